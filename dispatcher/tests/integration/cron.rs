//! Cron entries: each firing runs once, on time, through the executor (the `dev` role
//! in-process on the manual clock); and `POST /v1/jobs/{name}/cron/{entry}/trigger`
//! (docs/api.md, "Trigger a cron entry now"): the task a firing of the entry is, due at
//! the call, a new one per call; unknown jobs and entries are 404s naming the field.

use asyncd_store::Millis;
use serde_json::json;

use crate::support::*;

fn job(executor: &Executor) -> Vec<(&'static str, String)> {
    vec![(
        "job.yaml",
        job_yaml(
            "report-job",
            "report",
            &executor.url(),
            "  retry:\n    maxRetries: 4\n  cron:\n    - name: nightly\n      \
             schedule: \"CRON_TZ=UTC 0 2 * * *\"\n      payload: {scope: all}\n      priority: 7\n",
        ),
    )]
}

#[tokio::test]
async fn a_trigger_creates_the_entry_s_firing_now_every_time() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&job(&executor)).await;
    let mut fired = Vec::new();
    for _ in 0..2 {
        let (status, answer) = asyncd
            .post("/v1/jobs/report-job/cron/nightly/trigger", json!(null))
            .await;
        assert_eq!(status, 201, "{answer}");
        assert_eq!(
            (&answer["job"], &answer["entry"], &answer["type"]),
            (&json!("report-job"), &json!("nightly"), &json!("report"))
        );
        assert_eq!(parse_time(&answer["eta"]), asyncd.now(), "due at the call");
        fired.push(answer["id"].as_str().unwrap().to_string());
    }
    assert_ne!(fired[0], fired[1], "each call fires once more");
    for id in &fired {
        let task = asyncd.task(id).await;
        assert_eq!(task["payload"], json!({"scope": "all"}));
        assert_eq!(task["priority"], 7);
        assert_eq!(task["max_retries"], 4, "the job's retries");
    }
}

#[tokio::test]
async fn unknown_jobs_and_entries_are_404s_naming_the_field() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&job(&executor)).await;
    let (status, answer) = asyncd
        .post("/v1/jobs/nope/cron/nightly/trigger", json!(null))
        .await;
    assert_eq!(status, 404, "{answer}");
    assert_eq!(answer["error"]["field"], "name", "{answer}");
    let (status, answer) = asyncd
        .post("/v1/jobs/report-job/cron/hourly/trigger", json!(null))
        .await;
    assert_eq!(status, 404, "{answer}");
    assert_eq!(
        (&answer["error"]["code"], &answer["error"]["field"]),
        (&json!("not_found"), &json!("entry"))
    );
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("\"hourly\"") && message.contains("nightly"),
        "names the entry and the job's entries: {message}"
    );
}

#[tokio::test]
async fn cron_entries_fire_through_the_executor() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let extra = "  cron:\n    - name: every-second\n      schedule: \"CRON_TZ=Asia/Kathmandu * * * * * *\"\n      payload: {cron: true}\n";
    let mut asyncd = InProcess::start(&one_job(&executor, extra)).await;
    // The first pass creates the firings from the start time on.
    asyncd
        .next("a cron pass", |s| match s {
            asyncd::test_hooks::Signal::Scheduled { created, at } => {
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
                    asyncd::test_hooks::Signal::Dispatched { eta, at, .. } => Some((eta, at)),
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
