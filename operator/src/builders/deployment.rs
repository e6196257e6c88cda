//! The dispatcher Deployment `asyncd-dispatcher-<config>`: `asyncd dispatcher` reading its
//! route from the namespace's routing ConfigMap, owned by the config.
//!
//! `spec.replicas` is left out on purpose: the HPA owns it (an apply that set it would
//! fight the autoscaler).

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvFromSource, EnvVar,
    EnvVarSource, HTTPGetAction, ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec,
    Probe, ResourceRequirements, SecretEnvSource, SecretKeySelector, SecretVolumeSource,
    SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use kube::api::ObjectMeta;
use std::collections::BTreeMap;

use super::routing::ROUTING_CONFIGMAP;
use super::{DispatcherSettings, dispatcher_name, labels, selector_labels};
use crate::crd::AsyncJobConfig;

pub const METRICS_PORT: i32 = 7700;
/// Where dispatchers read signing keys (`asyncd --signing-dir`): the job's Secret is
/// mounted at `<this>/<secret name>`, so each key is `<this>/<secret name>/<key>`.
pub const SIGNING_DIR: &str = "/var/run/asyncd/signing";
const SIGNING_VOLUME: &str = "signing";

/// Where the dispatcher keeps its outcome journal (`asyncd --outcome-journal`): an
/// emptyDir, which a container's restart in the same pod keeps, so that a dispatcher
/// killed with outcomes unwritten (OOM, a liveness failure) writes them when it starts
/// again instead of its tasks running twice.
pub const OUTCOME_JOURNAL_DIR: &str = "/var/lib/asyncd/outcome-journal";
const OUTCOME_JOURNAL_VOLUME: &str = "outcome-journal";

/// The outcome journal's volume. Its size limit is above what the journal keeps (two
/// segments of at most 32 MiB): past it the kubelet would evict the pod.
fn outcome_journal_volume() -> (Volume, VolumeMount) {
    (
        Volume {
            name: OUTCOME_JOURNAL_VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource {
                size_limit: Some(Quantity("128Mi".into())),
                ..EmptyDirVolumeSource::default()
            }),
            ..Volume::default()
        },
        VolumeMount {
            name: OUTCOME_JOURNAL_VOLUME.into(),
            mount_path: OUTCOME_JOURNAL_DIR.into(),
            ..VolumeMount::default()
        },
    )
}

/// The job's own signing Secret, and nothing else, as a read-only volume. Optional: a
/// pod starts while the Secret is missing and the dispatcher holds the job's tasks back
/// (saying why) until the kubelet fills the volume; a rotated key reaches the running
/// pod the same way, without a rollout.
fn signing_volume(config: &AsyncJobConfig) -> Option<(Volume, VolumeMount)> {
    let secret = &config.spec.executor.signing.as_ref()?.secret_ref.name;
    Some((
        Volume {
            name: SIGNING_VOLUME.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.clone()),
                optional: Some(true),
                default_mode: Some(0o440),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        },
        VolumeMount {
            name: SIGNING_VOLUME.into(),
            mount_path: format!("{SIGNING_DIR}/{secret}"),
            read_only: Some(true),
            ..VolumeMount::default()
        },
    ))
}

/// The container's arguments (after the `asyncd` entrypoint). The store URL is not among
/// them: it holds the database password, which argv would show to every `ps` on the
/// node; `asyncd` reads it from `ASYNCD_STORE` (see [`build`]).
/// Group of the asyncd image's user (`USER 65532:65532` in dispatcher/Dockerfile).
pub const DISPATCHER_GID: i64 = 65532;

pub fn args(config: &AsyncJobConfig, settings: &DispatcherSettings) -> Vec<String> {
    vec![
        "dispatcher".into(),
        "--routing-configmap".into(),
        format!("{}/{ROUTING_CONFIGMAP}", config.namespace()),
        "--job".into(),
        config.name().into(),
        "--kafka-brokers".into(),
        settings.kafka_brokers.clone(),
        "--listen".into(),
        format!("0.0.0.0:{METRICS_PORT}"),
        "--signing-dir".into(),
        SIGNING_DIR.into(),
    ]
}

fn secret_env(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

fn probe(path: &str) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("metrics".into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(10),
        failure_threshold: Some(3),
        ..Probe::default()
    }
}

pub fn build(config: &AsyncJobConfig, settings: &DispatcherSettings) -> Deployment {
    let mut env = vec![secret_env("ASYNCD_STORE", &settings.store_secret, "url")];
    env.push(EnvVar {
        name: "ASYNCD_LOG".into(),
        value: Some("info".into()),
        ..EnvVar::default()
    });
    // A cluster's log collector parses JSON lines; an attempt's carry the task's fields.
    env.push(EnvVar {
        name: "ASYNCD_LOG_FORMAT".into(),
        value: Some("json".into()),
        ..EnvVar::default()
    });
    // Executors of long tasks call back on the pod's own address; the dispatcher refuses
    // to advertise the 0.0.0.0 it listens on.
    env.push(EnvVar {
        name: "ASYNCD_POD_IP".into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "status.podIP".into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    });
    env.push(EnvVar {
        name: "ASYNCD_ADVERTISE_URL".into(),
        value: Some(format!("http://$(ASYNCD_POD_IP):{METRICS_PORT}")),
        ..EnvVar::default()
    });
    // Left out when empty, so a Deployment built without them is the one built before
    // these settings existed and does not roll.
    for (name, ranges) in [
        ("ASYNCD_EXECUTOR_DENY_CIDRS", &settings.executor_deny_cidrs),
        (
            "ASYNCD_EXECUTOR_ALLOW_CIDRS",
            &settings.executor_allow_cidrs,
        ),
    ] {
        if ranges.is_empty() {
            continue;
        }
        let ranges: Vec<String> = ranges.iter().map(ToString::to_string).collect();
        env.push(EnvVar {
            name: name.into(),
            value: Some(ranges.join(",")),
            ..EnvVar::default()
        });
    }
    if let Some(timeout) = settings.store_timeout {
        env.push(EnvVar {
            name: "ASYNCD_STORE_TIMEOUT".into(),
            value: Some(asyncd_spec::format_duration(timeout)),
            ..EnvVar::default()
        });
    }
    env.push(EnvVar {
        name: "ASYNCD_OUTCOME_JOURNAL".into(),
        value: Some(OUTCOME_JOURNAL_DIR.into()),
        ..EnvVar::default()
    });
    let (journal_volume, journal_mount) = outcome_journal_volume();
    let signing = signing_volume(config);
    let mut volumes = vec![journal_volume];
    let mut volume_mounts = vec![journal_mount];
    if let Some((volume, mount)) = signing {
        volumes.push(volume);
        volume_mounts.push(mount);
    }
    let container = Container {
        name: "dispatcher".into(),
        image: Some(settings.image.clone()),
        image_pull_policy: settings.image_pull_policy.clone(),
        command: Some(vec!["asyncd".into()]),
        args: Some(args(config, settings)),
        env: Some(env),
        // Kafka TLS and SASL settings, the password among them: variables, never args.
        env_from: settings.kafka_secret.as_ref().map(|name| {
            vec![EnvFromSource {
                secret_ref: Some(SecretEnvSource {
                    name: name.clone(),
                    optional: Some(false),
                }),
                ..EnvFromSource::default()
            }]
        }),
        ports: Some(vec![ContainerPort {
            name: Some("metrics".into()),
            container_port: METRICS_PORT,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        }]),
        liveness_probe: Some(probe("/healthz")),
        readiness_probe: Some(probe("/readyz")),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".into(), Quantity("100m".into())),
                ("memory".into(), Quantity("64Mi".into())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".into(),
                Quantity("512Mi".into()),
            )])),
            ..ResourceRequirements::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(volume_mounts),
        ..Container::default()
    };
    let pod_annotations = BTreeMap::from([
        ("prometheus.io/scrape".to_string(), "true".to_string()),
        ("prometheus.io/port".to_string(), METRICS_PORT.to_string()),
        ("prometheus.io/path".to_string(), "/metrics".to_string()),
    ]);
    Deployment {
        metadata: ObjectMeta {
            name: Some(dispatcher_name(config)),
            namespace: Some(config.namespace().into()),
            labels: Some(labels(config)),
            owner_references: config.controller_owner_ref(&()).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: Some(DeploymentSpec {
            selector: LabelSelector {
                match_labels: Some(selector_labels(config)),
                ..LabelSelector::default()
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                ..DeploymentStrategy::default()
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(config)),
                    annotations: Some(pod_annotations),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(settings.service_account.clone()),
                    // in-flight attempts get this long to finish on a rollout or scale-in
                    termination_grace_period_seconds: Some(60),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        // the asyncd image's user (65532:65532) reads the signing Secret
                        // (mode 0440) through its group: the kubelet gives the files to
                        // the fsGroup. Without it the key is root's and the job is never
                        // dispatched (found by e2e/cluster.sh, the first run in real pods).
                        fs_group: Some(DISPATCHER_GID),
                        seccomp_profile: Some(k8s_openapi::api::core::v1::SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            ..Default::default()
                        }),
                        ..PodSecurityContext::default()
                    }),
                    containers: vec![container],
                    volumes: Some(volumes),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    #[test]
    fn runs_the_dispatcher_for_this_job_from_the_routing_configmap() {
        let config = fixtures::sample("order-cancel-job.yaml");
        let settings = fixtures::settings();
        let d = build(&config, &settings);
        assert_eq!(
            d.metadata.name.as_deref(),
            Some("asyncd-dispatcher-order-cancel-job")
        );
        assert_eq!(d.metadata.namespace.as_deref(), Some(fixtures::NAMESPACE));
        let spec = d.spec.unwrap();
        assert_eq!(spec.replicas, None, "the HPA owns replicas");
        let pod = spec.template.spec.unwrap();
        assert_eq!(
            pod.service_account_name.as_deref(),
            Some("asyncd-dispatcher")
        );
        // the image's user reads the 0440 signing Secret through the fsGroup
        let psc = pod.security_context.as_ref().unwrap();
        assert_eq!(psc.fs_group, Some(65532));
        assert_eq!(psc.run_as_non_root, Some(true));
        let c = &pod.containers[0];
        assert_eq!(c.image.as_deref(), Some("registry.example/asyncd:1.2.3"));
        assert_eq!(
            c.args.as_ref().unwrap().join(" "),
            "dispatcher --routing-configmap shop/asyncd-routing --job order-cancel-job \
             --kafka-brokers kafka-0:9092,kafka-1:9092 --listen 0.0.0.0:7700 \
             --signing-dir /var/run/asyncd/signing"
        );
        assert_eq!(c.ports.as_ref().unwrap()[0].container_port, 7700);
        let env = c.env.as_ref().unwrap();
        let store = env[0]
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!(
            (
                env[0].name.as_str(),
                store.name.as_str(),
                store.key.as_str()
            ),
            ("ASYNCD_STORE", "asyncd-store", "url")
        );
        // JSON log lines for the cluster's log collector
        let format = env
            .iter()
            .find(|e| e.name == "ASYNCD_LOG_FORMAT")
            .expect("the log format is set");
        assert_eq!(format.value.as_deref(), Some("json"));
        // executors call back on the pod's address, defined before it is referenced
        let names: Vec<&str> = env.iter().map(|e| e.name.as_str()).collect();
        let pod_ip = names.iter().position(|n| *n == "ASYNCD_POD_IP").unwrap();
        let advertise = names
            .iter()
            .position(|n| *n == "ASYNCD_ADVERTISE_URL")
            .unwrap();
        assert!(pod_ip < advertise);
        assert_eq!(
            env[pod_ip]
                .value_from
                .as_ref()
                .unwrap()
                .field_ref
                .as_ref()
                .unwrap()
                .field_path,
            "status.podIP"
        );
        assert_eq!(
            env[advertise].value.as_deref(),
            Some("http://$(ASYNCD_POD_IP):7700")
        );
        // the sample signs calls: its own Secret, and only it, is mounted read-only
        // where --signing-dir points, optional so the pod starts while it is missing
        assert!(
            c.args
                .as_ref()
                .unwrap()
                .join(" ")
                .ends_with("--signing-dir /var/run/asyncd/signing"),
        );
        // mounted after the outcome journal's emptyDir, which every dispatcher has
        let mounts = c.volume_mounts.as_ref().unwrap();
        assert_eq!(mounts.len(), 2);
        assert_eq!(
            (mounts[1].mount_path.as_str(), mounts[1].read_only),
            ("/var/run/asyncd/signing/order-cancel-signing", Some(true))
        );
        let volumes = pod.volumes.as_ref().unwrap();
        assert_eq!(volumes.len(), 2);
        assert_eq!(volumes[1].name, mounts[1].name);
        let secret = volumes[1].secret.as_ref().unwrap();
        assert_eq!(
            (
                secret.secret_name.as_deref(),
                secret.optional,
                secret.items.as_ref()
            ),
            (Some("order-cancel-signing"), Some(true), None)
        );
        // no secret reaches the pod through its environment but the store URL
        let from_secrets: Vec<&str> = env
            .iter()
            .filter(|e| {
                e.value_from
                    .as_ref()
                    .is_some_and(|v| v.secret_key_ref.is_some())
            })
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(from_secrets, ["ASYNCD_STORE"]);
    }

    #[test]
    fn each_job_mounts_only_its_own_signing_secret_and_unsigned_jobs_none() {
        let mut a = fixtures::sample("order-cancel-job.yaml");
        a.metadata.name = Some("job-a".into());
        let mut b = a.clone();
        b.metadata.name = Some("job-b".into());
        b.spec.0.executor.signing.as_mut().unwrap().secret_ref.name = "job-b-signing".into();
        let secrets = |config: &AsyncJobConfig| -> Vec<String> {
            let pod = build(config, &fixtures::settings())
                .spec
                .unwrap()
                .template
                .spec
                .unwrap();
            pod.volumes
                .unwrap_or_default()
                .iter()
                .filter_map(|v| v.secret.as_ref()?.secret_name.clone())
                .collect()
        };
        assert_eq!(secrets(&a), ["order-cancel-signing"]);
        assert_eq!(secrets(&b), ["job-b-signing"]);
        let unsigned = fixtures::config("job-c");
        assert!(unsigned.spec.executor.signing.is_none());
        assert!(secrets(&unsigned).is_empty());
        let pod = build(&unsigned, &fixtures::settings())
            .spec
            .unwrap()
            .template
            .spec
            .unwrap();
        let mounts: Vec<&str> = pod.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.mount_path.as_str())
            .collect();
        assert_eq!(mounts, [OUTCOME_JOURNAL_DIR], "the outcome journal only");
    }

    #[test]
    fn every_dispatcher_keeps_its_outcome_journal_on_a_bounded_emptydir() {
        let pod = build(&fixtures::config("job-a"), &fixtures::settings())
            .spec
            .unwrap()
            .template
            .spec
            .unwrap();
        let container = &pod.containers[0];
        let env = container.env.as_ref().unwrap();
        let journal = env
            .iter()
            .find(|e| e.name == "ASYNCD_OUTCOME_JOURNAL")
            .and_then(|e| e.value.as_deref());
        assert_eq!(journal, Some(OUTCOME_JOURNAL_DIR));
        let mount = container
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == OUTCOME_JOURNAL_DIR)
            .expect("mounted");
        assert_ne!(mount.read_only, Some(true), "the journal is written");
        let volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == mount.name)
            .expect("a volume");
        let empty_dir = volume.empty_dir.as_ref().expect("an emptyDir");
        assert_eq!(empty_dir.size_limit, Some(Quantity("128Mi".into())));
    }

    #[test]
    fn secrets_reach_the_dispatcher_as_variables_never_as_arguments() {
        let config = fixtures::config("order-cancel-job");
        let mut settings = fixtures::settings();
        let plain = build(&config, &settings);
        let c = &plain.spec.unwrap().template.spec.unwrap().containers[0];
        assert_eq!(c.env_from, None, "no Kafka Secret unless one is named");
        let args = c.args.as_ref().unwrap().join(" ");
        assert!(
            !args.contains("--store") && !args.contains("ASYNCD_STORE"),
            "{args}"
        );

        settings.kafka_secret = Some("asyncd-kafka".into());
        let d = build(&config, &settings);
        let c = &d.spec.unwrap().template.spec.unwrap().containers[0];
        let from = c.env_from.as_ref().unwrap();
        let secret = from[0].secret_ref.as_ref().unwrap();
        assert_eq!(
            (secret.name.as_str(), secret.optional),
            ("asyncd-kafka", Some(false))
        );
        assert!(!c.args.as_ref().unwrap().join(" ").contains("sasl"));
    }

    /// The value of the dispatcher container's variable `name`, if it has one.
    fn env_value(d: Deployment, name: &str) -> Option<String> {
        let pod = d.spec.unwrap().template.spec.unwrap();
        let env = pod.containers[0].env.clone().unwrap_or_default();
        let found: Vec<&EnvVar> = env.iter().filter(|e| e.name == name).collect();
        assert!(found.len() <= 1, "{name} set twice: {found:?}");
        found
            .first()
            .map(|e| e.value.clone().expect("a plain value"))
    }

    #[test]
    fn the_operators_executor_ranges_reach_the_dispatcher_only_when_set() {
        let config = fixtures::config("job-a");
        let unset = build(&config, &fixtures::settings());
        assert_eq!(env_value(unset.clone(), "ASYNCD_EXECUTOR_DENY_CIDRS"), None);
        assert_eq!(env_value(unset, "ASYNCD_EXECUTOR_ALLOW_CIDRS"), None);

        let mut settings = fixtures::settings();
        settings.executor_deny_cidrs =
            vec!["10.0.0.0/16".parse().unwrap(), "fd00::/8".parse().unwrap()];
        let deny_only = build(&config, &settings);
        assert_eq!(
            env_value(deny_only.clone(), "ASYNCD_EXECUTOR_DENY_CIDRS").as_deref(),
            Some("10.0.0.0/16,fd00::/8")
        );
        assert_eq!(env_value(deny_only, "ASYNCD_EXECUTOR_ALLOW_CIDRS"), None);

        settings.executor_allow_cidrs = vec!["10.0.5.0/24".parse().unwrap()];
        let both = build(&config, &settings);
        assert_eq!(
            env_value(both.clone(), "ASYNCD_EXECUTOR_DENY_CIDRS").as_deref(),
            Some("10.0.0.0/16,fd00::/8")
        );
        assert_eq!(
            env_value(both.clone(), "ASYNCD_EXECUTOR_ALLOW_CIDRS").as_deref(),
            Some("10.0.5.0/24")
        );
        // plain values, not arguments: the dispatcher's argv stays as it was
        let args = both.spec.unwrap().template.spec.unwrap().containers[0]
            .args
            .clone()
            .unwrap()
            .join(" ");
        assert!(!args.contains("executor"), "{args}");
    }

    #[test]
    fn the_operators_store_timeout_reaches_the_dispatcher_only_when_set() {
        let config = fixtures::config("job-a");
        let unset = build(&config, &fixtures::settings());
        // Unset, the Deployment is the one built before the setting existed: no roll.
        assert_eq!(env_value(unset, "ASYNCD_STORE_TIMEOUT"), None);
        let mut settings = fixtures::settings();
        settings.store_timeout = Some(std::time::Duration::from_millis(4_500));
        let set = build(&config, &settings);
        let value = env_value(set, "ASYNCD_STORE_TIMEOUT").expect("set");
        // In a form the dispatcher's own parser reads back as the same bound.
        assert_eq!(
            asyncd_spec::parse_duration(&value),
            Ok(std::time::Duration::from_millis(4_500)),
            "{value}"
        );
    }

    #[test]
    fn is_owned_by_the_config_and_selects_its_pods() {
        let config = fixtures::config("job-a");
        let d = build(&config, &fixtures::settings());
        let owner = &d.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.kind, "AsyncJobConfig");
        assert_eq!(owner.name, "job-a");
        assert_eq!(owner.controller, Some(true));
        let spec = d.spec.unwrap();
        let selector = spec.selector.match_labels.unwrap();
        let pod_labels = spec.template.metadata.unwrap().labels.unwrap();
        for (k, v) in &selector {
            assert_eq!(pod_labels.get(k), Some(v));
        }
        assert_eq!(
            selector.get("asyncd.example.io/job").map(String::as_str),
            Some("job-a")
        );
    }
}
