//! The README's "Schedules": one schedule per customer, written, listed, changed,
//! paused, triggered, backfilled and deleted at runtime. `sdk/readme_test.py` checks that
//! the README's block is this file's and runs it against `asyncd dev`.
//!
//! ```text
//! cargo run -p asyncd-client --example schedules
//! ```

use asyncd_client::{Client, CronOverlap, ErrorCode, ScheduleSpec};
use chrono::{Duration, Utc};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::builder()
        .endpoint("http://127.0.0.1:7700")
        .build()?;
    let (job, name) = ("report-job", "customer-42");

    // A monthly report for one customer, at 06:00 Berlin time on the 1st. PUT is an
    // upsert: run this again and the same schedule is written over.
    let spec = ScheduleSpec {
        cron: Some("CRON_TZ=Europe/Berlin 0 6 1 * *".into()),
        payload: json!({"customer": 42, "month": "{{scheduled_at}}"}),
        overlap: CronOverlap::Skip, // never two reports of one customer at once
        jitter: Some("10m".into()), // many customers' reports spread over 10 minutes
        ..ScheduleSpec::default()
    };
    let (schedule, created) = client.put_schedule(job, name, &spec).await?;
    println!(
        "{} (created: {created}): next firing {:?}",
        schedule.name, schedule.next_firing
    );
    // create_schedule refuses a name the job already has.
    match client.create_schedule(job, name, &spec).await {
        Err(e) if e.is(&ErrorCode::ScheduleExists) => println!("create again: {e}"),
        other => return Err(format!("want schedule_exists, got {other:?}").into()),
    }

    // Every schedule of the job, a page at a time.
    let mut cursor = None;
    loop {
        let page = client
            .list_schedules(job, cursor.as_deref(), Some(100))
            .await?;
        for s in &page.items {
            println!("{} ({:?}): fired {} tasks", s.name, s.source, s.fired);
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }

    // Change members of the spec (null clears one); pause, resume.
    let changed = client
        .change_schedule(job, name, json!({"priority": 5, "jitter": null}))
        .await?;
    assert_eq!((changed.spec.priority, changed.spec.jitter), (5, None));
    let paused = client.pause_schedule(job, name).await?;
    assert!(paused.spec.paused && paused.next_firing.is_none());
    client.resume_schedule(job, name).await?;

    // Fire it once now, besides its firings; then create the firings of the last 90
    // days, as if it had run then (each once, however often this is repeated).
    let fired = client.trigger_schedule(job, name).await?;
    println!("triggered: task {}", fired.id);
    let now = Utc::now();
    let backfill = client
        .backfill_schedule(job, name, now - Duration::days(90), now)
        .await?;
    println!(
        "backfill: {} firings, {} created",
        backfill.firings, backfill.created
    );

    // Deleting it keeps the tasks it created.
    client.delete_schedule(job, name).await?;
    Ok(())
}
