//! Schedules (`/v1/schedules`) through the SDK against a real `asyncd dev` (binary from
//! `ASYNCD_BIN`, default the `asyncd` in this test's own target folder). Without the
//! binary these tests fail; they never skip.

mod support;

use std::collections::BTreeSet;

use asyncd_client::{
    CronOverlap, Error, ErrorCode, Executor, ScheduleSource, ScheduleSpec, TaskContext, TaskQuery,
    format_time,
};
use chrono::{DurationRound, Utc};
use serde_json::{Value, json};
use support::{DEADLINE, Dev, Job, Recorder, SECRET, wait_for};

const JOB: &str = "rust-sched-job";

/// An executor whose `rust_sched` handler records every call and succeeds.
fn executor(rec: &Recorder) -> Executor {
    let rec = rec.clone();
    Executor::new().signing_secret(SECRET).register(
        "rust_sched",
        move |ctx: TaskContext, payload: Value| {
            rec.add(&ctx, &payload);
            async { Ok(()) }
        },
    )
}

async fn start(rec: &Recorder) -> Dev {
    Dev::start(
        executor(rec),
        &[Job::new("rust_sched").cron("nightly", "CRON_TZ=UTC 0 3 * * *")],
    )
    .await
}

fn every(period: &str) -> ScheduleSpec {
    ScheduleSpec {
        every: Some(period.into()),
        ..ScheduleSpec::default()
    }
}

/// The API refusal of `result`, checked for its code, status and (when given) field.
#[track_caller]
fn refused<T: std::fmt::Debug>(
    result: Result<T, Error>,
    code: ErrorCode,
    status: u16,
    field: Option<&str>,
) -> asyncd_client::ApiError {
    let err = result.expect_err("an API refusal");
    let api = err
        .api()
        .unwrap_or_else(|| panic!("{err} is not an API refusal"))
        .clone();
    assert_eq!((&api.code, api.status), (&code, status), "{api}");
    if field.is_some() {
        assert_eq!(api.field.as_deref(), field, "{api}");
    }
    api
}

/// An `every: 1s` schedule fires (polled with a deadline, no sleep as synchronisation):
/// its firings are tasks of the job, with the payload's templates filled in, that the
/// executor runs; deleting it keeps them.
#[tokio::test]
async fn an_every_schedule_fires_tasks_the_executor_runs() {
    let rec = Recorder::default();
    let dev = start(&rec).await;
    let c = &dev.client;
    let spec = ScheduleSpec {
        payload: json!({"schedule": "{{schedule}}", "at": "{{scheduled_at}}", "n": 7}),
        ..every("1s")
    };
    let created = c.create_schedule(JOB, "tick", &spec).await.unwrap();
    assert_eq!(
        (
            created.job.as_str(),
            created.name.as_str(),
            created.task_type.as_str(),
            created.source
        ),
        (JOB, "tick", "rust_sched", ScheduleSource::Api)
    );
    assert_eq!(created.spec.every.as_deref(), Some("1s"));
    assert_eq!(created.spec.overlap, CronOverlap::Allow);
    assert!(!created.spec.paused && created.next_firing.is_some());

    let fired = wait_for("the schedule's first firing", DEADLINE, async || {
        let s = c.get_schedule(JOB, "tick").await.unwrap();
        (s.fired >= 1 && s.last_task_id.is_some()).then_some(s)
    })
    .await;
    let last = fired.last_firing.expect("a firing has an instant");
    let task = c.get(fired.last_task_id.as_deref().unwrap()).await.unwrap();
    assert_eq!(task.task_type, "rust_sched");
    assert_eq!(
        task.payload,
        json!({"schedule": "tick", "at": format_time(last), "n": 7}),
        "the templates are filled in with the firing's name and instant"
    );

    // The executor runs firings: the first one due, at the latest.
    let run = wait_for("the executor to run a firing", DEADLINE, async || {
        rec.all()
            .into_iter()
            .find(|run| run.payload["schedule"] == "tick")
    })
    .await;
    assert_eq!(run.ctx.task_type, "rust_sched");

    c.delete_schedule(JOB, "tick").await.unwrap();
    refused(
        c.get_schedule(JOB, "tick").await,
        ErrorCode::NotFound,
        404,
        Some("name"),
    );
    c.get(&task.id).await.expect("the firings it created stay");
}

/// Create, upsert, list page by page, change, pause, resume, trigger and delete; the
/// job's `spec.cron` entry among them, read-only; and the refusals.
#[tokio::test]
async fn schedules_are_written_listed_changed_paused_triggered_and_deleted() {
    let rec = Recorder::default();
    let dev = start(&rec).await;
    let c = &dev.client;
    // The scheduler writes the config's entries to the store on its first pass.
    wait_for(
        "the config entry among the schedules",
        DEADLINE,
        async || c.get_schedule(JOB, "nightly").await.ok(),
    )
    .await;

    // PUT creates, then writes over.
    let (s, created) = c.put_schedule(JOB, "cust-1", &every("1h")).await.unwrap();
    assert!(created, "the first put creates: {s:?}");
    let spec = ScheduleSpec {
        priority: 2,
        overlap: CronOverlap::Skip,
        jitter: Some("5m".into()),
        ..every("1h")
    };
    let (s, created) = c.put_schedule(JOB, "cust-1", &spec).await.unwrap();
    assert!(!created, "the second put writes over: {s:?}");
    assert_eq!(
        (s.spec.priority, s.spec.overlap, s.spec.jitter.as_deref()),
        (2, CronOverlap::Skip, Some("5m"))
    );
    for name in ["cust-2", "cust-3:eu@x.y"] {
        c.create_schedule(JOB, name, &every("1h")).await.unwrap();
    }
    let api = refused(
        c.create_schedule(JOB, "cust-2", &every("2h")).await,
        ErrorCode::ScheduleExists,
        409,
        Some("name"),
    );
    assert!(!api.is_retryable());

    // Listed one a page through the cursor: every schedule once, by name, the config
    // entry among them.
    let mut names = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10 {
        let page = c
            .list_schedules(JOB, cursor.as_deref(), Some(1))
            .await
            .unwrap();
        assert!(page.items.len() <= 1, "{page:?}");
        names.extend(page.items.iter().map(|s| (s.name.clone(), s.source)));
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    assert!(cursor.is_none(), "the pages end: {names:?}");
    assert_eq!(
        names,
        vec![
            ("cust-1".to_string(), ScheduleSource::Api),
            ("cust-2".to_string(), ScheduleSource::Api),
            ("cust-3:eu@x.y".to_string(), ScheduleSource::Api),
            ("nightly".to_string(), ScheduleSource::Config),
        ]
    );
    let all = c.list_schedules(JOB, None, None).await.unwrap();
    assert_eq!(all.items.len(), 4);
    let nightly = all.items.iter().find(|s| s.name == "nightly").unwrap();
    assert_eq!(nightly.spec.cron.as_deref(), Some("CRON_TZ=UTC 0 3 * * *"));

    // A change replaces the members given; null clears one; cron replaces every.
    let s = c
        .change_schedule(JOB, "cust-1", json!({"priority": 5, "jitter": null}))
        .await
        .unwrap();
    assert_eq!(
        (s.spec.priority, s.spec.jitter, s.spec.overlap),
        (5, None, CronOverlap::Skip)
    );
    assert_eq!(s.spec.every.as_deref(), Some("1h"));
    let mut patch = asyncd_client::SchedulePatch::new();
    patch.insert("cron".into(), json!("CRON_TZ=Europe/Berlin 0 9 * * MON"));
    let s = c.change_schedule(JOB, "cust-1", patch).await.unwrap();
    assert_eq!(
        (s.spec.cron.as_deref(), s.spec.every.as_deref()),
        (Some("CRON_TZ=Europe/Berlin 0 9 * * MON"), None)
    );
    assert_eq!(
        c.get_schedule(JOB, "cust-1").await.unwrap().spec.priority,
        5
    );

    // Pause: no next firing; resume: one again.
    let s = c.pause_schedule(JOB, "cust-2").await.unwrap();
    assert!(s.spec.paused && s.next_firing.is_none(), "{s:?}");
    let s = c.get_schedule(JOB, "cust-2").await.unwrap();
    assert!(s.spec.paused && s.next_firing.is_none(), "{s:?}");
    let s = c.resume_schedule(JOB, "cust-2").await.unwrap();
    assert!(!s.spec.paused && s.next_firing.is_some(), "{s:?}");

    // Trigger: a task of the job, now, that get() finds; a config entry too.
    for name in ["cust-2", "nightly"] {
        let fired = c.trigger_schedule(JOB, name).await.unwrap();
        assert_eq!(
            (
                fired.job.as_str(),
                fired.entry.as_str(),
                fired.task_type.as_str()
            ),
            (JOB, name, "rust_sched")
        );
        let task = c.get(&fired.id).await.unwrap();
        assert_eq!(task.task_type, "rust_sched");
    }

    // The config entry is read-only here.
    refused(
        c.delete_schedule(JOB, "nightly").await,
        ErrorCode::ScheduleReadOnly,
        409,
        None,
    );
    refused(
        c.change_schedule(JOB, "nightly", json!({"priority": 1}))
            .await,
        ErrorCode::ScheduleReadOnly,
        409,
        None,
    );
    refused(
        c.put_schedule(JOB, "nightly", &every("1h")).await,
        ErrorCode::ScheduleReadOnly,
        409,
        None,
    );

    // Delete: gone, and a second delete is not found.
    c.delete_schedule(JOB, "cust-3:eu@x.y").await.unwrap();
    refused(
        c.get_schedule(JOB, "cust-3:eu@x.y").await,
        ErrorCode::NotFound,
        404,
        Some("name"),
    );
    refused(
        c.delete_schedule(JOB, "cust-3:eu@x.y").await,
        ErrorCode::NotFound,
        404,
        Some("name"),
    );

    // Refusals naming what is wrong.
    let no_zone = ScheduleSpec {
        cron: Some("0 9 * * *".into()),
        ..ScheduleSpec::default()
    };
    let api = refused(
        c.create_schedule(JOB, "no-zone", &no_zone).await,
        ErrorCode::InvalidField,
        400,
        Some("cron"),
    );
    assert!(api.message.contains("CRON_TZ"), "{api}");
    refused(
        c.create_schedule(JOB, "neither", &ScheduleSpec::default())
            .await,
        ErrorCode::InvalidField,
        400,
        Some("cron"),
    );
    refused(
        c.create_schedule(JOB, "fast", &every("500ms")).await,
        ErrorCode::InvalidField,
        400,
        Some("every"),
    );
    refused(
        c.create_schedule(JOB, "bad name", &every("1h")).await,
        ErrorCode::InvalidField,
        400,
        Some("name"),
    );
    refused(
        c.create_schedule("no-such-job", "x", &every("1h")).await,
        ErrorCode::NotFound,
        404,
        Some("job"),
    );
    refused(
        c.change_schedule(JOB, "cust-1", json!({"colour": "red"}))
            .await,
        ErrorCode::MalformedJson,
        400,
        Some("colour"),
    );
    refused(
        c.change_schedule(JOB, "cust-1", json!([1])).await,
        ErrorCode::MalformedJson,
        400,
        None,
    );
    refused(
        c.list_schedules(JOB, None, Some(0)).await,
        ErrorCode::InvalidField,
        400,
        Some("limit"),
    );
    let names: BTreeSet<String> = c
        .list_schedules(JOB, None, None)
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(["cust-1".into(), "cust-2".into(), "nightly".into()]),
        "nothing refused was stored"
    );
}

/// A backfill creates the firings whose instants fall in `[from, to)`, once: repeated,
/// it creates none.
#[tokio::test]
async fn a_backfill_creates_the_firings_of_a_past_range_once() {
    let rec = Recorder::default();
    let dev = start(&rec).await;
    let c = &dev.client;
    // Firings on whole hours since a day ago, so that `from` and `to` fall on two.
    let t0 = Utc::now()
        .duration_trunc(chrono::Duration::hours(1))
        .unwrap()
        - chrono::Duration::hours(24);
    let spec = ScheduleSpec {
        start_at: Some(t0),
        payload: json!({"at": "{{scheduled_at}}"}),
        ..every("1h")
    };
    c.create_schedule(JOB, "hourly", &spec).await.unwrap();
    let hour = chrono::Duration::hours(1);
    let (from, to) = (t0 + hour * 2, t0 + hour * 7);

    let result = c.backfill_schedule(JOB, "hourly", from, to).await.unwrap();
    assert_eq!(
        (result.firings, result.created),
        (5, 5),
        "from counts, to does not"
    );
    let again = c.backfill_schedule(JOB, "hourly", from, to).await.unwrap();
    assert_eq!((again.firings, again.created), (5, 0));
    // Overlapping the first: only the new firing is created.
    let more = c
        .backfill_schedule(JOB, "hourly", from, to + hour)
        .await
        .unwrap();
    assert_eq!((more.firings, more.created), (6, 1));

    let page = c
        .search(&TaskQuery {
            job: Some(JOB.into()),
            limit: Some(100),
            ..TaskQuery::default()
        })
        .await
        .unwrap();
    // (Leaving out the schedule's own next firing, created up to a minute ahead.)
    let instants: BTreeSet<String> = page
        .items
        .iter()
        .filter_map(|t| t.payload["at"].as_str().map(str::to_string))
        .filter(|at| at.as_str() < format_time(t0 + hour * 24).as_str())
        .collect();
    let want: BTreeSet<String> = (2..8).map(|h| format_time(t0 + hour * h)).collect();
    assert_eq!(instants, want, "one task per firing in [from, to)");

    // More than MAX_BACKFILL firings, or an empty range, is refused naming `to`.
    let secondly = ScheduleSpec {
        start_at: Some(t0),
        ..every("1s")
    };
    c.create_schedule(JOB, "secondly", &secondly).await.unwrap();
    let api = refused(
        c.backfill_schedule(JOB, "secondly", from, from + hour * 3)
            .await,
        ErrorCode::InvalidField,
        400,
        Some("to"),
    );
    assert!(
        api.message
            .contains(&asyncd_client::MAX_BACKFILL.to_string()),
        "{api}"
    );
    refused(
        c.backfill_schedule(JOB, "hourly", to, from).await,
        ErrorCode::InvalidField,
        400,
        Some("to"),
    );
    refused(
        c.backfill_schedule(JOB, "missing", from, to).await,
        ErrorCode::NotFound,
        404,
        Some("name"),
    );
}
