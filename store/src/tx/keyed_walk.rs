//! What differs between the dialects in the fair claim's walk over a job's keys.

/// How the fair claim's walk over a job's keys (`fair_claim::walk`) names `tasks` and
/// tests its rows, so that each of its probes reads `tasks_keyed` in key and rank order
/// whatever the planner's statistics say: with an index hint where the dialect has one,
/// and on PostgreSQL with the terms another index could serve written so that none can
/// (a never-analysed table, as after a bulk load, otherwise has it read a job's every
/// pending task through `tasks_by_type_state` for each key).
#[derive(Debug, Clone, Copy)]
pub struct KeyedWalk {
    /// `tasks`, with the dialect's hint for `tasks_keyed`.
    pub table: &'static str,
    /// The tasks whose keys the skip-scan steps to: the active ones, in the words of the
    /// partial index's predicate (SQLite uses a partial index only for a statement that
    /// repeats them), or on MariaDB, whose index holds every task by state, the pending.
    pub walked: &'static str,
    /// That a task is pending.
    pub pending: &'static str,
    /// `trigger_at` as the due test compares it.
    pub trigger_at: &'static str,
    /// Whether the walk steps from key to key in one statement per key, from Rust,
    /// rather than in one recursive statement: MariaDB reads a subquery's index range
    /// bounded by the row it is evaluated for from the range's start (a `ref` on the
    /// type and state), so each step of a recursive walk read every key before it.
    pub stepwise: bool,
    /// A setting the keyless window's statement runs under (`SET LOCAL`, so in a
    /// transaction of its own): on PostgreSQL sorts off, so that a never-analysed
    /// table's plan walks `tasks_ranked_by_type` in rank order instead of sorting the
    /// type's every pending task; its `state = 'pending'` is what that partial index
    /// needs, and it makes `tasks_by_type_state` look as good.
    pub keyless_setting: Option<&'static str>,
    /// The table as the keyless window names it to read one type's pending tasks in
    /// rank order through `tasks_ranked_by_type` (with the dialect's index hint where
    /// it has one).
    pub pending_by_rank: &'static str,
    /// The least key past every key of the tenant of the key in the column named: the
    /// tenant (as `Dialect::TENANT_OF_KEY` reads it) followed by U+0020, the character
    /// after the separator.
    pub after_tenant_of: fn(&str) -> String,
}
