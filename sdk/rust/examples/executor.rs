//! The Rust half of sdk/test.sh's cross-language check: a Rust executor for tasks
//! submitted by the Go or Python client (sdk/go/internal/crosstest,
//! sdk/python/tests/crosstest.py).
//!
//! ```text
//! cargo run -p asyncd-client --example executor -- --listen 127.0.0.1:0 \
//!     [--portfile F] [--secret S] [--type cross_rust] [--fail-permanently]
//! ```
//!
//! The handler recomputes the call's idempotency key from the payload with this SDK
//! and fails the task permanently when it differs from the one the other language
//! derived, so a success proves signature, payload and key derivation agree. With
//! `--fail-permanently` every task that passes those checks is refused permanently
//! (422) instead: it must land in dead letters with this executor's message.

use std::time::Duration;

use asyncd_client::{Executor, Outcome, TaskContext, idempotency_key_from};
use serde_json::Value;

/// The payload fields every language derives the idempotency key from.
const KEY_FIELDS: [&str; 3] = ["nonce", "amount", "text"];

struct Args {
    listen: String,
    portfile: Option<String>,
    secret: String,
    task_type: String,
    fail_permanently: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        listen: "127.0.0.1:0".into(),
        portfile: None,
        secret: String::new(),
        task_type: "cross_rust".into(),
        fail_permanently: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => args.listen = value()?,
            "--portfile" => args.portfile = Some(value()?),
            "--secret" => args.secret = value()?,
            "--type" => args.task_type = value()?,
            "--fail-permanently" => args.fail_permanently = true,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(args)
}

async fn run_task(ctx: TaskContext, payload: Value, fail_permanently: bool) -> Result<(), Outcome> {
    let want =
        idempotency_key_from(&ctx.task_type, &payload, &KEY_FIELDS).map_err(Outcome::permanent)?;
    if ctx.idempotency_key != want {
        return Err(Outcome::permanent(format!(
            "idempotency key {:?}, Rust derives {want:?}",
            ctx.idempotency_key
        )));
    }
    let lang = payload["lang"].as_str().unwrap_or("");
    if lang != "go" && lang != "python" {
        return Err(Outcome::permanent(format!(
            "payload {payload} did not come from the Go or Python client"
        )));
    }
    if fail_permanently {
        println!(
            "rust executor refused {} (attempt {}) from the {lang} client permanently",
            ctx.id, ctx.attempt
        );
        return Err(Outcome::permanent(format!(
            "rust executor: permanent failure as asked, task from the {lang} client"
        )));
    }
    println!(
        "rust executor ran {} (attempt {}) for the {lang} client",
        ctx.id, ctx.attempt
    );
    Ok(())
}

#[tokio::main]
async fn main() {
    let args = parse_args().unwrap_or_else(|e| {
        eprintln!("executor: {e}");
        std::process::exit(2)
    });
    let fail = args.fail_permanently;
    // No --secret: calls are not checked (an empty key would refuse them all).
    let executor = if args.secret.is_empty() {
        Executor::new()
    } else {
        Executor::new().signing_secret(&args.secret)
    };
    let executor = executor.register(args.task_type.clone(), move |ctx, payload: Value| {
        run_task(ctx, payload, fail)
    });
    let in_flight = executor.in_flight();
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .unwrap_or_else(|e| panic!("listen on {}: {e}", args.listen));
    let addr = listener.local_addr().unwrap();
    if let Some(portfile) = &args.portfile {
        // Written whole then renamed, so a reader polling for it never sees it half-written.
        let tmp = format!("{portfile}.tmp");
        std::fs::write(&tmp, addr.port().to_string()).unwrap();
        std::fs::rename(&tmp, portfile).unwrap();
    }
    println!(
        "rust executor for {} on {addr}{}",
        args.task_type,
        if fail { " (failing permanently)" } else { "" }
    );
    axum::serve(listener, executor.into_router())
        .with_graceful_shutdown(async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        })
        .await
        .unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(5), in_flight.wait()).await;
}
