//! Step 2b, claims: what a config takes that its namespace's other configs cannot show —
//! its signing Secret and its topics — checked against the API server and the broker
//! before anything is built. A config refused here changes nothing, like one in conflict
//! within its namespace, and gets the same `Conflict` condition.
//!
//! - **Signing Secret.** A config mounts a Secret as its signing key only when the Secret
//!   carries the label [`JOB_LABEL`] naming the config: whoever may write a config cannot
//!   point its dispatchers at another job's key. Only the Secret's metadata is read.
//! - **Topics.** The broker keeps each topic's owner, `namespace/config`, in its owner
//!   registry ([`asyncd_kafka_admin::owners`]). A topic recorded as another namespace's
//!   is refused (`TopicOwnedByOther`); one recorded as another config of this namespace
//!   is taken over, since [`conflicts::resolve`](crate::conflicts::resolve) already made
//!   this config its owner here. A topic that exists without a record was not created by
//!   the operator: it is refused (`TopicNotOwned`) unless the policy adopts such topics,
//!   and an admin assigns it by writing its record. A missing topic is created by the
//!   topic step, which records its owner once the broker says this call created it.

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::core::PartialObjectMeta;

use super::{Context, Error};
use crate::builders::JOB_LABEL;
use crate::conflicts::{Claimed, Conflict};
use crate::crd::AsyncJobConfig;
use crate::kafka::TopicAdmin;
use crate::policy::Policy;

/// What this step refuses a config for (a restarted operator reads their reasons back
/// from the status until the config's next pass).
pub const REFUSALS: [Claimed; 5] = [
    Claimed::Topic,
    Claimed::UnownedTopic,
    Claimed::SigningSecret,
    Claimed::UnlabelledSigningSecret,
    Claimed::MissingSigningSecret,
];

/// How a config is named as a topic's owner on the broker.
pub fn owner_id(config: &AsyncJobConfig) -> String {
    format!("{}/{}", config.namespace(), config.name())
}

/// The claim step: `Ok(Err(conflict))` refuses the config.
pub(super) async fn claim(
    config: &AsyncJobConfig,
    ctx: &Context,
) -> Result<Result<(), Conflict>, Error> {
    if let Some(conflict) = check_signing_secret(config, ctx).await? {
        return Ok(Err(conflict));
    }
    Ok(claim_topics(config, ctx.admin.as_ref(), &ctx.policy).await?)
}

async fn check_signing_secret(
    config: &AsyncJobConfig,
    ctx: &Context,
) -> Result<Option<Conflict>, Error> {
    let Some(signing) = &config.spec.executor.signing else {
        return Ok(None);
    };
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), config.namespace());
    let found = secrets.get_metadata_opt(&signing.secret_ref.name).await?;
    Ok(signing_conflict(
        config,
        &signing.secret_ref.name,
        found.as_ref(),
    ))
}

/// Whether the Secret named as `config`'s signing key may be mounted for it: `None`
/// when it carries [`JOB_LABEL`] with the config's name.
pub fn signing_conflict(
    config: &AsyncJobConfig,
    name: &str,
    found: Option<&PartialObjectMeta<Secret>>,
) -> Option<Conflict> {
    let conflict = |what, owner: &str| Conflict {
        owner: owner.to_string(),
        what,
        value: name.to_string(),
    };
    let Some(secret) = found else {
        return Some(conflict(Claimed::MissingSigningSecret, ""));
    };
    match secret
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(JOB_LABEL))
    {
        Some(job) if job == config.name() => None,
        Some(other) => Some(conflict(Claimed::SigningSecret, other)),
        None => Some(conflict(Claimed::UnlabelledSigningSecret, "")),
    }
}

/// Checks the owner record of each of `config`'s topics, and records the config as the
/// owner of those it takes over. The records are read once, and nothing is written
/// unless every topic may be taken.
pub async fn claim_topics(
    config: &AsyncJobConfig,
    admin: &dyn TopicAdmin,
    policy: &Policy,
) -> Result<Result<(), Conflict>, crate::kafka::TopicError> {
    let topics = config.topics();
    if topics.is_empty() {
        return Ok(Ok(()));
    }
    let me = owner_id(config);
    let owners = admin.owners().await?;
    let mut take = Vec::new();
    for topic in topics {
        match owners.get(&topic) {
            Some(owner) if *owner == me => {}
            Some(owner) if owner.split_once('/').map(|(ns, _)| ns) == Some(config.namespace()) => {
                take.push(topic)
            }
            Some(owner) => {
                return Ok(Err(Conflict {
                    owner: owner.clone(),
                    what: Claimed::Topic,
                    value: topic,
                }));
            }
            // missing: the topic step creates it and records the owner
            None if admin.partitions(&topic).await?.is_none() => {}
            None if policy.adopt_unowned_topics => take.push(topic),
            None => {
                return Ok(Err(Conflict {
                    owner: String::new(),
                    what: Claimed::UnownedTopic,
                    value: topic,
                }));
            }
        }
    }
    for topic in take {
        admin.set_owner(&topic, Some(&me)).await?;
    }
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::fixtures;
    use crate::kafka::fake::FakeAdmin;

    fn secret_labelled(job: Option<&str>) -> PartialObjectMeta<Secret> {
        let mut meta = PartialObjectMeta::<Secret>::default();
        meta.metadata.name = Some("key".into());
        meta.metadata.labels =
            job.map(|j| BTreeMap::from([(JOB_LABEL.to_string(), j.to_string())]));
        meta
    }

    #[test]
    fn a_signing_secret_is_mounted_only_when_labelled_for_the_config() {
        let config = fixtures::config("job-a");
        let ours = secret_labelled(Some("job-a"));
        assert_eq!(signing_conflict(&config, "key", Some(&ours)), None);
        let theirs = secret_labelled(Some("job-b"));
        let c = signing_conflict(&config, "key", Some(&theirs)).unwrap();
        assert_eq!(
            (c.reason(), c.owner.as_str()),
            ("SigningSecretOwnedByOther", "job-b")
        );
        assert!(c.message().contains("\"key\""), "{}", c.message());
        let bare = secret_labelled(None);
        let c = signing_conflict(&config, "key", Some(&bare)).unwrap();
        assert_eq!(c.reason(), "SigningSecretNotLabelled");
        assert!(c.message().contains(JOB_LABEL), "{}", c.message());
        let c = signing_conflict(&config, "key", None).unwrap();
        assert_eq!(c.reason(), "SigningSecretMissing");
    }

    fn admin_with(topics: &[&str], owners: &[(&str, &str)]) -> FakeAdmin {
        let admin = FakeAdmin::default();
        for t in topics {
            admin.topics.lock().unwrap().insert(t.to_string(), 6);
        }
        for (t, o) in owners {
            admin
                .owners
                .lock()
                .unwrap()
                .insert(t.to_string(), o.to_string());
        }
        admin
    }

    async fn claim_of(admin: &FakeAdmin, policy: &Policy) -> Result<(), Conflict> {
        claim_topics(&fixtures::config("a"), admin, policy)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_topic_recorded_as_another_namespaces_is_refused_and_nothing_written() {
        let admin = admin_with(
            &["topic", "topic-high"],
            &[("topic", "shop/a"), ("topic-high", "other/b")],
        );
        let c = claim_of(&admin, &Policy::default()).await.unwrap_err();
        assert_eq!(
            (c.reason(), c.owner.as_str(), c.value.as_str()),
            ("TopicOwnedByOther", "other/b", "topic-high")
        );
        assert!(c.message().contains("\"other/b\""), "{}", c.message());
        assert!(admin.calls.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn own_records_pass_and_this_namespaces_are_taken_over() {
        let admin = admin_with(
            &["topic", "topic-high"],
            &[("topic", "shop/a"), ("topic-high", "shop/gone")],
        );
        claim_of(&admin, &Policy::default()).await.unwrap();
        assert_eq!(*admin.calls.lock().unwrap(), ["own topic-high shop/a"]);
        assert_eq!(admin.owners.lock().unwrap()["topic-high"], "shop/a");
    }

    #[tokio::test]
    async fn an_existing_topic_without_a_record_is_refused_unless_adopted() {
        let admin = admin_with(&["topic"], &[]);
        let c = claim_of(&admin, &Policy::default()).await.unwrap_err();
        assert_eq!((c.reason(), c.value.as_str()), ("TopicNotOwned", "topic"));
        assert!(admin.owners.lock().unwrap().is_empty());
        let adopt = Policy {
            adopt_unowned_topics: true,
            ..Policy::default()
        };
        claim_of(&admin, &adopt).await.unwrap();
        // the missing high-priority topic is left to the topic step, which records it
        assert_eq!(*admin.calls.lock().unwrap(), ["own topic shop/a"]);
    }
}
