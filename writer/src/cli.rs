//! `ingot-writer`'s command line, as a library module so the CLI reference and man pages can be
//! generated from it.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use ingot_layers::machine_args::MachineArgs;

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
///     layer from the bootstrap data, writes every root device (var mirrored across them), keeps
///     /root/output.json's `status` and `message` current, and prints IMAGE_URL_DONE as the last
///     stdout line on success only. CAPH reboots the machine; the writer does not (--reboot).
///
///   Settings CAPH cannot pass come from image-url-command.toml beside the binary (or
///   BINARY.toml), over the settings compiled in (ci/release); flags win over both.
#[derive(Parser, Debug)]
#[command(
    name = "ingot-writer",
    version = ingot_artifact::version::VERSION,
    verbatim_doc_comment,
    after_help = EXIT_STATUS,
    mut_arg("role", |a| a.help(
        "This machine's role (default: from the bootstrap data when provisioning, else worker)"
    )),
    mut_arg("gpu", |a| a.requires("target").help(
        "With --target: a GPU vendor present on this machine (repeatable): nvidia. \
         Provisioning detects it from PCI"
    )),
    mut_arg("virt", |a| a.requires("target").help(
        "With --target: hardware virtualization is available. Provisioning detects it"
    )),
    // The writer's disks always boot with UEFI (the machine it describes has it), so the shared
    // flag says nothing here: accepted, not offered.
    mut_arg("uefi", |a| a.requires("target").hide(true))
)]
pub struct Cli {
    /// The stack: `oci://REGISTRY/REPO:TAG` (or `@sha256:...`), or an OCI image layout directory
    /// (`oci:DIR` or `DIR`).
    pub source: String,
    /// Provisioning: the bootstrap data (cloud-config or Ignition), e.g. /root/bootstrap.data.
    pub bootstrap_data: Option<PathBuf>,
    /// Provisioning: the machine's name (the hostname unless the bootstrap data sets one).
    pub machine_name: Option<String>,
    /// Provisioning: the target disks, short names (`sda nvme0n1`) or WWNs, space-separated;
    /// every one is written, and `var` mirrored across them.
    pub root_devices: Option<String>,
    /// Write this block device or image file instead of provisioning. Everything on it is
    /// replaced.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["bootstrap_data", "sysroot"])]
    pub target: Option<PathBuf>,
    /// The public key the stack must be signed with (else INGOT_TRUST_KEY, else the key
    /// compiled in): a minisign key checks the signature inside the artifact, a cosign PEM key
    /// (`cosign.pub`) the cosign signature of its manifest under the `sha256-<HEX>.sig` tag
    /// (docs/manifest.md, "Two signatures").
    #[arg(long, value_name = "PUB")]
    pub trust_key: Option<PathBuf>,
    // The machine the layer rules see: --role, and with --target --gpu/--virt (UEFI always)
    // (provisioning detects those).
    #[command(flatten)]
    pub machine: MachineArgs,
    /// Provisioning: read /sys, /proc and /dev below DIR (a fixture machine) instead of /.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub sysroot: PathBuf,
    /// Provisioning: write even when another disk holds an operating system (it may then be
    /// booted instead of this one, unless the boot order is pinned).
    #[arg(long)]
    pub allow_foreign_os: bool,
    /// Provisioning: minimum sequential read speed of the target, KiB/s (default as CAPH:
    /// 20000 for a spinning disk, 40000 otherwise).
    #[arg(long, value_name = "KIB_S")]
    pub min_read_speed: Option<u64>,
    /// Provisioning: how long the read speed test runs, in seconds (default 3).
    #[arg(long, value_name = "SECS")]
    pub read_test_seconds: Option<f64>,
    /// Provisioning: an extra node label `key=value` (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// Give up after this long (`90s`, `6m`, `1h`): the disk is left without a partition table
    /// and the reason reported. Default 6m when provisioning (CAPH gives up after 7 minutes),
    /// 20m with --target.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub deadline: Option<Duration>,
    /// Provisioning: reboot after a successful run. Off by default: CAPH reboots the machine
    /// itself after IMAGE_URL_DONE, and a second reboot racing its SSH session fails the host.
    #[arg(long, conflicts_with = "no_reboot")]
    pub reboot: bool,
    /// Provisioning: do not reboot (the default; accepted for older callers).
    #[arg(long, hide = true)]
    pub no_reboot: bool,
    /// Seconds between success and the reboot (the provisioner reads the result first;
    /// default 30).
    #[arg(long, value_name = "SECS")]
    pub reboot_delay: Option<u64>,
    /// Take every step up to and including the plan (check, gate, guard, resolve, verify,
    /// stage, seal, plan), print the plan and record it in the status file (state `dry-run`),
    /// and write nothing: the targets are only opened read-only. Exits 0 when a real run would
    /// go on to write.
    #[arg(long)]
    pub dry_run: bool,
    /// Provisioning: what to do with the node's secrets (SSH host keys, kubeadm tokens and
    /// configurations, private keys): `require` seals them to this machine's TPM 2.0 under the
    /// release's signed PCR policy or fails in `gate` before any disk is touched; `prefer` (the
    /// default) seals them where it can and otherwise writes them in the clear and says so; `off`
    /// writes them in the clear.
    #[arg(long, value_enum, value_name = "SETTING", conflicts_with = "target")]
    pub tpm: Option<crate::tpm::TpmSetting>,
    /// Size of the EFI system partition, in MiB (at least 64; default 256).
    #[arg(long, value_name = "MIB")]
    pub esp_size: Option<u64>,
    /// Extra kernel command-line argument (repeatable), e.g. console=ttyS0; no control
    /// characters and no ingot.* parameter.
    #[arg(long = "kernel-arg", value_name = "ARG")]
    pub kernel_args: Vec<String>,
    /// Writes of one range before the run fails (a range that reads back wrong is rewritten).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub max_attempts: u32,
    /// Write progress events as JSON lines to FILE, or `-` for stdout.
    #[arg(long, value_name = "FILE|-")]
    pub events: Option<String>,
    /// Keep a JSON status file at FILE (stage, message, warnings, rewrites, result); when
    /// provisioning, /root/output.json unless given (CAPH shows its `message`).
    #[arg(long, visible_alias = "output-json", value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Log verbosity (-v info, -vv debug).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// How to reach the registry (the same options as every `ingot` command that reaches one).
    #[command(flatten)]
    pub registry: ingot_artifact::registry::args::RegistryArgs,
}

/// The exit statuses, in `--help`.
pub const EXIT_STATUS: &str = "Exit status: 0 written (with --dry-run: every check passed and a \
real run would write); 1 the run failed, its reason on the last stdout line (provisioning: \
`FAILED (REASON)`) and in the status file, the disks either unchanged or without a partition \
table; 2 a usage or setup error, before any run began.";

/// `90s`, `20m`, `1h`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
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
