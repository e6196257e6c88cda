//! Parameters no task, job or key can have — a NUL, bytes that are not UTF-8 — are
//! refused with the API's JSON 400 naming them, alike on every store (issue 32: `GET
//! /v1/tasks/%00` answered 503 on PostgreSQL, where a NUL in text is an error, and 404 on
//! SQLite; `GET /v1/tasks/%FF` answered axum's plain-text 400).

use serde_json::Value;

use crate::support::*;

/// Each request with the field its refusal must name.
const REQUESTS: &[(&str, &str, &str)] = &[
    ("GET", "/v1/tasks/%00", "id"),
    ("GET", "/v1/tasks/a%00b", "id"),
    ("GET", "/v1/tasks/%FF", "path"),
    ("DELETE", "/v1/tasks/%00", "id"),
    ("DELETE", "/v1/tasks/%C3%28", "path"),
    ("GET", "/v1/tasks?job=test-job&unique_key=%00", "unique_key"),
    ("GET", "/v1/tasks?job=test-job&cursor=%FF", "cursor"),
    ("GET", "/v1/tasks?%FF=1", "query"),
    (
        "DELETE",
        "/v1/tasks?job=test-job&idempotency_key=k%00",
        "idempotency_key",
    ),
    ("GET", "/v1/jobs/%00", "name"),
    ("GET", "/v1/dead-letters?job=test-job&cursor=%00", "cursor"),
    ("POST", "/v1/dead-letters/%00/redrive", "id"),
    ("POST", "/v1/tasks/%FF/heartbeat", "path"),
];

async fn nul_and_bytes_that_are_not_utf8_are_refused_naming_the_parameter(backend: Backend) {
    let executor = Executor::start(|_| Answer::ok()).await;
    let Some(asyncd) = Deployment::start(backend, &one_job(&executor, "")).await else {
        return;
    };
    let http = reqwest::Client::new();
    for (method, path, field) in REQUESTS {
        let response = http
            .request(method.parse().unwrap(), asyncd.url(path))
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        assert_eq!(status, 400, "{method} {path}: {body}");
        assert_eq!(content_type, "application/json", "{method} {path}");
        assert_eq!(
            body["error"]["code"], "invalid_field",
            "{method} {path}: {body}"
        );
        assert_eq!(body["error"]["field"], *field, "{method} {path}: {body}");
    }
}

#[tokio::test]
async fn sqlite_nul_and_bytes_that_are_not_utf8_are_refused_naming_the_parameter() {
    nul_and_bytes_that_are_not_utf8_are_refused_naming_the_parameter(Backend::Sqlite).await;
}

#[tokio::test]
async fn postgres_nul_and_bytes_that_are_not_utf8_are_refused_naming_the_parameter() {
    nul_and_bytes_that_are_not_utf8_are_refused_naming_the_parameter(Backend::Server(
        Service::Postgres,
    ))
    .await;
}

#[tokio::test]
async fn mariadb_nul_and_bytes_that_are_not_utf8_are_refused_naming_the_parameter() {
    nul_and_bytes_that_are_not_utf8_are_refused_naming_the_parameter(Backend::Server(
        Service::MariaDb,
    ))
    .await;
}
