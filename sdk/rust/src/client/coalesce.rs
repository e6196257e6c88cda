//! Concurrent submits share calls ([`ClientBuilder::submit_coalescing`]): while a
//! client's submit calls are all in flight, further submits queue and go together in the
//! next free call, as one `POST /v1/tasks:batch`, each still answered with its own
//! result or error.
//!
//! [`ClientBuilder::submit_coalescing`]: super::ClientBuilder::submit_coalescing

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use asyncd_contract::{BatchRequest, BatchResponse, SubmitResult};
use reqwest::Method;
use serde_json::value::RawValue;
use tokio::sync::oneshot;

use super::{Client, batch_items};
use crate::error::Error;

/// At most this many tasks in one call: the API refuses a batch of more.
pub(super) const MAX_TASKS: usize = asyncd_contract::MAX_BATCH;

/// Past its first task, a call carries at most this many bytes of task bodies. The API
/// never sets its batch body limit below one task's body limit (by default a 1 MiB
/// payload plus a 64 KiB envelope; the batch default is 16 MiB), so a call this size fits
/// whatever limit an operator chose without lowering the payload limit; one that does
/// not answers 413 and its tasks go alone.
pub(super) const MAX_BYTES: usize = 1 << 20;

type Outcome = Result<SubmitResult, Error>;

/// The submits waiting for a call, and how many senders are making calls. Each sender is
/// a tokio task that takes the queued submits, makes one call with them, answers them,
/// and loops until the queue is empty; so there are never more than `max_calls` senders
/// and none outlives the work queued for it.
pub(crate) struct Coalescer {
    max_calls: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    // Bounded by the submit futures awaiting their answer: each holds one entry at most.
    queue: VecDeque<Queued>,
    senders: usize,
    next_id: u64,
}

struct Queued {
    /// Finds the entry again when its submit is dropped while queued.
    id: u64,
    /// The `POST /v1/tasks` body, serialized once: it goes as is into either call.
    body: Arc<RawValue>,
    answer: oneshot::Sender<Outcome>,
}

impl Coalescer {
    pub(crate) fn new(max_calls: usize) -> Self {
        Self {
            max_calls,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock, and the state is whole between any two
        // statements; a poisoned lock must not stop the drop guards below from running.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends `body` in the next free call and waits for its own answer.
    pub(super) async fn submit(self: &Arc<Self>, client: &Client, body: Box<RawValue>) -> Outcome {
        let body: Arc<RawValue> = body.into();
        let (answer, outcome) = oneshot::channel();
        let (id, start) = {
            let mut state = self.state();
            let id = state.next_id;
            state.next_id += 1;
            state.queue.push_back(Queued {
                id,
                body: body.clone(),
                answer,
            });
            // A sender only ends once the queue is empty, so with one free the queue held
            // nothing else: the sender takes this submit alone.
            let start = state.senders < self.max_calls;
            if start {
                state.senders += 1;
            }
            (id, start)
        };
        if start {
            tokio::spawn(send_until_empty(self.clone(), client.clone()));
        }
        let mut waiting = Waiting {
            coalescer: self,
            id,
            answered: false,
        };
        let outcome = outcome.await;
        waiting.answered = true;
        match outcome {
            Ok(outcome) => outcome,
            // The sender went away without answering: its runtime shut down under it (a
            // client shared between runtimes) or it panicked. Whether or not the call
            // was made, sending the task again is safe with its idempotency key.
            Err(_) => {
                client
                    .call_with(Method::POST, "/v1/tasks", Some(&*body), &[])
                    .await
            }
        }
    }

    /// Submits queued right now (tests wait for them).
    #[cfg(test)]
    fn queued(&self) -> usize {
        self.state().queue.len()
    }

    #[cfg(test)]
    fn senders(&self) -> usize {
        self.state().senders
    }
}

/// Removes a submit's entry from the queue when its future is dropped before it was
/// taken into a call, so that it is never sent. Already taken, the task may still be
/// stored, as when a lone call is dropped after it was sent; its idempotency key makes a
/// retry safe.
struct Waiting<'a> {
    coalescer: &'a Coalescer,
    id: u64,
    answered: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let mut state = self.coalescer.state();
        if let Some(i) = state.queue.iter().position(|q| q.id == self.id) {
            state.queue.remove(i);
        }
    }
}

/// Takes the next call's submits off the front of the queue: at most [`MAX_TASKS`] and,
/// past the first, [`MAX_BYTES`]. Submits dropped while queued are discarded unsent.
fn take_call(queue: &mut VecDeque<Queued>) -> Vec<Queued> {
    let mut call = Vec::new();
    let mut bytes = 0;
    while call.len() < MAX_TASKS {
        let Some(next) = queue.front() else { break };
        if next.answer.is_closed() {
            queue.pop_front();
            continue;
        }
        // The comma between items.
        let size = next.body.get().len() + 1;
        if !call.is_empty() && bytes + size > MAX_BYTES {
            break;
        }
        bytes += size;
        call.extend(queue.pop_front());
    }
    call
}

/// A sender's place among the `max_calls`. Released under the lock with the queue found
/// empty; dropped otherwise (the sender's runtime shut down mid-call, or it panicked), it
/// gives its place back and drops the queue, whose submits then send themselves alone
/// rather than wait for a sender that may never come.
struct Slot<'a> {
    coalescer: &'a Coalescer,
    held: bool,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let stranded = {
            let mut state = self.coalescer.state();
            state.senders -= 1;
            std::mem::take(&mut state.queue)
        };
        drop(stranded);
    }
}

/// A sender: makes calls until the queue is empty.
async fn send_until_empty(coalescer: Arc<Coalescer>, client: Client) {
    let mut slot = Slot {
        coalescer: &coalescer,
        held: true,
    };
    loop {
        let call = {
            let mut state = coalescer.state();
            let call = take_call(&mut state.queue);
            if call.is_empty() {
                // Under the same lock as the empty queue was seen: a submit queued after
                // this finds the place free and starts a sender of its own.
                state.senders -= 1;
                slot.held = false;
                return;
            }
            call
        };
        client.send_call(call).await;
    }
}

impl Client {
    /// Makes one call for `call`'s submits and answers each. The call's timeout is the
    /// client's per-request one, not any one submitter's: it carries the others' tasks.
    async fn send_call(&self, call: Vec<Queued>) {
        if call.len() == 1 {
            return self.send_alone(call).await;
        }
        let tasks: Vec<&RawValue> = call.iter().map(|q| &*q.body).collect();
        let answer: Result<BatchResponse, Error> = self
            .call_with(
                Method::POST,
                "/v1/tasks:batch",
                Some(&BatchRequest { tasks }),
                &[],
            )
            .await;
        let items = match answer {
            // The API's batch body limit is below what this call carried: each task alone
            // fits whatever a single submit of it would.
            Err(err) if err.status() == Some(413) => return self.send_alone(call).await,
            Err(err) => Err(err),
            Ok(resp) => batch_items(resp, call.len()),
        };
        match items {
            Ok(items) => {
                for (q, item) in call.into_iter().zip(items) {
                    // A submitter that gave up after its task was taken needs no answer.
                    let _ = q.answer.send(item.result.map_err(Error::from));
                }
            }
            Err(err) => {
                let n = call.len();
                for (q, err) in call.into_iter().zip(err.shared(n)) {
                    let _ = q.answer.send(Err(err));
                }
            }
        }
    }

    /// Sends each of `call`'s submits as its own `POST /v1/tasks`, one after the other,
    /// so that this sender still makes one call at a time.
    async fn send_alone(&self, call: Vec<Queued>) {
        for q in call {
            if q.answer.is_closed() {
                continue;
            }
            let outcome = self
                .call_with(Method::POST, "/v1/tasks", Some(&*q.body), &[])
                .await;
            let _ = q.answer.send(outcome);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use axum::Router;
    use axum::body::Bytes;
    use axum::http::{HeaderMap, StatusCode, Uri};
    use axum::response::IntoResponse;
    use serde_json::{Value, json};
    use tokio::sync::watch;
    use tokio::task::JoinHandle;

    use super::*;
    use crate::error::ErrorCode;
    use crate::{DEFAULT_SUBMIT_CALLS, RetryPolicy, Task};

    /// One call the fake API answered.
    #[derive(Debug, Clone, PartialEq)]
    struct Call {
        path: String,
        /// The idempotency keys of its tasks, in order.
        keys: Vec<String>,
        traceparent: Option<String>,
    }

    #[derive(Default)]
    struct ApiState {
        calls: Vec<Call>,
        /// Calls that reached the API, held at the gate or not.
        arrived: usize,
        /// A batch of more tasks answers 413; 0: no limit.
        batch_limit: usize,
        /// Answers for the next batch calls, in order, instead of judging their items.
        batch_answers: VecDeque<(u16, String)>,
    }

    /// A fake API answering `POST /v1/tasks` and `POST /v1/tasks:batch` item by item: a
    /// task's id is its idempotency key, type `nope` is refused as unknown and type
    /// `taken` as a unique conflict. Every call waits until the gate is open, so that a
    /// test can hold the calls in flight.
    #[derive(Clone)]
    struct BatchingApi {
        state: Arc<Mutex<ApiState>>,
        gate: Arc<watch::Sender<bool>>,
    }

    fn item(task: &Value) -> (u16, Value) {
        match task["type"].as_str() {
            Some("nope") => (
                400,
                json!({"error": {"code": "unknown_task_type", "message": "no job", "field": "type"}}),
            ),
            Some("taken") => (
                409,
                json!({"error": {"code": "unique_conflict", "message": "held", "field": "unique_key",
                                 "existing_id": "0193e"}}),
            ),
            _ => (
                201,
                json!({"id": task["idempotency_key"], "eta": "2026-12-01T00:00:00Z",
                       "route": "store", "duplicate": false}),
            ),
        }
    }

    impl BatchingApi {
        /// The fake API, its gate closed, and a client of it making at most `calls`
        /// submit calls at once.
        async fn start(calls: usize, retry: Option<RetryPolicy>) -> (BatchingApi, Client) {
            let api = BatchingApi {
                state: Arc::default(),
                gate: Arc::new(watch::channel(false).0),
            };
            let a = api.clone();
            let app = Router::new().fallback(move |uri: Uri, headers: HeaderMap, body: Bytes| {
                let a = a.clone();
                async move { a.answer(uri, headers, body).await }
            });
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
            let mut builder = Client::builder()
                .endpoint(format!("http://{addr}"))
                .submit_coalescing(calls);
            if let Some(policy) = retry {
                builder = builder.retry(policy);
            }
            (api, builder.build().unwrap())
        }

        async fn answer(
            &self,
            uri: Uri,
            headers: HeaderMap,
            body: Bytes,
        ) -> axum::response::Response {
            let mut gate = self.gate.subscribe();
            self.state.lock().unwrap().arrived += 1;
            gate.wait_for(|open| *open).await.unwrap();
            let body: Value = serde_json::from_slice(&body).unwrap();
            let batch = uri.path() == "/v1/tasks:batch";
            let tasks = if batch {
                body["tasks"].as_array().unwrap().clone()
            } else {
                vec![body]
            };
            let mut state = self.state.lock().unwrap();
            state.calls.push(Call {
                path: uri.path().to_string(),
                keys: tasks
                    .iter()
                    .map(|t| t["idempotency_key"].as_str().unwrap().to_string())
                    .collect(),
                traceparent: headers
                    .get("traceparent")
                    .map(|v| v.to_str().unwrap().to_string()),
            });
            let (status, answer) = if !batch {
                let (status, answer) = item(&tasks[0]);
                (status, answer.to_string())
            } else if let Some(canned) = state.batch_answers.pop_front() {
                canned
            } else if state.batch_limit > 0 && tasks.len() > state.batch_limit {
                (
                    413,
                    json!({"error": {"code": "payload_too_large", "message": "batch"}}).to_string(),
                )
            } else {
                let results: Vec<Value> = tasks
                    .iter()
                    .map(|t| {
                        let (status, mut answer) = item(t);
                        answer["status"] = json!(status);
                        answer
                    })
                    .collect();
                (200, json!({ "results": results }).to_string())
            };
            (
                StatusCode::from_u16(status).unwrap(),
                [("content-type", "application/json")],
                answer,
            )
                .into_response()
        }

        fn open(&self) {
            self.gate.send_replace(true);
        }

        fn calls(&self) -> Vec<Call> {
            self.state.lock().unwrap().calls.clone()
        }

        fn arrived(&self) -> usize {
            self.state.lock().unwrap().arrived
        }
    }

    fn call(path: &str, keys: &[&str]) -> Call {
        Call {
            path: path.into(),
            keys: keys.iter().map(|k| k.to_string()).collect(),
            traceparent: None,
        }
    }

    async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    fn coalescer(c: &Client) -> &Coalescer {
        c.inner.coalesce.as_ref().expect("a coalescing client")
    }

    /// Waits until every one of the client's calls is in flight and nothing is queued.
    async fn wait_busy(c: &Client) {
        let k = coalescer(c);
        wait_until("the calls to be in flight", || {
            k.senders() == k.max_calls && k.queued() == 0
        })
        .await;
    }

    async fn wait_queued(c: &Client, n: usize) {
        let k = coalescer(c);
        wait_until(&format!("{n} submits queued"), || k.queued() == n).await;
    }

    /// Starts a submit of `key` (type `nope` for key `bad`, `taken` for key `taken`).
    fn submit(c: &Client, key: &str) -> JoinHandle<Outcome> {
        submit_task(c, task(key))
    }

    fn task(key: &str) -> Task {
        let task_type = match key {
            "bad" => "nope",
            "taken" => "taken",
            _ => "t",
        };
        Task::new(task_type, json!({ "k": key })).idempotency_key(key)
    }

    fn submit_task(c: &Client, task: Task) -> JoinHandle<Outcome> {
        let c = c.clone();
        tokio::spawn(async move { c.submit(&task).await })
    }

    /// A client with one call, held in flight by a first submit, and `keys` queued
    /// behind it.
    async fn first_held_then_queued(
        retry: Option<RetryPolicy>,
        keys: &[&str],
    ) -> (
        BatchingApi,
        Client,
        JoinHandle<Outcome>,
        Vec<JoinHandle<Outcome>>,
    ) {
        let (api, c) = BatchingApi::start(1, retry).await;
        let first = submit(&c, "first");
        // The first goes alone: a call was free.
        wait_busy(&c).await;
        let rest = keys.iter().map(|k| submit(&c, k)).collect();
        wait_queued(&c, keys.len()).await;
        (api, c, first, rest)
    }

    #[tokio::test]
    async fn concurrent_submits_share_the_next_call_and_each_gets_its_own_result() {
        let keys = ["a", "bad", "taken", "c"];
        let (api, _c, first, rest) = first_held_then_queued(None, &keys).await;
        api.open();
        assert_eq!(first.await.unwrap().unwrap().id, "first");
        for (key, handle) in keys.iter().zip(rest) {
            let outcome = handle.await.unwrap();
            match *key {
                "bad" => {
                    let err = outcome.unwrap_err();
                    assert!(matches!(err, Error::Api(_)), "{err:?}");
                    let api = err.api().unwrap();
                    assert_eq!(
                        (api.status, &api.code, api.field.as_deref()),
                        (400, &ErrorCode::UnknownTaskType, Some("type"))
                    );
                }
                "taken" => {
                    let err = outcome.unwrap_err();
                    let api = err.api().unwrap();
                    assert_eq!(
                        (
                            api.status,
                            &api.code,
                            api.field.as_deref(),
                            api.existing_id.as_deref()
                        ),
                        (
                            409,
                            &ErrorCode::UniqueConflict,
                            Some("unique_key"),
                            Some("0193e")
                        )
                    );
                }
                _ => {
                    let res = outcome.unwrap();
                    assert_eq!(res.id, *key);
                    assert_eq!(res.route, asyncd_contract::Route::Store);
                }
            }
        }
        assert_eq!(
            api.calls(),
            [
                call("/v1/tasks", &["first"]),
                call("/v1/tasks:batch", &keys)
            ],
            "one call alone, then one batch of the four queued"
        );
    }

    #[tokio::test]
    async fn a_failed_shared_call_fails_every_submit_in_it() {
        // Refused as a whole: each submit gets the API's error, as alone.
        let (api, _c, first, rest) = first_held_then_queued(None, &["a", "b"]).await;
        api.state.lock().unwrap().batch_answers.push_back((
            503,
            r#"{"error":{"code":"store_unavailable","message":"down"}}"#.into(),
        ));
        api.open();
        first.await.unwrap().unwrap();
        for handle in rest {
            let err = handle.await.unwrap().unwrap_err();
            assert!(matches!(err, Error::Api(_)), "{err:?}");
            assert!(err.is(&ErrorCode::StoreUnavailable), "{err}");
            assert_eq!(err.status(), Some(503));
        }

        // An answer that does not decode: the error is shared.
        let (api, _c, first, rest) = first_held_then_queued(None, &["a", "b"]).await;
        api.state
            .lock()
            .unwrap()
            .batch_answers
            .push_back((200, "not json".into()));
        api.open();
        first.await.unwrap().unwrap();
        for handle in rest {
            let err = handle.await.unwrap().unwrap_err();
            match &err {
                Error::Shared(inner) => assert!(matches!(**inner, Error::Decode { .. }), "{err:?}"),
                other => panic!("want the shared decode error, got {other:?}"),
            }
            assert!(!err.is_retryable());
        }

        // One result for two tasks is a broken answer, for both.
        let (api, _c, first, rest) = first_held_then_queued(None, &["a", "b"]).await;
        api.state.lock().unwrap().batch_answers.push_back((
            200,
            r#"{"results":[{"status":201,"id":"a","eta":"2026-12-01T00:00:00Z"}]}"#.into(),
        ));
        api.open();
        first.await.unwrap().unwrap();
        for handle in rest {
            let err = handle.await.unwrap().unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::BatchLength {
                        sent: 2,
                        received: 1
                    }
                ),
                "{err:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_retry_policy_retries_a_shared_call_as_a_whole() {
        let policy = RetryPolicy::new(3).sleep_with(|_| async {});
        let (api, _c, first, rest) = first_held_then_queued(Some(policy), &["a", "b"]).await;
        api.state.lock().unwrap().batch_answers.push_back((
            503,
            r#"{"error":{"code":"store_unavailable","message":"down"}}"#.into(),
        ));
        api.open();
        first.await.unwrap().unwrap();
        for (key, handle) in ["a", "b"].iter().zip(rest) {
            assert_eq!(handle.await.unwrap().unwrap().id, *key);
        }
        assert_eq!(
            api.calls(),
            [
                call("/v1/tasks", &["first"]),
                call("/v1/tasks:batch", &["a", "b"]),
                call("/v1/tasks:batch", &["a", "b"]),
            ]
        );
    }

    #[tokio::test]
    async fn a_shared_call_the_api_finds_too_large_is_sent_task_by_task() {
        let keys = ["a", "bad", "c"];
        let (api, _c, first, rest) = first_held_then_queued(None, &keys).await;
        api.state.lock().unwrap().batch_limit = 1;
        api.open();
        first.await.unwrap().unwrap();
        for (key, handle) in keys.iter().zip(rest) {
            let outcome = handle.await.unwrap();
            if *key == "bad" {
                assert!(outcome.unwrap_err().is(&ErrorCode::UnknownTaskType));
            } else {
                assert_eq!(outcome.unwrap().id, *key);
            }
        }
        assert_eq!(
            api.calls(),
            [
                call("/v1/tasks", &["first"]),
                call("/v1/tasks:batch", &keys),
                call("/v1/tasks", &["a"]),
                call("/v1/tasks", &["bad"]),
                call("/v1/tasks", &["c"]),
            ],
            "the batch refused, then each task alone"
        );
    }

    #[tokio::test]
    async fn a_submit_dropped_while_queued_is_never_sent() {
        let (api, c) = BatchingApi::start(1, None).await;
        let first = submit(&c, "first");
        wait_busy(&c).await;
        let gave_up = submit(&c, "gave-up");
        let kept = submit(&c, "kept");
        wait_queued(&c, 2).await;
        gave_up.abort();
        assert!(gave_up.await.unwrap_err().is_cancelled());
        // Its entry left the queue when its future was dropped.
        wait_queued(&c, 1).await;
        api.open();
        first.await.unwrap().unwrap();
        assert_eq!(kept.await.unwrap().unwrap().id, "kept");
        assert_eq!(
            api.calls(),
            [call("/v1/tasks", &["first"]), call("/v1/tasks", &["kept"])],
            "the kept task alone after the first"
        );
    }

    #[tokio::test]
    async fn a_traced_submit_is_never_queued() {
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let (api, c) = BatchingApi::start(1, None).await;
        let first = submit(&c, "first");
        wait_busy(&c).await;
        let traced = submit_task(&c, task("traced").trace(parent, None));
        // Its own call reaches the API while the first is held, and it was never queued.
        wait_until("the traced submit's own call", || api.arrived() == 2).await;
        assert_eq!(coalescer(&c).queued(), 0);
        api.open();
        first.await.unwrap().unwrap();
        assert_eq!(traced.await.unwrap().unwrap().id, "traced");
        let calls = api.calls();
        let traced_call = calls.iter().find(|c| c.keys == ["traced"]).unwrap();
        assert_eq!(traced_call.path, "/v1/tasks");
        assert_eq!(traced_call.traceparent.as_deref(), Some(parent));
    }

    #[tokio::test]
    async fn without_coalescing_every_submit_is_its_own_call() {
        let (api, c) = BatchingApi::start(0, None).await;
        assert!(c.inner.coalesce.is_none());
        let handles: Vec<_> = ["a", "b", "c"].iter().map(|k| submit(&c, k)).collect();
        // All three in flight at once: none waited for another.
        wait_until("three calls in flight", || api.arrived() == 3).await;
        api.open();
        for handle in handles {
            handle.await.unwrap().unwrap();
        }
        assert!(api.calls().iter().all(|c| c.path == "/v1/tasks"));

        // One at a time, a coalescing client sends each alone too.
        let (api, c) = BatchingApi::start(DEFAULT_SUBMIT_CALLS, None).await;
        api.open();
        for key in ["a", "b", "c"] {
            c.submit(&task(key)).await.unwrap();
        }
        assert_eq!(
            api.calls(),
            [
                call("/v1/tasks", &["a"]),
                call("/v1/tasks", &["b"]),
                call("/v1/tasks", &["c"])
            ]
        );
    }

    fn queued(id: u64, body_bytes: usize) -> (Queued, oneshot::Receiver<Outcome>) {
        // A JSON string of `body_bytes` bytes, quotes included.
        let text = format!("\"{}\"", "x".repeat(body_bytes - 2));
        let (answer, outcome) = oneshot::channel();
        let body = RawValue::from_string(text).unwrap().into();
        (Queued { id, body, answer }, outcome)
    }

    fn ids(call: &[Queued]) -> Vec<u64> {
        call.iter().map(|q| q.id).collect()
    }

    #[test]
    fn a_call_takes_at_most_the_batch_limits() {
        let mut receivers = Vec::new();
        let mut queue = VecDeque::new();
        for id in 0..(MAX_TASKS as u64 + 5) {
            let (q, rx) = queued(id, 10);
            queue.push_back(q);
            receivers.push(rx);
        }
        assert_eq!(take_call(&mut queue).len(), MAX_TASKS);
        assert_eq!(ids(&take_call(&mut queue)), [1000, 1001, 1002, 1003, 1004]);
        assert!(take_call(&mut queue).is_empty());

        // Past the first task, at most MAX_BYTES (each body counts a comma too); a first
        // task larger than that still goes, alone.
        let half = MAX_BYTES / 2;
        let mut queue = VecDeque::new();
        for (id, size) in [(0, 2 * MAX_BYTES), (1, half - 1), (2, half - 1), (3, half)] {
            let (q, rx) = queued(id, size);
            queue.push_back(q);
            receivers.push(rx);
        }
        assert_eq!(ids(&take_call(&mut queue)), [0]);
        assert_eq!(ids(&take_call(&mut queue)), [1, 2]);
        assert_eq!(ids(&take_call(&mut queue)), [3]);
    }

    #[test]
    fn a_call_skips_submits_that_gave_up() {
        let mut queue = VecDeque::new();
        let (q0, rx0) = queued(0, 10);
        let (q1, rx1) = queued(1, 10);
        let (q2, rx2) = queued(2, 10);
        queue.extend([q0, q1, q2]);
        drop((rx0, rx2));
        assert_eq!(ids(&take_call(&mut queue)), [1]);
        assert!(queue.is_empty());
        drop(rx1);
    }
}
