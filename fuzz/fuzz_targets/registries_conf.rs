//! A registries.conf from anyone who can write `/etc/containers/registries.conf.d/`: parsing
//! refuses it or accepts it without panicking, and an accepted file gives, for references on the
//! hosts and paths it names, sources that are references (never more than its mirrors and the
//! location), or a refusal naming the file; a refusal's text never carries a control character
//! other than the newline. The input is the file; its names also seed the references tried.
#![no_main]

use std::path::Path;

use ingot_artifact::registry::mirrors::{MirrorConfig, MAX_MIRRORS};
use ingot_artifact::registry::RegistryRef;
use libfuzzer_sys::fuzz_target;

const FILE: &str = "/fuzz/registries.conf";

/// References to try: fixed ones, and one per quoted name in the text.
fn references(text: &str) -> Vec<RegistryRef> {
    let mut refs = vec!["oci://a.example/x/y:1".to_owned(), "oci://w.a.example:5000/x@sha256:".to_owned() + &"0".repeat(64)];
    for name in text.split('"').skip(1).step_by(2).take(16) {
        let name = name.trim_start_matches("*.");
        refs.push(format!("oci://{name}/r:t"));
        refs.push(format!("oci://w.{name}/r:t"));
    }
    refs.iter().filter_map(|r| r.parse().ok()).collect()
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let config = match MirrorConfig::parse(text, Path::new(FILE)) {
        Ok(c) => c,
        Err(e) => {
            let shown = ingot_artifact::error_chain::text(&e);
            assert!(shown.contains(FILE), "{shown}");
            assert!(!shown.chars().any(|c| c.is_control() && c != '\n'), "{shown:?}");
            return;
        }
    };
    for w in config.entries.windows(2) {
        assert!(w[0].prefix < w[1].prefix, "entries sorted, one per prefix");
    }
    for reference in references(text) {
        for by_digest in [false, true] {
            match config.pull_sources(&reference, by_digest) {
                Ok(sources) => {
                    assert!(!sources.is_empty() && sources.len() <= MAX_MIRRORS + 1);
                    assert!(sources.iter().filter(|s| !s.mirror).count() <= 1);
                }
                Err(e) => {
                    let shown = ingot_artifact::error_chain::text(&e);
                    assert!(!shown.chars().any(|c| c.is_control() && c != '\n'), "{shown:?}");
                }
            }
        }
    }
});
