//! Reconcile scenarios against a scripted API server ([`fixtures::ApiServer`]) and an
//! in-memory broker ([`FakeAdmin`]): every Kubernetes call a pass makes is listed, in
//! order, and a call too many or too few fails the test. The real API server and broker
//! are exercised by `e2e/operator.sh`.

use std::sync::Arc;

use asyncd_spec::DeletePolicy;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::runtime::controller::Action;
use serde_json::{Value, json};

use super::scenario_harness::*;
use super::{Error, RECHECK, RESYNC, reconcile};
use crate::builders::DispatcherSettings;
use crate::crd::{AsyncJobConfig, AsyncJobConfigStatus, FINALIZER};
use crate::fixtures::{self, ApiServer, Call, Reply};

#[tokio::test]
async fn the_first_reconcile_only_adds_the_finalizer() {
    let config = fixtures::config("a");
    let h = harness(&[&config]);
    h.server.expect(
        "PATCH",
        format!("{CONFIGS}/a"),
        json_of(&finalized(config.clone())),
    );

    let action = reconcile(Arc::new(config), h.ctx.clone()).await.unwrap();

    assert_eq!(action, Action::await_change());
    let calls = h.server.verify();
    let ops = calls[0].body.as_array().expect("a JSON patch");
    assert!(
        ops.iter()
            .any(|op| op["op"] == "add" && op["value"] == json!([FINALIZER])),
        "{ops:?}"
    );
    assert!(h.admin.calls.lock().unwrap().is_empty());
    assert!(h.server.events().is_empty());
}

#[tokio::test]
async fn a_pass_applies_every_step_and_reports_each_condition() {
    let config = finalized(fixtures::config("a"));
    let h = harness(&[&config]);
    expect_full_pass(&h.server, &config);
    h.server
        .expect("PATCH", format!("{CONFIGS}/a/status"), json_of(&config));

    let action = reconcile(Arc::new(config), h.ctx.clone()).await.unwrap();

    assert_eq!(action, Action::requeue(RESYNC));
    // each topic the pass created is recorded on the broker as this config's
    assert_eq!(
        *h.admin.calls.lock().unwrap(),
        [
            "create topic 6",
            "own topic shop/a",
            "create topic-high 6",
            "own topic-high shop/a"
        ]
    );
    let calls = h.server.verify();
    assert_eq!(calls[0].path, LIMITERS);
    assert_eq!(routing_keys(&calls[1]), ["a.yaml"]);
    assert_eq!(calls[2].body["kind"], "Deployment");
    assert_eq!(calls[3].body["kind"], "HorizontalPodAutoscaler");
    assert_eq!(
        conditions(&calls[4]),
        triples(&[
            ("Ready", "True", "Reconciled"),
            ("TopicReady", "True", "TopicCreated"),
            ("RoutingReady", "True", "RouteApplied"),
            ("DispatcherReady", "True", "DeploymentApplied"),
            ("ScalingReady", "True", "AutoscalerApplied"),
            ("Conflict", "False", "NoConflict"),
        ])
    );
    assert_eq!(calls[4].body["status"]["partitions"], 6);
    assert_eq!(
        h.server.events(),
        ["TopicCreated", "TopicCreated", "Reconciled"],
        "one per topic"
    );
}

#[tokio::test]
async fn an_unchanged_status_is_not_written_again() {
    let mut config = finalized(fixtures::config("a"));
    let h = harness(&[&config]);
    // the topics exist already, recorded as this config's: both passes find them as asked
    h.admin.own(&["topic", "topic-high"], "shop/a");
    expect_full_pass(&h.server, &config);
    h.server
        .expect("PATCH", format!("{CONFIGS}/a/status"), json_of(&config));
    reconcile(Arc::new(config.clone()), h.ctx.clone())
        .await
        .unwrap();
    let written = h.server.verify().pop().unwrap();
    config.status = Some(
        serde_json::from_value::<AsyncJobConfigStatus>(written.body["status"].clone()).unwrap(),
    );
    let events_before = h.server.events().len();

    // the same pass again, now with that status: no status patch, no new Events
    expect_full_pass(&h.server, &config);
    let action = reconcile(Arc::new(config), h.ctx.clone()).await.unwrap();

    assert_eq!(action, Action::requeue(RESYNC));
    assert_eq!(h.server.verify().len(), 5 + 4);
    assert_eq!(h.server.events().len(), events_before);
    assert!(h.admin.calls.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_failing_step_is_reported_and_later_steps_stay_pending() {
    let config = finalized(fixtures::config("a"));
    let h = harness(&[&config]);
    expect_no_limiters(&h.server)
        .expect("PATCH", ROUTING, Reply::Echo)
        .expect(
            "PATCH",
            format!("{DEPLOYMENTS}/asyncd-dispatcher-a"),
            Reply::Status(500),
        )
        .expect("PATCH", format!("{CONFIGS}/a/status"), json_of(&config));

    let error = reconcile(Arc::new(config), h.ctx.clone())
        .await
        .unwrap_err();

    assert!(matches!(error, Error::Kube(_)), "{error}");
    let calls = h.server.verify();
    assert_eq!(
        conditions(&calls[3]),
        triples(&[
            ("Ready", "False", "DeploymentApplyFailed"),
            ("TopicReady", "True", "TopicCreated"),
            ("RoutingReady", "True", "RouteApplied"),
            ("DispatcherReady", "False", "DeploymentApplyFailed"),
            ("ScalingReady", "Unknown", "Pending"),
            ("Conflict", "False", "NoConflict"),
        ])
    );
    assert!(
        h.server
            .events()
            .contains(&"DeploymentApplyFailed".to_string())
    );
}

#[tokio::test]
async fn the_younger_of_two_claimants_gets_conflict_and_nothing_is_created() {
    let cases = [
        (
            "task type",
            fixtures::aged("b", 2, |s| s.kafka.as_mut().unwrap().topic = "b".into()),
            "TaskTypeOwnedByOther",
        ),
        (
            "topic",
            fixtures::aged("b", 2, |s| s.task_type = "b".into()),
            "TopicOwnedByOther",
        ),
    ];
    for (claim, younger, reason) in cases {
        let older = finalized(fixtures::aged("a", 1, |_| {}));
        let younger = finalized(younger);
        let h = harness(&[&older, &younger]);
        // the route is rebuilt without the younger; no topic, Deployment or HPA for it
        expect_no_limiters(&h.server)
            .expect("PATCH", ROUTING, Reply::Echo)
            .expect("PATCH", format!("{CONFIGS}/b/status"), json_of(&younger));

        let action = reconcile(Arc::new(younger), h.ctx.clone()).await.unwrap();

        assert_eq!(action, Action::requeue(RECHECK), "{claim}");
        let calls = h.server.verify();
        assert_eq!(routing_keys(&calls[1]), ["a.yaml"], "{claim}");
        let conditions = conditions(&calls[2]);
        assert_eq!(
            conditions[0],
            ("Ready".into(), "False".into(), "Conflict".into()),
            "{claim}"
        );
        assert_eq!(
            conditions.last().unwrap(),
            &("Conflict".into(), "True".into(), reason.into()),
            "{claim}"
        );
        let message = calls[2].body["status"]["conditions"][5]["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(message.contains("\"a\""), "{claim}: {message}");
        assert!(h.admin.calls.lock().unwrap().is_empty(), "{claim}");
        assert!(h.server.events().contains(&reason.to_string()), "{claim}");
    }
}

/// The owned dispatcher Deployment a deletion finds.
fn owned_deployment(config: &AsyncJobConfig) -> Reply {
    let mut deployment = crate::builders::deployment::build(config, &fixtures::settings());
    deployment.metadata.owner_references = Some(vec![OwnerReference {
        uid: config.metadata.uid.clone().unwrap(),
        ..OwnerReference::default()
    }]);
    Reply::Json(serde_json::to_value::<Deployment>(deployment).unwrap())
}

fn removes_the_finalizer(call: &Call) -> bool {
    call.path == format!("{CONFIGS}/a")
        && call
            .body
            .as_array()
            .is_some_and(|ops| ops.iter().any(|op| op["op"] == "remove"))
}

#[tokio::test]
async fn deletion_under_delete_policy_deletes_the_topic_then_drops_the_finalizer() {
    let doomed = deleting(fixtures::config_with("a", |s| {
        s.kafka.as_mut().unwrap().delete_policy = DeletePolicy::Delete
    }));
    let other = finalized(fixtures::aged("b", 1, |s| {
        s.task_type = "b".into();
        s.kafka.as_mut().unwrap().topic = "b".into();
    }));
    let h = harness(&[&doomed, &other]);
    h.admin.own(&["topic", "topic-high"], "shop/a");
    let dispatcher = format!("{DEPLOYMENTS}/asyncd-dispatcher-a");
    expect_no_limiters(&h.server)
        .expect("PATCH", ROUTING, Reply::Echo)
        .expect("GET", dispatcher.clone(), owned_deployment(&doomed))
        .expect("DELETE", dispatcher, owned_deployment(&doomed))
        .expect(
            "GET",
            format!("{HPAS}/asyncd-dispatcher-a"),
            Reply::Status(404),
        )
        .expect("PATCH", format!("{CONFIGS}/a"), json_of(&doomed));

    let action = reconcile(Arc::new(doomed), h.ctx.clone()).await.unwrap();

    assert_eq!(action, Action::await_change());
    let calls = h.server.verify();
    assert_eq!(routing_keys(&calls[1]), ["b.yaml"]);
    assert!(removes_the_finalizer(calls.last().unwrap()));
    assert_eq!(
        *h.admin.calls.lock().unwrap(),
        [
            "delete topic",
            "disown topic",
            "delete topic-high",
            "disown topic-high"
        ]
    );
    assert!(h.admin.topics.lock().unwrap().is_empty());
    assert!(h.admin.owners.lock().unwrap().is_empty());
    assert_eq!(h.server.events(), ["Deleted"]);
}

/// Scripts the calls of a deletion of `config` that finds no Deployment and no HPA.
fn expect_bare_cleanup(server: &ApiServer, config: &AsyncJobConfig) {
    let name = config.name();
    expect_no_limiters(server)
        .expect("PATCH", ROUTING, Reply::Echo)
        .expect(
            "GET",
            format!("{DEPLOYMENTS}/asyncd-dispatcher-{name}"),
            Reply::Status(404),
        )
        .expect(
            "GET",
            format!("{HPAS}/asyncd-dispatcher-{name}"),
            Reply::Status(404),
        )
        .expect("PATCH", format!("{CONFIGS}/{name}"), json_of(config));
}

#[tokio::test]
async fn deletion_under_delete_policy_keeps_topics_not_recorded_as_this_configs() {
    // the config owns its topic in its namespace, but the broker records it as another
    // namespace's (or not at all): it is not this config's to delete
    let doomed = deleting(fixtures::config_with("a", |s| {
        s.kafka.as_mut().unwrap().delete_policy = DeletePolicy::Delete
    }));
    let h = harness(&[&doomed]);
    h.admin.own(&["topic"], "other/a");
    h.admin
        .topics
        .lock()
        .unwrap()
        .insert("topic-high".into(), 6);
    expect_bare_cleanup(&h.server, &doomed);

    reconcile(Arc::new(doomed), h.ctx.clone()).await.unwrap();

    h.server.verify();
    assert!(h.admin.calls.lock().unwrap().is_empty());
    assert_eq!(h.admin.topics.lock().unwrap().len(), 2);
    assert_eq!(h.admin.owners.lock().unwrap()["topic"], "other/a");
}

/// A refused config: its route is dropped and its status says why; nothing else.
async fn expect_refused(h: &Harness, config: AsyncJobConfig, reason: &str) -> String {
    let name = config.name().to_string();
    expect_no_limiters(&h.server)
        .expect("PATCH", ROUTING, Reply::Echo)
        .expect(
            "PATCH",
            format!("{CONFIGS}/{name}/status"),
            json_of(&config),
        );
    let action = reconcile(Arc::new(config), h.ctx.clone()).await.unwrap();
    assert_eq!(action, Action::requeue(RECHECK), "{reason}");
    let calls = h.server.verify();
    let written = calls.last().unwrap();
    let conditions = conditions(written);
    assert_eq!(
        conditions[0],
        ("Ready".into(), "False".into(), "Conflict".into()),
        "{reason}"
    );
    assert_eq!(
        conditions.last().unwrap(),
        &("Conflict".into(), "True".into(), reason.into())
    );
    assert!(
        routing_keys(&calls[calls.len() - 2]).is_empty(),
        "{reason}: a refused config is not routed"
    );
    assert!(h.server.events().contains(&reason.to_string()), "{reason}");
    written.body["status"]["conditions"][5]["message"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn a_topic_recorded_as_another_namespaces_is_refused_and_not_touched() {
    let config = finalized(fixtures::config_with("a", |s| {
        s.kafka.as_mut().unwrap().partitions = 12
    }));
    let h = harness(&[&config]);
    h.admin
        .own(&["topic", "topic-high"], "other-team/their-job");

    let message = expect_refused(&h, config, "TopicOwnedByOther").await;

    assert!(message.contains("\"other-team/their-job\""), "{message}");
    // not grown, not recorded: the broker is only read
    assert!(h.admin.calls.lock().unwrap().is_empty());
    assert_eq!(h.admin.topics.lock().unwrap()["topic"], 6);
}

#[tokio::test]
async fn an_existing_topic_without_an_owner_record_is_refused() {
    let config = finalized(fixtures::config("a"));
    let h = harness(&[&config]);
    h.admin.topics.lock().unwrap().insert("topic".into(), 6);

    let message = expect_refused(&h, config, "TopicNotOwned").await;

    assert!(message.contains("an admin assigns it"), "{message}");
    assert!(h.admin.calls.lock().unwrap().is_empty());
    assert!(h.admin.owners.lock().unwrap().is_empty());
}

const SIGNING_SECRET: &str = "/api/v1/namespaces/shop/secrets/order-cancel-signing";

fn secret_metadata(job_label: Option<&str>) -> Reply {
    let labels = job_label.map_or(json!({}), |j| json!({ crate::builders::JOB_LABEL: j }));
    Reply::Json(json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": {"name": "order-cancel-signing", "namespace": "shop", "labels": labels},
    }))
}

#[tokio::test]
async fn a_signing_secret_not_labelled_for_the_config_is_not_mounted() {
    for (label, reason) in [
        (Some("another-job"), "SigningSecretOwnedByOther"),
        (None, "SigningSecretNotLabelled"),
    ] {
        let config = finalized(fixtures::sample("order-cancel-job.yaml"));
        let h = harness(&[&config]);
        h.server
            .expect("GET", SIGNING_SECRET, secret_metadata(label));

        let message = expect_refused(&h, config, reason).await;

        assert!(message.contains("\"order-cancel-signing\""), "{message}");
        assert!(h.admin.calls.lock().unwrap().is_empty(), "{reason}");
    }
    // a missing Secret cannot be checked: refused too
    let config = finalized(fixtures::sample("order-cancel-job.yaml"));
    let h = harness(&[&config]);
    h.server.expect("GET", SIGNING_SECRET, Reply::Status(404));
    expect_refused(&h, config, "SigningSecretMissing").await;
}

#[tokio::test]
async fn a_signing_secret_labelled_for_the_config_is_mounted() {
    let config = finalized(fixtures::sample("order-cancel-job.yaml"));
    let h = harness(&[&config]);
    h.server.expect(
        "GET",
        SIGNING_SECRET,
        secret_metadata(Some("order-cancel-job")),
    );
    expect_full_pass(&h.server, &config);
    h.server.expect(
        "PATCH",
        format!("{CONFIGS}/order-cancel-job/status"),
        json_of(&config),
    );

    let action = reconcile(Arc::new(config), h.ctx.clone()).await.unwrap();

    assert_eq!(action, Action::requeue(RESYNC));
    let calls = h.server.verify();
    let volumes = calls[3].body["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap();
    let secrets: Vec<&serde_json::Value> =
        volumes.iter().map(|v| &v["secret"]["secretName"]).collect();
    assert!(
        secrets.contains(&&serde_json::json!("order-cancel-signing")),
        "{volumes:?}"
    );
}

#[tokio::test]
async fn the_operators_executor_ranges_reach_the_applied_deployment() {
    let config = finalized(fixtures::config("a"));
    let settings = DispatcherSettings {
        executor_deny_cidrs: vec!["10.0.0.0/16".parse().unwrap()],
        executor_allow_cidrs: vec!["10.0.5.0/24".parse().unwrap()],
        ..fixtures::settings()
    };
    let h = harness_with(&[&config], settings);
    expect_full_pass(&h.server, &config);
    h.server
        .expect("PATCH", format!("{CONFIGS}/a/status"), json_of(&config));

    reconcile(Arc::new(config), h.ctx.clone()).await.unwrap();

    let calls = h.server.verify();
    assert_eq!(calls[2].path, format!("{DEPLOYMENTS}/asyncd-dispatcher-a"));
    let env = calls[2].body["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    let value = |name: &str| {
        env.iter()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].clone())
    };
    assert_eq!(
        value("ASYNCD_EXECUTOR_DENY_CIDRS"),
        Some(json!("10.0.0.0/16"))
    );
    assert_eq!(
        value("ASYNCD_EXECUTOR_ALLOW_CIDRS"),
        Some(json!("10.0.5.0/24"))
    );
}

#[tokio::test]
async fn deletion_under_retain_policy_keeps_the_topic() {
    let doomed = deleting(fixtures::config("a"));
    let h = harness(&[&doomed]);
    h.admin.topics.lock().unwrap().insert("topic".into(), 6);
    expect_no_limiters(&h.server)
        .expect("PATCH", ROUTING, Reply::Echo)
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
    assert!(routing_keys(&calls[1]).is_empty());
    assert!(removes_the_finalizer(calls.last().unwrap()));
    assert!(h.admin.calls.lock().unwrap().is_empty());
    assert_eq!(h.admin.topics.lock().unwrap()["topic"], 6);
}

#[tokio::test]
async fn deleting_a_config_in_conflict_leaves_the_owners_topic() {
    let owner = finalized(fixtures::aged("b", 1, |s| s.task_type = "b".into()));
    let doomed = deleting(fixtures::aged("a", 2, |s| {
        s.kafka.as_mut().unwrap().delete_policy = DeletePolicy::Delete
    }));
    let h = harness(&[&owner, &doomed]);
    h.admin.topics.lock().unwrap().insert("topic".into(), 6);
    expect_no_limiters(&h.server)
        .expect("PATCH", ROUTING, Reply::Echo)
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
    assert_eq!(routing_keys(&calls[1]), ["b.yaml"]);
    assert!(h.admin.calls.lock().unwrap().is_empty());
    assert_eq!(h.admin.topics.lock().unwrap()["topic"], 6);
}

#[tokio::test]
async fn an_invalid_config_loses_its_route_and_reports_the_field() {
    let invalid = finalized(fixtures::config_with("a", |s| {
        s.executor.url = "ftp://nope".into()
    }));
    let h = harness(&[&invalid]);
    expect_no_limiters(&h.server)
        .expect("PATCH", ROUTING, Reply::Echo)
        .expect("PATCH", format!("{CONFIGS}/a/status"), json_of(&invalid));

    let action = reconcile(Arc::new(invalid), h.ctx.clone()).await.unwrap();

    assert_eq!(action, Action::requeue(RECHECK));
    let calls = h.server.verify();
    assert!(routing_keys(&calls[1]).is_empty());
    assert_eq!(
        conditions(&calls[2])[0],
        ("Ready".into(), "False".into(), "InvalidSpec".into())
    );
    let message: &Value = &calls[2].body["status"]["conditions"][0]["message"];
    assert!(
        message.as_str().unwrap().starts_with("spec.executor.url"),
        "{message}"
    );
    assert!(h.admin.calls.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_config_refused_by_its_claims_stays_out_of_the_route_another_pass_rebuilds() {
    // "a" was refused for a topic of another namespace by an earlier operator process (its
    // status says so); "b"'s pass, the first of this process, rebuilds the routing
    // ConfigMap: "a" must not be in it, or the api would produce into the other
    // namespace's topic
    let mut refused = finalized(fixtures::aged("a", 1, |s| s.task_type = "a".into()));
    refused.status = Some(crate::status::status(
        None,
        &crate::status::Verdict::Conflict(crate::conflicts::Conflict {
            owner: "other/x".into(),
            what: crate::conflicts::Claimed::Topic,
            value: "topic".into(),
        }),
        Some(1),
        "t",
    ));
    let owner = finalized(fixtures::aged("b", 2, |s| {
        s.task_type = "b".into();
        s.kafka.as_mut().unwrap().topic = "b".into();
    }));
    let h = harness(&[&refused, &owner]);
    h.admin.own(&["b", "b-high"], "shop/b");
    expect_full_pass(&h.server, &owner);
    h.server
        .expect("PATCH", format!("{CONFIGS}/b/status"), json_of(&owner));

    reconcile(Arc::new(owner), h.ctx.clone()).await.unwrap();

    let calls = h.server.verify();
    assert_eq!(routing_keys(&calls[1]), ["b.yaml"]);
}
