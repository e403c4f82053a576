//! Builds notifications exactly as the providers send them, signed (and for WeChat encrypted)
//! with provider-side sandbox keys. The QA replay tool and the test suite share it, so both
//! speak the providers' wire format and nothing else does.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ring::rand::{SecureRandom, SystemRandom};
use rsa::sha2::Sha256;
use serde_json::{Value, json};

#[derive(Debug, thiserror::Error)]
pub enum ForgeError {
    #[error("random number generator failed")]
    Random,
    #[error("signing failed: {0}")]
    Sign(String),
    #[error("encryption failed")]
    Encrypt,
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
    let mut bytes = vec![0u8; len];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| ForgeError::Random)?;
    Ok(bytes
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect())
}

/// RSASSA-PKCS1-v1_5 with SHA-256, base64: what both providers sign with.
pub fn rsa_sign(key: &rsa::PrivateKey, message: &[u8]) -> Result<String, ForgeError> {
    let signature = key
        .pkcs1v15_sign::<Sha256>(message)
        .map_err(|e| ForgeError::Sign(e.to_string()))?;
    Ok(BASE64.encode(signature))
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
        let summary = if original_type == "refund" {
            "退款成功"
        } else {
            "支付成功"
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
            let original_type = if event_type.starts_with("REFUND.") {
                "refund"
            } else {
                "transaction"
            };
            let nonce = random_token(12)?;
            let ciphertext = encrypt(
                self.apiv3_key.as_bytes(),
                &nonce,
                original_type,
                plaintext.to_string().as_bytes(),
            )?;
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
