//! WeChat Pay notifications end to end over HTTP, with keys made for the test run and
//! notifications built exactly as WeChat builds them (`paynotify::qa::forge::wechat`).

use std::sync::Arc;

use paynotify::channel::wechat::{PlatformKey, WechatMerchant, WechatSettings};
use paynotify::config::Secret;
use paynotify::qa::forge::Delivery;
use paynotify::qa::forge::wechat::{self, Sandbox};
use paynotify::time::Clock;
use serde_json::Value;

use crate::support::helpers::{Backend, TestApp, post_delivery, released_together, spawn_app_with};
use crate::support::keys::{certificate, public_key_path, rsa_key};

const KEY_A: &str = "PUB_KEY_ID_0000000000000000000000000000000A";
const KEY_B: &str = "PUB_KEY_ID_0000000000000000000000000000000B";
pub(crate) const APIV3_A: &str = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA1";
const APIV3_B: &str = "BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB2";

const CERT_SERIAL: &str = "5157F09EFDC096DE15EBE81A47057A7232F1B8E1";

pub(crate) fn settings() -> WechatSettings {
    rsa_key("wechat-a");
    rsa_key("wechat-b");
    WechatSettings {
        merchants: vec![
            WechatMerchant {
                private_key_file: None,
                merchant_serial: None,
                api_base: None,
                certificates: None,
                mchid: "1900000001".into(),
                // A mini-program and an official account bound to one mchid.
                appid: Some("wx0000000000000001".into()),
                appids: vec!["wx0000000000000003".into()],
                apiv3_key: Secret::new(APIV3_A),
                platform_keys: vec![
                    PlatformKey {
                        serial: Some(KEY_A.into()),
                        public_key_file: Some(public_key_path("wechat-a")),
                        certificate_file: None,
                    },
                    PlatformKey {
                        serial: None,
                        public_key_file: None,
                        certificate_file: Some(certificate("wechat-cert", CERT_SERIAL).1),
                    },
                ],
            },
            WechatMerchant {
                private_key_file: None,
                merchant_serial: None,
                api_base: None,
                certificates: None,
                mchid: "1900000002".into(),
                appid: None,
                appids: vec!["wx0000000000000002".into()],
                apiv3_key: Secret::new(APIV3_B),
                platform_keys: vec![PlatformKey {
                    serial: Some(KEY_B.into()),
                    public_key_file: Some(public_key_path("wechat-b")),
                    certificate_file: None,
                }],
            },
        ],
    }
}

pub(crate) fn sandbox(which: char) -> Sandbox {
    let (serial, private_key, mchid, appid, apiv3) = match which {
        'A' => (
            KEY_A,
            rsa_key("wechat-a"),
            "1900000001",
            "wx0000000000000001",
            APIV3_A,
        ),
        'C' => (
            CERT_SERIAL,
            certificate("wechat-cert", CERT_SERIAL).0,
            "1900000001",
            "wx0000000000000001",
            APIV3_A,
        ),
        _ => (
            KEY_B,
            rsa_key("wechat-b"),
            "1900000002",
            "wx0000000000000002",
            APIV3_B,
        ),
    };
    Sandbox {
        serial: serial.into(),
        private_key,
        mchid: mchid.into(),
        appid: appid.into(),
        apiv3_key: apiv3.into(),
    }
}

async fn app(backend: Backend) -> TestApp {
    spawn_app_with(backend, |s| s.wechat = settings()).await
}

fn now(app: &TestApp) -> i64 {
    app.clock.now().unix_seconds()
}

pub(crate) fn paid(app: &TestApp, s: &Sandbox, order_no: &str, total: i64) -> Delivery {
    let plaintext = wechat::transaction(s, order_no, &format!("42{order_no}"), total);
    s.notification("TRANSACTION.SUCCESS", &plaintext, now(app))
        .expect("forge")
}

async fn send(app: &TestApp, route: &str, d: &Delivery) -> (u16, String) {
    post_delivery(app, route, d).await
}

pub(crate) async fn pay(app: &TestApp, d: &Delivery) -> (u16, String) {
    send(app, "/notify/wechat/pay", d).await
}

/// Creates `order_no` and pays it with merchant A's notification, which is acknowledged.
pub(crate) async fn paid_order(app: &TestApp, order_no: &str, total: i64) {
    app.create_order(order_no, total).await;
    let (status, body) = pay(app, &paid(app, &sandbox('A'), order_no, total)).await;
    assert_eq!(status, 204, "{order_no}: {body}");
}

/// A refused notification answers in WeChat's failure shape and writes nothing.
async fn assert_refused(app: &TestApp, d: &Delivery, status: u16) {
    let (got, body) = pay(app, d).await;
    assert_eq!(got, status, "{body}");
    let body: Value = serde_json::from_str(&body).expect("FAIL body is JSON");
    assert_eq!(body["code"], "FAIL");
    assert!(body["message"].is_string());
    assert_eq!(app.db.count("pay_callback").await, 0);
    assert_eq!(app.db.count("local_message").await, 0);
}

crate::on_every_backend!(
    a_valid_payment_marks_the_order_paid,
    a_retry_reencrypted_and_resigned_is_a_duplicate,
    partial_refunds_add_up_to_a_full_refund,
    abnormal_and_closed_refunds_change_nothing,
    twenty_concurrent_identical_deliveries_make_one_transition,
    wrong_merchant_ids_or_amount_are_anomalies_and_the_order_stays_unpaid,
    two_merchants_and_both_key_kinds_at_once,
    a_payment_from_any_appid_of_the_merchant_is_ours,
    a_second_merchants_payment_and_its_refund_leave_the_order_paid,
);

async fn a_valid_payment_marks_the_order_paid(backend: Backend) {
    let app = app(backend).await;
    app.create_order("W-1", 19900).await;
    let (status, body) = pay(&app, &paid(&app, &sandbox('A'), "W-1", 19900)).await;
    assert_eq!((status, body.as_str()), (204, ""));
    let order = app.get_order("W-1").await;
    assert_eq!(order["status"], "PAID");
    assert_eq!(order["channel"], "wechat");
    assert_eq!(order["transaction_id"], "42W-1");
    assert_eq!(app.messages("ORDER_PAID").await, 1);
}

async fn a_retry_reencrypted_and_resigned_is_a_duplicate(backend: Backend) {
    let app = app(backend).await;
    app.create_order("W-2", 19900).await;
    let s = sandbox('A');
    let first = paid(&app, &s, "W-2", 19900);
    assert_eq!(pay(&app, &first).await.0, 204);
    app.clock.advance(15);
    let retry = paid(&app, &s, "W-2", 19900);
    assert_ne!(first.body, retry.body, "a fresh nonce and ciphertext");
    assert_ne!(
        first.header("Wechatpay-Signature"),
        retry.header("Wechatpay-Signature")
    );
    assert_eq!(pay(&app, &retry).await, (204, String::new()));
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    assert_eq!(app.db.count("pay_callback").await, 1);
}

async fn partial_refunds_add_up_to_a_full_refund(backend: Backend) {
    let app = app(backend).await;
    paid_order(&app, "W-R", 10000).await;
    let s = sandbox('A');
    let refund = |no: &str, fen| {
        let plaintext = wechat::refund(&s, "W-R", "42W-R", no, fen, 10000);
        s.notification("REFUND.SUCCESS", &plaintext, now(&app))
            .expect("forge")
    };
    assert_eq!(
        send(&app, "/notify/wechat/refund", &refund("R-1", 4000))
            .await
            .0,
        204
    );
    assert_eq!(
        send(&app, "/notify/wechat/refund", &refund("R-1", 4000))
            .await
            .0,
        204
    );
    assert_eq!(app.refund_state("W-R").await, ("PAID".into(), 4000));
    assert_eq!(
        send(&app, "/notify/wechat/refund", &refund("R-2", 6000))
            .await
            .0,
        204
    );
    assert_eq!(app.refund_state("W-R").await, ("REFUNDED".into(), 10000));
    assert_eq!(app.messages("ORDER_REFUNDED").await, 2);
}

async fn abnormal_and_closed_refunds_change_nothing(backend: Backend) {
    let app = app(backend).await;
    paid_order(&app, "W-AB", 10000).await;
    let s = sandbox('A');
    for (event, status) in [("REFUND.ABNORMAL", "ABNORMAL"), ("REFUND.CLOSED", "CLOSED")] {
        let mut plaintext = wechat::refund(&s, "W-AB", "42W-AB", "R-X", 10000, 10000);
        plaintext["refund_status"] = status.into();
        let d = s.notification(event, &plaintext, now(&app)).expect("forge");
        assert_eq!(
            send(&app, "/notify/wechat/refund", &d).await.0,
            204,
            "{event}"
        );
    }
    assert_eq!(app.refund_state("W-AB").await, ("PAID".into(), 0));
    assert_eq!(app.db.count("refund_callback").await, 0);
    // The refund can still succeed later under the same out_refund_no.
    let ok = s
        .notification(
            "REFUND.SUCCESS",
            &wechat::refund(&s, "W-AB", "42W-AB", "R-X", 10000, 10000),
            now(&app),
        )
        .expect("forge");
    assert_eq!(send(&app, "/notify/wechat/refund", &ok).await.0, 204);
    assert_eq!(app.status_of("W-AB").await, "REFUNDED");
}

async fn twenty_concurrent_identical_deliveries_make_one_transition(backend: Backend) {
    let app = Arc::new(app(backend).await);
    app.create_order("W-20", 19900).await;
    let d = paid(&app, &sandbox('A'), "W-20", 19900);
    let answers = released_together(20, |_| {
        let (app, d) = (app.clone(), d.clone());
        async move { pay(&app, &d).await }
    })
    .await;
    for answer in answers {
        assert_eq!(answer, (204, String::new()));
    }
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    assert_eq!(app.db.count("pay_callback").await, 1);
}

async fn wrong_merchant_ids_or_amount_are_anomalies_and_the_order_stays_unpaid(backend: Backend) {
    let app = app(backend).await;
    let s = sandbox('A');
    for (no, field, value) in [
        ("W-M1", "mchid", "1999999999"),
        ("W-M2", "appid", "wxffffffffffffffff"),
    ] {
        app.create_order(no, 19900).await;
        let mut plaintext = wechat::transaction(&s, no, "42x", 19900);
        plaintext[field] = value.into();
        let d = s
            .notification("TRANSACTION.SUCCESS", &plaintext, now(&app))
            .expect("forge");
        assert_eq!(pay(&app, &d).await.0, 204, "{field}");
        assert_eq!(app.status_of(no).await, "WAIT_PAY", "{field}");
    }
    app.create_order("W-M3", 19900).await;
    assert_eq!(pay(&app, &paid(&app, &s, "W-M3", 100)).await.0, 204);
    assert_eq!(app.status_of("W-M3").await, "WAIT_PAY");
    // `amount.total` is the order amount; what the payer paid after coupons does not count.
    app.create_order("W-M4", 19900).await;
    let mut coupon = wechat::transaction(&s, "W-M4", "42W-M4", 19900);
    coupon["amount"]["payer_total"] = 15000.into();
    let d = s
        .notification("TRANSACTION.SUCCESS", &coupon, now(&app))
        .expect("forge");
    assert_eq!(pay(&app, &d).await.0, 204);
    assert_eq!(app.status_of("W-M4").await, "PAID");

    assert_eq!(app.messages("PAYMENT_ANOMALY").await, 3);
    assert_eq!(app.messages("ORDER_PAID").await, 1);
}

async fn two_merchants_and_both_key_kinds_at_once(backend: Backend) {
    let app = app(backend).await;
    for (no, which) in [("W-KA", 'A'), ("W-KC", 'C'), ("W-KB", 'B')] {
        app.create_order(no, 500).await;
        assert_eq!(
            pay(&app, &paid(&app, &sandbox(which), no, 500)).await.0,
            204,
            "{which}"
        );
        assert_eq!(app.status_of(no).await, "PAID", "{which}");
    }
    // Merchant B's key cannot speak for merchant A's ids.
    app.create_order("W-KX", 500).await;
    let mut b_as_a = sandbox('B');
    b_as_a.mchid = "1900000001".into();
    b_as_a.appid = "wx0000000000000001".into();
    assert_eq!(pay(&app, &paid(&app, &b_as_a, "W-KX", 500)).await.0, 204);
    assert_eq!(app.status_of("W-KX").await, "WAIT_PAY");
}

async fn a_payment_from_any_appid_of_the_merchant_is_ours(backend: Backend) {
    let app = app(backend).await;
    for (no, appid) in [
        ("W-APP1", "wx0000000000000001"),
        ("W-APP3", "wx0000000000000003"),
    ] {
        app.create_order(no, 500).await;
        let mut s = sandbox('A');
        s.appid = appid.into();
        assert_eq!(pay(&app, &paid(&app, &s, no, 500)).await.0, 204, "{appid}");
        assert_eq!(app.status_of(no).await, "PAID", "{appid}");
    }
    // An appid of another merchant is still a mismatch.
    app.create_order("W-APP2", 500).await;
    let mut s = sandbox('A');
    s.appid = "wx0000000000000002".into();
    assert_eq!(pay(&app, &paid(&app, &s, "W-APP2", 500)).await.0, 204);
    assert_eq!(app.status_of("W-APP2").await, "WAIT_PAY");
    assert_eq!(app.messages("PAYMENT_ANOMALY").await, 1);
}

/// Merchant A is paid; merchant B takes a second payment for the same `out_trade_no`, and
/// refunds it. The order stays paid by A, and each of B's notices is recorded exactly once.
async fn a_second_merchants_payment_and_its_refund_leave_the_order_paid(backend: Backend) {
    let app = app(backend).await;
    paid_order(&app, "W-2M", 10000).await;
    let (a, b) = (sandbox('A'), sandbox('B'));

    let second = |at: i64| {
        let plaintext = wechat::transaction(&b, "W-2M", "43W-2M", 10000);
        b.notification("TRANSACTION.SUCCESS", &plaintext, at)
            .expect("forge")
    };
    assert_eq!(pay(&app, &second(now(&app))).await.0, 204, "acknowledged");
    // WeChat's retry: re-encrypted and re-signed, the same payment.
    assert_eq!(pay(&app, &second(now(&app) - 10)).await.0, 204, "retry");
    let order = app.get_order("W-2M").await;
    assert_eq!(
        (order["status"].as_str(), order["transaction_id"].as_str()),
        (Some("PAID"), Some("42W-2M"))
    );
    assert_eq!(
        app.anomalies("W-2M").await,
        [(
            "DUPLICATE_PAYMENT".to_owned(),
            "W-2M:wechat:43W-2M".to_owned()
        )]
    );

    // B refunds its own payment: A's payment still stands.
    let refund_b = || {
        let plaintext = wechat::refund(&b, "W-2M", "43W-2M", "RB-1", 10000, 10000);
        b.notification("REFUND.SUCCESS", &plaintext, now(&app))
            .expect("forge")
    };
    for _ in 0..2 {
        assert_eq!(
            send(&app, "/notify/wechat/refund", &refund_b()).await.0,
            204
        );
    }
    assert_eq!(app.refund_state("W-2M").await, ("PAID".into(), 0));
    assert_eq!(
        app.anomalies("W-2M").await,
        [
            (
                "DUPLICATE_PAYMENT".to_owned(),
                "W-2M:wechat:43W-2M".to_owned()
            ),
            (
                "OTHER_PAYMENT_REFUNDED".to_owned(),
                "W-2M:wechat:RB-1".to_owned()
            ),
        ]
    );
    assert_eq!(app.messages("ORDER_REFUNDED").await, 0);

    // The refund of the order's own payment moves it.
    let plaintext = wechat::refund(&a, "W-2M", "42W-2M", "RA-1", 10000, 10000);
    let refund_a = a
        .notification("REFUND.SUCCESS", &plaintext, now(&app))
        .expect("forge");
    assert_eq!(send(&app, "/notify/wechat/refund", &refund_a).await.0, 204);
    assert_eq!(app.refund_state("W-2M").await, ("REFUNDED".into(), 10000));
    assert_eq!(app.messages("ORDER_REFUNDED").await, 1);
}

// The refusals below never reach the ledger, so one backend is enough.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_not_signed_are_refused() {
    let app = app(Backend::Sqlite).await;
    app.create_order("W-X", 19900).await;
    let s = sandbox('A');
    let good = paid(&app, &s, "W-X", 19900);

    let mut one_byte = good.clone();
    let at = one_byte
        .body
        .iter()
        .position(|b| *b == b'T')
        .expect("a T in the body");
    one_byte.body[at] = b'X';
    assert_refused(&app, &one_byte, 401).await;

    // The same JSON re-serialised with other whitespace: the raw bytes are what is signed.
    let mut pretty = good.clone();
    let value: Value = serde_json::from_slice(&good.body).expect("json");
    pretty.body = serde_json::to_vec_pretty(&value).expect("json");
    assert_refused(&app, &pretty, 401).await;

    let mut other_key = good.clone();
    let forged = Sandbox {
        private_key: rsa_key("wechat-b"),
        ..sandbox('A')
    }
    .sign(now(&app), good.body.clone())
    .expect("sign");
    other_key.set_header(
        "Wechatpay-Signature",
        forged.header("Wechatpay-Signature").expect("sig"),
    );
    other_key.set_header(
        "Wechatpay-Nonce",
        forged.header("Wechatpay-Nonce").expect("nonce"),
    );
    assert_refused(&app, &other_key, 401).await;

    let mut probe = good.clone();
    let real = good.header("Wechatpay-Signature").expect("sig").to_owned();
    probe.set_header("Wechatpay-Signature", format!("WECHATPAY/SIGNTEST/{real}"));
    assert_refused(&app, &probe, 401).await;

    let mut garbage = good.clone();
    garbage.set_header("Wechatpay-Signature", "%%% not base64 %%%");
    assert_refused(&app, &garbage, 401).await;

    let mut unknown = good.clone();
    unknown.set_header(
        "Wechatpay-Serial",
        "PUB_KEY_ID_0000000000000000000000000000000Z",
    );
    assert_refused(&app, &unknown, 401).await;

    // And the untouched notification still goes through.
    assert_eq!(pay(&app, &good).await.0, 204);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timestamp_window_is_300_seconds_either_way() {
    let app = app(Backend::Sqlite).await;
    let s = sandbox('A');
    let at = |offset: i64, no: &str| {
        s.notification(
            "TRANSACTION.SUCCESS",
            &wechat::transaction(&s, no, "42", 100),
            now(&app) + offset,
        )
        .expect("forge")
    };
    for offset in [301, -301, 3600] {
        assert_refused(&app, &at(offset, "W-T0"), 401).await;
    }
    for (offset, no) in [(299, "W-T1"), (-299, "W-T2"), (0, "W-T3")] {
        app.create_order(no, 100).await;
        assert_eq!(pay(&app, &at(offset, no)).await.0, 204, "{offset}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_our_key_cannot_open_is_500_so_wechat_retries() {
    let app = app(Backend::Sqlite).await;
    app.create_order("W-D", 100).await;
    let s = sandbox('A');
    let plaintext = wechat::transaction(&s, "W-D", "42", 100).to_string();
    let signed = |ciphertext: String, aad: &str| {
        let body = wechat::envelope(
            "TRANSACTION.SUCCESS",
            "transaction",
            &ciphertext,
            aad,
            "abcdefghijkl",
        );
        s.sign(now(&app), body.into_bytes()).expect("sign")
    };
    let wrong_key = wechat::encrypt(
        APIV3_B.as_bytes(),
        "abcdefghijkl",
        "transaction",
        plaintext.as_bytes(),
    )
    .expect("enc");
    assert_refused(&app, &signed(wrong_key, "transaction"), 500).await;

    let right = wechat::encrypt(
        APIV3_A.as_bytes(),
        "abcdefghijkl",
        "transaction",
        plaintext.as_bytes(),
    )
    .expect("enc");
    assert_refused(&app, &signed(right.clone(), "refund"), 500).await;

    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut truncated = b64.decode(&right).expect("b64");
    truncated.truncate(truncated.len() - 4);
    assert_refused(&app, &signed(b64.encode(truncated), "transaction"), 500).await;

    assert_eq!(
        pay(&app, &signed(right, "transaction")).await.0,
        204,
        "the intact one opens"
    );
    let metrics = crate::support::helpers::metric(
        &app,
        "paynotify_notify_rejections_total",
        &["wechat", "undecryptable"],
    );
    assert_eq!(metrics, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_400() {
    let app = app(Backend::Sqlite).await;
    app.create_order("W-H", 100).await;
    let s = sandbox('A');
    let good = paid(&app, &s, "W-H", 100);
    for header in [
        "Wechatpay-Timestamp",
        "Wechatpay-Nonce",
        "Wechatpay-Signature",
        "Wechatpay-Serial",
    ] {
        let mut missing = good.clone();
        missing.remove_header(header);
        // No signature is a bad signature; any other missing header is a bad request.
        let status = if header == "Wechatpay-Signature" {
            401
        } else {
            400
        };
        assert_refused(&app, &missing, status).await;
        let mut twice = good.clone();
        twice.headers.push((
            header.to_owned(),
            good.header(header).expect("header").to_owned(),
        ));
        assert_refused(&app, &twice, 400).await;
    }
    let mut sm2 = good.clone();
    sm2.set_header("Wechatpay-Signature-Type", "WECHATPAY2-SM2-WITH-SM3");
    assert_refused(&app, &sm2, 400).await;
    let mut no_type = good.clone();
    no_type.remove_header("Wechatpay-Signature-Type");
    assert_eq!(pay(&app, &no_type).await.0, 204, "an absent type means RSA");

    // Signed by WeChat but missing a required field.
    let mut plaintext = wechat::transaction(&s, "W-H", "42", 100);
    plaintext
        .as_object_mut()
        .expect("object")
        .remove("out_trade_no");
    let d = s
        .notification("TRANSACTION.SUCCESS", &plaintext, now(&app))
        .expect("forge");
    let (status, _) = pay(&app, &d).await;
    assert_eq!(status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_body_is_413() {
    let app = spawn_app_with(Backend::Sqlite, |s| {
        s.wechat = settings();
        s.server.max_body_bytes = 2048;
    })
    .await;
    let s = sandbox('A');
    let mut plaintext = wechat::transaction(&s, "W-BIG", "42", 100);
    plaintext["attach"] = "x".repeat(4096).into();
    let d = s
        .notification("TRANSACTION.SUCCESS", &plaintext, now(&app))
        .expect("forge");
    assert_refused(&app, &d, 413).await;
}

/// A signed notification posted to the other kind's route is refused in WeChat's failure
/// shape, counted, and writes nothing; the same notification on its own route applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_route_takes_only_its_own_event_types() {
    let app = app(Backend::Sqlite).await;
    app.create_order("W-WR", 10000).await;
    let s = sandbox('A');
    let payment = paid(&app, &s, "W-WR", 10000);
    let refund = s
        .notification(
            "REFUND.SUCCESS",
            &wechat::refund(&s, "W-WR", "42W-WR", "R-WR", 10000, 10000),
            now(&app),
        )
        .expect("forge");
    let wrong = |app: &TestApp| {
        crate::support::helpers::metric(
            app,
            "paynotify_notify_rejections_total",
            &["wechat", "wrong_event_type"],
        )
    };
    let refused = |route: &str, d: &Delivery, kind: &str| {
        let (app, d, route, kind) = (&app, d.clone(), route.to_owned(), kind.to_owned());
        async move {
            let (status, body) = send(app, &route, &d).await;
            assert_eq!(status, 400, "{route}: {body}");
            let body: Value = serde_json::from_str(&body).expect("FAIL body is JSON");
            assert_eq!(body["code"], "FAIL", "{body}");
            let message = body["message"].as_str().expect("message");
            assert!(
                message.starts_with(&format!("wrong event type: event_type {kind}")),
                "{message}"
            );
            assert!(message.contains(&format!("came to {route}")), "{message}");
        }
    };

    refused("/notify/wechat/refund", &payment, "TRANSACTION.SUCCESS").await;
    assert_eq!(app.status_of("W-WR").await, "WAIT_PAY");
    assert_eq!(app.db.count("pay_callback").await, 0);
    assert_eq!(app.db.count("local_message").await, 0);
    assert_eq!(wrong(&app), 1);

    assert_eq!(pay(&app, &payment).await, (204, String::new()));
    assert_eq!(app.status_of("W-WR").await, "PAID");
    let messages = app.db.count("local_message").await;

    refused("/notify/wechat/pay", &refund, "REFUND.SUCCESS").await;
    assert_eq!(app.refund_state("W-WR").await, ("PAID".into(), 0));
    assert_eq!(app.db.count("refund_callback").await, 0);
    assert_eq!(app.db.count("local_message").await, messages);
    assert_eq!(wrong(&app), 2);

    assert_eq!(
        send(&app, "/notify/wechat/refund", &refund).await,
        (204, String::new())
    );
    assert_eq!(app.refund_state("W-WR").await, ("REFUNDED".into(), 10000));
    assert_eq!(wrong(&app), 2, "only the misrouted ones are counted");

    // An event of no kind this service knows is acknowledged on either route, changing
    // nothing.
    for route in ["/notify/wechat/pay", "/notify/wechat/refund"] {
        let other = s
            .notification(
                "COUPON.USE",
                &serde_json::json!({ "stock_id": "9856000" }),
                now(&app),
            )
            .expect("forge");
        assert_eq!(
            send(&app, route, &other).await,
            (204, String::new()),
            "{route}"
        );
    }
    assert_eq!(wrong(&app), 2);

    // A transfer's notification belongs to the transfer route alone.
    let before = app.db.count("local_message").await;
    let transfer = s
        .notification(
            "MCHTRANSFER.BILL.FINISHED",
            &wechat::transfer(&s, "TWR1", "1330TWR1", "SUCCESS", 100, None),
            now(&app),
        )
        .expect("forge");
    for route in ["/notify/wechat/pay", "/notify/wechat/refund"] {
        refused(route, &transfer, "MCHTRANSFER.BILL.FINISHED").await;
    }
    assert_eq!(app.db.count("local_message").await, before);
    assert_eq!(wrong(&app), 4);
}
