//! Test data: configs shaped like the committed samples, in namespace `shop`, and a
//! scripted API server for reconcile scenarios.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use asyncd_spec::job::{ExecutorSpec, KafkaSpec};
use asyncd_spec::{JobSpec, LimiterSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ObjectMeta;

use crate::builders::DispatcherSettings;
use crate::crd::{AsyncJobConfig, AsyncJobConfigSpec, AsyncLimiter, AsyncLimiterSpec};

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

/// An AsyncLimiter of namespace `shop`, its spec empty before `edit`.
pub fn limiter(name: &str, edit: impl FnOnce(&mut LimiterSpec)) -> AsyncLimiter {
    let mut spec = LimiterSpec::default();
    edit(&mut spec);
    let mut limiter = AsyncLimiter::new(name, AsyncLimiterSpec(spec));
    limiter.metadata = meta(name, 0);
    limiter
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

/// A scripted API server (kube-rs controller-rs's `fixtures.rs` pattern): a [`kube::Client`]
/// whose every request must be the next one the script expects. An unexpected call is
/// answered 500 and recorded, and [`ApiServer::verify`] fails on it or on an expected call
/// that never came. Events (`events.k8s.io`) are not scripted but collected, so a test
/// asserts their reasons (once per publish) instead of their order among the other calls.
#[derive(Clone, Default)]
pub struct ApiServer {
    state: Arc<Mutex<Script>>,
}

#[derive(Default)]
struct Script {
    expected: VecDeque<Expected>,
    calls: Vec<Call>,
    unexpected: Vec<String>,
    events: Vec<String>,
}

struct Expected {
    method: &'static str,
    path: String,
    reply: Reply,
}

/// How the server answers an expected call.
pub enum Reply {
    /// 200 with this body.
    Json(serde_json::Value),
    /// 200 with the request's own body (a server-side apply of a full object).
    Echo,
    /// An error `Status` with this code.
    Status(u16),
}

/// A request the server accepted, with its parsed JSON body.
#[derive(Clone, Debug)]
pub struct Call {
    pub method: String,
    pub path: String,
    pub body: serde_json::Value,
}

impl ApiServer {
    /// The server and a client talking to it.
    pub fn start() -> (Self, kube::Client) {
        let server = Self::default();
        let handler = server.clone();
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let handler = handler.clone();
            async move { Ok::<_, std::convert::Infallible>(handler.answer(request).await) }
        });
        (server, kube::Client::new(service, NAMESPACE))
    }

    /// Expects `method path` next (the path without the query string).
    pub fn expect(&self, method: &'static str, path: impl Into<String>, reply: Reply) -> &Self {
        self.state.lock().unwrap().expected.push_back(Expected {
            method,
            path: path.into(),
            reply,
        });
        self
    }

    async fn answer(
        &self,
        request: http::Request<kube::client::Body>,
    ) -> http::Response<kube::client::Body> {
        let method = request.method().to_string();
        let path = request.uri().path().to_string();
        let bytes = request
            .into_body()
            .collect_bytes()
            .await
            .unwrap_or_default();
        let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        let mut script = self.state.lock().unwrap();
        // a repeated Event is a PATCH of its series
        if path.starts_with("/apis/events.k8s.io/") {
            script
                .events
                .push(body["reason"].as_str().unwrap_or_default().to_string());
            return respond(200, &body);
        }
        let next = script.expected.front();
        if next.is_none_or(|e| e.method != method || e.path != path) {
            let wanted = next.map_or("nothing".to_string(), |e| {
                format!("{} {}", e.method, e.path)
            });
            script
                .unexpected
                .push(format!("{method} {path} (expected {wanted})"));
            return respond(500, &status_body(500));
        }
        let expected = script.expected.pop_front().unwrap();
        script.calls.push(Call {
            method,
            path,
            body: body.clone(),
        });
        match expected.reply {
            Reply::Json(value) => respond(200, &value),
            Reply::Echo => respond(200, &body),
            Reply::Status(code) => respond(code, &status_body(code)),
        }
    }

    /// Fails on any unexpected or missing call; returns the calls made, in order.
    pub fn verify(&self) -> Vec<Call> {
        let script = self.state.lock().unwrap();
        let missing: Vec<String> = script
            .expected
            .iter()
            .map(|e| format!("{} {}", e.method, e.path))
            .collect();
        assert!(
            script.unexpected.is_empty() && missing.is_empty(),
            "unexpected calls: {:#?}\nexpected calls that never came: {missing:#?}",
            script.unexpected
        );
        script.calls.clone()
    }

    /// The reasons of the Events published so far.
    pub fn events(&self) -> Vec<String> {
        self.state.lock().unwrap().events.clone()
    }
}

fn status_body(code: u16) -> serde_json::Value {
    let reason = match code {
        404 => "NotFound",
        409 => "Conflict",
        _ => "InternalError",
    };
    serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("scripted {code}"), "reason": reason, "code": code,
    })
}

fn respond(code: u16, body: &serde_json::Value) -> http::Response<kube::client::Body> {
    http::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(serde_json::to_vec(body).unwrap()))
        .unwrap()
}
