//! The stack.lock parser never panics, names the file in every error, and a lock it accepts is
//! written again (`to_toml`) to text it reads back to the same lock, byte for byte the second
//! time: the format is stable.
#![no_main]

use std::path::Path;

use ingot::debian::lock::Lock;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let file = Path::new("/fuzz/stack.lock");
    match Lock::parse(text, file) {
        Ok(lock) => {
            let written = lock.to_toml();
            let again = Lock::parse(&written, file)
                .unwrap_or_else(|e| panic!("a written lock is refused: {e}\n{written}"));
            assert_eq!(again, lock);
            assert_eq!(again.to_toml(), written);
        }
        Err(e) => assert_eq!(e.file, file),
    }
});
