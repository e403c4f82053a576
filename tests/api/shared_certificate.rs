//! A platform certificate several WeChat merchants hold (certificate mode): its serial
//! names the key that verifies, and the merchant is the one whose APIv3 key opens the
//! resource — in the configuration file and through `/admin/merchants` alike. A serial that
//! names another public key for another merchant is refused, and so is a second holder of a
//! certificate with the same APIv3 key (a notification would open for both).

use paynotify::channel::wechat::PlatformKey;
use paynotify::config::{Secret, Settings};
use paynotify::qa::forge::Delivery;
use paynotify::qa::forge::wechat::Sandbox;
use paynotify::time::Clock;
use reqwest::Method;
use serde_json::{Value, json};

use crate::support::helpers::{Backend, TestApp, admin_json, post_delivery, spawn_app_with};
use crate::support::keys::{certificate, public_key_path, rsa_key};

crate::on_every_backend!(
    merchants_sharing_a_certificate_each_get_their_own_payments,
    an_account_added_with_a_shared_certificate_is_paid_as_itself,
);

const CERT_SERIAL: &str = "5157F09EFDC096DE15EBE81A47057A7232F1B8E1";
const A: &str = "1900000001";
const B: &str = "1900000002";
const APIV3_B: &str = "BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB2";
const MASTER_KEY: &str = "cGF5bm90aWZ5LXNoYXJlZC1jZXJ0aWZpY2F0ZS0zMmI=";

/// Merchants A and B of `crate::wechat::settings()`, B holding A's platform certificate too.
fn both_hold_the_certificate(s: &mut Settings) {
    s.wechat = crate::wechat::settings();
    s.wechat.merchants[1].platform_keys.push(PlatformKey {
        serial: None,
        public_key_file: None,
        certificate_file: Some(certificate("wechat-cert", CERT_SERIAL).1),
    });
}

/// The certificate's notification for merchant `mchid`, encrypted with `apiv3_key`.
fn under_certificate(mchid: &str, appid: &str, apiv3_key: &str) -> Sandbox {
    Sandbox {
        serial: CERT_SERIAL.into(),
        private_key: certificate("wechat-cert", CERT_SERIAL).0,
        mchid: mchid.into(),
        appid: appid.into(),
        apiv3_key: apiv3_key.into(),
    }
}

fn paid(app: &TestApp, s: &Sandbox, order_no: &str) -> Delivery {
    let plaintext =
        paynotify::qa::forge::wechat::transaction(s, order_no, &format!("42{order_no}"), 100);
    s.notification(
        "TRANSACTION.SUCCESS",
        &plaintext,
        app.clock.now().unix_seconds(),
    )
    .expect("forge")
}

/// An order that names merchant `mchid`: paid only by that merchant's payment.
async fn order_of(app: &TestApp, order_no: &str, mchid: &str) {
    let body =
        json!({"order_no": order_no, "amount_fen": 100, "currency": "CNY", "wechat_mchid": mchid});
    let (status, answer) = admin_json(app, Method::POST, "/orders", &body).await;
    assert_eq!(status, 201, "{order_no}: {answer}");
}

/// `POST /admin/merchants` of `body` is 400 with an error naming each of `named`, and the
/// account it names is not stored.
async fn refused_and_not_stored(app: &TestApp, body: &Value, named: &[&str]) {
    let (status, answer) = admin_json(app, Method::POST, "/admin/merchants", body).await;
    assert_eq!(status, 400, "{answer}");
    let error = answer["error"].as_str().unwrap_or_default();
    for part in named {
        assert!(error.contains(part), "{part} in {error}");
    }
    let account = body["account"].as_str().unwrap_or_default();
    let path = format!("/admin/merchants/wechat/{account}");
    let (status, _) = admin_json(app, Method::GET, &path, &Value::Null).await;
    assert_eq!(status, 404, "nothing stored of {account}");
}

async fn merchants_sharing_a_certificate_each_get_their_own_payments(backend: Backend) {
    let app = spawn_app_with(backend, both_hold_the_certificate).await;
    let of_a = under_certificate(A, "wx0000000000000001", crate::wechat::APIV3_A);
    let of_b = under_certificate(B, "wx0000000000000002", APIV3_B);
    order_of(&app, "SC-A", A).await;
    order_of(&app, "SC-B", B).await;
    // One serial, one key: each payment opens with its own merchant's APIv3 key only, so it
    // pays the order of that merchant (the other's would be a MERCHANT_MISMATCH).
    for (order_no, s) in [("SC-A", &of_a), ("SC-B", &of_b)] {
        let d = paid(&app, s, order_no);
        assert_eq!(
            post_delivery(&app, "/notify/wechat/pay", &d).await,
            (204, String::new())
        );
        assert_eq!(app.status_of(order_no).await, "PAID", "{order_no}");
    }
    assert!(app.anomalies("SC-A").await.is_empty());
    assert!(app.anomalies("SC-B").await.is_empty());

    // An APIv3 key neither holds opens nothing: refused, nothing written.
    order_of(&app, "SC-X", B).await;
    let stranger = under_certificate(B, "wx0000000000000002", "XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX9");
    let (status, _) =
        post_delivery(&app, "/notify/wechat/pay", &paid(&app, &stranger, "SC-X")).await;
    assert_eq!(status, 500);
    assert_eq!(app.status_of("SC-X").await, "WAIT_PAY");

    // A per-account path takes only that account's entry of the certificate.
    order_of(&app, "SC-P", A).await;
    let of_a_on_b = paid(&app, &of_a, "SC-P");
    let (status, body) = post_delivery(&app, &format!("/notify/wechat/pay/{B}"), &of_a_on_b).await;
    assert_eq!(status, 401, "A's notification on B's path: {body}");
    assert!(body.contains("another merchant holding"), "{body}");
    assert_eq!(app.status_of("SC-P").await, "WAIT_PAY");
    assert_eq!(
        post_delivery(&app, &format!("/notify/wechat/pay/{A}"), &of_a_on_b).await,
        (204, String::new())
    );
    assert_eq!(app.status_of("SC-P").await, "PAID");
    assert_eq!(app.messages("ORDER_PAID").await, 3);
}

async fn an_account_added_with_a_shared_certificate_is_paid_as_itself(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.wechat = crate::wechat::settings();
        s.secrets.master_key = Secret::new(MASTER_KEY);
    })
    .await;
    let cert_pem = std::fs::read_to_string(certificate("wechat-cert", CERT_SERIAL).1).expect("pem");
    let c = "1900000003";
    let apiv3_c = "CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCC3";
    // The certificate merchant A holds (the file's), added for C through the API.
    let body = json!({
        "channel": "wechat", "account": c, "mode": "direct", "appids": ["wx0000000000000033"],
        "keys": {"apiv3_key": apiv3_c, "platform_keys": [{"certificate_pem": cert_pem}]},
    });
    let (status, view) = admin_json(&app, Method::POST, "/admin/merchants", &body).await;
    assert_eq!(status, 201, "{view}");
    assert_eq!(view["platform_serials"], json!([CERT_SERIAL]), "{view}");

    order_of(&app, "SC-C", c).await;
    let of_c = under_certificate(c, "wx0000000000000033", apiv3_c);
    let d = paid(&app, &of_c, "SC-C");
    assert_eq!(
        post_delivery(&app, "/notify/wechat/pay", &d).await,
        (204, String::new())
    );
    assert_eq!(app.status_of("SC-C").await, "PAID");
    order_of(&app, "SC-A2", A).await;
    let of_a = under_certificate(A, "wx0000000000000001", crate::wechat::APIV3_A);
    let d = paid(&app, &of_a, "SC-A2");
    assert_eq!(
        post_delivery(&app, "/notify/wechat/pay", &d).await,
        (204, String::new())
    );
    assert_eq!(app.status_of("SC-A2").await, "PAID");

    // The serial of A's public key, given for D with another key: a serial names one key.
    rsa_key("wechat-b");
    let other = std::fs::read_to_string(public_key_path("wechat-b")).expect("pem");
    let body = json!({
        "channel": "wechat", "account": "1900000004", "mode": "direct", "appids": ["wx0000000000000044"],
        "keys": {"apiv3_key": "DDDDDDDDDDDDDDDDDDDDDDDDDDDDDDD4", "platform_keys": [
            {"serial": "PUB_KEY_ID_0000000000000000000000000000000A", "public_key_pem": other}
        ]},
    });
    refused_and_not_stored(
        &app,
        &body,
        &["keys.platform_keys[0].serial", "another public key"],
    )
    .await;

    // The certificate again, under A's APIv3 key: its notifications would open for A and E.
    let body = json!({
        "channel": "wechat", "account": "1900000005", "mode": "direct", "appids": ["wx0000000000000055"],
        "keys": {"apiv3_key": crate::wechat::APIV3_A, "platform_keys": [{"certificate_pem": cert_pem}]},
    });
    refused_and_not_stored(&app, &body, &["keys.apiv3_key", "merchant 1900000001"]).await;

    // Disabling C takes only C's entry of the certificate: A's payments still verify.
    let (status, view) = admin_json(
        &app,
        Method::DELETE,
        &format!("/admin/merchants/wechat/{c}"),
        &Value::Null,
    )
    .await;
    assert_eq!(status, 200, "{view}");
    order_of(&app, "SC-A3", A).await;
    let d = paid(&app, &of_a, "SC-A3");
    assert_eq!(
        post_delivery(&app, "/notify/wechat/pay", &d).await,
        (204, String::new())
    );
    assert_eq!(app.status_of("SC-A3").await, "PAID");
}

#[test]
fn a_file_serial_naming_another_key_or_the_same_apiv3_key_is_a_start_up_error() {
    let mut settings = crate::wechat::settings();
    settings.merchants[1].platform_keys.push(PlatformKey {
        serial: Some("PUB_KEY_ID_0000000000000000000000000000000A".into()),
        public_key_file: Some(public_key_path("wechat-b")),
        certificate_file: None,
    });
    let err = paynotify::channel::wechat::WechatPay::from_settings(
        &settings,
        paynotify::time::Timestamp::new(chrono::Utc::now()),
    )
    .expect_err("another key under A's serial")
    .to_string();
    assert!(
        err.contains("wechat.merchants[1].platform_keys[1].serial"),
        "{err}"
    );
    assert!(err.contains("another public key"), "{err}");

    // The certificate A holds, given to B under A's APIv3 key: ambiguous.
    let mut settings = crate::wechat::settings();
    settings.merchants[1].apiv3_key = Secret::new(crate::wechat::APIV3_A);
    settings.merchants[1].platform_keys.push(PlatformKey {
        serial: None,
        public_key_file: None,
        certificate_file: Some(certificate("wechat-cert", CERT_SERIAL).1),
    });
    let err = paynotify::channel::wechat::WechatPay::from_settings(
        &settings,
        paynotify::time::Timestamp::new(chrono::Utc::now()),
    )
    .expect_err("the same APIv3 key under one certificate")
    .to_string();
    assert!(err.contains("wechat.merchants[1].apiv3_key"), "{err}");
}
