//! The signature vectors of `contract/fixtures/signature.json`, shared with the server
//! and the Go and Python SDKs: the canonical string, the signature, and every
//! verification case (rotation, stale timestamps, replays), each on a fresh
//! [`Verifier`] holding the case's keys.

use std::time::{Duration, UNIX_EPOCH};

use asyncd_client::{SignatureError, Verifier, VerifyError, sign, signed_call};
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
