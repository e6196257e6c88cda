//! Guarantee 1 on the embedded store: every accepted task runs at least once through
//! `kill -9` of `asyncd dev` at arbitrary moments.

use std::time::Duration;

use serde_json::json;

use crate::support::*;

const TASKS: usize = 600;

#[tokio::test]
async fn kill_9_mid_run_loses_nothing() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let jobs = [(
        "job.yaml",
        job_yaml("crash-job", "work", &executor.url(), ""),
    )];
    // A short claim hold so the restarted process takes back the dead one's claims quickly.
    let mut asyncd = Asyncd::start(&jobs, &["--claim-hold", "2s"]).await;

    let mut ids = Vec::with_capacity(TASKS);
    for chunk in (0..TASKS).collect::<Vec<_>>().chunks(200) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|i| json!({"type": "work", "payload": {"i": i}, "delay": format!("{}ms", (i * 7919) % 6000)}))
            .collect();
        let (status, answer) = asyncd
            .post("/v1/tasks:batch", json!({ "tasks": tasks }))
            .await;
        assert_eq!(status, 200);
        for result in answer["results"].as_array().unwrap() {
            assert_eq!(result["status"], 201, "{result}");
            ids.push(result["id"].as_str().unwrap().to_string());
        }
    }

    // Kill it twice while work is in every state: executed, in the heap, not yet claimed.
    for threshold in [TASKS / 4, TASKS / 2] {
        wait_for(
            &format!("{threshold} tasks executed"),
            DEADLINE,
            async || (executor.calls_by_task().len() >= threshold).then_some(()),
        )
        .await;
        asyncd.kill9();
        asyncd.spawn().await;
    }

    wait_for("every task executed", Duration::from_secs(60), async || {
        (executor.calls_by_task().len() >= TASKS).then_some(())
    })
    .await;
    let counts = executor.calls_by_task();
    for id in &ids {
        assert!(counts.contains_key(id), "task {id} never ran");
    }
    let duplicates: usize = counts.values().map(|calls| calls.len() - 1).sum();
    println!("kill -9 twice: {TASKS} tasks, {duplicates} duplicate executions");
    for id in &ids {
        asyncd.wait_state(id, "succeeded").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_killed_dispatchers_unwritten_outcome_is_written_when_it_starts_again() {
    unwritten_outcome_written_on_restart(Service::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_killed_dispatchers_unwritten_outcome_is_written_when_it_starts_again() {
    unwritten_outcome_written_on_restart(Service::MariaDb).await;
}

/// The outcome journal (`--outcome-journal`): the executor answers 200 as the
/// dispatcher's link to its store is cut, so the outcome cannot be written; the
/// dispatcher is SIGKILLed and started again on the same journal once the link is back.
/// It writes the outcome first thing: the task succeeds with its one executor call.
/// Without the journal the task would stay running until its lease lapsed (the 60 s
/// timeout plus the grace), far past this test's deadline, and then run a second time.
async fn unwritten_outcome_written_on_restart(service: Service) {
    let Some(database) = fresh_database(service).await else {
        return;
    };
    migrate(&database);
    let proxy = std::sync::Arc::new(DbProxy::start(&database, true).await);
    let link = proxy.clone();
    let executor = Executor::start(move |_| {
        link.cut();
        Answer::ok()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs");
    std::fs::create_dir(&jobs).unwrap();
    std::fs::write(
        jobs.join("job.yaml"),
        job_yaml("test-job", "work", &executor.url(), "").replace("timeout: 5s", "timeout: 60s"),
    )
    .unwrap();
    let journal = dir.path().join("journal");
    let journal_arg = journal.display().to_string();
    let api = Role::serve("api", &database, &jobs, dir.path(), &[]);
    let mut dispatcher = Role::serve(
        "dispatcher",
        &proxy.url(&database),
        &jobs,
        dir.path(),
        &["--outcome-journal", &journal_arg],
    );
    let http = reqwest::Client::new();
    wait_healthy(&http, &api.listen).await;
    let answer: serde_json::Value = http
        .post(format!("http://{}/v1/tasks", api.listen))
        .json(&json!({"type": "work", "payload": {"n": 1}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = answer["id"].as_str().expect("an id").to_string();

    // The outcome is journaled once the dispatcher has the executor's answer.
    let segments = ["outcomes-0.jsonl", "outcomes-1.jsonl"].map(|name| journal.join(name));
    wait_for("the outcome journaled", DEADLINE, async || {
        segments
            .iter()
            .any(|path| std::fs::read_to_string(path).is_ok_and(|text| text.contains(&id)))
            .then_some(())
    })
    .await;
    dispatcher.kill9();
    proxy.restore();
    dispatcher.spawn();

    let task_url = format!("http://{}/v1/tasks/{id}", api.listen);
    wait_for("the task succeeded", Duration::from_secs(30), async || {
        let task: serde_json::Value = http.get(&task_url).send().await.ok()?.json().await.ok()?;
        (task["state"] == "succeeded").then_some(())
    })
    .await;
    assert_eq!(executor.calls_for(&id).len(), 1, "run once");
    assert!(
        dispatcher
            .log()
            .contains("writing the outcomes an earlier process left unwritten"),
        "{}",
        dispatcher.log()
    );
}
