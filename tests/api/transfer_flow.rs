//! Merchant transfers followed to the end against the stand-in providers: every status
//! transition, the timeout that hides a created bill, cancel before and after the user's
//! confirmation, a refusal confirmed by the query, answers that are not the provider's, the
//! notifications that must not move a transfer, and one final event however many report it.

use paynotify::metrics::Metrics;
use paynotify::notice::{ChannelId, Outcome};
use paynotify::time::Clock;
use paynotify::transfer::{TransferSeen, TransferState};
use serde_json::{Value, json};

use crate::reconcile::fake;
use crate::support::helpers::{Backend, TestApp, post_delivery};
use crate::support::provider::{FakeProvider, Signing};
use crate::support::wechat_transfer::{self, Kind, NewBill};
use crate::transfers::{MCHID, app_with, get, post, recorded, start, wechat_body};

crate::on_every_backend!(
    a_wechat_transfer_waits_for_the_user_then_succeeds_once,
    a_create_that_hangs_is_sent_again_under_the_same_number_until_final,
    cancel_before_and_after_the_users_confirmation,
    a_refusal_fails_the_transfer_only_once_the_query_finds_no_bill,
    answers_that_are_not_the_providers_move_nothing,
    notifications_that_must_not_move_a_transfer_raise_one_anomaly,
    two_followers_of_one_transfer_emit_one_final_event,
    an_alipay_transfer_is_final_in_its_answer_and_its_message_is_a_duplicate,
    an_alipay_refusal_fails_and_a_hang_is_sent_again_until_final,
);

/// `[transfers]` timings in these tests (the defaults).
const QUERY_AFTER_SECS: i64 = 60;
const QUERY_EVERY_SECS: i64 = 300;

async fn app(backend: Backend, fake: &FakeProvider) -> TestApp {
    app_with(backend, fake, |_| {}).await
}

/// The transfer job's run now.
async fn drive(app: &TestApp) -> usize {
    app.transfers.drive_due().await.expect("transfer job")
}

async fn shown(app: &TestApp, no: &str) -> Value {
    let (status, transfer) = get(app, no).await;
    assert_eq!(status, 200, "{no}: {transfer}");
    transfer
}

/// `MCHTRANSFER.BILL.FINISHED` of the bill the stand-in holds, posted as WeChat posts it.
async fn notify_finished(app: &TestApp, fake: &FakeProvider, no: &str) -> u16 {
    let s = crate::wechat::sandbox('A');
    let d = fake
        .state
        .wechat_transfers
        .finished(&s, no, app.clock.now().unix_seconds());
    post_delivery(app, "/notify/wechat/transfer", &d).await.0
}

fn creates(fake: &FakeProvider) -> usize {
    fake.state.wechat_transfers.calls(Kind::Create)
}

fn final_count(app: &TestApp, result: &str) -> u64 {
    Metrics::count(&app.metrics.transfers_final, &["wechat", result])
}

async fn a_wechat_transfer_waits_for_the_user_then_succeeds_once(backend: Backend) {
    let fake = fake().await;
    let app = app(backend, &fake).await;
    let (status, t) = start(&app, &wechat_body("TWAIT1", 150)).await;
    assert_eq!(status, 202, "{t}");
    assert_eq!(t["status"], "WAIT_USER_CONFIRM");
    assert_eq!(t["provider_state"], "WAIT_USER_CONFIRM");
    assert_eq!(t["provider_bill_no"], "1330TWAIT1");
    let package = fake
        .state
        .wechat_transfers
        .bill("TWAIT1")
        .and_then(|b| b.package_info);
    assert_eq!(
        t["package_info"].as_str(),
        package.as_deref(),
        "passed through unchanged"
    );
    assert!(package.is_some());
    assert_eq!(t["finished_at"], Value::Null);
    // Not due before query_after_secs.
    app.clock.advance(QUERY_AFTER_SECS - 1);
    assert_eq!(drive(&app).await, 0);
    // The user confirms: the next query finds TRANSFERING, which is PROCESSING here.
    fake.state.wechat_transfers.confirm("TWAIT1");
    app.clock.advance(1);
    assert_eq!(drive(&app).await, 1);
    let t = shown(&app, "TWAIT1").await;
    assert_eq!(
        (&t["status"], &t["provider_state"]),
        (&json!("PROCESSING"), &json!("TRANSFERING"))
    );
    // The money arrives; the notification says so first.
    fake.state.wechat_transfers.succeed("TWAIT1");
    assert_eq!(notify_finished(&app, &fake, "TWAIT1").await, 204);
    let t = shown(&app, "TWAIT1").await;
    assert_eq!(
        (&t["status"], &t["provider_state"]),
        (&json!("SUCCESS"), &json!("SUCCESS"))
    );
    assert_ne!(t["finished_at"], Value::Null);
    // The same notification again, and the query: duplicates.
    assert_eq!(notify_finished(&app, &fake, "TWAIT1").await, 204);
    app.clock.advance(QUERY_EVERY_SECS);
    assert_eq!(drive(&app).await, 0, "a final transfer is not followed");
    let events = app.outbox("TRANSFER_SUCCEEDED").await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].biz_key, "TWAIT1:wechat");
    let payload = &events[0].payload.0;
    assert_eq!(payload["out_bill_no"], "TWAIT1");
    assert_eq!(payload["account"], MCHID);
    assert_eq!(payload["amount_fen"], 150);
    assert_eq!(payload["status"], "SUCCESS");
    assert_eq!(payload["provider_bill_no"], "1330TWAIT1");
    assert!(payload["finished_at"].is_string(), "{payload}");
    // A notification's final counts as a notification, not as an answer.
    assert_eq!(final_count(&app, "success"), 0);
}

async fn a_create_that_hangs_is_sent_again_under_the_same_number_until_final(backend: Backend) {
    let fake = fake().await;
    let app = app(backend, &fake).await;
    fake.state.wechat_transfers.new_bills(NewBill::Success);
    fake.state.wechat_transfers.hang_after_creating(1);
    let (status, t) = start(&app, &wechat_body("THANG1", 200)).await;
    assert_eq!(status, 202, "{t}");
    assert_eq!(
        (&t["status"], &t["provider_state"]),
        (&json!("PROCESSING"), &Value::Null)
    );
    assert_eq!(
        fake.state.wechat_transfers.held(),
        1,
        "the provider created the bill"
    );
    // Sent again once a call can no longer be in flight: the same number, the same bill.
    app.clock.advance(60);
    assert_eq!(drive(&app).await, 1);
    assert_eq!(creates(&fake), 2);
    assert_eq!(fake.state.wechat_transfers.held(), 1);
    let t = shown(&app, "THANG1").await;
    assert_eq!(t["status"], "SUCCESS", "{t}");
    assert_eq!(app.messages("TRANSFER_SUCCEEDED").await, 1);
    assert_eq!(final_count(&app, "success"), 1);
    // The same request again: the stored transfer, nothing sent.
    let (status, again) = start(&app, &wechat_body("THANG1", 200)).await;
    assert_eq!((status, &again["status"]), (200, &json!("SUCCESS")));
    assert_eq!(creates(&fake), 2);
}

async fn cancel_before_and_after_the_users_confirmation(backend: Backend) {
    let fake = fake().await;
    let app = app(backend, &fake).await;
    // Before the user confirms: WeChat accepts, CANCELLED comes by query.
    assert_eq!(start(&app, &wechat_body("TCANCEL1", 100)).await.0, 202);
    let (status, t) = post(&app, "/transfers/TCANCEL1/cancel", &json!({})).await;
    assert_eq!(status, 202, "{t}");
    assert_eq!(
        (&t["status"], &t["provider_state"]),
        (&json!("WAIT_USER_CONFIRM"), &json!("CANCELING"))
    );
    fake.state.wechat_transfers.finish_cancel("TCANCEL1");
    app.clock.advance(QUERY_AFTER_SECS);
    assert_eq!(drive(&app).await, 1);
    let t = shown(&app, "TCANCEL1").await;
    assert_eq!(t["status"], "CANCELLED", "{t}");
    assert_eq!(app.messages("TRANSFER_CANCELLED").await, 1);
    assert_eq!(final_count(&app, "cancelled"), 1);
    let cancels = fake.state.wechat_transfers.calls(Kind::Cancel);
    let (status, _) = post(&app, "/transfers/TCANCEL1/cancel", &json!({})).await;
    assert_eq!(status, 200, "already CANCELLED");
    assert_eq!(
        fake.state.wechat_transfers.calls(Kind::Cancel),
        cancels,
        "nothing sent"
    );
    // After the user confirmed, as known here: 409, nothing sent.
    assert_eq!(start(&app, &wechat_body("TCANCEL2", 100)).await.0, 202);
    fake.state.wechat_transfers.confirm("TCANCEL2");
    app.clock.advance(QUERY_AFTER_SECS);
    drive(&app).await;
    assert_eq!(
        shown(&app, "TCANCEL2").await["provider_state"],
        "TRANSFERING"
    );
    let (status, answer) = post(&app, "/transfers/TCANCEL2/cancel", &json!({})).await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(fake.state.wechat_transfers.calls(Kind::Cancel), cancels);
    // The user confirmed meanwhile, not known here yet: WeChat refuses, 409 with its code.
    assert_eq!(start(&app, &wechat_body("TCANCEL3", 100)).await.0, 202);
    fake.state.wechat_transfers.confirm("TCANCEL3");
    let (status, answer) = post(&app, "/transfers/TCANCEL3/cancel", &json!({})).await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["code"], "INVALID_REQUEST");
    assert_eq!(shown(&app, "TCANCEL3").await["status"], "WAIT_USER_CONFIRM");
    // A final transfer, and one never started.
    fake.state.wechat_transfers.succeed("TCANCEL2");
    app.clock.advance(QUERY_EVERY_SECS);
    drive(&app).await;
    assert_eq!(
        post(&app, "/transfers/TCANCEL2/cancel", &json!({})).await.0,
        409
    );
    assert_eq!(
        post(&app, "/transfers/TNOSUCH/cancel", &json!({})).await.0,
        404
    );
    assert_eq!(app.messages("TRANSFER_CANCELLED").await, 1);
}

async fn a_refusal_fails_the_transfer_only_once_the_query_finds_no_bill(backend: Backend) {
    let fake = fake().await;
    let app = app(backend, &fake).await;
    fake.state.wechat_transfers.new_bills(NewBill::NotEnough);
    let (status, t) = start(&app, &wechat_body("TPOOR1", 1000)).await;
    assert_eq!(status, 202, "{t}");
    assert_eq!(
        (&t["status"], &t["fail_reason"]),
        (&json!("FAIL"), &json!("NOT_ENOUGH"))
    );
    assert_eq!(
        t["provider_state"],
        Value::Null,
        "nothing exists at the provider"
    );
    assert_eq!(
        fake.state.wechat_transfers.calls(Kind::Query),
        1,
        "confirmed by a query"
    );
    let failed = app.outbox("TRANSFER_FAILED").await;
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].payload.0["fail_reason"], "NOT_ENOUGH");
    assert_eq!(final_count(&app, "fail"), 1);
    // A FAIL does not count against the day: the whole limit is there again.
    fake.state
        .wechat_transfers
        .new_bills(NewBill::WaitUserConfirm);
    assert_eq!(start(&app, &wechat_body("TPOOR2", 1000)).await.0, 202);
    // A bill that fails later (the user never confirmed): FAIL with WeChat's reason.
    fake.state.wechat_transfers.fail("TPOOR2", "OVERDUE_CLOSE");
    app.clock.advance(QUERY_AFTER_SECS);
    assert_eq!(drive(&app).await, 1);
    let t = shown(&app, "TPOOR2").await;
    assert_eq!(
        (&t["status"], &t["fail_reason"]),
        (&json!("FAIL"), &json!("OVERDUE_CLOSE"))
    );
    assert_eq!(app.messages("TRANSFER_FAILED").await, 2);
}

async fn answers_that_are_not_the_providers_move_nothing(backend: Backend) {
    let fake = fake().await;
    let app = app(backend, &fake).await;
    fake.state.sign_with(Signing::Unsigned);
    let (status, t) = start(&app, &wechat_body("TFORGE1", 100)).await;
    assert_eq!(status, 202, "{t}");
    assert_eq!(
        (&t["status"], &t["provider_state"]),
        (&json!("PROCESSING"), &Value::Null)
    );
    fake.state.sign_with(Signing::Forger);
    app.clock.advance(60);
    assert_eq!(drive(&app).await, 1);
    let t = shown(&app, "TFORGE1").await;
    assert_eq!(
        (&t["status"], &t["provider_state"]),
        (&json!("PROCESSING"), &Value::Null)
    );
    // A notification whose signature does not verify: 401, nothing moves either.
    fake.state.wechat_transfers.succeed("TFORGE1");
    let s = crate::wechat::sandbox('A');
    let mut d = fake
        .state
        .wechat_transfers
        .finished(&s, "TFORGE1", app.clock.now().unix_seconds());
    let body = String::from_utf8(d.body.clone()).expect("utf-8");
    d.body = body
        .replacen("MCHTRANSFER.BILL.FINISHED", "MCHTRANSFER.BILL.FINISHEd", 1)
        .into_bytes();
    assert_eq!(
        post_delivery(&app, "/notify/wechat/transfer", &d).await.0,
        401
    );
    assert_eq!(shown(&app, "TFORGE1").await["status"], "PROCESSING");
    // The provider's own answer, at last.
    fake.state.sign_with(Signing::Provider);
    app.clock.advance(600);
    assert_eq!(drive(&app).await, 1);
    assert_eq!(shown(&app, "TFORGE1").await["status"], "SUCCESS");
    assert_eq!(app.messages("TRANSFER_SUCCEEDED").await, 1);
    assert_eq!(fake.state.wechat_transfers.held(), 1);
}

async fn notifications_that_must_not_move_a_transfer_raise_one_anomaly(backend: Backend) {
    let fake = fake().await;
    let app = app(backend, &fake).await;
    assert_eq!(start(&app, &wechat_body("TODD1", 100)).await.0, 202);
    let s = crate::wechat::sandbox('A');
    let now = app.clock.now().unix_seconds();
    // Another amount than the transfer's, signed by WeChat: acknowledged, not applied.
    let d = wechat_transfer::finished(&s, "TODD1", "1330TODD1", "SUCCESS", 101, None, now);
    for _ in 0..2 {
        assert_eq!(
            post_delivery(&app, "/notify/wechat/transfer", &d).await.0,
            204
        );
    }
    let anomalies = app.outbox("TRANSFER_ANOMALY").await;
    assert_eq!(anomalies.len(), 1, "{anomalies:?}");
    let payload = &anomalies[0].payload.0;
    assert_eq!(payload["reason"], "AMOUNT_MISMATCH");
    assert_eq!(
        (&payload["amount_fen"], &payload["provider_amount_fen"]),
        (&json!(100), &json!(101))
    );
    assert_eq!(anomalies[0].biz_key, "TODD1:wechat:1330TODD1");
    assert_eq!(shown(&app, "TODD1").await["status"], "WAIT_USER_CONFIRM");
    // Money out that was never started here: the loudest anomaly, nothing else written.
    let d = wechat_transfer::finished(&s, "TNEVER1", "1330TNEVER1", "SUCCESS", 5000, None, now);
    assert_eq!(
        post_delivery(&app, "/notify/wechat/transfer", &d).await.0,
        204
    );
    let anomalies = app.outbox("TRANSFER_ANOMALY").await;
    let unknown: Vec<_> = anomalies
        .iter()
        .filter(|m| m.payload.0["reason"] == "UNKNOWN_TRANSFER")
        .collect();
    assert_eq!(unknown.len(), 1, "{anomalies:?}");
    assert_eq!(unknown[0].payload.0["account"], Value::Null);
    assert_eq!(unknown[0].payload.0["provider_amount_fen"], 5000);
    assert_eq!(recorded(&app).await, 1);
    // Another merchant named in a signed answer about another bill under the number: never
    // moved. (One anomaly per bill: the key is the number, the channel and the bill.)
    let other = TransferSeen {
        out_bill_no: "TODD1".into(),
        provider_bill_no: Some("1330TODD1-OTHER".into()),
        state: TransferState::Success,
        provider_state: Some("SUCCESS".into()),
        amount_fen: Some(100),
        account: "1900000009".into(),
        package_info: None,
        fail_reason: None,
        occurred_at: None,
    };
    let outcome = app
        .store
        .apply_transfer(ChannelId::Wechat, &other, true, app.clock.now())
        .await
        .expect("apply");
    assert_eq!(
        outcome,
        Outcome::Anomaly(paynotify::notice::AnomalyReason::MerchantMismatch)
    );
    assert_eq!(shown(&app, "TODD1").await["status"], "WAIT_USER_CONFIRM");
    assert_eq!(app.messages("TRANSFER_SUCCEEDED").await, 0);
}

async fn two_followers_of_one_transfer_emit_one_final_event(backend: Backend) {
    let fake = fake().await;
    let app = app(backend, &fake).await;
    for i in 0..5 {
        assert_eq!(
            start(&app, &wechat_body(&format!("TTWO{i}"), 100)).await.0,
            202
        );
        fake.state.wechat_transfers.succeed(&format!("TTWO{i}"));
    }
    app.clock.advance(QUERY_AFTER_SECS);
    // Two instances' jobs at once, and the notifications racing them.
    let (a, b, ()) = tokio::join!(drive(&app), drive(&app), async {
        for i in 0..5 {
            notify_finished(&app, &fake, &format!("TTWO{i}")).await;
        }
    });
    assert!(a + b <= 5, "each transfer is taken once: {a} + {b}");
    assert!(fake.state.wechat_transfers.calls(Kind::Query) <= 5);
    assert_eq!(app.messages("TRANSFER_SUCCEEDED").await, 5);
    for i in 0..5 {
        assert_eq!(shown(&app, &format!("TTWO{i}")).await["status"], "SUCCESS");
    }
}

/// Alipay: the certificate-mode app of the stand-in gateway, transfers on.
async fn alipay_app(backend: Backend, fake: &FakeProvider) -> TestApp {
    let url = fake.url.clone();
    let root = crate::support::keys::alipay_certs(crate::support::provider::APP_KEY)
        .root
        .clone();
    crate::support::helpers::spawn_app_with(backend, move |s| {
        crate::alipay::cert_mode(s, &url, &root);
        s.provider_api.timeout_ms = 1000;
        s.transfers.enabled = true;
    })
    .await
}

fn alipay_body(no: &str, fen: i64) -> Value {
    json!({
        "out_bill_no": no, "channel": "alipay", "account": crate::alipay::CERT_APP,
        "amount_fen": fen, "remark": "返利",
        "payee": {"identity": "2088000000000099", "identity_type": "ALIPAY_USER_ID"}
    })
}

fn alipay_final(app: &TestApp, result: &str) -> u64 {
    Metrics::count(&app.metrics.transfers_final, &["alipay", result])
}

async fn an_alipay_transfer_is_final_in_its_answer_and_its_message_is_a_duplicate(
    backend: Backend,
) {
    let fake = crate::alipay::cert_gateway().await;
    let app = alipay_app(backend, &fake).await;
    let (status, t) = start(&app, &alipay_body("TALI1", 1050)).await;
    assert_eq!(status, 202, "{t}");
    assert_eq!(
        (&t["status"], &t["provider_state"]),
        (&json!("SUCCESS"), &json!("SUCCESS"))
    );
    let held = fake.state.alipay_transfer("TALI1").expect("held");
    assert_eq!(held.amount_fen, 1050);
    assert_eq!(t["provider_bill_no"], held.order_id.as_str());
    assert_eq!(
        t["payee"],
        json!({"identity": "2088000000000099", "identity_type": "ALIPAY_USER_ID"})
    );
    assert_eq!(alipay_final(&app, "success"), 1);
    // Its message at the app gateway: acknowledged, a duplicate.
    let message = crate::support::alipay_transfer::order_changed(
        &fake.state,
        &crate::alipay::sandbox(),
        "TALI1",
    );
    let answered = post_delivery(&app, "/notify/alipay/gateway", &message).await;
    assert_eq!(answered, (200, "success".to_owned()));
    assert_eq!(app.messages("TRANSFER_SUCCEEDED").await, 1);
    assert_eq!(app.messages("TRANSFER_ANOMALY").await, 0);
    // Alipay transfers cannot be cancelled.
    assert_eq!(
        post(&app, "/transfers/TALI1/cancel", &json!({})).await.0,
        409
    );
    // An app without certificate-mode API credentials cannot transfer.
    let mut other = alipay_body("TALI2", 100);
    other["account"] = json!(crate::alipay::APP);
    let (status, answer) = start(&app, &other).await;
    assert_eq!(
        (status, &answer["code"]),
        (422, &json!("ACCOUNT_CANNOT_TRANSFER")),
        "{answer}"
    );
    assert_eq!(fake.state.alipay_transfers_created(), 1);
}

async fn an_alipay_refusal_fails_and_a_hang_is_sent_again_until_final(backend: Backend) {
    use crate::support::alipay_transfer::NewTransfer;
    let fake = crate::alipay::cert_gateway().await;
    let app = alipay_app(backend, &fake).await;
    fake.state
        .new_alipay_transfers(NewTransfer::Refused("PAYEE_NOT_EXIST"));
    let (status, t) = start(&app, &alipay_body("TALIX1", 100)).await;
    assert_eq!(status, 202, "{t}");
    assert_eq!(
        (&t["status"], &t["fail_reason"]),
        (&json!("FAIL"), &json!("PAYEE_NOT_EXIST"))
    );
    assert_eq!(app.messages("TRANSFER_FAILED").await, 1);
    assert_eq!(alipay_final(&app, "fail"), 1);
    // The create hangs after Alipay made the transfer: unknown, sent again, one transfer.
    fake.state.new_alipay_transfers(NewTransfer::Success);
    fake.state.hang_alipay_transfers(1);
    let (status, t) = start(&app, &alipay_body("TALIX2", 100)).await;
    assert_eq!(status, 202, "{t}");
    assert_eq!(
        (&t["status"], &t["provider_state"]),
        (&json!("PROCESSING"), &Value::Null)
    );
    app.clock.advance(60);
    assert_eq!(drive(&app).await, 1);
    assert_eq!(shown(&app, "TALIX2").await["status"], "SUCCESS");
    assert_eq!(fake.state.alipay_transfers_created(), 1);
    assert_eq!(app.messages("TRANSFER_SUCCEEDED").await, 1);
}
