//! The [`Store`] trait: the one narrow interface every backend implements.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;

use crate::*;

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Applies pending migrations.
    async fn migrate(&self) -> Result<()>;
    async fn ping(&self) -> Result<()>;

    /// Inserts tasks in one transaction, one outcome per task in order.
    async fn insert(&self, tasks: &[NewTask], now: Millis) -> Result<Vec<InsertOutcome>>;
    /// Inserts a workflow — tasks that may depend on earlier ones of the same list — in
    /// one transaction, all or nothing. A `depends_on` id of an earlier task is read as
    /// the id that task ends up with (a repeat of an idempotency key answers with the
    /// first task's). The first outcome that is neither an insert nor such a repeat
    /// rolls everything back and is returned with its index.
    async fn insert_workflow(&self, tasks: &[NewTask], now: Millis) -> Result<WorkflowOutcome>;
    async fn get(&self, id: &str) -> Result<Option<TaskRecord>>;
    async fn cancel(&self, id: &str, now: Millis) -> Result<CancelOutcome>;
    /// Changes task `id` in place (its id kept) if it has not begun: pending, blocked,
    /// or claimed (the claim is given up, fenced by its token, so a dispatcher holding
    /// it never begins it with the old values). One statement, so a racing start either
    /// comes first (then the change answers [`ChangeOutcome::NotChangeable`]) or finds
    /// the claim gone; never half.
    async fn change(&self, id: &str, change: TaskChange<'_>, now: Millis) -> Result<ChangeOutcome>;
    /// Records task `id` of `task_type` as cancelled before it exists: a Kafka-routed
    /// task cancelled while its message still waits in the topic. When the consumer
    /// stores the message, the insert finds the id taken and nothing runs. `false` when
    /// a task with this id exists already (cancel that one instead).
    async fn insert_cancelled(&self, id: &str, task_type: &str, now: Millis) -> Result<bool>;

    /// Changes Kafka-routed task `id` of `task_type` whose message has not been consumed:
    /// writes a cancelled placeholder under the id, and the change, which the consumer
    /// applies to the task when it stores the message ([`Store::insert_consumed`]); a
    /// change before this one is kept for the members this one does not name. `false`
    /// when the id is taken otherwise (the task was consumed, or cancelled ahead of
    /// consumption): change the stored task instead. A cancel of the placeholder drops
    /// the change, and with it the task.
    async fn change_unconsumed(
        &self,
        id: &str,
        task_type: &str,
        change: TaskChange<'_>,
        now: Millis,
    ) -> Result<bool>;

    /// Claims up to `limit` pending tasks due by `horizon`, best `(claim_rank, id)` first
    /// (the trigger time moved 10 s earlier per priority level, [`ClaimedTask::rank`]),
    /// holding each until `max(trigger_at, now) + hold`. Tasks of a paused type
    /// ([`Store::pause`]) are never claimed, here or by [`Store::claim_ids`].
    async fn claim(&self, params: ClaimParams<'_>) -> Result<Vec<ClaimedTask>>;
    /// Claims these tasks if they are still pending, as [`Store::claim`] would.
    async fn claim_ids(&self, params: ClaimIdsParams<'_>) -> Result<Vec<ClaimedTask>>;
    /// Stores tasks consumed from Kafka and claims for `owner` the new ones due by
    /// `horizon`, so the consumer that read them dispatches them without a poll. Tasks
    /// already stored (a message consumed twice) are left alone; a task changed before
    /// it was consumed ([`Store::change_unconsumed`]) takes its placeholder's place,
    /// changed. A task whose key another request's task holds is not stored, and named
    /// in [`Consumed::refused`], so that the consumer can keep its message.
    async fn insert_consumed(&self, params: InsertConsumedParams<'_>) -> Result<Consumed>;
    /// [`Store::insert`], claiming for `claim.owner` as they go in the new tasks it
    /// allows (due by its horizon, of a type not paused, within each type's room): a
    /// dispatcher in the submitting process takes them straight into its heap. Only
    /// where the dialect inserts many rows per statement (SQLite, PostgreSQL); the rest
    /// go in pending. Returns the insert's outcomes and the tasks claimed.
    async fn insert_claiming(
        &self,
        tasks: &[NewTask],
        now: Millis,
        claim: ClaimAtInsert<'_>,
    ) -> Result<(Vec<InsertOutcome>, Vec<ClaimedTask>)>;
    /// What inserting `task` would answer against the task already holding its
    /// idempotency key: [`InsertOutcome::Duplicate`] or, for another type or payload,
    /// [`InsertOutcome::IdempotencyMismatch`]; `None` when no task holds it (or the task
    /// has no key). Inserts nothing.
    async fn find_idempotent(&self, task: &NewTask) -> Result<Option<InsertOutcome>>;
    /// The id of the task of type `task_type` holding idempotency key `key`, if any.
    async fn idempotency_key_holder(&self, task_type: &str, key: &str) -> Result<Option<String>>;
    /// Begins attempts on claimed tasks whose token still matches and whose type is not
    /// paused; each lease runs until `now + its timeout + grace`. Returns the ones that
    /// started.
    async fn start(&self, params: StartParams<'_>) -> Result<Vec<Started>>;
    /// [`Store::start`] within a job's limits, kept in total across every dispatcher: in
    /// one transaction that takes the job's `job_limits` row first (so dispatchers take
    /// turns), begins attempts on the first claims given while the type's running
    /// attempts stay within `gate.concurrency` and its token bucket has a token for each
    /// (`store::domain::admit`), and takes a token for each attempt begun. The claims
    /// left over stay claimed, for the caller to try again.
    async fn start_limited(&self, params: StartParams<'_>, gate: JobGate<'_>) -> Result<Admitted>;
    /// Claim and begin in one write: attempts on up to `params.limit` of `gate`'s type's
    /// pending tasks due by `now`, best ranked first, skipping what another dispatcher
    /// is taking, within the job's limits as [`Store::start_limited`] keeps them (in the
    /// same transaction, after the same row lock). Not for a job with a concurrency key
    /// (`gate.key_limit`), whose turns among keys the claim keeps. Each lease runs
    /// until `now + its timeout + grace`.
    async fn start_due(&self, params: StartDueParams<'_>, gate: JobGate<'_>) -> Result<DueStarted>;
    /// Claims up to `params.limit` of one keyed job's due tasks (`params.types` names
    /// it) fairly among its concurrency keys: each key's claimed and running tasks
    /// count first, so a key that has `per_key` of them gets no more, and the rest go
    /// to the keys in turns — every key's best ranked task before any key's second,
    /// the keys of a turn in rotation from the one after `after` (docs/design.md,
    /// "Per-key limits"). A key cooling down past `params.now`
    /// ([`Store::cool_down_key`]) gets none.
    async fn claim_fair(&self, params: ClaimParams<'_>, fair: FairParams<'_>) -> Result<FairClaim>;
    /// Rests concurrency key `key` of `task_type` until `ends_at`: no fair claim takes
    /// its pending tasks before then. A cooldown already ending later is kept.
    async fn cool_down_key(&self, task_type: &str, key: &str, ends_at: Millis) -> Result<()>;
    /// Applies each finish whose token still matches; `true` where it applied.
    async fn finish(&self, finishes: &[Finish], now: Millis) -> Result<Vec<bool>>;
    /// [`Store::finish`], then [`Store::start_due`] for each of `starts` (of distinct
    /// types, none with a concurrency key), in one transaction: the outcomes that free a
    /// job's slots begin its next due attempts in the same write, as BullMQ's
    /// `moveToFinished` fetches the next job, instead of a slot waiting for its outcome's
    /// write and then for the next start's. The finished attempts no longer count as
    /// running for the starts' limits. A start whose job's limits row another
    /// transaction holds begins nothing rather than wait for it (the outcomes are not
    /// held up). One result per start, in the order given.
    async fn finish_and_start_due(
        &self,
        finishes: &[Finish],
        now: Millis,
        starts: &[DueStart<'_>],
    ) -> Result<(Vec<bool>, Vec<DueStarted>)>;
    /// Ends up to `limit` tasks that had not begun by their [`NewTask::expires_at`]
    /// (blocked, pending or claimed ones whose expiry is at or before `now`) as
    /// [`TaskState::Expired`], earliest expiry first, failing their blocked dependents
    /// as a death does; returns them. Every start leaves such a task unstarted, so this
    /// decides only when it shows as expired, not whether an attempt begins.
    async fn expire(&self, now: Millis, limit: u32) -> Result<Vec<ExpiredTask>>;
    /// Up to `limit` claims and attempts whose lease ran out before `now`, for the
    /// rescuer to retry, release or bury (River's `JobGetStuck`).
    async fn lapsed_leases(&self, now: Millis, limit: u32) -> Result<Vec<Lapsed>>;

    /// A page of dead tasks, latest due first (see [`DeadLetterParams`]).
    async fn dead_letters(&self, params: DeadLetterParams<'_>) -> Result<Vec<TaskRecord>>;
    async fn redrive(&self, id: &str, now: Millis) -> Result<RedriveOutcome>;
    /// Deletes finished tasks past their retention ([`PurgeParams`]) with their
    /// dependency edges, in one short transaction; returns how many went.
    async fn purge(&self, params: PurgeParams<'_>) -> Result<u64>;
    /// Frees the unique keys of up to `limit` succeeded tasks whose
    /// [`NewTask::unique_for`] ended by `now`, earliest end first, in one short
    /// transaction; returns how many. (An insert or redrive that hits such a key frees
    /// it itself: this only keeps them from piling up.)
    async fn release_unique_keys(&self, now: Millis, limit: u32) -> Result<u64>;
    /// Deletes up to `limit` key windows ([`crate::window`]) that closed before
    /// `closed_before` and whose task no longer waits, in one short statement; returns
    /// how many. (A window still naming a waiting task is kept: a trailing debounce
    /// must keep folding submits into it.)
    async fn purge_key_windows(&self, closed_before: Millis, limit: u32) -> Result<u64>;
    /// Deletes up to `limit` key cooldowns that ended before `ended_before`, earliest
    /// first, in one short statement, then up to `limit` key buckets
    /// (`concurrencyKey.rateLimit`) idle for a day before it; returns how many of both.
    async fn purge_key_cooldowns(&self, ended_before: Millis, limit: u32) -> Result<u64>;
    /// Up to `limit` keys of `task_type` resting at `now` ([`Self::cool_down_key`]) with
    /// the end of each, the latest ending first: what the jobs overview shows.
    async fn resting_keys(
        &self,
        task_type: &str,
        now: Millis,
        limit: u32,
    ) -> Result<Vec<(String, Millis)>>;
    /// Attempts running now of `task_types`, together: what an AsyncLimiter the types'
    /// jobs share holds (the jobs overview's `limiters`).
    async fn running_attempts(&self, task_types: &[String]) -> Result<u64>;
    /// The token bucket of a rate limit as its last start left it (not refilled to now,
    /// see [`domain::admit`]); `None` before any start made it (a full bucket).
    async fn rate_bucket(&self, of: RateBucket<'_>) -> Result<Option<domain::Bucket>>;
    /// Sets (`Some`) or deletes (`None`) the runtime weight of `tenant` in the fair claim
    /// of `task_type`, in place of its `spec.fairness` weight; whether a row changed.
    async fn set_tenant_weight(
        &self,
        task_type: &str,
        tenant: &str,
        weight: Option<u32>,
        now: Millis,
    ) -> Result<bool>;
    /// The runtime weights of `task_type`'s tenants.
    async fn tenant_weights(&self, task_type: &str) -> Result<BTreeMap<String, u32>>;
    /// The keys or tenants (`by`) of `task_type`, a job with a `concurrencyKey`, with
    /// tasks claimed, running or due at `now`, the most running first, then the most
    /// due, up to `limit`; counted over at most `cap` of the job's active tasks.
    async fn usage(
        &self,
        task_type: &str,
        by: UsageBy,
        now: Millis,
        cap: u64,
        limit: u32,
    ) -> Result<Vec<UsageCounts>>;
    /// Tasks by filter ([`SearchParams`]), without their `depends_on`.
    /// How many dead letters match `filter`, and how many of them its action can act on.
    async fn count_dead(&self, filter: DeadFilter<'_>) -> Result<DeadCount>;
    /// Acts (redrive or purge) on up to `limit` of the dead letters `filter`'s action can
    /// act on, oldest death first; returns how many it acted on. A redrive does to each
    /// what [`Store::redrive`] does.
    async fn act_on_dead(&self, filter: DeadFilter<'_>, limit: u32, now: Millis) -> Result<u64>;
    async fn search(&self, params: SearchParams<'_>) -> Result<Vec<TaskRecord>>;
    /// One task type's counts for the jobs overview, each an index range walked at most
    /// `cap` entries deep (see [`JobCountParams`]): `tasks_by_type_state` (migration
    /// 0008) for the waiting and running tasks, `tasks_finished` for the finished ones.
    async fn job_counts(&self, params: JobCountParams<'_>) -> Result<JobCounts>;

    /// [`Self::job_counts`]' `due` and `oldest_due` alone (`finished_since` is not read):
    /// with nothing due it reads no more than the first entry of each range, however
    /// many tasks wait for later.
    async fn due_backlog(&self, params: JobCountParams<'_>) -> Result<DueBacklog>;

    /// Records that dispatcher `member` is alive at `now` with its adaptive `shares` of
    /// the jobs it runs (and forgets members silent for an hour).
    async fn heartbeat_member(&self, member: &str, now: Millis, shares: &Shares) -> Result<()>;
    /// Dispatchers whose last heartbeat is at or after `since`, sorted.
    async fn live_members(&self, since: Millis) -> Result<Vec<String>>;
    /// [`Self::heartbeat_member`], then [`Self::live_members`] alive since `live_since`
    /// (the heartbeat just written counts): a dispatcher's beat, which a backend may
    /// write and read in one statement.
    async fn heartbeat_and_list_members(
        &self,
        member: &str,
        now: Millis,
        shares: &Shares,
        live_since: Millis,
    ) -> Result<Vec<String>> {
        self.heartbeat_member(member, now, shares).await?;
        self.live_members(live_since).await
    }
    /// Per task type, the sum of the shares published by the dispatchers whose last
    /// heartbeat is at or after `since` (migration `0014_dispatcher_shares.sql`).
    async fn live_shares(&self, since: Millis) -> Result<BTreeMap<String, u64>>;
    /// A clean exit: the others take over `member`'s task types at once.
    async fn remove_member(&self, member: &str) -> Result<()>;
    /// Hands back every claim `owner` holds (not its running attempts), as if it had
    /// released each one: for a dispatcher that others found dead, so its claimed tasks
    /// run again within seconds instead of after the claim hold. Safe while it lives
    /// on: its `start` of a released claim changes nothing. Returns how many.
    async fn release_claims(&self, owner: &str, now: Millis) -> Result<u64>;
    /// The database server's clock, for a process to measure its own against; `None`
    /// for an embedded database, which has no clock but the process's.
    async fn database_clock(&self) -> Result<Option<Millis>>;
    /// The `tasks` table's live and dead row versions; `None` for a database that
    /// reclaims dead versions by itself as it goes (SQLite, MariaDB), where
    /// [`Store::reclaim_dead_rows`] has nothing to do.
    async fn dead_rows(&self) -> Result<Option<DeadRows>>;
    /// Reclaims the `tasks` table's dead row versions and their index entries now
    /// (PostgreSQL: `VACUUM`), unless another reclaim is at work on it. Takes as long as
    /// a pass over the table and its indexes.
    async fn reclaim_dead_rows(&self) -> Result<()>;
    /// Keeps a Kafka message the consumer could not make a task of, so its offset can be
    /// committed without losing it. A message already recorded (at the same topic,
    /// partition and offset: re-delivered after a crash) is left as it is.
    async fn record_kafka_dead_letter(&self, letter: &KafkaDeadLetter) -> Result<()>;
    /// Recorded Kafka messages, latest first ([`KafkaDeadLetterParams`]).
    async fn kafka_dead_letters(
        &self,
        params: KafkaDeadLetterParams<'_>,
    ) -> Result<Vec<KafkaDeadLetter>>;
    /// Deletes up to `limit` Kafka dead letters recorded before `recorded_before`, oldest
    /// first, in one short statement, and the changes of Kafka-routed tasks made before
    /// then whose message never came ([`Store::change_unconsumed`]); returns how many
    /// dead letters went.
    async fn purge_kafka_dead_letters(&self, recorded_before: Millis, limit: u32) -> Result<u64>;

    /// Pauses task type `task_type` (the API's pause of its job): from the commit on, no
    /// claim takes its tasks and no attempt of it begins (a claim already held is left
    /// unstarted, for its dispatcher to hand back). Returns since when it is paused: `now`,
    /// or the earlier pause it was already under.
    async fn pause(&self, task_type: &str, now: Millis) -> Result<Millis>;
    /// Lifts the pause of `task_type`; `false` if it was not paused.
    async fn resume(&self, task_type: &str) -> Result<bool>;
    /// Every paused task type with since when, sorted by type.
    async fn paused_types(&self) -> Result<Vec<(String, Millis)>>;
    /// Creates schedule `put.name` of `put.task_type` ([`crate::schedule`]), to be
    /// planned from `put.now`; `None` if the job has a schedule of that name.
    async fn create_schedule(&self, put: PutSchedule<'_>) -> Result<Option<ScheduleRecord>>;
    /// Writes over schedule `put.name` of `put.task_type` — only at `version`, if given
    /// — and plans it afresh from `put.now` (firings already created stay). `None` if
    /// there is no such schedule, or it is no longer at `version`.
    async fn update_schedule(
        &self,
        put: PutSchedule<'_>,
        version: Option<i64>,
    ) -> Result<Option<ScheduleRecord>>;
    async fn get_schedule(&self, task_type: &str, name: &str) -> Result<Option<ScheduleRecord>>;
    /// Up to `limit` schedules of `task_type` named after `after`, by name.
    async fn list_schedules(
        &self,
        task_type: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ScheduleRecord>>;
    /// Deletes a schedule (its firings already created stay); `false` if there was none.
    async fn delete_schedule(&self, task_type: &str, name: &str) -> Result<bool>;
    /// Makes `task_type`'s config schedules `entries`, in one transaction: creates the
    /// new, writes over the changed (planned afresh from `now`), deletes the rest.
    async fn sync_config_schedules(
        &self,
        task_type: &str,
        entries: &[ConfigSchedule],
        now: Millis,
    ) -> Result<()>;
    /// Cancels the firings named by `cron_keys` that wait, not due before `now`: those a
    /// schedule created ahead (up to its horizon) when it is paused or deleted. Returns
    /// how many.
    async fn cancel_firings(&self, cron_keys: &[String], now: Millis) -> Result<u64>;
    /// Takes up to `params.limit` schedules due to be looked at by `params.wake_by`,
    /// earliest first, passing over those another scheduler holds, and in one
    /// transaction, for each: asks `planner` for its firings, stores them under its
    /// overlap policy, and writes where the schedule stands. Returns every firing dealt
    /// with.
    async fn fire_schedules(&self, params: FireParams, planner: Planner<'_>) -> Result<FirePass>;

    /// The earliest ETA of a pending task of `task_type` due after `after` and by
    /// `horizon`: for a claimer whose claim ahead was cut short by the job's room, when
    /// the first task it left in the store falls due.
    async fn next_pending_eta(
        &self,
        task_type: &str,
        after: Millis,
        horizon: Millis,
    ) -> Result<Option<Millis>>;
}

/// How long a silent member's row is kept before a heartbeat of another deletes it.
pub const MEMBER_RETENTION: Duration = Duration::from_secs(3600);
