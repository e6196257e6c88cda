//! `submit`, `get`, `ls`, `change`, `cancel`.

use std::io::Read;
use std::time::Duration;

use asyncd_client::{
    Change, Changed, Client, OnLimit, PendingChange, Task, TaskQuery, TaskState, TaskStatus,
};
use chrono::{DateTime, Utc};
use clap::Args;
use serde_json::Value;

use crate::exit::{Failure, usage};
use crate::output::{self, Format, Table, or_dash, short};

#[derive(Args)]
pub struct SubmitArgs {
    /// The task type (an AsyncJobConfig's spec.taskType).
    #[arg(value_name = "TYPE")]
    task_type: String,
    /// The payload as JSON (default null); `-` reads it from stdin, `@FILE` from a file.
    payload: Option<String>,
    /// Run it after this long (`90s`, `15m`, `2d`).
    #[arg(long, value_parser = crate::duration, conflicts_with = "eta")]
    delay: Option<Duration>,
    /// Run it at this instant (RFC 3339).
    #[arg(long, value_parser = crate::instant)]
    eta: Option<DateTime<Utc>>,
    /// Never run it unless an attempt has begun by this instant (RFC 3339): it expires.
    #[arg(long, value_parser = crate::instant, conflicts_with = "start_within")]
    expires_at: Option<DateTime<Utc>>,
    /// Never run it unless an attempt has begun this long after it is due (`10m`)
    /// [default: the job's startWithin, if any].
    #[arg(long, value_parser = crate::duration)]
    start_within: Option<Duration>,
    /// Debounce on this key (trailing: one waiting task per key, with the latest payload,
    /// due --period after the latest submit).
    #[arg(long, value_name = "KEY", requires = "period", conflicts_with_all = ["throttle", "delay", "eta"])]
    debounce: Option<String>,
    /// At most one task of this key per --period.
    #[arg(long, value_name = "KEY", requires = "period")]
    throttle: Option<String>,
    /// The debounce's or throttle's period (`30s`).
    #[arg(long, value_parser = crate::duration)]
    period: Option<Duration>,
    /// A trailing debounce's cap: due at most this long after the burst's first submit.
    #[arg(long, value_parser = crate::duration, requires = "debounce", conflicts_with = "leading")]
    max_delay: Option<Duration>,
    /// A leading debounce: run the first, drop the rest until --period of quiet.
    #[arg(long, requires = "debounce")]
    leading: bool,
    /// A throttled submit over the limit is dropped (answered with the key's task)
    /// rather than refused.
    #[arg(long, requires = "throttle")]
    drop: bool,
    /// 0 (default) to 9: a higher priority runs first among tasks due together.
    #[arg(long)]
    priority: Option<u8>,
    /// Retries after the first attempt (default: the job's).
    #[arg(long)]
    max_retries: Option<u32>,
    /// How long one attempt may take (default: the job's).
    #[arg(long, value_parser = crate::duration)]
    task_timeout: Option<Duration>,
    /// At most one unfinished task holds this key (and a succeeded one, for its job's
    /// `retention.uniqueKeys`).
    #[arg(long)]
    unique_key: Option<String>,
    /// Submitting again with the same key answers the first task instead of a second
    /// [default: a new random key on every run].
    #[arg(long)]
    idempotency_key: Option<String>,
    /// Wait for this task to succeed first (repeatable).
    #[arg(long = "depends-on", value_name = "ID")]
    depends_on: Vec<String>,
}

#[derive(Args)]
pub struct ChangeArgs {
    /// The task's id.
    id: String,
    /// The new payload as JSON; `-` reads it from stdin, `@FILE` from a file.
    #[arg(long)]
    payload: Option<String>,
    /// Due this long from now (`90s`, `15m`, `2d`).
    #[arg(long, value_parser = crate::duration, conflicts_with_all = ["eta", "now"])]
    delay: Option<Duration>,
    /// Due at this instant (RFC 3339).
    #[arg(long, value_parser = crate::instant, conflicts_with = "now")]
    eta: Option<DateTime<Utc>>,
    /// Due now (promote).
    #[arg(long)]
    now: bool,
    /// The new priority, 0 to 9.
    #[arg(long)]
    priority: Option<u8>,
    /// The job (AsyncJobConfig name) of the task: it also changes a Kafka-routed task
    /// not consumed yet (without it, that is "not found"), which takes the change when a
    /// dispatcher stores it.
    #[arg(long)]
    job: Option<String>,
}

/// The `PAYLOAD` argument as JSON: literal, `-` (stdin) or `@FILE`.
fn payload(arg: Option<&str>) -> Result<Value, Failure> {
    json_arg("PAYLOAD", arg)
}

/// The argument `name` (as the usage names it: `PAYLOAD`, `--payload`) as JSON: literal,
/// `-` (stdin) or `@FILE`; `null` when not given. Its errors name the argument.
pub fn json_arg(name: &str, arg: Option<&str>) -> Result<Value, Failure> {
    let (text, source) = match arg {
        None => return Ok(Value::Null),
        Some("-") => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| usage(format!("{name}: reading stdin: {e}")))?;
            (text, "stdin".to_string())
        }
        Some(arg) => match arg.strip_prefix('@') {
            Some(path) => (
                std::fs::read_to_string(path)
                    .map_err(|e| usage(format!("{name}: reading {path}: {e}")))?,
                path.to_string(),
            ),
            None => (arg.to_string(), "the argument".to_string()),
        },
    };
    serde_json::from_str(&text).map_err(|e| usage(format!("{name}: {source} is not JSON ({e})")))
}

pub async fn submit(client: &Client, out: Format, args: SubmitArgs) -> Result<(), Failure> {
    let key = args
        .idempotency_key
        .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
    let mut task = Task::new(args.task_type, payload(args.payload.as_deref())?)
        .idempotency_key(key)
        .depends_on(args.depends_on);
    if let Some(priority) = args.priority {
        task = task.priority(priority);
    }
    if let Some(n) = args.max_retries {
        task = task.max_retries(n);
    }
    if let Some(timeout) = args.task_timeout {
        task = task.timeout(timeout);
    }
    if let Some(key) = args.unique_key {
        task = task.unique_key(key);
    }
    if let Some(delay) = args.delay {
        task = task.delay(delay);
    }
    if let Some(eta) = args.eta {
        task = task.eta(eta);
    }
    if let Some(at) = args.expires_at {
        task = task.expires_at(at);
    }
    if let Some(within) = args.start_within {
        task = task.start_within(within);
    }
    // clap requires --period with either.
    let period = args.period.unwrap_or_default();
    if let Some(key) = args.debounce {
        task = match args.leading {
            true => task.debounce_leading(key, period),
            false => task.debounce(key, period, args.max_delay),
        };
    }
    if let Some(key) = args.throttle {
        let on_limit = if args.drop {
            OnLimit::Drop
        } else {
            OnLimit::Refuse
        };
        task = task.throttle(key, period, on_limit);
    }
    let result = client.submit(&task).await?;
    if !output::structured(out, &result)? {
        let mut table = Table::new(&["ID", "ETA", "ROUTE", "DUPLICATE", "FOLDED"]);
        let folded = if result.debounced {
            "debounced"
        } else if result.dropped {
            "dropped"
        } else {
            "-"
        };
        table.row(vec![
            result.id.clone(),
            output::time(result.eta),
            result.route.as_str().into(),
            result.duplicate.to_string(),
            folded.into(),
        ]);
        table.print();
    }
    Ok(())
}

/// Changes a task that has not begun and shows it as `get` does; with `--job`, a task of a
/// Kafka-routed job not consumed yet gets the change recorded, which a line (or the API's
/// answer, with `-o json|yaml`) says.
pub async fn change(client: &Client, out: Format, args: ChangeArgs) -> Result<(), Failure> {
    let change = Change {
        payload: args
            .payload
            .as_deref()
            .map(|p| payload(Some(p)))
            .transpose()?,
        delay: args.delay,
        eta: args.eta,
        run_now: args.now,
        priority: args.priority,
    };
    if change == Change::default() {
        return Err(usage(
            "name what to change: --payload, --delay, --eta, --now or --priority",
        ));
    }
    let Some(job) = args.job else {
        let task = client.change(&args.id, &change).await?;
        return show(out, &task);
    };
    match client.change_in_job(&job, &args.id, &change).await? {
        Changed::Stored(task) => show(out, &task),
        Changed::Pending(pending) => {
            if !output::structured(out, &pending)? {
                println!("{}", pending_line(&pending));
            }
            Ok(())
        }
    }
}

/// The table format's line for a change that waits for its task to be consumed.
fn pending_line(pending: &PendingChange) -> String {
    format!(
        "{} not consumed yet: the change waits, and the task (job {}, type {}) takes it when a dispatcher stores it",
        pending.id, pending.job, pending.task_type
    )
}

pub async fn get(client: &Client, out: Format, id: &str) -> Result<(), Failure> {
    let task = client.get(id).await?;
    show(out, &task)
}

fn show(out: Format, task: &TaskStatus) -> Result<(), Failure> {
    if output::structured(out, task)? {
        return Ok(());
    }
    let mut table = Table::new(&["FIELD", "VALUE"]);
    let rows: Vec<(&str, String)> = vec![
        ("id", task.id.clone()),
        ("type", task.task_type.clone()),
        ("state", task.state.to_string()),
        ("eta", output::time(task.eta)),
        ("priority", task.priority.to_string()),
        (
            "attempt",
            format!("{} of {}", task.attempt, task.max_retries + 1),
        ),
        ("last_error", or_dash(task.last_error.clone())),
        ("lease_until", or_dash(task.lease_until.map(output::time))),
        ("expires_at", or_dash(task.expires_at.map(output::time))),
        ("idempotency_key", or_dash(task.idempotency_key.clone())),
        ("unique_key", or_dash(task.unique_key.clone())),
        (
            "depends_on",
            if task.depends_on.is_empty() {
                "-".into()
            } else {
                task.depends_on.join(", ")
            },
        ),
        ("created_at", output::time(task.created_at)),
        ("updated_at", output::time(task.updated_at)),
        ("payload", task.payload.to_string()),
        (
            "result",
            or_dash(task.result.as_ref().map(Value::to_string)),
        ),
    ];
    for (field, value) in rows {
        table.row(vec![field.into(), value]);
    }
    table.print();
    Ok(())
}

#[derive(Args)]
pub struct LsArgs {
    /// Only this job's tasks (its AsyncJobConfig's name).
    #[arg(long)]
    job: Option<String>,
    /// Only this task type's.
    #[arg(long = "type", value_name = "TYPE")]
    task_type: Option<String>,
    /// Only tasks in this state.
    #[arg(long, value_parser = state)]
    state: Option<TaskState>,
    /// Only the task holding this unique key.
    #[arg(long)]
    unique_key: Option<String>,
    /// Only tasks created after this instant (RFC 3339).
    #[arg(long, value_parser = crate::instant)]
    created_after: Option<DateTime<Utc>>,
    /// Only tasks due before this instant (RFC 3339).
    #[arg(long, value_parser = crate::instant)]
    eta_before: Option<DateTime<Utc>>,
    /// At most this many (1 to 1000).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
    limit: u32,
    /// Continue after a previous page (the cursor it printed).
    #[arg(long)]
    cursor: Option<String>,
}

fn state(text: &str) -> Result<TaskState, String> {
    text.parse::<TaskState>().map_err(|_| {
        let names: Vec<&str> = TaskState::ALL.iter().map(|s| s.as_str()).collect();
        format!("{text:?} is not one of {}", names.join(", "))
    })
}

/// Tasks as table rows: one line each.
pub fn task_table(tasks: &[TaskStatus]) -> Table {
    let mut table = Table::new(&["ID", "TYPE", "STATE", "ATTEMPT", "ETA", "LAST ERROR"]);
    for t in tasks {
        table.row(vec![
            t.id.clone(),
            t.task_type.clone(),
            t.state.to_string(),
            t.attempt.to_string(),
            output::time(t.eta),
            t.last_error.as_deref().map_or("-".into(), |e| short(e, 60)),
        ]);
    }
    table
}

pub async fn ls(client: &Client, out: Format, args: LsArgs) -> Result<(), Failure> {
    let page = client
        .search(&TaskQuery {
            job: args.job,
            task_type: args.task_type,
            state: args.state,
            unique_key: args.unique_key,
            created_after: args.created_after,
            eta_before: args.eta_before,
            limit: Some(args.limit),
            cursor: args.cursor,
        })
        .await?;
    if output::structured(out, &page)? {
        return Ok(());
    }
    task_table(&page.items).print();
    if let Some(cursor) = &page.next_cursor {
        // On stderr: the table on stdout stays only rows for a pipe.
        eprintln!("more: asyncctl ls … --cursor {cursor}");
    }
    Ok(())
}

/// Cancels task `id` (of `job`, when given), or the task of `job` holding `unique_key`;
/// clap gives an id or a unique key with its job, not both.
pub async fn cancel(
    client: &Client,
    out: Format,
    id: Option<String>,
    job: Option<String>,
    unique_key: Option<String>,
) -> Result<(), Failure> {
    let result = match (id, job, unique_key) {
        (Some(id), None, _) => client.cancel(&id).await?,
        (Some(id), Some(job), _) => client.cancel_in(&job, &id).await?,
        (None, Some(job), Some(key)) => client.cancel_unique(&job, &key).await?,
        (None, _, _) => unreachable!("clap requires an id or --job with --unique-key"),
    };
    if !output::structured(out, &result)? {
        println!("{} {}", result.id, result.state);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_is_json_from_the_argument_a_file_or_nothing() {
        assert_eq!(payload(None).unwrap(), Value::Null);
        assert_eq!(
            payload(Some(r#"{"a": 1}"#)).unwrap(),
            serde_json::json!({"a": 1})
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.json");
        std::fs::write(&file, "[1, 2]").unwrap();
        assert_eq!(
            payload(Some(&format!("@{}", file.display()))).unwrap(),
            serde_json::json!([1, 2])
        );
        let err = payload(Some("{nope")).unwrap_err();
        assert_eq!(err.code, crate::exit::USAGE);
        assert!(
            err.message.starts_with("PAYLOAD: the argument is not JSON"),
            "{}",
            err.message
        );
    }

    #[test]
    fn a_pending_change_is_one_line_naming_the_task_and_its_job() {
        let line = pending_line(&PendingChange {
            id: "0193a".into(),
            job: "hello-job".into(),
            task_type: "say_hello".into(),
            consumed: false,
        });
        assert!(
            line.starts_with("0193a not consumed yet: the change waits")
                && line.contains("job hello-job")
                && !line.contains('\n'),
            "{line}"
        );
    }

    #[test]
    fn a_state_is_one_of_the_api_s() {
        assert_eq!(state("dead").unwrap(), TaskState::Dead);
        assert!(state("gone").unwrap_err().contains("pending"));
    }
}
