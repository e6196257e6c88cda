//! Attempts and their leases: fencing by token, each attempt's own token, and leases that
//! lapse or whose owner died coming back.

use asyncd_store::{Finish, FinishKind, NewTask, Store, TaskState, TypeFilter};
use serde_json::value::RawValue;

use crate::{T0, at, claim_all, claim_params, insert, start_params, state};

scenarios!(
    attempt_lifecycle_with_fencing,
    lease_secrets_make_each_attempts_token_its_own,
    lapsed_leases_come_back,
    a_lease_extension_that_moves_nothing_still_applies,
    a_dead_owners_claims_come_back_at_once,
);

async fn attempt_lifecycle_with_fencing(store: &dyn Store) {
    let id = insert(store, NewTask::test("a", T0)).await;
    let claimed = claim_all(store, T0, T0).await.remove(0);
    let started = store
        .start(start_params(&[(id.clone(), claimed.lease_token)], T0, 500))
        .await
        .unwrap();
    assert_eq!(started.len(), 1);
    let attempt = &started[0];
    assert_eq!(attempt.attempt, 1);
    assert!(attempt.lease_token > claimed.lease_token);
    let record = store.get(&id).await.unwrap().unwrap();
    assert_eq!(
        record.lease_until,
        Some(at(1000 + 500)),
        "timeout plus grace"
    );
    // The claim's token is spent: starting it again changes nothing.
    assert!(
        store
            .start(start_params(&[(id.clone(), claimed.lease_token)], T0, 500))
            .await
            .unwrap()
            .is_empty()
    );

    let retry = Finish {
        id: id.clone(),
        lease_token: attempt.lease_token,
        kind: FinishKind::Retry {
            at: at(50),
            error: "boom".into(),
        },
    };
    assert_eq!(
        store
            .finish(std::slice::from_ref(&retry), T0)
            .await
            .unwrap(),
        [true]
    );
    assert_eq!(
        store.finish(&[retry], T0).await.unwrap(),
        [false],
        "a finished attempt's token is stale"
    );
    let record = store.get(&id).await.unwrap().unwrap();
    assert_eq!(
        (
            record.state,
            record.trigger_at,
            record.last_error.as_deref()
        ),
        (TaskState::Pending, at(50), Some("boom"))
    );

    let claimed = claim_all(store, at(50), at(50)).await.remove(0);
    let second = store
        .start(start_params(
            &[(id.clone(), claimed.lease_token)],
            at(50),
            0,
        ))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(second.attempt, 2);
    let stale = Finish {
        id: id.clone(),
        lease_token: attempt.lease_token,
        kind: FinishKind::Succeeded { result: None },
    };
    let fresh = Finish {
        id: id.clone(),
        lease_token: second.lease_token,
        kind: FinishKind::Succeeded {
            result: Some(RawValue::from_string("\"ok\"".into()).unwrap()),
        },
    };
    assert_eq!(
        store.finish(&[stale, fresh], at(60)).await.unwrap(),
        [false, true]
    );
    let record = store.get(&id).await.unwrap().unwrap();
    assert_eq!(
        (record.state, record.result.unwrap().get()),
        (TaskState::Succeeded, "\"ok\"")
    );
}

/// Each task gets its own random `lease_secret` at insert, kept as it is through claims
/// and attempts; the token an executor receives derives from it and the attempt's
/// counter, so another task's token, an earlier attempt's, or a guess matches nothing,
/// and a finish naming an earlier attempt's counter still changes nothing.
async fn lease_secrets_make_each_attempts_token_its_own(store: &dyn Store) {
    use asyncd_store::lease;
    let a = insert(store, NewTask::test("a", T0)).await;
    let b = insert(store, NewTask::test("a", T0)).await;
    let claimed = claim_all(store, T0, T0).await;
    assert_eq!(claimed.len(), 2);
    let secret = |id: &str| {
        claimed
            .iter()
            .find(|c| c.id == id)
            .unwrap()
            .lease_secret
            .clone()
    };
    for id in [&a, &b] {
        let s = secret(id);
        assert_eq!(s.len(), 64, "256 random bits, hex: {s:?}");
        assert!(s.bytes().all(|c| c.is_ascii_hexdigit()));
    }
    assert_ne!(secret(&a), secret(&b));
    let claims: Vec<(String, i64)> = claimed
        .iter()
        .map(|c| (c.id.clone(), c.lease_token))
        .collect();
    let started = store.start(start_params(&claims, T0, 0)).await.unwrap();
    let counter = |id: &str| started.iter().find(|s| s.id == id).unwrap().lease_token;
    let record = store.get(&a).await.unwrap().unwrap();
    assert_eq!(
        record.lease_secret,
        secret(&a),
        "the secret is the insert's"
    );
    assert_eq!(record.lease_token, counter(&a));
    let first = lease::token(&record.lease_secret, &a, counter(&a));
    let other = lease::token(&secret(&b), &b, counter(&b));
    assert!(lease::matches(
        &record.lease_secret,
        &a,
        record.lease_token,
        &first
    ));
    assert!(!lease::matches(
        &record.lease_secret,
        &a,
        record.lease_token,
        &other
    ));
    assert!(!lease::matches(
        &record.lease_secret,
        &a,
        record.lease_token,
        &record.lease_token.to_string()
    ));

    let retry = Finish {
        id: a.clone(),
        lease_token: counter(&a),
        kind: FinishKind::Retry {
            at: at(50),
            error: "boom".into(),
        },
    };
    assert_eq!(store.finish(&[retry], T0).await.unwrap(), [true]);
    let again = claim_all(store, at(50), at(50)).await.remove(0);
    assert_eq!(again.lease_secret, secret(&a));
    let second = store
        .start(start_params(&[(a.clone(), again.lease_token)], at(50), 0))
        .await
        .unwrap()
        .remove(0);
    let record = store.get(&a).await.unwrap().unwrap();
    let current = lease::token(&record.lease_secret, &a, second.lease_token);
    assert_ne!(current, first);
    assert!(lease::matches(
        &record.lease_secret,
        &a,
        record.lease_token,
        &current
    ));
    assert!(
        !lease::matches(&record.lease_secret, &a, record.lease_token, &first),
        "the earlier attempt's token is refused"
    );
    let late = Finish {
        id: a.clone(),
        lease_token: counter(&a),
        kind: FinishKind::Succeeded { result: None },
    };
    assert_eq!(store.finish(&[late], at(60)).await.unwrap(), [false]);
    assert_eq!(state(store, &a).await, TaskState::Running);
}

async fn lapsed_leases_come_back(store: &dyn Store) {
    let held = insert(store, NewTask::test("a", T0)).await;
    let running = insert(store, NewTask::test("a", T0)).await;
    let claims = claim_all(store, T0, T0).await;
    let run_claim = claims.iter().find(|c| c.id == running).unwrap();
    let started = store
        .start(start_params(
            &[(running.clone(), run_claim.lease_token)],
            T0,
            0,
        ))
        .await
        .unwrap()
        .remove(0);
    // Hold is 5 s past the ETA; the attempt's lease is its 1 s timeout.
    assert!(store.lapsed_leases(at(999), 100).await.unwrap().is_empty());
    let lapsed = store.lapsed_leases(at(5_001), 100).await.unwrap();
    let mut states: Vec<_> = lapsed.iter().map(|l| (l.id.clone(), l.state)).collect();
    states.sort_by_key(|(id, _)| id.clone());
    let mut expected = vec![
        (held.clone(), TaskState::Claimed),
        (running.clone(), TaskState::Running),
    ];
    expected.sort_by_key(|(id, _)| id.clone());
    assert_eq!(states, expected);
    let held_token = lapsed.iter().find(|l| l.id == held).unwrap().lease_token;
    let finishes = [
        Finish {
            id: held.clone(),
            lease_token: held_token,
            kind: FinishKind::Release,
        },
        Finish {
            id: running.clone(),
            lease_token: started.lease_token,
            kind: FinishKind::Retry {
                at: at(6_000),
                error: "lapsed".into(),
            },
        },
    ];
    assert_eq!(
        store.finish(&finishes, at(5_001)).await.unwrap(),
        [true, true]
    );
    let again: Vec<String> = claim_all(store, at(6_000), at(5_001))
        .await
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(
        again,
        [held, running],
        "both claimable again, in trigger order"
    );
}

async fn a_lease_extension_that_moves_nothing_still_applies(store: &dyn Store) {
    let id = insert(store, NewTask::test("a", T0)).await;
    let claimed = claim_all(store, T0, T0).await.remove(0);
    let started = store
        .start(start_params(&[(id.clone(), claimed.lease_token)], T0, 0))
        .await
        .unwrap()
        .remove(0);
    // The lease already runs to at(1000) and `now` is unchanged: the row stays as it
    // is, but the token matched, so the heartbeat is accepted.
    let extend = |until| Finish {
        id: id.clone(),
        lease_token: started.lease_token,
        kind: FinishKind::Extend { until },
    };
    assert_eq!(store.finish(&[extend(at(500))], T0).await.unwrap(), [true]);
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().lease_until,
        Some(at(1000)),
        "a lease is never shortened"
    );
    assert_eq!(store.finish(&[extend(at(2000))], T0).await.unwrap(), [true]);
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().lease_until,
        Some(at(2000))
    );
}

async fn a_dead_owners_claims_come_back_at_once(store: &dyn Store) {
    let held = insert(store, NewTask::test("a", T0)).await;
    let running = insert(store, NewTask::test("a", T0)).await;
    let other = insert(store, NewTask::test("b", T0)).await;
    let a = TypeFilter::Only(vec!["a".into()]);
    let b = TypeFilter::Only(vec!["b".into()]);
    let dead = store
        .claim(claim_params(&a, T0, T0, 30_000, "dead", 10))
        .await
        .unwrap();
    assert_eq!(dead.len(), 2);
    store
        .claim(claim_params(&b, T0, T0, 30_000, "alive", 10))
        .await
        .unwrap();
    let token = |id: &str| dead.iter().find(|c| c.id == id).unwrap().lease_token;
    store
        .start(start_params(&[(running.clone(), token(&running))], T0, 0))
        .await
        .unwrap();

    assert_eq!(store.release_claims("dead", at(100)).await.unwrap(), 1);
    let state = async |id: &str| store.get(id).await.unwrap().unwrap().state;
    assert_eq!(state(&held).await, TaskState::Pending);
    assert_eq!(
        state(&running).await,
        TaskState::Running,
        "attempts keep their lease"
    );
    assert_eq!(
        state(&other).await,
        TaskState::Claimed,
        "another owner's claim"
    );
    assert!(
        store
            .start(start_params(&[(held.clone(), token(&held))], at(200), 0))
            .await
            .unwrap()
            .is_empty(),
        "the dead owner's late start changes nothing"
    );
    let again = store
        .claim(claim_params(&a, at(300), at(300), 30_000, "alive", 10))
        .await
        .unwrap();
    assert_eq!(
        again.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        [held.as_str()]
    );
    assert_eq!(store.release_claims("dead", at(400)).await.unwrap(), 0);
}
