//! What a release records of its packages: per layer, the Debian packages its dpkg status
//! holds, as an SPDX 2.3 JSON document stored as a blob the signed descriptor pins. Each
//! package carries its supplier (from `Maintainer`), its purl, its `.deb`'s SHA-256 when the
//! build knows it, and its declared licence from its DEP-5 copyright file ([`copyright`]), so
//! the document holds the NTIA minimum elements.
//!
//! The dpkg status is parsed here rather than with a deb822 crate: none is in the lock file,
//! and the candidates (`deb822-lossless` keeps a lossless rowan syntax tree; `debian-control`
//! builds on it) bring a parser for a whole syntax tree where five fields of one file are
//! needed, under limits we set ourselves (file size, field size, entry count). The parser below
//! is bounded in every dimension and refuses what it does not understand.

pub mod copyright;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Media type of an SBOM blob (IANA's for SPDX JSON).
pub const SBOM_MEDIA_TYPE: &str = "application/spdx+json";
/// Where a layer's dpkg status is read: dpkg's own place, and where a base whose `/var` is
/// emptied before the build keeps a copy (`manifests/debian/build`).
pub const STATUS_PATHS: [&str; 2] = ["var/lib/dpkg/status", "usr/lib/ingot/dpkg/status"];
/// The largest dpkg status read (a full Debian desktop's is about 3 MiB).
pub const MAX_STATUS_SIZE: u64 = 32 << 20;
/// The most packages one status may list (Debian 12's whole amd64 archive has about 64,000).
pub const MAX_PACKAGES: usize = 65_536;
/// The longest package name (Debian's longest are under 70 bytes).
pub const MAX_NAME: usize = 128;
/// The longest version, epoch included.
pub const MAX_VERSION: usize = 128;
/// The longest architecture (`amd64`, `musl-linux-arm64`).
pub const MAX_ARCH: usize = 32;
/// The longest `Maintainer`.
pub const MAX_MAINTAINER: usize = 256;
/// The largest SBOM blob: the one limit for both sides. `ingot build` refuses a layer whose SBOM
/// would be larger, and every reader (`verify`, `inspect --packages`, `diff`) accepts up to it.
/// The limits above keep every SBOM a build can make below it (the test
/// `the_largest_document_the_limits_allow_fits_the_read_limit` computes that document).
pub const MAX_SBOM_SIZE: u64 = 256 << 20;

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
    /// Its declared licence ([`copyright::declared`] of its copyright file in the layer's
    /// tree); `None`: not said (`NOASSERTION`).
    #[serde(skip)]
    pub declared: Option<copyright::Declared>,
    /// The SHA-256 (lowercase hex) of the `.deb` it was installed from, when the build knows it
    /// (a layer made from `source.debian`: stack.lock's).
    #[serde(skip)]
    pub sha256: Option<String>,
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
    /// An SBOM larger than readers accept: refused when built, and when read.
    #[error("layer `{layer}`: the SBOM is {size} bytes, more than the {limit} an SBOM may have")]
    TooLarge {
        /// The layer.
        layer: String,
        /// Its size.
        size: u64,
        /// The limit ([`MAX_SBOM_SIZE`]).
        limit: u64,
    },
    /// An SBOM lists a package the builder would not have written.
    #[error("layer `{layer}`: the SBOM lists {reason}")]
    Package {
        /// The layer.
        layer: String,
        /// Which package, and what is wrong.
        reason: String,
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
        if let Some(max) = field_limit(name).filter(|max| value.len() > *max) {
            return Err(refuse(format!(
                "line {n}: field {name} is longer than {max} bytes"
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

/// The longest value a kept field may have; `None` for the fields not kept.
fn field_limit(field: &str) -> Option<usize> {
    Some(match field {
        "Package" => MAX_NAME,
        "Version" => MAX_VERSION,
        "Architecture" => MAX_ARCH,
        "Maintainer" => MAX_MAINTAINER,
        "Status" => 64,
        _ => return None,
    })
}

/// At most 64 characters of `s`, to quote in a message (whoever prints it escapes what a
/// terminal would act on: `ingot`'s printers do).
fn show(s: &str) -> String {
    s.chars().take(64).collect()
}

/// The builder's rules for the fields an SBOM lists, which readers apply too: `None` when they
/// hold, else what is wrong.
fn check_fields(name: &str, arch: &str, version: &str) -> Option<String> {
    let ok_name = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b))
    };
    let ok_version = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".+-~:".contains(&b))
    };
    let bad = |what: &str, v: &str| Some(format!("{what} `{}` is not valid", show(v)));
    for (what, v, max, ok) in [
        ("package name", name, MAX_NAME, ok_name(name)),
        ("architecture", arch, MAX_ARCH, ok_name(arch)),
        ("version", version, MAX_VERSION, ok_version(version)),
    ] {
        if v.is_empty() || v.len() > max || !ok {
            return bad(what, v);
        }
    }
    None
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
    if let Some(why) = check_fields(name, arch, version) {
        return Err(format!("the entry at line {line}: {why}"));
    }
    let maintainer = fields.get("Maintainer").copied();
    if let Some(m) = maintainer.filter(|m| m.chars().any(char::is_control)) {
        return Err(format!(
            "the entry at line {line}: Maintainer `{}` holds a control character",
            show(m)
        ));
    }
    let pkg = DebPackage {
        name: name.to_owned(),
        arch: arch.to_owned(),
        version: version.to_owned(),
        maintainer: maintainer.map(str::to_owned),
        declared: None,
        sha256: None,
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
            let mut packages = parse_status(&bytes, layer, path)?;
            declare_licences(tree, &mut packages);
            return Ok(Some(packages));
        }
    }
    Ok(None)
}

/// Each package's declared licence from its copyright file in `tree` ([`copyright::declared`]);
/// a file that is missing, too large, not a regular file or not DEP-5 says nothing.
pub fn declare_licences(tree: &ingot_layers::tree::Tree, packages: &mut [DebPackage]) {
    let mut seen: BTreeMap<String, Option<copyright::Declared>> = BTreeMap::new();
    for p in packages {
        let declared = seen.entry(p.name.clone()).or_insert_with(|| {
            tree.read_file_bounded(&copyright::path(&p.name), copyright::MAX_COPYRIGHT_SIZE)
                .ok()
                .flatten()
                .and_then(|bytes| copyright::declared(&bytes))
        });
        p.declared = declared.clone();
    }
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

/// SPDX's supplier from Debian's `Maintainer` (`NAME <EMAIL>`): `Organization: NAME (EMAIL)`
/// for a team (a mailing list, or a name that says team, maintainers, ...), else
/// `Person: NAME (EMAIL)`; `Organization: Debian` for a package that names none (dpkg's status
/// always does; a hand-made one may not).
fn supplier(maintainer: Option<&str>) -> String {
    let Some(m) = maintainer.map(str::trim).filter(|m| !m.is_empty()) else {
        return "Organization: Debian".into();
    };
    let clean = |s: &str| s.replace(['(', ')', '<', '>'], "").trim().to_owned();
    let (name, email) = match m.split_once('<') {
        Some((name, rest)) => (
            clean(name),
            clean(rest.split('>').next().unwrap_or_default()),
        ),
        None => (clean(m), String::new()),
    };
    let name = if name.is_empty() { email.clone() } else { name };
    let lower = format!("{name} {email}").to_lowercase();
    let team = [
        "lists.",
        "@lists",
        "alioth",
        "maintainers",
        "team",
        "developers",
        "packagers",
        "group",
        "project",
        "debian ",
    ]
    .iter()
    .any(|w| lower.contains(w));
    let kind = if team { "Organization" } else { "Person" };
    if email.is_empty() {
        format!("{kind}: {name}")
    } else {
        format!("{kind}: {name} ({email})")
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
/// namespace from stack, version and layer). Refused, naming the layer, when it would be larger
/// than [`MAX_SBOM_SIZE`].
pub fn spdx_document(
    info: &DocumentInfo<'_>,
    packages: &[DebPackage],
) -> Result<Vec<u8>, SbomError> {
    spdx_document_within(info, packages, MAX_SBOM_SIZE)
}

/// [`spdx_document`] under another limit: never holds more than `limit` bytes of it.
pub fn spdx_document_within(
    info: &DocumentInfo<'_>,
    packages: &[DebPackage],
    limit: u64,
) -> Result<Vec<u8>, SbomError> {
    let mut out = Bounded {
        bytes: Vec::new(),
        size: 0,
        limit,
    };
    write_spdx(info, packages, &mut out).expect("writing to memory does not fail");
    if out.size > limit {
        return Err(SbomError::TooLarge {
            layer: info.layer.to_owned(),
            size: out.size,
            limit,
        });
    }
    Ok(out.bytes)
}

/// Keeps what is written up to `limit` bytes and counts the rest, so a refused document's size
/// can be said without holding it.
struct Bounded {
    bytes: Vec<u8>,
    size: u64,
    limit: u64,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.size += buf.len() as u64;
        if self.size <= self.limit {
            self.bytes.extend_from_slice(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Streams the document to `out`, one package at a time (nothing but the package being written
/// is held). The structs below declare their fields in byte order of their JSON keys, the
/// order canonical JSON (a `serde_json::Value`'s sorted map) gives, so the bytes are the same.
pub fn write_spdx(
    info: &DocumentInfo<'_>,
    packages: &[DebPackage],
    out: impl std::io::Write,
) -> serde_json::Result<()> {
    let mut sorted: Vec<&DebPackage> = packages.iter().collect();
    sorted.sort();
    let (licences, extracted) = licences(&sorted);
    let layer_supplier = format!("Organization: {}", info.stack);
    let layer_comment = format!(
        "layer `{}` of stack {} {}",
        info.layer, info.stack, info.version
    );
    let doc = spdx::Document {
        spdxid: "SPDXRef-DOCUMENT",
        creation_info: spdx::CreationInfo {
            created: info.created,
            creators: [concat!("Tool: ingot-", env!("CARGO_PKG_VERSION"))],
        },
        data_license: "CC0-1.0",
        document_namespace: format!(
            "https://ingot.invalid/spdx/{}/{}/{}",
            info.stack, info.version, info.layer
        ),
        has_extracted_licensing_infos: extracted
            .values()
            .map(|e| spdx::ExtractedInfo {
                extracted_text: &e.text,
                license_id: &e.id,
                name: &e.name,
            })
            .collect(),
        name: format!("{}-{}-{}", info.stack, info.version, info.layer),
        packages: spdx::Packages {
            layer: spdx::LayerPackage {
                spdxid: spdx::LAYER_ID,
                comment: &layer_comment,
                copyright_text: NOASSERTION,
                download_location: NOASSERTION,
                files_analyzed: false,
                license_concluded: NOASSERTION,
                license_declared: NOASSERTION,
                name: info.layer,
                supplier: &layer_supplier,
                version_info: info.version,
            },
            packages: &sorted,
            licences: &licences,
        },
        relationships: spdx::Relationships(&sorted),
        spdx_version: "SPDX-2.3",
    };
    serde_json::to_writer(out, &doc)
}

const NOASSERTION: &str = "NOASSERTION";

/// The most bytes of licences one document declares: the packages' expressions and the texts
/// of the `LicenseRef-`s they name (`hasExtractedLicensingInfos`, each text once). A package
/// whose licence would go past it is `NOASSERTION` (a real layer's come to a few hundred KiB).
pub const MAX_LICENCE_BYTES: usize = 8 << 20;

/// Per package (as sorted), its declared licence expression, and the `LicenseRef-`s those
/// name: each package's own while they stay within [`MAX_LICENCE_BYTES`].
fn licences<'a>(
    sorted: &[&'a DebPackage],
) -> (
    Vec<Option<&'a str>>,
    BTreeMap<&'a str, &'a copyright::Extracted>,
) {
    let mut extracted = BTreeMap::new();
    let mut total = 0;
    let out = sorted
        .iter()
        .map(|p| {
            let d = p.declared.as_ref()?;
            let new: usize = d
                .extracted
                .iter()
                .filter(|e| !extracted.contains_key(e.id.as_str()))
                .map(|e| e.text.len() + e.name.len())
                .sum();
            let cost = d.expression.len() + new;
            if total + cost > MAX_LICENCE_BYTES {
                return None;
            }
            total += cost;
            for e in &d.extracted {
                extracted.insert(e.id.as_str(), e);
            }
            Some(d.expression.as_str())
        })
        .collect();
    (out, extracted)
}

/// The document's JSON shape, serialized from borrowed data.
mod spdx {
    use serde::ser::{SerializeSeq, Serializer};
    use serde::Serialize;

    use super::{purl, spdx_id, supplier, DebPackage, NOASSERTION};

    pub(super) const LAYER_ID: &str = "SPDXRef-Layer";

    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    pub(super) struct Document<'a> {
        #[serde(rename = "SPDXID")]
        pub spdxid: &'a str,
        pub creation_info: CreationInfo<'a>,
        pub data_license: &'a str,
        pub document_namespace: String,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        pub has_extracted_licensing_infos: Vec<ExtractedInfo<'a>>,
        pub name: String,
        pub packages: Packages<'a>,
        pub relationships: Relationships<'a>,
        pub spdx_version: &'a str,
    }

    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    pub(super) struct ExtractedInfo<'a> {
        pub extracted_text: &'a str,
        pub license_id: &'a str,
        pub name: &'a str,
    }

    #[derive(Serialize)]
    pub(super) struct CreationInfo<'a> {
        pub created: &'a str,
        pub creators: [&'a str; 1],
    }

    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    pub(super) struct LayerPackage<'a> {
        #[serde(rename = "SPDXID")]
        pub spdxid: &'a str,
        pub comment: &'a str,
        pub copyright_text: &'a str,
        pub download_location: &'a str,
        pub files_analyzed: bool,
        pub license_concluded: &'a str,
        pub license_declared: &'a str,
        pub name: &'a str,
        pub supplier: &'a str,
        pub version_info: &'a str,
    }

    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Package<'a> {
        #[serde(rename = "SPDXID")]
        spdxid: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        checksums: Option<[Checksum<'a>; 1]>,
        copyright_text: &'a str,
        download_location: &'a str,
        external_refs: [ExternalRef<'a>; 1],
        files_analyzed: bool,
        license_concluded: &'a str,
        license_declared: &'a str,
        name: &'a str,
        supplier: &'a str,
        version_info: &'a str,
    }

    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Checksum<'a> {
        algorithm: &'a str,
        checksum_value: &'a str,
    }

    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct ExternalRef<'a> {
        reference_category: &'a str,
        reference_locator: &'a str,
        reference_type: &'a str,
    }

    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Relationship<'a> {
        related_spdx_element: &'a str,
        relationship_type: &'a str,
        spdx_element_id: &'a str,
    }

    /// The layer, then each package (sorted), built as it is written.
    pub(super) struct Packages<'a> {
        pub layer: LayerPackage<'a>,
        pub packages: &'a [&'a DebPackage],
        /// Each package's declared licence (`None`: `NOASSERTION`).
        pub licences: &'a [Option<&'a str>],
    }

    impl Serialize for Packages<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut seq = s.serialize_seq(Some(self.packages.len() + 1))?;
            seq.serialize_element(&self.layer)?;
            for (i, (p, licence)) in self.packages.iter().zip(self.licences).enumerate() {
                let (id, purl, supplier) = (
                    spdx_id("Package", i, &p.name),
                    purl(p),
                    supplier(p.maintainer.as_deref()),
                );
                seq.serialize_element(&Package {
                    spdxid: &id,
                    checksums: p.sha256.as_deref().map(|v| {
                        [Checksum {
                            algorithm: "SHA256",
                            checksum_value: v,
                        }]
                    }),
                    copyright_text: NOASSERTION,
                    download_location: NOASSERTION,
                    external_refs: [ExternalRef {
                        reference_category: "PACKAGE-MANAGER",
                        reference_locator: &purl,
                        reference_type: "purl",
                    }],
                    files_analyzed: false,
                    license_concluded: NOASSERTION,
                    license_declared: licence.unwrap_or(NOASSERTION),
                    name: &p.name,
                    supplier: &supplier,
                    version_info: &p.version,
                })?;
            }
            seq.end()
        }
    }

    /// The document describes the layer and every package; the layer contains each package.
    pub(super) struct Relationships<'a>(pub &'a [&'a DebPackage]);

    impl Serialize for Relationships<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            fn rel<'a>(from: &'a str, kind: &'a str, to: &'a str) -> Relationship<'a> {
                Relationship {
                    related_spdx_element: to,
                    relationship_type: kind,
                    spdx_element_id: from,
                }
            }
            let mut seq = s.serialize_seq(Some(2 * self.0.len() + 1))?;
            seq.serialize_element(&rel("SPDXRef-DOCUMENT", "DESCRIBES", LAYER_ID))?;
            for (i, p) in self.0.iter().enumerate() {
                let id = spdx_id("Package", i, &p.name);
                seq.serialize_element(&rel("SPDXRef-DOCUMENT", "DESCRIBES", &id))?;
                seq.serialize_element(&rel(LAYER_ID, "CONTAINS", &id))?;
            }
            seq.end()
        }
    }
}

/// The Debian packages an SBOM blob (as [`spdx_document`] writes it) lists, sorted: read back
/// from each package's purl, its maintainer from `supplier`. The builder's limits and character
/// rules hold here too: a blob over [`MAX_SBOM_SIZE`], more than [`MAX_PACKAGES`] packages, or a
/// name, version or architecture the builder would refuse is refused, naming the layer.
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
    if bytes.len() as u64 > MAX_SBOM_SIZE {
        return Err(SbomError::TooLarge {
            layer: layer.to_owned(),
            size: bytes.len() as u64,
            limit: MAX_SBOM_SIZE,
        });
    }
    let doc: Doc = serde_json::from_slice(bytes).map_err(|source| SbomError::Document {
        layer: layer.to_owned(),
        source,
    })?;
    let refuse = |reason: String| SbomError::Package {
        layer: layer.to_owned(),
        reason,
    };
    let mut out = Vec::new();
    for p in doc.packages {
        let Some(purl) = p.external_refs.iter().find(|r| r.reference_type == "purl") else {
            continue; // the layer's own entry
        };
        let Some((_, arch)) = purl.reference_locator.split_once("?arch=") else {
            continue;
        };
        let arch = percent_decode(arch);
        if let Some(why) = check_fields(&p.name, &arch, &p.version_info) {
            return Err(refuse(format!("package `{}`: {why}", show(&p.name))));
        }
        if out.len() == MAX_PACKAGES {
            return Err(refuse(format!("more than {MAX_PACKAGES} packages")));
        }
        out.push(DebPackage {
            name: p.name,
            arch,
            version: p.version_info,
            maintainer: None,
            declared: None,
            sha256: None,
        });
    }
    out.sort();
    Ok(out)
}

/// A purl component with its `%XX` escapes decoded (one that does not decode stays as it is,
/// and fails the character rules).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .filter(|h| b[i] == b'%' && h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| std::str::from_utf8(h).ok());
        match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_owned())
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
        for (maintainer, want) in [
            (
                Some("GNU Libc Maintainers <debian-glibc@lists.debian.org>"),
                "Organization: GNU Libc Maintainers (debian-glibc@lists.debian.org)",
            ),
            (
                Some("Debian Go Packaging Team <team+pkg-go@tracker.debian.org>"),
                "Organization: Debian Go Packaging Team (team+pkg-go@tracker.debian.org)",
            ),
            (
                Some("Jane (J) Doe <jd@example.org>"),
                "Person: Jane J Doe (jd@example.org)",
            ),
            (None, "Organization: Debian"),
        ] {
            assert_eq!(supplier(maintainer), want);
        }
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
            declared: None,
            sha256: None,
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
        let doc = spdx_document(&info, &delta).unwrap();
        assert_eq!(doc, spdx_document(&info, &delta).unwrap(), "deterministic");
        let back = packages_of(&doc, "gpu").unwrap();
        let strip = |v: &[DebPackage]| {
            v.iter()
                .map(|p| (p.name.clone(), p.arch.clone(), p.version.clone()))
                .collect::<Vec<_>>()
        };
        // purl round trip keeps the version as versionInfo (unencoded).
        assert_eq!(strip(&back), strip(&delta));
    }

    fn info<'a>(layer: &'a str, version: &'a str) -> DocumentInfo<'a> {
        DocumentInfo {
            stack: "demo",
            version,
            layer,
            created: "2024-01-01T00:00:00Z",
        }
    }

    /// Counts what is written, keeping nothing.
    #[derive(Default)]
    struct Count(u64);

    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_streamed_document_is_canonical_json() {
        let mut packages = parse_status(STATUS.as_bytes(), "base", "s").unwrap();
        // With every optional part: a checksum, a declared licence with a LicenseRef.
        packages[1].sha256 = Some("ab".repeat(32));
        packages[1].declared = copyright::declared(
            b"Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\n\
Files: *\nLicense: Zlib and other\n\nLicense: other\n Do \"what\" you like.\n",
        );
        assert!(packages[1].declared.is_some());
        let doc = spdx_document(&info("gpu", "1.0.0"), &packages).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&doc).unwrap();
        assert_eq!(value["packages"][2]["checksums"][0]["algorithm"], "SHA256");
        let extracted = &value["hasExtractedLicensingInfos"][0];
        assert_eq!(extracted["extractedText"], "Do \"what\" you like.");
        assert_eq!(
            value["packages"][2]["licenseDeclared"],
            format!("Zlib AND {}", extracted["licenseId"].as_str().unwrap())
        );
        assert_eq!(
            String::from_utf8(ingot_layers::descriptor::canonical_json(&value).unwrap()).unwrap(),
            String::from_utf8(doc).unwrap(),
            "the streamed bytes are the canonical form of the same document"
        );
        assert_eq!(value["packages"].as_array().unwrap().len(), 3);
        assert_eq!(value["relationships"].as_array().unwrap().len(), 5);
    }

    /// The largest SBOM the status limits let a build make: `MAX_PACKAGES` packages, each with
    /// every field at its longest and of the characters that grow most in JSON and in the purl,
    /// under the longest stack, version and layer names a descriptor allows. Readers accept it.
    #[test]
    fn the_largest_document_the_limits_allow_fits_the_read_limit() {
        let worst = DebPackage {
            name: "+".repeat(MAX_NAME),
            arch: "+".repeat(MAX_ARCH),
            version: ":".repeat(MAX_VERSION),
            maintainer: Some("\"".repeat(MAX_MAINTAINER)),
            declared: Some(copyright::Declared {
                expression: "A".into(),
                extracted: Vec::new(),
            }),
            sha256: Some("0".repeat(64)),
        };
        assert!(check_fields(&worst.name, &worst.arch, &worst.version).is_none());
        let mut packages = vec![worst; MAX_PACKAGES];
        // The licences' bytes up to the document's limit, as texts of the character JSON grows
        // most (a text with a control character but tab and newline is unsaid), on the package
        // sorted last.
        let text = "\"".repeat(copyright::MAX_LICENSE_TEXT);
        let texts = (MAX_LICENCE_BYTES - MAX_PACKAGES) / (text.len() + copyright::MAX_NAME);
        packages[0].declared.as_mut().unwrap().extracted = (0..texts)
            .map(|i| copyright::Extracted {
                id: format!("LicenseRef-{i:0>48}-00000000"),
                name: "\"".repeat(copyright::MAX_NAME),
                text: text.clone(),
            })
            .collect();
        let (stack, layer) = ("s".repeat(64), "l".repeat(64));
        let version = "\"".repeat(128);
        let info = DocumentInfo {
            stack: &stack,
            version: &version,
            layer: &layer,
            created: "2024-01-01T00:00:00Z",
        };
        let mut size = Count::default();
        write_spdx(&info, &packages, &mut size).unwrap();
        let mut sorted: Vec<&DebPackage> = packages.iter().collect();
        sorted.sort();
        let (said, extracted) = licences(&sorted);
        assert!(
            said.iter().all(Option::is_some),
            "every licence fits the budget"
        );
        assert_eq!(extracted.len(), texts);
        println!(
            "the largest SBOM: {} bytes ({} MiB), the read limit {MAX_SBOM_SIZE}",
            size.0,
            size.0 >> 20
        );
        assert!(size.0 <= MAX_SBOM_SIZE, "{} > {MAX_SBOM_SIZE}", size.0);
    }

    #[test]
    fn a_document_over_the_limit_is_refused_naming_the_layer_the_size_and_the_limit() {
        let packages = parse_status(STATUS.as_bytes(), "base", "s").unwrap();
        let full = spdx_document(&info("gpu", "1.0.0"), &packages).unwrap();
        let size = full.len() as u64;
        assert_eq!(
            spdx_document_within(&info("gpu", "1.0.0"), &packages, size).unwrap(),
            full
        );
        let e = spdx_document_within(&info("gpu", "1.0.0"), &packages, size - 1).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "layer `gpu`: the SBOM is {size} bytes, more than the {} an SBOM may have",
                size - 1
            )
        );
    }

    #[test]
    fn readers_refuse_what_the_builder_refuses() {
        let packages = parse_status(STATUS.as_bytes(), "base", "s").unwrap();
        let good = spdx_document(&info("gpu", "1.0.0"), &packages).unwrap();
        let text = String::from_utf8(good).unwrap();
        let long = format!("\"name\":\"{}\"", "a".repeat(MAX_NAME + 1));
        let cases = [
            (
                "\"name\":\"zlib1g\"",
                "\"name\":\"zlib1g\\u001b]0;owned\\u0007\"",
                "package name",
            ),
            (
                "\"versionInfo\":\"1:1.2.13.dfsg-1\"",
                "\"versionInfo\":\"1.0\\nforged line\"",
                "version",
            ),
            ("arch=amd64", "arch=amd%0A64", "architecture"),
            ("\"name\":\"libstdc++6\"", &long, "package name"),
        ];
        for (from, to, want) in cases {
            let hostile = text.replacen(from, to, 1);
            assert_ne!(hostile, text, "{from}");
            let e = packages_of(hostile.as_bytes(), "gpu")
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with("layer `gpu`: the SBOM lists package `"),
                "{e}"
            );
            assert!(e.contains(want), "{e}");
        }
        let e = packages_of(&vec![b' '; MAX_SBOM_SIZE as usize + 1], "gpu").unwrap_err();
        assert!(e.to_string().contains("more than the"), "{e}");
    }

    #[test]
    fn the_builder_refuses_control_characters_in_maintainer() {
        let status = STATUS.replace("Mark Brown", "Mark\x1b[2J Brown");
        let e = parse_status(status.as_bytes(), "gpu", "s").unwrap_err();
        assert!(e.to_string().contains("control character"), "{e}");
    }
}
