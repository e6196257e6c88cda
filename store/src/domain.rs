//! The store's decisions, apart from any SQL: every backend asks these functions what a
//! transition does and only carries it out in its dialect, so the three backends cannot
//! drift apart on what a state or a conflict means.

use std::collections::HashMap;
use std::time::Duration;

use asyncd_spec::RateLimit;

use super::{
    CancelOutcome, ClaimedTask, FinishKind, HeldBy, InsertOutcome, Millis, NewTask, RedriveOutcome,
    TaskState,
};

/// How often an insert or a redrive that hit a unique key is tried again when the task
/// holding the key finished (freeing it) before the conflict could be named.
pub const CONFLICT_ATTEMPTS: usize = 3;

/// How much of an executor's error text is kept in `last_error`.
pub const MAX_REASON_CHARS: usize = 1024;

/// Makes text from an executor fit to store on every backend (the store applies it to
/// every error it writes, whoever sent it): no NUL (PostgreSQL refuses
/// it in text) or other control characters but tab and newline, at most
/// [`MAX_REASON_CHARS`] characters.
pub fn sanitize_reason(text: &str) -> String {
    let mut out: String = text
        .chars()
        .map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                '\u{FFFD}'
            } else {
                c
            }
        })
        .take(MAX_REASON_CHARS)
        .collect();
    if text.chars().nth(MAX_REASON_CHARS).is_some() {
        out.push('…');
    }
    out
}

/// What a new task starts as, decided by its dependencies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Initial {
    /// A `depends_on` id names no task: nothing is inserted.
    UnknownDependency(String),
    Start {
        state: TaskState,
        last_error: Option<String>,
    },
}

/// The starting state from each dependency's current state (`None`: no such task). Any
/// failed dependency makes the task dead at once, all succeeded make it pending,
/// anything else leaves it blocked until they finish. Backends may stop reading
/// dependencies at the first unknown one: that decides the outcome.
pub fn initial_state<'a>(
    dependencies: impl IntoIterator<Item = (&'a str, Option<TaskState>)>,
) -> Initial {
    let mut state = TaskState::Pending;
    let mut last_error = None;
    for (dep, dep_state) in dependencies {
        match dep_state {
            None => return Initial::UnknownDependency(dep.to_string()),
            Some(TaskState::Dead | TaskState::Cancelled | TaskState::Expired) => {
                state = TaskState::Dead;
                last_error = Some(dependency_failed(dep));
            }
            Some(TaskState::Succeeded) => {}
            Some(_) if state == TaskState::Pending => state = TaskState::Blocked,
            Some(_) => {}
        }
    }
    Initial::Start { state, last_error }
}

/// The `last_error` of a task that expired ([`crate::Store::expire`]).
pub const EXPIRED: &str = "expired: no attempt had begun by its expires_at";

/// The `last_error` of a task that will never run because `dep` failed.
pub fn dependency_failed(dep: &str) -> String {
    format!("dependency {dep} failed")
}

/// The value of the `unique_active` column: the unique key while the task can still
/// run, none once it cannot (a task dead on arrival holds no key).
pub fn unique_active(task: &NewTask, state: TaskState) -> Option<&str> {
    (state != TaskState::Dead)
        .then_some(task.unique_key.as_deref())
        .flatten()
}

/// A key an insert may have conflicted on, with the value the task brought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConflictKey<'a> {
    Idempotency(&'a str),
    Cron(&'a str),
    /// The same task again: a Kafka message consumed twice.
    Id(&'a str),
    /// Another unfinished task holds the unique key (`unique_active`).
    Unique(&'a str),
}

impl<'a> ConflictKey<'a> {
    pub fn value(self) -> &'a str {
        match self {
            Self::Idempotency(v) | Self::Cron(v) | Self::Id(v) | Self::Unique(v) => v,
        }
    }

    /// Whether the key is unique within its task type only (looked up with the type),
    /// rather than across all tasks: the keys a caller chooses, so that one job's keys
    /// can neither block nor reveal another's.
    pub fn per_type(self) -> bool {
        matches!(self, Self::Idempotency(_) | Self::Unique(_))
    }

    /// The outcome when task `id` (triggering at `trigger_at`) holds this key;
    /// `same_request` says whether the holder is the request the new task repeats: for an
    /// idempotency key its type and payload ([`same_request`]), so that a key reused for
    /// a different request is refused rather than answered with the first task; for an
    /// id its type, so that a task of another job under the id is never taken for this
    /// one (it is no repeat, and its id must not be named to the caller).
    pub fn outcome(self, id: String, trigger_at: Millis, same_request: bool) -> InsertOutcome {
        match self {
            Self::Unique(_) => InsertOutcome::UniqueConflict { existing_id: id },
            Self::Idempotency(_) if !same_request => {
                InsertOutcome::IdempotencyMismatch { existing_id: id }
            }
            Self::Id(_) if !same_request => InsertOutcome::IdTaken { id },
            _ => InsertOutcome::Duplicate { id, trigger_at },
        }
    }
}

/// Whether a stored task (its type and payload text) is the request `task` repeats.
/// Payloads compare as JSON values, so spacing and member order do not matter (a client
/// that re-encodes the same value on a retry is repeating it); `1` and `1.0` differ.
pub fn same_request(task: &NewTask, task_type: &str, payload: &str) -> bool {
    if task.task_type != task_type {
        return false;
    }
    let parse = |text: &str| serde_json::from_str::<serde_json::Value>(text).ok();
    match (parse(task.payload.get()), parse(payload)) {
        (Some(new), Some(stored)) => new == stored,
        _ => task.payload.get() == payload,
    }
}

/// The keys to look up, in order, after an insert hit a constraint; the first one
/// another task holds names the outcome. Idempotency comes first: a repeat of the same
/// submit also repeats its unique key. If none is held, the holder of the unique key
/// finished in between and the insert is tried again.
pub fn conflict_keys(task: &NewTask) -> impl Iterator<Item = ConflictKey<'_>> {
    [
        task.idempotency_key
            .as_deref()
            .map(ConflictKey::Idempotency),
        task.cron_key.as_deref().map(ConflictKey::Cron),
        Some(ConflictKey::Id(&task.id)),
        task.unique_key.as_deref().map(ConflictKey::Unique),
    ]
    .into_iter()
    .flatten()
}

/// What a finish that applied does to the tasks waiting on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DependentsEffect {
    /// Blocked dependents whose dependencies have now all succeeded become pending.
    Release,
    /// Blocked dependents, and theirs, go to dead letters.
    Fail,
    None,
}

pub fn on_finish(kind: &FinishKind) -> DependentsEffect {
    match kind {
        FinishKind::Succeeded { .. } => DependentsEffect::Release,
        FinishKind::Dead { .. } => DependentsEffect::Fail,
        FinishKind::Retry { .. } | FinishKind::Release | FinishKind::Extend { .. } => {
            DependentsEffect::None
        }
    }
}

/// The outcome of a cancel that changed nothing, from the task's current state.
pub fn cancel_refused(current: Option<TaskState>) -> CancelOutcome {
    match current {
        None => CancelOutcome::NotFound,
        Some(state) => CancelOutcome::NotCancellable(state),
    }
}

/// The outcome of a redrive that changed nothing, from the task's current state.
pub fn redrive_refused(current: Option<TaskState>) -> RedriveOutcome {
    match current {
        None => RedriveOutcome::NotFound,
        Some(state) => RedriveOutcome::NotDead(state),
    }
}

/// The outcome of a redrive that hit the unique key, from the task now holding it;
/// `None` when the holder finished since, and the redrive is tried again.
pub fn redrive_conflict(holder: Option<String>) -> Option<RedriveOutcome> {
    holder.map(|existing_id| RedriveOutcome::UniqueConflict { existing_id })
}

/// Claims are answered best [`ClaimedTask::rank`] first (the order they were claimed
/// in), whatever order the database returned the rows in (`RETURNING` promises none).
pub fn sort_claimed(claimed: &mut [ClaimedTask]) {
    claimed.sort_by(|a, b| a.rank().cmp(&b.rank()));
}

/// The order in which to apply a batch: by id, so concurrent batches lock shared rows in
/// the same order instead of deadlocking, and stable, so two entries for one task (an
/// extension, then the result) keep their order. Outcomes still go back in input order.
pub fn lock_order<S: AsRef<str>>(ids: impl Iterator<Item = S>) -> Vec<usize> {
    let ids: Vec<S> = ids.collect();
    let mut order: Vec<usize> = (0..ids.len()).collect();
    order.sort_by(|&a, &b| ids[a].as_ref().cmp(ids[b].as_ref()));
    order
}

/// A job's token bucket as its `job_limits` row keeps it: thousandths of a token (so a
/// refill over a few milliseconds at a low rate is not lost to rounding) as of `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    pub milli_tokens: i64,
    pub at: Millis,
}

impl Bucket {
    /// A new job's bucket: full.
    pub fn full(rate: Option<RateLimit>, now: Millis) -> Self {
        Self {
            milli_tokens: rate.map_or(0, |r| i64::from(r.burst) * 1000),
            at: now,
        }
    }
}

/// How many of the attempts asked for may begin now, and the bucket refilled to `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    pub allowed: usize,
    pub bucket: Bucket,
    /// Why fewer than asked for may begin.
    pub held_by: Option<HeldBy>,
}

/// The start of `wanted` attempts of a job with `running` attempts under way (in the
/// store, by every dispatcher): at most `concurrency` in all, and with a rate limit one
/// token each. The bucket fills at `per_second` tokens a second up to `burst`, by the
/// time between the last start seen and `now`; a `now` before that (another
/// dispatcher's clock ahead of this one, within the clock check's 500 ms) adds nothing
/// and does not move the bucket back, so no clock makes tokens faster than the rate.
pub fn admit(
    wanted: usize,
    running: i64,
    concurrency: u32,
    rate: Option<RateLimit>,
    bucket: Bucket,
    now: Millis,
) -> Admission {
    let room = usize::try_from(i64::from(concurrency).saturating_sub(running)).unwrap_or(0);
    let Some(rate) = rate else {
        let allowed = wanted.min(room);
        return Admission {
            allowed,
            bucket,
            held_by: (allowed < wanted).then_some(HeldBy::Concurrency),
        };
    };
    let elapsed = now.as_i64().saturating_sub(bucket.at.as_i64()).max(0);
    let cap = i64::from(rate.burst) * 1000;
    let milli_tokens = bucket
        .milli_tokens
        .saturating_add(elapsed.saturating_mul(i64::from(rate.per_second)))
        .min(cap);
    let bucket = Bucket {
        milli_tokens,
        at: Millis::new(bucket.at.as_i64().max(now.as_i64())),
    };
    let tokens = usize::try_from(milli_tokens.max(0) / 1000).unwrap_or(0);
    let allowed = wanted.min(room).min(tokens);
    let held_by = if allowed == wanted {
        None
    } else if room <= tokens {
        Some(HeldBy::Concurrency)
    } else {
        // Thousandths of a token short of the next one, at `per_second` thousandths a
        // millisecond.
        let short = u64::try_from(1000 - (milli_tokens - allowed as i64 * 1000)).unwrap_or(0);
        Some(HeldBy::Rate {
            next_token: Duration::from_millis(short.div_ceil(u64::from(rate.per_second))),
        })
    };
    Admission {
        allowed,
        bucket,
        held_by,
    }
}

/// One limit a start must pass: the job's own, or a limiter it names
/// ([`JobGate::limiters`](crate::JobGate::limiters)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// Attempts under way that count against it, in the store.
    pub running: i64,
    pub concurrency: u32,
    pub rate: Option<RateLimit>,
    pub bucket: Bucket,
    /// What holds when its concurrency is the one that binds.
    pub held_by_concurrency: HeldBy,
}

/// [`admit`] through every limit in turn, each taking what the one before it admitted:
/// as many begin as the tightest allows. `held_by` names the last limit that cut the
/// number (the one that binds); the buckets come back refilled to `now`, in the order
/// given, for [`spend`].
pub fn admit_all(
    wanted: usize,
    limits: &[Limit],
    now: Millis,
) -> (usize, Vec<Bucket>, Option<HeldBy>) {
    let mut allowed = wanted;
    let mut held_by = None;
    let mut buckets = Vec::with_capacity(limits.len());
    for limit in limits {
        let admission = admit(
            allowed,
            limit.running,
            limit.concurrency,
            limit.rate,
            limit.bucket,
            now,
        );
        if admission.allowed < allowed {
            held_by = admission.held_by.map(|held| match held {
                HeldBy::Concurrency => limit.held_by_concurrency,
                other => other,
            });
        }
        allowed = admission.allowed;
        buckets.push(admission.bucket);
    }
    (allowed, buckets, held_by)
}

/// Which claims, in the order given, their keys leave room for: a claim whose key
/// already has `limit` attempts running (`running`, per key, in the store) or admitted
/// ahead of it in this batch is skipped, and the claims after it are still considered,
/// so one held-back key does not hold back the others. Claims without a key always
/// have room. The second value says whether a key held any claim back.
pub fn key_room(
    keys: &[Option<&str>],
    limit: Option<u32>,
    running: &HashMap<String, i64>,
) -> (Vec<usize>, bool) {
    let Some(limit) = limit else {
        return ((0..keys.len()).collect(), false);
    };
    let mut taken: HashMap<&str, i64> = HashMap::new();
    let mut room = Vec::with_capacity(keys.len());
    for (index, key) in keys.iter().enumerate() {
        let Some(key) = key else {
            room.push(index);
            continue;
        };
        let count = taken
            .entry(key)
            .or_insert_with(|| running.get(*key).copied().unwrap_or(0));
        if *count < i64::from(limit) {
            *count += 1;
            room.push(index);
        }
    }
    let held = room.len() < keys.len();
    (room, held)
}

/// The bucket after `started` attempts took a token each.
pub fn spend(bucket: Bucket, started: usize) -> Bucket {
    Bucket {
        milli_tokens: bucket.milli_tokens.saturating_sub(
            i64::try_from(started)
                .unwrap_or(i64::MAX)
                .saturating_mul(1000),
        ),
        at: bucket.at,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::value::RawValue;

    use super::*;

    fn task() -> NewTask {
        NewTask::test("a", Millis::new(5))
            .id("t")
            .payload("{}")
            .max_retries(0)
            .timeout_ms(1)
    }

    fn start(state: TaskState, last_error: Option<&str>) -> Initial {
        Initial::Start {
            state,
            last_error: last_error.map(str::to_string),
        }
    }

    #[test]
    fn no_dependencies_start_pending() {
        assert_eq!(initial_state([]), start(TaskState::Pending, None));
    }

    #[test]
    fn succeeded_dependencies_start_pending() {
        let deps = [
            ("a", Some(TaskState::Succeeded)),
            ("b", Some(TaskState::Succeeded)),
        ];
        assert_eq!(initial_state(deps), start(TaskState::Pending, None));
    }

    #[test]
    fn an_unfinished_dependency_blocks() {
        for unfinished in [
            TaskState::Blocked,
            TaskState::Pending,
            TaskState::Claimed,
            TaskState::Running,
        ] {
            let deps = [("a", Some(TaskState::Succeeded)), ("b", Some(unfinished))];
            assert_eq!(initial_state(deps), start(TaskState::Blocked, None));
        }
    }

    #[test]
    fn a_failed_dependency_kills_whatever_else_is_unfinished() {
        for failed in [TaskState::Dead, TaskState::Cancelled, TaskState::Expired] {
            let deps = [
                ("a", Some(TaskState::Running)),
                ("b", Some(failed)),
                ("c", Some(TaskState::Pending)),
            ];
            assert_eq!(
                initial_state(deps),
                start(TaskState::Dead, Some("dependency b failed"))
            );
        }
    }

    #[test]
    fn an_unknown_dependency_wins_over_everything() {
        let deps = [("a", Some(TaskState::Dead)), ("x", None), ("y", None)];
        assert_eq!(initial_state(deps), Initial::UnknownDependency("x".into()));
    }

    #[test]
    fn only_a_task_that_can_run_holds_its_unique_key() {
        let mut t = task();
        assert_eq!(unique_active(&t, TaskState::Pending), None);
        t.unique_key = Some("u".into());
        assert_eq!(unique_active(&t, TaskState::Pending), Some("u"));
        assert_eq!(unique_active(&t, TaskState::Blocked), Some("u"));
        assert_eq!(unique_active(&t, TaskState::Dead), None);
    }

    #[test]
    fn conflicts_are_named_idempotency_first_unique_last() {
        let mut t = task();
        assert_eq!(
            conflict_keys(&t).collect::<Vec<_>>(),
            [ConflictKey::Id("t")]
        );
        t.unique_key = Some("u".into());
        t.cron_key = Some("c".into());
        t.idempotency_key = Some("i".into());
        assert_eq!(
            conflict_keys(&t).collect::<Vec<_>>(),
            [
                ConflictKey::Idempotency("i"),
                ConflictKey::Cron("c"),
                ConflictKey::Id("t"),
                ConflictKey::Unique("u"),
            ]
        );
    }

    #[test]
    fn a_reused_idempotency_key_is_a_mismatch_only_for_another_request() {
        let at = Millis::new(7);
        assert_eq!(
            ConflictKey::Idempotency("i").outcome("x".into(), at, false),
            InsertOutcome::IdempotencyMismatch {
                existing_id: "x".into()
            }
        );
        let mut t = task();
        t.payload = RawValue::from_string(r#"{"a": 1, "b": [2]}"#.into()).unwrap();
        assert!(same_request(&t, &t.task_type.clone(), r#"{"b":[2],"a":1}"#));
        assert!(!same_request(
            &t,
            &t.task_type.clone(),
            r#"{"a":1,"b":[3]}"#
        ));
        assert!(!same_request(
            &t,
            &t.task_type.clone(),
            r#"{"a":1.0,"b":[2]}"#
        ));
        assert!(!same_request(&t, "other", r#"{"a":1,"b":[2]}"#));
    }

    #[test]
    fn an_id_held_by_another_type_is_taken_not_a_duplicate() {
        assert_eq!(
            ConflictKey::Id("t").outcome("t".into(), Millis::new(7), false),
            InsertOutcome::IdTaken { id: "t".into() }
        );
    }

    #[test]
    fn a_held_unique_key_is_a_conflict_anything_else_a_duplicate() {
        let at = Millis::new(7);
        assert_eq!(
            ConflictKey::Unique("u").outcome("x".into(), at, true),
            InsertOutcome::UniqueConflict {
                existing_id: "x".into()
            }
        );
        for key in [
            ConflictKey::Idempotency("i"),
            ConflictKey::Cron("c"),
            ConflictKey::Id("t"),
        ] {
            assert_eq!(
                key.outcome("x".into(), at, true),
                InsertOutcome::Duplicate {
                    id: "x".into(),
                    trigger_at: at
                }
            );
        }
    }

    #[test]
    fn only_success_releases_and_only_death_fails_dependents() {
        let at = Millis::new(1);
        let cases = [
            (
                FinishKind::Succeeded { result: None },
                DependentsEffect::Release,
            ),
            (
                FinishKind::Dead { error: "e".into() },
                DependentsEffect::Fail,
            ),
            (
                FinishKind::Retry {
                    at,
                    error: "e".into(),
                },
                DependentsEffect::None,
            ),
            (FinishKind::Release, DependentsEffect::None),
            (FinishKind::Extend { until: at }, DependentsEffect::None),
        ];
        for (kind, effect) in cases {
            assert_eq!(on_finish(&kind), effect, "{kind:?}");
        }
    }

    #[test]
    fn refusals_name_the_current_state() {
        assert_eq!(cancel_refused(None), CancelOutcome::NotFound);
        assert_eq!(
            cancel_refused(Some(TaskState::Running)),
            CancelOutcome::NotCancellable(TaskState::Running)
        );
        assert_eq!(redrive_refused(None), RedriveOutcome::NotFound);
        assert_eq!(
            redrive_refused(Some(TaskState::Pending)),
            RedriveOutcome::NotDead(TaskState::Pending)
        );
        assert_eq!(
            redrive_conflict(Some("h".into())),
            Some(RedriveOutcome::UniqueConflict {
                existing_id: "h".into()
            })
        );
        assert_eq!(redrive_conflict(None), None);
    }

    #[test]
    fn batches_lock_by_id_keeping_repeats_in_order() {
        assert_eq!(lock_order(["b", "a", "b", "a"].iter()), [1, 3, 0, 2]);
    }

    const RATE: RateLimit = RateLimit {
        per_second: 10,
        burst: 5,
    };

    /// Starts as many as admitted at each instant, as the store does, and counts them.
    fn run(times: impl IntoIterator<Item = i64>, wanted: usize) -> (usize, Bucket) {
        let mut bucket = Bucket::full(Some(RATE), Millis::new(0));
        let mut begun = 0;
        for now in times {
            let admitted = admit(wanted, 0, 1000, Some(RATE), bucket, Millis::new(now));
            bucket = spend(admitted.bucket, admitted.allowed);
            begun += admitted.allowed;
        }
        (begun, bucket)
    }

    #[test]
    fn a_full_bucket_lets_its_burst_through_then_the_rate() {
        // The burst at once, then one every 100 ms: 5 + 10 over the next second, however
        // often the dispatchers ask.
        assert_eq!(run([0], 100).0, 5);
        assert_eq!(run((0..=1000).step_by(1), 100).0, 15);
        assert_eq!(run((0..=1000).step_by(5), 1).0, 15);
        assert_eq!(run((0..=10_000).step_by(250), 100).0, 105);
    }

    #[test]
    fn an_idle_bucket_fills_to_its_burst_and_no_more() {
        let (_, bucket) = run([0], 100);
        assert_eq!(bucket.milli_tokens, 0);
        let later = admit(100, 0, 1000, Some(RATE), bucket, Millis::new(60_000));
        assert_eq!(later.allowed, 5);
        assert_eq!(later.bucket.milli_tokens, 5_000);
    }

    #[test]
    fn fractions_of_a_token_are_kept_and_the_wait_for_the_next_is_told() {
        let empty = spend(Bucket::full(Some(RATE), Millis::new(0)), 5);
        // 40 ms at 10/s: 0.4 token, none to spend; the next in 60 ms.
        let at_40 = admit(1, 0, 1000, Some(RATE), empty, Millis::new(40));
        assert_eq!(at_40.allowed, 0);
        assert_eq!(
            at_40.held_by,
            Some(HeldBy::Rate {
                next_token: Duration::from_millis(60)
            })
        );
        assert_eq!(at_40.bucket.milli_tokens, 400);
        let at_100 = admit(1, 0, 1000, Some(RATE), at_40.bucket, Millis::new(100));
        assert_eq!((at_100.allowed, at_100.held_by), (1, None));
    }

    #[test]
    fn a_clock_behind_the_last_start_adds_nothing_and_moves_nothing_back() {
        let empty = spend(Bucket::full(Some(RATE), Millis::new(1_000)), 5);
        let behind = admit(1, 0, 1000, Some(RATE), empty, Millis::new(600));
        assert_eq!(behind.allowed, 0);
        assert_eq!(behind.bucket, empty);
    }

    #[test]
    fn the_tightest_limit_binds_and_names_itself() {
        let bucket = Bucket::full(None, Millis::new(0));
        let job = Limit {
            running: 2,
            concurrency: 10,
            rate: None,
            bucket,
            held_by_concurrency: HeldBy::Concurrency,
        };
        let shared = Limit {
            running: 5,
            concurrency: 6,
            rate: None,
            bucket,
            held_by_concurrency: HeldBy::Limiter,
        };
        let (allowed, buckets, held) = admit_all(4, &[job, shared], Millis::new(0));
        assert_eq!(
            (allowed, buckets.len(), held),
            (1, 2, Some(HeldBy::Limiter))
        );
        let (allowed, _, held) = admit_all(
            9,
            &[
                job,
                Limit {
                    running: 0,
                    ..shared
                },
            ],
            Millis::new(0),
        );
        assert_eq!((allowed, held), (6, Some(HeldBy::Limiter)));
        let (allowed, _, held) = admit_all(1, &[job, shared], Millis::new(0));
        assert_eq!((allowed, held), (1, None));
        let rated = Limit {
            rate: Some(RATE),
            bucket: Bucket {
                milli_tokens: 0,
                at: Millis::new(0),
            },
            ..shared
        };
        let (allowed, buckets, held) = admit_all(1, &[job, rated], Millis::new(0));
        assert_eq!(allowed, 0);
        assert!(matches!(held, Some(HeldBy::Rate { .. })), "{held:?}");
        assert_eq!(buckets[1].milli_tokens, 0);
    }

    #[test]
    fn running_attempts_count_against_the_concurrency_in_total() {
        let bucket = Bucket::full(None, Millis::new(0));
        let admitted = admit(10, 6, 8, None, bucket, Millis::new(0));
        assert_eq!(
            (admitted.allowed, admitted.held_by),
            (2, Some(HeldBy::Concurrency))
        );
        // More running than the limit (it was lowered): none, not an underflow.
        assert_eq!(admit(10, 9, 8, None, bucket, Millis::new(0)).allowed, 0);
        // Both limits: the tighter one holds, and says so.
        let full = Bucket::full(Some(RATE), Millis::new(0));
        let by_rate = admit(10, 0, 8, Some(RATE), full, Millis::new(0));
        assert_eq!(by_rate.allowed, 5);
        assert!(matches!(by_rate.held_by, Some(HeldBy::Rate { .. })));
        let by_slots = admit(10, 6, 8, Some(RATE), full, Millis::new(0));
        assert_eq!(
            (by_slots.allowed, by_slots.held_by),
            (2, Some(HeldBy::Concurrency))
        );
    }

    #[test]
    fn a_full_key_is_skipped_and_the_claims_behind_it_still_have_room() {
        let running = HashMap::from([("a".to_string(), 1), ("b".to_string(), 2)]);
        let keys = [
            Some("a"),
            Some("a"),
            Some("b"),
            None,
            Some("c"),
            Some("c"),
            Some("c"),
        ];
        let (room, held) = key_room(&keys, Some(2), &running);
        // "a" has one slot left, "b" none, "c" two; the keyless claim always fits.
        assert_eq!(room, vec![0, 3, 4, 5]);
        assert!(held);
        let (room, held) = key_room(&keys, None, &running);
        assert_eq!((room.len(), held), (keys.len(), false));
    }
}
