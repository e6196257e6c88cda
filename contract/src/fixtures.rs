//! JSON examples of every wire shape, built from the contract types. The Go and
//! Python SDK tests read them from `contract/fixtures/` and check that their own types
//! decode and re-encode each one to the same JSON, and that their signing reproduces
//! `signature.json`.

use serde::Serialize;
use serde_json::{Value, json};

use crate::time::from_millis;
use crate::*;

mod signing;

pub use signing::{LEASE_TOKEN, SIGNING_KEYS, SIGNING_TIMESTAMP};
use signing::{batch_signature_vector, signature_vectors};

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
                resting_keys: vec![],
                keys: vec![],
                limiters: vec![],
                tenant_weights: Default::default(),
                tenants: Vec::new(),
                binding_limit: Some(BindingLimit::Paused),
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
                resting_keys: vec![RestingKey {
                    key: "merchant:m7".into(),
                    until: from_millis(NOW + 30_000),
                }],
                keys: vec![
                    KeyUsage {
                        key: "merchant:m3".into(),
                        running: 2,
                        due: 40,
                    },
                    KeyUsage {
                        key: "merchant:m7".into(),
                        running: 0,
                        due: 12,
                    },
                ],
                tenant_weights: Default::default(),
                tenants: Vec::new(),
                limiters: vec![LimiterUsage {
                    name: "shop/mail-provider".into(),
                    concurrency: Some(20),
                    rate_per_second: Some(50),
                    running: 20,
                    task_types: vec!["send_email".into(), "send_sms".into()],
                }],
                binding_limit: None,
            },
        ],
    }
}

/// Every fixture, in file-name order.
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
