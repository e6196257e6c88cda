//! A database that runs out of disk: an api and a dispatcher process on a PostgreSQL or
//! MariaDB server whose data is on a small file system of its own
//! (`e2e/services/small-disk.sh`). The test fills that file system with a file while
//! tasks are waiting and being submitted. Submits must answer a clear 503
//! `store_unavailable` (never another 5xx, never a hang past the client's patience);
//! once the file is deleted, submits are accepted again without a restart, and every task
//! accepted before, during or after ran.

use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::*;

mod mariadb {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_disk_refuses_submits_with_503_and_loses_nothing() {
        super::full(super::Service::SmallDiskMariaDb).await;
    }
}

mod postgres {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_disk_refuses_submits_with_503_and_loses_nothing() {
        super::full(super::Service::SmallDiskPostgres).await;
    }
}

/// Long enough for a full server to answer, or for the bound on a store call
/// (`--store-timeout`, 10 s) to end the wait with a 503.
const PATIENCE: Duration = Duration::from_secs(30);

/// A batch of `n` tasks whose payloads take room: each fills part of a page, so the
/// tables outgrow the space left in their files quickly.
fn batch(first: usize, n: usize, delay: &str) -> Value {
    let tasks: Vec<Value> = (first..first + n)
        .map(|i| {
            json!({
                "type": "work",
                "payload": {"n": i, "pad": "x".repeat(2_000)},
                "delay": delay,
            })
        })
        .collect();
    json!({ "tasks": tasks })
}

/// Submits a batch; returns the status and, for a 2xx, the ids of the tasks accepted.
async fn submit(http: &reqwest::Client, api: &str, body: &Value) -> (u16, Value, Vec<String>) {
    let answer = http
        .post(format!("http://{api}/v1/tasks:batch"))
        .json(body)
        .send()
        .await
        .expect("the api answers, full disk or not");
    let status = answer.status().as_u16();
    let body: Value = answer.json().await.unwrap_or(Value::Null);
    let ids = body["results"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["status"] == 201)
        .filter_map(|r| r["id"].as_str().map(str::to_string))
        .collect();
    (status, body, ids)
}

/// Fills the file system holding `path` with it, in 1 MiB writes, until it is full.
fn fill(path: &PathBuf) {
    let mut file = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 1 << 20];
    loop {
        match file.write_all(&chunk) {
            Ok(()) => {}
            Err(err) if err.raw_os_error() == Some(28) => break, // ENOSPC
            Err(err) => panic!("filling {}: {err}", path.display()),
        }
    }
    // Whatever a partial write left: the last blocks go too.
    let _ = file.sync_all();
}

async fn full(service: Service) {
    let Some(database) = fresh_database(service).await else {
        return;
    };
    let mount = service
        .mount()
        .unwrap_or_else(|| panic!("{} names no mount", service.var()));
    let filler = PathBuf::from(&mount).join(format!("filler-{}", std::process::id()));
    migrate(&database);
    let executor = Executor::start(|_| Answer::ok()).await;
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs");
    std::fs::create_dir(&jobs).unwrap();
    std::fs::write(
        jobs.join("job.yaml"),
        job_yaml("test-job", "work", &executor.url(), ""),
    )
    .unwrap();
    let role = |name: &str| Role::serve(name, &database, &jobs, dir.path(), &[]);
    let roles = [role("api"), role("dispatcher")];
    let http = reqwest::Client::builder()
        .timeout(PATIENCE)
        .build()
        .unwrap();
    let api = roles[0].listen.clone();
    wait_healthy(&http, &api).await;

    // Accepted before the disk fills: some run at once, the rest fall due while it is full.
    let mut accepted: Vec<String> = Vec::new();
    for (first, delay) in [(0, "0s"), (100, "5s"), (200, "10s")] {
        let (status, body, ids) = submit(&http, &api, &batch(first, 100, delay)).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(ids.len(), 100, "{body}");
        accepted.extend(ids);
    }

    let to_fill = filler.clone();
    tokio::task::spawn_blocking(move || fill(&to_fill))
        .await
        .unwrap();

    // Submits until the database refuses one; each answer is a 2xx or a 503.
    let mut refused = None;
    let mut next = 1_000;
    let began = std::time::Instant::now();
    while refused.is_none() && began.elapsed() < DEADLINE * 3 {
        let (status, body, ids) = submit(&http, &api, &batch(next, 50, "1s")).await;
        next += 50;
        match status {
            200 => accepted.extend(ids),
            503 => refused = Some(body),
            other => panic!("a submit to a full database answered {other}: {body}"),
        }
    }
    let refused = refused.expect("no submit was refused while the disk was full");
    assert_eq!(
        refused["error"]["code"], "store_unavailable",
        "the refusal says why: {refused}"
    );

    std::fs::remove_file(&filler).unwrap();

    // Accepted again, without a restart.
    let again = wait_for(
        "a submit accepted once space is free",
        DEADLINE * 3,
        async || {
            let (status, _, ids) = submit(&http, &api, &batch(next, 10, "0s")).await;
            (status == 200 && ids.len() == 10).then_some(ids)
        },
    )
    .await;
    accepted.extend(again);

    // Everything accepted ran: before the disk filled, while it was full, after.
    let accepted: HashSet<String> = accepted.into_iter().collect();
    wait_for("every accepted task to run", DEADLINE * 3, async || {
        let ran: HashSet<String> = executor.calls().into_iter().map(|c| c.id).collect();
        accepted.is_subset(&ran).then_some(())
    })
    .await;
    drop(roles);
}
