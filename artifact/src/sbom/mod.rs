//! What a release records of its packages: per layer, the Debian packages its dpkg status
//! holds, as an SPDX 2.3 JSON document stored as a blob the signed descriptor pins. Each
//! package carries its supplier (from `Maintainer`), its purl, its `.deb`'s SHA-256 when the
//! build knows it, and its declared licence from its DEP-5 copyright file ([`copyright`]), so
//! the document holds the NTIA minimum elements.
//!
//! One module per job: `status` (the dpkg status, and what each layer lists), [`copyright`]
//! (the declared licence), `spdx` (the document, and the packages read back from one). Here:
//! the limits both sides share, the package, the errors.
//!
//! The dpkg status and the copyright files are parsed here rather than with a deb822 crate:
//! none is in the lock file, and the candidates (`deb822-lossless` keeps a lossless rowan
//! syntax tree; `debian-control` builds on it) bring a parser for a whole syntax tree where a
//! few fields are needed, under limits we set ourselves (file size, field size, entry count).
//! The status parser is bounded in every dimension and refuses what it does not understand;
//! the copyright parser is bounded too and, since a licence is not worth failing a build
//! over, says nothing (`NOASSERTION`) of what it does not understand.

pub mod copyright;
mod spdx;
mod status;

pub use spdx::{
    packages_of, purl, spdx_document, spdx_document_within, write_spdx, DocumentInfo,
    MAX_LICENCE_BYTES,
};
pub use status::{
    added_or_changed, declare_licences, distro_from_os_release, distro_of, layer_packages,
    parse_status, status_of, MAX_DISTRO_FIELD,
};

use serde::{Deserialize, Serialize};

/// Media type of an SBOM blob (IANA's for SPDX JSON).
pub const SBOM_MEDIA_TYPE: &str = "application/spdx+json";
/// Where a layer's dpkg status is read: dpkg's own place, and where a base whose `/var` is
/// emptied before the build keeps a copy (`ingot build`'s Debian trees).
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

/// At most 64 characters of `s`, to quote in a message (whoever prints it escapes what a
/// terminal would act on: `ingot`'s printers do).
pub(crate) fn show(s: &str) -> String {
    s.chars().take(64).collect()
}

/// The builder's rules for the fields an SBOM lists, which readers apply too: `None` when they
/// hold, else what is wrong.
pub(crate) fn check_fields(name: &str, arch: &str, version: &str) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use super::spdx::{licences, supplier};
    use super::*;

    const STATUS: &str = "Package: zlib1g\nStatus: install ok installed\nPriority: optional\n\
Maintainer: Mark Brown <broonie@debian.org>\nArchitecture: amd64\nVersion: 1:1.2.13.dfsg-1\n\
Description: compression library\n more text\n .\n\n\
Package: libstdc++6\nStatus: install ok installed\nArchitecture: amd64\nVersion: 12.2.0-14\n\n\
Package: removed\nStatus: deinstall ok config-files\nArchitecture: amd64\nVersion: 1.0\n";

    #[test]
    fn the_distro_comes_from_os_release() {
        let bookworm = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\n\
                        VERSION_ID=\"12\"\nVERSION=\"12 (bookworm)\"\nVERSION_CODENAME=bookworm\nID=debian\n";
        assert_eq!(
            distro_from_os_release(bookworm).as_deref(),
            Some("debian-12")
        );
        let trixie = "ID=debian\nVERSION_CODENAME=trixie\n";
        assert_eq!(
            distro_from_os_release(trixie).as_deref(),
            Some("debian-trixie")
        );
        for bad in [
            "ID=debian\n",
            "VERSION_ID=12\n",
            "ID=\"Debian Linux\"\nVERSION_ID=12\n",
            &format!("ID={}\nVERSION_ID=12\n", "d".repeat(33)),
        ] {
            assert_eq!(distro_from_os_release(bad), None, "{bad}");
        }
    }

    #[test]
    fn status_parses_installed_only() {
        let p = parse_status(STATUS.as_bytes(), "base", "var/lib/dpkg/status").unwrap();
        let names: Vec<_> = p.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["libstdc++6", "zlib1g"]);
        assert_eq!(p[1].version, "1:1.2.13.dfsg-1");
        assert_eq!(
            purl(&p[1], None),
            "pkg:deb/debian/zlib1g@1%3A1.2.13.dfsg-1?arch=amd64"
        );
        assert_eq!(
            purl(&p[0], Some("debian-12")),
            "pkg:deb/debian/libstdc%2B%2B6@12.2.0-14?arch=amd64&distro=debian-12"
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
            distro: Some("debian-12"),
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
            distro: None,
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
        // The longest distro qualifier os-release can give.
        let distro = format!(
            "{}-{}",
            "i".repeat(status::MAX_DISTRO_FIELD),
            "v".repeat(status::MAX_DISTRO_FIELD)
        );
        let info = DocumentInfo {
            stack: &stack,
            version: &version,
            layer: &layer,
            created: "2024-01-01T00:00:00Z",
            distro: Some(&distro),
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
