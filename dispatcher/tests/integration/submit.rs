//! Submitting tasks through the API: a delay honoured to the millisecond, a batch
//! answered item by item, and bad or oversized input refused with a 4xx naming the field,
//! while the body is read.

use std::time::Duration;

use asyncd_store::Millis;
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn delayed_task_runs_at_its_eta_not_before() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let mut asyncd = InProcess::start(&one_job(&executor, "")).await;
    let (status, answer) = asyncd
        .post(
            "/v1/tasks",
            json!({"type": "work", "payload": {"n": 1}, "delay": "2s"}),
        )
        .await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["route"], "store");
    let id = answer["id"].as_str().unwrap().to_string();
    let eta = parse_time(&answer["eta"]);
    assert_eq!(eta, T0 + 2_000);
    asyncd.clock.set_millis(Millis::new(eta - 1));
    asyncd.clock.set_millis(Millis::new(eta));
    // Handed on at the clock's first reading at or past the ETA: exactly the ETA.
    assert_eq!(asyncd.dispatched(&id).await, (eta, eta));
    let call = executor.wait_calls(&id, 1).await.remove(0);
    assert_eq!(parse_time(&call.body["eta"]), eta);
    assert_eq!(call.body["payload"], json!({"n": 1}));
    assert_eq!(call.body["attempt"], 1);
    assert_eq!(
        call.headers["idempotency-key"], id,
        "defaults to the task id"
    );
    asyncd.wait_state(&id, "succeeded").await;
}

#[tokio::test]
async fn batch_answers_each_item_in_order() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let (status, answer) = asyncd
        .post(
            "/v1/tasks:batch",
            json!({"tasks": [
                {"type": "work", "payload": 1},
                {"type": "nope"},
                {"type": "work", "payload": 2, "idempotency_key": "k"},
                {"type": "work", "payload": 2, "idempotency_key": "k"},
                {"type": "work", "payload": 3, "idempotency_key": "k"},
            ]}),
        )
        .await;
    assert_eq!(status, 200);
    let results = answer["results"].as_array().unwrap();
    let statuses: Vec<_> = results
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [201, 400, 201, 200, 409]);
    assert_eq!(results[1]["error"]["field"], "type");
    assert_eq!(
        results[2]["id"], results[3]["id"],
        "a repeat inside one batch is a duplicate too"
    );
    assert_eq!(results[4]["error"]["code"], "idempotency_mismatch");
    assert_eq!(results[4]["error"]["existing_id"], results[2]["id"]);
    wait_for("two executions", DEADLINE, async || {
        (executor.calls().len() == 2).then_some(())
    })
    .await;
}

#[tokio::test]
async fn bad_input_gets_a_4xx_naming_the_field() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd =
        InProcess::start_with(&one_job(&executor, ""), |s| s.max_payload_bytes = 1000).await;
    let big = "x".repeat(2000);
    let cases = [
        (
            r#"{"type": "work", "#.to_string(),
            400,
            "malformed_json",
            None,
        ),
        (
            r#"{"type": "nope"}"#.to_string(),
            400,
            "unknown_task_type",
            Some("type"),
        ),
        (
            r#"{"type": "work", "delay": "-5s"}"#.to_string(),
            400,
            "invalid_field",
            Some("delay"),
        ),
        (
            r#"{"type": "work", "delay": "100000d"}"#.to_string(),
            400,
            "invalid_field",
            Some("delay"),
        ),
        (
            r#"{"type": "work", "priority": "high"}"#.to_string(),
            400,
            "malformed_json",
            Some("priority"),
        ),
        (
            format!(r#"{{"type": "work", "payload": "{big}"}}"#),
            413,
            "payload_too_large",
            Some("payload"),
        ),
    ];
    for (body, status, code, field) in cases {
        let (got, answer) = asyncd.post_raw("/v1/tasks", &body).await;
        assert_eq!(got, status, "{body:.60}: {answer}");
        assert_eq!(answer["error"]["code"], code, "{body:.60}");
        assert_eq!(answer["error"]["field"].as_str(), field, "{body:.60}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }
    let (status, answer) = asyncd
        .post_raw("/v1/tasks:batch", r#"{"tasks": "no"}"#)
        .await;
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (400, Some("tasks"))
    );
    let (status, _) = asyncd.get("/v1/tasks/does-not-exist").await;
    assert_eq!(status, 404);
    let (status, answer) = asyncd.get("/v1/dead-letters?limit=0").await;
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (400, Some("limit"))
    );
    let (status, answer) = asyncd.post_raw("/v1/tasks/x/heartbeat", "{}").await;
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (400, Some("lease_token"))
    );
    assert!(executor.calls().is_empty());
}

/// Sends `head` and then body bytes from `next_chunk` for ever, as one chunked request,
/// until the server answers. Returns the answer's status and JSON body, and how many body
/// bytes had been sent by then: a server that reads the whole body before checking its
/// size never answers this, one that checks while reading answers after its limit (plus
/// what the socket buffers hold).
async fn endless_body(
    addr: std::net::SocketAddr,
    path: &str,
    head: &'static str,
    mut next_chunk: impl FnMut() -> Vec<u8> + Send + 'static,
) -> (u16, serde_json::Value, usize) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    // Past this the server is taken to read without a limit: stop rather than run on.
    const GIVE_UP: usize = 256 << 20;
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let sent = Arc::new(AtomicUsize::new(0));
    let counter = sent.clone();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    let write = tokio::spawn(async move {
        writer.write_all(request.as_bytes()).await?;
        let mut chunk = head.as_bytes().to_vec();
        while counter.load(Ordering::Relaxed) < GIVE_UP {
            let mut frame = format!("{:x}\r\n", chunk.len()).into_bytes();
            frame.extend_from_slice(&chunk);
            frame.extend_from_slice(b"\r\n");
            writer.write_all(&frame).await?;
            counter.fetch_add(chunk.len(), Ordering::Relaxed);
            chunk = next_chunk();
        }
        Ok::<_, std::io::Error>(())
    });
    let read = async {
        let mut answer = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            let n = reader.read(&mut buf).await.unwrap();
            assert!(n > 0, "the connection closed without an answer");
            answer.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&answer).to_string();
            let Some(end) = text.find("\r\n\r\n") else {
                continue;
            };
            let sent_then = sent.load(std::sync::atomic::Ordering::Relaxed);
            let status: u16 = text[9..12].parse().unwrap();
            let length: usize = text[..end]
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().unwrap())
                })
                .expect("a content-length");
            while answer.len() < end + 4 + length {
                let n = reader.read(&mut buf).await.unwrap();
                assert!(n > 0, "the answer was cut short");
                answer.extend_from_slice(&buf[..n]);
            }
            let body = serde_json::from_slice(&answer[end + 4..end + 4 + length]).unwrap();
            return (status, body, sent_then);
        }
    };
    let answer = tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .expect("an answer to an endless body");
    write.abort();
    answer
}

/// Issue 10: the body limit was 64 MiB or more on every endpoint, so one request could
/// make the API buffer that much before any check.
#[tokio::test]
async fn an_oversized_body_is_refused_while_it_is_read() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    // The loopback socket buffers hold a few MiB the server never read.
    const SLACK: usize = 8 << 20;
    let cases: [(&str, &'static str, &'static [u8], usize); 2] = [
        // One task: its payload limit (1 MiB by default) and 64 KiB for the other fields.
        (
            "/v1/tasks",
            r#"{"type": "work", "payload": ""#,
            b"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
            (1 << 20) + (64 << 10),
        ),
        // A batch: 16 MiB by default.
        (
            "/v1/tasks:batch",
            r#"{"tasks": ["#,
            br#"{"type": "work", "payload": "0123456789abcdef0123456789abcdef"},"#,
            16 << 20,
        ),
    ];
    for (path, head, item, limit) in cases {
        let chunk: Vec<u8> = item.repeat(64 * 1024 / item.len());
        let (status, body, sent) =
            endless_body(asyncd.addr, path, head, move || chunk.clone()).await;
        assert_eq!(status, 413, "{path}: {body}");
        assert_eq!(body["error"]["code"], "payload_too_large", "{path}: {body}");
        assert!(
            sent <= limit + SLACK,
            "{path}: {sent} bytes were read before the answer; the limit is {limit}"
        );
    }
    assert!(executor.calls().is_empty());
}

/// Issue 10: the item count of a batch was checked only after every item was parsed.
/// Reading stops at item 1001, so what follows (here not even JSON) is never parsed.
#[tokio::test]
async fn an_over_limit_batch_is_refused_at_the_first_item_too_many() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let items = vec![r#"{"type": "work"}"#; 1001].join(",");
    let (status, answer) = asyncd
        .post_raw(
            "/v1/tasks:batch",
            &format!(r#"{{"tasks": [{items}, this is not JSON"#),
        )
        .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["code"], "invalid_field", "{answer}");
    assert_eq!(answer["error"]["field"], "tasks", "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1000"),
        "{answer}"
    );
    // Dependencies likewise: ids past the 101st are not even read as strings.
    let ids: Vec<String> = (0..101)
        .map(|_| format!("\"{}\"", uuid::Uuid::now_v7()))
        .collect();
    let body = format!(
        r#"{{"type": "work", "depends_on": [{}, 1, {{}}, []]}}"#,
        ids.join(",")
    );
    let (status, answer) = asyncd.post_raw("/v1/tasks", &body).await;
    assert_eq!(
        (
            status,
            answer["error"]["code"].as_str(),
            answer["error"]["field"].as_str()
        ),
        (400, Some("invalid_field"), Some("depends_on")),
        "{answer}"
    );
    assert!(executor.calls().is_empty());
}
