//! Issue 4's proof against a real Kafka broker (KRaft, started by e2e/services/kafka.sh):
//! the round trip, a chaos run with SIGKILLed dispatchers and a broker restart, and a
//! rebalance when a dispatcher joins; and the Kafka route's side of later issues (priority
//! and pause from issue 14, cancels, dead letters, outages).

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::*;

/// The broker's bootstrap servers. Every test here begins by holding the [`Broker`] (the
/// chaos test restarts it), which skips the test when there is none.
pub(crate) fn brokers() -> String {
    Service::Kafka.address().expect("the test holds the broker")
}

fn kafka_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../e2e/services/kafka.sh")
}

/// A job whose tasks go through a topic of its own.
pub(crate) fn kafka_job(name: &str, url: &str, partitions: u32) -> String {
    kafka_job_with(name, url, partitions, "")
}

/// [`kafka_job`] with `extra_spec` (indented YAML lines) added to the job's spec.
fn kafka_job_with(name: &str, url: &str, partitions: u32, extra_spec: &str) -> String {
    let topic = format!("asyncd-test-{name}-{}", uuid::Uuid::now_v7().simple());
    job_yaml(
        name,
        name,
        url,
        &format!(
            "  kafka:\n    topic: {topic}\n    partitions: {partitions}\n    consumerGroup: {topic}-cg\n{extra_spec}"
        ),
    )
}

#[tokio::test]
async fn immediate_and_delayed_tasks_round_trip_through_the_broker() {
    let Some(_broker) = Broker::shared().await else {
        return;
    };
    let executor = Executor::start(|_| Answer::ok()).await;
    let jobs = [("job.yaml", kafka_job("roundtrip", &executor.url(), 3))];
    let brokers = brokers();
    let asyncd = Asyncd::start(&jobs, &["--kafka-brokers", &brokers, "--create-topics"]).await;

    // The topic is created on start; the first produce may race it, so wait for a 201.
    let first = wait_for("the first submit through Kafka", DEADLINE, async || {
        let (status, answer) = asyncd
            .post("/v1/tasks", json!({"type": "roundtrip", "payload": "now"}))
            .await;
        (status == 201).then_some(answer)
    })
    .await;
    assert_eq!(first["route"], "kafka");
    // The consumer is up once the first task ran; from here on, timing is steady state.
    executor.wait_calls(first["id"].as_str().unwrap(), 1).await;
    let (status, delayed) = asyncd
        .post("/v1/tasks", json!({"type": "roundtrip", "payload": "later", "delay": "2s", "start_within": "10m", "idempotency_key": "rt-1"}))
        .await;
    assert_eq!((status, delayed["route"].as_str()), (201, Some("kafka")));
    let (status, far) = asyncd
        .post("/v1/tasks", json!({"type": "roundtrip", "delay": "20m"}))
        .await;
    assert_eq!(
        (status, far["route"].as_str()),
        (201, Some("store")),
        "beyond the 10 min threshold"
    );

    let id = delayed["id"].as_str().unwrap();
    let call = executor.wait_calls(id, 1).await.remove(0);
    let eta = parse_time(&delayed["eta"]);
    let at = millis(call.at);
    assert!(
        at >= eta && at - eta < 500,
        "ran {} ms after its ETA",
        at - eta
    );
    assert_eq!(call.body["payload"], "later");
    assert_eq!(call.headers["idempotency-key"], "rt-1");
    let task = asyncd.wait_state(id, "succeeded").await;
    assert_eq!(task["attempt"], 1);
    assert_eq!(
        parse_time(&task["expires_at"]),
        eta + 600_000,
        "the expiry travels in the envelope: {task}"
    );

    // Once consumed, the key is known: a repeat answers with the first task.
    let (status, again) = asyncd
        .post(
            "/v1/tasks",
            json!({"type": "roundtrip", "payload": "later", "idempotency_key": "rt-1"}),
        )
        .await;
    assert_eq!(
        (status, again["id"].as_str(), again["duplicate"].as_bool()),
        (200, Some(id), Some(true))
    );
    // The key with another payload is another request: refused on this route too.
    let (status, refused) = asyncd
        .post(
            "/v1/tasks",
            json!({"type": "roundtrip", "payload": "other", "idempotency_key": "rt-1"}),
        )
        .await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"]["code"], "idempotency_mismatch");
    assert_eq!(refused["error"]["existing_id"].as_str(), Some(id));

    // Lag is reported every 5 s, and the chaos test in this binary restarts the shared
    // broker meanwhile (10-15 s without watermarks): allow for both.
    let metrics = wait_for(
        "consumer lag reported",
        Duration::from_secs(60),
        async || {
            let m = asyncd.metrics().await;
            m.contains("asyncd_kafka_consumer_lag{").then_some(m)
        },
    )
    .await;
    assert!(
        metrics
            .contains("asyncd_task_executed_total{status=\"success\",task_type=\"roundtrip\"} 2"),
        "{metrics}"
    );
}

/// A client that repeats a submit it got no answer to (the soak's SIGKILLed API) sends
/// the same idempotency key while the first copy may still be in the topic, where the
/// store cannot see it. Both answers must name one task that exists and runs once.
#[tokio::test]
async fn a_repeat_while_the_first_is_in_kafka_answers_the_same_task() {
    let Some(_broker) = Broker::shared().await else {
        return;
    };
    let executor = Executor::start(|_| Answer::ok()).await;
    let jobs = [("job.yaml", kafka_job("repeat", &executor.url(), 1))];
    let brokers = brokers();
    let asyncd = Asyncd::start(&jobs, &["--kafka-brokers", &brokers, "--create-topics"]).await;
    wait_for("the topic accepts submits", DEADLINE, async || {
        let (status, _) = asyncd
            .post("/v1/tasks", json!({"type": "repeat", "payload": "warm-up"}))
            .await;
        (status == 201).then_some(())
    })
    .await;

    let submit = || {
        asyncd.post(
            "/v1/tasks",
            json!({"type": "repeat", "payload": "once", "delay": "1s", "idempotency_key": "repeat-1"}),
        )
    };
    // Concurrent, so neither finds the other in the store.
    let ((first_status, first), (second_status, second)) = tokio::join!(submit(), submit());
    assert!(
        [first_status, second_status]
            .iter()
            .all(|s| *s == 200 || *s == 201),
        "{first} {second}"
    );
    let id = first["id"].as_str().unwrap();
    assert_eq!(
        second["id"].as_str(),
        Some(id),
        "two ids for one idempotency key"
    );

    // The task is found once consumed; before the fix the answered id never existed.
    let calls = executor.wait_calls(id, 1).await;
    assert_eq!(calls[0].headers["idempotency-key"], "repeat-1");
    let task = asyncd.wait_state(id, "succeeded").await;
    assert_eq!(task["attempt"], 1);
    assert_eq!(executor.calls_for(id).len(), 1, "the work ran twice");
}

/// Issue 14: on the Kafka route a task is ranked by priority only once a consumer has
/// stored it, so a high-priority task behind a lagging flood in the job's topic waited
/// for the consumer to read the whole flood first. Now it travels through the job's
/// high-priority topic, which a consumer of its own reads at once.
///
/// 50 000 due priority-0 tasks wait in the topic before a dispatcher starts; the job
/// begins attempts at 50/s (`rateLimit`; `concurrency: 4`), so the count of attempts
/// begun while the priority-9 task travels measures how long it waited, on any machine.
/// It is submitted once both consumers are reading (a first backlog task and a
/// priority-9 warm-up ran), with the flood still lagging.
#[tokio::test]
async fn a_priority_9_task_overtakes_a_lagging_flood_of_50_000_priority_0_tasks() {
    let Some(_broker) = Broker::shared().await else {
        return;
    };
    const BACKLOG: usize = 50_000;
    const PER_SECOND: usize = 50;
    /// Attempts begun between the priority-9 task's submit and its own: its produce,
    /// fetch and store take well under the 2 s this allows at 50/s. Behind the flood it
    /// waited for the consumer to store some 50 000 tasks, many seconds.
    const BOUND: usize = 2 * PER_SECOND;
    let executor = Executor::start(|_| Answer::ok()).await;
    let limits = format!("  concurrency: 4\n  rateLimit:\n    perSecond: {PER_SECOND}\n");
    let Some(cluster) = Cluster::start(&kafka_job_with("prio", &executor.url(), 3, &limits)).await
    else {
        return;
    };
    let warm_up = cluster
        .submit(vec![
            json!({"type": "prio", "payload": "warm-up", "priority": 9}),
        ])
        .await;
    let backlog: Vec<Value> = (0..BACKLOG)
        .map(|n| json!({"type": "prio", "payload": {"n": n}}))
        .collect();
    // Four requests in flight: the broker acknowledges each batch, so one at a time
    // would spend most of the test waiting.
    let parts: Vec<Vec<Value>> = backlog.chunks(BACKLOG / 4).map(|c| c.to_vec()).collect();
    let produced =
        futures::future::join_all(parts.into_iter().map(|part| cluster.submit(part))).await;
    assert_eq!(produced.iter().map(Vec::len).sum::<usize>(), BACKLOG);

    // With the default claim hold rather than the cluster's 3 s: the adopted flood stays
    // claimed for the test's length instead of lapsing into the rescuer meanwhile.
    let listen = format!("127.0.0.1:{}", free_port());
    let mut args = Cluster::args("dispatcher", &cluster.store, &cluster.jobs, &listen);
    let hold = args.iter().position(|a| a == "--claim-hold").unwrap() + 1;
    args[hold] = "30s".into();
    let _dispatcher = Role::start("dispatcher", &listen, args, cluster.dir.path());
    executor.wait_calls(&warm_up[0], 1).await;
    wait_for("the flood to begin", DEADLINE, async || {
        (executor.calls().len() >= 2).then_some(())
    })
    .await;
    let before = executor.calls().len();
    let high = cluster
        .submit(vec![
            json!({"type": "prio", "payload": "high", "priority": 9}),
        ])
        .await
        .remove(0);
    // Until it ran, or until more of the flood than the bound began before it.
    let (between, at) = wait_for("the priority-9 task's call", DEADLINE, async || {
        let calls = executor.calls();
        match calls.iter().position(|c| c.id == high) {
            Some(at) => Some((at - before, Some(at))),
            None => (calls.len() - before > BOUND).then_some((calls.len() - before, None)),
        }
    })
    .await;
    eprintln!(
        "{between} backlog attempts began between the priority-9 task's submit and its own ({at:?} calls before it)"
    );
    assert!(
        between <= BOUND,
        "{between} attempts of the lagging flood began before the priority-9 task (bound {BOUND})"
    );
    let at = at.unwrap();
    assert!(
        at < BACKLOG / 2,
        "the flood was not lagging: {at} calls came before the priority-9 task"
    );
}

/// `asyncd api` on a fresh PostgreSQL database, to which a test adds dispatchers; it
/// holds the [`cluster_turn`] while it lives.
struct Cluster {
    dir: tempfile::TempDir,
    api: String,
    store: String,
    jobs: PathBuf,
    http: reqwest::Client,
    _api_role: Role,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

impl Cluster {
    async fn start(job: &str) -> Option<Self> {
        Self::start_jobs(&[("job.yaml", job.to_string())]).await
    }

    /// A cluster serving every job of `files` (file name, YAML), on a fresh PostgreSQL
    /// database; `None` when PostgreSQL is not there: the test skips.
    async fn start_jobs(files: &[(&str, String)]) -> Option<Self> {
        let store = fresh_database(Service::Postgres).await?;
        let turn = cluster_turn().await;
        let dir = tempfile::tempdir().unwrap();
        let jobs = dir.path().join("jobs");
        std::fs::create_dir(&jobs).unwrap();
        for (file, job) in files {
            std::fs::write(jobs.join(file), job).unwrap();
        }
        migrate(&store);
        let api = format!("127.0.0.1:{}", free_port());
        let mut args = Self::args("api", &store, &jobs, &api);
        args.push("--create-topics".into());
        let api_role = Role::start("api", &api, args, dir.path());
        let http = reqwest::Client::new();
        let health = format!("http://{api}/healthz");
        wait_for("api healthy", DEADLINE, async || {
            http.get(&health)
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success())
                .map(|_| ())
        })
        .await;
        Some(Self {
            dir,
            api,
            store,
            jobs,
            http,
            _api_role: api_role,
            _turn: turn,
        })
    }

    fn args(role: &str, store: &str, jobs: &std::path::Path, listen: &str) -> Vec<String> {
        [
            role,
            "--store",
            store,
            "--config",
            &jobs.display().to_string(),
            "--listen",
            listen,
            "--kafka-brokers",
            &brokers(),
            "--claim-hold",
            "3s",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    fn dispatcher(&self, name: &str) -> Role {
        let listen = format!("127.0.0.1:{}", free_port());
        Role::start(
            name,
            &listen,
            Self::args("dispatcher", &self.store, &self.jobs, &listen),
            self.dir.path(),
        )
    }

    /// Submits in batches; every task must be accepted through Kafka.
    async fn submit(&self, tasks: Vec<Value>) -> Vec<String> {
        let mut ids = Vec::new();
        for chunk in tasks.chunks(500) {
            let answer = wait_for("a batch accepted", DEADLINE, async || {
                let r = self
                    .http
                    .post(format!("http://{}/v1/tasks:batch", self.api))
                    .json(&json!({ "tasks": chunk }))
                    .send()
                    .await
                    .ok()?;
                let answer: Value = r.json().await.ok()?;
                let results = answer["results"].as_array()?;
                results
                    .iter()
                    .all(|r| r["status"] == 201)
                    .then(|| answer.clone())
            })
            .await;
            for result in answer["results"].as_array().unwrap() {
                assert_eq!(result["route"], "kafka");
                ids.push(result["id"].as_str().unwrap().to_string());
            }
        }
        ids
    }
}

/// A value of a role's `/metrics`: the first line starting with `series`, 0 if none.
async fn role_metric(http: &reqwest::Client, role: &Role, series: &str) -> f64 {
    let text = match http
        .get(format!("http://{}/metrics", role.listen))
        .send()
        .await
    {
        Ok(answer) => answer.text().await.unwrap_or_default(),
        Err(_) => return 0.0,
    };
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// The claimer's passes: each claim it makes is one observation.
const CLAIM_PASSES: &str = "asyncd_mysql_poll_duration_seconds_count";

/// Issue 14 on the Kafka route: tasks produced while their job is paused (through the
/// API) are consumed and stored, and none reaches the executor — before and after a
/// SIGKILLed dispatcher comes back — while a job beside it runs; the resume runs each
/// of them exactly once.
#[tokio::test]
async fn a_paused_job_holds_its_kafka_route_tasks_across_a_dispatcher_restart() {
    let Some(_broker) = Broker::shared().await else {
        return;
    };
    const TASKS: usize = 40;
    let executor = Executor::start(|_| Answer::ok()).await;
    let paused_job = kafka_job("kpause", &executor.url(), 2);
    let topic = topic_of(&paused_job);
    let Some(cluster) = Cluster::start_jobs(&[
        ("paused.yaml", paused_job),
        ("control.yaml", kafka_job("kcontrol", &executor.url(), 1)),
    ])
    .await
    else {
        return;
    };
    let (http, api) = (&cluster.http, &cluster.api);
    let answer = http
        .post(format!("http://{api}/v1/jobs/kpause/pause"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let ids = cluster
        .submit(
            (0..TASKS)
                .map(|n| json!({"type": "kpause", "payload": {"n": n}}))
                .collect(),
        )
        .await;
    let ids: HashSet<String> = ids.into_iter().collect();
    let state = async |id: &str| -> Option<String> {
        let answer = http
            .get(format!("http://{api}/v1/tasks/{id}"))
            .send()
            .await
            .ok()?;
        let task: Value = answer.json().await.ok()?;
        task["state"].as_str().map(str::to_string)
    };
    // Until every paused task is in the store and some claim passes that could have
    // taken them have run, and the control job's task — produced after them, and run by
    // the same dispatcher — has been called: the dispatcher was running all along.
    let held_until_the_control_ran = async |dispatcher: &Role, control: &str| {
        executor.wait_calls(control, 1).await;
        wait_for("every paused task stored", DEADLINE, async || {
            for id in &ids {
                let state = state(id).await?;
                assert!(
                    state == "pending" || state == "claimed",
                    "paused task {id} is {state}"
                );
            }
            Some(())
        })
        .await;
        let passes = role_metric(http, dispatcher, CLAIM_PASSES).await;
        wait_for("two more claim passes", DEADLINE, async || {
            (role_metric(http, dispatcher, CLAIM_PASSES).await >= passes + 2.0).then_some(())
        })
        .await;
        let series = "asyncd_job_paused{job=\"kpause\"}";
        assert_eq!(role_metric(http, dispatcher, series).await, 1.0);
        let ran: Vec<_> = executor
            .calls()
            .into_iter()
            .filter(|c| ids.contains(&c.id))
            .collect();
        assert!(ran.is_empty(), "paused tasks reached the executor: {ran:?}");
    };

    let mut dispatcher = cluster.dispatcher("dispatcher-0");
    let control = cluster
        .submit(vec![json!({"type": "kcontrol", "payload": "first"})])
        .await
        .remove(0);
    wait_committed_to_the_end(&topic, &format!("{topic}-cg")).await;
    held_until_the_control_ran(&dispatcher, &control).await;

    // A crash and a restart: the new process reads the pause from the store too.
    dispatcher.kill9();
    dispatcher.spawn();
    let control = cluster
        .submit(vec![
            json!({"type": "kcontrol", "payload": "after the restart"}),
        ])
        .await
        .remove(0);
    held_until_the_control_ran(&dispatcher, &control).await;

    let answer = http
        .post(format!("http://{api}/v1/jobs/kpause/resume"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    // The claims the killed process held come back when their 3 s hold lapses.
    wait_for("every paused task succeeded", DEADLINE, async || {
        for id in &ids {
            (state(id).await? == "succeeded").then_some(())?;
        }
        Some(())
    })
    .await;
    let calls = executor.calls_by_task();
    for id in &ids {
        let n = calls.get(id).map_or(0, Vec::len);
        assert_eq!(n, 1, "task {id} was called {n} times");
    }
}

/// Issue 15: a Kafka-routed task cancelled while its message waits in the topic (no
/// dispatcher consumes it yet) is cancelled — it never reaches the executor — and the
/// task submitted after it on the same partition still runs.
#[tokio::test]
async fn a_task_cancelled_before_it_is_consumed_never_runs() {
    let Some(_broker) = Broker::shared().await else {
        return;
    };
    let executor = Executor::start(|_| Answer::ok()).await;
    let Some(cluster) = Cluster::start(&kafka_job("precancel", &executor.url(), 1)).await else {
        return;
    };
    let ids = cluster
        .submit(vec![
            json!({"type": "precancel", "payload": "cancel me"}),
            json!({"type": "precancel", "payload": "run me"}),
        ])
        .await;
    let (cancelled, runs) = (&ids[0], &ids[1]);
    let http = &cluster.http;
    let api = &cluster.api;
    let answer = http
        .delete(format!("http://{api}/v1/tasks/{cancelled}"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        answer.status(),
        404,
        "without ?job= an id not in the store is unknown"
    );
    let answer = http
        .delete(format!("http://{api}/v1/tasks/{cancelled}?job=precancel"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(
        (body["id"].as_str(), body["state"].as_str()),
        (Some(cancelled.as_str()), Some("cancelled"))
    );

    let _dispatcher = cluster.dispatcher("dispatcher-0");
    executor.wait_calls(runs, 1).await;
    let task: Value = http
        .get(format!("http://{api}/v1/tasks/{cancelled}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(task["state"], "cancelled", "{task}");
    assert!(
        executor.calls_for(cancelled).is_empty(),
        "the message before {runs} on the one partition was consumed, and not run"
    );
}

/// Issue 33: a Kafka-routed task changed while its message waits in the topic (no
/// dispatcher consumes it yet) runs changed once consumed: the change is recorded (202),
/// a second change before consumption adds to it, and the task keeps its id.
#[tokio::test]
async fn a_task_changed_before_it_is_consumed_runs_changed() {
    let Some(_broker) = Broker::shared().await else {
        return;
    };
    let executor = Executor::start(|_| Answer::ok()).await;
    let Some(cluster) = Cluster::start(&kafka_job("prechange", &executor.url(), 1)).await else {
        return;
    };
    let ids = cluster
        .submit(vec![
            json!({"type": "prechange", "payload": "as submitted"}),
        ])
        .await;
    let id = &ids[0];
    let (http, api) = (&cluster.http, &cluster.api);
    let patch = async |path: String, body: Value| {
        let answer = http
            .patch(format!("http://{api}{path}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = answer.status().as_u16();
        (status, answer.json::<Value>().await.unwrap_or(Value::Null))
    };
    let (status, _) = patch(format!("/v1/tasks/{id}"), json!({"payload": "changed"})).await;
    assert_eq!(
        status, 404,
        "without ?job= an id not in the store is unknown"
    );
    let (status, answer) = patch(
        format!("/v1/tasks/{id}?job=prechange"),
        json!({"payload": "changed"}),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(
        (&answer["id"], &answer["consumed"]),
        (&json!(id), &json!(false))
    );
    let (status, answer) = patch(
        format!("/v1/tasks/{id}?job=prechange"),
        json!({"priority": 7}),
    )
    .await;
    assert_eq!(status, 202, "a second change before consumption: {answer}");

    let _dispatcher = cluster.dispatcher("dispatcher-0");
    executor.wait_calls(id, 1).await;
    let calls = executor.calls_for(id);
    assert_eq!(
        calls[0].body["payload"],
        json!("changed"),
        "the changed payload"
    );
    let task: Value = http
        .get(format!("http://{api}/v1/tasks/{id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(task["priority"], 7, "both changes: {task}");
    let (status, answer) = patch(
        format!("/v1/tasks/{id}?job=prechange"),
        json!({"priority": 1}),
    )
    .await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (409, &json!("task_started")),
        "consumed and run: {answer}"
    );
}

/// Issue 31, reproduction 1: a cancel ahead of consumption cannot plant a row under the
/// id another job's idempotency key derives (nor can it under its own job's: that id is
/// another), so the other job's submit with that key is a new task that runs, not a
/// duplicate of nothing. A keyed Kafka task is cancelled ahead of consumption by its key.
#[tokio::test]
async fn a_cancel_before_consumption_plants_nothing_under_another_jobs_ids() {
    let Some(_broker) = Broker::shared().await else {
        return;
    };
    let executor = Executor::start(|_| Answer::ok()).await;
    let Some(cluster) = Cluster::start_jobs(&[
        ("a.yaml", kafka_job("planter", &executor.url(), 1)),
        // A job with a topic too: its keyed tasks have the ids their keys derive.
        ("b.yaml", kafka_job("victim", &executor.url(), 1)),
    ])
    .await
    else {
        return;
    };
    let (http, api) = (&cluster.http, &cluster.api);
    let victims_id = asyncd::api::submit::key_id("victim", "order-77");
    let answer = http
        .delete(format!("http://{api}/v1/tasks/{victims_id}?job=planter"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 404, "a derived id is not planted");

    let answer = http
        .delete(format!(
            "http://{api}/v1/tasks?job=planter&idempotency_key=order-77"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let cancelled: Value = answer.json().await.unwrap();
    let planters_id = asyncd::api::submit::key_id("planter", "order-77");
    assert_eq!(
        (cancelled["id"].as_str(), cancelled["state"].as_str()),
        (Some(planters_id.as_str()), Some("cancelled"))
    );
    assert_ne!(planters_id, victims_id);

    let answer = http
        .post(format!("http://{api}/v1/tasks"))
        .json(&json!({"type": "victim", "idempotency_key": "order-77"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 201);
    let submitted: Value = answer.json().await.unwrap();
    assert_eq!(
        (submitted["id"].as_str(), submitted["duplicate"].as_bool()),
        (Some(victims_id.as_str()), Some(false))
    );
    let _dispatcher = cluster.dispatcher("dispatcher-0");
    executor.wait_calls(&victims_id, 1).await;

    // The planter's own keyed task, produced after its cancel, never runs.
    let produced = cluster
        .submit(vec![
            json!({"type": "planter", "idempotency_key": "order-77"}),
            json!({"type": "planter", "payload": "after it"}),
        ])
        .await;
    assert_eq!(produced[0], planters_id);
    executor.wait_calls(&produced[1], 1).await;
    assert!(executor.calls_for(&planters_id).is_empty());
}

#[tokio::test]
async fn chaos_sigkilled_dispatchers_and_a_broker_restart_lose_nothing() {
    let Some(_broker) = Broker::alone().await else {
        return;
    };
    const WAVES: usize = 4;
    const WAVE: usize = 2500;
    let executor = Executor::start(|_| Answer::ok()).await;
    let Some(cluster) = Cluster::start(&kafka_job("chaos", &executor.url(), 6)).await else {
        return;
    };
    let mut dispatchers: Vec<Role> = (0..3)
        .map(|i| cluster.dispatcher(&format!("dispatcher-{i}")))
        .collect();

    // Waves of tasks with delays over 0–30 s, a dispatcher SIGKILLed (and restarted)
    // after each, and the broker restarted once while tasks are in flight.
    let mut ids = Vec::new();
    for wave in 0..WAVES {
        let tasks: Vec<Value> = (0..WAVE)
            .map(|i| {
                let n = wave * WAVE + i;
                json!({"type": "chaos", "payload": {"n": n}, "delay": format!("{}ms", (n * 7919) % 30_000)})
            })
            .collect();
        ids.extend(cluster.submit(tasks).await);
        let threshold = wave * WAVE + WAVE / 10;
        wait_for(
            &format!("{threshold} tasks executed"),
            Duration::from_secs(90),
            async || (executor.calls_by_task().len() >= threshold).then_some(()),
        )
        .await;
        let victim = wave % dispatchers.len();
        dispatchers[victim].kill9();
        if wave == 1 {
            let status = Command::new("bash")
                .arg(kafka_script())
                .arg("restart")
                .status()
                .unwrap();
            assert!(status.success(), "broker restart");
        }
        dispatchers[victim].spawn();
    }
    assert_eq!(ids.len(), WAVES * WAVE);

    wait_for(
        "every task executed",
        Duration::from_secs(180),
        async || {
            let counts = executor.calls_by_task();
            ids.iter().all(|id| counts.contains_key(id)).then_some(())
        },
    )
    .await;
    let counts = executor.calls_by_task();
    let duplicates: usize = counts.values().map(|c| c.len() - 1).sum();
    let early = counts
        .values()
        .flatten()
        .filter(|c| millis(c.at) < parse_time(&c.body["eta"]))
        .count();
    println!(
        "kafka chaos: {} tasks, {WAVES} SIGKILLs, 1 broker restart: {duplicates} duplicate executions, 0 lost",
        ids.len()
    );
    assert_eq!(early, 0, "no task ran before its ETA");
}

#[tokio::test]
async fn a_joining_dispatcher_takes_partitions_without_losing_or_stalling_tasks() {
    let Some(_broker) = Broker::shared().await else {
        return;
    };
    const WAVE: usize = 1500;
    let executor = Executor::start(|_| Answer::ok()).await;
    let Some(cluster) = Cluster::start(&kafka_job("rebalance", &executor.url(), 6)).await else {
        return;
    };
    let _first = cluster.dispatcher("first");
    let wave = |from: usize| -> Vec<Value> {
        (from..from + WAVE)
            .map(|i| json!({"type": "rebalance", "payload": {"i": i}, "delay": format!("{}ms", 2000 + (i * 7919) % 12_000)}))
            .collect()
    };
    let mut ids = cluster.submit(wave(0)).await;
    wait_for(
        "some of the first wave executed",
        Duration::from_secs(60),
        async || (executor.calls_by_task().len() >= WAVE / 4).then_some(()),
    )
    .await;
    let second = cluster.dispatcher("second");
    // The joiner reports consumer lag once the rebalance gave it partitions.
    let metrics = format!("http://{}/metrics", second.listen);
    wait_for(
        "the joining dispatcher to hold partitions",
        Duration::from_secs(60),
        async || {
            let text = cluster
                .http
                .get(&metrics)
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            text.contains("asyncd_kafka_consumer_lag{").then_some(())
        },
    )
    .await;
    for n in 1..=2 {
        ids.extend(cluster.submit(wave(n * WAVE)).await);
    }
    wait_for("every task executed", Duration::from_secs(90), async || {
        let counts = executor.calls_by_task();
        ids.iter().all(|id| counts.contains_key(id)).then_some(())
    })
    .await;
    let counts = executor.calls_by_task();
    let mut lateness: Vec<i64> = counts
        .values()
        .map(|c| millis(c[0].at) - parse_time(&c[0].body["eta"]))
        .collect();
    lateness.sort_unstable();
    let p99 = lateness[lateness.len() * 99 / 100];
    let by_second = counts
        .values()
        .filter(|c| c[0].headers["asyncd-dispatcher"].starts_with("second"))
        .count();
    println!(
        "rebalance: {} tasks, lateness p99 {p99} ms, {by_second} run by the joining dispatcher",
        ids.len()
    );
    assert!(by_second > 0, "the new dispatcher got partitions");
    assert!(lateness[0] >= 0, "nothing ran early");
    // A hand-over that stalls waits out the consumer's 10 s session timeout (or a claim
    // hold) before another member takes the partition; below that, lateness measures how
    // busy this machine is, not the rebalance, so the bound is the timeout itself.
    assert!(
        p99 < 10_000,
        "the rebalance stalled tasks: p99 lateness {p99} ms"
    );
}

/// Issue 10: with the broker down a submit blocked for 30 s, then answered 503, and the
/// produce that timed out could still land later. Now the produce gives up after the
/// delivery timeout and the task goes to the store under the same id, so a late Kafka
/// copy is dropped by the primary key. The API here produces to a port nobody listens
/// on; the dispatcher consumes the job's topic on the real broker, where the test then
/// puts the late copy itself (a timed-out produce that landed after all).
#[tokio::test]
async fn with_the_broker_unreachable_a_submit_falls_back_to_the_store_under_the_same_id() {
    let Some(_broker) = Broker::shared().await else {
        return;
    };
    const DELIVERY_TIMEOUT: Duration = Duration::from_secs(5);
    let executor = Executor::start(|_| Answer::ok()).await;
    let job = kafka_job("fallback", &executor.url(), 1);
    let topic = job
        .lines()
        .find_map(|l| l.trim().strip_prefix("topic: "))
        .unwrap()
        .to_string();
    let Some(store) = fresh_database(Service::Postgres).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs");
    std::fs::create_dir(&jobs).unwrap();
    std::fs::write(jobs.join("job.yaml"), &job).unwrap();
    migrate(&store);
    let role = |role: &str, listen: &str, brokers: &str, extra: &[&str]| {
        let mut args: Vec<String> = [
            role,
            "--store",
            &store,
            "--config",
            &jobs.display().to_string(),
            "--listen",
            listen,
            "--kafka-brokers",
            brokers,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        Role::start(role, listen, args, dir.path())
    };
    let unreachable = format!("127.0.0.1:{}", free_port());
    let api = format!("127.0.0.1:{}", free_port());
    let _api = role(
        "api",
        &api,
        &unreachable,
        &["--kafka-delivery-timeout", "5s"],
    );
    let dispatcher = format!("127.0.0.1:{}", free_port());
    let _dispatcher = role("dispatcher", &dispatcher, &brokers(), &["--create-topics"]);
    let http = reqwest::Client::new();
    wait_for("api healthy", DEADLINE, async || {
        http.get(format!("http://{api}/healthz"))
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success())
    })
    .await;

    let started = std::time::Instant::now();
    let r = http
        .post(format!("http://{api}/v1/tasks"))
        .json(&json!({"type": "fallback", "payload": "via the store", "idempotency_key": "fallback-1"}))
        .send()
        .await
        .unwrap();
    let took = started.elapsed();
    let status = r.status().as_u16();
    let answer: Value = r.json().await.unwrap();
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["route"], "store", "{answer}");
    // Generous: the point is seconds, not the 30 s the submit used to block.
    assert!(
        took < DELIVERY_TIMEOUT + Duration::from_secs(8),
        "the submit took {took:?}"
    );
    let id = answer["id"].as_str().unwrap().to_string();
    assert_eq!(id, asyncd::api::submit::key_id("fallback", "fallback-1"));

    // Right after a failure the broker is not waited for again: straight to the store.
    let started = std::time::Instant::now();
    let r = http
        .post(format!("http://{api}/v1/tasks"))
        .json(&json!({"type": "fallback", "payload": "no wait"}))
        .send()
        .await
        .unwrap();
    let took = started.elapsed();
    let (status, second): (u16, Value) = (r.status().as_u16(), r.json().await.unwrap());
    assert_eq!(
        (status, second["route"].as_str()),
        (201, Some("store")),
        "{second}"
    );
    assert!(took < DELIVERY_TIMEOUT, "the second submit took {took:?}");
    executor.wait_calls(second["id"].as_str().unwrap(), 1).await;

    executor.wait_calls(&id, 1).await;
    let task_url = format!("http://{api}/v1/tasks/{id}");
    let task = wait_for("the task to succeed", DEADLINE, async || {
        let task: Value = http.get(&task_url).send().await.ok()?.json().await.ok()?;
        (task["state"] == "succeeded").then_some(task)
    })
    .await;
    assert_eq!(task["attempt"], 1);
    let metrics = http
        .get(format!("http://{api}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // One: the second submit was never produced.
    assert!(
        metrics.contains("asyncd_kafka_produce_fallback_total{task_type=\"fallback\"} 1"),
        "{metrics}"
    );

    // The late copy, then a new task behind it in the one partition: once the new one
    // ran, the consumer has read the copy and gone on past it.
    let producer = asyncd::kafka::Producer::new(
        &brokers(),
        &Default::default(),
        Duration::from_secs(600),
        Duration::from_secs(10),
        None,
    )
    .unwrap();
    let envelope = |id: &str, payload: &str| asyncd_store::NewTask {
        idempotency_key: Some("fallback-1".into()).filter(|_| payload == "via the store"),
        ..asyncd_store::NewTask::test(
            "fallback",
            asyncd_store::Millis::new(millis(std::time::SystemTime::now())),
        )
        .id(id)
        .payload(format!("\"{payload}\""))
        .timeout_ms(30_000)
    };
    let late = envelope(&id, "via the store");
    // The dispatcher creates the topic as its consumer starts.
    wait_for("the late copy produced", DEADLINE, async || {
        producer.send(&topic, &late).await.ok()
    })
    .await;
    let marker = uuid::Uuid::now_v7().to_string();
    producer
        .send(&topic, &envelope(&marker, "behind the copy"))
        .await
        .unwrap();
    executor.wait_calls(&marker, 1).await;
    assert_eq!(
        executor.calls_for(&id).len(),
        1,
        "the late Kafka copy ran the task again"
    );
    let task: Value = http
        .get(&task_url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (task["state"].as_str(), task["attempt"].as_u64()),
        (Some("succeeded"), Some(1))
    );
}

/// The topic a [`kafka_job`] YAML names.
pub(crate) fn topic_of(job: &str) -> String {
    job.lines()
        .find_map(|l| l.trim().strip_prefix("topic: "))
        .unwrap()
        .to_string()
}

/// Waits until `group` has committed, on every partition of `topic`, the partition's end:
/// the consumer went on past everything produced so far.
async fn wait_committed_to_the_end(topic: &str, group: &str) {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let (topic, group) = (topic.to_string(), group.to_string());
    wait_for(
        "the group's offsets committed past every message",
        DEADLINE,
        async || {
            let (topic, group) = (topic.clone(), group.clone());
            tokio::task::spawn_blocking(move || {
                let consumer: BaseConsumer = rdkafka::ClientConfig::new()
                    .set("bootstrap.servers", brokers())
                    .set("group.id", &group)
                    .create()
                    .ok()?;
                let timeout = Duration::from_secs(5);
                let metadata = consumer.fetch_metadata(Some(&topic), timeout).ok()?;
                let partitions = metadata.topics().first()?.partitions().len() as i32;
                let mut list = rdkafka::TopicPartitionList::new();
                for p in 0..partitions {
                    list.add_partition(&topic, p);
                }
                let committed = consumer.committed_offsets(list, timeout).ok()?;
                (0..partitions)
                    .all(|p| {
                        let end = consumer.fetch_watermarks(&topic, p, timeout).map(|w| w.1);
                        let at = committed
                            .find_partition(&topic, p)
                            .map(|e| e.offset());
                        matches!((end, at), (Ok(end), Some(rdkafka::Offset::Offset(at))) if at >= end)
                    })
                    .then_some(())
            })
            .await
            .ok()
            .flatten()
        },
    )
    .await;
}

/// Issue 10: a message that is no task envelope was skipped with a log line, its bytes
/// lost. Now it is kept in the Kafka dead-letter table byte for byte, and its offset is
/// committed with the valid task behind it.
#[tokio::test]
async fn an_unreadable_message_is_kept_with_its_bytes_and_passed() {
    let Some(_broker) = Broker::shared().await else {
        return;
    };
    let executor = Executor::start(|_| Answer::ok()).await;
    let job = kafka_job("garbage", &executor.url(), 1);
    let topic = topic_of(&job);
    let Some(cluster) = Cluster::start(&job).await else {
        return;
    };
    let dispatcher = cluster.dispatcher("dispatcher");
    // The API creates the topic; a first task through it shows the consumer is up.
    let warm_up = cluster
        .submit(vec![json!({"type": "garbage", "payload": "warm-up"})])
        .await;
    executor.wait_calls(&warm_up[0], 1).await;

    let garbage: Vec<u8> = b"\x00not an envelope\xff\xfe{\"id\":\x00".to_vec();
    let producer: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap();
    let delivered = producer
        .send(
            rdkafka::producer::FutureRecord::<(), [u8]>::to(&topic).payload(&garbage[..]),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    let behind = cluster
        .submit(vec![
            json!({"type": "garbage", "payload": "behind the garbage"}),
        ])
        .await;
    executor.wait_calls(&behind[0], 1).await;

    let store = asyncd_store::open(&cluster.store).await.unwrap();
    let letters = store
        .kafka_dead_letters(asyncd_store::KafkaDeadLetterParams {
            limit: 10,
            ..asyncd_store::KafkaDeadLetterParams::default()
        })
        .await
        .unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(
        (
            letter.topic.as_str(),
            letter.partition,
            letter.offset,
            &letter.message
        ),
        (
            topic.as_str(),
            delivered.partition,
            delivered.offset,
            &garbage
        )
    );
    assert!(
        letter.reason.starts_with("not an asyncd task envelope"),
        "{}",
        letter.reason
    );
    let metrics = reqwest::get(format!("http://{}/metrics", dispatcher.listen))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .contains("asyncd_kafka_dead_letters_total{job=\"garbage\",reason=\"unreadable\"} 1"),
        "{metrics}"
    );
    wait_committed_to_the_end(&topic, &format!("{topic}-cg")).await;
}

/// Issue 10: one consumed task the store refused made the consumer retry its whole batch
/// forever, so nothing behind it on the partition ran again. Here a CHECK constraint in
/// the test's own database refuses one task's payload (as PostgreSQL refuses a value it
/// cannot store); the batch is split, the tasks around it run, and the refused one is
/// kept in the Kafka dead-letter table with the store's reason.
#[tokio::test]
async fn a_task_the_store_refuses_is_kept_aside_and_blocks_no_other() {
    let Some(_broker) = Broker::shared().await else {
        return;
    };
    use sqlx::Connection;
    let executor = Executor::start(|_| Answer::ok()).await;
    let job = kafka_job("refused", &executor.url(), 1);
    let topic = topic_of(&job);
    let Some(cluster) = Cluster::start(&job).await else {
        return;
    };
    let mut db = sqlx::PgConnection::connect(&cluster.store).await.unwrap();
    sqlx::query(
        "ALTER TABLE tasks ADD CONSTRAINT refuse_poison CHECK (payload NOT LIKE '%POISON%')",
    )
    .execute(&mut db)
    .await
    .unwrap();

    // Submitted in one batch, so the consumer most likely reads them in one too.
    let tasks: Vec<Value> = (0..21)
        .map(|i| {
            let payload = if i == 10 {
                json!("POISON")
            } else {
                json!({"i": i})
            };
            json!({"type": "refused", "payload": payload})
        })
        .collect();
    let ids = cluster.submit(tasks).await;
    let poison = ids[10].clone();
    // Started after the submits, so the whole batch is waiting for it.
    let _dispatcher = cluster.dispatcher("dispatcher");
    for (i, id) in ids.iter().enumerate() {
        if i != 10 {
            executor.wait_calls(id, 1).await;
        }
    }

    let store = asyncd_store::open(&cluster.store).await.unwrap();
    let letters = wait_for("the refused task's dead letter", DEADLINE, async || {
        let letters = store
            .kafka_dead_letters(asyncd_store::KafkaDeadLetterParams {
                limit: 10,
                ..asyncd_store::KafkaDeadLetterParams::default()
            })
            .await
            .ok()?;
        (!letters.is_empty()).then_some(letters)
    })
    .await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(
        (letter.topic.as_str(), letter.partition, letter.offset),
        (topic.as_str(), 0, 10),
        "the 11th message of the only partition"
    );
    let envelope: Value = serde_json::from_slice(&letter.message).unwrap();
    assert_eq!(
        (envelope["id"].as_str(), envelope["payload"].as_str()),
        (Some(poison.as_str()), Some("POISON"))
    );
    assert!(
        letter
            .reason
            .contains(&format!("the store refused task {poison}"))
            && letter.reason.contains("refuse_poison"),
        "{}",
        letter.reason
    );
    assert!(store.get(&poison).await.unwrap().is_none());
    assert!(executor.calls_for(&poison).is_empty());
    wait_committed_to_the_end(&topic, &format!("{topic}-cg")).await;
}

/// Issue 31: whoever could produce to a job's topic created tasks of any type, with any
/// retries and timeout, past the API's auth and limits. Now a message of another job's
/// type, or with a field a submit would be refused, is a dead letter saying why; no task
/// comes of it, and the valid task behind it runs.
#[tokio::test]
async fn a_message_the_api_would_not_produce_to_the_topic_is_kept_aside_and_never_runs() {
    let Some(_broker) = Broker::shared().await else {
        return;
    };
    let executor = Executor::start(|_| Answer::ok()).await;
    let victim = Executor::start(|_| Answer::ok()).await;
    let job = kafka_job("front", &executor.url(), 1);
    let topic = topic_of(&job);
    let Some(cluster) = Cluster::start_jobs(&[
        ("front.yaml", job),
        (
            "victim.yaml",
            job_yaml("victim", "victim", &victim.url(), ""),
        ),
    ])
    .await
    else {
        return;
    };
    let _dispatcher = cluster.dispatcher("dispatcher");
    let warm_up = cluster
        .submit(vec![json!({"type": "front", "payload": "warm-up"})])
        .await;
    executor.wait_calls(&warm_up[0], 1).await;

    // Envelopes as the API writes them, but for another job, and past a submit's bounds.
    let envelope = |task_type: &str, max_retries: u32| {
        let id = uuid::Uuid::now_v7().to_string();
        let now = chrono::Utc::now().timestamp_millis();
        let value = json!({"id": id, "type": task_type, "payload": {"order_id": 1},
            "priority": 0, "trigger_at": now, "max_retries": max_retries, "timeout_ms": 1000});
        (id, serde_json::to_vec(&value).unwrap())
    };
    let (foreign, foreign_message) = envelope("victim", 0);
    let (unbounded, unbounded_message) = envelope("front", 1_000_000);
    let producer: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap();
    for message in [&foreign_message, &unbounded_message] {
        producer
            .send(
                rdkafka::producer::FutureRecord::<(), [u8]>::to(&topic).payload(&message[..]),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
    let behind = cluster
        .submit(vec![json!({"type": "front", "payload": "behind them"})])
        .await;
    executor.wait_calls(&behind[0], 1).await;

    let store = asyncd_store::open(&cluster.store).await.unwrap();
    let letters = wait_for("both dead letters", DEADLINE, async || {
        let letters = store
            .kafka_dead_letters(asyncd_store::KafkaDeadLetterParams {
                limit: 10,
                ..asyncd_store::KafkaDeadLetterParams::default()
            })
            .await
            .ok()?;
        (letters.len() >= 2).then_some(letters)
    })
    .await;
    let mut reasons: Vec<(i64, &str, &[u8])> = letters
        .iter()
        .map(|l| (l.offset, l.reason.as_str(), &l.message[..]))
        .collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            (
                1,
                "type \"victim\" is not the task type of job \"front\" (\"front\"), whose topic this is",
                &foreign_message[..]
            ),
            (
                2,
                "refused as a submit would be: max_retries: must be 0..=100",
                &unbounded_message[..]
            ),
        ]
    );
    for id in [&foreign, &unbounded] {
        assert!(store.get(id).await.unwrap().is_none(), "task {id} exists");
    }
    assert!(
        victim.calls().is_empty(),
        "the other job's executor was called"
    );
    assert!(executor.calls_for(&unbounded).is_empty());
    wait_committed_to_the_end(&topic, &format!("{topic}-cg")).await;
}

/// With the store away, a task for the Kafka route is still accepted: nothing on that
/// route needs the store (the idempotency lookup is skipped; the id comes from the key),
/// and the dispatchers, which reach the store, run it.
#[tokio::test]
async fn with_the_store_away_a_kafka_route_submit_is_still_accepted() {
    let Some(_broker) = Broker::shared().await else {
        return;
    };
    let executor = Executor::start(|_| Answer::ok()).await;
    let job = kafka_job("nostore", &executor.url(), 1);
    let Some(store) = fresh_database(Service::Postgres).await else {
        return;
    };
    let proxy = DbProxy::start(&store, true).await;
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs");
    std::fs::create_dir(&jobs).unwrap();
    std::fs::write(jobs.join("job.yaml"), &job).unwrap();
    let role = |role: &str, listen: &str, store: &str| {
        let args: Vec<String> = [
            role,
            "--store",
            store,
            "--config",
            &jobs.display().to_string(),
            "--listen",
            listen,
            "--kafka-brokers",
            &brokers(),
            "--create-topics",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        Role::start(role, listen, args, dir.path())
    };
    let api = format!("127.0.0.1:{}", free_port());
    let _api = role("api", &api, &proxy.url(&store));
    let dispatcher = format!("127.0.0.1:{}", free_port());
    let _dispatcher = role("dispatcher", &dispatcher, &store);
    let http = reqwest::Client::new();
    let submit = async |key: &str| {
        let r = http
            .post(format!("http://{api}/v1/tasks"))
            .json(&json!({"type": "nostore", "payload": key, "idempotency_key": key}))
            .send()
            .await
            .ok()?;
        let status = r.status().as_u16();
        Some((status, r.json::<Value>().await.ok()?))
    };
    // A first task through Kafka while the store is up: the topic and consumer exist.
    let first = wait_for("a first Kafka-route submit", DEADLINE, async || {
        submit("first").await.filter(|(status, _)| *status == 201)
    })
    .await
    .1;
    assert_eq!(first["route"], "kafka", "{first}");
    executor.wait_calls(first["id"].as_str().unwrap(), 1).await;

    proxy.cut();
    let (status, second) = submit("second").await.expect("an answer");
    assert_eq!(
        (status, second["route"].as_str()),
        (201, Some("kafka")),
        "{second}"
    );
    let id = second["id"].as_str().unwrap();
    assert_eq!(id, asyncd::api::submit::key_id("nostore", "second"));
    let calls = executor.wait_calls(id, 1).await;
    assert_eq!(calls[0].attempt, 1);
}

/// Issue 10: with the broker and the store both down there is nowhere durable to put a
/// task, so a Kafka-route submit must answer 503 with `Retry-After` within seconds (not
/// hang, not 201), and the client's retry with the same idempotency key must land once
/// the store is back.
#[tokio::test]
async fn with_the_broker_and_the_store_both_down_a_submit_answers_503_and_a_retry_lands() {
    let Some(_broker) = Broker::shared().await else {
        return;
    };
    const DELIVERY_TIMEOUT: Duration = Duration::from_secs(2);
    let job = kafka_job("nowhere", "http://127.0.0.1:9/never-called", 1);
    let Some(store) = fresh_database(Service::Postgres).await else {
        return;
    };
    let proxy = DbProxy::start(&store, true).await;
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs");
    std::fs::create_dir(&jobs).unwrap();
    std::fs::write(jobs.join("job.yaml"), &job).unwrap();
    let api = format!("127.0.0.1:{}", free_port());
    let args: Vec<String> = [
        "api",
        "--store",
        &proxy.url(&store),
        "--config",
        &jobs.display().to_string(),
        "--listen",
        &api,
        "--kafka-brokers",
        &format!("127.0.0.1:{}", free_port()),
        "--kafka-delivery-timeout",
        "2s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let _api = Role::start("api", &api, args, dir.path());
    let http = reqwest::Client::new();
    wait_for("api healthy", DEADLINE, async || {
        http.get(format!("http://{api}/healthz"))
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success())
    })
    .await;

    proxy.cut();
    let submit = || {
        http.post(format!("http://{api}/v1/tasks"))
            .json(&json!({"type": "nowhere", "payload": 1, "idempotency_key": "nowhere-1"}))
            .send()
    };
    let started = std::time::Instant::now();
    let r = submit().await.unwrap();
    let took = started.elapsed();
    let status = r.status().as_u16();
    let retry_after = r.headers().get("retry-after").cloned();
    let answer: Value = r.json().await.unwrap();
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["error"]["code"], "kafka_unavailable", "{answer}");
    assert!(retry_after.is_some(), "no Retry-After: {answer}");
    // Generous on a busy machine: the point is seconds, not sqlx's 30 s acquire timeout
    // after a 30 s produce.
    assert!(
        took < DELIVERY_TIMEOUT + Duration::from_secs(8),
        "the submit took {took:?}"
    );

    proxy.restore();
    let (status, answer) = wait_for("the retried submit accepted", DEADLINE, async || {
        let r = submit().await.ok()?;
        let status = r.status().as_u16();
        Some((status, r.json::<Value>().await.ok()?)).filter(|(s, _)| *s != 503)
    })
    .await;
    assert_eq!(
        (status, answer["route"].as_str()),
        (201, Some("store")),
        "{answer}"
    );
    let id = answer["id"].as_str().unwrap();
    assert_eq!(id, asyncd::api::submit::key_id("nowhere", "nowhere-1"));
    let task: Value = http
        .get(format!("http://{api}/v1/tasks/{id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(task["state"], "pending", "{task}");
}
