//! The README's long-running example, run against `asyncd dev` by
//! `sdk/readme_test.py` (see sdk/rust/README.md).

use std::time::Duration;

use asyncd_client::{Client, Executor, Outcome, Task, TaskContext, TaskState};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Deserialize)]
struct Report {
    month: String,
}

#[derive(Serialize)]
struct Summary {
    month: String,
    rows: u64,
}

async fn build_report(_ctx: TaskContext, report: Report) -> Result<Summary, Outcome> {
    tokio::time::sleep(Duration::from_millis(500)).await; // the long work
    Ok(Summary {
        month: report.month,
        rows: 1234,
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_target(false).init();
    let executor = Executor::new()
        .signing_secret("dev-secret")
        .register_long_running("build_report", Duration::from_secs(30), build_report);
    let in_flight = executor.in_flight();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
    let app = executor.into_router();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let client = Client::builder()
        .endpoint("http://127.0.0.1:7700")
        .build()?;
    let task =
        Task::new("build_report", json!({"month": "2026-11"})).idempotency_key("report-2026-11");
    let res = client.submit(&task).await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let done = loop {
        let t = client.get(&res.id).await?;
        if t.state.is_final() {
            break t;
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("task {} is still {}", t.id, t.state).into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "report {}: {}, result {:?}, last error {:?}",
        done.id, done.state, done.result, done.last_error
    );
    server.abort();
    in_flight.wait().await; // on shutdown: let running handlers post their results
    if done.state != TaskState::Succeeded
        || done.result != Some(json!({"month": "2026-11", "rows": 1234}))
    {
        return Err("the report did not succeed with its summary".into());
    }
    Ok(())
}
