-- The same column as migrations/sqlite/0004_lease_secret.sql; see there for what it
-- holds. Rows from before this migration get theirs from RANDOM_BYTES (MariaDB 10.10+,
-- MySQL 5.6+; the server's CSPRNG).
ALTER TABLE tasks ADD COLUMN lease_secret VARCHAR(64) NULL;
UPDATE tasks SET lease_secret = LOWER(HEX(RANDOM_BYTES(32)));
