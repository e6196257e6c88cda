//! What the operator allows one config, from its flags (the chart sets them): caps on
//! what a config may ask of the shared broker and cluster, and what becomes of a topic
//! that exists without an owner record.

/// The operator's limits on every config it reconciles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Most partitions a config's topic may have (`spec.kafka.partitions`).
    pub max_partitions: u32,
    /// Most dispatcher replicas a config may ask (`spec.scaling.minReplicas`,
    /// `spec.scaling.maxReplicas`).
    pub max_replicas: u32,
    /// A config naming a topic that exists without an owner record takes it (and records
    /// itself as its owner) instead of being refused with `TopicNotOwned`. For one run
    /// after upgrading from an operator that kept no records; off otherwise.
    pub adopt_unowned_topics: bool,
}

pub const DEFAULT_MAX_PARTITIONS: u32 = 256;
pub const DEFAULT_MAX_REPLICAS: u32 = 64;

impl Default for Policy {
    fn default() -> Self {
        Self {
            max_partitions: DEFAULT_MAX_PARTITIONS,
            max_replicas: DEFAULT_MAX_REPLICAS,
            adopt_unowned_topics: false,
        }
    }
}
