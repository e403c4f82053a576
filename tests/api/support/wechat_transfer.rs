//! The stand-in's merchant transfers (商家转账): WeChat Pay's
//! `POST /v3/fund-app/mch-transfer/transfer-bills`, its query by `out_bill_no` and its cancel,
//! after the request's signature verified ([`super::provider`] checks it), and the
//! `MCHTRANSFER.BILL.FINISHED` notification of a bill it holds.
//!
//! A test drives it through `fake.state.wechat_transfers` ([`Transfers`]):
//!
//! - how new bills start: [`Transfers::new_bills`] ([`NewBill::WaitUserConfirm`] with a
//!   `package_info`, the default; [`NewBill::Success`] at once; [`NewBill::NotEnough`], a
//!   `403 NOT_ENOUGH` refusal that creates nothing);
//! - [`Transfers::hang_after_creating`]: the next creates hold their bill, then answer only
//!   after [`super::refunds::HANG_SECS`] (the caller times out while the bill exists);
//! - what happens to a bill later: [`Transfers::confirm`] (the user confirmed: `TRANSFERING`),
//!   [`Transfers::succeed`], [`Transfers::fail`] (with WeChat's `fail_reason`),
//!   [`Transfers::finish_cancel`] (`CANCELING` → `CANCELLED`), or any state with
//!   [`Transfers::set_state`];
//! - what it holds and was asked: [`Transfers::bill`], [`Transfers::held`],
//!   [`Transfers::calls`] per [`Kind`];
//! - [`Transfers::finished`]: the signed notification of a bill it holds, as WeChat sends it
//!   when the bill is final; [`finished`] builds one for any bill (one never started, say).
//!
//! WeChat's rules it keeps: the request names the platform key (`Wechatpay-Serial`) that
//! sealed `user_name` (RSAES-OAEP SHA-1, checked by opening it with the platform key's private
//! half), a name below 30 fen or no name at 2 000 yuan or more is `400 PARAM_ERROR`, the same
//! `out_bill_no` with the same parameters is the same bill and with others `400
//! INVALID_REQUEST`, an unknown bill is `404 NOT_FOUND`, a cancel after the user confirmed is
//! `400 INVALID_REQUEST` (the last three are the fake's choice: protocols.md "Not confirmed").
//! Answers are signed as the fake signs (`Signing`); errors are never signed, as WeChat's.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse};
use paynotify::qa::forge::Delivery;
use paynotify::qa::forge::wechat::{self as forge, Sandbox};
use serde_json::{Value, json};

use super::provider::{Fake, wechat_error, wechat_signed};
use super::refunds::HANG_SECS;

/// WeChat's transfer-bills path: `POST` creates; `GET …/out-bill-no/{no}` queries;
/// `POST …/out-bill-no/{no}/cancel` cancels.
pub const PATH: &str = "/v3/fund-app/mch-transfer/transfer-bills";

/// A bill's state, in WeChat's words ([`BillState::wechat`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BillState {
    Accepted,
    Processing,
    WaitUserConfirm,
    /// The user confirmed: a cancel is refused from now on.
    Transfering,
    Success,
    Fail,
    Canceling,
    Cancelled,
}

impl BillState {
    pub fn wechat(self) -> &'static str {
        match self {
            Self::Accepted => "ACCEPTED",
            Self::Processing => "PROCESSING",
            Self::WaitUserConfirm => "WAIT_USER_CONFIRM",
            Self::Transfering => "TRANSFERING",
            Self::Success => "SUCCESS",
            Self::Fail => "FAIL",
            Self::Canceling => "CANCELING",
            Self::Cancelled => "CANCELLED",
        }
    }

    /// Whether WeChat still takes a cancel: before the user confirmed.
    fn cancellable(self) -> bool {
        matches!(
            self,
            Self::Accepted | Self::Processing | Self::WaitUserConfirm | Self::Canceling
        )
    }
}

/// How a bill created from now on starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NewBill {
    /// `WAIT_USER_CONFIRM`, with a `package_info` for WeChat's confirm page.
    #[default]
    WaitUserConfirm,
    /// `SUCCESS` in the create's answer (a scene without the user-confirm step).
    Success,
    /// Refused `403 NOT_ENOUGH` (基本账户余额不足): nothing created.
    NotEnough,
}

/// The calls the stand-in counts, each after its signature verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Create,
    Query,
    Cancel,
}

/// One bill the stand-in holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bill {
    pub out_bill_no: String,
    /// `1330` + `out_bill_no`.
    pub transfer_bill_no: String,
    pub appid: String,
    pub openid: String,
    pub amount_fen: i64,
    pub remark: String,
    /// The payee's name as opened with the platform key.
    pub user_name: Option<String>,
    pub notify_url: Option<String>,
    pub state: BillState,
    pub fail_reason: Option<String>,
    /// With `WAIT_USER_CONFIRM`.
    pub package_info: Option<String>,
    /// The create's parameters, the name opened: what a repeated create must match.
    asked: Value,
}

/// The transfer side of the WeChat stand-in (one field of `Fake`).
#[derive(Debug, Default)]
pub struct Transfers {
    bills: Mutex<HashMap<String, Bill>>,
    new_bill: Mutex<NewBill>,
    hang_creates: AtomicUsize,
    calls: Mutex<HashMap<Kind, usize>>,
}

impl Transfers {
    /// Bills created from now on start as `how`.
    pub fn new_bills(&self, how: NewBill) {
        *self.new_bill.lock().expect("new bill") = how;
    }

    /// The next `creates` creates hold their bill, then answer only after
    /// [`HANG_SECS`](super::refunds::HANG_SECS).
    pub fn hang_after_creating(&self, creates: usize) {
        self.hang_creates.store(creates, Ordering::SeqCst);
    }

    /// The bill held under `out_bill_no`.
    pub fn bill(&self, out_bill_no: &str) -> Option<Bill> {
        self.bills.lock().expect("bills").get(out_bill_no).cloned()
    }

    /// How many bills the stand-in holds.
    pub fn held(&self) -> usize {
        self.bills.lock().expect("bills").len()
    }

    /// How many `kind` calls verified and were answered (refused ones included).
    pub fn calls(&self, kind: Kind) -> usize {
        self.calls
            .lock()
            .expect("calls")
            .get(&kind)
            .copied()
            .unwrap_or(0)
    }

    /// Bill `out_bill_no` is `state` now, with `fail_reason` (`None` clears it).
    pub fn set_state(&self, out_bill_no: &str, state: BillState, fail_reason: Option<&str>) {
        let mut bills = self.bills.lock().expect("bills");
        let bill = bills
            .get_mut(out_bill_no)
            .unwrap_or_else(|| panic!("the stand-in holds no bill {out_bill_no}"));
        bill.state = state;
        bill.fail_reason = fail_reason.map(str::to_owned);
        if state != BillState::WaitUserConfirm {
            bill.package_info = None;
        }
    }

    /// The user confirmed on WeChat's page: `TRANSFERING`.
    pub fn confirm(&self, out_bill_no: &str) {
        self.set_state(out_bill_no, BillState::Transfering, None);
    }

    /// The money reached the user: `SUCCESS`.
    pub fn succeed(&self, out_bill_no: &str) {
        self.set_state(out_bill_no, BillState::Success, None);
    }

    /// `FAIL` with WeChat's `reason` (`PAYEE_ACCOUNT_ABNORMAL`, `NAME_NOT_CORRECT`,
    /// `OVERDUE_CLOSE`, …).
    pub fn fail(&self, out_bill_no: &str, reason: &str) {
        self.set_state(out_bill_no, BillState::Fail, Some(reason));
    }

    /// A cancel WeChat accepted is done: `CANCELING` → `CANCELLED`.
    pub fn finish_cancel(&self, out_bill_no: &str) {
        let state = self.bill(out_bill_no).map(|b| b.state);
        assert_eq!(
            state,
            Some(BillState::Canceling),
            "{out_bill_no}: only a bill being cancelled is cancelled"
        );
        self.set_state(out_bill_no, BillState::Cancelled, None);
    }

    /// The `MCHTRANSFER.BILL.FINISHED` notification of the bill held under `out_bill_no`, in
    /// its state now, signed with `s`'s platform key at `timestamp` (the notify route's
    /// sandbox: `crate::wechat::sandbox('A')` for the stand-in's merchant).
    pub fn finished(&self, s: &Sandbox, out_bill_no: &str, timestamp: i64) -> Delivery {
        let bill = self
            .bill(out_bill_no)
            .unwrap_or_else(|| panic!("the stand-in holds no bill {out_bill_no}"));
        finished(
            s,
            &bill.out_bill_no,
            &bill.transfer_bill_no,
            bill.state.wechat(),
            bill.amount_fen,
            bill.fail_reason.as_deref(),
            timestamp,
        )
    }

    fn count(&self, kind: Kind) {
        *self.calls.lock().expect("calls").entry(kind).or_insert(0) += 1;
    }
}

/// A signed `MCHTRANSFER.BILL.FINISHED` notification about any bill, as WeChat sends it: the
/// resource (`mch_payment`) encrypted with `s`'s APIv3 key, the envelope signed with its
/// platform key at `timestamp`.
pub fn finished(
    s: &Sandbox,
    out_bill_no: &str,
    transfer_bill_no: &str,
    state: &str,
    amount_fen: i64,
    fail_reason: Option<&str>,
    timestamp: i64,
) -> Delivery {
    let resource = forge::transfer(
        s,
        out_bill_no,
        transfer_bill_no,
        state,
        amount_fen,
        fail_reason,
    );
    s.notification("MCHTRANSFER.BILL.FINISHED", &resource, timestamp)
        .expect("forge")
}

/// A bill as the create answers it.
fn created(bill: &Bill) -> Value {
    let mut answer = json!({
        "out_bill_no": bill.out_bill_no,
        "transfer_bill_no": bill.transfer_bill_no,
        "create_time": "2026-11-30T10:00:00+08:00",
        "state": bill.state.wechat(),
    });
    if let Some(package) = &bill.package_info {
        answer["package_info"] = json!(package);
    }
    if let Some(reason) = &bill.fail_reason {
        answer["fail_reason"] = json!(reason);
    }
    answer
}

/// A bill as the query answers it (the name is not echoed here).
fn queried(fake: &Fake, bill: &Bill) -> Value {
    let mut answer = json!({
        "mch_id": fake.mchid,
        "out_bill_no": bill.out_bill_no,
        "transfer_bill_no": bill.transfer_bill_no,
        "appid": bill.appid,
        "state": bill.state.wechat(),
        "transfer_amount": bill.amount_fen,
        "transfer_remark": bill.remark,
        "openid": bill.openid,
        "create_time": "2026-11-30T10:00:00+08:00",
        "update_time": "2026-11-30T10:05:00+08:00",
    });
    if let Some(reason) = &bill.fail_reason {
        answer["fail_reason"] = json!(reason);
    }
    answer
}

/// Every request under [`PATH`], its signature verified.
pub(super) async fn answer(
    req: &HttpRequest,
    body: &[u8],
    fake: &Fake,
    timestamp: &str,
) -> HttpResponse {
    let path = req.path();
    let post = req.method() == actix_web::http::Method::POST;
    if path == PATH && post {
        return create(req, body, fake, timestamp).await;
    }
    let Some(rest) = path.strip_prefix(&format!("{PATH}/out-bill-no/")) else {
        return wechat_error(404, "NOT_FOUND", "no such API");
    };
    let t = &fake.wechat_transfers;
    match (rest.strip_suffix("/cancel"), post) {
        (None, false) => {
            t.count(Kind::Query);
            record(fake, "wechat.transfer_query", rest);
            match t.bill(rest) {
                None => wechat_error(404, "NOT_FOUND", "转账单不存在"),
                Some(bill) => wechat_signed(fake, 200, timestamp, queried(fake, &bill).to_string()),
            }
        }
        (Some(no), true) => {
            t.count(Kind::Cancel);
            record(fake, "wechat.transfer_cancel", no);
            cancel(fake, no, timestamp)
        }
        _ => wechat_error(404, "NOT_FOUND", "no such API"),
    }
}

fn record(fake: &Fake, call: &str, out_bill_no: &str) {
    fake.calls
        .lock()
        .expect("calls")
        .push((call.to_owned(), out_bill_no.to_owned()));
}

fn cancel(fake: &Fake, out_bill_no: &str, timestamp: &str) -> HttpResponse {
    let mut bills = fake.wechat_transfers.bills.lock().expect("bills");
    let Some(bill) = bills.get_mut(out_bill_no) else {
        return wechat_error(404, "NOT_FOUND", "转账单不存在");
    };
    if !bill.state.cancellable() {
        return wechat_error(400, "INVALID_REQUEST", "当前转账单状态不允许撤销");
    }
    bill.state = BillState::Canceling;
    bill.package_info = None;
    let answer = json!({
        "out_bill_no": bill.out_bill_no,
        "transfer_bill_no": bill.transfer_bill_no,
        "state": "CANCELING",
        "update_time": "2026-11-30T10:06:00+08:00",
    });
    drop(bills);
    wechat_signed(fake, 200, timestamp, answer.to_string())
}

/// `user_name` opened with the platform key the request names, or why WeChat refuses it.
fn open_name(req: &HttpRequest, fake: &Fake, sealed: &str) -> Result<String, &'static str> {
    let (serial, key) = fake.platform();
    let named = req
        .headers()
        .get("Wechatpay-Serial")
        .and_then(|v| v.to_str().ok());
    if named != Some(serial.as_str()) {
        return Err("Wechatpay-Serial 与加密所用的平台证书或公钥不符");
    }
    forge::open_user_name(&key, sealed).map_err(|_| "user_name 解密失败")
}

/// `POST /v3/fund-app/mch-transfer/transfer-bills`.
async fn create(req: &HttpRequest, body: &[u8], fake: &Fake, timestamp: &str) -> HttpResponse {
    let t = &fake.wechat_transfers;
    t.count(Kind::Create);
    let mut asked: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let out_bill_no = asked["out_bill_no"].as_str().unwrap_or("").to_owned();
    record(fake, "wechat.transfer", &out_bill_no);
    let text = |k: &str| {
        asked[k]
            .as_str()
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    let (Some(appid), Some(openid), Some(remark), Some(_scene), Some(amount_fen)) = (
        text("appid"),
        text("openid"),
        text("transfer_remark"),
        text("transfer_scene_id"),
        asked["transfer_amount"].as_i64(),
    ) else {
        return wechat_error(400, "PARAM_ERROR", "输入源“/body”映射到字段失败");
    };
    let well_formed = (1..=32).contains(&out_bill_no.len())
        && out_bill_no.bytes().all(|b| b.is_ascii_alphanumeric())
        && remark.chars().count() <= 32
        && amount_fen > 0
        && asked["transfer_scene_report_infos"].is_array();
    // WeChat refuses a `null` where a string goes.
    let nulls = asked
        .as_object()
        .is_some_and(|o| o.values().any(Value::is_null));
    if !well_formed || nulls {
        return wechat_error(400, "PARAM_ERROR", "参数错误");
    }
    let user_name = match asked["user_name"].as_str() {
        None => None,
        Some(sealed) => match open_name(req, fake, sealed) {
            Ok(name) => Some(name),
            Err(why) => return wechat_error(400, "PARAM_ERROR", why),
        },
    };
    match (&user_name, amount_fen) {
        (Some(_), fen) if fen < 30 => {
            return wechat_error(
                400,
                "PARAM_ERROR",
                "转账金额小于0.3元时不支持传入收款用户姓名",
            );
        }
        (None, fen) if fen >= 200_000 => {
            return wechat_error(
                400,
                "PARAM_ERROR",
                "转账金额大于等于2000元时必须传入收款用户姓名",
            );
        }
        _ => {}
    }
    let notify_url = text("notify_url");
    // Compared with the name opened: each sealing of it differs.
    if let Some(name) = &user_name {
        asked["user_name"] = json!(name);
    }
    let bill = {
        let mut bills = t.bills.lock().expect("bills");
        if let Some(held) = bills.get(&out_bill_no) {
            if held.asked != asked {
                return wechat_error(
                    400,
                    "INVALID_REQUEST",
                    "商户单号重复，但请求参数与原请求不一致",
                );
            }
            let answer = created(held);
            drop(bills);
            return wechat_signed(fake, 200, timestamp, answer.to_string());
        }
        let how = *t.new_bill.lock().expect("new bill");
        let state = match how {
            NewBill::NotEnough => return wechat_error(403, "NOT_ENOUGH", "基本账户余额不足"),
            NewBill::WaitUserConfirm => BillState::WaitUserConfirm,
            NewBill::Success => BillState::Success,
        };
        let bill = Bill {
            transfer_bill_no: format!("1330{out_bill_no}"),
            out_bill_no: out_bill_no.clone(),
            appid,
            openid,
            amount_fen,
            remark,
            user_name,
            notify_url,
            state,
            fail_reason: None,
            package_info: (state == BillState::WaitUserConfirm)
                .then(|| format!("affffddafdfafddffda==.{out_bill_no}")),
            asked,
        };
        bills.insert(out_bill_no, bill.clone());
        bill
    };
    let hang = t
        .hang_creates
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if hang {
        tokio::time::sleep(Duration::from_secs(HANG_SECS)).await;
    }
    wechat_signed(fake, 200, timestamp, created(&bill).to_string())
}
