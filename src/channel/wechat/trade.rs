//! The trade calls of the API v3 client: query, close, refund and refund query, a
//! sub-merchant's through its service provider's partner endpoints, each answer verified (a
//! combination's query and close are in `combine.rs`).

use super::api::{
    ApiError, ApiMerchant, QueriedAmount, QueriedRefund, QueriedTransaction, SEGMENT, WechatApi,
    not_for_sub, partner_error,
};
use super::wire::{Transaction, TransactionAmount, parse_time, transaction_notice};
use crate::channel::api::{
    Account, Accounts, CancelReply, CloseAnswer, CombineAnswer, Failure, Miss, ProviderClient,
    Received, RefundAnswer, RefundCall, RefundReply, RefundState, TradeAnswer, TransferAnswer,
    TransferReply,
};
use crate::notice::{ChannelId, MerchantIds, Notice, NoticeKind, Refund, RefundAmount};
use crate::time::Timestamp;
use crate::transfer::TransferCall;

impl ProviderClient for WechatApi {
    type Account = ApiMerchant;
    const CHANNEL: ChannelId = ChannelId::Wechat;

    fn accounts(&self) -> &Accounts<ApiMerchant> {
        &self.merchants
    }

    async fn query(
        &self,
        m: &ApiMerchant,
        out_trade_no: &str,
        now: Timestamp,
    ) -> Result<TradeAnswer, Miss> {
        let no = percent_encoding::utf8_percent_encode(out_trade_no, SEGMENT);
        let sp = percent_encoding::utf8_percent_encode(&m.merchant.mchid, SEGMENT);
        let path = match &m.sub_mchid {
            Some(sub) => format!(
                "/v3/pay/partner/transactions/out-trade-no/{no}?sp_mchid={sp}&sub_mchid={}",
                percent_encoding::utf8_percent_encode(sub, SEGMENT)
            ),
            None => format!("/v3/pay/transactions/out-trade-no/{no}?mchid={sp}"),
        };
        let t: QueriedTransaction = self
            .get_verified(
                m,
                &path,
                ["ORDER_NOT_EXIST", "ORDERNOTEXIST"],
                "query answer",
                now,
            )
            .await?;
        // Every id the answer carries is checked: a signed answer about another order or
        // merchant (replayed from elsewhere) says nothing about this one.
        let (merchant_id, app_id) = answered_by(m, &t);
        if t.out_trade_no != out_trade_no || merchant_id.is_none() || app_id.is_none() {
            return Err(Failure::Unexpected(format!(
                "asked about {out_trade_no} of merchant {}, answered about {} of merchant {}",
                m.id(),
                t.out_trade_no,
                named(&t)
            ))
            .into());
        }
        Ok(match t.trade_state.as_str() {
            // REFUND: paid, then refunded; the payment happened all the same.
            "SUCCESS" | "REFUND" => {
                let (
                    Some(transaction_id),
                    Some(QueriedAmount {
                        total: Some(total),
                        currency,
                    }),
                ) = (t.transaction_id, t.amount)
                else {
                    return Err(Failure::Unexpected(
                        "a paid answer without transaction_id or amount".into(),
                    )
                    .into());
                };
                if total <= 0 {
                    return Err(Failure::Unexpected("amount.total must be positive".into()).into());
                }
                let paid = Transaction {
                    appid: app_id.unwrap_or_default(),
                    mchid: merchant_id.unwrap_or_default(),
                    out_trade_no: t.out_trade_no,
                    transaction_id,
                    trade_state: t.trade_state,
                    amount: TransactionAmount { total, currency },
                    success_time: t.success_time,
                };
                let mut notice = transaction_notice(&m.merchant, paid, NoticeKind::Paid);
                if m.sub_mchid.is_some() {
                    // Both ids were checked above, as a partner notification's are: the
                    // payment is the sub-merchant's, whichever of its apps it came through.
                    notice.merchant_matches = true;
                }
                let notice = notice.checked().map_err(Failure::Unexpected)?;
                TradeAnswer::Paid(Box::new(notice))
            }
            "CLOSED" | "REVOKED" => TradeAnswer::Closed,
            _ => TradeAnswer::Unpaid(t.trade_state),
        })
    }

    async fn close(
        &self,
        m: &ApiMerchant,
        out_trade_no: &str,
        now: Timestamp,
    ) -> Result<CloseAnswer, Miss> {
        let no = percent_encoding::utf8_percent_encode(out_trade_no, SEGMENT);
        let (path, body) = match &m.sub_mchid {
            Some(sub) => (
                format!("/v3/pay/partner/transactions/out-trade-no/{no}/close"),
                serde_json::json!({ "sp_mchid": m.merchant.mchid, "sub_mchid": sub }),
            ),
            None => (
                format!("/v3/pay/transactions/out-trade-no/{no}/close"),
                serde_json::json!({ "mchid": m.merchant.mchid }),
            ),
        };
        let body = body.to_string();
        let r = self.call(m, true, &path, &body, now).await?;
        if (200..300).contains(&r.status) {
            // An empty 204 names no order: valid for any close of this merchant within 300 s.
            // The caller confirms with a query (WeChat answers 204 also for a trade it never
            // saw).
            self.verify(m, &r, now)?;
            return Ok(CloseAnswer::Closed);
        }
        partner_error(m, &r)?;
        match Self::error_code(&r)?.as_str() {
            "ORDERPAID" => Ok(CloseAnswer::NotClosable),
            "ORDER_NOT_EXIST" | "ORDERNOTEXIST" => Err(Miss::NotFound),
            _ => Err(Self::unexpected(&r).into()),
        }
    }

    async fn combine_query(
        &self,
        m: &ApiMerchant,
        combine_out_trade_no: &str,
        now: Timestamp,
    ) -> Result<CombineAnswer, Miss> {
        self.query_combination(m, combine_out_trade_no, now).await
    }

    async fn combine_close(
        &self,
        m: &ApiMerchant,
        combine_out_trade_no: &str,
        combine_appid: &str,
        subs: &[(String, String)],
        now: Timestamp,
    ) -> Result<CloseAnswer, Miss> {
        self.close_combination(m, combine_out_trade_no, combine_appid, subs, now)
            .await
    }

    async fn refund_query(
        &self,
        m: &ApiMerchant,
        out_trade_no: &str,
        out_refund_no: &str,
        now: Timestamp,
    ) -> Result<RefundAnswer, Miss> {
        let mut path = format!(
            "/v3/refund/domestic/refunds/{}",
            percent_encoding::utf8_percent_encode(out_refund_no, SEGMENT)
        );
        if let Some(sub) = &m.sub_mchid {
            // Required of a service provider (WeiXinMPSDK #2954: leaving it out fails).
            path.push_str("?sub_mchid=");
            path.extend(percent_encoding::utf8_percent_encode(sub, SEGMENT));
        }
        let q: QueriedRefund = self
            .get_verified(
                m,
                &path,
                ["RESOURCE_NOT_EXISTS", "ORDER_NOT_EXIST"],
                "refund answer",
                now,
            )
            .await?;
        if q.out_trade_no != out_trade_no || q.out_refund_no != out_refund_no {
            return Err(Failure::Unexpected(format!(
                "asked about refund {out_refund_no} of {out_trade_no}, answered about {} of {}",
                q.out_refund_no, q.out_trade_no
            ))
            .into());
        }
        if q.status != "SUCCESS" {
            return Ok(RefundAnswer::NotRefunded(refund_state(&q.status), q.status));
        }
        let notice = refund_notice(m, q)?;
        Ok(RefundAnswer::Refunded(Some(Box::new(notice))))
    }

    /// `POST /v3/refund/domestic/refunds` for the order's own payment (`transaction_id`).
    /// paynotify has no setting for its public URL, so no `notify_url` is sent: WeChat
    /// notifies the refund URL registered in the merchant platform, which must end in
    /// [`super::REFUND_ROUTE`].
    async fn refund(
        &self,
        m: &ApiMerchant,
        call: &RefundCall,
        now: Timestamp,
    ) -> Result<RefundReply, Miss> {
        let mut body = refund_body(call);
        if let Some(sub) = &m.sub_mchid {
            body["sub_mchid"] = serde_json::Value::String(sub.clone());
        }
        let body = body.to_string();
        let r = self
            .call(m, true, "/v3/refund/domestic/refunds", &body, now)
            .await?;
        if !(200..300).contains(&r.status) {
            partner_error(m, &r)?;
            return Ok(refund_error(&r));
        }
        self.verify(m, &r, now)?;
        let q: QueriedRefund = serde_json::from_slice(&r.body)
            .map_err(|e| Failure::Unexpected(format!("refund answer: {e}")))?;
        // A signed answer about another refund (replayed from elsewhere) says nothing about
        // this one.
        if q.out_refund_no != call.out_refund_no
            || q.transaction_id != call.transaction_id
            || q.out_trade_no != call.out_trade_no
        {
            return Err(Failure::Unexpected(format!(
                "asked to make refund {} of {} ({}), answered about {} of {} ({})",
                call.out_refund_no,
                call.out_trade_no,
                call.transaction_id,
                q.out_refund_no,
                q.out_trade_no,
                q.transaction_id
            ))
            .into());
        }
        let state = refund_state(&q.status);
        let refund_id = Some(q.refund_id.clone());
        let notice = match state {
            RefundState::Success => Some(Box::new(refund_notice(m, q)?)),
            _ => None,
        };
        Ok(RefundReply::Accepted {
            state,
            refund_id,
            notice,
        })
    }

    fn transfer_apps(&self, m: &ApiMerchant) -> Result<Vec<String>, String> {
        not_for_sub(m).map_err(|f| f.detail().to_owned())?;
        Ok(self.transfer_apps_of(m))
    }

    async fn transfer(
        &self,
        m: &ApiMerchant,
        call: &TransferCall,
        now: Timestamp,
    ) -> Result<TransferReply, Miss> {
        not_for_sub(m)?;
        self.send_transfer(m, call, now).await
    }

    async fn transfer_query(
        &self,
        m: &ApiMerchant,
        out_bill_no: &str,
        now: Timestamp,
    ) -> Result<TransferAnswer, Miss> {
        not_for_sub(m)?;
        self.query_transfer(m, out_bill_no, now).await
    }

    async fn transfer_cancel(
        &self,
        m: &ApiMerchant,
        out_bill_no: &str,
        now: Timestamp,
    ) -> Result<CancelReply, Miss> {
        not_for_sub(m)?;
        self.cancel_transfer(m, out_bill_no, now).await
    }
}

/// The merchant and app a query answer names, when they are those `m` asked for: a direct
/// merchant's `mchid` and `appid`; a partner transaction's `sub_mchid` (under `sp_mchid`, the
/// asking service provider) and `sub_appid`, else `sp_appid`, as a partner notification
/// names them. `(None, _)` when the answer names another merchant (or another provider).
fn answered_by(m: &ApiMerchant, t: &QueriedTransaction) -> (Option<String>, Option<String>) {
    match &m.sub_mchid {
        Some(sub) => {
            let ours = t.sp_mchid.as_deref() == Some(m.merchant.mchid.as_str())
                && t.sub_mchid.as_deref() == Some(sub.as_str())
                && t.mchid.is_none();
            let app = t.sub_appid.clone().or_else(|| t.sp_appid.clone());
            (ours.then(|| sub.clone()), app)
        }
        None => {
            let ours =
                t.mchid.as_deref() == Some(m.merchant.mchid.as_str()) && t.sub_mchid.is_none();
            (ours.then(|| m.merchant.mchid.clone()), t.appid.clone())
        }
    }
}

/// The merchant ids a query answer names, for a failure's words.
fn named(t: &QueriedTransaction) -> String {
    match (&t.mchid, &t.sp_mchid, &t.sub_mchid) {
        (Some(mchid), None, None) => mchid.clone(),
        (mchid, sp, sub) => format!(
            "mchid {} sp_mchid {} sub_mchid {}",
            mchid.as_deref().unwrap_or("-"),
            sp.as_deref().unwrap_or("-"),
            sub.as_deref().unwrap_or("-")
        ),
    }
}

/// A refund's `status` as [`RefundState`]; one this client does not know is not final.
pub(super) fn refund_state(status: &str) -> RefundState {
    match status {
        "SUCCESS" => RefundState::Success,
        "CLOSED" => RefundState::Closed,
        "ABNORMAL" => RefundState::Abnormal,
        _ => RefundState::Processing,
    }
}

/// A `SUCCESS` refund object's notice (the refund query's or the refund call's answer): the
/// same fields as REFUND.SUCCESS decodes to, so the same digest.
pub(super) fn refund_notice(m: &ApiMerchant, q: QueriedRefund) -> Result<Notice, Failure> {
    if q.amount.refund <= 0 || q.amount.total <= 0 {
        return Err(Failure::Unexpected(
            "amount.refund and amount.total must be positive".into(),
        ));
    }
    let notice = Notice {
        channel: ChannelId::Wechat,
        kind: NoticeKind::Refunded(Refund {
            out_refund_no: q.out_refund_no,
            refund_id: q.refund_id,
            amount: RefundAmount::This(q.amount.refund),
        }),
        merchant_matches: true,
        merchant: MerchantIds {
            merchant_id: m.id().to_owned(),
            app_id: None,
        },
        out_trade_no: q.out_trade_no,
        transaction_id: q.transaction_id,
        amount_fen: q.amount.total,
        currency: "CNY".to_owned(),
        occurred_at: parse_time(q.success_time.as_deref()),
    };
    notice.checked().map_err(Failure::Unexpected)
}

/// The body of a refund request: `reason` only when there is one.
pub(super) fn refund_body(call: &RefundCall) -> serde_json::Value {
    let mut body = serde_json::json!({
        "transaction_id": call.transaction_id,
        "out_refund_no": call.out_refund_no,
        "amount": {
            "refund": call.amount_fen,
            "total": call.total_fen,
            "currency": "CNY",
        },
    });
    if let Some(reason) = &call.reason {
        body["reason"] = serde_json::Value::String(reason.clone());
    }
    body
}

/// The error codes WeChat documents for 申请退款 that mean "not created": a refusal.
const REFUSALS: [&str; 8] = [
    "NOT_ENOUGH",
    "INVALID_REQUEST",
    "PARAM_ERROR",
    "RESOURCE_NOT_EXISTS",
    "NO_AUTH",
    "USER_ACCOUNT_ABNORMAL",
    "MCH_NOT_EXISTS",
    "SIGN_ERROR",
];

/// What a non-2xx answer to a refund means. 429, 5xx, `SYSTEM_ERROR` and `FREQUENCY_LIMITED`:
/// no answer, send the same refund again later. A 4xx with one of WeChat's documented refusal
/// codes ([`REFUSALS`]) is a refusal; any other code is no usable answer. WeChat never signs
/// its error bodies, so the refunds room confirms a refusal with the refund query (a signed
/// answer naming the refund wins) before it treats the refund as not created.
pub(super) fn refund_error(r: &Received) -> RefundReply {
    let code = match WechatApi::error_code(r) {
        Ok(code) => code,
        Err(failure) => return RefundReply::Failed(failure),
    };
    let message = serde_json::from_slice::<ApiError>(&r.body)
        .map(|e| e.message)
        .unwrap_or_default();
    match code.as_str() {
        "SYSTEM_ERROR" | "FREQUENCY_LIMITED" => RefundReply::Failed(Failure::Unreachable(format!(
            "HTTP {} {code}: {message}",
            r.status
        ))),
        known if REFUSALS.contains(&known) => RefundReply::Refused { code, message },
        _ => RefundReply::Failed(Failure::Unexpected(format!(
            "HTTP {} {code}: {message}",
            r.status
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(status: u16, body: &str) -> Received {
        Received {
            status,
            headers: reqwest::header::HeaderMap::new(),
            body: body.as_bytes().to_vec(),
        }
    }

    fn error(code: &str) -> String {
        serde_json::json!({ "code": code, "message": "说明" }).to_string()
    }

    #[test]
    fn a_refund_error_is_a_refusal_only_in_wechat_s_documented_words() {
        for (status, code) in [
            (403, "NOT_ENOUGH"),
            (400, "INVALID_REQUEST"),
            (400, "PARAM_ERROR"),
            (404, "RESOURCE_NOT_EXISTS"),
        ] {
            assert_eq!(
                refund_error(&received(status, &error(code))),
                RefundReply::Refused {
                    code: code.into(),
                    message: "说明".into()
                },
                "{status} {code}"
            );
        }
        // Busy, rate limited, down: no answer, the same refund is sent again.
        for (status, body) in [
            (500, error("SYSTEM_ERROR")),
            (503, String::new()),
            (429, error("FREQUENCY_LIMITED")),
            (400, error("SYSTEM_ERROR")),
            (403, error("FREQUENCY_LIMITED")),
        ] {
            assert!(
                matches!(
                    refund_error(&received(status, &body)),
                    RefundReply::Failed(Failure::Unreachable(_))
                ),
                "{status} {body}"
            );
        }
        // A code WeChat does not document for refunds is no answer: sent again, never freed.
        assert!(matches!(
            refund_error(&received(400, &error("SOMETHING_NEW"))),
            RefundReply::Failed(Failure::Unexpected(_))
        ));
        for body in ["", "<html>Bad Request</html>", "{\"message\":\"no code\"}"] {
            assert!(
                matches!(
                    refund_error(&received(400, body)),
                    RefundReply::Failed(Failure::Unexpected(_))
                ),
                "{body}"
            );
        }
    }

    #[test]
    fn refund_statuses() {
        for (status, state) in [
            ("SUCCESS", RefundState::Success),
            ("PROCESSING", RefundState::Processing),
            ("CLOSED", RefundState::Closed),
            ("ABNORMAL", RefundState::Abnormal),
            ("SOMETHING_NEW", RefundState::Processing),
        ] {
            assert_eq!(refund_state(status), state, "{status}");
        }
    }

    #[test]
    fn a_refund_request_names_the_payment_and_omits_an_absent_reason() {
        let mut call = RefundCall {
            out_trade_no: "O1".into(),
            transaction_id: "42O1".into(),
            out_refund_no: "R1".into(),
            amount_fen: 30,
            total_fen: 100,
            reason: None,
        };
        assert_eq!(
            refund_body(&call),
            serde_json::json!({
                "transaction_id": "42O1",
                "out_refund_no": "R1",
                "amount": { "refund": 30, "total": 100, "currency": "CNY" }
            })
        );
        call.reason = Some("退货".into());
        assert_eq!(refund_body(&call)["reason"], "退货");
    }
}
