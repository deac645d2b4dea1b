//! `ingot inspect`: what a stack artifact holds, and which layers a given machine gets.
//!
//! Inspect reads the manifest and descriptor only (no layer blob is read) and shows the
//! signature's state instead of refusing: use `ingot verify` to check an artifact.

use ingot_layers::descriptor::StackDescriptor;
use ingot_layers::select::{self, Machine};
use ingot_verity::RootHash;
use serde::Serialize;

use crate::display::{safe, Safe};
use ingot_artifact::sbom::DebPackage;
use ingot_artifact::trust_key::TrustedKey;
use ingot_artifact::verify::{
    layer_packages, verify_metadata, ArtifactSource, SignatureStatus, Trust, VerifyError,
};

/// One row of the layer table.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LayerRow {
    /// Layer name.
    pub name: String,
    /// Layer kind.
    pub kind: String,
    /// Rule in text form; `-` for the base layer.
    pub rule: String,
    /// Uncompressed image size in bytes.
    pub size: u64,
    /// Compressed data blob size in bytes.
    pub compressed_size: u64,
    /// Verity hash blob size in bytes.
    pub hash_size: u64,
    /// Verity root hash.
    pub root_hash: RootHash,
    /// Preloaded image references.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub preload: Vec<String>,
    /// With `--packages`: the Debian packages the layer's SBOM lists (absent without one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub packages: Option<Vec<PackageRow>>,
    /// What the layer's kind needs of the machine, when it needs something ([`kind_note`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// What a layer of `kind` needs that the descriptor cannot show: an `nvidia` layer carries
/// out-of-tree kernel modules, which a kernel in Secure Boot's lockdown loads only when they are
/// signed with a key it trusts (whether they are signed is in the layer's data, not read here).
pub fn kind_note(kind: &str) -> Option<String> {
    (kind == "nvidia").then(|| {
        "kernel modules (NVIDIA's, built by DKMS): under Secure Boot (lockdown) Debian's kernel \
         refuses them unless they are signed with a key it trusts (a MOK); without Secure Boot \
         unsigned ones load, tainting the kernel"
            .to_owned()
    })
}

/// One Debian package of a layer.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PackageRow {
    /// Package name.
    pub name: String,
    /// Version.
    pub version: String,
    /// Architecture.
    pub arch: String,
}

impl From<&DebPackage> for PackageRow {
    fn from(p: &DebPackage) -> Self {
        PackageRow {
            name: p.name.clone(),
            version: p.version.clone(),
            arch: p.arch.clone(),
        }
    }
}

/// What `inspect` shows.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InspectReport {
    /// Stack name.
    pub name: String,
    /// Stack version.
    pub version: String,
    /// Creation time.
    pub created: String,
    /// Builder.
    pub builder: String,
    /// `sha256:…` of the image manifest.
    pub manifest_digest: String,
    /// `sha256:…` of the descriptor.
    pub descriptor_digest: String,
    /// `verified`, `unsigned`, `not checked` or `FAILED: …`.
    pub signature: String,
    /// The release's signed UKI (digest, size, its signed command line), if it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uki: Option<ingot_layers::descriptor::UkiBlob>,
    /// The TPM PCR 11 (SHA-256) value systemd-stub leaves when it boots that UKI (hex).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pcr11: Option<String>,
    /// The UKI's signed PCR 11 policy (its key's fingerprint and the phase each signature is
    /// for), checked, if it carries one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pcr_policy: Option<ingot_artifact::pcr_policy::Policy>,
    /// Every layer.
    pub layers: Vec<LayerRow>,
    /// The machine asked about, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine: Option<Machine>,
    /// The layers that machine gets, in stack order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selected: Option<Vec<String>>,
}

fn signature_text(s: &SignatureStatus) -> String {
    match s {
        SignatureStatus::Verified { key_id, .. } => format!("verified (key {key_id})"),
        SignatureStatus::Unsigned => "unsigned".to_owned(),
        SignatureStatus::NotChecked => "present, not checked (no --trust-key)".to_owned(),
        SignatureStatus::Failed(m) => format!("FAILED: {m}"),
    }
}

/// Build the report from a descriptor (no I/O).
pub fn report(
    descriptor: &StackDescriptor,
    manifest_digest: &str,
    descriptor_digest: &str,
    signature: &SignatureStatus,
    machine: Option<&Machine>,
) -> InspectReport {
    let layers = descriptor
        .layers
        .iter()
        .map(|l| LayerRow {
            name: l.name.clone(),
            kind: l.kind.clone(),
            rule: l
                .when
                .as_ref()
                .map_or_else(|| "-".to_owned(), ToString::to_string),
            size: l.size,
            compressed_size: l.data.size,
            hash_size: l.hash.size,
            root_hash: l.verity.root_hash.clone(),
            preload: l.preload.iter().map(|p| p.reference.clone()).collect(),
            packages: None,
            note: kind_note(&l.kind),
        })
        .collect();
    let selected = machine.map(|m| {
        descriptor
            .layers
            .iter()
            .filter(|l| select::selects(l.when.as_ref(), m))
            .map(|l| l.name.clone())
            .collect()
    });
    InspectReport {
        name: descriptor.name.clone(),
        version: descriptor.version.clone(),
        created: descriptor.created.clone(),
        builder: descriptor.builder.clone(),
        manifest_digest: manifest_digest.to_owned(),
        descriptor_digest: descriptor_digest.to_owned(),
        signature: signature_text(signature),
        uki: descriptor.uki.clone(),
        pcr11: None,
        pcr_policy: None,
        layers,
        machine: machine.cloned(),
        selected,
    }
}

/// Read an artifact's manifest and descriptor and build the report; with `packages`, also every
/// layer's SBOM blob (checked against its pinned digest).
pub fn inspect(
    source: &dyn ArtifactSource,
    key: Option<TrustedKey>,
    machine: Option<&Machine>,
    packages: bool,
) -> Result<InspectReport, VerifyError> {
    let trust = Trust {
        key,
        allow_unsigned: true,
    };
    let (r, _) = verify_metadata(source, &trust)?;
    let mut out = report(
        &r.descriptor,
        &r.manifest_digest,
        &r.descriptor_digest,
        &r.signature,
        machine,
    );
    // The UKI, read by its digest and checked: what PCR 11 will hold when a machine boots it.
    if let Some(uki) = ingot_artifact::verify::read_uki(source, &r.descriptor)? {
        let pcr = ingot_artifact::uki::pcr11(&uki).map_err(VerifyError::UkiImage)?;
        out.pcr11 = Some(hex::encode(pcr));
        out.pcr_policy =
            ingot_artifact::pcr_policy::of_uki(&uki).map_err(VerifyError::PcrPolicy)?;
    }
    if packages {
        for (row, layer) in out.layers.iter_mut().zip(&r.descriptor.layers) {
            row.packages =
                layer_packages(source, layer)?.map(|p| p.iter().map(PackageRow::from).collect());
        }
    }
    Ok(out)
}

/// Bytes as KiB/MiB/GiB with one decimal.
pub fn human_size(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The UKI lines of [`render_table`]: its digest and command line, PCR 11, its PCR policy.
fn render_uki(r: &InspectReport, out: &mut String) {
    use std::fmt::Write;
    if let Some(uki) = &r.uki {
        let _ = writeln!(
            out,
            "uki        {} ({}, Secure Boot signed)\ncmdline    {}",
            Safe(&uki.digest),
            human_size(uki.size),
            Safe(&uki.cmdline)
        );
        if let Some(pcr) = &r.pcr11 {
            let _ = writeln!(out, "pcr 11     sha256:{} (systemd-stub)", Safe(pcr));
        }
        if let Some(p) = &r.pcr_policy {
            let phases: Vec<String> = p
                .phases
                .iter()
                .map(|ph| {
                    if ph.is_empty() {
                        "(stub)".into()
                    } else {
                        Safe(ph).to_string()
                    }
                })
                .collect();
            let _ = writeln!(
                out,
                "pcr policy key {} signs PCR 11 in: {}",
                Safe(&p.key),
                phases.join(", ")
            );
        }
    }
}

/// The report as a plain-text table. Every string from the artifact goes through [`Safe`].
pub fn render_table(r: &InspectReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "stack      {} {}", Safe(&r.name), Safe(&r.version));
    let _ = writeln!(
        out,
        "created    {} by {}",
        Safe(&r.created),
        Safe(&r.builder)
    );
    let _ = writeln!(out, "manifest   {}", Safe(&r.manifest_digest));
    let _ = writeln!(out, "descriptor {}", Safe(&r.descriptor_digest));
    let _ = writeln!(out, "signature  {}", Safe(&r.signature));
    render_uki(r, &mut out);
    out.push('\n');
    let header = ["NAME", "KIND", "RULE", "SIZE", "COMPRESSED", "ROOT HASH"];
    let rows: Vec<[String; 6]> = r
        .layers
        .iter()
        .map(|l| {
            [
                safe(&l.name).into_owned(),
                safe(&l.kind).into_owned(),
                safe(&l.rule).into_owned(),
                human_size(l.size),
                human_size(l.compressed_size),
                l.root_hash.to_string(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| -> String {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(cell);
            } else {
                let _ = write!(s, "{cell:<w$}  ");
            }
        }
        s.push('\n');
        s
    };
    out.push_str(&line(&header.map(str::to_owned)));
    for row in &rows {
        out.push_str(&line(row));
    }
    for l in &r.layers {
        for p in &l.preload {
            let _ = write!(out, "\nlayer `{}` preloads {}", Safe(&l.name), Safe(p));
        }
    }
    if r.layers.iter().any(|l| !l.preload.is_empty()) {
        out.push('\n');
    }
    for l in &r.layers {
        if let Some(note) = &l.note {
            let _ = writeln!(out, "\nlayer `{}`: {}", Safe(&l.name), Safe(note));
        }
    }
    for l in &r.layers {
        let Some(packages) = &l.packages else {
            continue;
        };
        let _ = writeln!(
            out,
            "\nlayer `{}`: {} packages",
            Safe(&l.name),
            packages.len()
        );
        for p in packages {
            let _ = writeln!(
                out,
                "  {} {} {}",
                Safe(&p.name),
                Safe(&p.version),
                Safe(&p.arch)
            );
        }
    }
    if let (Some(m), Some(sel)) = (&r.machine, &r.selected) {
        let sel: Vec<_> = sel.iter().map(|s| safe(s)).collect();
        let _ = writeln!(out, "\nmachine {m} gets: {}", sel.join(", "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(human_size(512), "512 B");
        assert_eq!(human_size(4096), "4.0 KiB");
        assert_eq!(human_size(3 << 20), "3.0 MiB");
    }

    #[test]
    fn an_nvidia_layer_says_what_its_modules_need() {
        let note = kind_note("nvidia").unwrap();
        assert!(
            note.contains("Secure Boot") && note.contains("signed"),
            "{note}"
        );
        for kind in ["base", "kata", "control-plane", "gpu"] {
            assert_eq!(kind_note(kind), None, "{kind}");
        }
    }

    /// Every string of a report, hostile: the table shows none raw, and forges no line.
    #[test]
    fn the_table_shows_no_string_raw() {
        let evil = |what: &str| format!("{what}\u{1b}]0;pwned\u{7}\nforged\u{202e}");
        let layer = LayerRow {
            name: evil("name"),
            kind: evil("kind"),
            rule: evil("rule"),
            size: 1,
            compressed_size: 1,
            hash_size: 1,
            root_hash: "c".repeat(64).parse().unwrap(),
            preload: vec![evil("preload")],
            packages: Some(vec![PackageRow {
                name: evil("package"),
                version: evil("version"),
                arch: evil("arch"),
            }]),
            note: Some(evil("note")),
        };
        let report = InspectReport {
            name: evil("stack"),
            version: evil("version"),
            created: evil("created"),
            builder: evil("builder"),
            manifest_digest: evil("manifest"),
            descriptor_digest: evil("descriptor"),
            signature: evil("FAILED: "),
            uki: Some(ingot_layers::descriptor::UkiBlob {
                digest: evil("uki"),
                size: 1,
                cmdline: evil("cmdline"),
            }),
            pcr11: Some(evil("pcr")),
            pcr_policy: Some(ingot_artifact::pcr_policy::Policy {
                key: evil("pkfp"),
                phases: vec![evil("phase")],
            }),
            layers: vec![layer],
            machine: None,
            selected: None,
        };
        let table = render_table(&report);
        assert!(
            !table
                .chars()
                .any(|c| c.is_control() && c != '\n' || c == '\u{202e}'),
            "{table:?}"
        );
        assert!(!table.lines().any(|l| l.starts_with("forged")), "{table}");
        assert!(
            table.contains("  package\\u{1b}]0;pwned\\u{7}\\nforged"),
            "{table}"
        );
    }
}
