//! registries.conf as skopeo reads it (issue 33): Debian's skopeo 1.9.3 (containers/image 5.23)
//! and `ingot resolve` run over the same files (main files, drop-ins in a home directory,
//! `CONTAINERS_REGISTRIES_CONF`) against three real `docker-registry`s on loopback, each holding
//! different content under the same names, and references on made-up hosts that only a
//! `location` maps to them. Which source answered: the last `Trying to access` line of
//! skopeo's `--debug` log, and `source` in `ingot resolve --json`.
//!
//! Every case must give the same source (or fail in both), except the cases marked with a
//! departure, which must differ, and each of which must be a row of the departures table in
//! docs/registry.md.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::process::Command;

use ingot_testkit::registry::{free_port, Registry};

/// How the tools are pointed at the configuration.
#[derive(Clone, Copy)]
enum How {
    /// `--registries-conf FILE` (the file is `main`).
    Flag,
    /// No flag: `$HOME/.config/containers/registries.conf` and its drop-ins.
    Home,
    /// `CONTAINERS_REGISTRIES_CONF=FILE`.
    Env,
}

struct Case {
    name: &'static str,
    how: How,
    /// (path under the case directory, text); `main` is the main file. `{R0}`, `{R1}`,
    /// `{R2}`, `{DOWN}` are replaced by the registries' `127.0.0.1:PORT`, `{D}` by a digest
    /// only R0 and R1 hold.
    files: &'static [(&'static str, &'static str)],
    /// Mark every loopback location (a registry's or a mirror's) `insecure = true`: skopeo
    /// speaks plain HTTP only to a location marked so.
    insecure: bool,
    reference: &'static str,
    /// The row of the departures table that explains a difference.
    departure: Option<&'static str>,
}

const MAIN: &str = "main";
const USER: &str = "home/.config/containers/registries.conf";
const USER_D: &str = "home/.config/containers/registries.conf.d";

const fn flag(
    name: &'static str,
    text: &'static [(&'static str, &'static str)],
    reference: &'static str,
) -> Case {
    Case {
        name,
        how: How::Flag,
        files: text,
        insecure: true,
        reference,
        departure: None,
    }
}

const TAG: &str = "origin.invalid/x/img:t";

/// The cases for `--registries-conf FILE`, every loopback location marked insecure.
#[allow(clippy::too_many_lines)] // one table of registries.conf cases, read as a list
fn cases() -> Vec<Case> {
    vec![
        flag(
            "a prefix rewritten to its location",
            &[(MAIN, "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R1}/x\"\n")],
            TAG,
        ),
        flag(
            "mirrors in file order, then the location",
            &[(MAIN, "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R0}/x\"\n[[registry.mirror]]\nlocation = \"{R1}/x\"\n[[registry.mirror]]\nlocation = \"{R2}/x\"\n")],
            TAG,
        ),
        flag(
            "a mirror that is down is skipped",
            &[(MAIN, "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R0}/x\"\n[[registry.mirror]]\nlocation = \"{DOWN}/x\"\n[[registry.mirror]]\nlocation = \"{R2}/x\"\n")],
            TAG,
        ),
        flag(
            "a mirror lacking the tag is skipped",
            &[(MAIN, "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R0}/x\"\n[[registry.mirror]]\nlocation = \"{R1}/x\"\n[[registry.mirror]]\nlocation = \"{R2}/x\"\n")],
            "origin.invalid/x/img:only0",
        ),
        flag(
            "mirror-by-digest-only: a tag from the location",
            &[(MAIN, "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R0}/x\"\nmirror-by-digest-only = true\n[[registry.mirror]]\nlocation = \"{R1}/x\"\n")],
            TAG,
        ),
        flag(
            "mirror-by-digest-only: a digest from the mirror",
            &[(MAIN, "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R0}/x\"\nmirror-by-digest-only = true\n[[registry.mirror]]\nlocation = \"{R1}/x\"\n")],
            "origin.invalid/x/img@{D}",
        ),
        flag(
            "a digest-only mirror is not asked for a tag",
            &[(MAIN, "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R0}/x\"\n[[registry.mirror]]\nlocation = \"{R1}/x\"\npull-from-mirror = \"digest-only\"\n[[registry.mirror]]\nlocation = \"{R2}/x\"\n")],
            TAG,
        ),
        flag(
            "a tag-only mirror is not asked for a digest",
            &[(MAIN, "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R0}/x\"\n[[registry.mirror]]\nlocation = \"{R1}/x\"\npull-from-mirror = \"tag-only\"\n")],
            "origin.invalid/x/img@{D}",
        ),
        flag(
            "the longest prefix wins",
            &[(MAIN, "[[registry]]\nprefix = \"origin.invalid\"\nlocation = \"{R0}\"\n[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R2}/x\"\n")],
            TAG,
        ),
        flag(
            "equal lengths: the first in prefix order, not in the file",
            &[(MAIN, "[[registry]]\nprefix = \"w.origin.invalid\"\nlocation = \"{R1}\"\n[[registry]]\nprefix = \"*.origin.invalid\"\nlocation = \"{R2}\"\n")],
            "w.origin.invalid/x/img:t",
        ),
        flag(
            "a wildcard prefix with a location",
            &[(MAIN, "[[registry]]\nprefix = \"*.origin.invalid\"\nlocation = \"{R1}\"\n")],
            "a.origin.invalid/x/img:t",
        ),
        flag(
            "a mirror whose name is blocked is skipped",
            &[(MAIN, "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R0}/x\"\n[[registry.mirror]]\nlocation = \"{R1}/x\"\n[[registry]]\nprefix = \"{R1}\"\nlocation = \"{R1}\"\nblocked = true\n")],
            TAG,
        ),
        flag(
            "a location whose name is blocked is blocked",
            &[(MAIN, "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R1}/x\"\n[[registry]]\nprefix = \"{R1}\"\nlocation = \"{R1}\"\nblocked = true\n")],
            TAG,
        ),
        flag(
            "a blocked location still lets its mirrors serve",
            &[(MAIN, "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R1}/x\"\n[[registry.mirror]]\nlocation = \"{R2}/x\"\n[[registry]]\nprefix = \"{R1}\"\nlocation = \"{R1}\"\nblocked = true\n")],
            TAG,
        ),
        flag(
            "a blocked reference",
            &[(MAIN, "[[registry]]\nprefix = \"{R1}/x\"\nlocation = \"{R1}/x\"\nblocked = true\n")],
            "{R1}/x/img:t",
        ),
        Case {
            name: "a blocked prefix with a location elsewhere",
            files: &[(MAIN, "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R1}/x\"\nblocked = true\n")],
            departure: Some("a blocked prefix with a location"),
            ..flag("", &[], TAG)
        },
        flag(
            "a repeated prefix: the first entry",
            &[(MAIN, "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R1}/x\"\n[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R2}/x\"\n")],
            TAG,
        ),
        Case {
            name: "one location with two insecure settings is refused",
            files: &[(MAIN, "[[registry]]\nprefix = \"a.invalid/x\"\nlocation = \"{R1}/x\"\ninsecure = true\n[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R1}/x\"\n")],
            insecure: false,
            ..flag("", &[], TAG)
        },
        Case {
            name: "a mirror is insecure by its own key, not by its host's entry",
            files: &[(MAIN, "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R0}/x\"\ninsecure = true\n[[registry.mirror]]\nlocation = \"{R2}/x\"\n[[registry]]\nprefix = \"{R2}\"\nlocation = \"{R2}\"\ninsecure = true\n")],
            insecure: false,
            departure: Some("plain HTTP on loopback"),
            ..flag("", &[], TAG)
        },
    ]
}

/// The cases that need more than `--registries-conf` and loopback locations marked insecure:
/// version 1 files, the user's file and drop-ins, the environment, and the departures.
fn other_cases() -> Vec<Case> {
    vec![
        Case {
            name: "version 1: an insecure host",
            files: &[(MAIN, "[registries.insecure]\nregistries = ['{R0}']\n")],
            insecure: false,
            reference: "{R0}/x/img:t",
            ..flag("", &[], "")
        },
        Case {
            name: "version 1: a blocked host",
            files: &[(MAIN, "[registries.insecure]\nregistries = ['{R0}']\n[registries.block]\nregistries = ['{R0}']\n")],
            insecure: false,
            reference: "{R0}/x/img:t",
            ..flag("", &[], "")
        },
        Case {
            name: "the user's file, no flag",
            how: How::Home,
            files: &[(USER, "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R2}/x\"\n")],
            ..flag("", &[], TAG)
        },
        Case {
            name: "a drop-in replaces the main file's prefix",
            how: How::Home,
            files: &[
                (USER, "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R0}/x\"\n"),
                ("home/.config/containers/registries.conf.d/10-a.conf", "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R1}/x\"\n"),
            ],
            ..flag("", &[], TAG)
        },
        Case {
            name: "drop-ins apply in name order, whole entries",
            how: How::Home,
            files: &[
                (USER, "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R0}/x\"\n[[registry.mirror]]\nlocation = \"{R1}/x\"\n"),
                ("home/.config/containers/registries.conf.d/20-b.conf", "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R2}/x\"\n"),
                ("home/.config/containers/registries.conf.d/10-a.conf", "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R1}/x\"\n"),
            ],
            ..flag("", &[], TAG)
        },
        Case {
            name: "a drop-in beside a --registries-conf file is the user's",
            files: &[
                (MAIN, "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R0}/x\"\n"),
                ("home/.config/containers/registries.conf.d/10-a.conf", "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R2}/x\"\n"),
            ],
            ..flag("", &[], TAG)
        },
        Case {
            name: "plain HTTP on loopback without insecure",
            files: &[(MAIN, "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R1}/x\"\n")],
            insecure: false,
            departure: Some("plain HTTP on loopback"),
            ..flag("", &[], TAG)
        },
        Case {
            name: "a prefix holding a tag",
            files: &[(MAIN, "[[registry]]\nprefix = \"origin.invalid\"\nlocation = \"{R0}\"\n[[registry]]\nprefix = \"origin.invalid/x/img:t\"\nlocation = \"{R1}/x/img:t\"\n")],
            departure: Some("a prefix that can never match"),
            ..flag("", &[], TAG)
        },
        Case {
            name: "a prefix without a location",
            files: &[(MAIN, "[[registry]]\nprefix = \"{R1}/x\"\n")],
            departure: Some("a prefix without a location"),
            ..flag("", &[], "{R1}/x/img:t")
        },
        Case {
            name: "a misspelt key",
            files: &[(MAIN, "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R0}/x\"\n[[registry.mirror]]\nlocation = \"{R1}/x\"\npul-from-mirror = \"digest-only\"\n")],
            departure: Some("an unknown key"),
            ..flag("", &[], TAG)
        },
        Case {
            name: "CONTAINERS_REGISTRIES_CONF",
            how: How::Env,
            files: &[(MAIN, "[[registry]]\nprefix = \"origin.invalid/x\"\nlocation = \"{R1}/x\"\n")],
            departure: Some("`CONTAINERS_REGISTRIES_CONF`"),
            ..flag("", &[], TAG)
        },
    ]
}

/// The three registries, a closed port and the digest only R0 and R1 hold.
struct World {
    _regs: Vec<Registry>,
    /// (`{R0}`, `127.0.0.1:PORT`), …
    hosts: Vec<(String, String)>,
    digest: String,
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// A one-layer image holding `content`, pushed by skopeo to `target`.
fn push(dir: &Path, content: &str, target: &str) {
    let layer = dir.join(format!("{content}.tar"));
    let tree = dir.join(content);
    fs::create_dir_all(&tree).unwrap();
    fs::write(tree.join("which"), content).unwrap();
    run_ok(
        Command::new("tar")
            .arg("-C")
            .arg(&tree)
            .arg("-cf")
            .arg(&layer)
            .arg("which"),
    );
    run_ok(
        Command::new("skopeo")
            .args(["copy", "--quiet", "--dest-tls-verify=false"])
            .arg(format!("tarball:{}", layer.display()))
            .arg(format!("docker://{target}")),
    );
}

fn world(dir: &Path) -> World {
    let regs: Vec<Registry> = (0..3)
        .map(|i| Registry::start(&dir.join(format!("r{i}")), None))
        .collect();
    for (i, r) in regs.iter().enumerate() {
        push(dir, &format!("r{i}"), &format!("{}/x/img:t", r.host()));
    }
    push(dir, "only0", &format!("{}/x/img:only0", regs[0].host()));
    push(dir, "d", &format!("{}/x/img:d", regs[0].host()));
    run_ok(
        Command::new("skopeo")
            .args([
                "copy",
                "--quiet",
                "--preserve-digests",
                "--src-tls-verify=false",
            ])
            .args(["--dest-tls-verify=false"])
            .arg(format!("docker://{}/x/img:d", regs[0].host()))
            .arg(format!("docker://{}/x/img:d", regs[1].host())),
    );
    let digest = run_ok(
        Command::new(env!("CARGO_BIN_EXE_ingot"))
            .args(["resolve", "--registries-conf", "none"])
            .arg(format!("oci://{}/x/img:d", regs[0].host())),
    )
    .trim()
    .to_owned();
    let mut hosts: Vec<(String, String)> = regs
        .iter()
        .enumerate()
        .map(|(i, r)| (format!("{{R{i}}}"), r.host()))
        .collect();
    hosts.push(("{DOWN}".into(), format!("127.0.0.1:{}", free_port())));
    World {
        _regs: regs,
        hosts,
        digest,
    }
}

impl World {
    fn fill(&self, text: &str) -> String {
        let mut t = text.replace("{D}", &self.digest);
        for (k, v) in &self.hosts {
            t = t.replace(k, v);
        }
        t
    }

    /// The case's files written under `dir`.
    fn write(&self, case: &Case, dir: &Path) {
        for (path, template) in case.files {
            let mut text = String::new();
            for line in self.fill(template).lines() {
                text.push_str(line);
                text.push('\n');
                if case.insecure && line.starts_with("location = \"127.0.0.1:") {
                    text.push_str("insecure = true\n");
                }
            }
            let path = dir.join(path);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        }
        fs::create_dir_all(dir.join(USER_D)).unwrap();
    }
}

/// `host[:port]/repository` of a reference (its tag or digest dropped).
fn location(reference: &str) -> String {
    let name = reference.split('@').next().unwrap();
    match name.rsplit_once(':') {
        Some((n, tag)) if !tag.contains('/') => n.to_owned(),
        _ => name.to_owned(),
    }
}

/// Points `cmd` at the case's configuration.
fn configure(cmd: &mut Command, case: &Case, dir: &Path, flag: &str) {
    cmd.env("HOME", dir.join("home"))
        .env_remove("CONTAINERS_REGISTRIES_CONF")
        .env_remove("RUST_LOG");
    match case.how {
        How::Flag => {
            cmd.arg(flag).arg(dir.join(MAIN));
        }
        How::Home => {}
        How::Env => {
            cmd.env("CONTAINERS_REGISTRIES_CONF", dir.join(MAIN));
        }
    }
}

/// The source skopeo fetched the manifest from, or why it failed.
fn skopeo(case: &Case, dir: &Path, reference: &str) -> Result<String, String> {
    let mut cmd = Command::new("skopeo");
    cmd.arg("--debug");
    configure(&mut cmd, case, dir, "--registries-conf");
    cmd.args(["inspect", "--raw", "--retry-times", "0"])
        .arg(format!("docker://{reference}"));
    let out = cmd.output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(log.lines().last().unwrap_or("").to_owned());
    }
    let tried = log
        .lines()
        .filter_map(|l| l.split("Trying to access \\\"").nth(1))
        .next_back()
        .expect("skopeo's debug log names the sources it tries");
    Ok(location(tried.split("\\\"").next().unwrap()))
}

/// The source `ingot resolve` fetched the manifest from, or why it failed.
fn ingot(case: &Case, dir: &Path, reference: &str) -> Result<String, String> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ingot"));
    cmd.args(["resolve", "--json", "--retries", "1"]);
    configure(&mut cmd, case, dir, "--registries-conf");
    cmd.arg(format!("oci://{reference}"));
    let out = cmd.output().unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    Ok(v["source"]["location"].as_str().unwrap().to_owned())
}

/// The first column of the departures table in docs/registry.md.
fn departures_table() -> BTreeSet<String> {
    let doc = fs::read_to_string(common::repo().join("docs/registry.md")).unwrap();
    let section = doc
        .split("### Departures from containers/image")
        .nth(1)
        .expect("docs/registry.md has a departures section");
    section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| l.split('|').nth(1).unwrap().trim().to_owned())
        .collect()
}

#[test]
fn skopeo_and_ingot_pick_the_same_sources_from_the_same_files() {
    let test = "skopeo_and_ingot_pick_the_same_sources_from_the_same_files";
    if !ingot_testkit::skip::have_tools(test, &["skopeo", "docker-registry"]) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let w = world(tmp.path());
    let table = departures_table();
    let mut report = Vec::new();
    let mut wrong = Vec::new();
    for (i, case) in cases().iter().chain(&other_cases()).enumerate() {
        let dir = tmp.path().join(format!("case{i}"));
        w.write(case, &dir);
        let reference = w.fill(case.reference);
        let (s, g) = (
            skopeo(case, &dir, &reference),
            ingot(case, &dir, &reference),
        );
        let same = match (&s, &g) {
            (Ok(a), Ok(b)) => a == b,
            (Err(_), Err(_)) => true,
            _ => false,
        };
        let line = format!("{}: skopeo {s:?}; ingot {g:?}", case.name);
        match case.departure {
            None if !same => wrong.push(format!("differs: {line}")),
            Some(_) if same => wrong.push(format!("a departure that does not differ: {line}")),
            Some(row) if !table.contains(row) => wrong.push(format!(
                "departure `{row}` is not in docs/registry.md: {line}"
            )),
            _ => {}
        }
        report.push(line);
    }
    eprintln!("{}", report.join("\n"));
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The cases that succeed make sure the comparison is not of two failures.
    let served = report.iter().filter(|l| l.contains("skopeo Ok")).count();
    assert!(
        served >= 16,
        "only {served} cases served by skopeo:\n{}",
        report.join("\n")
    );
}
