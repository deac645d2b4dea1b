//! The SPDX 2.3 JSON document of one layer's packages, streamed with deterministic bytes, and
//! the packages read back from one.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{check_fields, copyright, show, DebPackage, SbomError, MAX_PACKAGES, MAX_SBOM_SIZE};

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
    /// The stack's distribution (`debian-12`, [`super::distro_of`] of its base), for the
    /// purls' `distro` qualifier; `None` leaves it out.
    pub distro: Option<&'a str>,
}

/// `pkg:deb/debian/NAME@VERSION?arch=ARCH[&distro=DISTRO]`, percent-encoded as the purl spec
/// asks (qualifiers sorted by key).
pub fn purl(p: &DebPackage, distro: Option<&str>) -> String {
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
    let distro = distro.map_or(String::new(), |d| format!("&distro={}", enc(d)));
    format!(
        "pkg:deb/debian/{}@{}?arch={}{distro}",
        enc(&p.name),
        enc(&p.version),
        enc(&p.arch)
    )
}

/// SPDX's supplier from Debian's `Maintainer` (`NAME <EMAIL>`): `Organization: NAME (EMAIL)`
/// for a team (a mailing list, or a name that says team, maintainers, ...), else
/// `Person: NAME (EMAIL)`; `Organization: Debian` for a package that names none (dpkg's status
/// always does; a hand-made one may not).
pub(super) fn supplier(maintainer: Option<&str>) -> String {
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

/// The SPDX 2.3 JSON document of one layer's packages (sorted, as [`super::parse_status`] gives them):
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
    let doc = shape::Document {
        spdxid: "SPDXRef-DOCUMENT",
        creation_info: shape::CreationInfo {
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
            .map(|e| shape::ExtractedInfo {
                extracted_text: &e.text,
                license_id: &e.id,
                name: &e.name,
            })
            .collect(),
        name: format!("{}-{}-{}", info.stack, info.version, info.layer),
        packages: shape::Packages {
            layer: shape::LayerPackage {
                spdxid: shape::LAYER_ID,
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
            distro: info.distro,
        },
        relationships: shape::Relationships(&sorted),
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
pub(super) fn licences<'a>(
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
mod shape {
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
        /// The purls' `distro` qualifier.
        pub distro: Option<&'a str>,
    }

    impl Serialize for Packages<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut seq = s.serialize_seq(Some(self.packages.len() + 1))?;
            seq.serialize_element(&self.layer)?;
            for (i, (p, licence)) in self.packages.iter().zip(self.licences).enumerate() {
                let (id, purl, supplier) = (
                    spdx_id("Package", i, &p.name),
                    purl(p, self.distro),
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
        let Some(arch) = qualifier(&purl.reference_locator, "arch") else {
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

/// The value of a purl's qualifier `key` (still percent-encoded), if it has one.
fn qualifier<'a>(purl: &'a str, key: &str) -> Option<&'a str> {
    let (_, qualifiers) = purl.split_once('?')?;
    let qualifiers = qualifiers.split('#').next().unwrap_or_default();
    qualifiers
        .split('&')
        .find_map(|q| q.strip_prefix(key)?.strip_prefix('='))
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
    use super::qualifier;

    #[test]
    fn a_qualifier_is_found_in_any_order_and_nowhere_else() {
        let q = |p, k| qualifier(p, k);
        let both = "pkg:deb/debian/zlib1g@1%3A1.2.13?arch=amd64&distro=debian-12";
        assert_eq!(q(both, "arch"), Some("amd64"));
        assert_eq!(q(both, "distro"), Some("debian-12"));
        let swapped = "pkg:deb/debian/zlib1g@1?distro=debian-12&arch=all#usr/lib";
        assert_eq!(q(swapped, "arch"), Some("all"));
        assert_eq!(q(swapped, "distro"), Some("debian-12"));
        // Before this ingot wrote `distro`: arch alone.
        assert_eq!(q("pkg:deb/debian/a@1?arch=amd64", "arch"), Some("amd64"));
        for none in [
            "pkg:deb/debian/a@1",
            "pkg:deb/debian/a@1?",
            "pkg:deb/debian/a@1?architecture=amd64",
            "pkg:deb/debian/a@1?xarch=amd64",
            "pkg:deb/debian/a@1#arch=amd64",
        ] {
            assert_eq!(q(none, "arch"), None, "{none}");
        }
    }
}
