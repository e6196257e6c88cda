//! JSON examples of every wire shape, built from the contract types. The Go and
//! Python SDK tests read them from `contract/fixtures/` and check that their own types
//! decode and re-encode each one to the same JSON, and that their signing reproduces
//! `signature.json`.

use serde::Serialize;
use serde_json::{Value, json};

use crate::time::from_millis;
use crate::*;

/// One fixture: `contract/fixtures/<name>.json`.
pub struct Fixture {
    pub name: &'static str,
    pub json: Value,
}

/// The file's text: pretty JSON and a final newline.
impl Fixture {
    pub fn text(&self) -> String {
        serde_json::to_string_pretty(&self.json).expect("JSON renders") + "\n"
    }
}

fn fixture(name: &'static str, value: &impl Serialize) -> Fixture {
    Fixture {
        name,
        json: serde_json::to_value(value).expect("contract types serialize"),
    }
}

const ID: &str = "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b";
const DEP_ID: &str = "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a50";
const ETA: i64 = 1_796_025_600_123; // 2026-11-30T08:00:00.123Z
const NOW: i64 = 1_796_024_700_000;

fn schedule_spec() -> ScheduleSpec {
    ScheduleSpec {
        cron: Some("CRON_TZ=Europe/Berlin 0 9 * * MON".into()),
        payload: json!({"customer": 42, "week_of": "{{scheduled_at}}"}),
        priority: 3,
        overlap: CronOverlap::BufferOne,
        catch_up: Some("1h".into()),
        start_at: Some(from_millis(NOW)),
        end_at: None,
        jitter: Some("5m".into()),
        paused: false,
        ..ScheduleSpec::default()
    }
}

fn schedule() -> Schedule {
    Schedule {
        job: "send-email".into(),
        name: "weekly-42".into(),
        task_type: "email".into(),
        source: ScheduleSource::Api,
        spec: schedule_spec(),
        next_firing: Some(from_millis(ETA)),
        last_firing: Some(from_millis(NOW - 7 * 86_400_000)),
        last_task_id: Some(ID.into()),
        buffered_firing: None,
        fired: 12,
        created_at: from_millis(NOW - 90 * 86_400_000),
        updated_at: from_millis(NOW - 86_400_000),
    }
}

/// One example of each error code, with the members it carries.
fn errors() -> Vec<(ErrorCode, ErrorBody)> {
    let with = |code: ErrorCode, message: &str, f: &dyn Fn(&mut ErrorObject)| {
        let mut error = ErrorObject::new(code.clone(), message);
        f(&mut error);
        (code, ErrorBody { error })
    };
    vec![
        with(
            ErrorCode::MalformedJson,
            "priority: invalid type: string \"high\", expected i64",
            &|o| o.field = Some("priority".into()),
        ),
        with(
            ErrorCode::InvalidField,
            "delay: must not be negative",
            &|o| o.field = Some("delay".into()),
        ),
        with(
            ErrorCode::UnknownTaskType,
            "type: no AsyncJobConfig declares task type \"nope\"",
            &|o| o.field = Some("type".into()),
        ),
        with(
            ErrorCode::PayloadTooLarge,
            "payload: 2000000 bytes is over the limit of 1048576 bytes",
            &|o| o.field = Some("payload".into()),
        ),
        with(ErrorCode::NotFound, &format!("no task {ID}"), &|_| {}),
        with(
            ErrorCode::UniqueConflict,
            &format!("unique_key: task {ID} with this key is still pending"),
            &|o| {
                o.field = Some("unique_key".into());
                o.existing_id = Some(ID.into());
            },
        ),
        with(
            ErrorCode::IdempotencyMismatch,
            &format!(
                "idempotency_key: task {ID} was submitted with this key and another type or \
                 payload; use a new key for a new request"
            ),
            &|o| {
                o.field = Some("idempotency_key".into());
                o.existing_id = Some(ID.into());
            },
        ),
        with(
            ErrorCode::NotCancellable,
            &format!("task {ID} is running and can no longer be cancelled"),
            &|o| o.state = Some(TaskState::Running),
        ),
        with(
            ErrorCode::StaleLease,
            "lease_token: not the current attempt of this task",
            &|o| o.field = Some("lease_token".into()),
        ),
        with(
            ErrorCode::NotDead,
            &format!("task {ID} is pending, not in dead letters"),
            &|o| o.state = Some(TaskState::Pending),
        ),
        with(
            ErrorCode::TaskStarted,
            &format!("task {ID} is running: it has begun and can no longer be changed"),
            &|o| o.state = Some(TaskState::Running),
        ),
        with(
            ErrorCode::Throttled,
            &format!(
                "throttle: task {ID} was stored under this key within the throttle's period; \
                 the window closes at 2026-12-01T09:01:00.000Z"
            ),
            &|o| {
                o.field = Some("throttle".into());
                o.existing_id = Some(ID.into());
            },
        ),
        with(
            ErrorCode::ScheduleExists,
            "name: job send-email already has a schedule named weekly-42",
            &|o| o.field = Some("name".into()),
        ),
        with(
            ErrorCode::ScheduleReadOnly,
            "schedule nightly of job send-email is its config's spec.cron entry: change the config",
            &|_| {},
        ),
        with(
            ErrorCode::TaskCancelled,
            &format!("task {ID} was cancelled while this attempt ran; stop, nothing is recorded"),
            &|o| o.state = Some(TaskState::Cancelled),
        ),
        with(
            ErrorCode::Unauthenticated,
            "Authorization: a bearer token is required",
            &|_| {},
        ),
        with(
            ErrorCode::Forbidden,
            "not allowed to submit tasks of job send-email",
            &|_| {},
        ),
        with(
            ErrorCode::StoreUnavailable,
            "the task store is unavailable; retry",
            &|_| {},
        ),
        with(
            ErrorCode::KafkaUnavailable,
            "the task was not accepted: Kafka did not acknowledge it (timed out); retry",
            &|_| {},
        ),
        with(
            ErrorCode::AuthUnavailable,
            "the Kubernetes API did not answer the token review; retry",
            &|_| {},
        ),
        with(
            ErrorCode::ClockSkew,
            "this process's clock is 2000 ms ahead of the store's (±1 ms), beyond the 500 ms allowed; not dispatching until it is fixed",
            &|_| {},
        ),
        with(
            ErrorCode::SigningUnavailable,
            "job order-cancel is not dispatched: key \"key\" of signing Secret \"order-cancel-signing\" cannot be read",
            &|_| {},
        ),
    ]
}

fn task_status() -> TaskStatus {
    TaskStatus {
        id: ID.into(),
        task_type: "send_email".into(),
        payload: json!({"to": "a@b.c", "n": 12.5, "text": "Grüße 😀 \"q\"\n"}),
        state: TaskState::Succeeded,
        priority: 5,
        eta: from_millis(ETA),
        attempt: 2,
        max_retries: 3,
        idempotency_key: Some("order-42".into()),
        unique_key: None,
        depends_on: vec![DEP_ID.into()],
        last_error: Some("executor answered 503: busy".into()),
        result: Some(json!({"rows": 12})),
        lease_until: None,
        expires_at: Some(from_millis(ETA + 600_000)),
        created_at: from_millis(NOW),
        updated_at: from_millis(ETA + 1500),
    }
}

fn executor_call() -> ExecutorCall {
    ExecutorCall {
        id: ID.into(),
        task_type: "send_email".into(),
        payload: json!({"to": "a@b.c"}),
        attempt: 1,
        eta: Some(from_millis(ETA)),
    }
}

fn executor_batch_call() -> ExecutorBatchCall {
    let task =
        |id: &str, attempt: u32, idempotency_key: &str, lease_token: &str| ExecutorBatchTask {
            id: id.into(),
            task_type: "send_email".into(),
            payload: json!({"to": "a@b.c"}),
            attempt,
            eta: Some(from_millis(ETA)),
            idempotency_key: idempotency_key.into(),
            lease_token: lease_token.into(),
            traceparent: None,
            tracestate: None,
        };
    let mut traced = task(DEP_ID, 2, DEP_ID, &LEASE_TOKEN.replace('9', "7"));
    traced.traceparent = Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into());
    ExecutorBatchCall {
        tasks: vec![task(ID, 1, "order-42", LEASE_TOKEN), traced],
    }
}

/// `batch_signature.json`: a signed batch call and its canonical string, which is a
/// single call's with the four per-task header values empty (each task carries them in
/// the signed body).
fn batch_signature_vector() -> Value {
    let body = serde_json::to_string(&executor_batch_call()).expect("JSON renders");
    let timestamp = SIGNING_TIMESTAMP.to_string();
    let call = SignedCall {
        timestamp: &timestamp,
        task_id: "",
        attempt: "",
        idempotency_key: "",
        lease_token: "",
        callback_url: "http://10.0.0.7:7700",
        body: body.as_bytes(),
    };
    let primary = SIGNING_KEYS[0].1.as_bytes();
    json!({
        "keys": SIGNING_KEYS.iter().map(|(n, k)| (n.to_string(), json!(k))).collect::<serde_json::Map<_, _>>(),
        "canonical": String::from_utf8(call.canonical()).expect("UTF-8"),
        "headers": {
            (headers::BATCH): "2",
            (headers::TIMESTAMP): timestamp,
            (headers::CALLBACK_URL): "http://10.0.0.7:7700",
            (headers::SIGNATURE): sign(&[primary], &call).expect("a key is set"),
        },
        "body": body,
        "now": SIGNING_TIMESTAMP,
    })
}

/// The signing keys of `signature.json`: the primary, and the one being rotated out.
pub const SIGNING_KEYS: [(&str, &str); 2] = [("primary", "s3cret"), ("secondary", "0ld-s3cret")];
pub const SIGNING_TIMESTAMP: i64 = 1_700_000_000;
/// A lease token as the server makes them (64 hex digits).
pub const LEASE_TOKEN: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

/// `signature.json`: a signed executor call (headers and body) and the verification
/// cases every SDK's executor helper must decide alike. A replay is a second call with
/// the same task id, attempt and lease token (a redriven task starts at attempt 1 again,
/// with a new token). Each case runs its steps, in
/// order, against one fresh verifier holding the named keys; `want` is `ok`, `mismatch`,
/// `stale`, `malformed_timestamp` or `replay`.
fn signature_vectors(body: &str) -> Value {
    let key = |name: &str| {
        SIGNING_KEYS
            .iter()
            .find(|(n, _)| *n == name)
            .expect("a named key")
            .1
            .as_bytes()
    };
    let headers_with = |timestamp: i64, attempt: u32, lease_token: &str, signers: &[&str]| {
        let timestamp = timestamp.to_string();
        let attempt = attempt.to_string();
        let call = SignedCall {
            timestamp: &timestamp,
            task_id: ID,
            attempt: &attempt,
            idempotency_key: "order-42",
            lease_token,
            callback_url: "http://10.0.0.7:7700",
            body: body.as_bytes(),
        };
        let keys: Vec<&[u8]> = signers.iter().map(|n| key(n)).collect();
        json!({
            (headers::TIMESTAMP): timestamp,
            (headers::TASK_ID): ID,
            (headers::ATTEMPT): attempt,
            (headers::IDEMPOTENCY_KEY): "order-42",
            (headers::LEASE_TOKEN): lease_token,
            (headers::CALLBACK_URL): "http://10.0.0.7:7700",
            (headers::SIGNATURE): sign(&keys, &call).expect("keys are set"),
        })
    };
    let headers = |timestamp: i64, attempt: u32, signers: &[&str]| {
        headers_with(timestamp, attempt, LEASE_TOKEN, signers)
    };
    let with = |mut headers: Value, name: &str, value: &str| {
        headers[name] = json!(value);
        headers
    };
    let t = SIGNING_TIMESTAMP;
    let step = |headers: Value, now: i64, want: &str| json!({"headers": headers, "body": body, "now": now, "want": want});
    let case = |name: &str, keys: &[&str], steps: Vec<Value>| json!({"name": name, "keys": keys, "steps": steps});
    let canonical = String::from_utf8(
        SignedCall {
            timestamp: &t.to_string(),
            task_id: ID,
            attempt: "1",
            idempotency_key: "order-42",
            lease_token: LEASE_TOKEN,
            callback_url: "http://10.0.0.7:7700",
            body: body.as_bytes(),
        }
        .canonical(),
    )
    .expect("UTF-8");
    let signed = headers(t, 1, &["primary"]);
    json!({
        "keys": SIGNING_KEYS.iter().map(|(n, k)| (n.to_string(), json!(k))).collect::<serde_json::Map<_, _>>(),
        "tolerance_seconds": SIGNATURE_TOLERANCE.as_secs(),
        "canonical": canonical,
        "headers": signed,
        "body": body,
        "cases": [
            case("signed with the primary key", &["primary"], vec![step(signed.clone(), t, "ok")]),
            case("within the window, late", &["primary"], vec![step(signed.clone(), t + 300, "ok")]),
            case("within the window, early", &["primary"], vec![step(signed.clone(), t - 300, "ok")]),
            case("stale timestamp", &["primary"], vec![step(signed.clone(), t + 301, "stale")]),
            case("timestamp from the future", &["primary"], vec![step(signed.clone(), t - 301, "stale")]),
            case("missing timestamp", &["primary"], vec![step(with(signed.clone(), headers::TIMESTAMP, ""), t, "malformed_timestamp")]),
            case("timestamp not the signed one", &["primary"], vec![step(with(signed.clone(), headers::TIMESTAMP, &(t + 1).to_string()), t, "mismatch")]),
            case("another lease token", &["primary"], vec![step(with(signed.clone(), headers::LEASE_TOKEN, &LEASE_TOKEN.replace('9', "8")), t, "mismatch")]),
            case("another callback url", &["primary"], vec![step(with(signed.clone(), headers::CALLBACK_URL, "http://evil.example:7700"), t, "mismatch")]),
            case("another attempt", &["primary"], vec![step(with(signed.clone(), headers::ATTEMPT, "2"), t, "mismatch")]),
            case("another idempotency key", &["primary"], vec![step(with(signed.clone(), headers::IDEMPOTENCY_KEY, "order-43"), t, "mismatch")]),
            case("another task id", &["primary"], vec![step(with(signed.clone(), headers::TASK_ID, DEP_ID), t, "mismatch")]),
            case("tampered body", &["primary"], vec![json!({"headers": signed, "body": body.replace("a@b.c", "x@b.c"), "now": t, "want": "mismatch"})]),
            case("signed with a key the verifier lacks", &["primary"], vec![step(headers(t, 1, &["secondary"]), t, "mismatch")]),
            case("unsigned", &["primary"], vec![step(with(signed.clone(), headers::SIGNATURE, ""), t, "mismatch")]),
            case("the old v1 scheme", &["primary"], vec![step(with(signed.clone(), headers::SIGNATURE, &signed[headers::SIGNATURE].as_str().unwrap().replace("v2=", "v1=")), t, "mismatch")]),
            case("rotation: signed with both keys, verifier on the new key", &["primary"], vec![step(headers(t, 1, &["primary", "secondary"]), t, "ok")]),
            case("rotation: signed with both keys, verifier still on the old key", &["secondary"], vec![step(headers(t, 1, &["primary", "secondary"]), t, "ok")]),
            case("rotation: signed with the old key, verifier holding both", &["primary", "secondary"], vec![step(headers(t, 1, &["secondary"]), t, "ok")]),
            case("replay of the same task and attempt", &["primary"], vec![
                step(signed.clone(), t, "ok"),
                step(signed.clone(), t + 10, "replay"),
            ]),
            case("a replay refused even when signed anew", &["primary"], vec![
                step(signed.clone(), t, "ok"),
                step(headers(t + 5, 1, &["primary"]), t + 10, "replay"),
            ]),
            case("the next attempt is not a replay", &["primary"], vec![
                step(signed.clone(), t, "ok"),
                step(headers(t + 60, 2, &["primary"]), t + 60, "ok"),
            ]),
            case("a redriven task (attempt 1 again, a new lease token) is not a replay", &["primary"], vec![
                step(signed.clone(), t, "ok"),
                step(headers_with(t + 60, 1, &LEASE_TOKEN.replace('9', "7"), &["primary"]), t + 60, "ok"),
            ]),
            case("a refused call is not remembered", &["primary"], vec![
                step(with(signed.clone(), headers::LEASE_TOKEN, "forged"), t, "mismatch"),
                step(signed.clone(), t, "ok"),
            ]),
        ],
    })
}

/// Every fixture, in file-name order.
/// An overview of one job with a cron entry and one without.
fn jobs() -> JobList {
    let stats = JobStats {
        due: 12,
        scheduled: 340,
        running: 4,
        dead: 2,
        oldest_due_seconds: Some(1.25),
        finished_last_minute: FinishedCounts {
            succeeded: 600,
            dead: 1,
        },
    };
    JobList {
        jobs: vec![
            JobOverview {
                status: JobStatus {
                    job: "order-cancel-job".into(),
                    task_type: "cancel_expired_order".into(),
                    paused: true,
                    paused_at: Some(from_millis(NOW)),
                    paused_by_config: false,
                },
                effective_concurrency: 8,
                stats: stats.clone(),
                cron: vec![CronOverview {
                    name: "nightly".into(),
                    schedule: "CRON_TZ=Europe/Berlin 0 3 * * *".into(),
                    // 03:00 in Berlin, from 2026-12-01 on.
                    next: [0, 1, 2]
                        .map(|day| from_millis(1_796_090_400_000 + day * 86_400_000))
                        .to_vec(),
                    overlap: CronOverlap::Skip,
                    catch_up: "1h".into(),
                    paused: false,
                }],
            },
            JobOverview {
                status: JobStatus {
                    job: "send-email-job".into(),
                    task_type: "send_email".into(),
                    paused: false,
                    paused_at: None,
                    paused_by_config: false,
                },
                effective_concurrency: 100,
                stats: JobStats {
                    oldest_due_seconds: None,
                    due: 0,
                    ..stats
                },
                cron: vec![],
            },
        ],
    }
}

pub fn all() -> Vec<Fixture> {
    let submit = SubmitRequest {
        payload: Some(json!({"to": "a@b.c"})),
        delay: Some("90s".into()),
        start_within: Some("10m".into()),
        priority: Some(5),
        idempotency_key: Some("order-42".into()),
        unique_key: Some("order:42".into()),
        max_retries: Some(3),
        timeout: Some("30s".into()),
        depends_on: Some(vec![DEP_ID.into()]),
        source_service: Some("orders".into()),
        ..SubmitRequest::new("send_email")
    };
    let accepted = SubmitResult {
        id: ID.into(),
        eta: from_millis(ETA),
        route: Route::Store,
        duplicate: false,
        debounced: false,
        dropped: false,
    };
    let refused = errors()
        .into_iter()
        .find(|(code, _)| *code == ErrorCode::UnknownTaskType)
        .expect("an unknown_task_type example")
        .1;
    let body = serde_json::to_vec(&executor_call()).expect("serializes");
    let body = String::from_utf8(body).expect("JSON is UTF-8");
    let mut fixtures = vec![
        fixture("submit_request", &submit),
        fixture("submit_response", &accepted),
        fixture(
            "submit_response_debounced",
            &SubmitResult {
                debounced: true,
                ..accepted.clone()
            },
        ),
        fixture(
            "batch_request",
            &BatchRequest {
                // What every SDK sends: a payload (null here) and an idempotency key.
                tasks: vec![
                    submit.clone(),
                    SubmitRequest {
                        payload: Some(Value::Null),
                        idempotency_key: Some("order-43".into()),
                        source_service: Some("orders".into()),
                        ..SubmitRequest::new("nope")
                    },
                ],
            },
        ),
        fixture(
            "batch_response",
            &BatchResponse {
                results: vec![
                    BatchItemResult {
                        status: 201,
                        outcome: BatchOutcome::Accepted(SubmitResult {
                            route: Route::Kafka,
                            ..accepted.clone()
                        }),
                    },
                    BatchItemResult {
                        status: 400,
                        outcome: BatchOutcome::Refused(refused),
                    },
                ],
            },
        ),
        fixture("task_status", &task_status()),
        fixture(
            "cancel_response",
            &CancelResult {
                id: ID.into(),
                state: TaskState::Cancelled,
            },
        ),
        fixture(
            "dead_letters_response",
            &DeadLetters {
                items: vec![TaskStatus {
                    state: TaskState::Dead,
                    result: None,
                    unique_key: Some("order:42".into()),
                    idempotency_key: None,
                    depends_on: vec![],
                    ..task_status()
                }],
                truncated: false,
                next_cursor: None,
            },
        ),
        fixture(
            "kafka_dead_letters_response",
            &KafkaDeadLetterPage {
                items: vec![KafkaDeadLetterStatus {
                    topic: "asyncd.send_email".into(),
                    partition: 2,
                    offset: 41,
                    message_base64: "bm90IGpzb24=".into(),
                    message_size: 8,
                    reason: "not an asyncd task envelope: expected value at line 1 column 1".into(),
                    recorded_at: from_millis(NOW),
                }],
                truncated: false,
                next_cursor: Some("1764547200000.2.41.asyncd.send_email".into()),
            },
        ),
        fixture(
            "kafka_dead_letter_purge_request",
            &KafkaDeadLetterPurge {
                recorded_before: from_millis(NOW),
                limit: Some(1000),
            },
        ),
        fixture(
            "kafka_dead_letter_purge_response",
            &KafkaDeadLetterPurgeResult { purged: 1000 },
        ),
        fixture(
            "redrive_response",
            &RedriveResult {
                id: ID.into(),
                state: TaskState::Pending,
                eta: from_millis(NOW),
            },
        ),
        fixture("jobs_response", &jobs()),
        fixture(
            "dead_letter_bulk_request",
            &DeadLetterBulk {
                job: Some("send-email".into()),
                error_prefix: Some("executor answered 503".into()),
                dead_before: Some(from_millis(NOW)),
                dry_run: true,
                ..DeadLetterBulk::default()
            },
        ),
        fixture(
            "dead_letter_bulk_response",
            &DeadLetterBulkResult {
                matched: 1500,
                affected: 1000,
                skipped: 0,
                remaining: 500,
                dry_run: false,
                dead_before: from_millis(NOW),
            },
        ),
        fixture(
            "schedule_create_request",
            &ScheduleCreate {
                job: "send-email".into(),
                name: "weekly-42".into(),
                spec: schedule_spec(),
            },
        ),
        fixture("schedule_response", &schedule()),
        fixture(
            "change_pending_response",
            &PendingChange {
                id: ID.into(),
                job: "send-email".into(),
                task_type: "email".into(),
                consumed: false,
            },
        ),
        fixture(
            "schedules_response",
            &SchedulePage {
                items: vec![schedule()],
                next_cursor: Some("weekly-42".into()),
            },
        ),
        fixture(
            "backfill_request",
            &BackfillRequest {
                from: from_millis(NOW - 7 * 86_400_000),
                to: from_millis(NOW),
            },
        ),
        fixture(
            "backfill_response",
            &BackfillResult {
                firings: 7,
                created: 6,
            },
        ),
        fixture("executor_call", &executor_call()),
        fixture("executor_batch_call", &executor_batch_call()),
        fixture(
            "executor_batch_answer",
            &ExecutorBatchAnswer {
                results: vec![
                    ExecutorBatchResult {
                        id: ID.into(),
                        status: ExecutorBatchStatus::Success,
                        error: None,
                        retry_after: None,
                        lease: None,
                    },
                    ExecutorBatchResult {
                        id: DEP_ID.into(),
                        status: ExecutorBatchStatus::Retry,
                        error: Some("downstream busy".into()),
                        retry_after: Some("30s".into()),
                        lease: None,
                    },
                ],
            },
        ),
        Fixture {
            name: "batch_signature",
            json: batch_signature_vector(),
        },
        fixture(
            "executor_accepted",
            &ExecutorAccepted {
                lease: Some("1m 30s".into()),
                lease_seconds: None,
            },
        ),
        fixture(
            "heartbeat_request",
            &HeartbeatRequest {
                lease_token: Some(LEASE_TOKEN.into()),
                lease: Some("1m".into()),
            },
        ),
        fixture(
            "heartbeat_response",
            &HeartbeatResponse {
                lease_until: from_millis(ETA + 60_000),
            },
        ),
        fixture(
            "result_request",
            &ResultRequest::<Value> {
                lease_token: Some(LEASE_TOKEN.into()),
                status: Some(ResultStatus::Retry),
                error: Some("db down".into()),
                output: None,
                retry_after: Some("10s".into()),
            },
        ),
        fixture(
            "result_request_success",
            &ResultRequest::<Value> {
                lease_token: Some(LEASE_TOKEN.into()),
                status: Some(ResultStatus::Success),
                error: None,
                output: Some(json!({"rows": 12})),
                retry_after: None,
            },
        ),
        fixture(
            "result_response",
            &ResultAck {
                id: ID.into(),
                state: TaskState::Succeeded,
            },
        ),
        Fixture {
            name: "errors",
            json: Value::Array(
                errors()
                    .into_iter()
                    .map(|(code, body)| {
                        json!({"status": code.status().expect("a server code"), "body": body})
                    })
                    .collect(),
            ),
        },
        Fixture {
            name: "signature",
            json: signature_vectors(&body),
        },
    ];
    fixtures.sort_by_key(|f| f.name);
    fixtures
}
