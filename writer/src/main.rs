//! `ingot-writer`: write a signed ingot stack to a disk, every block read back and verified.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use ingot::sign::PublicKey;
use ingot::verify::{StackRef, Trust};
use ingot_layers::select::{GpuVendor, Machine, Role};
use ingot_writer::engine::WriteOptions;
use ingot_writer::provision::ProvisionRequest;
use ingot_writer::report::{Reporter, Stage};
use ingot_writer::{WriteRequest, WriteSettings};

/// The public key compiled in at build time (INGOT_TRUST_KEY_BUILTIN=path to a minisign .pub).
const BUILTIN_KEY: Option<&str> = option_env!("INGOT_TRUST_KEY_BUILTIN");

/// Write a signed ingot stack to a disk: only the layers this machine gets (streamed straight
/// from a registry), every block read back and checked against the signed hash tree, the
/// partition table written last. A failed run leaves the disk without a partition table.
///
/// Two ways to run it:
///
///   ingot-writer IMAGE --target PATH [--role R --gpu nvidia --virt]
///     writes the stack to PATH for a machine described by flags.
///
///   OCI_REGISTRY_AUTH_TOKEN=... ingot-writer IMAGE_URL BOOTSTRAP_DATA MACHINE_NAME 'ROOT_DEVICES'
///     provisions this machine exactly as cluster-api-provider-hetzner's imageURLCommand runs it
///     in the rescue system: detects role and hardware, gates the disks (tools, UEFI, size, SMART,
///     read speed), refuses to wipe when another disk holds an OS, stages and seals the per-node
///     layer from the bootstrap data, writes, keeps /root/output.json's `message` current, prints
///     IMAGE_URL_DONE as the last stdout line on success only, and reboots (unless --no-reboot).
#[derive(Parser, Debug)]
#[command(name = "ingot-writer", version, verbatim_doc_comment)]
struct Cli {
    /// The stack: `oci://REGISTRY/REPO:TAG` (or `@sha256:...`), or an OCI image layout directory
    /// (`oci:DIR` or `DIR`).
    source: String,
    /// Provisioning: the bootstrap data (cloud-config or Ignition), e.g. /root/bootstrap.data.
    bootstrap_data: Option<PathBuf>,
    /// Provisioning: the machine's name (the hostname unless the bootstrap data sets one).
    machine_name: Option<String>,
    /// Provisioning: the target disks, short names (`sda nvme0n1`) or WWNs, space-separated;
    /// the first is written.
    root_devices: Option<String>,
    /// Write this block device or image file instead of provisioning. Everything on it is
    /// replaced.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["bootstrap_data", "sysroot"])]
    target: Option<PathBuf>,
    /// The minisign public key the stack must be signed with (else INGOT_TRUST_KEY, else the
    /// key compiled in).
    #[arg(long, value_name = "PUB")]
    trust_key: Option<PathBuf>,
    /// This machine's role (default: from the bootstrap data when provisioning, else worker).
    #[arg(long, value_name = "ROLE")]
    role: Option<Role>,
    /// With --target: a GPU vendor present on this machine (repeatable): nvidia. Provisioning
    /// detects it from PCI.
    #[arg(long, value_name = "VENDOR", requires = "target")]
    gpu: Vec<GpuVendor>,
    /// With --target: hardware virtualization is available. Provisioning detects it.
    #[arg(long, requires = "target")]
    virt: bool,
    /// Provisioning: read /sys, /proc and /dev below DIR (a fixture machine) instead of /.
    #[arg(long, value_name = "DIR", default_value = "/")]
    sysroot: PathBuf,
    /// Provisioning: write even when another disk holds an operating system (it may then be
    /// booted instead of this one, unless the boot order is pinned).
    #[arg(long)]
    allow_foreign_os: bool,
    /// Provisioning: minimum sequential read speed of the target, KiB/s (default as CAPH:
    /// 20000 for a spinning disk, 40000 otherwise).
    #[arg(long, value_name = "KIB_S")]
    min_read_speed: Option<u64>,
    /// Provisioning: how long the read speed test runs, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 3.0)]
    read_test_seconds: f64,
    /// Provisioning: an extra node label `key=value` (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// Give up after this long (`90s`, `20m`, `1h`): the disk is left without a partition table
    /// and the reason reported.
    #[arg(long, value_name = "DURATION", default_value = "20m", value_parser = parse_duration)]
    deadline: Duration,
    /// Provisioning: do not reboot after a successful run.
    #[arg(long)]
    no_reboot: bool,
    /// Seconds between success and the reboot (the provisioner reads the result first).
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    reboot_delay: u64,
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
    /// Keep a JSON status file at FILE (stage, message, warnings, rewrites, result); when
    /// provisioning, /root/output.json unless given (CAPH shows its `message`).
    #[arg(long, visible_alias = "output-json", value_name = "FILE")]
    report: Option<PathBuf>,
    /// Log verbosity (-v info, -vv debug).
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
}

/// `90s`, `20m`, `1h`, or plain seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, ""), |i| s.split_at(i));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (like 90s, 20m, 1h)"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("`{s}`: unknown unit `{unit}` (use s, m or h)")),
    };
    if secs == 0 {
        return Err("the deadline must be more than 0 seconds".into());
    }
    Ok(Duration::from_secs(secs))
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
    if !(cli.read_test_seconds > 0.0 && cli.read_test_seconds <= 60.0) {
        bail!("--read-test-seconds must be more than 0 and at most 60");
    }
    let deadline = Instant::now() + cli.deadline;
    let settings = WriteSettings {
        esp_size: cli
            .esp_size
            .checked_mul(1 << 20)
            .context("--esp-size is too large")?,
        kernel_args: cli.kernel_args.clone(),
        options: WriteOptions {
            max_attempts: cli.max_attempts,
            deadline: Some(deadline),
        },
    };
    let trust = Trust {
        key: Some(key),
        allow_unsigned: false,
    };
    match &cli.target {
        Some(target) => write_target(&cli, source, trust, target, settings, deadline),
        None => provision(&cli, source, trust, settings, deadline),
    }
}

/// After the deadline and a grace period for the run to stop on its own (it checks the deadline
/// between writes), give up hard: a write stuck in the kernel must not hold the provisioner
/// forever. The partition table is written last, so a run stopped here has none.
fn watchdog(deadline: Instant, on_expiry: impl FnOnce() + Send + 'static) {
    std::thread::spawn(move || {
        let grace = Duration::from_secs(60);
        std::thread::sleep((deadline + grace).saturating_duration_since(Instant::now()));
        on_expiry();
        std::process::exit(1);
    });
}

fn write_target(
    cli: &Cli,
    source: StackRef,
    trust: Trust,
    target: &std::path::Path,
    settings: WriteSettings,
    deadline: Instant,
) -> Result<ExitCode> {
    let mut machine = Machine::new(cli.role.unwrap_or(Role::Worker));
    machine.gpus = cli.gpu.clone();
    machine.virt = cli.virt;
    // The writer only makes UEFI-bootable disks.
    machine.uefi = true;
    let req = WriteRequest {
        source,
        trust,
        machine,
        target: target.to_path_buf(),
        esp_size: settings.esp_size,
        kernel_args: settings.kernel_args,
        options: settings.options,
    };
    let reporter = Reporter::new(cli.events.as_deref(), cli.report.clone())
        .context("opening --events/--report")?;
    watchdog(deadline, || {
        eprintln!("ingot-writer: error: the deadline passed and the run did not stop")
    });
    match ingot_writer::write_stack(&req, &reporter) {
        Ok(outcome) => {
            let msg = format!(
                "wrote {} ({}) to {}: layers {}; {} bytes written, {} zero bytes skipped, {} rewrites",
                outcome.stack,
                outcome.manifest_digest,
                target.display(),
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
            let touched = !matches!(
                reporter.status().stage,
                Stage::Resolve | Stage::Verify | Stage::Plan
            );
            if touched {
                eprintln!(
                    "ingot-writer: {} was left without a partition table",
                    target.display()
                );
            } else {
                eprintln!("ingot-writer: nothing was written to {}", target.display());
            }
            Ok(ExitCode::from(1))
        }
    }
}

/// CAPH's imageURLCommand contract: the last stdout line says IMAGE_URL_DONE on success and
/// never otherwise; /root/output.json's `message` says what is happening; non-zero on failure.
fn provision(
    cli: &Cli,
    source: StackRef,
    trust: Trust,
    settings: WriteSettings,
    deadline: Instant,
) -> Result<ExitCode> {
    let (Some(bootstrap), Some(machine_name), Some(root_devices)) = (
        cli.bootstrap_data.clone(),
        cli.machine_name.clone(),
        cli.root_devices.clone(),
    ) else {
        bail!(
            "give either --target PATH, or BOOTSTRAP_DATA MACHINE_NAME 'ROOT_DEVICES' after the \
             image (as cluster-api-provider-hetzner's imageURLCommand does); see --help"
        );
    };
    let mut labels = std::collections::BTreeMap::new();
    for l in &cli.labels {
        let (k, v) = l
            .split_once('=')
            .with_context(|| format!("--label `{l}`: expected KEY=VALUE"))?;
        labels.insert(k.to_string(), v.to_string());
    }
    let mut required_tools = Vec::new();
    if cli.sysroot == std::path::Path::new("/") {
        required_tools.push("smartctl".to_string());
    }
    if !cli.no_reboot {
        required_tools.extend(["sh".to_string(), "reboot".to_string()]);
    }
    let report = cli
        .report
        .clone()
        .unwrap_or_else(|| PathBuf::from("/root/output.json"));
    let reporter = Reporter::new(cli.events.as_deref(), Some(report.clone()))
        .with_context(|| format!("opening {}", report.display()))?
        .with_stdout_log();
    let req = ProvisionRequest {
        image: source,
        trust,
        bootstrap,
        machine_name,
        root_devices,
        sysroot: cli.sysroot.clone(),
        role: cli.role,
        allow_foreign_os: cli.allow_foreign_os,
        min_read_kib_s: cli.min_read_speed,
        read_test: Duration::from_secs_f64(cli.read_test_seconds),
        required_tools,
        labels,
        settings,
    };
    watchdog(deadline, || {
        println!("ingot-writer: FAILED (deadline): the run did not stop after its deadline");
    });
    match ingot_writer::provision::provision(&req, &reporter) {
        Ok(done) => {
            let msg = format!(
                "wrote {} ({}) to {} for {} ({}): layers {}; {} bytes written, {} rewrites",
                done.outcome.stack,
                done.outcome.manifest_digest,
                done.disk,
                done.hostname,
                done.role.as_str(),
                done.outcome
                    .layers
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                done.outcome.bytes_written,
                done.outcome.rewrites
            );
            reporter.done(&msg);
            if !cli.no_reboot {
                schedule_reboot(cli.reboot_delay)?;
                println!("rebooting in {} s", cli.reboot_delay);
            }
            println!("IMAGE_URL_DONE {msg}");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            let reason = e.reason();
            // The disk changes from the wipe on; every stage before it only reads.
            let touched = matches!(
                reporter.status().stage,
                Stage::Wipe | Stage::Write | Stage::Esp | Stage::PartitionTable | Stage::Finish
            );
            let text = format!("{:#}", anyhow::Error::from(e));
            reporter.failed(&format!("{reason}: {text}"));
            eprintln!("ingot-writer: error: {text}");
            let state = if touched {
                "the target disk was left without a partition table"
            } else {
                "no disk was changed"
            };
            // Never IMAGE_URL_DONE here, whatever the message holds.
            let line = format!("ingot-writer: FAILED ({reason}): {text}; {state}")
                .replace("IMAGE_URL_DONE", "IMAGE_URL_[DONE]");
            println!("{line}");
            Ok(ExitCode::from(1))
        }
    }
}

/// Reboots after `delay` seconds, from a detached shell, so this process can exit and the
/// provisioner can read its result first.
fn schedule_reboot(delay: u64) -> Result<()> {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &format!("sleep {delay}; sync; reboot")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: setsid is async-signal-safe; it detaches the shell from our session so it
    // outlives us (CAPH runs us under nohup over SSH).
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    cmd.spawn().context("starting the delayed reboot")?;
    Ok(())
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
