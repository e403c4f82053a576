//! Merchant transfers started through paynotify: `POST /transfers`,
//! `GET /transfers/{out_bill_no}`, `POST /transfers/{out_bill_no}/cancel`.
//!
//! The checks run in the contract's order: 403 (transfers off), 400 (the body), then the
//! transfers room's (the number, the account, the caps).

use actix_web::{HttpResponse, web};
use serde::Deserialize;

use super::{ApiError, Authorized, ErrorBody};
use crate::app::App;
use crate::notice::{ChannelId, Digest};
use crate::transfer::SceneReportInfo;
use crate::transfers::{
    Ask, AskedPayee, CancelError, Cancelled, StartError, Started, TransferView,
};

/// WeChat refuses a name below 30 fen and requires one from 2,000 yuan.
const NAME_FROM_FEN: i64 = 30;
const NAME_REQUIRED_FEN: i64 = 200_000;

/// The body of `POST /transfers`. The fields of the other channel are refused.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TransferRequest {
    /// 1 to 32 of A-Z a-z 0-9: the provider's idempotency key (WeChat `out_bill_no`, Alipay
    /// `out_biz_no`), unique across both channels.
    pub out_bill_no: String,
    /// `wechat` or `alipay`.
    pub channel: String,
    /// A WeChat `mchid` or an Alipay `app_id`; default: the channel's only account with API
    /// credentials.
    #[serde(default)]
    pub account: Option<String>,
    /// A positive integer (fen).
    pub amount_fen: i64,
    /// 1 to 32 characters: WeChat `transfer_remark`; Alipay `remark` (and `order_title` by
    /// default).
    pub remark: String,
    /// WeChat `{"openid", "user_name"?}`; Alipay `{"identity", "identity_type", "name"?}`.
    #[schema(value_type = Object)]
    pub payee: serde_json::Value,
    /// WeChat: the app the openid belongs to (required when the merchant has several).
    #[serde(default)]
    pub appid: Option<String>,
    /// WeChat: required, for example `"1000"`.
    #[serde(default)]
    pub transfer_scene_id: Option<String>,
    /// WeChat: sent as given.
    #[serde(default)]
    pub transfer_scene_report_infos: Option<Vec<SceneReportInfo>>,
    /// WeChat (optional), for example `现金奖励`.
    #[serde(default)]
    pub user_recv_perception: Option<String>,
    /// Alipay (optional): shown in the user's bill; default: `remark`.
    #[serde(default)]
    pub order_title: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WechatPayeeBody {
    openid: String,
    #[serde(default)]
    user_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AlipayPayeeBody {
    identity: String,
    identity_type: String,
    #[serde(default)]
    name: Option<String>,
}

/// `text` is 1 to `max` characters with no control characters.
fn text_ok(text: &str, max: usize) -> bool {
    !text.trim().is_empty() && text.chars().count() <= max && !text.chars().any(char::is_control)
}

fn bad<T>(message: impl Into<String>) -> Result<T, ApiError> {
    Err(ApiError::BadRequest(message.into()))
}

/// An optional text field: absent, or 1 to `max` characters.
fn optional(name: &str, value: Option<String>, max: usize) -> Result<Option<String>, ApiError> {
    match value {
        Some(v) if !text_ok(&v, max) => bad(format!(
            "{name}: 1 to {max} characters, no control characters"
        )),
        other => Ok(other),
    }
}

impl TransferRequest {
    /// The body checked field by field (400), with the digest of what came.
    fn ask(self, digest: Digest) -> Result<Ask, ApiError> {
        let no = &self.out_bill_no;
        if no.is_empty()
            || no.len() > crate::transfer::max_len::OUT_BILL_NO
            || !no.bytes().all(|b| b.is_ascii_alphanumeric())
        {
            return bad("out_bill_no: 1 to 32 characters of A-Z a-z 0-9");
        }
        let Some(channel) = ChannelId::parse(&self.channel) else {
            return bad("channel: wechat or alipay");
        };
        if self.amount_fen <= 0 {
            return bad("amount_fen: a positive integer (fen)");
        }
        if !text_ok(&self.remark, 32) {
            return bad("remark: 1 to 32 characters, no control characters");
        }
        let account = optional("account", self.account.clone(), 64)?;
        let payee = match channel {
            ChannelId::Wechat => self.wechat_payee()?,
            ChannelId::Alipay => self.alipay_payee()?,
        };
        Ok(Ask {
            out_bill_no: self.out_bill_no,
            channel,
            account,
            amount_fen: self.amount_fen,
            remark: self.remark,
            payee,
            digest,
        })
    }

    fn wechat_payee(&self) -> Result<AskedPayee, ApiError> {
        if self.order_title.is_some() {
            return bad("order_title: an Alipay field; a WeChat transfer has none");
        }
        let payee: WechatPayeeBody = serde_json::from_value(self.payee.clone()).or_else(|e| {
            bad(format!(
                "payee: {{\"openid\", \"user_name\"?}} for WeChat: {e}"
            ))
        })?;
        if !text_ok(&payee.openid, 128) {
            return bad("payee.openid: 1 to 128 characters");
        }
        let user_name = optional("payee.user_name", payee.user_name, 64)?;
        match (&user_name, self.amount_fen) {
            (Some(_), fen) if fen < NAME_FROM_FEN => {
                return bad("payee.user_name: not allowed below 30 fen (WeChat refuses it)");
            }
            (None, fen) if fen >= NAME_REQUIRED_FEN => {
                return bad("payee.user_name: required from 200000 fen (2,000 yuan)");
            }
            _ => {}
        }
        let Some(scene) = self.transfer_scene_id.clone() else {
            return bad("transfer_scene_id: required for WeChat (for example \"1000\")");
        };
        if !text_ok(&scene, 32) {
            return bad("transfer_scene_id: 1 to 32 characters");
        }
        let infos = self.transfer_scene_report_infos.clone().unwrap_or_default();
        if infos.len() > 10
            || infos
                .iter()
                .any(|i| !text_ok(&i.info_type, 64) || !text_ok(&i.info_content, 64))
        {
            return bad(
                "transfer_scene_report_infos: at most 10 of {\"info_type\", \"info_content\"}, each 1 to 64 characters",
            );
        }
        Ok(AskedPayee::Wechat {
            openid: payee.openid,
            user_name,
            appid: optional("appid", self.appid.clone(), 64)?,
            transfer_scene_id: scene,
            transfer_scene_report_infos: infos,
            user_recv_perception: optional(
                "user_recv_perception",
                self.user_recv_perception.clone(),
                32,
            )?,
        })
    }

    fn alipay_payee(&self) -> Result<AskedPayee, ApiError> {
        for (name, present) in [
            ("appid", self.appid.is_some()),
            ("transfer_scene_id", self.transfer_scene_id.is_some()),
            (
                "transfer_scene_report_infos",
                self.transfer_scene_report_infos.is_some(),
            ),
            ("user_recv_perception", self.user_recv_perception.is_some()),
        ] {
            if present {
                return bad(format!(
                    "{name}: a WeChat field; an Alipay transfer has none"
                ));
            }
        }
        let payee: AlipayPayeeBody = serde_json::from_value(self.payee.clone()).or_else(|e| {
            bad(format!(
                "payee: {{\"identity\", \"identity_type\", \"name\"?}} for Alipay: {e}"
            ))
        })?;
        if !text_ok(&payee.identity, 100) {
            return bad("payee.identity: 1 to 100 characters");
        }
        if !["ALIPAY_USER_ID", "ALIPAY_LOGON_ID"].contains(&payee.identity_type.as_str()) {
            return bad("payee.identity_type: ALIPAY_USER_ID or ALIPAY_LOGON_ID");
        }
        let name = optional("payee.name", payee.name, 64)?;
        if payee.identity_type == "ALIPAY_LOGON_ID" && name.is_none() {
            return bad("payee.name: required with ALIPAY_LOGON_ID");
        }
        Ok(AskedPayee::Alipay {
            identity: payee.identity,
            identity_type: payee.identity_type,
            name,
            order_title: optional("order_title", self.order_title.clone(), 128)?,
        })
    }
}

/// The 422 body: `{"error", "code"}`.
fn refused(code: &str, why: &str) -> HttpResponse {
    HttpResponse::UnprocessableEntity().json(serde_json::json!({ "error": why, "code": code }))
}

#[utoipa::path(post, path = "/transfers", tag = "transfers",
    description = "Pays a user from a merchant account: WeChat 商家转账 (transfer-bills) or Alipay alipay.fund.trans.uni.transfer (certificate mode). Off until transfers.enabled. The transfer is recorded, its caps checked under its account's lock, before the provider is called; a timeout or 5xx leaves it PROCESSING with provider_state null, and the same call (same out_bill_no, same fields) is sent again until the provider answers. Checks run in this order: 403, 400, the out_bill_no lookup (200 or 409), 404, 422.",
    request_body = TransferRequest,
    responses(
        (status = 202, description = "Recorded and sent: PROCESSING (no answer yet, or not finished), WAIT_USER_CONFIRM (with package_info), SUCCESS, or FAIL (with fail_reason)", body = TransferView),
        (status = 200, description = "The same out_bill_no with the same body: the stored transfer, nothing sent", body = TransferView),
        (status = 400, description = "Malformed body: out_bill_no, amount, remark, payee, a name below 30 fen or missing from 200000 fen, ALIPAY_LOGON_ID without a name, another channel's field", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 403, description = "transfers.enabled = false", body = ErrorBody),
        (status = 404, description = "Unknown account", body = ErrorBody),
        (status = 409, description = "out_bill_no is another transfer's (another body)", body = ErrorBody),
        (status = 422, description = "{\"error\", \"code\"}: OVER_MAX_AMOUNT, OVER_DAILY_LIMIT or ACCOUNT_CANNOT_TRANSFER; nothing sent"),
        (status = 503, description = "Database unavailable: nothing recorded", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn start(
    _: Authorized,
    state: web::Data<App>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    if !state.transfers.enabled() {
        return Err(ApiError::Forbidden(
            "transfers are off (transfers.enabled = false)",
        ));
    }
    let value: serde_json::Value =
        serde_json::from_slice(&body).or_else(|e| bad(format!("a JSON body: {e}")))?;
    // The same body is the same transfer whatever its key order or spacing.
    let digest = Digest::of(value.to_string().as_bytes());
    if value.get("amount_fen").is_some_and(|fen| !fen.is_i64()) {
        return bad("amount_fen: a positive integer (fen)");
    }
    let request: TransferRequest = serde_json::from_value(value).or_else(|e| bad(e.to_string()))?;
    let ask = request.ask(digest)?;
    let transfers = std::sync::Arc::clone(&state.transfers);
    // To its end even if the caller hangs up: the answer is recorded either way.
    let started = state
        .runtime
        .spawn(async move { transfers.start(&ask).await })
        .await
        .map_err(|e| ApiError::Database(e.into()))?;
    match started {
        Ok(Started::Sent(view)) => Ok(HttpResponse::Accepted().json(view)),
        Ok(Started::Stored(view)) => Ok(HttpResponse::Ok().json(view)),
        Err(StartError::Disabled) => Err(ApiError::Forbidden(
            "transfers are off (transfers.enabled = false)",
        )),
        Err(e @ StartError::OtherRequest) => Err(ApiError::Conflict(e.to_string())),
        Err(e @ StartError::UnknownAccount { .. }) => Err(ApiError::NotFound(e.to_string())),
        Err(StartError::BadRequest(why)) => Err(ApiError::BadRequest(why)),
        Err(StartError::Refused { cap, why }) => Ok(refused(cap.as_str(), &why)),
        Err(StartError::Store(e)) => Err(ApiError::Database(e)),
    }
}

#[utoipa::path(get, path = "/transfers/{out_bill_no}", tag = "transfers",
    params(("out_bill_no" = String, Path)),
    responses(
        (status = 200, description = "The transfer", body = TransferView),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 404, description = "No such transfer", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(
    _: Authorized,
    state: web::Data<App>,
    out_bill_no: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let transfers = std::sync::Arc::clone(&state.transfers);
    let found = state
        .detach(async move { transfers.get(&out_bill_no).await })
        .await?;
    match found {
        Some(view) => Ok(HttpResponse::Ok().json(view)),
        None => Err(ApiError::NotFound("no such transfer".to_owned())),
    }
}

#[utoipa::path(post, path = "/transfers/{out_bill_no}/cancel", tag = "transfers",
    description = "WeChat only, while PROCESSING or WAIT_USER_CONFIRM and WeChat has not reported TRANSFERING. WeChat accepting the cancel moves provider_state to CANCELING; CANCELLED and its event come through the query or the notification.",
    params(("out_bill_no" = String, Path)),
    responses(
        (status = 202, description = "WeChat accepted the cancel (provider_state CANCELING)", body = TransferView),
        (status = 200, description = "Already CANCELLED: nothing sent", body = TransferView),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 403, description = "transfers.enabled = false", body = ErrorBody),
        (status = 404, description = "No such transfer", body = ErrorBody),
        (status = 409, description = "An Alipay transfer, a final one, one past the user's confirmation, or WeChat refused the cancel (its code)", body = ErrorBody),
        (status = 503, description = "WeChat did not answer usably, or the database is unavailable: ask again", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn cancel(
    _: Authorized,
    state: web::Data<App>,
    out_bill_no: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let transfers = std::sync::Arc::clone(&state.transfers);
    let out_bill_no = out_bill_no.into_inner();
    let cancelled = state
        .runtime
        .spawn(async move { transfers.cancel(&out_bill_no).await })
        .await
        .map_err(|e| ApiError::Database(e.into()))?;
    match cancelled {
        Ok(Cancelled::Sent(view)) => Ok(HttpResponse::Accepted().json(view)),
        Ok(Cancelled::Already(view)) => Ok(HttpResponse::Ok().json(view)),
        Err(CancelError::Disabled) => Err(ApiError::Forbidden(
            "transfers are off (transfers.enabled = false)",
        )),
        Err(e @ CancelError::Unknown) => Err(ApiError::NotFound(e.to_string())),
        Err(e @ CancelError::NotCancellable(_)) => Err(ApiError::Conflict(e.to_string())),
        Err(e @ CancelError::Refused { .. }) => {
            let CancelError::Refused { code, .. } = &e else {
                return Err(ApiError::Conflict(e.to_string()));
            };
            Ok(HttpResponse::Conflict()
                .json(serde_json::json!({ "error": e.to_string(), "code": code })))
        }
        Err(CancelError::Unavailable(why)) => Err(ApiError::Unavailable(why)),
        Err(CancelError::Store(e)) => Err(ApiError::Database(e)),
    }
}
