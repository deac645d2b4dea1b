//! Registry credentials and where they come from.
//!
//! Precedence, first match wins (documented in `docs/registry.md`):
//! 1. `--username` with `--password-stdin` (HTTP basic, or the registry's token exchange);
//! 2. `OCI_REGISTRY_AUTH_TOKEN`, in cluster-api-provider-hetzner's form: `user:password` is a
//!    login (basic credentials, exchanged for a bearer token when the registry asks for one);
//!    a value without a colon is a token sent as `Authorization: Bearer base64(value)`, as
//!    CAPH's `download-from-oci.sh` does (it pipes the value through `base64`);
//! 3. the `auths` entry for the registry in docker's `config.json` (`$DOCKER_CONFIG/config.json`,
//!    else `~/.docker/config.json`; the `auth` field is base64 `user:password`);
//! 4. anonymous.
//!
//! Every secret is a [`Secret`]: its `Debug` and `Display` print `<redacted>`, so a secret cannot
//! reach a log line or an error message by accident.

use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine;
use oci_client::secrets::RegistryAuth;
use serde::Deserialize;

use super::RegistryError;

/// The environment variable CAPH sets for the rescue system.
pub const TOKEN_ENV: &str = "OCI_REGISTRY_AUTH_TOKEN";

/// A secret string. Never printed: `Debug` and `Display` redact it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wrap a secret.
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }

    /// The secret itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Credentials for one registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// None.
    Anonymous,
    /// A user name and password (HTTP basic, or exchanged for a bearer token).
    Basic {
        /// The user name.
        username: String,
        /// The password.
        password: Secret,
    },
    /// A bearer token, sent as is in `Authorization: Bearer …`.
    Bearer(Secret),
}

impl Credentials {
    pub(crate) fn to_oci(&self) -> RegistryAuth {
        match self {
            Credentials::Anonymous => RegistryAuth::Anonymous,
            Credentials::Basic { username, password } => {
                RegistryAuth::Basic(username.clone(), password.expose().to_owned())
            }
            Credentials::Bearer(t) => RegistryAuth::Bearer(t.expose().to_owned()),
        }
    }

    /// All secret strings in these credentials (to scrub them from text that came from
    /// elsewhere, e.g. a registry's error body).
    pub fn secrets(&self) -> Vec<&str> {
        match self {
            Credentials::Anonymous => vec![],
            Credentials::Basic { password, .. } => vec![password.expose()],
            Credentials::Bearer(t) => vec![t.expose()],
        }
    }
}

/// Credentials and a description of where they came from (safe to print).
#[derive(Debug, Clone)]
pub struct ResolvedAuth {
    /// The credentials.
    pub credentials: Credentials,
    /// e.g. `--username alice`, `OCI_REGISTRY_AUTH_TOKEN (bearer)`, `/root/.docker/config.json`.
    pub source: String,
}

/// What the command line gave.
#[derive(Debug, Clone, Default)]
pub struct ExplicitAuth {
    /// `--username`.
    pub username: Option<String>,
    /// The password read from stdin.
    pub password: Option<Secret>,
}

/// Parse `OCI_REGISTRY_AUTH_TOKEN` the way CAPH's download script does.
pub fn credentials_from_token_env(value: &str) -> Credentials {
    match value.split_once(':') {
        Some((user, pass)) => Credentials::Basic {
            username: user.to_owned(),
            password: Secret::new(pass),
        },
        None => Credentials::Bearer(Secret::new(
            base64::engine::general_purpose::STANDARD.encode(value.as_bytes()),
        )),
    }
}

#[derive(Deserialize, Default)]
struct DockerConfig {
    #[serde(default)]
    auths: std::collections::BTreeMap<String, DockerAuth>,
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
}

#[derive(Deserialize, Default)]
struct DockerAuth {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
}

/// `$DOCKER_CONFIG/config.json`, else `$HOME/.docker/config.json`.
pub fn docker_config_path() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".docker/config.json"))
}

/// The host part of an `auths` key: `https://host:port/v1/` → `host:port`.
fn auths_key_host(key: &str) -> &str {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    k.split('/').next().unwrap_or(k)
}

fn same_registry(a: &str, b: &str) -> bool {
    let norm = |h: &str| match h {
        "docker.io" | "registry-1.docker.io" => "index.docker.io".to_owned(),
        other => other.to_owned(),
    };
    norm(a) == norm(b)
}

/// Look `registry` up in a docker `config.json`.
pub fn credentials_from_docker_config(
    path: &Path,
    registry: &str,
) -> Result<Option<Credentials>, RegistryError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(RegistryError::io(path)(e)),
    };
    let config: DockerConfig = serde_json::from_str(&text).map_err(|e| {
        RegistryError::Protocol(format!("{}: not a docker config file: {e}", path.display()))
    })?;
    let Some((_, entry)) = config
        .auths
        .iter()
        .find(|(k, _)| same_registry(auths_key_host(k), registry))
    else {
        if let Some(store) = &config.creds_store {
            tracing::warn!(
                "{}: no `auths` entry for {registry}; credential helpers (credsStore {store}) \
                 are not supported",
                path.display()
            );
        }
        return Ok(None);
    };
    let bad = |why: &str| {
        RegistryError::Protocol(format!(
            "{}: the `auths` entry for {registry} {why}",
            path.display()
        ))
    };
    if let Some(token) = entry.identitytoken.as_deref().filter(|t| !t.is_empty()) {
        // An OAuth2 refresh token; registries exchange it at their token endpoint. oci-client
        // does not implement that exchange, so say so instead of failing obscurely.
        let _ = token;
        return Err(bad(
            "holds an identity token, which ingot does not support; use --username and \
             --password-stdin",
        ));
    }
    if let Some(auth) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .map_err(|_| bad("has an `auth` field that is not base64"))?;
        let decoded = String::from_utf8(decoded).map_err(|_| bad("has a non-UTF-8 `auth`"))?;
        let (user, pass) = decoded
            .split_once(':')
            .ok_or_else(|| bad("has an `auth` field that is not base64 of user:password"))?;
        return Ok(Some(Credentials::Basic {
            username: user.to_owned(),
            password: Secret::new(pass),
        }));
    }
    match (&entry.username, &entry.password) {
        (Some(u), Some(p)) => Ok(Some(Credentials::Basic {
            username: u.clone(),
            password: Secret::new(p.clone()),
        })),
        _ => Ok(None),
    }
}

/// Resolve the credentials for `registry` by the precedence in the module docs.
pub fn resolve(registry: &str, explicit: &ExplicitAuth) -> Result<ResolvedAuth, RegistryError> {
    match (&explicit.username, &explicit.password) {
        (Some(u), Some(p)) => {
            return Ok(ResolvedAuth {
                credentials: Credentials::Basic {
                    username: u.clone(),
                    password: p.clone(),
                },
                source: format!("--username {u}"),
            })
        }
        (Some(_), None) | (None, Some(_)) => {
            return Err(RegistryError::Reference(
                "--username and --password-stdin go together".to_owned(),
            ))
        }
        (None, None) => {}
    }
    if let Ok(v) = std::env::var(TOKEN_ENV) {
        let v = v.trim_end_matches(['\n', '\r']);
        if !v.is_empty() {
            let credentials = credentials_from_token_env(v);
            let kind = match credentials {
                Credentials::Basic { .. } => "user:password",
                _ => "bearer token",
            };
            return Ok(ResolvedAuth {
                credentials,
                source: format!("{TOKEN_ENV} ({kind})"),
            });
        }
    }
    if let Some(path) = docker_config_path() {
        if let Some(credentials) = credentials_from_docker_config(&path, registry)? {
            return Ok(ResolvedAuth {
                credentials,
                source: path.display().to_string(),
            });
        }
    }
    Ok(ResolvedAuth {
        credentials: Credentials::Anonymous,
        source: "anonymous".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s}"), "<redacted>");
        assert!(!format!("{s:?}").contains("hunter2"));
        let c = Credentials::Basic {
            username: "u".into(),
            password: s,
        };
        assert!(!format!("{c:?}").contains("hunter2"));
        let b = Credentials::Bearer(Secret::new("tok3n"));
        assert!(!format!("{b:?}").contains("tok3n"));
    }

    #[test]
    fn token_env_forms() {
        assert_eq!(
            credentials_from_token_env("alice:pa:ss"),
            Credentials::Basic {
                username: "alice".into(),
                password: Secret::new("pa:ss")
            }
        );
        // `echo -n ghp_abc | base64`
        assert_eq!(
            credentials_from_token_env("ghp_abc"),
            Credentials::Bearer(Secret::new("Z2hwX2FiYw=="))
        );
    }

    #[test]
    fn docker_config_lookup() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        // base64("bob:s3cret")
        std::fs::write(
            &path,
            r#"{"auths":{"https://127.0.0.1:5000/v1/":{"auth":"Ym9iOnMzY3JldA=="},
                "other.example":{"username":"u","password":"p"}}}"#,
        )
        .unwrap();
        assert_eq!(
            credentials_from_docker_config(&path, "127.0.0.1:5000").unwrap(),
            Some(Credentials::Basic {
                username: "bob".into(),
                password: Secret::new("s3cret")
            })
        );
        assert_eq!(
            credentials_from_docker_config(&path, "other.example").unwrap(),
            Some(Credentials::Basic {
                username: "u".into(),
                password: Secret::new("p")
            })
        );
        assert_eq!(
            credentials_from_docker_config(&path, "127.0.0.1:5001").unwrap(),
            None
        );
        assert_eq!(
            credentials_from_docker_config(&dir.path().join("none.json"), "x").unwrap(),
            None
        );
        std::fs::write(&path, r#"{"auths":{"h":{"auth":"!!"}}}"#).unwrap();
        assert!(credentials_from_docker_config(&path, "h").is_err());
    }
}
