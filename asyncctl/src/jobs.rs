//! `jobs ls|get|pause|resume|weight`, `cron ls|trigger` and `top`.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use asyncd_client::Client;
use asyncd_client::asyncd_contract::{BindingLimit, JobOverview, JobStatus};
use clap::{Args, Subcommand};
use serde::Serialize;

use crate::exit::{Failure, usage};
use crate::output::{self, Format, Table, or_dash};

#[derive(Subcommand)]
pub enum Jobs {
    /// Every job you may read: paused, due backlog, lateness, running, dead letters.
    Ls,
    /// One job, with the limit that binds now, its shared limiters, its cron entries and
    /// the keys resting after a 429 or 503.
    Get {
        /// The AsyncJobConfig's name.
        name: String,
    },
    /// Pause a job: no attempt of it begins; its tasks wait.
    Pause {
        /// The AsyncJobConfig's name.
        name: String,
    },
    /// Lift the API's pause of a job.
    Resume {
        /// The AsyncJobConfig's name.
        name: String,
    },
    /// Set a tenant's weight in a job with `spec.fairness`, in place of the spec's, from
    /// the next claim on; `--reset` gives the spec's back.
    Weight {
        /// The AsyncJobConfig's name.
        name: String,
        /// The tenant, as the job's `fairness.tenant` template renders it.
        tenant: String,
        /// 1 to 1000: the tenant's share of the job's concurrency is its weight over the
        /// weights of the tenants with work.
        #[arg(required_unless_present = "reset", conflicts_with = "reset")]
        weight: Option<u32>,
        /// Drop the weight set at runtime.
        #[arg(long)]
        reset: bool,
    },
}

#[derive(Subcommand)]
pub enum Cron {
    /// Cron entries with their next firings.
    Ls {
        /// Only this job's entries.
        #[arg(long)]
        job: Option<String>,
    },
    /// Fire a cron entry once, now, besides its schedule.
    Trigger {
        /// The AsyncJobConfig's name.
        job: String,
        /// The cron entry's name (spec.cron[].name).
        entry: String,
    },
}

#[derive(Args)]
pub struct TopArgs {
    /// Time between refreshes.
    #[arg(long, default_value = "2s", value_parser = crate::duration)]
    interval: Duration,
    /// Print one sample and exit (for scripts and tests).
    #[arg(long)]
    once: bool,
}

fn paused(status: &JobStatus) -> &'static str {
    match (status.paused, status.paused_by_config) {
        (false, _) => "no",
        (true, true) => "config",
        (true, false) => "api",
    }
}

fn pause_table(status: &JobStatus) -> Table {
    let mut table = Table::new(&["JOB", "TYPE", "PAUSED", "PAUSED AT"]);
    table.row(vec![
        status.job.clone(),
        status.task_type.clone(),
        paused(status).into(),
        or_dash(status.paused_at.map(output::time)),
    ]);
    table
}

/// The overview's counts stop at a cap: a count at it means "at least".
fn count(n: u64) -> String {
    if n >= asyncd_client::asyncd_contract::MAX_JOB_COUNT {
        format!("{n}+")
    } else {
        n.to_string()
    }
}

fn overview_table(jobs: &[JobOverview]) -> Table {
    let mut table = Table::new(&[
        "JOB",
        "TYPE",
        "PAUSED",
        "DUE",
        "LATE",
        "SCHEDULED",
        "RUNNING",
        "DEAD",
        "OK/MIN",
        "DEAD/MIN",
    ]);
    for job in jobs {
        let s = &job.stats;
        table.row(vec![
            job.status.job.clone(),
            job.status.task_type.clone(),
            paused(&job.status).into(),
            count(s.due),
            or_dash(s.oldest_due_seconds.map(output::seconds)),
            count(s.scheduled),
            count(s.running),
            count(s.dead),
            s.finished_last_minute.succeeded.to_string(),
            s.finished_last_minute.dead.to_string(),
        ]);
    }
    table
}

/// The keys resting after an executor's 429 or 503, and until when.
fn resting_table(job: &JobOverview) -> Table {
    let mut table = Table::new(&["RESTING KEY", "UNTIL"]);
    for key in &job.resting_keys {
        table.row(vec![key.key.clone(), output::time(key.until)]);
    }
    table
}

/// A keyed job's busiest keys with their usage.
fn keys_table(job: &JobOverview) -> Table {
    let mut table = Table::new(&["KEY", "RUNNING", "DUE"]);
    for k in &job.keys {
        table.row(vec![k.key.clone(), count(k.running), count(k.due)]);
    }
    table
}

/// A fair job's busiest tenants with their usage and share.
fn tenants_table(job: &JobOverview) -> Table {
    let mut table = Table::new(&["TENANT", "WEIGHT", "RUNNING", "DUE", "FAIR SHARE"]);
    for t in &job.tenants {
        table.row(vec![
            t.tenant.clone(),
            t.weight.to_string(),
            count(t.running),
            count(t.due),
            format!("{:.1}", t.fair_share),
        ]);
    }
    table
}

/// The AsyncLimiters the job shares with others, each with what runs under it now.
fn limiters_table(job: &JobOverview) -> Table {
    let mut table = Table::new(&["LIMITER", "RUNNING", "CONCURRENCY", "RATE/S", "TYPES"]);
    for limiter in &job.limiters {
        table.row(vec![
            limiter.name.clone(),
            limiter.running.to_string(),
            or_dash(limiter.concurrency),
            or_dash(limiter.rate_per_second),
            limiter.task_types.join(","),
        ]);
    }
    table
}

/// The limit keeping the job's due tasks waiting, as one line.
fn binding_line(job: &JobOverview) -> Option<String> {
    let limit = match job.binding_limit.as_ref()? {
        BindingLimit::Paused => "paused".to_string(),
        BindingLimit::Concurrency => format!("concurrency ({})", job.effective_concurrency),
        BindingLimit::Limiter { name } => format!("limiter {name}"),
        BindingLimit::Rate => "rate limit (no token left)".to_string(),
        BindingLimit::LimiterRate { name } => format!("limiter {name}'s rate (no token left)"),
        BindingLimit::KeyCooldown => "keys resting after 429/503".to_string(),
    };
    Some(format!("Held by: {limit}"))
}

fn cron_table(jobs: &[JobOverview]) -> Table {
    let mut table = Table::new(&[
        "JOB", "ENTRY", "SCHEDULE", "OVERLAP", "CATCH-UP", "PAUSED", "NEXT",
    ]);
    for job in jobs {
        for entry in &job.cron {
            let next: Vec<String> = entry.next.iter().map(|t| output::time(*t)).collect();
            table.row(vec![
                job.status.job.clone(),
                entry.name.clone(),
                entry.schedule.clone(),
                format!("{:?}", entry.overlap),
                entry.catch_up.clone(),
                entry.paused.to_string(),
                if next.is_empty() {
                    "-".into()
                } else {
                    next.join(", ")
                },
            ]);
        }
    }
    table
}

pub async fn jobs(client: &Client, out: Format, command: Jobs) -> Result<(), Failure> {
    match command {
        Jobs::Ls => {
            let jobs = client.jobs().await?;
            if !output::structured(out, &jobs)? {
                overview_table(&jobs).print();
            }
        }
        Jobs::Get { name } => {
            let job = client.job(&name).await?;
            if !output::structured(out, &job)? {
                let one = std::slice::from_ref(&job);
                overview_table(one).print();
                if let Some(line) = binding_line(&job) {
                    println!("{line}");
                }
                if !job.limiters.is_empty() {
                    println!();
                    limiters_table(&job).print();
                }
                if !job.cron.is_empty() {
                    println!();
                    cron_table(one).print();
                }
                if !job.resting_keys.is_empty() {
                    println!();
                    resting_table(&job).print();
                }
                if !job.tenants.is_empty() {
                    println!();
                    tenants_table(&job).print();
                }
                if !job.keys.is_empty() {
                    println!();
                    keys_table(&job).print();
                }
                if !job.tenant_weights.is_empty() {
                    println!();
                    let mut table = Table::new(&["TENANT", "WEIGHT SET AT RUNTIME"]);
                    for (tenant, weight) in &job.tenant_weights {
                        table.row(vec![tenant.clone(), weight.to_string()]);
                    }
                    table.print();
                }
            }
        }
        Jobs::Pause { name } => {
            let status = client.pause_job(&name).await?;
            if !output::structured(out, &status)? {
                pause_table(&status).print();
            }
        }
        Jobs::Resume { name } => {
            let status = client.resume_job(&name).await?;
            if !output::structured(out, &status)? {
                pause_table(&status).print();
            }
        }
        Jobs::Weight {
            name,
            tenant,
            weight,
            reset,
        } => {
            let set = match (weight, reset) {
                (Some(weight), false) => client.set_tenant_weight(&name, &tenant, weight).await?,
                (None, true) => client.reset_tenant_weight(&name, &tenant).await?,
                _ => return Err(usage("give a weight (1 to 1000) or --reset")),
            };
            if !output::structured(out, &set)? {
                let mut table = Table::new(&["JOB", "TENANT", "WEIGHT", "SET AT RUNTIME"]);
                table.row(vec![
                    set.job,
                    set.tenant,
                    set.weight.to_string(),
                    set.set_at_runtime.to_string(),
                ]);
                table.print();
            }
        }
    }
    Ok(())
}

/// A cron entry as `cron ls -o json|yaml` prints it.
#[derive(Serialize)]
struct CronLine<'a> {
    job: &'a str,
    #[serde(flatten)]
    entry: &'a asyncd_client::asyncd_contract::CronOverview,
}

pub async fn cron(client: &Client, out: Format, command: Cron) -> Result<(), Failure> {
    match command {
        Cron::Ls { job } => {
            let jobs = match job {
                Some(name) => vec![client.job(&name).await?],
                None => client.jobs().await?,
            };
            let lines: Vec<CronLine> = jobs
                .iter()
                .flat_map(|job| {
                    job.cron.iter().map(|entry| CronLine {
                        job: &job.status.job,
                        entry,
                    })
                })
                .collect();
            if !output::structured(out, &lines)? {
                cron_table(&jobs).print();
            }
        }
        Cron::Trigger { job, entry } => {
            let fired = client.trigger_cron(&job, &entry).await?;
            if !output::structured(out, &fired)? {
                let mut table = Table::new(&["ID", "JOB", "ENTRY", "TYPE", "ETA"]);
                table.row(vec![
                    fired.id.clone(),
                    fired.job.clone(),
                    fired.entry.clone(),
                    fired.task_type.clone(),
                    output::time(fired.eta),
                ]);
                table.print();
            }
        }
    }
    Ok(())
}

/// One job's line in `top`: the overview's figures and the rates over the last minute.
#[derive(Serialize)]
struct TopLine<'a> {
    job: &'a str,
    paused: bool,
    due: u64,
    oldest_due_seconds: Option<f64>,
    scheduled: u64,
    running: u64,
    dead: u64,
    /// Tasks that succeeded per second, over the minute before the sample.
    succeeded_per_second: f64,
    /// Tasks that went to dead letters per second, over the same minute.
    dead_per_second: f64,
}

fn top_lines(jobs: &[JobOverview]) -> Vec<TopLine<'_>> {
    jobs.iter()
        .map(|job| {
            let s = &job.stats;
            TopLine {
                job: &job.status.job,
                paused: job.status.paused,
                due: s.due,
                oldest_due_seconds: s.oldest_due_seconds,
                scheduled: s.scheduled,
                running: s.running,
                dead: s.dead,
                succeeded_per_second: s.finished_last_minute.succeeded as f64 / 60.0,
                dead_per_second: s.finished_last_minute.dead as f64 / 60.0,
            }
        })
        .collect()
}

fn top_table(lines: &[TopLine]) -> Table {
    let mut table = Table::new(&[
        "JOB",
        "PAUSED",
        "DUE",
        "LATE",
        "SCHEDULED",
        "RUNNING",
        "OK/S",
        "DEAD/S",
        "DEAD",
    ]);
    for l in lines {
        table.row(vec![
            l.job.to_string(),
            if l.paused { "yes" } else { "no" }.into(),
            count(l.due),
            or_dash(l.oldest_due_seconds.map(output::seconds)),
            count(l.scheduled),
            count(l.running),
            format!("{:.2}", l.succeeded_per_second),
            format!("{:.2}", l.dead_per_second),
            count(l.dead),
        ]);
    }
    table
}

pub async fn top(client: &Client, out: Format, args: TopArgs) -> Result<(), Failure> {
    if args.interval.is_zero() {
        return Err(usage("--interval: must be more than 0s"));
    }
    // Redraw in place only on a terminal; a pipe gets one block per sample.
    let redraw = std::io::stdout().is_terminal() && out == Format::Table && !args.once;
    loop {
        let jobs = client.jobs().await?;
        let lines = top_lines(&jobs);
        let now = output::time(chrono::Utc::now());
        if !output::structured(out, &lines)? {
            let mut stdout = std::io::stdout().lock();
            if redraw {
                // Home the cursor and clear the screen.
                write!(stdout, "\x1b[H\x1b[2J").map_err(anyhow::Error::from)?;
            }
            writeln!(
                stdout,
                "asyncd {} at {now}: {} job{} (rates over the last minute)",
                client.endpoint(),
                lines.len(),
                if lines.len() == 1 { "" } else { "s" }
            )
            .map_err(anyhow::Error::from)?;
            write!(stdout, "{}", top_table(&lines).render()).map_err(anyhow::Error::from)?;
            stdout.flush().map_err(anyhow::Error::from)?;
        }
        if args.once {
            return Ok(());
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = tokio::time::sleep(args.interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_counts_say_at_least() {
        let cap = asyncd_client::asyncd_contract::MAX_JOB_COUNT;
        assert_eq!(count(3), "3");
        assert_eq!(count(cap), format!("{cap}+"));
    }

    #[test]
    fn limiters_and_the_binding_limit_are_shown() {
        let list: asyncd_client::asyncd_contract::JobList =
            serde_json::from_str(include_str!("../../contract/fixtures/jobs_response.json"))
                .unwrap();
        let table = limiters_table(&list.jobs[1]).render();
        assert!(table.starts_with("LIMITER"), "{table}");
        assert!(
            table.contains("shop/mail-provider") && table.contains("send_email,send_sms"),
            "{table}"
        );
        assert_eq!(
            binding_line(&list.jobs[0]).as_deref(),
            Some("Held by: paused")
        );
        let mut held = list.jobs[1].clone();
        held.binding_limit = Some(BindingLimit::Limiter {
            name: "shop/mail-provider".into(),
        });
        assert_eq!(
            binding_line(&held).as_deref(),
            Some("Held by: limiter shop/mail-provider")
        );
        held.binding_limit = Some(BindingLimit::LimiterRate {
            name: "shop/mail-provider".into(),
        });
        assert_eq!(
            binding_line(&held).as_deref(),
            Some("Held by: limiter shop/mail-provider's rate (no token left)")
        );
        assert_eq!(binding_line(&list.jobs[1]), None);
    }

    #[test]
    fn resting_keys_are_listed_with_their_ends() {
        let mut job: JobOverview =
            serde_json::from_str(include_str!("../../contract/fixtures/jobs_response.json"))
                .map(|list: asyncd_client::asyncd_contract::JobList| list.jobs[1].clone())
                .unwrap();
        let until = job.resting_keys[0].until;
        let table = resting_table(&job).render();
        assert!(table.starts_with("RESTING KEY"), "{table}");
        assert!(
            table.contains("merchant:m7") && table.contains(&output::time(until)),
            "{table}"
        );
        job.resting_keys.clear();
        assert_eq!(
            resting_table(&job).render().lines().count(),
            1,
            "a header alone"
        );
    }

    #[test]
    fn busy_keys_are_listed_with_their_usage() {
        let list: asyncd_client::asyncd_contract::JobList =
            serde_json::from_str(include_str!("../../contract/fixtures/jobs_response.json"))
                .unwrap();
        let table = keys_table(&list.jobs[1]).render();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        assert!(lines[0].starts_with("KEY"), "{table}");
        let m3: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(m3, ["merchant:m3", "2", "40"], "{table}");
    }
}
