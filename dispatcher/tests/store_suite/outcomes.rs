//! What finishing an attempt records: a late success, and executors' errors.

use asyncd_store::{Finish, FinishKind, Millis, NewTask, RedriveOutcome, Store, TaskState};
use serde_json::value::RawValue;

use crate::{T0, at, claim_all, insert, start_params, state};

scenarios!(
    a_success_after_its_attempt_was_given_up_lands_until_a_new_claim,
    errors_from_executors_are_stored_sanitized_and_capped,
);

async fn a_success_after_its_attempt_was_given_up_lands_until_a_new_claim(store: &dyn Store) {
    // Issue 10, finding 3: a dispatcher starved of CPU wrote successes after their
    // leases lapsed; the rescuer had queued the tasks again, the successes were refused
    // as stale, and the work ran again and again. A success for a given-up attempt now
    // lands while the task waits for a new attempt; once one is claimed (or after a
    // redrive) the old attempt's token is spent.
    async fn given_up(store: &dyn Store, id: &str, now: Millis) -> i64 {
        let claimed = claim_all(store, now, now).await;
        let claim = claimed.iter().find(|c| c.id == id).unwrap();
        let attempt = store
            .start(start_params(&[(id.to_string(), claim.lease_token)], now, 0))
            .await
            .unwrap()
            .remove(0);
        let lapsed = Finish {
            id: id.to_string(),
            lease_token: attempt.lease_token,
            kind: FinishKind::Retry {
                at: now,
                error: "attempt 1 lease lapsed".into(),
            },
        };
        assert_eq!(store.finish(&[lapsed], now).await.unwrap(), [true]);
        attempt.lease_token
    }
    let late = |id: &str, token: i64| Finish {
        id: id.to_string(),
        lease_token: token,
        kind: FinishKind::Succeeded {
            result: Some(RawValue::from_string("\"late\"".into()).unwrap()),
        },
    };

    let waiting = insert(store, NewTask::test("a", T0)).await;
    let token = given_up(store, &waiting, T0).await;
    assert_eq!(state(store, &waiting).await, TaskState::Pending);
    assert_eq!(
        store.finish(&[late(&waiting, token)], at(1)).await.unwrap(),
        [true]
    );
    let record = store.get(&waiting).await.unwrap().unwrap();
    assert_eq!(
        (
            record.state,
            record.attempt,
            record.result.map(|r| r.get().to_string())
        ),
        (TaskState::Succeeded, 1, Some("\"late\"".to_string()))
    );
    assert!(
        claim_all(store, at(10), at(10)).await.is_empty(),
        "nothing runs again"
    );

    let reclaimed = insert(store, NewTask::test("a", at(20))).await;
    let token = given_up(store, &reclaimed, at(20)).await;
    let claim = claim_all(store, at(20), at(20)).await.remove(0);
    assert_eq!(
        store
            .finish(&[late(&reclaimed, token)], at(21))
            .await
            .unwrap(),
        [false],
        "a new claim spent the old token"
    );
    let second = store
        .start(start_params(
            &[(reclaimed.clone(), claim.lease_token)],
            at(21),
            0,
        ))
        .await
        .unwrap();
    assert_eq!(second.len(), 1, "the new claim still begins");

    // Given up on its last attempt: dead-lettered, until the success comes in.
    let buried = insert(store, NewTask::test("a", at(25))).await;
    let claim = claim_all(store, at(25), at(25)).await.remove(0);
    let attempt = store
        .start(start_params(
            &[(buried.clone(), claim.lease_token)],
            at(25),
            0,
        ))
        .await
        .unwrap()
        .remove(0);
    let lapsed = Finish {
        id: buried.clone(),
        lease_token: attempt.lease_token,
        kind: FinishKind::Dead {
            error: "attempt 1 lease lapsed".into(),
        },
    };
    assert_eq!(store.finish(&[lapsed], at(26)).await.unwrap(), [true]);
    assert_eq!(
        store
            .finish(&[late(&buried, attempt.lease_token)], at(27))
            .await
            .unwrap(),
        [true],
        "a success lands on the dead-lettered attempt"
    );
    assert_eq!(state(store, &buried).await, TaskState::Succeeded);

    let redriven = insert(store, NewTask::test("a", at(30))).await;
    let claim = claim_all(store, at(30), at(30)).await.remove(0);
    let attempt = store
        .start(start_params(
            &[(redriven.clone(), claim.lease_token)],
            at(30),
            0,
        ))
        .await
        .unwrap()
        .remove(0);
    let dead = Finish {
        id: redriven.clone(),
        lease_token: attempt.lease_token,
        kind: FinishKind::Dead {
            error: "gone".into(),
        },
    };
    assert_eq!(store.finish(&[dead], at(31)).await.unwrap(), [true]);
    assert!(matches!(
        store.redrive(&redriven, at(32)).await.unwrap(),
        RedriveOutcome::Redriven { .. }
    ));
    assert_eq!(
        store
            .finish(&[late(&redriven, attempt.lease_token)], at(33))
            .await
            .unwrap(),
        [false],
        "a redrive spent the old token"
    );
    assert_eq!(state(store, &redriven).await, TaskState::Pending);
}

async fn errors_from_executors_are_stored_sanitized_and_capped(store: &dyn Store) {
    // An executor's error text reaches the store whatever it holds: NUL (PostgreSQL
    // refuses it in text), escape sequences, megabytes. The store makes each storable
    // itself, so no caller can get an outcome batch refused, and the other outcomes in
    // the same batch apply.
    let poison = format!("boom\0\u{1b}[31m\r{}", "é".repeat(100_000));
    let ids = [
        insert(store, NewTask::test("a", T0)).await,
        insert(store, NewTask::test("a", T0)).await,
        insert(store, NewTask::test("a", T0)).await,
    ];
    let claims: Vec<(String, i64)> = claim_all(store, T0, T0)
        .await
        .iter()
        .map(|c| (c.id.clone(), c.lease_token))
        .collect();
    let started = store.start(start_params(&claims, T0, 0)).await.unwrap();
    let token = |id: &str| started.iter().find(|s| s.id == id).unwrap().lease_token;
    let finishes = [
        Finish {
            id: ids[0].clone(),
            lease_token: token(&ids[0]),
            kind: FinishKind::Retry {
                at: at(1000),
                error: poison.clone(),
            },
        },
        Finish {
            id: ids[1].clone(),
            lease_token: token(&ids[1]),
            kind: FinishKind::Dead {
                error: poison.clone(),
            },
        },
        Finish {
            id: ids[2].clone(),
            lease_token: token(&ids[2]),
            kind: FinishKind::Succeeded { result: None },
        },
    ];
    assert_eq!(
        store.finish(&finishes, at(1)).await.unwrap(),
        [true, true, true]
    );
    for (id, state) in [(&ids[0], TaskState::Pending), (&ids[1], TaskState::Dead)] {
        let record = store.get(id).await.unwrap().unwrap();
        assert_eq!(record.state, state);
        let error = record.last_error.unwrap();
        assert_eq!(error, asyncd::executor::sanitize_reason(&poison));
        assert!(
            error.starts_with("boom\u{FFFD}\u{FFFD}[31m\u{FFFD}é"),
            "{error:.20}"
        );
        assert!(error.chars().count() <= asyncd::executor::MAX_REASON_CHARS + 1);
    }
    assert_eq!(state(store, &ids[2]).await, TaskState::Succeeded);
}
