//! The house rules, read from the workspace (docs/architecture.md): who may depend on whom (the
//! writer links the artifact crate, never the builder, and the test-support crate is never a
//! normal dependency of anything), modules that form a line inside each crate, and the error
//! rule.

use std::process::Command;

/// Every crate (any name) in `cargo tree -e normal` of `package`.
fn all_normal_deps(package: &str) -> Vec<String> {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "-e",
            "normal",
            "--prefix",
            "none",
            "-p",
            package,
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("running cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// The ingot crates in `cargo tree -e normal` of `package`.
fn normal_deps(package: &str) -> Vec<String> {
    let mut crates: Vec<String> = all_normal_deps(package)
        .into_iter()
        .filter(|name| name == "ingot" || name.starts_with("ingot-"))
        .collect();
    crates.sort();
    crates.dedup();
    crates
}

/// The registry is one crate with one transport: no client library with an upload path and
/// an authorization flow of its own reaches the writer.
#[test]
fn the_writer_links_one_registry_client_and_no_upload_library() {
    let deps = all_normal_deps("ingot-writer");
    assert!(deps.iter().any(|d| d == "ingot-registry"), "{deps:?}");
    for other in ["oci-client", "oci-distribution", "oci-spec"] {
        assert!(!deps.iter().any(|d| d == other), "the writer links {other}");
    }
}

#[test]
fn the_writer_links_the_artifact_crate_not_the_builder() {
    let deps = normal_deps("ingot-writer");
    assert!(deps.contains(&"ingot-artifact".to_string()), "{deps:?}");
    assert!(!deps.contains(&"ingot".to_string()), "{deps:?}");
    assert!(!deps.contains(&"ingot-testkit".to_string()), "{deps:?}");
}

#[test]
fn the_lower_crates_use_nothing_above_them() {
    for (package, allowed) in [
        ("ingot-verity", &["ingot-verity"][..]),
        ("ingot-layers", &["ingot-layers", "ingot-verity"]),
        (
            "ingot-bootstrap",
            &["ingot-bootstrap", "ingot-layers", "ingot-verity"],
        ),
        ("ingot-machine", &["ingot-machine"]),
        ("ingot-vm", &["ingot-vm"]),
        (
            "ingot-registry",
            &["ingot-registry", "ingot-layers", "ingot-verity"],
        ),
        (
            "ingot-artifact",
            &[
                "ingot-artifact",
                "ingot-registry",
                "ingot-layers",
                "ingot-verity",
            ],
        ),
    ] {
        let deps = normal_deps(package);
        assert!(
            deps.iter().all(|d| allowed.contains(&d.as_str())),
            "{package} depends on {deps:?}; allowed: {allowed:?}"
        );
    }
}

/// Inside a crate, modules form a line too: none names a module that names it back (through
/// `crate::` or `super::` paths, doc links included), read from the sources; and the same with
/// every module folded into its crate-level ancestor.
#[test]
fn the_modules_of_each_crate_form_a_line() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut knots = Vec::new();
    for krate in LINED_CRATES {
        let graph = ingot_testkit::modules::graph(&root.join(krate).join("src"));
        assert!(
            graph.len() > 1 || *krate == "docgen",
            "{krate}: no modules read"
        );
        for cycle in ingot_testkit::modules::cycles(&graph) {
            knots.push(format!("{krate}: {}", cycle.join(", ")));
        }
        // A directory of modules is one unit: a circle through two of its submodules counts.
        for cycle in ingot_testkit::modules::cycles(&ingot_testkit::modules::folded(&graph)) {
            knots.push(format!("{krate} (submodules folded): {}", cycle.join(", ")));
        }
    }
    assert!(
        knots.is_empty(),
        "modules that name each other in a circle:\n{}",
        knots.join("\n")
    );
}

/// The error rule: a variant with a source does not format it too, so a chain printed with
/// `{:#}` says each cause once.
#[test]
fn no_error_formats_its_own_source() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut breaches = Vec::new();
    for krate in LINED_CRATES {
        for dir in ["src", "tests"] {
            let path = root.join(krate).join(dir);
            if path.is_dir() {
                breaches.extend(ingot_testkit::error_rule::breaches(&path));
            }
        }
    }
    let text: Vec<String> = breaches.iter().map(ToString::to_string).collect();
    assert!(
        text.is_empty(),
        "errors that print their cause twice:\n{}",
        text.join("\n")
    );
}

/// Every crate of the workspace.
const LINED_CRATES: &[&str] = &[
    "verity",
    "layers",
    "bootstrap",
    "machine",
    "registry",
    "artifact",
    "builder",
    "writer",
    "docgen",
    "testkit",
    "testproxy",
    "vm",
];
