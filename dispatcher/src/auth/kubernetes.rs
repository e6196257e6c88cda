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
//! Decisions are cached briefly ([`POSITIVE_TTL`], [`NEGATIVE_TTL`]) so a busy client costs
//! the API server two reviews per period, not two per request.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};

use super::{AuthError, Verb, unauthenticated};

/// How long an accepted token or an allowed action is trusted without asking again. A
/// revoked RoleBinding or a deleted ServiceAccount takes effect within this.
pub const POSITIVE_TTL: Duration = Duration::from_secs(10);
/// How long a refusal is remembered: short, so a newly granted Role applies quickly, but
/// enough that a client retrying a refused request in a loop does not flood the API server.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(2);
/// Entries per cache. Tokens are the caller's choice, so without a bound a stream of
/// distinct bogus tokens would grow the cache forever; at the bound expired entries are
/// dropped and, if that frees nothing, the whole cache is, which costs only a few reviews.
const MAX_ENTRIES: usize = 4096;

/// The authenticated user, as the TokenReview named it; what the access reviews ask about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct User {
    pub username: String,
    uid: Option<String>,
    groups: Vec<String>,
    extra: BTreeMap<String, Vec<String>>,
}

struct Cache<K, V> {
    entries: HashMap<K, (V, Instant)>,
}

impl<K: Eq + Hash, V: Clone> Cache<K, V> {
    fn new() -> Self {
        Self {
            entries: HashMap::new(),
        }
    }

    fn get(&self, key: &K) -> Option<V> {
        let (value, until) = self.entries.get(key)?;
        (Instant::now() < *until).then(|| value.clone())
    }

    fn put(&mut self, key: K, value: V, ttl: Duration) {
        if self.entries.len() >= MAX_ENTRIES {
            let now = Instant::now();
            self.entries.retain(|_, (_, until)| *until > now);
            if self.entries.len() >= MAX_ENTRIES {
                self.entries.clear();
            }
        }
        self.entries.insert(key, (value, Instant::now() + ttl));
    }
}

/// Who asked to do what to which job (`None`: every job).
type Decision = (User, Verb, Option<String>);

pub struct KubeAuth {
    client: Client,
    audience: String,
    namespace: String,
    group: String,
    /// Keyed by the token's SHA-256, so no token is kept; `None` is a refused token.
    tokens: Mutex<Cache<String, Option<User>>>,
    decisions: Mutex<Cache<Decision, bool>>,
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
            tokens: Mutex::new(Cache::new()),
            decisions: Mutex::new(Cache::new()),
        })
    }

    pub async fn authenticate(&self, token: &str) -> Result<User, AuthError> {
        let key = super::tokens::hash(token);
        let cached = self.tokens.lock().expect("token cache").get(&key);
        let user = match cached {
            Some(user) => user,
            None => {
                let user = self.review_token(token).await?;
                let ttl = if user.is_some() {
                    POSITIVE_TTL
                } else {
                    NEGATIVE_TTL
                };
                self.tokens
                    .lock()
                    .expect("token cache")
                    .put(key, user.clone(), ttl);
                user
            }
        };
        user.ok_or_else(|| {
            unauthenticated(&format!(
                "the bearer token is not a valid, unexpired Kubernetes token for audience {:?}",
                self.audience
            ))
        })
    }

    async fn review_token(&self, token: &str) -> Result<Option<User>, AuthError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                audiences: Some(vec![self.audience.clone()]),
                token: token.to_string(),
            },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
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
            .is_some_and(|a| a.contains(&self.audience));
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
        if let Some(allowed) = self.decisions.lock().expect("decision cache").get(&key) {
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
            .put(key, allowed, ttl);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_expires_and_stays_bounded() {
        let mut cache: Cache<usize, bool> = Cache::new();
        cache.put(0, true, Duration::from_secs(60));
        cache.put(1, false, Duration::ZERO);
        assert_eq!(cache.get(&0), Some(true));
        assert_eq!(cache.get(&1), None, "expired");
        for i in 2..MAX_ENTRIES * 3 {
            cache.put(i, true, Duration::from_secs(60));
            assert!(cache.entries.len() <= MAX_ENTRIES);
        }
    }
}
