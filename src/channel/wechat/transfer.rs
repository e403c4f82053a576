//! Merchant transfers (商家转账) through API v3: create, query and cancel one transfer bill,
//! each answer verified as every other answer; the payee's name sealed with the merchant's
//! platform key.

use serde::Deserialize;

use super::api::{ApiError, ApiMerchant, SEGMENT, WechatApi};
use super::wire::{TransferResource, parse_time, transfer_state};
use crate::channel::api::{CancelReply, Failure, Miss, Received, TransferAnswer, TransferReply};
use crate::time::Timestamp;
use crate::transfer::{Payee, TransferCall, TransferSeen, WechatPayee};

/// WeChat Pay v3 `POST` creates a bill; `…/out-bill-no/{out_bill_no}` queries it and
/// `…/cancel` under it cancels it.
const PATH: &str = "/v3/fund-app/mch-transfer/transfer-bills";

/// The create's answer (200).
#[derive(Deserialize)]
struct Created {
    out_bill_no: String,
    transfer_bill_no: String,
    create_time: Option<String>,
    state: String,
    fail_reason: Option<String>,
    /// With `WAIT_USER_CONFIRM`: what opens WeChat's confirm page.
    package_info: Option<String>,
}

/// The cancel's answer (200): accepted, `CANCELING`.
#[derive(Deserialize)]
struct Cancelled {
    out_bill_no: String,
    transfer_bill_no: String,
    state: String,
    update_time: Option<String>,
}

/// The error codes WeChat documents for 发起转账 that mean "not created": a refusal (the
/// transfers room believes it only once a query finds no bill under the number).
const REFUSALS: [&str; 8] = [
    "NOT_ENOUGH",
    "PARAM_ERROR",
    "INVALID_REQUEST",
    "NO_AUTH",
    "ACCOUNT_FROZEN",
    "MCH_NOT_EXISTS",
    "SIGN_ERROR",
    "USER_ACCOUNT_ABNORMAL",
];

/// The codes WeChat answers a cancel it will not make with (the user confirmed meanwhile,
/// the bill is final).
const CANCEL_REFUSALS: [&str; 4] = ["INVALID_REQUEST", "PARAM_ERROR", "NO_AUTH", "SIGN_ERROR"];

/// The path of the bill `out_bill_no` (digits and letters only, but escaped all the same).
fn bill_path(out_bill_no: &str) -> String {
    format!(
        "{PATH}/out-bill-no/{}",
        percent_encoding::utf8_percent_encode(out_bill_no, SEGMENT)
    )
}

impl WechatApi {
    /// The apps a payee's `openid` may belong to: every appid bound to the merchant.
    pub(super) fn transfer_apps_of(&self, m: &ApiMerchant) -> Vec<String> {
        m.merchant
            .appids
            .iter()
            .filter(|id| !id.is_empty())
            .cloned()
            .collect()
    }

    /// `POST /v3/fund-app/mch-transfer/transfer-bills`. A name is sealed with the merchant's
    /// platform key and the request names that key; without a usable key nothing is sent.
    pub(super) async fn send_transfer(
        &self,
        m: &ApiMerchant,
        call: &TransferCall,
        now: Timestamp,
    ) -> Result<TransferReply, Miss> {
        let Payee::Wechat(payee) = &call.payee else {
            return Err(Failure::Unexpected("not a WeChat payee".into()).into());
        };
        let (sealed, serial) = match &payee.user_name {
            None => (None, None),
            Some(name) => {
                // Unknown key: the merchant's certificates are fetched and the call made once
                // more (`crate::certificates`).
                let (serial, key) = self
                    .channel
                    .encryption_key(&m.merchant.mchid, now)
                    .ok_or_else(|| {
                        Failure::UnknownKey(format!(
                            "no usable platform key of merchant {} to encrypt user_name with",
                            m.merchant.mchid
                        ))
                    })?;
                let sealed = key
                    .key
                    .encrypt_oaep_sha1_base64(name.as_bytes())
                    .map_err(Failure::Unexpected)?;
                (Some(sealed), Some(serial))
            }
        };
        let body = transfer_body(call, payee, sealed.as_deref()).to_string();
        let r = self
            .call_naming(m, true, PATH, &body, serial.as_deref(), now)
            .await?;
        if !(200..300).contains(&r.status) {
            return Ok(transfer_error(&r));
        }
        self.verify(m, &r, now)?;
        let c: Created = serde_json::from_slice(&r.body)
            .map_err(|e| Failure::Unexpected(format!("transfer answer: {e}")))?;
        // A signed answer about another bill (replayed from elsewhere) says nothing of this one.
        if c.out_bill_no != call.out_bill_no {
            return Err(Failure::Unexpected(format!(
                "asked to transfer {}, answered about {}",
                call.out_bill_no, c.out_bill_no
            ))
            .into());
        }
        let seen = TransferSeen {
            out_bill_no: c.out_bill_no,
            provider_bill_no: Some(c.transfer_bill_no),
            state: transfer_state(&c.state),
            provider_state: Some(c.state),
            // The create's answer names no amount.
            amount_fen: None,
            account: m.merchant.mchid.clone(),
            package_info: c.package_info.filter(|p| !p.is_empty()),
            fail_reason: c.fail_reason.filter(|r| !r.is_empty()),
            occurred_at: parse_time(c.create_time.as_deref()),
        };
        seen.check_lengths().map_err(Failure::Unexpected)?;
        Ok(TransferReply::Accepted(Box::new(seen)))
    }

    /// `GET …/transfer-bills/out-bill-no/{out_bill_no}`, verified; the bill it names must be
    /// this merchant's `out_bill_no`.
    pub(super) async fn query_transfer(
        &self,
        m: &ApiMerchant,
        out_bill_no: &str,
        now: Timestamp,
    ) -> Result<TransferAnswer, Miss> {
        let t: TransferResource = self
            .get_verified(
                m,
                &bill_path(out_bill_no),
                ["NOT_FOUND", "RESOURCE_NOT_EXISTS"],
                "transfer answer",
                now,
            )
            .await?;
        if t.out_bill_no != out_bill_no || t.mch_id != m.merchant.mchid {
            return Err(Failure::Unexpected(format!(
                "asked about transfer {out_bill_no} of merchant {}, answered about {} of merchant {}",
                m.merchant.mchid, t.out_bill_no, t.mch_id
            ))
            .into());
        }
        if t.transfer_amount <= 0 {
            return Err(Failure::Unexpected("transfer_amount must be positive".into()).into());
        }
        let seen = t.seen();
        seen.check_lengths().map_err(Failure::Unexpected)?;
        Ok(TransferAnswer::Found(Box::new(seen)))
    }

    /// `POST …/out-bill-no/{out_bill_no}/cancel` with an empty body. Accepted means
    /// `CANCELING`: `CANCELLED` comes from a query or the notification.
    pub(super) async fn cancel_transfer(
        &self,
        m: &ApiMerchant,
        out_bill_no: &str,
        now: Timestamp,
    ) -> Result<CancelReply, Miss> {
        let path = format!("{}/cancel", bill_path(out_bill_no));
        let r = self.call(m, true, &path, "", now).await?;
        if !(200..300).contains(&r.status) {
            return cancel_error(&r);
        }
        self.verify(m, &r, now)?;
        let c: Cancelled = serde_json::from_slice(&r.body)
            .map_err(|e| Failure::Unexpected(format!("cancel answer: {e}")))?;
        if c.out_bill_no != out_bill_no {
            return Err(Failure::Unexpected(format!(
                "asked to cancel {out_bill_no}, answered about {}",
                c.out_bill_no
            ))
            .into());
        }
        let seen = TransferSeen {
            out_bill_no: c.out_bill_no,
            provider_bill_no: Some(c.transfer_bill_no),
            state: transfer_state(&c.state),
            provider_state: Some(c.state),
            amount_fen: None,
            account: m.merchant.mchid.clone(),
            package_info: None,
            fail_reason: None,
            occurred_at: parse_time(c.update_time.as_deref()),
        };
        seen.check_lengths().map_err(Failure::Unexpected)?;
        Ok(CancelReply::Canceling(Box::new(seen)))
    }
}

/// The body of a create: the optional fields only when present (WeChat refuses `null`s that
/// some SDKs send), `user_name` as sealed.
fn transfer_body(
    call: &TransferCall,
    payee: &WechatPayee,
    sealed_name: Option<&str>,
) -> serde_json::Value {
    let mut body = serde_json::json!({
        "appid": payee.appid,
        "out_bill_no": call.out_bill_no,
        "transfer_scene_id": payee.transfer_scene_id,
        "openid": payee.openid,
        "transfer_amount": call.amount_fen,
        "transfer_remark": call.remark,
        "transfer_scene_report_infos": payee.transfer_scene_report_infos,
    });
    for (name, value) in [
        ("user_name", sealed_name),
        ("notify_url", payee.notify_url.as_deref()),
        (
            "user_recv_perception",
            payee.user_recv_perception.as_deref(),
        ),
    ] {
        if let Some(value) = value {
            body[name] = serde_json::Value::String(value.to_owned());
        }
    }
    body
}

/// A non-2xx answer's code and message; `Err` for "no answer" (429, 5xx, `SYSTEM_ERROR`,
/// `FREQUENCY_LIMITED`) or no code at all.
fn error_of(r: &Received) -> Result<(String, String), Failure> {
    let code = WechatApi::error_code(r)?;
    let message = serde_json::from_slice::<ApiError>(&r.body)
        .map(|e| e.message)
        .unwrap_or_default();
    if matches!(code.as_str(), "SYSTEM_ERROR" | "FREQUENCY_LIMITED") {
        return Err(Failure::Unreachable(format!(
            "HTTP {} {code}: {message}",
            r.status
        )));
    }
    Ok((code, message))
}

/// What a non-2xx answer to a create means: WeChat's documented refusal ([`REFUSALS`]), no
/// answer (send the same transfer again), or a code this client does not know (no usable
/// answer either: never taken as "not created"). WeChat never signs its error bodies.
fn transfer_error(r: &Received) -> TransferReply {
    match error_of(r) {
        Err(failure) => TransferReply::Failed(failure),
        Ok((code, message)) if REFUSALS.contains(&code.as_str()) => {
            TransferReply::Refused { code, message }
        }
        Ok((code, message)) => TransferReply::Failed(Failure::Unexpected(format!(
            "HTTP {} {code}: {message}",
            r.status
        ))),
    }
}

/// What a non-2xx answer to a cancel means: no such bill, a refusal in WeChat's documented
/// words, or no usable answer.
fn cancel_error(r: &Received) -> Result<CancelReply, Miss> {
    let (code, message) = error_of(r)?;
    match code.as_str() {
        "NOT_FOUND" | "RESOURCE_NOT_EXISTS" => Err(Miss::NotFound),
        known if CANCEL_REFUSALS.contains(&known) => Ok(CancelReply::Refused { code, message }),
        _ => Err(Failure::Unexpected(format!("HTTP {} {code}: {message}", r.status)).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::{SceneReportInfo, TransferState};

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

    fn call(user_name: Option<&str>, notify_url: Option<&str>) -> (TransferCall, WechatPayee) {
        let payee = WechatPayee {
            appid: "wx0000000000000001".into(),
            openid: "oUser".into(),
            user_name: user_name.map(str::to_owned),
            transfer_scene_id: "1000".into(),
            transfer_scene_report_infos: vec![
                SceneReportInfo {
                    info_type: "活动名称".into(),
                    info_content: "新会员有礼".into(),
                },
                SceneReportInfo {
                    info_type: "奖励说明".into(),
                    info_content: "注册会员抽奖一等奖".into(),
                },
            ],
            user_recv_perception: None,
            notify_url: notify_url.map(str::to_owned),
        };
        let call = TransferCall {
            out_bill_no: "T1".into(),
            amount_fen: 500,
            remark: "新会员奖励".into(),
            payee: Payee::Wechat(payee.clone()),
        };
        (call, payee)
    }

    #[test]
    fn a_create_omits_what_is_absent_and_never_sends_null() {
        let (call, payee) = call(None, None);
        assert_eq!(
            transfer_body(&call, &payee, None),
            serde_json::json!({
                "appid": "wx0000000000000001",
                "out_bill_no": "T1",
                "transfer_scene_id": "1000",
                "openid": "oUser",
                "transfer_amount": 500,
                "transfer_remark": "新会员奖励",
                "transfer_scene_report_infos": [
                    { "info_type": "活动名称", "info_content": "新会员有礼" },
                    { "info_type": "奖励说明", "info_content": "注册会员抽奖一等奖" }
                ]
            })
        );
        let (call, mut payee) = call_with_everything();
        payee.user_recv_perception = Some("现金奖励".into());
        let body = transfer_body(&call, &payee, Some("c2VhbGVk"));
        assert_eq!(body["user_name"], "c2VhbGVk");
        assert_eq!(
            body["notify_url"],
            "https://pay.example/notify/wechat/transfer"
        );
        assert_eq!(body["user_recv_perception"], "现金奖励");
        assert!(
            body.as_object()
                .expect("object")
                .values()
                .all(|v| !v.is_null()),
            "{body}"
        );
    }

    fn call_with_everything() -> (TransferCall, WechatPayee) {
        call(
            Some("张三"),
            Some("https://pay.example/notify/wechat/transfer"),
        )
    }

    #[test]
    fn a_name_is_sealed_so_only_the_platform_key_s_private_half_reads_it() {
        use rsa::Generate;
        use rsa::pkcs8::{EncodePublicKey, LineEnding};

        let platform = rsa::PrivateKey::try_generate().expect("key");
        let pem = platform
            .to_public_key()
            .to_public_key_pem(LineEnding::LF)
            .expect("pem");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("platform.pub.pem");
        std::fs::write(&path, pem).expect("write");
        let key = crate::channel::keys::public_key_file("test", &path).expect("public key");
        let first = key
            .encrypt_oaep_sha1_base64("张三".as_bytes())
            .expect("seal");
        let second = key
            .encrypt_oaep_sha1_base64("张三".as_bytes())
            .expect("seal");
        assert_ne!(first, second, "OAEP is randomised");
        for sealed in [first, second] {
            assert_eq!(
                crate::qa::forge::wechat::open_user_name(&platform, &sealed).expect("opens"),
                "张三"
            );
        }
        let other = rsa::PrivateKey::try_generate().expect("key");
        let sealed = key.encrypt_oaep_sha1_base64(b"x").expect("seal");
        assert!(crate::qa::forge::wechat::open_user_name(&other, &sealed).is_err());
    }

    #[test]
    fn states_wechat_names_and_one_it_does_not() {
        for (word, state) in [
            ("ACCEPTED", TransferState::Accepted),
            ("PROCESSING", TransferState::Processing),
            ("WAIT_USER_CONFIRM", TransferState::WaitUserConfirm),
            ("TRANSFERING", TransferState::Transfering),
            ("CANCELING", TransferState::Canceling),
            ("SUCCESS", TransferState::Success),
            ("FAIL", TransferState::Fail),
            ("CANCELLED", TransferState::Cancelled),
            // Not final: followed until WeChat names a state this client knows.
            ("SOMETHING_NEW", TransferState::Processing),
        ] {
            assert_eq!(transfer_state(word), state, "{word}");
        }
    }

    #[test]
    fn a_create_error_is_a_refusal_only_in_wechat_s_documented_words() {
        for (status, code) in [
            (403, "NOT_ENOUGH"),
            (400, "PARAM_ERROR"),
            (400, "INVALID_REQUEST"),
            (403, "NO_AUTH"),
            (403, "ACCOUNT_FROZEN"),
        ] {
            assert_eq!(
                transfer_error(&received(status, &error(code))),
                TransferReply::Refused {
                    code: code.into(),
                    message: "说明".into()
                },
                "{status} {code}"
            );
        }
        for (status, body) in [
            (500, error("SYSTEM_ERROR")),
            (502, String::new()),
            (429, error("FREQUENCY_LIMITED")),
            (400, error("SYSTEM_ERROR")),
            (403, error("FREQUENCY_LIMITED")),
        ] {
            assert!(
                matches!(
                    transfer_error(&received(status, &body)),
                    TransferReply::Failed(Failure::Unreachable(_))
                ),
                "{status} {body}"
            );
        }
        for body in [error("SOMETHING_NEW"), String::new(), "<html/>".into()] {
            assert!(
                matches!(
                    transfer_error(&received(400, &body)),
                    TransferReply::Failed(Failure::Unexpected(_))
                ),
                "{body}"
            );
        }
    }

    #[test]
    fn a_cancel_error_is_not_found_a_refusal_or_no_answer() {
        assert_eq!(
            cancel_error(&received(404, &error("NOT_FOUND"))),
            Err(Miss::NotFound)
        );
        assert_eq!(
            cancel_error(&received(400, &error("INVALID_REQUEST"))),
            Ok(CancelReply::Refused {
                code: "INVALID_REQUEST".into(),
                message: "说明".into()
            })
        );
        for (status, body) in [(503, String::new()), (429, error("FREQUENCY_LIMITED"))] {
            assert!(
                matches!(
                    cancel_error(&received(status, &body)),
                    Err(Miss::Failed(Failure::Unreachable(_)))
                ),
                "{status}"
            );
        }
        assert!(matches!(
            cancel_error(&received(400, &error("SOMETHING_NEW"))),
            Err(Miss::Failed(Failure::Unexpected(_)))
        ));
    }
}
