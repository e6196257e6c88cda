//! The dispatcher's HorizontalPodAutoscaler (autoscaling/v2) on *due* work.
//!
//! It follows the Pods metric `asyncd_due_backlog` (tasks already due and not yet
//! dispatched, per pod), not Kafka consumer lag: lag also counts tasks parked in the topic
//! until their ETA, which no extra replica can dispatch any sooner. More consumers than
//! partitions would sit idle, so max replicas is clamped to the topic's partitions.

use asyncd_spec::job::ScalingSpec;
use k8s_openapi::api::autoscaling::v2::{
    CrossVersionObjectReference, HPAScalingPolicy, HPAScalingRules, HorizontalPodAutoscaler,
    HorizontalPodAutoscalerBehavior, HorizontalPodAutoscalerSpec, MetricIdentifier, MetricSpec,
    MetricTarget, PodsMetricSource,
};
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Resource;
use kube::api::ObjectMeta;

use super::{dispatcher_name, labels};
use crate::crd::AsyncJobConfig;

pub const METRIC: &str = "asyncd_due_backlog";
pub const DEFAULT_TARGET_DUE_BACKLOG: u32 = 100;
pub const DEFAULT_MIN_REPLICAS: u32 = 1;
pub const DEFAULT_SCALE_DOWN_STABILIZATION_SECONDS: u32 = 300;
/// The label of `asyncd_due_backlog` naming the task type: every dispatcher reports the
/// due backlog of every type in the store, so the HPA selects its own job's.
pub const TASK_TYPE_LABEL: &str = "task_type";

/// Replica bounds after defaults and the partition clamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub min: u32,
    pub max: u32,
    /// The max asked, when the partitions clamped it.
    pub clamped_from: Option<u32>,
}

/// `min` defaults to 1; `max` to the partitions (or to `min` without a topic); a max above
/// the partitions is clamped to them, and a min above that follows it down.
pub fn bounds(scaling: Option<&ScalingSpec>, partitions: Option<u32>) -> Bounds {
    let min = scaling
        .and_then(|s| s.min_replicas)
        .unwrap_or(DEFAULT_MIN_REPLICAS)
        .max(1);
    let asked_max = scaling.and_then(|s| s.max_replicas);
    let mut max = asked_max.unwrap_or(partitions.unwrap_or(min)).max(1);
    let mut clamped_from = None;
    if let Some(partitions) = partitions
        && max > partitions
    {
        clamped_from = Some(max);
        max = partitions.max(1);
    }
    Bounds {
        min: min.min(max),
        max,
        clamped_from: clamped_from.filter(|_| asked_max.is_some()),
    }
}

pub fn target_due_backlog(scaling: Option<&ScalingSpec>) -> u32 {
    scaling
        .and_then(|s| s.target_due_backlog)
        .unwrap_or(DEFAULT_TARGET_DUE_BACKLOG)
        .max(1)
}

pub fn scale_down_stabilization_seconds(scaling: Option<&ScalingSpec>) -> u32 {
    scaling
        .and_then(|s| s.scale_down_stabilization_seconds)
        .unwrap_or(DEFAULT_SCALE_DOWN_STABILIZATION_SECONDS)
}

pub fn build(config: &AsyncJobConfig, bounds: Bounds) -> HorizontalPodAutoscaler {
    let name = dispatcher_name(config);
    let target = target_due_backlog(config.spec.scaling.as_ref());
    let stabilization = scale_down_stabilization_seconds(config.spec.scaling.as_ref());
    HorizontalPodAutoscaler {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(config.namespace().into()),
            labels: Some(labels(config)),
            owner_references: config.controller_owner_ref(&()).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: HorizontalPodAutoscalerSpec {
            scale_target_ref: CrossVersionObjectReference {
                api_version: Some("apps/v1".into()),
                kind: "Deployment".into(),
                name,
            },
            min_replicas: Some(bounds.min as i32),
            max_replicas: bounds.max as i32,
            metrics: Some(vec![MetricSpec {
                type_: "Pods".into(),
                pods: Some(PodsMetricSource {
                    metric: MetricIdentifier {
                        name: METRIC.into(),
                        selector: Some(LabelSelector {
                            match_labels: Some(BTreeMap::from([(
                                TASK_TYPE_LABEL.to_string(),
                                config.spec.task_type.clone(),
                            )])),
                            ..LabelSelector::default()
                        }),
                    },
                    target: MetricTarget {
                        type_: "AverageValue".into(),
                        average_value: Some(Quantity(target.to_string())),
                        ..MetricTarget::default()
                    },
                }),
                ..MetricSpec::default()
            }]),
            // scale in slowly: a dispatcher leaving hands its partitions and claims over
            behavior: Some(HorizontalPodAutoscalerBehavior {
                scale_down: Some(HPAScalingRules {
                    stabilization_window_seconds: Some(stabilization as i32),
                    policies: Some(vec![HPAScalingPolicy {
                        type_: "Pods".into(),
                        value: 1,
                        period_seconds: 60,
                    }]),
                    ..HPAScalingRules::default()
                }),
                ..HorizontalPodAutoscalerBehavior::default()
            }),
        },
        ..HorizontalPodAutoscaler::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    fn scaling(min: Option<u32>, max: Option<u32>) -> ScalingSpec {
        ScalingSpec {
            min_replicas: min,
            max_replicas: max,
            ..ScalingSpec::default()
        }
    }

    #[test]
    fn defaults_are_one_to_the_partitions() {
        let b = bounds(None, Some(6));
        assert_eq!((b.min, b.max, b.clamped_from), (1, 6, None));
        let b = bounds(None, None);
        assert_eq!((b.min, b.max), (1, 1));
    }

    #[test]
    fn max_is_clamped_to_the_partitions() {
        let b = bounds(Some(&scaling(Some(2), Some(20))), Some(6));
        assert_eq!((b.min, b.max, b.clamped_from), (2, 6, Some(20)));
        // a min above the partitions follows the max down
        let b = bounds(Some(&scaling(Some(8), Some(10))), Some(4));
        assert_eq!((b.min, b.max), (4, 4));
        // within bounds: untouched
        let b = bounds(Some(&scaling(Some(2), Some(4))), Some(12));
        assert_eq!((b.min, b.max, b.clamped_from), (2, 4, None));
        // no topic: nothing to clamp to
        let b = bounds(Some(&scaling(Some(2), Some(40))), None);
        assert_eq!((b.min, b.max, b.clamped_from), (2, 40, None));
    }

    #[test]
    fn targets_the_due_backlog_per_pod() {
        let config = fixtures::config_with("job-a", |s| {
            s.scaling = Some(ScalingSpec {
                min_replicas: Some(2),
                max_replicas: Some(3),
                target_due_backlog: Some(250),
                scale_down_stabilization_seconds: Some(30),
            })
        });
        let hpa = build(&config, bounds(config.spec.scaling.as_ref(), Some(6)));
        assert_eq!(
            hpa.metadata.name.as_deref(),
            Some("asyncd-dispatcher-job-a")
        );
        let spec = hpa.spec;
        assert_eq!(spec.scale_target_ref.kind, "Deployment");
        assert_eq!(spec.scale_target_ref.name, "asyncd-dispatcher-job-a");
        assert_eq!((spec.min_replicas, spec.max_replicas), (Some(2), 3));
        let metric = spec.metrics.unwrap().remove(0);
        assert_eq!(metric.type_, "Pods");
        let pods = metric.pods.unwrap();
        assert_eq!(pods.metric.name, "asyncd_due_backlog");
        assert_eq!(pods.target.type_, "AverageValue");
        assert_eq!(pods.target.average_value, Some(Quantity("250".into())));
        // this job's task type only
        let selector = pods.metric.selector.unwrap().match_labels.unwrap();
        assert_eq!(
            selector.get("task_type").map(String::as_str),
            Some(config.spec.task_type.as_str())
        );
        let down = spec.behavior.unwrap().scale_down.unwrap();
        assert_eq!(down.stabilization_window_seconds, Some(30));
        // default target
        let config = fixtures::config("job-b");
        let pods = build(&config, bounds(None, Some(6)))
            .spec
            .metrics
            .unwrap()
            .remove(0)
            .pods
            .unwrap();
        assert_eq!(pods.target.average_value, Some(Quantity("100".into())));
        let hpa = build(&config, bounds(None, Some(6)));
        let down = hpa.spec.behavior.unwrap().scale_down.unwrap();
        assert_eq!(down.stabilization_window_seconds, Some(300));
    }
}
