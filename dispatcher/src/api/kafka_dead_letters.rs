//! Kafka dead letters — messages a consumer could not make a task of, kept byte for byte
//! in the store (`dispatcher/src/kafka/consumer.rs`): `GET /v1/kafka-dead-letters` lists them,
//! latest recorded first, paged like the task listings; `POST
//! /v1/kafka-dead-letters/purge` deletes those recorded before an instant, a bounded
//! batch per call (the retention purger deletes them a week after they were recorded
//! anyway: `retention::KAFKA_DEAD_LETTERS`).

use std::collections::HashMap;

use asyncd_contract::{
    KafkaDeadLetterPage, KafkaDeadLetterPurge, KafkaDeadLetterPurgeResult, KafkaDeadLetterStatus,
    MAX_BULK, MAX_LISTING_BYTES,
};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;

use super::extract::Query;
use axum::response::{IntoResponse, Response};
use base64::Engine;

use super::error::ApiError;
use super::listing::listing_limit;
use super::submit::{parse_json, plain_text};
use super::{AppState, body_bytes};
use crate::auth::{Caller, Verb};
use crate::clock::from_millis;
use asyncd_store::{KafkaDeadLetter, KafkaDeadLetterKey, KafkaDeadLetterParams, Millis};

/// A purge body is an instant and a limit; anything larger is not one.
const MAX_BODY_BYTES: usize = 16 * 1024;

pub(super) async fn list(
    State(state): AppState,
    caller: Caller,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let (job, topic) = match query.get("job") {
        Some(name) => {
            plain_text("job", name)?;
            let routes = state.routes.borrow().clone();
            let Some(job) = routes.jobs().find(|j| j.name == *name) else {
                return Err(ApiError::field(
                    "job",
                    format!("no AsyncJobConfig is named {name:?}"),
                ));
            };
            let Some(kafka) = &job.kafka else {
                return Err(ApiError::field(
                    "job",
                    format!("job {name:?} has no Kafka topic, so no Kafka dead letters"),
                ));
            };
            (Some(job.name.clone()), Some(kafka.topic.clone()))
        }
        None => (None, None),
    };
    state
        .auth
        .require(&caller, Verb::ListDeadLetters, job.as_deref())
        .await?;
    let limit = listing_limit(&query)?;
    let cursor = query.get("cursor").map(|c| parse_cursor(c)).transpose()?;
    let letters = state
        .store
        .kafka_dead_letters(KafkaDeadLetterParams {
            topic: topic.as_deref(),
            after: cursor.as_ref().map(Cursor::key),
            limit,
        })
        .await?;
    Ok(Json(page(&letters, limit, MAX_LISTING_BYTES)).into_response())
}

pub(super) async fn purge(
    State(state): AppState,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<KafkaDeadLetterPurgeResult>, ApiError> {
    let body = body_bytes(body, MAX_BODY_BYTES)?;
    let request: KafkaDeadLetterPurge = parse_json(&body)?;
    let limit = request.limit.unwrap_or(MAX_BULK);
    if !(1..=MAX_BULK).contains(&limit) {
        return Err(ApiError::field(
            "limit",
            format!("must be from 1 to {MAX_BULK}"),
        ));
    }
    // A message belongs to no job the store knows of: purging needs the right on all.
    state.auth.require(&caller, Verb::Purge, None).await?;
    let purged = state
        .store
        .purge_kafka_dead_letters(Millis::from(request.recorded_before), limit)
        .await?;
    if purged > 0 {
        tracing::info!(
            caller = caller.name(),
            purged,
            recorded_before = %request.recorded_before,
            "Kafka dead letters purged"
        );
    }
    Ok(Json(KafkaDeadLetterPurgeResult { purged }))
}

/// A listing cursor names the last letter of a page by its place in the listing's
/// order: `<recorded ms>.<partition>.<offset>.<topic>` (the topic last: it may hold
/// dots). Clients treat it as opaque.
struct Cursor {
    recorded_at: Millis,
    partition: i32,
    offset: i64,
    topic: String,
}

impl Cursor {
    fn of(letter: &KafkaDeadLetter) -> String {
        format!(
            "{}.{}.{}.{}",
            letter.recorded_at, letter.partition, letter.offset, letter.topic
        )
    }

    fn key(&self) -> KafkaDeadLetterKey<'_> {
        KafkaDeadLetterKey {
            recorded_at: self.recorded_at,
            topic: &self.topic,
            partition: self.partition,
            offset: self.offset,
        }
    }
}

fn parse_cursor(text: &str) -> Result<Cursor, ApiError> {
    let invalid = || ApiError::field("cursor", "must be a next_cursor from a previous page");
    let mut parts = text.splitn(4, '.');
    let mut next = || parts.next().ok_or_else(invalid);
    let recorded_at = Millis::new(next()?.parse().map_err(|_| invalid())?);
    let partition = next()?.parse().map_err(|_| invalid())?;
    let offset = next()?.parse().map_err(|_| invalid())?;
    let topic = next()?;
    // No stored topic is empty or holds a control character (PostgreSQL cannot even
    // compare with a NUL): such a cursor cannot have come from this server.
    if topic.is_empty() || topic.chars().any(char::is_control) {
        return Err(invalid());
    }
    Ok(Cursor {
        recorded_at,
        partition,
        offset,
        topic: topic.to_string(),
    })
}

/// The answer listing `letters` (a page asked with `limit`), cut after the last letter
/// that keeps the messages within `max_bytes` (the first always goes in, or a message
/// larger than the cap could never be listed). A cut page, or a full one, names the
/// cursor of its last letter.
fn page(letters: &[KafkaDeadLetter], limit: u32, max_bytes: usize) -> KafkaDeadLetterPage {
    let mut items = Vec::new();
    let mut bytes = 0;
    for letter in letters {
        let item = status(letter);
        // The encoded message is nearly all of an item.
        let size = item.message_base64.len() + item.reason.len() + item.topic.len() + 128;
        if !items.is_empty() && bytes + size > max_bytes {
            break;
        }
        bytes += size;
        items.push(item);
    }
    let truncated = items.len() < letters.len();
    let next_cursor = (truncated || (!items.is_empty() && letters.len() == limit as usize))
        .then(|| Cursor::of(&letters[items.len() - 1]));
    KafkaDeadLetterPage {
        items,
        truncated,
        next_cursor,
    }
}

fn status(letter: &KafkaDeadLetter) -> KafkaDeadLetterStatus {
    KafkaDeadLetterStatus {
        topic: letter.topic.clone(),
        partition: letter.partition,
        offset: letter.offset,
        message_base64: base64::engine::general_purpose::STANDARD.encode(&letter.message),
        message_size: letter.message_size,
        reason: letter.reason.clone(),
        recorded_at: from_millis(letter.recorded_at),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letter(topic: &str, offset: i64, message: &[u8]) -> KafkaDeadLetter {
        KafkaDeadLetter::new(topic, 3, offset, message, "bad".into(), Millis::new(1_000))
    }

    #[test]
    fn a_cursor_names_the_last_letter_and_reads_back_with_dots_in_the_topic() {
        let last = letter("asyncd.send_email", 41, b"x");
        let text = Cursor::of(&last);
        assert_eq!(text, "1000.3.41.asyncd.send_email");
        let cursor = parse_cursor(&text).unwrap();
        assert_eq!(
            cursor.key(),
            KafkaDeadLetterKey {
                recorded_at: Millis::new(1_000),
                topic: "asyncd.send_email",
                partition: 3,
                offset: 41,
            }
        );
        for bad in [
            "",
            "1000",
            "1000.3.41",
            "1000.3.41.",
            "x.3.41.t",
            "1000.3.41.t\u{0}",
        ] {
            assert!(parse_cursor(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_page_stops_at_its_byte_cap_but_always_holds_one_letter() {
        let big = vec![0u8; 3000];
        let letters: Vec<_> = (0..3).map(|i| letter("t", i, &big)).collect();
        let one = page(&letters, 10, 100);
        assert_eq!((one.items.len(), one.truncated), (1, true));
        assert_eq!(one.next_cursor.as_deref(), Some("1000.3.0.t"));
        let two = page(&letters, 10, 9000);
        assert_eq!((two.items.len(), two.truncated), (2, true));
        let all = page(&letters, 3, 1 << 20);
        assert_eq!((all.items.len(), all.truncated), (3, false));
        assert_eq!(
            all.next_cursor.as_deref(),
            Some("1000.3.2.t"),
            "a full page"
        );
        let last = page(&letters, 10, 1 << 20);
        assert_eq!(last.next_cursor, None, "fewer than asked: the last page");
        assert_eq!(
            base64::engine::general_purpose::STANDARD
                .decode(&all.items[0].message_base64)
                .unwrap(),
            big
        );
    }
}
