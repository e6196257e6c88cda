//! Schedules through the API (docs/api.md, "Schedules"): an API schedule fires through
//! the executor with its payload filled in, and stops when deleted; put, patch, pause,
//! resume, trigger and backfill as answered; a job's cron entries listed read-only; and
//! bad input named. The `dev` role in-process, on the manual clock.

use asyncd_store::Millis;
use reqwest::Method;
use serde_json::json;

use crate::support::*;

fn jobs(executor: &Executor) -> Vec<(&'static str, String)> {
    one_job(
        executor,
        "  cron:\n    - name: nightly\n      schedule: \"CRON_TZ=UTC 0 2 * * *\"\n",
    )
}

fn time(ms: i64) -> String {
    asyncd_contract::time::format_millis(ms)
}

async fn put(asyncd: &InProcess, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    asyncd.send_json(Method::PUT, path, body).await
}

#[tokio::test]
async fn an_api_schedule_fires_through_the_executor_until_deleted() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let mut asyncd = InProcess::start(&jobs(&executor)).await;
    let (status, created) = asyncd
        .post(
            "/v1/schedules",
            json!({"job": "test-job", "name": "customer-42", "every": "1s",
                   "payload": {"for": "{{scheduled_at}}", "by": "{{schedule}}"}}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(
        (&created["source"], &created["type"], &created["fired"]),
        (&json!("api"), &json!("work"), &json!(0))
    );
    assert_eq!(parse_time(&created["next_firing"]), T0 + 1_000);

    for second in 1..=2 {
        asyncd.clock.set_millis(Millis::new(T0 + second * 1_000));
        asyncd
            .next("a firing created", |s| match s {
                asyncd::test_hooks::Signal::Scheduled { created, at }
                    if at.as_i64() >= T0 + second * 1_000 =>
                {
                    (created > 0).then_some(())
                }
                _ => None,
            })
            .await;
    }
    let calls = wait_for("two firings run", DEADLINE, async || {
        let calls = executor.calls();
        (calls.len() >= 2).then_some(calls)
    })
    .await;
    // Both firings are due by the time the clock has moved twice: run side by side,
    // their calls may arrive in either order.
    let mut payloads: Vec<_> = calls[..2]
        .iter()
        .map(|c| c.body["payload"].clone())
        .collect();
    payloads.sort_by_key(|p| p["for"].as_str().unwrap_or_default().to_string());
    assert_eq!(
        payloads[..2],
        [
            json!({"for": "2027-01-15T08:00:01.000Z", "by": "customer-42"}),
            json!({"for": "2027-01-15T08:00:02.000Z", "by": "customer-42"}),
        ],
        "each firing's instant filled in"
    );
    let (_, schedule) = asyncd.get("/v1/schedules/test-job/customer-42").await;
    assert!(schedule["fired"].as_u64().unwrap() >= 2, "{schedule}");
    assert!(schedule["last_task_id"].is_string(), "{schedule}");

    // Firings exist up to a minute ahead; a pause cancels them, so it stops the
    // schedule at once.
    let waiting = async || {
        let (status, page) = asyncd.get("/v1/tasks?job=test-job&state=pending").await;
        assert_eq!(status, 200, "{page}");
        page["items"].as_array().unwrap().len()
    };
    assert!(waiting().await > 50, "created ahead");
    let (status, paused) = asyncd
        .post("/v1/schedules/test-job/customer-42/pause", json!(null))
        .await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(waiting().await, 0, "cancelled by the pause");
    let (status, _) = asyncd.delete("/v1/schedules/test-job/customer-42").await;
    assert_eq!(status, 204);
    let (status, answer) = asyncd.get("/v1/schedules/test-job/customer-42").await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (404, &json!("not_found"))
    );
}

#[tokio::test]
async fn a_schedule_is_put_patched_paused_resumed_triggered_and_backfilled() {
    // Every attempt fails and is retried after a backoff the manual clock never reaches,
    // so the triggered firing is still unfinished when the overlap rule is checked,
    // however quickly the dispatcher runs it.
    let executor = Executor::start(|_| Answer::status(503)).await;
    let asyncd = InProcess::start(&jobs(&executor)).await;
    let path = "/v1/schedules/test-job/weekly";
    let spec = json!({"cron": "CRON_TZ=Europe/Berlin 0 9 * * MON", "priority": 2});
    let (status, first) = put(&asyncd, path, spec.clone()).await;
    assert_eq!(status, 201, "{first}");
    let (status, again) = put(&asyncd, path, spec).await;
    assert_eq!(status, 200, "written over: {again}");

    let (status, patched) = asyncd
        .patch(
            path,
            json!({"every": "1h", "overlap": "BufferOne", "priority": null}),
        )
        .await;
    assert_eq!(status, 200, "{patched}");
    assert_eq!(
        (
            &patched["every"],
            patched.get("cron"),
            &patched["overlap"],
            &patched["priority"]
        ),
        (&json!("1h"), None, &json!("BufferOne"), &json!(0)),
        "every replaced cron; a null cleared priority"
    );

    let (status, paused) = asyncd.post(&format!("{path}/pause"), json!(null)).await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(
        (&paused["paused"], &paused["next_firing"]),
        (&json!(true), &json!(null))
    );
    let (_, resumed) = asyncd.post(&format!("{path}/resume"), json!(null)).await;
    assert_eq!(resumed["paused"], false);
    assert_eq!(parse_time(&resumed["next_firing"]), T0 + 3_600_000);

    let (status, fired) = asyncd.post(&format!("{path}/trigger"), json!(null)).await;
    assert_eq!(status, 201, "{fired}");
    assert_eq!(parse_time(&fired["eta"]), T0, "due at the call");
    // The job's own trigger endpoint fires an API schedule by its name too.
    let (status, _) = asyncd
        .post("/v1/jobs/test-job/cron/weekly/trigger", json!(null))
        .await;
    assert_eq!(
        status, 409,
        "BufferOne allows no overlap: the triggered firing has not finished"
    );

    let range = json!({"from": time(T0 - 5 * 3_600_000), "to": time(T0)});
    let (status, backfilled) = asyncd
        .post(&format!("{path}/backfill"), range.clone())
        .await;
    assert_eq!(status, 200, "{backfilled}");
    assert_eq!(backfilled, json!({"firings": 5, "created": 5}));
    let (_, repeated) = asyncd.post(&format!("{path}/backfill"), range).await;
    assert_eq!(repeated, json!({"firings": 5, "created": 0}), "each once");

    let (status, page) = asyncd.get("/v1/schedules?job=test-job&limit=1").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["items"][0]["name"], "nightly");
    assert_eq!(page["items"][0]["source"], "config");
    let cursor = page["next_cursor"].as_str().unwrap().to_string();
    let (_, rest) = asyncd
        .get(&format!(
            "/v1/schedules?job=test-job&limit=1&cursor={cursor}"
        ))
        .await;
    assert_eq!(rest["items"][0]["name"], "weekly");
}

#[tokio::test]
async fn bad_schedules_are_refused_naming_the_field() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&jobs(&executor)).await;
    let refused = async |method: Method, path: &str, body: serde_json::Value| {
        let (status, answer) = asyncd.send_json(method, path, body).await;
        (
            status,
            answer["error"]["code"].as_str().unwrap_or("").to_string(),
            answer["error"]["field"].as_str().unwrap_or("").to_string(),
        )
    };
    let expect =
        |status: u16, code: &str, field: &str| (status, code.to_string(), field.to_string());
    let create = |body: serde_json::Value| refused(Method::POST, "/v1/schedules", body);
    assert_eq!(
        create(json!({"name": "a", "every": "1h"})).await,
        expect(400, "invalid_field", "job")
    );
    assert_eq!(
        create(json!({"job": "nope", "name": "a", "every": "1h"})).await,
        expect(404, "not_found", "job")
    );
    assert_eq!(
        create(json!({"job": "test-job", "name": "a/b", "every": "1h"})).await,
        expect(400, "invalid_field", "name")
    );
    assert_eq!(
        create(json!({"job": "test-job", "name": "a", "cron": "0 9 * * *"})).await,
        expect(400, "invalid_field", "cron")
    );
    assert_eq!(
        create(json!({"job": "test-job", "name": "a", "every": "1h", "evry": 1})).await,
        expect(400, "malformed_json", "evry")
    );
    assert_eq!(
        create(json!({"job": "test-job", "name": "a", "every": "1h", "jitter": "2h"})).await,
        expect(400, "invalid_field", "jitter")
    );
    assert_eq!(
        create(json!({"job": "test-job", "name": "a", "every": 5})).await,
        expect(400, "malformed_json", "every")
    );
    assert_eq!(
        create(json!({"job": "test-job", "name": "a", "every": "1h"}))
            .await
            .0,
        201
    );
    assert_eq!(
        create(json!({"job": "test-job", "name": "a", "every": "1h"})).await,
        expect(409, "schedule_exists", "name")
    );
    assert_eq!(
        refused(
            Method::PATCH,
            "/v1/schedules/test-job/nightly",
            json!({"priority": 1})
        )
        .await,
        expect(409, "schedule_read_only", "")
    );
    assert_eq!(
        refused(
            Method::DELETE,
            "/v1/schedules/test-job/nightly",
            json!(null)
        )
        .await,
        expect(409, "schedule_read_only", "")
    );
    assert_eq!(
        refused(
            Method::PATCH,
            "/v1/schedules/test-job/zzz",
            json!({"priority": 1})
        )
        .await,
        expect(404, "not_found", "name")
    );
    assert_eq!(
        refused(Method::PATCH, "/v1/schedules/test-job/a", json!({})).await,
        expect(400, "invalid_field", "body"),
        "nothing to change"
    );
    assert_eq!(
        refused(
            Method::POST,
            "/v1/schedules/test-job/a/backfill",
            json!({"from": time(T0), "to": time(T0 + 1)})
        )
        .await,
        expect(400, "invalid_field", "to"),
        "the future is the schedule's own"
    );
    assert_eq!(
        refused(Method::GET, "/v1/schedules", json!(null)).await,
        expect(400, "invalid_field", "job")
    );
    assert_eq!(
        refused(
            Method::GET,
            "/v1/schedules?job=test-job&limit=0",
            json!(null)
        )
        .await,
        expect(400, "invalid_field", "limit")
    );
    assert_eq!(
        refused(
            Method::POST,
            "/v1/schedules/test-job/a/backfill",
            json!({"from": time(T0), "to": time(T0)})
        )
        .await,
        expect(400, "invalid_field", "to")
    );
    assert_eq!(
        refused(
            Method::POST,
            "/v1/schedules/test-job/a/backfill",
            json!({"from": time(T0 - 86_400_000 * 1000), "to": time(T0)})
        )
        .await,
        expect(400, "invalid_field", "to"),
        "more than 10 000 firings"
    );
}
