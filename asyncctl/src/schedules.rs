//! `schedule create|put|get|list|change|pause|resume|delete|trigger|backfill`: schedules
//! made at runtime through `/v1/schedules` (docs/api.md, "Schedules").

use std::time::Duration;

use asyncd_client::{
    BackfillResult, Client, CronOverlap, CronTriggerResult, MAX_SCHEDULE_PAGE, Schedule,
    SchedulePage, ScheduleSpec, format_duration,
};
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;

use crate::exit::{Failure, usage};
use crate::output::{self, Format, Table, or_dash};

#[derive(Subcommand)]
pub enum ScheduleCommand {
    /// Create a schedule; refused (exit 5) if the job has one of that name.
    Create(WriteArgs),
    /// Create a schedule or write over it (an upsert): the flags are its whole spec.
    Put(WriteArgs),
    /// Show one schedule: its spec, next and last firing, tasks fired.
    Get(Named),
    /// List a job's schedules by name (its spec.cron entries among them).
    #[command(visible_alias = "ls")]
    List(ListArgs),
    /// Pause a schedule: it creates no firings until resumed.
    Pause(Named),
    /// Resume a paused schedule: it goes on with its next firing (the pause's are not
    /// caught up).
    Resume(Named),
    /// Delete a schedule; the tasks it created stay.
    Delete(Named),
    /// Fire a schedule once, now, besides its firings.
    Trigger(Named),
    /// Create the firings whose instants fall in [--from, --to), as if the schedule had
    /// run then; each once, however often this is run.
    Backfill(BackfillArgs),
}

/// A schedule: its job and its name.
#[derive(Args)]
pub struct Named {
    /// The job (AsyncJobConfig name).
    job: String,
    /// The schedule's name.
    name: String,
}

/// What a firing does while the previous one has not finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Overlap {
    /// Run it anyway (the default).
    #[value(name = "Allow", alias = "AllowAll")]
    Allow,
    /// Skip it.
    #[value(name = "Skip")]
    Skip,
    /// Hold it back until the previous one finishes (at most one held).
    #[value(name = "BufferOne")]
    BufferOne,
    /// Cancel the previous one and run it.
    #[value(name = "CancelOther")]
    CancelOther,
}

impl From<Overlap> for CronOverlap {
    fn from(overlap: Overlap) -> Self {
        match overlap {
            Overlap::Allow => CronOverlap::Allow,
            Overlap::Skip => CronOverlap::Skip,
            Overlap::BufferOne => CronOverlap::BufferOne,
            Overlap::CancelOther => CronOverlap::CancelOther,
        }
    }
}

/// `create` and `put`: the schedule and its spec. `--cron` or `--every`, not both.
#[derive(Args)]
pub struct WriteArgs {
    #[command(flatten)]
    named: Named,
    #[command(flatten)]
    when: When,
    /// Each firing's payload as JSON (default null); `-` reads it from stdin, `@FILE`
    /// from a file. In its strings, {{scheduled_at}} becomes the firing's instant and
    /// {{schedule}} the schedule's name.
    #[arg(long)]
    payload: Option<String>,
    /// Each firing's priority, 0 (default) to 9.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=9))]
    priority: Option<u8>,
    /// While the previous firing has not finished [default: Allow].
    #[arg(long, value_enum, ignore_case = true)]
    overlap: Option<Overlap>,
    /// How far back firings missed while no scheduler ran are still created (up to 7d;
    /// 0s for none) [default: 1h].
    #[arg(long, value_name = "DUR", value_parser = crate::duration)]
    catch_up: Option<Duration>,
    /// Each firing is due up to this much after its instant (up to 1h, and up to
    /// --every).
    #[arg(long, value_name = "DUR", value_parser = crate::duration)]
    jitter: Option<Duration>,
    /// No firing before this instant (RFC 3339); an --every interval counts from it.
    #[arg(long, value_name = "TIME", value_parser = crate::instant)]
    start_at: Option<DateTime<Utc>>,
    /// No firing after this instant (RFC 3339).
    #[arg(long, value_name = "TIME", value_parser = crate::instant)]
    end_at: Option<DateTime<Utc>>,
    /// Create it paused.
    #[arg(long)]
    paused: bool,
}

/// When a schedule fires: exactly one of the two.
#[derive(Args)]
#[group(required = true, multiple = false)]
struct When {
    /// A cron expression with its zone: "CRON_TZ=Europe/Berlin 0 9 * * MON".
    #[arg(long, value_name = "EXPR")]
    cron: Option<String>,
    /// A fixed interval, at least 1s: 90s, 15m, 1h.
    #[arg(long, value_name = "DUR", value_parser = crate::duration)]
    every: Option<Duration>,
}

#[derive(Args)]
pub struct ListArgs {
    /// The job (AsyncJobConfig name).
    job: String,
    /// At most this many a page (1 to 1000) [default: the server's, 100].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_SCHEDULE_PAGE)))]
    limit: Option<u32>,
    /// Continue after a previous page (the cursor it printed).
    #[arg(long, conflicts_with = "all")]
    cursor: Option<String>,
    /// Every page, following the cursor to the end.
    #[arg(long)]
    all: bool,
}

#[derive(Args)]
pub struct BackfillArgs {
    #[command(flatten)]
    named: Named,
    /// The first instant of the range, included (RFC 3339).
    #[arg(long, value_name = "TIME", value_parser = crate::instant)]
    from: DateTime<Utc>,
    /// The end of the range, excluded (RFC 3339).
    #[arg(long, value_name = "TIME", value_parser = crate::instant)]
    to: DateTime<Utc>,
}

/// The spec the flags give; the rest is the server's defaults.
fn spec_of(args: &WriteArgs) -> Result<ScheduleSpec, Failure> {
    if let Some(every) = args.when.every
        && every < Duration::from_secs(1)
    {
        return Err(usage("--every: must be at least 1s"));
    }
    Ok(ScheduleSpec {
        cron: args.when.cron.clone(),
        every: args.when.every.map(format_duration),
        payload: crate::tasks::json_arg("--payload", args.payload.as_deref())?,
        priority: args.priority.unwrap_or_default(),
        overlap: args.overlap.map(CronOverlap::from).unwrap_or_default(),
        catch_up: args.catch_up.map(format_duration),
        start_at: args.start_at,
        end_at: args.end_at,
        jitter: args.jitter.map(format_duration),
        paused: args.paused,
    })
}

fn overlap_name(overlap: CronOverlap) -> String {
    format!("{overlap:?}")
}

/// `cron` or `every` as one column: `every 15m`, or the cron expression.
fn when(s: &Schedule) -> String {
    match (&s.spec.cron, &s.spec.every) {
        (Some(cron), _) => cron.clone(),
        (None, Some(every)) => format!("every {every}"),
        (None, None) => "-".into(),
    }
}

/// A schedule as rows of fields.
fn show(out: Format, s: &Schedule) -> Result<(), Failure> {
    if output::structured(out, s)? {
        return Ok(());
    }
    let spec = &s.spec;
    let rows: Vec<(&str, String)> = vec![
        ("job", s.job.clone()),
        ("name", s.name.clone()),
        ("type", s.task_type.clone()),
        ("source", source(s).into()),
        ("cron", or_dash(spec.cron.clone())),
        ("every", or_dash(spec.every.clone())),
        ("payload", spec.payload.to_string()),
        ("priority", spec.priority.to_string()),
        ("overlap", overlap_name(spec.overlap)),
        ("catch_up", or_dash(spec.catch_up.clone())),
        ("jitter", or_dash(spec.jitter.clone())),
        ("start_at", or_dash(spec.start_at.map(output::time))),
        ("end_at", or_dash(spec.end_at.map(output::time))),
        ("paused", spec.paused.to_string()),
        ("next_firing", or_dash(s.next_firing.map(output::time))),
        ("last_firing", or_dash(s.last_firing.map(output::time))),
        ("last_task_id", or_dash(s.last_task_id.clone())),
        (
            "buffered_firing",
            or_dash(s.buffered_firing.map(output::time)),
        ),
        ("fired", s.fired.to_string()),
        ("created_at", output::time(s.created_at)),
        ("updated_at", output::time(s.updated_at)),
    ];
    let mut table = Table::new(&["FIELD", "VALUE"]);
    for (field, value) in rows {
        table.row(vec![field.into(), value]);
    }
    table.print();
    Ok(())
}

fn source(s: &Schedule) -> &'static str {
    match s.source {
        asyncd_client::ScheduleSource::Api => "api",
        asyncd_client::ScheduleSource::Config => "config",
    }
}

/// Schedules as table rows: one line each.
fn list_table(items: &[Schedule]) -> Table {
    let mut table = Table::new(&[
        "NAME",
        "SOURCE",
        "CRON/EVERY",
        "OVERLAP",
        "PAUSED",
        "NEXT",
        "LAST",
        "FIRED",
    ]);
    for s in items {
        table.row(vec![
            s.name.clone(),
            source(s).into(),
            when(s),
            overlap_name(s.spec.overlap),
            s.spec.paused.to_string(),
            or_dash(s.next_firing.map(output::time)),
            or_dash(s.last_firing.map(output::time)),
            s.fired.to_string(),
        ]);
    }
    table
}

/// What `schedule delete -o json|yaml` prints: the API answers 204, without a body.
#[derive(Serialize)]
struct Deleted<'a> {
    job: &'a str,
    name: &'a str,
    deleted: bool,
}

/// Every page of `job`'s schedules, `limit` a page, following `next_cursor`.
async fn list_all(client: &Client, job: &str, limit: Option<u32>) -> Result<SchedulePage, Failure> {
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = client.list_schedules(job, cursor.as_deref(), limit).await?;
        items.extend(page.items);
        match page.next_cursor {
            None => break,
            Some(next) if cursor.as_ref() == Some(&next) => {
                return Err(Failure {
                    code: crate::exit::OTHER,
                    message: format!("the server answered the cursor {next:?} with itself"),
                });
            }
            next => cursor = next,
        }
    }
    Ok(SchedulePage {
        items,
        next_cursor: None,
    })
}

fn trigger_table(fired: &CronTriggerResult) -> Table {
    let mut table = Table::new(&["ID", "JOB", "SCHEDULE", "TYPE", "ETA"]);
    table.row(vec![
        fired.id.clone(),
        fired.job.clone(),
        fired.entry.clone(),
        fired.task_type.clone(),
        output::time(fired.eta),
    ]);
    table
}

fn backfill_table(result: &BackfillResult) -> Table {
    let mut table = Table::new(&["FIRINGS", "CREATED", "EXISTED"]);
    table.row(vec![
        result.firings.to_string(),
        result.created.to_string(),
        result.firings.saturating_sub(result.created).to_string(),
    ]);
    table
}

pub async fn run(client: &Client, out: Format, command: ScheduleCommand) -> Result<(), Failure> {
    match command {
        ScheduleCommand::Create(args) => {
            let spec = spec_of(&args)?;
            let s = client
                .create_schedule(&args.named.job, &args.named.name, &spec)
                .await?;
            show(out, &s)
        }
        ScheduleCommand::Put(args) => {
            let spec = spec_of(&args)?;
            let (s, created) = client
                .put_schedule(&args.named.job, &args.named.name, &spec)
                .await?;
            if out == Format::Table {
                // On stderr: stdout stays the schedule.
                eprintln!(
                    "schedule {} of job {} {}",
                    s.name,
                    s.job,
                    if created { "created" } else { "written over" }
                );
            }
            show(out, &s)
        }
        ScheduleCommand::Get(Named { job, name }) => {
            show(out, &client.get_schedule(&job, &name).await?)
        }
        ScheduleCommand::List(args) => {
            let page = if args.all {
                list_all(client, &args.job, args.limit).await?
            } else {
                client
                    .list_schedules(&args.job, args.cursor.as_deref(), args.limit)
                    .await?
            };
            if output::structured(out, &page)? {
                return Ok(());
            }
            list_table(&page.items).print();
            if let Some(cursor) = &page.next_cursor {
                // On stderr: the table on stdout stays only rows for a pipe.
                eprintln!(
                    "more: asyncctl schedule list {} --cursor {cursor} (or --all)",
                    args.job
                );
            }
            Ok(())
        }
        ScheduleCommand::Pause(Named { job, name }) => {
            show(out, &client.pause_schedule(&job, &name).await?)
        }
        ScheduleCommand::Resume(Named { job, name }) => {
            show(out, &client.resume_schedule(&job, &name).await?)
        }
        ScheduleCommand::Delete(Named { job, name }) => {
            client.delete_schedule(&job, &name).await?;
            let deleted = Deleted {
                job: &job,
                name: &name,
                deleted: true,
            };
            if !output::structured(out, &deleted)? {
                println!("deleted schedule {name} of job {job}");
            }
            Ok(())
        }
        ScheduleCommand::Trigger(Named { job, name }) => {
            let fired = client.trigger_schedule(&job, &name).await?;
            if !output::structured(out, &fired)? {
                trigger_table(&fired).print();
            }
            Ok(())
        }
        ScheduleCommand::Backfill(args) => {
            if args.to <= args.from {
                return Err(usage("--to: must be after --from"));
            }
            let result = client
                .backfill_schedule(&args.named.job, &args.named.name, args.from, args.to)
                .await?;
            if !output::structured(out, &result)? {
                backfill_table(&result).print();
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: ScheduleCommand,
    }

    fn write_args(args: &[&str]) -> Result<WriteArgs, clap::Error> {
        let cli = Cli::try_parse_from([&["t", "create", "job", "name"], args].concat())?;
        match cli.command {
            ScheduleCommand::Create(args) => Ok(args),
            _ => unreachable!(),
        }
    }

    #[test]
    fn the_flags_make_the_spec() {
        let args = write_args(&[
            "--every",
            "90s",
            "--payload",
            r#"{"c": "{{schedule}}"}"#,
            "--priority",
            "3",
            "--overlap",
            "bufferone",
            "--catch-up",
            "0s",
            "--jitter",
            "5m",
            "--start-at",
            "2026-12-07T01:00:00+01:00",
            "--paused",
        ])
        .unwrap();
        let spec = spec_of(&args).unwrap();
        assert_eq!(
            spec,
            ScheduleSpec {
                every: Some("1m 30s".into()),
                payload: serde_json::json!({"c": "{{schedule}}"}),
                priority: 3,
                overlap: CronOverlap::BufferOne,
                catch_up: Some("0s".into()),
                jitter: Some("5m".into()),
                start_at: Some("2026-12-07T00:00:00Z".parse().unwrap()),
                paused: true,
                ..ScheduleSpec::default()
            }
        );
        let args =
            write_args(&["--cron", "CRON_TZ=UTC 0 3 * * *", "--overlap", "AllowAll"]).unwrap();
        let spec = spec_of(&args).unwrap();
        assert_eq!(
            (spec.cron.as_deref(), spec.every, spec.overlap, spec.payload),
            (
                Some("CRON_TZ=UTC 0 3 * * *"),
                None,
                CronOverlap::Allow,
                serde_json::Value::Null
            )
        );
    }

    #[test]
    fn bad_flags_are_usage_errors_naming_the_flag() {
        let both = write_args(&["--cron", "CRON_TZ=UTC 0 3 * * *", "--every", "1h"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            both.contains("--cron") && both.contains("--every"),
            "{both}"
        );
        let neither = write_args(&[]).err().unwrap().to_string();
        assert!(
            neither.contains("--cron") && neither.contains("--every"),
            "{neither}"
        );
        for (flags, flag) in [
            (&["--every", "soon"][..], "--every"),
            (&["--every", "1h", "--priority", "10"], "--priority"),
            (&["--every", "1h", "--overlap", "Sometimes"], "--overlap"),
            (&["--every", "1h", "--start-at", "tomorrow"], "--start-at"),
            (&["--every", "1h", "--jitter", "a bit"], "--jitter"),
        ] {
            let err = write_args(flags).err().unwrap().to_string();
            assert!(err.contains(flag), "{flags:?}: {err}");
        }
        let bad_json = write_args(&["--every", "1h", "--payload", "{nope"]).unwrap();
        let err = spec_of(&bad_json).unwrap_err();
        assert_eq!(err.code, crate::exit::USAGE);
        assert!(
            err.message
                .starts_with("--payload: the argument is not JSON"),
            "{}",
            err.message
        );
        let fast = write_args(&["--every", "500ms"]).unwrap();
        assert!(spec_of(&fast).unwrap_err().message.contains("--every"));
    }
}
