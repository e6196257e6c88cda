//! `spec.fairness`: the fair claim shares a job between tenants first, by weight, then
//! between each tenant's keys in turn, so one tenant spreading a flood over many keys
//! does not starve the others (docs/design.md, "Fairness between tenants").

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use asyncd_spec::TENANT_SEPARATOR;
use asyncd_store::{
    ClaimIdsParams, FairParams, KeyOrder, Millis, NewTask, Store, TenantWeights, TypeFilter,
    UsageBy, UsageCounts,
};

use crate::{T0, at, claim_params, insert};

scenarios!(
    a_flooding_tenant_leaves_each_small_tenant_a_place_in_the_first_claim,
    tenants_begin_in_proportion_to_their_weights,
    runtime_weights_are_set_replaced_and_deleted_per_job,
    tenants_with_work_are_counted_busiest_first,
);

const FLOOD: usize = 100_000;
const FLOOD_KEYS: usize = 10_000;
const SMALL: usize = 50;

fn key(tenant: &str, key: &str) -> String {
    format!("{tenant}{TENANT_SEPARATOR}{key}")
}

/// One fair claim of `limit` tasks of `task_type` at `now`, as `(id, tenant)` pairs.
async fn claim(
    store: &dyn Store,
    task_type: &str,
    now: Millis,
    limit: u32,
    weights: &BTreeMap<String, u32>,
    after: Option<&str>,
) -> (Vec<(String, String)>, Option<String>) {
    let only = TypeFilter::Only(vec![task_type.into()]);
    let claim = store
        .claim_fair(
            claim_params(&only, now, now, 60_000, "x", limit),
            FairParams {
                per_key: 2,
                after,
                order: KeyOrder::Rank,
                key_limits: None,
                tenants: Some(TenantWeights {
                    weights,
                    default_weight: 1,
                    per_tenant: 100,
                }),
            },
        )
        .await
        .unwrap();
    let tasks = claim
        .tasks
        .into_iter()
        .map(|task| {
            let key = task.concurrency_key.unwrap_or_default();
            let tenant = key.split(TENANT_SEPARATOR).next().unwrap_or("").to_string();
            (task.id, tenant)
        })
        .collect();
    (tasks, claim.last_key)
}

/// The bound: with `T` tenants holding due tasks, each tenant's first due task is among
/// the first `T` the fair claim takes, however many tasks and keys another tenant has.
/// Here one tenant floods 10⁵ tasks over 10⁴ keys, all due before any of 50 small
/// tenants' two tasks each: one claim of 64 (a dispatcher's batch) takes every small
/// tenant's first task, and the flood takes no more than its fair share of it (one a
/// round). The claim's cost at this size is printed: index probes per tenant and key
/// it looks at, not the backlog (docs/benchmarks.md).
async fn a_flooding_tenant_leaves_each_small_tenant_a_place_in_the_first_claim(store: &dyn Store) {
    let started = Instant::now();
    let flood: Vec<NewTask> = (0..FLOOD)
        .map(|i| {
            NewTask::test("shared", at((i / 1000) as i64))
                .concurrency_key(key("big", &format!("k{}", i % FLOOD_KEYS)))
        })
        .collect();
    for chunk in flood.chunks(5_000) {
        store.insert(chunk, T0).await.unwrap();
    }
    let mut small_first = BTreeMap::new();
    for n in 0..SMALL {
        let tenant = format!("small-{n:02}");
        let first = insert(
            store,
            NewTask::test("shared", at(200)).concurrency_key(key(&tenant, "m")),
        )
        .await;
        insert(
            store,
            NewTask::test("shared", at(201)).concurrency_key(key(&tenant, "m")),
        )
        .await;
        small_first.insert(tenant, first);
    }
    let loaded = started.elapsed();
    let no_weights = BTreeMap::new();
    let picked_at = Instant::now();
    let (first, last) = claim(store, "shared", at(1_000), 64, &no_weights, None).await;
    eprintln!(
        "{FLOOD} + {} tasks loaded in {loaded:?}; the first fair claim of 64 took {:?}",
        2 * SMALL,
        picked_at.elapsed()
    );
    assert_eq!(first.len(), 64);
    let ids: BTreeSet<&str> = first.iter().map(|(id, _)| id.as_str()).collect();
    for (tenant, id) in &small_first {
        assert!(ids.contains(id.as_str()), "{tenant}'s first task waits");
    }
    let big = first.iter().filter(|(_, t)| t == "big").count();
    assert!(
        big <= 2,
        "the flooding tenant took {big} of the first 64: one a round, 51 tenants"
    );
    // The next claim goes round again from where this one stopped: the small tenants'
    // second tasks, the flood one a round.
    let (second, _) = claim(store, "shared", at(1_001), 64, &no_weights, last.as_deref()).await;
    let small_second = second.iter().filter(|(_, t)| t != "big").count();
    assert_eq!(
        small_first.len() * 2 - (64 - big),
        small_second,
        "every small task is taken by the second claim"
    );
}

/// Weighted: a tenant of weight 3 begins three tasks in each round where a tenant of
/// the default weight 1 begins one.
async fn tenants_begin_in_proportion_to_their_weights(store: &dyn Store) {
    for i in 0..20 {
        for tenant in ["heavy", "light"] {
            insert(
                store,
                NewTask::test("weighted", at(i)).concurrency_key(key(tenant, &format!("k{i}"))),
            )
            .await;
        }
    }
    let weights = BTreeMap::from([("heavy".to_string(), 3)]);
    let (picked, _) = claim(store, "weighted", at(100), 8, &weights, None).await;
    let heavy = picked.iter().filter(|(_, t)| t == "heavy").count();
    assert_eq!((heavy, picked.len() - heavy), (6, 2), "{picked:?}");
}

/// The weights set at runtime (migration 0026): one per job and tenant, replaced by a
/// later set, deleted back to none, each job's apart.
async fn runtime_weights_are_set_replaced_and_deleted_per_job(store: &dyn Store) {
    assert!(store.tenant_weights("weighed").await.unwrap().is_empty());
    assert!(
        store
            .set_tenant_weight("weighed", "acme", Some(5), T0)
            .await
            .unwrap()
    );
    assert!(
        store
            .set_tenant_weight("weighed", "zeta", Some(2), T0)
            .await
            .unwrap()
    );
    assert!(
        store
            .set_tenant_weight("other", "acme", Some(9), T0)
            .await
            .unwrap()
    );
    assert!(
        store
            .set_tenant_weight("weighed", "acme", Some(7), at(10))
            .await
            .unwrap(),
        "a later weight replaces the earlier"
    );
    assert_eq!(
        store.tenant_weights("weighed").await.unwrap(),
        BTreeMap::from([("acme".to_string(), 7), ("zeta".to_string(), 2)])
    );
    assert!(
        store
            .set_tenant_weight("weighed", "acme", None, at(20))
            .await
            .unwrap()
    );
    assert!(
        !store
            .set_tenant_weight("weighed", "acme", None, at(30))
            .await
            .unwrap(),
        "nothing left to delete"
    );
    assert_eq!(
        store.tenant_weights("weighed").await.unwrap(),
        BTreeMap::from([("zeta".to_string(), 2)])
    );
    assert_eq!(
        store.tenant_weights("other").await.unwrap(),
        BTreeMap::from([("acme".to_string(), 9)])
    );
}

/// The jobs overview's tenants and keys (`Store::usage`): claimed and due tasks counted
/// per tenant, or per key, at `now`, the most running first, then the most due; a tenant
/// whose tasks are all due later, another job's, and a task without a key left out;
/// `limit` and `cap` honoured.
async fn tenants_with_work_are_counted_busiest_first(store: &dyn Store) {
    let mut busy = Vec::new();
    for i in 0..3 {
        busy.push(
            insert(
                store,
                NewTask::test("usage", at(i)).concurrency_key(key("busy", &format!("k{i}"))),
            )
            .await,
        );
    }
    for i in 0..2 {
        insert(
            store,
            NewTask::test("usage", at(i)).concurrency_key(key("queued", &format!("k{i}"))),
        )
        .await;
    }
    insert(
        store,
        NewTask::test("usage", at(1_000)).concurrency_key(key("later", "k")),
    )
    .await;
    insert(
        store,
        NewTask::test("other-usage", at(0)).concurrency_key(key("elsewhere", "k")),
    )
    .await;
    insert(store, NewTask::test("usage", at(0))).await;
    let claimed = store
        .claim_ids(ClaimIdsParams {
            ids: &busy[..2],
            now: at(10),
            hold: std::time::Duration::from_secs(60),
            owner: "x",
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    let counts = |of: &str, running, due| UsageCounts {
        of: of.into(),
        running,
        due,
    };
    assert_eq!(
        store
            .usage("usage", UsageBy::Tenant, at(100), 1_000, 20)
            .await
            .unwrap(),
        vec![counts("busy", 2, 1), counts("queued", 0, 2)]
    );
    assert_eq!(
        store
            .usage("usage", UsageBy::Tenant, at(2_000), 1_000, 1)
            .await
            .unwrap(),
        vec![counts("busy", 2, 1)],
        "the busiest alone"
    );
    let capped = store
        .usage("usage", UsageBy::Tenant, at(2_000), 3, 20)
        .await
        .unwrap();
    let seen: u64 = capped.iter().map(|t| t.running + t.due).sum();
    assert_eq!(seen, 3, "at most the cap's tasks counted: {capped:?}");
    assert_eq!(
        store
            .usage("usage", UsageBy::Key, at(100), 1_000, 4)
            .await
            .unwrap(),
        vec![
            counts(&key("busy", "k0"), 1, 0),
            counts(&key("busy", "k1"), 1, 0),
            counts(&key("busy", "k2"), 0, 1),
            counts(&key("queued", "k0"), 0, 1),
        ],
        "by key: the running ones, then the due, in key order"
    );
}
