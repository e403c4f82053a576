//! The final answers this instance gave lately, by content digest: a repeat delivered to the
//! same instance is answered from memory, without a Redis round trip.
//!
//! A digest names the business content with its order (and refund) number and channel
//! (`Notice::digest`), so it is the whole key: the same digest is the same notification,
//! whatever key the gate stores it under in Redis. Entries live as long as Redis keeps them
//! (`redis.result_ttl_secs`) and at most `capacity` of them are kept, in two generations:
//! when the newer one is full the older one is dropped, so memory stays bounded without a
//! clock sweep and the most recent answers (the ones providers repeat) stay.
//!
//! Every answer is remembered under the database writer's tag (`store/writer.rs`): when the
//! tag changes (a failover), everything remembered before it is forgotten, since the new
//! writer may not have those payments.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::notice::Digest;

pub(super) struct Recent {
    generations: Mutex<Generations>,
    /// Entries per generation; zero: nothing is kept.
    per_generation: usize,
    ttl: Duration,
}

#[derive(Default)]
struct Generations {
    newer: HashMap<Digest, Instant>,
    older: HashMap<Digest, Instant>,
    /// The writer's tag these answers were given under.
    tag: u64,
}

impl Recent {
    pub(super) fn new(capacity: usize, ttl: Duration) -> Self {
        Self {
            generations: Mutex::new(Generations::default()),
            per_generation: capacity / 2,
            ttl,
        }
    }

    /// Whether this content was given a final answer within the TTL, under the writer `tag`.
    pub(super) fn answered(&self, digest: &Digest, tag: u64) -> bool {
        if self.per_generation == 0 {
            return false;
        }
        let Ok(g) = self.generations.lock() else {
            return false;
        };
        if g.tag != tag {
            return false;
        }
        g.newer
            .get(digest)
            .or_else(|| g.older.get(digest))
            .is_some_and(|at| at.elapsed() < self.ttl)
    }

    /// Remembers that this content has its final answer, given under the writer `tag`; a
    /// tag other than the last one forgets every answer given before it.
    pub(super) fn remember(&self, digest: &Digest, tag: u64) {
        if self.per_generation == 0 {
            return;
        }
        let Ok(mut g) = self.generations.lock() else {
            return;
        };
        if g.tag != tag {
            g.newer.clear();
            g.older.clear();
            g.tag = tag;
        }
        if g.newer.len() >= self.per_generation && !g.newer.contains_key(digest) {
            g.older = std::mem::take(&mut g.newer);
        }
        g.newer.insert(digest.clone(), Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(n: usize) -> Digest {
        Digest::of(n.to_string().as_bytes())
    }

    #[test]
    fn keeps_between_half_and_all_of_its_capacity_newest_first() {
        let recent = Recent::new(10, Duration::from_secs(60));
        for n in 0..23 {
            recent.remember(&digest(n), 1);
        }
        // Generations of 5: 20..23 in the newer, 15..20 in the older, the rest dropped.
        assert!((15..23).all(|n| recent.answered(&digest(n), 1)));
        assert!((0..15).all(|n| !recent.answered(&digest(n), 1)));
        assert!(!recent.answered(&digest(99), 1));
    }

    #[test]
    fn remembering_again_does_not_push_others_out() {
        let recent = Recent::new(4, Duration::from_secs(60));
        recent.remember(&digest(1), 1);
        recent.remember(&digest(2), 1);
        for _ in 0..10 {
            recent.remember(&digest(2), 1);
        }
        assert!(recent.answered(&digest(1), 1) && recent.answered(&digest(2), 1));
    }

    #[test]
    fn an_answer_older_than_the_ttl_is_forgotten() {
        let recent = Recent::new(10, Duration::from_millis(30));
        recent.remember(&digest(1), 1);
        assert!(recent.answered(&digest(1), 1));
        std::thread::sleep(Duration::from_millis(40));
        assert!(!recent.answered(&digest(1), 1));
    }

    #[test]
    fn zero_capacity_keeps_nothing() {
        let recent = Recent::new(0, Duration::from_secs(60));
        recent.remember(&digest(1), 1);
        assert!(!recent.answered(&digest(1), 1));
    }

    #[test]
    fn a_new_writer_tag_forgets_every_answer_given_before_it() {
        let recent = Recent::new(10, Duration::from_secs(60));
        recent.remember(&digest(1), 7);
        recent.remember(&digest(2), 7);
        assert!(recent.answered(&digest(1), 7));
        // Asked under the new writer: not trusted, whether or not it was remembered since.
        assert!(!recent.answered(&digest(1), 8));
        recent.remember(&digest(3), 8);
        assert!(recent.answered(&digest(3), 8));
        assert!(!recent.answered(&digest(2), 8));
        // Nor under the old tag again: those answers are gone.
        assert!(!recent.answered(&digest(1), 7));
    }
}
