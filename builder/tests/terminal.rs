//! What `inspect`, `diff` and `verify` print reaches a terminal. An unsigned layout is anyone's:
//! its SBOMs' package fields and its layers' file names must not reach the terminal raw (an
//! escape sequence retitles or clears it, a newline forges a line of output).

mod common;

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{cp_a, dpkg_layers, write_manifest, TestLayer};
use ingot_testkit::layout::{blob_path, read as read_layout};
use serde_json::Value;
use sha2::{Digest, Sha256};

const BASE_STATUS: &str = "Package: libc6\nStatus: install ok installed\nArchitecture: amd64\n\
Version: 2.36-9+deb12u4\n";
const TOOLS_STATUS: &str = "Package: socat\nStatus: install ok installed\nArchitecture: amd64\n\
Version: 1.7.4.4-2\n";

/// A two-layer stack (`base` with a dpkg status, `tools` with its own and `usr/bin/socat`), plus
/// a file in `tools` named `hostile_name` when given.
fn stack(dir: &Path, hostile_name: Option<&[u8]>) -> PathBuf {
    let (base, tools) = dpkg_layers(dir, BASE_STATUS.as_bytes(), TOOLS_STATUS.as_bytes());
    if let Some(name) = hostile_name {
        let file = tools
            .join("usr/bin")
            .join(std::ffi::OsStr::from_bytes(name));
        fs::write(file, b"x").unwrap();
    }
    write_manifest(
        dir,
        "terminal",
        &[
            TestLayer::new("base", "base", None, &base),
            TestLayer::new("tools", "tools", Some("virt"), &tools),
        ],
    )
}

/// `ingot` with its own log lines uncoloured (`NO_COLOR`): what is left to check is what the
/// stack brought.
fn ingot<const N: usize>(args: [&std::ffi::OsStr; N]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(args)
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .output()
        .expect("running ingot")
}

fn build(manifest: &Path, out: &Path) {
    let run = ingot([
        "build".as_ref(),
        manifest.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
        "--quiet".as_ref(),
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Swaps layer `layer`'s SBOM blob for `sbom` in an unsigned layout: a new descriptor, manifest
/// and index pin it, as anyone who can write the layout can.
fn replace_sbom(dir: &Path, layer: &str, sbom: &[u8]) {
    let built = read_layout(dir);
    let digest = sha256(sbom);
    fs::write(blob_path(dir, &digest), sbom).unwrap();
    let mut d = built.descriptor.clone();
    let entry = d["layers"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|l| l["name"] == layer)
        .unwrap();
    let old = entry["sbom"]["digest"].as_str().unwrap().to_owned();
    entry["sbom"] = serde_json::json!({"digest": digest, "size": sbom.len()});
    let dbytes = serde_json::to_vec(&d).unwrap();
    let ddigest = sha256(&dbytes);
    fs::write(blob_path(dir, &ddigest), &dbytes).unwrap();
    let mut m = built.manifest.clone();
    m["config"]["digest"] = ddigest.into();
    m["config"]["size"] = dbytes.len().into();
    for l in m["layers"].as_array_mut().unwrap() {
        if l["digest"] == old.as_str() {
            l["digest"] = digest.clone().into();
            l["size"] = sbom.len().into();
        }
    }
    let mbytes = serde_json::to_vec(&m).unwrap();
    let mdigest = sha256(&mbytes);
    fs::write(blob_path(dir, &mdigest), &mbytes).unwrap();
    let mut index: Value =
        serde_json::from_slice(&fs::read(dir.join("index.json")).unwrap()).unwrap();
    index["manifests"][0]["digest"] = mdigest.into();
    index["manifests"][0]["size"] = mbytes.len().into();
    fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
}

/// What a terminal would act on: C0 controls but the newline ending a line, DEL, C1 controls
/// (U+0080–U+009F, which some terminals take as CSI and OSC) and bidi overrides.
fn assert_terminal_safe(what: &str, out: &Output) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let bad: Vec<char> = text
        .chars()
        .filter(|&c| {
            (c.is_control() && c != '\n')
                || ('\u{202a}'..='\u{202e}').contains(&c)
                || c == '\u{2028}'
        })
        .collect();
    assert!(bad.is_empty(), "{what} printed {bad:?} raw:\n{text:?}");
    text
}

#[test]
fn inspect_and_diff_print_no_control_character_from_an_unsigned_sbom() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    build(&stack(&tmp.path().join("s"), None), &a);
    let b = tmp.path().join("b");
    cp_a(&a, &b);
    // Layer `tools`' SBOM, rewritten: a name that retitles and clears the terminal, a version
    // that forges a line of inspect's output.
    let sbom_digest = read_layout(&b).layer("tools")["sbom"]["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let good = fs::read_to_string(blob_path(&b, &sbom_digest)).unwrap();
    let hostile = good
        .replace(
            "\"name\":\"socat\"",
            "\"name\":\"socat\\u001b]0;pwned\\u0007\\u001b[2J\"",
        )
        .replace(
            "\"versionInfo\":\"1.7.4.4-2\"",
            "\"versionInfo\":\"1.0\\n\\nlayer `base`: 0 packages\"",
        );
    assert_ne!(hostile, good);
    replace_sbom(&b, "tools", hostile.as_bytes());

    let out = ingot(["inspect".as_ref(), b.as_os_str(), "--packages".as_ref()]);
    let text = assert_terminal_safe("inspect --packages", &out);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("layer `tools`: the SBOM lists package `socat\\u{1b}]0;pwned"),
        "{text}"
    );

    let out = ingot(["diff".as_ref(), a.as_os_str(), b.as_os_str()]);
    let text = assert_terminal_safe("diff", &out);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("layer `tools`: the SBOM lists"), "{text}");
}

#[test]
fn diff_escapes_file_names_from_a_layer() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    build(&stack(&tmp.path().join("sa"), None), &a);
    let b = tmp.path().join("b");
    let name = b"evil\x1b]0;pwned\x07\x1b[2J\nlayer base             unchanged\xe2\x80\xae";
    build(&stack(&tmp.path().join("sb"), Some(name)), &b);

    let out = ingot(["diff".as_ref(), a.as_os_str(), b.as_os_str()]);
    let text = assert_terminal_safe("diff", &out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(
            "  + /usr/bin/evil\\u{1b}]0;pwned\\u{7}\\u{1b}[2J\\nlayer base             \
             unchanged\\u{202e} (file 1 B"
        ),
        "{text}"
    );
    // The forged line is not a line: base's own is the only one.
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("layer base "))
            .count(),
        1,
        "{text}"
    );
}
