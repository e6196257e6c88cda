-- The same column as migrations/sqlite/0004_lease_secret.sql; see there for what it
-- holds. Rows from before this migration get 244 random bits from two gen_random_uuid()
-- (PostgreSQL 13+, drawn from pg_strong_random).
ALTER TABLE tasks ADD COLUMN lease_secret TEXT;
UPDATE tasks SET lease_secret = replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '');
