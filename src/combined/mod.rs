//! Combined payments (合单支付): one buyer payment for up to fifty sub-orders. This room
//! records a combination with its sub-orders (`POST /combined-orders`), shows it with a
//! status derived from theirs, and checks the accounts it names. Each sub-order is an
//! ordinary order that names its combination; the ledger applies a WeChat combined
//! notification in one transaction (`store::ledger`), and the reconcile room asks WeChat
//! about a combination whole (`reconcile::combined`).

pub mod store;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::channel::accounts::AccountBook;
use crate::channel::api::ProviderApi;
use crate::notice::{ChannelId, Digest, MAX_SUB_ORDERS};
use crate::order::{NewOrder, OrderStatus};
use crate::time::Timestamp;
pub use store::{CombinedRow, Created, NewCombination, Stored};

/// A sub-order's amount: at most 1000000000 fen (WeChat: 10 000 000 yuan a sub-order).
pub const MAX_SUB_AMOUNT_FEN: i64 = 1_000_000_000;
/// WeChat's `combine_out_trade_no`: 1 to 32 characters.
const MAX_COMBINE_NO: usize = 32;

/// `POST /combined-orders`.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CombineRequest {
    pub combine_out_trade_no: String,
    /// `wechat` or `alipay`.
    pub channel: String,
    /// The merchant that starts the combined payment (WeChat `combine_mchid`, the Alipay
    /// app); default: the channel's only account with API credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire_after_secs: Option<u64>,
    pub sub_orders: Vec<SubOrderRequest>,
}

#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubOrderRequest {
    pub order_no: String,
    pub amount_fen: i64,
    /// The sub-order's merchant (WeChat `sub_orders[].mchid`, Alipay `order_details[].app_id`);
    /// default: the combination's account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    #[serde(default)]
    pub subject: String,
}

/// A combination as `GET /combined-orders/{combine_out_trade_no}` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct CombinationView {
    pub combine_out_trade_no: String,
    pub channel: String,
    pub account: String,
    /// `WAIT_PAY`, `PAID`, `CLOSED` or `MIXED`, derived from the sub-orders.
    pub status: String,
    pub amount_fen: i64,
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    #[schema(value_type = String, format = DateTime)]
    pub expire_at: Timestamp,
    pub sub_orders: Vec<SubOrderView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct SubOrderView {
    pub order_no: String,
    pub account: Option<String>,
    pub amount_fen: i64,
    pub refunded_fen: i64,
    pub status: OrderStatus,
    pub transaction_id: Option<String>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub paid_at: Option<Timestamp>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub closed_at: Option<Timestamp>,
}

/// The combination's status from its sub-orders' (interface.md, "The combination").
pub fn derived_status(statuses: &[OrderStatus]) -> &'static str {
    let all = |f: fn(&OrderStatus) -> bool| !statuses.is_empty() && statuses.iter().all(f);
    if all(|s| *s == OrderStatus::WaitPay) {
        "WAIT_PAY"
    } else if all(|s| matches!(s, OrderStatus::Paid | OrderStatus::Refunded)) {
        "PAID"
    } else if all(|s| *s == OrderStatus::Closed) {
        "CLOSED"
    } else {
        "MIXED"
    }
}

impl From<&Stored> for CombinationView {
    fn from(stored: &Stored) -> Self {
        let statuses: Vec<OrderStatus> = stored.subs.iter().map(|(o, _)| o.status).collect();
        Self {
            combine_out_trade_no: stored.row.combine_out_trade_no.clone(),
            channel: stored.row.channel.clone(),
            account: stored.row.account.clone(),
            status: derived_status(&statuses).to_owned(),
            amount_fen: stored.row.amount_fen,
            created_at: stored.row.created_at,
            expire_at: stored.row.expire_at,
            sub_orders: stored
                .subs
                .iter()
                .map(|(o, account)| SubOrderView {
                    order_no: o.order_no.clone(),
                    account: account.clone(),
                    amount_fen: o.amount_fen,
                    refunded_fen: o.refunded_fen,
                    status: o.status,
                    transaction_id: o.transaction_id.clone(),
                    paid_at: o.paid_at,
                    closed_at: o.closed_at,
                })
                .collect(),
        }
    }
}

/// One channel's accounts, as a combination names them.
pub struct ChannelAccounts {
    pub channel: ChannelId,
    pub book: Arc<dyn AccountBook>,
    /// Its API client: the accounts with credentials (the default combination account).
    pub api: Option<Arc<dyn ProviderApi>>,
}

/// Records combinations: validation, the accounts' check, the store.
pub struct Combinations {
    store: crate::store::Store,
    channels: Vec<ChannelAccounts>,
}

/// A request the contract refuses before anything is read: 400 with why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

fn is_order_no(no: &str, max: usize, extra: &[u8]) -> bool {
    !no.is_empty()
        && no.len() <= max
        && no
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-|*".contains(&b) || extra.contains(&b))
}

impl CombineRequest {
    /// The body's own checks (400), in the contract's words.
    pub fn validate(&self) -> Result<ChannelId, Malformed> {
        let bad = |m: String| Err(Malformed(m));
        if !is_order_no(&self.combine_out_trade_no, MAX_COMBINE_NO, b"@") {
            return bad("combine_out_trade_no: 1 to 32 of A-Z a-z 0-9 _ - | * @".to_owned());
        }
        let Some(channel) = ChannelId::parse(&self.channel) else {
            return bad("channel: wechat or alipay".to_owned());
        };
        if let Some(secs) = self.expire_after_secs
            && !(1..=crate::order::MAX_EXPIRE_AFTER_SECS).contains(&secs)
        {
            return bad("expire_after_secs: between 1 and 2592000".to_owned());
        }
        if self.sub_orders.is_empty() || self.sub_orders.len() > MAX_SUB_ORDERS {
            return bad(format!(
                "sub_orders: 1 to {MAX_SUB_ORDERS} entries, not {}",
                self.sub_orders.len()
            ));
        }
        let account_ok = |a: &str| {
            !a.is_empty() && a.len() <= 32 && a.bytes().all(|b| b.is_ascii_alphanumeric())
        };
        if self.account.as_deref().is_some_and(|a| !account_ok(a)) {
            return bad("account: 1 to 32 letters and digits".to_owned());
        }
        let mut seen = std::collections::HashSet::new();
        for (i, sub) in self.sub_orders.iter().enumerate() {
            if !is_order_no(&sub.order_no, crate::notice::max_len::ORDER_NO, b"") {
                return bad(format!(
                    "sub_orders[{i}].order_no: 1 to 64 characters of A-Z a-z 0-9 _ - | *"
                ));
            }
            if !seen.insert(sub.order_no.as_str()) {
                return bad(format!(
                    "sub_orders[{i}].order_no: {} is listed twice",
                    sub.order_no
                ));
            }
            if !(1..=MAX_SUB_AMOUNT_FEN).contains(&sub.amount_fen) {
                return bad(format!(
                    "sub_orders[{i}].amount_fen: a positive integer (fen), at most {MAX_SUB_AMOUNT_FEN}"
                ));
            }
            if sub.account.as_deref().is_some_and(|a| !account_ok(a)) {
                return bad(format!(
                    "sub_orders[{i}].account: 1 to 32 letters and digits"
                ));
            }
            if sub.subject.chars().count() > 256 {
                return bad(format!("sub_orders[{i}].subject: at most 256 characters"));
            }
        }
        Ok(channel)
    }

    /// The digest of the request as parsed: the same body, whatever its whitespace or key
    /// order, is the same request.
    pub fn digest(&self) -> Digest {
        Digest::of(serde_json::to_string(self).unwrap_or_default().as_bytes())
    }
}

impl Combinations {
    pub fn new(store: crate::store::Store, channels: Vec<ChannelAccounts>) -> Self {
        Self { store, channels }
    }

    fn channel(&self, id: ChannelId) -> Option<&ChannelAccounts> {
        self.channels.iter().find(|c| c.channel == id)
    }

    /// The combination's account: the one named, else the channel's only account with API
    /// credentials (400 when there is none, or several).
    fn account(&self, id: ChannelId, named: Option<&str>) -> Result<String, String> {
        if let Some(named) = named {
            return Ok(named.to_owned());
        }
        let with_credentials = self
            .channel(id)
            .and_then(|c| c.api.as_ref())
            .map(|a| a.accounts())
            .unwrap_or_default();
        match with_credentials.as_slice() {
            [only] => Ok(only.clone()),
            [] => Err(format!(
                "account: no {id} account has API credentials; name one"
            )),
            _ => Err(format!(
                "account: several {id} accounts have API credentials; name one"
            )),
        }
    }

    /// Whether the accounts a combination names are enabled accounts of its channel (a WeChat
    /// combination's own account a `direct` merchant): why not, in the contract's 400.
    fn check_accounts(&self, id: ChannelId, account: &str, subs: &[String]) -> Result<(), String> {
        let Some(channel) = self.channel(id) else {
            return Err(format!("channel: {id} is not configured here"));
        };
        let combine_ok = match id {
            ChannelId::Wechat => channel.book.is_keyed(account),
            ChannelId::Alipay => channel.book.is_live(account),
        };
        if !combine_ok {
            return Err(match id {
                ChannelId::Wechat => {
                    format!("account: {account} is not an enabled direct WeChat merchant here")
                }
                ChannelId::Alipay => {
                    format!("account: {account} is not an enabled Alipay app here")
                }
            });
        }
        for (i, sub) in subs.iter().enumerate() {
            if !channel.book.is_live(sub) {
                return Err(format!(
                    "sub_orders[{i}].account: {sub} is not an enabled {id} account here"
                ));
            }
        }
        Ok(())
    }

    /// Records `request` (already validated as `channel`) at `now`, with `expire_after` as
    /// the default lifetime: the contract's checks in its order, then one transaction.
    pub async fn create(
        &self,
        request: &CombineRequest,
        channel: ChannelId,
        expire_after: u64,
        now: Timestamp,
    ) -> Result<Created, crate::store::StoreError> {
        let account = self.account(channel, request.account.as_deref());
        let combine_account = account.clone().unwrap_or_default();
        let sub_accounts: Vec<String> = request
            .sub_orders
            .iter()
            .map(|s| s.account.clone().unwrap_or_else(|| combine_account.clone()))
            .collect();
        let verdict = account.and_then(|a| self.check_accounts(channel, &a, &sub_accounts));
        let expire_after = request.expire_after_secs.unwrap_or(expire_after);
        let expire_at = now.plus_seconds(i64::try_from(expire_after).unwrap_or(i64::MAX / 2));
        let no = request.combine_out_trade_no.clone();
        let subs: Vec<NewOrder> = request
            .sub_orders
            .iter()
            .zip(&sub_accounts)
            .map(|(s, account)| NewOrder {
                order_no: s.order_no.clone(),
                amount_fen: s.amount_fen,
                currency: "CNY".to_owned(),
                subject: s.subject.clone(),
                created_at: now,
                expire_at,
                accounts: vec![(channel, account.clone())],
                combine_out_trade_no: Some(no.clone()),
            })
            .collect();
        let nos: Vec<&str> = subs.iter().map(|s| s.order_no.as_str()).collect();
        let row = CombinedRow {
            combine_out_trade_no: no.clone(),
            channel: channel.as_str().to_owned(),
            account: combine_account,
            amount_fen: subs.iter().map(|s| s.amount_fen).sum(),
            sub_order_count: i32::try_from(subs.len()).unwrap_or(i32::MAX),
            sub_orders: serde_json::to_string(&nos).unwrap_or_default(),
            request_digest: request.digest().as_str().to_owned(),
            created_at: now,
            expire_at,
        };
        self.store
            .create_combination(&NewCombination { row, subs }, verdict)
            .await
    }

    pub async fn get(&self, no: &str) -> Result<Option<Stored>, crate::store::StoreError> {
        self.store.combination(no).await
    }
}

#[cfg(test)]
mod tests {
    use super::derived_status;
    use crate::order::OrderStatus::{Closed, Paid, Refunded, WaitPay};

    #[test]
    fn the_status_is_derived_from_the_sub_orders() {
        assert_eq!(derived_status(&[WaitPay, WaitPay]), "WAIT_PAY");
        assert_eq!(derived_status(&[Paid, Refunded]), "PAID");
        assert_eq!(derived_status(&[Closed, Closed]), "CLOSED");
        assert_eq!(derived_status(&[Paid, WaitPay]), "MIXED");
        assert_eq!(derived_status(&[Closed, Paid]), "MIXED");
        assert_eq!(derived_status(&[]), "MIXED");
    }
}
