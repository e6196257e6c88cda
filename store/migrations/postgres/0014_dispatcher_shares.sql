-- See migrations/sqlite/0014_dispatcher_shares.sql.
ALTER TABLE dispatchers ADD COLUMN shares TEXT;
