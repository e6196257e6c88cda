//! `asyncctl`: the asyncd command line, on the Rust SDK (asyncctl/README.md).

mod config;
mod dlq;
mod exit;
mod jobs;
mod output;
mod schedules;
mod tasks;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{CommandFactory, Parser, Subcommand};

use crate::exit::Failure;
use crate::output::Format;

#[derive(Parser)]
#[command(
    name = "asyncctl",
    version,
    about = "The asyncd command line: tasks, dead letters, jobs, cron entries, schedules and a live view",
    after_help = "Exit codes: 0 ok, 1 other failure, 2 usage or invalid request, 3 not found, \
                  4 unauthenticated or forbidden, 5 conflict, 6 server unavailable (asyncctl/README.md)."
)]
struct Cli {
    /// The asyncd API's base URL [default: the config file's `server`, else
    /// http://127.0.0.1:7700]
    #[arg(long, global = true, env = "ASYNCD_SERVER")]
    server: Option<String>,
    /// Bearer token: an API token, or a Kubernetes token for the audience `asyncd`
    /// [default: the config file's `token` or `token_file`, else
    /// /var/run/secrets/asyncd/token when it exists]
    #[arg(long, global = true, env = "ASYNCD_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Config file [default: $XDG_CONFIG_HOME/asyncctl/config.yaml, else
    /// ~/.config/asyncctl/config.yaml]
    #[arg(long, global = true, env = "ASYNCCTL_CONFIG")]
    config: Option<PathBuf>,
    /// Output format: a table for people, or the API's answers as JSON or YAML.
    #[arg(
        short,
        long,
        global = true,
        value_enum,
        default_value = "table",
        env = "ASYNCCTL_OUTPUT"
    )]
    output: Format,
    /// How long one API call may take.
    #[arg(long, global = true, default_value = "30s", value_parser = duration)]
    timeout: Duration,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Submit a task.
    Submit(tasks::SubmitArgs),
    /// Show one task: state, attempts, last error, payload.
    Get {
        /// The task's id.
        id: String,
    },
    /// Search tasks, newest first.
    Ls(tasks::LsArgs),
    /// Change a task that has not begun, in place: its payload, due time or priority.
    Change(tasks::ChangeArgs),
    /// Cancel a task that has not finished: by id, or the one of a job holding a
    /// unique key.
    Cancel {
        /// The task's id.
        #[arg(required_unless_present = "unique_key", conflicts_with = "unique_key")]
        id: Option<String>,
        /// The job (AsyncJobConfig name) of the task: with an id, it also cancels a
        /// Kafka-routed task not consumed yet (without it, that is "not found"); with
        /// --unique-key, the job whose task holds the key.
        #[arg(long)]
        job: Option<String>,
        /// Cancel the unfinished task of --job that holds this unique key.
        #[arg(long, requires = "job")]
        unique_key: Option<String>,
    },
    /// Dead letters: list, redrive, purge.
    #[command(subcommand)]
    Dlq(dlq::Dlq),
    /// Jobs: overview, pause, resume, tenants' weights.
    #[command(subcommand)]
    Jobs(jobs::Jobs),
    /// Cron entries: list with their next firings, trigger one now.
    #[command(subcommand)]
    Cron(jobs::Cron),
    /// Schedules made at runtime: create, put, get, list, pause, resume, delete,
    /// trigger, backfill.
    #[command(subcommand)]
    Schedule(schedules::ScheduleCommand),
    /// Live per-job rates, due backlog and lateness, refreshed until interrupted.
    Top(jobs::TopArgs),
    /// Print a shell completion script, e.g. `source <(asyncctl completion bash)`.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// `10m`, `1h 30m`, `500ms`.
fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{text:?} is not a duration ({e})"))
}

/// An RFC 3339 instant, `2026-12-01T06:00:00Z`.
fn instant(text: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("{text:?} is not an RFC 3339 time such as 2026-12-01T06:00:00Z ({e})"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // A usage error exits 2 (clap's code), --help and --version 0.
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::from(exit::OK),
        Err(failure) => {
            eprintln!("asyncctl: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    if let Command::Completion { shell } = cli.command {
        clap_complete::generate(
            shell,
            &mut Cli::command(),
            "asyncctl",
            &mut std::io::stdout(),
        );
        return Ok(());
    }
    let file = match cli.config.or_else(config::default_path) {
        Some(path) => config::File::read(&path)?,
        None => config::File::default(),
    };
    let client = config::resolve(cli.server, cli.token, file).client(cli.timeout)?;
    let out = cli.output;
    match cli.command {
        Command::Submit(args) => tasks::submit(&client, out, args).await,
        Command::Get { id } => tasks::get(&client, out, &id).await,
        Command::Ls(args) => tasks::ls(&client, out, args).await,
        Command::Change(args) => tasks::change(&client, out, args).await,
        Command::Cancel {
            id,
            job,
            unique_key,
        } => tasks::cancel(&client, out, id, job, unique_key).await,
        Command::Dlq(command) => dlq::run(&client, out, command).await,
        Command::Jobs(command) => jobs::jobs(&client, out, command).await,
        Command::Cron(command) => jobs::cron(&client, out, command).await,
        Command::Schedule(command) => schedules::run(&client, out, command).await,
        Command::Top(args) => jobs::top(&client, out, args).await,
        Command::Completion { .. } => unreachable!("handled above"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_and_instants_say_what_is_wrong() {
        assert_eq!(duration("1h 30m").unwrap(), Duration::from_secs(5400));
        assert!(duration("soon").unwrap_err().contains("\"soon\""));
        assert_eq!(
            instant("2026-12-01T07:00:00+01:00").unwrap(),
            instant("2026-12-01T06:00:00Z").unwrap()
        );
        assert!(instant("tomorrow").unwrap_err().contains("RFC 3339"));
    }
}
