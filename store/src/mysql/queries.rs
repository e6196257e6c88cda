//! MySQL's text for the statements every backend runs alike (`shared::Queries`): the
//! only part of those that differs between dialects, kept apart from the code that runs
//! them.

use super::super::rows::task_columns;
use super::super::shared::{GateRow, ManyRows, Queries};

/// The statements every backend runs alike (see `shared` and `tx`).
pub(super) const QUERIES: Queries = Queries {
    get: concat!("SELECT ", task_columns!(), " FROM tasks WHERE id = ?"),
    dependencies: "SELECT depends_on FROM task_deps WHERE task_id = ? ORDER BY depends_on",
    // In `tasks_lease` order, (state, lease_until): claimed leases first, each state's
    // oldest first. Ordered by `lease_until` alone, MariaDB read every lapsed lease (or,
    // choosing another index, every claimed and running task) and sorted them to return
    // the first 1 000: in the 10⁶ soak, with 87 000 claims of killed dispatchers lapsed,
    // each read took 15–55 s and they piled up until the database did nothing else. In
    // index order it stops after `limit` rows.
    lapsed_leases: "SELECT id, task_type, state, attempt, max_retries, lease_token \
             FROM tasks FORCE INDEX (tasks_lease) \
             WHERE state IN ('claimed', 'running') AND lease_until < ? \
             ORDER BY state, lease_until LIMIT ?",
    heartbeat: "INSERT INTO dispatchers (id, heartbeat_at, shares) VALUES (?, ?, ?) \
                ON DUPLICATE KEY UPDATE heartbeat_at = VALUES(heartbeat_at), \
                shares = VALUES(shares)",
    forget_members: "DELETE FROM dispatchers WHERE heartbeat_at < ?",
    live_members: "SELECT id FROM dispatchers WHERE heartbeat_at >= ? ORDER BY id",
    heartbeat_and_live: None,
    live_shares: "SELECT shares FROM dispatchers WHERE heartbeat_at >= ? AND shares IS NOT NULL",
    remove_member: "DELETE FROM dispatchers WHERE id = ?",
    release_claims: "UPDATE tasks SET state = 'pending', lease_until = NULL, owner = NULL, \
                     updated_at = ? WHERE state = 'claimed' AND owner = ?",
    skip_locked: " FOR UPDATE SKIP LOCKED",
    database_clock: Some("SELECT CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED)"),
    // Not INSERT IGNORE, which would also turn a value the table refuses into a warning
    // and a row that is not the message: the no-op update skips only the duplicate key.
    record_kafka_dead_letter: "INSERT INTO kafka_dead_letters (topic, kafka_partition, kafka_offset, message, \
                               message_size, reason, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?) \
                               ON DUPLICATE KEY UPDATE topic = topic",
    // MySQL deletes with ORDER BY and LIMIT in one statement, walking
    // kafka_dead_letters_recent; concurrent purgers wait for each other's few rows.
    purge_kafka_dead_letters: "DELETE FROM kafka_dead_letters WHERE recorded_at < ? \
                               ORDER BY recorded_at LIMIT ?",
    pause: "INSERT IGNORE INTO job_pauses (task_type, paused_at) VALUES (?, ?)",
    resume: "DELETE FROM job_pauses WHERE task_type = ?",
    paused_types: "SELECT task_type, paused_at FROM job_pauses ORDER BY task_type",
    next_pending_eta: "SELECT trigger_at FROM tasks FORCE INDEX (tasks_by_type_state) \
                       WHERE task_type = ? AND state = 'pending' \
                         AND trigger_at > ? AND trigger_at <= ? \
                       ORDER BY trigger_at LIMIT 1",
    job_limits: GateRow {
        new: "INSERT IGNORE INTO job_limits (task_type, tokens, refilled_at) VALUES (?, ?, ?)",
        lock: "SELECT tokens, refilled_at FROM job_limits WHERE task_type = ? FOR UPDATE",
        try_lock: "SELECT tokens, refilled_at FROM job_limits WHERE task_type = ? \
                          FOR UPDATE SKIP LOCKED",
        peek: "SELECT tokens, refilled_at FROM job_limits WHERE task_type = ?",
        save: "UPDATE job_limits SET tokens = ?, refilled_at = ? WHERE task_type = ?",
    },
    limiters: GateRow {
        new: "INSERT IGNORE INTO limiters (id, tokens, refilled_at) VALUES (?, ?, ?)",
        lock: "SELECT tokens, refilled_at FROM limiters WHERE id = ? FOR UPDATE",
        try_lock: "SELECT tokens, refilled_at FROM limiters WHERE id = ? \
                          FOR UPDATE SKIP LOCKED",
        peek: "SELECT tokens, refilled_at FROM limiters WHERE id = ?",
        save: "UPDATE limiters SET tokens = ?, refilled_at = ? WHERE id = ?",
    },
    key_buckets: GateRow {
        new: "INSERT IGNORE INTO key_buckets (id, tokens, refilled_at) VALUES (?, ?, ?)",
        lock: "SELECT tokens, refilled_at FROM key_buckets WHERE id = ? FOR UPDATE",
        try_lock: "SELECT tokens, refilled_at FROM key_buckets WHERE id = ? \
                          FOR UPDATE SKIP LOCKED",
        peek: "SELECT tokens, refilled_at FROM key_buckets WHERE id = ?",
        save: "UPDATE key_buckets SET tokens = ?, refilled_at = ? WHERE id = ?",
    },
    purge_key_buckets: "DELETE FROM key_buckets WHERE refilled_at < ? ORDER BY refilled_at LIMIT ?",
    limiter_waiter: "SELECT waiting, waiting_at FROM limiters WHERE id = ?",
    set_limiter_waiter: "UPDATE limiters SET waiting = ?, waiting_at = ? WHERE id = ?",
    set_tenant_weight: "INSERT INTO tenant_weights (task_type, tenant, weight, updated_at) \
                        VALUES (?, ?, ?, ?) \
                        ON DUPLICATE KEY UPDATE weight = VALUES(weight), \
                        updated_at = VALUES(updated_at)",
    delete_tenant_weight: "DELETE FROM tenant_weights WHERE task_type = ? AND tenant = ?",
    tenant_weights: "SELECT tenant, weight FROM tenant_weights WHERE task_type = ? \
                     ORDER BY tenant",
    // Pinned, as the other statements on the state index are (see the top of this file).
    running: "SELECT COUNT(*) FROM tasks FORCE INDEX (tasks_finished) \
              WHERE state = 'running' AND task_type = ?",
    limits_and_running: None,
    due_exists: "SELECT trigger_at FROM tasks FORCE INDEX (tasks_ranked_by_type) \
                 WHERE state = 'pending' AND task_type = ? AND claim_rank <= ? \
                   AND trigger_at <= ? LIMIT 1",
    dependency_state: "SELECT state FROM tasks WHERE id = ? LOCK IN SHARE MODE",
    // A duplicate key fails the INSERT, which InnoDB rolls back alone (the transaction
    // goes on), and is told apart from every other error by its code. `INSERT IGNORE`
    // would also turn other errors (truncated values, bad data) into warnings, and
    // `ON DUPLICATE KEY UPDATE id = id` cannot tell a duplicate from an insert here:
    // sqlx sets CLIENT_FOUND_ROWS, under which both report one affected row.
    insert_tasks_conflict: "",
    insert_many: ManyRows::AllOrNothing,
    holder_by_idempotency_key: "SELECT id, trigger_at, task_type, payload FROM tasks \
                                WHERE idempotency_key = ? AND task_type = ?",
    holder_by_cron_key: "SELECT id, trigger_at FROM tasks WHERE cron_key = ?",
    holder_by_id: "SELECT id, trigger_at, task_type FROM tasks WHERE id = ?",
    holder_by_unique_key: "SELECT id, trigger_at FROM tasks \
                           WHERE unique_active = ? AND task_type = ?",
    release_unique: "UPDATE tasks FORCE INDEX (PRIMARY) SET unique_active = NULL \
                     WHERE id = ? AND unique_until <= ?",
    unique_expired: "SELECT id FROM tasks FORCE INDEX (tasks_unique_until) WHERE unique_until <= ? \
                     ORDER BY unique_until LIMIT ? FOR UPDATE SKIP LOCKED",
    // An upsert that changes nothing still takes the row's exclusive lock.
    open_window: "INSERT INTO key_windows (task_type, kind, window_key, opened_at, closes_at) \
                  VALUES (?, ?, ?, 0, 0) ON DUPLICATE KEY UPDATE closes_at = closes_at",
    read_window: "SELECT task_id, opened_at, closes_at FROM key_windows \
                  WHERE task_type = ? AND kind = ? AND window_key = ?",
    save_window: "UPDATE key_windows SET task_id = ?, opened_at = ?, closes_at = ? \
                  WHERE task_type = ? AND kind = ? AND window_key = ?",
    purge_windows: "DELETE FROM key_windows WHERE closes_at < ? \
                    AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = key_windows.task_id \
                                    AND t.state IN ('blocked', 'pending', 'claimed')) \
                    ORDER BY closes_at LIMIT ?",
    cool_down_key: "INSERT INTO key_cooldowns (task_type, concurrency_key, ends_at) \
                    VALUES (?, ?, ?) \
                    ON DUPLICATE KEY UPDATE ends_at = GREATEST(ends_at, VALUES(ends_at))",
    purge_cooldowns: "DELETE FROM key_cooldowns WHERE ends_at < ? ORDER BY ends_at LIMIT ?",
    expirable: "SELECT id, task_type FROM tasks FORCE INDEX (tasks_expiring) \
                WHERE expiring <= ? ORDER BY expiring LIMIT ? FOR UPDATE SKIP LOCKED",
    expire: "UPDATE tasks FORCE INDEX (PRIMARY) \
             SET state = 'expired', last_error = ?, unique_active = NULL, lease_until = NULL, \
                 owner = NULL, lease_token = lease_token + 1, updated_at = ? \
             WHERE id = ? AND expires_at <= ? AND state IN ('blocked', 'pending', 'claimed')",
    lock_rows: " FOR UPDATE",
    lock_skipping: " FOR UPDATE SKIP LOCKED",
    state: "SELECT state FROM tasks WHERE id = ?",
    cancel: "UPDATE tasks FORCE INDEX (PRIMARY) \
             SET state = 'cancelled', unique_active = NULL, lease_until = NULL, \
                 lease_token = lease_token + 1, updated_at = ? \
             WHERE id = ? AND state IN ('blocked', 'pending', 'claimed', 'running')",
    // MariaDB assigns left to right, each reading the values assigned before it: `state`
    // is read by its own assignment only.
    change: "UPDATE tasks FORCE INDEX (PRIMARY) \
             SET trigger_at = COALESCE(?, trigger_at), \
                 payload = COALESCE(?, payload), priority = COALESCE(?, priority), \
                 owner = NULL, lease_until = NULL, lease_token = lease_token + 1, updated_at = ?, \
                 state = CASE WHEN state = 'claimed' THEN 'pending' ELSE state END \
             WHERE id = ? AND state IN ('blocked', 'pending', 'claimed')",
    // rows_affected counts matched rows, not changed ones (sqlx sets CLIENT_FOUND_ROWS),
    // so an extension that moves nothing still reports that its token matched, as on
    // SQLite.
    succeed: "UPDATE tasks FORCE INDEX (PRIMARY) \
              SET state = 'succeeded', result = ?, \
                     unique_active = CASE WHEN unique_for > 0 THEN unique_active END, \
                  lease_until = NULL, owner = NULL, updated_at = ? \
              WHERE id = ? AND lease_token = ? AND state IN ('running', 'pending', 'dead')",
    retry: "UPDATE tasks FORCE INDEX (PRIMARY) \
            SET state = 'pending', trigger_at = ?, last_error = ?, \
                lease_until = NULL, owner = NULL, updated_at = ? \
            WHERE id = ? AND lease_token = ? AND state = 'running'",
    bury: "UPDATE tasks FORCE INDEX (PRIMARY) \
           SET state = 'dead', last_error = ?, unique_active = NULL, \
               lease_until = NULL, owner = NULL, updated_at = ? \
           WHERE id = ? AND lease_token = ? AND state = 'running'",
    release: "UPDATE tasks FORCE INDEX (PRIMARY) \
              SET state = 'pending', lease_until = NULL, owner = NULL, updated_at = ? \
              WHERE id = ? AND lease_token = ? AND state = 'claimed'",
    extend: "UPDATE tasks FORCE INDEX (PRIMARY) \
             SET lease_until = GREATEST(lease_until, ?), updated_at = ? \
             WHERE id = ? AND lease_token = ? AND state = 'running'",
    redrive: "UPDATE tasks FORCE INDEX (PRIMARY) \
              SET state = ?, attempt = 0, trigger_at = ?, \
                  lease_token = lease_token + 1, unique_active = unique_key, lease_until = NULL, updated_at = ? \
              WHERE id = ? AND state = 'dead'",
    redrive_holder: "SELECT b.id FROM tasks a JOIN tasks b \
                     ON b.unique_active = a.unique_key AND b.task_type = a.task_type \
                     WHERE a.id = ?",
    dead_letters: concat!(
        "SELECT ",
        task_columns!(),
        " FROM tasks WHERE state = 'dead' AND (? IS NULL OR task_type = ?) \
           AND (trigger_at < ? OR (trigger_at = ? AND id < ?)) \
         ORDER BY trigger_at DESC, id DESC LIMIT ?"
    ),
    // SUM is DECIMAL on MySQL: cast it back to the BIGINT the other backends return.
    purgeable: "SELECT id FROM tasks \
                WHERE task_type = ? AND state = ? AND updated_at < ? \
                  AND NOT EXISTS (SELECT 1 FROM task_deps d JOIN tasks c ON c.id = d.task_id \
                                 WHERE d.depends_on = tasks.id AND c.state = 'blocked') \
                ORDER BY updated_at, id LIMIT ? FOR UPDATE SKIP LOCKED",
};
