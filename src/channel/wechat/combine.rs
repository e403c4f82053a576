//! WeChat's combined payments (合单支付) asked about: the combine query and the combine close,
//! signed by the combination's merchant (`combine_mchid`), each answer verified as the
//! ordinary query's is.
//!
//! WeChat Pay v3: a combination is asked about only through
//! `/v3/combine-transactions/out-trade-no/{combine_out_trade_no}`; the ordinary query answers
//! `ORDER_NOT_EXIST` for its sub-orders ("不能使用普通支付的查单接口").

use serde::Deserialize;

use super::Merchant;
use super::api::{ApiMerchant, SEGMENT, WechatApi};
use super::wire::parse_time;
use crate::channel::api::{Account, CloseAnswer, CombineAnswer, Failure, Miss};
use crate::notice::{
    ChannelId, Combination, MAX_SUB_ORDERS, MerchantIds, Notice, NoticeKind, SubPayment,
};
use crate::time::Timestamp;

/// A combination as the combine query answers it. There is no top-level state: each
/// sub-order has its own. The newer answer's `combine_transaction_id`, `scene_info` and
/// `combine_payer_info` are not read: no business content covers them.
#[derive(Deserialize)]
pub(super) struct QueriedCombination {
    pub(super) combine_appid: String,
    pub(super) combine_mchid: String,
    pub(super) combine_out_trade_no: String,
    #[serde(default)]
    pub(super) sub_orders: Vec<QueriedSubOrder>,
}

/// One `sub_orders[]` entry of the combine query: `transaction_id` and `success_time` only
/// once paid.
#[derive(Deserialize)]
pub(super) struct QueriedSubOrder {
    pub(super) mchid: String,
    pub(super) trade_state: String,
    pub(super) out_trade_no: String,
    #[serde(default)]
    pub(super) transaction_id: Option<String>,
    #[serde(default)]
    pub(super) success_time: Option<String>,
    #[serde(default)]
    pub(super) amount: Option<QueriedSubAmount>,
}

/// A sub-order's `amount`: `total_amount` is what the ledger compares (not `payer_amount`,
/// which coupons reduce).
#[derive(Deserialize)]
pub(super) struct QueriedSubAmount {
    #[serde(default)]
    pub(super) total_amount: Option<i64>,
    #[serde(default)]
    pub(super) currency: Option<String>,
}

/// A combination is a direct merchant's (合单支付 has no partner form here).
fn direct_only(m: &ApiMerchant) -> Result<(), Failure> {
    match &m.sub_mchid {
        Some(sub) => Err(Failure::Unexpected(format!(
            "combined payments are a direct merchant's calls, not a sub-merchant's ({sub})"
        ))),
        None => Ok(()),
    }
}

fn path_of(combine_out_trade_no: &str) -> String {
    format!(
        "/v3/combine-transactions/out-trade-no/{}",
        percent_encoding::utf8_percent_encode(combine_out_trade_no, SEGMENT)
    )
}

impl WechatApi {
    /// `GET /v3/combine-transactions/out-trade-no/{combine_out_trade_no}` (no query string):
    /// the combination's notice when the signed answer names it and the asking merchant.
    pub(super) async fn query_combination(
        &self,
        m: &ApiMerchant,
        combine_out_trade_no: &str,
        now: Timestamp,
    ) -> Result<CombineAnswer, Miss> {
        direct_only(m)?;
        let q: QueriedCombination = self
            .get_verified(
                m,
                &path_of(combine_out_trade_no),
                ["ORDER_NOT_EXIST", "ORDERNOTEXIST"],
                "combine query answer",
                now,
            )
            .await?;
        // A signed answer about another combination or merchant (replayed from elsewhere)
        // says nothing about this one.
        if q.combine_out_trade_no != combine_out_trade_no || q.combine_mchid != m.merchant.mchid {
            return Err(Failure::Unexpected(format!(
                "asked about combination {combine_out_trade_no} of merchant {}, answered about {} of merchant {}",
                m.id(),
                q.combine_out_trade_no,
                q.combine_mchid
            ))
            .into());
        }
        let notice = queried_combination_notice(&m.merchant, q)?;
        Ok(CombineAnswer::Found(Box::new(notice)))
    }

    /// `POST …/out-trade-no/{combine_out_trade_no}/close` with `combine_appid` and every
    /// sub-order as recorded: WeChat closes every sub-order or none.
    pub(super) async fn close_combination(
        &self,
        m: &ApiMerchant,
        combine_out_trade_no: &str,
        combine_appid: &str,
        subs: &[(String, String)],
        now: Timestamp,
    ) -> Result<CloseAnswer, Miss> {
        direct_only(m)?;
        let path = format!("{}/close", path_of(combine_out_trade_no));
        let body = close_body(combine_appid, subs).to_string();
        let r = self.call(m, true, &path, &body, now).await?;
        if (200..300).contains(&r.status) {
            // As the ordinary close's: an empty signed 204 names no combination, so the
            // caller confirms with the combine query.
            self.verify(m, &r, now)?;
            return Ok(CloseAnswer::Closed);
        }
        match Self::error_code(&r)?.as_str() {
            "ORDERPAID" => Ok(CloseAnswer::NotClosable),
            "ORDER_NOT_EXIST" | "ORDERNOTEXIST" => Err(Miss::NotFound),
            // PARAM_ERROR among them: the sub-orders are not exactly those of the create.
            _ => Err(Self::unexpected(&r).into()),
        }
    }
}

/// The body of a combine close: `combine_appid` and `sub_orders[{mchid, out_trade_no}]`, as
/// wechatpayv3 sends it.
fn close_body(combine_appid: &str, subs: &[(String, String)]) -> serde_json::Value {
    let sub_orders: Vec<_> = subs
        .iter()
        .map(|(mchid, out_trade_no)| serde_json::json!({ "mchid": mchid, "out_trade_no": out_trade_no }))
        .collect();
    serde_json::json!({ "combine_appid": combine_appid, "sub_orders": sub_orders })
}

/// A combine query answer's notice, as the combined notification's: `out_trade_no` the
/// `combine_out_trade_no`, no `transaction_id`, `amount_fen` the sub-orders' sum, the
/// `combine_mchid` and `combine_appid` as its merchant, matching when they are `m`'s,
/// `occurred_at` the latest `success_time`. Every sub-order is listed with its
/// `trade_state`, paid or not.
pub(super) fn queried_combination_notice(
    m: &Merchant,
    q: QueriedCombination,
) -> Result<Notice, Failure> {
    if q.sub_orders.is_empty() || q.sub_orders.len() > MAX_SUB_ORDERS {
        return Err(Failure::Unexpected(format!(
            "a combination of {} sub-orders (1 to {MAX_SUB_ORDERS})",
            q.sub_orders.len()
        )));
    }
    let subs = q
        .sub_orders
        .into_iter()
        .map(queried_sub_payment)
        .collect::<Result<Vec<_>, _>>()?;
    let amount_fen = subs
        .iter()
        .try_fold(0i64, |sum, s| sum.checked_add(s.amount_fen))
        .ok_or_else(|| Failure::Unexpected("the sub-orders' amounts overflow".into()))?;
    let occurred_at = subs.iter().filter_map(|s| s.occurred_at).max();
    let notice = Notice {
        channel: ChannelId::Wechat,
        kind: NoticeKind::Combined(Box::new(Combination { subs })),
        merchant_matches: q.combine_mchid == m.mchid && m.appids.contains(&q.combine_appid),
        merchant: MerchantIds {
            merchant_id: q.combine_mchid,
            app_id: Some(q.combine_appid),
        },
        out_trade_no: q.combine_out_trade_no,
        transaction_id: String::new(),
        amount_fen,
        currency: "CNY".to_owned(),
        occurred_at,
    };
    notice.checked().map_err(Failure::Unexpected)
}

/// One sub-order of a combine query answer: `trade_state` as given, `currency` CNY unless
/// named. A paid one (`SUCCESS`, `REFUND`) must carry its `transaction_id` and a positive
/// `total_amount`, as the ordinary query's paid answer must.
fn queried_sub_payment(s: QueriedSubOrder) -> Result<SubPayment, Failure> {
    let (total, currency) = match s.amount {
        Some(a) => (a.total_amount, a.currency),
        None => (None, None),
    };
    let mut sub = SubPayment {
        out_trade_no: s.out_trade_no,
        transaction_id: s.transaction_id.unwrap_or_default(),
        amount_fen: total.unwrap_or_default(),
        currency: currency.unwrap_or_else(|| "CNY".to_owned()),
        mchid: s.mchid,
        trade_state: s.trade_state,
        occurred_at: parse_time(s.success_time.as_deref()),
    };
    if sub.amount_fen < 0 {
        return Err(Failure::Unexpected(format!(
            "sub-order {}: amount.total_amount must not be negative",
            sub.out_trade_no
        )));
    }
    if sub.is_paid() && (sub.transaction_id.is_empty() || sub.amount_fen <= 0) {
        return Err(Failure::Unexpected(format!(
            "sub-order {} is {} without transaction_id or a positive amount.total_amount",
            sub.out_trade_no, sub.trade_state
        )));
    }
    if !sub.is_paid() {
        // Only a payment has a time that means something.
        sub.occurred_at = None;
    }
    Ok(sub)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merchant() -> Merchant {
        Merchant::new(
            "1900000001".into(),
            vec!["wx0000000000000001".into()],
            &[7; 32],
        )
        .expect("merchant")
    }

    fn answer(value: serde_json::Value) -> QueriedCombination {
        serde_json::from_value(value).expect("a combine query answer")
    }

    fn sub(no: &str, state: &str, paid: bool) -> serde_json::Value {
        let mut v = serde_json::json!({
            "mchid": "1900000002", "trade_type": "JSAPI", "trade_state": state,
            "bank_type": "OTHERS", "attach": "", "out_trade_no": no,
            "amount": { "total_amount": 100, "currency": "CNY" }
        });
        if paid {
            v["transaction_id"] = serde_json::json!(format!("42{no}"));
            v["success_time"] = serde_json::json!("2026-11-30T10:00:00+08:00");
        }
        v
    }

    fn combination(subs: Vec<serde_json::Value>) -> serde_json::Value {
        serde_json::json!({
            "combine_appid": "wx0000000000000001", "combine_mchid": "1900000001",
            "combine_out_trade_no": "C1", "combine_transaction_id": "4200C1",
            "combine_payer_info": { "openid": "o1" }, "sub_orders": subs
        })
    }

    #[test]
    fn a_paid_combination_is_its_sub_orders_payments() {
        let q = answer(combination(vec![
            sub("S1", "SUCCESS", true),
            sub("S2", "REFUND", true),
        ]));
        let n = queried_combination_notice(&merchant(), q).expect("notice");
        assert_eq!(n.out_trade_no, "C1");
        assert_eq!(n.transaction_id, "");
        assert_eq!(n.amount_fen, 200);
        assert!(n.merchant_matches);
        assert!(n.occurred_at.is_some());
        let NoticeKind::Combined(c) = n.kind else {
            panic!("a combination");
        };
        assert_eq!(c.subs.len(), 2);
        assert!(c.subs.iter().all(SubPayment::is_paid));
        assert_eq!(c.subs[0].transaction_id, "42S1");
        assert_eq!(c.subs[1].trade_state, "REFUND");
    }

    #[test]
    fn an_unpaid_combination_lists_its_states_without_payments() {
        let q = answer(combination(vec![
            sub("S1", "NOTPAY", false),
            sub("S2", "CLOSED", false),
        ]));
        let n = queried_combination_notice(&merchant(), q).expect("notice");
        assert_eq!(n.occurred_at, None);
        let NoticeKind::Combined(c) = n.kind else {
            panic!("a combination");
        };
        assert_eq!(c.subs[0].trade_state, "NOTPAY");
        assert_eq!(c.subs[1].trade_state, "CLOSED");
        assert!(!c.subs.iter().any(SubPayment::is_paid));
    }

    #[test]
    fn a_paid_sub_order_without_its_payment_is_no_answer() {
        let q = answer(combination(vec![sub("S1", "SUCCESS", false)]));
        assert!(matches!(
            queried_combination_notice(&merchant(), q),
            Err(Failure::Unexpected(_))
        ));
        let q = answer(combination(vec![]));
        assert!(matches!(
            queried_combination_notice(&merchant(), q),
            Err(Failure::Unexpected(_))
        ));
    }

    #[test]
    fn another_app_does_not_match() {
        let mut v = combination(vec![sub("S1", "SUCCESS", true)]);
        v["combine_appid"] = serde_json::json!("wx0000000000009999");
        let n = queried_combination_notice(&merchant(), answer(v)).expect("notice");
        assert!(!n.merchant_matches);
    }

    #[test]
    fn a_close_lists_every_sub_order() {
        let subs = [
            ("1900000002".to_owned(), "S1".to_owned()),
            ("1900000003".to_owned(), "S2".to_owned()),
        ];
        assert_eq!(
            close_body("wx1", &subs),
            serde_json::json!({
                "combine_appid": "wx1",
                "sub_orders": [
                    { "mchid": "1900000002", "out_trade_no": "S1" },
                    { "mchid": "1900000003", "out_trade_no": "S2" }
                ]
            })
        );
    }
}
