//! The `merchant_account` table: the provider accounts added through `/admin/merchants`, each
//! with its settings in clear and its `keys` object sealed (`seal.rs`). Every instance reads
//! them all at start-up and then the rows changed since its last read.

use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error};
use diesel_async::{AsyncConnection, RunQueryDsl};

use crate::channel::accounts::{AccountSettings, Mode};
use crate::merchants::seal::Sealed;
use crate::notice::ChannelId;
use crate::store::schema::merchant_account;
use crate::store::{Store, StoreError, with_conn};
use crate::time::Timestamp;

/// `status`: a disabled account verifies nothing and is asked nothing; its row stays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Enabled,
    Disabled,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enabled => "enabled",
            Self::Disabled => "disabled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Enabled, Self::Disabled]
            .into_iter()
            .find(|status| status.as_str() == s)
    }
}

/// An account as stored: its keys only sealed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredAccount {
    pub channel: ChannelId,
    pub account: String,
    pub mode: Mode,
    pub sp_account: Option<String>,
    pub settings: AccountSettings,
    pub status: Status,
    /// Bumped by every change; an update names the version it read.
    pub keys_version: i64,
    pub sealed: Sealed,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// Which accounts [`Store::merchants`] lists, sorted by `(channel, account)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MerchantFilter {
    pub channel: Option<ChannelId>,
    pub status: Option<Status>,
    /// Only accounts after this one: the last of the previous page. A page boundary only
    /// with `channel` given (the order is by channel first).
    pub after: Option<String>,
    pub limit: i64,
}

/// A stored row that does not read back as an account: which row, and what is wrong. Read
/// through a statement it is that statement's deserialization error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("merchant_account {channel}/{account}: {problem}")]
pub struct BadRow {
    pub channel: String,
    pub account: String,
    pub problem: String,
}

/// Why [`Store::reseal_merchants`] changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ResealError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// This account could not be resealed (or read): every row is left as it was.
    #[error("{channel}/{account}: {message}")]
    Account {
        channel: String,
        account: String,
        message: String,
    },
}

impl From<Error> for ResealError {
    fn from(error: Error) -> Self {
        Self::Store(error.into())
    }
}

/// One row as stored.
#[derive(Debug, Clone, Queryable, Selectable, Insertable)]
#[diesel(table_name = merchant_account)]
struct Row {
    channel: String,
    account: String,
    mode: String,
    sp_account: Option<String>,
    settings: String,
    status: String,
    keys_version: i64,
    key_id: String,
    sealed_keys: String,
    created_at: Timestamp,
    updated_at: Timestamp,
}

impl Row {
    fn from_account(a: &StoredAccount) -> Result<Self, Error> {
        Ok(Self {
            channel: a.channel.as_str().to_owned(),
            account: a.account.clone(),
            mode: a.mode.as_str().to_owned(),
            sp_account: a.sp_account.clone(),
            settings: serde_json::to_string(&a.settings)
                .map_err(|e| Error::SerializationError(Box::new(e)))?,
            status: a.status.as_str().to_owned(),
            keys_version: a.keys_version,
            key_id: a.sealed.key_id.clone(),
            sealed_keys: a.sealed.to_base64(),
            created_at: a.created_at,
            updated_at: a.updated_at,
        })
    }

    fn into_account(self) -> Result<StoredAccount, BadRow> {
        let bad = |problem: String| BadRow {
            channel: self.channel.clone(),
            account: self.account.clone(),
            problem,
        };
        let channel = ChannelId::parse(&self.channel)
            .ok_or_else(|| bad("channel is not wechat or alipay".to_owned()))?;
        let mode = Mode::parse(&self.mode)
            .ok_or_else(|| bad(format!("mode {:?} is not direct or partner_sub", self.mode)))?;
        let status = Status::parse(&self.status).ok_or_else(|| {
            bad(format!(
                "status {:?} is not enabled or disabled",
                self.status
            ))
        })?;
        let settings: AccountSettings = serde_json::from_str(&self.settings)
            .map_err(|e| bad(format!("settings is not the JSON of account settings: {e}")))?;
        let sealed = Sealed::from_base64(self.key_id.clone(), &self.sealed_keys)
            .map_err(|_| bad("sealed_keys is not base64".to_owned()))?;
        Ok(StoredAccount {
            channel,
            account: self.account,
            mode,
            sp_account: self.sp_account,
            settings,
            status,
            keys_version: self.keys_version,
            sealed,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

/// The account of `row`, or the statement's error naming it.
fn read(row: Row) -> Result<StoredAccount, StoreError> {
    row.into_account()
        .map_err(|bad| StoreError::Query(Error::DeserializationError(Box::new(bad))))
}

/// The accounts of `rows`; the first that does not read back fails them all, naming itself.
fn accounts(rows: Vec<Row>) -> Result<Vec<StoredAccount>, StoreError> {
    rows.into_iter().map(read).collect()
}

impl Store {
    /// Stores a new account; `false` when `(channel, account)` is stored already (disabled
    /// ones included).
    pub async fn insert_merchant(&self, a: &StoredAccount) -> Result<bool, StoreError> {
        let row = Row::from_account(a)?;
        let inserted: Result<usize, Error> = with_conn!(self, conn => {
            diesel::insert_into(merchant_account::table)
                .values(&row)
                .execute(conn)
                .await
        });
        match inserted {
            Ok(_) => Ok(true),
            Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn merchant(
        &self,
        channel: ChannelId,
        account: &str,
    ) -> Result<Option<StoredAccount>, StoreError> {
        let row: Option<Row> = with_conn!(self, conn => {
            merchant_account::table
                .find((channel.as_str(), account))
                .select(Row::as_select())
                .first(conn)
                .await
                .optional()?
        });
        row.map(read).transpose()
    }

    /// A page of accounts, sorted by `(channel, account)`.
    pub async fn merchants(
        &self,
        filter: &MerchantFilter,
    ) -> Result<Vec<StoredAccount>, StoreError> {
        let rows: Vec<Row> = with_conn!(self, conn => {
            let mut query = merchant_account::table
                .select(Row::as_select())
                .order((merchant_account::channel, merchant_account::account))
                .limit(filter.limit.max(0))
                .into_boxed();
            if let Some(channel) = filter.channel {
                query = query.filter(merchant_account::channel.eq(channel.as_str()));
            }
            if let Some(status) = filter.status {
                query = query.filter(merchant_account::status.eq(status.as_str()));
            }
            if let Some(after) = &filter.after {
                query = query.filter(merchant_account::account.gt(after));
            }
            query.load(conn).await?
        });
        accounts(rows)
    }

    /// Replaces the account's settings, status, keys and `updated_at` (and sets its
    /// `keys_version`) if it is still at `expected_version`; `false` when another change
    /// came first (or the account is not stored). Its ids, mode and `sp_account` never change.
    pub async fn update_merchant(
        &self,
        a: &StoredAccount,
        expected_version: i64,
    ) -> Result<bool, StoreError> {
        let row = Row::from_account(a)?;
        let updated = with_conn!(self, conn => {
            diesel::update(
                merchant_account::table
                    .find((&row.channel, &row.account))
                    .filter(merchant_account::keys_version.eq(expected_version)),
            )
            .set((
                merchant_account::settings.eq(&row.settings),
                merchant_account::status.eq(&row.status),
                merchant_account::keys_version.eq(row.keys_version),
                merchant_account::key_id.eq(&row.key_id),
                merchant_account::sealed_keys.eq(&row.sealed_keys),
                merchant_account::updated_at.eq(row.updated_at),
            ))
            .execute(conn)
            .await?
        });
        Ok(updated == 1)
    }

    /// The accounts changed at or after `since`, oldest change first: an instance's reload.
    /// (At, not after: a change stamped the same microsecond as the last read is read again
    /// rather than missed.)
    pub async fn merchants_changed_since(
        &self,
        since: Timestamp,
    ) -> Result<Vec<StoredAccount>, StoreError> {
        let rows: Vec<Row> = with_conn!(self, conn => {
            merchant_account::table
                .filter(merchant_account::updated_at.ge(since))
                .order((
                    merchant_account::updated_at,
                    merchant_account::channel,
                    merchant_account::account,
                ))
                .select(Row::as_select())
                .load(conn)
                .await?
        });
        accounts(rows)
    }

    /// Every stored account, in one statement: start-up.
    pub async fn all_merchants(&self) -> Result<Vec<StoredAccount>, StoreError> {
        let rows: Vec<Row> = with_conn!(self, conn => {
            merchant_account::table
                .order((merchant_account::channel, merchant_account::account))
                .select(Row::as_select())
                .load(conn)
                .await?
        });
        accounts(rows)
    }

    /// How many enabled `partner_sub` accounts of `channel` name `sp_account` as theirs: a
    /// service provider with any cannot be disabled.
    pub async fn count_subs_enabled(
        &self,
        channel: ChannelId,
        sp_account: &str,
    ) -> Result<i64, StoreError> {
        with_conn!(self, conn => {
            Ok(merchant_account::table
                .filter(merchant_account::channel.eq(channel.as_str()))
                .filter(merchant_account::sp_account.eq(sp_account))
                .filter(merchant_account::mode.eq(Mode::PartnerSub.as_str()))
                .filter(merchant_account::status.eq(Status::Enabled.as_str()))
                .count()
                .get_result(conn)
                .await?)
        })
    }

    /// Replaces every account's seal with what `reseal` makes of it, in one transaction:
    /// all or none. The rows are locked first by an update that changes nothing (a row lock
    /// on PostgreSQL and MySQL, the write lock on SQLite), so no change made meanwhile is
    /// lost. `keys_version` and `updated_at` stay: the keys are the same, only their wrapping
    /// changed, and an instance still running with the old master key must not reload rows
    /// it cannot open. Returns how many accounts were resealed.
    pub async fn reseal_merchants(
        &self,
        reseal: impl Fn(&StoredAccount) -> Result<Sealed, String> + Sync,
    ) -> Result<usize, ResealError> {
        let reseal = &reseal;
        with_conn!(self, conn => {
            conn.transaction::<_, ResealError, _>(async |conn| {
                diesel::update(merchant_account::table)
                    .set(merchant_account::key_id.eq(merchant_account::key_id))
                    .execute(conn)
                    .await?;
                let rows: Vec<Row> = merchant_account::table
                    .order((merchant_account::channel, merchant_account::account))
                    .select(Row::as_select())
                    .load(conn)
                    .await?;
                let mut resealed = 0;
                for row in rows {
                    let account = row.into_account().map_err(|bad| ResealError::Account {
                        channel: bad.channel,
                        account: bad.account,
                        message: bad.problem,
                    })?;
                    let sealed = reseal(&account).map_err(|message| ResealError::Account {
                        channel: account.channel.as_str().to_owned(),
                        account: account.account.clone(),
                        message,
                    })?;
                    diesel::update(
                        merchant_account::table
                            .find((account.channel.as_str(), account.account.as_str())),
                    )
                    .set((
                        merchant_account::key_id.eq(&sealed.key_id),
                        merchant_account::sealed_keys.eq(sealed.to_base64()),
                    ))
                    .execute(conn)
                    .await?;
                    resealed += 1;
                }
                Ok(resealed)
            })
            .await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> Row {
        let at = Timestamp::new(chrono::DateTime::UNIX_EPOCH);
        Row {
            channel: "wechat".to_owned(),
            account: "1900000101".to_owned(),
            mode: "direct".to_owned(),
            sp_account: None,
            settings: "{\"appids\":[\"wx1\"]}".to_owned(),
            status: "enabled".to_owned(),
            keys_version: 1,
            key_id: "66687aad".to_owned(),
            sealed_keys: "AAAA".to_owned(),
            created_at: at,
            updated_at: at,
        }
    }

    #[test]
    fn a_row_reads_back_and_writes_the_same() {
        let account = row().into_account().expect("a good row");
        assert_eq!(account.settings.appids, ["wx1"]);
        assert_eq!(account.sealed.bytes, [0, 0, 0]);
        let again = Row::from_account(&account).expect("row");
        assert_eq!(again.into_account().expect("again"), account);
    }

    #[test]
    fn a_row_that_does_not_parse_names_its_account_and_what_is_wrong() {
        type Spoil = fn(&mut Row);
        let cases: [(&str, Spoil); 5] = [
            ("channel", |r| r.channel = "paypal".to_owned()),
            ("mode", |r| r.mode = "isv".to_owned()),
            ("status", |r| r.status = "gone".to_owned()),
            ("settings", |r| r.settings = "{".to_owned()),
            ("sealed_keys", |r| r.sealed_keys = "not base64!".to_owned()),
        ];
        for (what, spoil) in cases {
            let mut r = row();
            spoil(&mut r);
            let err = r.into_account().expect_err(what);
            assert_eq!(err.account, "1900000101", "{what}");
            let message = StoreError::Query(Error::DeserializationError(Box::new(err))).to_string();
            assert!(message.contains("1900000101"), "{message}");
            assert!(message.contains(what), "{message}");
        }
    }

    #[test]
    fn statuses_read_back() {
        for s in [Status::Enabled, Status::Disabled] {
            assert_eq!(Status::parse(s.as_str()), Some(s));
        }
        assert_eq!(Status::parse("Enabled"), None);
    }
}
