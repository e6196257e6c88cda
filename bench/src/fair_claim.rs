//! What one fair claim of a keyed job costs (`Store::claim_fair`, docs/design.md "Per-key
//! limits" and "Fairness between tenants"), against the job's due backlog, its keys and
//! its tenants: on each backend, one tenant's flood over `due / 10` keys beside 50 small
//! tenants' two tasks each, all due; then the median of `--claims` claims of 64, with
//! the keys' turns alone and with the tenants' weighted fair queuing. Each claim takes
//! its 64 and leaves them claimed, as a dispatcher would.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use asyncd_spec::TENANT_SEPARATOR;
use asyncd_store::{
    self as store, ClaimParams, FairParams, KeyOrder, Millis, NewTask, Store, TenantWeights,
    TypeFilter,
};

use crate::harness::now_ms;
use crate::store::fresh_database;

#[derive(clap::Args)]
pub struct Args {
    /// MariaDB/MySQL server URL without a database (as e2e/services/mariadb.sh url prints).
    #[arg(long, env = "ASYNCD_TEST_MYSQL_URL")]
    mysql: Option<String>,
    /// PostgreSQL server URL without a database.
    #[arg(long, env = "ASYNCD_TEST_POSTGRES_URL")]
    postgres: Option<String>,
    /// Due tasks of the keyed job, one run each.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000,1000000")]
    due: Vec<usize>,
    /// Claims timed per run and mode (the median is printed).
    #[arg(long, default_value_t = 5)]
    claims: usize,
}

const SMALL_TENANTS: usize = 50;

pub async fn run(args: &Args) -> Result<()> {
    println!(
        "## One fair claim of 64: the median of {} claims\n",
        args.claims
    );
    println!("| backend | due | keys | tenants | load | keys' turns alone | tenants, then keys |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let dir = tempfile::tempdir()?;
    for &due in &args.due {
        let mut backends = vec![(
            "SQLite",
            format!("sqlite://{}/claim-{due}.db", dir.path().display()),
        )];
        for (name, server) in [("MariaDB", &args.mysql), ("PostgreSQL", &args.postgres)] {
            if let Some(server) = server {
                backends.push((name, fresh_database(server).await?));
            }
        }
        for (name, url) in backends {
            let store = store::open(&url).await?;
            store.migrate().await?;
            let loaded = load(store.as_ref(), due).await?;
            let alone = median(claims(store.as_ref(), args.claims, false).await?);
            let tenants = median(claims(store.as_ref(), args.claims, true).await?);
            println!(
                "| {name} | {due} | {} | {} | {:.1} s | {:.0} ms | {:.0} ms |",
                due / 10,
                SMALL_TENANTS + 1,
                loaded.as_secs_f64(),
                alone.as_secs_f64() * 1000.0,
                tenants.as_secs_f64() * 1000.0,
            );
        }
    }
    Ok(())
}

/// `due` tasks due now: the flood's, over `due / 10` keys, then the small tenants'.
async fn load(store: &dyn Store, due: usize) -> Result<Duration> {
    let started = Instant::now();
    let now = Millis::new(now_ms());
    let flood = due.saturating_sub(2 * SMALL_TENANTS);
    let keys = (due / 10).max(1);
    let tasks = (0..flood)
        .map(|i| format!("big{TENANT_SEPARATOR}k{}", i % keys))
        .chain((0..2 * SMALL_TENANTS).map(|i| format!("small-{}{TENANT_SEPARATOR}m", i / 2)));
    let mut batch = Vec::with_capacity(5_000);
    for key in tasks {
        batch.push(NewTask::test("fair", now).concurrency_key(key));
        if batch.len() == 5_000 {
            store.insert(&batch, now).await?;
            batch.clear();
        }
    }
    if !batch.is_empty() {
        store.insert(&batch, now).await?;
    }
    Ok(started.elapsed())
}

async fn claims(store: &dyn Store, n: usize, tenants: bool) -> Result<Vec<Duration>> {
    let weights = BTreeMap::new();
    let types = TypeFilter::Only(vec!["fair".into()]);
    let mut after: Option<String> = None;
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let now = Millis::new(now_ms());
        let started = Instant::now();
        let claim = store
            .claim_fair(
                ClaimParams {
                    types: &types,
                    horizon: now,
                    now,
                    hold: Duration::from_secs(600),
                    owner: "bench",
                    limit: 64,
                    ahead: false,
                },
                FairParams {
                    per_key: 2,
                    after: after.as_deref(),
                    order: KeyOrder::Rank,
                    key_limits: None,
                    tenants: tenants.then_some(TenantWeights {
                        weights: &weights,
                        default_weight: 1,
                        per_tenant: 1_000,
                    }),
                },
            )
            .await?;
        times.push(started.elapsed());
        after = claim.last_key;
    }
    Ok(times)
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times.get(times.len() / 2).copied().unwrap_or_default()
}
