//! `ingot vm`: glue for [`ingot_vm`]. Describes the machine, has the writer write the stack
//! onto the VM's disk images exactly as CAPH runs it (the `ingot-writer` binary with the
//! machine fixture as its `--sysroot`), boots the disks under QEMU with the console on the
//! terminal, and exits with QEMU's status. `ingot vm ssh` logs into the forwarded port.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use ingot_artifact::verify::{open_with, StackRef};
use ingot_vm::accel::{self, Accel};
use ingot_vm::firmware::{Firmware, Lookup};
use ingot_vm::provision;
use ingot_vm::state::{Spec, State};
use ingot_vm::swtpm::Swtpm;

use super::publish::RegistryArgs;

// `ingot vm --help` shows the subcommand's line in mod.rs; docs/vm.md has the walk-through.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct VmArgs {
    #[command(subcommand)]
    pub command: Option<VmCommand>,
    /// The stack, as the writer takes it: `oci://REGISTRY/REPO:TAG` (or `@sha256:...`), or an
    /// OCI image layout directory. Not needed to boot a kept --state again.
    pub source: Option<String>,
    /// The public key the stack must be signed with (passed to the writer; else
    /// INGOT_TRUST_KEY, else the writer's built-in key).
    #[arg(long, value_name = "PUB")]
    pub trust_key: Option<PathBuf>,
    /// The node's role (passed to the writer; default: from the bootstrap data).
    #[arg(long, value_name = "ROLE")]
    pub role: Option<String>,
    /// A GPU on the machine's PCI bus, which the writer detects (QEMU emulates none: the guest
    /// does not see it); `none` takes a kept VM's away. [default: none]
    #[arg(long, value_name = "VENDOR")]
    pub gpu: Option<Gpu>,
    /// Hardware virtualization, as the writer detects it (vmx and /dev/kvm in the fixture).
    /// [default: off]
    #[arg(long, value_name = "ON", num_args = 0..=1, default_missing_value = "true")]
    pub virt: Option<bool>,
    /// The firmware the VM boots with. [default: uefi]
    #[arg(long, value_enum)]
    pub firmware: Option<FirmwareArg>,
    /// With --firmware secure-boot: the release's key set (`ingot key secure-boot --out DIR`),
    /// enrolled into the VM's variable store on its first boot (a kept VM keeps them).
    #[arg(long, value_name = "DIR")]
    pub secure_boot_keys: Option<PathBuf>,
    /// Disks (the writer writes every one, `var` mirrored when more than one). [default: 1]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=8))]
    pub disks: Option<u32>,
    /// Each disk's size: bytes, or with K, M, G or T (powers of 1024). [default: 8G]
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub disk_size: Option<u64>,
    /// Virtual CPUs. [default: 2]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub cpus: Option<u32>,
    /// Memory in MiB. [default: 2048]
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u32).range(128..))]
    pub memory: Option<u32>,
    /// The machine's name (the hostname unless the bootstrap data sets one). [default:
    /// ingot-vm]
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Bootstrap data (cloud-config or Ignition), as CAPH passes it. [default: a cloud-config
    /// with the hostname; on --rewrite, the data the VM was written with]
    #[arg(long, value_name = "FILE")]
    pub bootstrap: Option<PathBuf>,
    /// This SSH public key authorized for root: in generated bootstrap data, or added to a
    /// cloud-config --bootstrap. `ingot vm ssh` logs in with the private key beside it.
    #[arg(long, value_name = "PUB")]
    pub ssh_key: Option<PathBuf>,
    /// A kernel argument for the node (the writer's --kernel-arg; repeat it). `console=ttyS0`
    /// is always given. A Secure Boot release's signed command line ignores these.
    #[arg(long, value_name = "ARG")]
    pub kernel_arg: Vec<String>,
    /// The network: none (the node's offline first boot), or QEMU's user networking.
    /// [default: none]
    #[arg(long, value_enum)]
    pub net: Option<NetArg>,
    /// With --net user: the host's 127.0.0.1:PORT forwarded to the guest's SSH port.
    #[arg(long, value_name = "PORT")]
    pub ssh_port: Option<u16>,
    /// The accelerator (default: KVM when a probe guest runs under it, else TCG with a warning).
    #[arg(long, value_enum)]
    pub accel: Option<AccelArg>,
    /// Keep the VM here: its machine, disks, fixture, firmware variables and bootstrap data. A
    /// second `ingot vm --state DIR` boots the same machine's disks as the first boot left them
    /// (a machine flag given then changes the kept machine).
    #[arg(long, value_name = "DIR", conflicts_with = "ephemeral")]
    pub state: Option<PathBuf>,
    /// Throw the VM away when it ends (the default without --state).
    #[arg(long)]
    pub ephemeral: bool,
    /// Write SOURCE anew over the kept VM's disks, as re-provisioning a server does.
    #[arg(long, requires = "state")]
    pub rewrite: bool,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

#[derive(Subcommand, Debug)]
pub enum VmCommand {
    /// Log into a running VM over its forwarded SSH port (as root).
    Ssh(SshArgs),
}

#[derive(Args, Debug)]
pub struct SshArgs {
    /// The VM's state directory (its SSH port is kept there).
    #[arg(long, value_name = "DIR", required_unless_present = "port")]
    pub state: Option<PathBuf>,
    /// The forwarded port (instead of --state).
    #[arg(long, value_name = "PORT")]
    pub port: Option<u16>,
    /// The command to run (after `--`); none: a login shell.
    #[arg(last = true)]
    pub command: Vec<OsString>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Gpu {
    Nvidia,
    None,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FirmwareArg {
    /// OVMF.
    Uefi,
    /// OVMF's Secure Boot build, the --secure-boot-keys enrolled, a TPM from swtpm.
    SecureBoot,
    /// SeaBIOS.
    Bios,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NetArg {
    None,
    User,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum AccelArg {
    Kvm,
    Tcg,
}

/// `8G`, `512M`, `1T`, or plain bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, ""), |i| s.split_at(i));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size (like 8G, 512M)"))?;
    let shift = match unit {
        "" => 0,
        "K" | "k" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("`{s}`: unknown unit `{unit}` (use K, M, G or T)")),
    };
    n.checked_mul(1 << shift)
        .filter(|&b| b >= 1 << 20)
        .ok_or_else(|| format!("`{s}`: a disk is at least 1M and at most 16E"))
}

pub fn run(args: VmArgs) -> anyhow::Result<ExitCode> {
    if let Some(VmCommand::Ssh(ssh)) = args.command {
        return run_ssh(ssh);
    }
    let temp;
    let state = match &args.state {
        Some(dir) => State::new(dir),
        None => {
            // Not /tmp, often a tmpfs: a stack's gigabytes would be written into memory.
            let parent =
                std::env::var_os("TMPDIR").map_or_else(|| "/var/tmp".into(), PathBuf::from);
            temp = tempfile::Builder::new()
                .prefix("ingot-vm-")
                .tempdir_in(parent)
                .context("creating the VM's temporary state directory")?;
            State::new(temp.path())
        }
    };
    let kept = state.kept_spec()?;
    let spec = machine_spec(&args, kept.clone().unwrap_or_default())?;
    let source = provision::plan(args.source.as_deref(), &state, args.rewrite)?;
    if spec.firmware == Firmware::SecureBoot
        && args.secure_boot_keys.is_none()
        && !state.vars().exists()
    {
        bail!(
            "--firmware secure-boot needs --secure-boot-keys DIR (the keys the first boot enrolls)"
        );
    }
    // Refuse what is missing before writing anything.
    let lookup = Lookup::system();
    lookup.qemu()?;
    let images = lookup.firmware(spec.firmware)?;
    let swtpm = match spec.firmware {
        Firmware::SecureBoot => Some(lookup.swtpm()?),
        _ => None,
    };
    if let (Some(source), Firmware::SecureBoot) = (source, spec.firmware) {
        require_uki(&args, source)?;
    }
    let forced = args.accel.map(|a| match a {
        AccelArg::Kvm => Accel::Kvm,
        AccelArg::Tcg => Accel::Tcg,
    });
    let choice = accel::choose(forced).context("--accel kvm")?;
    if let Some(warning) = choice.warning() {
        eprintln!("ingot vm: warning: {warning}");
    }
    std::fs::create_dir_all(state.dir()).with_context(|| format!("{}", state.dir().display()))?;
    // Kept before the writer runs: its disks are this machine's even when the write fails.
    state.keep_spec(&spec)?;
    match source {
        Some(source) => {
            if !write(&args, source, &state, &spec, swtpm.as_deref())?.success() {
                eprintln!("ingot vm: the writer failed: nothing is booted");
                return Ok(ExitCode::from(1));
            }
        }
        None => eprintln!(
            "ingot vm: booting {} again as it was left{}",
            state.dir().display(),
            if kept.is_some_and(|k| k != spec) {
                " (on the machine the flags changed)"
            } else {
                ""
            }
        ),
    }
    state.keep_ssh(spec.ssh_port, ssh_identity(&args).as_deref())?;
    if let (Some(keys), false) = (&args.secure_boot_keys, state.vars().exists()) {
        eprintln!(
            "ingot vm: enrolling the keys in {} (systemd-boot)",
            keys.display()
        );
        provision::enroll(&lookup, keys, &state, &images, choice.accel)?;
    }
    let mut machine = state.machine_to_boot(&spec, images, choice.accel)?;
    let tpm = match &swtpm {
        Some(program) => Some(Swtpm::start(program, &state.tpm())?),
        None => None,
    };
    machine.tpm = tpm.as_ref().map(|t| t.socket().to_path_buf());
    eprintln!(
        "ingot vm: booting {} disk(s) with {} under {} (Ctrl-A X ends the VM)",
        machine.disks.len(),
        spec.firmware.name(),
        choice.accel.name()
    );
    let ran =
        ingot_vm::run::interactive(machine.command(), &state.console(), &mut std::io::stdout())?;
    drop(tpm);
    Ok(boot_status(&ran))
}

/// `ingot vm`'s status for a finished boot (exit_status::VM).
fn boot_status(ran: &ingot_vm::run::Interactive) -> ExitCode {
    if let Some(line) = &ran.failed {
        eprintln!("ingot vm: the node's boot failed: {line}");
        return ExitCode::from(3);
    }
    if ran.status.success() {
        return ExitCode::SUCCESS;
    }
    eprintln!("ingot vm: QEMU ended with {}", ran.status);
    ExitCode::from(4)
}

/// The machine to boot: the kept one (or the defaults), with what the flags change.
fn machine_spec(args: &VmArgs, mut spec: Spec) -> anyhow::Result<Spec> {
    if let Some(f) = args.firmware {
        spec.firmware = match f {
            FirmwareArg::Uefi => Firmware::Uefi,
            FirmwareArg::SecureBoot => Firmware::SecureBoot,
            FirmwareArg::Bios => Firmware::Bios,
        };
    }
    if let Some(name) = &args.name {
        spec.name.clone_from(name);
    }
    spec.virt = args.virt.unwrap_or(spec.virt);
    spec.nvidia_gpu = args.gpu.map_or(spec.nvidia_gpu, |g| g == Gpu::Nvidia);
    spec.cpus = args.cpus.unwrap_or(spec.cpus);
    spec.memory_mib = args.memory.unwrap_or(spec.memory_mib);
    spec.disks = args.disks.map_or(spec.disks, |d| d as usize);
    spec.disk_size = args.disk_size.unwrap_or(spec.disk_size);
    match args.net {
        Some(NetArg::None) => (spec.user_net, spec.ssh_port) = (false, None),
        Some(NetArg::User) => spec.user_net = true,
        None => {}
    }
    if let Some(port) = args.ssh_port {
        spec.ssh_port = Some(port);
    }
    if spec.ssh_port.is_some() && !spec.user_net {
        bail!("--ssh-port needs --net user");
    }
    Ok(spec)
}

/// Secure Boot boots only the release's signed UKI: a stack without one is refused before
/// anything is written.
fn require_uki(args: &VmArgs, source: &str) -> anyhow::Result<()> {
    let stack: StackRef = source.parse().map_err(anyhow::Error::msg)?;
    let key = args
        .trust_key
        .as_deref()
        .map(|p| ingot_artifact::trust_key::from_arg(&p.to_string_lossy()))
        .transpose()?;
    let opened =
        open_with(&stack, args.registry.options()?).with_context(|| format!("opening {source}"))?;
    let report = crate::inspect::inspect(opened.as_ref(), key, None, false)
        .map_err(|e| anyhow::anyhow!("{source}: {}", e.full_text()))?;
    if report.uki.is_none() {
        bail!(
            "stack {} {} has no signed UKI (built without --secure-boot-key): Secure Boot \
             would refuse its boot loader; boot it with --firmware uefi or bios",
            report.name,
            report.version
        );
    }
    Ok(())
}

/// The private key beside --ssh-key's public one (`PUB` without `.pub`), when it is there.
fn ssh_identity(args: &VmArgs) -> Option<PathBuf> {
    let public = args.ssh_key.as_ref()?.to_str()?;
    Some(PathBuf::from(public.strip_suffix(".pub")?)).filter(|p| p.is_file())
}

/// Has the writer write SOURCE onto the VM as CAPH runs it; its status. With `swtpm` (a
/// machine with a TPM), the VM's own TPM state runs on the host while the writer writes, so
/// the node's secrets are sealed to the TPM the node boots with, as in a rescue system.
fn write(
    args: &VmArgs,
    source: &str,
    state: &State,
    spec: &Spec,
    swtpm: Option<&std::path::Path>,
) -> anyhow::Result<std::process::ExitStatus> {
    let data = bootstrap_data(args, state, &spec.name)?;
    let writer = provision::writer_binary()?;
    eprintln!(
        "ingot vm: writing {source} onto {} disk(s) in {} with {}",
        spec.disks,
        state.dir().display(),
        writer.display()
    );
    let request = provision::Write {
        source,
        data: &data,
        trust_key: args.trust_key.as_deref(),
        role: args.role.as_deref(),
        kernel_args: &args.kernel_arg,
        flags: registry_args(&args.registry),
        tpm2_device: None,
    };
    let Some(program) = swtpm else {
        return Ok(provision::write(&writer, &request, state, spec)?);
    };
    let tpm = Swtpm::start_for_host(program, &state.tpm())?;
    let request = provision::Write {
        tpm2_device: tpm.tcti(),
        ..request
    };
    let status = provision::write(&writer, &request, state, spec);
    // Orderly, as a rescue system's power-off: the node boots next on this state.
    tpm.shutdown()?;
    Ok(status?)
}

/// The bootstrap data to write: --bootstrap's, else (re-provisioning without new data or key)
/// the data the VM was written with, else generated; with --ssh-key's key authorized for root.
fn bootstrap_data(args: &VmArgs, state: &State, name: &str) -> anyhow::Result<Vec<u8>> {
    let read = |p: &Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
    let kept = state.bootstrap();
    let given = match (&args.bootstrap, &args.ssh_key) {
        (Some(file), _) => Some(read(file)?),
        (None, None) if args.rewrite && kept.is_file() => Some(read(&kept)?),
        (None, _) => None,
    };
    let key = match &args.ssh_key {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("reading the SSH public key {}", p.display()))?,
        ),
        None => None,
    };
    ingot_vm::bootstrap::data(name, given, key.as_deref()).with_context(|| match &args.ssh_key {
        Some(p) => format!("--ssh-key {}", p.display()),
        None => "the bootstrap data".to_string(),
    })
}

/// The registry options again as the writer's flags (it takes the same ones).
fn registry_args(r: &RegistryArgs) -> Vec<OsString> {
    let mut out: Vec<OsString> = Vec::new();
    let mut flag = |f: &str, on: bool| {
        if on {
            out.push(f.into());
        }
    };
    flag("--plain-http", r.plain_http);
    flag("--insecure", r.insecure);
    flag("--password-stdin", r.password_stdin);
    flag("--quiet", r.quiet);
    let mut pair = |f: &str, v: Option<OsString>| {
        if let Some(v) = v {
            out.push(f.into());
            out.push(v);
        }
    };
    pair("--ca-file", r.ca_file.clone().map(Into::into));
    pair("--authfile", r.authfile.clone().map(Into::into));
    pair("--username", r.username.clone().map(Into::into));
    pair(
        "--registries-conf",
        r.registries_conf.clone().map(Into::into),
    );
    pair("--retries", Some(r.retries.to_string().into()));
    pair("--speed-limit", Some(r.speed_limit.to_string().into()));
    pair("--speed-time", Some(r.speed_time.to_string().into()));
    pair("--concurrency", Some(r.concurrency.to_string().into()));
    out
}

fn run_ssh(args: SshArgs) -> anyhow::Result<ExitCode> {
    let port = match (args.port, &args.state) {
        (Some(port), _) => port,
        (None, Some(dir)) => read_port(&State::new(dir).ssh_port_file())?,
        (None, None) => bail!("give --state DIR or --port PORT"),
    };
    let mut ssh = Command::new("ssh");
    if let Some(key) = args
        .state
        .as_ref()
        .and_then(|d| State::new(d).ssh_identity())
    {
        ssh.arg("-i").arg(key).args(["-o", "IdentitiesOnly=yes"]);
    }
    let status = ssh
        .args(["-p", &port.to_string()])
        .args(["-o", "StrictHostKeyChecking=no"])
        .args(["-o", "UserKnownHostsFile=/dev/null"])
        .args(["-o", "LogLevel=ERROR"])
        // A guest still booting accepts the forwarded connection and says nothing.
        .args(["-o", "ConnectTimeout=30"])
        .arg("root@127.0.0.1")
        .args(&args.command)
        .status()
        .context("running ssh (Debian package openssh-client)")?;
    Ok(ExitCode::from(status.code().map_or(255, |c| c as u8)))
}

fn read_port(file: &Path) -> anyhow::Result<u16> {
    let text = std::fs::read_to_string(file).with_context(|| {
        format!(
            "{}: no SSH port kept (was the VM started with --net user --ssh-port N?)",
            file.display()
        )
    })?;
    text.trim()
        .parse()
        .with_context(|| format!("{}: {text:?} is not a port", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        vm: VmArgs,
    }

    /// Every registry option reaches the writer: it takes the same flags.
    #[test]
    fn registry_options_are_passed_to_the_writer() {
        let given = [
            "--plain-http",
            "--authfile",
            "/a.json",
            "--registries-conf",
            "none",
            "--retries",
            "3",
            "--concurrency",
            "2",
        ];
        let args = Wrap::try_parse_from(["ingot-vm", "oci://r/x:1"].iter().chain(&given))
            .unwrap()
            .vm;
        let out: Vec<String> = registry_args(&args.registry)
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        for pair in given[1..].chunks(2) {
            let at = out.iter().position(|a| a == pair[0]).expect(pair[0]);
            assert_eq!(out[at + 1], pair[1], "{out:?}");
        }
        assert!(out.contains(&"--plain-http".to_string()), "{out:?}");
    }

    fn parsed(flags: &[&str]) -> VmArgs {
        Wrap::try_parse_from(["ingot-vm"].iter().chain(flags))
            .unwrap()
            .vm
    }

    /// A kept VM boots as the machine it was; a flag changes only its own part.
    #[test]
    fn flags_change_only_their_part_of_the_kept_machine() {
        let kept = Spec {
            firmware: Firmware::Bios,
            disks: 2,
            nvidia_gpu: true,
            user_net: true,
            ssh_port: Some(2222),
            ..Spec::default()
        };
        let none = machine_spec(&parsed(&["--state", "d"]), kept.clone()).unwrap();
        assert_eq!(none, kept);
        let cpus = machine_spec(&parsed(&["--cpus", "4"]), kept.clone()).unwrap();
        assert_eq!(
            cpus,
            Spec {
                cpus: 4,
                ..kept.clone()
            }
        );
        let off = machine_spec(&parsed(&["--net", "none", "--gpu", "none"]), kept.clone());
        assert_eq!(
            off.unwrap(),
            Spec {
                user_net: false,
                ssh_port: None,
                nvidia_gpu: false,
                ..kept
            }
        );
        let err = machine_spec(&parsed(&["--ssh-port", "2200"]), Spec::default()).unwrap_err();
        assert!(err.to_string().contains("--net user"), "{err}");
        let virt = machine_spec(&parsed(&["--virt"]), Spec::default()).unwrap();
        assert!(virt.virt);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8G"), Ok(8 << 30));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert!(parse_size("1K").is_err() && parse_size("G").is_err());
    }
}
