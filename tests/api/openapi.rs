//! The OpenAPI document: generated from the code, committed in docs/, served at /openapi.json.

use crate::support::helpers::{Backend, spawn_app};

const COMMITTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json");

/// Regenerate with `PAYNOTIFY_WRITE_OPENAPI=1 cargo test --test api openapi`.
#[test]
fn the_committed_openapi_document_is_the_generated_one() {
    let generated = paynotify::routes::openapi::pretty_json();
    if std::env::var_os("PAYNOTIFY_WRITE_OPENAPI").is_some() {
        std::fs::write(COMMITTED, format!("{generated}\n")).expect("write docs/openapi.json");
    }
    let committed = std::fs::read_to_string(COMMITTED).expect("docs/openapi.json");
    assert!(
        committed.trim_end() == generated.trim_end(),
        "docs/openapi.json differs from the code; regenerate it with \
         PAYNOTIFY_WRITE_OPENAPI=1 cargo test --test api openapi"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_is_documented_and_the_document_is_served() {
    let app = spawn_app(Backend::Sqlite).await;
    let served: serde_json::Value = app
        .client
        .get(app.url("/openapi.json"))
        .send()
        .await
        .expect("openapi.json")
        .json()
        .await
        .expect("JSON");
    assert!(
        served["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3."))
    );
    let mut paths: Vec<String> = served["paths"]
        .as_object()
        .expect("paths")
        .keys()
        .cloned()
        .collect();
    paths.sort();
    assert_eq!(
        paths,
        [
            "/admin/bills",
            "/admin/bills/reconcile",
            "/admin/callbacks",
            "/admin/certificates",
            "/admin/certificates/refresh",
            "/admin/merchants",
            "/admin/merchants/{channel}/{account}",
            "/admin/messages",
            "/admin/messages/{id}/redrive",
            "/admin/orders/{order_no}/reconcile",
            "/admin/receipts",
            "/admin/receipts/reapply",
            "/admin/receipts/{id}",
            "/admin/receipts/{id}/reapply",
            "/combined-orders",
            "/combined-orders/{combine_out_trade_no}",
            "/combined-orders/{combine_out_trade_no}/close",
            "/healthz",
            "/metrics",
            "/notify/alipay",
            "/notify/alipay/gateway",
            "/notify/wechat/pay",
            "/notify/wechat/pay/{account}",
            "/notify/wechat/refund",
            "/notify/wechat/refund/{account}",
            "/notify/wechat/transfer",
            "/openapi.json",
            "/orders",
            "/orders/{order_no}",
            "/orders/{order_no}/close",
            "/orders/{order_no}/refunds",
            "/readyz",
            "/transfers",
            "/transfers/{out_bill_no}",
            "/transfers/{out_bill_no}/cancel",
        ]
    );
    // A refund shows exactly the keys of interface.md ("Refunds started through paynotify").
    let refund = &served["components"]["schemas"]["RefundView"]["properties"];
    let mut keys: Vec<&String> = refund
        .as_object()
        .expect("RefundView schema")
        .keys()
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "amount_fen",
            "channel",
            "created_at",
            "error_code",
            "error_message",
            "order_no",
            "out_refund_no",
            "reason",
            "refund_id",
            "status",
            "updated_at"
        ]
    );
    let order = &served["components"]["schemas"]["Order"]["properties"];
    let mut keys: Vec<&String> = order.as_object().expect("Order schema").keys().collect();
    keys.sort();
    assert_eq!(keys, crate::support::helpers::ORDER_KEYS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_callbacks_without_order_no_is_a_documented_400() {
    let app = spawn_app(Backend::Sqlite).await;
    let response = app
        .client
        .get(app.url("/admin/callbacks"))
        .bearer_auth(&app.api_token)
        .send()
        .await
        .expect("GET /admin/callbacks");
    assert_eq!(response.status(), 400);
    let document: serde_json::Value =
        serde_json::from_str(&paynotify::routes::openapi::pretty_json()).expect("JSON");
    assert!(
        document["paths"]["/admin/callbacks"]["get"]["responses"]["400"].is_object(),
        "the 400 is in the OpenAPI document"
    );
}
