//! What to do with a job's Kafka topic, given what the broker has.

/// The decision for one topic; applying it is the controller's job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopicPlan {
    /// No topic yet: create it with this many partitions.
    Create(u32),
    /// Add partitions up to `to`.
    Grow { from: u32, to: u32 },
    /// Already as asked.
    Keep(u32),
    /// The spec asks for fewer partitions than the topic has. Kafka cannot remove
    /// partitions (and their data), so nothing is done and the status says why.
    RefuseShrink { current: u32, asked: u32 },
}

pub fn plan(asked: u32, current: Option<u32>) -> TopicPlan {
    match current {
        None => TopicPlan::Create(asked),
        Some(current) if asked > current => TopicPlan::Grow {
            from: current,
            to: asked,
        },
        Some(current) if asked < current => TopicPlan::RefuseShrink { current, asked },
        Some(current) => TopicPlan::Keep(current),
    }
}

impl TopicPlan {
    /// Partitions the topic has once the plan is carried out.
    pub fn partitions_after(&self) -> u32 {
        match *self {
            TopicPlan::Create(n) | TopicPlan::Keep(n) => n,
            TopicPlan::Grow { to, .. } => to,
            TopicPlan::RefuseShrink { current, .. } => current,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_a_missing_topic_with_the_partitions_asked() {
        assert_eq!(plan(6, None), TopicPlan::Create(6));
        assert_eq!(plan(6, None).partitions_after(), 6);
    }

    #[test]
    fn grows_when_the_spec_grows() {
        assert_eq!(plan(12, Some(6)), TopicPlan::Grow { from: 6, to: 12 });
        assert_eq!(plan(12, Some(6)).partitions_after(), 12);
    }

    #[test]
    fn never_shrinks() {
        let p = plan(6, Some(12));
        assert_eq!(
            p,
            TopicPlan::RefuseShrink {
                current: 12,
                asked: 6
            }
        );
        assert_eq!(p.partitions_after(), 12);
    }

    #[test]
    fn keeps_a_topic_that_is_as_asked() {
        assert_eq!(plan(6, Some(6)), TopicPlan::Keep(6));
    }
}
