//! A job's `concurrency` and `rateLimit` hold in total across dispatchers
//! (docs/design.md, "Limits"): two `Dispatcher`s on one store — one shared store on
//! SQLite, each its own store and pool on MariaDB and PostgreSQL, as two processes would
//! be — each given half of the job's tasks, claimed for it and pushed into its heap as
//! the Kafka route's consumer does with what it reads (on the store route only one
//! dispatcher polls a job at a time, but a new owner overlaps the old one while
//! membership changes). Each dispatcher alone would keep the limit, so twice the limit
//! is what a per-replica limit would allow; the executor measures what arrives.
//!
//! The concurrency tests run on the system clock (no timing is asserted). The rate test
//! runs on a [`ManualClock`] both dispatchers share, stepped by the test: the token
//! bucket lives in the store's `job_limits` row but is filled by the `now` each
//! dispatcher passes in, so the rate is exact in simulated time on every backend,
//! whatever the machine's load. (The server backends' clock check compares the
//! dispatcher's clock with the database's: it is taken once, when the manual clock still
//! reads the wall time, and not again while the test moves the clock on.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use asyncd::clock::{Clock, ManualClock, SharedClock, SystemClock};
use asyncd::clock_check::ClockCheck;
use asyncd::dispatch::{ClaimerWakeup, Dispatcher, DispatcherConfig, HeapSink};
use asyncd::executor::ExecutorClient;
use asyncd::job_table::RouteTable;
use asyncd::metrics::Metrics;
use asyncd_spec::{AsyncJobConfig, Job};
use asyncd_store::{self as store, ClaimParams, Millis, NewTask, Store, TypeFilter};
use axum::body::Bytes;
use axum::http::HeaderMap;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::support::wait_for;

const TASK_TYPE: &str = "limited";

/// An executor that counts the calls it is answering at once, and records when each
/// arrived (by the dispatchers' clock) and from which dispatcher.
#[derive(Clone)]
struct Counting {
    clock: SharedClock,
    inflight: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    calls: Arc<Mutex<Vec<(Millis, String)>>>,
    /// Per payload `m` (the concurrency key): calls in flight now, and the most at once.
    keys: Arc<Mutex<HashMap<String, (usize, usize)>>>,
}

impl Counting {
    async fn start(work: Duration, clock: SharedClock) -> (Self, String) {
        let counting = Self {
            clock,
            inflight: Arc::default(),
            most: Arc::default(),
            calls: Arc::default(),
            keys: Arc::default(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/run", listener.local_addr().unwrap());
        let c = counting.clone();
        let app = axum::Router::new().fallback(move |headers: HeaderMap, body: Bytes| {
            let c = c.clone();
            async move {
                let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let key = body["payload"]["m"].as_str().map(str::to_string);
                if let Some(key) = &key {
                    let mut keys = c.keys.lock().unwrap();
                    let (now, most) = keys.entry(key.clone()).or_default();
                    *now += 1;
                    *most = (*most).max(*now);
                }
                let now = c.inflight.fetch_add(1, Ordering::SeqCst) + 1;
                c.most.fetch_max(now, Ordering::SeqCst);
                let from = headers
                    .get("asyncd-dispatcher")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                c.calls.lock().unwrap().push((c.clock.now_millis(), from));
                tokio::time::sleep(work).await;
                c.inflight.fetch_sub(1, Ordering::SeqCst);
                if let Some(key) = &key {
                    c.keys.lock().unwrap().get_mut(key).unwrap().0 -= 1;
                }
                "{}"
            }
        });
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (counting, url)
    }

    fn calls(&self) -> Vec<(Millis, String)> {
        self.calls.lock().unwrap().clone()
    }

    /// The most calls answered at once since the last reset.
    fn reset_most(&self) -> usize {
        self.most.swap(0, Ordering::SeqCst)
    }

    async fn wait_calls(&self, n: usize, deadline: Duration) {
        wait_for(&format!("{n} executor calls"), deadline, async || {
            (self.calls.lock().unwrap().len() >= n).then_some(())
        })
        .await;
    }
}

fn job(url: &str, limits: &str) -> Job {
    let yaml = format!(
        "apiVersion: asyncd.example.io/v1\nkind: AsyncJobConfig\nmetadata: {{name: limited-job}}\n\
         spec:\n  taskType: {TASK_TYPE}\n  executor: {{url: '{url}', timeout: 5s}}\n{limits}"
    );
    AsyncJobConfig::from_yaml(&yaml).unwrap().1
}

/// Two dispatchers of one job on one database, the job's config shared (a change to it
/// reaches both, as a ConfigMap change would).
struct Pair {
    stores: Vec<Arc<dyn Store>>,
    clock: SharedClock,
    metrics: Vec<Arc<Metrics>>,
    sinks: Vec<HeapSink>,
    config: watch::Sender<Arc<RouteTable>>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    runs: Vec<tokio::task::JoinHandle<()>>,
}

const OWNERS: [&str; 2] = ["limits-a", "limits-b"];

impl Pair {
    async fn start(database: Option<String>, job: Job) -> (Self, tempfile::TempDir) {
        Self::start_on(database, job, None).await
    }

    /// As [`Pair::start`], on `manual` when given: set to the wall time as the
    /// dispatchers start, so that their one clock check against the server's (at the
    /// start; their heartbeat is set beyond the test's length) passes, and moved only by
    /// the test afterwards.
    async fn start_on(
        database: Option<String>,
        job: Job,
        manual: Option<Arc<ManualClock>>,
    ) -> (Self, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let sqlite = format!("sqlite://{}/tasks.db", dir.path().display());
        let stores: Vec<Arc<dyn Store>> = match &database {
            Some(url) => vec![
                store::open(url).await.unwrap(),
                store::open(url).await.unwrap(),
            ],
            None => {
                // SQLite is one process's store: both dispatchers share it.
                let shared = store::open(&sqlite).await.unwrap();
                vec![shared.clone(), shared]
            }
        };
        stores[0].migrate().await.unwrap();
        let (config, routes) = watch::channel(Arc::new(RouteTable::from_jobs([job])));
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let (clock, heartbeat): (SharedClock, _) = match manual {
            Some(manual) => {
                // After the migrations, which take seconds on a server backend.
                manual.set(chrono::Utc::now());
                (manual, Duration::from_secs(3600))
            }
            None => (
                Arc::new(SystemClock),
                DispatcherConfig::default().heartbeat_interval,
            ),
        };
        let mut sinks = Vec::new();
        let mut metrics = Vec::new();
        let mut runs = Vec::new();
        let mut checks = Vec::new();
        for (store, owner) in stores.iter().zip(OWNERS) {
            let clock_check = Arc::new(ClockCheck::default());
            checks.push(clock_check.clone());
            let metered = Arc::new(Metrics::new());
            metrics.push(metered.clone());
            let dispatcher = Dispatcher::new(
                store.clone(),
                routes.clone(),
                metered,
                clock.clone(),
                ExecutorClient::new("http://127.0.0.1:1".into(), owner.into()),
                DispatcherConfig {
                    owner: owner.into(),
                    // Scoped to another job, so neither claims this job's tasks from the
                    // store: each runs exactly the half the test hands it.
                    job: Some("elsewhere".into()),
                    poll_interval: Duration::from_millis(20),
                    hold: Duration::from_secs(60),
                    heartbeat_interval: heartbeat,
                    clock_check,
                    ..DispatcherConfig::default()
                },
                ClaimerWakeup::default(),
                shutdown.clone(),
                None,
            );
            sinks.push(dispatcher.sink());
            runs.push(tokio::spawn(dispatcher.run(tasks.clone())));
        }
        // Until its clock is checked against the store's, a dispatcher hands due tasks
        // back instead of running them.
        wait_for("both clocks checked", Duration::from_secs(20), async || {
            checks.iter().all(|c| c.may_dispatch()).then_some(())
        })
        .await;
        let pair = Self {
            stores,
            clock,
            metrics,
            sinks,
            config,
            shutdown,
            tasks,
            runs,
        };
        (pair, dir)
    }

    /// `n` tasks due now, half claimed for each dispatcher and handed to it.
    async fn give(&self, n: usize) {
        self.give_keyed(n, 0).await;
    }

    /// As [`Pair::give`], the tasks' concurrency keys (payload `m`) taking `keys`
    /// values in turn; none when 0.
    async fn give_keyed(&self, n: usize, keys: usize) {
        let now = self.clock.now_millis();
        let tasks: Vec<NewTask> = (0..n)
            .map(|i| NewTask {
                concurrency_key: (keys > 0).then(|| format!("k{}", i % keys)),
                ..NewTask::test(TASK_TYPE, now)
                    .payload(match keys {
                        0 => format!("{{\"n\":{i}}}"),
                        _ => format!("{{\"n\":{i},\"m\":\"k{}\"}}", i % keys),
                    })
                    .max_retries(0)
                    .timeout_ms(5_000)
            })
            .collect();
        self.stores[0].insert(&tasks, now).await.unwrap();
        let types = TypeFilter::Only(vec![TASK_TYPE.into()]);
        for ((store, sink), owner) in self.stores.iter().zip(&self.sinks).zip(OWNERS) {
            // A claim skips rows another transaction has locked (SKIP LOCKED), and the
            // dispatchers may still be writing the last round's outcomes: claim again
            // until this half is whole.
            let mut claimed = Vec::with_capacity(n / 2);
            let deadline = Instant::now() + Duration::from_secs(20);
            while claimed.len() < n / 2 {
                assert!(
                    Instant::now() < deadline,
                    "claimed {} of {} for {owner}",
                    claimed.len(),
                    n / 2
                );
                claimed.extend(
                    store
                        .claim(ClaimParams {
                            types: &types,
                            horizon: now,
                            now,
                            hold: Duration::from_secs(60),
                            owner,
                            limit: (n / 2 - claimed.len()) as u32,
                            ahead: false,
                        })
                        .await
                        .unwrap(),
                );
            }
            sink.push(claimed);
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        for run in self.runs {
            tokio::time::timeout(Duration::from_secs(30), run)
                .await
                .expect("the dispatcher stops")
                .expect("without a panic");
        }
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// How many calls came from each dispatcher.
fn per_dispatcher(calls: &[(Millis, String)]) -> Vec<usize> {
    OWNERS
        .iter()
        .map(|owner| calls.iter().filter(|(_, from)| from == owner).count())
        .collect()
}

async fn concurrency_holds_in_total_and_follows_a_config_change(database: Option<String>) {
    const K: usize = 4;
    const TASKS: usize = 200;
    let (executor, url) = Counting::start(Duration::from_millis(10), Arc::new(SystemClock)).await;
    let (pair, _dir) = Pair::start(database, job(&url, &format!("  concurrency: {K}\n"))).await;
    pair.give(TASKS).await;
    executor.wait_calls(TASKS, Duration::from_secs(60)).await;
    let most = executor.reset_most();
    let from = per_dispatcher(&executor.calls());
    eprintln!("at most {most} calls at once (limit {K}), by dispatcher {from:?}");
    assert!(most <= K, "{most} calls at once, above the limit of {K}");
    assert_eq!(most, K, "the limit was reached: the dispatchers were busy");
    assert_eq!(from, [TASKS / 2, TASKS / 2], "each ran its half");

    // Lowered without a restart: the next attempts keep the new limit.
    const LOWER: usize = 2;
    pair.config
        .send(Arc::new(RouteTable::from_jobs([job(
            &url,
            &format!("  concurrency: {LOWER}\n"),
        )])))
        .unwrap();
    pair.give(TASKS).await;
    executor
        .wait_calls(2 * TASKS, Duration::from_secs(60))
        .await;
    let most = executor.reset_most();
    eprintln!("after the change, at most {most} calls at once (limit {LOWER})");
    assert!(most <= LOWER, "{most} calls at once, above the new limit");
    pair.stop().await;
}

/// `concurrencyKey` with limit 2: both dispatchers hold claims of every key, and the
/// executor never sees more than 2 calls of one key at once.
async fn a_key_limit_holds_in_total(database: Option<String>) {
    const PER_KEY: usize = 2;
    const KEYS: usize = 5;
    const TASKS: usize = 200;
    let (executor, url) = Counting::start(Duration::from_millis(10), Arc::new(SystemClock)).await;
    let limits =
        format!("  concurrency: 50\n  concurrencyKey: {{key: '{{m}}', limit: {PER_KEY}}}\n");
    let (pair, _dir) = Pair::start(database, job(&url, &limits)).await;
    pair.give_keyed(TASKS, KEYS).await;
    executor.wait_calls(TASKS, Duration::from_secs(60)).await;
    let keys = executor.keys.lock().unwrap().clone();
    let from = per_dispatcher(&executor.calls());
    eprintln!("the most calls of one key at once, by key: {keys:?}; by dispatcher {from:?}");
    assert_eq!(keys.len(), KEYS);
    for (key, (_, most)) in &keys {
        assert!(
            *most <= PER_KEY,
            "{most} calls of key {key} at once, above {PER_KEY}"
        );
    }
    assert!(
        keys.values().any(|(_, most)| *most == PER_KEY),
        "some key reached its limit"
    );
    assert_eq!(from, [TASKS / 2, TASKS / 2], "each ran its half");
    pair.stop().await;
}

/// `rateLimit: {perSecond: 50, burst: 5}` shared by two dispatchers on one clock that
/// the test steps 10 ms at a time: after the burst, every simulated second has 50
/// attempts begin in total, within ±10 %, where a per-replica limit would let 100.
async fn rate_holds_in_total_within_ten_percent(database: Option<String>) {
    const RATE: usize = 50;
    const BURST: usize = 5;
    /// Simulated seconds measured, each a window that must hold RATE ± 10 % starts.
    const WINDOWS: usize = 4;
    /// Enough that both dispatchers still have tasks waiting when the last window ends.
    const TASKS: usize = 2 * (BURST + WINDOWS * RATE + 10);
    /// Half a token: every token is taken within a step or two of its arrival, and a
    /// dispatcher that lags a step behind (it read the clock just before the step) loses
    /// nothing, as the bucket keeps up to `BURST` tokens.
    const STEP: Duration = Duration::from_millis(10);
    let manual = ManualClock::at(chrono::Utc::now());
    let (executor, url) = Counting::start(Duration::ZERO, manual.clone()).await;
    let limits =
        format!("  concurrency: 100\n  rateLimit: {{perSecond: {RATE}, burst: {BURST}}}\n");
    let (pair, _dir) = Pair::start_on(database, job(&url, &limits), Some(manual.clone())).await;
    let t0 = manual.now_millis();
    pair.give(TASKS).await;

    // What each dispatcher's metrics say: attempts held back by the rate, and attempts
    // handed to the executor.
    let held = |i: usize| {
        pair.metrics[i]
            .limited
            .with_label_values(&["limited-job", "rate"])
            .get()
    };
    let dispatched = || {
        pair.metrics
            .iter()
            .map(|m| m.dispatched.with_label_values(&[TASK_TYPE]).get())
            .sum::<u64>() as usize
    };
    // The bucket starts full: the burst begins before the clock moves, and nothing else.
    wait_for(
        "the burst at the executor",
        Duration::from_secs(20),
        async || {
            let calls = executor.calls().len();
            (calls >= BURST && calls == dispatched() && held(0) + held(1) > 0).then_some(())
        },
    )
    .await;
    let end = t0 + Duration::from_secs(WINDOWS as u64);
    loop {
        let calls = executor.calls();
        if calls.len() == TASKS {
            break;
        }
        let before = [held(0), held(1)];
        manual.advance(STEP);
        // Both dispatchers have tried to begin at least once since the step (the rate
        // held each back, or it has run its half), and every attempt begun has reached
        // the executor, stamped with the clock as it is now.
        wait_for(
            &format!("both dispatchers at {:?}", manual.now_millis().since(t0)),
            Duration::from_secs(20),
            async || {
                let calls = executor.calls();
                let from = per_dispatcher(&calls);
                let caught_up = (0..2).all(|i| held(i) > before[i] || from[i] == TASKS / 2);
                (caught_up && calls.len() == dispatched()).then_some(())
            },
        )
        .await;
        assert!(
            manual.now_millis() < end + Duration::from_secs(5),
            "{} of {TASKS} tasks begun 5 s of simulated time after the windows",
            executor.calls().len()
        );
    }

    let calls = executor.calls();
    let at_start = calls.iter().filter(|(at, _)| *at == t0).count();
    // Window k: (t0 + k s, t0 + (k + 1) s]; the burst, at t0, is before the first.
    let windows: Vec<usize> = (0..WINDOWS as u64)
        .map(|k| {
            let (from, to) = (t0 + Duration::from_secs(k), t0 + Duration::from_secs(k + 1));
            calls
                .iter()
                .filter(|(at, _)| from < *at && *at <= to)
                .count()
        })
        .collect();
    let from = per_dispatcher(&calls);
    eprintln!(
        "{at_start} calls at once at the start (burst {BURST}), then per simulated second {windows:?} (limit {RATE}/s), by dispatcher {from:?}"
    );
    assert!(
        at_start <= BURST,
        "{at_start} calls at the start, above the burst"
    );
    for (k, count) in windows.iter().enumerate() {
        assert!(
            (RATE * 9 / 10..=RATE * 11 / 10).contains(count),
            "{count} calls in simulated second {k}, not within 10 % of {RATE}"
        );
    }
    assert_eq!(from, [TASKS / 2, TASKS / 2], "each ran its half");
    pair.stop().await;
}

mod sqlite {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_limit_holds_in_total() {
        super::a_key_limit_holds_in_total(None).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrency_holds_in_total_and_follows_a_config_change() {
        super::concurrency_holds_in_total_and_follows_a_config_change(None).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rate_holds_in_total_within_ten_percent() {
        super::rate_holds_in_total_within_ten_percent(None).await;
    }
}

mod mariadb {
    use crate::support::{Service, fresh_database};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_limit_holds_in_total() {
        let Some(url) = fresh_database(Service::MariaDb).await else {
            return;
        };
        super::a_key_limit_holds_in_total(Some(url)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrency_holds_in_total_and_follows_a_config_change() {
        let Some(url) = fresh_database(Service::MariaDb).await else {
            return;
        };
        super::concurrency_holds_in_total_and_follows_a_config_change(Some(url)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rate_holds_in_total_within_ten_percent() {
        let Some(url) = fresh_database(Service::MariaDb).await else {
            return;
        };
        super::rate_holds_in_total_within_ten_percent(Some(url)).await;
    }
}

mod postgres {
    use crate::support::{Service, fresh_database};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_limit_holds_in_total() {
        let Some(url) = fresh_database(Service::Postgres).await else {
            return;
        };
        super::a_key_limit_holds_in_total(Some(url)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrency_holds_in_total_and_follows_a_config_change() {
        let Some(url) = fresh_database(Service::Postgres).await else {
            return;
        };
        super::concurrency_holds_in_total_and_follows_a_config_change(Some(url)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rate_holds_in_total_within_ten_percent() {
        let Some(url) = fresh_database(Service::Postgres).await else {
            return;
        };
        super::rate_holds_in_total_within_ten_percent(Some(url)).await;
    }
}
