//! Test signals: events the dispatcher, rescuer and scheduler emit when a test asks for
//! them, so tests wait for "task X was claimed" instead of polling the API.
//!
//! Absent in production (`None`): each emit point is one `Option` check. Present, it is a
//! broadcast channel, so an emitter never waits on a slow test; a test that falls more
//! than [`CAPACITY`] events behind gets `Lagged` and fails loudly rather than missing one.

use tokio::sync::broadcast;

use asyncd_store::Millis;

/// Far more events than any test produces between two reads.
pub const CAPACITY: usize = 4096;

/// One thing that happened, stamped with the injected clock's time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signal {
    /// The claimer (or a Kafka consumer) put these tasks into the heap.
    Claimed { ids: Vec<String>, at: Millis },
    /// The ticker handed a due task to its job's runner.
    Dispatched { id: String, eta: Millis, at: Millis },
    /// The completer recorded these outcomes in the store.
    Finished { ids: Vec<String>, at: Millis },
    /// The completer began these attempts in the write of the outcomes that freed their
    /// slots (`dispatch::refill`).
    Refilled { ids: Vec<String> },
    /// Handed back unstarted (shutdown, or its job config is gone).
    Released { id: String },
    /// The dispatcher wrote its membership heartbeat.
    Heartbeat { at: Millis },
    /// The claimer ended a pass over the store (claiming nothing, possibly): every task
    /// it could take by `at` is in the heap.
    ClaimPass { at: Millis },
    /// The membership loop read which jobs are paused (config or API) at `at`.
    PausesSeen { paused: Vec<String>, at: Millis },
    /// A member seen alive at the last heartbeat is gone; its claims were handed back.
    MemberGone { member: String },
    /// A rescuer pass ended, bringing back `count` tasks.
    Rescued { count: usize, at: Millis },
    /// A retention pass that read the clock at `at` ended, deleting `purged` finished
    /// tasks.
    Purged { purged: u64, at: Millis },
    /// A cron pass ended, creating `created` firings.
    Scheduled { created: usize, at: Millis },
}

/// The sending side, cloned into each part.
#[derive(Debug, Clone)]
pub struct TestSignals(broadcast::Sender<Signal>);

impl TestSignals {
    pub fn new() -> (Self, broadcast::Receiver<Signal>) {
        let (tx, rx) = broadcast::channel(CAPACITY);
        (Self(tx), rx)
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Signal> {
        self.0.subscribe()
    }

    fn send(&self, signal: Signal) {
        // No receiver left is fine: the test stopped listening.
        let _ = self.0.send(signal);
    }
}

/// Emits `make()` if signals are on; `make` is not called otherwise.
pub fn emit(signals: &Option<TestSignals>, make: impl FnOnce() -> Signal) {
    if let Some(signals) = signals {
        signals.send(make());
    }
}
