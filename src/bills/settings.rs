//! `[bills]`: the daily bill reconciliation (对账): when it runs, which day a bill is of,
//! and how long a difference that may be timing stays `pending`.

use chrono::NaiveTime;
use chrono_tz::Tz;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

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
    #[serde(deserialize_with = "hh_mm")]
    pub run_at: NaiveTime,
    /// An IANA time zone: a bill date is a provider-local day, and the ledger's payments
    /// of that day are those recorded between its midnights in this zone. Both providers'
    /// bill days are Beijing days: `Asia/Shanghai`, and a warning at start-up for any other.
    #[serde(deserialize_with = "iana_zone")]
    pub timezone: Tz,
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
            run_at: NaiveTime::from_hms_opt(10, 30, 0).unwrap_or_default(),
            timezone: Tz::Asia__Shanghai,
            settle_days: 1,
            download_timeout_secs: 300,
        }
    }
}

/// `bills.run_at` as written (`HH:MM`), read once: a mistake is a start-up error naming the
/// key, and the schedule cannot fail later.
fn hh_mm<'de, D: Deserializer<'de>>(d: D) -> Result<NaiveTime, D::Error> {
    let text = String::deserialize(d)?;
    NaiveTime::parse_from_str(&text, "%H:%M")
        .map_err(|_| D::Error::custom(format!("{text:?} is not a time of day as HH:MM (10:30)")))
}

/// `bills.timezone` as written (an IANA name), read once.
fn iana_zone<'de, D: Deserializer<'de>>(d: D) -> Result<Tz, D::Error> {
    let text = String::deserialize(d)?;
    text.parse()
        .map_err(|_| D::Error::custom(format!("{text:?} is not an IANA time zone (Asia/Shanghai)")))
}

impl BillSettings {
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
        (!BEIJING.contains(&self.timezone.name())).then(|| {
            format!(
                "bills.timezone is {:?}: WeChat Pay's and Alipay's bills are of Beijing days (Asia/Shanghai), so the ledger's day is compared with another day than the bill's",
                self.timezone.name()
            )
        })
    }
}

impl Validate for BillSettings {
    fn validate(&self) -> Result<(), ConfigError> {
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
