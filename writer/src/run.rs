//! From the command line to a run: the trusted key, the settings, then either a named target
//! written (its result on stderr) or this machine provisioned as CAPH runs it ([`crate::caph`]).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ingot_artifact::verify::{StackRef, Trust};
use ingot_layers::select::Role;
use ingot_machine::host::{Fixture, Host, Live};

use crate::caph::{self, Reboot, OUTPUT_JSON};
use crate::cli::Cli;
use crate::config::{self, Settings};
use crate::engine::WriteOptions;
use crate::pipeline::{self, Failed};
use crate::report::{DiskState, Reporter, Stage};
use crate::request::{ProvisionRequest, WriteRequest, WriteSettings};
use crate::steps;
use ingot_artifact::registry::mirrors::MirrorsFrom;

/// The public key compiled in at build time (INGOT_TRUST_KEY_BUILTIN: a minisign .pub's text).
const BUILTIN_KEY: Option<&str> = option_env!("INGOT_TRUST_KEY_BUILTIN");

/// The TPM the secrets are sealed with, when not the machine's own (`swtpm:path=SOCKET`, for
/// tests): `systemd-creds --tpm2-device=`.
pub const TPM_DEVICE_ENV: &str = "INGOT_TPM2_DEVICE";

/// How long a write stuck in the kernel may outlive the deadline before the process ends:
/// provisioning must still end inside CAPH's 7 minutes (6 m deadline + 30 s).
const GRACE_PROVISIONING: Duration = Duration::from_secs(30);
const GRACE_TARGET: Duration = Duration::from_secs(60);

/// This run's settings: flags over the file beside the binary over the built-in settings over
/// the defaults (`crate::config`).
struct Effective {
    file: Settings,
    from: Vec<String>,
    deadline: Duration,
    reboot: bool,
    reboot_delay: u64,
    read_test_seconds: f64,
}

impl Effective {
    fn new(cli: &Cli) -> Result<Effective> {
        let exe = std::env::current_exe().ok();
        let (file, from) = config::load(config::BUILTIN, exe.as_deref())?;
        let deadline = match (cli.deadline, &file.deadline) {
            (Some(d), _) => d,
            (None, Some(text)) => crate::cli::parse_duration(text)
                .map_err(|e| anyhow::anyhow!("deadline in {}: {e}", from.join(" and ")))?,
            (None, None) if cli.target.is_some() => Duration::from_secs(20 * 60),
            (None, None) => Duration::from_secs(6 * 60),
        };
        Ok(Effective {
            deadline,
            reboot: cli.reboot || (!cli.no_reboot && file.reboot.unwrap_or(false)),
            reboot_delay: cli.reboot_delay.or(file.reboot_delay).unwrap_or(30),
            read_test_seconds: cli
                .read_test_seconds
                .or(file.read_test_seconds)
                .unwrap_or(3.0),
            file,
            from,
        })
    }

    /// Where the registries configuration comes from when `--registries-conf` is not given: the
    /// settings' `registries_conf`, else their `registries` text, else the default file.
    fn mirrors_from(&self) -> MirrorsFrom {
        match (&self.file.registries_conf, &self.file.registries) {
            (Some(path), _) => MirrorsFrom::parse(path),
            (None, Some(text)) => MirrorsFrom::Text {
                text: text.clone(),
                from: format!("`registries` in {}", self.from.join(" and ")).into(),
            },
            (None, None) => MirrorsFrom::Default,
        }
    }

    /// Where [`Effective::key`] takes the trusted key from, for the report.
    fn key_source(&self, cli: &Cli) -> String {
        if cli.trust_key.is_some() {
            "--trust-key".into()
        } else if std::env::var_os("INGOT_TRUST_KEY").is_some() {
            "INGOT_TRUST_KEY".into()
        } else if self.file.trust_key.is_some() {
            self.from.join(" and ")
        } else {
            "the built-in key".into()
        }
    }

    /// The trusted key: `--trust-key`, else `INGOT_TRUST_KEY`, else the settings' `trust_key`,
    /// else the key compiled in.
    fn key(&self, cli: &Cli) -> Result<ingot_artifact::trust_key::TrustedKey> {
        match &self.file.trust_key {
            Some(text)
                if cli.trust_key.is_none() && std::env::var_os("INGOT_TRUST_KEY").is_none() =>
            {
                let from = format!("the trust_key of {}", self.from.join(" and "));
                Ok(ingot_artifact::trust_key::TrustedKey::parse(text, &from)?)
            }
            _ => Ok(ingot_artifact::trust_key::first_of(
                cli.trust_key.as_deref(),
                BUILTIN_KEY,
            )?),
        }
    }
}

/// Runs what `cli` asks for. `Ok` carries the exit status of a run that reported its own
/// result; `Err` is a usage or setup error, before any run began.
pub fn run(cli: Cli) -> Result<ExitCode> {
    let eff = Effective::new(&cli)?;
    let key = eff.key(&cli)?;
    let source: StackRef = cli.source.parse().map_err(|e: String| anyhow::anyhow!(e))?;
    if cli.max_attempts == 0 {
        bail!("--max-attempts must be at least 1");
    }
    if !(eff.read_test_seconds > 0.0 && eff.read_test_seconds <= 60.0) {
        bail!("--read-test-seconds must be more than 0 and at most 60");
    }
    let deadline = Instant::now() + eff.deadline;
    crate::interrupt::install().context("installing the SIGTERM/SIGINT handlers")?;
    let mut kernel_args = eff.file.kernel_args.clone().unwrap_or_default();
    kernel_args.extend(cli.kernel_args.iter().cloned());
    let settings = WriteSettings {
        esp_size: cli
            .esp_size
            .or(eff.file.esp_size)
            .unwrap_or(256)
            .checked_mul(1 << 20)
            .context("--esp-size is too large")?,
        kernel_args,
        options: WriteOptions {
            max_attempts: cli.max_attempts,
            deadline: Some(deadline),
        },
        mirror: None,
        registry: cli.registry.options_or(eff.mirrors_from())?,
    };
    let trust = Trust {
        key: Some(key),
        allow_unsigned: false,
    };
    match &cli.target {
        Some(target) => write_target(&cli, source, trust, target, settings, deadline),
        None => provision(&cli, &eff, source, trust, settings, deadline),
    }
}

fn write_target(
    cli: &Cli,
    source: StackRef,
    trust: Trust,
    target: &Path,
    settings: WriteSettings,
    deadline: Instant,
) -> Result<ExitCode> {
    let mut machine = cli.machine.to_machine(Role::Worker);
    // The writer only makes UEFI-bootable disks.
    machine.uefi = true;
    let req = WriteRequest {
        source,
        trust,
        machine,
        target: target.to_path_buf(),
        settings,
    };
    let reporter = Reporter::new(cli.events.as_deref(), cli.report.clone())
        .context("opening --events/--report")?;
    crate::watchdog::start(deadline, GRACE_TARGET, || {
        eprintln!("ingot-writer: error: the deadline passed and the run did not stop")
    });
    if cli.dry_run {
        return write_target_dry_run(&req, &reporter);
    }
    match pipeline::write_stack(&req, &reporter) {
        Ok(outcome) => {
            eprintln!("{}", steps::finish::written(&outcome, target, &reporter));
            Ok(ExitCode::SUCCESS)
        }
        Err(Failed { error, disks }) => {
            let text = format!("{:#}", anyhow::Error::new(*error));
            reporter.failed(&text, disks);
            eprintln!("ingot-writer: error: {text}");
            eprintln!(
                "ingot-writer: {}",
                match disks {
                    DiskState::Untouched => format!("nothing was written to {}", target.display()),
                    DiskState::Cleared =>
                        format!("{} was left without a partition table", target.display()),
                    DiskState::ClearFailed => format!(
                        "{} was changed and clearing its partition table failed too",
                        target.display()
                    ),
                }
            );
            Ok(ExitCode::from(1))
        }
    }
}

/// `--target` with `--dry-run`: the plan on stdout, the result on stderr as a real run's.
fn write_target_dry_run(req: &WriteRequest, reporter: &Reporter) -> Result<ExitCode> {
    match pipeline::write_stack_dry_run(req, reporter) {
        Ok(planned) => {
            println!("{}", steps::finish::planned(&planned, reporter));
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            let text = format!("{:#}", anyhow::Error::new(e));
            reporter.failed(&text, DiskState::Untouched);
            eprintln!("ingot-writer: error: {text}");
            eprintln!(
                "ingot-writer: dry run: nothing was written to {}",
                req.target.display()
            );
            Ok(ExitCode::from(1))
        }
    }
}

fn provision(
    cli: &Cli,
    eff: &Effective,
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
    let mut labels = eff.file.labels.clone().unwrap_or_default();
    for l in &cli.labels {
        let (k, v) = l
            .split_once('=')
            .with_context(|| format!("--label `{l}`: expected KEY=VALUE"))?;
        labels.insert(k.to_string(), v.to_string());
    }
    // The one place the machine is chosen: the live machine, or a fixture machine's answers
    // below its sysroot (`ingot_machine::host`). Every program the run needs goes through it.
    let mut required_tools = Vec::new();
    let host: Arc<dyn Host> = if cli.sysroot == Path::new("/") {
        required_tools.push("smartctl".to_string());
        Arc::new(Live)
    } else {
        Arc::new(Fixture::new(&cli.sysroot))
    };
    if eff.reboot {
        required_tools.extend(["sh".to_string(), "reboot".to_string()]);
    }
    let report = cli
        .report
        .clone()
        .unwrap_or_else(|| PathBuf::from(OUTPUT_JSON));
    let reporter = Reporter::new(cli.events.as_deref(), Some(report.clone()))
        .with_context(|| format!("opening {}", report.display()))?
        .starting_at(Stage::Check)
        .with_stdout_log();
    reporter.detail(
        "settings",
        serde_json::json!({
            "from": eff.from,
            "trust_key": eff.key_source(cli),
            "deadline_seconds": eff.deadline.as_secs(),
            "reboot": eff.reboot,
            "tpm": crate::tpm::TpmSetting::effective(cli.tpm, eff.file.tpm),
        }),
    );
    let req = ProvisionRequest {
        image: source,
        trust,
        bootstrap,
        machine_name,
        root_devices,
        sysroot: cli.sysroot.clone(),
        host,
        role: cli.machine.role,
        allow_foreign_os: cli.allow_foreign_os || eff.file.allow_foreign_os.unwrap_or(false),
        min_read_kib_s: cli.min_read_speed.or(eff.file.min_read_speed),
        read_test: Duration::from_secs_f64(eff.read_test_seconds),
        required_tools,
        labels,
        tpm: crate::tpm::TpmSetting::effective(cli.tpm, eff.file.tpm),
        tpm_device: std::env::var(TPM_DEVICE_ENV)
            .ok()
            .or_else(|| (cli.sysroot == Path::new("/")).then(|| "auto".to_string())),
        settings,
    };
    let reboot = Reboot {
        enabled: eff.reboot && !cli.dry_run,
        delay: eff.reboot_delay,
    };
    if cli.dry_run {
        return Ok(caph::dry_run(&req, &reporter, deadline, GRACE_PROVISIONING));
    }
    caph::provision(&req, &reporter, deadline, GRACE_PROVISIONING, &reboot)
}
