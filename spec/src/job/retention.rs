//! `spec.retention`: how long finished tasks are kept, by how they finished.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::SpecError;
use crate::parse_duration;

/// How long a finished task stays in the store, by how it finished, counted from when
/// it finished. While it stays, `GET /v1/tasks/{id}` finds it and its idempotency key
/// still answers with it; after, both are gone.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetentionSpec {
    /// Succeeded tasks (default 24h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub succeeded: Option<String>,
    /// Cancelled tasks (default 24h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled: Option<String>,
    /// Dead letters (default 7d).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead: Option<String>,
    /// Expired tasks (default 24h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expired: Option<String>,
    /// How long a succeeded task keeps holding its unique key, so a late submit with the
    /// key is still refused as a duplicate (default 0s: the key is free once the task
    /// finished). At most `succeeded`: the key is kept in the task's row. A cancelled or
    /// dead task frees its key at once, for a new submit or its redrive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unique_keys: Option<String>,
}

/// A validated [`RetentionSpec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub succeeded: Duration,
    pub cancelled: Duration,
    pub dead: Duration,
    pub expired: Duration,
    /// See [`RetentionSpec::unique_keys`].
    pub unique_keys: Duration,
}

impl Retention {
    pub const DEFAULT: Retention = Retention {
        succeeded: Duration::from_secs(24 * 3600),
        cancelled: Duration::from_secs(24 * 3600),
        dead: Duration::from_secs(7 * 24 * 3600),
        expired: Duration::from_secs(24 * 3600),
        unique_keys: Duration::ZERO,
    };
    /// The longest retention accepted: ten years.
    pub const MAX: Duration = Duration::from_secs(3650 * 24 * 3600);
}

pub(super) fn validate_retention(spec: Option<&RetentionSpec>) -> Result<Retention, SpecError> {
    let spec = spec.cloned().unwrap_or_default();
    let d = Retention::DEFAULT;
    let each = |field: &str, value: &Option<String>, default: Duration| {
        let kept = value
            .as_deref()
            .map(parse_duration)
            .transpose()
            .map_err(|message| SpecError::new(field, message))?
            .unwrap_or(default);
        if kept > Retention::MAX {
            return Err(SpecError::new(field, "must be at most 3650d"));
        }
        Ok(kept)
    };
    let succeeded = each("spec.retention.succeeded", &spec.succeeded, d.succeeded)?;
    let unique_keys = each(
        "spec.retention.uniqueKeys",
        &spec.unique_keys,
        d.unique_keys,
    )?;
    if unique_keys > succeeded {
        return Err(SpecError::new(
            "spec.retention.uniqueKeys",
            "must be at most spec.retention.succeeded: the key is kept in the task's row",
        ));
    }
    Ok(Retention {
        succeeded,
        cancelled: each("spec.retention.cancelled", &spec.cancelled, d.cancelled)?,
        dead: each("spec.retention.dead", &spec.dead, d.dead)?,
        expired: each("spec.retention.expired", &spec.expired, d.expired)?,
        unique_keys,
    })
}
