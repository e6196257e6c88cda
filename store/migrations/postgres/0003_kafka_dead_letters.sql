-- The same table as migrations/sqlite/0003_kafka_dead_letters.sql; see there for what it
-- holds. BYTEA keeps the message byte for byte (NUL and invalid UTF-8 included, which
-- TEXT refuses).
CREATE TABLE kafka_dead_letters (
    topic           TEXT COLLATE "C" NOT NULL,
    kafka_partition INTEGER NOT NULL,
    kafka_offset    BIGINT NOT NULL,
    message         BYTEA NOT NULL,
    message_size    BIGINT NOT NULL,
    reason          TEXT NOT NULL,
    recorded_at     BIGINT NOT NULL,
    PRIMARY KEY (topic, kafka_partition, kafka_offset)
);
CREATE INDEX kafka_dead_letters_recent ON kafka_dead_letters (recorded_at);
