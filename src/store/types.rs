//! Two SQL types that let one schema serve every backend: `UtcTs` (timestamptz on PostgreSQL,
//! `DATETIME(6)` in UTC on MySQL, sortable RFC 3339 text on SQLite) and `Json` (jsonb on
//! PostgreSQL, `JSON` on MySQL, text on SQLite).

use chrono::{DateTime, Utc};
use diesel::deserialize::{self, FromSql, FromSqlRow};
use diesel::expression::AsExpression;
use diesel::mysql::{Mysql, MysqlValue};
use diesel::pg::{Pg, PgValue};
use diesel::serialize::{self, IsNull, Output, ToSql};
use diesel::sql_types;
use diesel::sqlite::{Sqlite, SqliteValue};

use crate::time::Timestamp;
pub use crate::time::UtcTs;

#[derive(
    Debug, Clone, Copy, Default, diesel::sql_types::SqlType, diesel::query_builder::QueryId,
)]
#[diesel(postgres_type(oid = 3802, array_oid = 3807))]
#[diesel(mysql_type(name = "String"))]
#[diesel(sqlite_type(name = "Text"))]
pub struct Json;

/// A JSON document stored in an outbox row.
#[derive(Debug, Clone, PartialEq, AsExpression, FromSqlRow, serde::Serialize)]
#[diesel(sql_type = Json)]
#[serde(transparent)]
pub struct Payload(pub serde_json::Value);

/// Fixed width, so text order is time order on SQLite.
const SQLITE_TIME_FORMAT: &str = "%Y-%m-%dT%H:%M:%S%.6fZ";

impl ToSql<UtcTs, Pg> for Timestamp {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Pg>) -> serialize::Result {
        let at = self.as_datetime();
        <DateTime<Utc> as ToSql<sql_types::Timestamptz, Pg>>::to_sql(&at, &mut out.reborrow())
    }
}

impl FromSql<UtcTs, Pg> for Timestamp {
    fn from_sql(bytes: PgValue<'_>) -> deserialize::Result<Self> {
        <DateTime<Utc> as FromSql<sql_types::Timestamptz, Pg>>::from_sql(bytes).map(Timestamp::new)
    }
}

impl ToSql<UtcTs, Sqlite> for Timestamp {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Sqlite>) -> serialize::Result {
        out.set_value(self.as_datetime().format(SQLITE_TIME_FORMAT).to_string());
        Ok(IsNull::No)
    }
}

impl FromSql<UtcTs, Sqlite> for Timestamp {
    fn from_sql(value: SqliteValue<'_, '_, '_>) -> deserialize::Result<Self> {
        let text = <String as FromSql<sql_types::Text, Sqlite>>::from_sql(value)?;
        let at = DateTime::parse_from_rfc3339(&text)?;
        Ok(Timestamp::new(at.with_timezone(&Utc)))
    }
}

impl ToSql<Json, Pg> for Payload {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Pg>) -> serialize::Result {
        <serde_json::Value as ToSql<sql_types::Jsonb, Pg>>::to_sql(&self.0, &mut out.reborrow())
    }
}

impl FromSql<Json, Pg> for Payload {
    fn from_sql(bytes: PgValue<'_>) -> deserialize::Result<Self> {
        <serde_json::Value as FromSql<sql_types::Jsonb, Pg>>::from_sql(bytes).map(Payload)
    }
}

impl ToSql<Json, Sqlite> for Payload {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Sqlite>) -> serialize::Result {
        out.set_value(self.0.to_string());
        Ok(IsNull::No)
    }
}

impl FromSql<Json, Sqlite> for Payload {
    fn from_sql(value: SqliteValue<'_, '_, '_>) -> deserialize::Result<Self> {
        let text = <String as FromSql<sql_types::Text, Sqlite>>::from_sql(value)?;
        Ok(Payload(serde_json::from_str(&text)?))
    }
}

impl ToSql<UtcTs, Mysql> for Timestamp {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Mysql>) -> serialize::Result {
        let at = self.as_datetime().naive_utc();
        <chrono::NaiveDateTime as ToSql<sql_types::Datetime, Mysql>>::to_sql(
            &at,
            &mut out.reborrow(),
        )
    }
}

impl FromSql<UtcTs, Mysql> for Timestamp {
    fn from_sql(value: MysqlValue<'_>) -> deserialize::Result<Self> {
        let naive =
            <chrono::NaiveDateTime as FromSql<sql_types::Datetime, Mysql>>::from_sql(value)?;
        Ok(Timestamp::new(naive.and_utc()))
    }
}

impl ToSql<Json, Mysql> for Payload {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Mysql>) -> serialize::Result {
        use std::io::Write;
        out.write_all(self.0.to_string().as_bytes())?;
        Ok(IsNull::No)
    }
}

impl FromSql<Json, Mysql> for Payload {
    fn from_sql(value: MysqlValue<'_>) -> deserialize::Result<Self> {
        Ok(Payload(serde_json::from_slice(value.as_bytes())?))
    }
}
