//! Shared by the integration tests: build a fixture machine, and prove the checks left its disk
//! images byte-identical.

#![allow(dead_code)]

use std::path::PathBuf;

use ingot_machine::{detect, Facts};
use ingot_testkit::machine::{materialize, FixtureError, Materialized};

/// `tests/fixtures/machines/<name>` at the repository root.
pub fn fixture_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/machines")
        .join(name)
}

/// A materialized fixture machine that lives as long as its temporary directory.
pub struct Machine {
    pub dir: tempfile::TempDir,
    pub m: Materialized,
    pub facts: Facts,
}

/// Build fixture `name`; `None` (with the reason printed) when a tool that makes its content is
/// not installed.
pub fn machine(name: &str) -> Option<Machine> {
    let dir = tempfile::tempdir().unwrap();
    let m = match materialize(&fixture_dir(name), dir.path()) {
        Ok(m) => m,
        Err(FixtureError::ToolMissing(tool)) => {
            ingot_testkit::skip::skip(
                &ingot_testkit::skip::current_test(),
                &format!(
                    "fixture {name}: {tool} is not installed \
                     (apt-get install e2fsprogs dosfstools mtools gdisk fdisk)"
                ),
            );
            return None;
        }
        Err(e) => panic!("materialize {name}: {e}"),
    };
    let facts = detect(&m.sysroot()).unwrap_or_else(|e| panic!("detect {name}: {e}"));
    Some(Machine { dir, m, facts })
}

/// Run `check` on fixture `name`, then assert every disk image is byte-identical to before.
pub fn with_machine(name: &str, check: impl FnOnce(&Machine)) {
    let Some(machine) = machine(name) else { return };
    let before = machine.m.digests().unwrap();
    check(&machine);
    assert_eq!(
        machine.m.digests().unwrap(),
        before,
        "{name}: a check changed a disk image"
    );
}
