//! What a consumer reads and how: [`StreamSettings`], and the checks a
//! [`StreamConsumer`](super::StreamConsumer) makes of them before it connects.

use std::time::Duration;

use super::StreamError;

/// Where and how to read.
#[derive(Debug, Clone)]
pub struct StreamSettings {
    /// paynotify's `relay.redis_stream` (default `paynotify:events`).
    pub stream: String,
    /// The consumer group: one per consuming service (created at `start_id`, with
    /// MKSTREAM, when missing at start).
    pub group: String,
    /// Where a group created now starts: `"$"` (the default) takes only entries added
    /// from now on; `"0"` takes the whole stream's history (paynotify's relay does not
    /// trim the stream, so that can be every event ever written). Used only when the
    /// group does not exist; an existing group continues where it is.
    pub start_id: String,
    /// This process's name in the group (unique per running instance; a restarted instance
    /// that keeps its name finishes what it held).
    pub consumer: String,
    /// Entries per `XREADGROUP`.
    pub batch: usize,
    /// How long one `XREADGROUP` blocks waiting for entries.
    pub block: Duration,
    /// Entries pending longer than this (a crashed or stuck consumer's) are taken over
    /// with `XAUTOCLAIM`. Keep it well above the time one batch takes to handle: an entry
    /// claimed while its first consumer still works on it runs twice (the inbox makes the
    /// second run a duplicate).
    pub claim_idle: Duration,
    /// How often the group is scanned with `XAUTOCLAIM` (also once at start).
    pub claim_every: Duration,
    /// Deliveries of one transiently failing entry before it may be parked on
    /// `parked_stream` and acknowledged (once `park_after` has passed too).
    pub max_attempts: u32,
    /// How long a transiently failing entry keeps being retried, from the first failure
    /// this process saw, before it may be parked (once it had `max_attempts` deliveries
    /// too). Default 5 minutes.
    pub park_after: Duration,
    /// Where poison entries go (`{stream}:parked` by default).
    pub parked_stream: String,
    /// The pause before an entry that failed transiently is read again, after its first
    /// delivery; doubled per further delivery up to `retry_backoff_max`.
    pub retry_backoff: Duration,
    /// The longest pause before a transiently failed entry is read again (default 30 s).
    pub retry_backoff_max: Duration,
    /// The first pause after a lost connection; doubled per consecutive failure up to
    /// `reconnect_backoff_max`.
    pub reconnect_backoff: Duration,
    pub reconnect_backoff_max: Duration,
    /// Consecutive failed attempts (to connect, or a command failing on a fresh
    /// connection) before [`StreamConsumer::run`](super::StreamConsumer::run) gives up.
    pub reconnect_attempts: u32,
    /// The longest wait for a connection and for an answer (beyond `block` for a blocking
    /// read).
    pub command_timeout: Duration,
    /// The connection's `CLIENT SETNAME` (default [`StreamSettings::default_client_name`]),
    /// so an operator can find it in `CLIENT LIST`.
    pub client_name: Option<String>,
}

impl StreamSettings {
    pub fn new(stream: &str, group: &str, consumer: &str) -> Self {
        Self {
            stream: stream.to_owned(),
            group: group.to_owned(),
            consumer: consumer.to_owned(),
            start_id: "$".to_owned(),
            batch: 64,
            block: Duration::from_secs(2),
            claim_idle: Duration::from_secs(60),
            claim_every: Duration::from_secs(30),
            max_attempts: 5,
            park_after: Duration::from_secs(300),
            parked_stream: format!("{stream}:parked"),
            retry_backoff: Duration::from_millis(200),
            retry_backoff_max: Duration::from_secs(30),
            reconnect_backoff: Duration::from_millis(100),
            reconnect_backoff_max: Duration::from_secs(5),
            reconnect_attempts: 10,
            command_timeout: Duration::from_secs(5),
            client_name: None,
        }
    }

    /// `pnc:{stream}:{group}:{consumer}`, with whitespace and control characters (which
    /// Redis refuses in a client name) replaced by `_`.
    pub fn default_client_name(&self) -> String {
        format!("pnc:{}:{}:{}", self.stream, self.group, self.consumer)
            .chars()
            .map(|c| if c.is_ascii_graphic() { c } else { '_' })
            .collect()
    }

    /// The name the connection is given.
    pub fn effective_client_name(&self) -> String {
        self.client_name
            .clone()
            .unwrap_or_else(|| self.default_client_name())
    }
}

/// The most entries one read may ask for.
pub const BATCH_MAX: usize = 10_000;

pub(super) fn validate(s: &StreamSettings) -> Result<(), StreamError> {
    let invalid = |what: &'static str, reason: &str| {
        Err(StreamError::Invalid {
            what,
            reason: reason.to_owned(),
        })
    };
    if s.stream.is_empty() {
        return invalid("stream", "must not be empty");
    }
    if s.group.is_empty() {
        return invalid("group", "must not be empty");
    }
    if s.consumer.is_empty() {
        return invalid("consumer", "must not be empty");
    }
    if s.start_id.is_empty() {
        return invalid("start_id", "must not be empty (`$` or `0`)");
    }
    if s.batch < 1 || s.batch > BATCH_MAX {
        return invalid(
            "batch",
            &format!("must be 1 to {BATCH_MAX}, is {}", s.batch),
        );
    }
    if s.block < Duration::from_millis(1) {
        return invalid("block", "must be at least 1 ms (0 would block forever)");
    }
    if s.max_attempts < 1 {
        return invalid("max_attempts", "must be at least 1");
    }
    // Zero would spin: a claim due again at once never lets a read of new entries run,
    // and a retry without a pause re-reads the entry in a hot loop.
    for (what, d) in [
        ("claim_every", s.claim_every),
        ("claim_idle", s.claim_idle),
        ("retry_backoff", s.retry_backoff),
        ("command_timeout", s.command_timeout),
    ] {
        if d.is_zero() {
            return invalid(what, "must be above zero");
        }
    }
    if s.reconnect_attempts < 1 {
        return invalid("reconnect_attempts", "must be at least 1");
    }
    if s.parked_stream == s.stream {
        return invalid("parked_stream", "must not be the stream itself");
    }
    if s.parked_stream.is_empty() {
        return invalid("parked_stream", "must not be empty");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis_streams::StreamConsumer;

    #[test]
    fn settings_out_of_range_are_refused_by_name() {
        let ok = StreamSettings::new("s", "g", "c");
        assert!(validate(&ok).is_ok());
        let refused = |change: &dyn Fn(&mut StreamSettings)| {
            let mut s = ok.clone();
            change(&mut s);
            match validate(&s) {
                Err(StreamError::Invalid { what, .. }) => what,
                other => panic!("expected Invalid, got {other:?}"),
            }
        };
        assert_eq!(refused(&|s| s.batch = 0), "batch");
        assert_eq!(refused(&|s| s.batch = BATCH_MAX + 1), "batch");
        assert_eq!(refused(&|s| s.block = Duration::ZERO), "block");
        assert_eq!(refused(&|s| s.block = Duration::from_micros(999)), "block");
        assert_eq!(refused(&|s| s.max_attempts = 0), "max_attempts");
        assert_eq!(refused(&|s| s.reconnect_attempts = 0), "reconnect_attempts");
        assert_eq!(
            refused(&|s| s.parked_stream = "s".to_owned()),
            "parked_stream"
        );
        assert_eq!(refused(&|s| s.start_id = String::new()), "start_id");
        assert_eq!(refused(&|s| s.claim_every = Duration::ZERO), "claim_every");
        assert_eq!(refused(&|s| s.claim_idle = Duration::ZERO), "claim_idle");
        assert_eq!(
            refused(&|s| s.retry_backoff = Duration::ZERO),
            "retry_backoff"
        );
        assert_eq!(
            refused(&|s| s.command_timeout = Duration::ZERO),
            "command_timeout"
        );
        let mut edge = ok.clone();
        edge.batch = BATCH_MAX;
        edge.block = Duration::from_millis(1);
        edge.max_attempts = 1;
        edge.reconnect_attempts = 1;
        assert!(validate(&edge).is_ok());
        let e = StreamConsumer::new("redis://127.0.0.1:6379", {
            let mut s = ok.clone();
            s.batch = 0;
            s
        })
        .err()
        .expect("refused");
        assert!(e.to_string().contains("`batch`"), "{e}");
    }
}
