//! The embedded default: events as log lines.

use crate::relay::sink::{Event, Published, Sink};

/// One structured log line per event (the embedded default).
#[derive(Debug, Default)]
pub struct LogSink;

impl Sink for LogSink {
    fn name(&self) -> &'static str {
        "log"
    }

    fn publish<'a>(&'a self, events: &'a [Event]) -> Published<'a> {
        Box::pin(async move {
            events
                .iter()
                .map(|e| {
                    tracing::info!(
                        target: "paynotify::events",
                        id = e.id,
                        topic = %e.topic,
                        biz_key = %e.biz_key,
                        payload = %e.payload,
                        created_at = %e.created_at,
                        "event"
                    );
                    Ok(())
                })
                .collect()
        })
    }
}
