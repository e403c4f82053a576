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

use crate::support::agree::{assert_refused_as, assert_vector_agrees, header_map};
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
            certificates: None,
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
            route: None,
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
                    NoticeKind::Transfer(_) => "transfer".to_owned(),
                    NoticeKind::Combined(_) => "combined".to_owned(),
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
                    // An unknown serial is refused as its own kind of bad signature (401
                    // `unknown_serial`), after the merchant's certificates were asked for.
                    "invalid_signature" if name.contains("unknown_serial") => {
                        matches!(rejection, Rejection::UnknownSerial(_))
                    }
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

/// A request as it arrived, to take apart one way at a time.
#[derive(Clone)]
struct Request {
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    now: i64,
    /// The notify route it came to; `None` for not known.
    route: Option<&'static str>,
}

impl Request {
    fn of_vector(name: &str) -> Self {
        let v = read_json(&dir().join(name));
        Self {
            headers: v["headers"]
                .as_object()
                .expect("headers")
                .iter()
                .map(|(k, value)| {
                    (
                        k.clone(),
                        value.as_str().expect("value").as_bytes().to_vec(),
                    )
                })
                .collect(),
            body: v["body"].as_str().expect("body").as_bytes().to_vec(),
            now: v["now"].as_i64().expect("now"),
            route: None,
        }
    }

    fn of_delivery(d: &paynotify::qa::forge::Delivery, now: i64) -> Self {
        Self {
            headers: d
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), v.as_bytes().to_vec()))
                .collect(),
            body: d.body.clone(),
            now,
            route: None,
        }
    }

    fn without(mut self, name: &str) -> Self {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self
    }

    fn with(self, name: &str, value: &[u8]) -> Self {
        let mut this = self.without(name);
        this.headers.push((name.to_owned(), value.to_vec()));
        this
    }

    /// `name` sent twice, its own value and `value`.
    fn twice(mut self, name: &str, value: &[u8]) -> Self {
        self.headers.push((name.to_owned(), value.to_vec()));
        self
    }

    fn header(&self, name: &str) -> Vec<u8> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
            .expect("header")
    }

    fn at(mut self, now: i64) -> Self {
        self.now = now;
        self
    }

    /// Sent to the notify route `route`.
    fn to(mut self, route: &'static str) -> Self {
        self.route = Some(route);
        self
    }

    fn assert_refused_as(&self, channel: &WechatPay, name: &str, expected: Option<&str>) {
        let headers = header_map(&self.headers);
        let inbound = Inbound {
            headers: &headers,
            body: &self.body,
            now: at(self.now),
            route: self.route,
        };
        assert_refused_as(channel, &inbound, name, expected);
    }
}

#[test]
fn verify_and_explain_agree_on_every_wechat_vector() {
    let channel =
        WechatPay::from_settings(&vector_settings(), at(1_794_967_525)).expect("keys load");
    let vectors = vector_files(&dir());
    assert_eq!(vectors.len(), 19, "every vector file is checked");
    for (name, _) in &vectors {
        let r = Request::of_vector(name);
        let headers = header_map(&r.headers);
        let inbound = Inbound {
            headers: &headers,
            body: &r.body,
            now: at(r.now),
            route: None,
        };
        assert_vector_agrees(&channel, &inbound, name);
    }
}

/// Every way `verify` (and decoding) refuses a WeChat notification, alone and two at a time
/// where the order of the checks decides which refusal is answered.
#[test]
fn verify_and_explain_agree_on_every_way_a_wechat_notification_is_refused() {
    let channel =
        WechatPay::from_settings(&vector_settings(), at(1_794_967_525)).expect("keys load");
    let valid = Request::of_vector("valid_pay.json");
    let check = |r: &Request, name: &str, expected: Option<&str>| {
        r.assert_refused_as(&channel, name, expected)
    };
    check(&valid, "as sent", None);
    let unsupported = "bad request: unsupported Wechatpay-Signature-Type";
    let non_ascii: &[u8] = b"caf\xc3\xa9";
    let mut cases = vec![
        (
            "signature type RSA4096",
            valid
                .clone()
                .with("Wechatpay-Signature-Type", b"WECHATPAY2-SHA256-RSA4096"),
            Some(unsupported),
        ),
        (
            "signature type absent",
            valid.clone().without("Wechatpay-Signature-Type"),
            None,
        ),
        (
            "signature type twice",
            valid
                .clone()
                .twice("Wechatpay-Signature-Type", b"WECHATPAY2-SHA256-RSA2048"),
            Some("bad request: header Wechatpay-Signature-Type appears more than once"),
        ),
        (
            "signature type not ASCII",
            valid.clone().with("Wechatpay-Signature-Type", non_ascii),
            Some("bad request: header Wechatpay-Signature-Type is not visible ASCII"),
        ),
    ];
    for header in [
        "Wechatpay-Timestamp",
        "Wechatpay-Nonce",
        "Wechatpay-Signature",
        "Wechatpay-Serial",
    ] {
        let missing = if header == "Wechatpay-Signature" {
            "bad signature: missing Wechatpay-Signature".to_owned()
        } else {
            format!("bad request: missing header {header}")
        };
        let twice = format!("bad request: header {header} appears more than once");
        let not_ascii = format!("bad request: header {header} is not visible ASCII");
        let own = valid.header(header);
        for (how, r, want) in [
            ("missing", valid.clone().without(header), missing),
            ("twice", valid.clone().twice(header, &own), twice),
            (
                "not ASCII",
                valid.clone().with(header, non_ascii),
                not_ascii,
            ),
        ] {
            r.assert_refused_as(&channel, &format!("{header} {how}"), Some(&want));
        }
        // The signature type is checked before any of the four.
        valid
            .clone()
            .without(header)
            .with("Wechatpay-Signature-Type", b"RSA")
            .assert_refused_as(
                &channel,
                &format!("{header} missing, bad type"),
                Some(unsupported),
            );
    }
    let now = valid.now;
    let serial = valid.header("Wechatpay-Serial");
    cases.extend([
        (
            "timestamp not a number",
            valid.clone().with("Wechatpay-Timestamp", b"1794967525.0"),
            Some("bad request: Wechatpay-Timestamp is not unix seconds"),
        ),
        (
            "stale",
            valid.clone().at(now + 400),
            Some("stale: timestamp is "),
        ),
        (
            "from the future",
            valid.clone().at(now - 400),
            Some("stale: timestamp is -"),
        ),
        (
            "serial in lower case",
            valid
                .clone()
                .with("Wechatpay-Serial", serial.to_ascii_lowercase().as_slice()),
            None,
        ),
        (
            "unknown serial",
            valid
                .clone()
                .with("Wechatpay-Serial", b"PUB_KEY_ID_UNKNOWN"),
            Some("unknown serial: unknown Wechatpay-Serial PUB_KEY_ID_UNKNOWN"),
        ),
        (
            "probe",
            valid
                .clone()
                .with("Wechatpay-Signature", b"WECHATPAY/SIGNTEST/AAAA"),
            Some("bad signature: WECHATPAY/SIGNTEST probe"),
        ),
        (
            "signature not base64",
            valid.clone().with("Wechatpay-Signature", b"not base64!"),
            Some("bad signature: Wechatpay-Signature is not base64"),
        ),
        (
            "signature of something else",
            valid.clone().with("Wechatpay-Signature", b"AAAA"),
            Some("bad signature: signature does not verify"),
        ),
        (
            "a body byte changed",
            Request {
                body: {
                    let mut body = valid.body.clone();
                    body[10] ^= 1;
                    body
                },
                ..valid.clone()
            },
            Some("bad signature: signature does not verify"),
        ),
        // Two faults: the one verify checks first is the one answered.
        (
            "timestamp not a number, nonce missing",
            valid
                .clone()
                .with("Wechatpay-Timestamp", b"x")
                .without("Wechatpay-Nonce"),
            Some("bad request: missing header Wechatpay-Nonce"),
        ),
        (
            "nonce and signature missing",
            valid
                .clone()
                .without("Wechatpay-Signature")
                .without("Wechatpay-Nonce"),
            Some("bad request: missing header Wechatpay-Nonce"),
        ),
        (
            "stale, unknown serial",
            valid
                .clone()
                .at(now + 400)
                .with("Wechatpay-Serial", b"PUB_KEY_ID_UNKNOWN"),
            Some("stale: "),
        ),
        (
            "timestamp not a number, unknown serial",
            valid
                .clone()
                .with("Wechatpay-Timestamp", b"x")
                .with("Wechatpay-Serial", b"PUB_KEY_ID_UNKNOWN"),
            Some("bad request: Wechatpay-Timestamp is not unix seconds"),
        ),
        (
            "unknown serial, probe",
            valid
                .clone()
                .with("Wechatpay-Serial", b"PUB_KEY_ID_UNKNOWN")
                .with("Wechatpay-Signature", b"WECHATPAY/SIGNTEST/AAAA"),
            Some("unknown serial: unknown Wechatpay-Serial"),
        ),
        (
            "unknown serial, signature not base64",
            valid
                .clone()
                .with("Wechatpay-Serial", b"PUB_KEY_ID_UNKNOWN")
                .with("Wechatpay-Signature", b"!"),
            Some("unknown serial: unknown Wechatpay-Serial"),
        ),
        (
            "stale, probe",
            valid
                .clone()
                .at(now + 400)
                .with("Wechatpay-Signature", b"WECHATPAY/SIGNTEST/AAAA"),
            Some("stale: "),
        ),
        (
            "bad type, stale, bad signature",
            valid
                .clone()
                .at(now + 400)
                .with("Wechatpay-Signature-Type", b"RSA")
                .with("Wechatpay-Signature", b"AAAA"),
            Some(unsupported),
        ),
    ]);
    for (name, r, want) in &cases {
        check(r, name, *want);
    }
}

/// The refusals of a body that is signed: reading the envelope, decrypting and decoding it.
#[test]
fn verify_and_explain_agree_on_every_way_a_signed_wechat_body_is_refused() {
    use paynotify::qa::forge::wechat::{encrypt, envelope, transaction};
    const PAY: &str = "/notify/wechat/pay";
    const REFUND: &str = "/notify/wechat/refund";
    const TRANSFER: &str = "/notify/wechat/transfer";

    let now = 1_794_967_525;
    let channel = WechatPay::from_settings(&crate::wechat::settings(), at(now)).expect("keys load");
    let a = crate::wechat::sandbox('A');
    let b = crate::wechat::sandbox('B');
    let paid = transaction(&a, "PN-AGREE-1", "4200000000000000000001", 100);
    let nonce = "0123456789ab";
    // A body with `resource` as WeChat builds it, changed by `change`, signed with `s`'s key.
    let body = |key: &str, plaintext: &Value, change: &dyn Fn(&mut Value)| -> Vec<u8> {
        let ciphertext = encrypt(
            key.as_bytes(),
            nonce,
            "transaction",
            plaintext.to_string().as_bytes(),
        )
        .expect("encrypt");
        let mut value: Value = serde_json::from_str(&envelope(
            "TRANSACTION.SUCCESS",
            "transaction",
            &ciphertext,
            "transaction",
            nonce,
        ))
        .expect("envelope");
        change(&mut value);
        value.to_string().into_bytes()
    };
    let signed = |s: &paynotify::qa::forge::wechat::Sandbox, body: Vec<u8>| {
        Request::of_delivery(&s.sign(now, body).expect("sign"), now)
    };
    let same = |_: &mut Value| {};
    let valid = signed(&a, body(&a.apiv3_key, &paid, &same));
    let mut other_merchant = paid.clone();
    other_merchant["mchid"] = "1900000002".into();
    let mut free = paid.clone();
    free["amount"]["total"] = 0.into();
    let mut long = paid.clone();
    long["out_trade_no"] = "N".repeat(200).into();
    let refund = |change: &dyn Fn(&mut Value)| {
        let mut plain = paynotify::qa::forge::wechat::refund(
            &a,
            "PN-AGREE-1",
            "4200000000000000000001",
            "RF-1",
            100,
            100,
        );
        change(&mut plain);
        let ciphertext = encrypt(
            a.apiv3_key.as_bytes(),
            nonce,
            "refund",
            plain.to_string().as_bytes(),
        )
        .expect("encrypt");
        signed(
            &a,
            envelope("REFUND.SUCCESS", "refund", &ciphertext, "refund", nonce).into_bytes(),
        )
    };
    let closed = signed(
        &a,
        body(&a.apiv3_key, &paid, &|v| {
            v["event_type"] = "TRANSACTION.CLOSED".into()
        }),
    );
    let cases = [
        ("as sent", valid.clone(), None),
        (
            "another merchant's transaction",
            signed(&a, body(&a.apiv3_key, &other_merchant, &same)),
            None,
        ),
        (
            "an event this service does not act on",
            closed.clone(),
            None,
        ),
        ("a refund", refund(&|_| {}), None),
        (
            "not JSON",
            signed(&a, b"{\"event_type\": ".to_vec()),
            Some("bad request: envelope: "),
        ),
        (
            "resource_type not encrypt-resource",
            signed(
                &a,
                body(&a.apiv3_key, &paid, &|v| {
                    v["resource_type"] = "plain".into()
                }),
            ),
            Some("bad request: resource_type is not encrypt-resource"),
        ),
        (
            "another algorithm",
            signed(
                &a,
                body(&a.apiv3_key, &paid, &|v| {
                    v["resource"]["algorithm"] = "AEAD_AES_128_GCM".into()
                }),
            ),
            Some("bad request: unsupported algorithm AEAD_AES_128_GCM"),
        ),
        (
            "nonce not 12 bytes",
            signed(
                &a,
                body(&a.apiv3_key, &paid, &|v| {
                    v["resource"]["nonce"] = "short".into()
                }),
            ),
            Some("bad request: resource.nonce is not 12 bytes"),
        ),
        (
            "ciphertext not base64",
            signed(
                &a,
                body(&a.apiv3_key, &paid, &|v| {
                    v["resource"]["ciphertext"] = "!!".into()
                }),
            ),
            Some("bad request: resource.ciphertext is not base64"),
        ),
        (
            "encrypted with another merchant's key",
            signed(&a, body(&b.apiv3_key, &paid, &same)),
            Some(
                "cannot decrypt: resource does not decrypt with the apiv3_key of merchant 1900000001",
            ),
        ),
        (
            "other associated data",
            signed(
                &a,
                body(&a.apiv3_key, &paid, &|v| {
                    v["resource"]["associated_data"] = "refund".into()
                }),
            ),
            Some("cannot decrypt: "),
        ),
        (
            "transaction not JSON",
            signed(&a, body(&a.apiv3_key, &Value::from("not an object"), &same)),
            Some("bad request: transaction: "),
        ),
        (
            "amount zero",
            signed(&a, body(&a.apiv3_key, &free, &same)),
            Some("bad request: amount.total must be positive"),
        ),
        (
            "out_trade_no too long",
            signed(&a, body(&a.apiv3_key, &long, &same)),
            Some("bad request: out_trade_no is 200 characters"),
        ),
        (
            "refund not JSON",
            refund(&|v| *v = Value::from(1)),
            Some("bad request: refund: "),
        ),
        (
            "refund of nothing",
            refund(&|v| v["amount"]["refund"] = 0.into()),
            Some("bad request: amount.refund and amount.total must be positive"),
        ),
        // Each route takes its own kind of event; one of neither kind is taken anywhere.
        (
            "a payment to the payment route",
            valid.clone().to(PAY),
            None,
        ),
        (
            "a refund to the refund route",
            refund(&|_| {}).to(REFUND),
            None,
        ),
        (
            "a payment to the refund route",
            valid.clone().to(REFUND),
            Some(
                "wrong event type: event_type TRANSACTION.SUCCESS is a payment; this request came to /notify/wechat/refund, which takes REFUND.*; the notify URL registered for payments",
            ),
        ),
        (
            "a refund to the payment route",
            refund(&|_| {}).to(PAY),
            Some(
                "wrong event type: event_type REFUND.SUCCESS is a refund; this request came to /notify/wechat/pay, which takes TRANSACTION.*; the notify URL registered for refunds",
            ),
        ),
        (
            "a payment event this service does not act on, to the refund route",
            closed.clone().to(REFUND),
            Some("wrong event type: event_type TRANSACTION.CLOSED is a payment"),
        ),
        (
            "a payment event this service does not act on, to the payment route",
            closed.clone().to(PAY),
            None,
        ),
        (
            "an event of no kind this service knows, to the refund route",
            signed(
                &a,
                body(&a.apiv3_key, &paid, &|v| {
                    v["event_type"] = "COUPON.USE".into()
                }),
            )
            .to(REFUND),
            None,
        ),
        (
            "a transfer to the payment route",
            signed(
                &a,
                body(&a.apiv3_key, &paid, &|v| {
                    v["event_type"] = "MCHTRANSFER.BILL.FINISHED".into()
                }),
            )
            .to(PAY),
            Some("wrong event type: event_type MCHTRANSFER.BILL.FINISHED is a merchant transfer"),
        ),
        (
            "a payment to the transfer route",
            valid.clone().to(TRANSFER),
            Some("wrong event type: event_type TRANSACTION.SUCCESS is a payment"),
        ),
        (
            "an event of no kind this service knows, to the transfer route",
            signed(
                &a,
                body(&a.apiv3_key, &paid, &|v| {
                    v["event_type"] = "COUPON.USE".into()
                }),
            )
            .to(TRANSFER),
            Some("wrong event type: event_type COUPON.USE is not MCHTRANSFER.BILL.FINISHED"),
        ),
        (
            "another transfer event, to the transfer route",
            signed(
                &a,
                body(&a.apiv3_key, &paid, &|v| {
                    v["event_type"] = "MCHTRANSFER.BATCH.FINISHED".into()
                }),
            )
            .to(TRANSFER),
            Some("wrong event type: event_type MCHTRANSFER.BATCH.FINISHED is not"),
        ),
        (
            "a transfer, to the transfer route",
            Request::of_delivery(
                &a.notification(
                    "MCHTRANSFER.BILL.FINISHED",
                    &paynotify::qa::forge::wechat::transfer(
                        &a,
                        "TAGREE1",
                        "1330TAGREE1",
                        "SUCCESS",
                        100,
                        None,
                    ),
                    now,
                )
                .expect("forge"),
                now,
            )
            .to(TRANSFER),
            None,
        ),
        (
            "a transfer whose resource is a payment's, to the transfer route",
            signed(
                &a,
                body(&a.apiv3_key, &paid, &|v| {
                    v["event_type"] = "MCHTRANSFER.BILL.FINISHED".into()
                }),
            )
            .to(TRANSFER),
            Some("bad request: transfer: missing field"),
        ),
        (
            "a refund to a path that is no WeChat route",
            refund(&|_| {}).to("/notify/wechat"),
            None,
        ),
        // Two faults: the signature is checked before the body is opened.
        (
            "a payment to the refund route, signed by another key",
            signed(&b, valid.body.clone())
                .with("Wechatpay-Serial", a.serial.as_bytes())
                .to(REFUND),
            Some("bad signature: signature does not verify"),
        ),
        (
            "not JSON, to the refund route",
            signed(&a, b"{\"event_type\": ".to_vec()).to(REFUND),
            Some("bad request: envelope: "),
        ),
        // The event type is read before the resource is decrypted.
        (
            "a payment to the refund route, not decryptable",
            signed(&a, body(&b.apiv3_key, &paid, &same)).to(REFUND),
            Some("wrong event type: "),
        ),
        (
            "signed by another key, not decryptable",
            signed(&b, body(&b.apiv3_key, &paid, &same))
                .with("Wechatpay-Serial", a.serial.as_bytes()),
            Some("bad signature: signature does not verify"),
        ),
        (
            "stale, not JSON",
            signed(&a, b"not JSON".to_vec()).at(now + 400),
            Some("stale: "),
        ),
    ];
    for (name, r, want) in &cases {
        r.assert_refused_as(&channel, name, *want);
    }
}

/// A notification posted to the other kind's route: explain names the event type check, the
/// route it came to and the one its notify URL must name; the checks after it still run.
#[test]
fn explain_names_the_route_a_misrouted_wechat_notification_belongs_to() {
    use paynotify::channel::{Provider, Verdict};
    let channel =
        WechatPay::from_settings(&vector_settings(), at(1_794_967_525)).expect("keys load");
    let r = Request::of_vector("valid_pay.json").to("/notify/wechat/refund");
    let headers = header_map(&r.headers);
    let inbound = Inbound {
        headers: &headers,
        body: &r.body,
        now: at(r.now),
        route: r.route,
    };
    let explained = channel.explain(&inbound);
    let failed = explained.first_failure().expect("a failed check");
    assert_eq!(failed.name, "event type");
    assert_eq!(
        failed.detail,
        "event_type TRANSACTION.SUCCESS is a payment; this request came to /notify/wechat/refund, \
         which takes REFUND.*; the notify URL registered for payments (the notify_url of the \
         order request) must end in /notify/wechat/pay"
    );
    assert!(matches!(
        failed.rejection,
        Some(Rejection::WrongEventType(_))
    ));
    let names: Vec<&str> = explained.checks.iter().map(|c| c.name.as_str()).collect();
    let at_check = |name: &str| names.iter().position(|n| *n == name).expect(name);
    assert!(at_check("signature") < at_check("event type"), "{names:?}");
    assert!(
        explained
            .checks
            .iter()
            .any(|c| c.name == "decryption" && c.verdict == Verdict::Pass),
        "{names:?}"
    );

    let right = channel.explain(&Inbound {
        route: Some("/notify/wechat/pay"),
        ..inbound
    });
    assert!(right.first_failure().is_none(), "{:?}", right.checks);
    let check = right
        .checks
        .iter()
        .find(|c| c.name == "event type")
        .expect("the event type check");
    assert_eq!(
        (check.verdict, check.detail.as_str()),
        (
            Verdict::Pass,
            "TRANSACTION.SUCCESS is a payment, which /notify/wechat/pay takes"
        )
    );
}
