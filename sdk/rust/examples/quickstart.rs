//! The README's quickstart: serves the executor for `cancel_expired_order` on
//! 127.0.0.1:8080, submits a task due in two seconds to `asyncd dev` on
//! 127.0.0.1:7700, waits for it and prints how it ended. See sdk/rust/README.md for the
//! job config and the `asyncd dev` command line; `sdk/readme_test.py` checks that the
//! README's block is this file's and runs it.
//!
//! ```text
//! cargo run -p asyncd-client --example quickstart
//! ```

use std::time::Duration;

use asyncd_client::{Client, Executor, Outcome, RetryPolicy, Task, TaskContext, TaskState};
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize)]
struct CancelOrder {
    order_id: u64,
}

async fn cancel_expired_order(ctx: TaskContext, order: CancelOrder) -> Result<(), Outcome> {
    // A payload that does not decode into CancelOrder never gets here: it is a
    // permanent failure (422, dead letters), since no retry can fix it.
    println!(
        "cancel order {} (task {}, attempt {}, key {})",
        order.order_id, ctx.id, ctx.attempt, ctx.idempotency_key
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The executor logs every task it did not run to success through `tracing`.
    tracing_subscriber::fmt().with_target(false).init();

    // Executor side: an axum Router serving the executor contract.
    let app = Executor::new()
        .signing_secret("dev-secret") // the key in the job's signing Secret
        .register("cancel_expired_order", cancel_expired_order)
        .into_router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
    tokio::spawn(async move { axum::serve(listener, app).await });

    // Client side; retries 503s, 429s and lost connections.
    let client = Client::builder()
        .endpoint("http://127.0.0.1:7700")
        .service_name("orders")
        .retry(RetryPolicy::default())
        .build()?;
    // Useless if it has not begun within 10 minutes of its due time: then it expires.
    let task = Task::new("cancel_expired_order", json!({"order_id": 42}))
        .derive_idempotency_key(&["order_id"])?
        .start_within(Duration::from_secs(600));
    let res = client.submit_delayed(&task, Duration::from_secs(2)).await?;
    println!(
        "submitted {}, due {} (duplicate: {})",
        res.id, res.eta, res.duplicate
    );
    loop {
        let t = client.get(&res.id).await?;
        if t.state.is_final() {
            println!(
                "task {}: {} after {} attempt(s); last error: {:?}",
                t.id, t.state, t.attempt, t.last_error
            );
            if t.state != TaskState::Succeeded {
                return Err(format!("task {} is {}", t.id, t.state).into());
            }
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
