//! What a `.deb` says it is: its control fields, read by `dpkg-deb`.

use std::path::Path;
use std::process::Command;

use crate::tool::{self, ToolError};

/// A `.deb`'s control file and the fields that identify it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Control {
    /// The whole control file (what apt's Packages index repeats).
    pub text: String,
    /// `Package`.
    pub name: String,
    /// `Version`.
    pub version: String,
    /// `Architecture`.
    pub architecture: String,
}

/// Why a `.deb` could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DebError {
    /// dpkg-deb failed on it.
    #[error("{}: reading its control file", path.display())]
    Tool {
        /// The file.
        path: std::path::PathBuf,
        /// The failure.
        source: ToolError,
    },
    /// Its control file lacks a field.
    #[error("{}: its control file has no {field} field", path.display())]
    Missing {
        /// The file.
        path: std::path::PathBuf,
        /// The field.
        field: &'static str,
    },
}

/// One field of a control paragraph (single-line fields only).
pub fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (!l.starts_with([' ', '\t']) && k.eq_ignore_ascii_case(name)).then(|| v.trim())
    })
}

/// Reads `path`'s control file (`dpkg-deb -f`).
pub fn read_control(path: &Path) -> Result<Control, DebError> {
    let out = tool::output(
        "dpkg-deb",
        "dpkg",
        Command::new("dpkg-deb").arg("-f").arg(path),
    )
    .map_err(|source| DebError::Tool {
        path: path.to_owned(),
        source,
    })?;
    let text = String::from_utf8_lossy(&out).into_owned();
    let get = |f: &'static str| {
        field(&text, f).map(str::to_owned).ok_or(DebError::Missing {
            path: path.to_owned(),
            field: f,
        })
    };
    Ok(Control {
        name: get("Package")?,
        version: get("Version")?,
        architecture: get("Architecture")?,
        text,
    })
}

/// The file name apt gives a package: `name_version_arch.deb`, the epoch's `:` as `%3a`.
pub fn file_name(name: &str, version: &str, architecture: &str) -> String {
    format!("{name}_{}_{architecture}.deb", version.replace(':', "%3a"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_names() {
        let text = "Package: zlib1g\nVersion: 1:1.2.13.dfsg-1\nDescription: x\n Version: no\nArchitecture: amd64\n";
        assert_eq!(field(text, "version"), Some("1:1.2.13.dfsg-1"));
        assert_eq!(field(text, "Architecture"), Some("amd64"));
        assert_eq!(field(text, "Depends"), None);
        assert_eq!(
            file_name("zlib1g", "1:1.2.13.dfsg-1", "amd64"),
            "zlib1g_1%3a1.2.13.dfsg-1_amd64.deb"
        );
    }
}
