//! Logging: `tracing` to stderr, filtered by `ASYNCD_LOG` (or `RUST_LOG`); default `info`
//! for the operator, `warn` for kube and rdkafka.

use tracing_subscriber::EnvFilter;

pub fn init() {
    let filter = EnvFilter::try_from_env("ASYNCD_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info,kube=warn,rdkafka=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
