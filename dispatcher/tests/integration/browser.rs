//! What a web page in the developer's browser can do to `asyncd dev` (issue 31,
//! reproductions 6 and 7): a cross-site form or `fetch` may not submit, pause or purge
//! (`Origin`, `Content-Type`), and after DNS rebinding a page may not read anything
//! (`Host`), while the built-in console, the SDKs and curl with JSON keep working.

use asyncd::auth::tokens::hash;
use asyncd::wiring::{AuthSettings, BrowserSettings};
use reqwest::header::{CONTENT_TYPE, HOST, ORIGIN};
use serde_json::{Value, json};

use crate::support::*;

async fn dev(adjust: impl FnOnce(&mut asyncd::wiring::Settings)) -> (InProcess, Executor) {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start_with(&one_job(&executor, ""), adjust).await;
    (asyncd, executor)
}

async fn answer(request: reqwest::RequestBuilder) -> (u16, Value) {
    let answer = request.send().await.unwrap();
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

fn message(body: &Value) -> &str {
    body["error"]["message"].as_str().unwrap_or_default()
}

async fn task_count(asyncd: &InProcess) -> usize {
    let (status, page) = asyncd.get("/v1/tasks").await;
    assert_eq!(status, 200, "{page}");
    page["items"].as_array().unwrap().len()
}

#[tokio::test]
async fn a_cross_site_text_plain_post_creates_nothing() {
    let (asyncd, _executor) = dev(|_| {}).await;
    let task = json!({"type": "work", "payload": {"n": 1}}).to_string();
    // Reproduction 6: what a form or a no-cors fetch on https://evil.example sends.
    let (status, body) = answer(
        asyncd
            .http
            .post(asyncd.url("/v1/tasks"))
            .header(ORIGIN, "https://evil.example")
            .header(CONTENT_TYPE, "text/plain;charset=UTF-8")
            .body(task.clone()),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(message(&body).contains("https://evil.example"), "{body}");
    // A browser that sends no Origin still cannot send a body the API reads as JSON.
    let (status, body) = answer(
        asyncd
            .http
            .post(asyncd.url("/v1/tasks"))
            .header(CONTENT_TYPE, "text/plain")
            .body(task.clone()),
    )
    .await;
    assert_eq!(status, 415, "{body}");
    assert!(message(&body).starts_with("Content-Type:"), "{body}");
    assert_eq!(task_count(&asyncd).await, 0, "no task was created");

    // Bodiless writes from another site: pause and purge refused too.
    for path in ["/v1/jobs/test-job/pause", "/v1/dead-letters/purge"] {
        let (status, body) = answer(
            asyncd
                .http
                .post(asyncd.url(path))
                .header(ORIGIN, "https://evil.example"),
        )
        .await;
        assert_eq!(status, 403, "{path}: {body}");
    }
    let (_, job) = asyncd.get("/v1/jobs/test-job").await;
    assert_eq!(job["paused"], false, "{job}");

    // The listener's own origin (the console) and plain clients keep working.
    let own = format!("http://{}", asyncd.addr);
    let (status, body) = answer(
        asyncd
            .http
            .post(asyncd.url("/v1/tasks"))
            .header(ORIGIN, own.clone())
            .json(&json!({"type": "work", "payload": {"n": 2}})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = answer(
        asyncd
            .http
            .post(asyncd.url("/v1/tasks"))
            .header(CONTENT_TYPE, "application/json; charset=utf-8")
            .body(json!({"type": "work", "payload": {"n": 3}}).to_string()),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    // A bodiless action sends no Content-Type at all.
    let (status, body) = answer(asyncd.http.post(asyncd.url("/v1/jobs/test-job/pause"))).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = asyncd.delete("/v1/tasks/no-such-task").await;
    assert_eq!(status, 404, "a bodiless DELETE reaches its handler: {body}");
    assert_eq!(task_count(&asyncd).await, 2);
}

#[tokio::test]
async fn a_rebound_host_reads_nothing_without_auth() {
    let (asyncd, _executor) = dev(|s| {
        s.browser = BrowserSettings {
            allowed_origins: vec![],
            allowed_hosts: vec!["asyncd.dev.test".into()],
        }
    })
    .await;
    asyncd.submit(json!({"type": "work", "payload": {}})).await;
    let read = |host: &str| {
        answer(
            asyncd
                .http
                .get(asyncd.url("/v1/tasks"))
                .header(HOST, host.to_string()),
        )
    };
    // Reproduction 7: the page's own name, now resolving to 127.0.0.1.
    let (status, body) = read(&format!("rebind.evil.example:{}", asyncd.addr.port())).await;
    assert_eq!(status, 403, "{body}");
    assert!(message(&body).contains("rebind.evil.example"), "{body}");
    assert!(body["items"].is_null(), "{body}");
    let port = asyncd.addr.port();
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("asyncd.dev.test:{port}"),
    ] {
        let (status, body) = read(&host).await;
        assert_eq!(status, 200, "{host}: {body}");
        assert_eq!(body["items"].as_array().unwrap().len(), 1);
    }
    // Probes and scrapers address the pod by IP: the operational endpoints are not guarded.
    let (status, _) = answer(
        asyncd
            .http
            .get(asyncd.url("/healthz"))
            .header(HOST, "10.1.2.3:7700"),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn with_auth_any_host_is_served_but_a_foreign_origin_is_not() {
    let secrets = tempfile::tempdir().unwrap();
    let file = secrets.path().join("tokens.yaml");
    std::fs::write(
        &file,
        format!(
            "tokens:\n  - {{name: admin, sha256: \"{}\", jobs: [\"*\"], verbs: [\"*\"]}}\n",
            hash("t-admin")
        ),
    )
    .unwrap();
    let (asyncd, _executor) = dev(|s| {
        s.auth = AuthSettings::Tokens(file);
        s.browser.allowed_origins = vec!["https://console.example:8443".into()];
    })
    .await;
    let get = |host: &str, origin: Option<&str>| {
        let mut request = asyncd
            .http
            .get(asyncd.url("/v1/tasks"))
            .bearer_auth("t-admin")
            .header(HOST, host.to_string());
        if let Some(origin) = origin {
            request = request.header(ORIGIN, origin.to_string());
        }
        answer(request)
    };
    let (status, body) = get("asyncd.team-a.svc:7700", None).await;
    assert_eq!(status, 200, "a Service name: {body}");
    let (status, body) = get("asyncd.team-a.svc:7700", Some("https://evil.example")).await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = get(
        "asyncd.team-a.svc:7700",
        Some("https://console.example:8443"),
    )
    .await;
    assert_eq!(status, 200, "an --allowed-origin: {body}");
}

#[tokio::test]
async fn the_binary_takes_allowed_origins_and_hosts_and_refuses_a_bad_origin() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = Asyncd::start(
        &one_job(&executor, ""),
        &[
            "--allowed-host",
            "asyncd.dev.test",
            "--allowed-origin",
            "https://console.example",
        ],
    )
    .await;
    let port = asyncd.addr().port();
    let (status, body) = answer(
        asyncd
            .http()
            .post(asyncd.url("/v1/tasks"))
            .header(HOST, format!("asyncd.dev.test:{port}"))
            .header(ORIGIN, "https://console.example")
            .json(&json!({"type": "work", "payload": {}})),
    )
    .await;
    assert_eq!(status, 201, "{body}");

    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("jobs")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_asyncd"))
        .args([
            "dev",
            "--listen",
            "127.0.0.1:0",
            "--allowed-origin",
            "console.example",
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
        stderr.contains("--allowed-origin \"console.example\" is not an origin"),
        "{stderr}"
    );
}
