//! Dead row versions: a store that keeps the versions its updates replaced until a
//! vacuum (PostgreSQL) counts them and reclaims them; the others reclaim as they go.

use asyncd::reclaimer::{DEAD_SHARE, Step, reclaim_if_due};
use asyncd_store::{Finish, FinishKind, NewTask, Store};
use std::time::{Duration, Instant};

use crate::{T0, at, claim_all, start_params};

scenarios!(dead_row_versions_are_counted_and_reclaimed,);

/// Issue 30: each task run to its end leaves its claim's, start's and finish's replaced
/// versions; PostgreSQL's statistics count them, the reclaimer waits until there are
/// enough, vacuums, and none are left. SQLite and MariaDB have nothing to count.
async fn dead_row_versions_are_counted_and_reclaimed(store: &dyn Store) {
    const TASKS: u64 = 300;
    let tasks: Vec<NewTask> = (0..TASKS).map(|_| NewTask::test("a", at(0))).collect();
    store.insert(&tasks, T0).await.unwrap();
    let claims: Vec<(String, i64)> = claim_all(store, at(0), at(0))
        .await
        .into_iter()
        .map(|claim| (claim.id, claim.lease_token))
        .collect();
    assert_eq!(claims.len() as u64, TASKS);
    let started = store.start(start_params(&claims, at(0), 0)).await.unwrap();
    let finishes: Vec<Finish> = started
        .into_iter()
        .map(|attempt| Finish {
            id: attempt.id,
            lease_token: attempt.lease_token,
            kind: FinishKind::Succeeded { result: None },
        })
        .collect();
    assert!(
        store
            .finish(&finishes, at(1))
            .await
            .unwrap()
            .iter()
            .all(|done| *done)
    );

    let look = |min_dead| reclaim_if_due(store, min_dead, DEAD_SHARE);
    let Some(_) = store.dead_rows().await.unwrap() else {
        assert_eq!(
            look(1).await.unwrap(),
            Step::SelfReclaiming,
            "nothing to count, nothing to do"
        );
        store.reclaim_dead_rows().await.unwrap();
        return;
    };
    // Each backend hands its counts to the statistics within a second of its
    // transaction, or 10 s after it last did once it goes idle.
    let deadline = Instant::now() + Duration::from_secs(30);
    let counted = loop {
        let rows = store.dead_rows().await.unwrap().unwrap();
        if rows.dead >= 3 * TASKS {
            break rows;
        }
        assert!(
            Instant::now() < deadline,
            "the statistics never counted the {} replaced versions: {rows:?}",
            3 * TASKS
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(counted.may_reclaim, "the suite's role owns its database");
    assert!(counted.live >= TASKS, "{counted:?}");

    assert_eq!(
        look(counted.dead + 1).await.unwrap(),
        Step::Waited(counted),
        "below the reclaimer's floor"
    );
    assert_eq!(look(counted.dead).await.unwrap(), Step::Reclaimed(counted));
    let after = store.dead_rows().await.unwrap().unwrap();
    assert_eq!(after.dead, 0, "the vacuum left dead versions: {after:?}");
    assert!(after.live >= TASKS, "{after:?}");
}
