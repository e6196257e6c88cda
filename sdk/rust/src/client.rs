//! The API client: submit, inspect, search, cancel, dead letters (one by one and in
//! bulk), the jobs overview, pause and resume a job, trigger a cron entry, changes of a
//! task not begun (`client/change.rs`), schedules (`client/schedule.rs`), and the
//! long-running callbacks (heartbeat, result).

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use asyncd_contract::{
    BackfillResult, CancelResult, CronOverlap, CronTriggerResult, DeadLetterBulk,
    DeadLetterBulkResult, JobOverview, JobStatus, MAX_BACKFILL, MAX_BATCH, MAX_SCHEDULE_NAME,
    MAX_SCHEDULE_PAGE, PendingChange, RedriveResult, ResultAck, ResultStatus, Schedule,
    SchedulePage, SchedulePatch, ScheduleSource, ScheduleSpec, SubmitResult, TaskPage, TaskState,
    TaskStatus, TenantWeight,
};
use asyncd_contract::{
    BatchOutcome, BatchRequest, BatchResponse, DeadLetters, JobList, SubmitRequest,
    TenantWeightRequest, headers,
};
use chrono::{DateTime, Utc};
use reqwest::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{ApiError, Error};
use crate::retry::RetryPolicy;
use crate::time::{format_duration, format_time};

mod builder;
mod callbacks;
mod change;
mod coalesce;
mod schedule;
mod task;

pub use builder::ClientBuilder;
pub use callbacks::TaskResult;
pub use change::{Change, Changed};
use coalesce::Coalescer;
pub use task::Task;
use task::trace_headers;

/// Where `asyncd dev` listens unless told otherwise.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:7700";

/// Labels submits for `asyncd_task_submitted_total`.
pub const SOURCE_SERVICE_HEADER: &str = headers::SOURCE_SERVICE;

/// Where a client looks for its bearer token when given none: mount a projected
/// ServiceAccount token for the audience `asyncd` there (docs/security.md).
pub const DEFAULT_TOKEN_FILE: &str = "/var/run/secrets/asyncd/token";

/// How long a token read from a file is used before the file is read again. The kubelet
/// renews a projected token at 80% of its lifetime (at least 10 minutes), so a minute is
/// always in time.
pub const TOKEN_FILE_REFRESH: Duration = Duration::from_secs(60);

/// How many submit calls a [`Client`] has in flight at once before further concurrent
/// submits wait and share the next call ([`ClientBuilder::submit_coalescing`]).
pub const DEFAULT_SUBMIT_CALLS: usize = 4;

/// Where the bearer token comes from.
#[derive(Clone)]
enum TokenSource {
    Static(String),
    File(PathBuf),
}

impl fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // Never the token itself: a Debug print ends up in logs.
            TokenSource::Static(_) => f.write_str("Static(<redacted>)"),
            TokenSource::File(path) => f.debug_tuple("File").field(path).finish(),
        }
    }
}

/// Talks to the asyncd API. Cheap to clone; safe to share between tasks.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    endpoint: String,
    service_name: Option<String>,
    http: reqwest::Client,
    token: TokenSource,
    /// The token last read from the file, and when.
    file_token: Mutex<Option<(Option<String>, Instant)>>,
    retry: Option<RetryPolicy>,
    /// Shares calls between concurrent submits; `None` sends each alone.
    coalesce: Option<Arc<Coalescer>>,
}

impl Inner {
    fn bearer(&self, now: Instant) -> Option<String> {
        let path = match &self.token {
            TokenSource::Static(token) => return Some(token.clone()),
            TokenSource::File(path) => path,
        };
        let mut cached = self.file_token.lock().expect("token lock");
        match &*cached {
            Some((token, read)) if now.duration_since(*read) < TOKEN_FILE_REFRESH => token.clone(),
            _ => {
                // No file (asyncd dev without auth): send nothing; a server that needs a
                // token answers 401.
                let token = std::fs::read_to_string(path)
                    .ok()
                    .map(|text| text.trim().to_string())
                    .filter(|text| !text.is_empty());
                *cached = Some((token.clone(), now));
                token
            }
        }
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("endpoint", &self.inner.endpoint)
            .field("service_name", &self.inner.service_name)
            .finish()
    }
}

/// The items of the answer to a batch of `sent` tasks, in their order: for
/// [`Client::submit_batch`] and for the calls concurrent submits share.
fn batch_items(resp: BatchResponse, sent: usize) -> Result<Vec<BatchItem>, Error> {
    if resp.results.len() != sent {
        return Err(Error::BatchLength {
            sent,
            received: resp.results.len(),
        });
    }
    Ok(resp
        .results
        .into_iter()
        .map(|item| BatchItem {
            status: item.status,
            result: match item.outcome {
                BatchOutcome::Accepted(result) => Ok(result),
                BatchOutcome::Refused(body) => Err(ApiError::new(item.status, body.error)),
            },
        })
        .collect())
}

/// One item of a [`Client::submit_batch`] answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchItem {
    /// 201 (stored), 200 (duplicate) or the 4xx of the refusal.
    pub status: u16,
    pub result: Result<SubmitResult, ApiError>,
}

/// The filters of [`Client::search`]: each one set narrows the search; none lists every
/// task (newest first) the caller may read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskQuery {
    /// Only this AsyncJobConfig's tasks.
    pub job: Option<String>,
    pub task_type: Option<String>,
    pub state: Option<TaskState>,
    pub unique_key: Option<String>,
    /// Only tasks created after this instant.
    pub created_after: Option<DateTime<Utc>>,
    /// Only tasks due before this instant.
    pub eta_before: Option<DateTime<Utc>>,
    /// At most this many (1..=1000; the server's default, 100, when unset).
    pub limit: Option<u32>,
    /// A previous page's `next_cursor`.
    pub cursor: Option<String>,
}

/// Percent-encodes one path segment or query value.
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Client {
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// The API base URL, without a trailing slash.
    pub fn endpoint(&self) -> &str {
        &self.inner.endpoint
    }

    /// The same client talking to another asyncd base URL (the executor uses it for
    /// the `Asyncd-Callback-Url` of a call).
    pub(crate) fn at(&self, endpoint: &str) -> Client {
        Client {
            inner: Arc::new(Inner {
                endpoint: endpoint.trim_end_matches('/').to_string(),
                service_name: self.inner.service_name.clone(),
                http: self.inner.http.clone(),
                token: self.inner.token.clone(),
                file_token: Mutex::new(None),
                // Callbacks are not retried by a policy: the executor handles them.
                retry: None,
                // Callbacks submit nothing.
                coalesce: None,
            }),
        }
    }

    fn body<'a>(&'a self, t: &'a Task) -> Result<SubmitRequest<&'a Value>, Error> {
        if t.task_type.is_empty() {
            return Err(Error::InvalidTask("task has no type".into()));
        }
        let key = match t.idempotency_key.as_deref() {
            Some(k) if !k.is_empty() => k,
            _ => return Err(Error::MissingIdempotencyKey),
        };
        if t.delay.is_some() && t.eta.is_some() {
            return Err(Error::InvalidTask(
                "task has both a delay and an eta".into(),
            ));
        }
        if t.expires_at.is_some() && t.start_within.is_some() {
            return Err(Error::InvalidTask(
                "task has both an expires_at and a start_within".into(),
            ));
        }
        Ok(SubmitRequest {
            task_type: t.task_type.clone(),
            payload: Some(&t.payload),
            delay: t.delay.filter(|d| !d.is_zero()).map(format_duration),
            eta: t.eta.map(format_time),
            expires_at: t.expires_at.map(format_time),
            start_within: t.start_within.map(format_duration),
            debounce: t.debounce.clone(),
            throttle: t.throttle.clone(),
            priority: Some(i64::from(t.priority)).filter(|&p| p != 0),
            idempotency_key: Some(key.to_string()),
            unique_key: t.unique_key.clone(),
            max_retries: t.max_retries.map(i64::from),
            timeout: t.timeout.map(format_duration),
            depends_on: Some(t.depends_on.clone()).filter(|d| !d.is_empty()),
            reference: None,
            depends_on_refs: None,
            source_service: self.inner.service_name.clone(),
        })
    }

    /// Enqueues `task` to run as soon as possible (or at its `delay` / `eta`). A task
    /// without an idempotency key is refused with [`Error::MissingIdempotencyKey`]
    /// before anything is sent. Concurrent submits may share a call
    /// ([`ClientBuilder::submit_coalescing`], on by default): then a tokio task of the
    /// client's own makes the call, and dropping this future once its task was taken
    /// into a call does not stop it (the task may still be stored; a retry is safe with
    /// its idempotency key). Dropped while still queued, the task is never sent.
    pub async fn submit(&self, task: &Task) -> Result<SubmitResult, Error> {
        let body = self.body(task)?;
        let trace = trace_headers(std::slice::from_ref(task))?;
        if let Some(coalescer) = &self.inner.coalesce
            && trace.is_empty()
        {
            let raw = serde_json::value::to_raw_value(&body).map_err(Error::Payload)?;
            return coalescer.submit(self, raw).await;
        }
        self.call_with(Method::POST, "/v1/tasks", Some(&body), &trace)
            .await
    }

    /// Enqueues `task` to run after `delay` (0..=400 days).
    pub async fn submit_delayed(
        &self,
        task: &Task,
        delay: Duration,
    ) -> Result<SubmitResult, Error> {
        let mut t = task.clone();
        t.delay = Some(delay);
        t.eta = None;
        self.submit(&t).await
    }

    /// Enqueues `task` to run at `eta` (sent as UTC with milliseconds; a past eta
    /// means now).
    pub async fn submit_at(&self, task: &Task, eta: DateTime<Utc>) -> Result<SubmitResult, Error> {
        let mut t = task.clone();
        t.delay = None;
        t.eta = Some(eta);
        self.submit(&t).await
    }

    /// Enqueues up to [`MAX_BATCH`] tasks in one call. Items are judged one by one:
    /// the error is for the call as a whole, and each [`BatchItem`] says how its task
    /// fared. Valid items are stored even when others are refused. A task without an
    /// idempotency key fails the whole call ([`Error::BatchTask`]) before sending.
    pub async fn submit_batch(&self, tasks: &[Task]) -> Result<Vec<BatchItem>, Error> {
        let bodies = tasks
            .iter()
            .enumerate()
            .map(|(index, t)| {
                self.body(t).map_err(|e| Error::BatchTask {
                    index,
                    source: Box::new(e),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let trace = trace_headers(tasks)?;
        let resp: BatchResponse = self
            .call_with(
                Method::POST,
                "/v1/tasks:batch",
                Some(&BatchRequest { tasks: bodies }),
                &trace,
            )
            .await?;
        batch_items(resp, tasks.len())
    }

    /// The task with `id`; an unknown id is an API error with code `not_found`.
    pub async fn get(&self, id: &str) -> Result<TaskStatus, Error> {
        self.call(
            Method::GET,
            &format!("/v1/tasks/{}", escape(id)),
            None::<&()>,
        )
        .await
    }

    /// Cancels a task that has not finished (blocked, pending, claimed or running; a
    /// running attempt is told on its next heartbeat). A finished task is refused with
    /// `not_cancellable`, whose [`ApiError::state`] names where it is. A Kafka-routed
    /// task not yet consumed is not in the store, so this answers `not_found` for it:
    /// use [`cancel_in`](Self::cancel_in).
    pub async fn cancel(&self, id: &str) -> Result<CancelResult, Error> {
        self.call(
            Method::DELETE,
            &format!("/v1/tasks/{}", escape(id)),
            None::<&()>,
        )
        .await
    }

    /// [`cancel`](Self::cancel) naming the task's job (its AsyncJobConfig's name)
    /// (`DELETE /v1/tasks/{id}?job=J`): besides what `cancel` does, a task of a
    /// Kafka-routed job that no dispatcher has consumed yet is recorded as cancelled,
    /// so it never runs. A job no config declares is `invalid_field` naming `job`.
    pub async fn cancel_in(&self, job: &str, id: &str) -> Result<CancelResult, Error> {
        let path = format!("/v1/tasks/{}?job={}", escape(id), escape(job));
        self.call(Method::DELETE, &path, None::<&()>).await
    }

    /// Cancels the unfinished task of job `job` (its AsyncJobConfig's name) that holds
    /// `unique_key`; `not_found` when none does.
    pub async fn cancel_unique(&self, job: &str, unique_key: &str) -> Result<CancelResult, Error> {
        let path = format!(
            "/v1/tasks?job={}&unique_key={}",
            escape(job),
            escape(unique_key)
        );
        self.call(Method::DELETE, &path, None::<&()>).await
    }

    /// Dead tasks, newest first: of `task_type` (every type with `None`), at most
    /// `limit` (the server's default, 100, with `None`; at most 1000).
    pub async fn dead_letters(
        &self,
        task_type: Option<&str>,
        limit: Option<u32>,
    ) -> Result<Vec<TaskStatus>, Error> {
        let mut query = Vec::new();
        if let Some(limit) = limit {
            query.push(format!("limit={limit}"));
        }
        if let Some(t) = task_type {
            query.push(format!("type={}", escape(t)));
        }
        let mut path = "/v1/dead-letters".to_string();
        if !query.is_empty() {
            path.push('?');
            path.push_str(&query.join("&"));
        }
        let resp: DeadLetters = self.call(Method::GET, &path, None::<&()>).await?;
        Ok(resp.items)
    }

    /// Puts a dead task back to pending, due now, with its attempts reset.
    pub async fn redrive(&self, id: &str) -> Result<RedriveResult, Error> {
        self.call(
            Method::POST,
            &format!("/v1/dead-letters/{}/redrive", escape(id)),
            None::<&()>,
        )
        .await
    }

    /// Pauses the job named `job` (its AsyncJobConfig's name): no attempt of it begins
    /// and its tasks wait in the store until [`Client::resume_job`]. Idempotent.
    pub async fn pause_job(&self, job: &str) -> Result<JobStatus, Error> {
        let path = format!("/v1/jobs/{}/pause", escape(job));
        self.call(Method::POST, &path, None::<&()>).await
    }

    /// Lifts the API's pause of `job`; the answer still says `paused` while its config
    /// (`spec.paused`) pauses it.
    pub async fn resume_job(&self, job: &str) -> Result<JobStatus, Error> {
        let path = format!("/v1/jobs/{}/resume", escape(job));
        self.call(Method::POST, &path, None::<&()>).await
    }

    /// Gives `tenant` the weight `weight` (1 to 1000) in the fair claim of `job` (one with
    /// `spec.fairness`), in place of the spec's, from the next claim on and until
    /// [`Client::reset_tenant_weight`].
    pub async fn set_tenant_weight(
        &self,
        job: &str,
        tenant: &str,
        weight: u32,
    ) -> Result<TenantWeight, Error> {
        let path = format!("/v1/jobs/{}/tenants/{}/weight", escape(job), escape(tenant));
        self.call(Method::PUT, &path, Some(&TenantWeightRequest { weight }))
            .await
    }

    /// Gives `tenant` back the weight `spec.fairness` gives it in `job`. Idempotent.
    pub async fn reset_tenant_weight(
        &self,
        job: &str,
        tenant: &str,
    ) -> Result<TenantWeight, Error> {
        let path = format!("/v1/jobs/{}/tenants/{}/weight", escape(job), escape(tenant));
        self.call(Method::DELETE, &path, None::<&()>).await
    }

    /// Tasks matching every filter of `query`, newest first, one page (`GET /v1/tasks`):
    /// pass the page's `next_cursor` as [`TaskQuery::cursor`] for the next one.
    pub async fn search(&self, query: &TaskQuery) -> Result<TaskPage, Error> {
        let mut params = Vec::new();
        let mut add = |name: &str, value: &str| params.push(format!("{name}={}", escape(value)));
        if let Some(job) = &query.job {
            add("job", job);
        }
        if let Some(t) = &query.task_type {
            add("type", t);
        }
        if let Some(state) = query.state {
            add("state", state.as_str());
        }
        if let Some(key) = &query.unique_key {
            add("unique_key", key);
        }
        if let Some(at) = query.created_after {
            add("created_after", &format_time(at));
        }
        if let Some(at) = query.eta_before {
            add("eta_before", &format_time(at));
        }
        if let Some(limit) = query.limit {
            add("limit", &limit.to_string());
        }
        if let Some(cursor) = &query.cursor {
            add("cursor", cursor);
        }
        let mut path = "/v1/tasks".to_string();
        if !params.is_empty() {
            path.push('?');
            path.push_str(&params.join("&"));
        }
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// Fires the cron entry `entry` of the job `job` once, now, besides its schedule;
    /// returns the task it created. An unknown job or entry is `not_found` (its
    /// [`ApiError::field`] says which).
    pub async fn trigger_cron(&self, job: &str, entry: &str) -> Result<CronTriggerResult, Error> {
        let path = format!("/v1/jobs/{}/cron/{}/trigger", escape(job), escape(entry));
        self.call(Method::POST, &path, None::<&()>).await
    }

    /// Every job the caller may read, sorted by name: its pause, due backlog, lateness,
    /// running and dead counts, finishes over the last minute and cron entries
    /// (`GET /v1/jobs`).
    pub async fn jobs(&self) -> Result<Vec<JobOverview>, Error> {
        let list: JobList = self.call(Method::GET, "/v1/jobs", None::<&()>).await?;
        Ok(list.jobs)
    }

    /// The job named `job` (its AsyncJobConfig's name), as [`Client::jobs`] shows it.
    pub async fn job(&self, job: &str) -> Result<JobOverview, Error> {
        let path = format!("/v1/jobs/{}", escape(job));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// Redrives up to `filter.limit` (default 1000) dead letters matching `filter` in one
    /// call. Call again with the answer's `dead_before` until `remaining` or `affected`
    /// is 0; each call is idempotent, so an interrupted loop is resumed by running it again.
    pub async fn redrive_dead_letters(
        &self,
        filter: &DeadLetterBulk,
    ) -> Result<DeadLetterBulkResult, Error> {
        self.call(Method::POST, "/v1/dead-letters/redrive", Some(filter))
            .await
    }

    /// Deletes up to `filter.limit` dead letters matching `filter` for good; loop as
    /// with [`Client::redrive_dead_letters`].
    pub async fn purge_dead_letters(
        &self,
        filter: &DeadLetterBulk,
    ) -> Result<DeadLetterBulkResult, Error> {
        self.call(Method::POST, "/v1/dead-letters/purge", Some(filter))
            .await
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.inner.endpoint, path)
    }

    /// Sends one API call with the bearer token and decodes a 2xx answer.
    async fn call<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, Error> {
        self.call_with(method, path, body, &[]).await
    }

    /// [`Client::call`] with more headers.
    async fn call_with<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        extra: &[(&'static str, String)],
    ) -> Result<T, Error> {
        self.retrying(|| self.send(method.clone(), path, body, true, extra))
            .await
    }

    /// [`Client::call`] that also returns the answer's status (`201` created or `200`).
    async fn call_status<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<(u16, T), Error> {
        self.retrying(|| async {
            let (status, raw) = self.exchange(method.clone(), path, body, true, &[]).await?;
            Ok((status, self.decode(&method, path, &raw)?))
        })
        .await
    }

    /// [`Client::call`] of an endpoint that answers `204` without a body.
    async fn call_no_content(&self, method: Method, path: &str) -> Result<(), Error> {
        self.retrying(|| async {
            self.exchange(method.clone(), path, None::<&()>, true, &[])
                .await
                .map(drop)
        })
        .await
    }

    /// Runs `call` once, or under the client's retry policy when it has one.
    async fn retrying<T, F, Fut>(&self, mut call: F) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, Error>>,
    {
        match &self.inner.retry {
            None => call().await,
            Some(policy) => policy.run(call).await,
        }
    }

    /// A heartbeat or result: the lease token authenticates it, and the API token is
    /// not sent to the dispatcher it may go to.
    async fn callback<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, Error> {
        self.send(method, path, body, false, &[]).await
    }

    async fn send<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        with_token: bool,
        extra: &[(&'static str, String)],
    ) -> Result<T, Error> {
        let (_, raw) = self
            .exchange(method.clone(), path, body, with_token, extra)
            .await?;
        self.decode(&method, path, &raw)
    }

    /// Decodes a 2xx answer's body.
    fn decode<T: DeserializeOwned>(
        &self,
        method: &Method,
        path: &str,
        raw: &[u8],
    ) -> Result<T, Error> {
        serde_json::from_slice(raw).map_err(|source| Error::Decode {
            method: method.to_string(),
            url: self.url(path),
            source,
        })
    }

    /// Sends one call; a 2xx answer's status and body, or the refusal as an error.
    async fn exchange<B: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        with_token: bool,
        extra: &[(&'static str, String)],
    ) -> Result<(u16, axum::body::Bytes), Error> {
        let url = self.url(path);
        let transport = |source| Error::Transport {
            method: method.to_string(),
            url: url.clone(),
            source,
        };
        let mut req = self
            .inner
            .http
            .request(method.clone(), &url)
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(name) = &self.inner.service_name {
            req = req.header(SOURCE_SERVICE_HEADER, name);
        }
        for (name, value) in extra {
            req = req.header(*name, value);
        }
        if with_token && let Some(token) = self.inner.bearer(Instant::now()) {
            req = req.bearer_auth(token);
        }
        if let Some(body) = body {
            let raw = serde_json::to_vec(body).map_err(Error::Payload)?;
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(raw);
        }
        let resp = req.send().await.map_err(transport)?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| crate::error::parse_retry_after(v, Utc::now()));
        let raw = resp.bytes().await.map_err(transport)?;
        if !(200..300).contains(&status) {
            let mut err = ApiError::from_response(status, &raw);
            err.retry_after = retry_after;
            return Err(err.into());
        }
        Ok((status, raw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use axum::Router;
    use axum::body::Bytes;
    use axum::http::{HeaderMap, Method as HttpMethod, StatusCode, Uri};
    use axum::response::IntoResponse;
    use chrono::TimeZone;
    use serde_json::json;
    use std::sync::Mutex;

    #[derive(Debug, Clone)]
    struct Recorded {
        method: String,
        path: String,
        query: String,
        headers: HeaderMap,
        body: Value,
    }

    /// A fake API: records requests and answers with a canned status and body.
    #[derive(Clone)]
    struct Fake {
        reqs: Arc<Mutex<Vec<Recorded>>>,
        answer: Arc<Mutex<(u16, String)>>,
    }

    impl Fake {
        async fn start(status: u16, body: &str) -> (Fake, Client) {
            let fake = Fake {
                reqs: Arc::default(),
                answer: Arc::new(Mutex::new((status, body.to_string()))),
            };
            let f = fake.clone();
            let app = Router::new().fallback(
                move |method: HttpMethod, uri: Uri, headers: HeaderMap, body: Bytes| {
                    let f = f.clone();
                    async move {
                        f.reqs.lock().unwrap().push(Recorded {
                            method: method.to_string(),
                            path: uri.path().to_string(),
                            query: uri.query().unwrap_or("").to_string(),
                            headers,
                            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
                        });
                        let (status, body) = f.answer.lock().unwrap().clone();
                        (
                            StatusCode::from_u16(status).unwrap(),
                            [("content-type", "application/json")],
                            body,
                        )
                            .into_response()
                    }
                },
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
            let client = Client::builder()
                .endpoint(format!("http://{addr}/"))
                .service_name("orders")
                .build()
                .unwrap();
            (fake, client)
        }

        fn answer(&self, status: u16, body: &str) {
            *self.answer.lock().unwrap() = (status, body.to_string());
        }

        fn last(&self) -> Recorded {
            self.reqs
                .lock()
                .unwrap()
                .last()
                .cloned()
                .expect("a request reached the fake API")
        }

        fn count(&self) -> usize {
            self.reqs.lock().unwrap().len()
        }
    }

    #[test]
    fn the_token_file_is_re_read_after_the_refresh_period() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let client = Client::builder().token_file(&path).build().unwrap();
        let t0 = Instant::now();
        assert_eq!(client.inner.bearer(t0), None, "no file, no token");
        std::fs::write(&path, "first\n").unwrap();
        assert_eq!(client.inner.bearer(t0), None, "cached within the period");
        let t1 = t0 + TOKEN_FILE_REFRESH;
        assert_eq!(client.inner.bearer(t1).as_deref(), Some("first"));
        std::fs::write(&path, "rotated").unwrap();
        assert_eq!(
            client.inner.bearer(t1 + Duration::from_secs(1)).as_deref(),
            Some("first")
        );
        assert_eq!(
            client.inner.bearer(t1 + TOKEN_FILE_REFRESH).as_deref(),
            Some("rotated")
        );
        let given = Client::builder().token("abc").build().unwrap();
        assert_eq!(given.inner.bearer(t0).as_deref(), Some("abc"));
        assert!(!format!("{:?}", Client::builder().token("abc")).contains("abc"));
    }

    #[tokio::test]
    async fn submit_sends_the_contract_body() {
        let (fake, c) = Fake::start(
            201,
            r#"{"id":"0193a","eta":"2026-11-30T06:00:00.123Z","route":"store","duplicate":false}"#,
        )
        .await;
        let task = Task::new("send_email", json!({"to": "a@b.c"}))
            .idempotency_key("k1")
            .unique_key("u1")
            .priority(5)
            .max_retries(0)
            .timeout(Duration::from_millis(1500))
            .depends_on(["0193x"]);
        let res = c
            .submit_delayed(&task, Duration::from_secs(90 * 60))
            .await
            .unwrap();
        let want = Utc.with_ymd_and_hms(2026, 11, 30, 6, 0, 0).unwrap()
            + chrono::Duration::milliseconds(123);
        assert_eq!(
            res,
            SubmitResult {
                id: "0193a".into(),
                eta: want,
                route: asyncd_contract::Route::Store,
                duplicate: false,
                debounced: false,
                dropped: false,
            }
        );
        let r = fake.last();
        assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/v1/tasks"));
        assert_eq!(r.headers["asyncd-source-service"], "orders");
        assert_eq!(r.headers["content-type"], "application/json");
        assert_eq!(
            r.body,
            json!({
                "type": "send_email", "payload": {"to": "a@b.c"}, "delay": "1h 30m", "priority": 5,
                "idempotency_key": "k1", "unique_key": "u1", "max_retries": 0, "timeout": "1s 500ms",
                "depends_on": ["0193x"], "source_service": "orders"
            })
        );
    }

    /// A task's trace goes as headers; a batch's tasks must share theirs.
    #[tokio::test]
    async fn the_trace_context_is_sent_as_headers() {
        let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let (fake, c) = Fake::start(
            201,
            r#"{"id":"a","eta":"2026-11-30T06:00:00.000Z","route":"store","duplicate":false}"#,
        )
        .await;
        let task = Task::new("t", json!(null)).idempotency_key("k");
        c.submit(&task).await.unwrap();
        c.submit(&task.clone().trace(parent, Some("vendor=1".into())))
            .await
            .unwrap();
        {
            let reqs = fake.reqs.lock().unwrap();
            assert!(!reqs[0].headers.contains_key("traceparent"));
            assert_eq!(reqs[1].headers["traceparent"], parent);
            assert_eq!(reqs[1].headers["tracestate"], "vendor=1");
            assert!(
                !reqs[1]
                    .body
                    .as_object()
                    .unwrap()
                    .contains_key("traceparent"),
                "a header, not a body field"
            );
        }
        let mixed = [task.clone().trace(parent, None), task.clone()];
        assert!(matches!(
            c.submit_batch(&mixed).await,
            Err(Error::InvalidTask(m)) if m.contains("traceparent")
        ));
        assert_eq!(fake.reqs.lock().unwrap().len(), 2, "nothing sent");
    }

    #[tokio::test]
    async fn submit_at_sends_utc_millis_and_omits_unset_fields() {
        let (fake, c) = Fake::start(
            201,
            r#"{"id":"a","eta":"2026-12-01T00:00:00.5Z","route":"store"}"#,
        )
        .await;
        let eta = chrono::FixedOffset::east_opt(8 * 3600)
            .unwrap()
            .with_ymd_and_hms(2026, 12, 1, 8, 0, 0)
            .unwrap()
            .with_timezone(&Utc)
            + chrono::Duration::milliseconds(500);
        let task = Task::new("t", Value::Null)
            .idempotency_key("k")
            .delay(Duration::from_secs(5));
        let res = c.submit_at(&task, eta).await.unwrap();
        assert!(!res.duplicate);
        assert_eq!(
            fake.last().body,
            json!({"type": "t", "payload": null, "eta": "2026-12-01T00:00:00.500Z",
                   "idempotency_key": "k", "source_service": "orders"})
        );
        // A zero delay is "now": nothing to send.
        c.submit_delayed(&task, Duration::ZERO).await.unwrap();
        assert!(fake.last().body.get("delay").is_none());
    }

    #[tokio::test]
    async fn refusals_before_sending() {
        let (fake, c) = Fake::start(201, "{}").await;
        let err = c.submit(&Task::new("t", 1)).await.unwrap_err();
        assert!(matches!(err, Error::MissingIdempotencyKey), "{err}");
        let err = c
            .submit(&Task::new("t", 1).idempotency_key(""))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::MissingIdempotencyKey), "{err}");
        let err = c
            .submit_batch(&[Task::new("t", 1).idempotency_key("k"), Task::new("t", 2)])
            .await
            .unwrap_err();
        match &err {
            Error::BatchTask { index: 1, source } => {
                assert!(matches!(**source, Error::MissingIdempotencyKey))
            }
            other => panic!("{other}"),
        }
        assert!(err.to_string().contains("batch task 1"), "{err}");
        let mut both = Task::new("t", 1).idempotency_key("k");
        both.delay = Some(Duration::from_secs(1));
        both.eta = Some(Utc::now());
        assert!(matches!(c.submit(&both).await, Err(Error::InvalidTask(_))));
        assert!(matches!(
            c.submit(&Task::new("", 1).idempotency_key("k")).await,
            Err(Error::InvalidTask(_))
        ));
        assert_eq!(fake.count(), 0, "nothing may be sent");
    }

    #[tokio::test]
    async fn api_errors_carry_code_field_status() {
        let (fake, c) = Fake::start(
            409,
            r#"{"error":{"code":"unique_conflict","message":"order:42 is pending","field":"unique_key","existing_id":"0193e"}}"#,
        )
        .await;
        let err = c
            .submit(&Task::new("t", 1).idempotency_key("k"))
            .await
            .unwrap_err();
        assert!(err.is(&ErrorCode::UniqueConflict));
        assert!(!err.is(&ErrorCode::NotFound));
        assert_eq!(err.status(), Some(409));
        let api = err.api().unwrap();
        assert_eq!(api.field.as_deref(), Some("unique_key"));
        assert_eq!(api.existing_id.as_deref(), Some("0193e"));

        fake.answer(502, "<html>bad gateway</html>");
        let err = c.get("x").await.unwrap_err();
        assert!(err.is(&ErrorCode::HttpError), "{err}");
        assert!(err.api().unwrap().message.contains("bad gateway"));

        fake.answer(200, "not json");
        let err = c.get("x").await.unwrap_err();
        assert!(matches!(err, Error::Decode { .. }), "{err}");
    }

    #[tokio::test]
    async fn transport_errors() {
        // A port nothing listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let c = Client::builder()
            .endpoint(format!("http://127.0.0.1:{port}"))
            .build()
            .unwrap();
        let err = c.get("x").await.unwrap_err();
        assert!(matches!(err, Error::Transport { .. }), "{err}");
        assert!(err.to_string().contains("GET"), "{err}");
        assert!(matches!(
            Client::builder().endpoint("127.0.0.1:7700").build(),
            Err(Error::Config(_))
        ));
    }

    const TASK: &str = r#"{"id":"a","type":"t","payload":{"x":1},"state":"dead","priority":0,"eta":"2026-12-01T00:00:00.000Z",
        "attempt":4,"max_retries":3,"idempotency_key":"k","unique_key":null,"depends_on":[],"last_error":"boom",
        "result":null,"lease_until":null,"created_at":"2026-11-30T00:00:00.000Z","updated_at":"2026-11-30T00:00:01.000Z"}"#;

    #[tokio::test]
    async fn batch_get_cancel_dead_letters_redrive() {
        let (fake, c) = Fake::start(
            200,
            r#"{"results":[{"status":201,"id":"a","eta":"2026-12-01T00:00:00Z","route":"store","duplicate":false},
                {"status":400,"error":{"code":"unknown_task_type","message":"no job","field":"type"}}]}"#,
        )
        .await;
        let items = c
            .submit_batch(&[
                Task::new("t", Value::Null)
                    .idempotency_key("k1")
                    .delay(Duration::from_secs(60)),
                Task::new("nope", Value::Null).idempotency_key("k2"),
            ])
            .await
            .unwrap();
        assert_eq!(items[0].status, 201);
        assert_eq!(items[0].result.as_ref().unwrap().id, "a");
        let err = items[1].result.as_ref().unwrap_err();
        assert_eq!(
            (items[1].status, &err.code, err.field.as_deref(), err.status),
            (400, &ErrorCode::UnknownTaskType, Some("type"), 400)
        );
        let r = fake.last();
        assert_eq!(r.path, "/v1/tasks:batch");
        assert_eq!(r.body["tasks"][0]["delay"], "1m");
        assert_eq!(r.body["tasks"].as_array().unwrap().len(), 2);

        // One result for two tasks is a broken answer.
        fake.answer(
            200,
            r#"{"results":[{"status":201,"id":"a","eta":"2026-12-01T00:00:00Z"}]}"#,
        );
        let err = c
            .submit_batch(&[
                Task::new("t", 1).idempotency_key("a"),
                Task::new("t", 2).idempotency_key("b"),
            ])
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::BatchLength {
                    sent: 2,
                    received: 1
                }
            ),
            "{err}"
        );

        fake.answer(200, &format!(r#"{{"items":[{TASK}]}}"#));
        let items = c.dead_letters(Some("t x"), Some(5)).await.unwrap();
        let r = fake.last();
        assert_eq!(
            (r.path.as_str(), r.query.as_str()),
            ("/v1/dead-letters", "limit=5&type=t%20x")
        );
        assert_eq!(items.len(), 1);
        let it = &items[0];
        assert_eq!(it.state, TaskState::Dead);
        assert_eq!(it.last_error.as_deref(), Some("boom"));
        assert_eq!(it.idempotency_key.as_deref(), Some("k"));
        assert_eq!(
            (it.unique_key.as_deref(), it.attempt, it.max_retries),
            (None, 4, 3)
        );
        assert_eq!(it.payload, json!({"x": 1}));
        c.dead_letters(None, None).await.unwrap();
        assert_eq!(fake.last().query, "");

        fake.answer(200, TASK);
        let got = c.get("a/b").await.unwrap();
        assert_eq!(
            got.updated_at - got.created_at,
            chrono::Duration::seconds(1)
        );
        let r = fake.last();
        assert_eq!(r.method, "GET");
        assert_eq!(
            r.path, "/v1/tasks/a%2Fb",
            "ids are escaped as one path segment"
        );

        fake.answer(
            200,
            r#"{"id":"a","state":"pending","eta":"2026-12-01T00:00:00.000Z"}"#,
        );
        let rd = c.redrive("a").await.unwrap();
        assert_eq!((rd.id.as_str(), &rd.state), ("a", &TaskState::Pending));
        let r = fake.last();
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("POST", "/v1/dead-letters/a/redrive")
        );

        let job = r#"{"job":"j","task_type":"t","paused":true,"paused_at":"2026-12-01T00:00:00.000Z","paused_by_config":false}"#;
        fake.answer(200, job);
        let paused = c.pause_job("j").await.unwrap();
        assert!(paused.paused && !paused.paused_by_config);
        assert!(paused.paused_at.is_some());
        let r = fake.last();
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("POST", "/v1/jobs/j/pause")
        );
        fake.answer(
            200,
            r#"{"job":"j","task_type":"t","paused":false,"paused_at":null,"paused_by_config":false}"#,
        );
        assert!(!c.resume_job("j").await.unwrap().paused);
        assert_eq!(fake.last().path, "/v1/jobs/j/resume");

        fake.answer(200, r#"{"id":"a","state":"cancelled"}"#);
        let cancelled = c.cancel("a").await.unwrap();
        assert_eq!(cancelled.state, TaskState::Cancelled);
        let r = fake.last();
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("DELETE", "/v1/tasks/a")
        );
        fake.answer(200, r#"{"id":"b","state":"cancelled"}"#);
        let cancelled = c.cancel_unique("j 1", "order:7").await.unwrap();
        assert_eq!(cancelled.id, "b");
        let r = fake.last();
        assert_eq!(
            (r.method.as_str(), r.path.as_str(), r.query.as_str()),
            ("DELETE", "/v1/tasks", "job=j%201&unique_key=order%3A7")
        );
        fake.answer(200, r#"{"id":"c/d","state":"cancelled"}"#);
        let cancelled = c.cancel_in("j 1", "c/d").await.unwrap();
        assert_eq!(
            (cancelled.id.as_str(), &cancelled.state),
            ("c/d", &TaskState::Cancelled)
        );
        let r = fake.last();
        assert_eq!(
            (r.method.as_str(), r.path.as_str(), r.query.as_str()),
            ("DELETE", "/v1/tasks/c%2Fd", "job=j%201")
        );
    }

    /// `change_in_job` names the job in the query (escaped) and sends `change`'s body: a
    /// 202 (the contract's fixture) is the change recorded for a task not consumed yet, a
    /// 200 the stored task changed.
    #[tokio::test]
    async fn change_in_job_tells_a_pending_change_from_a_stored_task() {
        let (fake, c) = Fake::start(
            202,
            include_str!("../../../contract/fixtures/change_pending_response.json"),
        )
        .await;
        let change = Change {
            payload: Some(json!({"v": 2})),
            priority: Some(5),
            ..Change::default()
        };
        let changed = c
            .change_in_job("send email&x=y", "a/b", &change)
            .await
            .unwrap();
        assert_eq!(
            changed,
            Changed::Pending(PendingChange {
                id: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b".into(),
                job: "send-email".into(),
                task_type: "email".into(),
                consumed: false,
            })
        );
        let r = fake.last();
        assert_eq!(
            (r.method.as_str(), r.path.as_str(), r.query.as_str()),
            ("PATCH", "/v1/tasks/a%2Fb", "job=send%20email%26x%3Dy")
        );
        assert_eq!(r.body, json!({"payload": {"v": 2}, "priority": 5}));

        fake.answer(200, TASK);
        let now = Change {
            run_now: true,
            ..Change::default()
        };
        match c.change_in_job("j", "a", &now).await.unwrap() {
            Changed::Stored(task) => assert_eq!((task.id.as_str(), task.attempt), ("a", 4)),
            other => panic!("{other:?}"),
        }
        let r = fake.last();
        assert_eq!(
            (r.path.as_str(), r.query.as_str()),
            ("/v1/tasks/a", "job=j")
        );
        assert_eq!(r.body, json!({"run_now": true}));

        fake.answer(
            400,
            r#"{"error":{"code":"invalid_field","message":"keys from the payload","field":"payload"}}"#,
        );
        match c.change_in_job("j", "a", &change).await.unwrap_err() {
            Error::Api(err) => assert_eq!(
                (&err.code, err.field.as_deref()),
                (&ErrorCode::InvalidField, Some("payload"))
            ),
            other => panic!("{other}"),
        }

        let sent = fake.count();
        let both = Change {
            delay: Some(Duration::from_secs(60)),
            eta: Some(Utc::now()),
            ..Change::default()
        };
        assert!(matches!(
            c.change_in_job("j", "a", &both).await,
            Err(Error::InvalidTask(_))
        ));
        assert!(matches!(
            c.change_in_job("", "a", &now).await,
            Err(Error::InvalidTask(_))
        ));
        assert_eq!(fake.count(), sent, "nothing may be sent");
    }

    #[tokio::test]
    async fn search_and_cron_trigger() {
        let (fake, c) = Fake::start(
            200,
            &format!(r#"{{"items":[{TASK}],"truncated":false,"next_cursor":"5.x"}}"#),
        )
        .await;
        let page = c
            .search(&TaskQuery {
                job: Some("j 1".into()),
                state: Some(TaskState::Dead),
                created_after: Some(Utc.with_ymd_and_hms(2026, 11, 30, 6, 0, 0).unwrap()),
                limit: Some(5),
                cursor: Some("4.y".into()),
                ..TaskQuery::default()
            })
            .await
            .unwrap();
        assert_eq!(page.items.len(), 1);
        assert_eq!(page.next_cursor.as_deref(), Some("5.x"));
        let r = fake.last();
        assert_eq!(
            (r.method.as_str(), r.path.as_str(), r.query.as_str()),
            (
                "GET",
                "/v1/tasks",
                "job=j%201&state=dead&created_after=2026-11-30T06%3A00%3A00.000Z&limit=5&cursor=4.y"
            )
        );
        c.search(&TaskQuery::default()).await.unwrap();
        assert_eq!(fake.last().query, "", "no filter, no query");

        fake.answer(
            201,
            r#"{"id":"t1","job":"j","entry":"nightly","type":"report","eta":"2026-11-30T06:00:00.000Z"}"#,
        );
        let fired = c.trigger_cron("j", "night ly").await.unwrap();
        assert_eq!(
            (
                fired.id.as_str(),
                fired.entry.as_str(),
                fired.task_type.as_str()
            ),
            ("t1", "nightly", "report")
        );
        let r = fake.last();
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("POST", "/v1/jobs/j/cron/night%20ly/trigger")
        );
        fake.answer(
            404,
            r#"{"error":{"code":"not_found","message":"job \"j\" has no cron entry \"x\"","field":"entry"}}"#,
        );
        let err = c.trigger_cron("j", "x").await.unwrap_err();
        assert!(err.is(&ErrorCode::NotFound), "{err}");
        assert_eq!(err.api().unwrap().field.as_deref(), Some("entry"));
    }

    const SCHEDULE: &str = r#"{"job":"j 1","name":"cust/42","type":"t","source":"api",
        "cron":"CRON_TZ=Europe/Berlin 0 9 * * MON","payload":{"c":42},"priority":3,"overlap":"BufferOne",
        "catch_up":"1h","jitter":"5m","start_at":"2026-12-07T00:00:00.000Z","paused":false,
        "next_firing":"2026-12-07T08:00:00.000Z","last_firing":null,"last_task_id":null,
        "buffered_firing":null,"fired":0,"created_at":"2026-11-30T00:00:00.000Z",
        "updated_at":"2026-11-30T00:00:00.000Z"}"#;

    #[tokio::test]
    async fn schedule_calls_send_the_contract() {
        let (fake, c) = Fake::start(201, SCHEDULE).await;
        let spec = ScheduleSpec {
            cron: Some("CRON_TZ=Europe/Berlin 0 9 * * MON".into()),
            payload: json!({"c": 42}),
            priority: 3,
            overlap: CronOverlap::BufferOne,
            jitter: Some("5m".into()),
            start_at: Some(Utc.with_ymd_and_hms(2026, 12, 7, 0, 0, 0).unwrap()),
            ..ScheduleSpec::default()
        };
        let s = c.create_schedule("j 1", "cust/42", &spec).await.unwrap();
        assert_eq!(
            (s.job.as_str(), s.name.as_str(), s.source, &s.spec.overlap),
            (
                "j 1",
                "cust/42",
                ScheduleSource::Api,
                &CronOverlap::BufferOne
            )
        );
        assert_eq!(s.spec.cron, spec.cron);
        assert!(s.next_firing.is_some() && s.last_firing.is_none());
        let r = fake.last();
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("POST", "/v1/schedules")
        );
        assert_eq!(
            r.body,
            json!({"job": "j 1", "name": "cust/42", "cron": "CRON_TZ=Europe/Berlin 0 9 * * MON",
                   "payload": {"c": 42}, "priority": 3, "overlap": "BufferOne", "jitter": "5m",
                   "start_at": "2026-12-07T00:00:00.000Z", "paused": false})
        );

        // PUT: 201 created, 200 written over; the body is the spec alone.
        let (_, created) = c.put_schedule("j 1", "cust/42", &spec).await.unwrap();
        assert!(created);
        let r = fake.last();
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("PUT", "/v1/schedules/j%201/cust%2F42")
        );
        assert!(
            r.body.get("job").is_none() && r.body["priority"] == 3,
            "{}",
            r.body
        );
        fake.answer(200, SCHEDULE);
        let (_, created) = c.put_schedule("j 1", "cust/42", &spec).await.unwrap();
        assert!(!created);

        c.get_schedule("j 1", "cust/42").await.unwrap();
        let r = fake.last();
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("GET", "/v1/schedules/j%201/cust%2F42")
        );

        fake.answer(
            200,
            &format!(r#"{{"items":[{SCHEDULE}],"next_cursor":"cust/42"}}"#),
        );
        let page = c.list_schedules("j 1", Some("a:b"), Some(1)).await.unwrap();
        assert_eq!(page.items.len(), 1);
        assert_eq!(page.next_cursor.as_deref(), Some("cust/42"));
        let r = fake.last();
        assert_eq!(
            (r.path.as_str(), r.query.as_str()),
            ("/v1/schedules", "job=j%201&cursor=a%3Ab&limit=1")
        );
        fake.answer(200, r#"{"items":[]}"#);
        let page = c.list_schedules("j", None, None).await.unwrap();
        assert!(page.items.is_empty() && page.next_cursor.is_none());
        assert_eq!(fake.last().query, "job=j");

        fake.answer(200, SCHEDULE);
        c.change_schedule("j", "s", json!({"priority": 5, "jitter": null}))
            .await
            .unwrap();
        let r = fake.last();
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("PATCH", "/v1/schedules/j/s")
        );
        assert_eq!(r.body, json!({"priority": 5, "jitter": null}));
        let mut patch = SchedulePatch::new();
        patch.insert("every".into(), json!("1h"));
        c.change_schedule("j", "s", patch).await.unwrap();
        assert_eq!(fake.last().body, json!({"every": "1h"}));

        for (call, want) in [
            ("pause", "/v1/schedules/j/s/pause"),
            ("resume", "/v1/schedules/j/s/resume"),
        ] {
            match call {
                "pause" => c.pause_schedule("j", "s").await.unwrap(),
                _ => c.resume_schedule("j", "s").await.unwrap(),
            };
            let r = fake.last();
            assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", want));
        }

        fake.answer(204, "");
        c.delete_schedule("j", "s").await.unwrap();
        let r = fake.last();
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("DELETE", "/v1/schedules/j/s")
        );

        fake.answer(
            201,
            r#"{"id":"t1","job":"j","entry":"s","type":"t","eta":"2026-11-30T06:00:00.000Z"}"#,
        );
        let fired = c.trigger_schedule("j", "s").await.unwrap();
        assert_eq!((fired.id.as_str(), fired.entry.as_str()), ("t1", "s"));
        assert_eq!(fake.last().path, "/v1/schedules/j/s/trigger");

        fake.answer(200, r#"{"firings":5,"created":3}"#);
        let from = Utc.with_ymd_and_hms(2026, 11, 1, 0, 0, 0).unwrap();
        let result = c
            .backfill_schedule("j", "s", from, from + chrono::Duration::hours(5))
            .await
            .unwrap();
        assert_eq!((result.firings, result.created), (5, 3));
        let r = fake.last();
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("POST", "/v1/schedules/j/s/backfill")
        );
        assert_eq!(
            r.body,
            json!({"from": "2026-11-01T00:00:00.000Z", "to": "2026-11-01T05:00:00.000Z"})
        );

        fake.answer(
            409,
            r#"{"error":{"code":"schedule_exists","message":"name: taken","field":"name"}}"#,
        );
        let err = c.create_schedule("j", "s", &spec).await.unwrap_err();
        assert!(err.is(&ErrorCode::ScheduleExists), "{err}");
        assert_eq!(err.api().unwrap().field.as_deref(), Some("name"));
        fake.answer(
            409,
            r#"{"error":{"code":"schedule_read_only","message":"config"}}"#,
        );
        let err = c.delete_schedule("j", "nightly").await.unwrap_err();
        assert!(err.is(&ErrorCode::ScheduleReadOnly), "{err}");
        let err = c.put_schedule("j", "nightly", &spec).await.unwrap_err();
        assert_eq!(err.status(), Some(409));
    }

    #[tokio::test]
    async fn job_overview_and_bulk_dead_letters() {
        let job = r#"{"job":"j","task_type":"t","paused":false,"paused_at":null,"paused_by_config":false,
            "effective_concurrency":6,
            "stats":{"due":3,"scheduled":4,"running":1,"dead":2,"oldest_due_seconds":1.5,
                     "finished_last_minute":{"succeeded":120,"dead":1}},
            "cron":[{"name":"nightly","schedule":"CRON_TZ=UTC 0 2 * * *","next":["2026-12-01T02:00:00.000Z"],"overlap":"Allow","catch_up":"1h","paused":false}]}"#;
        let (fake, c) = Fake::start(200, &format!(r#"{{"jobs":[{job}]}}"#)).await;
        let jobs = c.jobs().await.unwrap();
        assert_eq!(fake.last().path, "/v1/jobs");
        assert_eq!(jobs.len(), 1);
        assert_eq!(
            (
                jobs[0].status.job.as_str(),
                jobs[0].stats.due,
                jobs[0].stats.finished_last_minute.succeeded
            ),
            ("j", 3, 120)
        );
        assert_eq!(jobs[0].cron[0].name, "nightly");
        fake.answer(200, job);
        let one = c.job("j/1").await.unwrap();
        assert_eq!(one.stats.oldest_due_seconds, Some(1.5));
        assert_eq!(one.effective_concurrency, 6);
        assert_eq!(fake.last().path, "/v1/jobs/j%2F1");

        fake.answer(
            200,
            r#"{"matched":5,"affected":5,"skipped":0,"remaining":0,"dry_run":false,"dead_before":"2026-12-01T00:00:00.000Z"}"#,
        );
        let filter = DeadLetterBulk {
            job: Some("j".into()),
            error_prefix: Some("boom".into()),
            dry_run: true,
            ..DeadLetterBulk::default()
        };
        let result = c.redrive_dead_letters(&filter).await.unwrap();
        assert_eq!(
            (result.matched, result.affected, result.remaining),
            (5, 5, 0)
        );
        let r = fake.last();
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("POST", "/v1/dead-letters/redrive")
        );
        assert_eq!(
            r.body,
            json!({"job": "j", "error_prefix": "boom", "dry_run": true})
        );
        c.purge_dead_letters(&filter).await.unwrap();
        assert_eq!(fake.last().path, "/v1/dead-letters/purge");
    }

    #[tokio::test]
    async fn heartbeat_and_result_bodies() {
        let (fake, c) = Fake::start(200, r#"{"lease_until":"2026-11-30T06:00:00.000Z"}"#).await;
        let until = c
            .heartbeat("t1", "tok-7", Some(Duration::from_secs(60)))
            .await
            .unwrap();
        assert_eq!(until, Utc.with_ymd_and_hms(2026, 11, 30, 6, 0, 0).unwrap());
        let r = fake.last();
        assert_eq!(r.path, "/v1/tasks/t1/heartbeat");
        assert_eq!(r.body, json!({"lease_token": "tok-7", "lease": "1m"}));
        c.heartbeat("t1", "tok-7", None).await.unwrap();
        assert_eq!(fake.last().body, json!({"lease_token": "tok-7"}));

        fake.answer(200, r#"{"id":"t1","state":"pending"}"#);
        c.post_result(
            "t1",
            &TaskResult {
                lease_token: "tok-7".into(),
                status: ResultStatus::Retry,
                error: Some("later".into()),
                output: None,
                retry_after: Some(Duration::from_secs(10)),
            },
        )
        .await
        .unwrap();
        let r = fake.last();
        assert_eq!(r.path, "/v1/tasks/t1/result");
        assert_eq!(
            r.body,
            json!({"lease_token": "tok-7", "status": "retry", "error": "later", "retry_after": "10s"})
        );
    }

    #[test]
    fn task_builders() {
        #[derive(Serialize)]
        struct Order {
            order_id: u32,
        }
        let t = Task::with_payload("cancel_expired_order", &Order { order_id: 42 })
            .unwrap()
            .derive_idempotency_key(&["order_id"])
            .unwrap()
            .eta(Utc::now())
            .delay(Duration::from_secs(1));
        assert_eq!(t.payload, json!({"order_id": 42}));
        assert_eq!(
            t.idempotency_key.as_deref(),
            Some("4f9784bc13ff28f2e3c837ee03f702799786b4884f81c72d5c39674f90774eec")
        );
        assert!(
            t.eta.is_none() && t.delay.is_some(),
            "the last of delay/eta wins"
        );
        assert!(TaskState::Dead.is_final() && !TaskState::Running.is_final());
        assert_eq!(escape("a/b c~é"), "a%2Fb%20c~%C3%A9");
    }
}
