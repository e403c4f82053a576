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

use crate::support::agree::{assert_refused_as, assert_vector_agrees};
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
            app_cert_file: None,
            alipay_root_cert_file: None,
        }],
        ..AlipaySettings::default()
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
            route: None,
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

fn assert_body_refused_as(channel: &Alipay, body: &[u8], name: &str, expected: Option<&str>) {
    let mut headers = HeaderMap::new();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/x-www-form-urlencoded; charset=utf-8"),
    );
    let inbound = Inbound {
        headers: &headers,
        body,
        now: SystemClock.now(),
        route: None,
    };
    assert_refused_as(channel, &inbound, name, expected);
}

#[test]
fn verify_and_explain_agree_on_every_alipay_vector() {
    let channel = Alipay::from_settings(&vector_settings(), SystemClock.now()).expect("keys load");
    let vectors = vector_files(&dir());
    assert_eq!(vectors.len(), 14, "every vector file is checked");
    for (name, v) in &vectors {
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_str(v["content_type"].as_str().expect("content type"))
                .expect("value"),
        );
        let inbound = Inbound {
            headers: &headers,
            body: v["body"].as_str().expect("body").as_bytes(),
            now: SystemClock.now(),
            route: None,
        };
        assert_vector_agrees(&channel, &inbound, name);
    }
}

/// Every way `verify` (and decoding) refuses an Alipay notification, alone and two at a time
/// where the order of the checks decides which refusal is answered.
#[test]
fn verify_and_explain_agree_on_every_way_an_alipay_notification_is_refused() {
    use crate::alipay::{Fields, pay_fields, set};
    use paynotify::qa::forge::alipay::encode_form;
    use paynotify::qa::forge::rsa_sign;

    let channel =
        Alipay::from_settings(&crate::alipay::settings(), SystemClock.now()).expect("keys load");
    let key = crate::support::keys::rsa_key("alipay");
    // Signed as an Alipay SDK signs: `keep_empty` as the Python/Node/Go ones, else as Java's.
    let sign = |mut fields: Fields, keep_empty: bool| -> Vec<u8> {
        let content = sign_content(&fields, keep_empty);
        fields.push((
            "sign".into(),
            rsa_sign(&key, content.as_bytes()).expect("sign"),
        ));
        fields.push(("sign_type".into(), "RSA2".into()));
        encode_form(&fields)
    };
    let changed = |change: &dyn Fn(&mut Fields)| {
        let mut fields = pay_fields("PN-AGREE-1", 100, "TRADE_SUCCESS");
        change(&mut fields);
        sign(fields, false)
    };
    let replaced = |body: &[u8], from: &str, to: &str| -> Vec<u8> {
        let text = String::from_utf8(body.to_vec()).expect("form");
        assert!(text.contains(from), "{from} in {text}");
        text.replacen(from, to, 1).into_bytes()
    };
    let valid = changed(&|_| {});
    let without = |key: &'static str| move |f: &mut Fields| f.retain(|(k, _)| k != key);
    // A GBK form with a value that is not GBK, signed over its bytes.
    let not_gbk = {
        let mut fields = pay_fields("PN-AGREE-1", 100, "TRADE_SUCCESS");
        set(&mut fields, "charset", "gbk");
        set(&mut fields, "subject", "X");
        let content = sign_content(&fields, false).replacen("subject=X", "subject=\u{1}", 1);
        let mut content = content.into_bytes();
        let at = content.iter().position(|b| *b == 1).expect("marker");
        content[at] = 0xff;
        fields.push(("sign".into(), rsa_sign(&key, &content).expect("sign")));
        fields.push(("sign_type".into(), "RSA2".into()));
        replaced(&encode_form(&fields), "subject=X", "subject=%FF")
    };
    let cases: Vec<(&str, Vec<u8>, Option<&str>)> = vec![
        ("as sent", valid.clone(), None),
        (
            "an empty value, signed keeping it",
            sign(
                {
                    let mut f = pay_fields("PN-AGREE-1", 100, "TRADE_SUCCESS");
                    set(&mut f, "body", "");
                    f
                },
                true,
            ),
            None,
        ),
        (
            "another seller",
            changed(&|f| set(f, "seller_id", "2088000000000009")),
            None,
        ),
        (
            "a parameter twice",
            [valid.as_slice(), b"&out_trade_no=PN-AGREE-2"].concat(),
            Some("bad request: parameter out_trade_no appears more than once"),
        ),
        (
            "app_id missing",
            changed(&without("app_id")),
            Some("bad request: missing parameter app_id"),
        ),
        (
            "unknown app_id",
            changed(&|f| set(f, "app_id", "2021000000000099")),
            Some("bad signature: unknown app_id 2021000000000099"),
        ),
        (
            "app_id not UTF-8",
            replaced(&valid, "&app_id=2021000000000001", "&app_id=%FF"),
            Some("bad signature: unknown app_id"),
        ),
        (
            "sign_type RSA",
            replaced(&valid, "sign_type=RSA2", "sign_type=RSA"),
            Some("bad request: unsupported sign_type RSA"),
        ),
        (
            "sign missing",
            {
                let mut f = pay_fields("PN-AGREE-1", 100, "TRADE_SUCCESS");
                f.push(("sign_type".into(), "RSA2".into()));
                encode_form(&f)
            },
            Some("bad signature: missing sign"),
        ),
        (
            "sign empty",
            {
                let mut f = pay_fields("PN-AGREE-1", 100, "TRADE_SUCCESS");
                f.push(("sign".into(), String::new()));
                encode_form(&f)
            },
            Some("bad signature: missing sign"),
        ),
        (
            "sign not base64",
            {
                let mut f = pay_fields("PN-AGREE-1", 100, "TRADE_SUCCESS");
                f.push(("sign".into(), "not base64!".into()));
                encode_form(&f)
            },
            Some("bad signature: sign is not base64"),
        ),
        (
            "amount changed after signing",
            replaced(&valid, "total_amount=1.00", "total_amount=9.00"),
            Some("bad signature: signature does not verify"),
        ),
        (
            "signed with another app's key",
            changed(&|f| {
                set(f, "app_id", "2021000000000002");
                set(f, "seller_id", "2088000000000002");
            }),
            Some("bad signature: signature does not verify"),
        ),
        (
            "unsupported charset",
            changed(&|f| set(f, "charset", "latin1")),
            Some("bad request: unsupported charset latin1"),
        ),
        (
            "a value not in its charset",
            not_gbk,
            Some("bad request: a parameter is not valid gbk"),
        ),
        (
            "out_trade_no missing",
            changed(&without("out_trade_no")),
            Some("bad request: missing parameter out_trade_no"),
        ),
        (
            "amount not yuan",
            changed(&|f| set(f, "total_amount", "1e2")),
            Some("bad request: total_amount: "),
        ),
        (
            "amount zero",
            changed(&|f| set(f, "total_amount", "0.00")),
            Some("bad request: total_amount must be positive"),
        ),
        (
            "refund without out_biz_no",
            changed(&|f| set(f, "refund_fee", "0.50")),
            Some("bad request: missing parameter out_biz_no"),
        ),
        (
            "out_trade_no too long",
            changed(&|f| set(f, "out_trade_no", &"N".repeat(200))),
            Some("bad request: out_trade_no is 200 characters"),
        ),
        // Two faults: the one verify checks first is the one answered.
        (
            "a parameter twice, unknown app_id",
            [
                changed(&|f| set(f, "app_id", "2021000000000099")).as_slice(),
                b"&sign_type=RSA2",
            ]
            .concat(),
            Some("bad request: parameter sign_type appears more than once"),
        ),
        (
            "app_id missing, sign missing",
            {
                let mut f = pay_fields("PN-AGREE-1", 100, "TRADE_SUCCESS");
                f.retain(|(k, _)| k != "app_id");
                encode_form(&f)
            },
            Some("bad request: missing parameter app_id"),
        ),
        (
            "unknown app_id, sign_type RSA",
            replaced(
                &changed(&|f| set(f, "app_id", "2021000000000099")),
                "sign_type=RSA2",
                "sign_type=RSA",
            ),
            Some("bad signature: unknown app_id"),
        ),
        (
            "sign_type RSA, amount changed after signing",
            replaced(
                &replaced(&valid, "sign_type=RSA2", "sign_type=RSA"),
                "total_amount=1.00",
                "total_amount=9.00",
            ),
            Some("bad request: unsupported sign_type RSA"),
        ),
        (
            "amount changed after signing, unsupported charset",
            replaced(
                &changed(&|f| set(f, "charset", "latin1")),
                "total_amount=1.00",
                "total_amount=9.00",
            ),
            Some("bad signature: signature does not verify"),
        ),
    ];
    for (name, body, want) in &cases {
        assert_body_refused_as(&channel, body, name, *want);
    }
}
