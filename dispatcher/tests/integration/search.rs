//! Task search through the API.

use std::time::Duration;

use serde_json::json;

use crate::support::*;

/// Issue 15, task search over HTTP: by job and state, newest first, page by page with
/// `next_cursor`; a bad filter is a 400 naming it.
#[tokio::test]
async fn tasks_are_searched_by_filter_page_by_page() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let (status, answer) = asyncd
            .post(
                "/v1/tasks",
                json!({"type": "work", "payload": {"n": n}, "delay": "1h"}),
            )
            .await;
        assert_eq!(status, 201, "{answer}");
        ids.push(answer["id"].as_str().unwrap().to_string());
        asyncd.clock.advance(Duration::from_millis(1));
    }
    let cancelled = ids[1].clone();
    assert_eq!(
        asyncd.delete(&format!("/v1/tasks/{cancelled}")).await.0,
        200
    );

    let (status, page) = asyncd.get("/v1/tasks?job=test-job&state=pending").await;
    assert_eq!(status, 200, "{page}");
    let listed: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [ids[2].as_str(), ids[0].as_str()], "newest first");
    assert!(
        page.get("next_cursor").is_none(),
        "a short page is the last"
    );

    let mut paged = Vec::new();
    let mut path = "/v1/tasks?type=work&limit=1".to_string();
    loop {
        let (status, page) = asyncd.get(&path).await;
        assert_eq!(status, 200, "{page}");
        for item in page["items"].as_array().unwrap() {
            paged.push(item["id"].as_str().unwrap().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(cursor) => path = format!("/v1/tasks?type=work&limit=1&cursor={cursor}"),
            None => break,
        }
    }
    let mut newest_first = ids.clone();
    newest_first.reverse();
    assert_eq!(paged, newest_first);

    for (query, field) in [
        ("job=nope", "job"),
        ("state=done", "state"),
        ("created_after=yesterday", "created_after"),
        ("eta_before=1", "eta_before"),
        ("limit=0", "limit"),
        ("cursor=garbage", "cursor"),
        ("unique_key=a%00b", "unique_key"),
        ("type=a%00b", "type"),
    ] {
        let (status, answer) = asyncd.get(&format!("/v1/tasks?{query}")).await;
        assert_eq!(
            (status, answer["error"]["field"].as_str()),
            (400, Some(field)),
            "{query}: {answer}"
        );
    }
}
