//! Issue 15, dead letters in bulk through the API of real processes — `asyncd dev` on
//! SQLite, and `asyncd api` with `asyncd dispatcher` on PostgreSQL: a redrive of 5 000
//! dead letters, SIGKILLed part-way and resumed, redrives each exactly once; the same
//! loop run again after they died again does nothing; a purge by filter deletes what it
//! matches and nothing else; bad filters are 400s naming the field. And listings, on the
//! `dev` role in-process: dead tasks page by page up to a byte cap, and Kafka messages
//! that could not be made tasks, listed and purged.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use asyncd_store::Millis;
use serde_json::{Value, json};

use crate::support::*;

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
    let Some(mut asyncd) = Deployment::start(backend, &jobs).await else {
        return;
    };
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
        Service::Postgres,
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

/// Issue 15: Kafka dead letters through the API — listed latest first, byte for byte in
/// base64, one job's topic only, page by page with the cursor; purged by the instant
/// they were recorded before; a bad parameter is a 400 naming it.
#[tokio::test]
async fn kafka_dead_letters_are_listed_and_purged_through_the_api() {
    use asyncd_store::KafkaDeadLetter;
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "  kafka: {topic: asyncd.work}\n")).await;
    let url = format!("sqlite://{}", asyncd.dir.path().join("asyncd.db").display());
    let store = asyncd_store::open(&url).await.unwrap();
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
