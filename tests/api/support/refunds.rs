//! The stand-ins' refund creates: WeChat's `POST /v3/refund/domestic/refunds` and Alipay's
//! `alipay.trade.refund`, after the request's signature verified ([`super::provider`] checks
//! it). Both providers' rules: a refund of the trade's own payment, within what is left of
//! it, deduplicated on the refund number; each answer signed as the fake signs.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use actix_web::HttpResponse;
use paynotify::money::yuan_to_fen;
use paynotify::qa::forge::alipay::yuan;
use serde_json::{Value, json};

use super::provider::{
    Fake, RefundStatus, Refunded, Refusal, Trade, alipay_signed, wechat_error, wechat_signed,
};

/// WeChat's refund path (`POST` creates, `GET …/{out_refund_no}` queries).
pub const WECHAT_PATH: &str = "/v3/refund/domestic/refunds";

/// How long a hanging create sleeps before it answers: longer than the client timeout the
/// tests set.
pub const HANG_SECS: u64 = 3;

/// One refund create as the provider reads it.
struct Ask<'a> {
    /// Alipay names the trade; WeChat only its payment (`transaction_id`).
    out_trade_no: Option<&'a str>,
    transaction_id: &'a str,
    out_refund_no: &'a str,
    refund_fen: i64,
    /// WeChat's `amount.total`, which must be the trade's.
    total: Option<i64>,
}

/// Why the provider refuses a refund create.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// No paid trade of that payment.
    NotPaid,
    /// WeChat: `amount.total` is not the trade's.
    OtherTotal,
    /// Nothing, or more than is left of the payment.
    OverRemainder,
    /// The refund number again, with another amount (or trade).
    OtherAmount,
    Refused(Refusal),
}

/// The refund a create holds: made now, or under the same number before.
struct Held {
    refund: Refunded,
    new: bool,
}

/// A paid trade's payment id and total: paid, or paid and refunded in full since (a new
/// refund of it is then over what is left, as at the providers).
fn payment(trade: &Trade) -> Option<(&str, i64)> {
    match trade {
        Trade::Paid {
            transaction_id,
            total,
        }
        | Trade::Refunded {
            transaction_id,
            total,
        } => Some((transaction_id, *total)),
        Trade::NotPaid | Trade::Closed => None,
    }
}

/// What `trade` has refunded: `counted` refunds of it, summed.
fn refunded_of(
    refunds: &HashMap<String, Refunded>,
    out_trade_no: &str,
    counted: impl Fn(RefundStatus) -> bool,
) -> i64 {
    refunds
        .values()
        .filter(|r| r.out_trade_no == out_trade_no && counted(r.status))
        .map(|r| r.refund_fen)
        .sum()
}

/// The trade's running refunded total: the money that went back (Alipay `refund_fee`).
fn running_total(refunds: &HashMap<String, Refunded>, out_trade_no: &str) -> i64 {
    refunded_of(refunds, out_trade_no, |s| s == RefundStatus::Success)
}

/// `refund`'s trade refunded in full once its done refunds reach its total.
pub(super) fn refunded_in_full(
    refunds: &HashMap<String, Refunded>,
    trades: &mut HashMap<String, Trade>,
    refund: &Refunded,
) {
    if running_total(refunds, &refund.out_trade_no) >= refund.total {
        trades.insert(
            refund.out_trade_no.clone(),
            Trade::Refunded {
                transaction_id: refund.transaction_id.clone(),
                total: refund.total,
            },
        );
    }
}

/// The out_trade_no of the trade paid by `transaction_id`, if any.
fn trade_paid_by(fake: &Fake, transaction_id: &str) -> Option<String> {
    fake.trades
        .lock()
        .expect("trades")
        .iter()
        .find(|(_, t)| payment(t).is_some_and(|(id, _)| id == transaction_id))
        .map(|(no, _)| no.clone())
}

/// Creates the refund `ask` names, or finds it under its number, as both providers do.
fn create(fake: &Fake, ask: &Ask<'_>) -> Result<Held, Why> {
    let mut refunds = fake.refunds.lock().expect("refunds");
    let mut trades = fake.trades.lock().expect("trades");
    let (out_trade_no, total) = trades
        .iter()
        .find(|(no, t)| match ask.out_trade_no {
            Some(asked) => no.as_str() == asked,
            None => payment(t).is_some_and(|(id, _)| id == ask.transaction_id),
        })
        .and_then(|(no, t)| Some((no.clone(), payment(t)?)))
        .filter(|(_, (id, _))| *id == ask.transaction_id)
        .map(|(no, (_, total))| (no, total))
        .ok_or(Why::NotPaid)?;
    if ask.total.is_some_and(|t| t != total) {
        return Err(Why::OtherTotal);
    }
    if let Some(held) = refunds.get(ask.out_refund_no) {
        if held.refund_fen != ask.refund_fen || held.out_trade_no != out_trade_no {
            return Err(Why::OtherAmount);
        }
        return Ok(Held {
            refund: held.clone(),
            new: false,
        });
    }
    if let Some(refusal) = *fake.refund_refusal.lock().expect("refusal") {
        return Err(Why::Refused(refusal));
    }
    // Every refund held counts against the payment but one closed without money moving.
    let held = refunded_of(&refunds, &out_trade_no, |s| s != RefundStatus::Closed);
    if ask.refund_fen <= 0 || ask.refund_fen > total - held {
        return Err(Why::OverRemainder);
    }
    let refund = Refunded {
        out_trade_no,
        transaction_id: ask.transaction_id.to_owned(),
        refund_fen: ask.refund_fen,
        total,
        status: *fake.new_refund_status.lock().expect("status"),
    };
    refunds.insert(ask.out_refund_no.to_owned(), refund.clone());
    fake.refunds_created.fetch_add(1, Ordering::SeqCst);
    refunded_in_full(&refunds, &mut trades, &refund);
    Ok(Held { refund, new: true })
}

/// A create that holds its refund, while creates are to hang: answer only after
/// [`HANG_SECS`].
async fn maybe_hang(fake: &Fake) {
    let hang = fake
        .hang_refund_creates
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if hang {
        tokio::time::sleep(Duration::from_secs(HANG_SECS)).await;
    }
}

/// WeChat's refund object, as the create and the query answer it.
pub(super) fn wechat_refund(out_refund_no: &str, r: &Refunded) -> Value {
    let mut refund = json!({
        "refund_id": format!("5030{out_refund_no}"),
        "out_refund_no": out_refund_no,
        "transaction_id": r.transaction_id,
        "out_trade_no": r.out_trade_no,
        "channel": "ORIGINAL",
        "user_received_account": "支付用户零钱",
        "create_time": "2026-11-30T10:59:00+08:00",
        "status": r.status.wechat(),
        "funds_account": "AVAILABLE",
        "amount": { "total": r.total, "refund": r.refund_fen, "payer_total": r.total, "payer_refund": r.refund_fen, "settlement_refund": r.refund_fen, "settlement_total": r.total, "discount_refund": 0, "currency": "CNY" }
    });
    if r.status == RefundStatus::Success {
        refund["success_time"] = json!("2026-11-30T11:00:00+08:00");
    }
    refund
}

/// `POST /v3/refund/domestic/refunds`: the refund object, signed; a refusal as WeChat's
/// (unsigned) error body.
pub(super) async fn wechat_create(body: &[u8], fake: &Fake, timestamp: &str) -> HttpResponse {
    let asked: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let (Some(transaction_id), Some(out_refund_no), Some(refund_fen), Some(total)) = (
        asked["transaction_id"].as_str(),
        asked["out_refund_no"].as_str(),
        asked["amount"]["refund"].as_i64(),
        asked["amount"]["total"].as_i64(),
    ) else {
        return wechat_error(400, "PARAM_ERROR", "输入源“/body”映射到字段失败");
    };
    let out_trade_no = trade_paid_by(fake, transaction_id).unwrap_or_default();
    fake.calls
        .lock()
        .expect("calls")
        .push(("wechat.refund".to_owned(), out_trade_no));
    let ask = Ask {
        out_trade_no: None,
        transaction_id,
        out_refund_no,
        refund_fen,
        total: Some(total),
    };
    match create(fake, &ask) {
        Ok(held) => {
            maybe_hang(fake).await;
            let answer = wechat_refund(out_refund_no, &held.refund);
            wechat_signed(fake, 200, timestamp, answer.to_string())
        }
        Err(Why::NotPaid) => wechat_error(400, "INVALID_REQUEST", "订单不存在或未支付"),
        Err(Why::OtherTotal) => wechat_error(400, "PARAM_ERROR", "订单金额与实际金额不符"),
        Err(Why::OverRemainder) => {
            wechat_error(400, "INVALID_REQUEST", "申请退款金额超过订单可退金额")
        }
        Err(Why::OtherAmount) => wechat_error(
            400,
            "INVALID_REQUEST",
            "订单金额或退款金额与之前请求不一致，请核实后再试",
        ),
        Err(Why::Refused(Refusal::BalanceNotEnough)) => {
            wechat_error(403, "NOT_ENOUGH", "基本账户余额不足")
        }
    }
}

/// `alipay.trade.refund`: `10000` with `fund_change` `Y` for a refund done now, `N` for one
/// held before or not done yet (`refund_fee` the trade's running total either way); a
/// refusal as Alipay's signed business error.
pub(super) async fn alipay_create(biz: &Value, fake: &Fake) -> HttpResponse {
    const METHOD: &str = "alipay.trade.refund";
    let refusal = |sub_code: &str, sub_msg: &str| json!({"code": "40004", "msg": "Business Failed", "sub_code": sub_code, "sub_msg": sub_msg});
    let out_trade_no = biz["out_trade_no"].as_str();
    let trade_no = biz["trade_no"].as_str().map(str::to_owned).or_else(|| {
        let trade = fake.trade(out_trade_no?)?;
        payment(&trade).map(|(id, _)| id.to_owned())
    });
    let (Some(trade_no), Some(out_refund_no), Some(refund_fen)) = (
        trade_no,
        biz["out_request_no"].as_str(),
        biz["refund_amount"]
            .as_str()
            .and_then(|a| yuan_to_fen(a).ok()),
    ) else {
        let missing = json!({"code": "40002", "msg": "Invalid Arguments", "sub_code": "isv.invalid-parameter", "sub_msg": "参数无效"});
        return alipay_signed(fake, METHOD, &missing);
    };
    let ask = Ask {
        out_trade_no,
        transaction_id: &trade_no,
        out_refund_no,
        refund_fen,
        total: None,
    };
    let value = match create(fake, &ask) {
        Ok(held) => {
            maybe_hang(fake).await;
            let r = &held.refund;
            let done = held.new && r.status == RefundStatus::Success;
            let refund_fee = running_total(&fake.refunds.lock().expect("refunds"), &r.out_trade_no);
            json!({
                "code": "10000", "msg": "Success", "trade_no": r.transaction_id,
                "out_trade_no": r.out_trade_no, "buyer_logon_id": "159****3821",
                "fund_change": if done { "Y" } else { "N" },
                "refund_fee": yuan(refund_fee), "gmt_refund_pay": "2026-11-30 11:00:00"
            })
        }
        Err(Why::NotPaid) => refusal("ACQ.TRADE_NOT_EXIST", "交易不存在"),
        Err(Why::OverRemainder | Why::OtherAmount | Why::OtherTotal) => {
            refusal("ACQ.REFUND_AMT_NOT_EQUAL_TOTAL", "退款金额超限")
        }
        Err(Why::Refused(Refusal::BalanceNotEnough)) => {
            refusal("ACQ.SELLER_BALANCE_NOT_ENOUGH", "卖家余额不足")
        }
    };
    alipay_signed(fake, METHOD, &value)
}
