//! What a schedule's row means at an instant: the firings due and when to look again
//! ([`plan`]), and the task a firing is ([`firing`]). Pure: the store runs [`plan`]
//! inside the transaction that holds the row.

use std::time::Duration;

use asyncd_contract::ScheduleSpec;
use asyncd_spec::Job;
use asyncd_spec::job::Overlap;
use asyncd_spec::schedule::rule::ScheduleRule;
use asyncd_store::{FirePlan, Millis, NewTask, PlannedFiring, ScheduleRecord};
use serde_json::value::RawValue;

use crate::clock::from_millis;
use crate::job_table::RouteTable;

/// How often a schedule whose job this process does not know (or whose spec it cannot
/// read: written by a newer release) is looked at again.
pub const UNKNOWN_RECHECK: Duration = Duration::from_secs(60);
/// The most firings one plan creates: a schedule far behind (a long catch-up of a
/// seconds cron) is caught up over several passes rather than in one transaction.
pub const MAX_FIRINGS_PER_PLAN: usize = 1_000;

/// How far ahead of its instant a firing is created.
#[derive(Debug, Clone, Copy)]
pub struct Leads {
    /// A schedule that allows overlaps: its firings exist this far ahead, so a
    /// dispatcher holds them in its heap before they are due.
    pub horizon: Duration,
    /// Any other: whether a firing is skipped, held back or cancels the previous one is
    /// decided when it is created, so that happens when it is due, within one pass.
    pub pass: Duration,
}

impl Leads {
    fn of(&self, overlap: Overlap) -> Duration {
        if overlap == Overlap::Allow {
            self.horizon
        } else {
            self.pass
        }
    }
}

/// Reads a row's spec as the API wrote it.
pub fn rule_of(row: &ScheduleRecord) -> Result<ScheduleRule, String> {
    let spec: ScheduleSpec = serde_json::from_str(&row.spec).map_err(|err| err.to_string())?;
    ScheduleRule::from_spec(&spec).map_err(|err| format!("{}: {}", err.field, err.message))
}

/// The firings of `row` due by `now` plus its lead, from where it stands: its next
/// firing not yet created (planned from its last write if none), or, after an outage
/// longer than its catch-up, the first within the catch-up.
pub fn plan(routes: &RouteTable, row: &ScheduleRecord, now: Millis, leads: Leads) -> FirePlan {
    if row.paused {
        return FirePlan::wait(row, None);
    }
    let Some(job) = routes.job(&row.task_type) else {
        return FirePlan::wait(row, Some(now + UNKNOWN_RECHECK));
    };
    let rule = match rule_of(row) {
        Ok(rule) => rule,
        Err(err) => {
            tracing::warn!(
                task_type = row.task_type,
                schedule = row.name,
                %err,
                "a schedule this scheduler cannot read is left alone"
            );
            return FirePlan::wait(row, Some(now + UNKNOWN_RECHECK));
        }
    };
    let anchor = from_millis(row.created_at);
    let lead = leads.of(rule.overlap);
    let mut next = match row.next_at {
        Some(at) => Some(from_millis(at)),
        None => rule.next_after(from_millis(row.updated_at), anchor),
    };
    let earliest = now.saturating_sub(rule.catch_up);
    if let Some(at) = next
        && Millis::from(at) <= earliest
    {
        next = rule.next_after(from_millis(earliest), anchor);
    }
    let mut firings = Vec::new();
    if let Some(at) = row.buffered_at {
        // Held back for the previous firing: due now, it is that late already.
        firings.push(PlannedFiring {
            at,
            task: firing(job, &rule, &row.name, at, Some(now)),
            buffered: true,
        });
    }
    while let Some(at) = next.map(Millis::from)
        && at <= now + lead
        && firings.len() < MAX_FIRINGS_PER_PLAN
    {
        firings.push(PlannedFiring {
            at,
            task: firing(job, &rule, &row.name, at, None),
            buffered: false,
        });
        next = rule.next_after(from_millis(at), anchor);
    }
    let next_at = next.map(Millis::from);
    FirePlan {
        firings,
        next_at,
        wake_at: next_at.map(|at| at.saturating_sub(lead)),
        overlap: rule.overlap,
    }
}

/// The identity of schedule `name`'s firing at `at`: unique among the job's firings,
/// so it is created once.
pub fn firing_key(job: &Job, name: &str, at: Millis) -> String {
    format!("{}/{name}/{at}", job.task_type)
}

/// The task schedule `name`'s firing at `at` is: the rule's payload (filled in) and
/// priority, the job's retries and timeout, due at `at` plus its jitter unless `due`
/// says when (a firing held back, late already). Its identity is its `cron_key`.
pub fn firing(
    job: &Job,
    rule: &ScheduleRule,
    name: &str,
    at: Millis,
    due: Option<Millis>,
) -> NewTask {
    let instant = from_millis(at);
    let payload_value = rule.payload_at(name, instant);
    let payload =
        RawValue::from_string(payload_value.to_string()).expect("a JSON value prints as JSON");
    let trigger_at = due.unwrap_or(at + rule.jitter_for(name, instant));
    NewTask {
        id: uuid::Uuid::now_v7().to_string(),
        task_type: job.task_type.clone(),
        payload,
        priority: rule.priority,
        trigger_at,
        max_retries: job.max_retries,
        timeout_ms: job.timeout.as_millis() as i64,
        idempotency_key: None,
        // One key for every firing of a schedule that does not allow overlaps: the
        // store refuses a firing while the previous one holds it (unfinished), and the
        // overlap policy decides what then.
        unique_key: (rule.overlap != Overlap::Allow)
            .then(|| format!("cron:{}/{name}", job.task_type)),
        // Held only while unfinished, whatever the job's `retention.uniqueKeys`: the
        // next firing must not be skipped for one that already finished.
        unique_for: Duration::ZERO,
        cron_key: Some(firing_key(job, name, at)),
        depends_on: Vec::new(),
        source_service: Some("asyncd-scheduler".into()),
        // A payload the job's template cannot fill (the schedule or the template changed
        // since the config was checked) leaves the firing keyless: it is claimed as the
        // keyless tasks' own key rather than lost.
        concurrency_key: job.render_concurrency_key(&payload_value).ok().flatten(),
        trace: None,
        expires_at: job.start_within.map(|within| trigger_at + within),
        // Each firing is its own: a job's debounce or throttle is for its submits.
        window: None,
    }
}

/// [`firing`] of a trigger: due now, and not the scheduled firing of this instant.
pub fn triggered(job: &Job, rule: &ScheduleRule, name: &str, now: Millis) -> NewTask {
    NewTask {
        cron_key: None,
        ..firing(job, rule, name, now, Some(now))
    }
}
