//! One registries.conf file, read and parsed, then checked and normalised as containers/image
//! does it for each file (`postProcessRegistries` in its `sysregistriesv2`): a `prefix` without
//! `location` is its own location; a prefix configured twice keeps its first entry (the later
//! ones are ignored, with a warning: containers/image ignores them silently); one location under
//! two prefixes with different `insecure` or `blocked` is refused; the entries are sorted by
//! prefix, which decides ties between equally long matches.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use ingot_verity::input::{self, InputError, Symlinks};

use super::{names, Entry, Mirror, PullFromMirror, IGNORED_TOP};
use crate::mirrors_error::{escaped, shown, MirrorsError, MAX_FILE, MAX_MIRRORS};

/// Reads `path` (at most [`MAX_FILE`] bytes) as text. Only a regular file is read, opened
/// without blocking: a FIFO or a device in its place is refused, naming it, instead of hanging
/// the run or reading forever.
pub(super) fn read(path: &Path) -> Result<String, MirrorsError> {
    let read = |source| MirrorsError::Read {
        path: path.to_owned(),
        source,
    };
    let bytes =
        input::read_bounded(path, MAX_FILE, Symlinks::Follow).map_err(
            |e| match input::input_error(&e) {
                Some(InputError::TooLarge { .. }) => MirrorsError::TooLarge {
                    path: path.to_owned(),
                },
                _ => read(e),
            },
        )?;
    String::from_utf8(bytes).map_err(|e| {
        read(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not UTF-8 text (byte {})", e.utf8_error().valid_up_to()),
        ))
    })
}

/// The `[[registry]]` entries of one file's text, checked, without duplicate prefixes, sorted
/// by prefix. `drop_in`: a file of a `registries.conf.d` directory, which must be version 2.
pub(super) fn parse(text: &str, path: &Path, drop_in: bool) -> Result<Vec<Entry>, MirrorsError> {
    let table: toml::Table = toml::from_str(text).map_err(|e| toml_error(path, text, &e))?;
    let r = Reader { path };
    if table.contains_key("registries") {
        if drop_in {
            return Err(r.invalid(
                "registries",
                "a drop-in file must be in the version 2 format ([[registry]]), as \
                 containers/image requires",
            ));
        }
        if let Some(k) = table.keys().find(|k| *k != "registries") {
            return Err(MirrorsError::Mixed {
                path: path.to_owned(),
                v2_key: shown(k),
            });
        }
        let v1 = table["registries"]
            .as_table()
            .ok_or_else(|| r.invalid("registries", "must be a table"))?;
        return normalise(path, r.v1(v1)?);
    }
    let mut entries: Vec<Entry> = Vec::new();
    for (k, v) in &table {
        match k.as_str() {
            "registry" => {
                for (i, t) in r.tables(k, v)?.into_iter().enumerate() {
                    entries.push(r.entry(&format!("registry[{i}]"), t)?);
                }
            }
            k if IGNORED_TOP.contains(&k) => {
                tracing::debug!("{}: `{k}` is about short names; ignored", path.display());
            }
            _ => return Err(r.invalid(k, "unknown key in a registries.conf")),
        }
    }
    normalise(path, entries)
}

/// containers/image's checks over one file's entries: one location (or, without one, prefix)
/// with two `insecure` or `blocked` settings is refused; a repeated prefix keeps its first
/// entry; the result is sorted by prefix.
fn normalise(path: &Path, entries: Vec<Entry>) -> Result<Vec<Entry>, MirrorsError> {
    let mut seen: HashMap<&str, (bool, bool)> = HashMap::new();
    for e in &entries {
        let at = if e.location.is_empty() {
            &e.prefix
        } else {
            &e.location
        };
        let (insecure, blocked) = *seen.entry(at).or_insert((e.insecure, e.blocked));
        for (what, differs) in [
            ("insecure", insecure != e.insecure),
            ("blocked", blocked != e.blocked),
        ] {
            if differs {
                return Err(MirrorsError::Conflict {
                    path: path.to_owned(),
                    location: at.to_owned(),
                    setting: what,
                });
            }
        }
    }
    let mut prefixes = HashSet::new();
    let mut kept: Vec<Entry> = Vec::new();
    for e in entries {
        if prefixes.insert(e.prefix.clone()) {
            kept.push(e);
        } else {
            tracing::warn!(
                "{}: prefix `{}` is configured more than once: its first [[registry]] is used, \
                 the others are ignored (as containers/image does)",
                path.display(),
                shown(&e.prefix)
            );
        }
    }
    kept.sort_by(|a, b| a.prefix.cmp(&b.prefix));
    Ok(kept)
}

/// The TOML path of a key, for messages.
fn key_path(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

struct Reader<'a> {
    path: &'a Path,
}

impl Reader<'_> {
    fn invalid(&self, key: &str, problem: impl Into<String>) -> MirrorsError {
        MirrorsError::Invalid {
            path: self.path.to_owned(),
            key: shown(key),
            problem: problem.into(),
        }
    }

    fn string(&self, key: &str, v: &toml::Value) -> Result<String, MirrorsError> {
        v.as_str()
            .map(str::to_owned)
            .ok_or_else(|| self.invalid(key, format!("must be a string, not {}", v.type_str())))
    }

    fn boolean(&self, key: &str, v: &toml::Value) -> Result<bool, MirrorsError> {
        v.as_bool().ok_or_else(|| {
            self.invalid(key, format!("must be true or false, not {}", v.type_str()))
        })
    }

    fn tables<'v>(
        &self,
        key: &str,
        v: &'v toml::Value,
    ) -> Result<Vec<&'v toml::Table>, MirrorsError> {
        let array = v
            .as_array()
            .ok_or_else(|| self.invalid(key, format!("must be an array of tables ([[{key}]])")))?;
        array
            .iter()
            .enumerate()
            .map(|(i, t)| {
                t.as_table()
                    .ok_or_else(|| self.invalid(&format!("{key}[{i}]"), "must be a table"))
            })
            .collect()
    }

    /// A `location`: `host[:port][/path][:tag|@digest]`, no scheme, no trailing `/`.
    fn location(&self, key: &str, v: &toml::Value) -> Result<String, MirrorsError> {
        self.name(key, v, false)
    }

    /// A `prefix`: a location, or `*.domain`.
    fn prefix(&self, key: &str, v: &toml::Value) -> Result<String, MirrorsError> {
        self.name(key, v, true)
    }

    fn name(&self, key: &str, v: &toml::Value, wildcard: bool) -> Result<String, MirrorsError> {
        let s = self.string(key, v)?;
        let s = s.trim_end_matches('/').to_owned();
        if s.contains("://") {
            return Err(self.invalid(
                key,
                format!(
                    "`{}` has a scheme; a location is host[:port][/path]",
                    shown(&s)
                ),
            ));
        }
        let path = s.split_once('/').map_or("", |(_, p)| p);
        if wildcard && path.contains([':', '@']) {
            return Err(self.invalid(
                key,
                format!(
                    "`{}` can never match a reference: a prefix is matched against the \
                     repository's name, without its tag or digest (as containers/image does)",
                    shown(&s)
                ),
            ));
        }
        if let Some(why) = names::problem(&s, wildcard) {
            let what = if wildcard {
                "can never match a reference"
            } else {
                "is not a registry location"
            };
            return Err(self.invalid(key, format!("`{}` {what}: {why}", shown(&s))));
        }
        Ok(s)
    }

    fn mirror(&self, key: &str, t: &toml::Table) -> Result<Mirror, MirrorsError> {
        let mut mirror = Mirror {
            location: String::new(),
            insecure: false,
            pull_from_mirror: PullFromMirror::All,
        };
        for (k, v) in t {
            let kp = key_path(key, k);
            match k.as_str() {
                "location" => mirror.location = self.location(&kp, v)?,
                "insecure" => mirror.insecure = self.boolean(&kp, v)?,
                "pull-from-mirror" => {
                    mirror.pull_from_mirror = match self.string(&kp, v)?.as_str() {
                        "" | "all" => PullFromMirror::All,
                        "digest-only" => PullFromMirror::DigestOnly,
                        "tag-only" => PullFromMirror::TagOnly,
                        other => {
                            return Err(self.invalid(
                                &kp,
                                format!(
                                    "`{}` is not one of \"all\", \"digest-only\", \
                                     \"tag-only\"",
                                    shown(other)
                                ),
                            ))
                        }
                    }
                }
                _ => return Err(self.invalid(&kp, "unknown key in a [[registry.mirror]]")),
            }
        }
        if mirror.location.is_empty() {
            return Err(self.invalid(key, "a mirror needs a `location`"));
        }
        Ok(mirror)
    }

    fn entry(&self, key: &str, t: &toml::Table) -> Result<Entry, MirrorsError> {
        let mut entry = Entry {
            prefix: String::new(),
            location: String::new(),
            insecure: false,
            blocked: false,
            mirrors: Vec::new(),
            from: self.path.to_owned(),
        };
        let mut by_digest_only = false;
        let mut pull_from_mirror_set = None;
        let mut too_many = None;
        for (k, v) in t {
            let kp = key_path(key, k);
            match k.as_str() {
                "prefix" => entry.prefix = self.prefix(&kp, v)?,
                "location" => entry.location = self.location(&kp, v)?,
                "insecure" => entry.insecure = self.boolean(&kp, v)?,
                "blocked" => entry.blocked = self.boolean(&kp, v)?,
                "mirror-by-digest-only" => by_digest_only = self.boolean(&kp, v)?,
                "mirror" => {
                    let mirrors = self.tables(&kp, v)?;
                    if mirrors.len() > MAX_MIRRORS {
                        // Refused below, once the prefix (which names the registry) is known.
                        too_many = Some(mirrors.len());
                        continue;
                    }
                    for (i, m) in mirrors.into_iter().enumerate() {
                        let mkey = format!("{kp}[{i}]");
                        if m.contains_key("pull-from-mirror") {
                            pull_from_mirror_set = Some(format!("{mkey}.pull-from-mirror"));
                        }
                        entry.mirrors.push(self.mirror(&mkey, m)?);
                    }
                }
                _ => return Err(self.invalid(&kp, "unknown key in a [[registry]]")),
            }
        }
        if entry.prefix.is_empty() {
            entry.prefix = entry.location.clone();
        }
        if entry.prefix.is_empty() {
            return Err(self.invalid(key, "a [[registry]] needs a `prefix` or a `location`"));
        }
        if let Some(count) = too_many {
            return Err(MirrorsError::TooManyMirrors {
                path: self.path.to_owned(),
                key: key.to_owned(),
                prefix: entry.prefix,
                count,
            });
        }
        if by_digest_only {
            if let Some(k) = pull_from_mirror_set {
                return Err(self.invalid(
                    &k,
                    "cannot be set together with the registry's mirror-by-digest-only",
                ));
            }
            for m in &mut entry.mirrors {
                m.pull_from_mirror = PullFromMirror::DigestOnly;
            }
        }
        Ok(entry)
    }

    /// Version 1: `[registries.insecure]` and `[registries.block]` (`registries = [...]`).
    fn v1(&self, t: &toml::Table) -> Result<Vec<Entry>, MirrorsError> {
        let mut entries: Vec<Entry> = Vec::new();
        for (k, v) in t {
            let kp = key_path("registries", k);
            let (insecure, blocked) = match k.as_str() {
                "search" => (false, false),
                "insecure" => (true, false),
                "block" => (false, true),
                _ => return Err(self.invalid(&kp, "unknown key in the version 1 format")),
            };
            let table = v
                .as_table()
                .ok_or_else(|| self.invalid(&kp, "must be a table"))?;
            for (k2, list) in table {
                let kp2 = key_path(&kp, k2);
                if k2 != "registries" {
                    return Err(self.invalid(&kp2, "unknown key in the version 1 format"));
                }
                let list = list
                    .as_array()
                    .ok_or_else(|| self.invalid(&kp2, "must be an array of strings"))?;
                for (i, host) in list.iter().enumerate() {
                    let host = self.location(&format!("{kp2}[{i}]"), host)?;
                    if !(insecure || blocked) {
                        continue; // search: short names only
                    }
                    match entries.iter_mut().find(|e| e.prefix == host) {
                        Some(e) => {
                            e.insecure |= insecure;
                            e.blocked |= blocked;
                        }
                        None => entries.push(Entry {
                            prefix: host.clone(),
                            location: host,
                            insecure,
                            blocked,
                            mirrors: Vec::new(),
                            from: self.path.to_owned(),
                        }),
                    }
                }
            }
        }
        Ok(entries)
    }
}

/// Characters of the offending line quoted on each side of a TOML error's column.
const EXCERPT_HALF: usize = 100;

/// A TOML error as a [`MirrorsError::Toml`]: the line and column, the parser's message, and
/// the line around the column, escaped and cut (toml's own message quotes the line whole).
fn toml_error(path: &Path, text: &str, e: &toml::de::Error) -> MirrorsError {
    let message = shown(&e.message().trim().replace('\n', "; "));
    let Some(span) = e.span() else {
        return MirrorsError::Toml {
            path: path.to_owned(),
            at: String::new(),
            message,
            excerpt: String::new(),
        };
    };
    let mut at = span.start.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let end = text[at..].find('\n').map_or(text.len(), |i| at + i);
    let before: Vec<char> = text[start..at].chars().collect();
    let from = before.len().saturating_sub(EXCERPT_HALF);
    let head: String = before[from..].iter().collect();
    let rest = &text[at..end];
    let tail: String = rest.chars().take(EXCERPT_HALF).collect();
    let cut_after = tail.len() < rest.len();
    let excerpt = if from > 0 || cut_after {
        let chars = before.len() + rest.chars().count();
        format!(
            "; the line ({chars} characters, cut to {} around the column) reads `{}{}{}{}`",
            2 * EXCERPT_HALF,
            if from > 0 { "…" } else { "" },
            escaped(&head),
            escaped(&tail),
            if cut_after { "…" } else { "" },
        )
    } else {
        format!("; the line reads `{}{}`", escaped(&head), escaped(&tail))
    };
    MirrorsError::Toml {
        path: path.to_owned(),
        at: format!(
            "line {}, column {}: ",
            text[..start].matches('\n').count() + 1,
            before.len() + 1
        ),
        message,
        excerpt,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::mirrors::tests::{conf, err};
    use crate::mirrors::{MirrorConfig, MirrorsFrom};

    #[test]
    fn hostile_files_are_named_errors() {
        let e = err("[[registry]\nlocation = \"x\"");
        assert!(e.contains("not a TOML"), "{e}");
        let e = err("[[registry]]\nlocation = \"x\"\npul-from-mirror = \"all\"\n");
        assert!(
            e.contains("registry[0].pul-from-mirror") && e.contains("unknown"),
            "{e}"
        );
        let e = err("[[registry]]\nlocation = \"x\"\n[[registry.mirror]]\ninsecure = true\n");
        assert!(e.contains("needs a `location`"), "{e}");
        let e = err("[[registry]]\nlocation = \"https://x\"\n");
        assert!(e.contains("scheme"), "{e}");
        let e = err("[[registry]]\ninsecure = true\n");
        assert!(e.contains("`prefix` or a `location`"), "{e}");
        let e = err("[[registry]]\nlocation = \"x\"\nblocked = \"yes\"\n");
        assert!(
            e.contains("registry[0].blocked") && e.contains("true or false"),
            "{e}"
        );

        let e = err("mirror = 1\n");
        assert!(e.contains("`mirror`"), "{e}");
        // Ignored keys about short names.
        conf("short-name-mode = \"enforcing\"\n[aliases]\nfoo = \"example.com/foo\"\n");
    }

    /// Issue 32, item 8: a FIFO hung `load` in its open (waiting for a writer). The load runs
    /// in a thread with a deadline, so a regression fails here instead of hanging; opening the
    /// writer end afterwards lets a hung open go.
    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("registries.conf");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || tx.send(MirrorsFrom::File(path).load().map(|_| ())));
        let got = rx.recv_timeout(std::time::Duration::from_secs(20));
        if got.is_err() {
            drop(std::fs::OpenOptions::new().write(true).open(&fifo));
            panic!("loading a FIFO as registries.conf still blocks after 20 s");
        }
        let e = got.unwrap().unwrap_err();
        let s = crate::error_chain::text(&e);
        assert!(
            s.contains(&fifo.display().to_string()) && s.contains("a FIFO"),
            "{s}"
        );
    }

    /// Issue 32, item 9: 2,000 mirrors cost 37 s of setup, 20,000 never finished. One registry
    /// lists at most [`MAX_MIRRORS`]; more is refused naming the registry, the count, the cap.
    #[test]
    fn mirrors_per_registry_are_capped() {
        let file = |n: usize| {
            let mut t = String::from("[[registry]]\nprefix = \"reg.example/stacks\"\n");
            for i in 0..n {
                t.push_str(&format!("[[registry.mirror]]\nlocation = \"m{i}.local\"\n"));
            }
            t
        };
        assert_eq!(
            conf(&file(MAX_MIRRORS)).entries[0].mirrors.len(),
            MAX_MIRRORS
        );
        for n in [MAX_MIRRORS + 1, 20_000] {
            let e = err(&file(n));
            assert!(
                e.contains(&format!(
                    "`registry[0]` (prefix `reg.example/stacks`) lists {n} mirrors, more than \
                     the {MAX_MIRRORS} accepted"
                )),
                "{e}"
            );
        }
    }

    /// Issue 32, item 11: prefixes that can never match were kept silently. Each is refused,
    /// naming the key, the prefix (escaped) and why; a location is held to the same grammar.
    #[test]
    fn prefixes_that_can_never_match_are_refused() {
        for (prefix, why) in [
            (
                "*.",
                "`*.` can never match a reference: `*.` needs a domain",
            ),
            ("REG.example", "upper-case `R`"),
            ("reg.example/Stacks", "upper-case `S`"),
            ("reg.example\\u0000", "`reg.example\\u{0}` can never match"),
            (
                "reg\\u001b[2J.example",
                "`reg\\u{1b}[2J.example` can never match",
            ),
            ("reg..example", "empty label"),
            ("reg.ex*ample", "leading `*.`"),
            ("*.*.example", "after `*.`"),
        ] {
            let e = err(&format!(
                "[[registry]]\nprefix = \"{prefix}\"\nlocation = \"x\"\n"
            ));
            assert!(
                e.contains("`registry[0].prefix`") && e.contains(why),
                "{prefix}: {e}"
            );
            assert!(!e.contains('\u{1b}') && !e.contains('\0'), "{e:?}");
        }
        let e =
            err("[[registry]]\nlocation = \"r\"\n[[registry.mirror]]\nlocation = \"M.local\"\n");
        assert!(
            e.contains("registry[0].mirror[0].location") && e.contains("not a registry location"),
            "{e}"
        );
        let e = err("[[registry]]\nprefix = \"r\"\nlocation = \"*.x\"\n");
        assert!(e.contains("cannot have a wildcard"), "{e}");
    }

    /// Issue 32, item 11: a TOML error quoted its whole line (a megabyte, escape sequences and
    /// all). Now 200 characters around the column, escaped, the cut said; an unknown key or a
    /// bad value from the file is cut and escaped the same way.
    #[test]
    fn a_toml_error_quotes_a_short_escaped_excerpt() {
        let mut text = String::from("[[registry]]\nlocation = \"x\"\nk = \"");
        text.push_str(&"A".repeat(1 << 19));
        text.push_str("\u{1b}]0;pwned\u{7}");
        text.push_str(&"B".repeat(1 << 19));
        text.push_str("\"\n");
        let e = err(&text);
        assert!(
            e.len() < 1000,
            "{} bytes: {}",
            e.len(),
            e.chars().take(1000).collect::<String>()
        );
        assert!(
            e.contains(&format!("line 3, column {}", 6 + (1 << 19))),
            "{e}"
        );
        assert!(e.contains("cut to 200 around the column"), "{e}");
        assert!(e.contains("AAAA\\u{1b}]0;pwned\\u{7}BBBB"), "{e}");
        assert!(!e.chars().any(|c| c.is_control() && c != '\n'), "{e:?}");
        // A short line is quoted whole.
        let e = err("[[registry]\nlocation = \"x\"");
        assert!(
            e.contains("line 1, column") && e.contains("reads `[[registry]`"),
            "{e}"
        );
        // A megabyte-long key, or value, named in a refusal.
        let key = format!("\"{}\\u001b\"", "k".repeat(1 << 19));
        let e = err(&format!("[[registry]]\nlocation = \"x\"\n{key} = 1\n"));
        assert!(e.len() < 1000 && e.contains("characters, cut"), "{e}");
        let value = "p".repeat(1 << 19);
        let e = err(&format!("[[registry]]\nlocation = \"x\"\n[[registry.mirror]]\nlocation = \"m\"\npull-from-mirror = \"{value}\"\n"));
        assert!(e.len() < 1000 && e.contains("characters, cut"), "{e}");
    }

    #[test]
    fn a_huge_file_is_refused_after_a_bounded_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("registries.conf");
        let mut text = String::from("# ");
        text.push_str(&"x".repeat(MAX_FILE as usize + 10));
        std::fs::write(&path, text).unwrap();
        let e = MirrorConfig::load(&path).unwrap_err();
        assert!(matches!(e, MirrorsError::TooLarge { .. }), "{e}");
        assert!(e.to_string().contains(&path.display().to_string()));
        // A device in its place is not read.
        let e = MirrorConfig::load(Path::new("/dev/zero")).unwrap_err();
        assert!(e.to_string().contains("/dev/zero"), "{e}");
        let e = MirrorsFrom::File(dir.path().join("none.conf"))
            .load()
            .unwrap_err();
        assert!(e.to_string().contains("none.conf"), "{e}");
        assert_eq!(MirrorsFrom::None.load().unwrap(), None);
    }
}
