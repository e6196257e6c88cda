//! How the API writes new tasks: through the dispatcher in its process when there is one
//! ([`LocalDispatch::insert`]: the tasks it may take go in claimed, straight into its
//! heap, and its claimer is woken for the others due soon), else straight into the store
//! for the dispatchers to claim.

use std::sync::Arc;

use crate::dispatch::LocalDispatch;
use asyncd_store::{InsertOutcome, Millis, NewTask, Store};

#[derive(Clone)]
pub struct TaskWriter {
    store: Arc<dyn Store>,
    local: Option<LocalDispatch>,
}

impl TaskWriter {
    pub fn new(store: Arc<dyn Store>, local: Option<LocalDispatch>) -> Self {
        Self { store, local }
    }

    /// Inserts `tasks` as [`Store::insert`] does.
    pub async fn insert(
        &self,
        tasks: &[NewTask],
        now: Millis,
    ) -> asyncd_store::Result<Vec<InsertOutcome>> {
        match &self.local {
            Some(local) => local.insert(&*self.store, tasks, now).await,
            None => self.store.insert(tasks, now).await,
        }
    }
}
