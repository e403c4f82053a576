//! The API v3 client: query, close, refund and refund query, each answer verified (merchant
//! transfers are in `transfer.rs`).

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::Deserialize;

use super::verify::string_to_sign;
use super::wire::{
    Transaction, TransactionAmount, WechatRefundAmount, parse_time, transaction_notice,
};
use super::{Merchant, SIGNATURE_TYPE, TIMESTAMP_WINDOW_SECS, WechatPay, WechatSettings};
use crate::channel::api::{
    Account, Accounts, CancelReply, CloseAnswer, Failure, Miss, ProviderClient, Received,
    RefundAnswer, RefundCall, RefundReply, RefundState, TradeAnswer, TransferAnswer, TransferReply,
};
use crate::channel::keys;
use crate::config::value::{ConfigError, invalid};
use crate::https::ClientSettings;
use crate::notice::{ChannelId, MerchantIds, Notice, NoticeKind, Refund, RefundAmount};
use crate::time::Timestamp;
use crate::transfer::TransferCall;

/// WeChat Pay API v3's production base URL.
pub const API_BASE: &str = "https://api.mch.weixin.qq.com";

/// One merchant's API credentials: its API private key and that key's certificate serial.
/// A sub-merchant's entry holds its service provider's (服务商模式): the SP signs and its
/// platform keys verify, and every call takes the partner form naming `sub_mchid`.
pub struct ApiMerchant {
    /// The merchant whose keys these are: a sub-merchant's service provider.
    pub(super) merchant: Arc<Merchant>,
    pub(super) serial: String,
    pub(super) key: Arc<keys::Signer>,
    pub(super) base: String,
    /// `certificates = "download"`: its platform certificates are fetched and kept fresh.
    pub(super) downloads: bool,
    /// A sub-merchant's entry: its `sub_mchid`, the id the calls are made for.
    pub(super) sub_mchid: Option<String>,
}

impl ApiMerchant {
    /// The entry of `sub_mchid`, served by this service provider's credentials.
    pub(super) fn for_sub(&self, sub_mchid: &str) -> Self {
        Self {
            merchant: Arc::clone(&self.merchant),
            serial: self.serial.clone(),
            key: Arc::clone(&self.key),
            base: self.base.clone(),
            downloads: false,
            sub_mchid: Some(sub_mchid.to_owned()),
        }
    }
}

impl Account for ApiMerchant {
    fn id(&self) -> &str {
        self.sub_mchid.as_deref().unwrap_or(&self.merchant.mchid)
    }
    const MISSING: &'static str = "API credentials for mchid";
}

/// The WeChat Pay API v3 client: query by `out_trade_no`, close, refund, refund query, for
/// every merchant with API credentials. Requests are signed with the merchant's API private
/// key; answers are verified with that merchant's platform keys, as notifications are.
pub struct WechatApi {
    pub(super) channel: Arc<WechatPay>,
    pub(super) merchants: Accounts<ApiMerchant>,
}

/// A transaction as the query answers it: `transaction_id` and `amount` only once paid. A
/// direct merchant's names `appid` and `mchid`; a partner transaction (服务商模式) names
/// `sp_appid`, `sp_mchid`, `sub_mchid` and perhaps `sub_appid` instead.
#[derive(Deserialize)]
pub(super) struct QueriedTransaction {
    #[serde(default)]
    pub(super) appid: Option<String>,
    #[serde(default)]
    pub(super) mchid: Option<String>,
    #[serde(default)]
    pub(super) sp_appid: Option<String>,
    #[serde(default)]
    pub(super) sp_mchid: Option<String>,
    #[serde(default)]
    pub(super) sub_appid: Option<String>,
    #[serde(default)]
    pub(super) sub_mchid: Option<String>,
    pub(super) out_trade_no: String,
    pub(super) transaction_id: Option<String>,
    pub(super) trade_state: String,
    pub(super) amount: Option<QueriedAmount>,
    pub(super) success_time: Option<String>,
}

/// An unpaid trade's `amount` may carry only `payer_currency`.
#[derive(Deserialize)]
pub(super) struct QueriedAmount {
    pub(super) total: Option<i64>,
    pub(super) currency: Option<String>,
}

/// A refund as the refund query answers it (no `mchid`: the asking merchant's).
#[derive(Deserialize)]
pub(super) struct QueriedRefund {
    pub(super) refund_id: String,
    pub(super) out_refund_no: String,
    pub(super) transaction_id: String,
    pub(super) out_trade_no: String,
    pub(super) status: String,
    pub(super) amount: WechatRefundAmount,
    pub(super) success_time: Option<String>,
}

/// WeChat Pay's error body (4xx/5xx): never signed, so only its documented codes count.
#[derive(Deserialize)]
pub(super) struct ApiError {
    pub(super) code: String,
    #[serde(default)]
    pub(super) message: String,
}

/// `/`-free path segment: `out_trade_no` allows `|` and `*`.
pub(super) const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'*');

impl WechatApi {
    /// The client of the file's merchants with API credentials (merchants added through
    /// `/admin/merchants` join it later).
    pub(super) fn from_settings(
        channel: Arc<WechatPay>,
        settings: &WechatSettings,
        reconcile: &ClientSettings,
    ) -> Result<Self, ConfigError> {
        let mut merchants = Vec::new();
        for (i, m) in settings.merchants.iter().enumerate() {
            let prefix = format!("wechat.merchants[{i}]");
            let (path, serial) = match (&m.private_key_file, &m.merchant_serial) {
                (None, None) => continue,
                (Some(path), Some(serial)) if !serial.is_empty() => (path, serial),
                (Some(_), _) => {
                    return Err(invalid(
                        format!("{prefix}.merchant_serial"),
                        "required with private_key_file: the serial of the merchant API certificate",
                    ));
                }
                (None, Some(_)) => {
                    return Err(invalid(
                        format!("{prefix}.private_key_file"),
                        "required with merchant_serial: the merchant API private key (apiclient_key.pem)",
                    ));
                }
            };
            let key = keys::private_key_file(&format!("{prefix}.private_key_file"), path)?;
            let base = m.api_base.clone().unwrap_or_else(|| API_BASE.to_owned());
            let base = base.trim_end_matches('/').to_owned();
            crate::https::provider_url(&format!("{prefix}.api_base"), &base)?;
            let Some(merchant) = channel.merchant(&m.mchid) else {
                return Err(invalid(
                    format!("{prefix}.mchid"),
                    "not a configured merchant",
                ));
            };
            merchants.push(ApiMerchant {
                merchant,
                serial: serial.clone(),
                key: Arc::new(keys::Signer::parsed(key)),
                base,
                downloads: m.downloads(),
                sub_mchid: None,
            });
        }
        Ok(Self {
            channel,
            merchants: Accounts::new(merchants, reconcile)?,
        })
    }

    /// Sends one signed request. WeChat Pay v3: the string to sign is
    /// `METHOD\npath?query\ntimestamp\nnonce\nbody\n`, RSA-SHA256 with the API private key.
    pub(super) async fn call(
        &self,
        m: &ApiMerchant,
        post: bool,
        path: &str,
        body: &str,
        now: Timestamp,
    ) -> Result<Received, Failure> {
        self.call_naming(m, post, path, body, None, now).await
    }

    /// [`WechatApi::call`] with `Wechatpay-Serial` naming `platform_serial`, the platform key
    /// a field of `body` is encrypted with (WeChat Pay v3: it must know which key to decrypt
    /// with).
    pub(super) async fn call_naming(
        &self,
        m: &ApiMerchant,
        post: bool,
        path: &str,
        body: &str,
        platform_serial: Option<&str>,
        now: Timestamp,
    ) -> Result<Received, Failure> {
        let method = if post { "POST" } else { "GET" };
        let authorization = Self::authorization(m, method, path, body, now)?;
        let url = format!("{}{path}", m.base);
        let client = self.merchants.plumbing().client();
        let request = if post {
            client
                .post(url)
                .header("Content-Type", "application/json")
                .body(body.to_owned())
        } else {
            client.get(url)
        };
        let mut request = request
            .header("Accept", "application/json")
            .header("Authorization", authorization);
        if let Some(serial) = platform_serial {
            request = request.header("Wechatpay-Serial", serial);
        }
        self.merchants.plumbing().send(request).await
    }

    /// The `Authorization` header of one request: `path` with its query exactly as sent.
    pub(super) fn authorization(
        m: &ApiMerchant,
        method: &str,
        path: &str,
        body: &str,
        now: Timestamp,
    ) -> Result<String, Failure> {
        const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        let nonce = crate::random::token(ALNUM, 32)
            .map_err(|_| Failure::Unexpected("random number generator failed".into()))?;
        let timestamp = now.unix_seconds();
        let message = format!("{method}\n{path}\n{timestamp}\n{nonce}\n{body}\n");
        let signature = m
            .key
            .sign_base64(message.as_bytes())
            .map_err(|e| Failure::Unexpected(format!("signing failed: {e}")))?;
        Ok(format!(
            "{SIGNATURE_TYPE} mchid=\"{}\",nonce_str=\"{nonce}\",signature=\"{signature}\",timestamp=\"{timestamp}\",serial_no=\"{}\"",
            m.merchant.mchid, m.serial
        ))
    }

    /// Checks a 2xx answer's signature, as a notification's: `Wechatpay-*` headers over
    /// `timestamp\nnonce\nbody\n`, a usable platform key of the merchant that asked, fresh.
    /// A key it names that is not known is [`Failure::UnknownKey`].
    pub(super) fn verify(
        &self,
        m: &ApiMerchant,
        r: &Received,
        now: Timestamp,
    ) -> Result<(), Failure> {
        let serial = r
            .header("Wechatpay-Serial")
            .ok_or_else(|| Failure::BadSignature("answer without Wechatpay-Serial".into()))?;
        let platform = self
            .channel
            .key(serial)
            .filter(|p| p.merchant.mchid == m.merchant.mchid && p.usable_at(now))
            .ok_or_else(|| {
                Failure::UnknownKey(format!(
                    "Wechatpay-Serial {serial} is not a usable platform key of merchant {}",
                    m.merchant.mchid
                ))
            })?;
        self.verify_with(r, now, &platform.key)
    }

    /// Checks a 2xx answer's `Wechatpay-*` headers and its signature with `key`.
    pub(super) fn verify_with(
        &self,
        r: &Received,
        now: Timestamp,
        key: &keys::RsaVerifier,
    ) -> Result<(), Failure> {
        let unsigned = |what: &str| Failure::BadSignature(format!("answer without {what}"));
        if let Some(kind) = r.header("Wechatpay-Signature-Type")
            && kind != SIGNATURE_TYPE
        {
            return Err(Failure::BadSignature(format!(
                "unsupported Wechatpay-Signature-Type {kind}"
            )));
        }
        let timestamp = r
            .header("Wechatpay-Timestamp")
            .ok_or_else(|| unsigned("Wechatpay-Timestamp"))?;
        let nonce = r
            .header("Wechatpay-Nonce")
            .ok_or_else(|| unsigned("Wechatpay-Nonce"))?;
        let signature = r
            .header("Wechatpay-Signature")
            .ok_or_else(|| unsigned("Wechatpay-Signature"))?;
        let seconds: i64 = timestamp
            .parse()
            .map_err(|_| Failure::BadSignature("Wechatpay-Timestamp is not unix seconds".into()))?;
        let skew = now.unix_seconds().saturating_sub(seconds);
        if skew.abs() > TIMESTAMP_WINDOW_SECS {
            return Err(Failure::BadSignature(format!(
                "answer timestamp is {skew} s from now"
            )));
        }
        let signature = BASE64
            .decode(signature)
            .map_err(|_| Failure::BadSignature("Wechatpay-Signature is not base64".into()))?;
        if signature.is_empty()
            || !key.verify(&string_to_sign(timestamp, nonce, &r.body), &signature)
        {
            return Err(Failure::BadSignature(
                "the answer's signature does not verify with the platform key".into(),
            ));
        }
        Ok(())
    }

    /// What a non-2xx answer means: its `code` (unsigned, so only the documented ones
    /// count), or "retry later".
    pub(super) fn error_code(r: &Received) -> Result<String, Failure> {
        if r.status == 429 || r.status >= 500 {
            return Err(Failure::Unreachable(format!("HTTP {}", r.status)));
        }
        match serde_json::from_slice::<ApiError>(&r.body) {
            Ok(e) => Ok(e.code),
            Err(_) => Err(Failure::Unexpected(format!(
                "HTTP {} without an error code",
                r.status
            ))),
        }
    }

    pub(super) fn unexpected(r: &Received) -> Failure {
        let message = serde_json::from_slice::<ApiError>(&r.body)
            .map(|e| format!("{}: {}", e.code, e.message))
            .unwrap_or_default();
        Failure::Unexpected(format!("HTTP {} {message}", r.status))
    }

    /// GETs `path` and reads its verified 2xx answer (`what` names it in a parse error); an
    /// error answer with one of the `not_found` codes is [`Miss::NotFound`].
    pub(super) async fn get_verified<T: serde::de::DeserializeOwned>(
        &self,
        m: &ApiMerchant,
        path: &str,
        not_found: [&str; 2],
        what: &str,
        now: Timestamp,
    ) -> Result<T, Miss> {
        let r = self.call(m, false, path, "", now).await?;
        if !(200..300).contains(&r.status) {
            partner_error(m, &r)?;
            let code = Self::error_code(&r)?;
            return Err(if not_found.contains(&code.as_str()) {
                Miss::NotFound
            } else {
                Miss::Failed(Self::unexpected(&r))
            });
        }
        self.verify(m, &r, now)?;
        Ok(serde_json::from_slice(&r.body)
            .map_err(|e| Failure::Unexpected(format!("{what}: {e}")))?)
    }
}

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

/// A service provider's call answered with an error: never an answer about the trade. WeChat
/// does not document its error for a `sub_mchid` not bound to the service provider, and
/// its error bodies are never signed, so no 4xx of a partner call is taken as a "no such
/// trade" or a refusal: the call is retried as unanswered.
fn partner_error(m: &ApiMerchant, r: &Received) -> Result<(), Failure> {
    let Some(sub) = &m.sub_mchid else {
        return Ok(());
    };
    WechatApi::error_code(r)?;
    Err(Failure::Unexpected(format!(
        "{} (a partner call for sub-merchant {sub}: not asked)",
        WechatApi::unexpected(r).detail()
    )))
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

/// Merchant transfers and bills are a direct merchant's calls: a sub-merchant's entry has
/// none of its own.
pub(super) fn not_for_sub(m: &ApiMerchant) -> Result<(), Failure> {
    match &m.sub_mchid {
        Some(sub) => Err(Failure::Unexpected(format!(
            "merchant transfers and bills are not available for a sub-merchant ({sub})"
        ))),
        None => Ok(()),
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
