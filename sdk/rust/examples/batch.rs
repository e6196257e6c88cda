//! The README's "Batch calls": a job with `executor.batch` runs the handler a single
//! call would. To show it without a batching asyncd, this program plays asyncd's
//! dispatcher: it sends its own executor one signed batch call of three tasks
//! (docs/api.md, "Batch delivery"), prints the answer — one result per task — and
//! checks it. `sdk/readme_test.py` checks that the README's block is this file's and
//! runs it.
//!
//! ```text
//! cargo run -p asyncd-client --example batch
//! ```

use asyncd_client::{Executor, Outcome, TaskContext};
use serde::Deserialize;

#[derive(Deserialize)]
struct Thumbnail {
    image: String,
}

// The handler is the one single calls run; in a batch it runs once per task.
async fn make_thumbnail(ctx: TaskContext, thumbnail: Thumbnail) -> Result<(), Outcome> {
    if thumbnail.image.is_empty() {
        return Err(Outcome::permanent("no such image"));
    }
    println!(
        "thumbnail of {} (task {}, attempt {}, lease token {})",
        thumbnail.image, ctx.id, ctx.attempt, ctx.lease_token
    );
    Ok(())
}

fn executor() -> Executor {
    Executor::new()
        .signing_secret("dev-secret")
        .batch_concurrency(16) // handlers of one batch call at once (default 64)
        .register("make_thumbnail", make_thumbnail)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_target(false).init();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/tasks/thumbnails", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, executor().into_router()).await });

    let images = [("t-1", "cat.png"), ("t-2", ""), ("t-3", "dog.png")];
    let answer = as_asyncd::send_batch(&url, "dev-secret", &images).await?;
    println!("{answer}");
    let statuses: Vec<&str> = answer["results"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| r["status"].as_str().unwrap_or(""))
        .collect();
    if statuses != ["success", "failed", "success"] {
        return Err(format!("want success, failed, success; got {answer}").into());
    }
    Ok(())
}

/// What asyncd's dispatcher sends for a job with `executor.batch`.
mod as_asyncd {
    use std::time::{SystemTime, UNIX_EPOCH};

    use asyncd_client::{
        HEADER_BATCH, HEADER_CALLBACK_URL, HEADER_SIGNATURE, HEADER_TIMESTAMP, sign,
        signed_batch_call,
    };
    use axum::http::{HeaderMap, HeaderValue, header};
    use serde_json::{Value, json};

    /// POSTs one `make_thumbnail` task per `(task id, image)`, signed with `key`, and
    /// returns the executor's answer.
    pub async fn send_batch(
        url: &str,
        key: &str,
        images: &[(&str, &str)],
    ) -> Result<Value, Box<dyn std::error::Error>> {
        let tasks: Vec<Value> = images
            .iter()
            .map(|(id, image)| {
                json!({
                    "id": id,
                    "type": "make_thumbnail",
                    "payload": {"image": image},
                    "attempt": 1,
                    "idempotency_key": id,
                    "lease_token": format!("lease-of-{id}"),
                })
            })
            .collect();
        let body = serde_json::to_vec(&json!({ "tasks": tasks }))?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(HEADER_BATCH, HeaderValue::from(tasks.len()));
        headers.insert(HEADER_TIMESTAMP, HeaderValue::from(now));
        headers.insert(
            HEADER_CALLBACK_URL,
            HeaderValue::from_static("http://127.0.0.1:7700"),
        );
        // The single call's canonical string with the per-task fields empty.
        let signature = sign(&[key.as_bytes()], &signed_batch_call(&headers, &body))?;
        headers.insert(HEADER_SIGNATURE, HeaderValue::from_str(&signature)?);
        let resp = reqwest::Client::new()
            .post(url)
            .headers(headers)
            .body(body)
            .send()
            .await?;
        if !resp.status().is_success() {
            return Err(format!("the executor answered {}", resp.status()).into());
        }
        Ok(resp.json().await?)
    }
}
