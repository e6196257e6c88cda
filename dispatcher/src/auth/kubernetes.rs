//! `--auth kubernetes`: the bearer token is a ServiceAccount (or any other Kubernetes)
//! token, validated with a TokenReview bound to `--auth-audience`; each action is a
//! SubjectAccessReview on the job's AsyncJobConfig in its namespace, so a team grants
//! access with an ordinary Role and RoleBinding and `kubectl auth can-i` answers the same:
//!
//! | action | verb | resource (group `asyncd.example.io`) |
//! |---|---|---|
//! | submit | `create` | `asyncjobconfigs/tasks` |
//! | read a task | `get` | `asyncjobconfigs/tasks` |
//! | cancel | `delete` | `asyncjobconfigs/tasks` |
//! | list dead letters | `list` | `asyncjobconfigs/deadletters` |
//! | redrive | `update` | `asyncjobconfigs/deadletters` |
//! | pause or resume the job | `update` | `asyncjobconfigs/pause` |
//! | read whether the job is paused | `get` | `asyncjobconfigs/tasks` |
//!
//! The resource name is the AsyncJobConfig's name; "every job" is a review without a
//! name, which RBAC grants only to a rule without `resourceNames`.
//!
//! Answers are cached briefly ([`POSITIVE_TTL`], [`NEGATIVE_TTL`]) so a busy client costs
//! the API server two reviews per period, not two per request; what a flood of tokens
//! may cost it is bounded in [`super::token_reviews`].

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};

pub use super::token_reviews::{NEGATIVE_TTL, POSITIVE_TTL};
use super::token_reviews::{TokenReviews, TtlCache};
use super::{AuthError, Verb, unauthenticated};

/// Access decisions kept. Only authenticated users reach them, each with the jobs it
/// names; past the bound the decision closest to expiry goes and costs one review later.
const MAX_DECISIONS: usize = 4096;

/// The authenticated user, as the TokenReview named it; what the access reviews ask about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct User {
    pub username: String,
    uid: Option<String>,
    groups: Vec<String>,
    extra: BTreeMap<String, Vec<String>>,
}

/// Who asked to do what to which job (`None`: every job).
type Decision = (User, Verb, Option<String>);

pub struct KubeAuth {
    client: Client,
    audience: String,
    namespace: String,
    group: String,
    /// Keyed by the token's SHA-256, so no token is kept.
    tokens: TokenReviews<User>,
    decisions: Mutex<TtlCache<Decision, bool>>,
}

fn unavailable(what: &'static str, err: kube::Error) -> AuthError {
    tracing::error!(%err, "{what} failed");
    AuthError::Unavailable(what)
}

impl KubeAuth {
    /// Connects as the process's own identity (in a pod its ServiceAccount, which needs
    /// `create` on `tokenreviews` and `subjectaccessreviews`). `namespace` is the jobs'
    /// namespace: the routing ConfigMap's.
    pub async fn connect(audience: String, namespace: String) -> Result<Self, kube::Error> {
        let client = Client::try_default().await?;
        let group = asyncd_spec::job::API_VERSION
            .split_once('/')
            .map_or(asyncd_spec::job::API_VERSION, |(group, _)| group)
            .to_string();
        tracing::info!(%audience, %namespace, "authenticating callers with TokenReview and SubjectAccessReview");
        Ok(Self {
            client,
            audience,
            namespace,
            group,
            tokens: TokenReviews::new(Arc::new(Instant::now)),
            decisions: Mutex::new(TtlCache::new(MAX_DECISIONS)),
        })
    }

    /// The token's user; `source`, the caller's address, pays for a review the cache
    /// cannot spare (429 when it is over its rate).
    pub async fn authenticate(
        &self,
        token: &str,
        source: Option<IpAddr>,
    ) -> Result<User, AuthError> {
        let key = super::tokens::hash(token);
        let review = Self::review_token(
            self.client.clone(),
            self.audience.clone(),
            token.to_string(),
        );
        let user = self.tokens.user(&key, source, review).await?;
        user.ok_or_else(|| {
            unauthenticated(&format!(
                "the bearer token is not a valid, unexpired Kubernetes token for audience {:?}",
                self.audience
            ))
        })
    }

    async fn review_token(
        client: Client,
        audience: String,
        token: String,
    ) -> Result<Option<User>, AuthError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                audiences: Some(vec![audience.clone()]),
                token,
            },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(client);
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| unavailable("token review", e))?;
        let Some(status) = answer.status else {
            return Ok(None);
        };
        // The API server checks the audience itself; a token it accepted for another
        // audience (an authenticator that ignores audiences) is refused here.
        let for_us = status
            .audiences
            .as_ref()
            .is_some_and(|a| a.contains(&audience));
        if status.authenticated != Some(true) || !for_us {
            tracing::info!(
                error = status.error.as_deref().unwrap_or(""),
                "token refused by TokenReview"
            );
            return Ok(None);
        }
        let Some(info) = status.user else {
            return Ok(None);
        };
        Ok(Some(User {
            username: info.username.unwrap_or_default(),
            uid: info.uid,
            groups: info.groups.unwrap_or_default(),
            extra: info.extra.unwrap_or_default(),
        }))
    }

    pub async fn allows(
        &self,
        user: &User,
        verb: Verb,
        job: Option<&str>,
    ) -> Result<bool, AuthError> {
        let key = (user.clone(), verb, job.map(str::to_string));
        if let Some(allowed) = self
            .decisions
            .lock()
            .expect("decision cache")
            .get(&key, Instant::now())
        {
            return Ok(allowed);
        }
        let (verb_name, subresource) = rbac(verb);
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.username.clone()),
                uid: user.uid.clone(),
                groups: Some(user.groups.clone()),
                extra: Some(user.extra.clone()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(self.group.clone()),
                    resource: Some("asyncjobconfigs".into()),
                    subresource: Some(subresource.into()),
                    verb: Some(verb_name.into()),
                    namespace: Some(self.namespace.clone()),
                    name: job.map(str::to_string),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| unavailable("access review", e))?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        let ttl = if allowed { POSITIVE_TTL } else { NEGATIVE_TTL };
        self.decisions
            .lock()
            .expect("decision cache")
            .put(key, allowed, ttl, Instant::now());
        Ok(allowed)
    }
}

/// The RBAC verb and subresource of `asyncjobconfigs` an action needs.
pub fn rbac(verb: Verb) -> (&'static str, &'static str) {
    match verb {
        Verb::Submit => ("create", "tasks"),
        Verb::Get => ("get", "tasks"),
        Verb::Cancel => ("delete", "tasks"),
        Verb::ListDeadLetters => ("list", "deadletters"),
        Verb::Redrive => ("update", "deadletters"),
        Verb::Purge => ("delete", "deadletters"),
        Verb::Pause => ("update", "pause"),
    }
}
