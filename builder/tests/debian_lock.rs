//! `ingot build` of a layer made from Debian packages, for real: mmdebstrap installs bookworm's
//! essential set from Debian's archive, ingot writes stack.lock and fills the .deb cache. Then:
//! the same build `--locked` without any network is served from the cache and gives the same
//! manifest digest; a lock naming a version neither the cache nor the archive has fails naming
//! the package and writes nothing; a lock one update behind (the older `.deb` only in the cache)
//! builds `--locked`, and `--update PACKAGE` moves that package to the archive's version, prints
//! the change and `ingot diff` shows it; a cached file that rotted is fetched again, not used.
//! The layer's SBOM gives every package its `.deb`'s SHA-256 from the lock and the licences its
//! real copyright files declare. The tree cache: a build with nothing changed reuses the tree
//! (no mmdebstrap) and gives the same stack; `--rebuild --locked` three days later (faketime)
//! makes the tree again and gives the same manifest digest; a changed package list rebuilds.
//!
//! Root (mmdebstrap's root mode) and the archive: the full tier only (about four minutes, most
//! of it apt's downloads and mmdebstrap; the quick tier skips every root test).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use ingot::debian::cache::sha256_of;
use ingot::debian::lock::{Lock, LockedPackage};
use ingot_testkit::skip;

/// A one-layer stack from bookworm's essential set. That tree has no kernel: the boot paths name
/// files it does have, so the build's checks pass (no machine boots this stack).
const MANIFEST: &str = r#"
name = "tiny"
version = "1.0.0"
source_date_epoch = 1700000000

[boot]
kernel = "/usr/bin/dpkg"
initrd = "/usr/bin/dpkg-deb"
efi = "/usr/bin/dpkg-query"

[[layer]]
name = "base"
kind = "base"

[layer.source.debian]
variant = "essential"
path_exclude = ["/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*"]
path_include = ["/usr/share/doc/*/copyright"]

[[layer.source.debian.archive]]
mirror = "http://deb.debian.org/debian"
suites = ["bookworm"]
components = ["main"]
"#;

/// Offline: in a network namespace of its own, where nothing is reachable.
const OFFLINE: &[&str] = &["unshare", "--net"];
/// Three days from now, as libfaketime makes ingot and everything it runs see the clock.
const IN_THREE_DAYS: &[&str] = &["faketime", "+3 days"];

/// Runs `ingot build MANIFEST --out OUT --deb-cache CACHE EXTRA...` (the tree cache is then
/// `trees` beside `cache`), under the command `wrap` (none: directly).
fn build(dir: &Path, out: &str, extra: &[&str], wrap: &[&str]) -> (Output, f64) {
    let ingot = env!("CARGO_BIN_EXE_ingot");
    let mut cmd = match wrap {
        [] => Command::new(ingot),
        [tool, args @ ..] => {
            let mut c = Command::new(tool);
            c.args(args).arg(ingot);
            c
        }
    };
    cmd.current_dir(dir)
        .args([
            "build",
            "m/stack.toml",
            "--quiet",
            "--deb-cache",
            "cache",
            "--out",
            out,
        ])
        .args(extra)
        .env_remove("RUST_LOG");
    let started = Instant::now();
    let output = cmd.output().expect("running ingot");
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "{wrap:?} ingot build {out} {extra:?}: {secs:.1} s\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    (output, secs)
}

/// Every line of `text` as a JSON object with an `event` (a line that is not fails the test).
fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
            assert!(v["event"].is_string() && v["t"].is_number(), "{l}");
            v
        })
        .collect()
}

fn manifest_digest(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("manifest   "))
        .unwrap_or_else(|| panic!("no manifest digest in {text}"))
        .to_owned()
}

/// A JSON file of an OCI layout: `index.json`, or the blob a digest names.
fn layout_json(layout: &Path, digest: Option<&str>) -> serde_json::Value {
    let path = match digest {
        None => layout.join("index.json"),
        Some(d) => layout.join("blobs/sha256").join(&d["sha256:".len()..]),
    };
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

/// The base layer's SBOM in `layout` gives each package the SHA-256 the lock has for its `.deb`
/// (libc6's checked against `sha256sum` of the cached file), and the licences the tree's
/// copyright files declare; pyspdxtools and sbomcheck accept it when installed.
fn sbom_has_the_lock(dir: &Path, layout: &Path, base: &ingot::debian::lock::LayerLock) {
    let index = layout_json(layout, None);
    let manifest = layout_json(layout, index["manifests"][0]["digest"].as_str());
    let config = layout_json(layout, manifest["config"]["digest"].as_str());
    let digest = config["layers"][0]["sbom"]["digest"].as_str().unwrap();
    let sbom_path = layout.join("blobs/sha256").join(&digest["sha256:".len()..]);
    let sbom = layout_json(layout, Some(digest));
    let packages = ingot_testkit::spdx::packages(&sbom);
    assert_eq!(packages.len(), base.packages.len());
    for p in &base.packages {
        let listed = packages
            .iter()
            .find(|s| s["name"] == p.name.as_str())
            .unwrap_or_else(|| panic!("{} is not in the SBOM", p.name));
        assert_eq!(
            listed["checksums"],
            serde_json::json!([{"algorithm": "SHA256", "checksumValue": p.sha256}]),
            "{}",
            p.name
        );
    }
    let libc = base.packages.iter().find(|p| p.name == "libc6").unwrap();
    let sum = Command::new("sha256sum")
        .arg(dir.join("cache").join(format!("{}.deb", libc.sha256)))
        .output()
        .unwrap();
    let sum = String::from_utf8_lossy(&sum.stdout);
    assert_eq!(sum.split_whitespace().next(), Some(libc.sha256.as_str()));
    let declared = |name: &str| {
        packages.iter().find(|s| s["name"] == name).unwrap()["licenseDeclared"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    // bookworm's dash: BSD-3-Clause, a public-domain file, GPL-2+ (DEP-5); libc6: not DEP-5.
    assert!(declared("dash").starts_with("(BSD-3-Clause) AND (LicenseRef-public-domain-"));
    assert_eq!(declared("libc6"), "NOASSERTION");
    let said = packages
        .iter()
        .filter(|p| p["licenseDeclared"] != "NOASSERTION")
        .count();
    eprintln!(
        "SBOM of the essential set: {} bytes, {} packages, {said} with a declared licence",
        fs::metadata(&sbom_path).unwrap().len(),
        packages.len()
    );
    let file = dir.join("base.spdx.json");
    fs::copy(&sbom_path, &file).unwrap();
    ingot_testkit::spdx::tools_accept(&file, "the essential set's SBOM");
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The lock the first build wrote: the essential set, every file cached under its hash.
fn first_lock(d: &Path, lock_path: &Path) -> (String, Lock) {
    let lock_text = fs::read_to_string(lock_path).unwrap();
    let lock = Lock::parse(&lock_text, lock_path).unwrap();
    let base = &lock.layers["base"];
    assert!(base.packages.len() > 20, "{lock_text}");
    for name in ["base-files", "dpkg", "libc6"] {
        assert!(
            base.packages.iter().any(|p| p.name == name),
            "{name} not locked"
        );
    }
    assert_eq!(base.suites.len(), 1);
    assert_eq!(base.suites[0].suite, "bookworm");
    assert!(base.suites[0].date.ends_with("UTC"), "{:?}", base.suites[0]);
    assert_eq!(base.kernel, None, "the essential set has no kernel");
    for p in &base.packages {
        let cached = d.join("cache").join(format!("{}.deb", p.sha256));
        assert_eq!(sha256_of(&cached).unwrap(), p.sha256, "{}", p.name);
    }

    (lock_text, lock)
}

#[test]
fn a_locked_rebuild_comes_from_the_cache_and_a_missing_version_is_named() {
    let test = ingot_testkit::test_name!();
    if !skip::have_root(test)
        || !skip::have_tools(test, &["mmdebstrap", "unshare", "dpkg-deb", "faketime"])
    {
        return;
    }
    // Beside the output, as a real build is: /var/tmp, not a small /tmp.
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let d = dir.path();
    fs::create_dir(d.join("m")).unwrap();
    fs::write(d.join("m/stack.toml"), MANIFEST).unwrap();
    let lock_path: PathBuf = d.join("m/stack.lock");

    // 1. Resolved against the archive: the lock is written, every file cached under its hash.
    let (first, cold) = build(d, "out1", &[], &[]);
    assert!(first.status.success());
    let (lock_text, lock) = first_lock(d, &lock_path);
    let base = &lock.layers["base"];
    let said = String::from_utf8_lossy(&first.stderr);
    assert!(
        said.contains("layer base: built: no lock entry (resolved against the archive)"),
        "{said}"
    );

    // 2. Locked, with no network at all, the tree made again (not taken from the tree cache):
    //    every file from the .deb cache, the same stack.
    let (second, warm) = build(d, "out2", &["--locked", "--rebuild"], OFFLINE);
    assert!(second.status.success());
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(said.contains("layer base: built: --rebuild;"), "{said}");
    assert!(
        said.contains(&format!(
            "{} .deb from the cache, 0 downloaded",
            base.packages.len()
        )),
        "{said}"
    );
    assert_eq!(manifest_digest(&first), manifest_digest(&second));
    assert_eq!(
        fs::read_to_string(&lock_path).unwrap(),
        lock_text,
        "--locked changed the lock"
    );
    eprintln!("mmdebstrap build: cold {cold:.1} s, locked from the cache (offline) {warm:.1} s");
    sbom_has_the_lock(d, &d.join("out2"), base);

    // 3. A version neither the cache nor the archive has: named, nothing written.
    let real = base
        .packages
        .iter()
        .find(|p| p.name == "base-files")
        .unwrap();
    let edited = lock_text.replacen(
        &format!("version = \"{}\"", real.version),
        "version = \"99.0-ingot-test\"",
        1,
    );
    assert_ne!(edited, lock_text);
    fs::write(&lock_path, &edited).unwrap();
    let before = entries(d);
    let (third, _) = build(d, "out3", &["--locked"], &[]);
    assert!(!third.status.success());
    let said = String::from_utf8_lossy(&third.stderr);
    assert!(
        said.contains("base-files 99.0-ingot-test (amd64)"),
        "{said}"
    );
    assert!(said.contains("neither the .deb cache"), "{said}");
    assert_eq!(
        entries(d),
        before,
        "a failed locked build left something behind"
    );
    assert_eq!(fs::read_to_string(&lock_path).unwrap(), edited);

    // 3b. A lock one update behind the archive, built --locked offline from the cache.
    let (older, behind_tree) = lock_behind(d, &lock_text, real, &manifest_digest(&first));

    // 4. `--update base-files` moves that package only, to the archive's version, and says so;
    //    every other package stays as locked, so the stack is the first one again, and
    //    `ingot diff` between the two stacks names the move.
    //    One cached file has rotted meanwhile: it is not used, but fetched again and repaired.
    let rotten = base.packages.iter().find(|p| p.name == "dpkg").unwrap();
    let rotten_path = d.join("cache").join(format!("{}.deb", rotten.sha256));
    fs::write(&rotten_path, b"not dpkg any more").unwrap();
    let (fourth, _) = build(d, "out4", &["--update", "base-files"], &[]);
    assert!(fourth.status.success());
    let said = String::from_utf8_lossy(&fourth.stderr);
    let change = format!(
        "Updating base-files:amd64 {} -> {}",
        older.version, real.version
    );
    assert!(said.contains(&change), "{said}");
    diff_names_the_update(d, &older.version, &real.version);
    let rest = base.packages.len() - 2;
    assert!(
        said.contains(&format!("{rest} .deb from the cache, 2 downloaded")),
        "{said}"
    );
    assert_eq!(
        sha256_of(&rotten_path).unwrap(),
        rotten.sha256,
        "the rotten file was not replaced"
    );
    let updated = Lock::parse(&fs::read_to_string(&lock_path).unwrap(), &lock_path).unwrap();
    assert_eq!(updated.layers["base"].packages, base.packages);
    assert_eq!(manifest_digest(&fourth), manifest_digest(&first));

    tree_cache(d, &manifest_digest(&first), cold, &behind_tree);
}

/// Writes a lock one update behind the archive (`lock_text` with `real`, base-files, replaced by
/// an older version the archive has dropped and only the .deb cache holds, as after a security
/// update) and builds it `--locked`, offline, from the cache into `out3b`: another stack than
/// `first`. Returns the older package and its tree cache entry.
fn lock_behind(
    d: &Path,
    lock_text: &str,
    real: &LockedPackage,
    first: &str,
) -> (LockedPackage, String) {
    let older = older_in_cache(d, real);
    let behind = lock_text.replacen(
        &format!(
            "version = \"{}\", sha256 = \"{}\"",
            real.version, real.sha256
        ),
        &format!(
            "version = \"{}\", sha256 = \"{}\"",
            older.version, older.sha256
        ),
        1,
    );
    assert_ne!(behind, lock_text);
    fs::write(d.join("m/stack.lock"), &behind).unwrap();
    let cached = base_entries(d);
    let (old_stack, _) = build(d, "out3b", &["--locked"], OFFLINE);
    assert!(old_stack.status.success());
    let behind_tree = base_entries(d)
        .into_iter()
        .find(|e| !cached.contains(e))
        .expect("the older lock's tree entered the tree cache")
        .0;
    assert_ne!(manifest_digest(&old_stack), first);
    (older, behind_tree)
}

/// base-files one version behind `real`: its `.deb` repacked by dpkg-deb as version
/// `REAL~ingot1` (`~` sorts before anything, so it is older) and put in the .deb cache under its
/// hash, as the cache keeps a version the archive has since replaced.
fn older_in_cache(d: &Path, real: &LockedPackage) -> LockedPackage {
    fs::create_dir_all(d.join("older")).unwrap();
    let root = d.join("older/root");
    let deb = d.join("older/base-files.deb");
    let cached = d.join("cache").join(format!("{}.deb", real.sha256));
    let run = |args: &[&std::ffi::OsStr]| {
        let out = Command::new("dpkg-deb").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "dpkg-deb {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&["-R".as_ref(), cached.as_os_str(), root.as_os_str()]);
    let version = format!("{}~ingot1", real.version);
    let control = root.join("DEBIAN/control");
    let text = fs::read_to_string(&control).unwrap();
    let from = format!("\nVersion: {}\n", real.version);
    assert!(text.contains(&from), "{text}");
    fs::write(
        &control,
        text.replace(&from, &format!("\nVersion: {version}\n")),
    )
    .unwrap();
    run(&["-b".as_ref(), root.as_os_str(), deb.as_os_str()]);
    let sha256 = sha256_of(&deb).unwrap();
    fs::copy(&deb, d.join("cache").join(format!("{sha256}.deb"))).unwrap();
    LockedPackage {
        version,
        sha256,
        ..real.clone()
    }
}

/// `ingot diff` between the stack one update behind (out3b) and the updated one (out4): the
/// base layer changed, and base-files moved from `old` to `new`.
fn diff_names_the_update(d: &Path, old: &str, new: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_ingot"))
        .current_dir(d)
        .args(["diff", "out3b", "out4"])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "ingot diff out3b out4:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "the stacks differ");
    assert!(
        text.lines()
            .any(|l| l.contains("base-files") && l.contains(old) && l.contains(new)),
        "{text}"
    );
}

/// The `base-<key>` entries of the tree cache beside `d/cache`, with their trees' inodes.
fn base_entries(d: &Path) -> Vec<(String, u64)> {
    use std::os::unix::fs::MetadataExt;
    entries(&d.join("trees"))
        .into_iter()
        .filter(|n| n.starts_with("base-"))
        .map(|n| {
            let ino = fs::metadata(d.join("trees").join(&n).join("tree"))
                .unwrap()
                .ino();
            (n, ino)
        })
        .collect()
}

/// Steps 5-7: the tree cache after steps 1-4 (whose lock is the first build's again).
fn tree_cache(d: &Path, digest: &str, cold: f64, behind: &str) {
    // 5. Nothing changed (and no network): the tree is reused, mmdebstrap does not run (the
    //    cached tree is the same directory), the stack is the same. The cache holds it and the
    //    tree of the lock one update behind (`behind`).
    let before = base_entries(d);
    assert_eq!(before.len(), 2, "{before:?}");
    let current = before.iter().find(|e| e.0 != behind).unwrap().clone();
    let short = &current.0["base-".len().."base-".len() + 12];
    let (fifth, cached) = build(d, "out5", &["--json"], OFFLINE);
    assert!(fifth.status.success());
    let said = String::from_utf8_lossy(&fifth.stderr);
    let reason = format!("tree cache {short}: same lock entry, inputs and ingot version");
    // With --json, stderr is JSON Lines: the tree's event, then the stack's own phases.
    let events = json_lines(&said);
    let tree = events
        .iter()
        .find(|e| e["event"] == "tree")
        .unwrap_or_else(|| panic!("no tree event in {said}"));
    assert_eq!(tree["reused"], true);
    assert_eq!(tree["reason"], reason.as_str());
    assert_eq!(
        tree["text"],
        format!("layer base: reused ({reason})").as_str()
    );
    for phase in ["ext4", "zstd"] {
        assert!(
            events.iter().any(|e| e["event"] == "phaseDone"
                && e["layer"] == "base"
                && e["phase"] == phase
                && e["seconds"].is_number()),
            "no {phase} phase in {said}"
        );
    }
    assert!(!said.contains("mmdebstrap"), "{said}");
    assert_eq!(base_entries(d), before, "the cached tree was replaced");
    let result: serde_json::Value = serde_json::from_slice(&fifth.stdout).unwrap();
    assert_eq!(result["manifestDigest"], digest);
    assert_eq!(
        result["trees"],
        serde_json::json!([{"layer": "base", "reused": true, "reason": reason}])
    );

    // 6. Three days later, --rebuild --locked: the tree made again from the .deb cache, the
    //    same manifest digest (nothing in the stack depends on the day it was built).
    let (sixth, rebuilt) = build(d, "out6", &["--rebuild", "--locked"], IN_THREE_DAYS);
    let said = String::from_utf8_lossy(&sixth.stderr);
    assert!(sixth.status.success(), "{said}");
    assert!(said.contains("layer base: built: --rebuild;"), "{said}");
    let after = base_entries(d);
    assert_eq!(after.len(), 2, "{after:?}");
    let remade = after
        .iter()
        .find(|e| e.0 == current.0)
        .expect("the same key");
    assert_ne!(remade.1, current.1, "the tree was not made again");
    assert_eq!(manifest_digest(&sixth), digest);
    eprintln!(
        "essential-set stack: cold {cold:.1} s, cached {cached:.1} s, --rebuild --locked under \
         faketime +3 days {rebuilt:.1} s"
    );

    // 7. A package added to the declaration: resolved and built again; the cache keeps two
    //    trees of the layer, the newest by use (the tree one update behind goes).
    let manifest = fs::read_to_string(d.join("m/stack.toml")).unwrap();
    let more = manifest.replace(
        "variant = \"essential\"\n",
        "variant = \"essential\"\npackages = [\"hello\"]\n",
    );
    assert_ne!(more, manifest);
    fs::write(d.join("m/stack.toml"), more).unwrap();
    let (seventh, _) = build(d, "out7", &[], &[]);
    let said = String::from_utf8_lossy(&seventh.stderr);
    assert!(seventh.status.success(), "{said}");
    assert!(
        said.contains(
            "layer base: built: the declaration changed since stack.lock (resolved again)"
        ),
        "{said}"
    );
    assert_ne!(manifest_digest(&seventh), digest);
    let now = base_entries(d);
    assert_eq!(now.len(), 2, "{now:?}");
    assert!(now.contains(remade), "the older tree was dropped: {now:?}");
    assert!(now.iter().all(|e| e.0 != behind), "{now:?}");
}
