//! Logging: `tracing` to stderr, filtered by `RUST_LOG` (default `info`), as text (coloured
//! only when stderr is a terminal) or as JSON lines (`log.format`).

use std::io::IsTerminal;

use actix_web::Error;
use actix_web::HttpMessage;
use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use tracing::Span;
use tracing_actix_web::{RequestId, RootSpanBuilder};

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
    crate::https::install_crypto();
    if std::env::var_os("TEST_LOG").is_some() {
        init();
    }
}

/// The span every request runs in: its request id (which receipts record too) and path.
/// `tracing-actix-web`'s default span carries some fifteen OpenTelemetry fields (client
/// address, user agent, route, …), each formatted into every request's span and then
/// repeated in every log line inside it; that was a measurable share of the CPU a
/// notification costs (docs/benchmarks.md).
pub struct RequestSpan;

impl RootSpanBuilder for RequestSpan {
    fn on_request_start(request: &ServiceRequest) -> Span {
        let request_id = request.extensions().get::<RequestId>().copied();
        match request_id {
            Some(id) => tracing::info_span!("request", request_id = %id, path = %request.path()),
            None => tracing::info_span!("request", path = %request.path()),
        }
    }

    fn on_request_end<B: MessageBody>(_: Span, _: &Result<ServiceResponse<B>, Error>) {}
}
