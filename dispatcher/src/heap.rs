//! The ETA min-heap each dispatcher holds claimed tasks in until they are due.
//!
//! Ordered by ETA, then priority (higher first), then id (older first), so tasks due at
//! the same instant leave in priority order and otherwise in submission order.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use crate::store::{ClaimedTask, Millis};

#[derive(Debug)]
struct Entry(ClaimedTask);

impl Entry {
    fn key(&self) -> (Millis, Reverse<u8>, &str) {
        (self.0.trigger_at, Reverse(self.0.priority), &self.0.id)
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
    }
}

#[derive(Debug, Default)]
pub struct EtaHeap {
    inner: BinaryHeap<Reverse<Entry>>,
}

impl EtaHeap {
    pub fn push(&mut self, task: ClaimedTask) {
        self.inner.push(Reverse(Entry(task)));
    }

    /// The earliest ETA held, if any.
    pub fn next_eta(&self) -> Option<Millis> {
        self.inner.peek().map(|Reverse(e)| e.0.trigger_at)
    }

    /// Takes the head if it is due at `now`.
    pub fn pop_due(&mut self, now: Millis) -> Option<ClaimedTask> {
        if self.next_eta()? <= now {
            self.inner.pop().map(|Reverse(e)| e.0)
        } else {
            None
        }
    }

    pub fn len(&self) -> usize {
        self.inner.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// Empties the heap (shutdown hands the tasks back to the store).
    pub fn drain(&mut self) -> Vec<ClaimedTask> {
        self.inner.drain().map(|Reverse(e)| e.0).collect()
    }
}

#[cfg(test)]
pub(crate) fn task(id: &str, trigger_at: i64, priority: u8) -> ClaimedTask {
    ClaimedTask {
        id: id.to_string(),
        task_type: "t".to_string(),
        payload: serde_json::value::RawValue::from_string("null".into()).unwrap(),
        priority,
        trigger_at: Millis::new(trigger_at),
        attempt: 0,
        max_retries: 0,
        timeout_ms: 1000,
        lease_token: 1,
        idempotency_key: None,
        lease_secret: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_then_priority_then_id() {
        let mut heap = EtaHeap::default();
        heap.push(task("c", 20, 0));
        heap.push(task("b", 10, 1));
        heap.push(task("a", 10, 1));
        heap.push(task("d", 10, 9));
        heap.push(task("e", 5, 0));
        let order: Vec<_> = std::iter::from_fn(|| heap.pop_due(Millis::new(100)))
            .map(|t| t.id)
            .collect();
        assert_eq!(order, ["e", "d", "a", "b", "c"]);
    }

    #[test]
    fn nothing_leaves_before_its_eta() {
        let mut heap = EtaHeap::default();
        heap.push(task("a", 50, 0));
        assert!(heap.pop_due(Millis::new(49)).is_none());
        assert_eq!(heap.next_eta(), Some(Millis::new(50)));
        assert_eq!(heap.pop_due(Millis::new(50)).unwrap().id, "a");
        assert!(heap.is_empty());
    }
}
