//! Human duration strings (`"500ms"`, `"90s"`, `"3d"`), the one format used by the API,
//! the job configs and the CLI flags.

use std::time::Duration;

/// Parses a non-negative human duration. The error says what was wrong with the text,
/// without the field name, which the caller knows.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    if trimmed.starts_with('-') {
        return Err(format!("{text:?} must not be negative"));
    }
    if trimmed.is_empty() {
        return Err("must not be empty".to_string());
    }
    humantime::parse_duration(trimmed)
        .map_err(|err| format!("{text:?} is not a duration like \"90s\" or \"3d\" ({err})"))
}

/// Formats a duration the way [`parse_duration`] reads it.
pub fn format_duration(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_units_users_write() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("3d"), Ok(Duration::from_secs(3 * 86_400)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
    }

    #[test]
    fn refuses_negative_and_garbage() {
        assert!(parse_duration("-5s").unwrap_err().contains("negative"));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("10").is_err(), "a unit is required");
    }

    #[test]
    fn formats_round_trip() {
        let d = Duration::from_millis(90_500);
        assert_eq!(parse_duration(&format_duration(d)), Ok(d));
    }
}
