//! The trade calls of the OpenAPI client: `alipay.trade.query`, `.close`, `.refund` and
//! `.fastpay.refund.query` (an authorized app's with its `app_auth_token`), each answer
//! verified, and the payments and refunds they show.

use super::App;
use super::api::{AlipayApi, ApiApp, ApiResponse, beijing_time, not_for_authorized};
use crate::channel::api::{
    Accounts, CancelReply, CloseAnswer, Failure, Miss, ProviderClient, RefundAnswer, RefundCall,
    RefundReply, RefundState, TradeAnswer, TransferAnswer, TransferReply,
};
use crate::money::{fen_to_yuan, yuan_to_fen};
use crate::notice::{ChannelId, MerchantIds, Notice, NoticeKind, Refund, RefundAmount};
use crate::time::Timestamp;
use crate::transfer::TransferCall;

impl ProviderClient for AlipayApi {
    type Account = ApiApp;
    const CHANNEL: ChannelId = ChannelId::Alipay;

    fn accounts(&self) -> &Accounts<ApiApp> {
        &self.apps
    }

    async fn query(
        &self,
        a: &ApiApp,
        out_trade_no: &str,
        now: Timestamp,
    ) -> Result<TradeAnswer, Miss> {
        let biz = serde_json::json!({ "out_trade_no": out_trade_no });
        let r = self
            .call(a, "alipay.trade.query", &biz, now)
            .await?
            .found()?;
        if r.out_trade_no.as_deref() != Some(out_trade_no) {
            return Err(Failure::Unexpected(format!(
                "asked about {out_trade_no}, answered about {:?}",
                r.out_trade_no
            ))
            .into());
        }
        let status = r.trade_status.clone().unwrap_or_default();
        match status.as_str() {
            // TRADE_CLOSED is also "paid, then refunded in full" (未付款交易超时关闭，或支付完成
            // 后全额退款): the payment happened, as WeChat's REFUND, and the answer shows it.
            "TRADE_SUCCESS" | "TRADE_FINISHED" => paid(a, r),
            "TRADE_CLOSED" if r.carries_a_payment() => paid(a, r),
            "TRADE_CLOSED" => Ok(TradeAnswer::Closed),
            _ => Ok(TradeAnswer::Unpaid(status)),
        }
    }

    async fn close(
        &self,
        a: &ApiApp,
        out_trade_no: &str,
        now: Timestamp,
    ) -> Result<CloseAnswer, Miss> {
        let biz = serde_json::json!({ "out_trade_no": out_trade_no });
        let r = self.call(a, "alipay.trade.close", &biz, now).await?;
        match (r.code.as_str(), r.sub_code.as_deref()) {
            // A success carries no time: another order's, replayed, must not count for this one.
            ("10000", _) if r.out_trade_no.as_deref() == Some(out_trade_no) => {
                Ok(CloseAnswer::Closed)
            }
            ("10000", _) => Err(Failure::Unexpected(format!(
                "asked to close {out_trade_no}, answered about {:?}",
                r.out_trade_no
            ))
            .into()),
            (_, Some("ACQ.TRADE_NOT_EXIST")) => Err(Miss::NotFound),
            // Paid, or closed already: a query tells which.
            (_, Some("ACQ.TRADE_STATUS_ERROR")) => Ok(CloseAnswer::NotClosable),
            _ => Err(r.failure().into()),
        }
    }

    async fn refund_query(
        &self,
        a: &ApiApp,
        out_trade_no: &str,
        out_refund_no: &str,
        now: Timestamp,
    ) -> Result<RefundAnswer, Miss> {
        let biz =
            serde_json::json!({ "out_trade_no": out_trade_no, "out_request_no": out_refund_no });
        let r = self
            .call(a, "alipay.trade.fastpay.refund.query", &biz, now)
            .await?
            .found()?;
        if r.out_request_no
            .as_deref()
            .is_some_and(|no| no != out_refund_no)
        {
            return Err(Failure::Unexpected(format!(
                "asked about refund {out_refund_no}, answered about {:?}",
                r.out_request_no
            ))
            .into());
        }
        // `10000` alone is not a refund: only REFUND_SUCCESS is (an empty answer means
        // Alipay has no such refund request).
        match r.refund_status.as_deref() {
            Some("REFUND_SUCCESS") => Ok(RefundAnswer::Refunded(None)),
            Some(other) => Ok(RefundAnswer::NotRefunded(
                RefundState::Processing,
                other.to_owned(),
            )),
            None => Err(Miss::NotFound),
        }
    }

    /// `alipay.trade.refund` of the order's own payment, `out_request_no` the refund's
    /// number (Alipay deduplicates on it). The answer is signed, business errors included.
    async fn refund(
        &self,
        a: &ApiApp,
        call: &RefundCall,
        now: Timestamp,
    ) -> Result<RefundReply, Miss> {
        let r = self
            .call(a, "alipay.trade.refund", &refund_biz(call), now)
            .await?;
        Ok(refund_reply(&a.app, call, r)?)
    }

    fn transfer_apps(&self, a: &ApiApp) -> Result<Vec<String>, String> {
        not_for_authorized(a).map_err(|f| f.detail().to_owned())?;
        Self::transfer_apps_of(a)
    }

    async fn transfer(
        &self,
        a: &ApiApp,
        call: &TransferCall,
        now: Timestamp,
    ) -> Result<TransferReply, Miss> {
        not_for_authorized(a)?;
        self.send_transfer(a, call, now).await
    }

    async fn transfer_query(
        &self,
        a: &ApiApp,
        out_bill_no: &str,
        now: Timestamp,
    ) -> Result<TransferAnswer, Miss> {
        not_for_authorized(a)?;
        self.query_transfer(a, out_bill_no, now).await
    }

    /// Alipay has no cancel of a transfer: an account transfer is final in its answer.
    async fn transfer_cancel(
        &self,
        _: &ApiApp,
        _: &str,
        _: Timestamp,
    ) -> Result<CancelReply, Miss> {
        Err(Failure::Unexpected("Alipay transfers cannot be cancelled".into()).into())
    }
}

/// The `biz_content` of a refund: `refund_reason` only when there is one.
pub(super) fn refund_biz(call: &RefundCall) -> serde_json::Value {
    let mut biz = serde_json::json!({
        "out_trade_no": call.out_trade_no,
        "trade_no": call.transaction_id,
        "refund_amount": fen_to_yuan(call.amount_fen),
        "out_request_no": call.out_refund_no,
    });
    if let Some(reason) = &call.reason {
        biz["refund_reason"] = serde_json::Value::String(reason.clone());
    }
    biz
}

/// What a verified answer to `alipay.trade.refund` means. `10000` with `fund_change` `Y`:
/// done now, with the notice of its refund notification. `N` (or none): Alipay holds the
/// refund, refunded before under this number or not yet; a refund query tells which.
/// `20000` and `ACQ.SYSTEM_ERROR`: no answer, send it again. Any other code is Alipay's
/// signed refusal, in its `sub_code` and `sub_msg`.
pub(super) fn refund_reply(
    app: &App,
    call: &RefundCall,
    r: ApiResponse,
) -> Result<RefundReply, Failure> {
    if r.retry_later() {
        return Ok(RefundReply::Failed(r.failure()));
    }
    if r.code != "10000" {
        return Ok(RefundReply::Refused {
            code: r.sub_code.unwrap_or(r.code),
            message: r.sub_msg.unwrap_or(r.msg),
        });
    }
    // Every id the answer carries is checked: a signed answer about another trade (replayed
    // from elsewhere) says nothing about this refund.
    let names_another =
        |answered: &Option<String>, asked: &str| answered.as_deref().is_some_and(|no| no != asked);
    if r.out_trade_no.as_deref() != Some(call.out_trade_no.as_str())
        || names_another(&r.trade_no, &call.transaction_id)
        || names_another(&r.out_request_no, &call.out_refund_no)
    {
        return Err(Failure::Unexpected(format!(
            "asked to make refund {} of {} ({}), answered about {:?} ({:?}, {:?})",
            call.out_refund_no,
            call.out_trade_no,
            call.transaction_id,
            r.out_trade_no,
            r.trade_no,
            r.out_request_no
        )));
    }
    let refund_id = format!("{}:{}", call.transaction_id, call.out_refund_no);
    if r.fund_change.as_deref() != Some("Y") {
        return Ok(RefundReply::Accepted {
            state: RefundState::Processing,
            refund_id: Some(refund_id),
            notice: None,
        });
    }
    let notice = refunded_notice(app, call, &r, refund_id.clone())?;
    Ok(RefundReply::Accepted {
        state: RefundState::Success,
        refund_id: Some(refund_id),
        notice: Some(Box::new(notice)),
    })
}

/// A refund done now (`fund_change` `Y`): the notice its partial-refund notification decodes
/// to (`refund_fee`, `out_biz_no` = `out_request_no`), so the same digest. The answer names
/// neither seller nor app nor the trade's total: the seller is the asking app's (checked
/// against `seller_id` when the answer carries one), the app the one that asked, the total
/// the payment's that the call names.
fn refunded_notice(
    app: &App,
    call: &RefundCall,
    r: &ApiResponse,
    refund_id: String,
) -> Result<Notice, Failure> {
    let bad = |m: String| Failure::Unexpected(m);
    let refunded_total = r
        .refund_fee
        .as_deref()
        .ok_or_else(|| bad("fund_change Y without refund_fee".into()))
        .and_then(|t| yuan_to_fen(t).map_err(|e| bad(format!("refund_fee: {e}"))))?;
    if refunded_total <= 0 {
        return Err(bad("refund_fee must be positive".into()));
    }
    let seller_id = r
        .seller_id
        .clone()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| app.seller_id.clone());
    let notice = Notice {
        channel: ChannelId::Alipay,
        kind: NoticeKind::Refunded(Refund {
            out_refund_no: call.out_refund_no.clone(),
            refund_id,
            amount: RefundAmount::RunningTotal(refunded_total),
        }),
        merchant_matches: seller_id == app.seller_id,
        merchant: MerchantIds {
            merchant_id: seller_id,
            app_id: Some(app.app_id.clone()),
        },
        out_trade_no: call.out_trade_no.clone(),
        transaction_id: call.transaction_id.clone(),
        amount_fen: call.total_fen,
        currency: "CNY".to_owned(),
        occurred_at: r.gmt_refund_pay.as_deref().and_then(beijing_time),
    };
    notice.checked().map_err(bad)
}

/// A paid answer's payment, or why the answer does not show one. An authorized app's trade is
/// its merchant's: the seller is the answer's `seller_id`, else the merchant's configured
/// PID, else (neither known) its `auth_app_id`, the account the order names; it matches
/// unless it names a seller other than a configured one.
fn paid(a: &ApiApp, r: ApiResponse) -> Result<TradeAnswer, Miss> {
    let answered = r.seller_id.clone().filter(|s| !s.is_empty());
    let mut notice = paid_notice(&a.app, r)?;
    if let Some(auth) = &a.authorized {
        let seller = answered
            .or_else(|| auth.seller_id.clone())
            .unwrap_or_else(|| auth.auth_app_id.clone());
        notice.merchant_matches = auth.seller_id.as_ref().is_none_or(|s| *s == seller);
        notice.merchant.merchant_id = seller;
        // The order's account, as the notification names it (`auth_app_id`).
        notice.merchant.app_id = Some(auth.auth_app_id.clone());
        notice = notice.checked().map_err(Failure::Unexpected)?;
    }
    Ok(TradeAnswer::Paid(Box::new(notice)))
}

/// A paid trade's notice from what the signed answer says. `alipay.trade.query` answers name
/// neither seller nor app: the seller is the asking app's (Alipay answers an app only about
/// its own seller's trades, and the answer verified with that app's Alipay key), checked
/// against the answer's `seller_id` when it carries one; the app is the one that asked, which
/// need not be the app the buyer paid through, so it is not part of an Alipay payment's
/// content ([`Notice::digest`]) and the notification is a duplicate either way.
pub(super) fn paid_notice(app: &App, r: ApiResponse) -> Result<Notice, Failure> {
    let bad = |m: String| Failure::Unexpected(m);
    let trade_no = r
        .trade_no
        .filter(|t| !t.is_empty())
        .ok_or_else(|| bad("a paid answer without trade_no".into()))?;
    let total = r
        .total_amount
        .as_deref()
        .ok_or_else(|| bad("a paid answer without total_amount".into()))
        .and_then(|t| yuan_to_fen(t).map_err(|e| bad(format!("total_amount: {e}"))))?;
    if total <= 0 {
        return Err(bad("total_amount must be positive".into()));
    }
    let occurred_at = r.send_pay_date.as_deref().and_then(beijing_time);
    let seller_id = r
        .seller_id
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| app.seller_id.clone());
    let notice = Notice {
        channel: ChannelId::Alipay,
        kind: NoticeKind::Paid,
        merchant_matches: seller_id == app.seller_id,
        merchant: MerchantIds {
            merchant_id: seller_id,
            app_id: Some(app.app_id.clone()),
        },
        out_trade_no: r.out_trade_no.unwrap_or_default(),
        transaction_id: trade_no,
        amount_fen: total,
        currency: "CNY".to_owned(),
        occurred_at,
    };
    notice.checked().map_err(bad)
}
