//! `[transfers]`: merchant transfers started through paynotify, their caps, and how they are
//! followed until they are final.

use serde::Deserialize;

use crate::config::value::{ConfigError, Validate, invalid};

/// The largest cap either limit takes: 100,000,000 yuan.
const MAX_CAP_FEN: i64 = 10_000_000_000;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TransferSettings {
    /// `POST /transfers` and cancel answer 403 until true. The job and the notify routes run
    /// regardless: a transfer started before must still finish.
    pub enabled: bool,
    /// A transfer the provider accepted is first queried this long after.
    pub query_after_secs: u64,
    /// Then every this many seconds until it is final.
    pub query_every_secs: u64,
    /// One transfer at most this many fen: more is 422 `OVER_MAX_AMOUNT`.
    pub max_amount_fen: i64,
    /// Per account, the transfers created since Beijing midnight other than `FAIL` and
    /// `CANCELLED`, the new one included, at most this many fen: more is 422
    /// `OVER_DAILY_LIMIT`.
    pub daily_limit_fen: i64,
    /// Sent as `notify_url` in WeChat creates (this service's public
    /// `/notify/wechat/transfer`); empty: not sent, and the job alone follows them.
    pub wechat_notify_url: String,
    /// A transfer whose provider did not answer is sent again (same `out_bill_no`, same
    /// fields) after 5 s, then twice as long each time, at most this long apart.
    pub max_retry_secs: u64,
    /// How often the job looks for transfers that are due, and how many it takes a run.
    pub scan_every_secs: u64,
    pub batch: u32,
}

impl Default for TransferSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            query_after_secs: 60,
            query_every_secs: 300,
            max_amount_fen: 20_000,
            daily_limit_fen: 1_000_000,
            wechat_notify_url: String::new(),
            max_retry_secs: 300,
            scan_every_secs: 10,
            batch: 100,
        }
    }
}

impl Validate for TransferSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        let day = 86_400;
        for (key, value, low) in [
            ("transfers.query_after_secs", self.query_after_secs, 0),
            ("transfers.query_every_secs", self.query_every_secs, 1),
            ("transfers.max_retry_secs", self.max_retry_secs, 5),
            ("transfers.scan_every_secs", self.scan_every_secs, 1),
        ] {
            if !(low..=day).contains(&value) {
                return Err(invalid(key, format!("must be between {low} and {day}")));
            }
        }
        for (key, value) in [
            ("transfers.max_amount_fen", self.max_amount_fen),
            ("transfers.daily_limit_fen", self.daily_limit_fen),
        ] {
            if !(1..=MAX_CAP_FEN).contains(&value) {
                return Err(invalid(key, format!("must be between 1 and {MAX_CAP_FEN}")));
            }
        }
        if !(1..=10_000).contains(&self.batch) {
            return Err(invalid("transfers.batch", "must be between 1 and 10000"));
        }
        if !self.wechat_notify_url.is_empty() {
            // WeChat calls it from outside: https, a host, no query (WeChat refuses one).
            let url = &self.wechat_notify_url;
            let parsed = reqwest::Url::parse(url).ok();
            if !parsed.is_some_and(|u| {
                u.scheme() == "https" && u.host_str().is_some() && u.query().is_none()
            }) {
                return Err(invalid(
                    "transfers.wechat_notify_url",
                    format!(
                        "{url} is not an https URL without a query (this service's public /notify/wechat/transfer)"
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Change = fn(&mut TransferSettings);

    #[test]
    fn each_out_of_range_value_names_its_key() {
        assert!(TransferSettings::default().validate().is_ok());
        let cases: [(&str, Change); 8] = [
            ("transfers.query_every_secs", |s| s.query_every_secs = 0),
            ("transfers.query_after_secs", |s| {
                s.query_after_secs = 86_401
            }),
            ("transfers.max_retry_secs", |s| s.max_retry_secs = 1),
            ("transfers.scan_every_secs", |s| s.scan_every_secs = 0),
            ("transfers.batch", |s| s.batch = 0),
            ("transfers.max_amount_fen", |s| s.max_amount_fen = 0),
            ("transfers.daily_limit_fen", |s| {
                s.daily_limit_fen = MAX_CAP_FEN + 1
            }),
            ("transfers.wechat_notify_url", |s| {
                s.wechat_notify_url = "ftp://example.com/notify".into();
            }),
        ];
        for (key, change) in cases {
            let mut s = TransferSettings::default();
            change(&mut s);
            let err = s.validate().expect_err(key).to_string();
            assert!(err.contains(key), "{key}: {err}");
        }
    }
}
