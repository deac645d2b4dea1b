//! The descriptor parser never panics; whatever it accepts re-serializes canonically and parses
//! back to the same value.
#![no_main]

use ingot_layers::descriptor::StackDescriptor;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = StackDescriptor::from_json(data) {
        let bytes = d.to_canonical_json();
        let back = StackDescriptor::from_json(&bytes).expect("canonical bytes parse");
        assert_eq!(back, d);
        assert_eq!(back.to_canonical_json(), bytes);
    }
});
