//! Step 4a, apply the topics (the job's main topic and its high-priority topic): ask the
//! broker, decide with [`topic::plan`] (build), carry it out. Create and grow only; a
//! shrink is refused with its reason. A topic this step creates is recorded on the broker
//! as the config's (see [`claims`](super::claims)).

use tracing::info;

use super::{Context, Error};
use crate::builders::topic;
use crate::crd::AsyncJobConfig;
use crate::kafka::{TopicAdmin, TopicError};
use crate::status::{Report, State, Step, TOPIC_READY};

/// What the topic step did.
#[derive(Debug, PartialEq)]
pub struct TopicOutcome {
    pub step: Step,
    /// Partitions the main topic has now (`None`: no topic).
    pub partitions: Option<u32>,
    /// Actions worth an Event and a metric each: `(reason, op, note)`.
    pub actions: Vec<(&'static str, &'static str, String)>,
}

/// The topic step: for each of the job's topics — the main one and the high-priority
/// one, with the same partitions — ask the broker, decide with [`topic::plan`], carry it
/// out. The step fails when either topic does.
pub async fn topic_step(
    config: &AsyncJobConfig,
    admin: &dyn TopicAdmin,
) -> Result<TopicOutcome, TopicError> {
    let Some(kafka) = &config.spec.kafka else {
        return Ok(TopicOutcome {
            step: Step::ok(
                "NoTopic",
                "no kafka section: every task goes through the store",
            ),
            partitions: None,
            actions: Vec::new(),
        });
    };
    let owner = super::claims::owner_id(config);
    let mut steps = Vec::new();
    let mut actions = Vec::new();
    let mut partitions = None;
    for name in kafka.topics() {
        let (step, action, after) = one_topic(&name, kafka.partitions, &owner, admin).await?;
        partitions.get_or_insert(after);
        steps.push(step);
        actions.extend(action);
    }
    let step = match steps.iter().position(|s| s.state != State::True) {
        Some(failed) => steps.swap_remove(failed),
        None => {
            let reason = actions.first().map_or(steps[0].reason.as_str(), |a| a.0);
            let message = steps
                .iter()
                .map(|s| s.message.as_str())
                .collect::<Vec<_>>()
                .join("; ");
            Step::ok(reason, message)
        }
    };
    Ok(TopicOutcome {
        step,
        partitions,
        actions,
    })
}

/// One topic: its step, the action taken if any, and its partitions afterwards.
async fn one_topic(
    name: &str,
    partitions: u32,
    owner: &str,
    admin: &dyn TopicAdmin,
) -> Result<(Step, Option<(&'static str, &'static str, String)>, u32), TopicError> {
    let current = admin.partitions(name).await?;
    let plan = topic::plan(partitions, current);
    let (step, action) = match plan {
        topic::TopicPlan::Create(n) => {
            // Kafka creates a topic once: the caller it tells so is the one that records
            // its owner. Another that created it since the claim step is not followed.
            if admin.create(name, n).await? {
                admin.set_owner(name, Some(owner)).await?;
            } else if admin.owners().await?.get(name).map(String::as_str) != Some(owner) {
                return Err(TopicError(format!(
                    "topic {name} was created by someone else meanwhile; it is not taken"
                )));
            }
            let note = format!("created topic {name} with {n} partitions");
            (
                Step::ok("TopicCreated", note.clone()),
                Some(("TopicCreated", "create", note)),
            )
        }
        topic::TopicPlan::Grow { from, to } => {
            admin.grow(name, to).await?;
            let note = format!("grew topic {name} from {from} to {to} partitions");
            (
                Step::ok("PartitionsGrown", note.clone()),
                Some(("PartitionsGrown", "grow", note)),
            )
        }
        topic::TopicPlan::Keep(n) => (
            Step::ok(
                "TopicReady",
                format!("topic {name} has the {n} partitions asked"),
            ),
            None,
        ),
        topic::TopicPlan::RefuseShrink { current, asked } => (
            Step::failed(
                "ShrinkRefused",
                format!(
                    "spec.kafka.partitions is {asked} but topic {name} has {current}: Kafka cannot remove partitions, so the topic is left as is; set partitions to {current} or more"
                ),
            ),
            Some(("ShrinkRefused", "shrink_refused", String::new())),
        ),
    };
    Ok((step, action, plan.partitions_after()))
}

pub(super) async fn apply_topic(
    config: &AsyncJobConfig,
    ctx: &Context,
    report: &mut Report,
) -> Result<Option<u32>, Error> {
    let outcome = match topic_step(config, ctx.admin.as_ref()).await {
        Ok(outcome) => outcome,
        Err(err) => {
            report.set(
                TOPIC_READY,
                Step::failed("KafkaUnavailable", err.to_string()),
            );
            return Err(Error::Kafka(err));
        }
    };
    for (reason, op, note) in &outcome.actions {
        ctx.metrics.topic_ops.with_label_values(&[op]).inc();
        // a refused shrink gets its Event from the status transition, once
        if !note.is_empty() {
            info!(config = config.name(), "{note}");
            ctx.event(config, false, reason, note.clone()).await;
        }
    }
    report.set(TOPIC_READY, outcome.step);
    Ok(outcome.partitions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use crate::kafka::fake::FakeAdmin;
    use crate::status;

    #[tokio::test]
    async fn topic_step_creates_grows_and_refuses_to_shrink() {
        let admin = FakeAdmin::default();
        let six = fixtures::config("a");
        let out = topic_step(&six, &admin).await.unwrap();
        assert_eq!(out.step.reason, "TopicCreated");
        assert_eq!(out.partitions, Some(6));
        assert_eq!(
            out.step.message,
            "created topic topic with 6 partitions; created topic topic-high with 6 partitions"
        );
        assert_eq!(out.actions.len(), 2, "one Event each");
        // again: nothing to do
        let out = topic_step(&six, &admin).await.unwrap();
        assert_eq!(
            (out.step.reason.as_str(), out.actions),
            ("TopicReady", vec![])
        );
        let twelve = fixtures::config_with("a", |s| s.kafka.as_mut().unwrap().partitions = 12);
        let out = topic_step(&twelve, &admin).await.unwrap();
        assert_eq!(out.step.reason, "PartitionsGrown");
        assert_eq!(out.partitions, Some(12));
        // shrinking back is refused, with the reason, and the broker is not touched
        let out = topic_step(&six, &admin).await.unwrap();
        assert_eq!(out.step.state, status::State::False);
        assert_eq!(out.step.reason, "ShrinkRefused");
        assert!(out.step.message.contains("has 12"), "{}", out.step.message);
        assert_eq!(out.partitions, Some(12));
        assert_eq!(
            *admin.calls.lock().unwrap(),
            [
                "create topic 6",
                "own topic shop/a",
                "create topic-high 6",
                "own topic-high shop/a",
                "grow topic 12",
                "grow topic-high 12"
            ]
        );
        assert_eq!(admin.topics.lock().unwrap()["topic"], 12);
        assert_eq!(admin.topics.lock().unwrap()["topic-high"], 12);
        // a high-priority topic missing (made before it existed) is created on its own
        admin.topics.lock().unwrap().remove("topic-high");
        let out = topic_step(&twelve, &admin).await.unwrap();
        assert_eq!(out.step.reason, "TopicCreated");
        assert_eq!(out.partitions, Some(12));
        assert_eq!(admin.topics.lock().unwrap()["topic-high"], 12);
        // a topic another client creates between the claim step and this one
        let raced = CreatedMeanwhile(FakeAdmin::default());
        let err = topic_step(&twelve, &raced).await.unwrap_err();
        assert!(err.0.contains("created by someone else"), "{err}");
        assert!(raced.0.owners.lock().unwrap().is_empty());
        // no kafka section: no topic
        let none = fixtures::config_with("b", |s| s.kafka = None);
        let out = topic_step(&none, &admin).await.unwrap();
        assert_eq!(
            (out.step.reason.as_str(), out.partitions),
            ("NoTopic", None)
        );
    }

    /// A broker where each topic is created by another client just before this one asks.
    struct CreatedMeanwhile(FakeAdmin);

    #[async_trait::async_trait]
    impl TopicAdmin for CreatedMeanwhile {
        async fn partitions(&self, _: &str) -> Result<Option<u32>, TopicError> {
            Ok(None)
        }
        async fn create(&self, _: &str, _: u32) -> Result<bool, TopicError> {
            Ok(false)
        }
        async fn grow(&self, topic: &str, total: u32) -> Result<(), TopicError> {
            self.0.grow(topic, total).await
        }
        async fn delete(&self, topic: &str) -> Result<(), TopicError> {
            self.0.delete(topic).await
        }
        async fn owners(&self) -> Result<std::collections::BTreeMap<String, String>, TopicError> {
            self.0.owners().await
        }
        async fn set_owner(&self, topic: &str, owner: Option<&str>) -> Result<(), TopicError> {
            self.0.set_owner(topic, owner).await
        }
    }
}
