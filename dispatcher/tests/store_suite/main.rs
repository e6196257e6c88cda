//! The store contract, one suite run against every backend (as River's riverdrivertest is
//! run against each driver): each scenario is a function of a `&dyn Store`, one file per
//! entity of the store, and runs as one test per backend — `<entity>::sqlite::…`,
//! `<entity>::mariadb::…`, `<entity>::postgres::…` — each on a fresh, migrated database,
//! so one failure hides none of the others. A backend is done when it passes all of them.
//! A few scenarios need several dispatchers on one database server and run on MariaDB
//! and PostgreSQL only. The servers come from the environment; without one its tests
//! skip, or fail with `ASYNCD_TEST_REQUIRE_BACKENDS=1` ([`backends`]).

use std::time::Duration;

use asyncd_store::{
    self as store, ClaimParams, ClaimedTask, Finish, FinishKind, InsertOutcome, Millis, NewTask,
    StartParams, Store, TaskState, TypeFilter,
};

use server::Server;

/// Every scenario named as one test per backend (`sqlite::…`, `mariadb::…`,
/// `postgres::…`) in the module that invokes it.
macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    crate::on_sqlite(super::$name).await;
                }
            )*
        }
        mod mariadb {
            $(
                #[tokio::test]
                async fn $name() {
                    if let Some(server) = crate::Server::mariadb() {
                        server.run(super::$name).await;
                    }
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    if let Some(server) = crate::Server::postgres() {
                        server.run(super::$name).await;
                    }
                }
            )*
        }
    };
}

#[path = "../support/backends.rs"]
mod backends;
mod server;

mod claims;
mod cron;
mod dead_letters;
mod dead_rows;
mod dispatchers;
mod expiry;
mod fair_walk;
mod jobs;
mod key_rates;
mod keys;
mod leases;
mod limiters;
mod limits;
mod ordering;
mod outcomes;
mod retention;
mod schedules;
mod search;
mod tasks;
mod tenants;
mod windows;
mod workflows;

/// Runs one scenario on a fresh, migrated SQLite database in a folder of its own.
async fn on_sqlite<F>(scenario: F)
where
    F: for<'a> AsyncFn(&'a dyn Store),
{
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/store.db", dir.path().display());
    let store = store::open(&url).await.unwrap();
    store.migrate().await.unwrap();
    scenario(store.as_ref()).await;
}

const T0: Millis = Millis::new(T0_MS);
const T0_MS: i64 = 1_800_000_000_000;

/// `ms` milliseconds after (or before) [`T0`].
fn at(ms: i64) -> Millis {
    Millis::new(T0_MS + ms)
}

fn claim_params<'a>(
    types: &'a TypeFilter,
    horizon: Millis,
    now: Millis,
    hold_ms: u64,
    owner: &'a str,
    limit: u32,
) -> ClaimParams<'a> {
    ClaimParams {
        types,
        horizon,
        now,
        hold: Duration::from_millis(hold_ms),
        owner,
        limit,
        ahead: false,
    }
}

fn start_params(claims: &[(String, i64)], now: Millis, grace_ms: u64) -> StartParams<'_> {
    StartParams {
        claims,
        now,
        grace: Duration::from_millis(grace_ms),
    }
}

/// The outcome of attempt `lease_token` of task `id`: a success without a result.
fn succeeded(id: &str, lease_token: i64) -> Finish {
    Finish {
        id: id.into(),
        lease_token,
        kind: FinishKind::Succeeded { result: None },
    }
}

async fn insert(store: &dyn Store, task: NewTask) -> String {
    match store.insert(&[task], T0).await.unwrap().remove(0) {
        InsertOutcome::Inserted { id, .. } => id,
        other => panic!("expected an insert, got {other:?}"),
    }
}

async fn claim_all(store: &dyn Store, horizon: Millis, now: Millis) -> Vec<ClaimedTask> {
    store
        .claim(claim_params(
            &TypeFilter::All,
            horizon,
            now,
            5_000,
            "me",
            10_000,
        ))
        .await
        .unwrap()
}

async fn state(store: &dyn Store, id: &str) -> TaskState {
    store.get(id).await.unwrap().unwrap().state
}
