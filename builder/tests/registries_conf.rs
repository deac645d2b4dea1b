//! Hostile registries.conf files (issue 32, items 8, 9 and 11), through `ingot resolve
//! --registries-conf`: every one is refused before a connection is made (a setup error, not
//! exit 8 for a registry), naming the file and the problem, within a deadline (a regression is killed there, not left hanging).
//! The settings' `registries_conf` and `/etc/containers/registries.conf` are read by the same
//! `MirrorConfig::load`.

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ingot_testkit::measure::Run;

/// More than any of these runs needs; a run still going then is a hang.
const DEADLINE: Duration = Duration::from_secs(60);

/// `ingot resolve` of a reference on a closed loopback port, with `conf`.
fn resolve(conf: &Path) -> Run {
    let conf = conf.to_str().unwrap();
    let run = common::ingot_measured(
        [
            "resolve",
            "oci://127.0.0.1:2/x/y:1",
            "--retries",
            "1",
            "--registries-conf",
            conf,
        ],
        DEADLINE,
    );
    run.print(conf);
    assert!(
        run.killed.is_none(),
        "stopped at the deadline: {}",
        run.stderr
    );
    run
}

/// The refusal of a bad file: a setup error (exit 1), the file named, the stderr bounded and free of control
/// characters other than the newline.
fn refused(conf: &Path) -> String {
    let run = resolve(conf);
    assert_eq!(run.status.code(), Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains(&conf.display().to_string()),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.len() < 2000,
        "{} bytes of stderr",
        run.stderr.len()
    );
    assert!(
        !run.stderr.chars().any(|c| c.is_control() && c != '\n'),
        "{:?}",
        run.stderr
    );
    run.stderr
}

/// Item 8: a FIFO as `--registries-conf` hung the run forever (the open waits for a writer);
/// it is refused as not a regular file.
#[test]
fn a_fifo_is_refused_not_waited_on() {
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("registries.conf");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let err = refused(&fifo);
    assert!(err.contains("a FIFO"), "{err}");
}

/// Item 9: a registry's mirrors are capped (`MAX_MIRRORS`), the error naming the registry, the
/// count and the cap; 20,000 mirrors (inside the 1 MiB file cap) are refused at once.
#[test]
fn too_many_mirrors_are_refused_naming_the_registry() {
    let tmp = tempfile::tempdir().unwrap();
    let conf = tmp.path().join("registries.conf");
    let file = |n: usize| {
        let mut text = String::from("[[registry]]\nprefix = \"127.0.0.1:2\"\n");
        for i in 0..n {
            text.push_str(&format!(
                "[[registry.mirror]]\nlocation = \"m{i}.invalid\"\n"
            ));
        }
        text
    };
    fs::write(&conf, file(20_000)).unwrap();
    let err = refused(&conf);
    assert!(
        err.contains("`registry[0]` (prefix `127.0.0.1:2`) lists 20000 mirrors, more than the 16"),
        "{err}"
    );
    fs::write(&conf, file(17)).unwrap();
    assert!(refused(&conf).contains("lists 17 mirrors"));
    // At the cap, the file is used (the run fails later, on the closed port, exit 8).
    fs::write(&conf, file(16)).unwrap();
    let run = resolve(&conf);
    assert!(!run.stderr.contains("mirrors, more than"), "{}", run.stderr);
}

/// Item 11: prefixes that can never match were kept silently; each is refused naming the
/// prefix (escaped) and why.
#[test]
fn prefixes_that_can_never_match_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let conf = tmp.path().join("registries.conf");
    for (prefix, why) in [
        ("*.", "needs a domain"),
        ("127.0.0.1:2/X", "upper-case `X`"),
        ("REG.example", "upper-case `R`"),
        ("127.0.0.1:2\\u0000", "`127.0.0.1:2\\u{0}` can never match"),
        ("reg.example/\\u001b]0;pwned\\u0007", "U+001B"),
        ("reg..example", "empty label"),
        ("reg.*.example", "leading `*.`"),
    ] {
        fs::write(
            &conf,
            format!("[[registry]]\nprefix = \"{prefix}\"\nlocation = \"127.0.0.1:3\"\n"),
        )
        .unwrap();
        let err = refused(&conf);
        assert!(
            err.contains("registry[0].prefix") && err.contains(why),
            "{prefix}: {err}"
        );
    }
}

/// What skopeo (containers/image, reading the same file) does with those prefixes: it accepts
/// them without a word and never applies them (the reference goes to its own host, not to the
/// `location`), where a valid prefix is applied. So refusing them loses nothing that worked.
#[test]
fn skopeo_silently_ignores_the_same_prefixes() {
    if !ingot_testkit::skip::have_tool(ingot_testkit::test_name!(), "skopeo") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let conf = tmp.path().join("registries.conf");
    let skopeo = |prefix: &str| {
        fs::write(
            &conf,
            format!("[[registry]]\nprefix = \"{prefix}\"\nlocation = \"127.0.0.1:3\"\n"),
        )
        .unwrap();
        let out = Command::new("skopeo")
            .arg("--registries-conf")
            .arg(&conf)
            .args([
                "inspect",
                "--tls-verify=false",
                "docker://127.0.0.1:2/x/y:1",
            ])
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let applied = skopeo("127.0.0.1:2");
    assert!(applied.contains("127.0.0.1:3/v2/"), "{applied}");
    for prefix in ["*.", "127.0.0.1:2/X", "127.0.0.1:2\\u0000"] {
        let err = skopeo(prefix);
        assert!(
            err.contains("127.0.0.1:2/v2/") && !err.contains("127.0.0.1:3"),
            "{prefix}: {err}"
        );
        assert!(!err.contains("registries configuration"), "{prefix}: {err}");
    }
}

/// Item 11: a TOML error quoted the whole offending line (toml's message), a megabyte of it
/// with any escape sequence it held, into the terminal and the writer's status. Now the line is
/// cut around the column, escaped, and the cut said.
#[test]
fn a_toml_error_on_a_megabyte_line_quotes_a_short_escaped_excerpt() {
    let tmp = tempfile::tempdir().unwrap();
    let conf = tmp.path().join("registries.conf");
    let mut text = String::from("[[registry]]\nlocation = \"x\"\nbad = ");
    text.push_str(&"A".repeat(500_000));
    text.push_str("\u{1b}]0;pwned\u{7}\u{1b}[2J");
    text.push_str(&"B".repeat(500_000));
    text.push('\n');
    fs::write(&conf, text).unwrap();
    let err = refused(&conf);
    assert!(err.contains("line 3, column "), "{err}");
    assert!(err.contains("cut to 200 around the column"), "{err}");
    assert!(!err.contains('\u{1b}'), "{err:?}");
    // The excerpt around the column holds the escape sequences, escaped.
    assert!(err.contains("\\u{1b}]0;pwned"), "{err}");
}
