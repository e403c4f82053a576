//! The orders API: idempotent creation, reads, closing, and the bearer token.

use std::sync::Arc;

use serde_json::json;

use crate::support::helpers::{
    Backend, TestApp, named, named_accounts, released_together, spawn_app, spawn_app_with,
};

crate::on_every_backend!(
    a_replay_with_the_same_key_returns_identical_bytes,
    the_same_key_with_another_body_is_422,
    an_existing_order_without_a_key_is_409,
    concurrent_creates_with_one_key_make_one_order_and_one_answer,
    invalid_orders_are_400_and_write_nothing,
    orders_need_the_bearer_token,
    without_a_token_requests_relayed_by_a_proxy_are_refused,
    an_order_has_every_key_and_404_when_missing,
    close_moves_only_unpaid_orders,
    an_order_naming_both_accounts_stores_both,
    an_existing_order_named_again_writes_no_account,
    an_unconfigured_account_is_400_naming_its_provider,
    with_the_token_a_browser_on_another_site_changes_nothing,
);

async fn post_order(app: &TestApp, key: Option<&str>, body: &serde_json::Value) -> (u16, String) {
    let mut request = app
        .client
        .post(app.url("/orders"))
        .bearer_auth(&app.api_token)
        .json(body);
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    let response = request.send().await.expect("POST /orders");
    (
        response.status().as_u16(),
        response.text().await.expect("body"),
    )
}

fn order(no: &str, amount: i64) -> serde_json::Value {
    json!({ "order_no": no, "amount_fen": amount, "currency": "CNY", "subject": "t" })
}

async fn a_replay_with_the_same_key_returns_identical_bytes(backend: Backend) {
    let app = spawn_app(backend).await;
    let first = post_order(&app, Some("k-1"), &order("P-1", 100)).await;
    assert_eq!(first.0, 201);
    app.clock.advance(5);
    let again = post_order(&app, Some("k-1"), &order("P-1", 100)).await;
    assert_eq!(again, first);
    // Key order and whitespace do not make it another request.
    let reordered =
        json!({ "subject": "t", "currency": "CNY", "amount_fen": 100, "order_no": "P-1" });
    assert_eq!(post_order(&app, Some("k-1"), &reordered).await, first);
    assert_eq!(app.db.count("orders").await, 1);
}

async fn the_same_key_with_another_body_is_422(backend: Backend) {
    let app = spawn_app(backend).await;
    post_order(&app, Some("k-2"), &order("P-2", 100)).await;
    let (status, body) = post_order(&app, Some("k-2"), &order("P-2", 101)).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(app.get_order("P-2").await["amount_fen"], 100);
}

async fn an_existing_order_without_a_key_is_409(backend: Backend) {
    let app = spawn_app(backend).await;
    assert_eq!(post_order(&app, None, &order("P-3", 100)).await.0, 201);
    assert_eq!(post_order(&app, None, &order("P-3", 100)).await.0, 409);
    // A new key for an existing order is 409 too, and replays as 409.
    let conflict = post_order(&app, Some("k-3"), &order("P-3", 100)).await;
    assert_eq!(conflict.0, 409);
    assert_eq!(
        post_order(&app, Some("k-3"), &order("P-3", 100)).await,
        conflict
    );
}

async fn concurrent_creates_with_one_key_make_one_order_and_one_answer(backend: Backend) {
    let app = Arc::new(spawn_app(backend).await);
    let answers = released_together(10, |_| {
        let app = app.clone();
        async move { post_order(&app, Some("k-c"), &order("P-C", 100)).await }
    })
    .await;
    assert!(answers.iter().all(|a| *a == answers[0]), "{answers:?}");
    assert_eq!(answers[0].0, 201);
    assert_eq!(app.db.count("orders").await, 1);
}

async fn invalid_orders_are_400_and_write_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    let bad = [
        json!({ "order_no": "", "amount_fen": 1 }),
        json!({ "order_no": "has space", "amount_fen": 1 }),
        json!({ "order_no": "x".repeat(65), "amount_fen": 1 }),
        json!({ "order_no": "P", "amount_fen": 0 }),
        json!({ "order_no": "P", "amount_fen": -5 }),
        json!({ "order_no": "P", "amount_fen": 1.5 }),
        json!({ "order_no": "P", "amount_fen": "100" }),
        json!({ "order_no": "P", "amount_fen": 1, "currency": "cny" }),
        json!({ "order_no": "P", "amount_fen": 1, "expire_after_secs": 0 }),
        json!({ "order_no": "P", "amount_fen": 1, "surprise": true }),
        json!({ "amount_fen": 1 }),
    ];
    for body in bad {
        let (status, reply) = post_order(&app, None, &body).await;
        assert_eq!(status, 400, "{body} -> {reply}");
        let reply: serde_json::Value = serde_json::from_str(&reply).expect("JSON error");
        assert!(reply["error"].is_string());
    }
    let (status, _) = post_order(&app, Some("with space"), &order("P", 1)).await;
    assert_eq!(status, 400);
    assert_eq!(app.db.count("orders").await, 0);
    assert_eq!(app.db.count("idempotency_key").await, 0);
}

async fn orders_need_the_bearer_token(backend: Backend) {
    let app = spawn_app(backend).await;
    let no_token = app
        .client
        .post(app.url("/orders"))
        .json(&order("P-T", 1))
        .send()
        .await;
    assert_eq!(no_token.expect("request").status(), 401);
    let wrong = app
        .client
        .get(app.url("/orders/P-T"))
        .bearer_auth("nope")
        .send()
        .await
        .expect("request");
    assert_eq!(wrong.status(), 401);
    let close = app.client.post(app.url("/orders/P-T/close")).send().await;
    assert_eq!(close.expect("request").status(), 401);
    assert_eq!(app.db.count("orders").await, 0);
}

async fn an_order_has_every_key_and_404_when_missing(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_order("P-K", 19900).await;
    let order = app.get_order("P-K").await;
    let mut keys: Vec<_> = order.as_object().expect("object").keys().cloned().collect();
    keys.sort();
    assert_eq!(keys, crate::support::helpers::ORDER_KEYS);
    assert_eq!(order["created_at"], "2026-11-30T08:00:00Z");
    assert!(order["paid_at"].is_null());
    let missing = app
        .client
        .get(app.url("/orders/NOPE"))
        .bearer_auth(&app.api_token)
        .send()
        .await
        .expect("request");
    assert_eq!(missing.status(), 404);
}

async fn close_moves_only_unpaid_orders(backend: Backend) {
    let app = spawn_app(backend).await;
    let close = |no: &str| {
        app.client
            .post(app.url(&format!("/orders/{no}/close")))
            .bearer_auth(&app.api_token)
            .send()
    };
    app.create_order("P-CL", 100).await;
    let first = close("P-CL").await.expect("close");
    assert_eq!(first.status(), 200);
    let body: serde_json::Value = first.json().await.expect("json");
    assert_eq!(body["status"], "CLOSED");
    assert!(body["closed_at"].is_string());
    assert_eq!(close("P-CL").await.expect("close").status(), 200);
    assert_eq!(app.messages("ORDER_CLOSED").await, 1);

    crate::support::test_channel::paid_order(&app, "P-PAID", 100).await;
    assert_eq!(close("P-PAID").await.expect("close").status(), 409);
    assert_eq!(app.status_of("P-PAID").await, "PAID");
    assert_eq!(close("NOPE").await.expect("close").status(), 404);
}

/// An empty token is allowed on a loopback listener only; a reverse proxy on the same machine
/// would relay anyone's request from that address, and a web page open in a browser there
/// could post to it, so a request a proxy relayed or a browser sent from another site is
/// refused and writes nothing, while local callers keep working without a token.
async fn without_a_token_requests_relayed_by_a_proxy_are_refused(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.server.api_token = paynotify::config::Secret::default();
    })
    .await;
    for (header, value) in [
        ("Forwarded", "for=203.0.113.7;proto=https"),
        ("X-Forwarded-For", "203.0.113.7"),
        ("X-Real-IP", "203.0.113.7"),
    ] {
        let created = app
            .client
            .post(app.url("/orders"))
            .header(header, value)
            .json(&order("PX-1", 100))
            .send()
            .await
            .expect("POST /orders");
        assert_eq!(created.status(), 403, "{header}");
        let body: serde_json::Value = created.json().await.expect("JSON error");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("server.api_token")),
            "{body}"
        );
        let closed = app
            .client
            .post(app.url("/orders/PX-1/close"))
            .header(header, value)
            .send()
            .await
            .expect("close");
        assert_eq!(closed.status(), 403, "{header}");
        let admin = app
            .client
            .get(app.url("/admin/messages"))
            .header(header, value)
            .send()
            .await
            .expect("admin");
        assert_eq!(admin.status(), 403, "{header}");
    }
    assert_eq!(app.db.count("orders").await, 0, "nothing written");

    // A web page open in a browser on this machine posting to the loopback API: a form post
    // needs no preflight, so without this a page could close an order.
    app.create_order("PX-2", 100).await;
    for (header, value) in [
        ("Sec-Fetch-Site", "cross-site"),
        ("Sec-Fetch-Site", "same-site"),
        ("Origin", "http://evil.example"),
        ("Origin", "null"),
    ] {
        let closed = app
            .client
            .post(app.url("/orders/PX-2/close"))
            .header(header, value)
            .header("Content-Type", "application/x-www-form-urlencoded")
            .send()
            .await
            .expect("close");
        assert_eq!(closed.status(), 403, "{header}: {value}");
    }
    assert_eq!(app.status_of("PX-2").await, "WAIT_PAY", "nothing closed");
    let same_origin = app
        .client
        .post(app.url("/orders/PX-2/close"))
        .header("Sec-Fetch-Site", "same-origin")
        .send()
        .await
        .expect("close");
    assert_eq!(same_origin.status(), 200, "a request of this origin");

    let (status, body) = {
        let response = app
            .client
            .post(app.url("/orders"))
            .json(&order("PX-1", 100))
            .send()
            .await
            .expect("POST /orders");
        (response.status(), response.text().await.expect("body"))
    };
    assert_eq!(status, 201, "a local caller without a token: {body}");
}

/// The WeChat merchants 1900000001 and 1900000002 and the Alipay apps 2021000000000001 and
/// 2021000000000002 configured (without API credentials: they may be named, never asked).
async fn app_with_accounts(backend: Backend) -> TestApp {
    spawn_app_with(backend, |s| {
        s.wechat = crate::wechat::settings();
        s.alipay = crate::alipay::settings();
    })
    .await
}

/// `order(no, 100)` naming a WeChat merchant and an Alipay app.
fn naming(no: &str, mchid: &str, app_id: &str) -> serde_json::Value {
    let mut body = order(no, 100);
    body["wechat_mchid"] = json!(mchid);
    body["alipay_app_id"] = json!(app_id);
    body
}

async fn an_order_naming_both_accounts_stores_both(backend: Backend) {
    let app = app_with_accounts(backend).await;
    let body = naming("P-ACC", "1900000001", "2021000000000001");
    assert_eq!(post_order(&app, None, &body).await.0, 201);
    assert_eq!(
        app.db
            .count(
                "order_account WHERE order_no = 'P-ACC' AND \
                 ((channel = 'wechat' AND account = '1900000001') OR \
                  (channel = 'alipay' AND account = '2021000000000001'))"
            )
            .await,
        2
    );
    assert_eq!(app.db.count("order_account").await, 2);
    assert_eq!(
        named_accounts(&app.store, "P-ACC").await,
        [
            named("alipay", "2021000000000001"),
            named("wechat", "1900000001"),
        ]
    );
    // One named, the other not: one row.
    let mut one = order("P-ONE", 100);
    one["alipay_app_id"] = json!("2021000000000002");
    assert_eq!(post_order(&app, None, &one).await.0, 201);
    assert_eq!(
        named_accounts(&app.store, "P-ONE").await,
        [named("alipay", "2021000000000002")]
    );
    // None named: no row, every account with credentials is asked.
    assert_eq!(post_order(&app, None, &order("P-NONE", 100)).await.0, 201);
    assert!(named_accounts(&app.store, "P-NONE").await.is_empty());
    assert_eq!(app.db.count("order_account").await, 3);
}

async fn an_existing_order_named_again_writes_no_account(backend: Backend) {
    let app = app_with_accounts(backend).await;
    let first = naming("P-AGAIN", "1900000001", "2021000000000001");
    assert_eq!(post_order(&app, None, &first).await.0, 201);
    // Other accounts for the same order_no, with and without a key: 409, nothing written.
    let other = naming("P-AGAIN", "1900000002", "2021000000000002");
    assert_eq!(post_order(&app, None, &other).await.0, 409);
    assert_eq!(post_order(&app, Some("k-again"), &other).await.0, 409);
    assert_eq!(post_order(&app, None, &first).await.0, 409);
    assert_eq!(app.db.count("order_account").await, 2);
    assert_eq!(
        named_accounts(&app.store, "P-AGAIN").await,
        [
            named("alipay", "2021000000000001"),
            named("wechat", "1900000001"),
        ]
    );
}

async fn an_unconfigured_account_is_400_naming_its_provider(backend: Backend) {
    let app = app_with_accounts(backend).await;
    for (field, id, message) in [
        (
            "wechat_mchid",
            "1999999999",
            "wechat_mchid: 1999999999 is not a configured wechat merchant/app",
        ),
        // An Alipay app id is not a WeChat merchant, nor the other way round.
        (
            "wechat_mchid",
            "2021000000000001",
            "wechat_mchid: 2021000000000001 is not a configured wechat merchant/app",
        ),
        (
            "alipay_app_id",
            "1900000001",
            "alipay_app_id: 1900000001 is not a configured alipay merchant/app",
        ),
    ] {
        let mut body = order("P-UNKNOWN", 100);
        body[field] = json!(id);
        let (status, answer) = post_order(&app, None, &body).await;
        assert_eq!(status, 400, "{answer}");
        let answer: serde_json::Value = serde_json::from_str(&answer).expect("error JSON");
        assert_eq!(answer["error"], message);
    }
    assert_eq!(app.db.count("orders").await, 0);
    assert_eq!(app.db.count("order_account").await, 0);
}

/// Every route of the internal API that changes something: method, path, JSON body.
const CHANGING: [(&str, &str, Option<&str>); 9] = [
    (
        "POST",
        "/orders",
        Some(r#"{"order_no": "XS-NEW", "amount_fen": 100, "currency": "CNY", "subject": "s"}"#),
    ),
    ("POST", "/orders/XS-1/close", None),
    (
        "POST",
        "/orders/XS-1/refunds",
        Some(r#"{"out_refund_no": "XS-R1", "amount_fen": 100}"#),
    ),
    ("POST", "/admin/messages/{dead}/redrive", None),
    ("POST", "/admin/orders/XS-1/reconcile", None),
    ("POST", "/admin/certificates/refresh", None),
    ("POST", "/admin/bills/reconcile?date=2026-12-01", None),
    ("POST", "/admin/receipts/reapply", None),
    ("POST", "/admin/receipts/{receipt}/reapply", None),
];

/// A gateway in front may add the bearer header to every request of a browser: then a page
/// of another site could post to the API. What a browser says of where it sent a request
/// from (`Sec-Fetch-Site`, else `Origin`) is refused on every route that changes something,
/// as the console refuses it, whatever the credential.
async fn with_the_token_a_browser_on_another_site_changes_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_order("XS-1", 100).await;
    crate::support::test_channel::paid_order(&app, "XS-PAID", 100).await;
    app.db
        .execute("UPDATE local_message SET status = 2 WHERE biz_key LIKE 'XS-PAID%'")
        .await;
    let dead = app.store.messages(Some(2), 10).await.expect("messages")[0].id;
    app.store
        .insert_receipts(&[paynotify::receipts::store::NewReceipt {
            channel: "wechat".into(),
            route: Some("/notify/wechat/pay".into()),
            received_at: paynotify::time::Clock::now(app.clock.as_ref()),
            peer: None,
            request_id: None,
            headers: paynotify::store::types::Payload(json!({})),
            body_b64: String::new(),
            body_bytes: 0,
            status: 401,
            outcome: "bad_signature".into(),
            detail: None,
            out_trade_no: None,
        }])
        .await
        .expect("receipt");
    let receipt = app.db.count("notify_receipt").await;
    assert_eq!(receipt, 1);
    let receipt_id = app
        .store
        .receipts(&paynotify::receipts::store::ReceiptFilter {
            limit: 1,
            ..Default::default()
        })
        .await
        .expect("receipts")[0]
        .id;
    let send = |method: &str, path: &str, body: Option<&str>, header: Option<(&str, &str)>| {
        let path = path
            .replace("{dead}", &dead.to_string())
            .replace("{receipt}", &receipt_id.to_string());
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = app
            .client
            .request(method, app.url(&path))
            .bearer_auth(&app.api_token);
        if let Some(body) = body {
            request = request
                .header("Content-Type", "application/json")
                .body(body.to_owned());
        }
        if let Some((name, value)) = header {
            request = request.header(name, value);
        }
        async move {
            let response = request.send().await.expect("request");
            let status = response.status().as_u16();
            (status, response.text().await.expect("body"))
        }
    };
    let unchanged = || async {
        assert_eq!(app.db.count("orders").await, 2, "no order made");
        assert_eq!(app.status_of("XS-1").await, "WAIT_PAY", "not closed");
        assert_eq!(app.db.count("refund_request").await, 0, "no refund");
        assert_eq!(
            app.store.message_status(dead).await.expect("status"),
            Some(2),
            "still dead"
        );
        assert_eq!(
            app.db
                .count("notify_receipt WHERE reapplied_at IS NOT NULL")
                .await,
            0,
            "not re-applied"
        );
    };
    for (method, path, body) in CHANGING {
        for header in [
            ("Sec-Fetch-Site", "cross-site"),
            ("Sec-Fetch-Site", "same-site"),
            ("Origin", "http://evil.example"),
            ("Origin", "null"),
        ] {
            let (status, answer) = send(method, path, body, Some(header)).await;
            assert_eq!(status, 403, "{method} {path} with {header:?}: {answer}");
            assert!(
                answer.contains("requests a browser sends from another site are refused"),
                "{method} {path}: {answer}"
            );
        }
        unchanged().await;
    }
    // Reads are not refused: a page of another site cannot read the answer.
    let (status, _) = send(
        "GET",
        "/orders/XS-1",
        None,
        Some(("Sec-Fetch-Site", "cross-site")),
    )
    .await;
    assert_eq!(status, 200);
    // The same requests from this origin, or from a program (neither header), get through.
    for (i, (method, path, body)) in CHANGING.into_iter().enumerate() {
        let header = (i % 2 == 0).then_some(("Sec-Fetch-Site", "same-origin"));
        let (status, answer) = send(method, path, body, header).await;
        assert!(
            status != 403 && status != 401,
            "{method} {path} with {header:?}: {status} {answer}"
        );
    }
    assert_eq!(app.status_of("XS-1").await, "CLOSED");
    assert_eq!(
        app.store.message_status(dead).await.expect("status"),
        Some(0)
    );
}
