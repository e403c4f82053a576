//! Logging: `tracing` to stderr, filtered by `RUST_LOG` (default `info`), as text (coloured
//! only when stderr is a terminal) or as JSON lines (`log.format`).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Text logs: what the commands use before (or without) a configuration.
pub fn init() {
    init_with(LogFormat::Text);
}

/// Logs in `format`. JSON lines carry the event's fields at the top level (`message`,
/// `channel`, `out_trade_no`, `outcome`, `latency_ms`, …) and the request's span (with its
/// `request_id`) under `span`.
pub fn init_with(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,tokio_cron_scheduler=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second call (tests) keeps the first subscriber.
    let _ = match format {
        // Colour codes only for a person at a terminal, never into files or pipes.
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
}

/// Logs in tests only when `TEST_LOG` is set, so failures can be read without noise.
pub fn init_for_tests() {
    // Every test builds reqwest clients; reqwest has no TLS provider of its own here.
    crate::channel::api::install_crypto();
    if std::env::var_os("TEST_LOG").is_some() {
        init();
    }
}
