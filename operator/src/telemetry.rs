//! Logging: `tracing` to stderr, filtered by `ASYNCD_LOG` (or `RUST_LOG`); default `info`
//! for the operator, `warn` for kube and rdkafka. As text (colour only on a terminal: the
//! escape codes would land in `kubectl logs`) or as one JSON object per line
//! (`--log-format json`, which the chart sets).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// `--log-format` (`ASYNCD_LOG_FORMAT`), as `asyncd` takes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_env("ASYNCD_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info,kube=warn,rdkafka=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
}
