//! `ingot-writer`: write a signed ingot stack to a disk, every block verified before and after.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Parser;
use ingot::sign::PublicKey;
use ingot::verify::{StackRef, Trust};
use ingot_layers::select::{GpuVendor, Machine, Role};
use ingot_writer::engine::WriteOptions;
use ingot_writer::report::Reporter;
use ingot_writer::WriteRequest;

/// The public key compiled in at build time (INGOT_TRUST_KEY_BUILTIN=path to a minisign .pub).
const BUILTIN_KEY: Option<&str> = option_env!("INGOT_TRUST_KEY_BUILTIN");

/// Write a signed ingot stack to a disk: only the layers this machine gets, every block checked
/// against the signed hash tree before it is written and after it is read back, the partition
/// table written last. A failed run leaves the disk without a partition table.
#[derive(Parser, Debug)]
#[command(name = "ingot-writer", version)]
struct Cli {
    /// The stack: an OCI image layout directory (`oci:DIR` or `DIR`).
    source: String,
    /// The disk to write: a block device or an image file. Everything on it is replaced.
    #[arg(long, value_name = "PATH")]
    target: PathBuf,
    /// The minisign public key the stack must be signed with (else INGOT_TRUST_KEY, else the
    /// key compiled in).
    #[arg(long, value_name = "PUB")]
    trust_key: Option<PathBuf>,
    /// This machine's role.
    #[arg(long, value_name = "ROLE", default_value = "worker")]
    role: Role,
    /// A GPU vendor present on this machine (repeatable): nvidia.
    #[arg(long, value_name = "VENDOR")]
    gpu: Vec<GpuVendor>,
    /// Hardware virtualization is available.
    #[arg(long)]
    virt: bool,
    /// Size of the EFI system partition, in MiB (at least 64).
    #[arg(long, value_name = "MIB", default_value_t = 256)]
    esp_size: u64,
    /// Extra kernel command-line argument (repeatable), e.g. console=ttyS0.
    #[arg(long = "kernel-arg", value_name = "ARG")]
    kernel_args: Vec<String>,
    /// Writes of one range before the run fails (a range that reads back wrong is rewritten).
    #[arg(long, value_name = "N", default_value_t = 3)]
    max_attempts: u32,
    /// Write progress events as JSON lines to FILE, or `-` for stdout.
    #[arg(long, value_name = "FILE|-")]
    events: Option<String>,
    /// Keep a JSON status file at FILE (stage, message, rewrites, result).
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Log verbosity (-v info, -vv debug).
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
}

fn trust_key(cli: &Cli) -> Result<PublicKey> {
    let (text, from) = if let Some(path) = &cli.trust_key {
        (
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
            path.display().to_string(),
        )
    } else if let Some(path) = std::env::var_os("INGOT_TRUST_KEY") {
        let path = PathBuf::from(path);
        (
            std::fs::read_to_string(&path)
                .with_context(|| format!("reading INGOT_TRUST_KEY {}", path.display()))?,
            path.display().to_string(),
        )
    } else if let Some(key) = BUILTIN_KEY {
        (key.to_string(), "the built-in key".to_string())
    } else {
        bail!("no trusted key: pass --trust-key PUB or set INGOT_TRUST_KEY (the writer never accepts an unsigned stack)");
    };
    PublicKey::from_minisign(&text).with_context(|| format!("reading the public key from {from}"))
}

fn run(cli: Cli) -> Result<ExitCode> {
    let key = trust_key(&cli)?;
    let source: StackRef = cli.source.parse().map_err(|e: String| anyhow::anyhow!(e))?;
    if cli.max_attempts == 0 {
        bail!("--max-attempts must be at least 1");
    }
    let mut machine = Machine::new(cli.role);
    machine.gpus = cli.gpu.clone();
    machine.virt = cli.virt;
    // The writer only makes UEFI-bootable disks.
    machine.uefi = true;
    let req = WriteRequest {
        source,
        trust: Trust {
            key: Some(key),
            allow_unsigned: false,
        },
        machine,
        target: cli.target.clone(),
        esp_size: cli
            .esp_size
            .checked_mul(1 << 20)
            .context("--esp-size is too large")?,
        kernel_args: cli.kernel_args.clone(),
        options: WriteOptions {
            max_attempts: cli.max_attempts,
        },
    };
    let reporter = Reporter::new(cli.events.as_deref(), cli.report.clone())
        .context("opening --events/--report")?;
    match ingot_writer::write_stack(&req, &reporter) {
        Ok(outcome) => {
            let msg = format!(
                "wrote {} ({}) to {}: layers {}; {} bytes written, {} zero bytes skipped, {} rewrites",
                outcome.stack,
                outcome.manifest_digest,
                cli.target.display(),
                outcome.layers.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", "),
                outcome.bytes_written,
                outcome.bytes_skipped,
                outcome.rewrites
            );
            reporter.done(&msg);
            eprintln!("{msg}");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            let text = format!("{:#}", anyhow::Error::from(e));
            reporter.failed(&text);
            eprintln!("ingot-writer: error: {text}");
            use ingot_writer::report::Stage;
            let touched = !matches!(
                reporter.status().stage,
                Stage::Resolve | Stage::Verify | Stage::Plan
            );
            if touched {
                eprintln!(
                    "ingot-writer: {} was left without a partition table",
                    cli.target.display()
                );
            } else {
                eprintln!(
                    "ingot-writer: nothing was written to {}",
                    cli.target.display()
                );
            }
            Ok(ExitCode::from(1))
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ingot-writer: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
