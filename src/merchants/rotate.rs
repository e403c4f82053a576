//! `paynotify secrets rotate`: every stored account's keys sealed again under a new master
//! key, in one transaction, so the database is never half under one key and half under the
//! other.

use crate::merchants::seal::{MasterKey, SealError};
use crate::merchants::store::ResealError;
use crate::store::Store;

#[derive(Debug, thiserror::Error)]
pub enum RotateError {
    #[error("the new key is the current key (key id {0}): nothing to rotate")]
    SameKey(String),
    #[error("nothing was resealed: {0}")]
    Reseal(#[from] ResealError),
}

/// Reseals every stored account from `old` to `new`; how many. An account already under
/// `new` (a rotation run again after the first one committed) is checked to open and kept.
/// Any account neither key opens rolls the whole rotation back, naming it.
pub async fn rotate(store: &Store, old: &MasterKey, new: &MasterKey) -> Result<usize, RotateError> {
    if old.id() == new.id() {
        return Err(RotateError::SameKey(new.id().to_owned()));
    }
    let resealed = store
        .reseal_merchants(|account| {
            let opener = if account.sealed.key_id == new.id() {
                new
            } else {
                old
            };
            let keys = opener
                .open(account.channel, &account.account, &account.sealed)
                .map_err(|e| match e {
                    SealError::WrongKey { key_id } => format!(
                        "sealed with key id {key_id}, neither the current key ({}) nor the new one",
                        old.id()
                    ),
                    other => other.to_string(),
                })?;
            new.seal(account.channel, &account.account, &keys)
                .map_err(|e| e.to_string())
        })
        .await?;
    Ok(resealed)
}
