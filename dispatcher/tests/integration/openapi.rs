//! The OpenAPI document asyncd serves.

use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn serves_its_openapi_document_which_describes_real_answers() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = Asyncd::start(&one_job(&executor, ""), &[]).await;
    let (status, document) = asyncd.get("/v1/openapi.json").await;
    assert_eq!(status, 200, "{document}");
    let committed: serde_json::Value =
        serde_json::from_str(include_str!("../../../docs/openapi.json")).unwrap();
    assert_eq!(document, committed, "served and committed documents differ");

    let schemas = &document["components"]["schemas"];
    let id = asyncd.submit(json!({"type": "work", "delay": "1h"})).await;
    let (_, task) = asyncd.get(&format!("/v1/tasks/{id}")).await;
    let keys = |v: &serde_json::Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&task), keys(&schemas["TaskStatus"]["properties"]));
    let mut required: Vec<String> =
        serde_json::from_value(schemas["TaskStatus"]["required"].clone()).unwrap();
    required.sort();
    assert_eq!(keys(&task), required, "every member is always sent");
}
