//! cosign's key-based signatures, fully offline: the key files `cosign generate-key-pair` writes
//! (an encrypted private key, a PEM public key), the "simple signing" payload that names a
//! manifest digest, its ECDSA P-256 signature, and the `sha256-<HEX>.sig` tag whose image
//! manifest carries one signature per layer. The format is cosign's (`specs/SIGNATURE_SPEC.md`),
//! checked in the tests against Debian's skopeo, which signs and verifies it too.

pub mod attach;
pub mod check;
pub mod payload;
pub mod private_key;
pub mod public_key;
pub mod sig_manifest;

pub use private_key::SigningKey;
pub use public_key::PublicKey;

/// The tag that holds the cosign signatures of the manifest `digest` (`sha256:HEX`):
/// `sha256-HEX.sig`, in the same repository.
pub fn signature_tag(digest: &str) -> String {
    format!("{}.sig", digest.replacen(':', "-", 1))
}

#[cfg(test)]
mod tests {
    #[test]
    fn tag_of_a_digest() {
        let d = format!("sha256:{}", "ab".repeat(32));
        assert_eq!(
            super::signature_tag(&d),
            format!("sha256-{}.sig", "ab".repeat(32))
        );
    }
}
