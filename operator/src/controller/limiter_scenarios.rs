//! Reconcile scenarios of configs that name AsyncLimiters (`spec.limiters`), on the
//! harness of [`scenarios`](super::scenarios): every Kubernetes call listed, in order.

use std::sync::Arc;

use kube::runtime::controller::Action;
use serde_json::json;

use super::scenario_harness::{
    CONFIGS, DEPLOYMENTS, HPAS, LIMITERS, ROUTING, conditions, deleting,
    expect_routed_and_deployed, finalized, harness, json_of, limiter_list, routing_keys, triples,
};
use super::{Error, RECHECK, RESYNC, reconcile};
use crate::crd::{AsyncLimiter, AsyncLimiterStatus};
use crate::fixtures::{self, Call, Reply};

fn status_path(limiter: &str) -> String {
    format!("{LIMITERS}/{limiter}/status")
}

fn limiter_json(limiter: &AsyncLimiter) -> Reply {
    Reply::Json(serde_json::to_value(limiter).unwrap())
}

/// The document under `key` of a routing ConfigMap apply.
fn entry(call: &Call, key: &str) -> serde_yaml::Value {
    assert_eq!(call.path, ROUTING);
    serde_yaml::from_str(call.body["data"][key].as_str().unwrap()).unwrap()
}

fn psp() -> AsyncLimiter {
    fixtures::limiter("psp", |s| {
        s.concurrency = Some(3);
        s.rate_limit = Some(asyncd_spec::job::RateLimitSpec {
            per_second: 10,
            burst: None,
        });
    })
}

#[tokio::test]
async fn a_config_naming_a_limiter_routes_it_with_the_limiter_document_in_the_configmap() {
    let config = finalized(fixtures::config_with("a", |s| {
        s.limiters = vec!["psp".into()]
    }));
    let limiter = psp();
    let h = harness(&[&config]);
    h.server
        // the pass's check that every named limiter exists
        .expect("GET", LIMITERS, limiter_list(&[&limiter]))
        // the routing rebuild's own list, then the map, then the limiter's status
        .expect("GET", LIMITERS, limiter_list(&[&limiter]))
        .expect("PATCH", ROUTING, Reply::Echo)
        .expect("PATCH", status_path("psp"), limiter_json(&limiter));
    expect_deployed(&h.server, "a");
    h.server
        .expect("PATCH", format!("{CONFIGS}/a/status"), json_of(&config));

    let action = reconcile(Arc::new(config), h.ctx.clone()).await.unwrap();

    assert_eq!(action, Action::requeue(RESYNC));
    let calls = h.server.verify();
    assert_eq!(routing_keys(&calls[2]), ["a.yaml", "limiter_psp.yaml"]);
    // both documents carry the namespace: the dispatchers bind the job to `shop/psp`
    let job = entry(&calls[2], "a.yaml");
    assert_eq!(job["metadata"]["namespace"], "shop");
    assert_eq!(job["spec"]["limiters"][0], "psp");
    let doc = entry(&calls[2], "limiter_psp.yaml");
    assert_eq!(doc["kind"], "AsyncLimiter");
    assert_eq!(doc["metadata"]["name"], "psp");
    assert_eq!(doc["metadata"]["namespace"], "shop");
    assert_eq!(doc["spec"]["concurrency"], 3);
    assert_eq!(doc["spec"]["rateLimit"]["perSecond"], 10);
    // the limiter's status names its job
    assert_eq!(calls[3].path, status_path("psp"));
    assert_eq!(
        calls[3].body,
        json!({"status": {"observedGeneration": 1, "jobs": ["a"], "jobCount": 1}})
    );
    let written = calls.last().unwrap();
    assert_eq!(
        conditions(written)[..3],
        triples(&[
            ("Ready", "True", "Reconciled"),
            ("TopicReady", "True", "TopicCreated"),
            ("RoutingReady", "True", "RouteApplied"),
        ])
    );
    let routing = written.body["status"]["conditions"][2]["message"]
        .as_str()
        .unwrap();
    assert!(routing.ends_with("beside AsyncLimiters psp"), "{routing}");
}

/// The Deployment and HPA of config `name`, after its route.
fn expect_deployed(server: &fixtures::ApiServer, name: &str) {
    server
        .expect(
            "PATCH",
            format!("{DEPLOYMENTS}/asyncd-dispatcher-{name}"),
            Reply::Echo,
        )
        .expect(
            "PATCH",
            format!("{HPAS}/asyncd-dispatcher-{name}"),
            Reply::Echo,
        );
}

#[tokio::test]
async fn a_config_naming_a_missing_limiter_is_not_routed_and_says_why() {
    let config = finalized(fixtures::aged("a", 1, |s| s.limiters = vec!["psp".into()]));
    let other = finalized(fixtures::aged("b", 2, |s| {
        s.task_type = "b".into();
        s.kafka.as_mut().unwrap().topic = "b".into();
    }));
    // another limiter exists, its status already right: not written again
    let mut bank = fixtures::limiter("bank", |s| s.concurrency = Some(1));
    bank.status = Some(AsyncLimiterStatus {
        observed_generation: Some(1),
        jobs: Vec::new(),
        job_count: 0,
        running: None,
    });
    let h = harness(&[&config, &other]);
    h.server
        .expect("GET", LIMITERS, limiter_list(&[&bank]))
        .expect("GET", LIMITERS, limiter_list(&[&bank]))
        .expect("PATCH", ROUTING, Reply::Echo)
        .expect("PATCH", format!("{CONFIGS}/a/status"), json_of(&config));

    let action = reconcile(Arc::new(config), h.ctx.clone()).await.unwrap();

    assert_eq!(action, Action::requeue(RECHECK));
    let calls = h.server.verify();
    // the map still routes the other config, and holds the limiter that exists
    assert_eq!(routing_keys(&calls[2]), ["b.yaml", "limiter_bank.yaml"]);
    let written = &calls[3];
    assert_eq!(
        conditions(written)[0],
        ("Ready".into(), "False".into(), "InvalidSpec".into())
    );
    let message = written.body["status"]["conditions"][0]["message"]
        .as_str()
        .unwrap();
    assert!(
        message.starts_with("spec.limiters[0]: no AsyncLimiter \"psp\" in namespace \"shop\""),
        "{message}"
    );
    // nothing was built for it: no topic, no Deployment
    assert!(h.admin.calls.lock().unwrap().is_empty());
    assert!(h.server.events().contains(&"InvalidSpec".to_string()));
}

#[tokio::test]
async fn a_limiter_gone_before_the_rebuild_leaves_the_config_unrouted_and_undeployed() {
    let config = finalized(fixtures::config_with("a", |s| {
        s.limiters = vec!["psp".into()]
    }));
    let h = harness(&[&config]);
    h.server
        .expect("GET", LIMITERS, limiter_list(&[&psp()]))
        .expect("GET", LIMITERS, limiter_list(&[]))
        .expect("PATCH", ROUTING, Reply::Echo)
        .expect("PATCH", format!("{CONFIGS}/a/status"), json_of(&config));

    let error = reconcile(Arc::new(config), h.ctx.clone())
        .await
        .unwrap_err();

    assert!(matches!(error, Error::Step(_)), "{error}");
    let calls = h.server.verify();
    assert!(routing_keys(&calls[2]).is_empty());
    assert_eq!(
        conditions(&calls[3])[..5],
        triples(&[
            ("Ready", "False", "LimiterUnavailable"),
            ("TopicReady", "True", "TopicCreated"),
            ("RoutingReady", "False", "LimiterUnavailable"),
            ("DispatcherReady", "Unknown", "Pending"),
            ("ScalingReady", "Unknown", "Pending"),
        ])
    );
    let message = calls[3].body["status"]["conditions"][2]["message"]
        .as_str()
        .unwrap();
    assert!(message.starts_with("spec.limiters[0]: "), "{message}");
}

#[tokio::test]
async fn deleting_a_config_takes_it_off_its_limiters_status() {
    let doomed = deleting(fixtures::config_with("a", |s| {
        s.limiters = vec!["psp".into()]
    }));
    let mut limiter = psp();
    limiter.status = Some(AsyncLimiterStatus {
        observed_generation: Some(1),
        jobs: vec!["a".into()],
        job_count: 1,
        running: None,
    });
    let h = harness(&[&doomed]);
    h.server
        .expect("GET", LIMITERS, limiter_list(&[&limiter]))
        .expect("PATCH", ROUTING, Reply::Echo)
        .expect("PATCH", status_path("psp"), limiter_json(&limiter))
        .expect(
            "GET",
            format!("{DEPLOYMENTS}/asyncd-dispatcher-a"),
            Reply::Status(404),
        )
        .expect(
            "GET",
            format!("{HPAS}/asyncd-dispatcher-a"),
            Reply::Status(404),
        )
        .expect("PATCH", format!("{CONFIGS}/a"), json_of(&doomed));

    reconcile(Arc::new(doomed), h.ctx.clone()).await.unwrap();

    let calls = h.server.verify();
    // the limiter stays in the map (no config names it now)
    assert_eq!(routing_keys(&calls[1]), ["limiter_psp.yaml"]);
    assert_eq!(
        calls[2].body,
        json!({"status": {"observedGeneration": 1, "jobs": [], "jobCount": 0}})
    );
}

#[tokio::test]
async fn without_the_limiter_crd_configs_that_name_none_are_still_routed() {
    // an operator upgraded before its CRDs (Helm never upgrades crds/): the list is 404
    let config = finalized(fixtures::config("a"));
    let h = harness(&[&config]);
    h.server.expect("GET", LIMITERS, Reply::Status(404));
    expect_routed_and_deployed(&h.server, &config);
    h.server
        .expect("PATCH", format!("{CONFIGS}/a/status"), json_of(&config));

    let action = reconcile(Arc::new(config), h.ctx.clone()).await.unwrap();

    assert_eq!(action, Action::requeue(RESYNC));
    let calls = h.server.verify();
    assert_eq!(routing_keys(&calls[1]), ["a.yaml"]);
    assert_eq!(
        conditions(&calls[4])[0],
        ("Ready".into(), "True".into(), "Reconciled".into())
    );
}

#[tokio::test]
async fn without_the_right_to_list_limiters_a_config_naming_one_says_so() {
    // RBAC older than the operator: the list is 403; the map is rebuilt without the config
    let config = finalized(fixtures::config_with("a", |s| {
        s.limiters = vec!["psp".into()]
    }));
    let h = harness(&[&config]);
    h.server
        .expect("GET", LIMITERS, Reply::Status(403))
        .expect("GET", LIMITERS, Reply::Status(403))
        .expect("PATCH", ROUTING, Reply::Echo)
        .expect("PATCH", format!("{CONFIGS}/a/status"), json_of(&config));

    let action = reconcile(Arc::new(config), h.ctx.clone()).await.unwrap();

    assert_eq!(action, Action::requeue(RECHECK));
    let calls = h.server.verify();
    assert!(routing_keys(&calls[2]).is_empty());
    let message = calls[3].body["status"]["conditions"][0]["message"]
        .as_str()
        .unwrap();
    assert!(
        message.starts_with("spec.limiters[0]: no AsyncLimiter \"psp\" in namespace \"shop\" can be read: the operator may not list AsyncLimiters"),
        "{message}"
    );
}

#[tokio::test]
async fn a_limiter_status_write_that_fails_does_not_fail_the_pass() {
    let config = finalized(fixtures::config("a"));
    let idle = fixtures::limiter("idle", |s| s.concurrency = Some(1));
    let h = harness(&[&config]);
    h.server
        .expect("GET", LIMITERS, limiter_list(&[&idle]))
        .expect("PATCH", ROUTING, Reply::Echo)
        .expect("PATCH", status_path("idle"), Reply::Status(403));
    expect_deployed(&h.server, "a");
    h.server
        .expect("PATCH", format!("{CONFIGS}/a/status"), json_of(&config));

    let action = reconcile(Arc::new(config), h.ctx.clone()).await.unwrap();

    assert_eq!(action, Action::requeue(RESYNC));
    h.server.verify();
    let failures = h
        .ctx
        .metrics
        .failures
        .with_label_values(&["limiter_status"])
        .get();
    assert_eq!(failures, 1);
}
