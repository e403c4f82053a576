//! The stand-in's combined payments (合单支付): WeChat Pay's combine query
//! `GET /v3/combine-transactions/out-trade-no/{combine_out_trade_no}` and combine close
//! `POST …/{combine_out_trade_no}/close`, after the request's signature verified
//! ([`super::provider`] checks it), answered in WeChat's wire format and signed as the fake
//! signs its ordinary query (`Signing`); errors are never signed, as WeChat's.
//!
//! A test drives it through `fake.state.wechat_combinations` ([`Combinations`]):
//!
//! - [`Combinations::register`]: a combination as the merchant's create left it, its
//!   sub-orders `NOTPAY`;
//! - [`Combinations::pay`]: the buyer paid, every sub-order `SUCCESS` with its own
//!   [`transaction_id`] and `success_time` (WeChat's FAQ: no combination is half paid);
//! - what it holds and was asked: [`Combinations::state`], [`Combinations::asked`].
//!
//! WeChat's rules it keeps: a combination is the signing merchant's (`combine_mchid`), or
//! `404 ORDER_NOT_EXIST`; the close must list exactly the sub-orders of the create (count,
//! `mchid`, `out_trade_no`) and the create's `combine_appid`, and closes all of them or none;
//! the ordinary query of a sub-order answers `404 ORDER_NOT_EXIST` (the FAQ: "不能使用普通支付的
//! 查单接口"). The fake's own choices (protocols.md "Not confirmed"): the close of an unknown
//! combination is `404 ORDER_NOT_EXIST` (the ordinary close answers `204` there), of a paid
//! one `400 ORDERPAID` (as the ordinary close), of a closed one `204` again (as the ordinary
//! close), and a close whose sub-orders do not match is `400 PARAM_ERROR` (the FAQ says only
//! that it fails). The `Lie`s of the ordinary query apply: `NotFoundUnsigned` answers every
//! call an unsigned `404`, `OtherMerchant` names merchant `1900009999` in the query's answer
//! and, with `CloseKeepsTrade`, answers a close with a replayed `204` that closes nothing.

use std::collections::HashMap;
use std::sync::Mutex;

use actix_web::{HttpRequest, HttpResponse};
use serde_json::{Value, json};

use super::provider::{Fake, Lie, wechat_error, wechat_signed};

/// WeChat's combine path, followed by the combination's number.
pub const PATH: &str = "/v3/combine-transactions/out-trade-no/";

/// A paid sub-order's `success_time`.
pub const SUCCESS_TIME: &str = "2026-11-30T10:00:00+08:00";

/// The `transaction_id` WeChat gives sub-order `out_trade_no` when the combination is paid
/// (each sub-order has its own: 每个子单对应一笔支付单号).
pub fn transaction_id(out_trade_no: &str) -> String {
    format!("4200{out_trade_no}")
}

/// Where a combination stands: every sub-order is in the same state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    NotPaid,
    Paid,
    Closed,
}

impl State {
    /// Each sub-order's `trade_state`.
    fn wechat(self) -> &'static str {
        match self {
            Self::NotPaid => "NOTPAY",
            Self::Paid => "SUCCESS",
            Self::Closed => "CLOSED",
        }
    }
}

/// One sub-order as the create named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubOrder {
    pub mchid: String,
    pub out_trade_no: String,
    pub amount_fen: i64,
}

/// One combination the stand-in holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Combination {
    pub combine_mchid: String,
    pub combine_appid: String,
    pub sub_orders: Vec<SubOrder>,
    pub state: State,
}

/// One combine request whose signature verified: which call, the combination it named and
/// the body it sent (`Null` for a query).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asked {
    pub call: Call,
    pub combine_out_trade_no: String,
    pub body: Value,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Query,
    Close,
}

/// The combinations the stand-in holds, by `combine_out_trade_no`, and the requests it got.
#[derive(Default)]
pub struct Combinations {
    held: Mutex<HashMap<String, Combination>>,
    asked: Mutex<Vec<Asked>>,
}

impl Combinations {
    /// Holds combination `no` of merchant `combine_mchid` and app `combine_appid`, with
    /// `subs` as `(mchid, out_trade_no, amount_fen)`, not paid.
    pub fn register(
        &self,
        no: &str,
        combine_mchid: &str,
        combine_appid: &str,
        subs: &[(&str, &str, i64)],
    ) {
        let sub_orders = subs
            .iter()
            .map(|&(mchid, out_trade_no, amount_fen)| SubOrder {
                mchid: mchid.to_owned(),
                out_trade_no: out_trade_no.to_owned(),
                amount_fen,
            })
            .collect();
        self.held.lock().expect("combinations").insert(
            no.to_owned(),
            Combination {
                combine_mchid: combine_mchid.to_owned(),
                combine_appid: combine_appid.to_owned(),
                sub_orders,
                state: State::NotPaid,
            },
        );
    }

    /// The buyer paid combination `no`: every sub-order `SUCCESS`.
    pub fn pay(&self, no: &str) {
        self.set_state(no, State::Paid);
    }

    fn set_state(&self, no: &str, state: State) {
        self.held
            .lock()
            .expect("combinations")
            .get_mut(no)
            .expect("a combination the stand-in holds")
            .state = state;
    }

    pub fn state(&self, no: &str) -> Option<State> {
        self.get(no).map(|c| c.state)
    }

    pub fn get(&self, no: &str) -> Option<Combination> {
        self.held.lock().expect("combinations").get(no).cloned()
    }

    /// Every combine request whose signature verified, in order.
    pub fn asked(&self) -> Vec<Asked> {
        self.asked.lock().expect("asked").clone()
    }

    /// Whether `out_trade_no` is a sub-order of a combination held here.
    pub fn holds_sub(&self, out_trade_no: &str) -> bool {
        self.held
            .lock()
            .expect("combinations")
            .values()
            .any(|c| c.sub_orders.iter().any(|s| s.out_trade_no == out_trade_no))
    }
}

/// A combine query or close whose signature verified (`timestamp` is the request's).
pub async fn answer(req: &HttpRequest, body: &[u8], fake: &Fake, timestamp: &str) -> HttpResponse {
    let Some(rest) = req.path().strip_prefix(PATH) else {
        return wechat_error(404, "NOT_FOUND", "no such API");
    };
    let post = req.method() == actix_web::http::Method::POST;
    let (no, call) = match rest.strip_suffix("/close") {
        Some(no) if post => (no.to_owned(), Call::Close),
        None if !post && req.query_string().is_empty() => (rest.to_owned(), Call::Query),
        _ => return wechat_error(404, "NOT_FOUND", "no such API"),
    };
    let sent: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let combinations = &fake.wechat_combinations;
    combinations.asked.lock().expect("asked").push(Asked {
        call,
        combine_out_trade_no: no.clone(),
        body: sent.clone(),
    });
    let label = match call {
        Call::Query => "wechat.combine_query",
        Call::Close => "wechat.combine_close",
    };
    fake.calls
        .lock()
        .expect("calls")
        .push((label.to_owned(), no.clone()));
    let lie = *fake.lie.lock().expect("lie");
    if lie == Lie::NotFoundUnsigned {
        return wechat_error(404, "ORDER_NOT_EXIST", "订单不存在");
    }
    // A combination is the signing merchant's, or it does not exist.
    let Some(held) = combinations
        .get(&no)
        .filter(|c| c.combine_mchid == fake.mchid)
    else {
        return wechat_error(404, "ORDER_NOT_EXIST", "订单不存在");
    };
    match call {
        Call::Query => {
            let combine_mchid = match lie {
                Lie::OtherMerchant => "1900009999".to_owned(),
                _ => held.combine_mchid.clone(),
            };
            let answer = queried(&no, &combine_mchid, &held);
            wechat_signed(fake, 200, timestamp, answer.to_string())
        }
        Call::Close => {
            if matches!(lie, Lie::CloseKeepsTrade | Lie::OtherMerchant) {
                return wechat_signed(fake, 204, timestamp, String::new());
            }
            if held.state == State::Paid {
                return wechat_error(400, "ORDERPAID", "订单已支付");
            }
            if !close_matches(&sent, &held) {
                return wechat_error(400, "PARAM_ERROR", "子单与合单下单时不一致");
            }
            combinations.set_state(&no, State::Closed);
            wechat_signed(fake, 204, timestamp, String::new())
        }
    }
}

/// Whether a close's body names the create's `combine_appid` and exactly its sub-orders, in
/// any order.
fn close_matches(sent: &Value, held: &Combination) -> bool {
    if sent["combine_appid"].as_str() != Some(held.combine_appid.as_str()) {
        return false;
    }
    let Some(listed) = sent["sub_orders"].as_array() else {
        return false;
    };
    let mut listed: Vec<(&str, &str)> = listed
        .iter()
        .map(|s| {
            (
                s["mchid"].as_str().unwrap_or_default(),
                s["out_trade_no"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    let mut created: Vec<(&str, &str)> = held
        .sub_orders
        .iter()
        .map(|s| (s.mchid.as_str(), s.out_trade_no.as_str()))
        .collect();
    listed.sort_unstable();
    created.sort_unstable();
    listed == created
}

/// The combine query's answer, in the doc's key order.
fn queried(no: &str, combine_mchid: &str, held: &Combination) -> Value {
    let sub_orders: Vec<Value> = held
        .sub_orders
        .iter()
        .map(|s| {
            let mut sub = json!({
                "mchid": s.mchid,
                "trade_type": "JSAPI",
                "trade_state": held.state.wechat(),
                "bank_type": "OTHERS",
                "attach": "",
                "out_trade_no": s.out_trade_no,
                "amount": { "total_amount": s.amount_fen, "currency": "CNY" },
            });
            if held.state == State::Paid {
                sub["success_time"] = json!(SUCCESS_TIME);
                sub["transaction_id"] = json!(transaction_id(&s.out_trade_no));
                sub["amount"]["payer_amount"] = json!(s.amount_fen);
                sub["amount"]["payer_currency"] = json!("CNY");
            }
            sub
        })
        .collect();
    json!({
        "combine_appid": held.combine_appid,
        "combine_mchid": combine_mchid,
        "combine_out_trade_no": no,
        "combine_transaction_id": format!("4200C{no}"),
        "scene_info": { "device_id": "POS1:1" },
        "combine_payer_info": { "openid": "oSandboxOpenId0000000000000" },
        "sub_orders": sub_orders,
    })
}
