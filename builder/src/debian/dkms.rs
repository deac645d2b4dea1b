//! Kernel modules built by DKMS (`source.debian.dkms`) for the base's exact kernel, never the
//! host's: a throw-away chroot (`mmdebstrap --variant=apt` with `linux-headers-KVER` and `dkms`)
//! installs the locked DKMS source package, whose postinst builds the modules; the `.ko` files
//! are taken from its `/usr/lib/modules/KVER/updates/dkms`.
//!
//! The modules are kept in a cache beside the `.deb` cache, under the kernel release and the
//! source package's SHA-256 (`modules/KVER/SHA256`), so a build for the same kernel and driver
//! does not compile again. The build chroot's own packages (compiler, headers, dkms) are not
//! locked: what is pinned is the kernel (the base's lock) and the driver's source (the layer's
//! `dkms` lock entries); a module built again on another day may differ in bytes, so a
//! reproducible rebuild keeps the module cache (docs/debian-build.md).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::cache::DebCache;
use super::deb;
use super::lock::LockedPackage;
use super::tree::{io_err, refused, TreeError};

/// Where DKMS leaves the modules it built, below `/usr/lib/modules/KVER/`.
pub const DKMS_DIR: &str = "updates/dkms";
/// The marker the kernel appends to a signed module.
const SIGNATURE_MARK: &[u8] = b"~Module signature appended~\n";

/// One DKMS build.
#[derive(Debug)]
pub struct Build<'a> {
    /// The layer.
    pub layer: &'a str,
    /// The locked DKMS source package (its file is in the `.deb` cache).
    pub package: &'a LockedPackage,
    /// The base's kernel release.
    pub kernel: &'a str,
    /// apt's sources (`deb …` lines) for the chroot.
    pub sources: &'a [String],
    /// The suite mmdebstrap is given.
    pub suite: &'a str,
    /// The `.deb` cache.
    pub cache: &'a DebCache,
    /// The modules cache.
    pub modules: &'a Path,
    /// A scratch directory.
    pub work: &'a Path,
    /// The manifest's `source_date_epoch`.
    pub source_date_epoch: u64,
    /// DKMS's signing key and certificate (`mok.key`, `mok.pub`), when the modules are signed.
    pub signing: Option<(&'a Path, &'a Path)>,
}

/// The modules cache beside the `.deb` cache (`…/debs` → `…/modules`).
pub fn default_dir(deb_cache: &Path) -> PathBuf {
    match deb_cache.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.join("modules"),
        _ => PathBuf::from("modules"),
    }
}

/// The `.ko` files built for `b`: from the modules cache, or built now and put there. Returns
/// the directory holding them and whether they were built now.
pub fn modules(b: &Build<'_>) -> Result<(PathBuf, bool), TreeError> {
    let flavour = match b.signing {
        None => "unsigned".to_owned(),
        Some((_, cert)) => {
            let sha = super::cache::sha256_of(cert)?;
            format!("signed-{}", &sha[..16])
        }
    };
    let dir = b
        .modules
        .join(b.kernel)
        .join(&b.package.sha256)
        .join(flavour);
    if has_modules(&dir) {
        check_modules(b.layer, &dir, b.kernel)?;
        return Ok((dir, false));
    }
    let built = build(b)?;
    check_modules(b.layer, &built, b.kernel)?;
    if b.signing.is_some() && !all_signed(&built)? {
        return Err(refused(
            b.layer,
            "DKMS left the modules unsigned although a signing key was given",
        ));
    }
    let parent = dir.parent().expect("below the kernel");
    fs::create_dir_all(parent).map_err(io_err("creating", parent))?;
    let tmp = tempfile::Builder::new()
        .prefix(".new-")
        .tempdir_in(parent)
        .map_err(io_err("creating a directory in", parent))?;
    let staged = tmp.path().join("ko");
    fs::create_dir(&staged).map_err(io_err("creating", &staged))?;
    for ko in ko_files(&built)? {
        let to = staged.join(ko.file_name().unwrap_or_default());
        fs::copy(&ko, &to).map_err(io_err("copying", &ko))?;
    }
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&staged, &dir).map_err(io_err("putting the modules in", &dir))?;
    Ok((dir, true))
}

fn has_modules(dir: &Path) -> bool {
    ko_files(dir).is_ok_and(|k| !k.is_empty())
}

/// The `.ko` files in `dir`, sorted.
pub fn ko_files(dir: &Path) -> Result<Vec<PathBuf>, TreeError> {
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(io_err("reading", dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "ko"))
        .collect();
    out.sort();
    Ok(out)
}

/// Every module must be for `kernel` (its vermagic's first word).
fn check_modules(layer: &str, dir: &Path, kernel: &str) -> Result<(), TreeError> {
    let kos = ko_files(dir)?;
    if kos.is_empty() {
        return Err(refused(
            layer,
            format!("DKMS built no module (nothing in {})", dir.display()),
        ));
    }
    for ko in kos {
        let out = Command::new("modinfo")
            .args(["-F", "vermagic"])
            .arg(&ko)
            .output()
            .map_err(io_err("running modinfo on", &ko))?;
        let magic = String::from_utf8_lossy(&out.stdout);
        let release = magic.split_whitespace().next().unwrap_or("");
        if release != kernel {
            return Err(refused(
                layer,
                format!(
                    "{} is built for kernel `{release}`, not the base's {kernel}",
                    ko.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Whether every module in `dir` carries a signature (the kernel's trailing marker).
pub fn all_signed(dir: &Path) -> Result<bool, TreeError> {
    for ko in ko_files(dir)? {
        let bytes = fs::read(&ko).map_err(io_err("reading", &ko))?;
        if !bytes.ends_with(SIGNATURE_MARK) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The build chroot: mmdebstrap with the headers and dkms, then the source package installed
/// from its cached file (apt resolves its dependencies from the archives).
fn build(b: &Build<'_>) -> Result<PathBuf, TreeError> {
    let p = b.package;
    let file = deb::file_name(&p.name, &p.version, &p.architecture);
    let debs = b.work.join("dkms-deb");
    fs::create_dir_all(&debs).map_err(io_err("creating", &debs))?;
    let deb = debs.join(&file);
    if !b.cache.place(&p.sha256, &deb)? {
        return Err(refused(
            b.layer,
            format!("{} {} is not in the .deb cache", p.name, p.version),
        ));
    }
    let out = b.work.join("dkms-modules");
    let chroot = b.work.join("dkms-chroot");
    let mut cmd = Command::new("mmdebstrap");
    let tools = if b.signing.is_some() { ",openssl" } else { "" };
    cmd.args(["--variant=apt", "--mode=root", "--format=directory"])
        .arg("--aptopt=APT::Install-Recommends \"false\"")
        .arg(format!("--include=linux-headers-{},dkms{tools}", b.kernel))
        .arg(format!("--customize-hook=copy-in {} /tmp/", deb.display()));
    if let Some((key, cert)) = b.signing {
        // dkms 3.0 signs with its defaults, mok_signing_key and mok_certificate.
        cmd.arg("--customize-hook=mkdir -p \"$1\"/var/lib/dkms")
            .arg(format!(
                "--customize-hook=copy-in {} /var/lib/dkms/",
                key.display()
            ))
            .arg(format!(
                "--customize-hook=copy-in {} /var/lib/dkms/",
                cert.display()
            ));
    }
    cmd.arg(format!(
        "--customize-hook=chroot \"$1\" env DEBIAN_FRONTEND=noninteractive apt-get install \
             -y -q /tmp/{file}"
    ))
    .arg(format!(
        "--customize-hook=sync-out /usr/lib/modules/{}/{DKMS_DIR} {}",
        b.kernel,
        out.display()
    ))
    .arg(b.suite)
    .arg(&chroot)
    .args(b.sources)
    .env("SOURCE_DATE_EPOCH", b.source_date_epoch.to_string())
    .env("LC_ALL", "C.UTF-8")
    .stdin(Stdio::null());
    let log_path = b.work.join("dkms.log");
    let log = fs::File::create(&log_path).map_err(io_err("creating", &log_path))?;
    let log2 = log.try_clone().map_err(io_err("opening", &log_path))?;
    cmd.stdout(log).stderr(log2);
    tracing::info!("layer {}: {:?}", b.layer, cmd);
    let status = cmd.status().map_err(io_err(
        "running mmdebstrap (is it installed? apt-get install mmdebstrap)",
        Path::new("mmdebstrap"),
    ))?;
    let _ = fs::remove_dir_all(&chroot);
    if !status.success() {
        let text = fs::read_to_string(&log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(30)..].join("\n");
        tracing::error!("layer {}: the DKMS build's log ends:\n{tail}", b.layer);
        return Err(refused(
            b.layer,
            format!(
                "the DKMS build of {} {} for kernel {} failed ({status}); the end of its log is \
                 above",
                p.name, p.version, b.kernel
            ),
        ));
    }
    Ok(out)
}
