//! The capped exponential backoff the Redis Streams and RabbitMQ adapters pause by.

use std::time::Duration;

/// `base * 2^(failures-1)`, at most `max` (the factor stops doubling at 2^16).
pub(crate) fn backoff(base: Duration, max: Duration, failures: u32) -> Duration {
    let factor = 1u32 << failures.saturating_sub(1).min(16);
    base.saturating_mul(factor).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let b = |n| backoff(Duration::from_millis(100), Duration::from_secs(1), n);
        assert_eq!(b(1), Duration::from_millis(100));
        assert_eq!(b(2), Duration::from_millis(200));
        assert_eq!(b(4), Duration::from_millis(800));
        assert_eq!(b(5), Duration::from_secs(1));
        assert_eq!(b(40), Duration::from_secs(1));
    }
}
