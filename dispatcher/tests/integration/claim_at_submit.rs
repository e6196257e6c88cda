//! Claim at submit (issue 30; `dispatch/at_submit.rs`): with a dispatcher in the API's
//! process, a task due within the lookahead goes in already claimed and straight into
//! the heap, without a claim statement — once the claimer's last pass left none of its
//! job's due tasks in the store. The claimer here passes only when woken, so every
//! claim statement is one the submits caused.

use std::time::Duration;

use serde_json::json;

use crate::support::*;

/// Claim statements run so far: the claim poll histogram's count.
async fn claim_statements(asyncd: &InProcess) -> u64 {
    let metrics = asyncd.metrics().await;
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("asyncd_mysql_poll_duration_seconds_count "))
        .map_or(0, |count| count.trim().parse().unwrap())
}

#[tokio::test]
async fn a_due_task_goes_in_claimed_once_the_claimer_left_none_in_the_store() {
    let executor = Executor::start(|_| Answer::ok()).await;
    // Room for more than one: a job found full is woken again by its next task to end,
    // which would close claim at submit until the claimer has passed once more.
    let jobs = one_job(&executor, "  concurrency: 16\n");
    let mut asyncd = InProcess::start_with(&jobs, |settings| {
        settings.dispatcher.poll_interval = Duration::from_secs(3_600);
    })
    .await;

    // Before any pass the claimer has measured nothing: the first task goes in pending
    // and wakes it, and its claim finds the store empty after it.
    let first = asyncd.submit(json!({"type": "work"})).await;
    asyncd.finished(&first).await;
    let claims = claim_statements(&asyncd).await;
    assert!(
        claims >= 1,
        "the first task was claimed by a claim statement"
    );

    // The second goes in claimed: it runs, and no claim statement ran for it.
    let second = asyncd.submit(json!({"type": "work"})).await;
    asyncd.finished(&second).await;
    assert_eq!(
        claim_statements(&asyncd).await,
        claims,
        "the second task needed a claim statement: it was not claimed at submit"
    );
    assert_eq!(asyncd.task(&second).await["state"], "succeeded");

    // A task due beyond the lookahead goes in pending, as before.
    let later = asyncd.submit(json!({"type": "work", "delay": "1h"})).await;
    assert_eq!(asyncd.task(&later).await["state"], "pending");
}
