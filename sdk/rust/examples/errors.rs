//! The README's errors-and-retries example, run against `asyncd dev` by
//! `sdk/readme_test.py` (see sdk/rust/README.md).

use std::time::Duration;

use asyncd_client::{Client, ErrorCode, RetryPolicy, Task};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::builder()
        .endpoint("http://127.0.0.1:7700")
        .retry(
            RetryPolicy::new(5)
                .backoff(Duration::from_millis(200), Duration::from_secs(5))
                .on_retry(|attempt, err, wait| {
                    eprintln!("attempt {attempt} failed ({err}); retrying in {wait:?}")
                }),
        )
        .build()?;
    let key = "order-7-cancel";
    let first = Task::new("cancel_expired_order", json!({"order_id": 7})).idempotency_key(key);
    client
        .submit_delayed(&first, Duration::from_secs(3600))
        .await?;
    let other = Task::new("cancel_expired_order", json!({"order_id": 8})).idempotency_key(key);
    match client.submit(&other).await {
        Err(e) if e.is(&ErrorCode::IdempotencyMismatch) => println!(
            "key {key} belongs to task {:?}: use a new key (retryable: {})",
            e.api().and_then(|a| a.existing_id.as_deref()),
            e.is_retryable()
        ),
        other => return Err(format!("want idempotency_mismatch, got {other:?}").into()),
    }
    let unknown = Task::new("no_such_job", json!(null)).idempotency_key("k");
    match client.submit(&unknown).await {
        Err(e) if e.is(&ErrorCode::UnknownTaskType) => println!("refused: {e}"),
        other => return Err(format!("want unknown_task_type, got {other:?}").into()),
    }
    // A transport error says why in its Display (here: nothing listens on port 9).
    let nobody = Client::builder().endpoint("http://127.0.0.1:9").build()?;
    let err = nobody.get("x").await.unwrap_err();
    assert!(err.is_retryable());
    println!("unreachable: {err}");
    Ok(())
}
