//! The manifest parser never panics, and every error it reports names the file and, when it
//! gives a position, a line and column inside the text.
#![no_main]

use std::path::Path;

use ingot::manifest::Manifest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Manifest::parse(text, Path::new("/fuzz/stack.toml")) {
        Ok(m) => {
            assert!(!m.layers.is_empty());
            assert_eq!(m.layers[0].kind, "base");
            assert!(m.layers[0].when.is_none());
            assert!(m.layers[1..].iter().all(|l| l.when.is_some()));
        }
        Err(e) => {
            assert_eq!(e.file, Path::new("/fuzz/stack.toml"));
            if let Some((line, col)) = e.position {
                assert!(line >= 1 && line <= text.lines().count().max(1) + 1, "{e}");
                assert!(col >= 1, "{e}");
            }
        }
    }
});
