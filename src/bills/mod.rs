//! The daily bill reconciliation (对账): every provider's bill of a day against the ledger's
//! payments and refunds of that provider-local day, the last safety net for a payment that
//! slipped past notification and query.
//!
//! A run of (bill date, channel) holds a lease (`bill_run`), so one instance does it. Each
//! account's bill is fetched and checked by its provider ([`BillSource`]), streamed into
//! `bill_line`, and compared with set-based SQL (`store/comparison.rs`); only the
//! differences come back. **The bill is evidence, never a payment**: a payment the bill has
//! and the ledger lacks is asked about at the provider, and only its signed answer goes
//! through the ledger (one `ORDER_PAID`; the notification that comes later is a duplicate).
//! What the ledger has and the bill does not, or has with another amount, is raised once as
//! a `PAYMENT_ANOMALY` (`BILL_MISMATCH`). A difference near midnight that the other side
//! dates to the next day is `pending`, and compared again by the runs of the next
//! `bills.settle_days` days.

pub mod compare;
pub mod read;
pub mod report;
pub mod run;
pub mod settings;
pub mod store;

use std::sync::Arc;
use std::time::Duration;

use chrono::{NaiveDate, TimeZone};

use crate::certificates::Certificates;
use crate::channel::api::ProviderApi;
use crate::channel::bill::BillSource;
use crate::metrics::Metrics;
use crate::store::Store;
use crate::time::{Clock, Timestamp};
use settings::BillSettings;

pub use compare::{MAX_DIFFERENCES, TIMING_WINDOW_SECS};
pub use run::RunError;

/// Every provider's bills and what is needed to act on them.
pub struct Bills {
    sources: Vec<Arc<dyn BillSource>>,
    apis: Vec<Arc<dyn ProviderApi>>,
    certificates: Arc<Certificates>,
    store: Store,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    zone: chrono_tz::Tz,
    settle_days: i64,
    download_timeout: Duration,
    owner: String,
    /// Runs started by this instance: each run's lease is its own (`owner` and this).
    runs: std::sync::atomic::AtomicU64,
}

impl Bills {
    pub fn new(
        sources: Vec<Arc<dyn BillSource>>,
        apis: Vec<Arc<dyn ProviderApi>>,
        certificates: Arc<Certificates>,
        store: Store,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
        settings: &BillSettings,
    ) -> Result<Self, crate::config::ConfigError> {
        // The lease's owner: two instances must never share one (in containers every process
        // is PID 1), so no token, no start.
        let token = crate::random::token(b"0123456789abcdef", 16).map_err(|_| {
            crate::config::value::invalid(
                "bills",
                "no random number generator for the run's lease owner",
            )
        })?;
        Ok(Self {
            sources,
            apis,
            certificates,
            store,
            metrics,
            clock,
            zone: settings.timezone,
            settle_days: i64::from(settings.settle_days),
            download_timeout: Duration::from_secs(settings.download_timeout_secs),
            owner: format!("bills-{}-{token}", std::process::id()),
            runs: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Whether any account's bills can be fetched now.
    pub fn fetches(&self) -> bool {
        self.sources.iter().any(|s| !s.accounts().is_empty())
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The provider-local day before `now`: what the daily job reconciles.
    pub fn yesterday(&self, now: Timestamp) -> NaiveDate {
        yesterday_in(self.zone, now)
    }

    pub fn zone(&self) -> chrono_tz::Tz {
        self.zone
    }

    /// `[start, end)` of `date` in `bills.timezone`.
    fn day(&self, date: NaiveDate) -> (Timestamp, Timestamp) {
        day_in(self.zone, date)
    }
}

/// The day before `now`'s date in `zone`.
pub fn yesterday_in(zone: chrono_tz::Tz, now: Timestamp) -> NaiveDate {
    let today = now.as_datetime().with_timezone(&zone).date_naive();
    today.pred_opt().unwrap_or(today)
}

/// `[start, end)` of `date` in `zone`: from its midnight to the next. Where a zone's clock
/// skips midnight, the day starts at the first hour that exists.
pub fn day_in(zone: chrono_tz::Tz, date: NaiveDate) -> (Timestamp, Timestamp) {
    let start = |d: NaiveDate| {
        let at = (0..3)
            .find_map(|hour| {
                let local = d.and_hms_opt(hour, 0, 0)?;
                zone.from_local_datetime(&local).earliest()
            })
            .map_or_else(
                || d.and_time(chrono::NaiveTime::MIN).and_utc(),
                |t| t.with_timezone(&chrono::Utc),
            );
        Timestamp::new(at)
    };
    let next = date.succ_opt().unwrap_or(date);
    (start(date), start(next))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bills::report::{Item, ItemType, OurTotals, Report, Resolution, Status, exit_code};
    use crate::channel::bill::BillTotals;
    use crate::notice::ChannelId;

    fn utc(text: &str) -> Timestamp {
        Timestamp::new(
            chrono::DateTime::parse_from_rfc3339(text)
                .map(|t| t.with_timezone(&chrono::Utc))
                .unwrap_or_default(),
        )
    }

    #[test]
    fn a_bill_date_is_a_day_in_the_providers_zone() {
        let date = NaiveDate::from_ymd_opt(2026, 11, 30).unwrap_or_default();
        let (start, end) = day_in(chrono_tz::Asia::Shanghai, date);
        assert_eq!(start, utc("2026-11-29T16:00:00Z"));
        assert_eq!(end, utc("2026-11-30T16:00:00Z"));
        // 00:30 on 12-01 in Beijing is still 11-30 in UTC: yesterday is 11-30 all the same.
        assert_eq!(
            yesterday_in(chrono_tz::Asia::Shanghai, utc("2026-11-30T16:30:00Z")),
            date
        );
        assert_eq!(
            yesterday_in(chrono_tz::UTC, utc("2026-11-30T16:30:00Z")),
            NaiveDate::from_ymd_opt(2026, 11, 29).unwrap_or_default()
        );
        // A day of 23 hours where the clock moves (Europe/Berlin, 2026-03-29).
        let spring = NaiveDate::from_ymd_opt(2026, 3, 29).unwrap_or_default();
        let (s, e) = day_in(chrono_tz::Europe::Berlin, spring);
        assert_eq!(e.unix_seconds() - s.unix_seconds(), 23 * 3600);
    }

    fn report(status: Status) -> Report {
        Report {
            date: "2026-11-30".into(),
            channel: ChannelId::Wechat,
            account: "1900000001".into(),
            integrity: crate::channel::bill::Integrity::SignedHash,
            status,
            reason: None,
            fetched_at: Timestamp::new(chrono::Utc::now()),
            provider: BillTotals::default(),
            ours: OurTotals::default(),
            items: Vec::new(),
        }
    }

    #[test]
    fn the_exit_code_is_the_worst_report() {
        use Status::*;
        assert_eq!(exit_code(&[report(Balanced), report(Balanced)]), 0);
        assert_eq!(exit_code(&[report(Balanced), report(Mismatched)]), 1);
        assert_eq!(exit_code(&[report(Mismatched), report(Unavailable)]), 2);
        assert_eq!(exit_code(&[report(Unavailable), report(Balanced)]), 2);
    }

    #[test]
    fn only_an_open_item_makes_a_report_mismatched() {
        let item = |resolution| Item {
            kind: ItemType::MissingHere,
            out_trade_no: "A".into(),
            out_refund_no: None,
            transaction_id: None,
            provider: None,
            ours: None,
            resolution,
        };
        assert_eq!(Report::status_of(&[]), Status::Balanced);
        assert_eq!(
            Report::status_of(&[item(Resolution::Pending), item(Resolution::Recovered)]),
            Status::Balanced
        );
        assert_eq!(
            Report::status_of(&[item(Resolution::Pending), item(Resolution::Open)]),
            Status::Mismatched
        );
    }

    #[test]
    fn raised_types_are_what_the_ledger_counts_that_the_provider_does_not() {
        let raised: Vec<&str> = ItemType::ALL
            .into_iter()
            .filter(|t| t.raised())
            .map(ItemType::as_str)
            .collect();
        assert_eq!(
            raised,
            [
                "MISSING_AT_PROVIDER",
                "AMOUNT_MISMATCH",
                "REFUND_MISSING_AT_PROVIDER",
                "REFUND_AMOUNT_MISMATCH"
            ]
        );
    }

    #[test]
    fn run_at_is_a_daily_cron_expression() {
        let mut settings = BillSettings::default();
        assert_eq!(Bills::schedule(&settings), "0 30 10 * * *");
        settings.run_at = chrono::NaiveTime::from_hms_opt(7, 5, 0).expect("a time");
        assert_eq!(Bills::schedule(&settings), "0 5 7 * * *");
    }

    #[test]
    fn run_at_and_timezone_are_read_once_and_a_mistake_is_refused() {
        let read = |fields: serde_json::Value| serde_json::from_value::<BillSettings>(fields);
        let s = read(serde_json::json!({"run_at": "07:05", "timezone": "Europe/Berlin"}))
            .expect("valid");
        assert_eq!(Bills::schedule(&s), "0 5 7 * * *");
        assert_eq!(s.timezone, chrono_tz::Tz::Europe__Berlin);
        assert!(
            s.zone_warning()
                .is_some_and(|w| w.contains("Europe/Berlin"))
        );
        assert!(BillSettings::default().zone_warning().is_none());
        for bad in ["7", "25:00", "10:60", "10.30", ""] {
            let e = read(serde_json::json!({ "run_at": bad })).expect_err(bad);
            assert!(e.to_string().contains("HH:MM"), "{bad}: {e}");
        }
        let e = read(serde_json::json!({"timezone": "Mars/Olympus"})).expect_err("no such zone");
        assert!(e.to_string().contains("IANA"), "{e}");
    }

    #[test]
    fn settings_mistakes_name_the_key() {
        use crate::config::value::Validate;
        let names = |s: BillSettings, key: &str| {
            s.validate()
                .err()
                .is_some_and(|e| e.to_string().contains(key))
        };
        assert!(BillSettings::default().validate().is_ok());
        let settle = BillSettings {
            settle_days: 8,
            ..BillSettings::default()
        };
        assert!(names(settle, "bills.settle_days"));
        let timeout = BillSettings {
            download_timeout_secs: 0,
            ..BillSettings::default()
        };
        assert!(names(timeout, "bills.download_timeout_secs"));
    }
}
