//! The boot contract's limits, where both `ingot build` and the writer's `plan` check them: the
//! kernel command line that names the layers (its length, and what `--kernel-arg` may add),
//! the number of GPT entries the layout takes, and the boot files the ESP must hold.
//!
//! A stack past one of these limits is refused when it is built, and again before a disk is
//! wiped: written anyway, it would not boot (x86 Linux truncates a longer command line; a GPT
//! has room for 128 partitions; a missing kernel is found only after the wipe).

use ingot_verity::RootHash;
use uuid::Uuid;

use crate::descriptor::{BootFiles, StackDescriptor};

/// x86 Linux's `COMMAND_LINE_SIZE`, the terminating NUL included: the longest command line
/// the kernel keeps whole is one byte shorter.
pub const COMMAND_LINE_SIZE: usize = 2048;
/// Partition entries in the GPT the writer makes (the usual size of its entry array).
pub const GPT_ENTRIES: usize = 128;
/// The writer's default ESP size (`--esp-size`), the size `ingot build` checks the boot files
/// against.
pub const DEFAULT_ESP_SIZE: u64 = 256 << 20;
/// Room the ESP keeps beyond the boot files: FATs, directories and cluster slack.
pub const ESP_SPARE: u64 = 8 << 20;
/// The prefix of ingot's own kernel parameters; `--kernel-arg` may not set one.
pub const OWN_PREFIX: &str = "ingot.";

/// A boot contract limit a stack or a write exceeds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BootLimitError {
    #[error(
        "the kernel command line is {len} bytes, more than the {max} x86 Linux keeps \
         (COMMAND_LINE_SIZE {COMMAND_LINE_SIZE}, with its NUL): {layers} layers name their root \
         hashes on it"
    )]
    CommandLineTooLong {
        len: usize,
        max: usize,
        layers: usize,
    },
    #[error(
        "the disk layout needs {count} partitions for {layers} layers, more than the \
         {GPT_ENTRIES} entries of a GPT"
    )]
    TooManyPartitions { count: usize, layers: usize },
    #[error("kernel argument {arg:?} {reason}")]
    KernelArg { arg: String, reason: String },
    #[error("boot.{what} {path:?}: {reason}")]
    BootFile {
        what: &'static str,
        path: String,
        reason: String,
    },
    #[error(
        "the boot files are {need} bytes (kernel {kernel}, initrd {initrd}, bootloader {efi}); \
         an ESP of {esp} bytes holds at most {room} (it keeps {ESP_SPARE} for the file system)"
    )]
    BootFilesTooBig {
        need: u64,
        kernel: u64,
        initrd: u64,
        efi: u64,
        esp: u64,
        room: u64,
    },
}

/// What the kernel command line names.
pub struct Cmdline<'a> {
    /// `name:version` of the stack.
    pub stack: (&'a str, &'a str),
    /// The selected layers in stacking order, each with the root hash its tree was checked
    /// against.
    pub layers: Vec<(&'a str, &'a RootHash)>,
    /// The sealed node layer's root hash.
    pub node: Option<&'a RootHash>,
    /// The `var` partition's UUID; on a node written to several disks, every member of `var`'s
    /// mirror, in disk order.
    pub var: Vec<Uuid>,
    /// Appended after ingot's own parameters.
    pub extra: &'a [String],
}

impl Cmdline<'_> {
    /// `ingot.stack=NAME:VERSION ingot.layers=L:HASH,... [ingot.node=HASH] ingot.var=PARTUUID=U ro EXTRA...`
    pub fn render(&self) -> String {
        let layer_list: Vec<String> = self
            .layers
            .iter()
            .map(|(name, root)| format!("{name}:{root}"))
            .collect();
        let mut cmdline = format!(
            "ingot.stack={}:{} ingot.layers={}",
            self.stack.0,
            self.stack.1,
            layer_list.join(",")
        );
        if let Some(n) = self.node {
            cmdline.push_str(&format!(" ingot.node={n}"));
        }
        let var: Vec<String> = self.var.iter().map(|u| format!("PARTUUID={u}")).collect();
        cmdline.push_str(&format!(" ingot.var={} ro", var.join(",")));
        for arg in self.extra {
            cmdline.push(' ');
            cmdline.push_str(arg);
        }
        cmdline
    }

    /// Renders the command line, refused when the kernel would not keep it whole or an extra
    /// argument is not one [`check_kernel_arg`] accepts.
    pub fn checked(&self) -> Result<String, BootLimitError> {
        for arg in self.extra {
            check_kernel_arg(arg)?;
        }
        let cmdline = self.render();
        check_cmdline_len(
            &cmdline,
            self.layers.len() + usize::from(self.node.is_some()),
        )?;
        Ok(cmdline)
    }
}

/// Marks a command line as the signed one of a UKI: the initramfs then takes the node layer's
/// root hash and `var`'s members only from the stub's credentials, never from the command line.
pub const SIGNED_MARK: &str = "ingot.boot=uki";

/// The command line a release's UKI carries (its `.cmdline`), the same for every machine:
/// `ingot.stack=NAME:VERSION ingot.layers=base:ROOT,NAME:ROOT,... [ingot.when=NAME:RULE;...]
/// ingot.boot=uki ro [KERNEL_ARGS...]`. It names **every** layer of the stack with its root hash
/// (the initramfs opens those of them the writer put on this disk, the base always) and each
/// layer's `when` rule, spaces removed (information for the console; the writer selected them).
pub fn signed_cmdline(d: &StackDescriptor) -> String {
    let layers: Vec<String> = d
        .layers
        .iter()
        .map(|l| format!("{}:{}", l.name, l.verity.root_hash))
        .collect();
    let mut cmdline = format!(
        "ingot.stack={}:{} ingot.layers={}",
        d.name,
        d.version,
        layers.join(",")
    );
    let rules: Vec<String> = d
        .layers
        .iter()
        .filter_map(|l| {
            let rule = l.when.as_ref()?.to_string();
            Some(format!("{}:{}", l.name, rule.replace(' ', "")))
        })
        .collect();
    if !rules.is_empty() {
        cmdline.push_str(&format!(" ingot.when={}", rules.join(";")));
    }
    cmdline.push_str(&format!(" {SIGNED_MARK} ro"));
    for arg in &d.boot.kernel_args {
        cmdline.push(' ');
        cmdline.push_str(arg);
    }
    cmdline
}

/// The largest layout a stack can take (every layer selected, a node layer on top, one `var`
/// disk, no extra arguments), checked against the partition and command line limits. Root
/// hashes are SHA-256: zeros of that length give the command line's exact length.
pub fn check_stack(
    name: &str,
    version: &str,
    layers: &[&str],
    bios: bool,
) -> Result<(), BootLimitError> {
    check_partition_count(layers.len() + 1, bios)?;
    let hash = RootHash::from_bytes(vec![0u8; 32]);
    Cmdline {
        stack: (name, version),
        layers: layers.iter().map(|l| (*l, &hash)).collect(),
        node: Some(&hash),
        var: vec![Uuid::nil()],
        extra: &[],
    }
    .checked()
    .map(drop)
}

/// Refuses a command line longer than x86 Linux keeps (`layers`: how many it names, for the
/// message).
pub fn check_cmdline_len(cmdline: &str, layers: usize) -> Result<(), BootLimitError> {
    let max = COMMAND_LINE_SIZE - 1;
    if cmdline.len() > max {
        return Err(BootLimitError::CommandLineTooLong {
            len: cmdline.len(),
            max,
            layers,
        });
    }
    Ok(())
}

/// An extra kernel argument (`--kernel-arg`): no control characters (a newline would add lines
/// to the boot loader's entry) and no `ingot.*` parameter (the writer's own: a second
/// `ingot.var=` would point the initramfs elsewhere), in any of its words.
pub fn check_kernel_arg(arg: &str) -> Result<(), BootLimitError> {
    let refuse = |reason: &str| BootLimitError::KernelArg {
        arg: arg.to_string(),
        reason: reason.to_string(),
    };
    if arg.trim().is_empty() {
        return Err(refuse("is empty"));
    }
    if arg.chars().any(char::is_control) {
        return Err(refuse("holds a control character"));
    }
    if arg
        .split_whitespace()
        .any(|word| word.trim_start_matches('"').starts_with(OWN_PREFIX))
    {
        return Err(refuse(&format!(
            "sets one of the writer's own parameters ({OWN_PREFIX}*)"
        )));
    }
    Ok(())
}

/// The partitions a layout takes: the ESP, a data and a verity partition per layer (the node
/// layer included), `var`, and the BIOS boot partition when there is one.
pub fn partition_count(layers: usize, bios: bool) -> usize {
    1 + 2 * layers + 1 + usize::from(bios)
}

/// Refuses a layout of `layers` layers (the node layer included) with more partitions than a
/// GPT has entries.
pub fn check_partition_count(layers: usize, bios: bool) -> Result<(), BootLimitError> {
    let count = partition_count(layers, bios);
    if count > GPT_ENTRIES {
        return Err(BootLimitError::TooManyPartitions { count, layers });
    }
    Ok(())
}

/// Refuses boot files (sizes in bytes) that an ESP of `esp` bytes cannot hold.
pub fn check_esp_room(kernel: u64, initrd: u64, efi: u64, esp: u64) -> Result<(), BootLimitError> {
    let need = kernel.saturating_add(initrd).saturating_add(efi);
    let room = esp.saturating_sub(ESP_SPARE);
    if need > room {
        return Err(BootLimitError::BootFilesTooBig {
            need,
            kernel,
            initrd,
            efi,
            esp,
            room,
        });
    }
    Ok(())
}

/// The sizes of the kernel, initrd and bootloader in a base layer, each a regular file
/// (symlinks followed, as the writer reads them: `file_size` answers for a path, as
/// the tree's `file_size` does); a missing one is refused by name.
pub fn boot_file_sizes(
    file_size: impl Fn(&str) -> Result<u64, String>,
    boot: &BootFiles,
) -> Result<(u64, u64, u64), BootLimitError> {
    let size = |what: &'static str, path: &str| {
        file_size(path).map_err(|reason| BootLimitError::BootFile {
            what,
            path: path.to_string(),
            reason,
        })
    };
    Ok((
        size("kernel", &boot.kernel)?,
        size("initrd", &boot.initrd)?,
        size("efi", &boot.efi)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::{FileData, Meta, Node, NodeKind, Tree};
    use std::sync::Arc;

    fn tree() -> Tree {
        let mut t = Tree::new();
        let mut add = |path: &str, kind: NodeKind| {
            let components: Vec<Vec<u8>> = path[1..].split('/').map(|c| c.into()).collect();
            let node = Node {
                meta: Meta::new(0o644, 0, 0),
                kind,
            };
            t.insert(&components, node, path.as_bytes()).unwrap();
        };
        let file = NodeKind::File(FileData::from_bytes(Arc::from(vec![7u8; 100])));
        add("/boot/vmlinuz-6.1", file);
        add("/boot/vmlinuz", NodeKind::Symlink(b"vmlinuz-6.1".to_vec()));
        add(
            "/vmlinuz",
            NodeKind::Symlink(b"boot/../boot/vmlinuz".to_vec()),
        );
        add("/loop", NodeKind::Symlink(b"/loop".to_vec()));
        t
    }

    fn files(kernel: &str, initrd: &str) -> BootFiles {
        BootFiles {
            kernel: kernel.into(),
            initrd: initrd.into(),
            efi: "/boot/vmlinuz-6.1".into(),
            bios: None,
            kernel_args: vec![],
        }
    }

    #[test]
    fn boot_files_resolve_through_symlinks_and_must_exist() {
        let t = tree();
        assert_eq!(
            boot_file_sizes(|p| t.file_size(p), &files("/vmlinuz", "/boot/vmlinuz")).unwrap(),
            (100, 100, 100)
        );
        let e = boot_file_sizes(|p| t.file_size(p), &files("/vmlinuz", "/boot/initrd.img"))
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("boot.initrd \"/boot/initrd.img\": is missing"),
            "{e}"
        );
        let e = boot_file_sizes(|p| t.file_size(p), &files("/boot", "/boot/vmlinuz")).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let e = boot_file_sizes(|p| t.file_size(p), &files("/loop", "/boot/vmlinuz")).unwrap_err();
        assert!(e.to_string().contains("more than 40 symlinks"), "{e}");
    }

    #[test]
    fn limits() {
        assert!(check_partition_count(62, true).is_ok());
        assert!(check_partition_count(63, false).is_ok());
        let e = check_partition_count(63, true).unwrap_err().to_string();
        assert!(
            e.contains("129 partitions") && e.contains("128 entries"),
            "{e}"
        );
        assert!(check_partition_count(64, false).is_err());
        assert!(check_esp_room(100 << 20, 140 << 20, 1 << 20, DEFAULT_ESP_SIZE).is_ok());
        let e = check_esp_room(100 << 20, 150 << 20, 1 << 20, DEFAULT_ESP_SIZE).unwrap_err();
        assert!(
            e.to_string()
                .contains("268435456 bytes holds at most 260046848"),
            "{e}"
        );
        for bad in [
            "quiet\ninitrd /evil",
            "a\tb",
            "ingot.var=PARTUUID=x",
            "quiet ingot.node=00",
            "\"ingot.x=1\"",
            " ",
        ] {
            assert!(check_kernel_arg(bad).is_err(), "{bad:?}");
        }
        for good in [
            "console=ttyS0,115200",
            "quiet",
            "systemd.unit=rescue.target",
            "xingot.a=1",
        ] {
            assert!(check_kernel_arg(good).is_ok(), "{good:?}");
        }
        assert!(check_cmdline_len(&"x".repeat(2047), 1).is_ok());
        let e = check_cmdline_len(&"x".repeat(2048), 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("2048 bytes, more than the 2047"), "{e}");
    }
}
