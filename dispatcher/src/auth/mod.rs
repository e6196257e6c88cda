//! Authentication and authorization of API callers (docs/security.md).
//!
//! Three modes (`--auth`): `none` (every caller may do everything; only on loopback
//! listeners unless `--insecure-no-auth`), `tokens` (hashed API tokens from a file, each
//! scoped to jobs and verbs; [`tokens`]) and `kubernetes` (ServiceAccount tokens checked
//! with TokenReview, actions with SubjectAccessReview against RBAC on the job;
//! [`kubernetes`]). Handlers take a [`Caller`] (which answers 401 when the request carries
//! no acceptable credential) and ask [`Auth::allows`] before touching a job's tasks.
//! A refusal is an [`AuthError`]; the API turns it into its HTTP answer.

pub mod kubernetes;
mod token_reviews;
pub mod tokens;

use std::net::{IpAddr, SocketAddr};

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;

/// What a caller wants to do, on one job's tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    /// `POST /v1/tasks`, `POST /v1/tasks:batch`.
    Submit,
    /// `GET /v1/tasks/{id}`.
    Get,
    /// `GET /v1/dead-letters`.
    ListDeadLetters,
    /// `DELETE /v1/tasks/{id}`.
    Cancel,
    /// `POST /v1/dead-letters/{id}/redrive`, `POST /v1/dead-letters/redrive`.
    Redrive,
    /// `POST /v1/dead-letters/purge`.
    Purge,
    /// `POST /v1/jobs/{name}/pause` and `…/resume`.
    Pause,
}

impl Verb {
    /// How a refusal names the action.
    fn describe(self) -> &'static str {
        match self {
            Verb::Submit => "submit tasks of",
            Verb::Get => "read tasks of",
            Verb::ListDeadLetters => "list dead letters of",
            Verb::Cancel => "cancel tasks of",
            Verb::Redrive => "redrive dead letters of",
            Verb::Pause => "pause or resume",
            Verb::Purge => "purge dead letters of",
        }
    }
}

/// Why a caller was refused, or could not be checked. Each message is the whole answer
/// the caller reads, so it names the header, the action or the service at fault.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    /// No acceptable credential: 401.
    #[error("Authorization: {0}")]
    Unauthenticated(String),
    /// Authenticated, but not allowed `verb` on `job` (`None`: every job): 403.
    #[error("not allowed to {} {}", .verb.describe(), scope(.job.as_deref()))]
    Forbidden { verb: Verb, job: Option<String> },
    /// The Kubernetes API did not answer the named review, so nobody can be checked: 503.
    #[error("the Kubernetes API did not answer the {0}; retry")]
    Unavailable(&'static str),
    /// `--auth kubernetes`: this address sent more new tokens than it may have reviewed
    /// (`token_reviews`): 429.
    #[error("Authorization: too many new bearer tokens from {0}; retry in a second")]
    RateLimited(IpAddr),
}

/// How a refusal names the jobs it was about.
fn scope(job: Option<&str>) -> String {
    match job {
        Some(job) => format!("job {job}"),
        None => "every job (name a task type to narrow the request)".into(),
    }
}

/// An authenticated caller.
#[derive(Debug, Clone)]
pub enum Caller {
    /// `--auth none`: everything is allowed.
    Anyone,
    /// `--auth tokens`: the matching token's grants.
    Token(std::sync::Arc<tokens::Grant>),
    /// `--auth kubernetes`: the user the TokenReview named.
    Kubernetes(kubernetes::User),
}

impl Caller {
    /// For logs: who it is, never the credential.
    pub fn name(&self) -> &str {
        match self {
            Caller::Anyone => "anyone",
            Caller::Token(grant) => &grant.name,
            Caller::Kubernetes(user) => &user.username,
        }
    }
}

pub enum Auth {
    None,
    Tokens(tokens::TokenFile),
    Kubernetes(Box<kubernetes::KubeAuth>),
}

impl Auth {
    /// The caller the request's `Authorization: Bearer` credential names, or 401.
    /// `source` is the peer's address, which TokenReviews are rate-limited by.
    pub async fn authenticate(
        &self,
        headers: &HeaderMap,
        source: Option<IpAddr>,
    ) -> Result<Caller, AuthError> {
        match self {
            Auth::None => Ok(Caller::Anyone),
            Auth::Tokens(file) => file.authenticate(bearer(headers)?).map(Caller::Token),
            Auth::Kubernetes(kube) => kube
                .authenticate(bearer(headers)?, source)
                .await
                .map(Caller::Kubernetes),
        }
    }

    /// Whether `caller` may do `verb` on `job` (an AsyncJobConfig name); `None` means
    /// every job (a dead-letter listing of all types, a task whose job is gone), which only
    /// a caller allowed on all jobs passes.
    pub async fn allows(
        &self,
        caller: &Caller,
        verb: Verb,
        job: Option<&str>,
    ) -> Result<bool, AuthError> {
        match (self, caller) {
            (_, Caller::Anyone) => Ok(true),
            (_, Caller::Token(grant)) => Ok(grant.allows(verb, job)),
            (Auth::Kubernetes(kube), Caller::Kubernetes(user)) => {
                kube.allows(user, verb, job).await
            }
            (_, Caller::Kubernetes(_)) => Ok(false),
        }
    }

    /// `Ok` when allowed, else `403 forbidden` naming the action and the job.
    pub async fn require(
        &self,
        caller: &Caller,
        verb: Verb,
        job: Option<&str>,
    ) -> Result<(), AuthError> {
        if self.allows(caller, verb, job).await? {
            return Ok(());
        }
        tracing::info!(caller = caller.name(), ?verb, job, "forbidden");
        Err(forbidden(verb, job))
    }
}

pub fn forbidden(verb: Verb, job: Option<&str>) -> AuthError {
    AuthError::Forbidden {
        verb,
        job: job.map(str::to_string),
    }
}

pub fn unauthenticated(why: &str) -> AuthError {
    AuthError::Unauthenticated(why.to_string())
}

fn bearer(headers: &HeaderMap) -> Result<&str, AuthError> {
    let value = headers
        .get(AUTHORIZATION)
        .ok_or_else(|| unauthenticated("a bearer token is required"))?;
    let text = value
        .to_str()
        .map_err(|_| unauthenticated("must be \"Bearer <token>\""))?;
    let (scheme, token) = text
        .split_once(' ')
        .ok_or_else(|| unauthenticated("must be \"Bearer <token>\""))?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(unauthenticated("must be \"Bearer <token>\""));
    }
    Ok(token)
}

/// `--auth none` on a listener other than loopback serves every team's tasks to anyone who
/// can reach the port: refused unless the operator said `--insecure-no-auth`.
pub fn check_no_auth(listen: SocketAddr, insecure: bool) -> Result<(), String> {
    if listen.ip().is_loopback() {
        return Ok(());
    }
    if insecure {
        tracing::warn!(
            %listen,
            "serving the API without authentication on a non-loopback address (--insecure-no-auth): \
             anyone who can reach it may submit, read, cancel and redrive every job's tasks"
        );
        return Ok(());
    }
    Err(format!(
        "--auth none on {listen}, which is not a loopback address, would let anyone who can reach \
         it submit, read, cancel and redrive every job's tasks; use --auth tokens or --auth \
         kubernetes, listen on 127.0.0.1, or pass --insecure-no-auth to accept that"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_auth_is_refused_off_loopback_unless_insecure() {
        let any: SocketAddr = "0.0.0.0:7700".parse().unwrap();
        let lan: SocketAddr = "10.0.0.5:7700".parse().unwrap();
        for ok in ["127.0.0.1:7700", "[::1]:7700", "127.0.0.2:0"] {
            check_no_auth(ok.parse().unwrap(), false).unwrap();
        }
        for refused in [any, lan, "[::]:7700".parse().unwrap()] {
            let err = check_no_auth(refused, false).unwrap_err();
            assert!(err.contains("--insecure-no-auth"), "{err}");
        }
        check_no_auth(any, true).unwrap();
    }

    #[test]
    fn only_a_bearer_credential_is_read() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(AUTHORIZATION, value.parse().unwrap());
            headers
        };
        assert_eq!(bearer(&with("Bearer abc")).unwrap(), "abc");
        assert_eq!(bearer(&with("bearer  abc ")).unwrap(), "abc");
        for bad in ["Basic abc", "Bearer", "Bearer  ", "abc"] {
            let err = bearer(&with(bad)).unwrap_err();
            assert_eq!(err, unauthenticated("must be \"Bearer <token>\""), "{bad}");
        }
        let err = bearer(&HeaderMap::new()).unwrap_err();
        assert_eq!(err, unauthenticated("a bearer token is required"));
    }
}
