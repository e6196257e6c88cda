//! Executor callbacks and signed executor calls (docs/security.md), end to end through
//! the `dev` role in-process: forged callbacks on every store backend, the signature a
//! real executor receives, a job whose signing Secret is missing, and a result callback
//! asking for a retry or failing the task for good.

use std::sync::Arc;
use std::time::SystemTime;

use asyncd::clock::SystemClock;

use asyncd_contract::{SignedCall, verify_signature};
use serde_json::{Value, json};

use crate::support::*;

fn long_job(executor: &Executor, extra: &str) -> Vec<(&'static str, String)> {
    vec![(
        "job.yaml",
        job_yaml(
            "test-job",
            "work",
            &executor.url(),
            &format!("  retry:\n    initialBackoff: 100ms\n{extra}"),
        ),
    )]
}

/// The answer every refused callback gets, whatever the reason.
fn refused(answer: &(u16, Value)) -> (u16, String) {
    (answer.0, answer.1.to_string())
}

/// Forged heartbeats and results — guessed tokens, another task's token, an earlier
/// attempt's token, an unknown task — all get the one same answer, and none changes the
/// task; the real token still works afterwards.
async fn forged_callbacks_are_refused_and_change_nothing(store_url: Option<String>) {
    let executor = Executor::start(|_| Answer::status(202).with_body(r#"{"lease":"60s"}"#)).await;
    // The real clock: a dispatcher on a database server dispatches only while its clock
    // agrees with the server's.
    let mut asyncd = InProcess::start_with(&long_job(&executor, ""), |settings| {
        settings.clock = Arc::new(SystemClock);
        if let Some(url) = store_url {
            settings.store_url = url;
        }
    })
    .await;
    let id = asyncd.submit(task("work", json!({"n": 1}))).await;
    let other = asyncd.submit(task("work", json!({"n": 2}))).await;
    let first = executor.wait_calls(&id, 1).await.remove(0);
    let other_call = executor.wait_calls(&other, 1).await.remove(0);
    assert_eq!(first.lease_token.len(), 64, "256 bits, hex");
    assert!(first.lease_token.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_ne!(first.lease_token, other_call.lease_token);

    // A retry, so that the task has an earlier attempt whose token is known.
    asyncd.finished(&id).await;
    let (status, answer) = asyncd
        .post(
            &format!("/v1/tasks/{id}/result"),
            json!({"lease_token": first.lease_token, "status": "retry", "retry_after": "1s"}),
        )
        .await;
    assert_eq!((status, answer["state"].as_str()), (200, Some("pending")));
    let second = executor.wait_calls(&id, 2).await.remove(1);
    assert_ne!(second.lease_token, first.lease_token);
    // The 202's lease is written before the snapshot below.
    asyncd.finished(&id).await;
    let before = wait_for("the second attempt to run", DEADLINE, async || {
        let task = asyncd.task(&id).await;
        (task["state"] == "running" && task["attempt"] == 2).then_some(task)
    })
    .await;

    let unknown = "01900000-0000-7000-8000-000000000000";
    let baseline = refused(
        &asyncd
            .post(
                &format!("/v1/tasks/{unknown}/heartbeat"),
                json!({"lease_token": second.lease_token}),
            )
            .await,
    );
    assert_eq!(baseline.0, 409, "{}", baseline.1);
    assert!(baseline.1.contains("stale_lease"), "{}", baseline.1);
    let guesses = [
        "1".to_string(),
        "2".to_string(),
        "3".to_string(),
        "0".repeat(64),
        "f".repeat(64),
        first.lease_token.clone(),
        other_call.lease_token.clone(),
        second.lease_token.to_uppercase(),
        format!("{} ", &second.lease_token[..63]),
    ];
    for token in &guesses {
        for (path, body) in [
            ("heartbeat", json!({"lease_token": token, "lease": "24h"})),
            (
                "result",
                json!({"lease_token": token, "status": "success", "output": "forged"}),
            ),
            (
                "result",
                json!({"lease_token": token, "status": "failed", "error": "forged"}),
            ),
        ] {
            let answer = asyncd.post(&format!("/v1/tasks/{id}/{path}"), body).await;
            assert_eq!(refused(&answer), baseline, "{path} with {token:?}");
        }
    }
    // The header form is checked the same way.
    let answer = asyncd
        .http
        .post(asyncd.url(&format!("/v1/tasks/{id}/result")))
        .header("Asyncd-Lease-Token", &first.lease_token)
        .json(&json!({"status": "success"}))
        .send()
        .await
        .unwrap();
    let status = answer.status().as_u16();
    assert_eq!(
        (status, answer.json::<Value>().await.unwrap().to_string()),
        baseline
    );
    // Another task's own token works on that task only.
    let (status, _) = asyncd
        .post(
            &format!("/v1/tasks/{other}/heartbeat"),
            json!({"lease_token": other_call.lease_token}),
        )
        .await;
    assert_eq!(status, 200);

    let after = asyncd.task(&id).await;
    for field in ["state", "attempt", "lease_until", "result", "last_error"] {
        assert_eq!(after[field], before[field], "{field} changed");
    }
    let (status, answer) = asyncd
        .post(
            &format!("/v1/tasks/{id}/result"),
            json!({"lease_token": second.lease_token, "status": "success", "output": "real"}),
        )
        .await;
    assert_eq!((status, answer["state"].as_str()), (200, Some("succeeded")));
    assert_eq!(asyncd.task(&id).await["result"], "real");
    // Once finished, its own token answers like any other refused one.
    let answer = asyncd
        .post(
            &format!("/v1/tasks/{id}/heartbeat"),
            json!({"lease_token": second.lease_token}),
        )
        .await;
    assert_eq!(refused(&answer), baseline);
}

#[tokio::test]
async fn sqlite_forged_callbacks_are_refused_and_change_nothing() {
    forged_callbacks_are_refused_and_change_nothing(None).await;
}

#[tokio::test]
async fn mariadb_forged_callbacks_are_refused_and_change_nothing() {
    let Some(url) = fresh_database(Service::MariaDb).await else {
        return;
    };
    forged_callbacks_are_refused_and_change_nothing(Some(url)).await;
}

#[tokio::test]
async fn postgres_forged_callbacks_are_refused_and_change_nothing() {
    let Some(url) = fresh_database(Service::Postgres).await else {
        return;
    };
    forged_callbacks_are_refused_and_change_nothing(Some(url)).await;
}

/// Issue 15: cancelling a running task revokes its attempt's lease. The executor learns
/// it on its next heartbeat (and its result) as `410 task_cancelled` — not the `409
/// stale_lease` of a forged or outdated token —, nothing it sends is recorded, and the
/// task's unique key is free at once.
async fn a_running_task_is_cancelled_and_its_attempt_told(store_url: Option<String>) {
    let executor = Executor::start(|_| Answer::status(202).with_body(r#"{"lease":"60s"}"#)).await;
    let mut asyncd = InProcess::start_with(&long_job(&executor, ""), |settings| {
        settings.clock = Arc::new(SystemClock);
        if let Some(url) = store_url {
            settings.store_url = url;
        }
    })
    .await;
    let id = asyncd
        .submit(json!({"type": "work", "payload": {"n": 1}, "unique_key": "order:1"}))
        .await;
    let call = executor.wait_calls(&id, 1).await.remove(0);
    asyncd.finished(&id).await;
    wait_for("the attempt to run", DEADLINE, async || {
        (asyncd.task(&id).await["state"] == "running").then_some(())
    })
    .await;

    let (status, answer) = asyncd.delete(&format!("/v1/tasks/{id}")).await;
    assert_eq!(
        (status, answer["state"].as_str()),
        (200, Some("cancelled")),
        "{answer}"
    );

    for (path, body) in [
        ("heartbeat", json!({"lease_token": call.lease_token})),
        (
            "result",
            json!({"lease_token": call.lease_token, "status": "success", "output": "late"}),
        ),
    ] {
        let (status, answer) = asyncd.post(&format!("/v1/tasks/{id}/{path}"), body).await;
        assert_eq!(status, 410, "{path}: {answer}");
        assert_eq!(
            answer["error"]["code"], "task_cancelled",
            "{path}: {answer}"
        );
    }
    let (status, answer) = asyncd
        .post(
            &format!("/v1/tasks/{id}/heartbeat"),
            json!({"lease_token": "0".repeat(64)}),
        )
        .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (409, Some("stale_lease")),
        "only the cancelled attempt's own token learns of the cancel"
    );
    let task = asyncd.task(&id).await;
    assert_eq!(task["state"], "cancelled");
    assert_eq!(
        task["result"],
        Value::Null,
        "the late result is not recorded"
    );
    let (status, answer) = asyncd.delete(&format!("/v1/tasks/{id}")).await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (409, Some("not_cancellable"))
    );
    let next = asyncd
        .submit(
            json!({"type": "work", "payload": {"n": 2}, "unique_key": "order:1", "delay": "1h"}),
        )
        .await;

    // Cancel by unique key: the unfinished holder of the key, whatever its id.
    let (status, answer) = asyncd
        .delete("/v1/tasks?job=test-job&unique_key=order:1")
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        (answer["id"].as_str(), answer["state"].as_str()),
        (Some(next.as_str()), Some("cancelled"))
    );
    let (status, answer) = asyncd
        .delete("/v1/tasks?job=test-job&unique_key=order:1")
        .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{answer}"
    );
    let (status, answer) = asyncd.delete("/v1/tasks?job=test-job").await;
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (400, Some("unique_key")),
        "{answer}"
    );

    // Cancel by idempotency key: on a job without a Kafka topic a keyed task has a
    // time-ordered id, found by its key.
    let keyed = asyncd
        .submit(json!({"type": "work", "payload": {"n": 3}, "idempotency_key": "order-3", "delay": "1h"}))
        .await;
    let (status, answer) = asyncd
        .delete("/v1/tasks?job=test-job&idempotency_key=order-3")
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        (answer["id"].as_str(), answer["state"].as_str()),
        (Some(keyed.as_str()), Some("cancelled"))
    );
    let (status, answer) = asyncd
        .delete("/v1/tasks?job=test-job&idempotency_key=order-4")
        .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (404, Some("not_found")),
        "no task holds the key: {answer}"
    );
}

#[tokio::test]
async fn sqlite_a_running_task_is_cancelled_and_its_attempt_told() {
    a_running_task_is_cancelled_and_its_attempt_told(None).await;
}

#[tokio::test]
async fn mariadb_a_running_task_is_cancelled_and_its_attempt_told() {
    let Some(url) = fresh_database(Service::MariaDb).await else {
        return;
    };
    a_running_task_is_cancelled_and_its_attempt_told(Some(url)).await;
}

#[tokio::test]
async fn postgres_a_running_task_is_cancelled_and_its_attempt_told() {
    let Some(url) = fresh_database(Service::Postgres).await else {
        return;
    };
    a_running_task_is_cancelled_and_its_attempt_told(Some(url)).await;
}

const SIGNING: &str = "  executor:\n    url: URL\n    signing:\n      secretRef:\n        name: test-signing\n        keys: [current, previous]\n";

/// The job `signed` (task type `work`), signing with `test-signing`, and the unsigned
/// job `plain` (task type `plain`), both calling `executor`.
fn signed_job(executor: &Executor) -> Vec<(&'static str, String)> {
    vec![
        (
            "job.yaml",
            format!(
                "apiVersion: asyncd.example.io/v1\nkind: AsyncJobConfig\nmetadata:\n  name: signed\nspec:\n  taskType: work\n{}",
                SIGNING.replace("URL", &executor.url())
            ),
        ),
        (
            "plain.yaml",
            job_yaml("plain", "plain", &executor.url(), ""),
        ),
    ]
}

fn signed_call(call: &Call) -> SignedCall<'_> {
    let h = |name: &str| call.headers.get(name).map_or("", String::as_str);
    SignedCall {
        timestamp: h("asyncd-timestamp"),
        task_id: h("asyncd-task-id"),
        attempt: h("asyncd-attempt"),
        idempotency_key: h("idempotency-key"),
        lease_token: h("asyncd-lease-token"),
        callback_url: h("asyncd-callback-url"),
        body: &call.raw,
    }
}

/// A job with two keys (a rotation) signs every call with both, over the documented
/// string; an executor holding either key accepts it and one holding neither does not.
#[tokio::test]
async fn calls_are_signed_over_the_canonical_string_with_each_key() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let keys = tempfile::tempdir().unwrap();
    let secret = keys.path().join("test-signing");
    std::fs::create_dir(&secret).unwrap();
    std::fs::write(secret.join("current"), "new-key").unwrap();
    std::fs::write(secret.join("previous"), "old-key").unwrap();
    let dir = keys.path().to_path_buf();
    let asyncd = InProcess::start_with(&signed_job(&executor), |settings| {
        settings.dispatcher.signing_dir = dir;
    })
    .await;
    let id = asyncd
        .submit(json!({"type": "work", "payload": {"x": 1}, "idempotency_key": "idem-1"}))
        .await;
    let call = executor.wait_calls(&id, 1).await.remove(0);
    let signed = signed_call(&call);
    assert_eq!(
        (signed.task_id, signed.attempt, signed.idempotency_key),
        (id.as_str(), "1", "idem-1")
    );
    assert_eq!(signed.callback_url, format!("http://{}", asyncd.addr));
    let signature = call.headers["asyncd-signature"].as_str();
    assert_eq!(
        signature
            .split(',')
            .filter(|s| s.starts_with("v2="))
            .count(),
        2,
        "{signature}"
    );
    let now = SystemTime::now();
    for key in [b"new-key".as_slice(), b"old-key"] {
        assert_eq!(
            verify_signature(&[key], Some(signature), &signed, now),
            Ok(())
        );
    }
    assert!(verify_signature(&[b"other-key"], Some(signature), &signed, now).is_err());
    // The first value is the primary key's.
    let primary = asyncd_contract::sign(&[b"new-key"], &signed).unwrap();
    assert!(signature.starts_with(&primary), "{signature}");
}

/// A job whose signing Secret is missing is not dispatched — its task waits, pending,
/// with a metric and `/readyz` saying why — and runs, signed, once the key appears; an
/// empty key is as good as missing.
#[tokio::test]
async fn a_job_without_its_signing_secret_waits_until_the_secret_appears() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let keys = tempfile::tempdir().unwrap();
    let dir = keys.path().to_path_buf();
    let asyncd = InProcess::start_with(&signed_job(&executor), |settings| {
        settings.dispatcher.signing_dir = dir;
    })
    .await;
    let id = asyncd.submit(task("work", json!({}))).await;
    let unavailable = "asyncd_signing_unavailable{job=\"signed\"} 1";
    wait_for("the missing secret to be reported", DEADLINE, async || {
        asyncd.metrics().await.contains(unavailable).then_some(())
    })
    .await;
    let (status, body) = asyncd.get("/readyz").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("signing_unavailable"))
    );
    let why = body["error"]["message"].as_str().unwrap();
    assert!(
        why.starts_with(
            "job signed is not dispatched: key \"current\" of signing Secret \"test-signing\""
        ),
        "{why}"
    );
    let secret = keys.path().join("test-signing");
    std::fs::create_dir(&secret).unwrap();
    std::fs::write(secret.join("current"), "new-key").unwrap();
    std::fs::write(secret.join("previous"), "").unwrap();
    // Still unavailable with an empty key, while another job's task runs meanwhile.
    let plain = asyncd.submit(task("plain", json!({}))).await;
    asyncd.wait_state(&plain, "succeeded").await;
    assert!(asyncd.metrics().await.contains(unavailable));
    assert_eq!(asyncd.task(&id).await["state"], "pending");
    assert_eq!(asyncd.task(&id).await["attempt"], 0);
    assert!(executor.calls_for(&id).is_empty(), "never called unsigned");

    std::fs::write(secret.join("previous"), "old-key").unwrap();
    let done = asyncd.wait_state(&id, "succeeded").await;
    assert_eq!(done["attempt"], 1, "waiting cost no attempt");
    let call = executor.calls_for(&id).remove(0);
    assert_eq!(
        verify_signature(
            &[b"old-key"],
            Some(&call.headers["asyncd-signature"]),
            &signed_call(&call),
            SystemTime::now()
        ),
        Ok(())
    );
    assert!(
        asyncd
            .metrics()
            .await
            .contains("asyncd_signing_unavailable{job=\"signed\"} 0")
    );
    assert_eq!(asyncd.get("/readyz").await.0, 200);
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
    let again = asyncd.run_when_due(&id).await;
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
