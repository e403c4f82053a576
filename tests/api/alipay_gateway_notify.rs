//! The app gateway (`POST /notify/alipay/gateway`) end to end: a verified
//! `alipay.fund.trans.order.changed` about a transfer never started here is `success` and one
//! `TRANSFER_ANOMALY` (`UNKNOWN_TRANSFER`); another `msg_method` is `success` and writes
//! nothing; the refusals are `/notify/alipay`'s; each route takes only its own kind of form.

use paynotify::qa::forge::Delivery;
use paynotify::qa::forge::alipay::{FundOrder, gateway_message, transfer_changed};
use serde_json::json;

use crate::alipay::{Fields, pay_fields, sandbox, set, signed};
use crate::support::agree::{assert_refused_as, header_map};
use crate::support::helpers::{Backend, TestApp, post_delivery, spawn_app_with};

crate::on_every_backend!(
    a_transfer_never_started_here_is_acknowledged_and_raised_once,
    another_msg_method_is_acknowledged_and_writes_nothing,
);

const GATEWAY: &str = "/notify/alipay/gateway";
const NOTIFY: &str = "/notify/alipay";

async fn app(backend: Backend) -> TestApp {
    spawn_app_with(backend, |s| s.alipay = crate::alipay::settings()).await
}

fn unknown_transfer() -> FundOrder {
    FundOrder {
        out_biz_no: "TNOTOURS0001".into(),
        order_id: "20261130110070000000000000000099".into(),
        amount_fen: 50_000,
        status: "SUCCESS".into(),
        error_code: None,
    }
}

fn changed(order: &FundOrder) -> Fields {
    transfer_changed(&sandbox(), order)
}

async fn rows(app: &TestApp) -> i64 {
    app.db.count("local_message").await
}

async fn a_transfer_never_started_here_is_acknowledged_and_raised_once(backend: Backend) {
    let app = app(backend).await;
    let message = signed(changed(&unknown_transfer()));
    assert_eq!(
        post_delivery(&app, GATEWAY, &message).await,
        (200, "success".to_owned())
    );
    let raised = app.outbox("TRANSFER_ANOMALY").await;
    assert_eq!(raised.len(), 1);
    let payload = &raised[0].payload.0;
    assert_eq!(payload["reason"], "UNKNOWN_TRANSFER", "{payload}");
    assert_eq!(payload["out_bill_no"], "TNOTOURS0001");
    assert_eq!(payload["channel"], "alipay");
    assert_eq!(payload["provider_account"], "2021000000000001");
    assert_eq!(payload["provider_amount_fen"], 50_000);
    assert_eq!(
        payload["provider_bill_no"],
        "20261130110070000000000000000099"
    );

    // Alipay's retry: the same answer, still one.
    assert_eq!(
        post_delivery(&app, GATEWAY, &message).await,
        (200, "success".to_owned())
    );
    assert_eq!(app.messages("TRANSFER_ANOMALY").await, 1);
    assert_eq!(rows(&app).await, 1);
}

async fn another_msg_method_is_acknowledged_and_writes_nothing(backend: Backend) {
    let app = app(backend).await;
    let fields = gateway_message(
        &sandbox(),
        "alipay.open.mini.version.audit.passed",
        &json!({"mini_app_id": "2021000000000001", "mini_app_version": "0.0.1"}),
    );
    assert_eq!(
        post_delivery(&app, GATEWAY, &signed(fields)).await,
        (200, "success".to_owned())
    );
    assert_eq!(rows(&app).await, 0);
}

/// A field changed after signing: the sign no longer verifies.
fn tampered(fields: Fields) -> Delivery {
    let mut d = signed(fields);
    let body = String::from_utf8(d.body.clone()).expect("utf-8");
    assert!(body.contains("TNOTOURS0001"), "{body}");
    d.body = body
        .replacen("TNOTOURS0001", "TNOTOURS0002", 1)
        .into_bytes();
    d
}

/// The same refusal at the gateway as at `/notify/alipay` for what neither takes: a sign
/// that does not verify, no sign, an app that is not configured, a body too large. Nothing
/// written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_those_of_the_notify_route() {
    let app = app(Backend::Sqlite).await;
    let order = unknown_transfer();
    let mut unsigned = changed(&order);
    unsigned.push(("sign_type".into(), "RSA2".into()));
    let unsigned = Delivery {
        headers: vec![(
            "Content-Type".into(),
            "application/x-www-form-urlencoded; charset=utf-8".into(),
        )],
        body: paynotify::qa::forge::alipay::encode_form(&unsigned),
    };
    let mut other_app = changed(&order);
    set(&mut other_app, "app_id", "2021000000009999");
    let too_large = Delivery {
        headers: unsigned.headers.clone(),
        body: vec![b'a'; 70_000],
    };
    let cases = [
        ("bad signature", tampered(changed(&order)), 401),
        ("no signature", unsigned, 401),
        ("unknown app_id", signed(other_app), 401),
        ("too large", too_large, 413),
    ];
    for (name, delivery, status) in cases {
        let at_gateway = post_delivery(&app, GATEWAY, &delivery).await;
        let at_notify = post_delivery(&app, NOTIFY, &delivery).await;
        assert_eq!(at_gateway, (status, "fail".to_owned()), "{name}");
        assert_eq!(at_gateway, at_notify, "{name}");
    }
    assert_eq!(rows(&app).await, 0);
}

/// A trade notification at the app gateway, and a gateway message at the notify URL: a URL
/// registered in the wrong place, refused as `wrong_event_type` (400) and nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_route_takes_only_its_own_kind_of_form() {
    let app = app(Backend::Sqlite).await;
    let trade = signed(pay_fields("GW-ORDER-1", 100, "TRADE_SUCCESS"));
    assert_eq!(
        post_delivery(&app, GATEWAY, &trade).await,
        (400, "fail".to_owned())
    );
    let message = signed(changed(&unknown_transfer()));
    assert_eq!(
        post_delivery(&app, NOTIFY, &message).await,
        (400, "fail".to_owned())
    );
    assert_eq!(rows(&app).await, 0);
    assert_eq!(
        crate::support::helpers::metric(
            &app,
            "paynotify_notify_rejections_total",
            &["alipay", "wrong_event_type"]
        ),
        2
    );
}

/// `verify` and `explain` walk one list of checks for gateway messages too.
#[test]
fn verify_and_explain_agree_on_gateway_messages() {
    use paynotify::channel::Inbound;
    use paynotify::channel::alipay::{Alipay, GATEWAY_ROUTE, NOTIFY_ROUTE};
    use paynotify::time::Timestamp;

    let alipay = Alipay::from_settings(
        &crate::alipay::settings(),
        Timestamp::new(chrono::Utc::now()),
    )
    .expect("channel");
    let order = unknown_transfer();
    let mut no_biz = changed(&order);
    no_biz.retain(|(k, _)| k != "biz_content");
    let mut bad_status = changed(&order);
    let biz =
        json!({"out_biz_no": "T1", "order_id": "1", "status": "PAID", "trans_amount": "1.00"});
    set(&mut bad_status, "biz_content", &biz.to_string());
    let other = gateway_message(&sandbox(), "alipay.open.app.notify", &json!({}));
    let cases: Vec<(&str, Delivery, &str, Option<&str>)> = vec![
        ("transfer", signed(changed(&order)), GATEWAY_ROUTE, None),
        ("other msg_method", signed(other), GATEWAY_ROUTE, None),
        (
            "bad signature",
            tampered(changed(&order)),
            GATEWAY_ROUTE,
            Some("bad signature"),
        ),
        (
            "no biz_content",
            signed(no_biz),
            GATEWAY_ROUTE,
            Some("bad request: missing parameter biz_content"),
        ),
        (
            "unknown status",
            signed(bad_status),
            GATEWAY_ROUTE,
            Some("bad request: biz_content: unknown status PAID"),
        ),
        (
            "message at the notify URL",
            signed(changed(&order)),
            NOTIFY_ROUTE,
            Some("wrong event type"),
        ),
        (
            "trade at the gateway",
            signed(pay_fields("GW-ORDER-2", 100, "TRADE_SUCCESS")),
            GATEWAY_ROUTE,
            Some("wrong event type"),
        ),
    ];
    for (name, delivery, route, expected) in cases {
        let headers: Vec<(String, Vec<u8>)> = delivery
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
            .collect();
        let headers = header_map(&headers);
        let request = Inbound {
            headers: &headers,
            body: &delivery.body,
            now: Timestamp::new(chrono::Utc::now()),
            route: Some(route),
        };
        assert_refused_as(&alipay, &request, name, expected);
    }
}

/// The stand-in with the transfers room: a transfer `DEALING` in the create's answer is
/// finished by its `alipay.fund.trans.order.changed`, once; the message again is a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dealing_transfer_is_finished_by_its_message_once() {
    use crate::support::alipay_transfer::{NewTransfer, Status, order_changed};
    use crate::transfers::{get, start};

    let fake = crate::alipay::cert_gateway().await;
    let url = fake.url.clone();
    let root = crate::support::keys::alipay_certs(crate::support::provider::APP_KEY)
        .root
        .clone();
    let app = spawn_app_with(Backend::Sqlite, move |s| {
        crate::alipay::cert_mode(s, &url, &root);
        s.transfers.enabled = true;
    })
    .await;
    fake.state.new_alipay_transfers(NewTransfer::Dealing);
    let body = json!({
        "out_bill_no": "TGW1", "channel": "alipay", "account": crate::alipay::CERT_APP,
        "amount_fen": 1000, "remark": "活动奖励",
        "payee": {"identity": "2088000000000099", "identity_type": "ALIPAY_USER_ID"}
    });
    let (status, transfer) = start(&app, &body).await;
    assert_eq!(status, 202, "{transfer}");
    assert_eq!(transfer["status"], "PROCESSING", "{transfer}");
    assert_eq!(transfer["provider_state"], "DEALING", "{transfer}");

    let held = fake.state.settle_alipay_transfer("TGW1", Status::Success);
    let message = order_changed(&fake.state, &sandbox(), "TGW1");
    for _ in 0..2 {
        assert_eq!(
            post_delivery(&app, GATEWAY, &message).await,
            (200, "success".to_owned())
        );
    }
    let (_, transfer) = get(&app, "TGW1").await;
    assert_eq!(transfer["status"], "SUCCESS", "{transfer}");
    assert_eq!(transfer["provider_bill_no"], held.order_id.as_str());
    assert_eq!(app.messages("TRANSFER_SUCCEEDED").await, 1);
    assert_eq!(app.messages("TRANSFER_ANOMALY").await, 0);
    assert_eq!(fake.state.alipay_transfers_created(), 1);
}
