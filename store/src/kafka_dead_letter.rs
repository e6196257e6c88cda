//! Kafka messages the consumer could not make a task of, kept so their offsets can be
//! committed without losing them.

use crate::Millis;
#[cfg(doc)]
use crate::Store;

/// A Kafka message the consumer could not make a task of: bytes that are no task
/// envelope, or a task the store refused.
#[derive(Debug, Clone, PartialEq)]
pub struct KafkaDeadLetter {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// The message's value as read, byte for byte, cut at [`KAFKA_DEAD_LETTER_BYTES`].
    pub message: Vec<u8>,
    /// The value's length as read: more than `message.len()` when it was cut.
    pub message_size: i64,
    pub reason: String,
    pub recorded_at: Millis,
}

/// What [`Store::kafka_dead_letters`] lists: up to `limit` dead letters, of `topic`
/// only if given, in the order latest recorded first, then by topic, partition and
/// offset, each descending; with `after`, those that come after it in that order (a
/// page's last item: the next page).
#[derive(Debug, Clone, Copy, Default)]
pub struct KafkaDeadLetterParams<'a> {
    pub topic: Option<&'a str>,
    pub after: Option<KafkaDeadLetterKey<'a>>,
    pub limit: u32,
}

/// Where a Kafka dead letter sits in the listing's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KafkaDeadLetterKey<'a> {
    pub recorded_at: Millis,
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
}

/// How much of a message a Kafka dead letter keeps. A broker accepts messages up to its
/// `message.max.bytes` (1 MiB by default), so a message is cut only on a topic configured
/// above 8 MiB; the bound keeps one row within MariaDB's default 16 MiB packet.
pub const KAFKA_DEAD_LETTER_BYTES: usize = 8 << 20;

impl KafkaDeadLetter {
    /// The dead letter of the message at `offset` of `partition`, its value cut to
    /// [`KAFKA_DEAD_LETTER_BYTES`].
    pub fn new(
        topic: &str,
        partition: i32,
        offset: i64,
        message: &[u8],
        reason: String,
        recorded_at: Millis,
    ) -> Self {
        Self {
            topic: topic.to_string(),
            partition,
            offset,
            message: message[..message.len().min(KAFKA_DEAD_LETTER_BYTES)].to_vec(),
            message_size: i64::try_from(message.len()).unwrap_or(i64::MAX),
            reason,
            recorded_at,
        }
    }
}
