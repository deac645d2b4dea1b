//! `ingot build`: CLI glue for [`crate::build`].

use crate::events::Events;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use crate::build::{build_with, BuildOptions};
use crate::manifest::Manifest;
use anyhow::Context;
use clap::Args;
use ingot_artifact::compress::{DEFAULT_FRAME_SIZE, DEFAULT_LEVEL};
use ingot_artifact::sign::SecretKey;

/// Build a stack release: every layer as a deterministic ext4 image sealed with dm-verity,
/// compressed in independent zstd frames, described by a stack descriptor, signed, and written
/// as an OCI image layout.
///
/// The output is written to a temporary directory next to OUT and renamed at the end: a failed
/// build leaves nothing. Two builds of one manifest give the same bytes.
///
/// A layer whose source is `debian` (docs/debian-build.md) is made first, as root, by mmdebstrap
/// and apt: they resolve, download, check the archive's signatures and install. A base is made by
/// mmdebstrap; a layer `over` it is what apt installs in an overlay on the base's tree (its
/// maintainer scripts see the base), with kernel modules built by dkms in a throw-away chroot for
/// the base's kernel. ingot pins what they installed in stack.lock beside the manifest (every package's version, architecture and
/// .deb SHA-256, the suites' Release dates, the kernel) and keeps the .deb files in a cache named
/// by their hashes. A later build installs what the lock says; --update moves it forward. Each
/// finished tree is kept in the tree cache under a hash of everything that made it (its lock
/// entry, declaration, the layers below, source_date_epoch, the ingot version): a build with
/// nothing changed reuses it and runs no mmdebstrap; --rebuild makes it again.
#[derive(Args, Debug)]
pub struct BuildArgs {
    /// The stack manifest (TOML; see docs/manifest.md). A layer whose source is `debian` is made
    /// first, as root, by mmdebstrap and apt (they resolve, download, check signatures and
    /// install; ingot pins the result in stack.lock beside the manifest and caches the .debs:
    /// docs/debian-build.md).
    pub manifest: PathBuf,
    /// The OCI image layout directory to write (must not exist, unless --force).
    #[arg(long, short)]
    pub out: PathBuf,
    /// Sign the stack descriptor with this unencrypted minisign secret key (made by
    /// `ingot key generate` or `minisign -G -W`). Without it the artifact is unsigned.
    #[arg(long, value_name = "KEY")]
    pub sign_key: Option<PathBuf>,
    /// Make the release's unified kernel image (systemd-stub from the base layer, its kernel,
    /// initrd and os-release, a command line naming every layer's root hash and the stack's
    /// `[boot] kernel_args`) and Authenticode-sign it with this Secure Boot db key (PEM, with
    /// --secure-boot-cert). The signed descriptor pins it; the writer boots UEFI machines from it
    /// (docs/boot-contract.md, "Secure Boot"). The key must be RSA of at least 2048 bits (UEFI
    /// requires firmware to verify RSA-2048 only; a larger key gets a warning) and the
    /// certificate its own, checked before anything is written. Needs openssl, objcopy, sbsign
    /// and faketime.
    #[arg(long, value_name = "KEY", requires = "secure_boot_cert")]
    pub secure_boot_key: Option<PathBuf>,
    /// The db certificate (PEM) that goes with --secure-boot-key.
    #[arg(long, value_name = "CERT", requires = "secure_boot_key")]
    pub secure_boot_cert: Option<PathBuf>,
    /// Give the release's UKI a signed PCR 11 policy: its public half as the `.pcrpkey` section
    /// and, as `.pcrsig`, its signatures of the PCR 11 values the UKI leaves in the boot phases a
    /// node opens its secrets in (the stub's measurement alone, `sysinit`, `sysinit:ready`), in
    /// the format systemd 252's `systemd-creds` and `systemd-cryptenroll --tpm2-public-key` take
    /// (docs/boot-contract.md, "Measured boot"). An RSA private key in PEM, at least 2048 bits
    /// (`ingot key generate --pcr` or `openssl genpkey -algorithm RSA`); needs --secure-boot-key.
    #[arg(long, value_name = "KEY", requires = "secure_boot_key")]
    pub pcr_key: Option<PathBuf>,
    /// Uncompressed bytes per zstd frame (recorded in the descriptor).
    #[arg(long, default_value_t = DEFAULT_FRAME_SIZE, value_name = "BYTES")]
    pub frame_size: usize,
    /// zstd compression level (1-19).
    #[arg(long, default_value_t = DEFAULT_LEVEL, value_parser = clap::value_parser!(i32).range(1..=19))]
    pub zstd_level: i32,
    /// Source revision for the `org.opencontainers.image.revision` annotation
    /// (default: `git rev-parse HEAD` in the manifest's directory, if that works).
    #[arg(long)]
    pub revision: Option<String>,
    /// Replace OUT if it is a previous layout (a directory holding only `oci-layout`,
    /// `index.json` and `blobs/`); anything else is refused, never deleted.
    #[arg(long)]
    pub force: bool,
    /// Install exactly what stack.lock pins for the layers made from Debian packages, from the
    /// .deb cache (or the archive, for a file not cached, its hash checked); fail naming the
    /// package when neither has that file, or when the lock does not match the manifest. The lock
    /// is never changed.
    #[arg(long, conflicts_with = "update")]
    pub locked: bool,
    /// Resolve the Debian layers against the archives again and move stack.lock forward: every
    /// package, or only each PACKAGE named (the others stay at their locked versions). A layer
    /// whose locked packages all are still the archives' candidates stays as locked (its cached
    /// tree is reused). Prints each change (package, old -> new). Give it last: it takes every
    /// word after it.
    #[arg(long, num_args = 0.., value_name = "PACKAGE")]
    pub update: Option<Vec<String>>,
    /// The .deb cache (files named by their SHA-256). Default: $XDG_CACHE_HOME/ingot/debs, or
    /// /var/cache/ingot/debs for root.
    #[arg(long, value_name = "DIR")]
    pub deb_cache: Option<PathBuf>,
    /// An operator input a layer declares (`inputs = ["NAME"]` in the manifest): `kubernetes=DIR`
    /// (kubeadm and kubelet for a base made with `boot_integration`, kubectl for a layer over
    /// it; binaries or .deb files), `nvidia-toolkit=DIR` (NVIDIA's container toolkit .debs),
    /// `kata=DIR` (Kata Containers' static release), `images=DIR` (OCI image layouts to preload
    /// in a control-plane layer); docs/debian-build.md. Repeatable. An input no layer declares
    /// is an error; a declared one left out is left out of the stack, and the build says what the
    /// stack then lacks.
    #[arg(long = "input", value_name = "NAME=PATH", value_parser = crate::manifest::parse_input_arg)]
    pub inputs: Vec<(String, PathBuf)>,
    /// The tree cache: each Debian-made layer's finished tree, under a hash of its lock entry,
    /// its declaration, the layers below, source_date_epoch and the ingot version, so a build
    /// with nothing changed reuses it (2 entries kept per layer). Default: `trees` beside the
    /// .deb cache (/var/cache/ingot/trees for root).
    #[arg(long, value_name = "DIR")]
    pub tree_cache: Option<PathBuf>,
    /// Make every Debian-made layer's tree again with mmdebstrap, ignoring the tree cache (the
    /// packages still come from the .deb cache), as `mkosi -f` does; the new tree replaces the
    /// cached one. With --locked it checks that the lock still makes the same stack.
    #[arg(long)]
    pub rebuild: bool,
    /// No progress bars or spinners.
    #[arg(long, short)]
    pub quiet: bool,
    /// Print the result as one JSON object (camelCase keys) on stdout instead of text, and the
    /// progress on stderr as JSON Lines for CI: one object a line with `event` (note, phase,
    /// phaseDone, tree, lockChange, error) and `t`, the seconds since the build started.
    #[arg(long)]
    pub json: bool,
}

fn git_revision(manifest: &std::path::Path) -> Option<String> {
    let dir = manifest.parent().filter(|p| !p.as_os_str().is_empty())?;
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["rev-parse", "HEAD"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let rev = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !rev.is_empty()).then_some(rev)
}

/// Makes the trees of the layers whose source is `debian` (beside OUT), before anything else.
fn debian_trees(
    args: &BuildArgs,
    manifest: &Manifest,
    events: &Events,
) -> anyhow::Result<Option<crate::debian::Prepared>> {
    let debian_opts = crate::debian::Options {
        cache: args.deb_cache.clone(),
        locked: args.locked,
        update: args.update.clone().map(|u| u.into_iter().collect()),
        tree_cache: args.tree_cache.clone(),
        rebuild: args.rebuild,
        progress: !args.quiet && !args.json,
        events: events.clone(),
    };
    let prepared = crate::debian::prepare(manifest, &debian_opts)
        .with_context(|| format!("making the Debian trees of {}", args.manifest.display()))?;
    if prepared.is_none() && (args.locked || args.update.is_some() || args.rebuild) {
        anyhow::bail!(
            "{}: no layer is made from Debian packages: --locked, --update and --rebuild have \
             nothing to do",
            args.manifest.display()
        );
    }
    if let Some(p) = &prepared {
        for (line, tree) in p.report.iter().zip(&p.trees) {
            if events.on() {
                events.emit(
                    "tree",
                    serde_json::json!({
                        "layer": tree.layer,
                        "reused": tree.reused,
                        "reason": tree.reason,
                        "key": tree.key,
                        "text": line,
                    }),
                );
            } else {
                eprintln!("{line}");
            }
        }
    }
    Ok(prepared)
}

/// Writes stack.lock when it changed, and prints what moved (as `cargo update` does).
fn write_lock(p: &crate::debian::Prepared, events: &Events) -> anyhow::Result<()> {
    for (layer, changes) in &p.changes {
        for c in changes {
            if events.on() {
                events.emit(
                    "lockChange",
                    serde_json::json!({
                        "layer": layer,
                        "name": c.name,
                        "architecture": c.architecture,
                        "old": c.old,
                        "new": c.new,
                        "text": c.to_string(),
                    }),
                );
            } else {
                eprintln!("    {c}  (layer {layer})");
            }
        }
    }
    if p.lock_changed() {
        p.lock
            .write(&p.lock_path)
            .with_context(|| format!("writing {}", p.lock_path.display()))?;
        events.note(&format!("wrote {}", p.lock_path.display()));
    }
    Ok(())
}

/// The result as one JSON object; `trees` says per Debian-made layer whether its tree was
/// reused from the tree cache, and why (or why it was built).
fn print_json(
    out: &crate::build::BuildOutput,
    prepared: Option<&crate::debian::Prepared>,
    total: u64,
    compressed: u64,
) -> anyhow::Result<()> {
    let v = serde_json::json!({
        "name": out.descriptor.name,
        "version": out.descriptor.version,
        "layout": out.out,
        "manifestDigest": out.manifest_digest,
        "descriptorDigest": out.descriptor_digest,
        "signed": out.signed,
        "layers": out.descriptor.layers.len(),
        "size": total,
        "compressedSize": compressed,
        "uki": out.descriptor.uki,
        "trees": prepared.map_or_else(Vec::new, |p| p
            .trees
            .iter()
            .map(|t| serde_json::json!({
                "layer": t.layer,
                "reused": t.reused,
                "reason": t.reason,
            }))
            .collect()),
    });
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}

pub fn run(args: BuildArgs) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let events = if args.json {
        Events::json()
    } else {
        Events::off()
    };
    let mut manifest = Manifest::load(&args.manifest).map_err(anyhow::Error::new)?;
    for line in manifest
        .give_inputs(&args.inputs, crate::debian::inputs::take_input)
        .map_err(anyhow::Error::new)?
    {
        events.note(&line);
    }
    let prepared = debian_trees(&args, &manifest, &events)?;
    let manifest = prepared.as_ref().map_or(manifest, |p| p.manifest.clone());
    if args.frame_size == 0 || args.frame_size % 4096 != 0 {
        anyhow::bail!("--frame-size must be a positive multiple of 4096");
    }
    let sign_key = match &args.sign_key {
        None => None,
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("reading the secret key {}", p.display()))?;
            Some(
                SecretKey::from_minisign(&text)
                    .with_context(|| format!("loading the secret key {}", p.display()))?,
            )
        }
    };
    let revision = args
        .revision
        .clone()
        .or_else(|| git_revision(&args.manifest));
    let opts = BuildOptions {
        out: args.out.clone(),
        sign_key,
        frame_size: args.frame_size,
        zstd_level: args.zstd_level,
        revision,
        force: args.force,
        progress: !args.quiet && !args.json,
        events: events.clone(),
        secure_boot: match (&args.secure_boot_key, &args.secure_boot_cert) {
            (Some(key), Some(cert)) => Some(crate::uki::SecureBootKey {
                key: key.clone(),
                cert: cert.clone(),
            }),
            _ => None,
        },
        pcr_key: args.pcr_key.clone(),
    };
    let digests = prepared
        .as_ref()
        .map(|p| crate::build::deb_digests(&p.lock))
        .unwrap_or_default();
    let out = build_with(&manifest, &opts, &digests)
        .with_context(|| format!("building {}", args.manifest.display()))?;
    if let Some(p) = prepared.as_ref().filter(|_| !args.locked) {
        write_lock(p, &events)?;
    }
    let total: u64 = out.descriptor.layers.iter().map(|l| l.size).sum();
    let compressed: u64 = out.descriptor.layers.iter().map(|l| l.data.size).sum();
    if args.json {
        print_json(&out, prepared.as_ref(), total, compressed)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "built {} {} ({} layers, {} → {} compressed) in {:.2?}",
        out.descriptor.name,
        out.descriptor.version,
        out.descriptor.layers.len(),
        crate::inspect::human_size(total),
        crate::inspect::human_size(compressed),
        started.elapsed()
    );
    println!("layout     {}", out.out.display());
    println!("manifest   {}", out.manifest_digest);
    println!("descriptor {}", out.descriptor_digest);
    if let Some(uki) = &out.descriptor.uki {
        println!(
            "uki        {} ({} bytes, Secure Boot signed)",
            uki.digest, uki.size
        );
    }
    println!(
        "signature  {}",
        if out.signed {
            "minisign (dev.ingot.signature)"
        } else {
            "none (unsigned)"
        }
    );
    Ok(ExitCode::SUCCESS)
}
