//! The README's "Changing a task before it runs": a task due in an hour gets a new
//! payload and is made due now, keeping its id, and runs; a change after that is refused
//! as `task_started`. `sdk/readme_test.py` checks that the README's block is this
//! file's and runs it against `asyncd dev`.
//!
//! ```text
//! cargo run -p asyncd-client --example change
//! ```

use std::time::Duration;

use asyncd_client::{Change, Client, ErrorCode, Executor, Outcome, Task, TaskContext, TaskState};
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize)]
struct CancelOrder {
    order_id: u64,
    reason: String,
}

async fn cancel_expired_order(_ctx: TaskContext, order: CancelOrder) -> Result<(), Outcome> {
    println!("cancel order {} ({})", order.order_id, order.reason);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let app = Executor::new()
        .signing_secret("dev-secret")
        .register("cancel_expired_order", cancel_expired_order)
        .into_router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
    tokio::spawn(async move { axum::serve(listener, app).await });

    let client = Client::builder()
        .endpoint("http://127.0.0.1:7700")
        .build()?;
    let task = Task::new(
        "cancel_expired_order",
        json!({"order_id": 14, "reason": "expired"}),
    )
    .idempotency_key("order-14-cancel");
    let res = client
        .submit_delayed(&task, Duration::from_secs(3600))
        .await?;
    println!("submitted {}, due {}", res.id, res.eta);
    let change = Change {
        payload: Some(json!({"order_id": 14, "reason": "customer asked"})),
        run_now: true,
        ..Change::default()
    };
    let changed = client.change(&res.id, &change).await?;
    assert_eq!(changed.id, res.id, "a change keeps the task's id");
    println!(
        "changed {}: due {}, payload {}",
        changed.id, changed.eta, changed.payload
    );
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
        "task {}: {} after {} attempt(s)",
        done.id, done.state, done.attempt
    );
    if done.state != TaskState::Succeeded {
        return Err(format!("task {} is {}: {:?}", done.id, done.state, done.last_error).into());
    }
    // Too late now: the task has run.
    let again = Change {
        run_now: true,
        ..Change::default()
    };
    match client.change(&res.id, &again).await {
        Err(e) if e.is(&ErrorCode::TaskStarted) => println!("change again: {e}"),
        other => return Err(format!("want task_started, got {other:?}").into()),
    }
    Ok(())
}
