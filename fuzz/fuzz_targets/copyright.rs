//! The DEP-5 copyright parser never panics, and what it declares stays within its bounds: an
//! expression of at most `MAX_EXPRESSION` bytes naming every `LicenseRef-` it declares, each
//! text within `MAX_LICENSE_TEXT`.
#![no_main]

use ingot_artifact::sbom::copyright::{declared, MAX_EXPRESSION, MAX_LICENSE_TEXT};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(d) = declared(data) {
        assert!(!d.expression.is_empty() && d.expression.len() <= MAX_EXPRESSION);
        for e in &d.extracted {
            assert!(e.id.starts_with("LicenseRef-"));
            assert!(d.expression.contains(&e.id));
            assert!(!e.text.is_empty() && e.text.len() <= MAX_LICENSE_TEXT);
        }
    }
});
