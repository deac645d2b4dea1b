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
use serde::Deserialize;

use crate::error::RegistryError;

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
    /// `--authfile`: a docker `config.json` to read instead of the environment's.
    pub authfile: Option<PathBuf>,
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

/// The part of a docker `config.json` that names credential helpers, read only to name the
/// helper in an error (`docker_credential` does the lookup itself).
#[derive(Deserialize, Default)]
struct HelperNames {
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
    #[serde(default, rename = "credHelpers")]
    cred_helpers: std::collections::BTreeMap<String, String>,
}

impl HelperNames {
    fn for_registry(&self, registry: &str) -> Option<String> {
        self.cred_helpers
            .get(registry)
            .or(self.creds_store.as_ref())
            .filter(|h| !h.is_empty())
            .map(|h| format!("docker-credential-{h}"))
    }
}

/// What docker's credential helpers print when they hold nothing for a registry
/// (`docker-credential-helpers`' `ErrCredentialsNotFound`). Docker, skopeo and oras then go on
/// anonymously, and so does ingot; every other helper failure is an error.
const HELPER_NOT_FOUND: &str = "credentials not found";

/// `$DOCKER_CONFIG/config.json`, else `$HOME/.docker/config.json`.
pub fn docker_config_path() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".docker/config.json"))
}

/// Look `registry` up in a docker `config.json` (or a containers `auth.json`, the same format):
/// `credHelpers[registry]`, then the `auths` entry, then `credsStore`, as docker does. A missing
/// file is `None`; a helper that cannot be run or fails is an error, never anonymous.
///
/// The lookup and the helper protocol (`docker-credential-NAME get`, the registry on stdin, JSON
/// `{"Username","Secret"}` on stdout) are the `docker_credential` crate's.
pub fn credentials_from_docker_config(
    path: &Path,
    registry: &str,
) -> Result<Option<Credentials>, RegistryError> {
    use docker_credential::{CredentialRetrievalError as E, DockerCredential};
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(RegistryError::io(path)(e)),
    };
    let not_config = |source| RegistryError::DockerConfig {
        path: path.to_owned(),
        source,
    };
    let names: HelperNames = serde_json::from_slice(&text).map_err(|e| RegistryError::Decode {
        what: format!("{}: not a docker config file", path.display()),
        source: e,
    })?;
    let helper = names
        .for_registry(registry)
        .unwrap_or_else(|| "the credential helper".to_owned());
    let bad = |why: String| {
        RegistryError::Protocol(format!(
            "{}: the `auths` entry for {registry} {why}",
            path.display()
        ))
    };
    let helper_failed = |detail: String| RegistryError::Auth {
        registry: registry.to_owned(),
        source_desc: format!("{helper} named by {}", path.display()),
        detail,
    };
    match docker_credential::get_credential_from_reader(text.as_slice(), registry) {
        Ok(DockerCredential::UsernamePassword(username, password)) => {
            Ok(Some(Credentials::Basic {
                username,
                password: Secret::new(password),
            }))
        }
        // An OAuth2 refresh token; registries exchange it at their token endpoint (a POST
        // ingot does not make yet), so say so instead of failing obscurely.
        Ok(DockerCredential::IdentityToken(_)) => Err(bad(
            "holds an identity token, which ingot does not support; use --username and \
             --password-stdin"
                .to_owned(),
        )),
        Err(E::NoCredentialConfigured) => Ok(None),
        Err(e @ E::ConfigReadError) => Err(not_config(e)),
        Err(E::CredentialDecodingError) => Err(bad(
            "has an `auth` field that is not base64 of user:password".to_owned(),
        )),
        Err(E::CredentialMismatchError) => Err(bad(
            "has an `auth` field that disagrees with its username and password".to_owned(),
        )),
        Err(E::HelperFailure { stdout, stderr, .. }) => {
            let said = format!("{} {}", stdout.trim(), stderr.trim());
            if said.to_lowercase().contains(HELPER_NOT_FOUND) {
                tracing::info!("{helper} holds no credentials for {registry}: anonymous");
                return Ok(None);
            }
            Err(helper_failed(format!(
                "{helper} failed: {}",
                clip(said.trim())
            )))
        }
        Err(E::HelperCommunicationError) => Err(helper_failed(if on_path(&helper) {
            format!("{helper} stopped before it read the registry name, or could not be run")
        } else {
            format!("could not run {helper}: it is not on PATH")
        })),
        Err(E::MalformedHelperResponse) => Err(helper_failed(format!(
            "{helper} did not print {{\"Username\":…,\"Secret\":…}}"
        ))),
        Err(e @ E::ConfigNotFound) => Err(not_config(e)),
    }
}

/// Whether an executable `name` is in a directory of `PATH`.
fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(name).is_file()))
}

/// At most 300 characters of a helper's message, on one line.
fn clip(s: &str) -> String {
    let one_line = s.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(300) {
        Some((i, _)) => format!("{}…", &one_line[..i]),
        None => one_line,
    }
}

/// The credentials for a host other than the one the user named (a mirror, a rewritten
/// location): only what docker's files (`--authfile`, else `$DOCKER_CONFIG/config.json` or
/// `~/.docker/config.json`) hold for that host, so that the command line's and
/// `OCI_REGISTRY_AUTH_TOKEN`'s credentials never reach another host.
pub fn resolve_for_mirror(
    registry: &str,
    explicit: &ExplicitAuth,
) -> Result<ResolvedAuth, RegistryError> {
    let path = match &explicit.authfile {
        Some(p) => Some(p.clone()),
        None => docker_config_path(),
    };
    if let Some(path) = path {
        if let Some(credentials) = credentials_from_docker_config(&path, registry)? {
            return Ok(ResolvedAuth {
                credentials,
                source: format!("{} (entry for {registry})", path.display()),
            });
        }
    }
    Ok(ResolvedAuth {
        credentials: Credentials::Anonymous,
        source: format!("anonymous (nothing for {registry} in docker's config)"),
    })
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
    if let Some(path) = &explicit.authfile {
        if !path.is_file() {
            return Err(RegistryError::Reference(format!(
                "--authfile {}: no such file",
                path.display()
            )));
        }
        let credentials = credentials_from_docker_config(path, registry)?;
        return Ok(ResolvedAuth {
            source: match credentials {
                Some(_) => format!("--authfile {}", path.display()),
                None => format!("anonymous (nothing for {registry} in {})", path.display()),
            },
            credentials: credentials.unwrap_or(Credentials::Anonymous),
        });
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
