//! The task as the API shows it, alone or as an item of a listing, and the paging that
//! task searches and dead letters share: a page is cut by count and by bytes, and names
//! the cursor that the next page starts after.

use std::collections::HashMap;

use asyncd_contract::TaskStatus;
use serde_json::value::RawValue;

use super::error::ApiError;
use crate::clock::from_millis;
use asyncd_store::{Millis, TaskRecord};

fn raw_or_null(raw: &RawValue) -> serde_json::Value {
    serde_json::from_str(raw.get()).unwrap_or(serde_json::Value::Null)
}

pub fn task_status(task: &TaskRecord) -> TaskStatus {
    TaskStatus {
        id: task.id.clone(),
        task_type: task.task_type.clone(),
        payload: raw_or_null(&task.payload),
        state: task.state,
        priority: task.priority,
        eta: from_millis(task.trigger_at),
        attempt: task.attempt,
        max_retries: task.max_retries,
        idempotency_key: task.idempotency_key.clone(),
        unique_key: task.unique_key.clone(),
        depends_on: task.depends_on.clone(),
        last_error: task.last_error.clone(),
        result: task.result.as_deref().map(raw_or_null),
        lease_until: task.lease_until.map(from_millis),
        expires_at: task.expires_at.map(from_millis),
        created_at: from_millis(task.created_at),
        updated_at: from_millis(task.updated_at),
    }
}

/// A listing's `limit` query parameter: 100 unless given.
pub fn listing_limit(query: &HashMap<String, String>) -> Result<u32, ApiError> {
    match query.get("limit") {
        None => Ok(100),
        Some(text) => match text.parse::<u32>() {
            Ok(n @ 1..=1000) => Ok(n),
            _ => Err(ApiError::field("limit", "must be 1..=1000")),
        },
    }
}

/// A listing cursor names the last task of a page by its place in the listing's order:
/// `<ms>.<id>`, the ms being the time the listing orders by (`trigger_at` for dead
/// letters, `created_at` for a search). Clients treat it as opaque.
fn cursor_of(task: &TaskRecord, order: fn(&TaskRecord) -> Millis) -> String {
    format!("{}.{}", order(task).as_i64(), task.id)
}

pub fn parse_cursor(text: &str) -> Result<(Millis, String), ApiError> {
    let invalid = || ApiError::field("cursor", "must be a next_cursor from a previous page");
    let (at, id) = text.split_once('.').ok_or_else(invalid)?;
    let at: i64 = at.parse().map_err(|_| invalid())?;
    // Ids are UUIDs: anything else cannot have come from this server.
    let id = uuid::Uuid::parse_str(id).map_err(|_| invalid())?;
    Ok((Millis::new(at), id.to_string()))
}

/// A [`asyncd_contract::DeadLetters`] answer of `tasks` (a page asked with `limit`), cut
/// after the last item that keeps the body within `max_bytes` (the first item always goes
/// in, or a task larger than the cap could never be listed); the second value says
/// whether items were cut. A cut page, or a full one, names the cursor of its last item.
/// Written item by item, so a cut listing is never serialized whole.
pub fn listing(
    tasks: &[TaskRecord],
    limit: u32,
    max_bytes: usize,
    order: fn(&TaskRecord) -> Millis,
) -> (Vec<u8>, bool) {
    // The longest tail: `"truncated"` and a cursor of an i64 and a UUID.
    const TAIL_BYTES: usize = 128;
    let mut body = br#"{"items":["#.to_vec();
    let mut listed = 0;
    for (i, task) in tasks.iter().enumerate() {
        let item = serde_json::to_vec(&task_status(task)).expect("a task status serializes");
        if i > 0 && body.len() + 1 + item.len() + TAIL_BYTES > max_bytes {
            break;
        }
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&item);
        listed += 1;
    }
    let truncated = listed < tasks.len();
    body.extend_from_slice(format!("],\"truncated\":{truncated}").as_bytes());
    if truncated || (listed > 0 && tasks.len() == limit as usize) {
        let cursor = cursor_of(&tasks[listed - 1], order);
        body.extend_from_slice(format!(",\"next_cursor\":\"{cursor}\"").as_bytes());
    }
    body.push(b'}');
    (body, truncated)
}

#[cfg(test)]
mod tests {
    use super::*;
    use asyncd_contract::DeadLetters;
    use asyncd_store::TaskState;

    fn dead(id: usize, payload_bytes: usize) -> TaskRecord {
        let payload = format!("\"{}\"", "x".repeat(payload_bytes));
        TaskRecord {
            id: format!("task-{id}"),
            task_type: "t".into(),
            payload: RawValue::from_string(payload).unwrap(),
            state: TaskState::Dead,
            priority: 0,
            trigger_at: Millis::new(0),
            attempt: 1,
            max_retries: 0,
            timeout_ms: 1000,
            lease_token: 0,
            lease_until: None,
            idempotency_key: None,
            unique_key: None,
            depends_on: Vec::new(),
            last_error: Some("boom".into()),
            result: None,
            created_at: Millis::new(0),
            updated_at: Millis::new(0),
            lease_secret: String::new(),
            expires_at: None,
        }
    }

    #[test]
    fn a_listing_stops_at_its_byte_cap_and_says_so() {
        let tasks: Vec<TaskRecord> = (0..10).map(|i| dead(i, 1000)).collect();
        let (body, truncated) = listing(&tasks, 10, 4500, |t| t.trigger_at);
        let answer: DeadLetters = serde_json::from_slice(&body).unwrap();
        assert!(body.len() <= 4500, "{} bytes", body.len());
        assert_eq!((answer.items.len(), answer.truncated), (3, true));
        assert!(truncated);
        assert_eq!(answer.items[2].id, "task-2", "the newest ones, in order");
        assert_eq!(
            answer.next_cursor.as_deref(),
            Some("0.task-2"),
            "the next page starts after the last one listed"
        );

        let (full, truncated) = listing(&tasks, 10, usize::MAX, |t| t.trigger_at);
        let answer: DeadLetters = serde_json::from_slice(&full).unwrap();
        assert_eq!(
            (answer.items.len(), answer.truncated, truncated),
            (10, false, false)
        );
        assert_eq!(
            answer.next_cursor.as_deref(),
            Some("0.task-9"),
            "a full page may have more behind it"
        );
        let (body, _) = listing(&tasks, 11, usize::MAX, |t| t.trigger_at);
        let short: DeadLetters = serde_json::from_slice(&body).unwrap();
        assert_eq!(short.next_cursor, None, "a short page is the last");
        for (body, answer) in [(full, answer), (body, short)] {
            assert_eq!(
                body,
                serde_json::to_vec(&answer).unwrap(),
                "written as the contract type writes it"
            );
        }
    }

    #[test]
    fn a_task_larger_than_the_cap_is_still_listed_alone() {
        let tasks = [dead(0, 10_000), dead(1, 10)];
        let (body, _) = listing(&tasks, 2, 1000, |t| t.trigger_at);
        let answer: DeadLetters = serde_json::from_slice(&body).unwrap();
        assert_eq!((answer.items.len(), answer.truncated), (1, true));
        let (body, _) = listing(&[], 2, 1000, |t| t.trigger_at);
        assert_eq!(body, br#"{"items":[],"truncated":false}"#);
    }

    #[test]
    fn a_cursor_is_refused_unless_this_server_could_have_written_it() {
        let id = "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b";
        assert_eq!(
            parse_cursor(&format!("-5.{id}")).unwrap(),
            (Millis::new(-5), id.to_string())
        );
        for bad in [
            "",
            "5",
            ".x",
            "x.y",
            &format!("1e3.{id}"),
            "5.task-1",
            &format!("5.{id}\0"),
        ] {
            let error = parse_cursor(bad).unwrap_err();
            assert_eq!(error.status, axum::http::StatusCode::BAD_REQUEST, "{bad:?}");
        }
    }
}
