//! `sigstore-verify IMAGE PUBLIC_KEY`: the sigstore project's own Rust client (sigstore-rs, what
//! Kubewarden verifies images with) checks IMAGE's key-based cosign signature (`.sig` tag)
//! against a cosign public key, over plain HTTP (the tests' loopback registry). Exit 0 when a
//! signature verifies, 1 with the reason otherwise.

use sigstore::cosign::verification_constraint::{PublicKeyVerifier, VerificationConstraintVec};
use sigstore::cosign::{verify_constraints, ClientBuilder, CosignCapabilities};
use sigstore::crypto::SigningScheme;
use sigstore::registry::{Auth, ClientConfig, ClientProtocol, OciReference};

async fn check(image: &str, key: &[u8]) -> Result<usize, String> {
    let image: OciReference = image.parse().map_err(|e| format!("{image}: {e}"))?;
    let config = ClientConfig {
        protocol: ClientProtocol::Http,
        ..Default::default()
    };
    let mut client = ClientBuilder::default()
        .with_oci_client_config(config)
        .build()
        .map_err(|e| e.to_string())?;
    let layers = client
        .trusted_signature_layers(&Auth::Anonymous, &image)
        .await
        .map_err(|e| format!("fetching the signature layers: {e}"))?;
    let verifier = PublicKeyVerifier::new(key, &SigningScheme::default())
        .map_err(|e| format!("the public key: {e}"))?;
    let constraints: VerificationConstraintVec = vec![Box::new(verifier)];
    verify_constraints(&layers, constraints.iter()).map_err(|e| {
        let unsatisfied: Vec<String> = e
            .unsatisfied_constraints
            .iter()
            .map(|c| format!("{c:?}"))
            .collect();
        format!("{} signature layer(s), none satisfies: {}", layers.len(), unsatisfied.join(", "))
    })?;
    Ok(layers.len())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let [_, image, key] = &args[..] else {
        eprintln!("usage: sigstore-verify IMAGE PUBLIC_KEY");
        return std::process::ExitCode::from(2);
    };
    let key = match std::fs::read(key) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("sigstore-verify: {key}: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    match check(image, &key).await {
        Ok(n) => {
            println!("verified: {image} ({n} signature layer(s))");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sigstore-verify: {image}: {e}");
            std::process::ExitCode::from(1)
        }
    }
}
