//! Issue 15, workflows in one call, through the API of a real `asyncd dev`: a batch
//! whose items name each other runs as a DAG, parents first; a cycle, an unknown ref or
//! one bad item refuses the whole batch (nothing stored), naming the item's field.

mod support;

use serde_json::json;
use support::*;

#[tokio::test]
async fn a_batch_with_refs_runs_as_a_dag_and_a_bad_one_stores_nothing() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let jobs = [("job.yaml", job_yaml("orders", "order", &executor.url(), ""))];
    let asyncd = Asyncd::start(&jobs, &[]).await;

    let (status, answer) = asyncd
        .post(
            "/v1/tasks:batch",
            json!({"tasks": [
                {"type": "order", "payload": "ship", "ref": "ship", "depends_on_refs": ["charge", "pack"]},
                {"type": "order", "payload": "charge", "ref": "charge"},
                {"type": "order", "payload": "pack", "ref": "pack", "depends_on_refs": ["charge"]},
            ]}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let ids: Vec<String> = answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert_eq!(r["status"], 201, "{r}");
            r["id"].as_str().unwrap().to_string()
        })
        .collect();
    let (ship, charge, pack) = (&ids[0], &ids[1], &ids[2]);
    let task = asyncd.task(ship).await;
    let mut deps: Vec<&str> = task["depends_on"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    deps.sort_unstable();
    let mut want = vec![charge.as_str(), pack.as_str()];
    want.sort_unstable();
    assert_eq!(deps, want, "refs become the ids of the batch's tasks");

    asyncd.wait_state(ship, "succeeded").await;
    let at = |id: &str| executor.calls_for(id)[0].at;
    assert!(
        at(charge) <= at(pack) && at(pack) <= at(ship),
        "parents first"
    );

    // Refused as a whole, naming the item; nothing of it is stored.
    for (tasks, field) in [
        (
            json!([
                {"type": "order", "payload": "cycle-a", "ref": "a", "depends_on_refs": ["b"]},
                {"type": "order", "payload": "cycle-b", "ref": "b", "depends_on_refs": ["a"]},
            ]),
            "tasks[0].depends_on_refs",
        ),
        (
            json!([
                {"type": "order", "payload": "lonely", "ref": "a", "depends_on_refs": ["nope"]},
            ]),
            "tasks[0].depends_on_refs",
        ),
        (
            json!([
                {"type": "order", "payload": "fine", "ref": "a"},
                {"type": "no-such-type", "depends_on_refs": ["a"]},
            ]),
            "tasks[1].type",
        ),
    ] {
        let (status, answer) = asyncd
            .post("/v1/tasks:batch", json!({ "tasks": tasks }))
            .await;
        assert_eq!(status, 400, "{tasks} answered {answer}");
        assert_eq!(answer["error"]["field"], field, "{answer}");
    }
    let (status, page) = asyncd.get("/v1/tasks?job=orders&limit=100").await;
    assert_eq!(status, 200);
    assert_eq!(
        page["items"].as_array().unwrap().len(),
        3,
        "only the first workflow's tasks: {page}"
    );

    let (status, answer) = asyncd
        .post("/v1/tasks", json!({"type": "order", "ref": "a"}))
        .await;
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (400, Some("ref"))
    );
}
