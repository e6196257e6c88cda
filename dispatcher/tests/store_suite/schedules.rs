//! Schedules (`asyncd_store::schedule`) as the store keeps them: written, read, listed
//! and deleted; fired by a pass that creates each firing once and records where the
//! schedule stands; the overlap policies decided as a firing is created; and two
//! schedulers' passes on one database taking each schedule once.

use std::sync::Arc;
use std::time::Duration;

use asyncd_spec::job::Overlap;
use asyncd_store::{
    self as store, CancelOutcome, FireParams, FirePlan, FiringOutcome, Millis, NewTask,
    PlannedFiring, PutSchedule, ScheduleRecord, ScheduleSource, Store, TaskState,
};

use crate::server::Server;
use crate::{T0, at, state};

scenarios!(
    a_schedule_is_written_read_listed_and_deleted,
    a_pass_creates_each_firing_once_and_records_where_the_schedule_stands,
    overlap_policies_are_decided_as_a_firing_is_created,
    config_schedules_follow_the_config,
);

fn put<'a>(name: &'a str, spec: &'a str, now: Millis) -> PutSchedule<'a> {
    PutSchedule {
        task_type: "s",
        name,
        source: ScheduleSource::Api,
        spec,
        paused: false,
        now,
    }
}

async fn a_schedule_is_written_read_listed_and_deleted(store: &dyn Store) {
    let created = store
        .create_schedule(put("b", r#"{"every":"1h"}"#, T0))
        .await
        .unwrap()
        .expect("created");
    assert_eq!(created.version, 1);
    assert_eq!(created.wake_at, Some(T0), "planned by the next pass");
    assert_eq!(
        store.create_schedule(put("b", "{}", T0)).await.unwrap(),
        None,
        "the name is taken"
    );
    assert_eq!(
        store.get_schedule("s", "b").await.unwrap().as_ref(),
        Some(&created)
    );
    for name in ["a", "c:1", "c:2"] {
        store
            .create_schedule(put(name, r#"{"every":"1h"}"#, T0))
            .await
            .unwrap()
            .unwrap();
    }
    let names = |rows: Vec<ScheduleRecord>| -> Vec<String> {
        rows.into_iter().map(|row| row.name).collect()
    };
    assert_eq!(
        names(store.list_schedules("s", None, 2).await.unwrap()),
        ["a", "b"]
    );
    assert_eq!(
        names(store.list_schedules("s", Some("b"), 2).await.unwrap()),
        ["c:1", "c:2"],
        "the page after b"
    );
    assert!(
        store
            .list_schedules("other", None, 10)
            .await
            .unwrap()
            .is_empty()
    );

    let paused = PutSchedule {
        paused: true,
        ..put("b", r#"{"every":"2h"}"#, at(5_000))
    };
    let changed = store
        .update_schedule(paused, Some(1))
        .await
        .unwrap()
        .expect("at version 1");
    assert_eq!(changed.version, 2);
    assert_eq!(changed.spec, r#"{"every":"2h"}"#);
    assert_eq!(changed.wake_at, None, "paused: never looked at");
    assert_eq!(changed.updated_at, at(5_000));
    assert_eq!(changed.created_at, T0);
    assert_eq!(
        store.update_schedule(paused, Some(1)).await.unwrap(),
        None,
        "no longer at version 1"
    );
    assert!(store.delete_schedule("s", "b").await.unwrap());
    assert!(!store.delete_schedule("s", "b").await.unwrap());
    assert_eq!(store.get_schedule("s", "b").await.unwrap(), None);
}

/// A firing of schedule `name` at `at`: its identity as the scheduler gives it, and the
/// schedule's unique key unless it allows overlaps.
fn firing(name: &str, at_ms: i64, overlap: Overlap) -> PlannedFiring {
    let mut task = NewTask::test("s", at(at_ms));
    task.cron_key = Some(format!("s/{name}/{}", at(at_ms)));
    if overlap != Overlap::Allow {
        task.unique_key = Some(format!("cron:s/{name}"));
    }
    task.unique_for = Duration::ZERO;
    PlannedFiring {
        at: at(at_ms),
        task,
        buffered: false,
    }
}

/// A planner firing each schedule it is given once, at its wake time, then waking it
/// 10 s later.
fn every_ten_seconds(row: &ScheduleRecord) -> FirePlan {
    let at_ms = row.wake_at.expect("a taken row wakes").as_i64() - T0.as_i64();
    FirePlan {
        firings: vec![firing(&row.name, at_ms, Overlap::Allow)],
        next_at: Some(at(at_ms + 10_000)),
        wake_at: Some(at(at_ms + 10_000)),
        overlap: Overlap::Allow,
    }
}

fn pass(now: Millis) -> FireParams {
    FireParams {
        now,
        wake_by: now,
        limit: 500,
    }
}

async fn a_pass_creates_each_firing_once_and_records_where_the_schedule_stands(store: &dyn Store) {
    store
        .create_schedule(put("tick", r#"{"every":"10s"}"#, T0))
        .await
        .unwrap()
        .unwrap();
    store
        .create_schedule(put("later", r#"{"every":"10s"}"#, at(60_000)))
        .await
        .unwrap()
        .unwrap();
    let first = store
        .fire_schedules(pass(T0), &every_ten_seconds)
        .await
        .unwrap();
    assert_eq!(first.schedules, 1, "only the schedule due to be looked at");
    let [fired] = first.fired.as_slice() else {
        panic!("{:?}", first.fired);
    };
    let FiringOutcome::Created { id } = &fired.outcome else {
        panic!("{:?}", fired.outcome);
    };
    assert_eq!(state(store, id).await, TaskState::Pending);
    let row = store.get_schedule("s", "tick").await.unwrap().unwrap();
    assert_eq!(
        (
            row.next_at,
            row.wake_at,
            row.last_task_id.as_deref(),
            row.last_fired_at,
            row.fired
        ),
        (
            Some(at(10_000)),
            Some(at(10_000)),
            Some(id.as_str()),
            Some(T0),
            1
        )
    );
    assert_eq!(row.version, 2);

    let again = store
        .fire_schedules(pass(at(5_000)), &every_ten_seconds)
        .await
        .unwrap();
    assert_eq!(again.schedules, 0, "nothing to look at before 10 s");

    // A firing stored before (a backfill, another scheduler's pass) is not stored again.
    let repeat = |_: &ScheduleRecord| FirePlan {
        firings: vec![firing("tick", 0, Overlap::Allow)],
        next_at: Some(at(20_000)),
        wake_at: Some(at(20_000)),
        overlap: Overlap::Allow,
    };
    let repeated = store
        .fire_schedules(pass(at(10_000)), &repeat)
        .await
        .unwrap();
    assert_eq!(
        repeated.fired[0].outcome,
        FiringOutcome::Existed { id: id.clone() }
    );
    let row = store.get_schedule("s", "tick").await.unwrap().unwrap();
    assert_eq!(row.fired, 1, "an existing firing is not counted again");
}

fn overlap_of(name: &str) -> Overlap {
    match name {
        "skip" => Overlap::Skip,
        "buffer" => Overlap::BufferOne,
        _ => Overlap::CancelOther,
    }
}

async fn overlap_policies_are_decided_as_a_firing_is_created(store: &dyn Store) {
    for name in ["skip", "buffer", "cancel"] {
        store
            .create_schedule(put(name, r#"{"every":"10s"}"#, T0))
            .await
            .unwrap()
            .unwrap();
    }
    // Each pass fires what is due by its instant, a held-back firing first.
    let planner_at = |now: Millis| {
        move |row: &ScheduleRecord| {
            let overlap = overlap_of(&row.name);
            let due = row.next_at.unwrap_or(T0);
            let mut firings = Vec::new();
            if let Some(held) = row.buffered_at {
                let mut again = firing(&row.name, held.as_i64() - T0.as_i64(), overlap);
                again.buffered = true;
                firings.push(again);
            }
            let mut next = due;
            if due <= now {
                firings.push(firing(&row.name, due.as_i64() - T0.as_i64(), overlap));
                next = due + Duration::from_secs(10);
            }
            FirePlan {
                firings,
                next_at: Some(next),
                wake_at: Some(next),
                overlap,
            }
        }
    };
    let outcomes = |fired: &[store::Fired], name: &str| -> Vec<FiringOutcome> {
        fired
            .iter()
            .filter(|f| f.name == name)
            .map(|f| f.outcome.clone())
            .collect()
    };
    let first = store
        .fire_schedules(pass(T0), &planner_at(T0))
        .await
        .unwrap();
    let created = |name: &str| match outcomes(&first.fired, name).as_slice() {
        [FiringOutcome::Created { id }] => id.clone(),
        other => panic!("{name}: {other:?}"),
    };
    let (skip0, buffer0, cancel0) = (created("skip"), created("buffer"), created("cancel"));

    // 10 s: every first firing is unfinished.
    let second = store
        .fire_schedules(pass(at(10_000)), &planner_at(at(10_000)))
        .await
        .unwrap();
    assert_eq!(
        outcomes(&second.fired, "skip"),
        [FiringOutcome::Skipped {
            running: skip0.clone()
        }]
    );
    assert_eq!(
        outcomes(&second.fired, "buffer"),
        [FiringOutcome::Buffered {
            running: buffer0.clone()
        }]
    );
    let cancel = outcomes(&second.fired, "cancel");
    let [
        FiringOutcome::Replaced {
            id: cancel1,
            cancelled,
        },
    ] = cancel.as_slice()
    else {
        panic!("cancel: {cancel:?}");
    };
    assert_eq!(cancelled, &cancel0);
    assert_eq!(state(store, &cancel0).await, TaskState::Cancelled);
    assert_eq!(state(store, cancel1).await, TaskState::Pending);
    let buffer = store.get_schedule("s", "buffer").await.unwrap().unwrap();
    assert_eq!(buffer.buffered_at, Some(at(10_000)));
    assert_eq!(
        buffer.wake_at,
        Some(at(11_000)),
        "looked at again within a second, for the previous one to finish"
    );

    // 11 s: the previous firing has not finished; the held one stays held.
    let third = store
        .fire_schedules(pass(at(11_000)), &planner_at(at(11_000)))
        .await
        .unwrap();
    assert_eq!(
        outcomes(&third.fired, "buffer"),
        [FiringOutcome::Buffered {
            running: buffer0.clone()
        }]
    );
    // 20 s: still unfinished; the held firing stays the 10 s one, the new one is skipped.
    let fourth = store
        .fire_schedules(pass(at(20_000)), &planner_at(at(20_000)))
        .await
        .unwrap();
    assert_eq!(
        outcomes(&fourth.fired, "buffer")[1],
        FiringOutcome::Skipped {
            running: buffer0.clone()
        }
    );
    let buffer = store.get_schedule("s", "buffer").await.unwrap().unwrap();
    assert_eq!(buffer.buffered_at, Some(at(10_000)), "at most one held");

    // The previous firing ends: the held one goes in at the next look.
    assert_eq!(
        store.cancel(&buffer0, at(20_500)).await.unwrap(),
        CancelOutcome::Cancelled
    );
    let fifth = store
        .fire_schedules(pass(at(21_000)), &planner_at(at(21_000)))
        .await
        .unwrap();
    let held: Vec<_> = fifth.fired.iter().filter(|f| f.name == "buffer").collect();
    let [held] = held.as_slice() else {
        panic!("buffer: {held:?}");
    };
    let FiringOutcome::Created { id } = &held.outcome else {
        panic!("{:?}", held.outcome);
    };
    assert_eq!(state(store, id).await, TaskState::Pending);
    assert_eq!(
        held.task.cron_key.as_deref(),
        Some(format!("s/buffer/{}", at(10_000)).as_str()),
        "the 10 s firing"
    );
    let buffer = store.get_schedule("s", "buffer").await.unwrap().unwrap();
    assert_eq!(buffer.buffered_at, None);
    assert_eq!(buffer.wake_at, Some(at(30_000)), "back to its own pace");
}

async fn config_schedules_follow_the_config(store: &dyn Store) {
    let entry = |name: &str, spec: &str, paused: bool| store::ConfigSchedule {
        name: name.into(),
        spec: spec.into(),
        paused,
    };
    store
        .create_schedule(put("api-one", r#"{"every":"1h"}"#, T0))
        .await
        .unwrap()
        .unwrap();
    let v1 = [
        entry("nightly", r#"{"cron":"CRON_TZ=UTC 0 3 * * *"}"#, false),
        entry("hourly", r#"{"cron":"CRON_TZ=UTC 0 * * * *"}"#, false),
    ];
    store.sync_config_schedules("s", &v1, T0).await.unwrap();
    let nightly = store.get_schedule("s", "nightly").await.unwrap().unwrap();
    assert_eq!(nightly.source, ScheduleSource::Config);
    // The same config again writes nothing.
    store
        .sync_config_schedules("s", &v1, at(1_000))
        .await
        .unwrap();
    assert_eq!(
        store.get_schedule("s", "nightly").await.unwrap().unwrap(),
        nightly
    );
    // hourly paused, nightly gone: the API's schedule stays.
    let v2 = [entry("hourly", r#"{"cron":"CRON_TZ=UTC 0 * * * *"}"#, true)];
    store
        .sync_config_schedules("s", &v2, at(2_000))
        .await
        .unwrap();
    assert_eq!(store.get_schedule("s", "nightly").await.unwrap(), None);
    let hourly = store.get_schedule("s", "hourly").await.unwrap().unwrap();
    assert!(hourly.paused);
    assert_eq!(hourly.wake_at, None);
    assert!(store.get_schedule("s", "api-one").await.unwrap().is_some());
}

/// Two schedulers, each with its own store (and pool), fire 300 schedules due at once
/// in passes of 50: every schedule is taken by one pass only — no firing is found
/// already stored, which is what a pass taking a schedule another holds would find.
async fn two_schedulers_take_each_schedule_once(server: &Server) {
    let url = server.create_db().await;
    let setup = store::open(&url).await.unwrap();
    setup.migrate().await.unwrap();
    for n in 0..300 {
        setup
            .create_schedule(put(&format!("c{n:03}"), r#"{"every":"10s"}"#, T0))
            .await
            .unwrap()
            .unwrap();
    }
    let schedulers: Vec<Arc<dyn Store>> = vec![
        store::open(&url).await.unwrap(),
        store::open(&url).await.unwrap(),
    ];
    let runs = schedulers.iter().map(|store| {
        let store = store.clone();
        tokio::spawn(async move {
            let mut fired = Vec::new();
            loop {
                let params = FireParams {
                    limit: 50,
                    ..pass(T0)
                };
                let pass = store
                    .fire_schedules(params, &every_ten_seconds)
                    .await
                    .unwrap();
                fired.extend(pass.fired);
                if pass.schedules == 0 {
                    return fired;
                }
            }
        })
    });
    let mut fired = Vec::new();
    for run in futures::future::join_all(runs).await {
        fired.extend(run.unwrap());
    }
    let created = fired
        .iter()
        .filter(|f| matches!(f.outcome, FiringOutcome::Created { .. }))
        .count();
    let existed: Vec<_> = fired
        .iter()
        .filter(|f| !matches!(f.outcome, FiringOutcome::Created { .. }))
        .collect();
    assert!(existed.is_empty(), "taken twice: {existed:?}");
    assert_eq!(created, 300);
    drop(setup);
    server.drop_created().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_two_schedulers_take_each_schedule_once() {
    let Some(server) = Server::mariadb() else {
        return;
    };
    two_schedulers_take_each_schedule_once(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_two_schedulers_take_each_schedule_once() {
    let Some(server) = Server::postgres() else {
        return;
    };
    two_schedulers_take_each_schedule_once(&server).await;
}
