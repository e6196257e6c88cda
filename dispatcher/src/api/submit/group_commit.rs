//! Group commit for single submits and small batches: concurrent `POST /v1/tasks` calls
//! (and `POST /v1/tasks:batch` calls under [`OWN_TRANSACTION`] tasks) on the store route
//! share one store transaction instead of committing one each. A call is answered only
//! after the transaction holding its task committed, so "201 means durable" holds as
//! before; what changes is that under load a thousand submits cost one commit (one WAL
//! flush on PostgreSQL, one write transaction on SQLite's single writer) instead of a
//! thousand.
//!
//! One writer takes the first waiting request and whatever else is waiting at that
//! moment, up to `MAX_GROUP` tasks, and writes them with one insert ([`TaskWriter`]). With
//! one submit at a time it writes that one at once: nothing waits for company.
//!
//! A group the store refuses (a value one backend cannot store, say) is not allowed to
//! fail the others: each request is then written on its own, so only the one at fault is
//! refused. An outage fails the whole group at once — retrying each alone would only
//! queue them behind one another's connection timeouts.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use asyncd_contract::ErrorCode;

use super::task_writer::TaskWriter;
use crate::api::error::ApiError;
use asyncd_store::{InsertOutcome, Millis, NewTask, StoreError};

/// Requests waiting while a group is being written. The bound is back-pressure on the
/// HTTP handlers: past it a submit waits to be queued, as it would for a connection.
/// A thousand is several groups' worth at the largest group size.
const QUEUE: usize = 1_000;

/// A submit of this many tasks or more is written in a transaction of its own, not in a
/// group: its commit is already shared by enough tasks, and on PostgreSQL such batches
/// from several callers then commit side by side instead of one after another. Measured
/// with 4 calls of 1 000 in flight (docs/benchmarks.md).
pub const OWN_TRANSACTION: usize = 256;

/// The most tasks one group's transaction takes: a full batch submit, the largest
/// insert the store is asked for anyway.
const MAX_GROUP: usize = asyncd_contract::MAX_BATCH;

type Answer = Result<Vec<InsertOutcome>, Arc<StoreError>>;

struct Request {
    tasks: Vec<NewTask>,
    now: Millis,
    answer: oneshot::Sender<Answer>,
}

/// The submitting side; cheap to share. Dropping the last one ends [`Writer::run`]
/// once the requests queued before are written.
#[derive(Clone)]
pub struct GroupCommit {
    requests: mpsc::Sender<Request>,
}

/// The writing side: [`Writer::run`] until every [`GroupCommit`] is gone.
pub struct Writer {
    store: TaskWriter,
    requests: mpsc::Receiver<Request>,
}

pub fn new(store: TaskWriter) -> (GroupCommit, Writer) {
    let (tx, rx) = mpsc::channel(QUEUE);
    (
        GroupCommit { requests: tx },
        Writer {
            store,
            requests: rx,
        },
    )
}

/// The writer stopped before answering: the role is shutting down.
fn stopped() -> ApiError {
    ApiError::new(
        ErrorCode::StoreUnavailable,
        "the task was not stored: the server is shutting down; retry",
    )
}

impl GroupCommit {
    /// Inserts `tasks` in the next group, as [`Store::insert`] would on its own.
    pub async fn insert(
        &self,
        tasks: Vec<NewTask>,
        now: Millis,
    ) -> Result<Vec<InsertOutcome>, ApiError> {
        let (answer, answered) = oneshot::channel();
        self.requests
            .send(Request { tasks, now, answer })
            .await
            .map_err(|_| stopped())?;
        Ok(answered.await.map_err(|_| stopped())??)
    }
}

impl Writer {
    pub async fn run(mut self) {
        // A request that did not fit the last group opens the next.
        let mut carried: Option<Request> = None;
        loop {
            let first = match carried.take() {
                Some(request) => request,
                None => match self.requests.recv().await {
                    Some(request) => request,
                    None => return,
                },
            };
            let mut size = first.tasks.len();
            let mut group = vec![first];
            while size < MAX_GROUP {
                match self.requests.try_recv() {
                    Ok(request) if size + request.tasks.len() <= MAX_GROUP => {
                        size += request.tasks.len();
                        group.push(request);
                    }
                    Ok(request) => {
                        carried = Some(request);
                        break;
                    }
                    Err(_) => break,
                }
            }
            write(&self.store, group).await;
        }
    }
}

async fn write(store: &TaskWriter, mut group: Vec<Request>) {
    if group.len() == 1 {
        let request = group.pop().expect("one request");
        let answer = store.insert(&request.tasks, request.now).await;
        let _ = request.answer.send(answer.map_err(Arc::new));
        return;
    }
    // The group commits at the latest of its requests' instants.
    let now = group.iter().map(|r| r.now).max().expect("a group");
    let sizes: Vec<usize> = group.iter().map(|r| r.tasks.len()).collect();
    let tasks: Vec<NewTask> = group
        .iter_mut()
        .flat_map(|r| std::mem::take(&mut r.tasks))
        .collect();
    match store.insert(&tasks, now).await {
        Ok(outcomes) => {
            let mut outcomes = outcomes.into_iter();
            for (request, size) in group.into_iter().zip(sizes) {
                let mine = outcomes.by_ref().take(size).collect();
                let _ = request.answer.send(Ok(mine));
            }
        }
        Err(err) if err.is_unavailable() => {
            let err = Arc::new(err);
            for request in group {
                let _ = request.answer.send(Err(err.clone()));
            }
        }
        Err(err) => {
            tracing::warn!(%err, requests = group.len(), "the store refused a group of submits; writing each alone");
            let mut tasks = tasks.into_iter();
            for (request, size) in group.into_iter().zip(sizes) {
                let mine: Vec<NewTask> = tasks.by_ref().take(size).collect();
                let answer = store.insert(&mine, request.now).await;
                let _ = request.answer.send(answer.map_err(Arc::new));
            }
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    fn task(id: &str, payload: &str) -> NewTask {
        NewTask::test("t", Millis::new(1_000))
            .id(id)
            .payload(payload)
            .max_retries(0)
            .timeout_ms(5_000)
    }

    async fn sqlite(dir: &tempfile::TempDir) -> (Arc<dyn asyncd_store::Store>, String) {
        let url = format!("sqlite://{}", dir.path().join("group.db").display());
        let store = asyncd_store::open(&url).await.unwrap();
        store.migrate().await.unwrap();
        (store, url)
    }

    /// Submits `tasks` one request each, at instants 1, 2, … ms, and waits until all
    /// of them are queued: the writer has not been started.
    async fn queue_all(
        commit: &GroupCommit,
        tasks: Vec<NewTask>,
    ) -> Vec<tokio::task::JoinHandle<Result<Vec<InsertOutcome>, ApiError>>> {
        queue_requests(commit, tasks.into_iter().map(|task| vec![task]).collect()).await
    }

    /// [`queue_all`] with several tasks to a request, as a batch submit sends them.
    async fn queue_requests(
        commit: &GroupCommit,
        requests: Vec<Vec<NewTask>>,
    ) -> Vec<tokio::task::JoinHandle<Result<Vec<InsertOutcome>, ApiError>>> {
        let n = requests.len();
        let handles = requests
            .into_iter()
            .enumerate()
            .map(|(i, tasks)| {
                let commit = commit.clone();
                tokio::spawn(async move { commit.insert(tasks, Millis::new(i as i64 + 1)).await })
            })
            .collect();
        while QUEUE - commit.requests.capacity() < n {
            tokio::task::yield_now().await;
        }
        handles
    }

    #[tokio::test]
    async fn submits_waiting_together_are_written_in_one_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = sqlite(&dir).await;
        let (commit, writer) = new(TaskWriter::new(store.clone(), None));
        let ids: Vec<String> = (0..50).map(|i| format!("task-{i}")).collect();
        let handles = queue_all(&commit, ids.iter().map(|id| task(id, "{}")).collect()).await;
        let writing = tokio::spawn(writer.run());
        for (handle, id) in handles.into_iter().zip(&ids) {
            let outcomes = handle.await.unwrap().unwrap();
            assert_eq!(
                outcomes,
                [InsertOutcome::Inserted {
                    id: id.clone(),
                    trigger_at: Millis::new(1_000)
                }],
                "each request answered with its own task"
            );
        }
        // One transaction for all: every task carries the group's instant, the latest
        // of the fifty requests'; alone, each would carry its own.
        for id in &ids {
            let stored = store.get(id).await.unwrap().unwrap();
            assert_eq!(stored.created_at, Millis::new(50), "{id}");
        }
        drop(commit);
        writing.await.expect("the writer ends with its last sender");
    }

    #[tokio::test]
    async fn small_batches_share_a_group_and_each_gets_its_own_outcomes() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = sqlite(&dir).await;
        let (commit, writer) = new(TaskWriter::new(store.clone(), None));
        let requests: Vec<Vec<String>> = vec![
            vec!["a1".into(), "a2".into(), "a3".into()],
            vec!["b1".into()],
            vec!["c1".into(), "c2".into()],
        ];
        let handles = queue_requests(
            &commit,
            requests
                .iter()
                .map(|ids| ids.iter().map(|id| task(id, "{}")).collect())
                .collect(),
        )
        .await;
        let writing = tokio::spawn(writer.run());
        for (handle, ids) in handles.into_iter().zip(&requests) {
            let outcomes = handle.await.unwrap().unwrap();
            let want: Vec<InsertOutcome> = ids
                .iter()
                .map(|id| InsertOutcome::Inserted {
                    id: id.clone(),
                    trigger_at: Millis::new(1_000),
                })
                .collect();
            assert_eq!(
                outcomes, want,
                "each request answered with its own tasks, in order"
            );
        }
        for id in requests.iter().flatten() {
            let stored = store.get(id).await.unwrap().unwrap();
            assert_eq!(
                stored.created_at,
                Millis::new(3),
                "{id}: one transaction for the three requests"
            );
        }
        drop(commit);
        writing.await.expect("the writer ends with its last sender");
    }

    #[tokio::test]
    async fn a_task_the_store_refuses_fails_only_its_own_submit() {
        let dir = tempfile::tempdir().unwrap();
        let (store, url) = sqlite(&dir).await;
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        sqlx::query(
            "CREATE TRIGGER refuse BEFORE INSERT ON tasks WHEN NEW.payload LIKE '%poison%' \
             BEGIN SELECT RAISE(ABORT, 'refused'); END",
        )
        .execute(&pool)
        .await
        .unwrap();
        let (commit, writer) = new(TaskWriter::new(store.clone(), None));
        let tasks = vec![
            task("before", "{}"),
            task("poisoned", r#"{"poison":true}"#),
            task("after", "{}"),
        ];
        let handles = queue_all(&commit, tasks).await;
        tokio::spawn(writer.run());
        let answers: Vec<_> = futures::future::join_all(handles)
            .await
            .into_iter()
            .map(|h| h.unwrap())
            .collect();
        assert!(answers[0].is_ok(), "{:?}", answers[0]);
        assert!(answers[1].is_err(), "the refused task's submit fails");
        assert!(answers[2].is_ok(), "{:?}", answers[2]);
        for (id, stored) in [("before", true), ("poisoned", false), ("after", true)] {
            assert_eq!(store.get(id).await.unwrap().is_some(), stored, "{id}");
        }
    }
}
