//! The allocator of the `asyncd` process, and the hand-back of its freed memory when the
//! process goes quiet.
//!
//! mimalloc returns the pages a thread freed to the system only as that thread goes on
//! allocating and freeing: a process that goes idle after a burst of work keeps what
//! the burst freed. `asyncd dev` held 10–20 MiB that way with 10⁶ tasks waiting
//! (docs/benchmarks.md, "asyncd dev's idle memory and mimalloc's purge delay").
//! Returning every page at once instead (`MIMALLOC_PURGE_DELAY=0`) cost a tenth more
//! CPU per task under load. So each runtime thread hands its freed pages back as it
//! parks, at most once per [`RETURN_EVERY`]: under load that is a walk of the thread's
//! heap per second, and in an idle process, whose threads wake for timers, it returns
//! what the last burst left within a second or two.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// mimalloc rather than glibc's malloc: the hot path allocates per task (requests,
/// JSON, rows), and glibc spent a sixth of asyncd's CPU there under a drain
/// (docs/benchmarks.md, "Hot-path guard").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How often a thread hands its freed pages back, at most.
pub const RETURN_EVERY: Duration = Duration::from_secs(1);

/// For the runtime's `on_thread_park`: the calling thread is about to wait for work.
/// Hands back the pages it freed, unless it did so within [`RETURN_EVERY`].
pub fn thread_going_idle() {
    thread_local! {
        static LAST: Cell<Option<Instant>> = const { Cell::new(None) };
    }
    let now = Instant::now();
    LAST.with(|last| {
        if last
            .get()
            .is_some_and(|at| now.duration_since(at) < RETURN_EVERY)
        {
            return;
        }
        last.set(Some(now));
        return_freed_pages();
    });
}

/// Frees the calling thread's empty heap pages and returns to the system those whose
/// purge delay has passed (mimalloc's `mi_collect(false)`; `true` would also purge the
/// ones freed a moment ago, which the next park a second later does anyway).
#[allow(unsafe_code)]
pub fn return_freed_pages() {
    // SAFETY: `mi_collect` takes no pointer and touches only mimalloc's own state: the
    // calling thread's heap and the pages no allocation holds.
    unsafe { libmimalloc_sys::mi_collect(false) }
}
