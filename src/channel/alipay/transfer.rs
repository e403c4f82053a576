//! Alipay's 单笔转账: `alipay.fund.trans.uni.transfer` and `alipay.fund.trans.common.query`,
//! each answer verified before it counts, and what a fund order says about one transfer —
//! the query's answer and the `alipay.fund.trans.order.changed` message read alike.
//!
//! Alipay's fund-out APIs take apps in certificate mode only (python-alipay-sdk:
//! "只支持公钥证书模式"): every request carries `app_cert_sn` and `alipay_root_cert_sn`
//! ([`super::api::CertSn`]). Alipay has no cancel of an account transfer.

use serde::Deserialize;
use serde_json::{Value, json};

use super::api::{AlipayApi, ApiApp, beijing_time};
use crate::channel::api::{Failure, Miss, TransferAnswer, TransferReply};
use crate::money::{fen_to_yuan, yuan_to_fen};
use crate::time::Timestamp;
use crate::transfer::{Payee, TransferCall, TransferSeen, TransferState, max_len};

/// The create (`out_biz_no` is the idempotency key: the same number again is the same
/// transfer).
pub const TRANSFER_METHOD: &str = "alipay.fund.trans.uni.transfer";
/// The query, by `out_biz_no` with `product_code` and `biz_scene`.
pub const QUERY_METHOD: &str = "alipay.fund.trans.common.query";
/// The message Alipay posts to the app gateway when a fund order changes (资金单据状态变更通知).
pub const ORDER_CHANGED: &str = "alipay.fund.trans.order.changed";
/// 单笔无密转账到支付宝账户.
pub const PRODUCT_CODE: &str = "TRANS_ACCOUNT_NO_PWD";
pub const BIZ_SCENE: &str = "DIRECT_TRANSFER";

/// Whether app `a` may send transfers: only in certificate mode. Its payees belong to no app
/// of ours (an Alipay user id or logon id), so the list is empty.
impl AlipayApi {
    pub(super) fn transfer_apps_of(a: &ApiApp) -> Result<Vec<String>, String> {
        match a.cert_sn {
            Some(_) => Ok(Vec::new()),
            None => Err(format!(
                "app {} signs in public-key mode: Alipay's fund-out APIs ({TRANSFER_METHOD}) take certificate mode only",
                a.app.app_id
            )),
        }
    }
}

/// The `biz_content` of a transfer, the same every time it is sent: `trans_amount` in yuan,
/// `payee_info.name` only when there is one (python-alipay-sdk sends `null`; Alipay checks
/// a name it is given against the account).
pub(super) fn transfer_biz(call: &TransferCall) -> Result<Value, Failure> {
    let Payee::Alipay(p) = &call.payee else {
        return Err(Failure::Unexpected(format!(
            "transfer {} is not to an Alipay payee",
            call.out_bill_no
        )));
    };
    let mut payee = json!({ "identity": p.identity, "identity_type": p.identity_type });
    if let Some(name) = p.name.as_ref().filter(|n| !n.is_empty()) {
        payee["name"] = Value::String(name.clone());
    }
    Ok(json!({
        "out_biz_no": call.out_bill_no,
        "trans_amount": fen_to_yuan(call.amount_fen),
        "product_code": PRODUCT_CODE,
        "biz_scene": BIZ_SCENE,
        "order_title": p.order_title,
        "payee_info": payee,
        "remark": call.remark,
    }))
}

/// The `biz_content` of a query by our number.
pub(super) fn query_biz(out_bill_no: &str) -> Value {
    json!({ "product_code": PRODUCT_CODE, "biz_scene": BIZ_SCENE, "out_biz_no": out_bill_no })
}

/// One fund order as Alipay writes it: in the create's and the query's answers, and in the
/// `biz_content` of `alipay.fund.trans.order.changed`.
#[derive(Debug, Default, Deserialize)]
pub(super) struct FundOrder {
    pub(super) out_biz_no: Option<String>,
    pub(super) order_id: Option<String>,
    /// `SUCCESS`, `FAIL`, `DEALING`, `REFUND`.
    pub(super) status: Option<String>,
    /// Yuan; the query names it on `SUCCESS`, the message always. A string in Alipay's
    /// answers; read as a number too.
    pub(super) trans_amount: Option<Value>,
    /// On `FAIL`: the code, then Alipay's words.
    pub(super) error_code: Option<String>,
    pub(super) fail_reason: Option<String>,
    /// The query's and the message's time of payment; the create's is `trans_date`.
    pub(super) pay_date: Option<String>,
    pub(super) trans_date: Option<String>,
}

fn given(text: Option<String>) -> Option<String> {
    text.filter(|t| !t.trim().is_empty())
}

impl FundOrder {
    /// What this fund order says about its transfer, as app `app_id`'s (the app whose
    /// Alipay key verified it). `Err` says why it says nothing usable.
    pub(super) fn seen(self, app_id: &str) -> Result<TransferSeen, String> {
        let out_bill_no = given(self.out_biz_no).ok_or("no out_biz_no")?;
        let status = given(self.status).ok_or("no status")?;
        let state =
            TransferState::parse(&status).ok_or_else(|| format!("unknown status {status}"))?;
        let amount_fen = match self.trans_amount {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.trim().is_empty() => None,
            Some(Value::String(s)) => {
                Some(yuan_to_fen(&s).map_err(|e| format!("trans_amount: {e}"))?)
            }
            Some(Value::Number(n)) => {
                Some(yuan_to_fen(&n.to_string()).map_err(|e| format!("trans_amount: {e}"))?)
            }
            Some(other) => return Err(format!("trans_amount is not an amount: {other}")),
        };
        // A transfer moves at least 0.1 yuan: none at all is not an amount Alipay writes.
        if amount_fen.is_some_and(|fen| fen <= 0) {
            return Err("trans_amount must be positive".to_owned());
        }
        // The code fits the column; Alipay's own words are cut to it.
        let fail_reason = given(self.error_code)
            .or_else(|| given(self.fail_reason))
            .map(|reason| reason.chars().take(max_len::FAIL_REASON).collect());
        let occurred_at = given(self.pay_date)
            .or_else(|| given(self.trans_date))
            .and_then(|at| beijing_time(&at));
        let seen = TransferSeen {
            out_bill_no,
            provider_bill_no: given(self.order_id),
            state,
            provider_state: Some(status),
            amount_fen,
            account: app_id.to_owned(),
            package_info: None,
            fail_reason,
            occurred_at,
        };
        seen.check_lengths()?;
        Ok(seen)
    }

    /// [`FundOrder::seen`], for an answer to a call about `out_bill_no`: a signed answer
    /// about another transfer (replayed from elsewhere) says nothing about this one.
    fn about(self, app_id: &str, out_bill_no: &str) -> Result<TransferSeen, Failure> {
        let answered = self.out_biz_no.clone();
        if answered.as_deref() != Some(out_bill_no) {
            return Err(Failure::Unexpected(format!(
                "asked about transfer {out_bill_no}, answered about {answered:?}"
            )));
        }
        self.seen(app_id).map_err(Failure::Unexpected)
    }
}

/// The fields of a fund call's `…_response` this client reads.
#[derive(Debug, Deserialize)]
pub(super) struct FundAnswer {
    pub(super) code: String,
    #[serde(default)]
    pub(super) msg: String,
    pub(super) sub_code: Option<String>,
    pub(super) sub_msg: Option<String>,
    #[serde(flatten)]
    pub(super) order: FundOrder,
}

impl FundAnswer {
    /// `20000`, `isp.*` and a `SYSTEM_ERROR` (系统繁忙): Alipay says "try later", nothing
    /// about the transfer.
    fn retry_later(&self) -> bool {
        let sub_code = self.sub_code.as_deref().unwrap_or("");
        self.code == "20000"
            || sub_code.starts_with("isp.")
            || sub_code == "SYSTEM_ERROR"
            || sub_code.ends_with(".SYSTEM_ERROR")
    }

    fn failure(&self) -> Failure {
        let what = format!(
            "code {} {} {} {}",
            self.code,
            self.msg,
            self.sub_code.as_deref().unwrap_or(""),
            self.sub_msg.as_deref().unwrap_or("")
        );
        if self.retry_later() {
            Failure::Unreachable(what)
        } else {
            Failure::Unexpected(what)
        }
    }
}

/// What a verified answer to `alipay.fund.trans.uni.transfer` means. `10000`: Alipay holds
/// the transfer (created now or before), in the state it names. `40004`: Alipay's signed
/// refusal of this transfer, in its `sub_code` (`PAYEE_NOT_EXIST`, `PAYEE_USERINFO_ERROR`,
/// `BALANCE_IS_NOT_ENOUGH`, …). Any other code refuses the app itself (`40006`
/// `isv.insufficient-isv-permissions`, `40001`/`40002` certificate SNs) and says nothing
/// about the payee: unexpected, sent again once someone fixes the app.
pub(super) fn transfer_reply(
    app_id: &str,
    out_bill_no: &str,
    r: FundAnswer,
) -> Result<TransferReply, Failure> {
    if r.retry_later() {
        return Ok(TransferReply::Failed(r.failure()));
    }
    match r.code.as_str() {
        "10000" => Ok(TransferReply::Accepted(Box::new(
            r.order.about(app_id, out_bill_no)?,
        ))),
        "40004" => Ok(TransferReply::Refused {
            code: r.sub_code.unwrap_or(r.code),
            message: r.sub_msg.unwrap_or(r.msg),
        }),
        _ => Err(r.failure()),
    }
}

/// What a verified answer to `alipay.fund.trans.common.query` means: the transfer as Alipay
/// holds it, or `ORDER_NOT_EXIST`: nothing under this number.
pub(super) fn query_answer(
    app_id: &str,
    out_bill_no: &str,
    r: FundAnswer,
) -> Result<TransferAnswer, Miss> {
    if r.retry_later() {
        return Err(r.failure().into());
    }
    if r.code == "10000" {
        return Ok(TransferAnswer::Found(Box::new(
            r.order.about(app_id, out_bill_no)?,
        )));
    }
    if r.sub_code.as_deref() == Some("ORDER_NOT_EXIST") {
        return Err(Miss::NotFound);
    }
    Err(r.failure().into())
}

impl AlipayApi {
    /// `alipay.fund.trans.uni.transfer` of `call`, from app `a`.
    pub(super) async fn send_transfer(
        &self,
        a: &ApiApp,
        call: &TransferCall,
        now: Timestamp,
    ) -> Result<TransferReply, Miss> {
        let biz = transfer_biz(call)?;
        let r = self.call_as(a, TRANSFER_METHOD, &biz, now).await?;
        Ok(transfer_reply(&a.app.app_id, &call.out_bill_no, r)?)
    }

    /// `alipay.fund.trans.common.query` of transfer `out_bill_no` of app `a`.
    pub(super) async fn query_transfer(
        &self,
        a: &ApiApp,
        out_bill_no: &str,
        now: Timestamp,
    ) -> Result<TransferAnswer, Miss> {
        let r = self
            .call_as(a, QUERY_METHOD, &query_biz(out_bill_no), now)
            .await?;
        query_answer(&a.app.app_id, out_bill_no, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::AlipayPayee;

    const APP: &str = "2021000000000002";

    fn call(identity_type: &str, name: Option<&str>) -> TransferCall {
        TransferCall {
            out_bill_no: "T1".into(),
            amount_fen: 12345,
            remark: "活动奖励".into(),
            payee: Payee::Alipay(AlipayPayee {
                identity: "2088000000000099".into(),
                identity_type: identity_type.into(),
                name: name.map(str::to_owned),
                order_title: "十一月奖励".into(),
            }),
        }
    }

    fn answer(value: Value) -> FundAnswer {
        serde_json::from_value(value).expect("answer")
    }

    #[test]
    fn a_transfer_names_its_amount_in_yuan_and_a_name_only_when_given() {
        let biz = transfer_biz(&call("ALIPAY_USER_ID", None)).expect("biz");
        assert_eq!(
            biz,
            json!({
                "out_biz_no": "T1",
                "trans_amount": "123.45",
                "product_code": "TRANS_ACCOUNT_NO_PWD",
                "biz_scene": "DIRECT_TRANSFER",
                "order_title": "十一月奖励",
                "payee_info": { "identity": "2088000000000099", "identity_type": "ALIPAY_USER_ID" },
                "remark": "活动奖励"
            })
        );
        // Never `"name": null`.
        assert!(!biz.to_string().contains("name\""), "{biz}");
        let named = transfer_biz(&call("ALIPAY_LOGON_ID", Some("张三"))).expect("biz");
        assert_eq!(named["payee_info"]["name"], "张三");
        assert_eq!(named["payee_info"]["identity_type"], "ALIPAY_LOGON_ID");
        let mut small = call("ALIPAY_USER_ID", None);
        small.amount_fen = 10;
        assert_eq!(transfer_biz(&small).expect("biz")["trans_amount"], "0.10");
        assert_eq!(
            query_biz("T1"),
            json!({"product_code": "TRANS_ACCOUNT_NO_PWD", "biz_scene": "DIRECT_TRANSFER", "out_biz_no": "T1"})
        );
    }

    #[test]
    fn a_transfer_to_a_wechat_payee_is_not_sent() {
        let mut wechat = call("ALIPAY_USER_ID", None);
        wechat.payee = Payee::Wechat(crate::transfer::WechatPayee {
            appid: "wx1".into(),
            openid: "o1".into(),
            user_name: None,
            transfer_scene_id: "1000".into(),
            transfer_scene_report_infos: Vec::new(),
            user_recv_perception: None,
            notify_url: None,
        });
        assert!(matches!(transfer_biz(&wechat), Err(Failure::Unexpected(_))));
    }

    #[test]
    fn an_accepted_transfer_carries_its_status_order_id_and_app() {
        for (status, state) in [
            ("SUCCESS", TransferState::Success),
            ("DEALING", TransferState::Processing),
            ("FAIL", TransferState::Fail),
            ("REFUND", TransferState::Fail),
        ] {
            let r = answer(json!({
                "code": "10000", "msg": "Success", "out_biz_no": "T1",
                "order_id": "20261130110070000002", "pay_fund_order_id": "20261130110070001",
                "status": status, "trans_date": "2026-11-30 11:00:00"
            }));
            let Ok(TransferReply::Accepted(seen)) = transfer_reply(APP, "T1", r) else {
                panic!("{status}: accepted");
            };
            assert_eq!(seen.state, state, "{status}");
            assert_eq!(seen.provider_state.as_deref(), Some(status));
            assert_eq!(
                seen.provider_bill_no.as_deref(),
                Some("20261130110070000002")
            );
            assert_eq!(seen.account, APP);
            assert_eq!(seen.amount_fen, None);
            assert_eq!(seen.out_bill_no, "T1");
            assert_eq!(seen.occurred_at, beijing_time("2026-11-30 11:00:00"));
        }
        // Another transfer's answer, or one naming none, or a status nobody documents.
        for value in [
            json!({"code": "10000", "out_biz_no": "T2", "order_id": "1", "status": "SUCCESS"}),
            json!({"code": "10000", "order_id": "1", "status": "SUCCESS"}),
            json!({"code": "10000", "out_biz_no": "T1", "order_id": "1", "status": "PAID"}),
            json!({"code": "10000", "out_biz_no": "T1", "order_id": "1"}),
        ] {
            assert!(
                matches!(
                    transfer_reply(APP, "T1", answer(value.clone())),
                    Err(Failure::Unexpected(_))
                ),
                "{value}"
            );
        }
    }

    #[test]
    fn a_business_refusal_is_a_refusal_and_a_refusal_of_the_app_is_not() {
        for sub_code in [
            "PAYEE_NOT_EXIST",
            "PAYEE_USERINFO_ERROR",
            "BALANCE_IS_NOT_ENOUGH",
            "INVALID_PARAMETER",
        ] {
            let r = answer(json!({
                "code": "40004", "msg": "Business Failed", "sub_code": sub_code, "sub_msg": "说明"
            }));
            assert_eq!(
                transfer_reply(APP, "T1", r),
                Ok(TransferReply::Refused {
                    code: sub_code.into(),
                    message: "说明".into()
                })
            );
        }
        for (code, sub_code) in [
            ("40006", "isv.insufficient-isv-permissions"),
            ("40001", "isv.missing-app-cert-sn"),
            ("40002", "isv.invalid-app-cert-sn"),
            ("40002", "isv.invalid-alipay-root-cert-sn"),
        ] {
            let r = answer(json!({"code": code, "msg": "Invalid", "sub_code": sub_code}));
            assert!(
                matches!(
                    transfer_reply(APP, "T1", r),
                    Err(Failure::Unexpected(why)) if why.contains(sub_code)
                ),
                "{code} {sub_code}"
            );
        }
        for (code, sub_code) in [
            ("20000", "isp.unknow-error"),
            ("40004", "SYSTEM_ERROR"),
            ("40004", "ACQ.SYSTEM_ERROR"),
        ] {
            let r = answer(json!({"code": code, "msg": "busy", "sub_code": sub_code}));
            assert!(
                matches!(
                    transfer_reply(APP, "T1", r),
                    Ok(TransferReply::Failed(Failure::Unreachable(_)))
                ),
                "{code} {sub_code}"
            );
        }
    }

    #[test]
    fn a_query_names_the_amount_and_the_failure_and_order_not_exist_is_none() {
        let found = answer(json!({
            "code": "10000", "msg": "Success", "out_biz_no": "T1", "order_id": "2026O1",
            "status": "SUCCESS", "trans_amount": "123.45", "pay_date": "2026-11-30 11:00:01"
        }));
        let Ok(TransferAnswer::Found(seen)) = query_answer(APP, "T1", found) else {
            panic!("found");
        };
        assert_eq!(seen.amount_fen, Some(12345));
        assert_eq!(seen.state, TransferState::Success);
        assert_eq!(seen.occurred_at, beijing_time("2026-11-30 11:00:01"));
        let failed = answer(json!({
            "code": "10000", "out_biz_no": "T1", "order_id": "2026O1", "status": "FAIL",
            "error_code": "PAYEE_ACCOUNT_STATUS_ERROR", "fail_reason": "收款方账户状态异常"
        }));
        let Ok(TransferAnswer::Found(seen)) = query_answer(APP, "T1", failed) else {
            panic!("found");
        };
        assert_eq!(seen.state, TransferState::Fail);
        assert_eq!(seen.amount_fen, None);
        assert_eq!(
            seen.fail_reason.as_deref(),
            Some("PAYEE_ACCOUNT_STATUS_ERROR")
        );
        let words_only = answer(json!({
            "code": "10000", "out_biz_no": "T1", "status": "FAIL",
            "fail_reason": "很".repeat(100)
        }));
        let Ok(TransferAnswer::Found(seen)) = query_answer(APP, "T1", words_only) else {
            panic!("found");
        };
        assert_eq!(
            seen.fail_reason.map(|r| r.chars().count()),
            Some(max_len::FAIL_REASON)
        );
        let none = answer(json!({
            "code": "40004", "msg": "Business Failed", "sub_code": "ORDER_NOT_EXIST", "sub_msg": "转账订单不存在"
        }));
        assert_eq!(query_answer(APP, "T1", none), Err(Miss::NotFound));
        let other = answer(json!({"code": "10000", "out_biz_no": "T9", "status": "SUCCESS"}));
        assert!(matches!(
            query_answer(APP, "T1", other),
            Err(Miss::Failed(Failure::Unexpected(_)))
        ));
        let bad_amount = answer(
            json!({"code": "10000", "out_biz_no": "T1", "status": "SUCCESS", "trans_amount": "1.234"}),
        );
        assert!(matches!(
            query_answer(APP, "T1", bad_amount),
            Err(Miss::Failed(Failure::Unexpected(_)))
        ));
        let busy = answer(json!({"code": "20000", "sub_code": "isp.unknow-error"}));
        assert!(matches!(
            query_answer(APP, "T1", busy),
            Err(Miss::Failed(Failure::Unreachable(_)))
        ));
    }

    #[test]
    fn a_fund_order_of_no_money_says_nothing_usable() {
        let order = |amount: Value| -> FundOrder {
            serde_json::from_value(json!({
                "out_biz_no": "T1", "order_id": "20261130110070000006", "status": "SUCCESS",
                "trans_amount": amount
            }))
            .expect("a fund order")
        };
        assert_eq!(
            order(json!("10.50")).seen(APP).map(|s| s.amount_fen),
            Ok(Some(1050))
        );
        for nothing in [json!("0"), json!("0.00"), json!(0)] {
            assert!(order(nothing.clone()).seen(APP).is_err(), "{nothing}");
        }
    }
}
