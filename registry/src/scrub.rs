//! Credentials out of text that came from elsewhere: a registry that echoes the request's
//! `Authorization` header in an error body must not get the credentials into a message, a log
//! line or (through the writer's status file) a Kubernetes event. Every form a credential is
//! sent or held in is removed: the password, `user:password`, its base64 (HTTP basic), the
//! bearer token as sent and decoded, and every token a token service handed out.

use std::sync::Mutex;

use base64::Engine;

use crate::auth::Credentials;

/// What replaces a credential.
pub const REDACTED: &str = "<redacted>";

/// The secret strings to remove, longest first (so a password inside `user:password` does not
/// leave the rest behind).
#[derive(Debug, Default)]
pub struct Scrubber {
    secrets: Mutex<Vec<String>>,
}

impl Scrubber {
    /// Every form of `credentials`.
    pub fn new(credentials: &Credentials) -> Self {
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut forms = Vec::new();
        match credentials {
            Credentials::Anonymous => {}
            Credentials::Basic { username, password } => {
                let pair = format!("{username}:{}", password.expose());
                forms.push(b64.encode(&pair));
                forms.push(pair);
                forms.push(password.expose().to_owned());
            }
            Credentials::Bearer(token) => {
                let token = token.expose();
                if let Some(raw) = b64
                    .decode(token)
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                {
                    forms.push(raw);
                }
                forms.push(token.to_owned());
            }
        }
        let scrubber = Scrubber::default();
        for f in forms {
            scrubber.add(f);
        }
        scrubber
    }

    /// One more secret (a token from a token service).
    pub fn add(&self, secret: String) {
        // A one- or two-character "secret" would blank out ordinary text; nothing sends those.
        if secret.len() < 3 {
            return;
        }
        let mut secrets = self.secrets.lock().unwrap_or_else(|p| p.into_inner());
        if !secrets.contains(&secret) {
            secrets.push(secret);
            secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        }
    }

    /// `text` with every secret replaced by [`REDACTED`].
    pub fn scrub(&self, text: &str) -> String {
        let secrets = self.secrets.lock().unwrap_or_else(|p| p.into_inner());
        let mut text = text.to_owned();
        for s in secrets.iter() {
            text = text.replace(s.as_str(), REDACTED);
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{credentials_from_token_env, Secret};

    #[test]
    fn every_form_of_a_login_is_removed() {
        let s = Scrubber::new(&Credentials::Basic {
            username: "alice".into(),
            password: Secret::new("hunter22"),
        });
        // base64("alice:hunter22")
        let echoed = "you sent Authorization: Basic YWxpY2U6aHVudGVyMjI= (alice:hunter22), \
                      password hunter22";
        let out = s.scrub(echoed);
        for secret in ["YWxpY2U6aHVudGVyMjI=", "alice:hunter22", "hunter22"] {
            assert!(!out.contains(secret), "{out}");
        }
        assert!(out.contains("Basic <redacted>"), "{out}");
    }

    #[test]
    fn a_bearer_token_is_removed_as_sent_and_decoded_and_so_are_issued_tokens() {
        let s = Scrubber::new(&credentials_from_token_env("ghp_abc123"));
        let out = s.scrub("Bearer Z2hwX2FiYzEyMw== ghp_abc123");
        assert_eq!(out, "Bearer <redacted> <redacted>");
        s.add("issued-token-xyz".into());
        assert_eq!(s.scrub("token issued-token-xyz"), "token <redacted>");
    }
}
