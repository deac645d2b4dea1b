//! A package's declared licence from its `/usr/share/doc/PKG/copyright`, when that file is
//! machine-readable (DEP-5, Debian's copyright-format 1.0): the `License:` fields of its `Files`
//! paragraphs, as one SPDX license expression. Debian's short names that have an SPDX identifier
//! map to it; any other name becomes a `LicenseRef-` whose text (from the same file) goes with
//! it; a name whose text the file does not give makes the whole licence unknown (`None`), as
//! does a file that is not DEP-5. Bounded: the file, each licence text and the expression.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// Where a package's copyright file is, relative to the tree's root.
pub fn path(package: &str) -> String {
    format!("usr/share/doc/{package}/copyright")
}

/// The largest copyright file read (Debian's largest are about 1 MiB: the kernel's, perl's are
/// smaller); a larger one gives no licence.
pub const MAX_COPYRIGHT_SIZE: u64 = 4 << 20;
/// The longest licence text kept for one `LicenseRef-`.
pub const MAX_LICENSE_TEXT: usize = 64 << 10;
/// The longest licence name kept.
pub const MAX_NAME: usize = 128;
/// The longest license expression one package gets.
pub const MAX_EXPRESSION: usize = 4096;

/// A package's declared licence.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Declared {
    /// The SPDX license expression.
    pub expression: String,
    /// The `LicenseRef-`s it names, with their texts.
    pub extracted: Vec<Extracted>,
}

/// A licence SPDX has no identifier for, as the document declares it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Extracted {
    /// `LicenseRef-NAME-HASH` (the hash of the text: one id, one text).
    pub id: String,
    /// The name the copyright file gives it.
    pub name: String,
    /// Its text, as the copyright file gives it.
    pub text: String,
}

/// The declared licence a copyright file gives, `None` when it is not DEP-5 or does not say
/// (see the module's documentation). Never fails: any bytes give an answer.
pub fn declared(bytes: &[u8]) -> Option<Declared> {
    if bytes.len() as u64 > MAX_COPYRIGHT_SIZE {
        return None;
    }
    let text = std::str::from_utf8(bytes).ok()?;
    let paragraphs = paragraphs(text);
    let first = paragraphs.first()?;
    if !is_dep5(field(first, "Format")?) {
        return None;
    }
    // Standalone `License:` paragraphs give the texts of names used in `Files` paragraphs.
    let mut texts: BTreeMap<String, String> = BTreeMap::new();
    for p in &paragraphs[1..] {
        if field(p, "Files").is_none() {
            if let Some((name, body)) = field(p, "License").map(split_license) {
                texts.entry(name.to_lowercase()).or_insert(body);
            }
        }
    }
    let mut terms: Vec<String> = Vec::new();
    let mut extracted: BTreeMap<String, Extracted> = BTreeMap::new();
    for p in &paragraphs[1..] {
        if field(p, "Files").is_none() {
            continue;
        }
        let (names, body) = split_license(field(p, "License")?);
        let term = expression(&names, &body, &texts, &mut extracted)?;
        if !terms.contains(&term) {
            terms.push(term);
        }
    }
    if terms.is_empty() {
        return None;
    }
    let expression = if terms.len() == 1 {
        terms.pop()?
    } else {
        terms
            .iter()
            .map(|t| format!("({t})"))
            .collect::<Vec<_>>()
            .join(" AND ")
    };
    (expression.len() <= MAX_EXPRESSION).then(|| Declared {
        expression,
        extracted: extracted.into_values().collect(),
    })
}

/// Whether a `Format:` value names copyright-format 1.0 (or DEP-5's draft, which it became).
fn is_dep5(format: &str) -> bool {
    let f = format.trim();
    (f.starts_with("http://") || f.starts_with("https://"))
        && (f.contains("/copyright-format/1.0") || f.contains("/deps/dep5"))
}

/// One paragraph: its fields, each `(name, value)` with continuation lines joined by `\n`.
type Paragraph<'a> = Vec<(&'a str, String)>;

fn paragraphs(text: &str) -> Vec<Paragraph<'_>> {
    let mut out = Vec::new();
    let mut cur: Paragraph<'_> = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
        } else if line.starts_with('#') {
            // deb822 comment
        } else if line.starts_with([' ', '\t']) {
            if let Some((_, value)) = cur.last_mut() {
                value.push('\n');
                value.push_str(line);
            }
        } else if let Some((name, value)) = line.split_once(':') {
            cur.push((name.trim(), value.trim().to_owned()));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// A field's value (field names are case-insensitive in deb822).
fn field<'p>(p: &'p Paragraph<'_>, name: &str) -> Option<&'p str> {
    p.iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// A `License:` value: its first line (the names) and its text (the rest; ` .` lines empty).
fn split_license(value: &str) -> (String, String) {
    let (first, rest) = value.split_once('\n').unwrap_or((value, ""));
    let body: Vec<&str> = rest
        .lines()
        .map(|l| {
            let l = l.trim();
            if l == "." {
                ""
            } else {
                l
            }
        })
        .collect();
    (first.trim().to_owned(), body.join("\n").trim().to_owned())
}

/// One `License:` first line as an SPDX expression: names joined by `and`/`or`, a comma
/// lowering the precedence of what follows it (`A or B, and C` is `(A OR B) AND C`).
fn expression(
    names: &str,
    body: &str,
    texts: &BTreeMap<String, String>,
    extracted: &mut BTreeMap<String, Extracted>,
) -> Option<String> {
    if names.is_empty() {
        return None;
    }
    let mut groups: Vec<String> = Vec::new();
    let mut joins: Vec<&str> = Vec::new();
    for (i, group) in names.split(',').enumerate() {
        let mut words = group.split_whitespace().peekable();
        if i > 0 {
            match words.next().map(str::to_ascii_lowercase).as_deref() {
                Some("and") => joins.push("AND"),
                Some("or") => joins.push("OR"),
                _ => return None,
            }
        }
        let mut out = String::new();
        let mut name: Vec<&str> = Vec::new();
        for w in words.by_ref() {
            let op = match w.to_ascii_lowercase().as_str() {
                "and" => Some("AND"),
                "or" => Some("OR"),
                _ => None,
            };
            match op {
                Some(op) => {
                    out.push_str(&one(&name.join(" "), body, texts, extracted)?);
                    out.push(' ');
                    out.push_str(op);
                    out.push(' ');
                    name.clear();
                }
                None => name.push(w),
            }
        }
        out.push_str(&one(&name.join(" "), body, texts, extracted)?);
        groups.push(out);
    }
    let mut expr = groups[0].clone();
    for (g, join) in groups[1..].iter().zip(joins) {
        expr = format!("({expr}) {join} ({g})");
    }
    Some(expr)
}

/// One licence name: its SPDX identifier, or a `LicenseRef-` with the text the paragraph or
/// a standalone `License:` paragraph gives (`None` without one).
fn one(
    name: &str,
    body: &str,
    texts: &BTreeMap<String, String>,
    extracted: &mut BTreeMap<String, Extracted>,
) -> Option<String> {
    if name.is_empty() || name.len() > MAX_NAME || name.chars().any(char::is_control) {
        return None;
    }
    if let Some(id) = spdx_id(name) {
        return Some(id.to_owned());
    }
    let text = if body.is_empty() {
        texts.get(&name.to_lowercase())?.as_str()
    } else {
        body
    };
    let control = |c: char| c.is_control() && c != '\n' && c != '\t';
    if text.is_empty() || text.len() > MAX_LICENSE_TEXT || text.chars().any(control) {
        return None;
    }
    let safe: String = name
        .chars()
        .take(48)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let hash = hex::encode(&Sha256::digest(text.as_bytes())[..4]);
    let id = format!("LicenseRef-{safe}-{hash}");
    extracted.entry(id.clone()).or_insert_with(|| Extracted {
        id: id.clone(),
        name: name.to_owned(),
        text: text.to_owned(),
    });
    Some(id)
}

/// The SPDX identifier of a Debian short licence name (copyright-format 1.0's list, and the
/// spellings Debian's archive uses for them), `None` for any other name.
fn spdx_id(name: &str) -> Option<&'static str> {
    let n = name.to_ascii_lowercase();
    let n = n.strip_suffix(".0").map_or(n.as_str(), |s| s);
    Some(match n {
        "apache-2" | "apache-2.0" => "Apache-2.0",
        "apache-1.1" => "Apache-1.1",
        "artistic" | "artistic-1" => "Artistic-1.0-Perl",
        "artistic-2" => "Artistic-2.0",
        "bsd-2-clause" => "BSD-2-Clause",
        "bsd-3-clause" => "BSD-3-Clause",
        "bsd-4-clause" => "BSD-4-Clause",
        "bsl-1" => "BSL-1.0",
        "cc0-1" | "cc0" => "CC0-1.0",
        "cc-by-3" => "CC-BY-3.0",
        "cc-by-4" => "CC-BY-4.0",
        "cc-by-sa-3" => "CC-BY-SA-3.0",
        "cc-by-sa-4" => "CC-BY-SA-4.0",
        "curl" => "curl",
        "expat" | "mit" => "MIT",
        "ftl" => "FTL",
        "fsfap" => "FSFAP",
        "fsful" => "FSFUL",
        "fsfullr" => "FSFULLR",
        "isc" => "ISC",
        "libpng" => "Libpng",
        "mpl-1.1" => "MPL-1.1",
        "mpl-2" => "MPL-2.0",
        "openssl" => "OpenSSL",
        "python-2" | "psf-2" => "Python-2.0",
        "unicode-dfs-2016" => "Unicode-DFS-2016",
        "x11" => "X11",
        "zlib" => "Zlib",
        "zpl-2.1" => "ZPL-2.1",
        _ => return gnu(n),
    })
}

/// GNU licences: `GPL-2`, `GPL-2+`, `LGPL-2.1+`, `GPL-3.0+`, `AGPL-3`, `GFDL-1.3+`.
fn gnu(n: &str) -> Option<&'static str> {
    let (n, later) = match n.strip_suffix('+') {
        Some(n) => (n, true),
        None => (n, false),
    };
    let n = n.strip_suffix(".0").unwrap_or(n);
    let pick =
        |only: &'static str, or_later: &'static str| Some(if later { or_later } else { only });
    match n {
        "gpl-1" => pick("GPL-1.0-only", "GPL-1.0-or-later"),
        "gpl-2" => pick("GPL-2.0-only", "GPL-2.0-or-later"),
        "gpl-3" => pick("GPL-3.0-only", "GPL-3.0-or-later"),
        "lgpl-2" => pick("LGPL-2.0-only", "LGPL-2.0-or-later"),
        "lgpl-2.1" => pick("LGPL-2.1-only", "LGPL-2.1-or-later"),
        "lgpl-3" => pick("LGPL-3.0-only", "LGPL-3.0-or-later"),
        "agpl-3" => pick("AGPL-3.0-only", "AGPL-3.0-or-later"),
        "gfdl-1.2" => pick("GFDL-1.2-only", "GFDL-1.2-or-later"),
        "gfdl-1.3" => pick("GFDL-1.3-only", "GFDL-1.3-or-later"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEP5: &str = "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: demo

Files: *
Copyright: 2000 Someone
License: GPL-2+
 This program is free software.

Files: lib/*
Copyright: 2001 Other
License: LGPL-2.1+ or BSD-3-clause

Files: contrib/*
Copyright: 2002 Third
License: public-domain

Files: debian/*
Copyright: 2003 Packager
License: GPL-2+

License: public-domain
 The author disclaims copyright to this source code.
";

    #[test]
    fn dep5_files_paragraphs_give_the_expression() {
        let d = declared(DEP5.as_bytes()).unwrap();
        assert_eq!(d.extracted.len(), 1);
        let pd = &d.extracted[0];
        assert!(pd.id.starts_with("LicenseRef-public-domain-"), "{}", pd.id);
        assert_eq!(
            pd.text,
            "The author disclaims copyright to this source code."
        );
        assert_eq!(
            d.expression,
            format!(
                "(GPL-2.0-or-later) AND (LGPL-2.1-or-later OR BSD-3-Clause) AND ({})",
                pd.id
            )
        );
    }

    #[test]
    fn not_dep5_or_unsaid_gives_nothing() {
        assert_eq!(
            declared(b"This is the Debian prepackaged version of X.\n"),
            None
        );
        assert_eq!(declared(b""), None);
        // A name SPDX lacks and the file gives no text for.
        let unsaid = DEP5.replace("License: public-domain\n The author", "X: y\n The author");
        assert_eq!(declared(unsaid.as_bytes()), None);
        let huge = format!("{DEP5}{}", " x\n".repeat(MAX_COPYRIGHT_SIZE as usize));
        assert_eq!(declared(huge.as_bytes()), None);
    }

    #[test]
    fn commas_lower_precedence_and_names_map() {
        let doc = "Format: http://www.debian.org/doc/packaging-manuals/copyright-format/1.0\n\n\
Files: *\nLicense: GPL-1+ or Artistic, and Expat\n";
        assert_eq!(
            declared(doc.as_bytes()).unwrap().expression,
            "(GPL-1.0-or-later OR Artistic-1.0-Perl) AND (MIT)"
        );
        for (debian, spdx) in [
            ("GPL-2.0+", "GPL-2.0-or-later"),
            ("gpl-3", "GPL-3.0-only"),
            ("LGPL-2.1", "LGPL-2.1-only"),
            ("Apache-2.0", "Apache-2.0"),
            ("BSD-3-Clause", "BSD-3-Clause"),
            ("CC0-1.0", "CC0-1.0"),
            ("MIT", "MIT"),
        ] {
            assert_eq!(spdx_id(debian), Some(spdx), "{debian}");
        }
        assert_eq!(spdx_id("GPL"), None);
        assert_eq!(spdx_id("GPLv3+"), None);
    }

    /// Arbitrary bytes never panic and never give an expression past the bound.
    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let alphabet: &[&[u8]] = &[
            b"Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n",
            b"Files: *\n",
            b"License: ",
            b"GPL-2+",
            b" or ",
            b" and ",
            b", and ",
            b", or ",
            b"\n",
            b"\n\n",
            b" .\n",
            b" text\n",
            b"public-domain",
            b",",
            b"\xff",
            b"\0",
            b"with OpenSSL exception",
            b"#c\n",
            b"\t",
            b":",
        ];
        for _ in 0..20_000 {
            let len = (next() % 40) as usize;
            let mut bytes = Vec::new();
            for _ in 0..len {
                let r = next();
                if r % 7 == 0 {
                    bytes.push((r >> 8) as u8);
                } else {
                    bytes.extend_from_slice(alphabet[(r >> 8) as usize % alphabet.len()]);
                }
            }
            if let Some(d) = declared(&bytes) {
                assert!(d.expression.len() <= MAX_EXPRESSION);
                assert!(!d.expression.is_empty());
                for e in &d.extracted {
                    assert!(d.expression.contains(&e.id));
                    assert!(e.text.len() <= MAX_LICENSE_TEXT);
                }
            }
        }
    }
}
