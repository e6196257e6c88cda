//! The roles' lifecycle in-process: start-up failures come back from `start`, and a
//! stopped role has wound every part down.

mod support;

use std::sync::Arc;
use std::time::Duration;

use asyncd::clock::ManualClock;
use asyncd::roles::{self, Parts, RoleError};
use asyncd::store::TaskState;
use serde_json::json;
use support::*;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn a_taken_listen_port_fails_start_up() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("jobs")).unwrap();
    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut settings = settings(&dir, ManualClock::at(chrono::Utc::now()));
    settings.listen = taken.local_addr().unwrap();
    let err = match roles::start(settings, Parts::ALL, CancellationToken::new()).await {
        Ok(_) => panic!("started on a taken port"),
        Err(err) => err,
    };
    assert!(
        matches!(&err, RoleError::Listen(addr, e)
            if *addr == taken.local_addr().unwrap() && e.kind() == std::io::ErrorKind::AddrInUse),
        "{err:?}"
    );
}

#[tokio::test]
async fn stopping_a_role_hands_back_its_claims_and_ends_cleanly() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let jobs = [("job.yaml", job_yaml("j", "work", &executor.url(), ""))];
    let mut asyncd = InProcess::start(&jobs).await;
    let id = asyncd.submit(json!({"type": "work", "delay": "1s"})).await;
    asyncd
        .next("the claim", |s| match s {
            asyncd::signals::Signal::Claimed { ids, .. } => ids.contains(&id).then_some(()),
            _ => None,
        })
        .await;
    let url = format!("sqlite://{}", asyncd.dir.path().join("asyncd.db").display());
    let addr = asyncd.addr;
    let dir = tempfile::TempDir::new().unwrap();
    // Keep the folder (and its database) past the role.
    let kept = std::mem::replace(&mut asyncd.dir, dir);
    asyncd.stop().await.expect("a clean shutdown");
    assert!(
        tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr))
            .await
            .is_ok_and(|c| c.is_err()),
        "the listener is closed"
    );
    let store = asyncd::store::open(&url).await.unwrap();
    let task = store.get(&id).await.unwrap().unwrap();
    assert_eq!((task.state, task.attempt), (TaskState::Pending, 0));
    assert!(executor.calls().is_empty());
    drop(kept);
}

/// A database server that is away: every connection is accepted and closed at once
/// (what a restarting server looks like) until `up` is notified; from then on each
/// connection is relayed to `target`.
async fn restarting_database(
    target: std::net::SocketAddr,
) -> (
    u16,
    Arc<tokio::sync::Notify>,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let up = Arc::new(tokio::sync::Notify::new());
    let refused = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (is_up, count) = (up.clone(), refused.clone());
    tokio::spawn(async move {
        let mut serving = false;
        loop {
            tokio::select! {
                _ = is_up.notified(), if !serving => serving = true,
                accepted = listener.accept() => {
                    let (mut client, _) = accepted.unwrap();
                    if !serving {
                        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        continue; // dropped: closed
                    }
                    tokio::spawn(async move {
                        let mut server = tokio::net::TcpStream::connect(target).await.unwrap();
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    });
                }
            }
        }
    });
    (port, up, refused)
}

#[tokio::test]
async fn a_role_started_while_its_database_restarts_waits_for_it() {
    let database = fresh_database("ASYNCD_TEST_POSTGRES_URL").await;
    let url = reqwest::Url::parse(&database).unwrap();
    let target = std::net::SocketAddr::new(
        url.host_str().unwrap().parse().unwrap(),
        url.port().unwrap(),
    );
    let (port, up, refused) = restarting_database(target).await;
    let mut through_proxy = url.clone();
    through_proxy.set_port(Some(port)).unwrap();

    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("jobs")).unwrap();
    let mut settings = settings(&dir, ManualClock::at(chrono::Utc::now()));
    settings.store_url = through_proxy.to_string();
    settings.store_wait = Duration::from_secs(60);
    let shutdown = CancellationToken::new();
    let starting = tokio::spawn(roles::start(settings, Parts::ALL, shutdown.clone()));
    wait_for("refused connections", DEADLINE, async || {
        (refused.load(std::sync::atomic::Ordering::SeqCst) >= 2).then_some(())
    })
    .await;
    assert!(
        !starting.is_finished(),
        "start gave up while the database was away"
    );
    up.notify_one();
    let running = tokio::time::timeout(DEADLINE, starting)
        .await
        .expect("start finishes once the database is back")
        .unwrap()
        .expect("the role starts");
    let ready = reqwest::get(format!("http://{}/readyz", running.addr()))
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    shutdown.cancel();
    running.wait().await.expect("a clean shutdown");
}

#[tokio::test]
async fn a_wrong_database_password_fails_start_up_at_once() {
    let database = fresh_database("ASYNCD_TEST_POSTGRES_URL").await;
    let mut url = reqwest::Url::parse(&database).unwrap();
    url.set_password(Some("wrong")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("jobs")).unwrap();
    let mut settings = settings(&dir, ManualClock::at(chrono::Utc::now()));
    settings.store_url = url.to_string();
    settings.store_wait = Duration::from_secs(3600);
    let started = tokio::time::timeout(
        DEADLINE,
        roles::start(settings, Parts::ALL, CancellationToken::new()),
    )
    .await
    .expect("a wrong password is not waited out");
    assert!(
        matches!(started, Err(RoleError::Store(_))),
        "{:?}",
        started.err()
    );
}
