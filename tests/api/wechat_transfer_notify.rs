//! `POST /notify/wechat/transfer` on a running service: `MCHTRANSFER.BILL.FINISHED` verified
//! like every WeChat notification, and one about a transfer never started here recorded once
//! as a `TRANSFER_ANOMALY`; whatever is refused writes nothing.

use paynotify::qa::forge::Delivery;
use paynotify::qa::forge::wechat;
use paynotify::time::Clock;
use serde_json::Value;

use crate::support::helpers::{Backend, TestApp, post_delivery, spawn_app_with};
use crate::support::wechat_transfer::finished;

const ROUTE: &str = "/notify/wechat/transfer";

async fn app(backend: Backend) -> TestApp {
    spawn_app_with(backend, |s| s.wechat = crate::wechat::settings()).await
}

fn now(app: &TestApp) -> i64 {
    app.clock.now().unix_seconds()
}

/// A finished bill of merchant A that paynotify never started.
fn unknown(app: &TestApp, state: &str) -> Delivery {
    finished(
        &crate::wechat::sandbox('A'),
        "TNEVER1",
        "1330TNEVER1",
        state,
        500,
        None,
        now(app),
    )
}

/// Refused in WeChat's failure shape with `status`, and nothing written.
async fn assert_refused(app: &TestApp, route: &str, d: &Delivery, status: u16) -> String {
    let (got, body) = post_delivery(app, route, d).await;
    assert_eq!(got, status, "{route}: {body}");
    let body: Value = serde_json::from_str(&body).expect("FAIL body is JSON");
    assert_eq!(body["code"], "FAIL", "{body}");
    assert_eq!(app.db.count("local_message").await, 0);
    assert_eq!(app.db.count("transfer_anomaly").await, 0);
    body["message"].as_str().expect("message").to_owned()
}

crate::on_every_backend!(a_transfer_never_started_here_is_one_anomaly);

async fn a_transfer_never_started_here_is_one_anomaly(backend: Backend) {
    let app = app(backend).await;
    assert_eq!(
        post_delivery(&app, ROUTE, &unknown(&app, "SUCCESS")).await,
        (204, String::new())
    );
    let anomalies = app.outbox("TRANSFER_ANOMALY").await;
    assert_eq!(anomalies.len(), 1, "{anomalies:?}");
    let payload = &anomalies[0].payload.0;
    assert_eq!(payload["reason"], "UNKNOWN_TRANSFER", "{payload}");
    assert_eq!(payload["out_bill_no"], "TNEVER1");
    assert_eq!(payload["channel"], "wechat");
    assert_eq!(payload["provider_amount_fen"], 500);
    assert_eq!(payload["account"], Value::Null);
    assert_eq!(anomalies[0].biz_key, "TNEVER1:wechat:1330TNEVER1");

    // WeChat's retry, encrypted and signed afresh: acknowledged, not recorded again.
    app.clock.advance(15);
    assert_eq!(
        post_delivery(&app, ROUTE, &unknown(&app, "SUCCESS")).await,
        (204, String::new())
    );
    assert_eq!(app.messages("TRANSFER_ANOMALY").await, 1);
    assert_eq!(app.db.count("local_message").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transfer_route_refuses_what_does_not_verify_and_writes_nothing() {
    let app = app(Backend::Sqlite).await;
    let s = crate::wechat::sandbox('A');

    // Signed by another merchant's key under A's serial.
    let mut forged = unknown(&app, "SUCCESS");
    let by_b = finished(
        &crate::wechat::sandbox('B'),
        "TNEVER1",
        "1330TNEVER1",
        "SUCCESS",
        500,
        None,
        now(&app),
    );
    forged.body = by_b.body;
    assert_refused(&app, ROUTE, &forged, 401).await;

    let mut unsigned = unknown(&app, "SUCCESS");
    unsigned.remove_header("Wechatpay-Signature");
    assert_refused(&app, ROUTE, &unsigned, 401).await;

    let stale = finished(
        &s,
        "TNEVER1",
        "1330TNEVER1",
        "SUCCESS",
        500,
        None,
        now(&app) - 400,
    );
    assert_refused(&app, ROUTE, &stale, 401).await;

    // Signed, but not the route's event.
    let payment = s
        .notification(
            "TRANSACTION.SUCCESS",
            &wechat::transaction(&s, "W-T1", "42W-T1", 100),
            now(&app),
        )
        .expect("forge");
    let message = assert_refused(&app, ROUTE, &payment, 400).await;
    assert!(
        message.starts_with("wrong event type: event_type TRANSACTION.SUCCESS is a payment"),
        "{message}"
    );
    for event in ["MCHTRANSFER.BATCH.FINISHED", "COUPON.USE"] {
        let other = s
            .notification(
                event,
                &wechat::transfer(&s, "TNEVER1", "1330TNEVER1", "SUCCESS", 500, None),
                now(&app),
            )
            .expect("forge");
        let message = assert_refused(&app, ROUTE, &other, 400).await;
        assert!(
            message.starts_with(&format!(
                "wrong event type: event_type {event} is not MCHTRANSFER.BILL.FINISHED"
            )),
            "{message}"
        );
    }
    // And the transfer's own event on the payment route.
    let message = assert_refused(&app, "/notify/wechat/pay", &unknown(&app, "SUCCESS"), 400).await;
    assert!(message.contains("/notify/wechat/transfer"), "{message}");
    assert_eq!(
        crate::support::helpers::metric(
            &app,
            "paynotify_notify_rejections_total",
            &["wechat", "wrong_event_type"],
        ),
        4
    );
}
