//! The SDK against a real `asyncd dev` (binary from `ASYNCD_BIN`, default the `asyncd`
//! in this test's own target folder). Without the binary these tests fail; they
//! never skip: a green run must mean the SDK was checked against the server.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use asyncd_client::{
    Change, Changed, Client, Error, ErrorCode, Executor, HEADER_BATCH, OnLimit, Outcome,
    PendingChange, ResultStatus, SubmitResult, Task, TaskContext, TaskQuery, TaskResult, TaskState,
    idempotency_key_from,
};
use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use chrono::Utc;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use support::{DEADLINE, Dev, Job, Recorder, SECRET, WRONG_SECRET_NAME, uniq};

const UNKNOWN_ID: &str = "01934a6e-0000-7000-8000-000000000000";

#[derive(Debug, Serialize, Deserialize)]
struct Order {
    order_id: u64,
    note: String,
}

/// An executor whose handlers record every call: `rust_ok` succeeds, `rust_order`
/// takes a typed payload, `rust_permanent` fails permanently.
fn recording_executor(rec: &Recorder) -> Executor {
    let ok = rec.clone();
    let typed = rec.clone();
    let permanent = rec.clone();
    Executor::new()
        .signing_secret(SECRET)
        .register("rust_ok", move |ctx: TaskContext, payload: Value| {
            ok.add(&ctx, &payload);
            async { Ok(()) }
        })
        .register("rust_order", move |ctx: TaskContext, order: Order| {
            typed.add(&ctx, &serde_json::to_value(&order).unwrap());
            async move { Ok(()) }
        })
        .register("rust_permanent", move |ctx: TaskContext, payload: Value| {
            permanent.add(&ctx, &payload);
            async { Err::<(), _>(Outcome::permanent("bad order")) }
        })
}

async fn submit(dev: &Dev, task: Task) -> SubmitResult {
    let task = if task.idempotency_key.is_none() {
        task.idempotency_key(uniq("k"))
    } else {
        task
    };
    dev.client
        .submit(&task)
        .await
        .unwrap_or_else(|e| panic!("submit {}: {e}", task.task_type))
}

fn api_error(
    result: Result<impl std::fmt::Debug, Error>,
    code: ErrorCode,
    status: u16,
    field: Option<&str>,
) -> asyncd_client::ApiError {
    let err = result.expect_err("an API refusal");
    let api = err
        .api()
        .unwrap_or_else(|| panic!("{err} is not an API refusal"))
        .clone();
    assert_eq!((&api.code, api.status), (&code, status), "{api}");
    if field.is_some() {
        assert_eq!(api.field.as_deref(), field, "{api}");
    }
    api
}

#[tokio::test]
async fn submit_runs_the_executor_and_dedupes() {
    let rec = Recorder::default();
    let dev = Dev::start(recording_executor(&rec), &[Job::new("rust_order")]).await;

    let order = Order {
        order_id: 42,
        note: "héllo".into(),
    };
    let task = Task::with_payload("rust_order", &order).unwrap();
    let key = idempotency_key_from("rust_order", &order, &["order_id", "note"]).unwrap();
    assert_eq!(
        task.clone()
            .derive_idempotency_key(&["order_id", "note"])
            .unwrap()
            .idempotency_key,
        Some(key.clone())
    );
    let key = format!("{key}-{}", uniq(""));
    let res = submit(&dev, task.clone().idempotency_key(&key).priority(3)).await;
    assert!(!res.duplicate && !res.id.is_empty(), "{res:?}");
    assert!(
        matches!(
            res.route,
            asyncd_client::asyncd_contract::Route::Store
                | asyncd_client::asyncd_contract::Route::Kafka
        ),
        "{res:?}"
    );

    let got = dev.wait_state(&res.id, TaskState::Succeeded).await;
    assert_eq!(got.task_type, "rust_order");
    assert_eq!(got.attempt, 1);
    assert_eq!(got.priority, 3);
    assert_eq!(got.idempotency_key.as_deref(), Some(key.as_str()));
    assert_eq!(got.payload, json!({"order_id": 42, "note": "héllo"}));
    assert!(
        got.lease_until.is_none() && got.last_error.is_none(),
        "{got:?}"
    );

    let runs = rec.runs(&res.id);
    assert_eq!(runs.len(), 1);
    let run = &runs[0];
    assert_eq!(run.ctx.id, res.id);
    assert_eq!(run.ctx.task_type, "rust_order");
    assert_eq!(run.ctx.attempt, 1);
    assert_eq!(run.ctx.idempotency_key, key);
    assert_eq!(run.ctx.callback_url, dev.endpoint);
    assert!(
        run.ctx.eta.is_some() && run.ctx.dispatcher.is_some(),
        "{:?}",
        run.ctx
    );
    assert_eq!(run.payload, json!({"order_id": 42, "note": "héllo"}));
    assert!(
        run.at >= res.eta - chrono::Duration::milliseconds(1),
        "ran before its ETA"
    );

    // A repeat of the key and payload returns the first task.
    let again =
        Task::new("rust_order", json!({"order_id": 42, "note": "héllo"})).idempotency_key(&key);
    let dup = dev.client.submit(&again).await.unwrap();
    assert!(dup.duplicate, "{dup:?}");
    assert_eq!((dup.id.as_str(), dup.eta), (res.id.as_str(), res.eta));
    // The key with another payload is another request: refused, naming the first task.
    let other = Task::new("rust_order", json!({"order_id": 43, "note": ""})).idempotency_key(&key);
    let err = dev.client.submit(&other).await.unwrap_err();
    assert!(err.is(&ErrorCode::IdempotencyMismatch), "{err}");
    assert!(!err.is_retryable());
    let api = err.api().unwrap();
    assert_eq!(
        (api.status, api.existing_id.as_deref(), api.field.as_deref()),
        (409, Some(res.id.as_str()), Some("idempotency_key"))
    );
    assert_eq!(rec.runs(&res.id).len(), 1, "executed twice");

    // Submits are labelled with the service name.
    let metrics = dev.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("asyncd_task_submitted_total{")
                && l.contains(r#"source_service="rust-it""#)
                && l.contains(r#"task_type="rust_order""#)),
        "no asyncd_task_submitted_total sample for source_service rust-it:\n{metrics}"
    );
}

/// `change` moves a waiting task's due time and replaces its payload and priority, its
/// id kept; the attempt then runs with the new values, and a change after it is refused.
#[tokio::test]
async fn a_waiting_task_changed_runs_with_its_new_values() {
    let rec = Recorder::default();
    let dev = Dev::start(recording_executor(&rec), &[Job::new("rust_ok")]).await;
    let c = &dev.client;
    let task = Task::new("rust_ok", json!({"v": 1})).idempotency_key(uniq("k"));
    let res = c
        .submit_delayed(&task, Duration::from_secs(3600))
        .await
        .unwrap();
    let change = Change {
        payload: Some(json!({"v": 2})),
        priority: Some(5),
        ..Change::default()
    };
    let got = c.change(&res.id, &change).await.unwrap();
    assert_eq!(
        (got.id.as_str(), &got.payload, got.priority, got.eta),
        (res.id.as_str(), &json!({"v": 2}), 5, res.eta)
    );
    assert!(rec.runs(&res.id).is_empty(), "ran an hour early");
    let now = Change {
        run_now: true,
        ..Change::default()
    };
    c.change(&res.id, &now).await.unwrap();
    dev.wait_state(&res.id, TaskState::Succeeded).await;
    let runs = rec.runs(&res.id);
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].payload, json!({"v": 2}), "the changed payload ran");
    let err = api_error(
        c.change(&res.id, &now).await,
        ErrorCode::TaskStarted,
        409,
        None,
    );
    assert_eq!(err.state, Some(TaskState::Succeeded));
    let both = Change {
        delay: Some(Duration::from_secs(60)),
        eta: Some(Utc::now()),
        ..Change::default()
    };
    assert!(matches!(
        c.change(&res.id, &both).await,
        Err(Error::InvalidTask(_))
    ));
}

/// A task whose expiry comes while its job is paused never runs: it ends `expired`, and
/// the task submitted after the resume runs while it does not.
#[tokio::test]
async fn a_task_not_begun_by_its_expiry_ends_expired_and_never_runs() {
    let rec = Recorder::default();
    let dev = Dev::start(recording_executor(&rec), &[Job::new("rust_ok")]).await;
    let c = &dev.client;
    c.pause_job("rust-ok-job").await.unwrap();
    let res = submit(
        &dev,
        Task::new("rust_ok", json!({"code": 1}))
            .idempotency_key(uniq("code"))
            .start_within(Duration::from_millis(300)),
    )
    .await;
    let expired = dev.wait_state(&res.id, TaskState::Expired).await;
    let expires_at = expired
        .expires_at
        .expect("an expiring task shows its expiry");
    assert_eq!(
        expires_at,
        res.eta + chrono::Duration::milliseconds(300),
        "300 ms after it fell due"
    );
    assert_eq!(expired.attempt, 0);
    c.resume_job("rust-ok-job").await.unwrap();
    let later = submit(
        &dev,
        Task::new("rust_ok", json!({"code": 2})).idempotency_key(uniq("code")),
    )
    .await;
    dev.wait_state(&later.id, TaskState::Succeeded).await;
    assert!(rec.runs(&res.id).is_empty(), "the expired task never ran");
    let found = c
        .search(&TaskQuery {
            task_type: Some("rust_ok".into()),
            state: Some(TaskState::Expired),
            ..TaskQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(found.items.len(), 1);
    assert_eq!(found.items[0].id, res.id);

    let both = Task::new("rust_ok", Value::Null)
        .idempotency_key(uniq("code"))
        .expires_at(Utc::now() + chrono::Duration::hours(1));
    let both = Task {
        start_within: Some(Duration::from_secs(60)),
        ..both
    };
    assert!(matches!(c.submit(&both).await, Err(Error::InvalidTask(_))));
}

/// A trailing debounce folds the submits of a key into one task, which runs once with
/// the latest payload; a throttle refuses the second submit of its period.
#[tokio::test]
async fn debounced_submits_run_once_with_the_latest_payload_and_a_throttle_refuses() {
    let rec = Recorder::default();
    let dev = Dev::start(recording_executor(&rec), &[Job::new("rust_ok")]).await;
    let c = &dev.client;
    c.pause_job("rust-ok-job").await.unwrap();
    let debounced = |n: u32| {
        Task::new("rust_ok", json!({"n": n}))
            .idempotency_key(uniq("d"))
            .debounce("user:7", Duration::from_millis(200), None)
    };
    let first = submit(&dev, debounced(1)).await;
    assert!(!first.debounced);
    for n in 2..=3 {
        let folded = submit(&dev, debounced(n)).await;
        assert_eq!(
            (folded.id.as_str(), folded.debounced),
            (first.id.as_str(), true)
        );
    }
    c.resume_job("rust-ok-job").await.unwrap();
    dev.wait_state(&first.id, TaskState::Succeeded).await;
    let runs = rec.runs(&first.id);
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].payload, json!({"n": 3}), "the latest payload ran");

    let throttled = || {
        Task::new("rust_ok", Value::Null)
            .idempotency_key(uniq("t"))
            .delay(Duration::from_secs(3600))
            .throttle("report:1", Duration::from_secs(60), OnLimit::Refuse)
    };
    let stored = submit(&dev, throttled()).await;
    let err = api_error(
        c.submit(&throttled()).await,
        ErrorCode::Throttled,
        409,
        Some("throttle"),
    );
    assert_eq!(err.existing_id.as_deref(), Some(stored.id.as_str()));
    let dropped = c
        .submit(&Task {
            throttle: Some(asyncd_client::Throttle {
                on_limit: OnLimit::Drop,
                ..throttled().throttle.unwrap()
            }),
            ..throttled()
        })
        .await
        .unwrap();
    assert_eq!(
        (dropped.id.as_str(), dropped.dropped),
        (stored.id.as_str(), true)
    );
}

#[tokio::test]
async fn delayed_at_and_cancel() {
    let rec = Recorder::default();
    let dev = Dev::start(recording_executor(&rec), &[Job::new("rust_ok")]).await;
    let c = &dev.client;
    let task = || Task::new("rust_ok", Value::Null).idempotency_key(uniq("k"));

    let before = Utc::now();
    let res = c
        .submit_delayed(&task(), Duration::from_secs(3600))
        .await
        .unwrap();
    let away = res.eta - before;
    assert!(
        away >= chrono::Duration::seconds(3599) && away <= chrono::Duration::seconds(3610),
        "eta {} is {away} away, want 1h",
        res.eta
    );
    let got = c.get(&res.id).await.unwrap();
    assert!(
        matches!(got.state, TaskState::Pending | TaskState::Claimed),
        "{got:?}"
    );
    let cancelled = c.cancel(&res.id).await.unwrap();
    assert_eq!(
        (cancelled.id.as_str(), cancelled.state),
        (res.id.as_str(), TaskState::Cancelled)
    );
    dev.wait_state(&res.id, TaskState::Cancelled).await;
    let err = api_error(
        c.cancel(&res.id).await,
        ErrorCode::NotCancellable,
        409,
        None,
    );
    assert_eq!(err.state, Some(TaskState::Cancelled));

    let eta = Utc::now() + chrono::Duration::hours(2);
    let eta =
        eta - chrono::Duration::nanoseconds(i64::from(eta.timestamp_subsec_nanos() % 1_000_000));
    let at = c.submit_at(&task(), eta).await.unwrap();
    assert_eq!(
        at.eta, eta,
        "eta asked with milliseconds comes back as asked"
    );
    assert_eq!(c.get(&at.id).await.unwrap().eta, eta);
    c.cancel(&at.id).await.unwrap();

    // A past eta means now.
    let past = c
        .submit_at(&task(), Utc::now() - chrono::Duration::hours(1))
        .await
        .unwrap();
    dev.wait_state(&past.id, TaskState::Succeeded).await;

    let soon = c
        .submit_delayed(&task(), Duration::from_millis(700))
        .await
        .unwrap();
    dev.wait_state(&soon.id, TaskState::Succeeded).await;
    let runs = rec.runs(&soon.id);
    assert_eq!(runs.len(), 1);
    assert!(
        runs[0].at >= soon.eta,
        "ran at {} before its ETA {}",
        runs[0].at,
        soon.eta
    );
}

#[tokio::test]
async fn request_errors() {
    let rec = Recorder::default();
    let dev = Dev::start(recording_executor(&rec), &[Job::new("rust_ok")]).await;
    let c = &dev.client;
    let ok = || Task::new("rust_ok", Value::Null).idempotency_key(uniq("k"));

    api_error(
        c.submit(&Task::new("no_such_type", 1).idempotency_key(uniq("k")))
            .await,
        ErrorCode::UnknownTaskType,
        400,
        Some("type"),
    );
    api_error(
        c.submit(&ok().priority(10)).await,
        ErrorCode::InvalidField,
        400,
        Some("priority"),
    );
    api_error(
        c.submit(&ok().max_retries(101)).await,
        ErrorCode::InvalidField,
        400,
        Some("max_retries"),
    );
    api_error(
        c.submit(&ok().idempotency_key("k".repeat(256))).await,
        ErrorCode::InvalidField,
        400,
        Some("idempotency_key"),
    );
    api_error(
        c.submit(&ok().unique_key("u".repeat(256))).await,
        ErrorCode::InvalidField,
        400,
        Some("unique_key"),
    );
    api_error(
        c.submit_delayed(&ok(), Duration::from_secs(401 * 86_400))
            .await,
        ErrorCode::InvalidField,
        400,
        Some("delay"),
    );
    // 400 days is the limit, and accepted.
    let far = c
        .submit_delayed(&ok(), Duration::from_secs(400 * 86_400))
        .await
        .unwrap();
    c.cancel(&far.id).await.unwrap();
    api_error(
        c.submit(&ok().depends_on([UNKNOWN_ID])).await,
        ErrorCode::InvalidField,
        400,
        Some("depends_on"),
    );
    let mut big = ok();
    // Over the 1 MiB payload limit, within the body limit (payload + 64 KiB).
    big.payload = Value::String("x".repeat((1 << 20) + 1024));
    api_error(
        c.submit(&big).await,
        ErrorCode::PayloadTooLarge,
        413,
        Some("payload"),
    );

    api_error(c.get(UNKNOWN_ID).await, ErrorCode::NotFound, 404, None);
    api_error(c.cancel(UNKNOWN_ID).await, ErrorCode::NotFound, 404, None);
    api_error(c.redrive(UNKNOWN_ID).await, ErrorCode::NotFound, 404, None);

    // A finished task can be neither cancelled nor redriven.
    let done = submit(&dev, ok()).await;
    dev.wait_state(&done.id, TaskState::Succeeded).await;
    let err = api_error(
        c.cancel(&done.id).await,
        ErrorCode::NotCancellable,
        409,
        None,
    );
    assert_eq!(err.state, Some(TaskState::Succeeded));
    api_error(c.redrive(&done.id).await, ErrorCode::NotDead, 409, None);

    // The long-running callbacks refuse a token that is not the current attempt's.
    api_error(
        c.heartbeat(&done.id, "1", None).await,
        ErrorCode::StaleLease,
        409,
        None,
    );
    let result = TaskResult {
        lease_token: "1".into(),
        status: ResultStatus::Success,
        error: None,
        output: None,
        retry_after: None,
    };
    api_error(
        c.post_result(&done.id, &result).await,
        ErrorCode::StaleLease,
        409,
        None,
    );
    // An unknown task answers exactly as a wrong token does: callbacks leak nothing.
    let unknown = api_error(
        c.post_result(UNKNOWN_ID, &result).await,
        ErrorCode::StaleLease,
        409,
        Some("lease_token"),
    );
    let wrong = api_error(
        c.post_result(&done.id, &result).await,
        ErrorCode::StaleLease,
        409,
        Some("lease_token"),
    );
    assert_eq!(unknown.message, wrong.message);

    // A missing idempotency key never reaches the server.
    let err = c.submit(&Task::new("rust_ok", 1)).await.unwrap_err();
    assert!(matches!(err, Error::MissingIdempotencyKey), "{err}");

    // No server at all: a transport error, not an API refusal.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let nowhere = Client::builder()
        .endpoint(format!("http://127.0.0.1:{port}"))
        .build()
        .unwrap();
    let err = nowhere.submit(&ok()).await.unwrap_err();
    assert!(
        matches!(err, Error::Transport { .. }) && err.api().is_none(),
        "{err}"
    );
}

#[tokio::test]
async fn unique_conflict() {
    let rec = Recorder::default();
    let dev = Dev::start(
        recording_executor(&rec),
        &[
            Job::new("rust_ok"),
            Job::new("rust_unique").unique_key("order:{order_id}"),
        ],
    )
    .await;
    let c = &dev.client;
    let hour = Duration::from_secs(3600);
    let order = Utc::now().timestamp_nanos_opt().unwrap();
    let unique = || Task::new("rust_unique", json!({"order_id": order})).idempotency_key(uniq("u"));
    let first = c.submit_delayed(&unique(), hour).await.unwrap();
    let err = api_error(
        c.submit_delayed(&unique(), hour).await,
        ErrorCode::UniqueConflict,
        409,
        None,
    );
    assert_eq!(err.existing_id.as_deref(), Some(first.id.as_str()));
    let got = c.get(&first.id).await.unwrap();
    assert_eq!(
        got.unique_key,
        Some(format!("order:{order}")),
        "rendered from the template"
    );

    // An explicit unique key, free again once its holder is no longer pending.
    let ukey = uniq("explicit");
    let ok = || {
        Task::new("rust_ok", Value::Null)
            .idempotency_key(uniq("k"))
            .unique_key(&ukey)
    };
    let held = c.submit_delayed(&ok(), hour).await.unwrap();
    let err = api_error(c.submit(&ok()).await, ErrorCode::UniqueConflict, 409, None);
    assert_eq!(err.existing_id.as_deref(), Some(held.id.as_str()));
    c.cancel(&held.id).await.unwrap();
    let again = c.submit(&ok()).await.unwrap();
    dev.wait_state(&again.id, TaskState::Succeeded).await;
    c.cancel(&first.id).await.unwrap();
}

#[tokio::test]
async fn permanent_failure_dead_letters_and_redrive() {
    let rec = Recorder::default();
    let dev = Dev::start(
        recording_executor(&rec),
        &[Job::new("rust_permanent"), Job::new("rust_order")],
    )
    .await;
    let c = &dev.client;
    let res = submit(&dev, Task::new("rust_permanent", json!({"order_id": 9}))).await;
    let dead = dev.wait_state(&res.id, TaskState::Dead).await;
    assert_eq!(dead.attempt, 1, "a 422 must not be retried");
    let last_error = dead.last_error.clone().unwrap_or_default();
    assert!(
        last_error.contains("422") && last_error.contains("bad order"),
        "{last_error}"
    );

    let items = c
        .dead_letters(Some("rust_permanent"), Some(1000))
        .await
        .unwrap();
    assert!(
        items.iter().any(|t| t.id == res.id),
        "dead letters lack {}: {items:?}",
        res.id
    );
    assert!(
        items
            .iter()
            .all(|t| t.task_type == "rust_permanent" && t.state == TaskState::Dead)
    );

    // A payload that does not decode into the handler's type is permanent too.
    let bad = submit(
        &dev,
        Task::new("rust_order", json!({"order_id": "not a number"})),
    )
    .await;
    let bad_dead = dev.wait_state(&bad.id, TaskState::Dead).await;
    assert_eq!(bad_dead.attempt, 1);
    assert!(
        bad_dead
            .last_error
            .unwrap_or_default()
            .contains("payload does not decode")
    );
    assert!(
        rec.runs(&bad.id).is_empty(),
        "the handler ran on a bad payload"
    );

    let newest = c.dead_letters(None, Some(1)).await.unwrap();
    assert_eq!(newest.len(), 1);
    assert_eq!(newest[0].id, bad.id, "newest first");
    assert_eq!(c.dead_letters(None, None).await.unwrap().len(), 2);

    let rd = c.redrive(&res.id).await.unwrap();
    assert_eq!(
        (rd.id.as_str(), rd.state),
        (res.id.as_str(), TaskState::Pending)
    );
    // It runs again (attempts reset) and, failing permanently again, is dead again.
    let runs = rec.wait_runs(&res.id, 2).await;
    assert_eq!(runs[1].ctx.attempt, 1, "attempts are reset by a redrive");
    let again = dev.wait_state(&res.id, TaskState::Dead).await;
    assert_eq!(again.attempt, 1);
}

#[tokio::test]
async fn retries_backoff_retry_after_and_exhaustion() {
    let rec = Recorder::default();
    let (flaky, after, always, panics) = (rec.clone(), rec.clone(), rec.clone(), rec.clone());
    #[derive(Debug, thiserror::Error)]
    #[error("flaky dependency")]
    struct Flaky;
    async fn call_dependency(attempt: u32) -> Result<(), Flaky> {
        if attempt == 1 { Err(Flaky) } else { Ok(()) }
    }
    let executor = Executor::new()
        .signing_secret(SECRET)
        .register("rust_flaky", move |ctx: TaskContext, p: Value| {
            flaky.add(&ctx, &p);
            async move {
                // Any std error converts into Outcome::Error with `?`: a 500, retried.
                call_dependency(ctx.attempt).await?;
                Ok::<_, Outcome>(())
            }
        })
        .register("rust_retry_after", move |ctx: TaskContext, p: Value| {
            after.add(&ctx, &p);
            async move {
                match ctx.attempt {
                    1 => Err(Outcome::retry_after(Duration::from_secs(1))),
                    2 => Err(Outcome::retry()),
                    _ => Ok(()),
                }
            }
        })
        .register("rust_always_fails", move |ctx: TaskContext, p: Value| {
            always.add(&ctx, &p);
            async { Err::<(), _>(Outcome::error("always down")) }
        })
        .register("rust_panics", move |ctx: TaskContext, p: Value| {
            panics.add(&ctx, &p);
            async move {
                assert!(ctx.attempt > 1, "handler bug on attempt {}", ctx.attempt);
                Ok(())
            }
        });
    let dev = Dev::start(
        executor,
        &[
            Job::new("rust_flaky"),
            Job::new("rust_retry_after"),
            Job::new("rust_always_fails"),
            Job::new("rust_panics"),
        ],
    )
    .await;
    let flaky = submit(&dev, Task::new("rust_flaky", Value::Null)).await;
    let after = submit(&dev, Task::new("rust_retry_after", Value::Null)).await;
    let always = submit(
        &dev,
        Task::new("rust_always_fails", Value::Null).max_retries(1),
    )
    .await;
    let panics = submit(&dev, Task::new("rust_panics", Value::Null)).await;

    assert_eq!(
        dev.wait_state(&flaky.id, TaskState::Succeeded)
            .await
            .attempt,
        2
    );
    assert_eq!(
        dev.wait_state(&panics.id, TaskState::Succeeded)
            .await
            .attempt,
        2
    );
    assert_eq!(
        dev.wait_state(&after.id, TaskState::Succeeded)
            .await
            .attempt,
        3
    );
    let runs = rec.runs(&after.id);
    assert_eq!(runs.len(), 3);
    let gap = runs[1].at - runs[0].at;
    assert!(
        gap >= chrono::Duration::milliseconds(900),
        "Retry-After: 1 not honoured: runs {gap} apart"
    );

    let dead = dev.wait_state(&always.id, TaskState::Dead).await;
    assert_eq!(
        (dead.attempt, dead.max_retries),
        (2, 1),
        "max_retries 1: two attempts"
    );
    assert_eq!(rec.runs(&always.id).len(), 2);
    let last_error = dead.last_error.unwrap_or_default();
    assert!(
        last_error.contains("500") && last_error.contains("always down"),
        "{last_error}"
    );
}

#[tokio::test]
async fn submit_batch() {
    let rec = Recorder::default();
    let dev = Dev::start(recording_executor(&rec), &[Job::new("rust_ok")]).await;
    let c = &dev.client;
    let seen_key = uniq("seen");
    let seen = submit(
        &dev,
        Task::new("rust_ok", "first").idempotency_key(&seen_key),
    )
    .await;
    let items = c
        .submit_batch(&[
            Task::new("rust_ok", json!({"n": 1})).idempotency_key(uniq("b1")),
            Task::new("no_such_type", Value::Null).idempotency_key(uniq("b2")),
            Task::new("rust_ok", Value::Null)
                .idempotency_key(uniq("b3"))
                .delay(Duration::from_secs(3600)),
            Task::new("rust_ok", "first").idempotency_key(&seen_key),
            Task::new("rust_ok", Value::Null)
                .idempotency_key(uniq("b5"))
                .priority(10),
        ])
        .await
        .unwrap();
    assert_eq!(items.len(), 5);
    assert_eq!(items[0].status, 201);
    let first = items[0].result.clone().unwrap();
    let err = items[1].result.clone().unwrap_err();
    assert_eq!(
        (items[1].status, err.code, err.field.as_deref()),
        (400, ErrorCode::UnknownTaskType, Some("type"))
    );
    assert_eq!(items[2].status, 201);
    let later = items[2].result.clone().unwrap();
    assert!(
        later.eta > Utc::now() + chrono::Duration::minutes(59),
        "{later:?}"
    );
    assert_eq!(items[3].status, 200);
    let dup = items[3].result.clone().unwrap();
    assert!(dup.duplicate && dup.id == seen.id, "{dup:?}");
    let err = items[4].result.clone().unwrap_err();
    assert_eq!(
        (err.code, err.field.as_deref()),
        (ErrorCode::InvalidField, Some("priority"))
    );

    dev.wait_state(&first.id, TaskState::Succeeded).await;
    c.cancel(&later.id).await.unwrap();

    // A task without a key fails the whole batch before anything is sent.
    let err = c
        .submit_batch(&[
            Task::new("rust_ok", 1).idempotency_key(uniq("b6")),
            Task::new("rust_ok", 2),
        ])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::BatchTask { index: 1, .. }), "{err}");
}

/// Serves a loopback proxy to `upstream` that counts the calls by method and path;
/// returns its base URL and the counts.
async fn counting_proxy(upstream: String) -> (String, Arc<Mutex<HashMap<String, usize>>>) {
    let counts: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let seen = counts.clone();
    let http = reqwest::Client::new();
    let app = axum::Router::new().fallback(
        move |method: reqwest::Method, uri: axum::http::Uri, headers: HeaderMap, body: Bytes| {
            let (seen, http, upstream) = (seen.clone(), http.clone(), upstream.clone());
            async move {
                *seen
                    .lock()
                    .unwrap()
                    .entry(format!("{method} {}", uri.path()))
                    .or_default() += 1;
                let mut forwarded = headers;
                forwarded.remove(reqwest::header::HOST);
                forwarded.remove(reqwest::header::CONTENT_LENGTH);
                let resp = http
                    .request(method, format!("{upstream}{uri}"))
                    .headers(forwarded)
                    .body(body)
                    .send()
                    .await
                    .unwrap();
                let status = resp.status();
                let body = resp.bytes().await.unwrap();
                (status, [("content-type", "application/json")], body).into_response()
            }
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, counts)
}

/// Many tasks submitting through one call at a time against a real asyncd dev: the
/// submits share batch calls, and each still gets exactly what it would alone.
#[tokio::test]
async fn concurrent_submits_share_calls_and_keep_their_own_answers() {
    const N: usize = 200;
    let rec = Recorder::default();
    let dev = Dev::start(recording_executor(&rec), &[Job::new("rust_ok")]).await;
    let (proxy, counts) = counting_proxy(dev.endpoint.clone()).await;
    let client = Client::builder()
        .endpoint(proxy)
        .submit_coalescing(1)
        .build()
        .unwrap();
    let base = uniq("co");
    let mut handles = Vec::new();
    for i in 0..N {
        // An hour away: the executor plays no part.
        let mut task = Task::new("rust_ok", json!({ "n": i }))
            .idempotency_key(format!("{base}-{i}"))
            .delay(Duration::from_secs(3600));
        match i {
            // The same key and payload as task 6: the same task.
            7 => {
                task.payload = json!({"n": 6});
                task.idempotency_key = Some(format!("{base}-6"));
            }
            // The same key as task 6 with another payload: refused.
            8 => task.idempotency_key = Some(format!("{base}-6")),
            9 => task.task_type = "no_such_type".into(),
            _ => {}
        }
        let client = client.clone();
        handles.push(tokio::spawn(async move { client.submit(&task).await }));
        // This test's runtime has one thread, which runs the spawned submits in the
        // order they were spawned (so task 6 is queued before 7 and 8) once this loop
        // yields: every ten, so that calls are made while more submits arrive.
        if i % 10 == 9 {
            tokio::task::yield_now().await;
        }
    }
    let mut answers = Vec::new();
    for handle in handles {
        answers.push(handle.await.unwrap());
    }

    let mut ids = HashMap::new();
    for (i, answer) in answers.iter().enumerate() {
        if matches!(i, 7..=9) {
            continue;
        }
        let res = answer
            .as_ref()
            .unwrap_or_else(|e| panic!("submit {i}: {e}"));
        if let Some(prev) = ids.insert(res.id.clone(), i) {
            panic!("submits {prev} and {i} answered the same id {}", res.id);
        }
    }
    let six = answers[6].as_ref().unwrap();
    let seven = answers[7].as_ref().unwrap();
    assert!(
        seven.id == six.id && seven.duplicate != six.duplicate,
        "a repeat of task 6 answered {seven:?}; task 6 {six:?}"
    );
    for (i, code, status, field) in [
        (8, ErrorCode::IdempotencyMismatch, 409, "idempotency_key"),
        (9, ErrorCode::UnknownTaskType, 400, "type"),
    ] {
        let err = answers[i].as_ref().expect_err("an API refusal");
        let Error::Api(api) = err else {
            panic!("submit {i}: {err:?} is not an API refusal")
        };
        assert_eq!(
            (&api.code, api.status, api.field.as_deref()),
            (&code, status, Some(field)),
            "submit {i}: {api}"
        );
    }
    for i in [0, 6, 150, N - 1] {
        let id = &answers[i].as_ref().unwrap().id;
        let got = dev.client.get(id).await.unwrap();
        assert_eq!(
            (&got.payload, got.state),
            (&json!({ "n": i }), TaskState::Pending),
            "task {i}"
        );
    }
    let counts = counts.lock().unwrap().clone();
    let batches = counts.get("POST /v1/tasks:batch").copied().unwrap_or(0);
    let singles = counts.get("POST /v1/tasks").copied().unwrap_or(0);
    println!("{batches} batch calls and {singles} single calls for {N} submits");
    assert!(
        batches > 0 && batches + singles < N / 2,
        "{batches} batch calls and {singles} single calls for {N} concurrent submits: \
         they did not share calls ({counts:?})"
    );
}

#[tokio::test]
async fn depends_on() {
    let rec = Recorder::default();
    let dev = Dev::start(recording_executor(&rec), &[Job::new("rust_ok")]).await;
    let c = &dev.client;
    let ok = || Task::new("rust_ok", Value::Null).idempotency_key(uniq("k"));
    let parent = c
        .submit_delayed(&ok(), Duration::from_millis(1500))
        .await
        .unwrap();
    let child = c
        .submit(&ok().depends_on([parent.id.clone()]))
        .await
        .unwrap();
    let got = c.get(&child.id).await.unwrap();
    assert_eq!(got.state, TaskState::Blocked);
    assert_eq!(got.depends_on, vec![parent.id.clone()]);
    dev.wait_state(&child.id, TaskState::Succeeded).await;
    let (p, ch) = (rec.runs(&parent.id), rec.runs(&child.id));
    assert!(
        p.len() == 1 && ch.len() == 1 && ch[0].at >= p[0].at,
        "child ran before its dependency"
    );

    let doomed = c
        .submit_delayed(&ok(), Duration::from_secs(3600))
        .await
        .unwrap();
    let orphan = c
        .submit(&ok().depends_on([doomed.id.clone()]))
        .await
        .unwrap();
    c.cancel(&doomed.id).await.unwrap();
    let dead = dev.wait_state(&orphan.id, TaskState::Dead).await;
    assert!(dead.last_error.unwrap_or_default().contains("dependency"));
    assert!(rec.runs(&orphan.id).is_empty());
}

#[tokio::test]
async fn long_running_heartbeats_keep_the_lease() {
    const LEASE: Duration = Duration::from_secs(2);
    let rec = Recorder::default();
    let (release, released) = tokio::sync::watch::channel(false);
    let (r1, r2) = (rec.clone(), rec.clone());
    let executor = Executor::new()
        .signing_secret(SECRET)
        .register_long_running("rust_long", LEASE, move |ctx: TaskContext, p: Value| {
            r1.add(&ctx, &p);
            let rel = released.clone();
            async move {
                let mut released = rel;
                released
                    .wait_for(|r| *r)
                    .await
                    .expect("the test keeps the sender");
                Ok(json!({"rows": 3, "attempt": ctx.attempt}))
            }
        })
        .register_long_running(
            "rust_long_fails",
            LEASE,
            move |ctx: TaskContext, p: Value| {
                r2.add(&ctx, &p);
                async { Err::<(), _>(Outcome::permanent("report input is corrupt")) }
            },
        );
    let in_flight = executor.in_flight();
    let dev = Dev::start(
        executor,
        &[Job::new("rust_long"), Job::new("rust_long_fails")],
    )
    .await;
    let c = &dev.client;

    let res = submit(&dev, Task::new("rust_long", Value::Null).timeout(LEASE)).await;
    rec.wait_runs(&res.id, 1).await;
    // Hold the handler until its first lease (the attempt's timeout plus the
    // dispatcher's grace) has lapsed: only heartbeats keep the attempt alive past it (a
    // lapsed lease would start attempt 2), and they move lease_until forward.
    let first_until = c
        .get(&res.id)
        .await
        .unwrap()
        .lease_until
        .expect("a running task has a lease");
    let held = Instant::now();
    loop {
        let got = c.get(&res.id).await.unwrap();
        assert_eq!(
            (&got.state, got.attempt),
            (&TaskState::Running, 1),
            "while the handler works: {got:?}"
        );
        let until = got.lease_until.expect("a running task has a lease");
        if Utc::now() > first_until + chrono::Duration::milliseconds(500) {
            assert!(until > Utc::now(), "the lease was not extended: {got:?}");
            break;
        }
        assert!(
            held.elapsed() < DEADLINE,
            "lease_until {first_until} never passed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(in_flight.len(), 1);
    release.send(true).unwrap();
    let done = dev.wait_state(&res.id, TaskState::Succeeded).await;
    assert_eq!(done.attempt, 1);
    assert_eq!(
        done.result,
        Some(json!({"rows": 3, "attempt": 1})),
        "output stored as result"
    );
    assert_eq!(rec.runs(&res.id).len(), 1);

    let fails = submit(&dev, Task::new("rust_long_fails", Value::Null)).await;
    let dead = dev.wait_state(&fails.id, TaskState::Dead).await;
    assert_eq!(dead.attempt, 1);
    assert!(
        dead.last_error
            .unwrap_or_default()
            .contains("report input is corrupt")
    );
    tokio::time::timeout(DEADLINE, in_flight.wait())
        .await
        .expect("long-running handlers finish");
}

/// Sets its [`tokio::sync::Notify`] when dropped: inside a handler's future, it says the
/// future was dropped.
struct OnDrop(std::sync::Arc<tokio::sync::Notify>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.notify_one();
    }
}

/// Issue 15: a task cancelled while its long-running handler runs is cancelled in the
/// handler: the executor learns it on its next heartbeat (410 `task_cancelled`) and
/// cancels the handler's `ctx.cancellation` token, which the handler observes and
/// returns on; and the task ends cancelled after its one attempt.
#[tokio::test]
async fn cancelling_a_running_task_cancels_its_handler() {
    const LEASE: Duration = Duration::from_secs(2);
    let rec = Recorder::default();
    let observed = std::sync::Arc::new(tokio::sync::Notify::new());
    let dropped = std::sync::Arc::new(tokio::sync::Notify::new());
    let (r, o, d) = (rec.clone(), observed.clone(), dropped.clone());
    let executor = Executor::new()
        .signing_secret(SECRET)
        // Longer than the test waits: the handler must end by observing its token, not
        // by being dropped after the grace.
        .cancel_grace(DEADLINE * 2)
        .register_long_running("rust_cancel", LEASE, move |ctx: TaskContext, p: Value| {
            r.add(&ctx, &p);
            let (o, guard) = (o.clone(), OnDrop(d.clone()));
            async move {
                let _guard = guard;
                ctx.cancellation.cancelled().await;
                o.notify_one();
                Err::<(), _>(Outcome::permanent("cancelled"))
            }
        });
    let in_flight = executor.in_flight();
    let dev = Dev::start(executor, &[Job::new("rust_cancel")]).await;
    let res = submit(&dev, Task::new("rust_cancel", Value::Null)).await;
    rec.wait_runs(&res.id, 1).await;
    assert_eq!(
        dev.client.get(&res.id).await.unwrap().state,
        TaskState::Running
    );
    dev.client.cancel(&res.id).await.unwrap();
    tokio::time::timeout(DEADLINE, observed.notified())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the handler did not see its token cancelled within {DEADLINE:?} of the cancel\n{}",
                dev.log_tail()
            )
        });
    tokio::time::timeout(DEADLINE, dropped.notified())
        .await
        .expect("the handler's future ended");
    let done = dev.wait_state(&res.id, TaskState::Cancelled).await;
    assert_eq!(done.attempt, 1);
    assert!(
        done.result.is_none(),
        "the cancelled handler's outcome was recorded: {done:?}"
    );
    assert_eq!(rec.runs(&res.id).len(), 1);
    tokio::time::timeout(DEADLINE, in_flight.wait())
        .await
        .expect("no handler is left running");
}

/// Issue 15: a cancel naming the task's job. A task of a Kafka-routed job that no
/// dispatcher has consumed is not in the store — `asyncd dev` has no brokers, so an id
/// never submitted stands for one: a plain `cancel` cannot tell it from an unknown id
/// (404), `cancel_in` records it cancelled so that it never runs. A stored task is
/// cancelled by `cancel_in` as by `cancel`; a job no config declares is refused.
#[tokio::test]
async fn cancel_in_a_job_cancels_a_kafka_task_not_consumed_yet() {
    let rec = Recorder::default();
    let dev = Dev::start(
        recording_executor(&rec),
        &[
            Job::new("rust_ok"),
            Job::new("rust_kafka").kafka("asyncd-it-rust-kafka"),
        ],
    )
    .await;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let unconsumed = format!("01934a6e-0000-7000-8000-{:012x}", nanos & 0xffff_ffff_ffff);
    api_error(
        dev.client.cancel(&unconsumed).await,
        ErrorCode::NotFound,
        404,
        None,
    );
    let cancelled = dev
        .client
        .cancel_in("rust-kafka-job", &unconsumed)
        .await
        .unwrap();
    assert_eq!(
        (cancelled.id.as_str(), &cancelled.state),
        (unconsumed.as_str(), &TaskState::Cancelled)
    );
    let got = dev.client.get(&unconsumed).await.unwrap();
    assert_eq!(got.state, TaskState::Cancelled);
    assert!(
        got.last_error
            .as_deref()
            .is_some_and(|e| e.contains("before it was consumed from Kafka")),
        "{got:?}"
    );

    let waiting = submit(
        &dev,
        Task::new("rust_ok", Value::Null).delay(Duration::from_secs(3600)),
    )
    .await;
    let cancelled = dev
        .client
        .cancel_in("rust-ok-job", &waiting.id)
        .await
        .unwrap();
    assert_eq!(cancelled.state, TaskState::Cancelled);
    dev.wait_state(&waiting.id, TaskState::Cancelled).await;
    api_error(
        dev.client.cancel_in("no-such-job", UNKNOWN_ID).await,
        ErrorCode::InvalidField,
        400,
        Some("job"),
    );
}

/// `change_in_job` reaches a Kafka-routed task that no dispatcher has consumed (an id
/// never submitted stands for one, as `asyncd dev` has no brokers): `change` cannot tell
/// it from an unknown id (404); with the job the change is recorded (202,
/// `Changed::Pending`), and a second one too. A stored task is changed with the job as
/// without it (200, `Changed::Stored`) — the server ignores `?job=` for a job without
/// Kafka — and a job no config declares is refused.
#[tokio::test]
async fn change_in_job_records_a_change_of_a_kafka_task_not_consumed_yet() {
    let rec = Recorder::default();
    let dev = Dev::start(
        recording_executor(&rec),
        &[
            Job::new("rust_ok"),
            Job::new("rust_kafka").kafka("asyncd-it-rust-kafka"),
        ],
    )
    .await;
    let c = &dev.client;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let unconsumed = format!("01934a6e-0003-7000-8000-{:012x}", nanos & 0xffff_ffff_ffff);
    let priority = Change {
        priority: Some(7),
        ..Change::default()
    };
    api_error(
        c.change(&unconsumed, &priority).await,
        ErrorCode::NotFound,
        404,
        None,
    );
    let want = Changed::Pending(PendingChange {
        id: unconsumed.clone(),
        job: "rust-kafka-job".into(),
        task_type: "rust_kafka".into(),
        consumed: false,
    });
    let later = Change {
        payload: Some(json!({"v": 2})),
        delay: Some(Duration::from_secs(3600)),
        ..Change::default()
    };
    for change in [&priority, &later] {
        let changed = c
            .change_in_job("rust-kafka-job", &unconsumed, change)
            .await
            .unwrap();
        assert_eq!(changed, want);
    }

    let waiting = submit(
        &dev,
        Task::new("rust_ok", json!({"v": 1})).delay(Duration::from_secs(3600)),
    )
    .await;
    let change = Change {
        payload: Some(json!({"v": 2})),
        priority: Some(7),
        ..Change::default()
    };
    match c
        .change_in_job("rust-ok-job", &waiting.id, &change)
        .await
        .unwrap()
    {
        Changed::Stored(task) => assert_eq!(
            (task.id.as_str(), &task.payload, task.priority, task.state),
            (waiting.id.as_str(), &json!({"v": 2}), 7, TaskState::Pending)
        ),
        other => panic!("{other:?}"),
    }
    api_error(
        c.change_in_job("no-such-job", &waiting.id, &priority).await,
        ErrorCode::InvalidField,
        400,
        Some("job"),
    );
    c.cancel(&waiting.id).await.unwrap();
}

#[tokio::test]
async fn bad_signature_is_refused_into_dead_letters() {
    let rec = Recorder::default();
    let dev = Dev::start(
        recording_executor(&rec),
        &[Job::new("rust_ok").secret(WRONG_SECRET_NAME)],
    )
    .await;
    let res = submit(&dev, Task::new("rust_ok", Value::Null)).await;
    let dead = dev.wait_state(&res.id, TaskState::Dead).await;
    assert_eq!(dead.attempt, 1, "a 401 is permanent");
    let last_error = dead.last_error.unwrap_or_default();
    assert!(
        last_error.contains("401") && last_error.contains("signature"),
        "{last_error}"
    );
    assert!(
        rec.runs(&res.id).is_empty(),
        "the handler ran on a badly signed call"
    );
}

/// Batch delivery (docs/api.md, "Batch delivery"): a job with `executor.batch` gets its
/// due tasks several to a call, and the handler registered as for single calls runs
/// once per task, with each task's own context. Needs the dispatcher's side of batch
/// delivery: an asyncd without it refuses the job's `executor.batch` at start-up.
#[tokio::test]
async fn batch_delivery_runs_the_handler_once_per_task() {
    const TASKS: usize = 25;
    const MAX_TASKS: usize = 10;
    let rec = Recorder::default();
    let r = rec.clone();
    let executor = Executor::new().signing_secret(SECRET).register(
        "rust_batch",
        move |ctx: TaskContext, p: Value| {
            r.add(&ctx, &p);
            async { Ok(()) }
        },
    );
    // How many tasks each executor call carried: its Asyncd-Batch, 1 for a single call.
    let calls: std::sync::Arc<std::sync::Mutex<Vec<usize>>> = Default::default();
    let seen = calls.clone();
    let app = executor
        .into_router()
        .layer(tower::util::MapRequestLayer::new(
            move |req: axum::extract::Request| {
                let n = req
                    .headers()
                    .get(HEADER_BATCH)
                    .and_then(|v| v.to_str().ok())
                    .map_or(Some(1), |v| v.trim().parse().ok());
                seen.lock().unwrap().push(n.unwrap_or(0));
                req
            },
        ));
    let dev = Dev::start_app(
        app,
        &[Job::new("rust_batch").batch(MAX_TASKS as u32, "200ms")],
        |_| Vec::new(),
    )
    .await;

    let tasks: Vec<Task> = (0..TASKS)
        .map(|i| Task::new("rust_batch", json!({"n": i})).idempotency_key(uniq("batch")))
        .collect();
    let items = dev.client.submit_batch(&tasks).await.unwrap();
    assert_eq!(items.len(), TASKS);
    let mut submitted = Vec::new();
    for (item, task) in items.into_iter().zip(&tasks) {
        assert_eq!(item.status, 201, "{:?}", item.result);
        submitted.push((item.result.unwrap().id, task));
    }
    for (id, task) in &submitted {
        let done = dev.wait_state(id, TaskState::Succeeded).await;
        assert_eq!(done.attempt, 1, "{done:?}");
        let runs = rec.runs(id);
        assert_eq!(runs.len(), 1, "task {id} ran {} times", runs.len());
        let ctx = &runs[0].ctx;
        assert_eq!(
            (ctx.id.as_str(), ctx.task_type.as_str(), ctx.attempt),
            (id.as_str(), "rust_batch", 1)
        );
        assert_eq!(Some(&ctx.idempotency_key), task.idempotency_key.as_ref());
        assert_eq!(runs[0].payload, task.payload);
        assert_eq!(ctx.callback_url, dev.endpoint);
        assert!(
            !ctx.lease_token.is_empty() && ctx.eta.is_some() && ctx.dispatcher.is_some(),
            "{ctx:?}"
        );
    }
    let calls = calls.lock().unwrap().clone();
    println!("tasks per executor call: {calls:?}");
    assert!(
        calls.iter().any(|&n| n > 1),
        "no executor call carried more than one task: {calls:?}"
    );
    assert!(
        calls.iter().all(|&n| (1..=MAX_TASKS).contains(&n)),
        "a call of 0 or more than maxTasks tasks: {calls:?}"
    );
    assert_eq!(
        calls.iter().sum::<usize>(),
        TASKS,
        "each task in exactly one call: {calls:?}"
    );
}
