//! Which files make the registries configuration, as containers/image finds them
//! (`newConfigWrapperWithHomeDir` and `dropInConfigs` in its `sysregistriesv2`):
//!
//! - a file named explicitly (skopeo's `--registries-conf`, podman's
//!   `CONTAINERS_REGISTRIES_CONF`) must exist; the drop-ins of the system's directory and then
//!   of the user's apply to it;
//! - else the user's `$HOME/.config/containers/registries.conf`, when it exists, with the user's
//!   drop-ins only;
//! - else [`DEFAULT_PATH`] (when it exists), with the system's drop-ins, then the user's.
//!
//! A drop-in directory is read for its `*.conf` entries, in name order, not recursively; a
//! missing directory is no drop-ins. Each drop-in is version 2, and replaces the entries with
//! its prefixes.

use std::path::{Path, PathBuf};

use super::{file, MirrorConfig, MirrorsError};

/// The file skopeo and podman read when nothing else is asked for.
pub const DEFAULT_PATH: &str = "/etc/containers/registries.conf";

/// The system's drop-in directory.
const SYSTEM_DIR: &str = "/etc/containers/registries.conf.d";

/// The user's file and drop-in directory, under `$HOME`.
const USER_FILE: &str = ".config/containers/registries.conf";
const USER_DIR: &str = ".config/containers/registries.conf.d";

/// The environment variable naming the file (podman's; skopeo 1.9.3 does not read it).
pub const ENV: &str = "CONTAINERS_REGISTRIES_CONF";

/// The most drop-in files read from one directory: real systems have a handful; a directory
/// holding more is refused rather than read without end.
const MAX_DROP_INS: usize = 256;

/// `$HOME`, when it is set.
pub(super) fn home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

/// The files to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Files {
    /// The main file.
    main: PathBuf,
    /// It must exist (it was named).
    required: bool,
    /// The drop-in directories, in the order applied.
    dirs: Vec<PathBuf>,
}

impl Files {
    /// A file named on the command line or in the environment.
    pub(super) fn explicit(path: &Path, home: Option<&Path>) -> Files {
        let mut dirs = vec![PathBuf::from(SYSTEM_DIR)];
        dirs.extend(home.map(|h| h.join(USER_DIR)));
        Files {
            main: path.to_owned(),
            required: true,
            dirs,
        }
    }

    /// Nothing named: the user's file if it exists, else the system's.
    pub(super) fn default_for(home: Option<&Path>) -> Files {
        if let Some(h) = home {
            let user = h.join(USER_FILE);
            if user.exists() {
                return Files {
                    main: user,
                    required: true,
                    dirs: vec![h.join(USER_DIR)],
                };
            }
        }
        let mut files = Files::explicit(Path::new(DEFAULT_PATH), home);
        files.required = false;
        files
    }

    /// The configuration these files make; none when not one of them exists.
    pub(super) fn load(&self) -> Result<Option<MirrorConfig>, MirrorsError> {
        let mut config = if self.required || self.main.exists() {
            Some(MirrorConfig::load(&self.main)?)
        } else {
            None
        };
        for dir in &self.dirs {
            for path in drop_ins(dir)? {
                let entries = file::parse(&file::read(&path)?, &path, true)?;
                config
                    .get_or_insert_with(|| MirrorConfig {
                        path: self.main.clone(),
                        ..MirrorConfig::default()
                    })
                    .apply(&path, entries);
            }
        }
        Ok(config)
    }
}

/// The `*.conf` entries of `dir`, in name order (none when it does not exist).
fn drop_ins(dir: &Path) -> Result<Vec<PathBuf>, MirrorsError> {
    let failed = |source| MirrorsError::Dir {
        path: dir.to_owned(),
        source,
    };
    let list = match std::fs::read_dir(dir) {
        Ok(list) => list,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(failed(e)),
    };
    let mut out = Vec::new();
    for entry in list {
        let entry = entry.map_err(failed)?;
        let is_dir = entry.file_type().map_err(failed)?.is_dir();
        if is_dir || !entry.file_name().as_encoded_bytes().ends_with(b".conf") {
            continue;
        }
        if out.len() == MAX_DROP_INS {
            return Err(failed(std::io::Error::other(format!(
                "more than {MAX_DROP_INS} *.conf files"
            ))));
        }
        out.push(entry.path());
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn the_user_file_replaces_the_system_one_and_takes_only_its_own_drop_ins() {
        let home = tempfile::tempdir().unwrap();
        let h = home.path();
        assert_eq!(Files::default_for(Some(h)).main, Path::new(DEFAULT_PATH));
        write(&h.join(USER_FILE), "");
        let f = Files::default_for(Some(h));
        assert_eq!(
            (f.main, f.dirs),
            (h.join(USER_FILE), vec![h.join(USER_DIR)])
        );
        let f = Files::explicit(Path::new("/x.conf"), Some(h));
        assert_eq!(f.dirs, [PathBuf::from(SYSTEM_DIR), h.join(USER_DIR)]);
    }

    #[test]
    fn drop_ins_replace_whole_entries_by_prefix_in_name_order() {
        let home = tempfile::tempdir().unwrap();
        let h = home.path();
        let main = h.join("main.conf");
        write(
            &main,
            "[[registry]]\nprefix = \"a.example\"\nlocation = \"one.example\"\n\
             [[registry.mirror]]\nlocation = \"m.example\"\n",
        );
        let d = h.join(USER_DIR);
        write(
            &d.join("20-b.conf"),
            "[[registry]]\nprefix = \"a.example\"\nlocation = \"three.example\"\n",
        );
        write(
            &d.join("10-a.conf"),
            "[[registry]]\nprefix = \"a.example\"\nlocation = \"two.example\"\n",
        );
        write(&d.join("30-c.txt"), "not read");
        std::fs::create_dir_all(d.join("sub.conf")).unwrap();
        let files = Files {
            main: main.clone(),
            required: true,
            dirs: vec![d.clone()],
        };
        let c = files.load().unwrap().unwrap();
        assert_eq!(c.files, [main, d.join("10-a.conf"), d.join("20-b.conf")]);
        assert_eq!(c.entries.len(), 1);
        assert_eq!(c.entries[0].location, "three.example");
        assert!(c.entries[0].mirrors.is_empty(), "replaced whole");
        assert_eq!(c.entries[0].from, d.join("20-b.conf"));
        // A version 1 drop-in is refused, naming it.
        write(
            &d.join("40-v1.conf"),
            "[registries.block]\nregistries = [\"x.example\"]\n",
        );
        let e = files.load().unwrap_err().to_string();
        assert!(e.contains("40-v1.conf") && e.contains("version 2"), "{e}");
    }

    #[test]
    fn nothing_to_read_is_no_configuration_but_a_named_file_must_exist() {
        let home = tempfile::tempdir().unwrap();
        let files = Files {
            main: home.path().join("none.conf"),
            required: false,
            dirs: vec![home.path().join("none.d")],
        };
        assert_eq!(files.load().unwrap(), None);
        let named = Files {
            required: true,
            ..files
        };
        assert!(named.load().unwrap_err().to_string().contains("none.conf"));
    }
}
