//! Known-answer WeChat Pay notifications (tests/vectors/wechat, made and checked with the
//! wechatpayv3 SDK): every `valid_*` verifies and decrypts to its plaintext, every other
//! vector is refused with its expected reason.

use std::path::{Path, PathBuf};

use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use chrono::{TimeZone, Utc};
use paynotify::channel::wechat::WechatPay;
use paynotify::channel::wechat::{PlatformKey, WechatMerchant, WechatSettings};
use paynotify::channel::{Channel, Inbound, Rejection};
use paynotify::config::Secret;
use paynotify::notice::{NoticeKind, RefundAmount};
use paynotify::time::Timestamp;
use serde_json::Value;

use crate::support::helpers::{read_json, vector_files};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/wechat")
}

/// The merchants of keys/keys.json as configuration.
pub fn vector_settings() -> WechatSettings {
    let keys = dir().join("keys");
    let doc = read_json(&keys.join("keys.json"));
    let merchants = doc["merchants"]
        .as_array()
        .expect("merchants")
        .iter()
        .map(|m| WechatMerchant {
            private_key_file: None,
            merchant_serial: None,
            api_base: None,
            mchid: m["mchid"].as_str().expect("mchid").into(),
            appid: Some(m["appid"].as_str().expect("appid").into()),
            appids: Vec::new(),
            apiv3_key: Secret::new(m["apiv3_key"].as_str().expect("key")),
            platform_keys: m["platform_keys"]
                .as_array()
                .expect("platform_keys")
                .iter()
                .map(|k| PlatformKey {
                    serial: k["serial"].as_str().map(Into::into),
                    public_key_file: k["public_key_file"].as_str().map(|f| keys.join(f)),
                    certificate_file: k["certificate_file"].as_str().map(|f| keys.join(f)),
                })
                .collect(),
        })
        .collect();
    WechatSettings { merchants }
}

fn at(unix: i64) -> Timestamp {
    Timestamp::new(Utc.timestamp_opt(unix, 0).single().expect("time"))
}

#[test]
fn every_wechat_vector_gets_its_expected_answer() {
    let channel =
        WechatPay::from_settings(&vector_settings(), at(1_794_967_525)).expect("keys load");
    let mut seen = 0;
    for (name, v) in vector_files(&dir()) {
        let mut headers = HeaderMap::new();
        for (k, value) in v["headers"].as_object().expect("headers") {
            headers.append(
                HeaderName::from_bytes(k.as_bytes()).expect("header name"),
                HeaderValue::from_str(value.as_str().expect("header value")).expect("header value"),
            );
        }
        let body = v["body"].as_str().expect("body").as_bytes();
        let inbound = Inbound {
            headers: &headers,
            body,
            now: at(v["now"].as_i64().expect("now")),
        };
        let expect = v["expect"].as_str().expect("expect");
        let result = channel.verify(&inbound);
        match expect {
            "valid" => {
                let verified = result.unwrap_or_else(|e| panic!("{name}: {e}"));
                let plaintext: Value =
                    serde_json::from_slice(verified.plaintext()).expect("plaintext JSON");
                assert_eq!(plaintext, v["plaintext"], "{name}");
                let notice = channel
                    .decode(verified)
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                let want = &v["notice"];
                let kind = match &notice.kind {
                    NoticeKind::Paid => "paid".to_owned(),
                    NoticeKind::Refunded(_) => "refunded".to_owned(),
                    NoticeKind::Other { status } => format!("refund_{}", status.to_lowercase()),
                    NoticeKind::Closed => "closed".to_owned(),
                };
                assert_eq!(kind, want["kind"], "{name}");
                assert_eq!(notice.out_trade_no, want["out_trade_no"], "{name}");
                assert_eq!(notice.transaction_id, want["transaction_id"], "{name}");
                assert_eq!(notice.amount_fen, want["amount_total_fen"], "{name}");
                assert_eq!(notice.merchant.merchant_id, want["mchid"], "{name}");
                assert_eq!(
                    notice.merchant.app_id.as_deref(),
                    want["appid"].as_str(),
                    "{name}"
                );
                assert!(notice.merchant_matches, "{name}");
                if let NoticeKind::Refunded(r) = &notice.kind {
                    assert_eq!(r.out_refund_no, want["out_refund_no"], "{name}");
                    assert_eq!(r.refund_id, want["refund_id"], "{name}");
                    let fen = match r.amount {
                        RefundAmount::This(fen) => fen,
                        RefundAmount::RunningTotal(_) => {
                            panic!("{name}: WeChat states each refund alone")
                        }
                    };
                    assert_eq!(fen, want["refund_fen"], "{name}");
                } else if want["kind"] == "paid" {
                    assert_eq!(notice.currency, want["currency"], "{name}");
                }
            }
            other => {
                let rejection = result.err().unwrap_or_else(|| panic!("{name}: accepted"));
                let matches = match other {
                    "invalid_signature" => matches!(rejection, Rejection::BadSignature(_)),
                    "stale" => matches!(rejection, Rejection::Stale(_)),
                    "bad_request" => matches!(rejection, Rejection::BadRequest(_)),
                    "decrypt_error" => matches!(rejection, Rejection::Undecryptable(_)),
                    unknown => panic!("{name}: unknown expectation {unknown}"),
                };
                assert!(matches, "{name}: expected {other}, got {rejection:?}");
            }
        }
        seen += 1;
    }
    assert_eq!(seen, 19, "every vector file was checked");
}

#[test]
fn an_expired_platform_certificate_is_refused_at_start_up() {
    // The vector certificate is valid until 2046-01-01.
    let err = WechatPay::from_settings(&vector_settings(), at(2_400_000_000)).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("certificate_file") && message.contains("expired"),
        "{message}"
    );
}

#[test]
fn a_bad_key_file_is_a_start_up_error_naming_it() {
    let mut settings = vector_settings();
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("not-a-key.pem");
    std::fs::write(
        &bad,
        "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
    )
    .expect("write");
    settings.merchants[1].platform_keys[0].public_key_file = Some(bad.clone());
    let err = WechatPay::from_settings(&settings, at(1_794_967_525))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("not-a-key.pem") && err.contains("wechat.merchants[1]"),
        "{err}"
    );

    settings.merchants[1].platform_keys[0].public_key_file = Some(dir.path().join("missing.pem"));
    let err = WechatPay::from_settings(&settings, at(1_794_967_525))
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing.pem"), "{err}");
}
