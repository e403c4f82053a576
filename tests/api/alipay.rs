//! Alipay notifications end to end over HTTP, signed with keys made for the test run and
//! encoded exactly as Alipay encodes them (`paynotify::qa::forge::alipay`).

use std::sync::Arc;

use paynotify::channel::alipay::{AlipayApp, AlipaySettings};
use paynotify::notice::Outcome;
use paynotify::qa::forge::Delivery;
use paynotify::qa::forge::alipay::{self, Sandbox, encode_form, sign_content, yuan};

use crate::support::helpers::{
    Backend, TestApp, post_delivery, released_together, spawn_app_with, wechat_paid,
};
use crate::support::keys::{certificate, public_key_path, rsa_key};
use crate::support::provider::FakeProvider;

pub(crate) const APP: &str = "2021000000000001";
const SELLER: &str = "2088000000000001";
pub(crate) const CERT_APP: &str = "2021000000000002";
const CERT_SELLER: &str = "2088000000000002";

pub(crate) type Fields = Vec<(String, String)>;

pub(crate) fn settings() -> AlipaySettings {
    rsa_key("alipay");
    AlipaySettings {
        apps: vec![
            AlipayApp {
                app_private_key_file: None,
                gateway: None,
                app_id: APP.into(),
                seller_id: SELLER.into(),
                alipay_public_key_file: Some(public_key_path("alipay")),
                alipay_cert_file: None,
                app_cert_file: None,
                alipay_root_cert_file: None,
            },
            AlipayApp {
                app_private_key_file: None,
                gateway: None,
                app_id: CERT_APP.into(),
                seller_id: CERT_SELLER.into(),
                alipay_public_key_file: None,
                alipay_cert_file: Some(certificate("alipay-cert", "0A1B2C3D").1),
                app_cert_file: None,
                alipay_root_cert_file: None,
            },
        ],
        // The stand-in gateway serves its bill files itself (support/alipay_bill.rs).
        bill_hosts: vec!["127.0.0.1".into()],
    }
}

pub(crate) fn sandbox() -> Sandbox {
    Sandbox {
        app_id: APP.into(),
        seller_id: SELLER.into(),
        private_key: rsa_key("alipay"),
    }
}

async fn app(backend: Backend) -> TestApp {
    spawn_app_with(backend, |s| s.alipay = settings()).await
}

pub(crate) fn set(fields: &mut Fields, key: &str, value: &str) {
    match fields.iter_mut().find(|(k, _)| k == key) {
        Some(field) => field.1 = value.to_owned(),
        None => fields.push((key.to_owned(), value.to_owned())),
    }
}

pub(crate) fn signed(fields: Fields) -> Delivery {
    sandbox().notification(fields, false).expect("forge")
}

pub(crate) fn pay_fields(order_no: &str, fen: i64, status: &str) -> Fields {
    alipay::payment(
        &sandbox(),
        order_no,
        &format!("2026{order_no}"),
        fen,
        status,
    )
}

pub(crate) async fn send(app: &TestApp, d: &Delivery) -> (u16, String) {
    post_delivery(app, "/notify/alipay", d).await
}

fn ok() -> (u16, String) {
    (200, "success".to_owned())
}

/// Creates `order_no` and pays it with a `TRADE_SUCCESS` notification.
async fn paid_order(app: &TestApp, order_no: &str, fen: i64) {
    app.create_order(order_no, fen).await;
    let d = signed(pay_fields(order_no, fen, "TRADE_SUCCESS"));
    assert_eq!(send(app, &d).await, ok(), "{order_no}");
}

/// Refused in Alipay's shape (`fail`), nothing written.
async fn assert_refused(app: &TestApp, d: &Delivery, status: u16) {
    assert_eq!(send(app, d).await, (status, "fail".to_owned()));
    assert_eq!(app.db.count("pay_callback").await, 0);
    assert_eq!(app.db.count("local_message").await, 0);
}

crate::on_every_backend!(
    a_valid_payment_marks_the_order_paid,
    twenty_concurrent_identical_deliveries_make_one_transition,
    trade_finished_after_trade_success_is_the_same_payment,
    partial_refund_twice_then_the_rest,
    a_full_refund_comes_as_trade_closed,
    an_unpaid_trade_closed_by_alipay_is_recorded_and_the_order_stays_payable,
    wechat_and_alipay_both_paying_is_a_duplicate_payment,
    wrong_seller_or_amount_are_anomalies_and_the_order_stays_unpaid,
    partial_refunds_out_of_order_each_get_an_event_and_count_once,
    two_orders_may_use_the_same_refund_number,
    a_refund_through_the_channel_that_did_not_pay_is_an_anomaly,
);

/// The `ORDER_REFUNDED` events, sorted by key, are `expected`: `(biz_key, refund_fen)`.
async fn assert_refund_events(app: &TestApp, expected: &[(&str, Option<i64>)]) {
    let mut events: Vec<_> = app
        .outbox("ORDER_REFUNDED")
        .await
        .into_iter()
        .map(|m| (m.biz_key, m.payload.0["refund_fen"].as_i64()))
        .collect();
    events.sort();
    let expected: Vec<_> = expected
        .iter()
        .map(|(key, fen)| ((*key).to_owned(), *fen))
        .collect();
    assert_eq!(events, expected);
}

async fn partial_refunds_out_of_order_each_get_an_event_and_count_once(backend: Backend) {
    let app = app(backend).await;
    paid_order(&app, "A-OO", 10000).await;
    let s = sandbox();
    // Refund A (50.00, total 50.00) and then B (30.00, total 80.00); B's notice arrives first.
    let b = signed(alipay::refund(&s, "A-OO", "2026A-OO", 10000, "RF-B", 8000));
    let a = signed(alipay::refund(&s, "A-OO", "2026A-OO", 10000, "RF-A", 5000));
    assert_eq!(send(&app, &b).await, ok());
    assert_eq!(send(&app, &a).await, ok());
    assert_eq!(send(&app, &a).await, ok(), "repeat");
    assert_eq!(app.refund_state("A-OO").await, ("PAID".into(), 8000));
    assert_refund_events(&app, &[("A-OO:RF-A", Some(0)), ("A-OO:RF-B", Some(8000))]).await;
}

async fn two_orders_may_use_the_same_refund_number(backend: Backend) {
    let app = app(backend).await;
    let s = sandbox();
    for no in ["A-N1", "A-N2"] {
        paid_order(&app, no, 1000).await;
        // Alipay's out_request_no only has to be unique within one trade.
        let refund = signed(alipay::refund(&s, no, &format!("2026{no}"), 1000, "1", 400));
        assert_eq!(send(&app, &refund).await, ok(), "{no}");
        assert_eq!(app.get_order(no).await["refunded_fen"], 400, "{no}");
    }
    assert_refund_events(&app, &[("A-N1:1", Some(400)), ("A-N2:1", Some(400))]).await;
}

async fn a_refund_through_the_channel_that_did_not_pay_is_an_anomaly(backend: Backend) {
    let app = app(backend).await;
    app.create_and_apply(&wechat_paid("A-XC", "4200000001", 1000))
        .await;
    // Alipay was paid too (an anomaly), and that second payment is refunded in full.
    send(&app, &signed(pay_fields("A-XC", 1000, "TRADE_SUCCESS"))).await;
    let refund = signed(alipay::refund(
        &sandbox(),
        "A-XC",
        "2026A-XC",
        1000,
        "RF-X",
        1000,
    ));
    assert_eq!(send(&app, &refund).await, ok());
    assert_eq!(app.refund_state("A-XC").await, ("PAID".into(), 0));
    let reasons: Vec<String> = app
        .outbox("PAYMENT_ANOMALY")
        .await
        .into_iter()
        .map(|m| {
            m.payload.0["reason"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(
        reasons,
        ["OTHER_PAYMENT_REFUNDED", "DUPLICATE_PAYMENT"],
        "newest first: the refund of the second payment, then that payment"
    );
}

async fn a_valid_payment_marks_the_order_paid(backend: Backend) {
    let app = app(backend).await;
    app.create_order("A-1", 19900).await;
    let d = signed(pay_fields("A-1", 19900, "TRADE_SUCCESS"));
    let body = String::from_utf8(d.body.clone()).expect("ascii form");
    // The subject has Chinese, `+`, `&`, `=` and spaces, all encoded once.
    assert!(
        body.contains("subject=%E6%B2%99%E7%AE%B1%E8%AE%A2%E5%8D%95+A%2BB+%26+C%3DD"),
        "{body}"
    );
    assert_eq!(send(&app, &d).await, ok());
    let order = app.get_order("A-1").await;
    assert_eq!(
        (order["status"].as_str(), order["channel"].as_str()),
        (Some("PAID"), Some("alipay"))
    );
    assert_eq!(order["transaction_id"], "2026A-1");
    assert_eq!(app.messages("ORDER_PAID").await, 1);
}

async fn twenty_concurrent_identical_deliveries_make_one_transition(backend: Backend) {
    let app = Arc::new(app(backend).await);
    app.create_order("A-20", 990).await;
    let d = signed(pay_fields("A-20", 990, "TRADE_SUCCESS"));
    let answers = released_together(20, |_| {
        let (app, d) = (app.clone(), d.clone());
        async move { send(&app, &d).await }
    })
    .await;
    for answer in answers {
        assert_eq!(answer, ok());
    }
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    assert_eq!(app.db.count("pay_callback").await, 1);
}

async fn trade_finished_after_trade_success_is_the_same_payment(backend: Backend) {
    let app = app(backend).await;
    paid_order(&app, "A-F", 5880).await;
    let mut finished = pay_fields("A-F", 5880, "TRADE_FINISHED");
    set(&mut finished, "notify_time", "2027-02-28 10:00:00");
    set(&mut finished, "notify_id", "another-notify-id");
    assert_eq!(send(&app, &signed(finished)).await, ok());
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    assert_eq!(
        app.db.count("local_message").await,
        1,
        "no anomaly, no conflict"
    );
    // A first-ever TRADE_FINISHED pays an order by itself.
    app.create_order("A-F2", 100).await;
    assert_eq!(
        send(&app, &signed(pay_fields("A-F2", 100, "TRADE_FINISHED"))).await,
        ok()
    );
    assert_eq!(app.status_of("A-F2").await, "PAID");
}

async fn partial_refund_twice_then_the_rest(backend: Backend) {
    let app = app(backend).await;
    paid_order(&app, "A-R", 19900).await;
    let s = sandbox();
    let first = signed(alipay::refund(&s, "A-R", "2026A-R", 19900, "RF-1", 5000));
    assert_eq!(send(&app, &first).await, ok());
    assert_eq!(send(&app, &first).await, ok(), "the same refund again");
    assert_eq!(app.refund_state("A-R").await, ("PAID".into(), 5000));
    // refund_fee is Alipay's running total: 19900 after the second refund of 14900.
    let rest = signed(alipay::refund(&s, "A-R", "2026A-R", 19900, "RF-2", 19900));
    assert_eq!(send(&app, &rest).await, ok());
    assert_eq!(app.refund_state("A-R").await, ("REFUNDED".into(), 19900));
    let refunds: Vec<_> = app
        .outbox("ORDER_REFUNDED")
        .await
        .into_iter()
        .map(|m| (m.biz_key, m.payload.0["refund_fen"].as_i64()))
        .collect();
    assert_eq!(
        refunds,
        [
            ("A-R:RF-2".to_owned(), Some(14900)),
            ("A-R:RF-1".to_owned(), Some(5000))
        ]
    );
    let recorded = app.store.callbacks_of("A-R").await.expect("callbacks");
    let mut amounts: Vec<_> = recorded
        .refunds
        .iter()
        .map(|r| (r.out_refund_no.as_str(), r.refund_fen))
        .collect();
    amounts.sort();
    assert_eq!(amounts, [("RF-1", 5000), ("RF-2", 14900)]);
}

async fn a_full_refund_comes_as_trade_closed(backend: Backend) {
    let app = app(backend).await;
    paid_order(&app, "A-FR", 12800).await;
    let full = signed(alipay::refund(
        &sandbox(),
        "A-FR",
        "2026A-FR",
        12800,
        "RF-ALL",
        12800,
    ));
    assert!(String::from_utf8_lossy(&full.body).contains("trade_status=TRADE_CLOSED"));
    assert_eq!(send(&app, &full).await, ok());
    assert_eq!(app.refund_state("A-FR").await, ("REFUNDED".into(), 12800));
}

async fn an_unpaid_trade_closed_by_alipay_is_recorded_and_the_order_stays_payable(
    backend: Backend,
) {
    let app = app(backend).await;
    app.create_order("A-C", 6660).await;
    let mut closed = pay_fields("A-C", 6660, "TRADE_CLOSED");
    closed.retain(|(k, _)| k != "gmt_payment");
    set(&mut closed, "gmt_close", "2026-11-30 10:30:00");
    assert_eq!(send(&app, &signed(closed.clone())).await, ok());
    assert_eq!(send(&app, &signed(closed)).await, ok(), "repeat");
    assert_eq!(app.status_of("A-C").await, "WAIT_PAY");
    assert_eq!(app.messages("ORDER_CLOSED").await, 0);
    // Recorded once, and visible to operators.
    let callbacks: serde_json::Value = app
        .client
        .get(app.url("/admin/callbacks?order_no=A-C"))
        .bearer_auth(&app.api_token)
        .send()
        .await
        .expect("callbacks")
        .json()
        .await
        .expect("json");
    let statuses = callbacks["statuses"].as_array().expect("statuses");
    assert_eq!(statuses.len(), 1, "{callbacks}");
    assert_eq!(statuses[0]["status"], "CLOSED");
    assert_eq!(statuses[0]["channel"], "alipay");
    // The buyer pays the same order by WeChat.
    let wechat = wechat_paid("A-C", "4200000009", 6660);
    assert_eq!(app.apply(&wechat).await, Outcome::Applied);
    assert_eq!(app.status_of("A-C").await, "PAID");
    // WAIT_BUYER_PAY is acknowledged and changes nothing.
    app.create_order("A-W", 100).await;
    assert_eq!(
        send(&app, &signed(pay_fields("A-W", 100, "WAIT_BUYER_PAY"))).await,
        ok()
    );
    assert_eq!(app.status_of("A-W").await, "WAIT_PAY");
}

async fn wechat_and_alipay_both_paying_is_a_duplicate_payment(backend: Backend) {
    let app = app(backend).await;
    app.create_and_apply(&wechat_paid("A-2C", "4200000000", 19900))
        .await;
    assert_eq!(
        send(&app, &signed(pay_fields("A-2C", 19900, "TRADE_SUCCESS"))).await,
        ok()
    );
    let order = app.get_order("A-2C").await;
    assert_eq!(order["channel"], "wechat");
    let anomaly = app.outbox("PAYMENT_ANOMALY").await;
    let anomaly = anomaly.first().expect("an anomaly");
    assert_eq!(anomaly.payload.0["reason"], "DUPLICATE_PAYMENT");
    assert_eq!(anomaly.biz_key, "A-2C:alipay:2026A-2C");
}

async fn wrong_seller_or_amount_are_anomalies_and_the_order_stays_unpaid(backend: Backend) {
    let app = app(backend).await;
    app.create_order("A-S", 19900).await;
    let mut other_seller = pay_fields("A-S", 19900, "TRADE_SUCCESS");
    set(&mut other_seller, "seller_id", "2088999999999999");
    assert_eq!(send(&app, &signed(other_seller)).await, ok());
    assert_eq!(app.status_of("A-S").await, "WAIT_PAY");

    app.create_order("A-AM", 19900).await;
    assert_eq!(
        send(&app, &signed(pay_fields("A-AM", 19800, "TRADE_SUCCESS"))).await,
        ok()
    );
    assert_eq!(app.status_of("A-AM").await, "WAIT_PAY");
    assert_eq!(app.messages("PAYMENT_ANOMALY").await, 2);
}

// Refusals and encodings; the ledger is not what is tested, so SQLite suffices.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn field_order_charset_and_content_type_do_not_matter() {
    let app = app(Backend::Sqlite).await;
    // Fields in another order.
    app.create_order("A-O", 100).await;
    let mut fields = pay_fields("A-O", 100, "TRADE_SUCCESS");
    fields.reverse();
    let d = signed(fields);
    let body = String::from_utf8_lossy(&d.body).to_string();
    assert!(
        body.contains("sign=")
            && (body.contains("%2B") || body.contains("%2F") || body.contains("%3D"))
    );
    assert_eq!(send(&app, &d).await, ok());

    // The Content-Type Alipay has been seen to send, and query parameters on the URL.
    app.create_order("A-Q", 100).await;
    let mut odd = signed(pay_fields("A-Q", 100, "TRADE_SUCCESS"));
    odd.set_header(
        "Content-Type",
        "application/x-www-form-urlencoded; text/html; charset=utf-8",
    );
    assert_eq!(
        post_delivery(
            &app,
            "/notify/alipay?s=api/pay&total_amount=1.00&sign=xyz",
            &odd
        )
        .await,
        ok()
    );
    assert_eq!(app.status_of("A-Q").await, "PAID");

    // A GBK body, signed over its GBK bytes.
    app.create_order("A-G", 100).await;
    let mut gbk = pay_fields("A-G", 100, "TRADE_SUCCESS");
    set(&mut gbk, "charset", "gbk");
    set(&mut gbk, "subject", "年货礼盒 A+B");
    let content = sign_content(&gbk, false);
    let (content, _, _) = encoding_rs::GBK.encode(&content);
    let sign = paynotify::qa::forge::rsa_sign(&rsa_key("alipay"), &content).expect("sign");
    let mut body = Vec::new();
    for (k, v) in gbk.iter().chain(
        [
            ("sign".to_owned(), sign),
            ("sign_type".to_owned(), "RSA2".to_owned()),
        ]
        .iter(),
    ) {
        let (bytes, _, _) = encoding_rs::GBK.encode(v);
        body.extend(format!("{k}=").bytes());
        body.extend(form_urlencoded::byte_serialize(&bytes).flat_map(str::bytes));
        body.push(b'&');
    }
    body.pop();
    let d = Delivery {
        headers: vec![(
            "Content-Type".into(),
            "application/x-www-form-urlencoded; charset=gbk".into(),
        )],
        body,
    };
    assert_eq!(send(&app, &d).await, ok());
    assert_eq!(app.status_of("A-G").await, "PAID");

    // Certificate mode: the key inside the Alipay public-key certificate.
    app.create_order("A-CERT", 100).await;
    let cert_app = Sandbox {
        app_id: CERT_APP.into(),
        seller_id: CERT_SELLER.into(),
        private_key: certificate("alipay-cert", "0A1B2C3D").0,
    };
    let fields = alipay::payment(&cert_app, "A-CERT", "2026A-CERT", 100, "TRADE_SUCCESS");
    assert_eq!(
        send(&app, &cert_app.notification(fields, false).expect("forge")).await,
        ok()
    );
    assert_eq!(app.status_of("A-CERT").await, "PAID");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_valued_field_verifies_under_either_signing_rule() {
    let app = app(Backend::Sqlite).await;
    for (no, keep_empty) in [("A-E1", false), ("A-E2", true)] {
        app.create_order(no, 100).await;
        let mut fields = pay_fields(no, 100, "TRADE_SUCCESS");
        set(&mut fields, "passback_params", "");
        let d = sandbox().notification(fields, keep_empty).expect("forge");
        assert!(String::from_utf8_lossy(&d.body).contains("passback_params=&"));
        assert_eq!(send(&app, &d).await, ok(), "keep_empty = {keep_empty}");
        assert_eq!(app.status_of(no).await, "PAID");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_or_foreign_notifications_are_401() {
    let app = app(Backend::Sqlite).await;
    app.create_order("A-X", 19900).await;
    let good = signed(pay_fields("A-X", 19900, "TRADE_SUCCESS"));

    let mut tampered = good.clone();
    let text = String::from_utf8(tampered.body).expect("ascii");
    tampered.body = text
        .replace("total_amount=199.00", "total_amount=1.99")
        .into_bytes();
    assert_refused(&app, &tampered, 401).await;

    let wrong_key = Sandbox {
        private_key: rsa_key("not-alipay"),
        ..sandbox()
    };
    assert_refused(
        &app,
        &wrong_key
            .notification(pay_fields("A-X", 19900, "TRADE_SUCCESS"), false)
            .expect("forge"),
        401,
    )
    .await;

    let stranger = Sandbox {
        app_id: "2021999999999999".into(),
        ..sandbox()
    };
    let fields = alipay::payment(&stranger, "A-X", "2026A-X", 19900, "TRADE_SUCCESS");
    assert_refused(
        &app,
        &stranger.notification(fields, false).expect("forge"),
        401,
    )
    .await;

    let mut unsigned = pay_fields("A-X", 19900, "TRADE_SUCCESS");
    unsigned.push(("sign_type".into(), "RSA2".into()));
    let d = Delivery {
        headers: good.headers.clone(),
        body: encode_form(&unsigned),
    };
    assert_refused(&app, &d, 401).await;

    // Decoding `+` twice would turn it into a space and break the signature: decoded once,
    // the good notification verifies.
    assert_eq!(send(&app, &good).await, ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_forms_and_bad_amounts_are_400() {
    let app = app(Backend::Sqlite).await;
    app.create_order("A-B", 19900).await;
    let mut twice = signed(pay_fields("A-B", 19900, "TRADE_SUCCESS"));
    twice.body.extend_from_slice(b"&out_trade_no=A-OTHER");
    assert_refused(&app, &twice, 400).await;

    for amount in [
        "199.001",
        "1e2",
        "-1.00",
        " 199.00",
        "",
        "NaN",
        "99999999999999999999.00",
        "0.00",
    ] {
        let mut fields = pay_fields("A-B", 19900, "TRADE_SUCCESS");
        set(&mut fields, "total_amount", amount);
        assert_refused(&app, &signed(fields), 400).await;
    }
    let mut missing = pay_fields("A-B", 19900, "TRADE_SUCCESS");
    missing.retain(|(k, _)| k != "out_trade_no");
    assert_refused(&app, &signed(missing), 400).await;
    // A refund without out_biz_no has no key to deduplicate on.
    let mut keyless = alipay::refund(&sandbox(), "A-B", "2026A-B", 19900, "RF", 100);
    keyless.retain(|(k, _)| k != "out_biz_no");
    assert_refused(&app, &signed(keyless), 400).await;
    assert_eq!(app.status_of("A-B").await, "WAIT_PAY");
    assert_eq!(yuan(19900), "199.00");
}

/// `sign_type` is not signed, so its absence weakens nothing: the signature is always
/// checked as RSA2 (SHA256withRSA). A value other than exactly `RSA2` — the legacy `RSA`
/// (SHA1), another case, a truncated or padded value — is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_sign_type_means_rsa2_and_any_other_value_is_400() {
    let app = app(Backend::Sqlite).await;
    app.create_order("A-ST", 19900).await;
    let good = signed(pay_fields("A-ST", 19900, "TRADE_SUCCESS"));
    let body = String::from_utf8(good.body.clone()).expect("form body");
    let fields: Vec<&str> = body.split('&').collect();
    assert!(fields.contains(&"sign_type=RSA2"), "{body}");
    let rebuilt = |sign_type: Option<&str>| Delivery {
        headers: good.headers.clone(),
        body: fields
            .iter()
            .filter_map(|f| match (f.starts_with("sign_type="), sign_type) {
                (false, _) => Some((*f).to_owned()),
                (true, Some(value)) => Some(format!("sign_type={value}")),
                (true, None) => None,
            })
            .collect::<Vec<_>>()
            .join("&")
            .into_bytes(),
    };
    let with_sign_type = |value: &str| rebuilt(Some(value));
    for other in ["RSA", "rsa2", "RSA2+", "RSA25", "R", ""] {
        assert_refused(&app, &with_sign_type(other), 400).await;
    }
    assert_eq!(app.status_of("A-ST").await, "WAIT_PAY");

    let without = rebuilt(None);
    assert!(!String::from_utf8_lossy(&without.body).contains("sign_type"));
    assert_eq!(send(&app, &without).await, ok());
    assert_eq!(app.status_of("A-ST").await, "PAID");
}

/// The app's API key pair in certificate mode (the stand-in gateway checks requests with it).
const CERT_APP_KEY: &str = crate::support::provider::APP_KEY;

/// `f`'s issuer (RFC 2253) and decimal serial as the `openssl` command prints them, and the
/// MD5 of the two as python3's hashlib gives it: the SN computed without our code.
fn openssl_sn(f: &std::path::Path) -> (String, String) {
    use crate::support::keys::openssl;
    let f = f.to_str().expect("path");
    let issuer = openssl(&["x509", "-in", f, "-noout", "-issuer", "-nameopt", "RFC2253"]);
    let issuer = issuer
        .trim()
        .strip_prefix("issuer=")
        .expect("issuer=")
        .to_owned();
    let serial = openssl(&["x509", "-in", f, "-noout", "-serial"]);
    let serial = serial
        .trim()
        .strip_prefix("serial=")
        .expect("serial=")
        .to_owned();
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import hashlib,sys; print(hashlib.md5((sys.argv[1] + str(int(sys.argv[2], 16))).encode()).hexdigest())",
            &issuer,
            &serial,
        ])
        .output()
        .expect("python3 is needed to compute the expected SN");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        issuer,
        String::from_utf8(out.stdout)
            .expect("utf-8")
            .trim()
            .to_owned(),
    )
}

/// alipay-sdk-java-all's `getCertSN` / `getRootCertSN` on a chain in Alipay's format: MD5 of
/// the issuer (RFC 2253, RDNs reversed) and the serial in decimal; the root SN joins the RSA
/// roots' SNs with `_` in file order and leaves the EC root out.
#[test]
fn alipay_cert_sns_are_the_sdks_md5_of_issuer_and_decimal_serial() {
    use paynotify::channel::alipay::cert_sn::{alipay_cert_sn, alipay_root_cert_sn};
    use paynotify::channel::keys::certificates_file;

    let certs = crate::support::keys::alipay_certs(CERT_APP_KEY);
    let app = certificates_file("test", &certs.app_cert).expect("app certificate");
    assert_eq!(app.len(), 1);
    let (issuer, expected_app) = openssl_sn(&certs.app_cert);
    assert_eq!(
        issuer,
        "CN=Paynotify Test Root R1,OU=Certification Authority,O=Paynotify Test,C=CN"
    );
    // The 19-byte serial has its high bit set: DER stores a leading zero, Java's BigInteger
    // (and ours) reads it unsigned.
    let serial = app[0].tbs_certificate().serial_number().as_bytes();
    assert_eq!(serial.len(), 20);
    assert_eq!((serial[0], serial[1]), (0x00, 0x9F));
    assert_eq!(alipay_cert_sn(&app[0]), expected_app);
    // x509-cert's own Display writes this issuer the same way (RFC 4514 order).
    assert_eq!(app[0].tbs_certificate().issuer().to_string(), issuer);

    let roots = certificates_file("test", &certs.root).expect("root file");
    assert_eq!(roots.len(), 3);
    let [r1, _ec, r2] = &certs.roots;
    let expected_root = format!("{}_{}", openssl_sn(r1).1, openssl_sn(r2).1);
    assert_eq!(alipay_root_cert_sn(&roots), expected_root);
    // Each RSA root's SN is its own certificate's.
    assert_eq!(alipay_cert_sn(&roots[0]), openssl_sn(r1).1);
    assert_eq!(alipay_cert_sn(&roots[2]), openssl_sn(r2).1);
    let other = certificates_file("test", &certs.other_root).expect("other root file");
    assert_eq!(alipay_root_cert_sn(&other), openssl_sn(r2).1);
}

/// The stand-in gateway for the certificate-mode app, checking both SNs.
pub(crate) async fn cert_gateway() -> FakeProvider {
    let platform = crate::wechat::sandbox('A');
    let fake = FakeProvider::start(
        (
            &platform.mchid,
            &platform.appid,
            &platform.serial,
            platform.private_key,
        ),
        (CERT_APP, "alipay"),
    )
    .await;
    let (_, app_sn) = openssl_sn(&crate::support::keys::alipay_certs(CERT_APP_KEY).app_cert);
    let certs = crate::support::keys::alipay_certs(CERT_APP_KEY);
    let [r1, _, r2] = &certs.roots;
    let root_sn = format!("{}_{}", openssl_sn(r1).1, openssl_sn(r2).1);
    fake.state.expect_cert_sn(&app_sn, &root_sn);
    fake
}

/// App 2021000000000002 in certificate mode with API credentials at `url`: answers are
/// verified with the key of its `alipay_cert_file` (the stand-in's Alipay key), requests carry
/// the SNs of `app_cert_file` and of `root`.
pub(crate) fn cert_mode(s: &mut paynotify::config::Settings, url: &str, root: &std::path::Path) {
    use crate::support::keys::{certificate_over, private_key_path};
    s.alipay = settings();
    let a = &mut s.alipay.apps[1];
    a.alipay_cert_file = Some(certificate_over("alipayCertPublicKey_RSA2", "alipay"));
    a.app_private_key_file = Some(private_key_path(CERT_APP_KEY));
    a.app_cert_file = Some(
        crate::support::keys::alipay_certs(CERT_APP_KEY)
            .app_cert
            .clone(),
    );
    a.alipay_root_cert_file = Some(root.to_path_buf());
    a.gateway = Some(format!("{url}/gateway.do"));
    s.provider_api.max_qps = 1000;
    s.provider_api.timeout_ms = 5000;
}

/// An order only the certificate-mode app is asked about.
async fn create_for_cert_app(app: &TestApp, order_no: &str, fen: i64) {
    let response = app
        .client
        .post(app.url("/orders"))
        .bearer_auth(&app.api_token)
        .json(&serde_json::json!({
            "order_no": order_no, "amount_fen": fen, "currency": "CNY", "alipay_app_id": CERT_APP
        }))
        .send()
        .await
        .expect("POST /orders");
    assert_eq!(response.status(), 201);
}

/// `POST /admin/orders/{no}/reconcile`: the order as it is after asking the provider.
async fn reconcile_order(app: &TestApp, order_no: &str) -> serde_json::Value {
    let response = app
        .client
        .post(app.url(&format!("/admin/orders/{order_no}/reconcile")))
        .bearer_auth(&app.api_token)
        .send()
        .await
        .expect("reconcile");
    assert_eq!(response.status(), 200);
    response.json().await.expect("json")
}

/// Certificate mode: query and close at the stand-in gateway, which refuses any request
/// without the app's and the root's SN, as Alipay's does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_mode_query_and_close_carry_both_cert_sns() {
    use crate::support::provider::Trade;
    use std::sync::atomic::Ordering;

    let fake = cert_gateway().await;
    let url = fake.url.clone();
    let root = crate::support::keys::alipay_certs(CERT_APP_KEY)
        .root
        .clone();
    let app = spawn_app_with(Backend::Sqlite, move |s| cert_mode(s, &url, &root)).await;
    create_for_cert_app(&app, "AC-PAID", 300).await;
    fake.state.set(
        "AC-PAID",
        Trade::Paid {
            transaction_id: "2026AC-PAID".into(),
            total: 300,
        },
    );
    let body = reconcile_order(&app, "AC-PAID").await;
    assert_eq!(body["status"], "PAID", "{body}");
    assert_eq!(app.messages("ORDER_PAID").await, 1);

    create_for_cert_app(&app, "AC-OPEN", 300).await;
    fake.state.set("AC-OPEN", Trade::NotPaid);
    app.clock.advance(1801);
    assert_eq!(app.expire_now().await, 1);
    assert_eq!(fake.state.trade("AC-OPEN"), Some(Trade::Closed));
    assert_eq!(app.status_of("AC-OPEN").await, "CLOSED");
    let calls: Vec<String> = fake.state.calls().into_iter().map(|(c, _)| c).collect();
    assert_eq!(calls[..2], ["alipay.trade.query", "alipay.trade.close"]);
    // Every request carried both SNs: none refused.
    assert_eq!(fake.state.refused.load(Ordering::SeqCst), 0);
    assert_eq!(fake.state.verified.load(Ordering::SeqCst), calls.len());
}

/// The same calls with another root file: the stand-in refuses them (`40002
/// isv.invalid-alipay-root-cert-sn`), nothing is applied, the order stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_mode_with_another_root_file_is_refused_by_the_gateway() {
    use crate::support::provider::Trade;
    use std::sync::atomic::Ordering;

    let fake = cert_gateway().await;
    let url = fake.url.clone();
    let root = crate::support::keys::alipay_certs(CERT_APP_KEY)
        .other_root
        .clone();
    let app = spawn_app_with(Backend::Sqlite, move |s| cert_mode(s, &url, &root)).await;
    create_for_cert_app(&app, "AC-WRONG", 300).await;
    fake.state.set(
        "AC-WRONG",
        Trade::Paid {
            transaction_id: "2026AC-WRONG".into(),
            total: 300,
        },
    );
    let body = reconcile_order(&app, "AC-WRONG").await;
    assert_eq!(body["status"], "WAIT_PAY", "{body}");
    assert!(
        body.to_string().contains("isv.invalid-alipay-root-cert-sn"),
        "{body}"
    );
    assert_eq!(app.status_of("AC-WRONG").await, "WAIT_PAY");
    assert_eq!(app.messages("ORDER_PAID").await, 0);
    assert_eq!(fake.state.refused.load(Ordering::SeqCst), 1);
    assert_eq!(fake.state.verified.load(Ordering::SeqCst), 0);
    assert!(fake.state.calls().is_empty());
}

/// Certificate-mode settings that cannot work stop start-up naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_mode_mistakes_stop_start_up_naming_the_key() {
    use paynotify::config::Settings;
    use paynotify::startup::{Application, Options};

    paynotify::telemetry::init_for_tests();
    let certs = crate::support::keys::alipay_certs(CERT_APP_KEY);
    let not_pem = tempfile::NamedTempFile::new().expect("file");
    std::fs::write(not_pem.path(), "not a certificate").expect("write");
    let not_pem = not_pem.path().to_path_buf();
    let ec_only = certs.roots[1].clone();
    let start_up = async |change: &dyn Fn(&mut Settings), days_later: i64| {
        let db = crate::support::helpers::TestDb::create(Backend::Sqlite).await;
        let mut s = crate::support::helpers::test_settings(db.url());
        cert_mode(&mut s, "http://127.0.0.1:1", &certs.root);
        change(&mut s);
        let now = chrono::Utc::now() + chrono::Duration::days(days_later);
        let options = Options {
            clock: std::sync::Arc::new(paynotify::time::ManualClock::new(now)),
            ..Options::default()
        };
        match s.validate() {
            Err(e) => Err(e.to_string()),
            Ok(()) => Application::build(&s, options)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
        }
    };
    assert_eq!(start_up(&|_| {}, 0).await, Ok(()));
    type Mistake = Box<dyn Fn(&mut Settings)>;
    let cases: Vec<(&str, Mistake, i64)> = vec![
        (
            "alipay.apps[1].app_cert_file",
            Box::new(|s| s.alipay.apps[1].app_cert_file = None),
            0,
        ),
        (
            "alipay.apps[1].alipay_root_cert_file",
            Box::new(|s| s.alipay.apps[1].alipay_root_cert_file = None),
            0,
        ),
        (
            "alipay.apps[0].app_cert_file",
            Box::new(|s| s.alipay.apps[0].app_cert_file = Some(certs.app_cert.clone())),
            0,
        ),
        (
            "alipay.apps[0].alipay_root_cert_file",
            Box::new(|s| s.alipay.apps[0].alipay_root_cert_file = Some(certs.root.clone())),
            0,
        ),
        (
            "alipay.apps[1].app_cert_file",
            Box::new(move |s| s.alipay.apps[1].app_private_key_file = None),
            0,
        ),
        (
            "alipay.apps[1].app_cert_file",
            Box::new({
                let p = not_pem.clone();
                move |s| s.alipay.apps[1].app_cert_file = Some(p.clone())
            }),
            0,
        ),
        (
            "alipay.apps[1].alipay_root_cert_file",
            Box::new({
                let p = not_pem.clone();
                move |s| s.alipay.apps[1].alipay_root_cert_file = Some(p.clone())
            }),
            0,
        ),
        (
            "alipay.apps[1].alipay_root_cert_file",
            Box::new(move |s| s.alipay.apps[1].alipay_root_cert_file = Some(ec_only.clone())),
            0,
        ),
        // The app certificate is valid for 30 days.
        ("alipay.apps[1].app_cert_file", Box::new(|_| {}), 31),
    ];
    for (key, mistake, days_later) in cases {
        let Err(err) = start_up(&*mistake, days_later).await else {
            panic!("{key}: start-up went on");
        };
        assert!(err.contains(key), "{key}: {err}");
    }
}
