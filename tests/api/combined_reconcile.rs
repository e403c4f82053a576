//! A WeChat combination asked about whole (interface.md, "Asking WeChat"), against the
//! stand-in's combine endpoints (`support/wechat_combine.rs`), on every backend: a lost
//! combined notification recovered by one combine query, the close at expiry and through the
//! API, a paid combination never closed, and the ordinary endpoints never used for a
//! sub-order.

use paynotify::notice::{
    ChannelId, Combination, MerchantIds, Notice, NoticeKind, Outcome, SubPayment,
};
use paynotify::time::Clock;
use serde_json::{Value, json};

use crate::reconcile::{MCHID, app_with, fake, post};
use crate::support::helpers::{Backend, TestApp};
use crate::support::provider::FakeProvider;
use crate::support::wechat_combine::{Call, State, transaction_id};

crate::on_every_backend!(
    a_lost_combined_notification_is_recovered_by_one_combine_query,
    expiry_closes_the_combination_whole_at_wechat_first,
    a_combination_paid_at_wechat_is_applied_at_expiry_never_closed,
    the_close_endpoint_closes_the_combination_whole,
    a_sub_order_is_refunded_on_its_own,
);

const APPID: &str = "wx0000000000000001";
const OTHER_MCHID: &str = "1900000002";
/// `[reconcile]` of `crate::reconcile::configure`.
const AFTER_SECS: i64 = 300;
const EXPIRE_SECS: i64 = 1800;

/// Combination `no` of [`MCHID`] here and at the stand-in: `{no}-1` (100 fen, [`MCHID`]) and
/// `{no}-2` (250 fen, [`OTHER_MCHID`]).
async fn combination(app: &TestApp, fake: &FakeProvider, no: &str) {
    let body = json!({"combine_out_trade_no": no, "channel": "wechat", "account": MCHID,
        "expire_after_secs": EXPIRE_SECS,
        "sub_orders": [{"order_no": format!("{no}-1"), "amount_fen": 100},
                       {"order_no": format!("{no}-2"), "amount_fen": 250, "account": OTHER_MCHID}]});
    let response = app
        .client
        .post(app.url("/combined-orders"))
        .bearer_auth(&app.api_token)
        .json(&body)
        .send()
        .await
        .expect("POST /combined-orders");
    assert_eq!(response.status(), 201);
    let (one, two) = (format!("{no}-1"), format!("{no}-2"));
    fake.state.wechat_combinations.register(
        no,
        MCHID,
        APPID,
        &[(MCHID, &one, 100), (OTHER_MCHID, &two, 250)],
    );
}

async fn view(app: &TestApp, no: &str) -> Value {
    let response = app
        .client
        .get(app.url(&format!("/combined-orders/{no}")))
        .bearer_auth(&app.api_token)
        .send()
        .await
        .expect("GET");
    response.json().await.expect("JSON")
}

fn calls(fake: &FakeProvider, no: &str) -> Vec<Call> {
    fake.state
        .wechat_combinations
        .asked()
        .into_iter()
        .filter(|a| a.combine_out_trade_no == no)
        .map(|a| a.call)
        .collect()
}

/// The combined notification WeChat would send for `no` once paid.
fn notification(no: &str) -> Notice {
    let sub = |out_trade_no: String, amount_fen: i64, mchid: &str| SubPayment {
        transaction_id: transaction_id(&out_trade_no),
        out_trade_no,
        amount_fen,
        currency: "CNY".into(),
        mchid: mchid.into(),
        trade_state: "SUCCESS".into(),
        occurred_at: None,
    };
    Notice {
        channel: ChannelId::Wechat,
        kind: NoticeKind::Combined(Box::new(Combination {
            subs: vec![
                sub(format!("{no}-1"), 100, MCHID),
                sub(format!("{no}-2"), 250, OTHER_MCHID),
            ],
        })),
        out_trade_no: no.into(),
        transaction_id: String::new(),
        amount_fen: 350,
        currency: "CNY".into(),
        merchant: MerchantIds {
            merchant_id: MCHID.into(),
            app_id: Some(APPID.into()),
        },
        merchant_matches: true,
        occurred_at: None,
    }
}

async fn a_lost_combined_notification_is_recovered_by_one_combine_query(backend: Backend) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    combination(&app, &fake, "RC-1").await;
    fake.state.wechat_combinations.pay("RC-1");
    app.clock.advance(AFTER_SECS + 1);
    let recovered = app
        .reconciler
        .reconcile_due(app.clock.now())
        .await
        .expect("reconcile");
    assert_eq!(recovered, 1, "one combination recovered");
    // One combine query for the whole combination, never the ordinary query of a sub-order.
    assert_eq!(calls(&fake, "RC-1"), [Call::Query]);
    for no in ["RC-1-1", "RC-1-2"] {
        let order = app.get_order(no).await;
        assert_eq!(order["status"], "PAID", "{no}");
        assert_eq!(order["transaction_id"], transaction_id(no), "{no}");
    }
    assert_eq!(view(&app, "RC-1").await["status"], "PAID");
    let paid = app.outbox("ORDER_PAID").await;
    assert_eq!(paid.len(), 2);
    assert!(
        paid.iter()
            .all(|m| m.payload.0["combine_out_trade_no"] == "RC-1")
    );
    // The notification that comes later is a duplicate.
    let outcome = app
        .store
        .apply(&notification("RC-1"), app.clock.now())
        .await
        .expect("apply");
    assert_eq!(outcome, Outcome::Duplicate);
    assert_eq!(app.messages("ORDER_PAID").await, 2);
    // Not asked again within reconcile.every_secs.
    app.reconciler
        .reconcile_due(app.clock.now())
        .await
        .expect("reconcile");
    assert_eq!(calls(&fake, "RC-1").len(), 1);

    // The admin reconcile of a sub-order asks about its combination.
    combination(&app, &fake, "RC-2").await;
    let response = post(&app, "/admin/orders/RC-2-2/reconcile").await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(body["providers"][0]["call"], "combine_query", "{body}");
    assert_eq!(body["providers"][0]["answer"], "found", "{body}");
    assert_eq!(body["status"], "WAIT_PAY");
}

async fn expiry_closes_the_combination_whole_at_wechat_first(backend: Backend) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    combination(&app, &fake, "EX-1").await;
    app.clock.advance(EXPIRE_SECS + 1);
    let closed = app.expire_now().await;
    assert_eq!(closed, 1, "the combination closed as one");
    assert_eq!(
        calls(&fake, "EX-1"),
        [Call::Query, Call::Close, Call::Query],
        "asked, closed whole, and the query decided"
    );
    let close = fake
        .state
        .wechat_combinations
        .asked()
        .into_iter()
        .find(|a| a.call == Call::Close)
        .expect("a close");
    assert_eq!(close.body["combine_appid"], APPID);
    assert_eq!(
        close.body["sub_orders"],
        json!([{"mchid": MCHID, "out_trade_no": "EX-1-1"},
               {"mchid": OTHER_MCHID, "out_trade_no": "EX-1-2"}])
    );
    assert_eq!(
        fake.state.wechat_combinations.state("EX-1"),
        Some(State::Closed)
    );
    assert_eq!(view(&app, "EX-1").await["status"], "CLOSED");
    let closed = app.outbox("ORDER_CLOSED").await;
    assert_eq!(closed.len(), 2, "one ORDER_CLOSED per sub-order");
    assert!(
        closed
            .iter()
            .all(|m| m.payload.0["combine_out_trade_no"] == "EX-1")
    );
    // A payment that lands after the close is PAID_AFTER_CLOSE, never a payment.
    let outcome = app
        .store
        .apply(&notification("EX-1"), app.clock.now())
        .await
        .expect("apply");
    assert_eq!(
        outcome,
        Outcome::Anomaly(paynotify::notice::AnomalyReason::PaidAfterClose)
    );
    assert_eq!(app.status_of("EX-1-1").await, "CLOSED");
}

async fn a_combination_paid_at_wechat_is_applied_at_expiry_never_closed(backend: Backend) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    combination(&app, &fake, "EP-1").await;
    fake.state.wechat_combinations.pay("EP-1");
    app.clock.advance(EXPIRE_SECS + 1);
    assert_eq!(app.expire_now().await, 0);
    assert!(
        !calls(&fake, "EP-1").contains(&Call::Close),
        "a paid combination is not closed"
    );
    assert_eq!(view(&app, "EP-1").await["status"], "PAID");
    assert_eq!(app.messages("ORDER_CLOSED").await, 0);
    assert_eq!(app.messages("ORDER_PAID").await, 2);
}

async fn the_close_endpoint_closes_the_combination_whole(backend: Backend) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    combination(&app, &fake, "CL-1").await;
    // A sub-order alone is not closed: 409, nothing sent.
    let response = post(&app, "/orders/CL-1-1/close").await;
    assert_eq!(response.status(), 409);
    assert!(calls(&fake, "CL-1").is_empty());
    let response = post(&app, "/combined-orders/CL-1/close").await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(body["status"], "CLOSED", "{body}");
    assert_eq!(body["sub_orders"][1]["status"], "CLOSED");
    assert!(calls(&fake, "CL-1").contains(&Call::Close));
    // Again: already closed, 200, nothing more sent.
    let asked = calls(&fake, "CL-1").len();
    assert_eq!(
        post(&app, "/combined-orders/CL-1/close").await.status(),
        200
    );
    assert_eq!(calls(&fake, "CL-1").len(), asked);
    assert_eq!(
        post(&app, "/combined-orders/NOPE/close").await.status(),
        404
    );
    // Paid at WeChat before the close: the payment is applied, 409.
    combination(&app, &fake, "CL-2").await;
    fake.state.wechat_combinations.pay("CL-2");
    let response = post(&app, "/combined-orders/CL-2/close").await;
    assert_eq!(response.status(), 409);
    assert_eq!(view(&app, "CL-2").await["status"], "PAID");
    // WeChat unreachable: 503, the combination stays open.
    combination(&app, &fake, "CL-3").await;
    fake.state
        .down
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let response = post(&app, "/combined-orders/CL-3/close").await;
    assert_eq!(response.status(), 503);
    assert_eq!(view(&app, "CL-3").await["status"], "WAIT_PAY");
}

async fn a_sub_order_is_refunded_on_its_own(backend: Backend) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    combination(&app, &fake, "RF-1").await;
    fake.state.wechat_combinations.pay("RF-1");
    let outcome = app
        .store
        .apply(&notification("RF-1"), app.clock.now())
        .await
        .expect("apply");
    assert_eq!(outcome, Outcome::Applied);
    // WeChat holds each sub-order's payment as a transaction of its own.
    for (no, fen) in [("RF-1-1", 100), ("RF-1-2", 250)] {
        fake.state.set(
            no,
            crate::support::provider::Trade::Paid {
                transaction_id: transaction_id(no),
                total: fen,
            },
        );
    }
    let response = app
        .client
        .post(app.url("/orders/RF-1-1/refunds"))
        .bearer_auth(&app.api_token)
        .json(&json!({"out_refund_no": "RF-1-1-R1", "amount_fen": 100}))
        .send()
        .await
        .expect("POST refunds");
    assert_eq!(response.status(), 202);
    let refund: Value = response.json().await.expect("JSON");
    assert_eq!(refund["status"], "SUCCESS", "{refund}");
    // Sent for the sub-order's own payment (through its own account, which has API
    // credentials), its amount.total the sub-order's, not the combination's.
    let held = fake.state.refunds.lock().expect("refunds")["RF-1-1-R1"].clone();
    assert_eq!(held.transaction_id, transaction_id("RF-1-1"));
    assert_eq!((held.total, held.refund_fen), (100, 100));
    assert_eq!(app.status_of("RF-1-1").await, "REFUNDED");
    assert_eq!(app.status_of("RF-1-2").await, "PAID");
    let refunded = app.outbox("ORDER_REFUNDED").await;
    assert_eq!(refunded.len(), 1);
    assert_eq!(refunded[0].payload.0["order_no"], "RF-1-1");
    assert_eq!(refunded[0].payload.0["combine_out_trade_no"], "RF-1");
    assert_eq!(view(&app, "RF-1").await["status"], "PAID");
}
