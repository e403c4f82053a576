//! The fake providers' service-provider mode: WeChat's partner paths (服务商模式), signed by a
//! service provider for a `sub_mchid`, and Alipay calls an ISV app makes for a merchant with
//! its `app_auth_token`. Each call is recorded with the ids it carried, for tests to assert.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;

use actix_web::{HttpRequest, HttpResponse};
use paynotify::channel::keys::public_key_file;
use serde_json::{Value, json};

use crate::support::keys::public_key_path;
use crate::support::provider::{
    Fake, MERCHANT_KEY, MERCHANT_SERIAL, Trade, alipay_signed, wechat_error, wechat_signed,
};
use crate::support::refunds;

/// What the fakes know of service-provider mode, and what they were asked.
#[derive(Debug, Default)]
pub struct Partner {
    /// Service providers besides the fake's own merchant: `mchid` → the serial of the merchant
    /// API certificate its requests must name (signed with [`MERCHANT_KEY`] too).
    pub providers: HashMap<String, String>,
    /// The sub-merchant a trade belongs to, when it is not the one asked about (an answer
    /// replayed from another sub-merchant).
    pub owners: HashMap<String, String>,
    /// Alipay: the tokens merchants granted, `app_auth_token` → `auth_app_id`.
    pub tokens: HashMap<String, String>,
    /// Every partner call that verified, in order.
    pub received: Vec<PartnerCall>,
}

/// One call made in service-provider mode, as the fake received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartnerCall {
    /// `wechat.query`, `wechat.close`, `wechat.refund`, `wechat.refund_query`, or the
    /// Alipay method.
    pub call: String,
    /// The order number (WeChat refunds: the refund number).
    pub no: String,
    /// WeChat: the `Authorization` mchid; Alipay: `app_id`.
    pub signer: String,
    /// WeChat: `sp_mchid` as the request named it (the refunds name none).
    pub sp_mchid: Option<String>,
    /// WeChat: `sub_mchid`; Alipay: `app_auth_token`.
    pub sub: String,
    /// The whole request as sent: path and query, or the form.
    pub request: String,
}

impl Fake {
    pub fn partner(&self) -> std::sync::MutexGuard<'_, Partner> {
        self.partner.lock().expect("partner")
    }

    /// WeChat: `mchid` is a service provider too, its requests naming `serial`.
    pub fn also_provider(&self, mchid: &str, serial: &str) {
        self.partner()
            .providers
            .insert(mchid.to_owned(), serial.to_owned());
    }

    /// WeChat: answers about `out_trade_no` name sub-merchant `sub_mchid`.
    pub fn owned_by(&self, out_trade_no: &str, sub_mchid: &str) {
        self.partner()
            .owners
            .insert(out_trade_no.to_owned(), sub_mchid.to_owned());
    }

    /// Alipay: `token` is the token `auth_app_id` granted.
    pub fn grant(&self, token: &str, auth_app_id: &str) {
        self.partner()
            .tokens
            .insert(token.to_owned(), auth_app_id.to_owned());
    }

    pub fn partner_calls(&self) -> Vec<PartnerCall> {
        self.partner().received.clone()
    }
}

/// `k="v"` pairs of a WeChat `Authorization` header.
fn authorization(req: &HttpRequest) -> Option<HashMap<String, String>> {
    let value = req.headers().get("Authorization")?.to_str().ok()?;
    let params = value.strip_prefix("WECHATPAY2-SHA256-RSA2048 ")?;
    Some(
        params
            .split(',')
            .filter_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                Some((k.trim().to_owned(), v.trim_matches('"').to_owned()))
            })
            .collect(),
    )
}

/// The signer's `mchid` and timestamp when `req` is signed by a service provider the fake
/// knows, with the serial it must name.
fn signed_by_provider(req: &HttpRequest, body: &[u8], fake: &Fake) -> Option<(String, String)> {
    use base64::Engine;
    let auth = authorization(req)?;
    let mchid = auth.get("mchid")?;
    let serial = auth.get("serial_no")?;
    let known = (*mchid == fake.mchid && serial == MERCHANT_SERIAL)
        || fake.partner().providers.get(mchid) == Some(serial);
    if !known {
        return None;
    }
    let timestamp = auth.get("timestamp")?;
    let path = req.uri().path_and_query()?.as_str();
    let mut message = format!(
        "{}\n{path}\n{timestamp}\n{}\n",
        req.method(),
        auth.get("nonce_str")?
    )
    .into_bytes();
    message.extend_from_slice(body);
    message.push(b'\n');
    let signature = base64::engine::general_purpose::STANDARD
        .decode(auth.get("signature")?)
        .ok()?;
    let key = public_key_file("test", Path::new(&public_key_path(MERCHANT_KEY))).ok()?;
    key.verify(&message, &signature)
        .then(|| (mchid.clone(), timestamp.clone()))
}

/// WeChat's answer to a call in service-provider mode, or to a direct call that names a
/// `sub_mchid`; `None` for every other call (the direct merchant's).
pub(super) async fn wechat(req: &HttpRequest, body: &[u8], fake: &Fake) -> Option<HttpResponse> {
    let path = req.path();
    let query: HashMap<String, String> = form_urlencoded::parse(req.query_string().as_bytes())
        .into_owned()
        .collect();
    let asked: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let named = |k: &str| {
        query
            .get(k)
            .cloned()
            .or_else(|| asked[k].as_str().map(str::to_owned))
    };
    let sub = named("sub_mchid");
    let partner_path = path.starts_with("/v3/pay/partner/");
    let refund_path = path.starts_with(refunds::WECHAT_PATH);
    if path.starts_with("/v3/pay/transactions/") && sub.is_some() {
        // go-pay/gopay #281.
        return Some(wechat_error(
            400,
            "PARAM_ERROR",
            "普通商户不允许传sub_mch_id",
        ));
    }
    if !(partner_path || (refund_path && sub.is_some())) {
        return None;
    }
    let Some(sub) = sub else {
        // yansongda/pay #1049; WxJava #3676.
        return Some(wechat_error(
            400,
            "PARAM_ERROR",
            "受理机构必须传入sub_mch_id",
        ));
    };
    let Some((signer, timestamp)) = signed_by_provider(req, body, fake) else {
        fake.refused.fetch_add(1, Ordering::SeqCst);
        return Some(wechat_error(401, "SIGN_ERROR", "签名错误"));
    };
    let sp_mchid = named("sp_mchid");
    if partner_path && sp_mchid.as_deref() != Some(signer.as_str()) {
        return Some(wechat_error(
            400,
            "PARAM_ERROR",
            "sp_mchid与请求头中的mchid不一致",
        ));
    }
    fake.verified.fetch_add(1, Ordering::SeqCst);
    let post = req.method() == actix_web::http::Method::POST;
    let (call, no) = if refund_path && post {
        let no = asked["out_refund_no"].as_str().unwrap_or("").to_owned();
        ("wechat.refund", no)
    } else if let Some(no) = path.strip_prefix(&format!("{}/", refunds::WECHAT_PATH)) {
        ("wechat.refund_query", no.to_owned())
    } else {
        let rest = path
            .strip_prefix("/v3/pay/partner/transactions/out-trade-no/")
            .unwrap_or("");
        match rest.strip_suffix("/close") {
            Some(no) => ("wechat.close", no.to_owned()),
            None => ("wechat.query", rest.to_owned()),
        }
    };
    fake.partner().received.push(PartnerCall {
        call: call.to_owned(),
        no: no.clone(),
        signer: signer.clone(),
        sp_mchid: sp_mchid.clone(),
        sub: sub.clone(),
        request: match post {
            true => format!("{} {}", req.uri(), String::from_utf8_lossy(body)),
            false => req.uri().to_string(),
        },
    });
    Some(match call {
        "wechat.refund" => refunds::wechat_create(body, fake, &timestamp).await,
        "wechat.refund_query" => {
            let held = fake.refunds.lock().expect("refunds").get(&no).cloned();
            match held {
                Some(r) => {
                    let answer = refunds::wechat_refund(&no, &r);
                    wechat_signed(fake, 200, &timestamp, answer.to_string())
                }
                None => wechat_error(404, "RESOURCE_NOT_EXISTS", "退款单不存在"),
            }
        }
        "wechat.close" => match fake.trade(&no) {
            Some(Trade::Paid { .. } | Trade::Refunded { .. }) => {
                wechat_error(400, "ORDERPAID", "订单已支付")
            }
            _ => {
                fake.set(&no, Trade::Closed);
                wechat_signed(fake, 204, &timestamp, String::new())
            }
        },
        _ => partner_query(fake, &signer, &sub, &no, &timestamp),
    })
}

/// A partner transaction: `sp_*` and `sub_*` ids instead of `mchid` and `appid`
/// (wechatpay-java `partnerpayments/model/Transaction.java`).
fn partner_query(
    fake: &Fake,
    sp_mchid: &str,
    sub_mchid: &str,
    no: &str,
    timestamp: &str,
) -> HttpResponse {
    let owner = fake
        .partner()
        .owners
        .get(no)
        .cloned()
        .unwrap_or_else(|| sub_mchid.to_owned());
    let mut answer = json!({
        "sp_appid": fake.appid, "sp_mchid": sp_mchid, "sub_mchid": owner, "out_trade_no": no,
    });
    let state = match fake.trade(no) {
        None => return wechat_error(404, "ORDER_NOT_EXIST", "订单不存在"),
        Some(Trade::NotPaid) => {
            json!({ "trade_state": "NOTPAY", "trade_state_desc": "订单未支付" })
        }
        Some(Trade::Closed) => json!({ "trade_state": "CLOSED", "trade_state_desc": "订单已关闭" }),
        Some(
            Trade::Paid {
                transaction_id,
                total,
            }
            | Trade::Refunded {
                transaction_id,
                total,
            },
        ) => json!({
            "transaction_id": transaction_id,
            "trade_type": "JSAPI",
            "trade_state": "SUCCESS",
            "trade_state_desc": "支付成功",
            "bank_type": "OTHERS",
            "success_time": "2026-11-30T10:00:00+08:00",
            "payer": { "sp_openid": "oSandboxSpOpenId00000000000" },
            "amount": { "total": total, "payer_total": total, "currency": "CNY", "payer_currency": "CNY" }
        }),
    };
    if let (Some(all), Value::Object(more)) = (answer.as_object_mut(), state) {
        all.extend(more);
    }
    wechat_signed(fake, 200, timestamp, answer.to_string())
}

/// Alipay: a call carrying `app_auth_token` (already verified, the token among the signed
/// parameters) is recorded; a token no merchant granted gets Alipay's signed refusal.
pub(super) fn alipay(
    fake: &Fake,
    method: &str,
    params: &HashMap<String, String>,
) -> Option<HttpResponse> {
    let token = params.get("app_auth_token")?;
    let biz: Value = params
        .get("biz_content")
        .and_then(|b| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    let mut form: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
    form.sort();
    let known = {
        let mut partner = fake.partner();
        partner.received.push(PartnerCall {
            call: method.to_owned(),
            no: biz["out_trade_no"].as_str().unwrap_or("").to_owned(),
            signer: params.get("app_id").cloned().unwrap_or_default(),
            sp_mchid: None,
            sub: token.clone(),
            request: form.join("&"),
        });
        partner.tokens.contains_key(token)
    };
    if known {
        return None;
    }
    let refusal = json!({"code": "20001", "msg": "Insufficient Token Permissions",
        "sub_code": "aop.invalid-app-auth-token", "sub_msg": "无效的应用授权令牌"});
    Some(alipay_signed(fake, method, &refusal))
}
