-- The same table as migrations/sqlite/0003_kafka_dead_letters.sql; see there for what it
-- holds. LONGBLOB keeps the message byte for byte (8 MiB at most, within MariaDB's
-- default 16 MiB max_allowed_packet). Kafka topic names are at most 249 ASCII
-- characters, so the key stays within InnoDB's 3072-byte index key limit.
CREATE TABLE kafka_dead_letters (
    topic           VARCHAR(255) NOT NULL,
    kafka_partition INT NOT NULL,
    kafka_offset    BIGINT NOT NULL,
    message         LONGBLOB NOT NULL,
    message_size    BIGINT NOT NULL,
    reason          TEXT NOT NULL,
    recorded_at     BIGINT NOT NULL,
    PRIMARY KEY (topic, kafka_partition, kafka_offset),
    KEY kafka_dead_letters_recent (recorded_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
