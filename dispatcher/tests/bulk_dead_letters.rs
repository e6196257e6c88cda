//! Issue 15, dead letters in bulk through the API of real processes — `asyncd dev` on
//! SQLite, and `asyncd api` with `asyncd dispatcher` on PostgreSQL: a redrive of 5 000
//! dead letters, SIGKILLed part-way and resumed, redrives each exactly once; the same
//! loop run again after they died again does nothing; a purge by filter deletes what it
//! matches and nothing else; bad filters are 400s naming the field.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use support::*;

const TASKS: usize = 5_000;
/// Pages of the interrupted redrive: small, so that the loop takes many calls and the
/// kill lands with some of them done and some not.
const PAGE: usize = 50;

/// Runs a bulk action to the end the way a client does — the same filter and, after the
/// first answer, that answer's `dead_before` — and returns the answers.
async fn run_to_end(api: &impl Api, path: &str, mut filter: Value) -> Vec<Value> {
    let mut answers = Vec::new();
    loop {
        let (status, answer) = api.post(path, filter.clone()).await;
        assert_eq!(status, 200, "{path} {filter} answered {answer}");
        filter["dead_before"] = answer["dead_before"].clone();
        let done = answer["remaining"] == 0 || answer["affected"] == 0;
        answers.push(answer);
        if done {
            return answers;
        }
    }
}

async fn submit_all(api: &impl Api, task_type: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(1_000) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|i| json!({"type": task_type, "payload": {"i": i}}))
            .collect();
        let (status, answer) = api.post("/v1/tasks:batch", json!({ "tasks": tasks })).await;
        assert_eq!(status, 200, "{answer}");
        for result in answer["results"].as_array().unwrap() {
            assert_eq!(result["status"], 201, "{result}");
            ids.push(result["id"].as_str().unwrap().to_string());
        }
    }
    ids
}

async fn dead_count(api: &impl Api, filter: Value) -> u64 {
    let mut filter = filter;
    filter["dry_run"] = json!(true);
    let (status, answer) = api.post("/v1/dead-letters/redrive", filter).await;
    assert_eq!(status, 200, "{answer}");
    answer["matched"].as_u64().unwrap()
}

async fn a_bulk_redrive_killed_part_way_resumes_and_redrives_each_once(backend: Backend) {
    let executor = Executor::start(|_| Answer::status(500)).await;
    let jobs = [(
        "job.yaml",
        job_yaml(
            "bulk-job",
            "bulk",
            &executor.url(),
            "  retry: {maxRetries: 0}\n",
        ),
    )];
    let mut asyncd = Deployment::start(backend, &jobs).await;
    let ids = submit_all(&asyncd, "bulk", TASKS).await;
    let job = json!({"job": "bulk-job"});
    wait_for("every task dead", DEADLINE * 4, async || {
        (dead_count(&asyncd, job.clone()).await == TASKS as u64).then_some(())
    })
    .await;

    // Paused, the redriven tasks wait in the store, where the test counts them.
    let (status, _) = asyncd.post("/v1/jobs/bulk-job/pause", json!({})).await;
    assert_eq!(status, 200);

    let (status, dry) = asyncd
        .post(
            "/v1/dead-letters/redrive",
            json!({"job": "bulk-job", "dry_run": true}),
        )
        .await;
    assert_eq!(status, 200, "{dry}");
    assert_eq!(
        (&dry["matched"], &dry["affected"], &dry["remaining"]),
        (&json!(TASKS), &json!(0), &json!(TASKS)),
        "a dry run changes nothing: {dry}"
    );
    let mut filter = json!({"job": "bulk-job", "dead_before": dry["dead_before"], "limit": PAGE});

    // A client runs the action page after page, as `run_to_end` does, until the process
    // dies under it.
    // `pages` counts the answers the client has read: a page the store committed may
    // still be on its way back when the kill lands, so the count of dead letters alone
    // does not say the client saw one.
    let pages = Arc::new(AtomicUsize::new(0));
    let client = {
        let http = asyncd.http().clone();
        let url = asyncd.url("/v1/dead-letters/redrive");
        let body = filter.clone();
        let pages = pages.clone();
        tokio::spawn(async move {
            let mut answered = 0;
            loop {
                let response = match http.post(&url).json(&body).send().await {
                    Ok(response) => response,
                    Err(err) => return (answered, Err(err.to_string())),
                };
                let status = response.status();
                let answer = match response.json::<Value>().await {
                    Ok(answer) => answer,
                    Err(err) => return (answered, Err(err.to_string())),
                };
                assert_eq!(status, 200, "{answer}");
                answered += 1;
                pages.store(answered, Ordering::SeqCst);
                if answer["remaining"] == 0 {
                    return (answered, Ok(answer));
                }
            }
        })
    };
    // Killed once the client has read at least one page and at most half went: the loop
    // is mid-way, with a call in flight or about to be.
    let job_filter = json!({"job": "bulk-job", "dead_before": dry["dead_before"]});
    let before_kill = wait_for("the redrive part-way", DEADLINE, async || {
        if pages.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let dead = dead_count(&asyncd, job_filter.clone()).await as usize;
        (TASKS / 2..=TASKS - PAGE).contains(&dead).then_some(dead)
    })
    .await;
    asyncd.kill9_api();
    let (answered, last) = client.await.unwrap();
    assert!(
        last.is_err(),
        "the kill ended the client's loop before the action finished: {last:?}"
    );
    assert!(answered >= 1, "at least one page answered before the kill");
    asyncd.respawn_api().await;

    let dead = dead_count(&asyncd, job_filter.clone()).await as usize;
    assert!(
        dead > 0 && dead <= before_kill,
        "interrupted part-way: {dead} dead letters left after the kill ({before_kill} just before)"
    );
    println!(
        "{backend:?}: SIGKILL after {answered} pages of {PAGE} answered, {before_kill} dead \
         letters left just before it, {dead} after"
    );
    filter["limit"] = json!(1_000);
    let answers = run_to_end(&asyncd, "/v1/dead-letters/redrive", filter.clone()).await;
    assert_eq!(answers.last().unwrap()["remaining"], 0, "{answers:?}");
    assert_eq!(
        answers
            .iter()
            .map(|a| a["affected"].as_u64().unwrap())
            .sum::<u64>(),
        dead as u64,
        "the resumed loop redrove exactly what was left: {answers:?}"
    );
    assert_eq!(dead_count(&asyncd, job.clone()).await, 0);
    let pending = search_states(&asyncd, "bulk-job").await;
    assert_eq!(
        pending.get("pending").copied().unwrap_or(0),
        TASKS,
        "every dead letter redriven: {pending:?}"
    );

    // Each runs once more and dies again; the same action, resumed once more, matches
    // none of them (they died after its cutoff).
    let (status, _) = asyncd.post("/v1/jobs/bulk-job/resume", json!({})).await;
    assert_eq!(status, 200);
    wait_for("every task dead again", DEADLINE * 4, async || {
        (dead_count(&asyncd, job.clone()).await == TASKS as u64).then_some(())
    })
    .await;
    let (status, again) = asyncd.post("/v1/dead-letters/redrive", filter).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(
        (&again["matched"], &again["affected"]),
        (&json!(0), &json!(0))
    );
    let calls = executor.calls_by_task();
    for id in &ids {
        assert_eq!(
            calls.get(id).map_or(0, Vec::len),
            2,
            "task {id}: its first run and the one redrive"
        );
    }
}

#[tokio::test]
async fn sqlite_a_bulk_redrive_killed_part_way_resumes_and_redrives_each_once() {
    a_bulk_redrive_killed_part_way_resumes_and_redrives_each_once(Backend::Sqlite).await;
}

#[tokio::test]
async fn postgres_a_bulk_redrive_killed_part_way_resumes_and_redrives_each_once() {
    a_bulk_redrive_killed_part_way_resumes_and_redrives_each_once(Backend::Server(
        "ASYNCD_TEST_POSTGRES_URL",
    ))
    .await;
}

/// Task counts by state for one job, through `GET /v1/tasks` page by page.
async fn search_states(asyncd: &impl Api, job: &str) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/tasks?job={job}&limit=1000");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let (status, page) = asyncd.get(&path).await;
        assert_eq!(status, 200, "{page}");
        for task in page["items"].as_array().unwrap() {
            *counts
                .entry(task["state"].as_str().unwrap().to_string())
                .or_default() += 1;
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return counts,
        }
    }
}

#[tokio::test]
async fn a_bulk_purge_deletes_what_matches_and_bad_filters_name_their_field() {
    let executor = Executor::start(|call| {
        if call.body["payload"]["kind"] == "slow" {
            Answer::status(503).with_body("overloaded")
        } else {
            Answer::status(500).with_body("boom")
        }
    })
    .await;
    let jobs = [
        (
            "a.yaml",
            job_yaml("job-a", "a", &executor.url(), "  retry: {maxRetries: 0}\n"),
        ),
        (
            "b.yaml",
            job_yaml("job-b", "b", &executor.url(), "  retry: {maxRetries: 0}\n"),
        ),
    ];
    let asyncd = Asyncd::start(&jobs, &[]).await;
    let slow = asyncd
        .submit(json!({"type": "a", "payload": {"kind": "slow"}}))
        .await;
    let boom = asyncd
        .submit(json!({"type": "a", "payload": {"kind": "boom"}}))
        .await;
    let other = asyncd
        .submit(json!({"type": "b", "payload": {"kind": "slow"}}))
        .await;
    for id in [&slow, &boom, &other] {
        asyncd.wait_state(id, "dead").await;
    }
    let last_error = asyncd.task(&slow).await["last_error"]
        .as_str()
        .unwrap()
        .to_string();
    let status_at = last_error
        .find("503")
        .expect("the last error names the status")
        + 3;
    let prefix = &last_error[..status_at];

    let (status, answer) = asyncd
        .post(
            "/v1/dead-letters/purge",
            json!({"type": "a", "error_prefix": prefix}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        (
            &answer["matched"],
            &answer["affected"],
            &answer["remaining"]
        ),
        (&json!(1), &json!(1), &json!(0)),
        "only {slow} died with {last_error:?}: {answer}"
    );
    let (status, _) = asyncd.get(&format!("/v1/tasks/{slow}")).await;
    assert_eq!(status, 404, "purged");
    asyncd.wait_state(&boom, "dead").await;
    asyncd.wait_state(&other, "dead").await;

    for (body, field) in [
        (json!({}), "job"),
        (json!({"job": "nope"}), "job"),
        (json!({"job": "job-a", "type": "b"}), "type"),
        (json!({"job": "job-a", "limit": 0}), "limit"),
        (json!({"job": "job-a", "limit": 1001}), "limit"),
        (
            json!({"job": "job-a", "error_prefix": "a\u{0}b"}),
            "error_prefix",
        ),
        (
            json!({"job": "job-a", "dead_before": "yesterday"}),
            "dead_before",
        ),
    ] {
        let (status, answer) = asyncd.post("/v1/dead-letters/purge", body.clone()).await;
        assert_eq!(status, 400, "{body} answered {answer}");
        assert_eq!(answer["error"]["field"], field, "{body} answered {answer}");
    }
    let (status, answer) = asyncd
        .post(
            "/v1/dead-letters/purge",
            json!({"job": "job-a", "dryrun": true}),
        )
        .await;
    assert_eq!(
        status, 400,
        "a misspelt field must not widen a purge: {answer}"
    );
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("dryrun"),
        "{answer}"
    );
    asyncd.wait_state(&boom, "dead").await;
}
