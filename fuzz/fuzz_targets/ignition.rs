//! Bootstrap data, with the Ignition object opening put before half the inputs (see `bootstrap_common.rs`).
#![no_main]

#[path = "bootstrap_common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| common::run(b"{\"ignition\":{\"version\":\"3.4.0\"},", data));
