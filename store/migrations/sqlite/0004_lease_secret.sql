-- A per-task secret from which each attempt's lease token is derived:
-- hex(HMAC-SHA256(lease_secret, "<id>\n<lease_token>")) (dispatcher/src/lease.rs). The
-- counter `lease_token` stays the fencing token; the secret makes the token an executor
-- receives unguessable. 32 random bytes, hex, written by the insert; rows from before
-- this migration get theirs here (SQLite's randomblob draws from its CSPRNG).
ALTER TABLE tasks ADD COLUMN lease_secret TEXT;
UPDATE tasks SET lease_secret = lower(hex(randomblob(32)));
