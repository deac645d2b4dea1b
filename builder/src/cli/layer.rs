//! `ingot layer build`: one layer image (and optionally its dm-verity tree) from a directory, a
//! tar archive or an OCI image layout.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use ingot_layers::{Ext4Options, Source};

#[derive(Subcommand, Debug)]
pub enum LayerCommand {
    /// Build a deterministic read-only ext4 image from SRC.
    ///
    /// SRC is a directory, a tar archive (plain, gzip or zstd), or `oci:DIR[@sha256:DIGEST]` for
    /// the flattened filesystem of an image in an OCI image layout.
    #[command(after_help = super::exit_status::PLAIN)]
    Build(BuildArgs),
}

#[derive(Args, Debug)]
pub struct BuildArgs {
    /// Source tree: a directory, a tar archive, or oci:LAYOUT[@MANIFEST_DIGEST].
    src: String,
    /// Output image file.
    out: PathBuf,
    /// Layer identity (stack name + version + layer name); the filesystem UUID, the directory
    /// hash seed and the verity UUID derive from it.
    #[arg(long, default_value = "")]
    seed: String,
    /// Every timestamp in the image [default: $SOURCE_DATE_EPOCH, else 0].
    #[arg(long)]
    source_date_epoch: Option<u64>,
    /// Image size in bytes (suffixes K, M, G, T: powers of 1024); default: just big enough.
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Also write the dm-verity hash tree here and print the root hash.
    #[arg(long, value_name = "OUT.hash")]
    verity: Option<PathBuf>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        None => (s, 1u64),
        Some((i, _)) => {
            let m = match s[i..]
                .trim_end_matches(['i', 'B'])
                .to_ascii_uppercase()
                .as_str()
            {
                "K" => 1u64 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                other => return Err(format!("unknown size suffix {other:?}")),
            };
            (&s[..i], m)
        }
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("bad size {s:?}"))
}

fn parse_source(src: &str) -> Result<Source> {
    if let Some(rest) = src.strip_prefix("oci:") {
        let (path, digest) = match rest.rsplit_once('@') {
            Some((p, d)) if d.starts_with("sha256:") => (p, d.to_string()),
            _ => (rest, String::new()),
        };
        return Ok(Source::OciLayout {
            path: PathBuf::from(path),
            manifest_digest: digest,
        });
    }
    let path = PathBuf::from(src);
    let md = std::fs::metadata(&path).with_context(|| format!("reading source {src}"))?;
    if md.is_dir() {
        Ok(Source::Dir(path))
    } else if md.is_file() {
        Ok(Source::Tar(path))
    } else {
        bail!("source {src} is neither a directory nor a file")
    }
}

pub fn run(cmd: LayerCommand) -> Result<ExitCode> {
    match cmd {
        LayerCommand::Build(a) => build(a),
    }
}

fn build(a: BuildArgs) -> Result<ExitCode> {
    let source = parse_source(&a.src)?;
    let epoch = match a.source_date_epoch {
        Some(n) => n,
        None => match std::env::var("SOURCE_DATE_EPOCH") {
            Ok(v) => v.trim().parse().context("parsing $SOURCE_DATE_EPOCH")?,
            Err(_) => 0,
        },
    };
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} writing image {bar:30} {bytes}/{total_bytes} {bytes_per_sec}",
        )
        .expect("static template"),
    );
    let pb = bar.clone();
    let opts = Ext4Options {
        seed: a.seed.into_bytes(),
        source_date_epoch: epoch,
        size: a.size,
        progress: Some(Arc::new(move |done, total| {
            pb.set_length(total);
            pb.set_position(done);
        })),
    };
    let built = ingot_layers::build_layer(&source, &a.out, a.verity.as_deref(), &opts);
    bar.finish_and_clear();
    let built = built.with_context(|| format!("building layer image {}", a.out.display()))?;
    if a.json {
        let mut v = serde_json::json!({
            "image": a.out,
            "imageSize": built.image_size,
            "dataBlocks": built.data_blocks,
            "usedBlocks": built.image.used_blocks,
            "inodes": built.image.inodes,
            "fsUuid": ingot_verity::uuid_to_string(&built.image.uuid),
        });
        if let (Some(vi), Some(h)) = (&built.verity, &a.verity) {
            v["hash"] = serde_json::json!(h);
            v["rootHash"] = serde_json::json!(vi.root_hash);
            v["salt"] = serde_json::json!(vi.salt);
            v["verityUuid"] = serde_json::json!(vi.uuid);
            v["hashSize"] = serde_json::json!(built.hash_size);
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        eprintln!(
            "{}: {} bytes, {} blocks ({} used), {} inodes",
            a.out.display(),
            built.image_size,
            built.data_blocks,
            built.image.used_blocks,
            built.image.inodes
        );
        if let Some(vi) = &built.verity {
            println!("{}", vi.root_hash);
        }
    }
    Ok(ExitCode::SUCCESS)
}
