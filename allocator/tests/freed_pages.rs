//! The hand-back of freed pages, seen in the process's resident memory. One test in its
//! own binary: another test allocating beside it would move the figure.

use std::time::{Duration, Instant};

/// Resident memory of this process, in bytes (`/proc/self/statm`'s second field).
fn resident() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .expect("statm's resident field");
    pages * 4096
}

#[test]
fn pages_freed_by_a_burst_go_back_to_the_system() {
    const BURST: u64 = 128 << 20;
    let before = resident();
    // Many small blocks, as requests and rows are: freed, they stay in mimalloc's pages.
    let blocks: Vec<Box<[u8; 1024]>> = (0..BURST / 1024).map(|_| Box::new([1u8; 1024])).collect();
    let peak = resident();
    assert!(
        peak >= before + BURST / 2,
        "the burst is resident: {before} → {peak} bytes"
    );
    drop(blocks);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        asyncd_allocator::return_freed_pages();
        let now = resident();
        if now + BURST / 2 <= peak {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "freed pages still resident after 20 s: {peak} → {now} bytes"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
