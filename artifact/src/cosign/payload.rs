//! The "simple signing" payload a cosign signature signs (containers-signature(5)):
//! `{"critical":{"identity":{"docker-reference":REPO},"image":{"docker-manifest-digest":DIGEST},
//! "type":"cosign container image signature"},"optional":null}`. cosign checks the digest and
//! the type; skopeo's `signedIdentity` policy also reads `docker-reference`.

use serde::{Deserialize, Serialize};

/// The type string every cosign signature payload carries.
pub const PAYLOAD_TYPE: &str = "cosign container image signature";
/// The largest payload read (cosign's are about 250 bytes; `optional` may add a little).
pub const MAX_PAYLOAD_SIZE: u64 = 64 << 10;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PayloadError {
    #[error("the payload is {size} bytes; a cosign payload may have at most {MAX_PAYLOAD_SIZE}")]
    TooLarge { size: u64 },
    #[error("the payload is not a simple-signing document: {0}")]
    Json(String),
    #[error("the payload's type is `{0}`, not `{PAYLOAD_TYPE}`")]
    Type(String),
    #[error(
        "the payload's docker-manifest-digest `{0}` is not sha256: and 64 lowercase hex digits"
    )]
    Digest(String),
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Payload {
    critical: Critical,
    optional: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Critical {
    identity: Identity,
    image: Image,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Identity {
    #[serde(rename = "docker-reference")]
    docker_reference: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Image {
    #[serde(rename = "docker-manifest-digest")]
    docker_manifest_digest: String,
}

/// What a checked payload says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// `docker-reference`: the repository the signer meant (`HOST[:PORT]/PATH`).
    pub docker_reference: String,
    /// `docker-manifest-digest`: the manifest signed.
    pub manifest_digest: String,
}

/// The payload signing `digest` for the repository `docker_reference`, as cosign writes it.
pub fn build(docker_reference: &str, digest: &str) -> Vec<u8> {
    let p = Payload {
        critical: Critical {
            identity: Identity {
                docker_reference: docker_reference.to_owned(),
            },
            image: Image {
                docker_manifest_digest: digest.to_owned(),
            },
            kind: PAYLOAD_TYPE.to_owned(),
        },
        optional: None,
    };
    serde_json::to_vec(&p).expect("serialisable")
}

fn is_sha256_digest(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// Parses a payload strictly: bounded, no unknown field in `critical`, the exact type, a
/// well-formed digest. Only call it on bytes whose signature verified.
pub fn parse(bytes: &[u8]) -> Result<Signed, PayloadError> {
    if bytes.len() as u64 > MAX_PAYLOAD_SIZE {
        return Err(PayloadError::TooLarge {
            size: bytes.len() as u64,
        });
    }
    let p: Payload =
        serde_json::from_slice(bytes).map_err(|e| PayloadError::Json(e.to_string()))?;
    if p.critical.kind != PAYLOAD_TYPE {
        return Err(PayloadError::Type(p.critical.kind));
    }
    let digest = p.critical.image.docker_manifest_digest;
    if !is_sha256_digest(&digest) {
        return Err(PayloadError::Digest(digest));
    }
    Ok(Signed {
        docker_reference: p.critical.identity.docker_reference,
        manifest_digest: digest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest() -> String {
        format!("sha256:{}", "0f".repeat(32))
    }

    #[test]
    fn cosign_bytes_exactly() {
        let want = format!(
            r#"{{"critical":{{"identity":{{"docker-reference":"r.example:5000/a/b"}},"image":{{"docker-manifest-digest":"{}"}},"type":"cosign container image signature"}},"optional":null}}"#,
            digest()
        );
        assert_eq!(build("r.example:5000/a/b", &digest()), want.as_bytes());
        let s = parse(want.as_bytes()).unwrap();
        assert_eq!(s.manifest_digest, digest());
        assert_eq!(s.docker_reference, "r.example:5000/a/b");
    }

    #[test]
    fn optional_fields_are_allowed() {
        let p = build("r/a", &digest());
        let text = String::from_utf8(p).unwrap().replace(
            "\"optional\":null",
            r#""optional":{"creator":"containers/image","timestamp":1}"#,
        );
        parse(text.as_bytes()).unwrap();
    }

    #[test]
    fn bad_payloads_are_refused() {
        let good = String::from_utf8(build("r/a", &digest())).unwrap();
        let wrong_type = good.replace("cosign container image signature", "other");
        assert_eq!(
            parse(wrong_type.as_bytes()),
            Err(PayloadError::Type("other".into()))
        );
        let upper = good.replace(
            &digest(),
            &digest().to_uppercase().replace("SHA256", "sha256"),
        );
        assert!(matches!(
            parse(upper.as_bytes()),
            Err(PayloadError::Digest(_))
        ));
        let extra = good.replace("\"type\"", "\"extra\":1,\"type\"");
        assert!(matches!(
            parse(extra.as_bytes()),
            Err(PayloadError::Json(_))
        ));
        assert!(matches!(
            parse(&good.as_bytes()[..40]),
            Err(PayloadError::Json(_))
        ));
        let big = vec![b' '; MAX_PAYLOAD_SIZE as usize + 1];
        assert!(matches!(parse(&big), Err(PayloadError::TooLarge { .. })));
    }
}
