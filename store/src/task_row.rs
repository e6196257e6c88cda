//! A task's row as an insert writes it ([`TaskValues`], in [`crate::shared::INSERT_TASKS`]' column order),
//! and how many rows one insert statement carries. The inserts themselves are in
//! [`crate::tx`].

use std::collections::{HashMap, HashSet};

use asyncd_contract::TraceContext;

use crate::shared::ManyRows;
use crate::{ClaimedTask, Millis, NewTask, TaskState, domain};

/// The most rows one insert statement carries: 256 × 25 parameters stays well inside
/// every backend's limit (SQLite's is 32 766).
const MAX_ROWS_PER_INSERT: usize = 256;

/// A run of up to this many tasks goes in as one statement of its own size.
const EXACT_ROWS: usize = 16;

/// The most rows one bulk load carries (a batch submit holds at most
/// [`asyncd_contract::MAX_BATCH`]): its text stays a few hundred kilobytes.
pub(crate) const BULK_LOAD_MAX_ROWS: usize = 4_096;

/// Whether `task`'s row can go in by a bulk load, which has no way to leave out a row
/// whose key is taken: it holds no idempotency, unique or cron key. (Its id can still
/// be taken, by a redelivered Kafka message: the load then fails, and the insert runs
/// again without it.)
pub(crate) fn loadable(task: &NewTask) -> bool {
    task.idempotency_key.is_none() && task.unique_key.is_none() && task.cron_key.is_none()
}

/// How many of a run of `run` tasks one statement inserts.
///
/// Where a taken key leaves its row out ([`ManyRows::LeftOut`]): all of them up to
/// [`EXACT_ROWS`], else the most a multiple of it allows. So a run below
/// [`MAX_ROWS_PER_INSERT`] takes at most two statements (a group commit's runs are
/// mostly of 10–60 tasks; cut in powers of two they took four round trips on average),
/// and a connection prepares and caches at most 31 statement texts however batches are
/// cut (sqlx keeps 100).
///
/// Where a taken key fails the statement ([`ManyRows::AllOrNothing`]) and its rows are
/// tried again one by one, without being claimed: a power of two, so that the statement
/// one repeated key fails stays small (nine texts).
pub(crate) fn rows_per_statement(run: usize, many: ManyRows) -> usize {
    let most = run.clamp(1, MAX_ROWS_PER_INSERT);
    match many {
        ManyRows::LeftOut if most <= EXACT_ROWS => most,
        ManyRows::LeftOut => most / EXACT_ROWS * EXACT_ROWS,
        ManyRows::AllOrNothing => 1 << most.ilog2(),
    }
}

/// A task row's values, in [`crate::shared::INSERT_TASKS`]' column order. (`pub` only
/// because [`crate::tx::Dialect::load_tasks`] names it; its module is private.)
pub struct TaskValues<'a> {
    pub(crate) id: &'a str,
    pub(crate) task_type: &'a str,
    pub(crate) payload: &'a str,
    pub(crate) state: TaskState,
    pub(crate) priority: i16,
    pub(crate) trigger_at: Millis,
    pub(crate) max_retries: i64,
    pub(crate) timeout_ms: i64,
    pub(crate) idempotency_key: Option<&'a str>,
    pub(crate) unique_key: Option<&'a str>,
    /// The unique key while it is held ([`domain::unique_active`]).
    pub(crate) unique_active: Option<&'a str>,
    pub(crate) unique_for: i64,
    pub(crate) cron_key: Option<&'a str>,
    pub(crate) source_service: Option<&'a str>,
    pub(crate) last_error: Option<&'a str>,
    /// Both `created_at` and `updated_at`.
    pub(crate) now: Millis,
    pub(crate) lease_secret: String,
    pub(crate) concurrency_key: Option<&'a str>,
    pub(crate) traceparent: Option<String>,
    pub(crate) tracestate: Option<&'a str>,
    pub(crate) expires_at: Option<Millis>,
    /// Claimed as it is inserted ([`ClaimAtInsert`]): by whom, and until when.
    pub(crate) claim: Option<(&'a str, Millis)>,
}

/// Who claims, as they are inserted, the new tasks due by `horizon` (a Kafka consumer
/// that read them, [`super::Store::insert_consumed`]; a dispatcher in the submitting
/// process, [`super::Store::insert_claiming`]), and for how long. A task so claimed is
/// written once, where an insert and then a claim wrote it twice.
#[derive(Debug, Clone, Copy)]
pub struct ClaimAtInsert<'a> {
    pub owner: &'a str,
    pub hold: std::time::Duration,
    pub horizon: Millis,
    /// Per task type, how many tasks may be claimed at most; a type not listed is not
    /// claimed. `None`: any type, any number.
    pub room: Option<&'a HashMap<String, usize>>,
}

/// A [`ClaimAtInsert`] as one insert transaction applies it: the types paused in the
/// store, read in the transaction, and the room each type has left.
pub(crate) struct ClaimRoom<'c, 'a> {
    pub(crate) claim: &'c ClaimAtInsert<'a>,
    pub(crate) paused: &'c HashSet<String>,
    pub(crate) room: Option<&'c mut HashMap<String, usize>>,
}

impl ClaimRoom<'_, '_> {
    /// Whether `task` goes in claimed, taking its type's room if so.
    pub(crate) fn takes(&mut self, task: &NewTask) -> bool {
        if task.trigger_at > self.claim.horizon || self.paused.contains(&task.task_type) {
            return false;
        }
        match self.room.as_deref_mut() {
            None => true,
            Some(room) => match room.get_mut(&task.task_type) {
                Some(left) if *left > 0 => {
                    *left -= 1;
                    true
                }
                _ => false,
            },
        }
    }
}

impl ClaimAtInsert<'_> {
    /// When the claim of a task due at `trigger_at` lapses, as a claim would set it.
    pub(crate) fn lease_until(&self, trigger_at: Millis, now: Millis) -> Millis {
        trigger_at.max(now) + self.hold
    }
}

/// The new rows of `tasks`, pending, or claimed as `claim` takes them.
pub(crate) fn new_rows<'t, 'a: 't>(
    tasks: &'t [NewTask],
    now: Millis,
    mut claim: Option<&mut ClaimRoom<'_, 'a>>,
) -> Vec<TaskValues<'t>> {
    tasks
        .iter()
        .map(|task| {
            let row = TaskValues::new(task, TaskState::Pending, None, now);
            let claimed = claim.as_deref_mut().and_then(|claim| {
                let ClaimAtInsert { owner, .. } = *claim.claim;
                let until = claim.claim.lease_until(task.trigger_at, now);
                claim.takes(task).then_some((owner, until))
            });
            match claimed {
                Some((owner, until)) => row.claimed(owner, until),
                None => row,
            }
        })
        .collect()
}

impl<'a> TaskValues<'a> {
    /// A cancelled row under `id`, holding the id of a Kafka-routed task whose message
    /// has not been consumed: a cancel ahead of consumption, or a change's placeholder
    /// (`tx/kafka_changes.rs`). The consumer's insert of the message finds the id taken.
    pub(crate) fn placeholder(id: &'a str, task_type: &'a str, now: Millis) -> Self {
        Self {
            id,
            task_type,
            payload: "null",
            state: TaskState::Cancelled,
            priority: 0,
            trigger_at: now,
            max_retries: 0,
            timeout_ms: 0,
            idempotency_key: None,
            unique_key: None,
            unique_active: None,
            unique_for: 0,
            cron_key: None,
            source_service: None,
            last_error: Some("cancelled before it was consumed from Kafka"),
            now,
            lease_secret: crate::lease::new_secret(),
            concurrency_key: None,
            traceparent: None,
            tracestate: None,
            expires_at: None,
            claim: None,
        }
    }

    pub(crate) fn new(
        task: &'a NewTask,
        state: TaskState,
        last_error: Option<&'a str>,
        now: Millis,
    ) -> Self {
        Self {
            id: &task.id,
            task_type: &task.task_type,
            payload: task.payload.get(),
            state,
            priority: i16::from(task.priority),
            trigger_at: task.trigger_at,
            max_retries: i64::from(task.max_retries),
            timeout_ms: task.timeout_ms,
            idempotency_key: task.idempotency_key.as_deref(),
            unique_key: task.unique_key.as_deref(),
            unique_active: domain::unique_active(task, state),
            unique_for: super::duration_ms(task.unique_for),
            cron_key: task.cron_key.as_deref(),
            source_service: task.source_service.as_deref(),
            last_error,
            now,
            lease_secret: crate::lease::new_secret(),
            concurrency_key: task.concurrency_key.as_deref(),
            traceparent: task.trace.as_ref().map(TraceContext::traceparent),
            tracestate: task.trace.as_ref().and_then(|t| t.state.as_deref()),
            expires_at: task.expires_at,
            claim: None,
        }
    }

    /// The same row, claimed by `owner` until `lease_until` (its first lease token).
    pub(crate) fn claimed(self, owner: &'a str, lease_until: Millis) -> Self {
        Self {
            state: TaskState::Claimed,
            claim: Some((owner, lease_until)),
            ..self
        }
    }

    /// The task as the claim of this row hands it to its owner.
    pub(crate) fn claimed_task(&self, task: &NewTask) -> ClaimedTask {
        ClaimedTask {
            id: task.id.clone(),
            task_type: task.task_type.clone(),
            payload: task.payload.clone(),
            priority: task.priority,
            trigger_at: task.trigger_at,
            attempt: 0,
            max_retries: task.max_retries,
            timeout_ms: task.timeout_ms,
            lease_token: CLAIMED_AT_INSERT_TOKEN,
            idempotency_key: task.idempotency_key.clone(),
            lease_secret: self.lease_secret.clone(),
            concurrency_key: task.concurrency_key.clone(),
            trace: task.trace.clone(),
            expires_at: task.expires_at,
        }
    }
}

/// The lease token of a task claimed as it is inserted: the one a claim of a new task
/// (token 0, plus one) gives it.
pub(crate) const CLAIMED_AT_INSERT_TOKEN: i64 = 1;

#[cfg(test)]
mod tests {
    use super::*;

    /// The statements a run of `run` tasks is cut into, by their row counts.
    fn cut(mut run: usize, many: ManyRows) -> Vec<usize> {
        let mut statements = Vec::new();
        while run > 0 {
            let rows = rows_per_statement(run, many);
            statements.push(rows);
            run -= rows;
        }
        statements
    }

    #[test]
    fn runs_go_in_as_few_statements_of_few_sizes() {
        let mut sizes = HashSet::new();
        for run in 1..=1_000 {
            let statements = cut(run, ManyRows::LeftOut);
            assert_eq!(statements.iter().sum::<usize>(), run);
            let most = if run < MAX_ROWS_PER_INSERT {
                2
            } else {
                run.div_ceil(MAX_ROWS_PER_INSERT) + 1
            };
            assert!(statements.len() <= most, "{run}: {statements:?}");
            sizes.extend(statements);
        }
        assert_eq!(sizes.len(), 31, "statement texts a connection caches");
        assert_eq!(cut(37, ManyRows::LeftOut), [32, 5]);
        assert_eq!(cut(12, ManyRows::LeftOut), [12]);
        // One taken key fails the whole statement here: the statements stay powers of two.
        assert_eq!(cut(37, ManyRows::AllOrNothing), [32, 4, 1]);
        assert_eq!(cut(300, ManyRows::AllOrNothing), [256, 32, 8, 4]);
    }
}
