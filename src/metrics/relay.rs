//! Gauges read from the database at each scrape or relay tick: the outbox, the pool and
//! group apply.

use super::Metrics;

impl Metrics {
    /// The outbox gauges, from what the database reported: messages pending and dead, and
    /// how long the oldest pending one has waited.
    pub fn outbox(&self, pending: i64, dead: i64, oldest_pending_secs: i64) {
        self.relay_pending.set(pending);
        self.relay_dead.set(dead);
        self.relay_oldest_pending_seconds
            .set(oldest_pending_secs.max(0));
    }

    /// The pool gauges: connections in use, idle, and callers waiting for one.
    pub fn pool(&self, (in_use, idle, waiting): (usize, usize, usize)) {
        for (label, value) in [("in_use", in_use), ("idle", idle), ("waiting", waiting)] {
            self.db_pool
                .with_label_values(&[label])
                .set(i64::try_from(value).unwrap_or(i64::MAX));
        }
    }

    /// Group apply since start-up (`Store::group_stats`): groups, the payments they carried,
    /// and groups that failed as a whole.
    pub fn groups(&self, groups: u64, payments: u64, failed: u64) {
        // Two scrapes at once must not both add the same difference.
        static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = ONE_AT_A_TIME
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for (counter, total) in [
            (&self.ledger_groups, groups),
            (&self.ledger_group_payments, payments),
            (&self.ledger_group_failures, failed),
        ] {
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    }
}
