//! Issue 31: a job's `executor.url` could point anywhere — a cloud's metadata address,
//! the Kubernetes API server, the dispatcher's own loopback — and the answer landed in
//! `last_error`. Under the cluster policy such an address is refused: the call is never
//! made, and the task goes to dead letters saying why.

use serde_json::json;

use crate::support::*;
use asyncd::executor::AddressPolicy;

/// One job's URL names the executor by a host name that resolves to loopback (refused
/// by the client's resolver, when it connects), the other by its IP literal (which no
/// resolver sees, so it is checked before the call). Neither is called.
#[tokio::test]
async fn an_executor_at_a_refused_address_is_never_called_and_the_task_says_why() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let literal = executor.url();
    let by_name = literal.replace("127.0.0.1", "localhost");
    assert_ne!(by_name, literal);
    let asyncd = InProcess::start_with(
        &[
            ("name.yaml", job_yaml("name-job", "by-name", &by_name, "")),
            ("ip.yaml", job_yaml("ip-job", "by-ip", &literal, "")),
        ],
        |settings| settings.executor_addresses = AddressPolicy::cluster(None),
    )
    .await;
    let named = asyncd.submit(task("by-name", json!({}))).await;
    let ip = asyncd.submit(task("by-ip", json!({}))).await;

    let dead = asyncd.wait_state(&ip, "dead").await;
    assert_eq!(
        (&dead["attempt"], &dead["last_error"]),
        (
            &json!(1),
            &json!("executor address 127.0.0.1 refused by policy")
        ),
        "{dead}"
    );
    let dead = asyncd.wait_state(&named, "dead").await;
    // `localhost` may resolve to ::1 first.
    let last_error = dead["last_error"].as_str().unwrap();
    assert!(
        [
            "executor address 127.0.0.1 refused by policy",
            "executor address ::1 refused by policy"
        ]
        .contains(&last_error),
        "{dead}"
    );
    assert_eq!(dead["attempt"], 1, "not retried: {dead}");
    assert!(executor.calls().is_empty(), "the executor was called");
}

/// Under the cluster policy with 127.0.0.1/32 allowed back, the same executor runs: the
/// refusal above is the policy's, not the URL's.
#[tokio::test]
async fn an_allowed_range_lets_a_loopback_executor_run() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start_with(
        &[("ip.yaml", job_yaml("ip-job", "by-ip", &executor.url(), ""))],
        |settings| {
            settings.executor_addresses =
                AddressPolicy::cluster(None).with(&[], &["127.0.0.1/32".parse().unwrap()])
        },
    )
    .await;
    let id = asyncd.submit(task("by-ip", json!({}))).await;
    asyncd.wait_state(&id, "succeeded").await;
    assert_eq!(executor.calls_for(&id).len(), 1);
}
