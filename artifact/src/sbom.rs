//! What a release records of its packages: per layer, the Debian packages its dpkg status
//! holds, as an SPDX 2.3 JSON document stored as a blob the signed descriptor pins.
//!
//! The dpkg status is parsed here rather than with a deb822 crate: none is in the lock file,
//! and the candidates (`deb822-lossless` keeps a lossless rowan syntax tree; `debian-control`
//! builds on it) bring a parser for a whole syntax tree where five fields of one file are
//! needed, under limits we set ourselves (file size, field size, entry count). The parser below
//! is bounded in every dimension and refuses what it does not understand.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Media type of an SBOM blob (IANA's for SPDX JSON).
pub const SBOM_MEDIA_TYPE: &str = "application/spdx+json";
/// Where a layer's dpkg status is read: dpkg's own place, and where a base whose `/var` is
/// emptied before the build keeps a copy (`manifests/debian/build`).
pub const STATUS_PATHS: [&str; 2] = ["var/lib/dpkg/status", "usr/lib/ingot/dpkg/status"];
/// The largest dpkg status read (a full Debian desktop's is about 3 MiB).
pub const MAX_STATUS_SIZE: u64 = 32 << 20;
/// The largest SBOM blob read back.
pub const MAX_SBOM_SIZE: u64 = 64 << 20;
/// The most packages one status may list.
pub const MAX_PACKAGES: usize = 100_000;
/// The longest value of the fields kept (name, version, architecture, maintainer).
const MAX_FIELD: usize = 1024;

/// One installed Debian package.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DebPackage {
    /// `Package`.
    pub name: String,
    /// `Architecture` (`amd64`, `all`, ...).
    pub arch: String,
    /// `Version`, epoch included.
    pub version: String,
    /// `Maintainer`, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintainer: Option<String>,
}

/// Why a dpkg status or an SBOM was refused.
#[derive(Debug, thiserror::Error)]
pub enum SbomError {
    /// The status file breaks the format or a limit.
    #[error("layer `{layer}`: dpkg status {path}: {reason}")]
    Status {
        /// The layer.
        layer: String,
        /// The file, relative to the layer's root.
        path: String,
        /// What is wrong (and where).
        reason: String,
    },
    /// An SBOM blob larger than any reader accepts.
    #[error("layer `{layer}`: the SBOM is {size} bytes, more than the {MAX_SBOM_SIZE} read")]
    TooLarge {
        /// The layer.
        layer: String,
        /// Its size.
        size: u64,
    },
    /// An SBOM blob is not the document `ingot build` writes.
    #[error("layer `{layer}`: the SBOM is not valid")]
    Document {
        /// The layer.
        layer: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

/// Parse a dpkg status file: the packages whose `Status` is `install ok installed`, sorted.
/// `layer` and `path` name the file in errors.
pub fn parse_status(bytes: &[u8], layer: &str, path: &str) -> Result<Vec<DebPackage>, SbomError> {
    let refuse = |reason: String| SbomError::Status {
        layer: layer.to_owned(),
        path: path.to_owned(),
        reason,
    };
    if bytes.len() as u64 > MAX_STATUS_SIZE {
        return Err(refuse(format!(
            "{} bytes, more than the {MAX_STATUS_SIZE} a status may have",
            bytes.len()
        )));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        refuse(format!(
            "not UTF-8 text (byte {} is not valid)",
            e.valid_up_to()
        ))
    })?;
    if text.contains('\0') {
        return Err(refuse("holds a NUL byte: not a text file".into()));
    }
    let mut out: BTreeMap<(String, String), DebPackage> = BTreeMap::new();
    let mut fields: BTreeMap<&str, &str> = BTreeMap::new();
    let mut start_line = 1;
    let mut last: Option<&str> = None;
    let lines = text.split('\n').chain(std::iter::once(""));
    for (i, line) in lines.enumerate() {
        let n = i + 1;
        if line.trim().is_empty() {
            if !fields.is_empty() {
                finish_entry(&fields, start_line, &mut out).map_err(&refuse)?;
                if out.len() > MAX_PACKAGES {
                    return Err(refuse(format!("more than {MAX_PACKAGES} packages")));
                }
                fields.clear();
            }
            last = None;
            start_line = n + 1;
            continue;
        }
        if line.starts_with([' ', '\t']) {
            // A continuation line (Description, Conffiles): only the fields kept must be one line.
            match last {
                Some(f) if KEPT.contains(&f) => {
                    return Err(refuse(format!(
                        "line {n}: field {f} continues on a second line"
                    )))
                }
                Some(_) => continue,
                None => {
                    return Err(refuse(format!(
                        "line {n}: a continuation line opens an entry"
                    )))
                }
            }
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(refuse(format!("line {n}: not a `Field: value` line")));
        };
        if name.is_empty() || name.contains([' ', '\t']) {
            return Err(refuse(format!(
                "line {n}: `{}` is not a field name",
                show(name)
            )));
        }
        let value = value.trim();
        if KEPT.contains(&name) && value.len() > MAX_FIELD {
            return Err(refuse(format!(
                "line {n}: field {name} is longer than {MAX_FIELD} bytes"
            )));
        }
        if fields.insert(name, value).is_some() {
            return Err(refuse(format!(
                "line {n}: field {name} appears twice in one entry"
            )));
        }
        last = Some(name);
    }
    Ok(out.into_values().collect())
}

const KEPT: [&str; 5] = ["Package", "Version", "Architecture", "Maintainer", "Status"];

fn show(s: &str) -> String {
    s.chars().take(64).collect()
}

fn finish_entry(
    fields: &BTreeMap<&str, &str>,
    line: usize,
    out: &mut BTreeMap<(String, String), DebPackage>,
) -> Result<(), String> {
    let get = |f: &str| {
        fields
            .get(f)
            .copied()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("the entry at line {line} has no {f} field"))
    };
    let name = get("Package")?;
    if get("Status")? != "install ok installed" {
        return Ok(());
    }
    let (version, arch) = (get("Version")?, get("Architecture")?);
    let bad = |what: &str, v: &str| {
        format!(
            "the entry at line {line}: {what} `{}` is not valid",
            show(v)
        )
    };
    let ok_name = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b))
    };
    if !ok_name(name) {
        return Err(bad("package name", name));
    }
    if !ok_name(arch) {
        return Err(bad("architecture", arch));
    }
    if !version
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b".+-~:".contains(&b))
    {
        return Err(bad("version", version));
    }
    let pkg = DebPackage {
        name: name.to_owned(),
        arch: arch.to_owned(),
        version: version.to_owned(),
        maintainer: fields.get("Maintainer").map(|m| (*m).to_owned()),
    };
    if out
        .insert((pkg.name.clone(), pkg.arch.clone()), pkg)
        .is_some()
    {
        return Err(format!(
            "the entry at line {line}: package {name}:{arch} is listed twice"
        ));
    }
    Ok(())
}

/// The installed packages of a layer's tree: its dpkg status at the first of [`STATUS_PATHS`]
/// that is there, `None` when neither is (a layer without a status has no packages).
pub fn status_of(
    tree: &ingot_layers::tree::Tree,
    layer: &str,
) -> Result<Option<Vec<DebPackage>>, SbomError> {
    for path in STATUS_PATHS {
        let bytes = tree
            .read_file_bounded(path, MAX_STATUS_SIZE)
            .map_err(|reason| SbomError::Status {
                layer: layer.to_owned(),
                path: path.to_owned(),
                reason,
            })?;
        if let Some(bytes) = bytes {
            return parse_status(&bytes, layer, path).map(Some);
        }
    }
    Ok(None)
}

/// Per layer (stack order, each layer's own status or `None`), the packages its SBOM lists: the
/// base's whole status; above it, what a layer's status adds or changes relative to the status
/// the layers below give (the nearest lower layer that has one hides the others, as the
/// overlay does); nothing for a layer without a status.
pub fn layer_packages(statuses: &[Option<Vec<DebPackage>>]) -> Vec<Vec<DebPackage>> {
    let mut below: &[DebPackage] = &[];
    let mut out = Vec::with_capacity(statuses.len());
    for status in statuses {
        match status {
            Some(this) => {
                out.push(added_or_changed(this, below));
                below = this;
            }
            None => out.push(Vec::new()),
        }
    }
    out
}

/// The packages `this` status adds or changes relative to `below` (the status the layers below
/// give): a package (name, architecture) absent there, or there at another version.
pub fn added_or_changed(this: &[DebPackage], below: &[DebPackage]) -> Vec<DebPackage> {
    let below: BTreeMap<(&str, &str), &str> = below
        .iter()
        .map(|p| ((p.name.as_str(), p.arch.as_str()), p.version.as_str()))
        .collect();
    this.iter()
        .filter(|p| below.get(&(p.name.as_str(), p.arch.as_str())) != Some(&p.version.as_str()))
        .cloned()
        .collect()
}

/// Which layer a document describes, and when.
#[derive(Debug, Clone)]
pub struct DocumentInfo<'a> {
    /// Stack name.
    pub stack: &'a str,
    /// Stack version.
    pub version: &'a str,
    /// Layer name.
    pub layer: &'a str,
    /// RFC 3339 time from the stack's `source_date_epoch`.
    pub created: &'a str,
}

/// `pkg:deb/debian/NAME@VERSION?arch=ARCH`, percent-encoded as the purl spec asks.
pub fn purl(p: &DebPackage) -> String {
    let enc = |s: &str| {
        s.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b".-_~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect::<String>()
    };
    format!(
        "pkg:deb/debian/{}@{}?arch={}",
        enc(&p.name),
        enc(&p.version),
        enc(&p.arch)
    )
}

/// SPDX's `Person: NAME (EMAIL)` from Debian's `NAME <EMAIL>`.
fn supplier(maintainer: Option<&str>) -> String {
    let Some(m) = maintainer.map(str::trim).filter(|m| !m.is_empty()) else {
        return "NOASSERTION".into();
    };
    let clean = |s: &str| s.replace(['(', ')', '<', '>'], "").trim().to_owned();
    match m.split_once('<') {
        Some((name, rest)) => {
            let email = rest.split('>').next().unwrap_or_default();
            format!("Person: {} ({})", clean(name), clean(email))
        }
        None => format!("Person: {}", clean(m)),
    }
}

fn spdx_id(prefix: &str, i: usize, name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("SPDXRef-{prefix}-{i}-{safe}")
}

/// The SPDX 2.3 JSON document of one layer's packages (sorted, as [`parse_status`] gives them):
/// deterministic bytes (canonical JSON; `created` from the stack's `source_date_epoch`, the
/// namespace from stack, version and layer).
pub fn spdx_document(info: &DocumentInfo<'_>, packages: &[DebPackage]) -> Vec<u8> {
    use serde_json::json;
    let layer_id = "SPDXRef-Layer".to_owned();
    let mut spdx_packages = vec![json!({
        "SPDXID": layer_id,
        "name": info.layer,
        "versionInfo": info.version,
        "downloadLocation": "NOASSERTION",
        "filesAnalyzed": false,
        "licenseConcluded": "NOASSERTION",
        "licenseDeclared": "NOASSERTION",
        "copyrightText": "NOASSERTION",
        "comment": format!("layer `{}` of stack {} {}", info.layer, info.stack, info.version),
    })];
    let mut relationships = vec![json!({
        "spdxElementId": "SPDXRef-DOCUMENT",
        "relationshipType": "DESCRIBES",
        "relatedSpdxElement": layer_id,
    })];
    let mut sorted: Vec<&DebPackage> = packages.iter().collect();
    sorted.sort();
    for (i, p) in sorted.into_iter().enumerate() {
        let id = spdx_id("Package", i, &p.name);
        spdx_packages.push(json!({
            "SPDXID": id,
            "name": p.name,
            "versionInfo": p.version,
            "supplier": supplier(p.maintainer.as_deref()),
            "downloadLocation": "NOASSERTION",
            "filesAnalyzed": false,
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "NOASSERTION",
            "copyrightText": "NOASSERTION",
            "externalRefs": [{
                "referenceCategory": "PACKAGE-MANAGER",
                "referenceType": "purl",
                "referenceLocator": purl(p),
            }],
        }));
        relationships.push(json!({
            "spdxElementId": "SPDXRef-DOCUMENT",
            "relationshipType": "DESCRIBES",
            "relatedSpdxElement": id,
        }));
        relationships.push(json!({
            "spdxElementId": layer_id,
            "relationshipType": "CONTAINS",
            "relatedSpdxElement": id,
        }));
    }
    let doc = json!({
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": format!("{}-{}-{}", info.stack, info.version, info.layer),
        "documentNamespace": format!(
            "https://ingot.invalid/spdx/{}/{}/{}",
            info.stack, info.version, info.layer
        ),
        "creationInfo": {
            "created": info.created,
            "creators": [concat!("Tool: ingot-", env!("CARGO_PKG_VERSION"))],
        },
        "packages": spdx_packages,
        "relationships": relationships,
    });
    ingot_layers::descriptor::canonical_json(&doc).expect("JSON values serialize")
}

/// The Debian packages an SBOM blob (as [`spdx_document`] writes it) lists, sorted: read back
/// from each package's purl, its maintainer from `supplier`.
pub fn packages_of(bytes: &[u8], layer: &str) -> Result<Vec<DebPackage>, SbomError> {
    #[derive(Deserialize)]
    struct Doc {
        packages: Vec<Pkg>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Pkg {
        name: String,
        #[serde(default)]
        version_info: String,
        #[serde(default)]
        external_refs: Vec<Ref>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Ref {
        reference_type: String,
        reference_locator: String,
    }
    let doc: Doc = serde_json::from_slice(bytes).map_err(|source| SbomError::Document {
        layer: layer.to_owned(),
        source,
    })?;
    let mut out: Vec<DebPackage> = doc
        .packages
        .into_iter()
        .filter_map(|p| {
            let purl = p
                .external_refs
                .iter()
                .find(|r| r.reference_type == "purl")?;
            let arch = purl.reference_locator.split_once("?arch=")?.1.to_owned();
            Some(DebPackage {
                name: p.name,
                arch,
                version: p.version_info,
                maintainer: None,
            })
        })
        .collect();
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Package: zlib1g\nStatus: install ok installed\nPriority: optional\n\
Maintainer: Mark Brown <broonie@debian.org>\nArchitecture: amd64\nVersion: 1:1.2.13.dfsg-1\n\
Description: compression library\n more text\n .\n\n\
Package: libstdc++6\nStatus: install ok installed\nArchitecture: amd64\nVersion: 12.2.0-14\n\n\
Package: removed\nStatus: deinstall ok config-files\nArchitecture: amd64\nVersion: 1.0\n";

    #[test]
    fn status_parses_installed_only() {
        let p = parse_status(STATUS.as_bytes(), "base", "var/lib/dpkg/status").unwrap();
        let names: Vec<_> = p.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["libstdc++6", "zlib1g"]);
        assert_eq!(p[1].version, "1:1.2.13.dfsg-1");
        assert_eq!(
            purl(&p[1]),
            "pkg:deb/debian/zlib1g@1%3A1.2.13.dfsg-1?arch=amd64"
        );
        assert_eq!(
            purl(&p[0]),
            "pkg:deb/debian/libstdc%2B%2B6@12.2.0-14?arch=amd64"
        );
        assert_eq!(
            supplier(p[1].maintainer.as_deref()),
            "Person: Mark Brown (broonie@debian.org)"
        );
    }

    #[test]
    fn hostile_status() {
        let cases: [(&[u8], &str); 7] = [
            (
                b"Status: install ok installed\nVersion: 1\nArchitecture: all\n",
                "no Package field",
            ),
            (
                b"Package: a\nStatus: install ok installed\nVersion: 1\nArchitecture: all\n\n\
Package: a\nStatus: install ok installed\nVersion: 2\nArchitecture: all\n",
                "listed twice",
            ),
            (b"\x7fELF\x02\x01\x01\0\0\0", "NUL"),
            (b"\xff\xfe junk", "not UTF-8"),
            (b"Package: a\nPackage: b\n", "appears twice"),
            (b"just words\n", "not a `Field: value` line"),
            (
                b"Package: a b\nStatus: install ok installed\nVersion: 1\nArchitecture: all\n",
                "package name",
            ),
        ];
        for (bytes, want) in cases {
            let e = parse_status(bytes, "gpu", "usr/lib/ingot/dpkg/status").unwrap_err();
            let text = e.to_string();
            assert!(text.contains(want), "{text}");
            assert!(text.contains("layer `gpu`") && text.contains("usr/lib/ingot/dpkg/status"));
        }
        let huge = vec![b'a'; MAX_STATUS_SIZE as usize + 1];
        let e = parse_status(&huge, "gpu", "var/lib/dpkg/status").unwrap_err();
        assert!(e.to_string().contains("more than"), "{e}");
    }

    #[test]
    fn delta_and_round_trip() {
        let base = parse_status(STATUS.as_bytes(), "base", "s").unwrap();
        let mut upper = base.clone();
        upper[0].version = "13.0-1".into();
        upper.push(DebPackage {
            name: "nvidia".into(),
            arch: "amd64".into(),
            version: "535".into(),
            maintainer: None,
        });
        let delta = added_or_changed(&upper, &base);
        let names: Vec<_> = delta.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["libstdc++6", "nvidia"]);
        let info = DocumentInfo {
            stack: "demo",
            version: "1.0.0",
            layer: "gpu",
            created: "2024-01-01T00:00:00Z",
        };
        let doc = spdx_document(&info, &delta);
        assert_eq!(doc, spdx_document(&info, &delta), "deterministic");
        let back = packages_of(&doc, "gpu").unwrap();
        let strip = |v: &[DebPackage]| {
            v.iter()
                .map(|p| (p.name.clone(), p.arch.clone(), p.version.clone()))
                .collect::<Vec<_>>()
        };
        // purl round trip keeps the version as versionInfo (unencoded).
        assert_eq!(strip(&back), strip(&delta));
    }
}
