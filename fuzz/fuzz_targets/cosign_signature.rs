//! What a registry can answer under a cosign `sha256-<HEX>.sig` tag: the signature manifest and
//! a payload (`SIG_MANIFEST\0PAYLOAD`, the payload served for every layer). The manifest and
//! payload parsers refuse or accept without panicking, and the check never accepts a signature
//! under a key made here, which no input can have signed.
#![no_main]

use std::sync::OnceLock;

use ingot_artifact::cosign::{check, payload, sig_manifest::SigManifest, PublicKey, SigningKey};
use libfuzzer_sys::fuzz_target;

fn key() -> &'static PublicKey {
    static KEY: OnceLock<PublicKey> = OnceLock::new();
    KEY.get_or_init(|| SigningKey::generate().public_key())
}

fuzz_target!(|data: &[u8]| {
    let (manifest, body) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, data),
    };
    if let Ok(m) = SigManifest::parse(manifest) {
        let _ = m.signatures();
    }
    if let Ok(signed) = payload::parse(body) {
        assert!(signed.manifest_digest.starts_with("sha256:"));
    }
    let digest = format!("sha256:{}", "0".repeat(64));
    let blob = |_: &_| Ok(body.to_vec());
    let r = check::check(key(), &digest, "t.sig", "fuzz input", Some(manifest), &blob);
    assert!(r.is_err(), "accepted a signature no one made");
});
