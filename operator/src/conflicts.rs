//! Who owns a task type and a Kafka topic when several configs in a namespace claim them.
//!
//! Configs are taken oldest first (creationTimestamp, then name). Each takes its task type
//! and topics (its topic and its high-priority topic, `{topic}-high`) unless an earlier
//! *owner* already holds one of them; then it is in conflict, names that owner, and the
//! operator changes nothing for it — no topic, no route, no Deployment — so deleting it
//! can never touch the owner's topics. A config in conflict claims nothing, so it never
//! blocks a third one. A config being deleted keeps its claims until its finalizer is
//! gone, so no newer config takes its topics while its cleanup runs.
//!
//! What a namespace's configs cannot see of each other is settled elsewhere, with the
//! same [`Conflict`]: a topic recorded on the broker as another namespace's, or that
//! exists without an owner record ([`crate::controller`]'s claim step), and a signing
//! Secret not labelled for the config.

use std::collections::{BTreeMap, HashMap};

use crate::crd::AsyncJobConfig;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    Owner,
    Conflict(Conflict),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The config that holds what this one claims: its name in this namespace,
    /// `namespace/name` for a topic recorded as another namespace's, empty when nobody
    /// does.
    pub owner: String,
    pub what: Claimed,
    /// The task type, topic or Secret claimed.
    pub value: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claimed {
    TaskType,
    Topic,
    /// A topic that exists without an owner record: the operator did not create it.
    UnownedTopic,
    /// A signing Secret labelled for another config (`owner`).
    SigningSecret,
    /// A signing Secret without the label naming its config.
    UnlabelledSigningSecret,
    /// A signing Secret that does not exist, so its label cannot be checked.
    MissingSigningSecret,
}

impl Claimed {
    /// The `Conflict` condition's reason.
    pub fn reason(self) -> &'static str {
        match self {
            Claimed::TaskType => "TaskTypeOwnedByOther",
            Claimed::Topic => "TopicOwnedByOther",
            Claimed::UnownedTopic => "TopicNotOwned",
            Claimed::SigningSecret => "SigningSecretOwnedByOther",
            Claimed::UnlabelledSigningSecret => "SigningSecretNotLabelled",
            Claimed::MissingSigningSecret => "SigningSecretMissing",
        }
    }
}

impl Conflict {
    pub fn reason(&self) -> &'static str {
        self.what.reason()
    }

    pub fn message(&self) -> String {
        let value = &self.value;
        let owner = &self.owner;
        let label = crate::builders::JOB_LABEL;
        let tail = "this config changes nothing until";
        match self.what {
            Claimed::TaskType | Claimed::Topic => {
                let what = if self.what == Claimed::TaskType {
                    "task type"
                } else {
                    "Kafka topic"
                };
                format!(
                    "{what} {value:?} is owned by AsyncJobConfig {owner:?} (claimed earlier); {tail} it claims another"
                )
            }
            Claimed::UnownedTopic => format!(
                "Kafka topic {value:?} exists but has no owner record (the operator did not create it); {tail} an admin assigns it (docs/security.md, \"Topic ownership\")"
            ),
            Claimed::SigningSecret => format!(
                "signing Secret {value:?} is labelled {label}={owner:?}: it belongs to another config; {tail} it names its own"
            ),
            Claimed::UnlabelledSigningSecret => format!(
                "signing Secret {value:?} has no label {label} naming this config; {tail} the Secret is labelled for it"
            ),
            Claimed::MissingSigningSecret => format!(
                "signing Secret {value:?} does not exist; {tail} it is created with the label {label} naming this config"
            ),
        }
    }
}

/// The ordering key: older first, then by name.
fn age_key(config: &AsyncJobConfig) -> (Option<k8s_openapi::jiff::Timestamp>, &str) {
    (
        config.metadata.creation_timestamp.as_ref().map(|t| t.0),
        config.name(),
    )
}

/// Ownership of every config of one namespace, by config name.
pub fn resolve<'a>(
    configs: impl IntoIterator<Item = &'a AsyncJobConfig>,
) -> BTreeMap<String, Ownership> {
    let mut ordered: Vec<&AsyncJobConfig> = configs.into_iter().collect();
    // a missing timestamp (not yet stored) sorts last: it is the newest
    ordered.sort_by(|a, b| {
        let (ta, na) = age_key(a);
        let (tb, nb) = age_key(b);
        match (ta, tb) {
            (Some(x), Some(y)) => x.cmp(&y).then(na.cmp(nb)),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => na.cmp(nb),
        }
    });
    let mut task_types: HashMap<&str, &str> = HashMap::new();
    let mut topics: HashMap<String, &str> = HashMap::new();
    let mut out = BTreeMap::new();
    for config in ordered {
        let task_type = config.spec.task_type.trim();
        let claimed = config.topics();
        let conflict = if let Some(owner) = task_types.get(task_type) {
            Some(Conflict {
                owner: owner.to_string(),
                what: Claimed::TaskType,
                value: task_type.into(),
            })
        } else {
            claimed.iter().find_map(|t| {
                topics.get(t).map(|owner| Conflict {
                    owner: owner.to_string(),
                    what: Claimed::Topic,
                    value: t.clone(),
                })
            })
        };
        let ownership = match conflict {
            Some(conflict) => Ownership::Conflict(conflict),
            None => {
                task_types.insert(task_type, config.name());
                for t in claimed {
                    topics.insert(t, config.name());
                }
                Ownership::Owner
            }
        };
        out.insert(config.name().to_string(), ownership);
    }
    out
}

/// The configs whose documents go into the routing ConfigMap: owners not being deleted.
pub fn routable<'a>(
    configs: &'a [std::sync::Arc<AsyncJobConfig>],
    ownership: &BTreeMap<String, Ownership>,
) -> Vec<&'a AsyncJobConfig> {
    configs
        .iter()
        .map(|c| c.as_ref())
        .filter(|c| !c.is_deleting())
        .filter(|c| ownership.get(c.name()) == Some(&Ownership::Owner))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    fn conflict_owner(map: &BTreeMap<String, Ownership>, name: &str) -> Option<(String, Claimed)> {
        match map.get(name)? {
            Ownership::Owner => None,
            Ownership::Conflict(c) => Some((c.owner.clone(), c.what)),
        }
    }

    #[test]
    fn the_older_config_owns_the_task_type() {
        let old = fixtures::aged("old", 100, |s| s.task_type = "t".into());
        let new = fixtures::aged("new", 200, |s| {
            s.task_type = "t".into();
            s.kafka.as_mut().unwrap().topic = "other-topic".into();
        });
        let map = resolve([&new, &old]);
        assert_eq!(map["old"], Ownership::Owner);
        assert_eq!(
            conflict_owner(&map, "new"),
            Some(("old".into(), Claimed::TaskType))
        );
        let Ownership::Conflict(c) = &map["new"] else {
            unreachable!()
        };
        assert_eq!(c.reason(), "TaskTypeOwnedByOther");
        assert!(c.message().contains("\"old\""), "{}", c.message());
    }

    #[test]
    fn a_shared_topic_is_a_conflict_too() {
        let a = fixtures::aged("a", 100, |s| s.task_type = "x".into());
        let b = fixtures::aged("b", 200, |s| s.task_type = "y".into());
        let map = resolve([&a, &b]);
        assert_eq!(
            conflict_owner(&map, "b"),
            Some(("a".into(), Claimed::Topic))
        );
    }

    #[test]
    fn a_topic_named_as_another_configs_high_priority_topic_is_a_conflict() {
        let a = fixtures::aged("a", 100, |s| {
            s.task_type = "x".into();
            s.kafka.as_mut().unwrap().topic = "t".into();
        });
        let b = fixtures::aged("b", 200, |s| {
            s.task_type = "y".into();
            s.kafka.as_mut().unwrap().topic = "t-high".into();
        });
        let map = resolve([&b, &a]);
        let Ownership::Conflict(c) = &map["b"] else {
            panic!("{map:?}")
        };
        assert_eq!((c.owner.as_str(), c.what), ("a", Claimed::Topic));
        assert_eq!(c.value, "t-high");
    }

    #[test]
    fn same_age_breaks_the_tie_by_name() {
        let a = fixtures::aged("alpha", 100, |_| {});
        let b = fixtures::aged("beta", 100, |_| {});
        let map = resolve([&b, &a]);
        assert_eq!(map["alpha"], Ownership::Owner);
        assert_eq!(
            conflict_owner(&map, "beta"),
            Some(("alpha".into(), Claimed::TaskType))
        );
    }

    #[test]
    fn a_config_in_conflict_claims_nothing() {
        // b loses the task type to a; c shares only b's topic, so c owns it
        let a = fixtures::aged("a", 100, |s| {
            s.task_type = "t".into();
            s.kafka.as_mut().unwrap().topic = "ta".into();
        });
        let b = fixtures::aged("b", 200, |s| {
            s.task_type = "t".into();
            s.kafka.as_mut().unwrap().topic = "tb".into();
        });
        let c = fixtures::aged("c", 300, |s| {
            s.task_type = "u".into();
            s.kafka.as_mut().unwrap().topic = "tb".into();
        });
        let map = resolve([&c, &b, &a]);
        assert_eq!(map["a"], Ownership::Owner);
        assert_eq!(
            conflict_owner(&map, "b"),
            Some(("a".into(), Claimed::TaskType))
        );
        assert_eq!(map["c"], Ownership::Owner);
    }

    #[test]
    fn deleting_the_owner_hands_over_only_once_it_is_gone() {
        let mut old = fixtures::aged("old", 100, |_| {});
        old.metadata.deletion_timestamp = old.metadata.creation_timestamp.clone();
        let new = fixtures::aged("new", 200, |_| {});
        let map = resolve([&old, &new]);
        assert_eq!(map["old"], Ownership::Owner, "still cleaning up");
        assert!(conflict_owner(&map, "new").is_some());
        let configs = vec![std::sync::Arc::new(old), std::sync::Arc::new(new.clone())];
        assert!(
            routable(&configs, &map).is_empty(),
            "a deleting owner is not routed"
        );
        let map = resolve([&new]);
        assert_eq!(map["new"], Ownership::Owner);
    }

    #[test]
    fn unrelated_configs_all_own() {
        let a = fixtures::aged("a", 100, |s| {
            s.task_type = "a".into();
            s.kafka.as_mut().unwrap().topic = "a".into();
        });
        let b = fixtures::aged("b", 100, |s| {
            s.task_type = "b".into();
            s.kafka = None;
        });
        let c = fixtures::aged("c", 100, |s| {
            s.task_type = "c".into();
            s.kafka = None;
        });
        let map = resolve([&a, &b, &c]);
        assert!(map.values().all(|o| *o == Ownership::Owner), "{map:?}");
    }
}
