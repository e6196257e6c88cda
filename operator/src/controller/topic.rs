//! Step 4a, apply the topic: ask the broker, decide with [`topic::plan`] (build), carry
//! it out. Create and grow only; a shrink is refused with its reason.

use tracing::info;

use super::{Context, Error};
use crate::builders::topic;
use crate::crd::AsyncJobConfig;
use crate::kafka::{TopicAdmin, TopicError};
use crate::status::{Report, Step, TOPIC_READY};

/// What the topic step did.
#[derive(Debug, PartialEq)]
pub struct TopicOutcome {
    pub step: Step,
    /// Partitions the topic has now (`None`: no topic).
    pub partitions: Option<u32>,
    /// An action worth an Event and a metric: `(reason, op, note)`.
    pub action: Option<(&'static str, &'static str, String)>,
}

/// The topic step: ask the broker, decide with [`topic::plan`], carry it out.
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
            action: None,
        });
    };
    let current = admin.partitions(&kafka.topic).await?;
    let plan = topic::plan(kafka.partitions, current);
    let (step, action) = match plan {
        topic::TopicPlan::Create(n) => {
            admin.create(&kafka.topic, n).await?;
            let note = format!("created topic {} with {n} partitions", kafka.topic);
            (
                Step::ok("TopicCreated", note.clone()),
                Some(("TopicCreated", "create", note)),
            )
        }
        topic::TopicPlan::Grow { from, to } => {
            admin.grow(&kafka.topic, to).await?;
            let note = format!("grew topic {} from {from} to {to} partitions", kafka.topic);
            (
                Step::ok("PartitionsGrown", note.clone()),
                Some(("PartitionsGrown", "grow", note)),
            )
        }
        topic::TopicPlan::Keep(n) => (
            Step::ok(
                "TopicReady",
                format!("topic {} has the {n} partitions asked", kafka.topic),
            ),
            None,
        ),
        topic::TopicPlan::RefuseShrink { current, asked } => (
            Step::failed(
                "ShrinkRefused",
                format!(
                    "spec.kafka.partitions is {asked} but topic {} has {current}: Kafka cannot remove partitions, so the topic is left as is; set partitions to {current} or more",
                    kafka.topic
                ),
            ),
            Some(("ShrinkRefused", "shrink_refused", String::new())),
        ),
    };
    Ok(TopicOutcome {
        step,
        partitions: Some(plan.partitions_after()),
        action,
    })
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
    if let Some((reason, op, note)) = &outcome.action {
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
        // again: nothing to do
        let out = topic_step(&six, &admin).await.unwrap();
        assert_eq!((out.step.reason.as_str(), out.action), ("TopicReady", None));
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
            ["create topic 6", "grow topic 12"]
        );
        assert_eq!(admin.topics.lock().unwrap()["topic"], 12);
        // no kafka section: no topic
        let none = fixtures::config_with("b", |s| s.kafka = None);
        let out = topic_step(&none, &admin).await.unwrap();
        assert_eq!(
            (out.step.reason.as_str(), out.partitions),
            ("NoTopic", None)
        );
    }
}
