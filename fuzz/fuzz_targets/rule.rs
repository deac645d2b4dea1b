//! The selection rule's text parser never panics, and its text form round-trips.
#![no_main]

use ingot_layers::select::Rule;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(rule) = text.parse::<Rule>() {
        let shown = rule.to_string();
        assert_eq!(shown.parse::<Rule>().as_ref(), Ok(&rule), "{shown}");
        let json = serde_json::to_string(&rule).expect("serializes");
        let back: Rule = serde_json::from_str(&json).expect("parses back");
        assert_eq!(back, rule);
    }
});
