//! The one authorization path of every request (pull, push, HEAD, mirrors): the `Authorization`
//! header by the distribution token flow, and [`Endpoint::send`], which sends a request with it
//! and answers a `401` that names a token service. Every token answer is read with a cap
//! ([`crate::http::read_capped`]): a token service that never stops answering costs at most
//! [`TOKEN_BODY_CAP`] bytes.
//!
//! A CAPH bearer token is sent as is. Otherwise `GET /v2/` says what the registry wants: no
//! challenge (or a `Basic` one) means basic credentials, if there are any; a `Bearer` challenge
//! names the token service (`realm`), asked for a token of the repository ([`Access`]: `pull`,
//! or `pull,push`) with the basic credentials. A request answered `401` with a `Bearer`
//! challenge (a token that expired, a repository served by another token service than `/v2/`
//! names) gets a token from that challenge's realm and is sent once more. A realm that is not an
//! `http(s)` URL is refused for good.

use base64::Engine;
use reqwest::header::{HeaderValue, AUTHORIZATION, WWW_AUTHENTICATE};
use serde::Deserialize;
use tokio::time::Instant;

use crate::auth::Credentials;
use crate::client::Endpoint;
use crate::error::{Cause, RegistryError};
use crate::http::{error_answer, read_capped, Capped, SMALL_BODY_DEADLINE, TOKEN_BODY_CAP};
use crate::reference::RegistryRef;
use crate::retry::{classify_http, Failure};

/// A token service's answer (docker's `token`, OAuth2's `access_token`).
#[derive(Deserialize)]
struct TokenAnswer {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
}

/// What a request does in a repository: the actions of its token's scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Manifests, blobs and HEAD requests.
    Pull,
    /// Uploads (a push token also reads, which the blob checks of an upload need).
    Push,
}

impl Access {
    fn actions(self) -> &'static str {
        match self {
            Access::Pull => "pull",
            Access::Push => "pull,push",
        }
    }
}

/// The parameters of a `Bearer` challenge.
struct Challenge {
    realm: String,
    service: Option<String>,
}

/// The first `Bearer` challenge with a realm in a `WWW-Authenticate` value.
fn bearer_challenge(value: &str) -> Option<Challenge> {
    http_auth::ChallengeParser::new(value)
        .filter_map(Result::ok)
        .filter(|c| c.scheme.eq_ignore_ascii_case("bearer"))
        .find_map(|c| {
            let param = |name: &str| {
                c.params
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.to_unescaped())
            };
            Some(Challenge {
                realm: param("realm")?,
                service: param("service"),
            })
        })
}

/// The `Bearer` challenge of an answer's `WWW-Authenticate`, if it has one.
fn challenge_of(answer: &reqwest::Response) -> Option<Challenge> {
    answer
        .headers()
        .get(WWW_AUTHENTICATE)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_challenge)
}

fn with_authorization(
    request: reqwest::RequestBuilder,
    authorization: Option<HeaderValue>,
) -> reqwest::RequestBuilder {
    match authorization {
        Some(a) => request.header(AUTHORIZATION, a),
        None => request,
    }
}

fn header(value: String) -> Result<Option<HeaderValue>, Failure> {
    let mut value = HeaderValue::from_str(&value).map_err(|_| {
        Failure::Fatal(RegistryError::Protocol(
            "a credential is not header-safe".to_owned(),
        ))
    })?;
    value.set_sensitive(true);
    Ok(Some(value))
}

impl Endpoint {
    /// The basic credentials as a header value, if there are any.
    fn basic(&self) -> Result<Option<HeaderValue>, Failure> {
        match &self.auth.credentials {
            Credentials::Basic { username, password } => {
                let pair = format!("{username}:{}", password.expose());
                header(format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(pair)
                ))
            }
            _ => Ok(None),
        }
    }

    /// Sends the request `build` makes, with the `Authorization` for `access` to `reference`'s
    /// repository. A `401` naming a `Bearer` token service gets a token from it and the request
    /// once more (`build` is called again). Returns the answer, whatever its status, and the
    /// `Authorization` it was sent with (an upload's next requests carry it too).
    pub(crate) async fn send(
        &self,
        reference: &RegistryRef,
        access: Access,
        what: &str,
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<(reqwest::Response, Option<HeaderValue>), Failure> {
        let ctx = self.ctx();
        let authorization = self.authorization(reference, access).await?;
        let answer = with_authorization(build(), authorization.clone())
            .send()
            .await
            .map_err(|e| classify_http(&ctx, what, e))?;
        let challenge = match (&self.auth.credentials, answer.status()) {
            // A token given as is cannot be renewed here.
            (Credentials::Bearer(_), _) => None,
            (_, reqwest::StatusCode::UNAUTHORIZED) => challenge_of(&answer),
            _ => None,
        };
        let Some(challenge) = challenge else {
            return Ok((answer, authorization));
        };
        drop(answer);
        let authorization = self.token(reference, &challenge, access).await?;
        let answer = with_authorization(build(), authorization.clone())
            .send()
            .await
            .map_err(|e| classify_http(&ctx, what, e))?;
        Ok((answer, authorization))
    }

    /// `Authorization` for `access` to `reference`'s repository: a bearer token (the given one,
    /// or one from the registry's token service), else the basic credentials, else none.
    pub(crate) async fn authorization(
        &self,
        reference: &RegistryRef,
        access: Access,
    ) -> Result<Option<HeaderValue>, Failure> {
        if let Credentials::Bearer(t) = &self.auth.credentials {
            return header(format!("Bearer {}", t.expose()));
        }
        let ctx = self.ctx();
        let what = format!("{}: the registry's /v2/ endpoint", self.registry);
        let ping = format!("{}://{}/v2/", self.transport.scheme, self.registry);
        // Only the headers are wanted; the body is never read.
        let answer = self
            .transport
            .http
            .get(&ping)
            .send()
            .await
            .map_err(|e| classify_http(&ctx, &what, e))?;
        let challenge = challenge_of(&answer);
        drop(answer);
        let Some(challenge) = challenge else {
            return self.basic();
        };
        self.token(reference, &challenge, access).await
    }

    /// A token for `access` from the token service `challenge` names.
    async fn token(
        &self,
        reference: &RegistryRef,
        challenge: &Challenge,
        access: Access,
    ) -> Result<Option<HeaderValue>, Failure> {
        let ctx = self.ctx();
        let realm = ctx.text(challenge.realm.as_bytes());
        let what = format!("{}: the token service {realm}", self.registry);
        let mut url = match reqwest::Url::parse(&challenge.realm) {
            Ok(url) if matches!(url.scheme(), "http" | "https") => url,
            _ => {
                return Err(Failure::Fatal(RegistryError::Refused {
                    what: format!("{what}: the registry's token realm is not an http(s) URL"),
                    cause: Cause::Answer(format!("WWW-Authenticate realm=\"{realm}\"")),
                }))
            }
        };
        let scope = format!("repository:{}:{}", reference.repository, access.actions());
        url.query_pairs_mut().append_pair("scope", &scope);
        if let Some(s) = &challenge.service {
            url.query_pairs_mut().append_pair("service", s);
        }
        let mut request = self.transport.http.get(url);
        if let Some(basic) = self.basic()? {
            request = request.header(AUTHORIZATION, basic);
        }
        let mut answer = request
            .send()
            .await
            .map_err(|e| classify_http(&ctx, &what, e))?;
        if !answer.status().is_success() {
            return Err(match error_answer(&ctx, &what, answer).await {
                // Any refusal by the token service is about the credentials.
                Failure::Fatal(_) | Failure::Transient(Cause::Status { .. }) => {
                    ctx.auth_failed(format!("the token service {realm} refused"))
                }
                other => other,
            });
        }
        let deadline = Instant::now() + SMALL_BODY_DEADLINE;
        let body = match read_capped(&mut answer, TOKEN_BODY_CAP, deadline).await {
            Ok(body) => body,
            Err(Capped::TooLarge) => {
                return Err(Failure::Transient(Cause::BodyTooLarge {
                    what: format!("answer of the token service {realm}"),
                    cap: TOKEN_BODY_CAP,
                }))
            }
            Err(Capped::TooSlow) => {
                return Err(Failure::Transient(Cause::TooSlow(format!(
                    "the token service {realm} did not answer within {SMALL_BODY_DEADLINE:?}"
                ))))
            }
            Err(Capped::Http(e)) => return Err(classify_http(&ctx, &what, e)),
        };
        let parsed: TokenAnswer = serde_json::from_slice(&body).map_err(|e| {
            Failure::Fatal(RegistryError::Decode {
                what: format!("{what}: its answer is not a token"),
                source: e,
            })
        })?;
        let Some(token) = parsed.token.or(parsed.access_token) else {
            return Err(Failure::Fatal(RegistryError::Protocol(format!(
                "{what}: its answer has no token"
            ))));
        };
        self.scrubber.add(token.clone());
        header(format!("Bearer {token}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bearer_challenge_is_found_among_others() {
        let c = bearer_challenge(
            r#"Basic realm="x", Bearer realm="https://auth.example/token",service="reg""#,
        )
        .unwrap();
        assert_eq!(c.realm, "https://auth.example/token");
        assert_eq!(c.service.as_deref(), Some("reg"));
        assert!(bearer_challenge(r#"Basic realm="registry""#).is_none());
        assert!(bearer_challenge("Bearer service=\"no realm\"").is_none());
    }
}
