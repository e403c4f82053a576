//! Service-provider mode, notifications: a WeChat service provider's notification for one
//! of its sub-merchants (verified and decrypted with the provider's keys, applied to the
//! sub-merchant's order once, refused `unknown_merchant` while the sub-merchant is not
//! registered), the per-account notify paths, and an Alipay ISV's notification for a
//! merchant that authorised its app (`auth_app_id`).

use paynotify::config::{Secret, Settings};
use paynotify::qa::forge::Delivery;
use paynotify::time::Clock;
use reqwest::Method;
use serde_json::{Value, json};

use crate::alipay::{APP as ISV_APP, pay_fields, set, signed};
use crate::support::helpers::{Backend, TestApp, admin_json, post_delivery, spawn_app_with};
use crate::wechat::sandbox;

crate::on_every_backend!(
    a_partner_payment_is_applied_once_to_the_sub_merchants_order,
    an_unregistered_sub_merchant_is_refused_until_it_is_registered,
    a_partner_payment_naming_another_service_provider_is_a_merchant_mismatch,
    per_account_paths_take_only_that_accounts_keys,
    a_partner_refund_names_the_sub_merchant,
    an_isv_notification_is_applied_to_the_authorizing_merchants_order,
    an_order_that_names_an_account_is_paid_only_by_that_account,
);

const MASTER_KEY: &str = "cGF5bm90aWZ5LXBhcnRuZXItbm90aWZ5LWtleS0zMmI=";
/// The service provider: merchant A of `crate::wechat::settings()`.
const SP: &str = "1900000001";
const SP_APPID: &str = "wx0000000000000001";
const SUB: &str = "1900000201";
const SUB_APPID: &str = "wx0000000000000201";
const AUTH_APP: &str = "2021000000000301";
const AUTH_SELLER: &str = "2088000000000301";

fn configure(s: &mut Settings) {
    s.wechat = crate::wechat::settings();
    s.alipay = crate::alipay::settings();
    s.secrets.master_key = Secret::new(MASTER_KEY);
}

async fn app(backend: Backend) -> TestApp {
    spawn_app_with(backend, configure).await
}

async fn add_sub(app: &TestApp) {
    let body = json!({
        "channel": "wechat", "account": SUB, "mode": "partner_sub",
        "sp_account": SP, "appids": [SUB_APPID],
    });
    let (status, view) = admin_json(app, Method::POST, "/admin/merchants", &body).await;
    assert_eq!(status, 201, "{view}");
    assert_eq!(view["mode"], "partner_sub", "{view}");
    assert_eq!(view["sp_account"], SP, "{view}");
}

async fn order(app: &TestApp, order_no: &str, field: &str, account: &str) {
    let body = json!({"order_no": order_no, "amount_fen": 100, "currency": "CNY", field: account});
    let (status, answer) = admin_json(app, Method::POST, "/orders", &body).await;
    assert_eq!(status, 201, "{order_no}: {answer}");
}

/// The service provider's payment resource for `sub_mchid`, as WeChat sends it.
fn partner_transaction(sp_mchid: &str, sub_mchid: &str, order_no: &str) -> Value {
    json!({
        "sp_appid": SP_APPID, "sp_mchid": sp_mchid,
        "sub_appid": SUB_APPID, "sub_mchid": sub_mchid,
        "out_trade_no": order_no, "transaction_id": format!("42{order_no}"),
        "trade_type": "JSAPI", "trade_state": "SUCCESS", "trade_state_desc": "支付成功",
        "bank_type": "OTHERS", "attach": "", "success_time": "2026-11-30T10:00:00+08:00",
        "payer": {"sp_openid": "oSpOpenId000000000000000000", "sub_openid": "oSubOpenId00000000000000000"},
        "amount": {"total": 100, "payer_total": 100, "currency": "CNY", "payer_currency": "CNY"}
    })
}

/// Signed and encrypted with the service provider's keys (merchant A's).
fn partner_paid(app: &TestApp, sub_mchid: &str, order_no: &str) -> Delivery {
    sandbox('A')
        .notification(
            "TRANSACTION.SUCCESS",
            &partner_transaction(SP, sub_mchid, order_no),
            app.clock.now().unix_seconds(),
        )
        .expect("forge")
}

fn reason_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or(Value::Null)
}

async fn a_partner_payment_is_applied_once_to_the_sub_merchants_order(backend: Backend) {
    let app = app(backend).await;
    add_sub(&app).await;
    order(&app, "SP-1", "wechat_mchid", SUB).await;
    let d = partner_paid(&app, SUB, "SP-1");
    for _ in 0..2 {
        assert_eq!(
            post_delivery(&app, "/notify/wechat/pay", &d).await,
            (204, String::new())
        );
    }
    assert_eq!(app.status_of("SP-1").await, "PAID");
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    assert!(app.anomalies("SP-1").await.is_empty());
}

async fn an_unregistered_sub_merchant_is_refused_until_it_is_registered(backend: Backend) {
    let app = app(backend).await;
    app.create_order("SP-2", 100).await;
    let d = partner_paid(&app, SUB, "SP-2");
    let (status, body) = post_delivery(&app, "/notify/wechat/pay", &d).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(reason_of(&body)["code"], "FAIL", "{body}");
    assert_eq!(app.status_of("SP-2").await, "WAIT_PAY");
    assert_eq!(app.db.count("pay_callback").await, 0);
    assert_eq!(app.db.count("local_message").await, 0);
    assert_eq!(
        crate::support::helpers::metric(
            &app,
            "paynotify_notify_rejections_total",
            &["wechat", "unknown_merchant"]
        ),
        1
    );

    // WeChat retries for a day: registering the sub-merchant in time recovers the payment.
    add_sub(&app).await;
    let retry = partner_paid(&app, SUB, "SP-2");
    assert_eq!(
        post_delivery(&app, "/notify/wechat/pay", &retry).await,
        (204, String::new())
    );
    assert_eq!(app.status_of("SP-2").await, "PAID");

    // Disabled again: refused like an unknown one.
    let (status, view) = admin_json(
        &app,
        Method::DELETE,
        &format!("/admin/merchants/wechat/{SUB}"),
        &Value::Null,
    )
    .await;
    assert_eq!(status, 200, "{view}");
    app.create_order("SP-3", 100).await;
    let (status, body) =
        post_delivery(&app, "/notify/wechat/pay", &partner_paid(&app, SUB, "SP-3")).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(app.status_of("SP-3").await, "WAIT_PAY");
}

async fn a_partner_payment_naming_another_service_provider_is_a_merchant_mismatch(
    backend: Backend,
) {
    let app = app(backend).await;
    add_sub(&app).await;
    order(&app, "SP-4", "wechat_mchid", SUB).await;
    // Signed and decrypted with A's keys, but the resource says another service provider.
    let d = sandbox('A')
        .notification(
            "TRANSACTION.SUCCESS",
            &partner_transaction("1900000999", SUB, "SP-4"),
            app.clock.now().unix_seconds(),
        )
        .expect("forge");
    assert_eq!(
        post_delivery(&app, "/notify/wechat/pay", &d).await,
        (204, String::new())
    );
    assert_eq!(app.status_of("SP-4").await, "WAIT_PAY");
    let anomalies = app.anomalies("SP-4").await;
    assert!(
        anomalies
            .iter()
            .any(|(reason, _)| reason == "MERCHANT_MISMATCH"),
        "{anomalies:?}"
    );
}

async fn per_account_paths_take_only_that_accounts_keys(backend: Backend) {
    let app = app(backend).await;
    add_sub(&app).await;
    // A direct payment of A on A's path.
    app.create_order("PA-1", 100).await;
    let direct = crate::wechat::paid(&app, &sandbox('A'), "PA-1", 100);
    assert_eq!(
        post_delivery(&app, &format!("/notify/wechat/pay/{SP}"), &direct).await,
        (204, String::new())
    );
    assert_eq!(app.status_of("PA-1").await, "PAID");

    // B's key on A's path: not A's keys.
    app.create_order("PA-2", 100).await;
    let of_b = crate::wechat::paid(&app, &sandbox('B'), "PA-2", 100);
    let (status, body) = post_delivery(&app, &format!("/notify/wechat/pay/{SP}"), &of_b).await;
    assert_eq!(status, 401, "{body}");
    // An account not enabled here.
    let (status, body) = post_delivery(&app, "/notify/wechat/pay/1900000777", &of_b).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(app.status_of("PA-2").await, "WAIT_PAY");

    // The sub-merchant's path takes its provider's keys, and only its own payments.
    order(&app, "PA-3", "wechat_mchid", SUB).await;
    let d = partner_paid(&app, SUB, "PA-3");
    assert_eq!(
        post_delivery(&app, &format!("/notify/wechat/pay/{SUB}"), &d).await,
        (204, String::new())
    );
    assert_eq!(app.status_of("PA-3").await, "PAID");
    app.create_order("PA-4", 100).await;
    let direct = crate::wechat::paid(&app, &sandbox('A'), "PA-4", 100);
    let (status, body) = post_delivery(&app, &format!("/notify/wechat/pay/{SUB}"), &direct).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(app.status_of("PA-4").await, "WAIT_PAY");
}

async fn a_partner_refund_names_the_sub_merchant(backend: Backend) {
    let app = app(backend).await;
    add_sub(&app).await;
    order(&app, "SR-1", "wechat_mchid", SUB).await;
    assert_eq!(
        post_delivery(&app, "/notify/wechat/pay", &partner_paid(&app, SUB, "SR-1")).await,
        (204, String::new())
    );
    let refund = json!({
        "sp_mchid": SP, "sub_mchid": SUB,
        "out_trade_no": "SR-1", "transaction_id": "42SR-1",
        "out_refund_no": "SR-1-R1", "refund_id": "50SR1",
        "refund_status": "SUCCESS", "success_time": "2026-11-30T11:00:00+08:00",
        "user_received_account": "招商银行信用卡0403",
        "amount": {"total": 100, "refund": 100, "payer_total": 100, "payer_refund": 100}
    });
    let now = app.clock.now().unix_seconds();
    let d = sandbox('A')
        .notification("REFUND.SUCCESS", &refund, now)
        .expect("forge");
    assert_eq!(
        post_delivery(&app, "/notify/wechat/refund", &d).await,
        (204, String::new())
    );
    assert_eq!(app.status_of("SR-1").await, "REFUNDED");

    // Another sub-merchant's refund: unknown_merchant, nothing written.
    let mut other = refund.clone();
    other["sub_mchid"] = json!("1900000299");
    other["out_refund_no"] = json!("SR-1-R2");
    let d = sandbox('A')
        .notification("REFUND.SUCCESS", &other, now)
        .expect("forge");
    let (status, body) = post_delivery(&app, "/notify/wechat/refund", &d).await;
    assert_eq!(status, 401, "{body}");
}

async fn an_isv_notification_is_applied_to_the_authorizing_merchants_order(backend: Backend) {
    let app = app(backend).await;
    let body = json!({
        "channel": "alipay", "account": AUTH_APP, "mode": "partner_sub",
        "sp_account": ISV_APP, "seller_id": AUTH_SELLER,
        "keys": {"app_auth_token": "202611BB0000000000000000000000000301"},
    });
    let (status, view) = admin_json(&app, Method::POST, "/admin/merchants", &body).await;
    assert_eq!(status, 201, "{view}");
    assert_eq!(view["has_app_auth_token"], true, "{view}");
    assert!(!view.to_string().contains("202611BB"), "{view}");

    order(&app, "ISV-1", "alipay_app_id", AUTH_APP).await;
    // Signed by Alipay for the ISV's app; the order is the authorizing merchant's.
    let mut fields = pay_fields("ISV-1", 100, "TRADE_SUCCESS");
    set(&mut fields, "auth_app_id", AUTH_APP);
    set(&mut fields, "seller_id", AUTH_SELLER);
    let d = signed(fields);
    assert_eq!(
        post_delivery(&app, "/notify/alipay", &d).await,
        (200, "success".to_owned())
    );
    assert_eq!(app.status_of("ISV-1").await, "PAID");
    assert!(app.anomalies("ISV-1").await.is_empty());

    // Another merchant's PID under this authorisation: a mismatch, not a payment.
    order(&app, "ISV-2", "alipay_app_id", AUTH_APP).await;
    let mut fields = pay_fields("ISV-2", 100, "TRADE_SUCCESS");
    set(&mut fields, "auth_app_id", AUTH_APP);
    set(&mut fields, "seller_id", "2088000000000999");
    assert_eq!(
        post_delivery(&app, "/notify/alipay", &signed(fields)).await,
        (200, "success".to_owned())
    );
    assert_eq!(app.status_of("ISV-2").await, "WAIT_PAY");

    // A merchant that did not authorise here: 401 fail, nothing written.
    app.create_order("ISV-3", 100).await;
    let mut fields = pay_fields("ISV-3", 100, "TRADE_SUCCESS");
    set(&mut fields, "auth_app_id", "2021000000000399");
    let (status, body) = post_delivery(&app, "/notify/alipay", &signed(fields)).await;
    assert_eq!((status, body.as_str()), (401, "fail"));
    assert_eq!(app.status_of("ISV-3").await, "WAIT_PAY");
}

async fn an_order_that_names_an_account_is_paid_only_by_that_account(backend: Backend) {
    let app = app(backend).await;
    add_sub(&app).await;
    // Merchant B's verified payment for an order that names merchant A.
    order(&app, "OW-1", "wechat_mchid", SP).await;
    let of_b = crate::wechat::paid(&app, &sandbox('B'), "OW-1", 100);
    for _ in 0..2 {
        assert_eq!(
            post_delivery(&app, "/notify/wechat/pay", &of_b).await,
            (204, String::new())
        );
    }
    assert_eq!(app.status_of("OW-1").await, "WAIT_PAY");
    let reasons: Vec<String> = app
        .anomalies("OW-1")
        .await
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    assert_eq!(reasons, ["MERCHANT_MISMATCH"]);
    assert_eq!(app.messages("ORDER_PAID").await, 0);
    // Order numbers are unique per merchant, not across them: B's payment holds the order's
    // callback key only until A, the account the order names, pays it.
    let of_a = paynotify::qa::forge::wechat::transaction(&sandbox('A'), "OW-1", "4200000A", 100);
    let of_a = sandbox('A')
        .notification("TRANSACTION.SUCCESS", &of_a, app.clock.now().unix_seconds())
        .expect("forge");
    for _ in 0..2 {
        assert_eq!(
            post_delivery(&app, "/notify/wechat/pay", &of_a).await,
            (204, String::new())
        );
    }
    assert_eq!(app.status_of("OW-1").await, "PAID");
    assert_eq!(app.get_order("OW-1").await["transaction_id"], "4200000A");
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    // B's retries stay what they were: its one anomaly, nothing more.
    assert_eq!(
        post_delivery(&app, "/notify/wechat/pay", &of_b).await,
        (204, String::new())
    );
    assert_eq!(app.status_of("OW-1").await, "PAID");
    assert_eq!(app.anomalies("OW-1").await.len(), 1);
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    // The service provider's own payment for an order that names its sub-merchant.
    order(&app, "OW-2", "wechat_mchid", SUB).await;
    let direct = crate::wechat::paid(&app, &sandbox('A'), "OW-2", 100);
    assert_eq!(
        post_delivery(&app, "/notify/wechat/pay", &direct).await,
        (204, String::new())
    );
    assert_eq!(app.status_of("OW-2").await, "WAIT_PAY");
    // An order that names no account is paid by any of the channel's.
    app.create_order("OW-3", 100).await;
    let of_b = crate::wechat::paid(&app, &sandbox('B'), "OW-3", 100);
    assert_eq!(
        post_delivery(&app, "/notify/wechat/pay", &of_b).await,
        (204, String::new())
    );
    assert_eq!(app.status_of("OW-3").await, "PAID");
}
