//! Known-answer Alipay notifications (tests/vectors/alipay, made and checked with
//! python-alipay-sdk): `valid_*` verify and decode to their notice, `invalid_*` are refused as
//! bad signatures, `bad_request_*` as bad requests.

use std::path::{Path, PathBuf};

use actix_web::http::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use paynotify::channel::alipay::{Alipay, string_to_sign};
use paynotify::channel::alipay::{AlipayApp, AlipaySettings};
use paynotify::channel::{Channel, Inbound, Rejection};
use paynotify::notice::{NoticeKind, RefundAmount};
use paynotify::qa::forge::alipay::sign_content;
use paynotify::time::{Clock, SystemClock};

use crate::support::helpers::{read_json, vector_files};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/alipay")
}

pub fn vector_settings() -> AlipaySettings {
    let keys = dir().join("keys");
    let doc = read_json(&keys.join("keys.json"));
    AlipaySettings {
        apps: vec![AlipayApp {
            app_private_key_file: None,
            gateway: None,
            app_id: doc["app_id"].as_str().expect("app_id").into(),
            seller_id: doc["seller_id"].as_str().expect("seller_id").into(),
            alipay_public_key_file: Some(
                keys.join(doc["alipay_public_key_file"].as_str().expect("file")),
            ),
            alipay_cert_file: None,
        }],
    }
}

#[test]
fn every_alipay_vector_gets_its_expected_answer() {
    let channel = Alipay::from_settings(&vector_settings(), SystemClock.now()).expect("keys load");
    let vectors = vector_files(&dir());
    assert_eq!(vectors.len(), 14, "every vector file is checked");
    for (name, v) in vectors {
        let body = v["body"].as_str().expect("body").as_bytes();
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_str(v["content_type"].as_str().expect("content type"))
                .expect("value"),
        );
        if let Some(signed) = v["sign_content"].as_str() {
            // The service's reading of the form gives exactly the string Alipay signed, and
            // so does the forge's.
            let ours = string_to_sign(body).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(String::from_utf8_lossy(&ours), signed, "{name}");
            let fields: Vec<(String, String)> = form_urlencoded::parse(body).into_owned().collect();
            assert_eq!(sign_content(&fields, false), signed, "{name}");
        }
        let inbound = Inbound {
            headers: &headers,
            body,
            now: SystemClock.now(),
        };
        let result = channel
            .verify(&inbound)
            .and_then(|verified| channel.decode(verified));
        match v["expect"].as_str().expect("expect") {
            "valid" => {
                let notice = result.unwrap_or_else(|e| panic!("{name}: {e}"));
                let want = &v["notice"];
                assert_eq!(notice.out_trade_no, want["out_trade_no"], "{name}");
                assert_eq!(notice.transaction_id, want["trade_no"], "{name}");
                assert_eq!(notice.amount_fen, want["total_amount_fen"], "{name}");
                assert_eq!(
                    notice.merchant.app_id.as_deref(),
                    want["app_id"].as_str(),
                    "{name}"
                );
                assert_eq!(notice.merchant.merchant_id, want["seller_id"], "{name}");
                assert!(notice.merchant_matches, "{name}");
                match (&notice.kind, want["kind"].as_str().expect("kind")) {
                    (NoticeKind::Paid, "paid") | (NoticeKind::Closed, "closed") => {}
                    (NoticeKind::Refunded(r), "refunded") => {
                        assert_eq!(r.out_refund_no, want["out_biz_no"], "{name}");
                        assert_eq!(
                            r.amount,
                            RefundAmount::RunningTotal(
                                want["refund_fee_fen"].as_i64().expect("fee")
                            ),
                            "{name}"
                        );
                    }
                    (got, want) => panic!("{name}: decoded {got:?}, expected {want}"),
                }
            }
            "invalid_signature" => {
                assert!(
                    matches!(result, Err(Rejection::BadSignature(_))),
                    "{name}: {result:?}"
                );
            }
            "bad_request" => {
                assert!(
                    matches!(result, Err(Rejection::BadRequest(_))),
                    "{name}: {result:?}"
                );
            }
            other => panic!("{name}: unknown expectation {other}"),
        }
    }
}
