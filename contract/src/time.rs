//! Times on the wire: RFC 3339, UTC, millisecond precision (`2026-11-30T06:00:00.123Z`).

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer, Serializer};

/// Renders `t` as the API writes times.
pub fn format_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// `t` (milliseconds since the Unix epoch) as the API writes times.
pub fn format_millis(ms: i64) -> String {
    format_time(from_millis(ms))
}

/// Milliseconds since the epoch as a time; out-of-range values clamp to the epoch.
pub fn from_millis(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

/// `#[serde(with = "crate::time::rfc3339")]` for a `DateTime<Utc>` field.
pub mod rfc3339 {
    use super::*;

    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_time(*t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        DateTime::<Utc>::deserialize(d)
    }
}

/// `#[serde(with = "crate::time::rfc3339_option")]` for an `Option<DateTime<Utc>>` field.
pub mod rfc3339_option {
    use super::*;

    pub fn serialize<S: Serializer>(t: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_str(&format_time(*t)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
        Option::<DateTime<Utc>>::deserialize(d)
    }
}

/// `#[serde(with = "crate::time::rfc3339_vec")]` for a `Vec<DateTime<Utc>>` field.
pub mod rfc3339_vec {
    use super::*;
    use serde::ser::SerializeSeq;

    pub fn serialize<S: Serializer>(times: &[DateTime<Utc>], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(times.len()))?;
        for t in times {
            seq.serialize_element(&format_time(*t))?;
        }
        seq.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<DateTime<Utc>>, D::Error> {
        Vec::<DateTime<Utc>>::deserialize(d)
    }
}

#[cfg(feature = "openapi")]
pub(crate) fn schema_vec(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "array", "items": {"type": "string", "format": "date-time"}})
}

#[cfg(feature = "openapi")]
pub(crate) fn schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "string", "format": "date-time"})
}

#[cfg(feature = "openapi")]
pub(crate) fn schema_option(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": ["string", "null"], "format": "date-time"})
}

/// A humantime duration (`"90s"`, `"1h 30m"`).
#[cfg(feature = "openapi")]
pub(crate) fn duration_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "description": "A duration in humantime form: \"500ms\", \"90s\", \"15m\", \"3d\", \"1h 30m\".",
        "examples": ["90s"]
    })
}

/// A humantime duration (`"90s"`, `"1h 30m"`), when given.
#[cfg(feature = "openapi")]
pub(crate) fn duration_option_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": ["string", "null"],
        "description": "A duration in humantime form: \"500ms\", \"90s\", \"15m\", \"3d\", \"1h 30m\".",
        "examples": ["90s"]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn always_three_fraction_digits_in_utc() {
        assert_eq!(format_millis(1_700_000_000_000), "2023-11-14T22:13:20.000Z");
        assert_eq!(format_millis(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }
}
