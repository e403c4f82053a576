//! `[bills]`: the daily bill reconciliation (对账): when it runs, which day a bill is of,
//! and how long a difference that may be timing stays `pending`.

use chrono::NaiveTime;
use serde::Deserialize;

use crate::config::value::{ConfigError, Validate, invalid};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BillSettings {
    /// Runs the daily job (it needs API credentials; the admin call and the CLI run either
    /// way).
    pub enabled: bool,
    /// The wall-clock time in `timezone` the job reconciles the day before at (`HH:MM`):
    /// after the providers publish their bills (WeChat about 10:00, Alipay about 09:00,
    /// Beijing time).
    pub run_at: String,
    /// An IANA time zone: a bill date is a provider-local day, and the ledger's payments
    /// of that day are those recorded between its midnights in this zone. Both providers'
    /// bill days are Beijing days: `Asia/Shanghai`, and a warning at start-up for any other.
    pub timezone: String,
    /// A difference that can be timing (a payment near midnight that the other side dates
    /// to the day next to it) is `pending` for this many days, then reported.
    pub settle_days: u32,
    /// How long downloading one bill file may take in all (a month's end can be large).
    pub download_timeout_secs: u64,
}

impl Default for BillSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            run_at: "10:30".to_owned(),
            timezone: "Asia/Shanghai".to_owned(),
            settle_days: 1,
            download_timeout_secs: 300,
        }
    }
}

impl BillSettings {
    /// `timezone`, checked by [`Validate`].
    pub fn zone(&self) -> Result<chrono_tz::Tz, ConfigError> {
        self.timezone.parse().map_err(|_| {
            invalid(
                "bills.timezone",
                format!(
                    "{:?} is not an IANA time zone (Asia/Shanghai)",
                    self.timezone
                ),
            )
        })
    }

    /// What start-up warns about a `timezone` other than Beijing's: WeChat's and Alipay's
    /// bills are of Beijing days, so the ledger's day in another zone is hours off theirs
    /// and payments near midnight are compared with the wrong day.
    pub fn zone_warning(&self) -> Option<String> {
        const BEIJING: [&str; 5] = [
            "Asia/Shanghai",
            "Asia/Chongqing",
            "Asia/Chungking",
            "Asia/Harbin",
            "PRC",
        ];
        (!BEIJING.contains(&self.timezone.as_str())).then(|| {
            format!(
                "bills.timezone is {:?}: WeChat Pay's and Alipay's bills are of Beijing days (Asia/Shanghai), so the ledger's day is compared with another day than the bill's",
                self.timezone
            )
        })
    }

    /// `run_at`, checked by [`Validate`].
    pub fn run_time(&self) -> Result<NaiveTime, ConfigError> {
        NaiveTime::parse_from_str(&self.run_at, "%H:%M").map_err(|_| {
            invalid(
                "bills.run_at",
                format!("{:?} is not a time of day as HH:MM (10:30)", self.run_at),
            )
        })
    }
}

impl Validate for BillSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        self.zone()?;
        self.run_time()?;
        if self.settle_days > 7 {
            return Err(invalid("bills.settle_days", "must be between 0 and 7"));
        }
        if !(1..=3600).contains(&self.download_timeout_secs) {
            return Err(invalid(
                "bills.download_timeout_secs",
                "must be between 1 and 3600",
            ));
        }
        Ok(())
    }
}
