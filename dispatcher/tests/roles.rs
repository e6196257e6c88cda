//! The roles' lifecycle in-process: start-up failures come back from `start`, and a
//! stopped role has wound every part down.

mod support;

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
