//! `asyncd-bench`: measures asyncd end to end — real `asyncd` processes and servers, a
//! no-op HTTP executor served by this process — and prints Markdown tables for
//! docs/benchmarks.md. Run through `e2e/bench.sh`, which builds the release binaries;
//! the chaos soak (`soak`) through `e2e/soak.sh`.

mod embedded;
mod fair_claim;
mod guard;
mod harness;
mod kafka;
mod retention;
mod soak;
mod store;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// `asyncd dev` on SQLite: submit, end-to-end, lateness, heap.
    Embedded(embedded::Args),
    /// The hot path's regression guard: `asyncd dev`'s drain rate as a fraction of a
    /// plain HTTP loop's against the same executor; fails below `--min-ratio`.
    Guard(guard::Args),
    /// The SQL stores: claim-and-complete with 1, 2, 4 dispatchers; poll cost by backlog.
    Store(store::Args),
    /// The Kafka path: submit, end-to-end, lateness, memory with tasks waiting in the heap.
    Kafka(kafka::Args),
    /// Retention: the task table's size and the dispatch lateness under a steady load,
    /// with the purge and without it.
    Retention(retention::Args),
    /// One keyed job's fair claim: its cost against the due backlog, the keys and the
    /// tenants, on each backend.
    FairClaim(fair_claim::Args),
    /// Chaos soak: every role killed and restarted, the database and broker restarted,
    /// misbehaving executors; fails on any lost, early or wrongly ended task.
    Soak(Box<soak::Args>),
}

#[tokio::main]
async fn main() -> Result<()> {
    match Cli::parse().bench {
        Bench::Embedded(args) => embedded::run(&args).await,
        Bench::Guard(args) => guard::run(&args).await,
        Bench::Store(args) => store::run(&args).await,
        Bench::FairClaim(args) => fair_claim::run(&args).await,
        Bench::Kafka(args) => kafka::run(&args).await,
        Bench::Retention(args) => retention::run(&args).await,
        Bench::Soak(args) => soak::run(&args).await,
    }
}
