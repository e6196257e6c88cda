//! Issue 3's proof: the roles as separate processes on one shared MariaDB or PostgreSQL
//! database — one API, three dispatchers, two schedulers — with one dispatcher killed by
//! SIGKILL mid-run. Every task runs; duplicates come only from the killed process's
//! lapsed leases (counted and printed); every cron firing runs once.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde_json::json;

use crate::support::*;

const TASKS: usize = 3000;
const TYPES: [&str; 4] = ["alpha", "beta", "gamma", "delta"];

async fn run_cluster(server: Service) {
    let Some(store) = fresh_database(server).await else {
        return;
    };
    let _turn = cluster_turn().await;
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs");
    std::fs::create_dir(&jobs).unwrap();
    let executor = Executor::start(|_| Answer::ok()).await;
    for t in TYPES {
        std::fs::write(
            jobs.join(format!("{t}.yaml")),
            job_yaml(t, t, &executor.url(), ""),
        )
        .unwrap();
    }
    let cron = "  cron:\n    - name: tick\n      schedule: \"CRON_TZ=America/New_York * * * * * *\"\n      payload: {cron: true}\n";
    std::fs::write(
        jobs.join("cron.yaml"),
        job_yaml("ticker", "ticker", &executor.url(), cron),
    )
    .unwrap();

    migrate(&store);

    let http = reqwest::Client::new();
    let common = |role: &str, addr: &str| -> Vec<String> {
        vec![
            role.into(),
            "--store".into(),
            store.clone(),
            "--config".into(),
            jobs.display().to_string(),
            "--listen".into(),
            addr.into(),
            "--claim-hold".into(),
            "3s".into(),
        ]
    };
    let api_addr = format!("127.0.0.1:{}", free_port());
    let mut api_args = common("api", &api_addr);
    api_args.extend(["--kafka-threshold".into(), "0s".into()]);
    let _api = Role::start("api", &api_addr, api_args, dir.path());
    let mut dispatchers: Vec<Role> = Vec::new();
    let mut addrs = vec![api_addr.clone()];
    for i in 0..3 {
        let addr = format!("127.0.0.1:{}", free_port());
        dispatchers.push(Role::start(
            &format!("dispatcher-{i}"),
            &addr,
            common("dispatcher", &addr),
            dir.path(),
        ));
        addrs.push(addr);
    }
    let mut schedulers = Vec::new();
    for i in 0..2 {
        let addr = format!("127.0.0.1:{}", free_port());
        schedulers.push(Role::start(
            &format!("scheduler-{i}"),
            &addr,
            common("scheduler", &addr),
            dir.path(),
        ));
        addrs.push(addr);
    }
    for addr in &addrs {
        wait_healthy(&http, addr).await;
    }

    let mut ids = Vec::with_capacity(TASKS);
    for chunk in (0..TASKS).collect::<Vec<_>>().chunks(500) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|i| {
                json!({"type": TYPES[i % TYPES.len()], "payload": {"i": i},
                       "delay": format!("{}ms", (i * 7919) % 8000)})
            })
            .collect();
        let r = http
            .post(format!("http://{api_addr}/v1/tasks:batch"))
            .json(&json!({ "tasks": tasks }))
            .send()
            .await
            .unwrap();
        let answer: serde_json::Value = r.json().await.unwrap();
        for result in answer["results"].as_array().unwrap() {
            assert_eq!(result["status"], 201, "{result}");
            assert_eq!(result["route"], "store");
            ids.push(result["id"].as_str().unwrap().to_string());
        }
    }

    wait_for(
        "a third of the tasks executed",
        Duration::from_secs(60),
        async || (executor.calls_by_task().len() >= TASKS / 3).then_some(()),
    )
    .await;
    let victim = dispatchers.remove(1);
    let victim_name = victim.name.clone();
    drop(victim); // SIGKILL

    wait_for("every task executed", Duration::from_secs(90), async || {
        let counts = executor.calls_by_task();
        ids.iter().all(|id| counts.contains_key(id)).then_some(())
    })
    .await;
    // Let the cron firings of the last seconds run, then stop creating new ones.
    drop(schedulers);
    let calls = executor.calls();

    // Duplicates: every execution after the first must follow one by the killed process.
    let mut by_task: BTreeMap<&str, Vec<&Call>> = BTreeMap::new();
    for call in &calls {
        by_task.entry(call.id.as_str()).or_default().push(call);
    }
    let mut duplicates = 0;
    for (id, calls) in &by_task {
        if calls.len() > 1 {
            duplicates += calls.len() - 1;
            let first = calls[0]
                .headers
                .get("asyncd-dispatcher")
                .map(String::as_str)
                .unwrap_or("");
            assert!(
                first.contains(&victim_name),
                "task {id} ran {} times; its first run was by {first:?}, not the killed {victim_name}",
                calls.len()
            );
        }
    }
    // A firing is known by its task's first call: a cron task whose attempt died with
    // the killed dispatcher is retried, and the retry's call carries the retry's ETA.
    let cron_firsts: Vec<&Call> = by_task
        .values()
        .filter_map(|calls| calls.first().copied())
        .filter(|c| c.body["type"] == "ticker")
        .collect();
    let mut firings: HashMap<&str, usize> = HashMap::new();
    for call in &cron_firsts {
        *firings
            .entry(call.body["eta"].as_str().unwrap())
            .or_default() += 1;
    }
    let repeated: Vec<_> = firings.iter().filter(|(_, n)| **n > 1).collect();
    let cron_tasks: std::collections::HashSet<_> =
        cron_firsts.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        cron_tasks.len(),
        firings.len(),
        "one task per cron firing: {repeated:?}"
    );
    assert!(firings.len() >= 5, "cron fired {} times", firings.len());
    let per_dispatcher = calls
        .iter()
        .fold(HashMap::<String, usize>::new(), |mut m, c| {
            *m.entry(
                c.headers
                    .get("asyncd-dispatcher")
                    .cloned()
                    .unwrap_or_default(),
            )
            .or_default() += 1;
            m
        });
    println!(
        "{}: {TASKS} tasks + {} cron firings over 3 dispatchers and 2 schedulers; \
         SIGKILL of {victim_name}; {duplicates} duplicate executions; executions per dispatcher {per_dispatcher:?}",
        server.name(),
        firings.len()
    );
    assert!(
        per_dispatcher.len() >= 3,
        "work was spread over the dispatchers: {per_dispatcher:?}"
    );
}

#[tokio::test]
async fn three_dispatchers_and_two_schedulers_on_mariadb() {
    run_cluster(Service::MariaDb).await;
}

#[tokio::test]
async fn three_dispatchers_and_two_schedulers_on_postgres() {
    run_cluster(Service::Postgres).await;
}
