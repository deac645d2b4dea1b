//! Any 512+ bytes: the superblock parser never panics, and whatever it accepts has valid
//! parameters, serializes back to the same fields and yields a computable geometry.
#![no_main]

use ingot_verity::Superblock;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(sb) = Superblock::parse(data) {
        let bytes = sb.to_bytes();
        let again = Superblock::parse(&bytes).expect("a parsed superblock re-parses");
        assert_eq!(again, sb);
        let params = sb.to_params(0);
        params.validate().expect("accepted superblocks have valid parameters");
        let _ = params.geometry().expect("accepted superblocks have a geometry");
    }
});
