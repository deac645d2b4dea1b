//! The generated man pages render with the real `man` (man-db, groff) and the completions load in
//! bash: `ingot-docgen --out DIR` as the README says to run it.

use std::path::Path;
use std::process::Command;

fn generate(out: &Path) -> String {
    let run = Command::new(env!("CARGO_BIN_EXE_ingot-docgen"))
        .arg("--out")
        .arg(out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    String::from_utf8(run.stdout).unwrap()
}

#[test]
fn man_renders_every_page() {
    let dir = tempfile::tempdir().unwrap();
    let listed = generate(dir.path());
    let man1 = dir.path().join("man1");
    for page in [
        "ingot.1",
        "ingot-build.1",
        "ingot-layer-build.1",
        "ingot-verify.1",
        "ingot-writer.1",
    ] {
        assert!(listed.contains(page), "{page} not listed:\n{listed}");
        let out = Command::new("man")
            .arg("-l")
            .arg(man1.join(page))
            .env("MANWIDTH", "100")
            .env("MAN_KEEP_FORMATTING", "")
            .env("PAGER", "cat")
            .output()
            .expect("man (man-db) is installed");
        let text = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{page}: {stderr}");
        assert!(stderr.trim().is_empty(), "{page}: groff warned: {stderr}");
        let name = page.trim_end_matches(".1");
        assert!(
            text.contains("NAME") && text.contains(name),
            "{page}:\n{text}"
        );
        assert!(text.contains("OPTIONS"), "{page}:\n{text}");
    }
    // The build page carries the build command's own options.
    let build = Command::new("man")
        .arg("-l")
        .arg(man1.join("ingot-build.1"))
        .env("PAGER", "cat")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&build.stdout).contains("--out"));
}

#[test]
fn completions_load_in_bash() {
    let dir = tempfile::tempdir().unwrap();
    generate(dir.path());
    for (file, name) in [
        ("ingot.bash", "ingot"),
        ("ingot-writer.bash", "ingot-writer"),
    ] {
        let path = dir.path().join("completions").join(file);
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!("source {}; complete -p {name}", path.display()))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(&format!(" {name}")),
            "{file}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The function bash would call offers the subcommands.
        if name == "ingot" {
            let out = Command::new("bash")
                .arg("-c")
                .arg(format!(
                    "source {}; COMP_WORDS=(ingot bu); COMP_CWORD=1; COMP_LINE='ingot bu'; \
                     COMP_POINT=8; _ingot ingot bu ingot; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
                    path.display()
                ))
                .output()
                .unwrap();
            let words = String::from_utf8_lossy(&out.stdout);
            assert!(words.lines().any(|w| w == "build"), "{words}");
        }
    }
    for file in ["_ingot", "ingot.fish", "_ingot-writer", "ingot-writer.fish"] {
        assert!(
            dir.path().join("completions").join(file).is_file(),
            "{file}"
        );
    }
}
