//! `[refunds]`: how refunds started through paynotify are followed until they are final.

use serde::Deserialize;

use crate::config::value::{ConfigError, Validate, invalid};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RefundSettings {
    /// A refund the provider accepted but has not finished is first queried this long after
    /// it was asked for.
    pub query_after_secs: u64,
    /// Then every this many seconds until it is final.
    pub query_every_secs: u64,
    /// A refund whose provider did not answer is sent again (same refund number, same
    /// amount) after 5 s, then twice as long each time, at most this long apart.
    pub max_retry_secs: u64,
    /// How often the job looks for refunds that are due, and how many it takes a run.
    pub scan_every_secs: u64,
    pub batch: u32,
}

impl Default for RefundSettings {
    fn default() -> Self {
        Self {
            query_after_secs: 60,
            query_every_secs: 300,
            max_retry_secs: 300,
            scan_every_secs: 10,
            batch: 100,
        }
    }
}

impl Validate for RefundSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        let day = 86_400;
        for (key, value, low) in [
            ("refunds.query_after_secs", self.query_after_secs, 0),
            ("refunds.query_every_secs", self.query_every_secs, 1),
            ("refunds.max_retry_secs", self.max_retry_secs, 5),
            ("refunds.scan_every_secs", self.scan_every_secs, 1),
        ] {
            if !(low..=day).contains(&value) {
                return Err(invalid(key, format!("must be between {low} and {day}")));
            }
        }
        if !(1..=10_000).contains(&self.batch) {
            return Err(invalid("refunds.batch", "must be between 1 and 10000"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Change = fn(&mut RefundSettings);

    #[test]
    fn each_out_of_range_value_names_its_key() {
        assert!(RefundSettings::default().validate().is_ok());
        let cases: [(&str, Change); 5] = [
            ("refunds.query_every_secs", |s| s.query_every_secs = 0),
            ("refunds.query_after_secs", |s| s.query_after_secs = 86_401),
            ("refunds.max_retry_secs", |s| s.max_retry_secs = 1),
            ("refunds.scan_every_secs", |s| s.scan_every_secs = 0),
            ("refunds.batch", |s| s.batch = 0),
        ];
        for (key, change) in cases {
            let mut s = RefundSettings::default();
            change(&mut s);
            let err = s.validate().expect_err(key).to_string();
            assert!(err.contains(key), "{key}: {err}");
        }
    }
}
