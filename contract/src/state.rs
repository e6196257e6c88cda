//! Task states, as the API names them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A task's state (`docs/api.md`, "Inspect, cancel").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    /// Waiting on `depends_on`.
    Blocked,
    /// Waiting for its ETA or a dispatcher.
    Pending,
    /// Held by a dispatcher until due.
    Claimed,
    /// An attempt is in flight, or accepted with 202 and leased.
    Running,
    Succeeded,
    /// In dead letters.
    Dead,
    Cancelled,
    /// Not begun by its `expires_at`: it never reached the executor.
    Expired,
}

/// A state name this version does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown task state {0:?}")]
pub struct UnknownState(pub String);

impl TaskState {
    pub const ALL: [TaskState; 8] = [
        Self::Blocked,
        Self::Pending,
        Self::Claimed,
        Self::Running,
        Self::Succeeded,
        Self::Dead,
        Self::Cancelled,
        Self::Expired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Blocked => "blocked",
            Self::Pending => "pending",
            Self::Claimed => "claimed",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Dead => "dead",
            Self::Cancelled => "cancelled",
            Self::Expired => "expired",
        }
    }

    pub fn parse(text: &str) -> Result<Self, UnknownState> {
        Self::ALL
            .into_iter()
            .find(|s| s.as_str() == text)
            .ok_or_else(|| UnknownState(text.to_string()))
    }

    /// Succeeded, dead, cancelled or expired: nothing more happens unless it is redriven.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Self::Succeeded | Self::Dead | Self::Cancelled | Self::Expired
        )
    }
}

impl FromStr for TaskState {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_parse_and_serde() {
        for state in TaskState::ALL {
            assert_eq!(TaskState::parse(state.as_str()), Ok(state));
            assert_eq!(
                serde_json::to_string(&state).unwrap(),
                format!("\"{state}\"")
            );
        }
        assert_eq!(
            TaskState::parse("done"),
            Err(UnknownState("done".to_string()))
        );
    }
}
