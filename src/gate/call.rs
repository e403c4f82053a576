//! What the gate asks Redis for a notice, as commands in a pipeline.

use redis::Pipeline;

/// One notice's gate call, queued for the next round trip.
pub(super) enum Call {
    /// Before the ledger: read the cached answer under `key`, take `marker` if nobody holds
    /// it. Replies: the cached answer, and `OK` if the marker was taken.
    Enter {
        key: String,
        marker: String,
        ttl_ms: u64,
    },
    /// After the ledger: cache `answer` under `key` (`None`: nothing final to cache) and give
    /// `marker` back (`None`: none was taken). No reply; nobody waits for it.
    Leave {
        key: String,
        answer: Option<String>,
        marker: Option<String>,
        ttl_secs: u64,
    },
}

impl Call {
    pub(super) fn commands(&self, pipe: &mut Pipeline) {
        match self {
            Self::Enter {
                key,
                marker,
                ttl_ms,
            } => {
                pipe.get(key)
                    .cmd("SET")
                    .arg(marker)
                    .arg(1)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms);
            }
            Self::Leave {
                key,
                answer,
                marker,
                ttl_secs,
            } => {
                if let Some(answer) = answer {
                    pipe.set_ex(key, answer, *ttl_secs).ignore();
                }
                if let Some(marker) = marker {
                    pipe.del(marker).ignore();
                }
            }
        }
    }

    /// How many replies its commands give (the others are ignored).
    pub(super) fn replies(&self) -> usize {
        match self {
            Self::Enter { .. } => 2,
            Self::Leave { .. } => 0,
        }
    }

    /// Whether it gives a marker back, which is tried even while the breaker is open (the
    /// marker would block its key until its TTL otherwise).
    pub(super) fn releases(&self) -> bool {
        matches!(
            self,
            Self::Leave {
                marker: Some(_),
                ..
            }
        )
    }
}
