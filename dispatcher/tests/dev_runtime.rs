//! The embedded runtime end to end: the `dev` role in-process on a manual clock (so
//! every ETA, backoff and lease is asserted exactly, whatever the machine's load), a real
//! HTTP executor on loopback, and assertions on what the executor saw and what the API
//! reports. Tests that need a process of their own (SIGTERM, a per-process environment
//! variable, the process log) run the real binary.

mod support;

use std::sync::Arc;
use std::time::Duration;

use asyncd::store::Millis;
use serde_json::{Value, json};
use support::*;

fn one_job(executor: &Executor, extra: &str) -> Vec<(&'static str, String)> {
    vec![(
        "job.yaml",
        job_yaml("test-job", "work", &executor.url(), extra),
    )]
}

/// Waits for `id` to wait for its next attempt (pending, or already claimed again) and
/// moves the clock to its ETA; returns the ETA.
async fn run_when_due(asyncd: &InProcess, id: &str) -> i64 {
    let task = wait_for(&format!("{id} to wait for a retry"), DEADLINE, async || {
        let task = asyncd.task(id).await;
        matches!(task["state"].as_str(), Some("pending" | "claimed")).then_some(task)
    })
    .await;
    let eta = parse_time(&task["eta"]);
    asyncd.clock.set_millis(Millis::new(eta));
    eta
}

#[tokio::test]
async fn delayed_task_runs_at_its_eta_not_before() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let mut asyncd = InProcess::start(&one_job(&executor, "")).await;
    let (status, answer) = asyncd
        .post(
            "/v1/tasks",
            json!({"type": "work", "payload": {"n": 1}, "delay": "2s"}),
        )
        .await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["route"], "store");
    let id = answer["id"].as_str().unwrap().to_string();
    let eta = parse_time(&answer["eta"]);
    assert_eq!(eta, T0 + 2_000);
    asyncd.clock.set_millis(Millis::new(eta - 1));
    asyncd.clock.set_millis(Millis::new(eta));
    // Handed on at the clock's first reading at or past the ETA: exactly the ETA.
    assert_eq!(asyncd.dispatched(&id).await, (eta, eta));
    let call = executor.wait_calls(&id, 1).await.remove(0);
    assert_eq!(parse_time(&call.body["eta"]), eta);
    assert_eq!(call.body["payload"], json!({"n": 1}));
    assert_eq!(call.body["attempt"], 1);
    assert_eq!(
        call.headers["idempotency-key"], id,
        "defaults to the task id"
    );
    asyncd.wait_state(&id, "succeeded").await;
}

#[tokio::test]
async fn equal_etas_run_in_priority_order() {
    let executor = Executor::start(|_| Answer::ok()).await;
    // A hold long enough that a job of concurrency 1 and a 5 s timeout may hold all five
    // at once (see `asyncd::holdings`).
    let mut asyncd = InProcess::start_with(&one_job(&executor, "  concurrency: 1\n"), |s| {
        s.dispatcher.hold = Duration::from_secs(60)
    })
    .await;
    let eta = T0 + 500;
    let text = asyncd::clock::rfc3339(Millis::new(eta));
    let mut ids = Vec::new();
    for priority in [1, 5, 3, 9, 0] {
        let id = asyncd
            .submit(json!({"type": "work", "payload": {"p": priority}, "eta": text, "priority": priority}))
            .await;
        ids.push(id);
    }
    // All five in the heap before any is due, so only priority decides the order.
    let mut claimed = Vec::new();
    while claimed.len() < ids.len() {
        claimed.extend(
            asyncd
                .next("claims", |s| match s {
                    asyncd::signals::Signal::Claimed { ids, .. } => Some(ids),
                    _ => None,
                })
                .await,
        );
    }
    asyncd.clock.set_millis(Millis::new(eta));
    wait_for("all five calls", DEADLINE, async || {
        (executor.calls().len() == 5).then_some(())
    })
    .await;
    let order: Vec<i64> = executor
        .calls()
        .iter()
        .map(|c| c.body["payload"]["p"].as_i64().unwrap())
        .collect();
    assert_eq!(order, [9, 5, 3, 1, 0]);
}

#[tokio::test]
async fn failures_back_off_exponentially_then_dead_letter_and_redrive() {
    let executor = Executor::start(|_| Answer::status(500).with_body("down")).await;
    let extra = "  retry:\n    maxRetries: 3\n    initialBackoff: 200ms\n    maxBackoff: 10s\n";
    let mut asyncd = InProcess::start(&one_job(&executor, extra)).await;
    let id = asyncd.submit(task("work", json!({}))).await;
    let mut dispatched = vec![asyncd.dispatched(&id).await.1];
    for i in 0..3 {
        asyncd.finished(&id).await;
        let eta = run_when_due(&asyncd, &id).await;
        // Equal jitter: each gap lies in [backoff/2, backoff], to the millisecond.
        let gap = eta - dispatched[i];
        let full = 200 << i;
        assert!(
            (full / 2..=full).contains(&gap),
            "gap {i} was {gap} ms, not within [{}, {full}]",
            full / 2
        );
        assert_eq!(asyncd.dispatched(&id).await, (eta, eta));
        dispatched.push(eta);
    }
    let dead = asyncd.wait_state(&id, "dead").await;
    let calls = executor.calls_for(&id);
    assert_eq!(calls.len(), 4, "max_retries 3 means 4 attempts");
    assert_eq!(
        calls.iter().map(|c| c.attempt).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    assert!(
        dead["last_error"].as_str().unwrap().contains("500"),
        "{dead}"
    );

    let (_, letters) = asyncd.get("/v1/dead-letters?type=work").await;
    assert_eq!(letters["items"][0]["id"], id.as_str());
    let metrics = asyncd.metrics().await;
    assert!(
        metrics.contains("asyncd_task_retry_total{task_type=\"work\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("asyncd_task_executed_total{status=\"failed\",task_type=\"work\"} 4"),
        "{metrics}"
    );

    executor.set_script(|_| Answer::ok());
    let (status, redriven) = asyncd
        .post(&format!("/v1/dead-letters/{id}/redrive"), json!({}))
        .await;
    assert_eq!(status, 200, "{redriven}");
    let done = asyncd.wait_state(&id, "succeeded").await;
    assert_eq!(done["attempt"], 1, "redrive resets the attempt count");
    let (status, again) = asyncd
        .post(&format!("/v1/dead-letters/{id}/redrive"), json!({}))
        .await;
    assert_eq!(
        (status, again["error"]["code"].as_str()),
        (409, Some("not_dead"))
    );
    let (_, letters) = asyncd.get("/v1/dead-letters?type=work").await;
    assert_eq!(letters["items"], json!([]));
}

#[tokio::test]
async fn retry_after_is_obeyed() {
    let executor = Executor::start(|call| {
        if call.attempt == 1 {
            Answer::status(429).with_header("retry-after", "2")
        } else {
            Answer::ok()
        }
    })
    .await;
    // A 10 s backoff would be obvious if Retry-After were ignored.
    let extra = "  retry:\n    initialBackoff: 10s\n";
    let mut asyncd = InProcess::start(&one_job(&executor, extra)).await;
    let id = asyncd.submit(task("work", json!({}))).await;
    let (_, first) = asyncd.dispatched(&id).await;
    asyncd.finished(&id).await;
    let second = run_when_due(&asyncd, &id).await;
    assert_eq!(
        second - first,
        2_000,
        "second attempt exactly Retry-After later"
    );
    asyncd.wait_state(&id, "succeeded").await;
    assert_eq!(executor.calls_for(&id).len(), 2);
}

#[tokio::test]
async fn a_lapsed_202_lease_is_retried() {
    let executor = Executor::start(|call| {
        if call.attempt == 1 {
            Answer::status(202).with_body(r#"{"lease":"1s"}"#)
        } else {
            Answer::ok()
        }
    })
    .await;
    let mut asyncd =
        InProcess::start(&one_job(&executor, "  retry:\n    initialBackoff: 100ms\n")).await;
    let id = asyncd.submit(task("work", json!({}))).await;
    // The 202's lease is recorded with the attempt's outcome.
    asyncd.finished(&id).await;
    let running = asyncd.task(&id).await;
    assert_eq!(
        (running["state"].as_str(), running["attempt"].as_i64()),
        (Some("running"), Some(1))
    );
    let lease_until = parse_time(&running["lease_until"]);
    assert!(
        lease_until >= T0 + 1_000,
        "at least the executor's 1 s lease"
    );
    // Still held at its last millisecond…
    asyncd.clock.set_millis(Millis::new(lease_until));
    asyncd.rescue_pass(lease_until).await;
    assert_eq!(asyncd.task(&id).await["state"], "running");
    // …and retried once past it.
    asyncd.clock.set_millis(Millis::new(lease_until + 1));
    assert_eq!(asyncd.rescue_pass(lease_until + 1).await, 1);
    let retry = run_when_due(&asyncd, &id).await;
    assert!(
        retry > lease_until,
        "retried at {retry}, before the lease lapsed"
    );
    let done = asyncd.wait_state(&id, "succeeded").await;
    assert_eq!(done["attempt"], 2);
    let calls = executor.calls_for(&id);
    assert_ne!(
        calls[1].lease_token, calls[0].lease_token,
        "each attempt has its own token"
    );
}

#[tokio::test]
async fn heartbeats_keep_a_lease_and_the_result_completes_it() {
    let executor = Executor::start(|_| Answer::status(202).with_body(r#"{"lease":"1s"}"#)).await;
    let mut asyncd = InProcess::start(&one_job(&executor, "")).await;
    let id = asyncd.submit(task("work", json!({}))).await;
    let call = executor.wait_calls(&id, 1).await.remove(0);
    assert_eq!(
        call.headers["asyncd-callback-url"],
        format!("http://{}", asyncd.addr)
    );
    // Three seconds of work, three times the lease, kept alive by heartbeats; after each
    // step a rescuer pass has seen the clock and brought nothing back.
    for _ in 0..10 {
        let (status, beat) = asyncd
            .post(
                &format!("/v1/tasks/{id}/heartbeat"),
                json!({"lease_token": call.lease_token}),
            )
            .await;
        assert_eq!(status, 200, "{beat}");
        asyncd.clock.advance(Duration::from_millis(300));
        let now = asyncd.now();
        assert_eq!(asyncd.rescue_pass(now).await, 0);
    }
    let (status, answer) = asyncd
        .post(
            &format!("/v1/tasks/{id}/result"),
            json!({"lease_token": call.lease_token, "status": "success", "output": {"rows": 12}}),
        )
        .await;
    assert_eq!(
        (status, answer["state"].as_str()),
        (200, Some("succeeded")),
        "{answer}"
    );
    let done = asyncd.task(&id).await;
    assert_eq!(
        done["attempt"], 1,
        "no second attempt while heartbeats came"
    );
    assert_eq!(done["result"], json!({"rows": 12}));
    assert_eq!(executor.calls_for(&id).len(), 1);
}

/// Issue 10, finding 3, through the result callback: an executor whose attempt was given
/// up (its lease lapsed) and queued again, or dead-lettered on its last try, reports
/// success before any new attempt is claimed — the work did succeed, so it lands instead
/// of running again or staying in dead letters. A late failure or heartbeat is refused.
#[tokio::test]
async fn a_lapsed_attempts_success_lands_until_a_new_attempt() {
    let executor = Executor::start(|_| Answer::status(202).with_body(r#"{"lease":"1s"}"#)).await;
    // One retry, an hour away: the given-up attempt's task waits, pending, meanwhile.
    let mut asyncd = InProcess::start(&one_job(
        &executor,
        "  retry:\n    maxRetries: 1\n    initialBackoff: 1h\n    maxBackoff: 1h\n",
    ))
    .await;
    let lapse = async |asyncd: &mut InProcess, id: &str| -> String {
        let token = executor.wait_calls(id, 1).await.pop().unwrap().lease_token;
        wait_for("the 202's lease recorded", DEADLINE, async || {
            let t = asyncd.task(id).await;
            (t["state"] == "running" && !t["lease_until"].is_null()).then_some(())
        })
        .await;
        let lease_until = parse_time(&asyncd.task(id).await["lease_until"]);
        asyncd.clock.set_millis(Millis::new(lease_until + 1));
        assert_eq!(asyncd.rescue_pass(lease_until + 1).await, 1);
        token
    };

    let queued = asyncd.submit(task("work", json!({"n": 1}))).await;
    let token = lapse(&mut asyncd, &queued).await;
    assert_eq!(asyncd.task(&queued).await["state"], "pending");
    for (path, body) in [
        ("heartbeat", json!({"lease_token": token})),
        (
            "result",
            json!({"lease_token": token, "status": "failed", "error": "late"}),
        ),
    ] {
        let (status, answer) = asyncd
            .post(&format!("/v1/tasks/{queued}/{path}"), body)
            .await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (409, Some("stale_lease")),
            "late {path}"
        );
    }
    let (status, answer) = asyncd
        .post(
            &format!("/v1/tasks/{queued}/result"),
            json!({"lease_token": token, "status": "success", "output": "late"}),
        )
        .await;
    assert_eq!(
        (status, answer["state"].as_str()),
        (200, Some("succeeded")),
        "{answer}"
    );
    let done = asyncd.task(&queued).await;
    assert_eq!(
        (done["attempt"].as_i64(), &done["result"]),
        (Some(1), &json!("late"))
    );

    // Its last attempt lapsed: dead-lettered, until the success comes in.
    let last = asyncd.submit(task("work", json!({"n": 2}))).await;
    let first = lapse(&mut asyncd, &last).await;
    let (status, _) = asyncd
        .post(
            &format!("/v1/tasks/{last}/result"),
            json!({"lease_token": first, "status": "retry"}),
        )
        .await;
    assert_eq!(status, 409, "a late retry is refused too");
    run_when_due(&asyncd, &last).await;
    let calls = executor.wait_calls(&last, 2).await;
    let second = calls[1].lease_token.clone();
    assert_ne!(second, first);
    wait_for(
        "the second attempt's lease recorded",
        DEADLINE,
        async || {
            let t = asyncd.task(&last).await;
            (t["attempt"] == 2 && !t["lease_until"].is_null()).then_some(())
        },
    )
    .await;
    let lease_until = parse_time(&asyncd.task(&last).await["lease_until"]);
    asyncd.clock.set_millis(Millis::new(lease_until + 1));
    assert_eq!(asyncd.rescue_pass(lease_until + 1).await, 1);
    assert_eq!(asyncd.task(&last).await["state"], "dead");
    let (status, _) = asyncd
        .post(
            &format!("/v1/tasks/{last}/result"),
            json!({"lease_token": first, "status": "success"}),
        )
        .await;
    assert_eq!(
        status, 409,
        "the first attempt's token was spent by the second claim"
    );
    let (status, answer) = asyncd
        .post(
            &format!("/v1/tasks/{last}/result"),
            json!({"lease_token": second, "status": "success", "output": "late"}),
        )
        .await;
    assert_eq!(
        (status, answer["state"].as_str()),
        (200, Some("succeeded")),
        "{answer}"
    );
    assert_eq!(
        executor.calls_for(&last).len(),
        2,
        "nothing ran a third time"
    );
}

/// Issue 15: a job's `retention.uniqueKeys` keeps a succeeded task's unique key held,
/// counted from when it succeeded: a late submit with the key within the window is
/// refused (409 `unique_conflict` naming the finished task), and from the window's end
/// the same submit makes a new task. (The API on SQLite, where the manual clock can move
/// freely; a server store refuses to dispatch on a clock an hour off its own, and the
/// store conformance test covers the server backends at the same instants.)
#[tokio::test]
async fn a_unique_key_is_held_for_its_window_after_success() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "  retention:\n    uniqueKeys: 1h\n")).await;
    let submit = json!({"type": "work", "payload": {}, "unique_key": "order:7"});
    let (status, first) = asyncd.post("/v1/tasks", submit.clone()).await;
    assert_eq!(status, 201, "{first}");
    let id = first["id"].as_str().unwrap().to_string();
    let done = asyncd.wait_state(&id, "succeeded").await;
    let finished = parse_time(&done["updated_at"]);

    asyncd.clock.set_millis(Millis::new(finished + 3_599_999));
    let (status, late) = asyncd.post("/v1/tasks", submit.clone()).await;
    assert_eq!(
        (
            status,
            late["error"]["code"].as_str(),
            late["error"]["existing_id"].as_str()
        ),
        (409, Some("unique_conflict"), Some(id.as_str())),
        "within the window: {late}"
    );
    asyncd.clock.set_millis(Millis::new(finished + 3_600_000));
    let (status, fresh) = asyncd.post("/v1/tasks", submit).await;
    assert_eq!(status, 201, "after the window: {fresh}");
    assert_ne!(fresh["id"].as_str(), Some(id.as_str()));
    asyncd
        .wait_state(fresh["id"].as_str().unwrap(), "succeeded")
        .await;
}

/// Issue 15: Kafka dead letters through the API — listed latest first, byte for byte in
/// base64, one job's topic only, page by page with the cursor; purged by the instant
/// they were recorded before; a bad parameter is a 400 naming it.
#[tokio::test]
async fn kafka_dead_letters_are_listed_and_purged_through_the_api() {
    use asyncd::store::KafkaDeadLetter;
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "  kafka: {topic: asyncd.work}\n")).await;
    let url = format!("sqlite://{}", asyncd.dir.path().join("asyncd.db").display());
    let store = asyncd::store::open(&url).await.unwrap();
    for (topic, offset, message, at) in [
        ("asyncd.work", 1, &b"\x00\xffbad"[..], T0 + 1),
        ("asyncd.work", 2, &b"{"[..], T0 + 2),
        ("asyncd.other", 5, &b""[..], T0 + 3),
    ] {
        let letter = KafkaDeadLetter::new(topic, 0, offset, message, "bad".into(), Millis::new(at));
        store.record_kafka_dead_letter(&letter).await.unwrap();
    }
    let listed = |page: &Value| -> Vec<(String, i64)> {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                (
                    l["topic"].as_str().unwrap().to_string(),
                    l["offset"].as_i64().unwrap(),
                )
            })
            .collect()
    };
    let (status, first) = asyncd.get("/v1/kafka-dead-letters?limit=2").await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(
        listed(&first),
        [
            ("asyncd.other".to_string(), 5),
            ("asyncd.work".to_string(), 2)
        ]
    );
    let cursor = first["next_cursor"]
        .as_str()
        .expect("a full page names its cursor");
    let (status, second) = asyncd
        .get(&format!("/v1/kafka-dead-letters?limit=2&cursor={cursor}"))
        .await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(listed(&second), [("asyncd.work".to_string(), 1)]);
    assert_eq!(second["next_cursor"], Value::Null, "the last page");
    assert_eq!(
        (
            &second["items"][0]["message_base64"],
            &second["items"][0]["message_size"]
        ),
        (&json!("AP9iYWQ="), &json!(5)),
        "the bytes as recorded"
    );
    let (status, of_job) = asyncd.get("/v1/kafka-dead-letters?job=test-job").await;
    assert_eq!(status, 200, "{of_job}");
    assert_eq!(
        listed(&of_job),
        [
            ("asyncd.work".to_string(), 2),
            ("asyncd.work".to_string(), 1)
        ]
    );
    for (query, field) in [
        ("job=nope", "job"),
        ("cursor=garbage", "cursor"),
        ("limit=0", "limit"),
    ] {
        let (status, answer) = asyncd.get(&format!("/v1/kafka-dead-letters?{query}")).await;
        assert_eq!(
            (status, answer["error"]["field"].as_str()),
            (400, Some(field)),
            "{query}: {answer}"
        );
    }

    let instant = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .unwrap()
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    };
    let (status, purged) = asyncd
        .post(
            "/v1/kafka-dead-letters/purge",
            json!({"recorded_before": instant(T0 + 2)}),
        )
        .await;
    assert_eq!((status, &purged["purged"]), (200, &json!(1)), "{purged}");
    let (_, left) = asyncd.get("/v1/kafka-dead-letters").await;
    assert_eq!(
        listed(&left),
        [
            ("asyncd.other".to_string(), 5),
            ("asyncd.work".to_string(), 2)
        ]
    );
    for (body, named) in [
        (json!({"recorded_before": "soon"}), "recorded_before"),
        (json!({"recorded_before": instant(T0), "limit": 0}), "limit"),
        // A misspelt or unknown field must not widen a purge.
        (
            json!({"recorded_before": instant(T0), "topic": "x"}),
            "topic",
        ),
    ] {
        let (status, answer) = asyncd
            .post("/v1/kafka-dead-letters/purge", body.clone())
            .await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(named)),
            "{body}: {answer}"
        );
    }
}

/// Issue 15, retention: a finished task is kept for its job's `spec.retention`, counted
/// from when it finished, then purged — `GET` answers 404, the counter says so, and its
/// idempotency key makes a new task.
#[tokio::test]
async fn finished_tasks_are_purged_after_the_jobs_retention() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let mut asyncd =
        InProcess::start(&one_job(&executor, "  retention:\n    succeeded: 1h\n")).await;
    let submit = json!({"type": "work", "payload": {}, "idempotency_key": "kept-1h"});
    let (status, first) = asyncd.post("/v1/tasks", submit.clone()).await;
    assert_eq!(status, 201, "{first}");
    let id = first["id"].as_str().unwrap().to_string();
    let done = asyncd.wait_state(&id, "succeeded").await;
    let finished = parse_time(&done["updated_at"]);

    // Kept through its last millisecond…
    let last = finished + 3_600_000;
    asyncd.clock.set_millis(Millis::new(last));
    asyncd.purge_pass(last).await;
    assert_eq!(asyncd.get(&format!("/v1/tasks/{id}")).await.0, 200);
    let (status, same) = asyncd.post("/v1/tasks", submit.clone()).await;
    assert_eq!(
        (status, same["id"].as_str(), same["duplicate"].as_bool()),
        (200, Some(id.as_str()), Some(true)),
        "its key still answers with it"
    );
    // …and purged once past it.
    asyncd.clock.set_millis(Millis::new(last + 1));
    asyncd.purge_pass(last + 1).await;
    assert_eq!(asyncd.get(&format!("/v1/tasks/{id}")).await.0, 404);
    assert!(
        asyncd
            .metrics()
            .await
            .contains("asyncd_tasks_purged_total{state=\"succeeded\",task_type=\"work\"} 1")
    );
    // The key is free: the same submit makes a new task (whose id, derived from the key,
    // is the same one).
    let (status, fresh) = asyncd.post("/v1/tasks", submit).await;
    assert_eq!(
        (status, fresh["duplicate"].as_bool()),
        (201, Some(false)),
        "{fresh}"
    );
    let created = asyncd.task(&id).await;
    assert_eq!(parse_time(&created["created_at"]), last + 1);
}

/// Issue 15, task search over HTTP: by job and state, newest first, page by page with
/// `next_cursor`; a bad filter is a 400 naming it.
#[tokio::test]
async fn tasks_are_searched_by_filter_page_by_page() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let (status, answer) = asyncd
            .post(
                "/v1/tasks",
                json!({"type": "work", "payload": {"n": n}, "delay": "1h"}),
            )
            .await;
        assert_eq!(status, 201, "{answer}");
        ids.push(answer["id"].as_str().unwrap().to_string());
        asyncd.clock.advance(Duration::from_millis(1));
    }
    let cancelled = ids[1].clone();
    assert_eq!(
        asyncd.delete(&format!("/v1/tasks/{cancelled}")).await.0,
        200
    );

    let (status, page) = asyncd.get("/v1/tasks?job=test-job&state=pending").await;
    assert_eq!(status, 200, "{page}");
    let listed: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [ids[2].as_str(), ids[0].as_str()], "newest first");
    assert!(
        page.get("next_cursor").is_none(),
        "a short page is the last"
    );

    let mut paged = Vec::new();
    let mut path = "/v1/tasks?type=work&limit=1".to_string();
    loop {
        let (status, page) = asyncd.get(&path).await;
        assert_eq!(status, 200, "{page}");
        for item in page["items"].as_array().unwrap() {
            paged.push(item["id"].as_str().unwrap().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(cursor) => path = format!("/v1/tasks?type=work&limit=1&cursor={cursor}"),
            None => break,
        }
    }
    let mut newest_first = ids.clone();
    newest_first.reverse();
    assert_eq!(paged, newest_first);

    for (query, field) in [
        ("job=nope", "job"),
        ("state=done", "state"),
        ("created_after=yesterday", "created_after"),
        ("eta_before=1", "eta_before"),
        ("limit=0", "limit"),
        ("cursor=garbage", "cursor"),
        ("unique_key=a%00b", "unique_key"),
        ("type=a%00b", "type"),
    ] {
        let (status, answer) = asyncd.get(&format!("/v1/tasks?{query}")).await;
        assert_eq!(
            (status, answer["error"]["field"].as_str()),
            (400, Some(field)),
            "{query}: {answer}"
        );
    }
}

#[tokio::test]
async fn a_lapsed_attempts_late_result_is_refused() {
    let executor = Executor::start(|call| {
        let lease = if call.attempt == 1 { "1s" } else { "60s" };
        Answer::status(202).with_body(format!(r#"{{"lease":"{lease}"}}"#))
    })
    .await;
    let mut asyncd =
        InProcess::start(&one_job(&executor, "  retry:\n    initialBackoff: 100ms\n")).await;
    let id = asyncd.submit(task("work", json!({}))).await;
    executor.wait_calls(&id, 1).await;
    asyncd.finished(&id).await;
    let lease_until = parse_time(&asyncd.task(&id).await["lease_until"]);
    asyncd.clock.set_millis(Millis::new(lease_until + 1));
    assert_eq!(asyncd.rescue_pass(lease_until + 1).await, 1);
    run_when_due(&asyncd, &id).await;
    let calls = executor.wait_calls(&id, 2).await;
    let (old, new) = (&calls[0].lease_token, &calls[1].lease_token);
    wait_for("second attempt leased", DEADLINE, async || {
        let t = asyncd.task(&id).await;
        (t["state"] == "running" && t["attempt"] == 2).then_some(())
    })
    .await;

    for (path, body) in [
        (
            "result",
            json!({"lease_token": old, "status": "success", "output": "stale"}),
        ),
        ("heartbeat", json!({"lease_token": old})),
    ] {
        let (status, answer) = asyncd.post(&format!("/v1/tasks/{id}/{path}"), body).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (409, Some("stale_lease")),
            "{path}"
        );
    }
    let task = asyncd.task(&id).await;
    assert_eq!(
        (task["state"].as_str(), task["attempt"].as_i64()),
        (Some("running"), Some(2))
    );

    let (status, _) = asyncd
        .post(
            &format!("/v1/tasks/{id}/result"),
            json!({"lease_token": new, "status": "success", "output": "fresh"}),
        )
        .await;
    assert_eq!(status, 200);
    let done = asyncd.task(&id).await;
    assert_eq!(done["result"], "fresh");
    let (status, _) = asyncd
        .post(
            &format!("/v1/tasks/{id}/result"),
            json!({"lease_token": new, "status": "failed"}),
        )
        .await;
    assert_eq!(status, 409, "a finished attempt cannot be reported twice");
}

#[tokio::test]
async fn result_callback_can_ask_for_a_retry_or_fail_for_good() {
    let executor = Executor::start(|_| Answer::status(202)).await;
    let mut asyncd = InProcess::start(&one_job(&executor, "")).await;
    let id = asyncd.submit(task("work", json!({}))).await;
    let (_, first_at) = asyncd.dispatched(&id).await;
    let first = executor.wait_calls(&id, 1).await.remove(0);
    let (status, answer) = asyncd
        .post(
            &format!("/v1/tasks/{id}/result"),
            json!({"lease_token": first.lease_token, "status": "retry", "retry_after": "500ms"}),
        )
        .await;
    assert_eq!((status, answer["state"].as_str()), (200, Some("pending")));
    let again = run_when_due(&asyncd, &id).await;
    assert_eq!(again - first_at, 500, "retried exactly retry_after later");
    let second = executor.wait_calls(&id, 2).await.remove(1);
    let (status, answer) = asyncd
        .post(
            &format!("/v1/tasks/{id}/result"),
            json!({"lease_token": second.lease_token, "status": "failed", "error": "invalid card"}),
        )
        .await;
    assert_eq!((status, answer["state"].as_str()), (200, Some("dead")));
    assert_eq!(asyncd.task(&id).await["last_error"], "invalid card");
}

#[tokio::test]
async fn idempotency_key_returns_the_first_task() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let body = json!({"type": "work", "payload": {}, "idempotency_key": "order-42", "delay": "1s"});
    let (s1, first) = asyncd.post("/v1/tasks", body.clone()).await;
    let (s2, second) = asyncd.post("/v1/tasks", body).await;
    assert_eq!((s1, s2), (201, 200));
    assert_eq!(first["id"], second["id"]);
    assert_eq!(second["duplicate"], true);
    assert_eq!(first["eta"], second["eta"]);
    let id = first["id"].as_str().unwrap();
    asyncd
        .clock
        .set_millis(Millis::new(parse_time(&first["eta"])));
    asyncd.wait_state(id, "succeeded").await;
    let (s3, third) = asyncd
        .post(
            "/v1/tasks",
            json!({"type": "work", "payload": {}, "idempotency_key": "order-42"}),
        )
        .await;
    assert_eq!(
        (s3, third["id"].as_str()),
        (200, Some(id)),
        "still the same task after it ran"
    );
    // The key with another payload (or none) is another request: refused, naming the
    // task that holds the key, however long ago that task ran.
    for other in [json!({"order_id": 43}), json!(null)] {
        let (status, refused) = asyncd
            .post(
                "/v1/tasks",
                json!({"type": "work", "payload": other, "idempotency_key": "order-42"}),
            )
            .await;
        assert_eq!(status, 409, "{refused}");
        assert_eq!(refused["error"]["code"], "idempotency_mismatch");
        assert_eq!(refused["error"]["field"], "idempotency_key");
        assert_eq!(refused["error"]["existing_id"].as_str(), Some(id));
    }
    let call = &executor.calls_for(id)[0];
    assert_eq!(call.headers["idempotency-key"], "order-42");
    assert_eq!(executor.calls().len(), 1);
}

#[tokio::test]
async fn unique_key_allows_one_pending_task() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "  uniqueKey: \"order:{order_id}\"\n")).await;
    let first = asyncd
        .submit(json!({"type": "work", "payload": {"order_id": 7}, "delay": "2s"}))
        .await;
    let (status, answer) = asyncd
        .post(
            "/v1/tasks",
            json!({"type": "work", "payload": {"order_id": 7}}),
        )
        .await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["error"]["code"], "unique_conflict");
    assert_eq!(answer["error"]["existing_id"], first.as_str());
    asyncd
        .submit(json!({"type": "work", "payload": {"order_id": 8}}))
        .await;
    asyncd.clock.advance(Duration::from_secs(2));
    asyncd.wait_state(&first, "succeeded").await;
    asyncd
        .submit(json!({"type": "work", "payload": {"order_id": 7}}))
        .await;
}

#[tokio::test]
async fn dependent_task_waits_for_its_dependency() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let a = asyncd
        .submit(json!({"type": "work", "payload": "a", "delay": "1s"}))
        .await;
    let b = asyncd
        .submit(json!({"type": "work", "payload": "b", "depends_on": [a]}))
        .await;
    assert_eq!(asyncd.task(&b).await["state"], "blocked");
    asyncd.clock.advance(Duration::from_secs(1));
    asyncd.wait_state(&b, "succeeded").await;
    let calls = executor.calls();
    assert_eq!(
        calls
            .iter()
            .map(|c| c.body["payload"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["a", "b"]
    );

    // A cancelled dependency fails its dependents.
    let c = asyncd
        .submit(json!({"type": "work", "payload": "c", "delay": "1h"}))
        .await;
    let d = asyncd
        .submit(json!({"type": "work", "payload": "d", "depends_on": [c]}))
        .await;
    let (status, _) = asyncd.delete(&format!("/v1/tasks/{c}")).await;
    assert_eq!(status, 200);
    let dead = asyncd.task(&d).await;
    assert_eq!(dead["state"], "dead");
    assert!(dead["last_error"].as_str().unwrap().contains(&c));
}

#[tokio::test]
async fn cron_entries_fire_through_the_executor() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let extra = "  cron:\n    - name: every-second\n      schedule: \"CRON_TZ=Asia/Kathmandu * * * * * *\"\n      payload: {cron: true}\n";
    let mut asyncd = InProcess::start(&one_job(&executor, extra)).await;
    // The first pass creates the firings from the start time on.
    asyncd
        .next("a cron pass", |s| match s {
            asyncd::signals::Signal::Scheduled { created, at } => {
                assert_eq!(at.as_i64(), T0);
                (created > 0).then_some(())
            }
            _ => None,
        })
        .await;
    let mut fired = Vec::new();
    for second in 1..=3 {
        asyncd.clock.set_millis(Millis::new(T0 + second * 1_000));
        fired.push(
            asyncd
                .next("a cron firing dispatched", |s| match s {
                    asyncd::signals::Signal::Dispatched { eta, at, .. } => Some((eta, at)),
                    _ => None,
                })
                .await,
        );
    }
    for (eta, at) in &fired {
        assert_eq!(eta.as_i64() % 1000, 0, "fires on whole seconds");
        assert_eq!(at, eta, "fired exactly on time");
    }
    let calls = wait_for("three cron calls", DEADLINE, async || {
        let calls = executor.calls();
        (calls.len() >= 3).then_some(calls)
    })
    .await;
    let etas: Vec<i64> = calls.iter().map(|c| parse_time(&c.body["eta"])).collect();
    for call in &calls {
        assert_eq!(call.body["payload"], json!({"cron": true}));
    }
    let mut unique = etas.clone();
    unique.dedup();
    assert_eq!(unique.len(), etas.len(), "each firing once: {etas:?}");
    assert_eq!(etas, [T0 + 1_000, T0 + 2_000, T0 + 3_000]);
}

#[tokio::test]
async fn permanent_4xx_goes_straight_to_dead_letters() {
    let executor = Executor::start(|_| Answer::status(422).with_body("bad order")).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let id = asyncd.submit(task("work", json!({}))).await;
    let dead = asyncd.wait_state(&id, "dead").await;
    assert_eq!(executor.calls_for(&id).len(), 1);
    assert!(
        dead["last_error"].as_str().unwrap().contains("bad order"),
        "{dead}"
    );
}

#[tokio::test]
async fn cancel_only_while_pending() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let later = asyncd.submit(json!({"type": "work", "delay": "1h"})).await;
    let (status, answer) = asyncd.delete(&format!("/v1/tasks/{later}")).await;
    assert_eq!((status, answer["state"].as_str()), (200, Some("cancelled")));
    let now = asyncd.submit(json!({"type": "work"})).await;
    asyncd.wait_state(&now, "succeeded").await;
    let (status, answer) = asyncd.delete(&format!("/v1/tasks/{now}")).await;
    assert_eq!(
        (status, answer["error"]["state"].as_str()),
        (409, Some("succeeded"))
    );
    let (status, answer) = asyncd
        .delete("/v1/tasks/01900000-0000-7000-8000-000000000000")
        .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    assert!(
        executor.calls_for(&later).is_empty(),
        "a cancelled task never runs"
    );
}

#[tokio::test]
async fn batch_answers_each_item_in_order() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let (status, answer) = asyncd
        .post(
            "/v1/tasks:batch",
            json!({"tasks": [
                {"type": "work", "payload": 1},
                {"type": "nope"},
                {"type": "work", "payload": 2, "idempotency_key": "k"},
                {"type": "work", "payload": 2, "idempotency_key": "k"},
                {"type": "work", "payload": 3, "idempotency_key": "k"},
            ]}),
        )
        .await;
    assert_eq!(status, 200);
    let results = answer["results"].as_array().unwrap();
    let statuses: Vec<_> = results
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [201, 400, 201, 200, 409]);
    assert_eq!(results[1]["error"]["field"], "type");
    assert_eq!(
        results[2]["id"], results[3]["id"],
        "a repeat inside one batch is a duplicate too"
    );
    assert_eq!(results[4]["error"]["code"], "idempotency_mismatch");
    assert_eq!(results[4]["error"]["existing_id"], results[2]["id"]);
    wait_for("two executions", DEADLINE, async || {
        (executor.calls().len() == 2).then_some(())
    })
    .await;
}

#[tokio::test]
async fn metrics_report_real_values() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let r = asyncd
        .http
        .post(asyncd.url("/v1/tasks"))
        .header("asyncd-source-service", "orders")
        .json(&json!({"type": "work"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    asyncd.submit(json!({"type": "work", "delay": "1h"})).await;
    let metrics = wait_for("metrics to show the run", DEADLINE, async || {
        let m = asyncd.metrics().await;
        // The backlog gauges refresh every 2 s: wait for a refresh after both submits.
        (m.contains("asyncd_task_executed_total{status=\"success\",task_type=\"work\"} 1")
            && m.contains("asyncd_mysql_pending_tasks{task_type=\"work\"} 1")
            && m.contains("asyncd_due_backlog{task_type=\"work\"} 0"))
        .then_some(m)
    })
    .await;
    for expected in [
        "asyncd_task_submitted_total{source_service=\"orders\",task_type=\"work\"} 1",
        "asyncd_task_dispatched_total{task_type=\"work\"} 1",
        "asyncd_task_dispatch_delay_seconds_count{task_type=\"work\"} 1",
        "asyncd_task_execution_duration_seconds_count{task_type=\"work\"} 1",
        "asyncd_task_submit_latency_seconds_count{task_type=\"work\"} 2",
        "asyncd_mysql_poll_duration_seconds_count",
    ] {
        assert!(metrics.contains(expected), "missing {expected}\n{metrics}");
    }
    let (status, _) = asyncd.get("/readyz").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn bad_input_gets_a_4xx_naming_the_field() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd =
        InProcess::start_with(&one_job(&executor, ""), |s| s.max_payload_bytes = 1000).await;
    let big = "x".repeat(2000);
    let cases = [
        (
            r#"{"type": "work", "#.to_string(),
            400,
            "malformed_json",
            None,
        ),
        (
            r#"{"type": "nope"}"#.to_string(),
            400,
            "unknown_task_type",
            Some("type"),
        ),
        (
            r#"{"type": "work", "delay": "-5s"}"#.to_string(),
            400,
            "invalid_field",
            Some("delay"),
        ),
        (
            r#"{"type": "work", "delay": "100000d"}"#.to_string(),
            400,
            "invalid_field",
            Some("delay"),
        ),
        (
            r#"{"type": "work", "priority": "high"}"#.to_string(),
            400,
            "malformed_json",
            Some("priority"),
        ),
        (
            format!(r#"{{"type": "work", "payload": "{big}"}}"#),
            413,
            "payload_too_large",
            Some("payload"),
        ),
    ];
    for (body, status, code, field) in cases {
        let (got, answer) = asyncd.post_raw("/v1/tasks", &body).await;
        assert_eq!(got, status, "{body:.60}: {answer}");
        assert_eq!(answer["error"]["code"], code, "{body:.60}");
        assert_eq!(answer["error"]["field"].as_str(), field, "{body:.60}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }
    let (status, answer) = asyncd
        .post_raw("/v1/tasks:batch", r#"{"tasks": "no"}"#)
        .await;
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (400, Some("tasks"))
    );
    let (status, _) = asyncd.get("/v1/tasks/does-not-exist").await;
    assert_eq!(status, 404);
    let (status, answer) = asyncd.get("/v1/dead-letters?limit=0").await;
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (400, Some("limit"))
    );
    let (status, answer) = asyncd.post_raw("/v1/tasks/x/heartbeat", "{}").await;
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (400, Some("lease_token"))
    );
    assert!(executor.calls().is_empty());
}
#[tokio::test]
async fn config_changes_apply_without_restart() {
    let first = Executor::start(|_| Answer::ok()).await;
    let second = Executor::start(|_| Answer::ok()).await;
    let asyncd = Asyncd::start(&one_job(&first, ""), &[]).await;
    let (status, _) = asyncd.post("/v1/tasks", task("other", json!({}))).await;
    assert_eq!(status, 400, "not configured yet");

    asyncd.write_job(
        "other.yaml",
        &job_yaml("other-job", "other", &second.url(), ""),
    );
    let id = wait_for("the new job to be routable", DEADLINE, async || {
        let (status, answer) = asyncd.post("/v1/tasks", task("other", json!({}))).await;
        (status == 201).then(|| answer["id"].as_str().unwrap().to_string())
    })
    .await;
    second.wait_calls(&id, 1).await;

    // Point the first job at the second executor: the next dispatch follows.
    asyncd.write_job(
        "job.yaml",
        &job_yaml("test-job", "work", &second.url(), "  concurrency: 2\n"),
    );
    let id = wait_for("the changed URL to apply", DEADLINE, async || {
        let id = asyncd.submit(task("work", json!({}))).await;
        asyncd.wait_state(&id, "succeeded").await;
        (!second.calls_for(&id).is_empty()).then_some(id)
    })
    .await;
    assert!(first.calls_for(&id).is_empty());

    // A broken file keeps the last good table.
    asyncd.write_job("job.yaml", "spec: [not, a, job");
    wait_for(
        "the reload to refuse the broken file",
        DEADLINE,
        async || {
            asyncd
                .log()
                .contains("keeping the last good ones")
                .then_some(())
        },
    )
    .await;
    let id = asyncd.submit(task("work", json!({}))).await;
    second.wait_calls(&id, 1).await;
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

#[tokio::test]
async fn serves_its_openapi_document_which_describes_real_answers() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = Asyncd::start(&one_job(&executor, ""), &[]).await;
    let (status, document) = asyncd.get("/v1/openapi.json").await;
    assert_eq!(status, 200, "{document}");
    let committed: serde_json::Value =
        serde_json::from_str(include_str!("../../docs/openapi.json")).unwrap();
    assert_eq!(document, committed, "served and committed documents differ");

    let schemas = &document["components"]["schemas"];
    let id = asyncd.submit(json!({"type": "work", "delay": "1h"})).await;
    let (_, task) = asyncd.get(&format!("/v1/tasks/{id}")).await;
    let keys = |v: &serde_json::Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&task), keys(&schemas["TaskStatus"]["properties"]));
    let mut required: Vec<String> =
        serde_json::from_value(schemas["TaskStatus"]["required"].clone()).unwrap();
    required.sort();
    assert_eq!(keys(&task), required, "every member is always sent");
}

/// Sends `head` and then body bytes from `next_chunk` for ever, as one chunked request,
/// until the server answers. Returns the answer's status and JSON body, and how many body
/// bytes had been sent by then: a server that reads the whole body before checking its
/// size never answers this, one that checks while reading answers after its limit (plus
/// what the socket buffers hold).
async fn endless_body(
    addr: std::net::SocketAddr,
    path: &str,
    head: &'static str,
    mut next_chunk: impl FnMut() -> Vec<u8> + Send + 'static,
) -> (u16, serde_json::Value, usize) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    // Past this the server is taken to read without a limit: stop rather than run on.
    const GIVE_UP: usize = 256 << 20;
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let sent = Arc::new(AtomicUsize::new(0));
    let counter = sent.clone();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: asyncd\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    let write = tokio::spawn(async move {
        writer.write_all(request.as_bytes()).await?;
        let mut chunk = head.as_bytes().to_vec();
        while counter.load(Ordering::Relaxed) < GIVE_UP {
            let mut frame = format!("{:x}\r\n", chunk.len()).into_bytes();
            frame.extend_from_slice(&chunk);
            frame.extend_from_slice(b"\r\n");
            writer.write_all(&frame).await?;
            counter.fetch_add(chunk.len(), Ordering::Relaxed);
            chunk = next_chunk();
        }
        Ok::<_, std::io::Error>(())
    });
    let read = async {
        let mut answer = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            let n = reader.read(&mut buf).await.unwrap();
            assert!(n > 0, "the connection closed without an answer");
            answer.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&answer).to_string();
            let Some(end) = text.find("\r\n\r\n") else {
                continue;
            };
            let sent_then = sent.load(std::sync::atomic::Ordering::Relaxed);
            let status: u16 = text[9..12].parse().unwrap();
            let length: usize = text[..end]
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().unwrap())
                })
                .expect("a content-length");
            while answer.len() < end + 4 + length {
                let n = reader.read(&mut buf).await.unwrap();
                assert!(n > 0, "the answer was cut short");
                answer.extend_from_slice(&buf[..n]);
            }
            let body = serde_json::from_slice(&answer[end + 4..end + 4 + length]).unwrap();
            return (status, body, sent_then);
        }
    };
    let answer = tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .expect("an answer to an endless body");
    write.abort();
    answer
}

/// Issue 10: the body limit was 64 MiB or more on every endpoint, so one request could
/// make the API buffer that much before any check.
#[tokio::test]
async fn an_oversized_body_is_refused_while_it_is_read() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    // The loopback socket buffers hold a few MiB the server never read.
    const SLACK: usize = 8 << 20;
    let cases: [(&str, &'static str, &'static [u8], usize); 2] = [
        // One task: its payload limit (1 MiB by default) and 64 KiB for the other fields.
        (
            "/v1/tasks",
            r#"{"type": "work", "payload": ""#,
            b"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
            (1 << 20) + (64 << 10),
        ),
        // A batch: 16 MiB by default.
        (
            "/v1/tasks:batch",
            r#"{"tasks": ["#,
            br#"{"type": "work", "payload": "0123456789abcdef0123456789abcdef"},"#,
            16 << 20,
        ),
    ];
    for (path, head, item, limit) in cases {
        let chunk: Vec<u8> = item.repeat(64 * 1024 / item.len());
        let (status, body, sent) =
            endless_body(asyncd.addr, path, head, move || chunk.clone()).await;
        assert_eq!(status, 413, "{path}: {body}");
        assert_eq!(body["error"]["code"], "payload_too_large", "{path}: {body}");
        assert!(
            sent <= limit + SLACK,
            "{path}: {sent} bytes were read before the answer; the limit is {limit}"
        );
    }
    assert!(executor.calls().is_empty());
}

/// Issue 10: the item count of a batch was checked only after every item was parsed.
/// Reading stops at item 1001, so what follows (here not even JSON) is never parsed.
#[tokio::test]
async fn an_over_limit_batch_is_refused_at_the_first_item_too_many() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let items = vec![r#"{"type": "work"}"#; 1001].join(",");
    let (status, answer) = asyncd
        .post_raw(
            "/v1/tasks:batch",
            &format!(r#"{{"tasks": [{items}, this is not JSON"#),
        )
        .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["code"], "invalid_field", "{answer}");
    assert_eq!(answer["error"]["field"], "tasks", "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1000"),
        "{answer}"
    );
    // Dependencies likewise: ids past the 101st are not even read as strings.
    let ids: Vec<String> = (0..101)
        .map(|_| format!("\"{}\"", uuid::Uuid::now_v7()))
        .collect();
    let body = format!(
        r#"{{"type": "work", "depends_on": [{}, 1, {{}}, []]}}"#,
        ids.join(",")
    );
    let (status, answer) = asyncd.post_raw("/v1/tasks", &body).await;
    assert_eq!(
        (
            status,
            answer["error"]["code"].as_str(),
            answer["error"]["field"].as_str()
        ),
        (400, Some("invalid_field"), Some("depends_on")),
        "{answer}"
    );
    assert!(executor.calls().is_empty());
}

/// Issue 10: a dead-letter listing could carry 1000 tasks of 1 MiB each.
#[tokio::test]
async fn a_dead_letter_listing_stops_at_its_byte_cap() {
    // docs/api.md: at most 8 MiB of items per listing.
    const CAP: usize = 8 << 20;
    let executor = Executor::start(|_| Answer::status(422)).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let payload = "x".repeat(1_000_000);
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(
            asyncd
                .submit(json!({"type": "work", "payload": {"i": i, "pad": payload}}))
                .await,
        );
    }
    for id in &ids {
        asyncd.wait_state(id, "dead").await;
    }
    let r = asyncd
        .http
        .get(asyncd.url("/v1/dead-letters?limit=1000"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.bytes().await.unwrap();
    assert!(text.len() <= CAP + 1024, "{} bytes", text.len());
    let answer: serde_json::Value = serde_json::from_slice(&text).unwrap();
    let items = answer["items"].as_array().unwrap();
    assert!(
        (1..10).contains(&items.len()),
        "{} items of ~1 MB each",
        items.len()
    );
    assert_eq!(answer["truncated"], true);
    // A listing that fits is whole and says so.
    let (status, small) = asyncd.get("/v1/dead-letters?limit=2").await;
    assert_eq!(status, 200);
    assert_eq!(small["items"].as_array().unwrap().len(), 2);
    assert_eq!(small["truncated"], false);

    // Following next_cursor from the cut page lists every dead task exactly once.
    let mut seen: Vec<String> = Vec::new();
    let mut page = answer;
    loop {
        seen.extend(
            page["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["id"].as_str().unwrap().to_string()),
        );
        let Some(cursor) = page["next_cursor"].as_str() else {
            break;
        };
        let (status, next) = asyncd
            .get(&format!("/v1/dead-letters?limit=1000&cursor={cursor}"))
            .await;
        assert_eq!(status, 200, "{next}");
        page = next;
    }
    seen.sort();
    ids.sort();
    assert_eq!(seen, ids);
    let (status, bad) = asyncd.get("/v1/dead-letters?cursor=nope").await;
    assert_eq!(
        (status, bad["error"]["field"].as_str()),
        (400, Some("cursor")),
        "{bad}"
    );
}

/// Issue 10: `source_service` is a Prometheus label, and any client could mint a new time
/// series per submit.
#[tokio::test]
async fn source_service_labels_are_bounded() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let tasks: Vec<_> = (0..150)
        .map(|i| json!({"type": "work", "delay": "1h", "source_service": format!("svc-{i}")}))
        .collect();
    let (status, answer) = asyncd
        .post("/v1/tasks:batch", json!({ "tasks": tasks }))
        .await;
    assert_eq!(status, 200, "{answer}");
    let metrics = asyncd.metrics().await;
    let series: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("asyncd_task_submitted_total{"))
        .collect();
    // docs/api.md: the first 100 distinct values, the rest as "other".
    assert_eq!(series.len(), 101, "{series:#?}");
    assert!(
        metrics.contains(
            "asyncd_task_submitted_total{source_service=\"other\",task_type=\"work\"} 50"
        ),
        "{metrics}"
    );
}
