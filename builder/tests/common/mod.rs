//! Helpers shared by the stack tests: running `ingot`, finding tools, reading layouts, and RAII
//! guards for the root-only parts (loop mounts, a private containerd).

#![allow(dead_code)] // each test binary uses a different subset

use ingot_testkit::measure;

/// Runs `ingot ARGS` measured (peak RSS, wall time), killed at `deadline`.
pub fn ingot_measured(
    args: impl IntoIterator<Item = impl AsRef<std::ffi::OsStr>>,
    deadline: Duration,
) -> measure::Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ingot"));
    cmd.args(args).env_remove("RUST_LOG");
    measure::measured_with(cmd, deadline, |_| {})
}

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("builder/ has a parent")
        .to_owned()
}

/// The demo manifest.
pub fn demo_manifest() -> PathBuf {
    repo().join("manifests/demo.toml")
}

#[allow(unused_imports)] // not every test file uses every helper
pub use ingot_testkit::skip::{have_root, have_tool};

/// Run `ingot` with arguments.
pub fn ingot<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("running ingot")
}

/// Run `ingot`, assert success, return stdout.
pub fn ingot_ok<I, S>(args: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let out = ingot(args);
    ingot_testkit::command::assert_success(&"ingot", &out);
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// Run a command, assert success, return stdout.
#[allow(unused_imports)] // not every test file runs tools
pub use ingot_testkit::command::run_ok;

/// Build `manifest` into `out` (signed with `key` if given, fixed revision).
pub fn build(manifest: &Path, out: &Path, key: Option<&Path>) {
    let mut args: Vec<std::ffi::OsString> = vec![
        "build".into(),
        manifest.into(),
        "--out".into(),
        out.into(),
        "--quiet".into(),
        "--revision".into(),
        "test".into(),
    ];
    if let Some(k) = key {
        args.push("--sign-key".into());
        args.push(k.into());
    }
    ingot_ok(args);
}

/// Make a key pair with `ingot key generate`; returns (secret, public).
pub fn keypair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let sk = dir.join(format!("{name}.key"));
    let pk = dir.join(format!("{name}.pub"));
    ingot_ok([
        "key".as_ref(),
        "generate".as_ref(),
        "--secret".as_ref(),
        sk.as_os_str(),
        "--public".as_ref(),
        pk.as_os_str(),
    ]);
    (sk, pk)
}

#[allow(unused_imports)] // not every test file uses every helper
pub use ingot_testkit::layout::{blob_path, read as read_layout, Layout as Built};

/// `cp -a FROM TO` (modes, times, links, extended attributes kept; ownership only as root).
pub fn cp_a(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .args(["-a", "--no-preserve=ownership"])
        .arg(from)
        .arg(to)
        .status()
        .expect("running cp");
    assert!(
        status.success(),
        "cp -a {} {}",
        from.display(),
        to.display()
    );
}

/// A copy of the demo stack whose base layer a test may change: the fixture's base tree copied
/// to `dir/NAME-base`, and `dir/NAME.toml`, the demo manifest reading it. Returns (manifest,
/// base tree).
pub fn demo_copy(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let fixtures = repo().join("tests/fixtures");
    let base = dir.join(format!("{name}-base"));
    cp_a(&fixtures.join("demo/base"), &base);
    let text = fs::read_to_string(demo_manifest())
        .unwrap()
        .replace("../tests/fixtures/demo/base", &base.display().to_string())
        .replace("../tests/fixtures", &fixtures.display().to_string());
    let manifest = dir.join(format!("{name}.toml"));
    fs::write(&manifest, text).unwrap();
    (manifest, base)
}

/// The SBOM tests' two layer trees in `dir`: `base`, the demo's base with `base_status` as its
/// dpkg status, and `tools`, holding `usr/bin/socat` and `tools_status`. Returns (base, tools).
#[allow(dead_code)] // not every test file builds SBOMs
pub fn dpkg_layers(dir: &Path, base_status: &[u8], tools_status: &[u8]) -> (PathBuf, PathBuf) {
    let base = dir.join("base");
    copy_tree(&repo().join("tests/fixtures/demo/base"), &base);
    fs::create_dir_all(base.join("usr/lib/ingot/dpkg")).unwrap();
    fs::write(base.join("usr/lib/ingot/dpkg/status"), base_status).unwrap();
    let tools = dir.join("tools");
    fs::create_dir_all(tools.join("usr/lib/ingot/dpkg")).unwrap();
    fs::create_dir_all(tools.join("usr/bin")).unwrap();
    fs::write(tools.join("usr/bin/socat"), b"socat").unwrap();
    fs::write(tools.join("usr/lib/ingot/dpkg/status"), tools_status).unwrap();
    (base, tools)
}

/// Copy a directory tree (files, dirs, symlinks; modes kept).
pub fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let ty = entry.file_type().unwrap();
        let dest = to.join(entry.file_name());
        if ty.is_dir() {
            copy_tree(&entry.path(), &dest);
            fs::set_permissions(&dest, entry.metadata().unwrap().permissions()).unwrap();
        } else if ty.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(entry.path()).unwrap(), &dest).unwrap();
        } else {
            fs::copy(entry.path(), &dest).unwrap();
        }
    }
}

/// A read-only loop mount, unmounted (and its loop device released) on drop.
#[allow(unused_imports)] // not every test file mounts
pub use ingot_testkit::loopdev::LoopMount;

/// A containerd of our own: temporary root, state dir and socket; killed on drop, and any
/// mount left under its directories removed.
pub struct Containerd {
    pub dir: PathBuf,
    pub socket: PathBuf,
    child: Child,
}

impl Containerd {
    pub fn start(dir: &Path) -> Containerd {
        fs::create_dir_all(dir).unwrap();
        let socket = dir.join("containerd.sock");
        let config = format!(
            "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
             [grpc]\n  address = \"{sock}\"\n[ttrpc]\n  address = \"{sock}.ttrpc\"\n\
             [debug]\n  address = \"\"\n[metrics]\n  address = \"\"\n",
            root = dir.join("root").display(),
            state = dir.join("state").display(),
            sock = socket.display(),
        );
        fs::write(dir.join("config.toml"), config).unwrap();
        let log = fs::File::create(dir.join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(dir.join("config.toml"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting containerd");
        let guard = Containerd {
            dir: dir.to_owned(),
            socket,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if guard.socket.exists()
                && Command::new("ctr")
                    .arg("--address")
                    .arg(&guard.socket)
                    .arg("version")
                    .output()
                    .is_ok_and(|o| o.status.success())
            {
                return guard;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "containerd did not come up: {}",
            fs::read_to_string(dir.join("containerd.log")).unwrap_or_default()
        );
    }

    /// `ctr --address SOCK -n ingot-test ARGS…`
    pub fn ctr(&self, args: &[&str]) -> Output {
        Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", "ingot-test"])
            .args(args)
            .output()
            .expect("running ctr")
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Unmount anything containerd left under its directories, deepest first.
        if let Ok(info) = fs::read_to_string("/proc/self/mountinfo") {
            let prefix = self.dir.to_string_lossy().into_owned();
            let mut points: Vec<&str> = info
                .lines()
                .filter_map(|l| l.split(' ').nth(4))
                .filter(|p| p.starts_with(&prefix))
                .collect();
            points.sort_by_key(|p| std::cmp::Reverse(p.len()));
            for p in points {
                let _ = Command::new("umount").arg("-l").arg(p).status();
            }
        }
    }
}

/// One layer of a test stack: its name, kind, `when` rule (`None` for the base) and tree.
#[allow(dead_code)] // not every test file builds its own stacks
pub struct TestLayer<'a> {
    pub name: &'a str,
    pub kind: &'a str,
    pub when: Option<&'a str>,
    pub dir: &'a Path,
}

impl<'a> TestLayer<'a> {
    #[allow(dead_code)] // not every test file builds its own stacks
    pub fn new(name: &'a str, kind: &'a str, when: Option<&'a str>, dir: &'a Path) -> Self {
        TestLayer {
            name,
            kind,
            when,
            dir,
        }
    }
}

/// Writes `dir/stack.toml`: stack `name` 1.0.0 at the demo's epoch, the demo's boot paths, and
/// `layers` in order (each a `dir` source); returns its path.
#[allow(dead_code)] // not every test file builds its own stacks
pub fn write_manifest(dir: &Path, name: &str, layers: &[TestLayer<'_>]) -> PathBuf {
    use std::fmt::Write as _;
    let mut text = format!(
        "name = \"{name}\"\nversion = \"1.0.0\"\nsource_date_epoch = 1700000000\n\n[boot]\n\
         kernel = \"/boot/vmlinuz\"\ninitrd = \"/boot/initrd.img\"\n\
         efi = \"/boot/efi/EFI/BOOT/BOOTX64.EFI\"\n"
    );
    for l in layers {
        let _ = write!(
            text,
            "\n[[layer]]\nname = \"{}\"\nkind = \"{}\"\n",
            l.name, l.kind
        );
        if let Some(when) = l.when {
            let _ = writeln!(text, "when = \"{when}\"");
        }
        let _ = writeln!(text, "source = {{ dir = \"{}\" }}", l.dir.display());
    }
    let path = dir.join("stack.toml");
    std::fs::write(&path, text).unwrap();
    path
}
