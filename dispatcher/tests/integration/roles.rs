//! The roles' lifecycle in-process: start-up failures come back from `start`, and a
//! stopped role has wound every part down; and the real binary finishes its in-flight
//! work on SIGTERM before it exits, and exits within its bound when its store stops
//! answering.

use std::sync::Arc;
use std::time::Duration;

use asyncd::clock::ManualClock;
use asyncd::wiring::{self, Parts, RoleError};
use asyncd_store::TaskState;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::support::*;

#[tokio::test]
async fn a_taken_listen_port_fails_start_up() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("jobs")).unwrap();
    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut settings = settings(&dir, ManualClock::at(chrono::Utc::now()));
    settings.listen = taken.local_addr().unwrap();
    let err = match wiring::start(settings, Parts::ALL, CancellationToken::new()).await {
        Ok(_) => panic!("started on a taken port"),
        Err(err) => err,
    };
    assert!(
        matches!(&err, RoleError::Listen(addr, e)
            if *addr == taken.local_addr().unwrap() && e.kind() == std::io::ErrorKind::AddrInUse),
        "{err:?}"
    );
}

#[tokio::test]
async fn stopping_a_role_hands_back_its_claims_and_ends_cleanly() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let jobs = [("job.yaml", job_yaml("j", "work", &executor.url(), ""))];
    let mut asyncd = InProcess::start(&jobs).await;
    let id = asyncd.submit(json!({"type": "work", "delay": "1s"})).await;
    asyncd
        .next("the claim", |s| match s {
            asyncd::test_hooks::Signal::Claimed { ids, .. } => ids.contains(&id).then_some(()),
            _ => None,
        })
        .await;
    let url = format!("sqlite://{}", asyncd.dir.path().join("asyncd.db").display());
    let addr = asyncd.addr;
    let dir = tempfile::TempDir::new().unwrap();
    // Keep the folder (and its database) past the role.
    let kept = std::mem::replace(&mut asyncd.dir, dir);
    asyncd.stop().await.expect("a clean shutdown");
    assert!(
        tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr))
            .await
            .is_ok_and(|c| c.is_err()),
        "the listener is closed"
    );
    let store = asyncd_store::open(&url).await.unwrap();
    let task = store.get(&id).await.unwrap().unwrap();
    assert_eq!((task.state, task.attempt), (TaskState::Pending, 0));
    assert!(executor.calls().is_empty());
    drop(kept);
}

#[tokio::test]
async fn a_role_started_while_its_database_restarts_waits_for_it() {
    let Some(database) = fresh_database(Service::Postgres).await else {
        return;
    };
    let proxy = DbProxy::start(&database, false).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("jobs")).unwrap();
    let mut settings = settings(&dir, ManualClock::at(chrono::Utc::now()));
    // The wall clock: a clock stopped at the test's start would be seconds behind the
    // store's once the database is back, and readiness then says `clock_skew`.
    settings.clock = Arc::new(asyncd::clock::SystemClock);
    settings.store_url = proxy.url(&database);
    settings.store_wait = Duration::from_secs(60);
    let shutdown = CancellationToken::new();
    let starting = tokio::spawn(wiring::start(settings, Parts::ALL, shutdown.clone()));
    wait_for("refused connections", DEADLINE, async || {
        (proxy.refused.load(std::sync::atomic::Ordering::SeqCst) >= 2).then_some(())
    })
    .await;
    assert!(
        !starting.is_finished(),
        "start gave up while the database was away"
    );
    proxy.restore();
    let running = tokio::time::timeout(DEADLINE, starting)
        .await
        .expect("start finishes once the database is back")
        .unwrap()
        .expect("the role starts");
    let ready = reqwest::get(format!("http://{}/readyz", running.addr()))
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    shutdown.cancel();
    running.wait().await.expect("a clean shutdown");
}

#[tokio::test]
async fn a_wrong_database_password_fails_start_up_at_once() {
    let Some(database) = fresh_database(Service::Postgres).await else {
        return;
    };
    let mut url = reqwest::Url::parse(&database).unwrap();
    url.set_password(Some("wrong")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("jobs")).unwrap();
    let mut settings = settings(&dir, ManualClock::at(chrono::Utc::now()));
    settings.store_url = url.to_string();
    settings.store_wait = Duration::from_secs(3600);
    let started = tokio::time::timeout(
        DEADLINE,
        wiring::start(settings, Parts::ALL, CancellationToken::new()),
    )
    .await
    .expect("a wrong password is not waited out");
    assert!(
        matches!(started, Err(RoleError::Store(_))),
        "{:?}",
        started.err()
    );
}

/// The wall clock shifted by an offset a test sets.
struct ShiftedClock(std::sync::atomic::AtomicI64);

impl asyncd::clock::Clock for ShiftedClock {
    fn now_millis(&self) -> asyncd_store::Millis {
        asyncd_store::Millis::new(
            chrono::Utc::now().timestamp_millis()
                + self.0.load(std::sync::atomic::Ordering::SeqCst),
        )
    }
}

#[tokio::test]
async fn a_dispatcher_whose_clock_runs_ahead_of_the_stores_dispatches_nothing() {
    use asyncd::test_hooks::{Signal, TestSignals};
    let executor = Executor::start(|_| Answer::ok()).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("jobs")).unwrap();
    std::fs::write(
        dir.path().join("jobs/job.yaml"),
        job_yaml("j", "work", &executor.url(), ""),
    )
    .unwrap();
    let clock = Arc::new(ShiftedClock(std::sync::atomic::AtomicI64::new(60_000)));
    let (signals, mut events) = TestSignals::new();
    let mut settings = settings(&dir, ManualClock::at(chrono::Utc::now()));
    let Some(store_url) = fresh_database(Service::Postgres).await else {
        return;
    };
    settings.store_url = store_url;
    settings.clock = clock.clone();
    settings.signals = Some(signals);
    settings.dispatcher.heartbeat_interval = Duration::from_millis(20);
    let shutdown = CancellationToken::new();
    let running = wiring::start(settings, Parts::ALL, shutdown.clone())
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let base = format!("http://{}", running.addr());

    // Due 30 s from now by the store's clock: 30 s overdue by this dispatcher's.
    let eta = asyncd::clock::rfc3339(asyncd_store::Millis::new(
        chrono::Utc::now().timestamp_millis() + 30_000,
    ));
    let answer: serde_json::Value = http
        .post(format!("{base}/v1/tasks"))
        .json(&json!({"type": "work", "eta": eta, "idempotency_key": "skew"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = answer["id"].as_str().unwrap().to_string();
    let ready = wait_for("/readyz to report the skew", DEADLINE, async || {
        let answer = http.get(format!("{base}/readyz")).send().await.ok()?;
        let status = answer.status();
        let body: serde_json::Value = answer.json().await.ok()?;
        // A moment's `store_unavailable` (a ping that waited out the pool on a busy
        // machine) is not the answer looked for.
        (status == 503 && body["error"]["code"] == "clock_skew").then_some(body)
    })
    .await;
    assert!(
        ready["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{ready}"
    );
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let offset: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("asyncd_clock_offset_seconds "))
        .expect("the offset metric")
        .parse()
        .unwrap();
    assert!((-61.0..-59.0).contains(&offset), "offset {offset} s");
    // Ten heartbeats (and some fifty claimer passes) while skewed: nothing claimed.
    let mut beats = 0;
    while beats < 10 {
        match tokio::time::timeout(DEADLINE, events.recv())
            .await
            .unwrap()
            .unwrap()
        {
            Signal::Heartbeat { .. } => beats += 1,
            Signal::Claimed { ids, .. } => panic!("claimed {ids:?} with a skewed clock"),
            Signal::Dispatched { id, .. } => panic!("dispatched {id} with a skewed clock"),
            _ => {}
        }
    }
    assert!(executor.calls().is_empty());

    // The clock is fixed: ready again, and the task runs at its ETA, not before.
    clock.0.store(0, std::sync::atomic::Ordering::SeqCst);
    wait_for("/readyz to be ready again", DEADLINE, async || {
        let answer = http.get(format!("{base}/readyz")).send().await.ok()?;
        (answer.status() == 200).then_some(())
    })
    .await;
    let task: serde_json::Value = http
        .get(format!("{base}/v1/tasks/{id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(task["attempt"], 0, "not run before its ETA: {task}");
    assert!(executor.calls().is_empty());
    shutdown.cancel();
    running.wait().await.expect("a clean shutdown");
}

// Multi-threaded: the executor below blocks its thread for the in-flight work, and the
// test must keep polling meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_work_before_exiting() {
    let entered = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let in_call = entered.clone();
    let executor = Executor::start(move |_| {
        in_call.store(true, std::sync::atomic::Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(1500)); // the in-flight work
        Answer::ok()
    })
    .await;
    let mut asyncd = Asyncd::start(&one_job(&executor, ""), &[]).await;
    let running = asyncd.submit(task("work", json!("in-flight"))).await;
    let later = asyncd.submit(json!({"type": "work", "delay": "1h"})).await;
    // The call itself, not the `running` state: on a busy machine a poll can miss the
    // 1.5 s the state lasts.
    wait_for("the executor call", DEADLINE, async || {
        entered
            .load(std::sync::atomic::Ordering::SeqCst)
            .then_some(())
    })
    .await;
    let status = asyncd.terminate().await;
    assert!(status.success(), "exit status {status}");
    asyncd.spawn().await;
    let task = asyncd.task(&running).await;
    assert_eq!(
        (task["state"].as_str(), task["attempt"].as_i64()),
        (Some("succeeded"), Some(1))
    );
    assert_eq!(asyncd.task(&later).await["state"], "pending");
}

/// How a store stops answering a stopping dispatcher.
#[derive(Clone, Copy, PartialEq)]
enum Stuck {
    /// A dead network path: no reset, no reply, on open connections and new ones.
    BlackHole,
    /// The outcome's row is locked by another transaction, so its write waits on it.
    RowLocked,
}

/// A dispatcher whose store stopped answering (a black hole) while an attempt was in
/// flight ends within its bound on SIGTERM: `--shutdown-grace` for the attempt, then at
/// most 15 s for writes that cannot land. The outcome it could not write is not lost:
/// the task's lease lapses and another dispatcher runs it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_a_dispatcher_whose_store_stopped_answering() {
    store_stops_answering(Stuck::BlackHole).await;
}

/// The same with the outcome's write waiting on a row lock, which no pool timeout ends:
/// the process exits at the bound, with a failure status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_a_dispatcher_whose_outcome_write_waits_forever() {
    store_stops_answering(Stuck::RowLocked).await;
}

async fn store_stops_answering(stuck: Stuck) {
    use sqlx::Connection;
    let Some(database) = fresh_database(Service::Postgres).await else {
        return;
    };
    migrate(&database);
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = calls.clone();
    // Channels, not polled flags or a sleep: the first attempt answers only once the
    // test has made the store stop answering, however long that takes on a busy machine
    // (a fixed 1.5 s lost that race to a slow connect, and the outcome was written).
    let (entered, mut first_call) = tokio::sync::mpsc::unbounded_channel();
    let (stuck_tx, stuck_rx) = std::sync::mpsc::channel::<()>();
    let stuck_rx = std::sync::Mutex::new(stuck_rx);
    let executor = Executor::start(move |_| {
        if counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            let _ = entered.send(());
            // Off the runtime's workers while it waits: the test's own connections and
            // its proxy run on them, and on a loaded machine a blocked worker delayed the
            // row lock past the attempt's timeout (the outcome was then written first).
            tokio::task::block_in_place(|| {
                let _ = stuck_rx.lock().unwrap().recv_timeout(DEADLINE);
            });
        }
        Answer::ok()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs");
    std::fs::create_dir(&jobs).unwrap();
    // An attempt timeout well beyond how long the test takes to make the store stuck, so
    // the first attempt's outcome is always the answer released after that; short enough
    // that its lease (plus the 5 s grace) lapses within the wait for the run again below.
    std::fs::write(
        jobs.join("job.yaml"),
        job_yaml("test-job", "work", &executor.url(), "").replace("timeout: 5s", "timeout: 20s"),
    )
    .unwrap();
    let proxy = DbProxy::start(&database, true).await;
    let role = |name: &str, store: &str, extra: &[&str]| {
        Role::serve(name, store, &jobs, dir.path(), extra)
    };
    let api = role("api", &database, &[]);
    let mut dispatcher = role(
        "dispatcher",
        &proxy.url(&database),
        &["--shutdown-grace", "2s"],
    );
    let http = reqwest::Client::new();
    wait_healthy(&http, &api.listen).await;
    let submitted: serde_json::Value = http
        .post(format!("http://{}/v1/tasks", api.listen))
        .json(&task("work", json!("in flight when the store goes")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = submitted["id"].as_str().expect("an id").to_string();
    let mut locker = sqlx::PgConnection::connect(&database).await.unwrap();
    tokio::time::timeout(DEADLINE, first_call.recv())
        .await
        .expect("the first executor call");
    match stuck {
        Stuck::BlackHole => proxy.black_hole(),
        Stuck::RowLocked => {
            sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
            sqlx::query("SELECT id FROM tasks WHERE id = $1 FOR UPDATE")
                .bind(&id)
                .fetch_one(&mut locker)
                .await
                .unwrap();
        }
    }
    // The first attempt answers now, its outcome's write stuck.
    stuck_tx.send(()).unwrap();
    // The bound (2 s + 15 s) and room for a busy machine; without it this never ends.
    let status = dispatcher.terminate(Duration::from_secs(60)).await;
    if stuck == Stuck::RowLocked {
        assert!(
            !status.success(),
            "stopped at the bound: {status}\n{}",
            std::fs::read_to_string(dir.path().join("dispatcher.log")).unwrap_or_default()
        );
        sqlx::query("ROLLBACK").execute(&mut locker).await.unwrap();
    }

    let _rescuer = role("dispatcher-2", &database, &[]);
    let done = wait_for("the task run again", Duration::from_secs(60), async || {
        let task: serde_json::Value = http
            .get(format!("http://{}/v1/tasks/{id}", api.listen))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        (task["state"] == "succeeded").then_some(task)
    })
    .await;
    assert_eq!(
        done["attempt"],
        2,
        "{done}\n{}",
        std::fs::read_to_string(dir.path().join("dispatcher.log")).unwrap_or_default()
    );
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
}
