//! The dispatcher end to end against a temp-file SQLite store, a loopback executor and a
//! [`ManualClock`]: time moves only when a test moves it, so every ETA is asserted
//! exactly, and test signals say when something happened instead of polling.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use asyncd_spec::AsyncJobConfig;
use chrono::{TimeZone, Utc};
use serde_json::value::RawValue;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::*;
use crate::clock::{Clock, ManualClock};
use crate::executor::ExecutorClient;
use crate::job_table::{RouteTable, fixed};
use crate::metrics::Metrics;
use crate::test_hooks::{Signal, TestSignals};
use asyncd_store::{ClaimParams, Millis, NewTask, Store, TaskState, TypeFilter};

const T0: i64 = 1_800_000_000_000;

fn job(task_type: &str, executor: &str, concurrency: u32) -> asyncd_spec::Job {
    let yaml = format!(
        "apiVersion: asyncd.example.io/v1\nkind: AsyncJobConfig\nmetadata: {{name: {task_type}-job}}\n\
         spec:\n  taskType: {task_type}\n  concurrency: {concurrency}\n  \
         executor: {{url: '{executor}', timeout: 5s}}\n"
    );
    AsyncJobConfig::from_yaml(&yaml).unwrap().1
}

/// An executor that answers 200 to everything.
async fn executor() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().fallback(|| async { "ok" });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/run")
}

struct Rig {
    dir: tempfile::TempDir,
    store: Arc<dyn Store>,
    clock: Arc<ManualClock>,
    signals: broadcast::Receiver<Signal>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    run: tokio::task::JoinHandle<()>,
}

impl Rig {
    async fn start(jobs: Vec<asyncd_spec::Job>, config: DispatcherConfig) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/tasks.db", dir.path().display());
        let store = asyncd_store::open(&url).await.unwrap();
        store.migrate().await.unwrap();
        Self::start_on(dir, store, jobs, config).await
    }

    async fn start_on(
        dir: tempfile::TempDir,
        store: Arc<dyn Store>,
        jobs: Vec<asyncd_spec::Job>,
        config: DispatcherConfig,
    ) -> Self {
        let clock = ManualClock::at(Utc.timestamp_millis_opt(T0).unwrap());
        let (signals, receiver) = TestSignals::new();
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let dispatcher = Dispatcher::new(
            store.clone(),
            fixed(RouteTable::from_jobs(jobs)),
            Arc::new(Metrics::new()),
            clock.clone(),
            ExecutorClient::new("http://127.0.0.1:1".into(), config.owner.clone()),
            DispatcherConfig {
                signals: Some(signals),
                ..config
            },
            ClaimerWakeup::default(),
            shutdown.clone(),
            None,
        );
        let run = tokio::spawn(dispatcher.run(tasks.clone()));
        Self {
            dir,
            store,
            clock,
            signals: receiver,
            shutdown,
            tasks,
            run,
        }
    }

    async fn insert(&self, task_type: &str, at: i64, priority: u8) -> String {
        let id = uuid::Uuid::now_v7().to_string();
        self.store
            .insert(
                &[new_task(&id, task_type, at, priority)],
                self.clock.now_millis(),
            )
            .await
            .unwrap();
        id
    }

    /// The next signal `pick` accepts, skipping others; fails after the deadline.
    async fn next<T>(&mut self, what: &str, mut pick: impl FnMut(Signal) -> Option<T>) -> T {
        let wait = async {
            loop {
                match self.signals.recv().await {
                    Ok(signal) => {
                        if let Some(found) = pick(signal) {
                            return found;
                        }
                    }
                    Err(err) => panic!("signals ended waiting for {what}: {err}"),
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(20), wait)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
    }

    async fn claimed(&mut self) -> (Vec<String>, i64) {
        self.next("a claim", |s| match s {
            Signal::Claimed { ids, at } => Some((ids, at.as_i64())),
            _ => None,
        })
        .await
    }

    async fn dispatched(&mut self) -> (String, i64, i64) {
        self.next("a dispatch", |s| match s {
            Signal::Dispatched { id, eta, at } => Some((id, eta.as_i64(), at.as_i64())),
            _ => None,
        })
        .await
    }

    /// Stops the dispatcher; the signals left to read, and the folder (so the store
    /// stays readable).
    async fn stop(self) -> (broadcast::Receiver<Signal>, tempfile::TempDir) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(20), self.run)
            .await
            .expect("the dispatcher stops")
            .expect("without a panic");
        self.tasks.close();
        assert!(
            self.tasks.is_empty(),
            "run returned with tasks still running"
        );
        (self.signals, self.dir)
    }
}

fn new_task(id: &str, task_type: &str, at: i64, priority: u8) -> NewTask {
    NewTask::test(task_type, Millis::new(at))
        .id(id)
        .payload("{}")
        .priority(priority)
        .max_retries(0)
        .timeout_ms(5_000)
}

fn fast() -> DispatcherConfig {
    DispatcherConfig {
        owner: "me".into(),
        poll_interval: Duration::from_millis(10),
        lookahead: Duration::from_secs(2),
        ..DispatcherConfig::default()
    }
}

/// An executor taking batch calls: records how many tasks each call carried and
/// answers each task as its payload's `do` says (`omit`: no result for it).
async fn batch_executor() -> (String, Arc<Mutex<Vec<usize>>>) {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = calls.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().fallback(move |body: bytes::Bytes| {
        let seen = seen.clone();
        async move {
            let call: asyncd_contract::ExecutorBatchCall =
                serde_json::from_slice(&body).expect("a batch call");
            seen.lock().unwrap().push(call.tasks.len());
            let results: Vec<_> = call
                .tasks
                .iter()
                .filter_map(|task| match task.payload["do"].as_str() {
                    Some("ok") => Some(serde_json::json!({"id": task.id, "status": "success"})),
                    Some("fail") => Some(serde_json::json!({"id": task.id, "status": "failed", "error": "no such thing"})),
                    Some("later") => Some(serde_json::json!({"id": task.id, "status": "retry", "error": "busy", "retry_after": "60s"})),
                    _ => None,
                })
                .collect();
            serde_json::json!({ "results": results }).to_string()
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/batch"), calls)
}

/// Four due tasks, calls of at most three: every task goes in exactly one call, and
/// each ends as its own result says, the one without a result retried.
#[tokio::test]
async fn a_batch_job_gets_its_due_tasks_in_calls_of_max_tasks_each_with_its_own_outcome() {
    let (url, calls) = batch_executor().await;
    let yaml = format!(
        "apiVersion: asyncd.example.io/v1\nkind: AsyncJobConfig\nmetadata: {{name: bulk-job}}\n\
         spec:\n  taskType: bulk\n  concurrency: 10\n  \
         retry: {{maxRetries: 2, initialBackoff: 600s}}\n  \
         executor: {{url: '{url}', timeout: 5s, batch: {{maxTasks: 3, maxWait: 500ms}}}}\n"
    );
    let job = AsyncJobConfig::from_yaml(&yaml).unwrap().1;
    let mut rig = Rig::start(vec![job], fast()).await;
    let mut ids = BTreeMap::new();
    let tasks: Vec<NewTask> = ["ok", "fail", "later", "omit"]
        .into_iter()
        .map(|what| {
            let id = uuid::Uuid::now_v7().to_string();
            ids.insert(what, id.clone());
            NewTask {
                payload: RawValue::from_string(format!(r#"{{"do":"{what}"}}"#)).unwrap(),
                max_retries: 2,
                ..new_task(&id, "bulk", T0, 0)
            }
        })
        .collect();
    rig.store
        .insert(&tasks, rig.clock.now_millis())
        .await
        .unwrap();
    let mut unfinished: BTreeSet<String> = ids.values().cloned().collect();
    while !unfinished.is_empty() {
        let finished = rig
            .next("the outcomes", |s| match s {
                Signal::Finished { ids, .. } => Some(ids),
                _ => None,
            })
            .await;
        for id in finished {
            unfinished.remove(&id);
        }
    }
    let mut sizes = calls.lock().unwrap().clone();
    sizes.sort_unstable();
    assert_eq!(sizes, vec![1, 3], "one full call, then the rest");
    let task = |what: &str| {
        let store = rig.store.clone();
        let id = ids[what].clone();
        async move { store.get(&id).await.unwrap().unwrap() }
    };
    assert_eq!(task("ok").await.state, TaskState::Succeeded);
    let failed = task("fail").await;
    assert_eq!(failed.state, TaskState::Dead);
    assert_eq!(failed.last_error.as_deref(), Some("no such thing"));
    let later = task("later").await;
    assert_eq!(later.state, TaskState::Pending);
    assert_eq!(
        later.trigger_at,
        Millis::new(T0 + 60_000),
        "its retry_after"
    );
    assert_eq!(later.last_error.as_deref(), Some("busy"));
    let omitted = task("omit").await;
    assert_eq!(omitted.state, TaskState::Pending);
    assert_eq!(
        omitted.last_error.as_deref(),
        Some("batch answer has no result for this task")
    );
    assert!(
        omitted.trigger_at >= Millis::new(T0 + 300_000),
        "its backoff"
    );
    rig.stop().await;
}

/// An executor that answers 200 to everything, counting the calls in flight at once
/// and the most it has seen.
async fn counting_executor() -> (String, Arc<Mutex<(usize, usize)>>) {
    let in_flight = Arc::new(Mutex::new((0, 0)));
    let seen = in_flight.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().fallback(move || {
        let seen = seen.clone();
        async move {
            {
                let mut seen = seen.lock().unwrap();
                seen.0 += 1;
                seen.1 = seen.1.max(seen.0);
            }
            // Long enough for calls to overlap, were the limit not kept.
            tokio::task::yield_now().await;
            seen.lock().unwrap().0 -= 1;
            "ok"
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/run"), in_flight)
}

/// A backlog of due tasks drains with most attempts begun by the completer, in the
/// write of the outcomes that freed their slots, and never more than the job's
/// concurrency at once.
#[tokio::test]
async fn the_outcomes_that_free_slots_begin_the_next_attempts() {
    let (url, in_flight) = counting_executor().await;
    let mut rig = Rig::start(vec![job("work", &url, 2)], fast()).await;
    let tasks: Vec<NewTask> = (0..20)
        .map(|_| new_task(&uuid::Uuid::now_v7().to_string(), "work", T0, 0))
        .collect();
    rig.store
        .insert(&tasks, rig.clock.now_millis())
        .await
        .unwrap();
    let mut unfinished: BTreeSet<String> = tasks.iter().map(|t| t.id.clone()).collect();
    let mut refilled = 0;
    while !unfinished.is_empty() {
        let ids = rig
            .next("the outcomes", |s| match s {
                Signal::Finished { ids, .. } => Some(ids),
                Signal::Refilled { ids } => {
                    refilled += ids.len();
                    None
                }
                _ => None,
            })
            .await;
        for id in ids {
            unfinished.remove(&id);
        }
    }
    assert!(
        refilled >= 10,
        "{refilled} of 20 attempts begun with the outcomes before them"
    );
    assert!(in_flight.lock().unwrap().1 <= 2, "within the concurrency");
    for task in &tasks {
        assert_eq!(
            rig.store.get(&task.id).await.unwrap().unwrap().state,
            TaskState::Succeeded
        );
    }
    rig.stop().await;
}

#[tokio::test]
async fn claims_ahead_and_dispatches_exactly_at_the_eta() {
    let url = executor().await;
    let mut rig = Rig::start(vec![job("work", &url, 1)], fast()).await;
    let id = rig.insert("work", T0 + 1_500, 0).await;
    assert_eq!(
        rig.claimed().await,
        (vec![id.clone()], T0),
        "claimed within lookahead"
    );
    assert_eq!(
        rig.store.get(&id).await.unwrap().unwrap().state,
        TaskState::Claimed
    );
    // The ticker reads the clock each time it wakes; it must not hand the task on
    // until the clock reaches the ETA, and then at that very millisecond.
    rig.clock.set_millis(Millis::new(T0 + 1_499));
    rig.clock.set_millis(Millis::new(T0 + 1_500));
    assert_eq!(rig.dispatched().await, (id.clone(), T0 + 1_500, T0 + 1_500));
    let finished = rig
        .next("the outcome", |s| match s {
            Signal::Finished { ids, .. } => Some(ids),
            _ => None,
        })
        .await;
    assert_eq!(finished, std::slice::from_ref(&id));
    assert_eq!(
        rig.store.get(&id).await.unwrap().unwrap().state,
        TaskState::Succeeded
    );
    rig.stop().await;
}

#[tokio::test]
async fn a_dead_members_claims_run_as_soon_as_it_is_known_dead() {
    let url = executor().await;
    let dir = tempfile::tempdir().unwrap();
    let store = asyncd_store::open(&format!("sqlite://{}/tasks.db", dir.path().display()))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    // Another dispatcher, alive at T0, claimed a due task for 30 s, then died.
    store
        .heartbeat_member("*/dead", Millis::new(T0), &Default::default())
        .await
        .unwrap();
    let id = uuid::Uuid::now_v7().to_string();
    store
        .insert(&[new_task(&id, "work", T0, 0)], Millis::new(T0))
        .await
        .unwrap();
    let claimed = store
        .claim(ClaimParams {
            types: &TypeFilter::All,
            horizon: Millis::new(T0),
            now: Millis::new(T0),
            hold: Duration::from_secs(30),
            owner: "dead",
            limit: 10,
            ahead: false,
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let config = DispatcherConfig {
        heartbeat_interval: Duration::from_millis(10),
        member_ttl: Duration::from_secs(4),
        ..fast()
    };
    let mut rig = Rig::start_on(dir, store, vec![job("work", &url, 1)], config).await;
    rig.next("a heartbeat that sees both", |s| {
        matches!(s, Signal::Heartbeat { .. }).then_some(())
    })
    .await;
    rig.clock.set_millis(Millis::new(T0 + 5_000));
    rig.next("the member gone", |s| match s {
        Signal::MemberGone { member } => (member == "*/dead").then_some(()),
        _ => None,
    })
    .await;
    let (dispatched, _, at) = rig.dispatched().await;
    assert_eq!(dispatched, id);
    assert_eq!(at, T0 + 5_000, "long before the 30 s hold lapses");
    rig.stop().await;
}

#[tokio::test]
async fn an_outcome_the_store_refuses_blocks_no_other() {
    // The executor's error text for one task is something the database refuses (as
    // PostgreSQL refuses NUL in text); a trigger stands in for that refusal.
    let poisoned = uuid::Uuid::now_v7().to_string();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/run", listener.local_addr().unwrap());
    let bad = poisoned.clone();
    let app = axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
        let bad = bad.clone();
        async move {
            if headers
                .get("asyncd-task-id")
                .is_some_and(|v| v == bad.as_str())
            {
                (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "POISON")
            } else {
                (axum::http::StatusCode::OK, "{}")
            }
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}/tasks.db", dir.path().display());
    let store = asyncd_store::open(&database).await.unwrap();
    store.migrate().await.unwrap();
    let mut db = <sqlx::SqliteConnection as sqlx::Connection>::connect(&database)
        .await
        .unwrap();
    sqlx::query(
        "CREATE TRIGGER refuse_poison BEFORE UPDATE ON tasks \
         WHEN NEW.last_error LIKE '%POISON%' \
         BEGIN SELECT RAISE(ABORT, 'refused by the test trigger'); END",
    )
    .execute(&mut db)
    .await
    .unwrap();
    let mut ids = vec![poisoned.clone()];
    store
        .insert(&[new_task(&poisoned, "work", T0, 0)], Millis::new(T0))
        .await
        .unwrap();
    for _ in 0..20 {
        let id = uuid::Uuid::now_v7().to_string();
        store
            .insert(&[new_task(&id, "work", T0, 0)], Millis::new(T0))
            .await
            .unwrap();
        ids.push(id);
    }
    // The body reaches `last_error` only for a job that opts in.
    let mut opted_in = job("work", &url, 21);
    opted_in.executor_error_bodies = true;
    let mut rig = Rig::start_on(dir, store, vec![opted_in], fast()).await;
    let mut finished = BTreeSet::new();
    while !ids.iter().all(|id| finished.contains(id)) {
        finished.extend(
            rig.next("outcomes", |s| match s {
                Signal::Finished { ids, .. } => Some(ids),
                _ => None,
            })
            .await,
        );
    }
    for id in &ids[1..] {
        let task = rig.store.get(id).await.unwrap().unwrap();
        assert_eq!(task.state, TaskState::Succeeded, "{id}");
    }
    let task = rig.store.get(&poisoned).await.unwrap().unwrap();
    assert_eq!(task.state, TaskState::Dead);
    let error = task.last_error.unwrap();
    assert!(
        error.starts_with("the store refused this attempt's outcome")
            && error.contains("refused by the test trigger"),
        "{error}"
    );
    rig.stop().await;
}

#[tokio::test]
async fn equal_etas_dispatch_in_priority_order() {
    let url = executor().await;
    // A hold long enough that a job of concurrency 1 and a 5 s timeout has room for
    // all five in the heap at once (see `crate::dispatch::holdings`).
    let config = DispatcherConfig {
        hold: Duration::from_secs(60),
        ..fast()
    };
    let mut rig = Rig::start(vec![job("work", &url, 1)], config).await;
    let mut ids = HashMap::new();
    for priority in [1, 5, 3, 9, 0] {
        ids.insert(rig.insert("work", T0 + 100, priority).await, priority);
    }
    let mut claimed = 0;
    while claimed < 5 {
        claimed += rig.claimed().await.0.len();
    }
    rig.clock.set_millis(Millis::new(T0 + 100));
    let mut order = Vec::new();
    for _ in 0..5 {
        let (id, eta, at) = rig.dispatched().await;
        assert_eq!((eta, at), (T0 + 100, T0 + 100));
        order.push(ids[&id]);
    }
    assert_eq!(order, [9, 5, 3, 1, 0]);
    rig.stop().await;
}

#[tokio::test]
async fn claims_exactly_when_the_eta_enters_the_lookahead() {
    let url = executor().await;
    let config = DispatcherConfig {
        lookahead: Duration::from_secs(1),
        ..fast()
    };
    let mut rig = Rig::start(vec![job("work", &url, 1)], config).await;
    let far = rig.insert("work", T0 + 5_000, 0).await;
    // A due probe shows a claim query ran; the far task must not come with it.
    for now in [T0, T0 + 3_999] {
        rig.clock.set_millis(Millis::new(now));
        let probe = rig.insert("work", now, 0).await;
        assert_eq!(rig.claimed().await, (vec![probe], now));
    }
    rig.clock.set_millis(Millis::new(T0 + 4_000));
    assert_eq!(rig.claimed().await, (vec![far], T0 + 4_000));
    rig.stop().await;
}

#[tokio::test]
async fn shutdown_releases_unstarted_claims_and_waits_for_every_loop() {
    let url = executor().await;
    let mut rig = Rig::start(vec![job("work", &url, 1)], fast()).await;
    let id = rig.insert("work", T0 + 1_000, 0).await;
    assert_eq!(rig.claimed().await.0, std::slice::from_ref(&id));
    let store = rig.store.clone();
    let (mut signals, _dir) = rig.stop().await;
    let mut released = Vec::new();
    while let Ok(signal) = signals.try_recv() {
        if let Signal::Released { id } = signal {
            released.push(id);
        }
    }
    assert_eq!(released, std::slice::from_ref(&id));
    let task = store.get(&id).await.unwrap().unwrap();
    assert_eq!((task.state, task.attempt), (TaskState::Pending, 0));
}

#[tokio::test]
async fn polls_only_the_task_types_it_owns() {
    let url = executor().await;
    let config = DispatcherConfig {
        // A short grace, so the view before the other member was seen ends quickly.
        member_ttl: Duration::from_millis(50),
        heartbeat_interval: Duration::from_millis(100),
        ..fast()
    };
    let me = ownership::member_name(None, &config.owner);
    let other = ownership::member_name(None, "other");
    let members = BTreeSet::from([me.clone(), other.clone()]);
    let owned_by = |who: &str| {
        (0..)
            .map(|i| format!("type-{i}"))
            .find(|t| ownership::owner(t, &format!("{t}-job"), &members) == Some(who))
            .unwrap()
    };
    let (mine, theirs) = (owned_by(&me), owned_by(&other));
    let dir = tempfile::tempdir().unwrap();
    let url_db = format!("sqlite://{}/tasks.db", dir.path().display());
    let store = asyncd_store::open(&url_db).await.unwrap();
    store.migrate().await.unwrap();
    store
        .heartbeat_member(&other, Millis::new(T0), &Default::default())
        .await
        .unwrap();
    let jobs = vec![job(&mine, &url, 1), job(&theirs, &url, 1)];
    let mut rig = Rig::start_on(dir, store, jobs, config).await;
    // Two heartbeats: the other member is in the view, and the grace (50 ms) after
    // the first view change is over by the second (100 ms later).
    for _ in 0..2 {
        rig.next("a heartbeat", |s| {
            matches!(s, Signal::Heartbeat { .. }).then_some(())
        })
        .await;
    }
    let both = [new_task("m", &mine, T0, 0), new_task("t", &theirs, T0, 0)];
    rig.store.insert(&both, Millis::new(T0)).await.unwrap();
    assert_eq!(rig.claimed().await.0, ["m"]);
    assert_eq!(
        rig.store.get("t").await.unwrap().unwrap().state,
        TaskState::Pending
    );
    rig.stop().await;
}
