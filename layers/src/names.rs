//! The rules for the names, versions, references and paths a stack carries.
//!
//! They hold for the release manifest (`ingot build` refuses a manifest that breaks them) and for
//! the signed stack descriptor (every reader refuses a descriptor that breaks them, even one the
//! trusted key signed): these strings end up in file names, GPT partition labels, the boot
//! loader's entry and kernel command lines, where a space or a newline would add options.

/// The longest stack, layer, kind or preload name.
pub const MAX_NAME_LEN: usize = 64;
/// The longest version.
pub const MAX_VERSION_LEN: usize = 128;

/// A name: 1–64 characters of `a-z 0-9 - _`, not starting with `-`.
pub fn is_plain_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && !s.starts_with('-')
}

/// What a name must be, for messages.
pub const PLAIN_NAME_RULE: &str = "1-64 characters of a-z, 0-9, `-`, `_`";

/// A release version: non-empty, at most 128 bytes, no whitespace or control characters.
pub fn is_version(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_VERSION_LEN && !s.chars().any(is_space_or_control)
}

/// What a version must be, for messages.
pub const VERSION_RULE: &str = "non-empty, at most 128 characters, without spaces";

/// An image reference (`registry/name:tag`): non-empty, at most 512 bytes, no whitespace or
/// control characters.
pub fn is_reference(s: &str) -> bool {
    !s.is_empty() && s.len() <= 512 && !s.chars().any(is_space_or_control)
}

/// An absolute path inside a layer, as the boot loader's entry names it: starts with `/`, at most
/// 4096 bytes, no whitespace or control characters, no `.` or `..` component.
pub fn is_layer_path(s: &str) -> bool {
    s.starts_with('/')
        && s.len() <= 4096
        && !s.chars().any(is_space_or_control)
        && !s.split('/').any(|c| c == "." || c == "..")
}

/// What a path inside a layer must be, for messages.
pub const LAYER_PATH_RULE: &str =
    "an absolute path in the layer, without spaces, control characters, `.` or `..`";

/// Free text shown to people (the builder, the creation time): at most 256 bytes, no control
/// characters.
pub fn is_label(s: &str) -> bool {
    s.len() <= 256 && !s.chars().any(char::is_control)
}

fn is_space_or_control(c: char) -> bool {
    c.is_whitespace() || c.is_control()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules() {
        assert!(is_plain_name("control-plane_2"));
        for bad in ["", "-x", "Cp", "cp init=/bin/sh", "a\nb", &"a".repeat(65)] {
            assert!(!is_plain_name(bad), "{bad:?}");
        }
        assert!(is_version("1.2.3-rc.1+build"));
        for bad in ["", "1.0 ingot.x=1", "1\n", "1\t2", &"1".repeat(129)] {
            assert!(!is_version(bad), "{bad:?}");
        }
        assert!(is_reference("registry.k8s.io/pause:3.10"));
        assert!(!is_reference("a b"));
        assert!(is_layer_path("/boot/vmlinuz"));
        for bad in [
            "boot/vmlinuz",
            "/boot/vmlinuz rd.break",
            "/boot/../x",
            "/a\nb",
        ] {
            assert!(!is_layer_path(bad), "{bad:?}");
        }
        assert!(is_label("ingot 0.1.0"));
        assert!(!is_label("x\ny"));
    }
}
