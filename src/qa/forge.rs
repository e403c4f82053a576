//! Builds notifications exactly as the providers send them, signed (and for WeChat encrypted)
//! with provider-side sandbox keys. The QA replay tool and the test suite share it, so both
//! speak the providers' wire format and nothing else does.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

#[derive(Debug, thiserror::Error)]
pub enum ForgeError {
    #[error("random number generator failed")]
    Random,
    #[error("signing failed: {0}")]
    Sign(String),
    #[error("encryption failed")]
    Encrypt,
    #[error("serialising failed")]
    Json,
}

/// An HTTP request body with the headers that go with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Delivery {
    /// Replaces (or adds) a header.
    pub fn set_header(&mut self, name: &str, value: impl Into<String>) {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.push((name.to_owned(), value.into()));
    }

    pub fn remove_header(&mut self, name: &str) {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn random_token(len: usize) -> Result<String, ForgeError> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    crate::random::token(ALPHABET, len).map_err(|_| ForgeError::Random)
}

/// RSASSA-PKCS1-v1_5 with SHA-256, base64: what both providers sign with (ring's signer,
/// as the service's own requests to the providers use).
pub fn rsa_sign(key: &rsa::PrivateKey, message: &[u8]) -> Result<String, ForgeError> {
    crate::channel::keys::RsaSigner::new(key)
        .and_then(|signer| signer.sign_base64(message))
        .map_err(ForgeError::Sign)
}

/// WeChat Pay API v3, from WeChat's side.
pub mod wechat {
    use super::*;
    use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};

    /// WeChat's platform key for one merchant, plus that merchant's APIv3 key.
    pub struct Sandbox {
        pub serial: String,
        pub private_key: rsa::PrivateKey,
        pub mchid: String,
        pub appid: String,
        pub apiv3_key: String,
    }

    /// A payment's decrypted resource (`original_type = transaction`).
    pub fn transaction(
        s: &Sandbox,
        out_trade_no: &str,
        transaction_id: &str,
        total_fen: i64,
    ) -> Value {
        json!({
            "appid": s.appid,
            "mchid": s.mchid,
            "out_trade_no": out_trade_no,
            "transaction_id": transaction_id,
            "trade_type": "JSAPI",
            "trade_state": "SUCCESS",
            "trade_state_desc": "支付成功",
            "bank_type": "OTHERS",
            "success_time": "2026-11-30T10:00:00+08:00",
            "payer": { "openid": "oSandboxOpenId0000000000000" },
            "amount": { "total": total_fen, "payer_total": total_fen, "currency": "CNY", "payer_currency": "CNY" }
        })
    }

    /// A refund's decrypted resource (`original_type = refund`).
    pub fn refund(
        s: &Sandbox,
        out_trade_no: &str,
        transaction_id: &str,
        out_refund_no: &str,
        refund_fen: i64,
        total_fen: i64,
    ) -> Value {
        json!({
            "mchid": s.mchid,
            "transaction_id": transaction_id,
            "out_trade_no": out_trade_no,
            "refund_id": format!("5030{out_refund_no}"),
            "out_refund_no": out_refund_no,
            "refund_status": "SUCCESS",
            "success_time": "2026-11-30T11:00:00+08:00",
            "user_received_account": "支付用户零钱",
            "amount": { "total": total_fen, "refund": refund_fen, "payer_total": total_fen, "payer_refund": refund_fen }
        })
    }

    /// A merchant transfer's decrypted resource (`original_type = mch_payment`), as
    /// `MCHTRANSFER.BILL.FINISHED` carries it: `state` `SUCCESS`, `FAIL` (with `fail_reason`)
    /// or `CANCELLED`.
    pub fn transfer(
        s: &Sandbox,
        out_bill_no: &str,
        transfer_bill_no: &str,
        state: &str,
        transfer_amount: i64,
        fail_reason: Option<&str>,
    ) -> Value {
        let mut resource = json!({
            "out_bill_no": out_bill_no,
            "transfer_bill_no": transfer_bill_no,
            "state": state,
            "mch_id": s.mchid,
            "transfer_amount": transfer_amount,
            "openid": "oSandboxOpenId0000000000000",
            "create_time": "2026-11-30T10:00:00+08:00",
            "update_time": "2026-11-30T10:05:00+08:00"
        });
        if let Some(reason) = fail_reason {
            resource["fail_reason"] = json!(reason);
        }
        resource
    }

    /// One sub-order of a combined payment (合单支付) as its notification lists it;
    /// `trade_state` `SUCCESS` in a real one.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct CombinedSub {
        pub out_trade_no: String,
        pub transaction_id: String,
        pub total_amount: i64,
        pub mchid: String,
        pub trade_state: String,
    }

    impl CombinedSub {
        /// `out_trade_no` paid `total_amount` to `mchid`, transaction `42{out_trade_no}`.
        pub fn paid(out_trade_no: &str, total_amount: i64, mchid: &str) -> Self {
            Self {
                out_trade_no: out_trade_no.into(),
                transaction_id: format!("42{out_trade_no}"),
                total_amount,
                mchid: mchid.into(),
                trade_state: "SUCCESS".into(),
            }
        }
    }

    /// A combined payment's decrypted resource (`TRANSACTION.SUCCESS`, `original_type`
    /// `transaction`), compact, in the key order of WeChat's doc sample: `combine_appid`,
    /// `combine_out_trade_no`, `combine_mchid`, `scene_info`, `sub_orders` (each `mchid`,
    /// `trade_type`, `trade_state`, `bank_type`, `attach`, `amount{total_amount, currency,
    /// payer_amount, payer_currency}`, `success_time`, `transaction_id`, `out_trade_no`),
    /// `combine_payer_info`. Every sub-order carries `attach` and was paid at `success_time`.
    pub fn combined(
        combine_appid: &str,
        combine_out_trade_no: &str,
        combine_mchid: &str,
        subs: &[CombinedSub],
        attach: &str,
        success_time: &str,
    ) -> Result<String, ForgeError> {
        let resource = combined_wire::Resource {
            combine_appid,
            combine_out_trade_no,
            combine_mchid,
            scene_info: combined_wire::SceneInfo {
                device_id: "POS1:1",
            },
            sub_orders: subs
                .iter()
                .map(|sub| combined_wire::SubOrder {
                    mchid: &sub.mchid,
                    trade_type: "JSAPI",
                    trade_state: &sub.trade_state,
                    bank_type: "OTHERS",
                    attach,
                    amount: combined_wire::Amount {
                        total_amount: sub.total_amount,
                        currency: "CNY",
                        payer_amount: sub.total_amount,
                        payer_currency: "CNY",
                    },
                    success_time,
                    transaction_id: &sub.transaction_id,
                    out_trade_no: &sub.out_trade_no,
                })
                .collect(),
            combine_payer_info: combined_wire::PayerInfo {
                openid: "oSandboxOpenId0000000000000",
            },
        };
        serde_json::to_string(&resource).map_err(|_| ForgeError::Json)
    }

    /// The combined resource's shape: struct fields keep the doc sample's key order.
    mod combined_wire {
        use serde::Serialize;

        #[derive(Serialize)]
        pub(super) struct Resource<'a> {
            pub(super) combine_appid: &'a str,
            pub(super) combine_out_trade_no: &'a str,
            pub(super) combine_mchid: &'a str,
            pub(super) scene_info: SceneInfo<'a>,
            pub(super) sub_orders: Vec<SubOrder<'a>>,
            pub(super) combine_payer_info: PayerInfo<'a>,
        }

        #[derive(Serialize)]
        pub(super) struct SceneInfo<'a> {
            pub(super) device_id: &'a str,
        }

        #[derive(Serialize)]
        pub(super) struct SubOrder<'a> {
            pub(super) mchid: &'a str,
            pub(super) trade_type: &'a str,
            pub(super) trade_state: &'a str,
            pub(super) bank_type: &'a str,
            pub(super) attach: &'a str,
            pub(super) amount: Amount<'a>,
            pub(super) success_time: &'a str,
            pub(super) transaction_id: &'a str,
            pub(super) out_trade_no: &'a str,
        }

        #[derive(Serialize)]
        pub(super) struct Amount<'a> {
            pub(super) total_amount: i64,
            pub(super) currency: &'a str,
            pub(super) payer_amount: i64,
            pub(super) payer_currency: &'a str,
        }

        #[derive(Serialize)]
        pub(super) struct PayerInfo<'a> {
            pub(super) openid: &'a str,
        }
    }

    /// A transfer's `user_name` as WeChat reads it: base64, RSAES-OAEP with SHA-1 and
    /// MGF1-SHA-1, opened with the platform key's private half.
    pub fn open_user_name(key: &rsa::PrivateKey, sealed: &str) -> Result<String, ForgeError> {
        let sealed = BASE64.decode(sealed).map_err(|_| ForgeError::Encrypt)?;
        let name = key
            .decrypt(rsa::Oaep::<sha1::Sha1>::new(), &sealed)
            .map_err(|_| ForgeError::Encrypt)?;
        String::from_utf8(name).map_err(|_| ForgeError::Encrypt)
    }

    /// AES-256-GCM as WeChat does it: ciphertext‖tag, base64.
    pub fn encrypt(
        apiv3_key: &[u8],
        nonce: &str,
        aad: &str,
        plaintext: &[u8],
    ) -> Result<String, ForgeError> {
        let key = UnboundKey::new(&AES_256_GCM, apiv3_key).map_err(|_| ForgeError::Encrypt)?;
        let nonce =
            Nonce::try_assume_unique_for_key(nonce.as_bytes()).map_err(|_| ForgeError::Encrypt)?;
        let mut buffer = plaintext.to_vec();
        LessSafeKey::new(key)
            .seal_in_place_append_tag(nonce, Aad::from(aad.as_bytes()), &mut buffer)
            .map_err(|_| ForgeError::Encrypt)?;
        Ok(BASE64.encode(buffer))
    }

    /// The notification body around an encrypted resource (compact JSON, WeChat's key order).
    pub fn envelope(
        event_type: &str,
        original_type: &str,
        ciphertext: &str,
        aad: &str,
        nonce: &str,
    ) -> String {
        let summary = match original_type {
            "refund" => "退款成功",
            "mch_payment" => "商家转账单据终态通知",
            _ => "支付成功",
        };
        json!({
            "id": format!("EV-{nonce}"),
            "create_time": "2026-11-30T10:00:01+08:00",
            "resource_type": "encrypt-resource",
            "event_type": event_type,
            "summary": summary,
            "resource": {
                "original_type": original_type,
                "algorithm": "AEAD_AES_256_GCM",
                "ciphertext": ciphertext,
                "associated_data": aad,
                "nonce": nonce
            }
        })
        .to_string()
    }

    /// The resource's `original_type` (and `associated_data`) for `event_type`.
    pub fn original_type(event_type: &str) -> &'static str {
        if event_type.starts_with("REFUND.") {
            "refund"
        } else if event_type.starts_with("MCHTRANSFER.") {
            "mch_payment"
        } else {
            "transaction"
        }
    }

    impl Sandbox {
        /// Signs `body` as sent at `timestamp` and returns the full request.
        pub fn sign(&self, timestamp: i64, body: Vec<u8>) -> Result<Delivery, ForgeError> {
            let nonce = random_token(32)?;
            let mut message = format!("{timestamp}\n{nonce}\n").into_bytes();
            message.extend_from_slice(&body);
            message.push(b'\n');
            let signature = rsa_sign(&self.private_key, &message)?;
            Ok(Delivery {
                headers: vec![
                    ("Content-Type".into(), "application/json".into()),
                    ("Wechatpay-Timestamp".into(), timestamp.to_string()),
                    ("Wechatpay-Nonce".into(), nonce),
                    ("Wechatpay-Signature".into(), signature),
                    ("Wechatpay-Serial".into(), self.serial.clone()),
                    (
                        "Wechatpay-Signature-Type".into(),
                        "WECHATPAY2-SHA256-RSA2048".into(),
                    ),
                ],
                body,
            })
        }

        /// A complete notification: `plaintext` encrypted with a fresh nonce, the envelope
        /// signed at `timestamp`. Every call differs on the wire, as WeChat's retries do.
        pub fn notification(
            &self,
            event_type: &str,
            plaintext: &Value,
            timestamp: i64,
        ) -> Result<Delivery, ForgeError> {
            self.sealed(event_type, plaintext.to_string().as_bytes(), timestamp)
        }

        /// [`Sandbox::notification`] for a plaintext already serialised (a combined
        /// payment's, whose key order a [`Value`] would not keep; or a broken one).
        pub fn sealed(
            &self,
            event_type: &str,
            plaintext: &[u8],
            timestamp: i64,
        ) -> Result<Delivery, ForgeError> {
            let original_type = original_type(event_type);
            let nonce = random_token(12)?;
            let ciphertext = encrypt(self.apiv3_key.as_bytes(), &nonce, original_type, plaintext)?;
            let body = envelope(
                event_type,
                original_type,
                &ciphertext,
                original_type,
                &nonce,
            );
            self.sign(timestamp, body.into_bytes())
        }
    }
}

/// Alipay asynchronous notifications, from Alipay's side.
pub mod alipay {
    use super::*;

    /// Alipay's private key for one app, with the app's ids.
    pub struct Sandbox {
        pub app_id: String,
        pub seller_id: String,
        pub private_key: rsa::PrivateKey,
    }

    /// `19900` → `"199.00"`.
    pub fn yuan(fen: i64) -> String {
        crate::money::fen_to_yuan(fen)
    }

    fn field(k: &str, v: impl Into<String>) -> (String, String) {
        (k.to_owned(), v.into())
    }

    /// The fields of a `trade_status_sync` notification for a payment.
    pub fn payment(
        s: &Sandbox,
        out_trade_no: &str,
        trade_no: &str,
        total_fen: i64,
        status: &str,
    ) -> Vec<(String, String)> {
        vec![
            field("gmt_create", "2026-11-30 10:00:00"),
            field("charset", "utf-8"),
            field("seller_email", "pay-ops@example.com"),
            field("subject", "沙箱订单 A+B & C=D"),
            field("buyer_id", "2088102179514385"),
            field("invoice_amount", yuan(total_fen)),
            field("notify_id", format!("2026113000222{trade_no}")),
            field(
                "fund_bill_list",
                format!(
                    "[{{\"amount\":\"{}\",\"fundChannel\":\"ALIPAYACCOUNT\"}}]",
                    yuan(total_fen)
                ),
            ),
            field("notify_type", "trade_status_sync"),
            field("trade_status", status),
            field("receipt_amount", yuan(total_fen)),
            field("buyer_pay_amount", yuan(total_fen)),
            field("app_id", s.app_id.clone()),
            field("notify_time", "2026-11-30 10:00:08"),
            field("point_amount", "0.00"),
            field("total_amount", yuan(total_fen)),
            field("trade_no", trade_no),
            field("auth_app_id", s.app_id.clone()),
            field("buyer_logon_id", "159****3821"),
            field("gmt_payment", "2026-11-30 10:00:07"),
            field("out_trade_no", out_trade_no),
            field("seller_id", s.seller_id.clone()),
            field("version", "1.0"),
        ]
    }

    /// A refund notification: `refunded_total_fen` is Alipay's `refund_fee`, the trade's
    /// refunded total after this refund; a full refund comes as `TRADE_CLOSED`.
    pub fn refund(
        s: &Sandbox,
        out_trade_no: &str,
        trade_no: &str,
        total_fen: i64,
        out_biz_no: &str,
        refunded_total_fen: i64,
    ) -> Vec<(String, String)> {
        let status = if refunded_total_fen >= total_fen {
            "TRADE_CLOSED"
        } else {
            "TRADE_SUCCESS"
        };
        let mut fields = payment(s, out_trade_no, trade_no, total_fen, status);
        fields.push(field("refund_fee", yuan(refunded_total_fen)));
        fields.push(field("out_biz_no", out_biz_no));
        fields.push(field("gmt_refund", "2026-11-30 11:00:00.123"));
        if status == "TRADE_CLOSED" {
            fields.push(field("gmt_close", "2026-11-30 11:00:00"));
        }
        fields
    }

    /// The fields of an Open Platform message to the app gateway (`/notify/alipay/gateway`):
    /// `msg_method` with its `biz_content`, for app `s.app_id`. Signed as a notification is
    /// ([`Sandbox::notification`]).
    pub fn gateway_message(
        s: &Sandbox,
        msg_method: &str,
        biz_content: &Value,
    ) -> Vec<(String, String)> {
        vec![
            field("notify_id", "2026113000262a3c7e1b0f5d4e6a8b9c01"),
            field("utc_timestamp", "1764471608000"),
            field("msg_method", msg_method),
            field("app_id", s.app_id.clone()),
            field("version", "1.1"),
            field("charset", "utf-8"),
            field("biz_content", biz_content.to_string()),
        ]
    }

    /// One transfer as `alipay.fund.trans.order.changed` tells it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct FundOrder {
        pub out_biz_no: String,
        pub order_id: String,
        pub amount_fen: i64,
        /// `SUCCESS`, `FAIL`, `DEALING`, `REFUND`.
        pub status: String,
        /// On `FAIL`: `error_code` (and a `fail_reason` in words).
        pub error_code: Option<String>,
    }

    /// The fields of `alipay.fund.trans.order.changed` for `order` (资金单据状态变更通知),
    /// with the `biz_content` Alipay sends for a `DIRECT_TRANSFER`.
    pub fn transfer_changed(s: &Sandbox, order: &FundOrder) -> Vec<(String, String)> {
        let mut biz = json!({
            "action_type": "FINISH",
            "biz_scene": "DIRECT_TRANSFER",
            "order_id": order.order_id,
            "origin_interface": "alipay.fund.trans.uni.transfer",
            "out_biz_no": order.out_biz_no,
            "pay_date": "2026-11-30 11:00:01",
            "pay_fund_order_id": format!("{}01", order.order_id),
            "product_code": "TRANS_ACCOUNT_NO_PWD",
            "status": order.status,
            "trans_amount": yuan(order.amount_fen),
        });
        if let Some(code) = &order.error_code {
            biz["error_code"] = json!(code);
            biz["fail_reason"] = json!("收款账户状态异常");
        }
        gateway_message(s, "alipay.fund.trans.order.changed", &biz)
    }

    /// What Alipay signs: every field but `sign`/`sign_type`, sorted, `k=v` joined by `&`.
    /// `keep_empty` follows the Python/Node/Go SDKs; otherwise empty values are skipped
    /// as the Java SDK does.
    pub fn sign_content(fields: &[(String, String)], keep_empty: bool) -> String {
        let mut signed: Vec<_> = fields
            .iter()
            .filter(|(k, v)| k != "sign" && k != "sign_type" && (keep_empty || !v.is_empty()))
            .collect();
        signed.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        signed
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&")
    }

    /// `application/x-www-form-urlencoded`: space as `+`, everything else outside
    /// `[A-Za-z0-9*-._]` percent-encoded.
    pub fn encode_form(fields: &[(String, String)]) -> Vec<u8> {
        fields
            .iter()
            .map(|(k, v)| {
                let k: String = form_urlencoded::byte_serialize(k.as_bytes()).collect();
                let v: String = form_urlencoded::byte_serialize(v.as_bytes()).collect();
                format!("{k}={v}")
            })
            .collect::<Vec<_>>()
            .join("&")
            .into_bytes()
    }

    impl Sandbox {
        /// Adds `sign_type` and `sign` (over `sign_content(fields, keep_empty)`) and encodes
        /// the form in UTF-8.
        pub fn notification(
            &self,
            mut fields: Vec<(String, String)>,
            keep_empty: bool,
        ) -> Result<Delivery, ForgeError> {
            let sign = rsa_sign(
                &self.private_key,
                sign_content(&fields, keep_empty).as_bytes(),
            )?;
            fields.push(("sign".into(), sign));
            fields.push(("sign_type".into(), "RSA2".into()));
            Ok(Delivery {
                headers: vec![(
                    "Content-Type".into(),
                    "application/x-www-form-urlencoded; charset=utf-8".into(),
                )],
                body: encode_form(&fields),
            })
        }
    }
}
