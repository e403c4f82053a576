//! Refunds started through paynotify (`POST /orders/{no}/refunds`), followed to the end against
//! the stand-in providers (`support/provider.rs`), which check every request's signature,
//! sign every answer and deduplicate on the refund number as the real ones do.

use std::sync::atomic::Ordering;

use paynotify::config::Settings;
use paynotify::metrics::Metrics;
use paynotify::qa::forge::{alipay, wechat};
use paynotify::time::Clock;
use serde_json::{Value, json};

use crate::reconcile::{configure, create, fake, notify_paid, paid_at, transaction_id};
use crate::support::helpers::{Backend, TestApp, released_together, spawn_app_with};
use crate::support::provider::{FakeProvider, RefundStatus, Refusal, Signing};

/// `[refunds]` in these tests.
const QUERY_AFTER_SECS: i64 = 60;
const QUERY_EVERY_SECS: i64 = 300;

async fn app_with(backend: Backend, fake: &FakeProvider) -> TestApp {
    let url = fake.url.clone();
    spawn_app_with(backend, move |s: &mut Settings| {
        configure(s, &url);
        // Shorter than the stand-in's hang, so a hung create is a timeout.
        s.provider_api.timeout_ms = 1000;
        s.refunds.query_after_secs = QUERY_AFTER_SECS as u64;
        s.refunds.query_every_secs = QUERY_EVERY_SECS as u64;
    })
    .await
}

/// An order of `fen` paid through `channel` (its notification applied), and paid at the
/// stand-in provider too.
async fn paid_order(app: &TestApp, fake: &FakeProvider, no: &str, fen: i64, channel: &str) {
    create(app, no, fen, channel).await;
    paid_at(fake, no, fen, channel);
    let status = notify_paid(app, channel, no, fen).await;
    assert!(status == 200 || status == 204, "{no}: {status}");
    assert_eq!(app.status_of(no).await, "PAID");
}

async fn refund(app: &TestApp, no: &str, body: &Value) -> (u16, Value) {
    let response = app
        .client
        .post(app.url(&format!("/orders/{no}/refunds")))
        .bearer_auth(&app.api_token)
        .json(body)
        .send()
        .await
        .expect("POST refunds");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn ask(app: &TestApp, no: &str, out_refund_no: &str, fen: i64) -> (u16, Value) {
    refund(
        app,
        no,
        &json!({"out_refund_no": out_refund_no, "amount_fen": fen, "reason": "售后退款"}),
    )
    .await
}

async fn listed(app: &TestApp, no: &str) -> (u16, Value) {
    let response = app
        .client
        .get(app.url(&format!("/orders/{no}/refunds")))
        .bearer_auth(&app.api_token)
        .send()
        .await
        .expect("GET refunds");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The status of `out_refund_no` as `GET /orders/{no}/refunds` shows it.
async fn status_of(app: &TestApp, no: &str, out_refund_no: &str) -> String {
    let (_, all) = listed(app, no).await;
    all.as_array()
        .and_then(|all| {
            all.iter()
                .find(|r| r["out_refund_no"] == out_refund_no)
                .and_then(|r| r["status"].as_str())
        })
        .unwrap_or("none")
        .to_owned()
}

/// The refund job's run now.
async fn drive(app: &TestApp) -> usize {
    app.refunds.drive_due().await.expect("refund job")
}

/// The refund notification of `out_refund_no` (`fen` of an order of `total`), as the provider
/// sends it; Alipay's carries the trade's running total `refunded_total`.
async fn notify_refund(
    app: &TestApp,
    channel: &str,
    no: &str,
    out_refund_no: &str,
    fen: i64,
    total: i64,
    refunded_total: i64,
) -> u16 {
    let transaction = transaction_id(channel, no);
    match channel {
        "wechat" => {
            let s = crate::wechat::sandbox('A');
            let plaintext = wechat::refund(&s, no, &transaction, out_refund_no, fen, total);
            let d = s
                .notification("REFUND.SUCCESS", &plaintext, app.clock.now().unix_seconds())
                .expect("forge");
            crate::support::helpers::post_delivery(app, "/notify/wechat/refund", &d)
                .await
                .0
        }
        _ => {
            let s = crate::alipay::sandbox();
            let fields = alipay::refund(&s, no, &transaction, total, out_refund_no, refunded_total);
            crate::alipay::send(app, &crate::alipay::signed(fields))
                .await
                .0
        }
    }
}

fn acknowledged(status: u16) -> bool {
    status == 200 || status == 204
}

fn created(fake: &FakeProvider) -> usize {
    fake.state.refunds_created()
}

async fn sent_then_the_rest_and_the_order_moves_once(backend: Backend, channel: &str) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    let no = format!("RF-ONCE-{channel}");
    paid_order(&app, &fake, &no, 10000, channel).await;

    let (status, first) = ask(&app, &no, "R-1", 4000).await;
    assert_eq!(status, 202, "{first}");
    assert_eq!(first["status"], "SUCCESS", "{first}");
    assert_eq!(first["order_no"], no.as_str());
    assert_eq!(first["channel"], channel);
    assert_eq!(first["amount_fen"], 4000);
    assert!(first["created_at"].is_string() && first["updated_at"].is_string());
    assert_eq!(app.refund_state(&no).await, ("PAID".to_owned(), 4000));
    assert_eq!(app.messages("ORDER_REFUNDED").await, 1);

    // The notification of the same refund, after the answer: a duplicate.
    assert!(acknowledged(
        notify_refund(&app, channel, &no, "R-1", 4000, 10000, 4000).await
    ));
    assert_eq!(app.messages("ORDER_REFUNDED").await, 1);
    assert_eq!(app.refund_state(&no).await, ("PAID".to_owned(), 4000));

    // The same request again: the stored refund, nothing sent.
    let calls = fake.state.calls().len();
    let (status, again) = ask(&app, &no, "R-1", 4000).await;
    assert_eq!(
        (status, &again["status"]),
        (200, &json!("SUCCESS")),
        "{again}"
    );
    assert_eq!(fake.state.calls().len(), calls);

    // The rest: REFUNDED.
    let (status, rest) = ask(&app, &no, "R-2", 6000).await;
    assert_eq!(
        (status, &rest["status"]),
        (202, &json!("SUCCESS")),
        "{rest}"
    );
    assert_eq!(app.refund_state(&no).await, ("REFUNDED".to_owned(), 10000));
    assert_eq!(app.messages("ORDER_REFUNDED").await, 2);
    assert!(acknowledged(
        notify_refund(&app, channel, &no, "R-2", 6000, 10000, 10000).await
    ));
    assert_eq!(app.messages("ORDER_REFUNDED").await, 2);
    // Nothing is left: a third is refused before anything is sent.
    let (status, _) = ask(&app, &no, "R-3", 1).await;
    assert_eq!(status, 409);
    assert_eq!(created(&fake), 2);
    assert_eq!(app.messages("PAYMENT_ANOMALY").await, 0);

    let (status, all) = listed(&app, &no).await;
    assert_eq!(status, 200);
    let all = all.as_array().expect("a list").clone();
    let numbers: Vec<&str> = all
        .iter()
        .filter_map(|r| r["out_refund_no"].as_str())
        .collect();
    assert_eq!(numbers, ["R-1", "R-2"]);
    assert!(all.iter().all(|r| r["status"] == "SUCCESS"));
    assert_eq!(Metrics::count(&app.metrics.refunds_started, &[channel]), 2);
    assert_eq!(
        Metrics::count(&app.metrics.refunds_final, &[channel, "success"]),
        2
    );
    assert_eq!(fake.state.refused.load(Ordering::SeqCst), 0);
}

async fn bad_requests_send_nothing(backend: Backend) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    paid_order(&app, &fake, "RF-BAD", 1000, "wechat").await;
    create(&app, "RF-UNPAID", 1000, "wechat").await;
    create(&app, "RF-CLOSED", 1000, "wechat").await;
    assert_eq!(
        crate::reconcile::post(&app, "/orders/RF-CLOSED/close")
            .await
            .status(),
        200
    );

    for (fen, status) in [(0, 400), (-5, 400), (1001, 409)] {
        assert_eq!(ask(&app, "RF-BAD", "R-X", fen).await.0, status, "{fen}");
    }
    let malformed = [
        json!({"amount_fen": 100}),
        json!({"out_refund_no": "R-X", "amount_fen": "100"}),
        json!({"out_refund_no": "R-X", "amount_fen": 100, "extra": 1}),
        json!({"out_refund_no": "", "amount_fen": 100}),
        json!({"out_refund_no": "R X/1", "amount_fen": 100}),
        json!({"out_refund_no": "R".repeat(65), "amount_fen": 100}),
        json!({"out_refund_no": "R-X", "amount_fen": 100, "reason": "x".repeat(81)}),
    ];
    for body in &malformed {
        let (status, error) = refund(&app, "RF-BAD", body).await;
        assert_eq!(status, 400, "{body}: {error}");
        assert!(error["error"].is_string(), "{error}");
    }
    let (status, error) = ask(&app, "RF-NONE", "R-X", 100).await;
    assert_eq!(status, 404, "{error}");
    for no in ["RF-UNPAID", "RF-CLOSED"] {
        let (status, error) = ask(&app, no, "R-X", 100).await;
        assert_eq!(status, 409, "{no}: {error}");
    }
    assert_eq!(listed(&app, "RF-NONE").await.0, 404);
    assert_eq!(
        fake.state
            .calls()
            .iter()
            .filter(|c| c.0.contains("refund"))
            .count(),
        0
    );
    assert_eq!(app.db.count("refund_request").await, 0);

    // A number is one refund's: another amount or another order is a conflict.
    assert_eq!(ask(&app, "RF-BAD", "R-1", 300).await.0, 202);
    paid_order(&app, &fake, "RF-BAD-2", 1000, "wechat").await;
    assert_eq!(ask(&app, "RF-BAD", "R-1", 301).await.0, 409);
    assert_eq!(ask(&app, "RF-BAD-2", "R-1", 300).await.0, 409);
    // In flight or done, it counts against what is left.
    assert_eq!(ask(&app, "RF-BAD", "R-2", 701).await.0, 409);
    assert_eq!(ask(&app, "RF-BAD", "R-2", 700).await.0, 202);
    assert_eq!(created(&fake), 2);
    assert_eq!(app.db.count("refund_request").await, 2);
    // Without the token: 401.
    let response = app
        .client
        .post(app.url("/orders/RF-BAD/refunds"))
        .json(&json!({"out_refund_no": "R-9", "amount_fen": 1}))
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), 401);
}

/// Where the refund notification comes relative to the query's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Notified {
    Before,
    During,
    After,
}

async fn a_processing_refund_is_queried_until_done(
    backend: Backend,
    channel: &str,
    notified: Notified,
) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    let no = format!("RF-Q-{channel}-{notified:?}");
    paid_order(&app, &fake, &no, 5000, channel).await;
    fake.state.new_refunds(RefundStatus::Processing);

    let (status, body) = ask(&app, &no, "R-Q", 5000).await;
    assert_eq!(
        (status, &body["status"]),
        (202, &json!("PROCESSING")),
        "{body}"
    );
    assert_eq!(app.refund_state(&no).await, ("PAID".to_owned(), 0));
    // In flight: nothing more may be asked for.
    assert_eq!(ask(&app, &no, "R-Q2", 1).await.0, 409);
    // Not due yet.
    app.clock.advance(QUERY_AFTER_SECS - 1);
    assert_eq!(drive(&app).await, 0);
    app.clock.advance(1);
    assert_eq!(drive(&app).await, 1);
    assert_eq!(status_of(&app, &no, "R-Q").await, "PROCESSING");

    // The bank is done.
    fake.state.settle_refund("R-Q", RefundStatus::Success);
    app.clock.advance(QUERY_EVERY_SECS);
    match notified {
        Notified::Before => {
            assert!(acknowledged(
                notify_refund(&app, channel, &no, "R-Q", 5000, 5000, 5000).await
            ));
            // The notification made it SUCCESS: nothing left to ask.
            assert_eq!(status_of(&app, &no, "R-Q").await, "SUCCESS");
            assert_eq!(drive(&app).await, 0);
        }
        Notified::During => {
            let (driven, notice) = tokio::join!(
                drive(&app),
                notify_refund(&app, channel, &no, "R-Q", 5000, 5000, 5000)
            );
            assert!(driven <= 1);
            assert!(acknowledged(notice), "{notice}");
        }
        Notified::After => {
            assert_eq!(drive(&app).await, 1);
            assert_eq!(status_of(&app, &no, "R-Q").await, "SUCCESS");
            assert!(acknowledged(
                notify_refund(&app, channel, &no, "R-Q", 5000, 5000, 5000).await
            ));
        }
    }
    assert_eq!(status_of(&app, &no, "R-Q").await, "SUCCESS");
    assert_eq!(app.refund_state(&no).await, ("REFUNDED".to_owned(), 5000));
    assert_eq!(app.messages("ORDER_REFUNDED").await, 1);
    assert_eq!(app.messages("PAYMENT_ANOMALY").await, 0);
    // Final: never asked about again.
    app.clock.advance(QUERY_EVERY_SECS * 10);
    assert_eq!(drive(&app).await, 0);
    assert_eq!(created(&fake), 1);
}

async fn a_provider_that_hangs_after_creating_answers_the_retry(backend: Backend, channel: &str) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    let no = format!("RF-HANG-{channel}");
    paid_order(&app, &fake, &no, 3000, channel).await;
    fake.state.hang_after_creating(1);

    let (status, body) = ask(&app, &no, "R-H", 1000).await;
    // Unknown, never failure.
    assert_eq!(
        (status, &body["status"]),
        (202, &json!("SUBMITTING")),
        "{body}"
    );
    assert_eq!(created(&fake), 1);
    assert_eq!(app.refund_state(&no).await, ("PAID".to_owned(), 0));
    // The same request again while unknown: the stored one, not a second call.
    let calls = fake.state.calls().len();
    assert_eq!(ask(&app, &no, "R-H", 1000).await.0, 200);
    assert_eq!(fake.state.calls().len(), calls);

    // The job sends it again under the same number (never sooner than a call may take):
    // the provider answers the refund it has.
    app.clock.advance(5);
    assert_eq!(drive(&app).await, 0);
    app.clock.advance(5);
    assert_eq!(drive(&app).await, 1);
    if channel == "alipay" {
        // Alipay's repeat says fund_change N: its query says whether it is done.
        assert_eq!(status_of(&app, &no, "R-H").await, "PROCESSING");
        app.clock.advance(QUERY_AFTER_SECS);
        assert_eq!(drive(&app).await, 1);
    }
    assert_eq!(status_of(&app, &no, "R-H").await, "SUCCESS");
    assert_eq!(app.refund_state(&no).await, ("PAID".to_owned(), 1000));
    assert_eq!(created(&fake), 1);
    assert_eq!(app.messages("ORDER_REFUNDED").await, 1);
    // Its notification, late: a duplicate.
    assert!(acknowledged(
        notify_refund(&app, channel, &no, "R-H", 1000, 3000, 1000).await
    ));
    assert_eq!(app.messages("ORDER_REFUNDED").await, 1);
    assert_eq!(app.messages("PAYMENT_ANOMALY").await, 0);
}

async fn no_usable_answer_is_never_failure(backend: Backend, channel: &str) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    let no = format!("RF-NOANS-{channel}");
    paid_order(&app, &fake, &no, 2000, channel).await;

    // Down, then answers signed by someone else, then unsigned: SUBMITTING throughout, and
    // the same number is sent each time.
    fake.state.down.store(true, Ordering::SeqCst);
    let (status, body) = ask(&app, &no, "R-N", 2000).await;
    assert_eq!(
        (status, &body["status"]),
        (202, &json!("SUBMITTING")),
        "{body}"
    );
    fake.state.down.store(false, Ordering::SeqCst);
    for signing in [Signing::Forger, Signing::Unsigned] {
        *fake.state.signing.lock().expect("signing") = signing;
        app.clock.advance(600);
        assert_eq!(drive(&app).await, 1);
        assert_eq!(
            status_of(&app, &no, "R-N").await,
            "SUBMITTING",
            "{signing:?}"
        );
        assert_eq!(app.refund_state(&no).await, ("PAID".to_owned(), 0));
    }
    *fake.state.signing.lock().expect("signing") = Signing::Provider;
    // Still in flight: nothing more may be asked for.
    assert_eq!(ask(&app, &no, "R-N2", 1).await.0, 409);
    app.clock.advance(600);
    assert_eq!(drive(&app).await, 1);
    if channel == "alipay" && status_of(&app, &no, "R-N").await == "PROCESSING" {
        app.clock.advance(QUERY_AFTER_SECS);
        assert_eq!(drive(&app).await, 1);
    }
    assert_eq!(status_of(&app, &no, "R-N").await, "SUCCESS");
    assert_eq!(app.refund_state(&no).await, ("REFUNDED".to_owned(), 2000));
    assert_eq!(created(&fake), 1);
    assert_eq!(app.messages("ORDER_REFUNDED").await, 1);
}

async fn a_refusal_is_abnormal_with_the_providers_code(backend: Backend, channel: &str) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    let no = format!("RF-NO-{channel}");
    paid_order(&app, &fake, &no, 2000, channel).await;
    fake.state.refuse_refunds(Some(Refusal::BalanceNotEnough));

    let (status, body) = ask(&app, &no, "R-B", 2000).await;
    assert_eq!(
        (status, &body["status"]),
        (202, &json!("ABNORMAL")),
        "{body}"
    );
    let code = match channel {
        "wechat" => "NOT_ENOUGH",
        _ => "ACQ.SELLER_BALANCE_NOT_ENOUGH",
    };
    assert_eq!(body["error_code"], code, "{body}");
    assert!(body["error_message"].is_string(), "{body}");
    assert_eq!(
        Metrics::count(&app.metrics.refunds_final, &[channel, "refused"]),
        1
    );
    // Final: the job leaves it alone, and it holds nothing back.
    app.clock.advance(3600);
    assert_eq!(drive(&app).await, 0);
    // The balance topped up, the same request sends it again.
    fake.state.refuse_refunds(None);
    let (status, body) = ask(&app, &no, "R-B", 2000).await;
    assert_eq!(
        (status, &body["status"]),
        (202, &json!("SUCCESS")),
        "{body}"
    );
    assert!(body.get("error_code").is_none(), "{body}");
    assert_eq!(app.refund_state(&no).await, ("REFUNDED".to_owned(), 2000));
    assert_eq!(created(&fake), 1);
}

async fn two_requests_for_the_last_fen_send_one(backend: Backend, channel: &str) {
    let fake = fake().await;
    let app = std::sync::Arc::new(app_with(backend, &fake).await);
    let no = format!("RF-LAST-{channel}");
    paid_order(&app, &fake, &no, 100, channel).await;
    let statuses = released_together(2, |i| {
        let (app, no) = (std::sync::Arc::clone(&app), no.clone());
        async move { ask(&app, &no, &format!("R-L{i}"), 100).await.0 }
    })
    .await;
    let mut sorted = statuses.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, [202, 409], "{statuses:?}");
    assert_eq!(created(&fake), 1);
    assert_eq!(app.refund_state(&no).await, ("REFUNDED".to_owned(), 100));
    assert_eq!(app.db.count("refund_request").await, 1);
}

/// One out_refund_no asked for at once for two orders: one is recorded and sent, the other is
/// told the number is another refund's (`409`, the API's error shape), never a 500. Several
/// rounds, so the two transactions overlap on every backend that lets them.
async fn one_refund_number_for_two_orders_at_once_is_409(backend: Backend, channel: &str) {
    let fake = fake().await;
    let app = std::sync::Arc::new(app_with(backend, &fake).await);
    const ROUNDS: usize = 6;
    for round in 0..ROUNDS {
        let orders = [
            format!("RF-SAME{round}-A-{channel}"),
            format!("RF-SAME{round}-B-{channel}"),
        ];
        for no in &orders {
            paid_order(&app, &fake, no, 300, channel).await;
        }
        let out_refund_no = format!("R-SAME-{round}");
        let answers = released_together(2, |i| {
            let (app, no, out_refund_no) = (
                std::sync::Arc::clone(&app),
                orders[i].clone(),
                out_refund_no.clone(),
            );
            async move { ask(&app, &no, &out_refund_no, 100).await }
        })
        .await;
        let mut statuses: Vec<u16> = answers.iter().map(|(status, _)| *status).collect();
        statuses.sort_unstable();
        assert_eq!(statuses, [202, 409], "round {round}: {answers:?}");
        let (_, refused) = answers
            .iter()
            .find(|(status, _)| *status == 409)
            .expect("a 409");
        assert_eq!(
            refused,
            &json!({"error": "out_refund_no is another refund's (another order or amount)"}),
            "round {round}"
        );
    }
    assert_eq!(created(&fake), ROUNDS);
    assert_eq!(app.db.count("refund_request").await, ROUNDS as i64);
    assert_eq!(app.messages("ORDER_REFUNDED").await, ROUNDS as i64);
}

async fn a_closed_refund_frees_its_amount(backend: Backend) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    paid_order(&app, &fake, "RF-CL", 800, "wechat").await;
    fake.state.new_refunds(RefundStatus::Processing);
    assert_eq!(ask(&app, "RF-CL", "R-C", 800).await.0, 202);
    fake.state.settle_refund("R-C", RefundStatus::Closed);
    app.clock.advance(QUERY_AFTER_SECS);
    assert_eq!(drive(&app).await, 1);
    assert_eq!(status_of(&app, "RF-CL", "R-C").await, "CLOSED");
    assert_eq!(
        Metrics::count(&app.metrics.refunds_final, &["wechat", "closed"]),
        1
    );
    assert_eq!(app.refund_state("RF-CL").await, ("PAID".to_owned(), 0));
    // Closed without money moving: the amount may be refunded under a new number.
    fake.state.new_refunds(RefundStatus::Success);
    let (status, body) = ask(&app, "RF-CL", "R-C2", 800).await;
    assert_eq!(
        (status, &body["status"]),
        (202, &json!("SUCCESS")),
        "{body}"
    );
    assert_eq!(
        app.refund_state("RF-CL").await,
        ("REFUNDED".to_owned(), 800)
    );
}

/// Alipay's refund query carries no running total, only the refund's own amount: with two
/// refunds of an order in flight, each is applied from the query at the amount asked for,
/// whichever order Alipay did them in; their notifications (each with the trade's running
/// total) are the same refunds.
async fn alipay_refunds_in_flight_together_are_each_applied_at_their_amount(backend: Backend) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    let no = "RF-TWO-alipay";
    paid_order(&app, &fake, no, 3000, "alipay").await;
    fake.state.new_refunds(RefundStatus::Processing);
    assert_eq!(ask(&app, no, "R-A", 1000).await.0, 202);
    assert_eq!(ask(&app, no, "R-B", 500).await.0, 202);
    // Alipay did R-B first, then R-A.
    fake.state.settle_refund("R-B", RefundStatus::Success);
    fake.state.settle_refund("R-A", RefundStatus::Success);
    app.clock.advance(QUERY_AFTER_SECS);
    assert_eq!(drive(&app).await, 2);
    assert_eq!(app.refund_state(no).await, ("PAID".to_owned(), 1500));
    assert_eq!(status_of(&app, no, "R-A").await, "SUCCESS");
    assert_eq!(status_of(&app, no, "R-B").await, "SUCCESS");
    // The notifications, in Alipay's order: running totals 500, then 1500.
    assert!(acknowledged(
        notify_refund(&app, "alipay", no, "R-B", 500, 3000, 500).await
    ));
    assert!(acknowledged(
        notify_refund(&app, "alipay", no, "R-A", 1000, 3000, 1500).await
    ));
    assert_eq!(app.refund_state(no).await, ("PAID".to_owned(), 1500));
    assert_eq!(
        refunds_counted(&app, no).await,
        [("R-A".to_owned(), 1000, 1000), ("R-B".to_owned(), 500, 500)]
    );
    assert_eq!(app.messages("ORDER_REFUNDED").await, 2);
    assert_eq!(app.messages("PAYMENT_ANOMALY").await, 0);
    app.clock.advance(QUERY_EVERY_SECS);
    assert_eq!(drive(&app).await, 0);
}

/// Each refund of the order as the ledger counted it and as its `ORDER_REFUNDED` said it,
/// sorted by number: `(out_refund_no, refund_callback.refund_fen, payload refund_fen)`.
async fn refunds_counted(app: &TestApp, no: &str) -> Vec<(String, i64, i64)> {
    let events: Vec<(String, i64)> = app
        .outbox("ORDER_REFUNDED")
        .await
        .into_iter()
        .map(|m| (m.biz_key, m.payload.0["refund_fen"].as_i64().unwrap_or(-1)))
        .collect();
    let recorded = app.store.callbacks_of(no).await.expect("callbacks");
    let mut counted: Vec<(String, i64, i64)> = recorded
        .refunds
        .iter()
        .map(|r| {
            let key = format!("{no}:{}", r.out_refund_no);
            let event = events
                .iter()
                .find(|(k, _)| *k == key)
                .map_or(-1, |(_, fen)| *fen);
            (r.out_refund_no.clone(), r.refund_fen, event)
        })
        .collect();
    counted.sort();
    counted
}

/// A refund made in Alipay's console, whose notification comes late, after a refund through
/// paynotify was applied from the query (which names that refund's amount, not the trade's
/// running total): each is counted at its own amount, and the order at Alipay's running total.
/// `console_first`: Alipay did the console refund before paynotify's.
async fn alipay_a_console_refund_notified_late(backend: Backend, console_first: bool) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    let no = format!("RF-LATE-{console_first}");
    paid_order(&app, &fake, &no, 1000, "alipay").await;
    fake.state.new_refunds(RefundStatus::Processing);
    assert_eq!(ask(&app, &no, "R-P", 200).await.0, 202);
    fake.state.settle_refund("R-P", RefundStatus::Success);
    app.clock.advance(QUERY_AFTER_SECS);
    assert_eq!(drive(&app).await, 1);
    assert_eq!(status_of(&app, &no, "R-P").await, "SUCCESS");
    assert_eq!(app.refund_state(&no).await, ("PAID".to_owned(), 200));

    // The console refund (300) and R-P (200), with the running totals Alipay reports.
    let (console_total, ours_total) = if console_first {
        (300, 500)
    } else {
        (500, 200)
    };
    // Whether R-P came before it is not known yet: Alipay is asked to deliver it again.
    let late = notify_refund(&app, "alipay", &no, "C-1", 300, 1000, console_total).await;
    assert!(!acknowledged(late), "{late}");
    assert_eq!(app.refund_state(&no).await, ("PAID".to_owned(), 200));
    // R-P's own notification: the refund the query applied, now with its running total.
    let ours = notify_refund(&app, "alipay", &no, "R-P", 200, 1000, ours_total).await;
    assert!(acknowledged(ours), "{ours}");
    let late = notify_refund(&app, "alipay", &no, "C-1", 300, 1000, console_total).await;
    assert!(acknowledged(late), "{late}");
    assert_eq!(app.refund_state(&no).await, ("PAID".to_owned(), 500));
    assert_eq!(
        refunds_counted(&app, &no).await,
        [("C-1".to_owned(), 300, 300), ("R-P".to_owned(), 200, 200)]
    );
    // Every repeat is a duplicate.
    for (out_refund_no, fen, total) in [("C-1", 300, console_total), ("R-P", 200, ours_total)] {
        let again = notify_refund(&app, "alipay", &no, out_refund_no, fen, 1000, total).await;
        assert!(acknowledged(again), "{out_refund_no}: {again}");
    }
    assert_eq!(app.refund_state(&no).await, ("PAID".to_owned(), 500));
    assert_eq!(app.messages("ORDER_REFUNDED").await, 2);
    assert_eq!(app.messages("PAYMENT_ANOMALY").await, 0);
}

/// Two refunds through paynotify, whose notifications come in the other order than Alipay
/// did them: each is counted at the amount it was asked for, not at the running total that
/// arrived first.
async fn alipay_notifications_out_of_order_count_each_refund_at_its_amount(backend: Backend) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    let no = "RF-OOO-alipay";
    paid_order(&app, &fake, no, 3000, "alipay").await;
    fake.state.new_refunds(RefundStatus::Processing);
    assert_eq!(ask(&app, no, "R-A", 1000).await.0, 202);
    assert_eq!(ask(&app, no, "R-B", 500).await.0, 202);
    fake.state.settle_refund("R-A", RefundStatus::Success);
    fake.state.settle_refund("R-B", RefundStatus::Success);
    // Alipay did R-A (running total 1000), then R-B (1500); R-B's notification comes first.
    assert!(acknowledged(
        notify_refund(&app, "alipay", no, "R-B", 500, 3000, 1500).await
    ));
    assert!(acknowledged(
        notify_refund(&app, "alipay", no, "R-A", 1000, 3000, 1000).await
    ));
    assert_eq!(app.refund_state(no).await, ("PAID".to_owned(), 1500));
    assert_eq!(
        refunds_counted(&app, no).await,
        [("R-A".to_owned(), 1000, 1000), ("R-B".to_owned(), 500, 500)]
    );
    assert_eq!(status_of(&app, no, "R-A").await, "SUCCESS");
    assert_eq!(status_of(&app, no, "R-B").await, "SUCCESS");
    assert_eq!(app.messages("PAYMENT_ANOMALY").await, 0);
    app.clock.advance(QUERY_AFTER_SECS);
    assert_eq!(drive(&app).await, 0);
}

/// Two refunds done at once by Alipay (`fund_change` `Y`) whose answers apply out of order:
/// R-A's create hangs past the client's timeout after Alipay did it, R-B's answer (running
/// total 1500, both) applies first, then R-A is found by the job. Each counts its own amount.
async fn alipay_answers_out_of_order_count_each_refund_at_its_amount(backend: Backend) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    let no = "RF-OOA-alipay";
    paid_order(&app, &fake, no, 3000, "alipay").await;
    fake.state.hang_after_creating(1);
    let (status, a) = ask(&app, no, "R-A", 1000).await;
    assert_eq!((status, &a["status"]), (202, &json!("SUBMITTING")), "{a}");
    let (status, b) = ask(&app, no, "R-B", 500).await;
    assert_eq!((status, &b["status"]), (202, &json!("SUCCESS")), "{b}");
    assert_eq!(app.refund_state(no).await, ("PAID".to_owned(), 500));
    // R-A sent again (fund_change N: held before), then queried: done.
    app.clock.advance(10);
    assert_eq!(drive(&app).await, 1);
    app.clock.advance(QUERY_AFTER_SECS);
    assert_eq!(drive(&app).await, 1);
    assert_eq!(status_of(&app, no, "R-A").await, "SUCCESS");
    assert_eq!(app.refund_state(no).await, ("PAID".to_owned(), 1500));
    assert_eq!(
        refunds_counted(&app, no).await,
        [("R-A".to_owned(), 1000, 1000), ("R-B".to_owned(), 500, 500)]
    );
    // Their notifications, late: duplicates.
    assert!(acknowledged(
        notify_refund(&app, "alipay", no, "R-A", 1000, 3000, 1000).await
    ));
    assert!(acknowledged(
        notify_refund(&app, "alipay", no, "R-B", 500, 3000, 1500).await
    ));
    assert_eq!(app.refund_state(no).await, ("PAID".to_owned(), 1500));
    assert_eq!(app.messages("ORDER_REFUNDED").await, 2);
    assert_eq!(app.messages("PAYMENT_ANOMALY").await, 0);
    assert_eq!(created(&fake), 2);
}

macro_rules! channel_tests {
    ($($name:ident => $check:ident($channel:literal $(, $more:expr)*)),* $(,)?) => {
        $(
            async fn $name(backend: Backend) {
                $check(backend, $channel $(, $more)*).await;
            }
        )*
    };
}

channel_tests! {
    wechat_sent_then_the_rest => sent_then_the_rest_and_the_order_moves_once("wechat"),
    alipay_sent_then_the_rest => sent_then_the_rest_and_the_order_moves_once("alipay"),
    wechat_notified_before_the_query => a_processing_refund_is_queried_until_done("wechat", Notified::Before),
    wechat_notified_during_the_query => a_processing_refund_is_queried_until_done("wechat", Notified::During),
    wechat_notified_after_the_query => a_processing_refund_is_queried_until_done("wechat", Notified::After),
    alipay_notified_before_the_query => a_processing_refund_is_queried_until_done("alipay", Notified::Before),
    alipay_notified_during_the_query => a_processing_refund_is_queried_until_done("alipay", Notified::During),
    alipay_notified_after_the_query => a_processing_refund_is_queried_until_done("alipay", Notified::After),
    wechat_hangs_after_creating => a_provider_that_hangs_after_creating_answers_the_retry("wechat"),
    alipay_hangs_after_creating => a_provider_that_hangs_after_creating_answers_the_retry("alipay"),
    wechat_no_usable_answer => no_usable_answer_is_never_failure("wechat"),
    alipay_no_usable_answer => no_usable_answer_is_never_failure("alipay"),
    wechat_refused => a_refusal_is_abnormal_with_the_providers_code("wechat"),
    alipay_refused => a_refusal_is_abnormal_with_the_providers_code("alipay"),
    wechat_last_fen => two_requests_for_the_last_fen_send_one("wechat"),
    alipay_last_fen => two_requests_for_the_last_fen_send_one("alipay"),
    wechat_one_number_two_orders => one_refund_number_for_two_orders_at_once_is_409("wechat"),
    alipay_one_number_two_orders => one_refund_number_for_two_orders_at_once_is_409("alipay"),
    alipay_console_refund_done_first_notified_late => alipay_a_console_refund_notified_late(true),
    alipay_console_refund_done_after_notified_late => alipay_a_console_refund_notified_late(false),
}

crate::on_every_backend!(
    wechat_sent_then_the_rest,
    alipay_sent_then_the_rest,
    bad_requests_send_nothing,
    wechat_notified_before_the_query,
    wechat_notified_during_the_query,
    wechat_notified_after_the_query,
    alipay_notified_before_the_query,
    alipay_notified_during_the_query,
    alipay_notified_after_the_query,
    wechat_hangs_after_creating,
    alipay_hangs_after_creating,
    wechat_no_usable_answer,
    alipay_no_usable_answer,
    wechat_refused,
    alipay_refused,
    wechat_last_fen,
    alipay_last_fen,
    wechat_one_number_two_orders,
    alipay_one_number_two_orders,
    a_closed_refund_frees_its_amount,
    alipay_refunds_in_flight_together_are_each_applied_at_their_amount,
    alipay_console_refund_done_first_notified_late,
    alipay_console_refund_done_after_notified_late,
    alipay_notifications_out_of_order_count_each_refund_at_its_amount,
    alipay_answers_out_of_order_count_each_refund_at_its_amount,
);
