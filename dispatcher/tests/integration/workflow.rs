//! Issue 15, workflows in one call, through the API of real processes — `asyncd dev` on
//! SQLite, and for the 50-task DAG also `asyncd api` with `asyncd dispatcher` on
//! PostgreSQL: a batch whose items name each other runs as a DAG, parents first; a
//! cycle, an unknown ref or one bad item refuses the whole batch (nothing stored), naming
//! the item's field. And on the `dev` role in-process: a task submitted on its own with
//! `depends_on` waits for its dependency, and dies with a cancelled one.

use std::time::Duration;

use serde_json::json;

use crate::support::*;

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

/// Issue 15: a DAG of 50 tasks — five layers of ten, each task after two of the layer
/// before, so diamonds everywhere — submitted children first in one batch, runs every
/// task after each of its parents: in the executor's call log, which records a call
/// before answering it, each task's call comes after the calls of its parents.
async fn a_dag_of_50_with_diamonds_runs_in_dependency_order(backend: Backend) {
    const LAYERS: usize = 5;
    const WIDTH: usize = 10;
    let executor = Executor::start(|_| Answer::ok()).await;
    let jobs = [("job.yaml", job_yaml("dag", "step", &executor.url(), ""))];
    let Some(asyncd) = Deployment::start(backend, &jobs).await else {
        return;
    };
    let name = |layer: usize, i: usize| format!("l{layer}-{i}");
    let parents = |layer: usize, i: usize| -> Vec<String> {
        if layer == 0 {
            Vec::new()
        } else {
            vec![name(layer - 1, i), name(layer - 1, (i + 1) % WIDTH)]
        }
    };
    // The deepest layer first: the server orders the batch, not the client.
    let mut items = Vec::new();
    for layer in (0..LAYERS).rev() {
        for i in 0..WIDTH {
            items.push(json!({
                "type": "step",
                "payload": name(layer, i),
                "ref": name(layer, i),
                "depends_on_refs": parents(layer, i),
            }));
        }
    }
    let (status, answer) = asyncd
        .post("/v1/tasks:batch", json!({ "tasks": items }))
        .await;
    assert_eq!(status, 200, "{answer}");
    let mut id_of = std::collections::HashMap::new();
    for (item, result) in items.iter().zip(answer["results"].as_array().unwrap()) {
        assert_eq!(result["status"], 201, "{result}");
        id_of.insert(
            item["ref"].as_str().unwrap().to_string(),
            result["id"].as_str().unwrap().to_string(),
        );
    }
    for id in id_of.values() {
        asyncd.wait_state(id, "succeeded").await;
    }
    let log = executor.calls();
    assert_eq!(log.len(), LAYERS * WIDTH, "each task ran once");
    // Where a task's call is in the log.
    let started = |r: &str| {
        log.iter()
            .position(|c| c.id == id_of[r])
            .unwrap_or_else(|| panic!("{r} never ran"))
    };
    for layer in 1..LAYERS {
        for i in 0..WIDTH {
            let child = name(layer, i);
            for parent in parents(layer, i) {
                assert!(
                    started(&parent) < started(&child),
                    "{child} began before its parent {parent} was done"
                );
            }
        }
    }
}

#[tokio::test]
async fn sqlite_a_dag_of_50_with_diamonds_runs_in_dependency_order() {
    a_dag_of_50_with_diamonds_runs_in_dependency_order(Backend::Sqlite).await;
}

#[tokio::test]
async fn postgres_a_dag_of_50_with_diamonds_runs_in_dependency_order() {
    a_dag_of_50_with_diamonds_runs_in_dependency_order(Backend::Server(Service::Postgres)).await;
}

#[tokio::test]
async fn dependent_task_waits_for_its_dependency() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let a = asyncd
        .submit(json!({"type": "work", "payload": "a", "delay": "1s"}))
        .await;
    let b = asyncd
        .submit(json!({"type": "work", "payload": "b", "depends_on": [a]}))
        .await;
    assert_eq!(asyncd.task(&b).await["state"], "blocked");
    asyncd.clock.advance(Duration::from_secs(1));
    asyncd.wait_state(&b, "succeeded").await;
    let calls = executor.calls();
    assert_eq!(
        calls
            .iter()
            .map(|c| c.body["payload"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["a", "b"]
    );

    // A cancelled dependency fails its dependents.
    let c = asyncd
        .submit(json!({"type": "work", "payload": "c", "delay": "1h"}))
        .await;
    let d = asyncd
        .submit(json!({"type": "work", "payload": "d", "depends_on": [c]}))
        .await;
    let (status, _) = asyncd.delete(&format!("/v1/tasks/{c}")).await;
    assert_eq!(status, 200);
    let dead = asyncd.task(&d).await;
    assert_eq!(dead["state"], "dead");
    assert!(dead["last_error"].as_str().unwrap().contains(&c));
}
