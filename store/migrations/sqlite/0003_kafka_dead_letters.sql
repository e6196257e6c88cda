-- Kafka messages the consumer could not make tasks of: undecodable bytes, or a task the
-- store refused. Each is kept here, byte for byte, and its offset committed, so one bad
-- message never blocks the partition behind it (dispatcher/src/kafka.rs).
--
-- One row per message: a message re-delivered after a crash is recorded once.
-- `message` holds at most store::KAFKA_DEAD_LETTER_BYTES (8 MiB; the broker's default
-- message.max.bytes is 1 MiB, so a message is cut only on a topic configured above
-- that); `message_size` is the message's length as read, so a cut one is recognisable.
CREATE TABLE kafka_dead_letters (
    topic           TEXT NOT NULL,
    kafka_partition INTEGER NOT NULL,
    kafka_offset    INTEGER NOT NULL,
    message         BLOB NOT NULL,
    message_size    INTEGER NOT NULL,
    reason          TEXT NOT NULL,
    recorded_at     INTEGER NOT NULL,      -- milliseconds since the Unix epoch, UTC
    PRIMARY KEY (topic, kafka_partition, kafka_offset)
);
-- The listing, newest first.
CREATE INDEX kafka_dead_letters_recent ON kafka_dead_letters (recorded_at);
