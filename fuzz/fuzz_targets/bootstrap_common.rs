//! The shared body of the `cloud_config` and `ignition` targets: the bootstrap parser never
//! panics or allocates without bound, and whatever it accepts stages without panicking: staged
//! paths are absolute, sorted with parents first, secrets tightened, and the tar writes.

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
    for p in &s.secrets {
        assert_eq!(s.get(p).unwrap().mode & 0o077, 0, "{}", p.display());
    }
    s.to_tree().unwrap();
}
