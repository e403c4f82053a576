//! The stand-in's Alipay 单笔转账: `alipay.fund.trans.uni.transfer` and
//! `alipay.fund.trans.common.query` at the fake gateway (`support/provider.rs` verified the
//! request's signature and hands the call here), and the `alipay.fund.trans.order.changed`
//! message Alipay posts to the app gateway.
//!
//! Transfers are held by `out_biz_no`. What a test controls, on [`Fake`]:
//! - [`Fake::new_alipay_transfers`]: what a new transfer becomes — `SUCCESS` at once (the
//!   normal case, and the default), `DEALING`, or refused with a `sub_code` (nothing held);
//! - [`Fake::hang_alipay_transfers`]: the next creates hold the transfer, then answer only
//!   after [`super::refunds::HANG_SECS`] (the client times out while the transfer exists);
//! - [`Fake::settle_alipay_transfer`]: a `DEALING` transfer becomes `SUCCESS` or `FAIL`;
//! - [`Fake::alipay_transfer`], [`Fake::alipay_transfers_created`]: what it holds;
//! - [`order_changed`]: the signed gateway message for a transfer it holds.
//!
//! Answers are signed as every Alipay answer of the fake ([`Fake::sign_with`]). The gateway's
//! refusals follow protocols.md, with the fake's own choices where Alipay's are not confirmed:
//! a request without `app_cert_sn` (an app in public-key mode) is `40006
//! isv.insufficient-isv-permissions`; wrong SNs as every call's ([`Fake::expect_cert_sn`]); the
//! same `out_biz_no` with other parameters `40004 INVALID_PARAMETER`; an unknown transfer
//! `40004 ORDER_NOT_EXIST`; `ALIPAY_LOGON_ID` without a name `40004 PAYEE_USERINFO_ERROR`.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use actix_web::HttpResponse;
use paynotify::money::yuan_to_fen;
use paynotify::qa::forge::Delivery;
use paynotify::qa::forge::alipay::{FundOrder, Sandbox, transfer_changed, yuan};
use serde_json::{Value, json};

use super::provider::{Fake, alipay_signed, cert_sn_refusal};
use super::refunds::HANG_SECS;

pub const TRANSFER: &str = "alipay.fund.trans.uni.transfer";
pub const QUERY: &str = "alipay.fund.trans.common.query";

/// A transfer's `status` at Alipay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    Success,
    /// Accepted, not finished (Alipay documents it as not applying to account transfers;
    /// the status set allows it).
    Dealing,
    /// Failed after it was accepted, with Alipay's `error_code`.
    Fail(String),
}

impl Status {
    pub fn word(&self) -> &'static str {
        match self {
            Self::Success => "SUCCESS",
            Self::Dealing => "DEALING",
            Self::Fail(_) => "FAIL",
        }
    }
}

/// What a new transfer becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NewTransfer {
    /// `SUCCESS` in the create's answer: the normal case.
    Success,
    /// `DEALING`, until [`Fake::settle_alipay_transfer`].
    Dealing,
    /// Refused with `40004` and this `sub_code` (`PAYEE_NOT_EXIST`, `BALANCE_IS_NOT_ENOUGH`,
    /// …): nothing held under the number.
    Refused(&'static str),
}

/// A transfer the stand-in holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlipayTransfer {
    pub app_id: String,
    pub out_biz_no: String,
    pub order_id: String,
    pub amount_fen: i64,
    pub status: Status,
    /// The create's `biz_content` as first asked: the same number again must ask the same.
    pub asked: Value,
}

impl AlipayTransfer {
    /// As the gateway message tells it.
    pub fn fund_order(&self) -> FundOrder {
        FundOrder {
            out_biz_no: self.out_biz_no.clone(),
            order_id: self.order_id.clone(),
            amount_fen: self.amount_fen,
            status: self.status.word().to_owned(),
            error_code: match &self.status {
                Status::Fail(code) => Some(code.clone()),
                _ => None,
            },
        }
    }
}

/// The stand-in's transfers and what it does with new ones (one field of [`Fake`]).
#[derive(Debug)]
pub struct Transfers {
    held: HashMap<String, AlipayTransfer>,
    new: NewTransfer,
    hang: usize,
    created: usize,
}

impl Default for Transfers {
    fn default() -> Self {
        Self {
            held: HashMap::new(),
            new: NewTransfer::Success,
            hang: 0,
            created: 0,
        }
    }
}

impl Fake {
    /// New transfers become `new` from now on ([`NewTransfer::Success`] unless set).
    pub fn new_alipay_transfers(&self, new: NewTransfer) {
        self.alipay_transfers.lock().expect("transfers").new = new;
    }

    /// The next `creates` creates of a new transfer hold it, then answer only after
    /// [`HANG_SECS`].
    pub fn hang_alipay_transfers(&self, creates: usize) {
        self.alipay_transfers.lock().expect("transfers").hang = creates;
    }

    /// The transfer held under `out_biz_no`.
    pub fn alipay_transfer(&self, out_biz_no: &str) -> Option<AlipayTransfer> {
        self.alipay_transfers
            .lock()
            .expect("transfers")
            .held
            .get(out_biz_no)
            .cloned()
    }

    /// How many transfers creates made (each number once).
    pub fn alipay_transfers_created(&self) -> usize {
        self.alipay_transfers.lock().expect("transfers").created
    }

    /// Transfer `out_biz_no` is `status` now (a `DEALING` one finished); returns it.
    pub fn settle_alipay_transfer(&self, out_biz_no: &str, status: Status) -> AlipayTransfer {
        let mut transfers = self.alipay_transfers.lock().expect("transfers");
        let held = transfers
            .held
            .get_mut(out_biz_no)
            .expect("a transfer the stand-in holds");
        held.status = status;
        held.clone()
    }
}

/// The signed `alipay.fund.trans.order.changed` message for the transfer held under
/// `out_biz_no`, as it is now, signed with `alipay`'s key (the Alipay key the service has
/// for that app: `crate::alipay::sandbox()` for app 2021000000000001), naming the app that
/// made the transfer. A form body for `POST /notify/alipay/gateway`.
pub fn order_changed(fake: &Fake, alipay: &Sandbox, out_biz_no: &str) -> Delivery {
    let held = fake
        .alipay_transfer(out_biz_no)
        .expect("a transfer the stand-in holds");
    let app = Sandbox {
        app_id: held.app_id.clone(),
        seller_id: alipay.seller_id.clone(),
        private_key: alipay.private_key.clone(),
    };
    app.notification(transfer_changed(&app, &held.fund_order()), false)
        .expect("forge")
}

fn refusal(code: &str, sub_code: &str, sub_msg: &str) -> Value {
    let msg = match code {
        "40004" => "Business Failed",
        "40006" => "Insufficient Permissions",
        _ => "Invalid Arguments",
    };
    json!({"code": code, "msg": msg, "sub_code": sub_code, "sub_msg": sub_msg})
}

/// A verified request for one of the fund methods: the gateway's checks of the app, then
/// the call.
pub(super) async fn answer(
    fake: &Fake,
    method: &str,
    params: &HashMap<String, String>,
) -> HttpResponse {
    let given = |k: &str| params.get(k).is_some_and(|v| !v.is_empty());
    if !given("app_cert_sn") {
        fake.refused.fetch_add(1, Ordering::SeqCst);
        let value = refusal(
            "40006",
            "isv.insufficient-isv-permissions",
            "ISV权限不足，建议在开发者中心检查签约是否已经生效",
        );
        return alipay_signed(fake, method, &value);
    }
    if let Some(value) = cert_sn_refusal(fake, params) {
        fake.refused.fetch_add(1, Ordering::SeqCst);
        return alipay_signed(fake, method, &value);
    }
    fake.verified.fetch_add(1, Ordering::SeqCst);
    let app_id = params.get("app_id").cloned().unwrap_or_default();
    let biz: Value = params
        .get("biz_content")
        .and_then(|b| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    let out_biz_no = biz["out_biz_no"].as_str().unwrap_or("").to_owned();
    fake.calls
        .lock()
        .expect("calls")
        .push((method.to_owned(), out_biz_no.clone()));
    let value = match method {
        TRANSFER => return create(fake, &app_id, &biz).await,
        QUERY => query(fake, &app_id, &biz),
        _ => refusal("40004", "isv.invalid-method", "不存在的方法名"),
    };
    alipay_signed(fake, method, &value)
}

/// Why a create names no transfer to make.
fn unreadable(biz: &Value) -> Option<&'static str> {
    let text = |v: &Value| v.as_str().is_some_and(|s| !s.is_empty());
    let payee = &biz["payee_info"];
    if !text(&biz["out_biz_no"])
        || biz["product_code"] != "TRANS_ACCOUNT_NO_PWD"
        || biz["biz_scene"] != "DIRECT_TRANSFER"
        || !text(&biz["order_title"])
        || !text(&payee["identity"])
    {
        return Some("参数有误");
    }
    if !matches!(
        payee["identity_type"].as_str(),
        Some("ALIPAY_USER_ID" | "ALIPAY_LOGON_ID" | "ALIPAY_OPEN_ID")
    ) {
        return Some("参数有误：identity_type");
    }
    // The SDK bug protocols.md names: `"name": null` is not a name.
    if payee.get("name").is_some_and(|n| !text(n)) {
        return Some("参数有误：name");
    }
    None
}

/// `alipay.fund.trans.uni.transfer`: the transfer under `out_biz_no`, made now or held
/// before with the same parameters.
async fn create(fake: &Fake, app_id: &str, biz: &Value) -> HttpResponse {
    let answer = |value: Value| alipay_signed(fake, TRANSFER, &value);
    if let Some(why) = unreadable(biz) {
        return answer(refusal("40004", "INVALID_PARAMETER", why));
    }
    let Some(amount_fen) = biz["trans_amount"]
        .as_str()
        .and_then(|a| yuan_to_fen(a).ok())
    else {
        return answer(refusal(
            "40004",
            "INVALID_PARAMETER",
            "参数有误：trans_amount",
        ));
    };
    let out_biz_no = biz["out_biz_no"].as_str().unwrap_or("").to_owned();
    let (held, new) = {
        let mut transfers = fake.alipay_transfers.lock().expect("transfers");
        match transfers.held.get(&out_biz_no) {
            Some(held) if held.app_id == app_id && held.asked == *biz => (held.clone(), false),
            Some(_) => {
                return answer(refusal(
                    "40004",
                    "INVALID_PARAMETER",
                    "参数有误：同一out_biz_no的请求参数与之前不一致",
                ));
            }
            None => {
                if amount_fen < 10 {
                    return answer(refusal(
                        "40004",
                        "EXCEED_LIMIT_SM_MIN_AMOUNT",
                        "单笔最低转账金额0.1元",
                    ));
                }
                if biz["payee_info"]["identity_type"] == "ALIPAY_LOGON_ID"
                    && biz["payee_info"].get("name").is_none()
                {
                    return answer(refusal(
                        "40004",
                        "PAYEE_USERINFO_ERROR",
                        "支付宝账号和姓名不匹配，请确认姓名是否正确",
                    ));
                }
                let status = match transfers.new {
                    NewTransfer::Success => Status::Success,
                    NewTransfer::Dealing => Status::Dealing,
                    NewTransfer::Refused(sub_code) => {
                        return answer(refusal("40004", sub_code, "收款账号不存在或转账被拒绝"));
                    }
                };
                transfers.created += 1;
                let held = AlipayTransfer {
                    app_id: app_id.to_owned(),
                    order_id: format!("2026113011007{:019}", transfers.created),
                    out_biz_no: out_biz_no.clone(),
                    amount_fen,
                    status,
                    asked: biz.clone(),
                };
                transfers.held.insert(out_biz_no.clone(), held.clone());
                (held, true)
            }
        }
    };
    if new {
        let hang = {
            let mut transfers = fake.alipay_transfers.lock().expect("transfers");
            let hang = transfers.hang > 0;
            transfers.hang = transfers.hang.saturating_sub(1);
            hang
        };
        if hang {
            tokio::time::sleep(Duration::from_secs(HANG_SECS)).await;
        }
    }
    answer(json!({
        "code": "10000", "msg": "Success", "out_biz_no": held.out_biz_no,
        "order_id": held.order_id, "pay_fund_order_id": format!("{}01", held.order_id),
        "status": held.status.word(), "trans_date": "2026-11-30 11:00:00"
    }))
}

/// `alipay.fund.trans.common.query` by `out_biz_no` (with `product_code` and `biz_scene`,
/// which Alipay requires with it) or by `order_id`.
fn query(fake: &Fake, app_id: &str, biz: &Value) -> Value {
    let transfers = fake.alipay_transfers.lock().expect("transfers");
    let found = match (biz["out_biz_no"].as_str(), biz["order_id"].as_str()) {
        (Some(no), _) => {
            if biz["product_code"] != "TRANS_ACCOUNT_NO_PWD"
                || biz["biz_scene"] != "DIRECT_TRANSFER"
            {
                return refusal(
                    "40004",
                    "INVALID_PARAMETER",
                    "参数有误：product_code和biz_scene必填",
                );
            }
            transfers.held.get(no)
        }
        (None, Some(order_id)) => transfers.held.values().find(|t| t.order_id == order_id),
        (None, None) => return refusal("40004", "INVALID_PARAMETER", "参数有误"),
    };
    let Some(t) = found.filter(|t| t.app_id == app_id) else {
        return refusal("40004", "ORDER_NOT_EXIST", "转账订单不存在");
    };
    let mut value = json!({
        "code": "10000", "msg": "Success", "order_id": t.order_id, "out_biz_no": t.out_biz_no,
        "pay_fund_order_id": format!("{}01", t.order_id), "status": t.status.word()
    });
    match &t.status {
        Status::Success => {
            value["pay_date"] = json!("2026-11-30 11:00:01");
            value["trans_amount"] = json!(yuan(t.amount_fen));
        }
        Status::Fail(code) => {
            value["error_code"] = json!(code);
            value["fail_reason"] = json!("收款账户状态异常");
        }
        Status::Dealing => {}
    }
    value
}
