//! `dlq ls|redrive|purge`: dead letters one by one, or in bulk by filter.

use asyncd_client::asyncd_contract::{DeadLetterBulk, DeadLetterBulkResult};
use asyncd_client::{Client, Error};
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::exit::{Failure, usage};
use crate::output::{self, Format};

#[derive(Subcommand)]
pub enum Dlq {
    /// List dead letters, latest due first.
    Ls {
        /// Only this task type's.
        #[arg(long = "type", value_name = "TYPE")]
        task_type: Option<String>,
        /// At most this many (1 to 1000).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: u32,
    },
    /// Put dead letters back to pending, due now, attempts reset: one by its id, or every
    /// one matching a filter (--job or --type, narrowed by the others).
    Redrive {
        /// One dead letter's id, instead of a filter.
        #[arg(conflicts_with_all = ["job", "task_type", "error_prefix", "dead_after", "dead_before", "dry_run"])]
        id: Option<String>,
        #[command(flatten)]
        filter: Filter,
    },
    /// Delete the dead letters matching a filter, for good.
    Purge {
        #[command(flatten)]
        filter: Filter,
    },
}

/// Which dead letters a bulk action takes: `--job` or `--type` is required.
#[derive(Args)]
pub struct Filter {
    /// Only this job's (its AsyncJobConfig's name).
    #[arg(long)]
    job: Option<String>,
    /// Only this task type's.
    #[arg(long = "type", value_name = "TYPE")]
    task_type: Option<String>,
    /// Only those whose last error starts with this text.
    #[arg(long)]
    error_prefix: Option<String>,
    /// Only those that died at or after this instant (RFC 3339).
    #[arg(long, value_parser = crate::instant)]
    dead_after: Option<DateTime<Utc>>,
    /// Only those that died before this instant (RFC 3339) [default: now].
    #[arg(long, value_parser = crate::instant)]
    dead_before: Option<DateTime<Utc>>,
    /// Count what matches; change nothing.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Clone, Copy)]
enum Action {
    Redrive,
    Purge,
}

impl Action {
    fn name(self) -> &'static str {
        match self {
            Action::Redrive => "redrive",
            Action::Purge => "purge",
        }
    }

    fn done(self) -> &'static str {
        match self {
            Action::Redrive => "redriven",
            Action::Purge => "purged",
        }
    }

    async fn send(
        self,
        client: &Client,
        request: &DeadLetterBulk,
    ) -> Result<DeadLetterBulkResult, Error> {
        match self {
            Action::Redrive => client.redrive_dead_letters(request).await,
            Action::Purge => client.purge_dead_letters(request).await,
        }
    }
}

/// What a whole bulk action did, over all its calls (`-o json|yaml` prints it).
#[derive(Debug, Serialize)]
struct Summary {
    action: &'static str,
    dry_run: bool,
    /// Matching when the action began.
    matched: u64,
    /// Redriven or purged, over every call.
    affected: u64,
    /// Left alone by the last call: a unique key another task holds (redrive), a blocked
    /// task waiting on them (purge).
    skipped: u64,
    /// Still matching at the end.
    remaining: u64,
    /// The `dead_before` of every call.
    #[serde(with = "asyncd_client::asyncd_contract::time::rfc3339")]
    dead_before: DateTime<Utc>,
    calls: u32,
}

pub async fn run(client: &Client, out: Format, command: Dlq) -> Result<(), Failure> {
    match command {
        Dlq::Ls { task_type, limit } => {
            let items = client
                .dead_letters(task_type.as_deref(), Some(limit))
                .await?;
            if !output::structured(out, &items)? {
                crate::tasks::task_table(&items).print();
            }
            Ok(())
        }
        Dlq::Redrive { id: Some(id), .. } => {
            let result = client.redrive(&id).await?;
            if !output::structured(out, &result)? {
                println!(
                    "{} {} due {}",
                    result.id,
                    result.state,
                    output::time(result.eta)
                );
            }
            Ok(())
        }
        Dlq::Redrive { id: None, filter } => bulk(client, out, Action::Redrive, filter).await,
        Dlq::Purge { filter } => bulk(client, out, Action::Purge, filter).await,
    }
}

/// Calls the bulk endpoint until nothing more matches or a call changes nothing. Every
/// call is idempotent, so an interrupted run is resumed by running the command again.
async fn bulk(client: &Client, out: Format, action: Action, filter: Filter) -> Result<(), Failure> {
    if filter.job.is_none() && filter.task_type.is_none() {
        return Err(usage(format!(
            "dlq {}: --job or --type is required (or a dead letter's id for redrive)",
            action.name()
        )));
    }
    let mut request = DeadLetterBulk {
        job: filter.job,
        task_type: filter.task_type,
        error_prefix: filter.error_prefix,
        dead_after: filter.dead_after,
        dead_before: filter.dead_before,
        dry_run: filter.dry_run,
        limit: None,
    };
    let first = action.send(client, &request).await?;
    // Every later call takes the instant the first one used: a task that dies again
    // after its redrive is a new dead letter, not one of this action's.
    request.dead_before = Some(first.dead_before);
    let mut summary = Summary {
        action: action.name(),
        dry_run: first.dry_run,
        matched: first.matched,
        affected: first.affected,
        skipped: first.skipped,
        remaining: first.remaining,
        dead_before: first.dead_before,
        calls: 1,
    };
    // Drawn on stderr, and only when it is a terminal (indicatif's own check).
    let bar = if summary.dry_run || out != Format::Table {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(first.matched)
    };
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({per_sec}, {eta})")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message(action.done());
    bar.inc(first.affected);
    let mut last = first;
    while !summary.dry_run && last.remaining > 0 && last.affected > 0 {
        last = action.send(client, &request).await?;
        summary.affected += last.affected;
        summary.skipped = last.skipped;
        summary.remaining = last.remaining;
        summary.calls += 1;
        bar.inc(last.affected);
    }
    bar.finish_and_clear();
    if output::structured(out, &summary)? {
        return Ok(());
    }
    if summary.dry_run {
        println!(
            "dry run: {} dead letters match (died before {}); nothing {}",
            summary.matched,
            output::time(summary.dead_before),
            action.done()
        );
    } else {
        println!(
            "{} {} of {} dead letters in {} calls; {} skipped, {} still match",
            action.done(),
            summary.affected,
            summary.matched,
            summary.calls,
            summary.skipped,
            summary.remaining
        );
    }
    Ok(())
}
