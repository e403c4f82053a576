//! Receipts: what arrived at a notify URL is kept when it was refused (or always, or never),
//! written off the hot path, never holding a configured secret; re-applied once fixed.

use std::time::{Duration, Instant};

use paynotify::config::{ReceiptMode, Secret};
use paynotify::qa::forge::Delivery;
use paynotify::store::receipts::{ReceiptFilter, StoredReceipt};
use serde_json::Value;

use crate::helpers::{Backend, TestApp, metric, spawn_app_with};
use crate::wechat::{APIV3_A, paid, pay, sandbox, settings};

async fn app(backend: Backend) -> TestApp {
    spawn_app_with(backend, |s| s.wechat = settings()).await
}

/// A "proxy" that parses the JSON body and pretty-prints it before passing it on.
fn reserialised(d: &Delivery) -> Delivery {
    let value: serde_json::Value = serde_json::from_slice(&d.body).expect("JSON body");
    let mut d = d.clone();
    d.body = serde_json::to_vec_pretty(&value).expect("pretty");
    d
}

async fn all_receipts(app: &TestApp) -> Vec<StoredReceipt> {
    app.store
        .receipts(&ReceiptFilter {
            limit: 1000,
            ..ReceiptFilter::default()
        })
        .await
        .expect("receipts")
}

crate::on_both_backends!(
    a_body_reserialised_by_a_proxy_is_refused_and_kept_as_it_arrived,
    accepted_notifications_leave_no_receipt_unless_store_is_all,
    receipts_never_contain_configured_secrets,
    a_full_receipt_queue_drops_and_counts_while_notify_still_answers,
    a_wrong_apiv3_key_fixed_then_bulk_reapply_pays_each_order_once,
    the_admin_api_lists_shows_and_reapplies_one_receipt,
);

async fn a_body_reserialised_by_a_proxy_is_refused_and_kept_as_it_arrived(backend: Backend) {
    let app = app(backend).await;
    app.create_order("RC-1", 19900).await;
    let proxied = reserialised(&paid(&app, &sandbox('A'), "RC-1", 19900));
    let (status, _) = pay(&app, &proxied).await;
    assert_eq!(status, 401);
    assert_eq!(app.receipts_stored(1).await, 1);
    let receipt = &all_receipts(&app).await[0];
    assert_eq!(receipt.channel, "wechat");
    assert_eq!(
        (receipt.status, receipt.outcome.as_str()),
        (401, "bad_signature")
    );
    assert_eq!(
        paynotify::receipts::decode_body(&receipt.body_b64).as_deref(),
        Some(proxied.body.as_slice()),
        "the raw body, byte for byte"
    );
    assert_eq!(receipt.body_bytes as usize, proxied.body.len());
    let headers = &receipt.headers.0;
    assert_eq!(
        headers["wechatpay-serial"][0],
        proxied.header("Wechatpay-Serial").expect("serial")
    );
    assert_eq!(headers["content-type"][0], "application/json");
    assert!(receipt.request_id.is_some() && receipt.peer.is_some());
    assert_eq!(metric(&app, "paynotify_receipts_total", &["written"]), 1);
}

async fn accepted_notifications_leave_no_receipt_unless_store_is_all(backend: Backend) {
    let app = app(backend).await;
    app.create_order("RC-2", 100).await;
    assert_eq!(
        pay(&app, &paid(&app, &sandbox('A'), "RC-2", 100)).await.0,
        204
    );
    // A refused one after it: once it is stored, the accepted one would have been too.
    let mut forged = paid(&app, &sandbox('A'), "RC-2", 100);
    forged.set_header("Wechatpay-Signature", "AAAA");
    assert_eq!(pay(&app, &forged).await.0, 401);
    assert_eq!(app.receipts_stored(1).await, 1);
    assert_eq!(all_receipts(&app).await[0].outcome, "bad_signature");

    let all = spawn_app_with(backend, |s| {
        s.wechat = settings();
        s.receipts.store = ReceiptMode::All;
    })
    .await;
    all.create_order("RC-3", 100).await;
    assert_eq!(
        pay(&all, &paid(&all, &sandbox('A'), "RC-3", 100)).await.0,
        204
    );
    assert_eq!(all.receipts_stored(1).await, 1);
    let receipt = &all_receipts(&all).await[0];
    assert_eq!(
        (
            receipt.status,
            receipt.outcome.as_str(),
            receipt.out_trade_no.as_deref()
        ),
        (204, "applied", Some("RC-3"))
    );

    let off = spawn_app_with(backend, |s| {
        s.wechat = settings();
        s.receipts.store = ReceiptMode::Off;
    })
    .await;
    assert_eq!(pay(&off, &forged).await.0, 401);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(off.db.count("notify_receipt").await, 0);
}

async fn receipts_never_contain_configured_secrets(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.wechat = settings();
        s.receipts.store = ReceiptMode::All;
    })
    .await;
    app.create_order("RC-S", 100).await;
    let s = sandbox('A');
    let mut sent = vec![paid(&app, &s, "RC-S", 100)];
    sent.push(reserialised(&paid(&app, &s, "RC-S", 100)));
    let mut bearer = paid(&app, &s, "RC-S", 100);
    // A caller that sends the API token along: the Authorization header is not kept.
    bearer.set_header("Authorization", format!("Bearer {}", app.api_token));
    sent.push(bearer);
    for d in &sent {
        pay(&app, d).await;
    }
    assert_eq!(app.receipts_stored(3).await, 3);
    let secrets = [APIV3_A.to_owned(), app.api_token.clone()];
    for receipt in all_receipts(&app).await {
        let row = serde_json::to_string(&receipt).expect("row as JSON");
        let body = paynotify::receipts::decode_body(&receipt.body_b64).expect("body");
        let body = String::from_utf8_lossy(&body);
        for secret in &secrets {
            assert!(
                !row.contains(secret.as_str()),
                "receipt row holds a secret: {row}"
            );
            assert!(
                !body.contains(secret.as_str()),
                "receipt body holds a secret"
            );
        }
    }
}

async fn a_full_receipt_queue_drops_and_counts_while_notify_still_answers(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.wechat = settings();
        s.receipts.queue = 2;
    })
    .await;
    // The writer's insert waits behind this lock, so nothing leaves the queue.
    let hold = Duration::from_secs(3);
    let lock = match backend {
        Backend::Sqlite => app.db.hold_write_lock("none", hold).await,
        _ => app.db.hold_table_lock("notify_receipt", hold).await,
    };
    let mut forged = paid(&app, &sandbox('A'), "RC-Q", 100);
    forged.set_header("Wechatpay-Signature", "AAAA");
    assert_eq!(pay(&app, &forged).await.0, 401);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    for _ in 0..20 {
        let one = Instant::now();
        assert_eq!(pay(&app, &forged).await.0, 401);
        assert!(
            one.elapsed() < Duration::from_millis(500),
            "notify waited on receipts"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "answered while the lock was held"
    );
    assert!(
        metric(&app, "paynotify_receipts_total", &["dropped"]) >= 17,
        "dropped: {}",
        metric(&app, "paynotify_receipts_total", &["dropped"])
    );
    lock.await.expect("lock task");
    assert!(app.receipts_stored(3).await >= 1);
}

async fn post_admin(app: &TestApp, path: &str) -> (u16, Value) {
    let response = app
        .client
        .post(app.url(path))
        .bearer_auth(&app.api_token)
        .send()
        .await
        .expect("admin POST");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON"))
}

async fn get_admin(app: &TestApp, path: &str) -> (u16, Value) {
    let response = app
        .client
        .get(app.url(path))
        .bearer_auth(&app.api_token)
        .send()
        .await
        .expect("admin GET");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON"))
}

/// 32 bytes, but not the key WeChat encrypts with.
const WRONG_APIV3: &str = "ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ1";

async fn a_wrong_apiv3_key_fixed_then_bulk_reapply_pays_each_order_once(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.wechat = settings();
        s.wechat.merchants[0].apiv3_key = Secret::new(WRONG_APIV3);
    })
    .await;
    let orders: Vec<String> = (1..=5).map(|i| format!("RK-{i}")).collect();
    for order_no in &orders {
        app.create_order(order_no, 300).await;
        let (status, _) = pay(&app, &paid(&app, &sandbox('A'), order_no, 300)).await;
        assert_eq!(status, 500, "undecryptable: WeChat retries");
    }
    assert_eq!(app.receipts_stored(5).await, 5);

    // The key is fixed and the service restarted, hours later: past WeChat's 5-minute
    // window, which a re-apply does not apply (the receipt proves when it arrived).
    let app = app.rebuild(|s| s.wechat = settings()).await;
    app.clock.advance(3 * 3600);
    let bulk = "/admin/receipts/reapply?outcome=undecryptable&since=2026-11-30T00:00:00Z&limit=100";
    let (status, first) = post_admin(&app, bulk).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["count"], 5, "{first}");
    assert_eq!(
        first["outcomes"],
        serde_json::json!({ "applied": 5 }),
        "{first}"
    );
    for order_no in &orders {
        assert_eq!(app.status_of(order_no).await, "PAID");
    }
    assert_eq!(app.messages("ORDER_PAID").await, 5);

    let (status, second) = post_admin(&app, bulk).await;
    assert_eq!(status, 200);
    assert_eq!(
        second["outcomes"],
        serde_json::json!({ "duplicate": 5 }),
        "{second}"
    );
    assert_eq!(
        app.messages("ORDER_PAID").await,
        5,
        "each order paid exactly once"
    );
    assert_eq!(app.db.count("pay_callback").await, 5);
    assert_eq!(
        app.db
            .count("notify_receipt WHERE reapply_outcome = 'duplicate'")
            .await,
        5
    );
}

async fn the_admin_api_lists_shows_and_reapplies_one_receipt(backend: Backend) {
    let app = app(backend).await;
    app.create_order("RA-1", 100).await;
    let proxied = reserialised(&paid(&app, &sandbox('A'), "RA-1", 100));
    assert_eq!(pay(&app, &proxied).await.0, 401);
    app.receipts_stored(1).await;

    let (status, list) =
        get_admin(&app, "/admin/receipts?channel=wechat&outcome=bad_signature").await;
    assert_eq!(status, 200);
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    let id = list[0]["id"].as_i64().expect("id");
    let (status, none) = get_admin(&app, "/admin/receipts?outcome=applied").await;
    assert_eq!((status, none.as_array().map(Vec::len)), (200, Some(0)));
    let (status, _) = get_admin(&app, "/admin/receipts?since=yesterday").await;
    assert_eq!(status, 400);

    let (status, one) = get_admin(&app, &format!("/admin/receipts/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(
        one["body_text"].as_str().map(str::as_bytes),
        Some(proxied.body.as_slice())
    );
    assert_eq!(
        one["headers"]["wechatpay-nonce"][0],
        proxied.header("Wechatpay-Nonce").expect("nonce")
    );

    // The re-serialised body still does not verify: re-apply says so and changes nothing.
    let (status, again) = post_admin(&app, &format!("/admin/receipts/{id}/reapply")).await;
    assert_eq!(status, 200);
    assert_eq!(again["outcome"], "bad_signature", "{again}");
    assert_eq!(app.status_of("RA-1").await, "WAIT_PAY");
    let (status, _) = post_admin(&app, "/admin/receipts/999999/reapply").await;
    assert_eq!(status, 404);
    let unauthorised = app
        .client
        .get(app.url("/admin/receipts"))
        .send()
        .await
        .expect("GET");
    assert_eq!(unauthorised.status(), 401);
}
