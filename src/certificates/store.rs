//! The `platform_certificate` table: the certificates downloaded from the providers, shared
//! by every instance and read at start-up.

use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error};
use diesel_async::RunQueryDsl;

use crate::channel::platform::PlatformCertificate;
use crate::notice::ChannelId;
use crate::store::schema::platform_certificate;
use crate::store::{Store, StoreError, with_conn};
use crate::time::Timestamp;

/// One row as stored.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable, Insertable)]
#[diesel(table_name = platform_certificate)]
struct Row {
    channel: String,
    mchid: String,
    serial: String,
    certificate: String,
    effective_at: Timestamp,
    expire_at: Timestamp,
    fetched_at: Timestamp,
}

impl Store {
    /// Stores each certificate, or moves its `fetched_at` when it is stored already (by this
    /// instance or another). One short statement per certificate, outside a transaction: a
    /// duplicate key fails only its own insert. Returns how many were new.
    pub async fn save_certificates(
        &self,
        certificates: &[PlatformCertificate],
    ) -> Result<usize, StoreError> {
        let mut added = 0;
        for c in certificates {
            let row = Row {
                channel: c.channel.as_str().to_owned(),
                mchid: c.account.clone(),
                serial: c.serial.clone(),
                certificate: c.pem.clone(),
                effective_at: c.effective_at,
                expire_at: c.expire_at,
                fetched_at: c.fetched_at,
            };
            let inserted: Result<usize, Error> = with_conn!(self, conn => {
                diesel::insert_into(platform_certificate::table)
                    .values(&row)
                    .execute(conn)
                    .await
            });
            match inserted {
                Ok(_) => added += 1,
                Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => {
                    with_conn!(self, conn => {
                        diesel::update(
                            platform_certificate::table
                                .filter(platform_certificate::channel.eq(&row.channel))
                                .filter(platform_certificate::mchid.eq(&row.mchid))
                                .filter(platform_certificate::serial.eq(&row.serial)),
                        )
                        .set(platform_certificate::fetched_at.eq(row.fetched_at))
                        .execute(conn)
                        .await?
                    });
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(added)
    }

    /// Every stored certificate of `channel` not expired at `now`, by merchant and serial.
    pub async fn certificates(
        &self,
        channel: ChannelId,
        now: Timestamp,
    ) -> Result<Vec<PlatformCertificate>, StoreError> {
        let rows: Vec<Row> = with_conn!(self, conn => {
            platform_certificate::table
                .filter(platform_certificate::channel.eq(channel.as_str()))
                .filter(platform_certificate::expire_at.gt(now))
                .order((platform_certificate::mchid, platform_certificate::serial))
                .select(Row::as_select())
                .load(conn)
                .await?
        });
        Ok(rows
            .into_iter()
            .map(|r| PlatformCertificate {
                channel,
                account: r.mchid,
                serial: r.serial,
                pem: r.certificate,
                effective_at: r.effective_at,
                expire_at: r.expire_at,
                fetched_at: r.fetched_at,
            })
            .collect())
    }
}
