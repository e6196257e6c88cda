//! Rows as the queries return them, one struct per query shape, shared by the backends,
//! each with one conversion into the store's types.
//!
//! The backends store the same values in different column types (PostgreSQL's
//! `priority` is a SMALLINT and `attempt` an INTEGER where SQLite has one integer type;
//! MariaDB's dedupe keys are VARBINARY, see its migration), so two column types here
//! decode whatever each backend stores: [`Int`] and [`Key`].

use serde_json::value::RawValue;
use sqlx::decode::Decode;
use sqlx::error::BoxDynError;
use sqlx::mysql::{MySql, MySqlTypeInfo, MySqlValueRef};
use sqlx::postgres::{PgTypeInfo, PgValueRef, Postgres};
use sqlx::sqlite::{Sqlite, SqliteTypeInfo, SqliteValueRef};
use sqlx::types::Type;

use super::{
    ClaimedTask, DueBacklog, JobCounts, Lapsed, Millis, Result, StoreError, TaskRecord, TaskState,
};

/// An integer column of any width.
#[derive(Debug, Clone, Copy)]
pub struct Int(pub i64);

impl Int {
    /// A column the store only ever writes from a `T` (a priority, an attempt count).
    fn narrow<T: TryFrom<i64>>(self, column: &str) -> Result<T> {
        T::try_from(self.0)
            .map_err(|_| StoreError::Corrupt(format!("{column} {} is out of range", self.0)))
    }
}

impl Type<Postgres> for Int {
    fn type_info() -> PgTypeInfo {
        <i64 as Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <i16 as Type<Postgres>>::compatible(ty)
            || <i32 as Type<Postgres>>::compatible(ty)
            || <i64 as Type<Postgres>>::compatible(ty)
    }
}

impl<'r> Decode<'r, Postgres> for Int {
    // PostgreSQL's integer decoder reads any width from the value's length.
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        <i64 as Decode<Postgres>>::decode(value).map(Int)
    }
}

impl Type<MySql> for Int {
    fn type_info() -> MySqlTypeInfo {
        <i64 as Type<MySql>>::type_info()
    }

    fn compatible(ty: &MySqlTypeInfo) -> bool {
        <i64 as Type<MySql>>::compatible(ty)
    }
}

impl<'r> Decode<'r, MySql> for Int {
    fn decode(value: MySqlValueRef<'r>) -> Result<Self, BoxDynError> {
        <i64 as Decode<MySql>>::decode(value).map(Int)
    }
}

impl Type<Sqlite> for Int {
    fn type_info() -> SqliteTypeInfo {
        <i64 as Type<Sqlite>>::type_info()
    }

    fn compatible(ty: &SqliteTypeInfo) -> bool {
        <i64 as Type<Sqlite>>::compatible(ty)
    }
}

impl<'r> Decode<'r, Sqlite> for Int {
    fn decode(value: SqliteValueRef<'r>) -> Result<Self, BoxDynError> {
        <i64 as Decode<Sqlite>>::decode(value).map(Int)
    }
}

/// A dedupe key: text, or on MariaDB UTF-8 bytes (VARBINARY, see its migration).
#[derive(Debug, Clone)]
pub struct Key(pub String);

impl Type<Postgres> for Key {
    fn type_info() -> PgTypeInfo {
        <String as Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <String as Type<Postgres>>::compatible(ty)
    }
}

impl<'r> Decode<'r, Postgres> for Key {
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        <String as Decode<Postgres>>::decode(value).map(Key)
    }
}

impl Type<MySql> for Key {
    fn type_info() -> MySqlTypeInfo {
        <[u8] as Type<MySql>>::type_info()
    }

    fn compatible(ty: &MySqlTypeInfo) -> bool {
        <[u8] as Type<MySql>>::compatible(ty)
    }
}

impl<'r> Decode<'r, MySql> for Key {
    fn decode(value: MySqlValueRef<'r>) -> Result<Self, BoxDynError> {
        let bytes = <Vec<u8> as Decode<MySql>>::decode(value)?;
        Ok(Key(String::from_utf8(bytes)?))
    }
}

impl Type<Sqlite> for Key {
    fn type_info() -> SqliteTypeInfo {
        <String as Type<Sqlite>>::type_info()
    }

    fn compatible(ty: &SqliteTypeInfo) -> bool {
        <String as Type<Sqlite>>::compatible(ty)
    }
}

impl<'r> Decode<'r, Sqlite> for Key {
    fn decode(value: SqliteValueRef<'r>) -> Result<Self, BoxDynError> {
        <String as Decode<Sqlite>>::decode(value).map(Key)
    }
}

fn raw(text: String) -> Result<Box<RawValue>> {
    RawValue::from_string(text).map_err(|e| StoreError::Corrupt(format!("stored JSON: {e}")))
}

/// The columns [`TaskRow`] reads, as a literal so queries built with `concat!` stay
/// `&'static str` (no `AssertSqlSafe` needed).
macro_rules! task_columns {
    () => {
        "id, task_type, payload, state, priority, trigger_at, attempt, max_retries, \
         timeout_ms, lease_token, lease_until, idempotency_key, unique_key, last_error, \
         result, created_at, updated_at, lease_secret, expires_at"
    };
}
pub(crate) use task_columns;

/// The columns [`ClaimRow`] reads.
macro_rules! claim_columns {
    () => {
        "id, task_type, payload, priority, trigger_at, attempt, max_retries, timeout_ms, \
         lease_token, idempotency_key, lease_secret, concurrency_key, traceparent, tracestate, \
         expires_at"
    };
}
pub(crate) use claim_columns;

/// A whole task, as `get` and `dead_letters` read it.
#[derive(sqlx::FromRow)]
pub struct TaskRow {
    id: String,
    task_type: String,
    payload: String,
    state: String,
    priority: Int,
    trigger_at: Millis,
    attempt: Int,
    max_retries: Int,
    timeout_ms: i64,
    lease_token: i64,
    lease_until: Option<Millis>,
    idempotency_key: Option<Key>,
    unique_key: Option<Key>,
    last_error: Option<String>,
    result: Option<String>,
    created_at: Millis,
    updated_at: Millis,
    lease_secret: Option<String>,
    expires_at: Option<Millis>,
}

impl TaskRow {
    /// The record, without its dependencies (another table).
    pub fn into_record(self) -> Result<TaskRecord> {
        Ok(TaskRecord {
            id: self.id,
            task_type: self.task_type,
            payload: raw(self.payload)?,
            state: TaskState::parse(&self.state)?,
            priority: self.priority.narrow("priority")?,
            trigger_at: self.trigger_at,
            attempt: self.attempt.narrow("attempt")?,
            max_retries: self.max_retries.narrow("max_retries")?,
            timeout_ms: self.timeout_ms,
            lease_token: self.lease_token,
            lease_until: self.lease_until,
            idempotency_key: self.idempotency_key.map(|k| k.0),
            unique_key: self.unique_key.map(|k| k.0),
            depends_on: Vec::new(),
            last_error: self.last_error,
            result: self.result.map(raw).transpose()?,
            created_at: self.created_at,
            updated_at: self.updated_at,
            lease_secret: self.lease_secret.unwrap_or_default(),
            expires_at: self.expires_at,
        })
    }
}

/// A task as a claim returns it ([`claim_columns`]).
#[derive(sqlx::FromRow)]
pub struct ClaimRow {
    id: String,
    task_type: String,
    payload: String,
    priority: Int,
    trigger_at: Millis,
    attempt: Int,
    max_retries: Int,
    timeout_ms: i64,
    lease_token: i64,
    idempotency_key: Option<Key>,
    lease_secret: Option<String>,
    concurrency_key: Option<Key>,
    traceparent: Option<String>,
    tracestate: Option<String>,
    expires_at: Option<Millis>,
}

impl ClaimRow {
    pub fn into_claimed(self) -> Result<ClaimedTask> {
        Ok(ClaimedTask {
            id: self.id,
            task_type: self.task_type,
            payload: raw(self.payload)?,
            priority: self.priority.narrow("priority")?,
            trigger_at: self.trigger_at,
            attempt: self.attempt.narrow("attempt")?,
            max_retries: self.max_retries.narrow("max_retries")?,
            timeout_ms: self.timeout_ms,
            lease_token: self.lease_token,
            idempotency_key: self.idempotency_key.map(|k| k.0),
            lease_secret: self.lease_secret.unwrap_or_default(),
            concurrency_key: self.concurrency_key.map(|k| k.0),
            // Written only after validation, so always valid unless written by hand;
            // an invalid one is then left out, as a receiver ignores a bad header.
            trace: self.traceparent.and_then(|parent| {
                asyncd_contract::TraceContext::parse(&parent, self.tracestate.as_deref())
            }),
            expires_at: self.expires_at,
        })
    }
}

/// Claimed rows, earliest `(trigger_at, id)` first.
pub fn claimed(rows: Vec<ClaimRow>) -> Result<Vec<ClaimedTask>> {
    let mut claimed = rows
        .into_iter()
        .map(ClaimRow::into_claimed)
        .collect::<Result<Vec<_>>>()?;
    super::domain::sort_claimed(&mut claimed);
    Ok(claimed)
}

/// The rows [`Store::start_due`](crate::Store::start_due) began, read after the write:
/// each task as its claim would have read it (the attempt before this one) with the
/// attempt that began, in rank order.
pub fn started_due(rows: Vec<ClaimRow>) -> Result<Vec<(ClaimedTask, super::Started)>> {
    let mut tasks = claimed(rows)?;
    tasks
        .iter_mut()
        .map(|task| {
            let started = super::Started {
                id: task.id.clone(),
                attempt: task.attempt,
                lease_token: task.lease_token,
            };
            task.attempt = task.attempt.checked_sub(1).ok_or_else(|| {
                StoreError::Corrupt(format!("task {} began with attempt 0", task.id))
            })?;
            Ok(started)
        })
        .collect::<Result<Vec<_>>>()
        .map(|started| tasks.into_iter().zip(started).collect())
}

#[derive(sqlx::FromRow)]
pub struct LapsedRow {
    id: String,
    task_type: String,
    state: String,
    attempt: Int,
    max_retries: Int,
    lease_token: i64,
}

impl LapsedRow {
    pub fn into_lapsed(self) -> Result<Lapsed> {
        Ok(Lapsed {
            id: self.id,
            task_type: self.task_type,
            state: TaskState::parse(&self.state)?,
            attempt: self.attempt.narrow("attempt")?,
            max_retries: self.max_retries.narrow("max_retries")?,
            lease_token: self.lease_token,
        })
    }
}

/// A row of a batch `start`, which names the task it started.
#[derive(sqlx::FromRow)]
pub struct BatchStarted {
    pub id: String,
    #[sqlx(flatten)]
    pub started: StartedRow,
}

/// The attempts of a batch `start` that began, in the order `claims` asked for them, as
/// the backends that begin one claim at a time answer. Each is matched to its claim by id
/// *and* token (a start moves the token on by one): a dispatcher may hold two claims of
/// one task — one given up by a change (`PATCH`, a debounce) and the task's claim since,
/// with the new payload — and only the live one began; the other must not be run.
pub fn started_in_order(
    claims: &[(String, i64)],
    rows: Vec<BatchStarted>,
) -> Result<Vec<super::Started>> {
    let mut started: std::collections::HashMap<(String, i64), super::Started> = rows
        .into_iter()
        .map(|row| {
            let claimed_with = row.started.lease_token - 1;
            Ok((
                (row.id.clone(), claimed_with),
                row.started.into_started(row.id)?,
            ))
        })
        .collect::<Result<_>>()?;
    Ok(claims
        .iter()
        .filter_map(|(id, token)| started.remove(&(id.clone(), *token)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn began(id: &str, attempt: i64, token: i64) -> BatchStarted {
        BatchStarted {
            id: id.into(),
            started: StartedRow {
                attempt: Int(attempt),
                lease_token: token,
            },
        }
    }

    #[test]
    fn a_started_attempt_goes_to_the_claim_it_began_not_a_stale_one_of_the_task() {
        let claims = [
            ("a".to_string(), 3),
            ("a".to_string(), 5),
            ("b".to_string(), 1),
        ];
        let started = started_in_order(&claims, vec![began("b", 1, 2), began("a", 1, 6)]).unwrap();
        let got: Vec<(&str, i64)> = started
            .iter()
            .map(|s| (s.id.as_str(), s.lease_token))
            .collect();
        assert_eq!(
            got,
            [("a", 6), ("b", 2)],
            "claim (a, 3) was given up: no attempt"
        );
    }
}

/// An attempt that began: the new attempt number and token.
#[derive(sqlx::FromRow)]
pub struct StartedRow {
    pub attempt: Int,
    pub lease_token: i64,
}

impl StartedRow {
    pub fn into_started(self, id: String) -> Result<super::Started> {
        Ok(super::Started {
            id,
            attempt: self.attempt.narrow("attempt")?,
            lease_token: self.lease_token,
        })
    }
}

/// The task holding a key: `SELECT id, trigger_at`, and for an idempotency key also
/// `task_type, payload`, which tell a repeat from a different request under the key.
#[derive(sqlx::FromRow)]
pub struct Holder {
    pub id: String,
    pub trigger_at: Millis,
    #[sqlx(default)]
    pub task_type: Option<String>,
    #[sqlx(default)]
    pub payload: Option<String>,
}

impl Holder {
    /// Whether the holder is the request `task` repeats: its type and payload where
    /// both were read (an idempotency key's holder), its type where only that was (an
    /// id's holder), and `true` for a holder read with neither (a cron or unique key's,
    /// which are looked up within the type or name the job anyway).
    pub fn same_request(&self, task: &super::NewTask) -> bool {
        match (&self.task_type, &self.payload) {
            (Some(task_type), Some(payload)) => {
                super::domain::same_request(task, task_type, payload)
            }
            (Some(task_type), None) => *task_type == task.task_type,
            _ => true,
        }
    }
}

/// The row of `job_counts::job_counts`.
#[derive(sqlx::FromRow)]
pub struct JobCountsRow {
    due: Int,
    scheduled: Int,
    running: Int,
    dead: Int,
    oldest_pending: Option<Millis>,
    oldest_claimed: Option<Millis>,
    succeeded_since: Int,
    dead_since: Int,
}

impl From<JobCountsRow> for JobCounts {
    fn from(row: JobCountsRow) -> Self {
        JobCounts {
            due: row.due.0,
            scheduled: row.scheduled.0,
            running: row.running.0,
            dead: row.dead.0,
            oldest_due: earliest(row.oldest_pending, row.oldest_claimed),
            succeeded_since: row.succeeded_since.0,
            dead_since: row.dead_since.0,
        }
    }
}

/// The row of `job_counts::due_backlog`.
#[derive(sqlx::FromRow)]
pub struct DueBacklogRow {
    due: Int,
    oldest_pending: Option<Millis>,
    oldest_claimed: Option<Millis>,
}

impl From<DueBacklogRow> for DueBacklog {
    fn from(row: DueBacklogRow) -> Self {
        DueBacklog {
            due: row.due.0,
            oldest_due: earliest(row.oldest_pending, row.oldest_claimed),
        }
    }
}

fn earliest(a: Option<Millis>, b: Option<Millis>) -> Option<Millis> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A state read back to name why a transition did not apply.
pub fn state(text: Option<String>) -> Result<Option<TaskState>> {
    Ok(text.as_deref().map(TaskState::parse).transpose()?)
}

/// A key window as `read_window` reads it.
#[derive(sqlx::FromRow)]
pub struct KeyWindowRow {
    task_id: Option<String>,
    opened_at: Millis,
    closes_at: Millis,
}

impl From<KeyWindowRow> for crate::window::WindowRow {
    fn from(row: KeyWindowRow) -> Self {
        Self {
            task_id: row.task_id,
            opened_at: row.opened_at,
            closes_at: row.closes_at,
        }
    }
}
