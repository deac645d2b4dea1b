//! `ingot verity` as a user runs it, beside `veritysetup`: same options, same output, same
//! verdicts, and a clear error (never a panic) for bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SALT: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const UUID: &str = "12345678-1234-1234-1234-123456789abc";

fn ingot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(args)
        .output()
        .expect("running ingot")
}

fn veritysetup() -> Option<PathBuf> {
    use ingot_testkit::skip::{current_test, find_tool, have_tool};
    have_tool(&current_test(), "veritysetup").then(|| find_tool("veritysetup").expect("installed"))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn data_file(dir: &Path, blocks: usize) -> PathBuf {
    let path = dir.join("data.img");
    let bytes: Vec<u8> = (0..blocks * 4096).map(|k| (k * 7 % 253) as u8).collect();
    std::fs::write(&path, bytes).unwrap();
    path
}

/// The same command line gives the same text and the same hash file as veritysetup.
#[test]
fn format_output_and_bytes_match_veritysetup() {
    let Some(vs) = veritysetup() else { return };
    let dir = tempfile::tempdir().unwrap();
    let data = data_file(dir.path(), 300);
    for extra in [
        &[][..],
        &["--hash", "sha1", "--format", "0"],
        &["--no-superblock", "--data-blocks", "200"],
    ] {
        let ours = dir.path().join("hash");
        let theirs = dir.path().join("hash.vs");
        let _ = std::fs::remove_file(&ours);
        let _ = std::fs::remove_file(&theirs);
        let mut args = vec![
            "verity",
            "format",
            "--salt",
            SALT,
            "--uuid",
            UUID,
            s(&data),
            s(&ours),
        ];
        args.extend_from_slice(extra);
        let o = ingot(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let mut vargs = vec![
            "format",
            "--salt",
            SALT,
            "--uuid",
            UUID,
            s(&data),
            s(&theirs),
        ];
        vargs.extend_from_slice(extra);
        let v = Command::new(&vs).args(&vargs).output().unwrap();
        assert!(v.status.success(), "{}", stderr(&v));
        assert_eq!(
            stdout(&o),
            stdout(&v).replace(s(&theirs), s(&ours)),
            "output for {extra:?}"
        );
        assert_eq!(
            std::fs::read(&ours).unwrap(),
            std::fs::read(&theirs).unwrap(),
            "hash bytes for {extra:?}"
        );
    }
}

/// --json, --root-hash-file, dump, and verify's exit codes: 0 intact, 2 corrupt, naming the block.
#[test]
fn json_root_hash_file_dump_and_verify() {
    let dir = tempfile::tempdir().unwrap();
    let data = data_file(dir.path(), 1000);
    let hash = dir.path().join("hash");
    let root_file = dir.path().join("root");
    let o = ingot(&[
        "verity",
        "format",
        "--json",
        "--root-hash-file",
        s(&root_file),
        s(&data),
        s(&hash),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let json: serde_json::Value =
        serde_json::from_slice(&o.stdout).expect("format --json prints JSON");
    let root = std::fs::read_to_string(&root_file).unwrap();
    assert_eq!(
        json["rootHash"],
        root.as_str(),
        "root hash file holds the printed root, no newline"
    );
    assert_eq!(json["dataBlocks"], 1000);
    assert_eq!(
        json["salt"].as_str().unwrap().len(),
        64,
        "random 32-byte salt by default"
    );

    let d = ingot(&["verity", "dump", s(&hash)]);
    assert!(d.status.success());
    assert!(
        stdout(&d).contains(&format!(
            "Salt:            \t{}",
            json["salt"].as_str().unwrap()
        )),
        "{}",
        stdout(&d)
    );
    assert!(
        !stdout(&d).contains("Root hash"),
        "the superblock holds no root hash"
    );

    let ok = ingot(&["verity", "verify", s(&data), s(&hash), &root]);
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    let ok = ingot(&[
        "verity",
        "verify",
        "--root-hash-file",
        s(&root_file),
        s(&data),
        s(&hash),
    ]);
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));

    let mut bytes = std::fs::read(&data).unwrap();
    bytes[777 * 4096 + 1] ^= 4;
    std::fs::write(&data, &bytes).unwrap();
    let bad = ingot(&["verity", "verify", s(&data), s(&hash), &root]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("data block 777"), "{}", stderr(&bad));

    // Another last digit: a fixed '0' equals the real root one salt in 16.
    let last = if root.ends_with('0') { '1' } else { '0' };
    let wrong_root = format!("{}{last}", &root[..63]);
    let bad = ingot(&["verity", "verify", s(&data), s(&hash), &wrong_root]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(
        stderr(&bad).contains("root hash mismatch"),
        "{}",
        stderr(&bad)
    );
}

/// Each bad input: exit 1, a message naming the problem, no panic, and no hash file left behind
/// where none existed.
#[test]
#[allow(clippy::too_many_lines)] // one table of bad inputs, read as a list
fn bad_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let data = data_file(dir.path(), 16);
    let empty = dir.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    let hash = dir.path().join("hash");
    let long_salt = "ab".repeat(257);
    let garbled = dir.path().join("garbled");
    let missing = dir.path().join("missing");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["verity", "format", s(&empty), s(&hash)],
            "data device is empty",
        ),
        (
            vec![
                "verity",
                "format",
                "--data-block-size",
                "3000",
                s(&data),
                s(&hash),
            ],
            "block size 3000 is invalid",
        ),
        (
            vec![
                "verity",
                "format",
                "--hash-block-size",
                "65537",
                s(&data),
                s(&hash),
            ],
            "block size 65537 is invalid",
        ),
        (
            vec!["verity", "format", "--salt", &long_salt, s(&data), s(&hash)],
            "at most 256",
        ),
        (
            vec!["verity", "format", "--salt", "xyz", s(&data), s(&hash)],
            "not hex",
        ),
        (
            vec!["verity", "format", "--hash", "md5", s(&data), s(&hash)],
            "unknown hash algorithm",
        ),
        (
            vec!["verity", "format", "--format", "2", s(&data), s(&hash)],
            "hash type 2",
        ),
        (
            vec![
                "verity",
                "format",
                "--hash-offset",
                "100",
                s(&data),
                s(&hash),
            ],
            "multiple of 512",
        ),
        (
            vec![
                "verity",
                "format",
                "--data-blocks",
                "17",
                s(&data),
                s(&hash),
            ],
            "are needed for 17 blocks",
        ),
        (
            vec![
                "verity",
                "format",
                "--uuid",
                "not-a-uuid",
                s(&data),
                s(&hash),
            ],
            "not a UUID",
        ),
        (
            vec![
                "verity",
                "format",
                "--hash-offset",
                "32768",
                s(&data),
                s(&data),
            ],
            "overlaps the hash area",
        ),
        (vec!["verity", "dump", s(&garbled)], "no verity superblock"),
        (
            vec!["verity", "verify", s(&data), s(&garbled), "00"],
            "no verity superblock",
        ),
        (
            vec!["verity", "format", s(&missing), s(&hash)],
            "opening data device",
        ),
    ];
    std::fs::write(&garbled, vec![0x5a; 4096]).unwrap();
    for (args, expect) in cases {
        let o = ingot(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains(expect),
            "{args:?}: expected {expect:?} in: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!hash.exists(), "{args:?} left {} behind", hash.display());
    }
}
