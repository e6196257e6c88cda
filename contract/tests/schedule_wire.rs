//! The schedule types on the wire: a spec refuses members it does not know, and a
//! schedule (a spec flattened among its state) reads back what it wrote.

use asyncd_contract::{CronOverlap, Schedule, ScheduleCreate, ScheduleSpec};

#[test]
fn a_spec_refuses_an_unknown_member() {
    let err = serde_json::from_str::<ScheduleSpec>(r#"{"every": "1h", "evry": "2h"}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("evry"), "{err}");
    let spec: ScheduleSpec =
        serde_json::from_str(r#"{"every": "1h", "overlap": "AllowAll"}"#).unwrap();
    assert_eq!(spec.overlap, CronOverlap::Allow, "AllowAll is Allow");
}

#[test]
fn a_schedule_and_a_create_round_trip() {
    let json = serde_json::json!({
        "job": "reports", "name": "weekly-42", "type": "report", "source": "api",
        "cron": "CRON_TZ=Europe/Berlin 0 9 * * MON", "payload": {"customer": 42},
        "priority": 3, "overlap": "BufferOne", "jitter": "5m", "paused": false,
        "next_firing": "2026-12-07T08:00:00.000Z", "last_firing": null,
        "last_task_id": null, "buffered_firing": null, "fired": 0,
        "created_at": "2026-12-05T10:00:00.000Z", "updated_at": "2026-12-05T10:00:00.000Z"
    });
    let schedule: Schedule = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(schedule.spec.overlap, CronOverlap::BufferOne);
    assert_eq!(schedule.spec.jitter.as_deref(), Some("5m"));
    assert_eq!(serde_json::to_value(&schedule).unwrap(), json);

    let create: ScheduleCreate = serde_json::from_value(serde_json::json!({
        "job": "reports", "name": "weekly-42", "every": "1h"
    }))
    .unwrap();
    assert_eq!(create.spec.every.as_deref(), Some("1h"));
}
