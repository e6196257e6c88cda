//! Handlers that outlive their call: the lease they hold, renewed while they run, and
//! how they are stopped once asyncd no longer accepts their attempt.

use super::*;

/// Stops a long-running handler whose attempt asyncd no longer accepts: cancels its
/// token so that it can stop cleanly, waits the grace for it to return, and drops its
/// future (Rust's own cancellation: it stops at its next await and its destructors run)
/// if it has not. Its outcome is not posted: asyncd would refuse it.
async fn stop(
    shared: &Shared,
    ctx: &TaskContext,
    mut handler: tokio::task::JoinHandle<Result<Value, Outcome>>,
) {
    ctx.cancellation.cancel();
    if tokio::time::timeout(shared.cancel_grace, &mut handler)
        .await
        .is_err()
    {
        tracing::warn!(task = %ctx.id, task_type = %ctx.task_type, attempt = ctx.attempt,
            grace = ?shared.cancel_grace,
            "asyncd: the handler did not return within its grace after its cancellation; dropping it");
        handler.abort();
    }
}

pub(super) async fn run_long(
    shared: Arc<Shared>,
    ctx: TaskContext,
    lease: Duration,
    fut: HandlerFuture,
) {
    let api = shared.callbacks.at(&ctx.callback_url);
    let period = (lease / 3).max(Duration::from_millis(1));
    let started = Instant::now();
    let mut handler = tokio::spawn(fut);
    let mut lease_until = Instant::now() + lease;
    let mut ticker = tokio::time::interval_at(Instant::now() + period, period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let joined = loop {
        tokio::select! {
            joined = &mut handler => break joined,
            _ = ticker.tick() => {
                let beat = tokio::time::timeout(period, api.heartbeat(&ctx.id, &ctx.lease_token, Some(lease))).await;
                match beat {
                    Ok(Ok(_)) => lease_until = Instant::now() + lease,
                    Ok(Err(e)) if e.is(&ErrorCode::TaskCancelled) => {
                        tracing::info!(task = %ctx.id, task_type = %ctx.task_type, attempt = ctx.attempt,
                            "asyncd: task was cancelled while it ran (its heartbeat said so); stopping the handler, its result is dropped");
                        stop(&shared, &ctx, handler).await;
                        return;
                    }
                    Ok(Err(e)) if e.is(&ErrorCode::StaleLease) || e.is(&ErrorCode::NotFound) => {
                        // A newer attempt owns the task; asyncd would refuse our result.
                        tracing::warn!(task = %ctx.id, task_type = %ctx.task_type, attempt = ctx.attempt, error = %e,
                            "asyncd: long-running task lost its lease (a heartbeat was refused): a newer attempt owns it; stopping the handler");
                        stop(&shared, &ctx, handler).await;
                        return;
                    }
                    Ok(Err(e)) => tracing::warn!(task = %ctx.id, error = %e, "asyncd heartbeat failed"),
                    Err(_) => tracing::warn!(task = %ctx.id, "asyncd heartbeat timed out"),
                }
            }
        }
    };
    let outcome = joined.unwrap_or_else(|e| Err(Outcome::Error(panic_message(e).into())));
    log_outcome(&ctx, &outcome, started.elapsed());
    let result = result_of(ctx.lease_token.clone(), outcome);
    // Transport failures and 5xx are retried until the lease would have lapsed
    // anyway; after that asyncd retries the task itself.
    let mut backoff = Duration::from_millis(100);
    loop {
        match api.post_result(&ctx.id, &result).await {
            Ok(_) => return,
            Err(e) if e.status().is_some_and(|s| s < 500) => {
                tracing::warn!(task = %ctx.id, error = %e, "asyncd refused the result");
                return;
            }
            Err(e) => {
                if Instant::now() + backoff > lease_until {
                    tracing::warn!(task = %ctx.id, error = %e, "asyncd result not delivered");
                    return;
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
