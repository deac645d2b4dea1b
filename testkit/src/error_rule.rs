//! The workspace's error rule, checked from the source: a `thiserror` variant that has a source
//! (`#[from]`, `#[source]` or a field named `source`) does not also format it in its message.
//! The binaries print the whole chain once (`{:#}`); a message that repeats its cause makes that
//! chain say it twice.
//!
//! The source is parsed with `syn` rather than matched with patterns: attributes span lines, and
//! a variant's fields decide which placeholder is its source.

use std::fs;
use std::path::{Path, PathBuf};

use syn::{Attribute, Fields, Item, LitStr};

/// One variant (or struct) whose message formats its own source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Breach {
    pub file: PathBuf,
    /// `Enum::Variant` or `Struct`.
    pub item: String,
    /// The placeholder that names the source (`0`, `source`, ...).
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for Breach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} formats its source `{{{}}}` in {:?}",
            self.file.display(),
            self.item,
            self.field,
            self.message
        )
    }
}

/// Every breach of the rule in the `.rs` files under `src` (recursively).
///
/// # Panics
/// When a file cannot be read or parsed: the checker must not pass by skipping code.
pub fn breaches(src: &Path) -> Vec<Breach> {
    let mut files = Vec::new();
    collect(src, &mut files);
    files.sort();
    let mut found = Vec::new();
    for file in files {
        let text =
            fs::read_to_string(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let parsed =
            syn::parse_file(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", file.display()));
        items(&file, &parsed.items, &mut found);
    }
    found
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

fn items(file: &Path, list: &[Item], found: &mut Vec<Breach>) {
    for item in list {
        match item {
            Item::Enum(e) => {
                for v in &e.variants {
                    check(
                        file,
                        &format!("{}::{}", e.ident, v.ident),
                        &v.attrs,
                        &v.fields,
                        found,
                    );
                }
            }
            Item::Struct(s) => check(file, &s.ident.to_string(), &s.attrs, &s.fields, found),
            Item::Mod(m) => {
                if let Some((_, inner)) = &m.content {
                    items(file, inner, found);
                }
            }
            _ => {}
        }
    }
}

fn check(file: &Path, item: &str, attrs: &[Attribute], fields: &Fields, found: &mut Vec<Breach>) {
    let Some(message) = message(attrs) else {
        return;
    };
    for field in sources(fields) {
        if formats(&message, &field) {
            found.push(Breach {
                file: file.to_path_buf(),
                item: item.to_string(),
                field,
                message: message.clone(),
            });
        }
    }
}

/// The literal of `#[error("...")]`, if the item has one (not `transparent`).
fn message(attrs: &[Attribute]) -> Option<String> {
    let attr = attrs.iter().find(|a| a.path().is_ident("error"))?;
    attr.parse_args_with(|input: syn::parse::ParseStream<'_>| {
        let lit: LitStr = input.parse()?;
        // The format arguments after the literal (`, path.display()`) do not matter here.
        let _: proc_macro2::TokenStream = input.parse()?;
        Ok(lit.value())
    })
    .ok()
}

/// The names (`source`) or positions (`0`) of the fields thiserror takes as the source.
fn sources(fields: &Fields) -> Vec<String> {
    let marked = |attrs: &[Attribute]| {
        attrs
            .iter()
            .any(|a| a.path().is_ident("from") || a.path().is_ident("source"))
    };
    fields
        .iter()
        .enumerate()
        .filter_map(|(i, f)| match &f.ident {
            Some(name) if name == "source" || marked(&f.attrs) => Some(name.to_string()),
            None if marked(&f.attrs) => Some(i.to_string()),
            _ => None,
        })
        .collect()
}

/// Whether `message` has a `{field}` or `{field:...}` placeholder (`{{` is a literal brace).
fn formats(message: &str, field: &str) -> bool {
    let unescaped = message.replace("{{", "");
    unescaped.match_indices('{').any(|(at, _)| {
        let rest = &unescaped[at + 1..];
        rest.strip_prefix(field)
            .is_some_and(|after| after.starts_with('}') || after.starts_with(':'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(code: &str) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("lib.rs"), code).unwrap();
        breaches(dir.path()).into_iter().map(|b| b.item).collect()
    }

    #[test]
    fn a_formatted_source_is_found_in_every_spelling() {
        let code = r#"
            #[derive(thiserror::Error, Debug)]
            enum E {
                #[error("reading {path}: {source}")]
                Named { path: String, source: std::io::Error },
                #[error("wrapped: {0}")]
                From(#[from] std::io::Error),
                #[error("{}: {cause:?}", path)]
                Marked { path: String, #[source] cause: std::io::Error },
            }
            mod inner {
                #[derive(thiserror::Error, Debug)]
                #[error("outer {0}")]
                struct S(#[source] std::io::Error);
            }
        "#;
        assert_eq!(scan(code), ["E::Named", "E::From", "E::Marked", "S"]);
    }

    #[test]
    fn a_message_that_leaves_its_source_out_passes() {
        let code = r#"
            #[derive(thiserror::Error, Debug)]
            enum E {
                #[error("reading {path}")]
                Named { path: String, source: std::io::Error },
                #[error(transparent)]
                Through(#[from] std::io::Error),
                #[error("layer {0} is {{0}} bytes")]
                NotASource(String, #[source] std::io::Error),
                #[error("{0} is not installed")]
                Plain(String),
            }
        "#;
        assert!(scan(code).is_empty(), "{:?}", scan(code));
    }
}
