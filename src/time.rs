//! Time as the service sees it: a UTC instant stored to the microsecond, and an injectable clock.

use std::fmt;
use std::sync::Mutex;

use chrono::{DateTime, SubsecRound, TimeDelta, Utc};
use serde::Serialize;

/// A UTC instant, truncated to microseconds so it survives a database round trip unchanged.
/// Serialised as RFC 3339.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    diesel::AsExpression,
    diesel::FromSqlRow,
)]
#[diesel(sql_type = UtcTs)]
#[serde(transparent)]
pub struct Timestamp(DateTime<Utc>);

/// The SQL type a [`Timestamp`] is stored as: `timestamptz` on PostgreSQL, `DATETIME(6)` in
/// UTC on MySQL, sortable RFC 3339 text on SQLite. Its encodings per backend live with the other SQL types in `store::types`.
#[derive(
    Debug, Clone, Copy, Default, diesel::sql_types::SqlType, diesel::query_builder::QueryId,
)]
#[diesel(postgres_type(oid = 1184, array_oid = 1185))]
#[diesel(mysql_type(name = "DateTime"))]
#[diesel(sqlite_type(name = "Text"))]
pub struct UtcTs;

impl Timestamp {
    pub fn new(at: DateTime<Utc>) -> Self {
        Self(at.trunc_subsecs(6))
    }
    pub fn as_datetime(&self) -> DateTime<Utc> {
        self.0
    }
    pub fn unix_seconds(&self) -> i64 {
        self.0.timestamp()
    }
    pub fn plus_seconds(&self, seconds: i64) -> Self {
        Self(self.0 + TimeDelta::seconds(seconds))
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.to_rfc3339())
    }
}

/// Where "now" comes from: the system clock in production, a hand-set one in tests, so
/// time windows (WeChat's 300 s, backoff, leases, expiry) are tested without sleeping.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Timestamp;
}

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::new(Utc::now())
    }
}

/// A clock that only moves when told to.
#[derive(Debug)]
pub struct ManualClock(Mutex<Timestamp>);

impl ManualClock {
    pub fn new(at: DateTime<Utc>) -> Self {
        Self(Mutex::new(Timestamp::new(at)))
    }
    pub fn set(&self, at: DateTime<Utc>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Timestamp::new(at);
    }
    pub fn advance(&self, seconds: i64) {
        let mut now = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *now = now.plus_seconds(seconds);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
