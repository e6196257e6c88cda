//! `--auth tokens` against the `dev` role in-process: every public endpoint refuses a
//! missing, wrong, expired and out-of-scope credential; a caller never learns whether a
//! task of a job it may not read exists; the executor callbacks and the operational
//! endpoints need no credential; roles without the API serve no public endpoint; and no
//! auth off loopback refuses to start. The same against a real kube-apiserver is in
//! e2e/operator.sh.

use std::sync::Arc;

use asyncd::auth::tokens::hash;
use asyncd::clock::ManualClock;
use asyncd::wiring::{self, AuthSettings, Parts, RoleError};
use reqwest::Method;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::support::*;

const ADMIN: &str = "t-admin";
const TEAM_A: &str = "t-team-a";
const READ_A: &str = "t-read-a";
const EXPIRED: &str = "t-expired";
const TEAM_B: &str = "t-team-b";
const SUBMIT_B: &str = "t-submit-b";

fn tokens_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("tokens.yaml");
    let text = format!(
        r#"tokens:
  - {{name: admin, sha256: "{}", jobs: ["*"], verbs: ["*"]}}
  - {{name: team-a, sha256: "{}", jobs: [job-a], verbs: [submit, read, cancel, redrive]}}
  - {{name: reader-a, sha256: "{}", jobs: [job-a], verbs: [read]}}
  - {{name: expired, sha256: "{}", jobs: ["*"], verbs: ["*"], expires: "2020-01-01T00:00:00Z"}}
  - {{name: team-b, sha256: "{}", jobs: [job-b], verbs: [submit, read, cancel]}}
  - {{name: submitter-b, sha256: "{}", jobs: [job-b], verbs: [submit]}}
"#,
        hash(ADMIN),
        hash(TEAM_A),
        hash(READ_A),
        hash(EXPIRED),
        hash(TEAM_B),
        hash(SUBMIT_B)
    );
    std::fs::write(&path, text).unwrap();
    path
}

async fn call(
    asyncd: &InProcess,
    method: Method,
    path: &str,
    body: Option<Value>,
    token: Option<&str>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new().request(method, asyncd.url(path));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let answer = request.send().await.unwrap();
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

fn authorized(token: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {token}").parse().unwrap(),
    );
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap()
}

/// A dev role with tokens, jobs `job-a` (type `a`) and `job-b` (type `b`), whose executor
/// fails every attempt for good, so tasks end in dead letters at once.
async fn start() -> (InProcess, Executor, tempfile::TempDir) {
    let executor = Executor::start(|_| Answer::status(400)).await;
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
    let secrets = tempfile::tempdir().unwrap();
    let file = tokens_file(secrets.path());
    let mut asyncd = InProcess::start_with(&jobs, |s| s.auth = AuthSettings::Tokens(file)).await;
    asyncd.http = authorized(ADMIN);
    (asyncd, executor, secrets)
}

#[tokio::test]
async fn every_public_endpoint_refuses_missing_wrong_expired_and_out_of_scope_credentials() {
    let (mut asyncd, _executor, _secrets) = start().await;
    let a = asyncd.submit(json!({"type": "a"})).await;
    let b = asyncd.submit(json!({"type": "b"})).await;
    for id in [&a, &b] {
        asyncd.wait_state(id, "dead").await;
    }
    let a_pending = asyncd.submit(json!({"type": "a", "delay": "1h"})).await;
    let b_pending = asyncd.submit(json!({"type": "b", "delay": "1h"})).await;

    // (method, path, body, in scope for team-a?)
    let endpoints = [
        (
            Method::POST,
            "/v1/tasks".to_string(),
            Some(json!({"type": "b"})),
        ),
        (
            Method::POST,
            "/v1/tasks:batch".to_string(),
            Some(json!({"tasks": [{"type": "b"}]})),
        ),
        (Method::GET, format!("/v1/tasks/{b}"), None),
        (Method::DELETE, format!("/v1/tasks/{b_pending}"), None),
        (Method::GET, "/v1/tasks?type=b".to_string(), None),
        (Method::GET, "/v1/tasks".to_string(), None),
        (Method::GET, "/v1/dead-letters?type=b".to_string(), None),
        (Method::GET, "/v1/dead-letters".to_string(), None),
        (Method::POST, format!("/v1/dead-letters/{b}/redrive"), None),
        // The admin's pause is undone by its resume, the next endpoint.
        (Method::POST, "/v1/jobs/job-b/pause".to_string(), None),
        (Method::POST, "/v1/jobs/job-b/resume".to_string(), None),
        (Method::GET, "/v1/jobs/job-b".to_string(), None),
    ];
    for (method, path, body) in &endpoints {
        for (token, why) in [
            (None, "a bearer token is required"),
            (Some("not-a-token"), "unknown bearer token"),
            (Some(EXPIRED), "expired"),
        ] {
            let (status, answer) = call(&asyncd, method.clone(), path, body.clone(), token).await;
            assert_eq!(status, 401, "{method} {path} with {token:?}: {answer}");
            assert_eq!(answer["error"]["code"], "unauthenticated", "{answer}");
            assert!(
                answer["error"]["message"].as_str().unwrap().contains(why),
                "{method} {path}: {answer}"
            );
        }
        // A credential in the wrong scheme is no credential.
        let answer = reqwest::Client::new()
            .request(method.clone(), asyncd.url(path))
            .basic_auth("admin", Some(ADMIN))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 401, "{method} {path} with Basic");

        // team-a's token on job-b's tasks: refused, and nothing changed (checked below).
        let (status, answer) =
            call(&asyncd, method.clone(), path, body.clone(), Some(TEAM_A)).await;
        let expected = match (method.as_str(), path.as_str()) {
            // Task ids of a job the caller cannot read answer as unknown ids.
            ("GET" | "DELETE", p) | ("POST", p)
                if p.starts_with("/v1/tasks/") || p.contains("/redrive") =>
            {
                404
            }
            // A batch answers 200 with the item refused.
            ("POST", "/v1/tasks:batch") => 200,
            _ => 403,
        };
        assert_eq!(status, expected, "{method} {path} out of scope: {answer}");
        match status {
            404 => {
                let id = path.split('/').nth(3).unwrap();
                let (_, unknown) = call(
                    &asyncd,
                    method.clone(),
                    &path.replace(id, "0193a8d2-0000-7000-8000-000000000000"),
                    body.clone(),
                    Some(TEAM_A),
                )
                .await;
                assert_eq!(
                    answer.to_string().replace(id, "ID"),
                    unknown
                        .to_string()
                        .replace("0193a8d2-0000-7000-8000-000000000000", "ID"),
                    "a hidden task answers exactly as an unknown id"
                );
            }
            200 => {
                assert_eq!(answer["results"][0]["status"], 403, "{answer}");
                assert_eq!(answer["results"][0]["error"]["code"], "forbidden");
            }
            _ => {
                assert_eq!(answer["error"]["code"], "forbidden", "{answer}");
            }
        }

        // The operator's token does it.
        let (status, answer) = call(&asyncd, method.clone(), path, body.clone(), Some(ADMIN)).await;
        assert!(status < 300, "{method} {path} as admin: {status} {answer}");
        // Undo what the admin call did, so the next endpoint sees the same tasks.
        if path.contains("/redrive") {
            asyncd.wait_state(&b, "dead").await;
        }
    }
    assert_eq!(
        asyncd.task(&b_pending).await["state"],
        "cancelled",
        "by the admin only"
    );

    // In scope: team-a does each of these on job-a.
    asyncd.http = authorized(TEAM_A);
    asyncd.submit(json!({"type": "a"})).await;
    assert_eq!(asyncd.task(&a).await["state"], "dead");
    let (status, listing) = asyncd.get("/v1/dead-letters?type=a").await;
    assert_eq!(status, 200, "{listing}");
    assert!(
        listing["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["id"] == a)
    );
    assert_eq!(
        asyncd.delete(&format!("/v1/tasks/{a_pending}")).await.0,
        200
    );
    let (status, answer) = asyncd
        .post(&format!("/v1/dead-letters/{a}/redrive"), json!({}))
        .await;
    assert_eq!(status, 200, "{answer}");

    // A reader of job-a sees its tasks but may not change them: 403, not 404.
    let (status, answer) = call(
        &asyncd,
        Method::DELETE,
        &format!("/v1/tasks/{a}"),
        None,
        Some(READ_A),
    )
    .await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (403, &json!("forbidden")),
        "{answer}"
    );
    let (status, _) = call(
        &asyncd,
        Method::GET,
        &format!("/v1/tasks/{a}"),
        None,
        Some(READ_A),
    )
    .await;
    assert_eq!(status, 200);
    let (status, answer) = call(
        &asyncd,
        Method::POST,
        "/v1/tasks",
        Some(json!({"type": "a"})),
        Some(READ_A),
    )
    .await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (403, &json!("forbidden")),
        "{answer}"
    );
    // Pausing its own job needs the pause verb, which team-a lacks; reading it does not.
    let (status, answer) = call(
        &asyncd,
        Method::POST,
        "/v1/jobs/job-a/pause",
        None,
        Some(TEAM_A),
    )
    .await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (403, &json!("forbidden")),
        "{answer}"
    );
    let (status, answer) = call(&asyncd, Method::GET, "/v1/jobs/job-a", None, Some(READ_A)).await;
    assert_eq!(
        (status, &answer["paused"]),
        (200, &json!(false)),
        "{answer}"
    );
}

/// Issue 31, reproductions 2–4: keys live inside their job, a dependency on another
/// job's task is answered as an unknown one, and a refusal names the task holding a
/// key only to a caller who may read it.
#[tokio::test]
async fn one_jobs_keys_and_tasks_neither_block_nor_reveal_anothers() {
    let (asyncd, _executor, _secrets) = start().await;
    let submit = |body: Value, token: &'static str| {
        let asyncd = &asyncd;
        async move { call(asyncd, Method::POST, "/v1/tasks", Some(body), Some(token)).await }
    };
    let later = "1h";

    // 2. The same idempotency key on two jobs: two tasks, neither refused.
    let (status, b) = submit(
        json!({"type": "b", "delay": later, "idempotency_key": "order-42"}),
        TEAM_B,
    )
    .await;
    assert_eq!(status, 201, "{b}");
    let b_id = b["id"].as_str().unwrap().to_string();
    let (status, a) = submit(
        json!({"type": "a", "delay": later, "idempotency_key": "order-42"}),
        TEAM_A,
    )
    .await;
    assert_eq!(
        (status, a["duplicate"].as_bool()),
        (201, Some(false)),
        "{a}"
    );
    assert_ne!(a["id"], b["id"]);

    // 3. The same unique key on two jobs.
    let (status, held) = submit(
        json!({"type": "b", "delay": later, "unique_key": "order:42"}),
        TEAM_B,
    )
    .await;
    assert_eq!(status, 201, "{held}");
    let (status, answer) = submit(
        json!({"type": "a", "delay": later, "unique_key": "order:42"}),
        TEAM_A,
    )
    .await;
    assert_eq!(status, 201, "{answer}");

    // 4. A dependency on another job's task is answered as one on no task at all.
    let (status, answer) = submit(json!({"type": "a", "depends_on": [b_id]}), TEAM_A).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["field"], "depends_on");
    assert_eq!(
        answer["error"]["message"],
        format!("depends_on: no task {b_id}"),
        "the same answer as for an id nobody holds"
    );
    let unknown = uuid::Uuid::now_v7().to_string();
    let (status, answer) = submit(json!({"type": "a", "depends_on": [unknown]}), TEAM_A).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(
        answer["error"]["message"],
        format!("depends_on: no task {unknown}")
    );
    let a_id = a["id"].as_str().unwrap();
    let (status, answer) = submit(
        json!({"type": "a", "delay": later, "depends_on": [a_id]}),
        TEAM_A,
    )
    .await;
    assert_eq!(status, 201, "a dependency the caller may read: {answer}");

    // The holder of a key is named to whoever may read the job, and only to them.
    let reused = json!({"type": "b", "delay": later, "idempotency_key": "order-42", "payload": {"other": 1}});
    let (status, answer) = submit(reused.clone(), TEAM_B).await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["error"]["existing_id"], b_id.as_str());
    let (status, answer) = submit(reused, SUBMIT_B).await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["error"]["code"], "idempotency_mismatch");
    assert!(answer["error"].get("existing_id").is_none(), "{answer}");
    assert!(
        !answer.to_string().contains(&b_id),
        "a caller who may not read job-b learns no id of it: {answer}"
    );
    let (status, answer) = submit(
        json!({"type": "b", "delay": later, "unique_key": "order:42"}),
        SUBMIT_B,
    )
    .await;
    assert_eq!(status, 409, "{answer}");
    assert!(answer["error"].get("existing_id").is_none(), "{answer}");
}

#[tokio::test]
async fn a_deleted_tokens_file_revokes_every_token_until_a_valid_one_is_back() {
    let (asyncd, _executor, secrets) = start().await;
    let jobs = |asyncd: &InProcess| {
        let request = asyncd.http.get(asyncd.url("/v1/jobs")).send();
        async move { request.await.unwrap().status().as_u16() }
    };
    assert_eq!(jobs(&asyncd).await, 200);
    // Reproduction 5: the file goes; within the reload check the token stops working.
    let file = secrets.path().join("tokens.yaml");
    std::fs::remove_file(&file).unwrap();
    wait_for(
        "the deleted file's tokens to be refused",
        DEADLINE,
        async || (jobs(&asyncd).await == 401).then_some(()),
    )
    .await;
    let (status, body) = call(&asyncd, Method::GET, "/v1/jobs", None, Some(ADMIN)).await;
    assert_eq!(status, 401);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("missing or invalid"),
        "{body}"
    );
    tokens_file(secrets.path());
    wait_for("a valid file to restore the tokens", DEADLINE, async || {
        (jobs(&asyncd).await == 200).then_some(())
    })
    .await;
}

#[tokio::test]
async fn the_jobs_overview_lists_only_the_jobs_a_caller_may_read() {
    let (asyncd, _executor, _secrets) = start().await;
    let listed = |answer: &Value| -> Vec<String> {
        answer["jobs"]
            .as_array()
            .unwrap_or_else(|| panic!("{answer}"))
            .iter()
            .map(|j| j["job"].as_str().unwrap().to_string())
            .collect()
    };
    let (status, answer) = call(&asyncd, Method::GET, "/v1/jobs", None, None).await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (401, &json!("unauthenticated")),
        "{answer}"
    );
    let (status, answer) = call(&asyncd, Method::GET, "/v1/jobs", None, Some(ADMIN)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(listed(&answer), ["job-a", "job-b"]);
    let (status, answer) = call(&asyncd, Method::GET, "/v1/jobs", None, Some(READ_A)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(listed(&answer), ["job-a"], "job-b is not theirs to read");
}

#[tokio::test]
async fn callbacks_and_operational_endpoints_need_no_credential() {
    let (asyncd, _executor, _secrets) = start().await;
    for path in ["/healthz", "/readyz", "/metrics", "/v1/openapi.json"] {
        let (status, _) = call(&asyncd, Method::GET, path, None, None).await;
        assert_eq!(status, 200, "{path}");
    }
    // Refused for the lease token (an unknown task answers as a wrong token does), not
    // for want of a bearer token.
    for (path, body) in [
        ("/v1/tasks/x/heartbeat", json!({"lease_token": "guessed"})),
        (
            "/v1/tasks/x/result",
            json!({"lease_token": "guessed", "status": "success"}),
        ),
    ] {
        let (status, answer) = call(&asyncd, Method::POST, path, Some(body), None).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (409, Some("stale_lease")),
            "{path}: {answer}"
        );
        assert_ne!(answer["error"]["message"], "no such endpoint", "{path}");
    }
}

#[tokio::test]
async fn roles_without_the_api_serve_no_public_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("jobs")).unwrap();
    for parts in [
        Parts {
            api: false,
            dispatcher: true,
            scheduler: false,
        },
        Parts {
            api: false,
            dispatcher: false,
            scheduler: true,
        },
    ] {
        let mut settings = settings(&dir, ManualClock::at(chrono::Utc::now()));
        // /readyz compares a dispatcher's clock with the store's.
        settings.clock = Arc::new(asyncd::clock::SystemClock);
        let shutdown = CancellationToken::new();
        let running = wiring::start(settings, parts, shutdown.clone())
            .await
            .unwrap();
        let http = reqwest::Client::new();
        let url = |path: &str| format!("http://{}{path}", running.addr());
        for (method, path) in [
            (Method::POST, "/v1/tasks"),
            (Method::POST, "/v1/tasks:batch"),
            (Method::GET, "/v1/tasks"),
            (Method::GET, "/v1/tasks/x"),
            (Method::DELETE, "/v1/tasks/x"),
            (Method::GET, "/v1/dead-letters"),
            (Method::POST, "/v1/dead-letters/x/redrive"),
        ] {
            let answer = http
                .request(method.clone(), url(path))
                .body("{}")
                .send()
                .await
                .unwrap();
            let status = answer.status().as_u16();
            let body: Value = answer.json().await.unwrap();
            assert_eq!(
                (status, body["error"]["message"].as_str()),
                (404, Some("no such endpoint")),
                "{parts:?} {method} {path}"
            );
        }
        for path in ["/healthz", "/readyz", "/metrics"] {
            assert_eq!(
                http.get(url(path)).send().await.unwrap().status(),
                200,
                "{path}"
            );
        }
        let answer = http
            .post(url("/v1/tasks/x/result"))
            .json(&json!({"lease_token": 2, "status": "success"}))
            .send()
            .await
            .unwrap();
        let body: Value = answer.json().await.unwrap();
        assert_ne!(
            body["error"]["message"], "no such endpoint",
            "callbacks are served"
        );
        shutdown.cancel();
        running.wait().await.unwrap();
    }
}

#[tokio::test]
async fn no_auth_off_loopback_refuses_to_start_unless_insecure() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("jobs")).unwrap();
    let clock: Arc<ManualClock> = ManualClock::at(chrono::Utc::now());
    let mut refused = settings(&dir, clock.clone());
    refused.listen = "0.0.0.0:0".parse().unwrap();
    refused.advertise_url = Some("http://127.0.0.1:7700".into());
    let err = match wiring::start(refused.clone(), Parts::ALL, CancellationToken::new()).await {
        Ok(_) => panic!("started without auth on 0.0.0.0"),
        Err(err) => err,
    };
    assert!(matches!(err, RoleError::Auth(_)), "{err:?}");
    assert!(err.to_string().contains("--insecure-no-auth"), "{err}");

    // A dispatcher serves no public API, so it needs no auth there.
    let dispatcher = Parts {
        api: false,
        dispatcher: true,
        scheduler: false,
    };
    let shutdown = CancellationToken::new();
    let running = wiring::start(refused.clone(), dispatcher, shutdown.clone())
        .await
        .unwrap();
    shutdown.cancel();
    running.wait().await.unwrap();

    let mut insecure = refused;
    insecure.auth = AuthSettings::None { insecure: true };
    let shutdown = CancellationToken::new();
    let running = wiring::start(insecure, Parts::ALL, shutdown.clone())
        .await
        .unwrap();
    shutdown.cancel();
    running.wait().await.unwrap();
}

#[test]
fn the_binary_says_why_it_refuses_no_auth_off_loopback_and_hashes_tokens() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("jobs")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_asyncd"))
        .args([
            "dev",
            "--listen",
            "0.0.0.0:0",
            "--advertise-url",
            "http://127.0.0.1:1",
        ])
        .arg("--config")
        .arg(dir.path().join("jobs"))
        .arg("--db")
        .arg(dir.path().join("asyncd.db"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--auth none on 0.0.0.0:0") && stderr.contains("--insecure-no-auth"),
        "{stderr}"
    );

    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_asyncd"))
        .arg("hash-token")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"test\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    );
}
