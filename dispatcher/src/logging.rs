//! Where log lines go and how they look: `tracing` events on stderr, as plain text (with
//! colour only on a terminal: escape codes in a file or `kubectl logs` are noise) or as
//! one JSON object per line for a cluster's log collector. An attempt's lines carry the
//! task's id, type and attempt number as fields of the `attempt` span they happen in.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// `--log-format` (`ASYNCD_LOG_FORMAT`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event; ANSI colours only when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, the event's fields
    /// (`message` among them) at the top level, and the innermost span's fields under
    /// `span` (`span.task_id`, `span.task_type`, `span.attempt` for an attempt).
    Json,
}

/// Installs the process's subscriber, filtered by `ASYNCD_LOG` (EnvFilter syntax),
/// else `default_filter`.
pub fn init(format: LogFormat, default_filter: &str) {
    let filter =
        EnvFilter::try_from_env("ASYNCD_LOG").unwrap_or_else(|_| EnvFilter::new(default_filter));
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
