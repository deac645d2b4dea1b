//! `ingot verity`: veritysetup's format, verify and dump, with the same option names and
//! meanings, so one can stand in for the other.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use ingot_verity::{HashAlgorithm, HashType, RootHash, VerityError, VerityParams};
use rand::RngCore;
use serde::Serialize;

/// Exit code when data or hash blocks do not match (veritysetup also exits 2 there).
const EXIT_CORRUPT: u8 = 2;

#[derive(Subcommand, Debug)]
pub enum VerityCommand {
    /// Build the hash tree of DATA and write it (and a superblock) to HASH; prints the root hash.
    ///
    /// HASH may be the data device itself with --hash-offset past the data. It is created when
    /// missing and not truncated. Without --salt a random 32-byte salt is used, like veritysetup;
    /// reproducible builds pass --salt and --uuid.
    #[command(after_help = super::exit_status::PLAIN)]
    Format(FormatArgs),
    /// Check every block of DATA against the tree in HASH and the trusted ROOT_HASH.
    ///
    /// Exit status: 0 when intact, 2 when a hash or data block does not match (the first bad one
    /// is named), 1 for any other error.
    #[command(after_help = super::exit_status::VERITY_VERIFY)]
    Verify(VerifyArgs),
    /// Print the superblock of HASH.
    #[command(after_help = super::exit_status::PLAIN)]
    Dump(DumpArgs),
}

/// The tree parameters, named as veritysetup names them.
#[derive(Args, Debug, Clone)]
pub struct TreeOptions {
    /// Hash algorithm: sha256, sha1, sha512 (also sha224, sha384).
    #[arg(long = "hash", value_name = "ALG", default_value = "sha256")]
    hash_alg: String,
    /// Hash type: 1 = normal, 0 = original Chrome OS.
    #[arg(long, value_name = "0|1", default_value_t = 1)]
    format: u32,
    /// Data block size in bytes (power of two, 512 to 524288).
    #[arg(long, value_name = "BYTES", default_value_t = 4096)]
    data_block_size: u32,
    /// Hash block size in bytes (power of two, 512 to 524288).
    #[arg(long, value_name = "BYTES", default_value_t = 4096)]
    hash_block_size: u32,
    /// Hash only the first N data blocks (default: every whole block of DATA).
    #[arg(long, value_name = "N")]
    data_blocks: Option<u64>,
    /// Byte offset of the superblock (or, with --no-superblock, of the tree) on HASH; a
    /// multiple of 512.
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    hash_offset: u64,
    /// Do not write (format) or read (verify) a superblock; every parameter must then be given.
    #[arg(long)]
    no_superblock: bool,
    /// Salt as hex, or "-" for none. Format: random 32 bytes when absent.
    #[arg(long, short = 's', value_name = "HEX|-")]
    salt: Option<String>,
}

#[derive(Args, Debug)]
pub struct FormatArgs {
    /// Data device or image file.
    data: PathBuf,
    /// Hash device or file (created when missing).
    hash: PathBuf,
    #[command(flatten)]
    tree: TreeOptions,
    /// Superblock UUID (random when absent).
    #[arg(long, value_name = "UUID")]
    uuid: Option<String>,
    /// Also write the root hash, as hex with no newline, to FILE.
    #[arg(long, value_name = "FILE")]
    root_hash_file: Option<PathBuf>,
    /// Print the result as JSON instead of veritysetup's text.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// Data device or image file.
    data: PathBuf,
    /// Hash device or file.
    hash: PathBuf,
    /// Trusted root hash as hex (or use --root-hash-file).
    root_hash: Option<String>,
    #[command(flatten)]
    tree: TreeOptions,
    /// Read the trusted root hash from FILE instead.
    #[arg(long, value_name = "FILE", conflicts_with = "root_hash")]
    root_hash_file: Option<PathBuf>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct DumpArgs {
    /// Hash device or file holding a superblock.
    hash: PathBuf,
    /// Byte offset of the superblock on HASH.
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    hash_offset: u64,
    /// Print as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(cmd: VerityCommand) -> Result<ExitCode> {
    match cmd {
        VerityCommand::Format(a) => format(a),
        VerityCommand::Verify(a) => verify(a),
        VerityCommand::Dump(a) => dump(a),
    }
}

fn parse_salt(text: &str) -> Result<Vec<u8>> {
    if text == "-" {
        return Ok(Vec::new());
    }
    let salt = hex::decode(text).with_context(|| format!("--salt {text:?} is not hex"))?;
    if salt.len() > ingot_verity::MAX_SALT_SIZE {
        bail!(
            "--salt is {} bytes: at most {} are allowed",
            salt.len(),
            ingot_verity::MAX_SALT_SIZE
        );
    }
    Ok(salt)
}

impl TreeOptions {
    fn params(&self, default_salt: impl FnOnce() -> Vec<u8>) -> Result<VerityParams> {
        let params = VerityParams {
            hash_type: HashType::from_u32(self.format).context("--format")?,
            algorithm: HashAlgorithm::from_name(&self.hash_alg).context("--hash")?,
            data_block_size: self.data_block_size,
            hash_block_size: self.hash_block_size,
            data_blocks: self.data_blocks.unwrap_or(0),
            salt: match &self.salt {
                Some(s) => parse_salt(s)?,
                None => default_salt(),
            },
            uuid: None,
            hash_offset: self.hash_offset,
            superblock: !self.no_superblock,
        };
        if self.data_blocks == Some(0) {
            bail!("--data-blocks 0: there is nothing to hash");
        }
        if params.data_block_size > 4096 {
            eprintln!("WARNING: Kernel cannot activate device if data block size exceeds page size (4096).");
        }
        Ok(params)
    }
}

/// The fields veritysetup prints, in its order.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    uuid: String,
    hash_type: u32,
    data_blocks: u64,
    data_block_size: u32,
    hash_blocks: u64,
    hash_block_size: u32,
    hash_algorithm: String,
    salt: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    root_hash: Option<RootHash>,
    hash_device_size: u64,
    hash_offset: u64,
    hash_start_block: u64,
    superblock: bool,
}

impl Report {
    fn new(p: &VerityParams, root_hash: Option<&RootHash>) -> Result<Report> {
        let g = p.geometry()?;
        Ok(Report {
            uuid: match (p.superblock, p.uuid) {
                (true, Some(u)) => ingot_verity::uuid_to_string(&u),
                _ => String::new(),
            },
            hash_type: p.hash_type.as_u32(),
            data_blocks: p.data_blocks,
            data_block_size: p.data_block_size,
            hash_blocks: g.hash_blocks,
            hash_block_size: p.hash_block_size,
            hash_algorithm: p.algorithm.name().to_string(),
            salt: if p.salt.is_empty() {
                "-".into()
            } else {
                hex::encode(&p.salt)
            },
            root_hash: root_hash.cloned(),
            hash_device_size: g.hash_device_size,
            hash_offset: p.hash_offset,
            hash_start_block: g.hash_start_block,
            superblock: p.superblock,
        })
    }

    /// veritysetup's layout: a 17-column label, a tab, the value.
    fn print_text(&self, hash: &Path) {
        println!("VERITY header information for {}", hash.display());
        println!("UUID:            \t{}", self.uuid);
        println!("Hash type:       \t{}", self.hash_type);
        println!("Data blocks:     \t{}", self.data_blocks);
        println!("Data block size: \t{}", self.data_block_size);
        println!("Hash blocks:     \t{}", self.hash_blocks);
        println!("Hash block size: \t{}", self.hash_block_size);
        println!("Hash algorithm:  \t{}", self.hash_algorithm);
        println!("Salt:            \t{}", self.salt);
        if let Some(root) = &self.root_hash {
            println!("Root hash:      \t{root}");
        }
        println!("Hash device size: \t{} [bytes]", self.hash_device_size);
    }

    fn print(&self, hash: &Path, json: bool) -> Result<()> {
        if json {
            println!("{}", serde_json::to_string_pretty(self)?);
        } else {
            self.print_text(hash);
        }
        Ok(())
    }
}

fn format(a: FormatArgs) -> Result<ExitCode> {
    let mut params = a.tree.params(|| {
        let mut salt = vec![0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut salt);
        salt
    })?;
    params.uuid = Some(match &a.uuid {
        Some(text) => ingot_verity::parse_uuid(text)
            .with_context(|| format!("--uuid {text:?} is not a UUID"))?,
        None => *uuid::Uuid::new_v4().as_bytes(),
    });
    let result = ingot_verity::format_file(&a.data, &a.hash, &params)
        .with_context(|| format!("formatting {} into {}", a.data.display(), a.hash.display()))?;
    if let Some(path) = &a.root_hash_file {
        std::fs::write(path, result.root_hash.to_string())
            .with_context(|| format!("writing root hash to {}", path.display()))?;
    }
    Report::new(&result.params, Some(&result.root_hash))?.print(&a.hash, a.json)?;
    Ok(ExitCode::SUCCESS)
}

fn verify(a: VerifyArgs) -> Result<ExitCode> {
    let root_text = match (&a.root_hash, &a.root_hash_file) {
        (Some(text), None) => text.clone(),
        // A root hash is at most 128 hex digits: a larger file is not read.
        (None, Some(path)) => ingot_verity::input::read_text_bounded(
            path,
            4096,
            ingot_verity::input::Symlinks::Follow,
        )
        .with_context(|| format!("reading root hash from {}", path.display()))?
        .trim()
        .to_string(),
        _ => bail!("give the trusted root hash as ROOT_HASH or --root-hash-file"),
    };
    // veritysetup takes either case; ingot prints and signs lower case.
    let root: RootHash = root_text.to_ascii_lowercase().parse()?;
    let params = a.tree.params(Vec::new)?;
    match ingot_verity::verify_files(&a.data, &a.hash, &root, &params) {
        Ok(used) => {
            if a.json {
                Report::new(&used, Some(&root))?.print(&a.hash, true)?;
            } else {
                println!(
                    "{}: intact ({} blocks of {} bytes)",
                    a.data.display(),
                    used.data_blocks,
                    used.data_block_size
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(VerityError::Verify(e)) => {
            eprintln!(
                "ingot: verification failed: {} against {}: {e}",
                a.data.display(),
                a.hash.display()
            );
            Ok(ExitCode::from(EXIT_CORRUPT))
        }
        Err(e) => Err(e).with_context(|| {
            format!(
                "verifying {} against {}",
                a.data.display(),
                a.hash.display()
            )
        }),
    }
}

fn dump(a: DumpArgs) -> Result<ExitCode> {
    let sb = ingot_verity::read_superblock(&a.hash, a.hash_offset)?;
    Report::new(&sb.to_params(a.hash_offset), None)?.print(&a.hash, a.json)?;
    Ok(ExitCode::SUCCESS)
}
