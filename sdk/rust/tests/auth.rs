//! The client's bearer token against a real `asyncd dev --auth tokens`: with the token
//! (given, or read from a file) calls succeed; without it, or with a wrong one, they fail
//! with the typed `unauthenticated` refusal; a token scoped to another job gets
//! `forbidden`, and this job's tasks look unknown to it.

mod support;

use std::time::Duration;

use asyncd_client::{Client, ErrorCode, Executor, Task, TaskState};
use serde_json::json;
use sha2::{Digest, Sha256};
use support::{Dev, Job, uniq};

const TOKEN: &str = "rust-it-token-for-auth-job";
const OTHER_TOKEN: &str = "rust-it-token-for-another-job";

fn sha256(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

fn client(
    dev: &Dev,
    configure: impl FnOnce(asyncd_client::ClientBuilder) -> asyncd_client::ClientBuilder,
) -> Client {
    configure(Client::builder().endpoint(&dev.endpoint))
        .build()
        .unwrap()
}

fn code<T: std::fmt::Debug>(result: Result<T, asyncd_client::Error>) -> (ErrorCode, u16) {
    let err = result.expect_err("refused");
    let api = err
        .api()
        .unwrap_or_else(|| panic!("{err} is not an API refusal"));
    (api.code.clone(), api.status)
}

#[tokio::test]
async fn a_client_with_the_token_succeeds_and_without_it_gets_unauthenticated() {
    let dev = Dev::start_with_args(
        Executor::new(),
        &[Job::new("rust_auth"), Job::new("rust_other")],
        |dir| {
            let file = dir.join("tokens.yaml");
            std::fs::write(
                &file,
                format!(
                    "tokens:\n  - {{name: rust-it, sha256: \"{}\", jobs: [rust-auth-job], verbs: [\"*\"]}}\n  - {{name: rust-it-other, sha256: \"{}\", jobs: [rust-other-job], verbs: [read]}}\n",
                    sha256(TOKEN),
                    sha256(OTHER_TOKEN)
                ),
            )
            .unwrap();
            vec![
                "--auth".into(),
                "tokens".into(),
                "--auth-tokens-file".into(),
                file.display().to_string(),
            ]
        },
    )
    .await;
    let task = || Task::new("rust_auth", json!({"n": 1})).idempotency_key(uniq("rust-auth"));

    let with_token = client(&dev, |b| b.token(TOKEN));
    let submitted = with_token
        .submit_delayed(&task(), Duration::from_secs(3600))
        .await
        .expect("submit with the token");
    assert_eq!(
        with_token.get(&submitted.id).await.unwrap().state,
        TaskState::Pending
    );

    // The same token from a file, as a pod mounts its projected ServiceAccount token.
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let from_file = client(&dev, |b| b.token_file(&token_file));
    assert_eq!(from_file.get(&submitted.id).await.unwrap().id, submitted.id);

    for anonymous in [
        client(&dev, |b| b.token_file(dir.path().join("missing"))),
        client(&dev, |b| b.token("not-the-token")),
        client(&dev, |b| b.token(sha256(TOKEN))),
    ] {
        assert_eq!(
            code(anonymous.submit(&task()).await),
            (ErrorCode::Unauthenticated, 401)
        );
        assert_eq!(
            code(anonymous.get(&submitted.id).await),
            (ErrorCode::Unauthenticated, 401)
        );
    }

    let other = client(&dev, |b| b.token(OTHER_TOKEN));
    assert_eq!(
        code(other.submit(&task()).await),
        (ErrorCode::Forbidden, 403)
    );
    assert_eq!(
        code(other.get(&submitted.id).await),
        (ErrorCode::NotFound, 404),
        "a task of a job the token may not read looks unknown"
    );
    with_token.cancel(&submitted.id).await.unwrap();
}
