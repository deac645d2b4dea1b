//! Bootstrap data, with the `#cloud-config` header put before half the inputs (see `bootstrap_common.rs`).
#![no_main]

#[path = "bootstrap_common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| common::run(b"#cloud-config\n", data));
