//! Test data: configs shaped like the committed samples, in namespace `shop`.

use asyncd_spec::JobSpec;
use asyncd_spec::job::{ExecutorSpec, KafkaSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ObjectMeta;

use crate::builders::DispatcherSettings;
use crate::crd::{AsyncJobConfig, AsyncJobConfigSpec};

pub const NAMESPACE: &str = "shop";

pub fn spec() -> JobSpec {
    JobSpec {
        task_type: "t0".into(),
        executor: ExecutorSpec {
            url: "http://svc.shop.svc:8080/run".into(),
            ..ExecutorSpec::default()
        },
        kafka: Some(KafkaSpec {
            topic: "topic".into(),
            partitions: 6,
            ..KafkaSpec::default()
        }),
        ..JobSpec::default()
    }
}

fn meta(name: &str, created_secs: i64) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(NAMESPACE.into()),
        uid: Some(format!("uid-{name}")),
        generation: Some(1),
        creation_timestamp: Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + created_secs).unwrap(),
        )),
        ..ObjectMeta::default()
    }
}

pub fn config(name: &str) -> AsyncJobConfig {
    config_with(name, |_| {})
}

pub fn config_with(name: &str, edit: impl FnOnce(&mut JobSpec)) -> AsyncJobConfig {
    aged(name, 0, edit)
}

/// A config created `created_secs` after a fixed instant.
pub fn aged(name: &str, created_secs: i64, edit: impl FnOnce(&mut JobSpec)) -> AsyncJobConfig {
    let mut spec = spec();
    edit(&mut spec);
    let mut config = AsyncJobConfig::new(name, AsyncJobConfigSpec(spec));
    config.metadata = meta(name, created_secs);
    config
}

/// A committed sample from `config/samples/`, as the API server would hand it over.
pub fn sample(file: &str) -> AsyncJobConfig {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../config/samples")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut config: AsyncJobConfig = serde_yaml::from_str(&text).unwrap();
    let name = config.name().to_string();
    config.metadata = meta(&name, 0);
    config
}

pub fn settings() -> DispatcherSettings {
    DispatcherSettings {
        image: "registry.example/asyncd:1.2.3".into(),
        kafka_brokers: "kafka-0:9092,kafka-1:9092".into(),
        ..DispatcherSettings::default()
    }
}
