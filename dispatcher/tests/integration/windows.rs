//! Debounce and throttle through the API: the answers of each kind of submit, the one
//! run of a debounced key with its latest payload, a job's default window rendered from
//! the payload, and bad input named. Driven by the injected clock.

use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn a_trailing_debounce_runs_once_with_the_latest_payload() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let debounced = |n: u32| {
        json!({
            "type": "work",
            "payload": {"n": n},
            "debounce": {"key": "user:7", "period": "10s", "max_delay": "1m"}
        })
    };
    let (status, first) = asyncd.post("/v1/tasks", debounced(1)).await;
    assert_eq!(status, 201, "{first}");
    let id = first["id"].as_str().unwrap().to_string();
    assert_eq!(parse_time(&first["eta"]), T0 + 10_000);
    assert!(first.get("debounced").is_none(), "{first}");

    asyncd
        .clock
        .set_millis(asyncd_store::Millis::new(T0 + 5_000));
    let (status, second) = asyncd.post("/v1/tasks", debounced(2)).await;
    assert_eq!(
        (status, second["id"].as_str(), second["debounced"].as_bool()),
        (200, Some(id.as_str()), Some(true)),
        "{second}"
    );
    assert_eq!(
        parse_time(&second["eta"]),
        T0 + 15_000,
        "moved with the submit"
    );
    let (status, third) = asyncd.post("/v1/tasks", debounced(3)).await;
    assert_eq!((status, third["id"].as_str()), (200, Some(id.as_str())));

    asyncd
        .clock
        .set_millis(asyncd_store::Millis::new(T0 + 15_000));
    asyncd.wait_state(&id, "succeeded").await;
    let calls = executor.calls();
    assert_eq!(calls.len(), 1, "one run for the burst");
    assert_eq!(
        calls[0].body["payload"],
        json!({"n": 3}),
        "the latest payload"
    );

    // The task ran: the next submit of the key is a new burst.
    let (status, next) = asyncd.post("/v1/tasks", debounced(4)).await;
    assert_eq!(status, 201, "{next}");
    assert_ne!(next["id"].as_str(), Some(id.as_str()));
}

/// A debounce due within the dispatcher's look-ahead: each submit's task is claimed
/// into the heap at once, and each fold gives that claim up, so the heap holds stale
/// claims of the task beside its live one. Only the live one, with the latest payload,
/// may run (a stale claim's payload ran once, when a start was matched by id alone).
#[tokio::test]
async fn a_debounce_within_the_look_ahead_runs_the_latest_payload_not_a_stale_claim() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let mut id = String::new();
    for n in 1..=3 {
        let (status, answer) = asyncd
            .post(
                "/v1/tasks",
                json!({"type": "work", "payload": {"n": n},
                       "debounce": {"key": "k", "period": "1s"}}),
            )
            .await;
        assert!(status == 201 || status == 200, "{answer}");
        id = answer["id"].as_str().unwrap().to_string();
        // The claimer takes the task (again) into its heap before the next submit.
        wait_for("the task claimed", DEADLINE, async || {
            (asyncd.task(&id).await["state"] == "claimed").then_some(())
        })
        .await;
    }
    asyncd
        .clock
        .set_millis(asyncd_store::Millis::new(T0 + 1_000));
    asyncd.wait_state(&id, "succeeded").await;
    let calls = executor.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].body["payload"], json!({"n": 3}));
}

#[tokio::test]
async fn a_throttle_refuses_or_drops_and_a_leading_debounce_drops() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let throttled = |on_limit: &str| {
        json!({
            "type": "work",
            "delay": "1h",
            "throttle": {"key": "report:9", "period": "1m", "on_limit": on_limit}
        })
    };
    let (status, first) = asyncd.post("/v1/tasks", throttled("refuse")).await;
    assert_eq!(status, 201, "{first}");
    let (status, refused) = asyncd.post("/v1/tasks", throttled("refuse")).await;
    assert_eq!(
        (
            status,
            refused["error"]["code"].as_str(),
            refused["error"]["field"].as_str(),
            refused["error"]["existing_id"].as_str()
        ),
        (
            409,
            Some("throttled"),
            Some("throttle"),
            first["id"].as_str()
        ),
        "{refused}"
    );
    let (status, dropped) = asyncd.post("/v1/tasks", throttled("drop")).await;
    assert_eq!(
        (status, dropped["id"].as_str(), dropped["dropped"].as_bool()),
        (200, first["id"].as_str(), Some(true)),
        "{dropped}"
    );
    assert_eq!(
        parse_time(&dropped["eta"]),
        T0 + 60_000,
        "when the window closes"
    );
    // In a batch, each item is answered on its own.
    let (status, batch) = asyncd
        .post(
            "/v1/tasks:batch",
            json!({"tasks": [throttled("refuse"), {"type": "work", "delay": "1h"}]}),
        )
        .await;
    assert_eq!(status, 200, "{batch}");
    assert_eq!(
        (
            batch["results"][0]["status"].as_u64(),
            batch["results"][1]["status"].as_u64()
        ),
        (Some(409), Some(201)),
        "{batch}"
    );
    asyncd
        .clock
        .set_millis(asyncd_store::Millis::new(T0 + 60_000));
    let (status, _) = asyncd.post("/v1/tasks", throttled("refuse")).await;
    assert_eq!(status, 201, "the next period");

    let leading = json!({
        "type": "work",
        "delay": "1h",
        "debounce": {"key": "k", "period": "10s", "mode": "leading"}
    });
    let (status, first) = asyncd.post("/v1/tasks", leading.clone()).await;
    assert_eq!(status, 201, "{first}");
    let (status, held) = asyncd.post("/v1/tasks", leading.clone()).await;
    assert_eq!(
        (status, held["dropped"].as_bool(), held["id"].as_str()),
        (200, Some(true), first["id"].as_str()),
        "{held}"
    );
}

#[tokio::test]
async fn a_jobs_debounce_renders_its_key_from_the_payload() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let spec = "  debounce:\n    key: \"user:{user_id}\"\n    period: 30s\n";
    let asyncd = InProcess::start(&one_job(&executor, spec)).await;
    let submit = |user: u32, n: u32| json!({"type": "work", "payload": {"user_id": user, "n": n}});
    let a = asyncd.submit(submit(1, 1)).await;
    let b = asyncd.submit(submit(2, 1)).await;
    assert_ne!(a, b, "another key");
    let (status, again) = asyncd.post("/v1/tasks", submit(1, 2)).await;
    assert_eq!(
        (status, again["id"].as_str(), again["debounced"].as_bool()),
        (200, Some(a.as_str()), Some(true))
    );
    // The submit's own window wins over the job's.
    let (status, own) = asyncd
        .post(
            "/v1/tasks",
            json!({"type": "work", "payload": {"user_id": 1},
                   "throttle": {"key": "x", "period": "1m"}}),
        )
        .await;
    assert_eq!(status, 201, "{own}");
    let (status, missing) = asyncd
        .post("/v1/tasks", json!({"type": "work", "payload": {"n": 1}}))
        .await;
    assert_eq!(
        (status, missing["error"]["field"].as_str()),
        (400, Some("payload")),
        "a payload without the key's field: {missing}"
    );
}

#[tokio::test]
async fn a_bad_window_is_refused_naming_its_field() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let trailing = json!({"key": "k", "period": "10s"});
    let cases = [
        (
            json!({"debounce": trailing, "throttle": {"key": "k", "period": "1m"}}),
            "throttle",
        ),
        (json!({"debounce": trailing, "delay": "1m"}), "delay"),
        (
            json!({"debounce": trailing, "eta": "2027-01-15T09:00:00Z"}),
            "eta",
        ),
        (
            json!({"debounce": trailing,
                   "depends_on": ["01900000-0000-7000-8000-000000000000"]}),
            "depends_on",
        ),
        (
            json!({"debounce": {"key": "k", "period": "0s"}}),
            "debounce.period",
        ),
        (
            json!({"debounce": {"key": "k", "period": "1m", "max_delay": "10s"}}),
            "debounce.max_delay",
        ),
        (
            json!({"debounce": {"key": "k", "period": "1m", "max_delay": "1h", "mode": "leading"}}),
            "debounce.max_delay",
        ),
        (
            json!({"debounce": {"key": "", "period": "1m"}}),
            "debounce.key",
        ),
        (
            json!({"throttle": {"key": "k", "period": "soon"}}),
            "throttle.period",
        ),
    ];
    for (fields, field) in cases {
        let mut body = json!({"type": "work"});
        body.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        let (status, answer) = asyncd.post("/v1/tasks", body.clone()).await;
        assert_eq!(
            (status, answer["error"]["field"].as_str()),
            (400, Some(field)),
            "{body}: {answer}"
        );
    }
    let (status, answer) = asyncd
        .post(
            "/v1/tasks",
            json!({"type": "work", "throttle": {"key": "k", "period": "1m", "on_limit": "queue"}}),
        )
        .await;
    assert_eq!(status, 400, "an unknown on_limit: {answer}");
    // A workflow is stored all or nothing: no room for a held or folded item.
    let (status, answer) = asyncd
        .post(
            "/v1/tasks:batch",
            json!({"tasks": [
                {"type": "work", "ref": "a"},
                {"type": "work", "ref": "b", "depends_on_refs": ["a"],
                 "throttle": {"key": "k", "period": "1m"}}
            ]}),
        )
        .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(
        answer["error"]["field"].as_str(),
        Some("tasks[1].debounce"),
        "{answer}"
    );
}
