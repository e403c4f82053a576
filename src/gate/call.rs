//! What the gate asks Redis for a notice, as commands in a pipeline.
//!
//! A notice has one key (`Gate::key`) whose value is either [`MARKER`] (someone is applying
//! it now) or the final answer (`{tag:x}:{digest}`), so a first delivery sends two commands:
//! `SET key MARKER NX PX ttl GET` before the ledger (Redis 7.0 or later: `NX` with `GET`),
//! and `SET key answer EX ttl` after it, which replaces the marker with the answer.

use redis::Pipeline;

/// The value of a key while a request applies its notice. A cached answer always has a `:`
/// (`{tag:x}:{digest}`), so no answer equals it.
pub(super) const MARKER: &str = "applying";

/// One notice's gate call, queued for the next round trip.
pub(super) enum Call {
    /// Before the ledger: set `key` to [`MARKER`] for `ttl_ms` unless it has a value, and
    /// read the value it had. Reply: that value (nil: the marker is ours now).
    Enter { key: String, ttl_ms: u64 },
    /// After the ledger: cache `answer` under `key`, which replaces the marker (`None`:
    /// nothing final to cache, and the marker, if `held`, is deleted). No reply; nobody waits
    /// for it.
    Leave {
        key: String,
        answer: Option<String>,
        held: bool,
        ttl_secs: u64,
    },
}

impl Call {
    pub(super) fn commands(&self, pipe: &mut Pipeline) {
        match self {
            Self::Enter { key, ttl_ms } => {
                pipe.cmd("SET")
                    .arg(key)
                    .arg(MARKER)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms)
                    .arg("GET");
            }
            Self::Leave {
                key,
                answer: Some(answer),
                ttl_secs,
                ..
            } => {
                pipe.cmd("SET")
                    .arg(key)
                    .arg(answer)
                    .arg("EX")
                    .arg(ttl_secs)
                    .ignore();
            }
            Self::Leave {
                key,
                answer: None,
                held: true,
                ..
            } => {
                pipe.del(key).ignore();
            }
            Self::Leave { .. } => {}
        }
    }

    /// How many replies its commands give (the others are ignored).
    pub(super) fn replies(&self) -> usize {
        match self {
            Self::Enter { .. } => 1,
            Self::Leave { .. } => 0,
        }
    }

    /// Whether it sends nothing (a `Leave` with neither an answer nor a marker).
    pub(super) fn is_empty(&self) -> bool {
        matches!(
            self,
            Self::Leave {
                answer: None,
                held: false,
                ..
            }
        )
    }

    /// Whether it gives a marker back, which is tried even while the breaker is open (the
    /// marker would block its key until its TTL otherwise).
    pub(super) fn releases(&self) -> bool {
        matches!(self, Self::Leave { held: true, .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The commands of a call, as Redis receives them.
    fn sent(call: &Call) -> Vec<Vec<String>> {
        let mut pipe = redis::pipe();
        call.commands(&mut pipe);
        pipe.cmd_iter()
            .map(|cmd| {
                cmd.args_iter()
                    .map(|arg| match arg {
                        redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                        _ => "<other>".to_owned(),
                    })
                    .collect()
            })
            .collect()
    }

    fn words(command: &str) -> Vec<String> {
        command.split(' ').map(str::to_owned).collect()
    }

    #[test]
    fn a_first_delivery_is_two_commands_on_one_key() {
        let enter = Call::Enter {
            key: "p:{A1}:pay:wechat".into(),
            ttl_ms: 2000,
        };
        assert_eq!(
            sent(&enter),
            [words("SET p:{A1}:pay:wechat applying NX PX 2000 GET")]
        );
        assert_eq!(enter.replies(), 1);
        let leave = Call::Leave {
            key: "p:{A1}:pay:wechat".into(),
            answer: Some("7:abc".into()),
            held: true,
            ttl_secs: 60,
        };
        assert_eq!(sent(&leave), [words("SET p:{A1}:pay:wechat 7:abc EX 60")]);
        assert!(leave.releases() && !leave.is_empty());
    }

    #[test]
    fn a_marker_without_an_answer_is_deleted_and_nothing_else_is_sent() {
        let give_back = Call::Leave {
            key: "k".into(),
            answer: None,
            held: true,
            ttl_secs: 60,
        };
        assert_eq!(sent(&give_back), [words("DEL k")]);
        assert!(give_back.releases());
        let nothing = Call::Leave {
            key: "k".into(),
            answer: None,
            held: false,
            ttl_secs: 60,
        };
        assert!(sent(&nothing).is_empty() && nothing.is_empty() && !nothing.releases());
    }

    #[test]
    fn no_answer_equals_the_marker() {
        assert!(!MARKER.contains(':'));
    }
}
