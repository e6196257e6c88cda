//! The signature vectors of `contract/fixtures/signature.json`, shared with the server
//! and the Go and Python SDKs: the canonical string, the signature, and every
//! verification case (rotation, stale timestamps, replays), each on a fresh
//! [`Verifier`] holding the case's keys; and the signed batch call of
//! `contract/fixtures/batch_signature.json`.

use std::time::{Duration, UNIX_EPOCH};

use asyncd_client::{SignatureError, Verifier, VerifyError, sign, signed_batch_call, signed_call};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

fn headers(map: &Value) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in map.as_object().unwrap() {
        headers.insert(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value.as_str().unwrap()).unwrap(),
        );
    }
    headers
}

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/../../contract/fixtures/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn outcome(result: Result<(), VerifyError>) -> &'static str {
    match result {
        Ok(()) => "ok",
        Err(VerifyError::Replayed) => "replay",
        Err(VerifyError::Signature(SignatureError::Stale)) => "stale",
        Err(VerifyError::Signature(SignatureError::MalformedTimestamp)) => "malformed_timestamp",
        Err(VerifyError::Signature(SignatureError::Mismatch | SignatureError::NoKey)) => "mismatch",
    }
}

#[test]
fn every_case_of_the_contract_vectors() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../contract/fixtures/signature.json"
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(
        v["tolerance_seconds"].as_u64(),
        Some(asyncd_client::SIGNATURE_TOLERANCE.as_secs())
    );
    let key = |name: &Value| {
        v["keys"][name.as_str().unwrap()]
            .as_str()
            .unwrap()
            .to_string()
    };
    let signed = headers(&v["headers"]);
    let body = v["body"].as_str().unwrap().as_bytes();
    let call = signed_call(&signed, body);
    assert_eq!(
        String::from_utf8(call.canonical()).unwrap(),
        v["canonical"].as_str().unwrap()
    );
    let primary = key(&Value::from("primary"));
    assert_eq!(
        sign(&[primary.as_bytes()], &call).unwrap(),
        v["headers"]["Asyncd-Signature"].as_str().unwrap()
    );
    let cases = v["cases"].as_array().unwrap();
    assert!(cases.len() >= 20, "{} cases", cases.len());
    for case in cases {
        let keys: Vec<String> = case["keys"].as_array().unwrap().iter().map(key).collect();
        let verifier = Verifier::new(&keys);
        for (i, step) in case["steps"].as_array().unwrap().iter().enumerate() {
            let now = UNIX_EPOCH + Duration::from_secs(step["now"].as_u64().unwrap());
            let got = outcome(verifier.verify(
                &headers(&step["headers"]),
                step["body"].as_str().unwrap().as_bytes(),
                now,
            ));
            assert_eq!(
                got,
                step["want"].as_str().unwrap(),
                "{}, step {}",
                case["name"],
                i + 1
            );
        }
    }
}

/// A batch call is signed over a single call's canonical string with the four per-task
/// header values empty; the body holds each task's id, attempt and lease token.
#[test]
fn the_signed_batch_call() {
    let v = fixture("batch_signature");
    let primary = v["keys"]["primary"].as_str().unwrap();
    let signed = headers(&v["headers"]);
    let body = v["body"].as_str().unwrap().as_bytes();
    let now = UNIX_EPOCH + Duration::from_secs(v["now"].as_u64().unwrap());
    let call = signed_batch_call(&signed, body);
    assert_eq!(
        String::from_utf8(call.canonical()).unwrap(),
        v["canonical"].as_str().unwrap()
    );
    assert!(
        v["canonical"]
            .as_str()
            .unwrap()
            .starts_with("1700000000\n\n\n\n\nhttp://10.0.0.7:7700\n{")
    );
    assert_eq!(
        sign(&[primary.as_bytes()], &call).unwrap(),
        v["headers"]["Asyncd-Signature"].as_str().unwrap()
    );
    let verify = |headers: &HeaderMap, body: &[u8], key: &str| {
        Verifier::new([key])
            .verify_batch(headers, body, now)
            .map(|_| ())
    };
    assert_eq!(outcome(verify(&signed, body, primary)), "ok");
    // Per-task headers on a batch call are not what was signed, whatever they say.
    let mut stray = signed.clone();
    stray.insert("Asyncd-Task-Id", HeaderValue::from_static("0193-other"));
    stray.insert("Asyncd-Lease-Token", HeaderValue::from_static("forged"));
    assert_eq!(outcome(verify(&stray, body, primary)), "ok");
    // (which a single call's verification, over those headers, refuses).
    assert_eq!(
        outcome(Verifier::new([primary]).verify(&stray, body, now)),
        "mismatch"
    );

    let tampered_body = String::from_utf8(body.to_vec())
        .unwrap()
        .replace("\"attempt\":2", "\"attempt\":3");
    assert_ne!(tampered_body.as_bytes(), body);
    assert_eq!(
        outcome(verify(&signed, tampered_body.as_bytes(), primary)),
        "mismatch"
    );
    let mut tampered_ts = signed.clone();
    tampered_ts.insert("Asyncd-Timestamp", HeaderValue::from_static("1700000001"));
    assert_eq!(outcome(verify(&tampered_ts, body, primary)), "mismatch");
    let mut other_callback = signed.clone();
    other_callback.insert(
        "Asyncd-Callback-Url",
        HeaderValue::from_static("http://evil.example:7700"),
    );
    assert_eq!(outcome(verify(&other_callback, body, primary)), "mismatch");
    let secondary = v["keys"]["secondary"].as_str().unwrap();
    assert_eq!(outcome(verify(&signed, body, secondary)), "mismatch");
    let verifier = Verifier::new([primary]);
    let late = verifier.verify_batch(&signed, body, now + Duration::from_secs(301));
    assert_eq!(outcome(late.map(|_| ())), "stale");

    // Replays are per task: each (task, attempt, lease token) of the body once.
    let tasks: Value = serde_json::from_slice(body).unwrap();
    let verifier = Verifier::new([primary]);
    let batch = verifier.verify_batch(&signed, body, now).unwrap();
    for task in tasks["tasks"].as_array().unwrap() {
        let (id, attempt, token) = (
            task["id"].as_str().unwrap(),
            task["attempt"].as_u64().unwrap() as u32,
            task["lease_token"].as_str().unwrap(),
        );
        assert_eq!(outcome(batch.check_task(id, attempt, token)), "ok");
        assert_eq!(outcome(batch.check_task(id, attempt, token)), "replay");
        assert_eq!(outcome(batch.check_task(id, attempt + 1, token)), "ok");
    }
    // The batch signed again later: its tasks were delivered.
    let again = verifier
        .verify_batch(&signed, body, now + Duration::from_secs(10))
        .unwrap();
    let first = &tasks["tasks"][0];
    assert_eq!(
        outcome(again.check_task(
            first["id"].as_str().unwrap(),
            1,
            first["lease_token"].as_str().unwrap()
        )),
        "replay"
    );
}
