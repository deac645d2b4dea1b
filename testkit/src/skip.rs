//! The one skip policy: a test that needs a tool, root or a machine feature it does not have
//! prints a loud SKIP line and passes, except in CI (`CI` set), where every skip is a failure,
//! because CI installs everything the tests need (`ci/test`).

use std::path::{Path, PathBuf};

/// The name of the function this is written in (the test), without its module path: what the
/// skip functions below take as `test`, so no test spells its own name.
///
/// ```
/// fn a_test() -> &'static str {
///     ingot_testkit::test_name!()
/// }
/// assert_eq!(a_test(), "a_test");
/// ```
#[macro_export]
macro_rules! test_name {
    () => {{
        fn here() {}
        $crate::skip::function_name(::std::any::type_name_of_val(&here))
    }};
}

/// The running test's name, for a helper that several tests call: libtest runs each test on a
/// thread named after it (`module::test`); the last segment of that name, or the thread's
/// own (`main`, `unnamed`) where no test runs.
pub fn current_test() -> String {
    let thread = std::thread::current();
    let name = thread.name().unwrap_or("unnamed");
    name.rsplit("::").next().unwrap_or(name).to_owned()
}

/// The last segment of `path` (`crate::module::function::here`, as [`test_name!`] has it) that
/// names a function: `here` and closures (`{{closure}}`) are passed over.
pub fn function_name(path: &'static str) -> &'static str {
    path.rsplit("::")
        .find(|s| *s != "here" && *s != "{{closure}}")
        .unwrap_or(path)
}

/// Whether this is CI: the `CI` variable is set to anything but empty, `0` or `false`.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.as_str(), "" | "0" | "false"))
}

/// Where `name` is installed: on PATH, or in the sbin directories a non-root PATH lacks.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Whether this process runs as root (its `/proc/self` belongs to its effective uid).
pub fn is_root() -> bool {
    std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").expect("/proc/self")) == 0
}

/// Skips `test` because of `why`: a loud line on stderr outside CI, a failure in CI.
pub fn skip(test: &str, why: &str) {
    assert!(
        !in_ci(),
        "{test}: {why}, and CI forbids skipping (ci/test installs everything)"
    );
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "\n*** SKIP {test}: {why} ***\n");
}

/// Whether `tool` is installed; if not, `test` is skipped (see [`skip`]).
pub fn have_tool(test: &str, tool: &str) -> bool {
    if find_tool(tool).is_some() {
        return true;
    }
    skip(test, &format!("`{tool}` is not installed"));
    false
}

/// Whether every tool in `tools` is installed; if not, `test` is skipped naming the missing.
pub fn have_tools(test: &str, tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| find_tool(t).is_none())
        .collect();
    if missing.is_empty() {
        return true;
    }
    skip(test, &format!("{} not installed", missing.join(", ")));
    false
}

/// Whether this is the quick tier (`ci/test --fast`, `INGOT_TEST_TIER=fast`): tests that need
/// root or a VM are left out of it on purpose, so they skip even in CI.
pub fn fast_tier() -> bool {
    std::env::var("INGOT_TEST_TIER").is_ok_and(|v| v == "fast")
}

/// Whether this runs as root (and not in the quick tier); if not, `test` is skipped.
pub fn have_root(test: &str) -> bool {
    if fast_tier() {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIP {test}: needs root; not in the quick tier"
        );
        return false;
    }
    if is_root() {
        return true;
    }
    skip(
        test,
        "needs root (loop devices, mounts); CI runs it as root",
    );
    false
}

/// Whether loop devices can be made here: root, `losetup`, and `/dev/loop-control`; if not,
/// `test` is skipped.
pub fn have_loop_devices(test: &str) -> bool {
    have_root(test) && have_tool(test, "losetup") && have_file(test, Path::new("/dev/loop-control"))
}

/// Whether `path` (a firmware image, a kernel) exists; if not, `test` is skipped.
pub fn have_file(test: &str, path: &Path) -> bool {
    if path.exists() {
        return true;
    }
    skip(test, &format!("{} is missing", path.display()));
    false
}

#[cfg(test)]
mod tests {
    #[test]
    fn test_name_is_the_enclosing_function() {
        assert_eq!(crate::test_name!(), "test_name_is_the_enclosing_function");
        let in_closure = || crate::test_name!();
        assert_eq!(in_closure(), "test_name_is_the_enclosing_function");
        assert_eq!(super::current_test(), "test_name_is_the_enclosing_function");
    }
}
