//! Issue 31, signed Kafka messages: with `--kafka-signing-key-file`, the API signs what it
//! produces and the consumer takes only messages signed for their topic with one of the
//! keys, so a principal that may write a job's topic but holds no key cannot enqueue.
//! Against the real broker, with the real `asyncd dev` binary; and the flag's refusals.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use asyncd::kafka::MessageKeys;
use base64::Engine;
use serde_json::json;

use crate::kafka_path::{brokers, kafka_job, topic_of};
use crate::support::*;

/// The key the API signs with, and the one it is being rotated from: both verify.
const KEY: &str = "c0a1f5b28e7d4a6b9f3e2d1c0b9a8f7e6d5c4b3a29180716f5e4d3c2b1a09f8e";
const OLD_KEY: &str = "9d8c7b6a5f4e3d2c1b0a99887766554433221100ffeeddccbbaa998877665544";
const OTHER_KEY: &str = "0000000000000000000000000000000000000000000000000000000000000001";

fn keys(text: &str) -> MessageKeys {
    MessageKeys::parse(text).unwrap()
}

/// A task envelope that passes every check of the envelope itself (its job's type, an id
/// the API would give, every field within bounds): only its signature decides.
fn envelope(task_type: &str) -> (String, Vec<u8>) {
    let id = uuid::Uuid::now_v7().to_string();
    let now = chrono::Utc::now().timestamp_millis();
    let value = json!({"id": id, "type": task_type, "payload": {"straight": true},
        "priority": 0, "trigger_at": now, "max_retries": 0, "timeout_ms": 10_000});
    (id, serde_json::to_vec(&value).unwrap())
}

/// Produces `value` to `topic` with the given `asyncd-signature` header values; returns
/// its offset.
async fn produce(topic: &str, value: &[u8], signatures: &[String]) -> i64 {
    use rdkafka::message::{Header, OwnedHeaders};
    let producer: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap();
    let mut headers = OwnedHeaders::new();
    for signature in signatures {
        headers = headers.insert(Header {
            key: asyncd::kafka::SIGNATURE_HEADER,
            value: Some(signature.as_str()),
        });
    }
    let record = rdkafka::producer::FutureRecord::<(), [u8]>::to(topic)
        .payload(value)
        .headers(headers);
    let delivered = producer
        .send(record, Duration::from_secs(10))
        .await
        .unwrap();
    delivered.offset
}

/// A message produced straight to the topic without a signature, or with one made with a
/// key the dispatcher does not hold, for another topic, or over other bytes, is a dead
/// letter saying so and counted by reason; no task comes of it. A task submitted through
/// the API runs, and so does a message signed with the older key of the list.
#[tokio::test]
async fn only_messages_signed_for_their_topic_become_tasks() {
    let Some(_broker) = Broker::shared().await else {
        return;
    };
    let executor = Executor::start(|_| Answer::ok()).await;
    let job = kafka_job("signed", &executor.url(), 1);
    let topic = topic_of(&job);
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("kafka-signing-key");
    // As a mounted Secret holds it: the signing key first, the older one still verifying.
    std::fs::write(&key_file, format!("{KEY}\n{OLD_KEY}\n")).unwrap();
    let key_file = key_file.display().to_string();
    let asyncd = Asyncd::start(
        &[("job.yaml", job)],
        &[
            "--kafka-brokers",
            &brokers(),
            "--create-topics",
            "--kafka-signing-key-file",
            &key_file,
        ],
    )
    .await;

    // Through the API: signed, consumed, run. The topic is created on start; the first
    // produce may race it, so wait for a 201.
    let first = wait_for("the first submit through Kafka", DEADLINE, async || {
        let (status, answer) = asyncd
            .post(
                "/v1/tasks",
                json!({"type": "signed", "payload": "through the API"}),
            )
            .await;
        (status == 201).then_some(answer)
    })
    .await;
    assert_eq!(first["route"], "kafka", "{first}");
    executor.wait_calls(first["id"].as_str().unwrap(), 1).await;

    let (unsigned, unsigned_value) = envelope("signed");
    let (foreign_key, foreign_key_value) = envelope("signed");
    let (other_topic, other_topic_value) = envelope("signed");
    let (tampered, tampered_value) = envelope("signed");
    let (rotated, rotated_value) = envelope("signed");
    let mut refused = vec![
        (
            produce(&topic, &unsigned_value, &[]).await,
            "unsigned",
            unsigned_value.clone(),
        ),
        (
            produce(
                &topic,
                &foreign_key_value,
                &[keys(OTHER_KEY).sign(&topic, &foreign_key_value)],
            )
            .await,
            "bad signature",
            foreign_key_value.clone(),
        ),
        (
            // Right key, captured from another job's topic.
            produce(
                &topic,
                &other_topic_value,
                &[keys(KEY).sign("asyncd-test-payments", &other_topic_value)],
            )
            .await,
            "bad signature",
            other_topic_value.clone(),
        ),
        (
            // A valid signature of other bytes: the job's own task, its payload changed.
            produce(
                &topic,
                &tampered_value,
                &[keys(KEY).sign(&topic, &unsigned_value)],
            )
            .await,
            "bad signature",
            tampered_value.clone(),
        ),
    ];
    refused.sort();
    // Signed by a holder of the older key, still in the list: taken.
    produce(
        &topic,
        &rotated_value,
        &[keys(OLD_KEY).sign(&topic, &rotated_value)],
    )
    .await;
    let behind = asyncd
        .submit(json!({"type": "signed", "payload": "behind them"}))
        .await;
    executor.wait_calls(&behind, 1).await;
    executor.wait_calls(&rotated, 1).await;

    let letters = wait_for("the four dead letters", DEADLINE, async || {
        let (status, answer) = asyncd.get("/v1/kafka-dead-letters?job=signed").await;
        assert_eq!(status, 200, "{answer}");
        let items = answer["items"].as_array().unwrap().clone();
        (items.len() >= 4).then_some(items)
    })
    .await;
    let mut found: Vec<(i64, String, Vec<u8>)> = letters
        .iter()
        .map(|letter| {
            (
                letter["offset"].as_i64().unwrap(),
                letter["reason"].as_str().unwrap().to_string(),
                base64::engine::general_purpose::STANDARD
                    .decode(letter["message_base64"].as_str().unwrap())
                    .unwrap(),
            )
        })
        .collect();
    found.sort();
    assert_eq!(found.len(), 4, "{letters:?}");
    for ((offset, reason, message), (expected_offset, prefix, value)) in found.iter().zip(&refused)
    {
        assert_eq!((offset, message), (expected_offset, value));
        assert!(reason.starts_with(&format!("{prefix}: ")), "{reason}");
    }
    assert!(
        found[1].1.contains(&format!("for topic {topic:?}")),
        "{}",
        found[1].1
    );
    for id in [&unsigned, &foreign_key, &other_topic, &tampered] {
        let (status, _) = asyncd.get(&format!("/v1/tasks/{id}")).await;
        assert_eq!(status, 404, "task {id} exists");
        assert!(executor.calls_for(id).is_empty(), "task {id} ran");
    }
    // Counted right after each letter is stored: wait for the last count.
    let series = [
        "asyncd_kafka_dead_letters_total{job=\"signed\",reason=\"unsigned\"} 1",
        "asyncd_kafka_dead_letters_total{job=\"signed\",reason=\"bad_signature\"} 3",
    ];
    wait_for("the dead letters counted by reason", DEADLINE, async || {
        let metrics = asyncd.metrics().await;
        series.iter().all(|s| metrics.contains(s)).then_some(())
    })
    .await;
}

/// Runs `asyncd dev` with `args` and `env` (it must fail at start); returns its output.
fn refused_at_start(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    std::fs::create_dir_all(dir.join("jobs")).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_asyncd"))
        .arg("dev")
        .arg("--config")
        .arg(dir.join("jobs"))
        .arg("--db")
        .arg(dir.join("asyncd.db"))
        .arg("--listen")
        .arg(format!("127.0.0.1:{}", free_port()))
        .args(args)
        .env_remove("ASYNCD_KAFKA_SIGNING_KEY")
        .env_remove("ASYNCD_KAFKA_SIGNING_KEY_FILE")
        .env("NO_COLOR", "1")
        .envs(env.iter().copied())
        .output()
        .expect("asyncd runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!output.status.success(), "started: {text}");
    text
}

/// An empty or short key, from the file or the variable, stops the process at start with
/// an error naming where it came from: it never runs unsigned, nor signs with a key
/// anyone could guess.
#[test]
fn an_empty_or_short_kafka_signing_key_stops_the_process_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("key");
    let flag = "--kafka-signing-key-file (ASYNCD_KAFKA_SIGNING_KEY_FILE)";
    std::fs::write(&file, "\n").unwrap();
    let path = file.display().to_string();
    let out = refused_at_start(dir.path(), &["--kafka-signing-key-file", &path], &[]);
    assert!(
        out.contains(&format!("{flag}: {path}: holds no key")),
        "{out}"
    );
    std::fs::write(&file, format!("{KEY}\nshort-key\n")).unwrap();
    let out = refused_at_start(dir.path(), &[], &[("ASYNCD_KAFKA_SIGNING_KEY_FILE", &path)]);
    assert!(
        out.contains(&format!(
            "{flag}: {path}: key 2 is 9 bytes; a Kafka signing key must be at least 32"
        )),
        "{out}"
    );
    assert!(!out.contains(KEY), "the key is in the output: {out}");
    let missing = dir.path().join("missing").display().to_string();
    let out = refused_at_start(dir.path(), &["--kafka-signing-key-file", &missing], &[]);
    assert!(out.contains(&format!("{flag}: reading {missing}")), "{out}");
    let out = refused_at_start(
        dir.path(),
        &[],
        &[("ASYNCD_KAFKA_SIGNING_KEY", "too-short")],
    );
    assert!(
        out.contains("ASYNCD_KAFKA_SIGNING_KEY: key 1 is 9 bytes"),
        "{out}"
    );
    let out = refused_at_start(
        dir.path(),
        &["--kafka-signing-key-file", &path],
        &[("ASYNCD_KAFKA_SIGNING_KEY", KEY)],
    );
    assert!(
        out.contains(&format!("{flag} and ASYNCD_KAFKA_SIGNING_KEY are both set")),
        "{out}"
    );
}
