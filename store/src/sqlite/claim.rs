//! SQLite's claim of due tasks in claim order: each type's pending tasks walked on
//! `tasks_ranked_by_type`, stopped at the claim's limit.
//!
//! One type is one range of that index. Several types are one branch per type, each
//! stopped at the limit, then merged and cut to the limit again. The alternatives
//! cost more: a walk of every type's pending tasks in claim order needs an index of
//! them all (`tasks_pending_ranked`, which every new task wrote for the sake of
//! dispatchers serving several jobs; dropped by 0029), and `task_type IN (…)` makes
//! SQLite read every due task of each type and sort them. A claim of every type
//! ([`TypeFilter::All`](crate::TypeFilter)) first finds the types with pending tasks:
//! a skip-scan of the same index, one probe per type.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use super::claim_columns;

/// SQLite refuses a compound statement of more than 500 parts
/// (`SQLITE_MAX_COMPOUND_SELECT`): a claim of more types than this picks in runs of this
/// many, merges what the runs picked, and claims that by id, in one transaction.
pub(super) const TYPES_PER_STATEMENT: usize = 400;

/// The ids and ranks of up to `?5` due tasks of `types` types, bound from `?6` on, in
/// claim order: `?2` now, `?4` the horizon (claim rank and trigger time at most that).
/// `?1` and `?3` are not read.
pub(super) fn pick_due_sql(types: usize) -> String {
    let branch = |n: usize| {
        format!(
            "SELECT id, claim_rank FROM tasks INDEXED BY tasks_ranked_by_type \
             WHERE state = 'pending' AND claim_rank <= ?4 AND trigger_at <= ?4 \
               AND task_type = ?{n} AND task_type NOT IN (SELECT task_type FROM job_pauses) \
             ORDER BY claim_rank, id LIMIT ?5",
            n = n + 6
        )
    };
    match types {
        1 => branch(0),
        _ => {
            let branches: Vec<String> = (0..types)
                .map(|n| format!("SELECT * FROM ({})", branch(n)))
                .collect();
            format!(
                "SELECT id, claim_rank FROM ({}) ORDER BY claim_rank, id LIMIT ?5",
                branches.join(" UNION ALL ")
            )
        }
    }
}

/// The claim of what [`pick_due_sql`] picks, bound alike: `?1` the owner, `?2` now, `?3`
/// the hold in milliseconds. Written once per number of types and kept: every claim of a
/// dispatcher asks for the same one (at most [`TYPES_PER_STATEMENT`] texts).
pub(super) fn claim_due_sql(types: usize) -> Arc<str> {
    static WRITTEN: LazyLock<Mutex<HashMap<usize, Arc<str>>>> = LazyLock::new(Default::default);
    WRITTEN
        .lock()
        .expect("no claim panics holding it")
        .entry(types)
        .or_insert_with(|| write_claim_due_sql(types).into())
        .clone()
}

fn write_claim_due_sql(types: usize) -> String {
    format!(
        "UPDATE tasks SET state = 'claimed', lease_token = lease_token + 1, \
                owner = ?1, lease_until = MAX(trigger_at, ?2) + ?3, updated_at = ?2 \
         WHERE id IN (SELECT id FROM ({})) RETURNING {}",
        pick_due_sql(types),
        claim_columns!()
    )
}

/// The task types with pending tasks, in order: one probe of `tasks_ranked_by_type` per
/// type.
pub(super) const PENDING_TYPES: &str = "WITH RECURSIVE types(task_type) AS ( \
       SELECT (SELECT task_type FROM tasks INDEXED BY tasks_ranked_by_type \
               WHERE state = 'pending' ORDER BY task_type LIMIT 1) \
       UNION ALL \
       SELECT (SELECT t.task_type FROM tasks t INDEXED BY tasks_ranked_by_type \
               WHERE t.state = 'pending' AND t.task_type > types.task_type \
               ORDER BY t.task_type LIMIT 1) \
       FROM types WHERE types.task_type IS NOT NULL) \
     SELECT task_type FROM types WHERE task_type IS NOT NULL";

/// `query` (of [`pick_due_sql`] or [`claim_due_sql`]) with `params` and `types` bound.
pub(super) fn bind_due<'q, O>(
    query: sqlx::query::QueryAs<'q, sqlx::Sqlite, O, sqlx::sqlite::SqliteArguments>,
    params: &crate::ClaimParams<'q>,
    types: &'q [String],
) -> sqlx::query::QueryAs<'q, sqlx::Sqlite, O, sqlx::sqlite::SqliteArguments> {
    let mut query = query
        .bind(params.owner)
        .bind(params.now)
        .bind(crate::millis::duration_ms(params.hold))
        .bind(params.horizon)
        .bind(i64::from(params.limit));
    for task_type in types {
        query = query.bind(task_type.as_str());
    }
    query
}
