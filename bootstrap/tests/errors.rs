//! Every refusal names the input and the problem.

mod common;

use std::io::Write;

use base64::Engine;
use ingot_bootstrap::{parse, stage, ParseError, StageError};

fn err(input: &[u8]) -> ParseError {
    parse(input).expect_err(&String::from_utf8_lossy(input))
}

#[test]
fn bad_inputs_name_the_problem() {
    let cases: &[(&[u8], &[&str])] = &[
        (b"", &["empty"]),
        (b"  \n\t", &["empty"]),
        (b"#!/bin/bash\necho hi\n", &["shell script"]),
        (b"Content-Type: multipart/mixed; boundary=\"x\"\nMIME-Version: 1.0\n", &["MIME multipart", "not supported"]),
        (b"#include\nhttp://x\n", &["#include"]),
        (b"hello: world\n", &["not recognised", "hello: world"]),
        (b"#cloud-config\nwrite_files: [\n", &["YAML", "line 3", "column"]),
        (b"#cloud-config\na: 1\na: 2\n", &["YAML", "duplicate"]),
        (b"{\"ignition\": {\"version\": \"3.4.0\"},}", &["JSON", "line 1", "column"]),
        (b"{\"ignition\": {\"version\": \"1.0.0\"}}", &["1.0.0", "not supported"]),
        (b"{\"storage\": {}}", &["ignition.version"]),
        (b"#cloud-config\nwrite_files:\n- path: /etc/x\n  encoding: b64\n  content: '!!!notbase64'\n", &["/etc/x", "\"b64\""]),
        (b"#cloud-config\nwrite_files:\n- path: /etc/x\n  encoding: rot13\n  content: abc\n", &["/etc/x", "rot13", "unknown encoding"]),
        (b"#cloud-config\nwrite_files:\n- path: /etc/x\n  encoding: gz+b64\n  content: aGVsbG8=\n", &["/etc/x", "gz+b64"]),
        (b"#cloud-config\nwrite_files:\n- path: /etc/x\n  permissions: 'rw-r--r--'\n", &["/etc/x", "rw-r--r--", "octal"]),
        (b"#cloud-config\nwrite_files:\n- path: /etc/x\n  permissions: '0999'\n", &["/etc/x", "0999"]),
        (b"#cloud-config\nwrite_files:\n- path: etc/x\n", &["write_files[0]", "etc/x", "relative"]),
        (b"#cloud-config\nwrite_files:\n- path: /etc/../x\n", &["write_files[0]", "/etc/../x", ".."]),
        (b"#cloud-config\nwrite_files:\n- content: x\n", &["write_files[0].path", "missing"]),
        (b"#cloud-config\nwrite_files:\n- path: /x\n  source: {uri: 'http://a/b'}\n", &["/x", "source", "not supported"]),
        (b"#cloud-config\n- a\n", &["cloud-config", "mapping"]),
        (b"{\"ignition\":{\"version\":\"2.3.0\"},\"storage\":{\"files\":[{\"path\":\"/a\",\"contents\":{\"source\":\"https://x/y\"}}]}}", &["/a", "https:", "not supported"]),
        (b"{\"ignition\":{\"version\":\"2.3.0\"},\"storage\":{\"files\":[{\"path\":\"/a\",\"mode\":99999}]}}", &["/a", "99999"]),
        (b"{\"ignition\":{\"version\":\"3.4.0\"},\"storage\":{\"files\":[{\"path\":\"/a\",\"contents\":{\"source\":\"data:;base64,@@@\"}}]}}", &["/a", "base64"]),
        (b"{\"ignition\":{\"version\":\"3.4.0\"},\"storage\":{\"files\":[{\"path\":\"/a\",\"contents\":{\"source\":\"data:,x\",\"compression\":\"xz\"}}]}}", &["/a", "xz"]),
        (b"{\"ignition\":{\"version\":\"3.4.0\"},\"storage\":{\"files\":[{\"path\":\"/a\",\"contents\":{\"source\":\"data:,x\",\"verification\":{\"hash\":\"sha512-00\"}}}]}}", &["/a", "sha512-00"]),
        (b"{\"ignition\":{\"version\":\"3.4.0\"},\"storage\":{\"links\":[{\"path\":\"/a\",\"target\":\"/b\",\"hard\":true}]}}", &["/a", "hard link"]),
        (b"{\"ignition\":{\"version\":\"3.4.0\",\"config\":{\"merge\":[{\"source\":\"http://x\"}]}}}", &["ignition.config", "not supported"]),
    ];
    for (input, needles) in cases {
        let msg = err(input).to_string();
        for n in *needles {
            assert!(
                msg.contains(n),
                "{:?}: {msg:?} lacks {n:?}",
                String::from_utf8_lossy(input)
            );
        }
    }
}

#[test]
fn gzip_bomb_is_capped() {
    // 65 MiB of zeros compresses to ~65 KiB: more than the per-file limit once decoded.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..65 {
        gz.write_all(&zeros).unwrap();
    }
    let data = base64::engine::general_purpose::STANDARD.encode(gz.finish().unwrap());
    let text = format!(
        "#cloud-config\nwrite_files:\n- path: /bomb\n  encoding: gz+b64\n  content: {data}\n"
    );
    let e = err(text.as_bytes());
    assert!(matches!(e, ParseError::FileTooLarge { .. }), "{e}");
    assert!(e.to_string().contains("/bomb"), "{e}");

    // Five files of 60 MiB each pass one by one but not together.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    for _ in 0..60 {
        gz.write_all(&zeros).unwrap();
    }
    let data = base64::engine::general_purpose::STANDARD.encode(gz.finish().unwrap());
    let mut text = String::from("#cloud-config\nwrite_files:\n");
    for i in 0..5 {
        text.push_str(&format!(
            "- path: /f{i}\n  encoding: gz+b64\n  content: {data}\n"
        ));
    }
    let e = err(text.as_bytes());
    assert!(matches!(e, ParseError::TotalTooLarge { .. }), "{e}");
    assert!(e.to_string().contains("/f4"), "{e}");
}

#[test]
fn gzipped_bootstrap_data_is_read() {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(b"#cloud-config\nhostname: n1\n").unwrap();
    let b = parse(&gz.finish().unwrap()).unwrap();
    assert_eq!(b.hostname.as_deref(), Some("n1"));
}

#[test]
fn stage_errors_name_the_input() {
    let b = parse(b"#cloud-config\nwrite_files:\n- path: /etc/x\n  owner: nosuch:root\n").unwrap();
    let e = stage(&common::input(b, false), &mut common::rng(1)).unwrap_err();
    assert!(matches!(e, StageError::Owner { .. }));
    let m = e.to_string();
    assert!(
        m.contains("/etc/x") && m.contains("nosuch") && m.contains("/etc/passwd"),
        "{m}"
    );

    let b = parse(b"#cloud-config\nwrite_files:\n- path: /etc/x\n  owner: root:nogrp\n").unwrap();
    let m = stage(&common::input(b, false), &mut common::rng(1))
        .unwrap_err()
        .to_string();
    assert!(
        m.contains("/etc/x") && m.contains("nogrp") && m.contains("/etc/group"),
        "{m}"
    );

    let b = parse(b"#cloud-config\nhostname: bad_name\n").unwrap();
    let m = stage(&common::input(b, false), &mut common::rng(1))
        .unwrap_err()
        .to_string();
    assert!(m.contains("bad_name"), "{m}");

    let b = parse(b"#cloud-config\n").unwrap();
    let mut i = common::input(b.clone(), false);
    i.labels.insert("bad label".into(), "x".into());
    let m = stage(&i, &mut common::rng(1)).unwrap_err().to_string();
    assert!(m.contains("bad label") && m.contains("node label"), "{m}");

    let mut i = common::input(b.clone(), false);
    i.network.as_mut().unwrap().interfaces[0].addresses = vec!["203.0.113.20".into()];
    let m = stage(&i, &mut common::rng(1)).unwrap_err().to_string();
    assert!(m.contains("enp7s0") && m.contains("203.0.113.20"), "{m}");

    let mut i = common::input(b, false);
    i.base_passwd.push_str("broken line\n");
    let m = stage(&i, &mut common::rng(1)).unwrap_err().to_string();
    assert!(m.contains("/etc/passwd line 9"), "{m}");
}

/// Set in the child [`deeply_nested_yaml_is_refused_at_once`] runs.
const NESTED_CHILD: &str = "INGOT_TEST_NESTED_YAML_CHILD";

/// 300 KB of `[` (150,000 levels): libyaml's scanner works in proportion to the depth for
/// every token, so loading it took minutes of CPU before serde_norway refused it. It is refused
/// before it is loaded, naming the limit and the place. The parse runs in a child (this test
/// binary again), measured: wall time and peak RSS are printed.
#[test]
fn deeply_nested_yaml_is_refused_at_once() {
    if std::env::var_os(NESTED_CHILD).is_some() {
        let text = format!("#cloud-config\nwrite_files: {}\n", "[".repeat(150_000));
        let message = err(text.as_bytes()).to_string();
        for want in ["deeper than 128", "line 2", "column"] {
            assert!(message.contains(want), "{want:?} in {message}");
        }
        return;
    }
    measured_child();
}

/// Runs [`deeply_nested_yaml_is_refused_at_once`] in a child and prints its wall time and peak
/// RSS (`wait4`'s `ru_maxrss`).
#[allow(unsafe_code)]
fn measured_child() {
    use std::os::unix::process::ExitStatusExt;
    let started = std::time::Instant::now();
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "deeply_nested_yaml_is_refused_at_once",
            "--test-threads=1",
        ])
        .env(NESTED_CHILD, "1")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut status = 0i32;
    // SAFETY: an all-zero rusage is a valid value; wait4 fills it in for this child only.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child by pid; std's Child is not waited on afterwards.
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as libc::pid_t, "wait4");
    std::mem::forget(child);
    println!(
        "nested YAML refused in {:.3} s wall, peak RSS {} KiB",
        started.elapsed().as_secs_f64(),
        usage.ru_maxrss
    );
    assert!(
        std::process::ExitStatus::from_raw(status).success(),
        "the child's parse did not refuse the document as expected"
    );
}
