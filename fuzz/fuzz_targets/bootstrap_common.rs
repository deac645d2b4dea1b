//! The shared body of the `cloud_config` and `ignition` targets: the bootstrap parser never
//! panics or allocates without bound, and whatever it accepts stages without panicking: staged
//! paths are absolute, sorted with parents first, secrets tightened, no type-level or prefix
//! systemd drop-in or dependency directory (`service.d/`, `foo-.service.d/`) anywhere, and the
//! tree builds.

use std::collections::BTreeMap;

use ingot_bootstrap::{parse, stage, EntryKind, StageInput, StageOptions};
use rand::rngs::StdRng;
use rand::SeedableRng;

const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n";
const GROUP: &str = "root:x:0:\nsudo:x:27:\nnogroup:x:65534:\n";

/// Runs one input; when its first byte is odd, `header` is put before the rest, so the fuzzer
/// spends its effort inside the format instead of on detection.
pub fn run(header: &[u8], data: &[u8]) {
    let prefixed;
    let input: &[u8] = match data.split_first() {
        Some((flag, rest)) if flag & 1 == 1 => {
            prefixed = [header, rest].concat();
            &prefixed
        }
        Some((_, rest)) => rest,
        None => data,
    };
    let Ok(b) = parse(input) else {
        return;
    };
    let si = StageInput {
        bootstrap: b,
        machine_name: "fuzz-node-0".to_string(),
        base_passwd: PASSWD.to_string(),
        base_group: GROUP.to_string(),
        network: None,
        labels: BTreeMap::new(),
        // RSA key generation would dominate every run.
        options: StageOptions { host_keys: false },
    };
    let Ok(s) = stage(&si, &mut StdRng::seed_from_u64(0)) else {
        return;
    };
    for w in s.entries.windows(2) {
        assert!(w[0].path < w[1].path, "not sorted: {:?}", w);
    }
    for e in &s.entries {
        assert!(e.path.is_absolute());
        assert!(!e.path.starts_with("/run") && !e.path.starts_with("/tmp"));
        if let Some(p) = e.path.parent().filter(|p| p.as_os_str() != "/") {
            assert!(matches!(s.get(p).map(|x| &x.kind), Some(EntryKind::Dir)), "{:?}", e);
        }
    }
    for e in &s.entries {
        assert_no_type_or_prefix_dir(&e.path);
    }
    for p in &s.secrets {
        assert_eq!(s.get(p).unwrap().mode & 0o077, 0, "{}", p.display());
    }
    s.to_tree().unwrap();
}

/// systemd's unit types, whose `TYPE.d/` (and `.wants/`, ...) apply to every unit of the type.
const UNIT_TYPES: &[&str] = &[
    "service", "socket", "target", "device", "mount", "automount", "swap", "timer", "path",
    "slice", "scope",
];

/// Unit directories (systemd.unit(5)), staged relocated from /run too.
const UNIT_DIRS: &[&str] = &[
    "/etc/systemd/system",
    "/etc/systemd/system.control",
    "/etc/systemd/system.attached",
    "/etc/systemd/user",
    "/etc/xdg/systemd/user",
    "/etc/ingot/run/systemd/system",
    "/etc/ingot/run/systemd/system.control",
    "/etc/ingot/run/systemd/transient",
    "/etc/ingot/run/systemd/user",
];

/// No unit directory the node layer carries holds a directory systemd reads for every unit of a
/// type or prefix: the allow-list (`bootstrap/src/stage/unit_dirs.rs`) refuses them.
fn assert_no_type_or_prefix_dir(path: &std::path::Path) {
    let text = path.to_string_lossy();
    let home = ["/.config/systemd/user/", "/.local/share/systemd/user/"]
        .iter()
        .find_map(|d| text.find(d).map(|i| &text[i + d.len()..]));
    let below = UNIT_DIRS
        .iter()
        .find_map(|d| path.strip_prefix(d).ok())
        .map(|r| r.to_string_lossy().into_owned())
        .or(home.map(str::to_string));
    let Some(first) = below.as_deref().and_then(|r| r.split('/').next()) else {
        return;
    };
    for suffix in [".d", ".wants", ".requires", ".upholds"] {
        let Some(unit) = first.strip_suffix(suffix) else {
            continue;
        };
        assert!(!UNIT_TYPES.contains(&unit), "type-level {first} staged: {text}");
        if let Some((stem, kind)) = unit.rsplit_once('.') {
            let prefix =
                UNIT_TYPES.contains(&kind) && !stem.contains('@') && stem.len() > 1 && stem.ends_with('-');
            assert!(!prefix, "prefix {first} staged: {text}");
        }
    }
}
