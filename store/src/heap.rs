//! The ETA min-heap each dispatcher holds claimed tasks in until they are due, and the
//! order a job's due tasks then begin in ([`ReadyHeap`]).
//!
//! The ETA heap is ordered by ETA, then priority (higher first), then id (older first).
//! Once due, a task waits for its job's runner in the job's [`ReadyHeap`], ordered by
//! [`ClaimedTask::rank`]: priority counts among due work, not only between tasks due at the same
//! instant, so a high-priority task is not stuck behind a low-priority backlog. The store
//! claims in the same order (`claim_rank`, migration 0006).
//!
//! A job with a `concurrencyKey` takes its keys in turn before rank: each key's queued
//! tasks are numbered in turns (start-time fair queueing), a key's next task one turn
//! after its last queued one and never before the turn being served, so every key with
//! a task waiting is served once before any key a second time, whatever their ranks.
//! Rank orders the tasks within a turn. Tasks without a key (and every task of a job
//! without one) are all of turn 0: rank alone orders them.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

use crate::{ClaimedTask, Millis};

/// A due task and its turn.
#[derive(Debug)]
struct Ranked(u64, ClaimedTask);

impl Ranked {
    fn key(&self) -> (u64, (i64, &str)) {
        (self.0, self.1.rank())
    }
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}
impl Eq for Ranked {}
impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
    }
}

/// One job's due tasks, in turns of their keys, then best [`ClaimedTask::rank`] first.
#[derive(Debug, Default)]
pub struct ReadyHeap {
    inner: BinaryHeap<Reverse<Ranked>>,
    /// The turn of each key's last queued task. Only keys whose turn is not behind
    /// `serving` are kept (the others' next turn is `serving` anyway), so this holds at
    /// most one entry per queued task or key served in the current turn.
    turns: HashMap<String, u64>,
    /// The turn of the last task taken.
    serving: u64,
}

impl ReadyHeap {
    pub fn push(&mut self, task: ClaimedTask) {
        let turn = match &task.concurrency_key {
            None => 0,
            Some(key) => {
                let next = self
                    .turns
                    .get(key)
                    .map_or(self.serving, |last| (last + 1).max(self.serving));
                self.turns.insert(key.clone(), next);
                next
            }
        };
        self.inner.push(Reverse(Ranked(turn, task)));
    }

    pub fn pop(&mut self) -> Option<ClaimedTask> {
        let Reverse(Ranked(turn, task)) = self.inner.pop()?;
        if turn > self.serving {
            self.serving = turn;
            let serving = self.serving;
            self.turns.retain(|_, last| *last >= serving);
        }
        Some(task)
    }

    pub fn len(&self) -> usize {
        self.inner.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }
}

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
        concurrency_key: None,
        trace: None,
        expires_at: None,
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
    fn due_work_begins_by_rank_priority_worth_ten_seconds_a_level() {
        let mut ready = ReadyHeap::default();
        // A backlog of priority 0 due over the last minute, and a priority-9 task due now.
        for (i, due) in [0, 10_000, 30_000, 59_000].into_iter().enumerate() {
            ready.push(task(&format!("low{i}"), due, 0));
        }
        ready.push(task("high", 60_000, 9));
        // Due 91 s before the high one: ageing puts it first even so.
        ready.push(task("aged", -31_000, 0));
        // Same rank as low1 (10 s - 0): the id breaks the tie.
        ready.push(task("equal", 20_000, 1));
        let order: Vec<_> = std::iter::from_fn(|| ready.pop()).map(|t| t.id).collect();
        assert_eq!(
            order,
            ["aged", "high", "low0", "equal", "low1", "low2", "low3"]
        );
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

    #[test]
    fn keys_take_turns_before_rank_and_a_new_key_waits_no_longer_than_one_turn() {
        let keyed = |id: &str, at: i64, key: &str| ClaimedTask {
            concurrency_key: Some(key.into()),
            ..task(id, at, 0)
        };
        let mut ready = ReadyHeap::default();
        // "a" floods with the best ranks.
        for i in 0..5 {
            ready.push(keyed(&format!("a{i}"), i, "a"));
        }
        ready.push(keyed("b0", 100, "b"));
        ready.push(keyed("b1", 101, "b"));
        let mut order = vec![ready.pop().unwrap().id, ready.pop().unwrap().id];
        assert_eq!(order, ["a0", "b0"], "one each in the first turn");
        // A key that comes now joins the turn being served or the next.
        ready.push(keyed("c0", 200, "c"));
        order.extend(std::iter::from_fn(|| ready.pop().map(|t| t.id)));
        assert_eq!(order, ["a0", "b0", "c0", "a1", "b1", "a2", "a3", "a4"]);
        // Keyless tasks keep rank order among themselves, ahead of the turns.
        ready.push(task("x", 50, 0));
        ready.push(keyed("d0", 1, "d"));
        ready.push(task("w", 40, 9));
        let order: Vec<_> = std::iter::from_fn(|| ready.pop().map(|t| t.id)).collect();
        assert_eq!(order, ["w", "x", "d0"]);
        assert!(
            !ready.turns.contains_key("b") && !ready.turns.contains_key("c"),
            "the keys served in earlier turns are forgotten"
        );
    }
}
