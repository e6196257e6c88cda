//! The soak's executor: answers each task as its behaviour says, in the body or at the
//! socket, and notes every call and success in the ledger.

use super::*;

#[derive(Clone)]
pub(super) struct ExecutorState {
    pub(super) ledger: Arc<Mutex<Ledger>>,
    pub(super) http: reqwest::Client,
    pub(super) apis: Vec<String>,
    pub(super) huge: Bytes,
}

/// Serves the soak's executor on a free port of 127.0.0.1; returns the port.
pub(super) async fn serve_executor(state: ExecutorState) -> Result<u16> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap, body: Bytes| {
        let state = state.clone();
        async move { execute(&state, &uri, &headers, &body).await }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr.port())
}

pub(super) fn answer(status: u16, body: impl Into<Bytes>) -> Response {
    (StatusCode::from_u16(status).unwrap(), body.into()).into_response()
}

pub(super) async fn execute(
    state: &ExecutorState,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let arrival = now_ms();
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let call: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let payload = &call["payload"];
    let (Some(index), Some(behaviour)) = (
        payload["i"].as_u64().map(|i| i as usize),
        payload["b"].as_str().and_then(Behaviour::parse),
    ) else {
        return answer(422, "not a soak task");
    };
    let id = header("asyncd-task-id");
    let attempt: u32 = header("asyncd-attempt").parse().unwrap_or(0);
    let lease_token = header("asyncd-lease-token");
    let caller = caller_pid(&header("asyncd-dispatcher"));
    let redirected = uri.query().is_some_and(|q| q.contains("redirected"));
    if !redirected {
        let mut etas = Vec::with_capacity(2);
        etas.extend(payload["eta"].as_i64());
        etas.extend(
            call["eta"]
                .as_str()
                .and_then(|e| chrono::DateTime::parse_from_rfc3339(e).ok())
                .map(|e| e.timestamp_millis()),
        );
        state
            .ledger
            .lock()
            .unwrap()
            .note_call(index, &id, arrival, &etas);
    }
    let success = || {
        state
            .ledger
            .lock()
            .unwrap()
            .note_success(index, attempt, &lease_token, caller)
    };
    match behaviour {
        Behaviour::Ok => {
            success();
            answer(200, "")
        }
        Behaviour::FailThenOk(n) if attempt <= n => answer(500, "failing on purpose"),
        Behaviour::FailThenOk(_) => {
            success();
            answer(200, "{}")
        }
        Behaviour::Slow => {
            tokio::time::sleep(EXECUTOR_TIMEOUT / 2).await;
            success();
            answer(200, "slow")
        }
        Behaviour::InvalidJson200 => {
            success();
            answer(200, "{\"ok\": tru")
        }
        Behaviour::NulBody => {
            success();
            answer(200, &b"\0ok\0\0{\0}"[..])
        }
        Behaviour::HugeBody => {
            success();
            answer(200, state.huge.clone())
        }
        Behaviour::Redirect if !redirected => {
            let mut response = answer(307, "");
            response
                .headers_mut()
                .insert("location", "/run?redirected=1".parse().unwrap());
            response
        }
        Behaviour::Redirect => {
            success();
            answer(200, "")
        }
        Behaviour::Callback | Behaviour::InvalidJson202 => {
            let state = state.clone();
            tokio::spawn(async move {
                finish_later(&state, index, attempt, &id, &lease_token, caller).await;
            });
            if behaviour == Behaviour::Callback {
                answer(202, r#"{"lease": "10s"}"#)
            } else {
                answer(202, "{lease: ten seconds")
            }
        }
        Behaviour::Permanent => answer(422, r#"{"error": "never"}"#),
        // The first attempt's answer never arrives whole, so asyncd must count it failed
        // and try again; the work is noted as done only by an answer that can arrive.
        Behaviour::Hang if attempt <= 1 => {
            // Long past the timeout; the dispatcher has hung up by then.
            tokio::time::sleep(EXECUTOR_TIMEOUT * 4).await;
            answer(200, "too late")
        }
        Behaviour::Trickle if attempt <= 1 => {
            let bytes = futures::stream::unfold(0u32, |sent| async move {
                if sent > 0 {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                (sent < TRICKLE_BYTES)
                    .then(|| (Ok::<_, std::io::Error>(Bytes::from_static(b"x")), sent + 1))
            });
            body_answer(TRICKLE_BYTES, bytes)
        }
        Behaviour::CutAfterHeaders if attempt <= 1 => {
            // An error from the body stream makes hyper close the connection mid-body;
            // it comes a moment later, or hyper gives up before the headers are out.
            let bytes = futures::stream::iter([Ok(Bytes::from_static(b"{\"ok\": "))]).chain(
                futures::stream::once(async {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Err(std::io::Error::other("the executor hangs up"))
                }),
            );
            body_answer(100, bytes)
        }
        Behaviour::Hang | Behaviour::Trickle | Behaviour::CutAfterHeaders => {
            success();
            answer(200, "")
        }
    }
}

/// How long a trickled answer is, in bytes (one a second): many times the timeout.
pub(super) const TRICKLE_BYTES: u32 = 64;

/// A 200 whose headers promise `length` bytes and whose body is `bytes`.
pub(super) fn body_answer<S>(length: u32, bytes: S) -> Response
where
    S: futures::Stream<Item = std::io::Result<Bytes>> + Send + 'static,
{
    let mut response = Response::new(axum::body::Body::from_stream(bytes));
    response
        .headers_mut()
        .insert("content-length", length.into());
    response
}

/// The long-running half of a 202: a heartbeat, then the success result, through any API
/// process that answers (they are being killed too).
pub(super) async fn finish_later(
    state: &ExecutorState,
    index: usize,
    attempt: u32,
    id: &str,
    lease_token: &str,
    caller: Option<u32>,
) {
    tokio::time::sleep(Duration::from_millis(200)).await;
    let heartbeat = json!({"lease_token": lease_token, "lease": "10s"});
    let path = format!("/v1/tasks/{id}/heartbeat");
    if post_retrying(state, &path, &heartbeat).await != Some(200) {
        return; // stale: a newer attempt has the task
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    state
        .ledger
        .lock()
        .unwrap()
        .note_success(index, attempt, lease_token, caller);
    let result = json!({"lease_token": lease_token, "status": "success", "output": {"i": index}});
    post_retrying(state, &format!("/v1/tasks/{id}/result"), &result).await;
}

pub(super) async fn post_retrying(state: &ExecutorState, path: &str, body: &Value) -> Option<u16> {
    let start = Instant::now();
    let mut k = 0;
    while start.elapsed() < Duration::from_secs(30) {
        let base = &state.apis[k % state.apis.len()];
        k += 1;
        if let Ok(r) = state
            .http
            .post(format!("{base}{path}"))
            .json(body)
            .send()
            .await
            && r.status() != 503
        {
            return Some(r.status().as_u16());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}
