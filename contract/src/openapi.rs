//! `docs/openapi.json`: an OpenAPI 3.0 document of the API, its schemas generated
//! from the contract types. Request bodies are described as the server reads them
//! (what it accepts, `additionalProperties: false` where it refuses unknown fields),
//! answers as it writes them (every member it always sends is required).

use schemars::generate::{Contract, SchemaSettings};
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{Map, Value, json};

use crate::*;

/// The document as `docs/openapi.json` holds it: pretty JSON and a final newline.
pub fn text() -> String {
    serde_json::to_string_pretty(&document()).expect("JSON renders") + "\n"
}

struct Schemas {
    requests: SchemaGenerator,
    answers: SchemaGenerator,
}

impl Schemas {
    fn request<T: JsonSchema>(&mut self) -> Value {
        self.requests.subschema_for::<T>().to_value()
    }

    fn answer<T: JsonSchema>(&mut self) -> Value {
        self.answers.subschema_for::<T>().to_value()
    }

    /// Both generators' definitions; a type seen by both must come out the same.
    fn components(mut self) -> Map<String, Value> {
        let mut all = self.requests.take_definitions(true);
        for (name, schema) in self.answers.take_definitions(true) {
            if let Some(seen) = all.get(&name) {
                assert_eq!(
                    seen, &schema,
                    "schema {name} differs between requests and answers: give it two types"
                );
            }
            all.insert(name, schema);
        }
        all.sort_keys();
        all
    }
}

fn json_content(schema: Value) -> Value {
    json!({"application/json": {"schema": schema}})
}

fn ok(description: &str, schema: Value) -> Value {
    json!({"description": description, "content": json_content(schema)})
}

fn path_id(what: &str) -> Value {
    json!({"name": "id", "in": "path", "required": true, "description": what,
           "schema": {"type": "string"}})
}

fn trace_header(name: &str, what: &str) -> Value {
    json!({"name": name, "in": "header", "required": false, "description": what,
           "schema": {"type": "string"}})
}

/// The query parameters naming a task by its job and key; `idempotency_key` says what
/// that key reaches.
fn by_key(idempotency_key: &str) -> Value {
    json!([
        {"name": "job", "in": "query", "required": false, "description": "The AsyncJobConfig (or give type)",
         "schema": {"type": "string"}},
        {"name": "type", "in": "query", "required": false, "description": "The task type (or give job)",
         "schema": {"type": "string"}},
        {"name": "unique_key", "in": "query", "required": false,
         "description": "The unfinished task holding this unique key (give this or idempotency_key)",
         "schema": {"type": "string"}},
        {"name": "idempotency_key", "in": "query", "required": false,
         "description": idempotency_key, "schema": {"type": "string"}},
    ])
}

fn schedule_path() -> Value {
    json!([
        {"name": "job", "in": "path", "required": true,
         "description": "The AsyncJobConfig's name (metadata.name)", "schema": {"type": "string"}},
        {"name": "name", "in": "path", "required": true,
         "description": "The schedule's name, unique within its job", "schema": {"type": "string"}},
    ])
}

fn job_name() -> Value {
    json!({"name": "name", "in": "path", "required": true,
           "description": "The AsyncJobConfig's name (metadata.name)",
           "schema": {"type": "string"}})
}

fn lease_token_header() -> Value {
    json!({"name": headers::LEASE_TOKEN, "in": "header", "required": false,
           "description": "The attempt's lease token (opaque, 64 hex digits), when the body carries no `lease_token`.",
           "schema": {"type": "string"}})
}

fn text_plain(description: &str) -> Value {
    json!({"description": description, "content": {"text/plain": {"schema": {"type": "string"}}}})
}

/// Error answers by status: which codes each one carries.
fn errors(error: &Value, codes: &[ErrorCode]) -> Map<String, Value> {
    let mut by_status: Vec<(u16, Vec<&str>)> = Vec::new();
    for code in codes {
        let status = code.status().expect("a server code");
        match by_status.iter_mut().find(|(s, _)| *s == status) {
            Some((_, names)) => names.push(code.as_str()),
            None => by_status.push((status, vec![code.as_str()])),
        }
    }
    by_status.sort();
    by_status
        .into_iter()
        .map(|(status, names)| {
            let description = format!("Refused: {}", names.join(", "));
            (status.to_string(), ok(&description, error.clone()))
        })
        .collect()
}

/// What every public operation (one without `"security": []`) may also answer, whatever
/// its own refusals: the server's guard in front of them (docs/security.md, "Browsers")
/// refuses a foreign `Origin` or `Host` (403) and a write whose body is not JSON (415),
/// and `--auth kubernetes` an address over its rate of token reviews (429).
fn with_guard_refusals(mut paths: Value, error: &Value) -> Value {
    let operations = paths
        .as_object_mut()
        .expect("paths is an object")
        .values_mut()
        .flat_map(|item| item.as_object_mut().expect("a path item").iter_mut());
    for (key, operation) in operations {
        // A path item also holds the parameters its operations share.
        let write = match key.as_str() {
            "get" => false,
            "post" | "put" | "patch" | "delete" => true,
            _ => continue,
        };
        if operation.get("security") == Some(&json!([])) {
            continue;
        }
        let responses = operation["responses"]
            .as_object_mut()
            .expect("responses is an object");
        let mut add = |status: &str, description: &str| {
            responses
                .entry(status)
                .or_insert_with(|| ok(description, error.clone()));
        };
        add(
            "403",
            "Refused: forbidden (a foreign Origin, or an unexpected Host without --auth)",
        );
        add(
            "429",
            "Refused: auth_unavailable (--auth kubernetes: too many new tokens from this address)",
        );
        if write {
            add(
                "415",
                "Refused: malformed_json (a body not sent as application/json)",
            );
        }
    }
    paths
}

fn responses(success: &[(u16, Value)], errors: Map<String, Value>) -> Value {
    let mut all: Map<String, Value> = success
        .iter()
        .map(|(status, answer)| (status.to_string(), answer.clone()))
        .collect();
    all.extend(errors);
    Value::Object(all)
}

/// The whole document.
pub fn document() -> Value {
    let settings = |contract| SchemaSettings::openapi3().with(|s| s.contract = contract);
    let mut s = Schemas {
        requests: settings(Contract::Deserialize).into_generator(),
        answers: settings(Contract::Serialize).into_generator(),
    };
    use ErrorCode::*;
    let error = s.answer::<ErrorBody>();
    // Every body-reading endpoint refuses bodies over the size limit.
    let submit_errors = errors(
        &error,
        &[
            MalformedJson,
            InvalidField,
            UnknownTaskType,
            PayloadTooLarge,
            UniqueConflict,
            IdempotencyMismatch,
            StoreUnavailable,
            KafkaUnavailable,
            Unauthenticated,
            Forbidden,
            AuthUnavailable,
        ],
    );
    let callback_errors = errors(
        &error,
        &[
            MalformedJson,
            InvalidField,
            PayloadTooLarge,
            StaleLease,
            TaskCancelled,
            StoreUnavailable,
        ],
    );
    let submit_result = s.answer::<SubmitResult>();
    let task = s.answer::<TaskStatus>();
    let job = s.answer::<JobStatus>();
    let paths = json!({
        "/v1/tasks": {"get": {
            "operationId": "searchTasks",
            "summary": "Tasks matching every filter given, newest first, at most 8 MiB of them per answer",
            "parameters": [
                {"name": "job", "in": "query", "required": false, "description": "Only this AsyncJobConfig's tasks",
                 "schema": {"type": "string"}},
                {"name": "type", "in": "query", "required": false, "description": "Only this task type",
                 "schema": {"type": "string"}},
                {"name": "state", "in": "query", "required": false, "description": "Only tasks in this state",
                 "schema": {"type": "string", "enum": ["blocked", "pending", "claimed", "running", "succeeded", "dead", "cancelled"]}},
                {"name": "unique_key", "in": "query", "required": false, "description": "Only tasks with this unique key",
                 "schema": {"type": "string"}},
                {"name": "created_after", "in": "query", "required": false, "description": "Only tasks created after this instant (RFC 3339)",
                 "schema": {"type": "string", "format": "date-time"}},
                {"name": "eta_before", "in": "query", "required": false, "description": "Only tasks due before this instant (RFC 3339)",
                 "schema": {"type": "string", "format": "date-time"}},
                {"name": "limit", "in": "query", "required": false, "description": "At most this many (default 100)",
                 "schema": {"type": "integer", "minimum": 1, "maximum": 1000}},
                {"name": "cursor", "in": "query", "required": false,
                 "description": "The previous page's next_cursor: list what comes after it",
                 "schema": {"type": "string"}},
            ],
            "responses": responses(&[(200, ok("Tasks", s.answer::<TaskPage>()))],
                errors(&error, &[InvalidField, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
        }, "delete": {
            "operationId": "cancelByUniqueKey",
            "summary": "Cancel the task of a job holding a unique key (unfinished) or submitted with an idempotency key",
            "parameters": by_key("The task submitted with this idempotency key (404 when none holds it); on a job with a Kafka topic also before it is consumed, under the id the key derives (give this or unique_key)"),
            "responses": responses(&[(200, ok("Cancelled", s.answer::<CancelResult>()))],
                errors(&error, &[InvalidField, NotFound, NotCancellable, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
        }, "patch": {
            "operationId": "changeByKey",
            "summary": "Change the stored task of a job holding a unique key (unfinished) or submitted with an idempotency key, as PATCH /v1/tasks/{id} does; on a Kafka-routed job, a task by idempotency key also before it is consumed (202)",
            "parameters": by_key("The task submitted with this idempotency key (give this or unique_key)"),
            "requestBody": {"required": true, "content": json_content(s.request::<ChangeRequest>())},
            "responses": responses(&[(200, ok("The task, changed", task.clone())),
                (202, ok("Recorded for a task not consumed yet: it takes the change when stored", s.answer::<PendingChange>()))],
                errors(&error, &[MalformedJson, InvalidField, PayloadTooLarge, NotFound, TaskStarted, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
        }, "post": {
            "operationId": "submitTask",
            "summary": "Submit a task",
            "parameters": [{"name": headers::SOURCE_SERVICE, "in": "header", "required": false,
                "description": "Label for asyncd_task_submitted_total when the body names no source_service.",
                "schema": {"type": "string", "maxLength": 128}},
                trace_header(headers::TRACEPARENT, "W3C Trace Context: the task's trace, continued by every executor call. A malformed value is ignored."),
                trace_header(headers::TRACESTATE, "W3C Trace Context: passed on with traceparent (at most 512 printable ASCII bytes, else dropped).")],
            "requestBody": {"required": true, "content": json_content(s.request::<SubmitRequest>())},
            "responses": responses(&[
                (201, ok("Accepted", submit_result.clone())),
                (200, ok("A repeat of an idempotency key: the first task", submit_result)),
            ], submit_errors),
        }},
        "/v1/tasks:batch": {"post": {
            "operationId": "submitBatch",
            "summary": "Submit up to 1000 tasks; each is answered on its own",
            "parameters": [{"name": headers::SOURCE_SERVICE, "in": "header", "required": false,
                "schema": {"type": "string", "maxLength": 128}},
                trace_header(headers::TRACEPARENT, "W3C Trace Context: the trace of every task of the batch. A malformed value is ignored."),
                trace_header(headers::TRACESTATE, "W3C Trace Context: passed on with traceparent.")],
            "requestBody": {"required": true, "content": json_content(s.request::<BatchRequest>())},
            "responses": responses(&[(200, ok("One result per item, in order", s.answer::<BatchResponse>()))],
                errors(&error, &[MalformedJson, InvalidField, PayloadTooLarge, StoreUnavailable, Unauthenticated, AuthUnavailable])),
        }},
        "/v1/tasks/{id}": {
            "parameters": [path_id("The task id")],
            "get": {
                "operationId": "getTask",
                "summary": "Inspect a task",
                "responses": responses(&[(200, ok("The task", task.clone()))],
                    errors(&error, &[InvalidField, NotFound, StoreUnavailable, Unauthenticated, AuthUnavailable])),
            },
            "patch": {
                "operationId": "changeTask",
                "summary": "Change a task that has not begun, in place: its due time, payload or priority; with ?job= naming a Kafka-routed job, also one whose message has not been consumed (202)",
                "parameters": [
                    {"name": "job", "in": "query", "required": false,
                     "description": "A Kafka-routed job: change a task of it that is not in the store yet, ahead of consumption",
                     "schema": {"type": "string"}},
                ],
                "requestBody": {"required": true, "content": json_content(s.request::<ChangeRequest>())},
                "responses": responses(&[(200, ok("The task, changed", task.clone())),
                    (202, ok("Recorded for a task not consumed yet: it takes the change when stored", s.answer::<PendingChange>()))],
                    errors(&error, &[MalformedJson, InvalidField, PayloadTooLarge, NotFound, TaskStarted, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
            },
            "delete": {
                "operationId": "cancelTask",
                "summary": "Cancel a task that has not finished; a running attempt learns it on its next heartbeat",
                "parameters": [
                    {"name": "job", "in": "query", "required": false,
                     "description": "A Kafka-routed job: an id not consumed yet is recorded as cancelled",
                     "schema": {"type": "string"}},
                    {"name": "type", "in": "query", "required": false, "description": "The task type, instead of job",
                     "schema": {"type": "string"}},
                ],
                "responses": responses(&[(200, ok("Cancelled", s.answer::<CancelResult>()))],
                    errors(&error, &[InvalidField, NotFound, NotCancellable, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
            },
        },
        "/v1/tasks/{id}/heartbeat": {"post": {
            "operationId": "heartbeat", "security": [],
            "summary": "Keep a long-running attempt's lease",
            "parameters": [path_id("The task id"), lease_token_header()],
            "requestBody": {"required": false, "content": json_content(s.request::<HeartbeatRequest>())},
            "responses": responses(&[(200, ok("The new lease", s.answer::<HeartbeatResponse>()))],
                callback_errors.clone()),
        }},
        "/v1/tasks/{id}/result": {"post": {
            "operationId": "postResult", "security": [],
            "summary": "Report how a long-running attempt ended",
            "parameters": [path_id("The task id"), lease_token_header()],
            "requestBody": {"required": true, "content": json_content(s.request::<ResultRequest>())},
            "responses": responses(&[(200, ok("The state the task moved to", s.answer::<ResultAck>()))],
                callback_errors),
        }},
        "/v1/dead-letters": {"get": {
            "operationId": "deadLetters",
            "summary": "Dead tasks, latest due first, at most 8 MiB of them per answer",
            "parameters": [
                {"name": "type", "in": "query", "required": false, "description": "Only this task type",
                 "schema": {"type": "string"}},
                {"name": "limit", "in": "query", "required": false, "description": "At most this many (default 100)",
                 "schema": {"type": "integer", "minimum": 1, "maximum": 1000}},
                {"name": "cursor", "in": "query", "required": false,
                 "description": "The previous page's next_cursor: list what comes after it",
                 "schema": {"type": "string"}},
            ],
            "responses": responses(&[(200, ok("Dead tasks", s.answer::<DeadLetters>()))],
                errors(&error, &[InvalidField, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
        }},
        "/v1/dead-letters/redrive": {"post": {
            "operationId": "redriveDeadLetters",
            "summary": "Redrive up to `limit` dead letters matching a filter, oldest death first; repeat until none remain",
            "requestBody": {"required": true, "content": json_content(s.request::<DeadLetterBulk>())},
            "responses": responses(&[(200, ok("Counts", s.answer::<DeadLetterBulkResult>()))],
                errors(&error, &[MalformedJson, InvalidField, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
        }},
        "/v1/dead-letters/purge": {"post": {
            "operationId": "purgeDeadLetters",
            "summary": "Delete up to `limit` dead letters matching a filter, oldest death first; repeat until none remain",
            "requestBody": {"required": true, "content": json_content(s.request::<DeadLetterBulk>())},
            "responses": responses(&[(200, ok("Counts", s.answer::<DeadLetterBulkResult>()))],
                errors(&error, &[MalformedJson, InvalidField, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
        }},
        "/v1/dead-letters/{id}/redrive": {"post": {
            "operationId": "redrive",
            "summary": "Put a dead task back to pending, due now, attempts reset",
            "parameters": [path_id("The dead task's id")],
            "responses": responses(&[(200, ok("Redriven", s.answer::<RedriveResult>()))],
                errors(&error, &[InvalidField, NotFound, NotDead, UniqueConflict, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
        }},
        "/v1/kafka-dead-letters": {"get": {
            "operationId": "kafkaDeadLetters",
            "summary": "Kafka messages the consumer could not make tasks of, latest recorded first, at most 8 MiB of them per answer",
            "parameters": [
                {"name": "job", "in": "query", "required": false, "description": "Only the messages of this AsyncJobConfig's topic",
                 "schema": {"type": "string"}},
                {"name": "limit", "in": "query", "required": false, "description": "At most this many (default 100)",
                 "schema": {"type": "integer", "minimum": 1, "maximum": 1000}},
                {"name": "cursor", "in": "query", "required": false,
                 "description": "The previous page's next_cursor: list what comes after it",
                 "schema": {"type": "string"}},
            ],
            "responses": responses(&[(200, ok("Kafka dead letters", s.answer::<KafkaDeadLetterPage>()))],
                errors(&error, &[InvalidField, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
        }},
        "/v1/kafka-dead-letters/purge": {"post": {
            "operationId": "purgeKafkaDeadLetters",
            "summary": "Delete up to `limit` Kafka dead letters recorded before an instant, oldest first; repeat until fewer are purged",
            "requestBody": {"required": true, "content": json_content(s.request::<KafkaDeadLetterPurge>())},
            "responses": responses(&[(200, ok("Count", s.answer::<KafkaDeadLetterPurgeResult>()))],
                errors(&error, &[MalformedJson, InvalidField, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
        }},
        "/v1/jobs": {"get": {
            "operationId": "listJobs",
            "summary": "Every job the caller may read, sorted by name: pause, backlog, lateness, dead letters, finishes in the last minute, cron entries and their next firings",
            "responses": responses(&[(200, ok("The jobs", s.answer::<JobList>()))],
                errors(&error, &[StoreUnavailable, Unauthenticated, AuthUnavailable])),
        }},
        "/v1/limiters": {"get": {
            "operationId": "listLimiters",
            "summary": "Every AsyncLimiter named by a job the caller may read, sorted by name, with the attempts of its jobs running now (what the operator writes to each limiter's status.running)",
            "responses": responses(&[(200, ok("The limiters", s.answer::<LimiterList>()))],
                errors(&error, &[StoreUnavailable, Unauthenticated, AuthUnavailable])),
        }},
        "/v1/jobs/{name}": {
            "parameters": [job_name()],
            "get": {
                "operationId": "getJob",
                "summary": "How a job stands: paused or not, backlog, lateness, dead letters, finishes in the last minute, cron entries",
                "responses": responses(&[(200, ok("The job", s.answer::<JobOverview>()))],
                    errors(&error, &[InvalidField, NotFound, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
            },
        },
        "/v1/jobs/{name}/pause": {"post": {
            "operationId": "pauseJob",
            "summary": "Pause a job: no attempt of it begins, its tasks wait in the store (idempotent)",
            "parameters": [job_name()],
            "responses": responses(&[(200, ok("Paused", job.clone()))],
                errors(&error, &[InvalidField, NotFound, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
        }},
        "/v1/jobs/{name}/resume": {"post": {
            "operationId": "resumeJob",
            "summary": "Lift the API's pause of a job; its waiting tasks run in order (idempotent)",
            "parameters": [job_name()],
            "responses": responses(&[(200, ok("Resumed, or still paused by its config", job))],
                errors(&error, &[InvalidField, NotFound, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
        }},
        "/v1/jobs/{name}/tenants/{tenant}/weight": {
            "parameters": [job_name(),
                {"name": "tenant", "in": "path", "required": true,
                 "description": "A tenant of the job's spec.fairness, as its tenant template renders it",
                 "schema": {"type": "string"}}],
            "put": {
                "operationId": "setTenantWeight",
                "summary": "Give a tenant of a spec.fairness job a weight in its fair claim, in place of the spec's, from the next claim on",
                "requestBody": {"required": true, "content": json_content(s.request::<TenantWeightRequest>())},
                "responses": responses(&[(200, ok("The weight set", s.answer::<TenantWeight>()))],
                    errors(&error, &[MalformedJson, InvalidField, PayloadTooLarge, NotFound, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
            },
            "delete": {
                "operationId": "resetTenantWeight",
                "summary": "Give a tenant back the weight its job's spec.fairness gives it (idempotent)",
                "responses": responses(&[(200, ok("The spec's weight", s.answer::<TenantWeight>()))],
                    errors(&error, &[InvalidField, NotFound, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
            },
        },
        "/v1/jobs/{name}/cron/{entry}/trigger": {"post": {
            "operationId": "triggerCron",
            "summary": "Fire a cron entry of a job, or one of its API schedules, once, now, besides its schedule: a new task with the entry's payload and priority",
            "parameters": [job_name(),
                {"name": "entry", "in": "path", "required": true,
                 "description": "The cron entry's name (spec.cron[].name)",
                 "schema": {"type": "string"}}],
            "responses": responses(&[(201, ok("The task it fired", s.answer::<CronTriggerResult>()))],
                errors(&error, &[InvalidField, NotFound, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
        }},
        "/v1/schedules": {
            "post": {
                "operationId": "createSchedule",
                "summary": "Create a schedule of a job: a cron (with its time zone) or an interval, firing tasks of the job (docs/api.md, Schedules)",
                "requestBody": {"required": true, "content": json_content(s.request::<ScheduleCreate>())},
                "responses": responses(&[(201, ok("The schedule", s.answer::<Schedule>()))],
                    errors(&error, &[MalformedJson, InvalidField, PayloadTooLarge, NotFound, ScheduleExists, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
            },
            "get": {
                "operationId": "listSchedules",
                "summary": "A job's schedules by name, its config's cron entries among them (source: config)",
                "parameters": [
                    {"name": "job", "in": "query", "required": true, "description": "The AsyncJobConfig whose schedules to list",
                     "schema": {"type": "string"}},
                    {"name": "limit", "in": "query", "required": false, "description": "At most this many (default 100)",
                     "schema": {"type": "integer", "minimum": 1, "maximum": MAX_SCHEDULE_PAGE}},
                    {"name": "cursor", "in": "query", "required": false,
                     "description": "The previous page's next_cursor: list what comes after it",
                     "schema": {"type": "string"}},
                ],
                "responses": responses(&[(200, ok("Schedules", s.answer::<SchedulePage>()))],
                    errors(&error, &[InvalidField, NotFound, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
            },
        },
        "/v1/schedules/{job}/{name}": {
            "parameters": schedule_path(),
            "get": {
                "operationId": "getSchedule",
                "summary": "A schedule and where it stands: its next firing, its last, what it holds back",
                "responses": responses(&[(200, ok("The schedule", s.answer::<Schedule>()))],
                    errors(&error, &[InvalidField, NotFound, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
            },
            "put": {
                "operationId": "putSchedule",
                "summary": "Create the schedule, or write over it: it starts again with its next firing",
                "requestBody": {"required": true, "content": json_content(s.request::<ScheduleSpec>())},
                "responses": responses(&[(200, ok("Written over", s.answer::<Schedule>())), (201, ok("Created", s.answer::<Schedule>()))],
                    errors(&error, &[MalformedJson, InvalidField, PayloadTooLarge, NotFound, ScheduleReadOnly, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
            },
            "patch": {
                "operationId": "changeSchedule",
                "summary": "Change members of a schedule (a null clears one); it starts again with its next firing",
                "requestBody": {"required": true, "content": json_content(json!({"type": "object", "description": "Members of a ScheduleSpec"}))},
                "responses": responses(&[(200, ok("Changed", s.answer::<Schedule>()))],
                    errors(&error, &[MalformedJson, InvalidField, PayloadTooLarge, NotFound, ScheduleReadOnly, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
            },
            "delete": {
                "operationId": "deleteSchedule",
                "summary": "Delete a schedule; the firings it created stay",
                "responses": responses(&[(204, json!({"description": "Deleted"}))],
                    errors(&error, &[InvalidField, NotFound, ScheduleReadOnly, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
            },
        },
        "/v1/schedules/{job}/{name}/pause": {"post": {
            "operationId": "pauseSchedule",
            "summary": "Pause a schedule: it creates no firings (idempotent)",
            "parameters": schedule_path(),
            "responses": responses(&[(200, ok("Paused", s.answer::<Schedule>()))],
                errors(&error, &[InvalidField, NotFound, ScheduleReadOnly, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
        }},
        "/v1/schedules/{job}/{name}/resume": {"post": {
            "operationId": "resumeSchedule",
            "summary": "Resume a schedule with its next firing; the pause's firings are not caught up (idempotent)",
            "parameters": schedule_path(),
            "responses": responses(&[(200, ok("Resumed", s.answer::<Schedule>()))],
                errors(&error, &[InvalidField, NotFound, ScheduleReadOnly, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
        }},
        "/v1/schedules/{job}/{name}/trigger": {"post": {
            "operationId": "triggerSchedule",
            "summary": "Fire a schedule once, now, besides its firings",
            "parameters": schedule_path(),
            "responses": responses(&[(201, ok("The task it fired", s.answer::<CronTriggerResult>()))],
                errors(&error, &[InvalidField, NotFound, UniqueConflict, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
        }},
        "/v1/schedules/{job}/{name}/backfill": {"post": {
            "operationId": "backfillSchedule",
            "summary": "Create the firings of a time range, as if the schedule had run then; each once, however often repeated",
            "parameters": schedule_path(),
            "requestBody": {"required": true, "content": json_content(s.request::<BackfillRequest>())},
            "responses": responses(&[(200, ok("Counts", s.answer::<BackfillResult>()))],
                errors(&error, &[MalformedJson, InvalidField, NotFound, StoreUnavailable, Unauthenticated, Forbidden, AuthUnavailable])),
        }},
        "/v1/openapi.json": {"get": {
            "operationId": "openapi", "security": [],
            "summary": "This document",
            "responses": {"200": ok("The OpenAPI document", json!({"type": "object"}))},
        }},
        "/metrics": {"get": {
            "operationId": "metrics", "security": [],
            "summary": "Prometheus metrics",
            "responses": {"200": text_plain("Prometheus text format")},
        }},
        "/healthz": {"get": {
            "operationId": "healthz", "security": [],
            "summary": "The process is up",
            "responses": {"200": text_plain("ok")},
        }},
        "/readyz": {"get": {
            "operationId": "readyz", "security": [],
            "summary": "The store answers, and a dispatcher's clock is within bounds of the store's",
            "responses": responses(&[(200, text_plain("ready"))], errors(&error, &[StoreUnavailable, ClockSkew, SigningUnavailable])),
        }},
    });
    let paths = with_guard_refusals(paths, &error);
    // The executor side of the contract is no endpoint of asyncd's; its shapes are
    // listed with the others for executors written against this document.
    s.answer::<ExecutorCall>();
    s.request::<ExecutorAccepted>();
    s.answer::<ExecutorBatchCall>();
    s.request::<ExecutorBatchAnswer>();
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "asyncd",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The asyncd HTTP API (docs/api.md). Generated from the asyncd-contract crate: \
                cargo run -p asyncd-contract --features openapi --bin contractgen. \
                ExecutorCall is the body asyncd POSTs to an executor, ExecutorAccepted an executor's 202 body; \
                ExecutorBatchCall and ExecutorBatchAnswer are a batch call (executor.batch) and its 2xx answer.",
            "license": {"name": "Apache-2.0"},
        },
        "paths": paths,
        // Every operation needs the bearer token unless it says `"security": []` (the
        // operational endpoints and the executor callbacks, which carry a lease token).
        "security": [{"bearerAuth": []}],
        "components": {
            "schemas": s.components(),
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer",
                "description": "An API token (--auth tokens) or a Kubernetes ServiceAccount token \
                    (--auth kubernetes); docs/security.md. Not needed when the server runs with --auth none."}},
        },
    })
}
