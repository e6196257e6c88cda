//! Batch calls (`Asyncd-Batch`, "Batch delivery" in `docs/api.md`): one body of tasks,
//! each run as a single call's would be, one result per task.

use super::*;

/// A batch call's task: what a single call carries in headers, its entry carries.
fn batch_context(
    task: &ExecutorBatchTask<Option<Box<RawValue>>>,
    origin: &CallOrigin,
) -> TaskContext {
    let non_empty = |v: &Option<String>| {
        v.as_deref()
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    TaskContext {
        id: task.id.clone(),
        task_type: task.task_type.clone(),
        attempt: task.attempt,
        idempotency_key: if task.idempotency_key.is_empty() {
            task.id.clone()
        } else {
            task.idempotency_key.clone()
        },
        lease_token: task.lease_token.clone(),
        callback_url: origin.callback_url.clone(),
        eta: task.eta,
        dispatcher: origin.dispatcher.clone(),
        traceparent: non_empty(&task.traceparent),
        tracestate: non_empty(&task.tracestate),
        cancellation: CancellationToken::new(),
    }
}

/// A batch call: the signature over the body (per-task header values empty), then each
/// task through [`run_task`], as a single call's would go, at most
/// `batch_concurrency` at once; one result per task, in the body's order.
pub(super) async fn serve_batch(shared: Arc<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let size = header_str(&headers, HEADER_BATCH).unwrap_or("");
    let verified: Option<VerifiedBatch<'_>> = match &shared.verifier {
        None => None,
        Some(verifier) => match verifier.verify_batch(&headers, &body, SystemTime::now()) {
            Ok(verified) => Some(verified),
            Err(e) => {
                tracing::error!(
                    batch = %size,
                    reason = %e,
                    hint = refusal_hint(&headers, &e),
                    "asyncd: refused a batch executor call (401: asyncd will not retry its tasks; redrive them once fixed)"
                );
                return error_answer(StatusCode::UNAUTHORIZED, e);
            }
        },
    };
    let call = match decode_batch(&body) {
        Ok(call) => call,
        // The same body would come again on a retry, so this is permanent (400).
        Err(why) => {
            tracing::error!(batch = %size, reason = %why,
                "asyncd: refused a batch executor call (400): the body is not an asyncd batch");
            return error_answer(
                StatusCode::BAD_REQUEST,
                format!("body is not an asyncd batch call: {why}"),
            );
        }
    };
    let origin = CallOrigin::of(&headers, shared.callbacks.endpoint());
    let n = call.tasks.len();
    let mut results: Vec<Option<ExecutorBatchResult>> = vec![None; n];
    // Replays are refused before any handler runs, as a single call's are: that task
    // fails (a single call would get a 401, a permanent failure), the others run.
    let mut runnable = Vec::with_capacity(n);
    for (i, task) in call.tasks.into_iter().enumerate() {
        if let Some(verified) = &verified
            && let Err(e) = verified.check_task(&task.id, task.attempt, &task.lease_token)
        {
            tracing::error!(
                task = %task.id,
                attempt = task.attempt,
                reason = %e,
                hint = refusal_hint(&headers, &e),
                "asyncd: refused a task of a batch executor call (failed: asyncd will not retry it)"
            );
            results[i] = Some(batch_result(
                task.id,
                ExecutorBatchStatus::Failed,
                Some(e.to_string()),
            ));
            continue;
        }
        let ctx = batch_context(&task, &origin);
        runnable.push((i, ctx, task.payload));
    }
    let slots = Arc::new(Semaphore::new(shared.batch_concurrency.min(n).max(1)));
    let mut running = JoinSet::new();
    let mut index = HashMap::new();
    for (i, ctx, payload) in runnable {
        let (shared, slots) = (shared.clone(), slots.clone());
        let id = ctx.id.clone();
        let handle = running.spawn(async move {
            let _slot = slots
                .acquire_owned()
                .await
                .expect("the semaphore is never closed");
            let id = ctx.id.clone();
            run_task(shared, ctx, payload).await.batch_result(id)
        });
        index.insert(handle.id(), (i, id));
    }
    // Dropping the set (asyncd hung up) drops the tasks still waiting or running; their
    // handlers, spawned, run on, as a single call's do.
    while let Some(joined) = running.join_next_with_id().await {
        let (task_id, result) = match joined {
            Ok((task_id, result)) => (task_id, result),
            Err(e) => {
                let task_id = e.id();
                let (_, id) = &index[&task_id];
                let msg = panic_message(e);
                (
                    task_id,
                    Verdict::Done(Err(Outcome::Error(msg.into()))).batch_result(id.clone()),
                )
            }
        };
        results[index[&task_id].0] = Some(result);
    }
    let answer = ExecutorBatchAnswer {
        results: results
            .into_iter()
            .map(|r| r.expect("every task has a result"))
            .collect(),
    };
    (StatusCode::OK, axum::Json(answer)).into_response()
}

/// A batch call's body, or why it is not one: every task needs an id and a type (the
/// contract's other fields are required by the type itself).
fn decode_batch(body: &[u8]) -> Result<BatchEnvelope, String> {
    let call: BatchEnvelope = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    if call.tasks.is_empty() {
        return Err("no tasks".into());
    }
    if let Some(i) = call
        .tasks
        .iter()
        .position(|t| t.id.is_empty() || t.task_type.is_empty())
    {
        return Err(format!("tasks[{i}] has no id or no type"));
    }
    Ok(call)
}

pub(super) fn batch_result(
    id: String,
    status: ExecutorBatchStatus,
    error: Option<String>,
) -> ExecutorBatchResult {
    ExecutorBatchResult {
        id,
        status,
        error,
        retry_after: None,
        lease: None,
    }
}
