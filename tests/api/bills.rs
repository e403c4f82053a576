//! The daily bill reconciliation end to end, for each provider on every backend: the fake
//! provider serves its bills in the real formats (WeChat's gzip with its SHA1, Alipay's zip
//! of GBK CSVs), the service fetches, checks, compares and acts through the ledger.

use chrono::TimeZone;
use paynotify::metrics::Metrics;
use paynotify::notice::{
    ChannelId, MerchantIds, Notice, NoticeKind, Outcome, Refund, RefundAmount,
};
use paynotify::time::Clock;
use serde_json::Value;

use crate::reconcile::{
    APP_ID, MCHID, configure, create, fake, notify_paid, paid_at, transaction_id,
};
use crate::support::helpers::{Backend, TestApp, spawn_app_with};
use crate::support::provider::{
    BillFault, FakeBill, FakeLine, FakeProvider, RefundStatus, Refunded,
};

const DAY: &str = "2026-11-30";
const NEXT: &str = "2026-12-01";
const AFTER: &str = "2026-12-02";

/// Tests that run one check on one channel.
macro_rules! channel_tests {
    ($($name:ident => $check:ident($channel:literal)),* $(,)?) => {
        $(
            async fn $name(backend: Backend) {
                $check(backend, $channel).await;
            }
        )*
    };
}

channel_tests!(
    wechat_a_balanced_day => a_balanced_day("wechat"),
    alipay_a_balanced_day => a_balanced_day("alipay"),
    wechat_a_day_with_differences => a_day_with_differences("wechat"),
    alipay_a_day_with_differences => a_day_with_differences("alipay"),
    wechat_midnight_is_pending_then_settled => midnight_is_pending_then_settled("wechat"),
    alipay_midnight_is_pending_then_settled => midnight_is_pending_then_settled("alipay"),
    wechat_a_bad_bill_is_never_acted_upon => a_bad_bill_is_never_acted_upon("wechat"),
    alipay_a_bad_bill_is_never_acted_upon => a_bad_bill_is_never_acted_upon("alipay"),
    wechat_a_late_notification_is_dated_by_the_providers_time => a_late_notification_is_dated_by_the_providers_time("wechat"),
    alipay_a_late_notification_is_dated_by_the_providers_time => a_late_notification_is_dated_by_the_providers_time("alipay"),
    wechat_a_difference_a_later_bill_explains_is_settled => a_difference_a_later_bill_explains_is_settled("wechat"),
    alipay_a_difference_a_later_bill_explains_is_settled => a_difference_a_later_bill_explains_is_settled("alipay"),
);

crate::on_every_backend!(
    a_sellers_bill_is_read_once_for_all_its_apps,
    a_second_payment_through_another_merchant_is_not_the_first,
    a_second_run_of_the_same_day_is_refused_and_shares_no_rows,
    a_run_keeps_its_lease_while_one_account_outlasts_it,
    wechat_a_balanced_day,
    alipay_a_balanced_day,
    wechat_a_day_with_differences,
    alipay_a_day_with_differences,
    wechat_midnight_is_pending_then_settled,
    alipay_midnight_is_pending_then_settled,
    wechat_a_bad_bill_is_never_acted_upon,
    alipay_a_bad_bill_is_never_acted_upon,
    wechat_a_late_notification_is_dated_by_the_providers_time,
    alipay_a_late_notification_is_dated_by_the_providers_time,
    wechat_a_difference_a_later_bill_explains_is_settled,
    alipay_a_difference_a_later_bill_explains_is_settled,
    wechat_a_lost_sub_order_is_recovered_through_its_combination,
);

async fn app_with(backend: Backend, fake: &FakeProvider) -> TestApp {
    let url = fake.url.clone();
    spawn_app_with(backend, move |s| {
        configure(s, &url);
        s.bills.download_timeout_secs = 2;
    })
    .await
}

/// Two WeChat merchants with API credentials: 1900000001 at `fake`, 1900000002 at another
/// provider; with `stall`, one that answers every request only after three seconds (its
/// bill takes six), so a run stays on that account a while.
async fn two_merchants(backend: Backend, stall: bool) -> (FakeProvider, FakeProvider, TestApp) {
    use crate::support::keys::private_key_path;
    use crate::support::provider::{MERCHANT_KEY, MERCHANT_SERIAL};

    let fake = fake().await;
    let b = crate::wechat::sandbox('B');
    let slow = FakeProvider::start(
        (&b.mchid, &b.appid, &b.serial, b.private_key),
        (APP_ID, "alipay"),
    )
    .await;
    slow.state
        .stall
        .store(stall, std::sync::atomic::Ordering::SeqCst);
    let (url, slow_url) = (fake.url.clone(), slow.url.clone());
    let app = spawn_app_with(backend, move |s| {
        configure(s, &url);
        let m = &mut s.wechat.merchants[1];
        m.private_key_file = Some(private_key_path(MERCHANT_KEY));
        m.merchant_serial = Some(MERCHANT_SERIAL.into());
        m.api_base = Some(slow_url);
        s.bills.download_timeout_secs = 20;
    })
    .await;
    (fake, slow, app)
}

fn channel_id(channel: &str) -> ChannelId {
    ChannelId::parse(channel).expect("channel")
}

fn account(channel: &str) -> &'static str {
    if channel == "wechat" { MCHID } else { APP_ID }
}

/// The payment of `order_no` as its notification decodes.
fn payment(channel: &str, order_no: &str, fen: i64) -> Notice {
    Notice {
        channel: channel_id(channel),
        kind: NoticeKind::Paid,
        merchant_matches: true,
        // As each channel's notification names its account: WeChat's mchid, Alipay's app.
        merchant: MerchantIds {
            merchant_id: account(channel).to_owned(),
            app_id: (channel == "alipay").then(|| account(channel).to_owned()),
        },
        out_trade_no: order_no.to_owned(),
        transaction_id: transaction_id(channel, order_no),
        amount_fen: fen,
        currency: "CNY".to_owned(),
        occurred_at: None,
    }
}

/// A refund of that payment.
fn refund(channel: &str, order_no: &str, out_refund_no: &str, fen: i64, total: i64) -> Notice {
    let mut n = payment(channel, order_no, total);
    n.kind = NoticeKind::Refunded(Refund {
        out_refund_no: out_refund_no.to_owned(),
        refund_id: format!("RID-{out_refund_no}"),
        amount: RefundAmount::This(fen),
    });
    n
}

/// The ledger records `notice` now (as its notification would).
async fn record(app: &TestApp, notice: &Notice) {
    let outcome = app
        .store
        .apply(notice, app.clock.now())
        .await
        .expect("apply");
    assert_eq!(outcome, Outcome::Applied, "{notice:?}");
}

/// An order named to the channel's account, paid here now.
async fn paid_here(app: &TestApp, channel: &str, order_no: &str, fen: i64) {
    create(app, order_no, fen, channel).await;
    record(app, &payment(channel, order_no, fen)).await;
}

/// A payment row of the bill; the provider's fee 0.6 %.
fn line(channel: &str, order_no: &str, fen: i64, at: &str) -> FakeLine {
    FakeLine {
        out_trade_no: order_no.to_owned(),
        transaction_id: transaction_id(channel, order_no),
        out_refund_no: None,
        amount_fen: fen,
        fee_milli_fen: fen * 6,
        at: at.to_owned(),
    }
}

/// A refund row of the bill; the fee given back.
fn refund_line(channel: &str, order_no: &str, out_refund_no: &str, fen: i64, at: &str) -> FakeLine {
    FakeLine {
        out_refund_no: Some(out_refund_no.to_owned()),
        fee_milli_fen: -fen * 6,
        ..line(channel, order_no, fen, at)
    }
}

fn bill(lines: Vec<FakeLine>) -> FakeBill {
    FakeBill { lines, fault: None }
}

/// `POST /admin/bills/reconcile` for `date` and `channel`: the reports.
async fn reconcile(app: &TestApp, date: &str, channel: &str) -> Vec<Value> {
    let response = crate::reconcile::post(
        app,
        &format!("/admin/bills/reconcile?date={date}&channel={channel}"),
    )
    .await;
    assert_eq!(response.status(), 200);
    let reports: Vec<Value> = response.json().await.expect("reports");
    assert_eq!(reports.len(), 1, "{reports:?}");
    reports
}

/// `GET /admin/bills` for `date`: the stored reports.
async fn stored(app: &TestApp, date: &str) -> Vec<Value> {
    let response = app
        .client
        .get(app.url(&format!("/admin/bills?date={date}")))
        .bearer_auth(&app.api_token)
        .send()
        .await
        .expect("GET /admin/bills");
    assert_eq!(response.status(), 200);
    response.json().await.expect("reports")
}

/// The report's item of `kind` for `order_no`.
fn item<'a>(report: &'a Value, kind: &str, order_no: &str) -> &'a Value {
    report["items"]
        .as_array()
        .and_then(|items| {
            items
                .iter()
                .find(|i| i["type"] == kind && i["out_trade_no"] == order_no)
        })
        .unwrap_or_else(|| panic!("no {kind} item for {order_no} in {report}"))
}

/// The biz_keys of the `PAYMENT_ANOMALY` messages, sorted; each must be `BILL_MISMATCH`, or
/// `BILL_MISMATCH_SETTLED` for the event that settles one (`…:settled`).
async fn anomalies(app: &TestApp) -> Vec<String> {
    let messages = app.outbox("PAYMENT_ANOMALY").await;
    for m in &messages {
        let reason = if m.biz_key.ends_with(":settled") {
            "BILL_MISMATCH_SETTLED"
        } else {
            "BILL_MISMATCH"
        };
        assert_eq!(m.payload.0["reason"], reason, "{:?}", m.payload.0);
    }
    let mut keys: Vec<String> = messages.into_iter().map(|m| m.biz_key).collect();
    keys.sort();
    keys
}

/// Beijing wall-clock time `at` of 2026-11-30 / 12-`day`, as the service's clock.
fn beijing(day: u32, h: u32, m: u32, s: u32, ms: u32) -> chrono::DateTime<chrono::Utc> {
    let local = chrono::FixedOffset::east_opt(8 * 3600)
        .expect("offset")
        .with_ymd_and_hms(2026, if day == 30 { 11 } else { 12 }, day, h, m, s)
        .single()
        .expect("time");
    local.with_timezone(&chrono::Utc) + chrono::Duration::milliseconds(i64::from(ms))
}

async fn a_balanced_day(backend: Backend, channel: &str) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    // 16:00 Beijing on 11-30.
    paid_here(&app, channel, "BL-A", 19900).await;
    paid_here(&app, channel, "BL-B", 5000).await;
    record(&app, &refund(channel, "BL-B", "BL-B-R1", 2000, 5000)).await;
    fake.state.set_bill(
        DAY,
        bill(vec![
            line(channel, "BL-A", 19900, "2026-11-30 15:59:58"),
            line(channel, "BL-B", 5000, "2026-11-30 15:59:59"),
            refund_line(channel, "BL-B", "BL-B-R1", 2000, "2026-11-30 16:00:01"),
        ]),
    );
    let reports = reconcile(&app, DAY, channel).await;
    let r = &reports[0];
    assert_eq!(r["status"], "balanced", "{r}");
    assert_eq!(r["date"], DAY);
    assert_eq!(r["channel"], channel);
    assert_eq!(r["account"], account(channel));
    assert_eq!(r["reason"], Value::Null);
    // An Alipay bill carries no hash: its report says the file is not integrity-protected.
    let integrity = if channel == "alipay" {
        "none"
    } else {
        "signed_hash"
    };
    assert_eq!(r["integrity"], integrity, "{r}");
    assert_eq!(r["items"], serde_json::json!([]), "{r}");
    // 0.6 % of 199.00 + 50.00 − 20.00 = 1.374 yuan: 137 fen.
    assert_eq!(
        r["provider"],
        serde_json::json!({"count": 2, "amount_fen": 24900, "refund_count": 1, "refund_fen": 2000, "fee_fen": 137})
    );
    assert_eq!(
        r["ours"],
        serde_json::json!({"count": 2, "amount_fen": 24900, "refund_count": 1, "refund_fen": 2000})
    );
    assert!(r["fetched_at"].is_string(), "{r}");
    assert_eq!(stored(&app, DAY).await, reports);
    assert_eq!(
        fake.state.bill_downloads.lock().expect("downloads").len(),
        1
    );
    assert_eq!(
        Metrics::count(&app.metrics.bill_runs, &[channel, "balanced"]),
        1
    );
    assert!(anomalies(&app).await.is_empty());
    // Nothing was asked about: the bill and the ledger agree.
    assert!(
        fake.state
            .calls()
            .iter()
            .all(|(call, _)| !call.ends_with("trade.query") && call != "wechat.query"),
        "{:?}",
        fake.state.calls()
    );
}

async fn a_day_with_differences(backend: Backend, channel: &str) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    // Paid at the provider; its notification never came.
    create(&app, "DF-LOST", 19900, channel).await;
    paid_at(&fake, "DF-LOST", 19900, channel);
    // Recorded with another amount than the provider's.
    paid_here(&app, channel, "DF-AMOUNT", 19900).await;
    // Recorded here, absent from the bill (at 16:00 Beijing: not near a midnight).
    paid_here(&app, channel, "DF-HERE", 3000).await;
    // A refund the provider made that the ledger never heard of; its refund query knows it.
    paid_here(&app, channel, "DF-REFUND", 8000).await;
    fake.state.refund(
        "DF-REFUND-R1",
        Refunded {
            out_trade_no: "DF-REFUND".into(),
            transaction_id: transaction_id(channel, "DF-REFUND"),
            refund_fen: 1000,
            total: 8000,
            status: RefundStatus::Success,
        },
    );
    // A refund recorded here for another amount, and one the bill does not have.
    paid_here(&app, channel, "DF-REFUND2", 5000).await;
    record(
        &app,
        &refund(channel, "DF-REFUND2", "DF-REFUND2-R", 1000, 5000),
    )
    .await;
    paid_here(&app, channel, "DF-REFUND3", 4000).await;
    record(
        &app,
        &refund(channel, "DF-REFUND3", "DF-REFUND3-R", 500, 4000),
    )
    .await;
    fake.state.set_bill(
        DAY,
        bill(vec![
            line(channel, "DF-LOST", 19900, "2026-11-30 12:00:00"),
            line(channel, "DF-AMOUNT", 19800, "2026-11-30 12:00:01"),
            line(channel, "DF-REFUND", 8000, "2026-11-30 12:00:02"),
            refund_line(
                channel,
                "DF-REFUND",
                "DF-REFUND-R1",
                1000,
                "2026-11-30 13:00:00",
            ),
            line(channel, "DF-REFUND2", 5000, "2026-11-30 12:00:03"),
            refund_line(
                channel,
                "DF-REFUND2",
                "DF-REFUND2-R",
                900,
                "2026-11-30 13:00:01",
            ),
            line(channel, "DF-REFUND3", 4000, "2026-11-30 12:00:04"),
        ]),
    );
    fake.state.set_bill(NEXT, bill(vec![]));
    // The morning after, as the daily job runs: what is recovered now is recorded today.
    app.clock.set(beijing(1, 10, 30, 0, 0));
    let reports = reconcile(&app, DAY, channel).await;
    let r = &reports[0];
    assert_eq!(r["status"], "mismatched", "{r}");
    assert_eq!(r["items"].as_array().map(Vec::len), Some(6), "{r}");

    let lost = item(r, "MISSING_HERE", "DF-LOST");
    assert_eq!(lost["resolution"], "recovered", "{lost}");
    assert_eq!(lost["provider"]["amount_fen"], 19900);
    assert_eq!(lost["transaction_id"], transaction_id(channel, "DF-LOST"));
    assert_eq!(app.status_of("DF-LOST").await, "PAID");
    assert_eq!(
        Metrics::count(&app.metrics.payments_recovered, &[channel]),
        1
    );

    let amount = item(r, "AMOUNT_MISMATCH", "DF-AMOUNT");
    assert_eq!(amount["resolution"], "open");
    assert_eq!(amount["provider"]["amount_fen"], 19800);
    assert_eq!(
        amount["ours"],
        serde_json::json!({"status": "PAID", "amount_fen": 19900})
    );

    let here = item(r, "MISSING_AT_PROVIDER", "DF-HERE");
    assert_eq!(here["resolution"], "open");
    assert_eq!(here["provider"], Value::Null);
    assert_eq!(here["ours"]["amount_fen"], 3000);

    let refund_here = item(r, "REFUND_MISSING_HERE", "DF-REFUND");
    assert_eq!(refund_here["out_refund_no"], "DF-REFUND-R1");
    assert_eq!(refund_here["provider"]["amount_fen"], 1000);
    if channel == "wechat" {
        // WeChat's signed refund answer goes through the ledger like its notification.
        assert_eq!(refund_here["resolution"], "recovered");
        assert_eq!(
            app.refund_state("DF-REFUND").await,
            ("PAID".to_owned(), 1000)
        );
    } else {
        // Alipay's answer lacks what its notification carries: left for a person.
        assert_eq!(refund_here["resolution"], "open");
        assert_eq!(app.refund_state("DF-REFUND").await, ("PAID".to_owned(), 0));
    }
    let refund_amount = item(r, "REFUND_AMOUNT_MISMATCH", "DF-REFUND2");
    assert_eq!(refund_amount["provider"]["amount_fen"], 900);
    assert_eq!(refund_amount["ours"]["amount_fen"], 1000);
    let refund_there = item(r, "REFUND_MISSING_AT_PROVIDER", "DF-REFUND3");
    assert_eq!(refund_there["out_refund_no"], "DF-REFUND3-R");
    assert_eq!(refund_there["ours"]["amount_fen"], 500);
    assert_eq!(refund_there["resolution"], "open");

    let raised = vec![
        format!("DF-AMOUNT:{channel}:bill:{DAY}:AMOUNT_MISMATCH"),
        format!("DF-HERE:{channel}:bill:{DAY}:MISSING_AT_PROVIDER"),
        format!("DF-REFUND2:{channel}:bill:{DAY}:REFUND_AMOUNT_MISMATCH:DF-REFUND2-R"),
        format!("DF-REFUND3:{channel}:bill:{DAY}:REFUND_MISSING_AT_PROVIDER:DF-REFUND3-R"),
    ];
    assert_eq!(anomalies(&app).await, raised);

    // The notification that comes after all is a duplicate: one ORDER_PAID for DF-LOST.
    let status = notify_paid(&app, channel, "DF-LOST", 19900).await;
    assert_eq!(status, if channel == "wechat" { 204 } else { 200 });
    assert_eq!(
        app.db
            .count("local_message WHERE topic = 'ORDER_PAID' AND biz_key = 'DF-LOST'")
            .await,
        1
    );

    // A rerun replaces the report and raises nothing twice.
    let again = reconcile(&app, DAY, channel).await;
    assert_eq!(again[0]["status"], "mismatched");
    assert_eq!(stored(&app, DAY).await.len(), 1);
    assert_eq!(anomalies(&app).await, raised);
    for kind in [
        "AMOUNT_MISMATCH",
        "MISSING_AT_PROVIDER",
        "REFUND_AMOUNT_MISMATCH",
    ] {
        assert_eq!(
            Metrics::count(&app.metrics.bill_items, &[channel, kind]),
            2,
            "{kind}"
        );
    }

    // The next day: what was recovered today (and the WeChat refund) the ledger records on
    // 12-01, and 12-01's bill lacks; the bill of 11-30 had them, so nothing is missing.
    let next = reconcile(&app, NEXT, channel).await;
    assert_eq!(next[0]["status"], "balanced", "{}", next[0]);
    assert_eq!(next[0]["items"], serde_json::json!([]), "{}", next[0]);
    assert_eq!(anomalies(&app).await, raised);
}

async fn midnight_is_pending_then_settled(backend: Backend, channel: &str) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    create(&app, "MN-LATE", 100, channel).await;
    create(&app, "MN-NEVER", 200, channel).await;
    // Paid at 23:59:59.5 provider time; the ledger records it at 00:00:00.3 the next day.
    app.clock.set(beijing(1, 0, 0, 0, 300));
    record(&app, &payment(channel, "MN-LATE", 100)).await;
    // Recorded ten minutes after midnight; the provider has it in no bill.
    app.clock.set(beijing(1, 0, 10, 0, 0));
    record(&app, &payment(channel, "MN-NEVER", 200)).await;
    fake.state.set_bill(
        DAY,
        bill(vec![line(channel, "MN-LATE", 100, "2026-11-30 23:59:59")]),
    );
    fake.state.set_bill(NEXT, bill(vec![]));
    fake.state.set_bill(AFTER, bill(vec![]));
    app.clock.set(beijing(1, 10, 30, 0, 0));

    let first = reconcile(&app, DAY, channel).await;
    assert_eq!(first[0]["status"], "balanced", "{}", first[0]);
    let late = item(&first[0], "MISSING_HERE", "MN-LATE");
    assert_eq!(late["resolution"], "pending");
    assert_eq!(
        late["ours"],
        serde_json::json!({"status": "PAID", "amount_fen": 100})
    );
    assert_eq!(first[0]["ours"]["count"], 0);

    // The next day's run: the ledger's side of MN-LATE is the pending item's match.
    let next = reconcile(&app, NEXT, channel).await;
    assert_eq!(next[0]["ours"]["count"], 2);
    let never = item(&next[0], "MISSING_AT_PROVIDER", "MN-NEVER");
    assert_eq!(never["resolution"], "pending", "{}", next[0]);
    assert_eq!(
        next[0]["items"].as_array().map(Vec::len),
        Some(1),
        "{}",
        next[0]
    );
    let settled = stored(&app, DAY).await;
    assert_eq!(settled[0]["status"], "balanced");
    assert_eq!(settled[0]["items"], serde_json::json!([]), "{}", settled[0]);
    assert!(anomalies(&app).await.is_empty());

    // settle_days later, what no bill had is reported, once; but not while the day after
    // it could not be compared (its bill may have it).
    fake.state.set_bill(
        AFTER,
        FakeBill {
            lines: vec![],
            fault: Some(BillFault::SummaryOff),
        },
    );
    assert_eq!(
        reconcile(&app, AFTER, channel).await[0]["status"],
        "unavailable"
    );
    let kept = stored(&app, NEXT).await;
    assert_eq!(
        item(&kept[0], "MISSING_AT_PROVIDER", "MN-NEVER")["resolution"],
        "pending"
    );
    assert!(anomalies(&app).await.is_empty());
    fake.state.set_bill(AFTER, bill(vec![]));
    let after = reconcile(&app, AFTER, channel).await;
    assert_eq!(after[0]["status"], "balanced");
    let reported = stored(&app, NEXT).await;
    assert_eq!(reported[0]["status"], "mismatched");
    assert_eq!(
        item(&reported[0], "MISSING_AT_PROVIDER", "MN-NEVER")["resolution"],
        "open"
    );
    assert_eq!(
        anomalies(&app).await,
        vec![format!(
            "MN-NEVER:{channel}:bill:{NEXT}:MISSING_AT_PROVIDER"
        )]
    );
}

/// The stored report of `date` of `channel`.
async fn stored_of(app: &TestApp, date: &str, channel: &str) -> Value {
    let mine: Vec<Value> = stored(app, date)
        .await
        .into_iter()
        .filter(|r| r["channel"] == channel)
        .collect();
    assert_eq!(mine.len(), 1, "{mine:?}");
    mine.into_iter().next().unwrap_or_default()
}

/// A payment at 23:50 whose notification was recorded at 02:30 the next day (an outage),
/// and a bill of its day that was not ready at its own run: the next morning's job compares
/// that day before the day after, and the payment is the day's by the provider's time, so
/// the day after does not raise it as missing at the provider.
async fn a_late_notification_is_dated_by_the_providers_time(backend: Backend, channel: &str) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    create(&app, "OO-LATE", 100, channel).await;
    app.clock.set(beijing(1, 2, 30, 0, 0));
    let mut late = payment(channel, "OO-LATE", 100);
    late.occurred_at = Some(paynotify::time::Timestamp::new(beijing(30, 23, 50, 0, 0)));
    record(&app, &late).await;
    let paid = vec![line(channel, "OO-LATE", 100, "2026-11-30 23:50:00")];
    fake.state.set_bill(
        DAY,
        FakeBill {
            lines: paid.clone(),
            fault: Some(BillFault::SummaryOff),
        },
    );
    fake.state.set_bill(NEXT, bill(vec![]));
    app.clock.set(beijing(1, 10, 30, 0, 0));
    assert_eq!(
        reconcile(&app, DAY, channel).await[0]["status"],
        "unavailable"
    );
    // The morning after, 11-30's bill is ready.
    fake.state.set_bill(DAY, bill(paid));
    app.clock.set(beijing(2, 10, 30, 0, 0));
    app.bills.daily().await.expect("daily run");
    assert!(anomalies(&app).await.is_empty());
    let day = stored_of(&app, DAY, channel).await;
    assert_eq!(day["status"], "balanced", "{day}");
    assert_eq!(day["items"], serde_json::json!([]), "{day}");
    assert_eq!(day["ours"]["count"], 1, "{day}");
    let next = stored_of(&app, NEXT, channel).await;
    assert_eq!(next["status"], "balanced", "{next}");
    assert_eq!(next["items"], serde_json::json!([]), "{next}");
    assert_eq!(next["ours"]["count"], 0, "{next}");
}

/// A payment whose notification said nothing of when it was paid, recorded at 02:30 the day
/// after, and raised by that day's run (its own day's bill was still not ready): the run of
/// its day, later, finds it in the bill. The item is `settled` and an event says so; the
/// first event stands.
async fn a_difference_a_later_bill_explains_is_settled(backend: Backend, channel: &str) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    create(&app, "OO-OLD", 300, channel).await;
    app.clock.set(beijing(1, 2, 30, 0, 0));
    record(&app, &payment(channel, "OO-OLD", 300)).await;
    let paid = vec![line(channel, "OO-OLD", 300, "2026-11-30 23:50:00")];
    fake.state.set_bill(
        DAY,
        FakeBill {
            lines: paid.clone(),
            fault: Some(BillFault::SummaryOff),
        },
    );
    fake.state.set_bill(NEXT, bill(vec![]));
    app.clock.set(beijing(2, 10, 30, 0, 0));
    assert_eq!(
        reconcile(&app, DAY, channel).await[0]["status"],
        "unavailable"
    );
    let next = &reconcile(&app, NEXT, channel).await[0];
    assert_eq!(next["status"], "mismatched", "{next}");
    assert_eq!(
        item(next, "MISSING_AT_PROVIDER", "OO-OLD")["resolution"],
        "open"
    );
    let raised = format!("OO-OLD:{channel}:bill:{NEXT}:MISSING_AT_PROVIDER");
    assert_eq!(anomalies(&app).await, vec![raised.clone()]);

    fake.state.set_bill(DAY, bill(paid));
    let day = &reconcile(&app, DAY, channel).await[0];
    assert_eq!(day["status"], "balanced", "{day}");
    assert_eq!(day["items"], serde_json::json!([]), "{day}");
    let next = stored_of(&app, NEXT, channel).await;
    assert_eq!(next["status"], "balanced", "{next}");
    assert_eq!(
        item(&next, "MISSING_AT_PROVIDER", "OO-OLD")["resolution"],
        "settled",
        "{next}"
    );
    let settled = format!("{raised}:settled");
    assert_eq!(anomalies(&app).await, vec![raised, settled.clone()]);
    let event = app
        .outbox("PAYMENT_ANOMALY")
        .await
        .into_iter()
        .find(|m| m.biz_key == settled)
        .expect("the settling event");
    assert_eq!(event.payload.0["resolution"], "settled");
    assert_eq!(event.payload.0["bill_date"], NEXT);
    assert_eq!(event.payload.0["settled_by"]["bill_date"], DAY);
    // A rerun of either day changes nothing.
    for date in [DAY, NEXT] {
        assert_eq!(
            reconcile(&app, date, channel).await[0]["status"],
            "balanced"
        );
    }
    let again = stored_of(&app, NEXT, channel).await;
    assert_eq!(
        (&again["status"], &again["items"]),
        (&next["status"], &next["items"])
    );
    assert_eq!(
        stored_of(&app, DAY, channel).await["items"],
        serde_json::json!([])
    );
    assert_eq!(anomalies(&app).await.len(), 2);
}

/// Every bad input of the channel's bill, and the label its reason starts with.
fn faults(channel: &str) -> Vec<(BillFault, &'static str)> {
    let mut all = vec![
        (BillFault::Truncated, "archive:"),
        (BillFault::MissingColumn("商户订单号"), "format:"),
        (BillFault::UnknownColumn, "format:"),
        (BillFault::SummaryOff, "summary:"),
        (BillFault::BadCharset, "format:"),
        (BillFault::OtherMerchant, "other account:"),
        (BillFault::Hang, "download:"),
        (BillFault::Redirect, "download:"),
        (BillFault::Unsigned, "bad_signature:"),
        (BillFault::WrongSignature, "bad_signature:"),
        (BillFault::NoBill, "no bill"),
    ];
    if channel == "wechat" {
        all.push((BillFault::WrongHash, "hash:"));
    }
    all
}

async fn a_bad_bill_is_never_acted_upon(backend: Backend, channel: &str) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    // What a good bill would act upon: a payment to recover, one to raise.
    create(&app, "BAD-LOST", 700, channel).await;
    paid_at(&fake, "BAD-LOST", 700, channel);
    paid_here(&app, channel, "BAD-HERE", 300).await;
    let lines = vec![line(channel, "BAD-LOST", 700, "2026-11-30 11:00:00")];
    let mut unavailable = 0;
    for (fault, label) in faults(channel) {
        fake.state.set_bill(
            DAY,
            FakeBill {
                lines: lines.clone(),
                fault: Some(fault.clone()),
            },
        );
        let reports = reconcile(&app, DAY, channel).await;
        let r = &reports[0];
        unavailable += 1;
        assert_eq!(r["status"], "unavailable", "{fault:?}: {r}");
        let reason = r["reason"].as_str().unwrap_or_default();
        assert!(reason.starts_with(label), "{fault:?}: {reason}");
        assert_eq!(r["items"], serde_json::json!([]), "{fault:?}");
        assert_eq!(app.status_of("BAD-LOST").await, "WAIT_PAY", "{fault:?}");
        assert!(anomalies(&app).await.is_empty(), "{fault:?}");
        assert_eq!(app.messages("ORDER_PAID").await, 1, "{fault:?}");
        assert_eq!(
            Metrics::count(&app.metrics.bill_runs, &[channel, "unavailable"]),
            unavailable
        );
        // The run's rows are gone with it.
        assert_eq!(app.db.count("bill_line").await, 0, "{fault:?}");
    }
    // Rows the format allows that the comparison cannot take: the same payment twice, an id
    // longer than the ledger's.
    let long = "L".repeat(65);
    for rows in [
        vec![lines[0].clone(), lines[0].clone()],
        vec![
            lines[0].clone(),
            line(channel, &long, 100, "2026-11-30 11:00:01"),
        ],
    ] {
        fake.state.set_bill(DAY, bill(rows.clone()));
        let r = &reconcile(&app, DAY, channel).await[0];
        assert_eq!(r["status"], "unavailable", "{rows:?}: {r}");
        let reason = r["reason"].as_str().unwrap_or_default();
        assert!(reason.starts_with("format:"), "{rows:?}: {reason}");
        assert_eq!(app.status_of("BAD-LOST").await, "WAIT_PAY");
        assert!(anomalies(&app).await.is_empty());
        assert_eq!(app.db.count("bill_line").await, 0);
    }
    // The next run, with the bill as it should be, acts.
    fake.state.set_bill(DAY, bill(lines));
    let reports = reconcile(&app, DAY, channel).await;
    assert_eq!(reports[0]["status"], "mismatched", "{}", reports[0]);
    assert_eq!(app.status_of("BAD-LOST").await, "PAID");
    assert_eq!(
        anomalies(&app).await,
        vec![format!("BAD-HERE:{channel}:bill:{DAY}:MISSING_AT_PROVIDER")]
    );
}

/// Another instance holds the run of (date, channel): the call is refused with 409 until
/// the lease runs out.
async fn a_run_held_elsewhere_is_refused(backend: Backend) {
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    fake.state.set_bill(DAY, bill(vec![]));
    let now = app.clock.now();
    let held = app
        .store
        .claim_bill_run(
            DAY,
            ChannelId::Wechat,
            "another-instance",
            now,
            now.plus_seconds(600),
        )
        .await
        .expect("claim");
    assert!(held);
    let response = crate::reconcile::post(
        &app,
        &format!("/admin/bills/reconcile?date={DAY}&channel=wechat"),
    )
    .await;
    assert_eq!(response.status(), 409);
    assert!(
        fake.state
            .bill_downloads
            .lock()
            .expect("downloads")
            .is_empty()
    );
    app.clock.advance(601);
    assert_eq!(
        reconcile(&app, DAY, "wechat").await[0]["status"],
        "balanced"
    );
}

/// `POST /orders` naming `named` (`{"alipay_app_id": …}`, or nothing).
async fn create_naming(app: &TestApp, order_no: &str, fen: i64, named: Value) {
    let mut body =
        serde_json::json!({ "order_no": order_no, "amount_fen": fen, "currency": "CNY" });
    if let (Some(body), Value::Object(named)) = (body.as_object_mut(), named) {
        body.extend(named);
    }
    let response = app
        .client
        .post(app.url("/orders"))
        .bearer_auth(&app.api_token)
        .json(&body)
        .send()
        .await
        .expect("POST /orders");
    assert_eq!(response.status(), 201);
}

/// Two Alipay apps of one seller with API credentials: Alipay's bill is the seller's, the
/// same file for either app. It is fetched once and compared with the payments of orders
/// naming either app, and those naming none.
async fn a_sellers_bill_is_read_once_for_all_its_apps(backend: Backend) {
    const SECOND_APP: &str = "2021000000000009";
    let fake = fake().await;
    fake.state.also_app(SECOND_APP);
    let url = fake.url.clone();
    let app = spawn_app_with(backend, move |s| {
        configure(s, &url);
        let first = &s.alipay.apps[0];
        let second = paynotify::channel::alipay::settings::AlipayApp {
            app_private_key_file: first.app_private_key_file.clone(),
            gateway: first.gateway.clone(),
            app_id: SECOND_APP.into(),
            seller_id: first.seller_id.clone(),
            alipay_public_key_file: first.alipay_public_key_file.clone(),
            alipay_cert_file: None,
            app_cert_file: None,
            alipay_root_cert_file: None,
        };
        s.alipay.apps.push(second);
        s.bills.download_timeout_secs = 2;
    })
    .await;
    let second = serde_json::json!({ "alipay_app_id": SECOND_APP });
    paid_here(&app, "alipay", "SA-1", 1000).await;
    for (no, fen) in [("SA-2", 2000), ("SA-3", 3000)] {
        create_naming(&app, no, fen, second.clone()).await;
        // Paid through the app the order names.
        let mut paid = payment("alipay", no, fen);
        paid.merchant.app_id = Some(SECOND_APP.into());
        record(&app, &paid).await;
    }
    create_naming(&app, "SA-4", 4000, Value::Null).await;
    record(&app, &payment("alipay", "SA-4", 4000)).await;
    fake.state.set_bill(
        DAY,
        bill(vec![
            line("alipay", "SA-1", 1000, "2026-11-30 15:00:00"),
            line("alipay", "SA-2", 2000, "2026-11-30 15:00:01"),
        ]),
    );
    let response = crate::reconcile::post(
        &app,
        &format!("/admin/bills/reconcile?date={DAY}&channel=alipay"),
    )
    .await;
    assert_eq!(response.status(), 200);
    // What the seller's bill lacks is raised, whichever app (or none) the order names.
    assert_eq!(
        anomalies(&app).await,
        vec![
            format!("SA-3:alipay:bill:{DAY}:MISSING_AT_PROVIDER"),
            format!("SA-4:alipay:bill:{DAY}:MISSING_AT_PROVIDER"),
        ]
    );
    let reports: Vec<Value> = response.json().await.expect("reports");
    assert_eq!(reports.len(), 1, "{reports:?}");
    let r = &reports[0];
    assert_eq!(r["account"], APP_ID, "{r}");
    assert_eq!(r["status"], "mismatched", "{r}");
    assert_eq!(r["items"].as_array().map(Vec::len), Some(2), "{r}");
    assert_eq!(r["provider"]["count"], 2, "{r}");
    assert_eq!(r["ours"]["count"], 4, "{r}");
    assert_eq!(
        fake.state.bill_downloads.lock().expect("downloads").len(),
        1
    );
}

/// An order paid through merchant 1900000001 (its notification came) and paid again, the
/// same amount, through 1900000002 (its notification lost): each merchant's bill lists it.
/// The second is not the first (another transaction id): it is missing here, asked about at
/// its merchant, and the ledger raises the duplicate payment.
async fn a_second_payment_through_another_merchant_is_not_the_first(backend: Backend) {
    use crate::support::provider::Trade;

    let (fake, other, app) = two_merchants(backend, false).await;
    paid_here(&app, "wechat", "TX-TWICE", 19900).await;
    let second = "4200000000000000000002".to_owned();
    other.state.set(
        "TX-TWICE",
        Trade::Paid {
            transaction_id: second.clone(),
            total: 19900,
        },
    );
    fake.state.set_bill(
        DAY,
        bill(vec![line(
            "wechat",
            "TX-TWICE",
            19900,
            "2026-11-30 15:59:58",
        )]),
    );
    other.state.set_bill(
        DAY,
        bill(vec![FakeLine {
            transaction_id: second.clone(),
            ..line("wechat", "TX-TWICE", 19900, "2026-11-30 16:10:00")
        }]),
    );
    app.clock.set(beijing(1, 10, 30, 0, 0));
    let response = crate::reconcile::post(
        &app,
        &format!("/admin/bills/reconcile?date={DAY}&channel=wechat"),
    )
    .await;
    assert_eq!(response.status(), 200);
    let reports: Vec<Value> = response.json().await.expect("reports");
    let of = |account: &str| {
        reports
            .iter()
            .find(|r| r["account"] == account)
            .cloned()
            .unwrap_or_else(|| panic!("no report of {account} in {reports:?}"))
    };
    let first = of(MCHID);
    assert_eq!(first["status"], "balanced", "{first}");
    assert_eq!(first["items"], serde_json::json!([]), "{first}");
    let again = of("1900000002");
    assert_eq!(again["status"], "mismatched", "{again}");
    let missing = item(&again, "MISSING_HERE", "TX-TWICE");
    assert_eq!(missing["transaction_id"], second.as_str(), "{missing}");
    assert_eq!(missing["ours"], Value::Null, "{missing}");
    // Its signed answer went through the ledger: the order's payment stands, the second is
    // raised.
    assert_eq!(missing["resolution"], "open", "{missing}");
    let raised: Vec<Value> = app
        .outbox("PAYMENT_ANOMALY")
        .await
        .into_iter()
        .map(|m| m.payload.0)
        .collect();
    assert!(
        raised
            .iter()
            .any(|p| p["reason"] == "DUPLICATE_PAYMENT" && p["order_no"] == "TX-TWICE"),
        "{raised:?}"
    );
    assert!(
        raised.iter().all(|p| p["reason"] != "BILL_MISMATCH"),
        "{raised:?}"
    );
    assert_eq!(app.db.count("bill_line").await, 0);
}

/// An operator's retry of a slow reconcile call, and the daily job, while a run of the same
/// date and channel goes on in this instance: refused (the job leaves it), never a second run
/// emptying the first one's bill rows under it (which raised every payment of the first
/// merchant as missing at the provider).
async fn a_second_run_of_the_same_day_is_refused_and_shares_no_rows(backend: Backend) {
    let (fake, slow, app) = two_merchants(backend, true).await;
    paid_here(&app, "wechat", "TW-A", 19900).await;
    paid_here(&app, "wechat", "TW-B", 5000).await;
    fake.state.set_bill(
        DAY,
        bill(vec![
            line("wechat", "TW-A", 19900, "2026-11-30 15:59:58"),
            line("wechat", "TW-B", 5000, "2026-11-30 15:59:59"),
        ]),
    );
    slow.state.set_bill(DAY, bill(vec![]));
    // The job's "yesterday" is DAY.
    app.clock.set(beijing(1, 10, 30, 0, 0));
    let path = format!("/admin/bills/reconcile?date={DAY}&channel=wechat");
    let (first, second, daily) = tokio::join!(
        crate::reconcile::post(&app, &path),
        async {
            // The first run is on the slow merchant's bill now.
            tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
            crate::reconcile::post(&app, &path).await
        },
        async {
            tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
            app.bills.daily().await
        }
    );
    assert!(anomalies(&app).await.is_empty());
    assert_eq!(second.status(), 409);
    let daily = daily.expect("the daily job goes on past a run held");
    assert!(
        daily.iter().all(|r| r.channel != ChannelId::Wechat),
        "{daily:?}"
    );
    assert_eq!(first.status(), 200);
    let reports: Vec<Value> = first.json().await.expect("reports");
    assert_eq!(reports.len(), 2, "{reports:?}");
    for r in &reports {
        assert_eq!(r["status"], "balanced", "{r}");
        assert_eq!(r["items"], serde_json::json!([]), "{r}");
    }
    let kept: Vec<Value> = stored(&app, DAY)
        .await
        .into_iter()
        .filter(|r| r["channel"] == "wechat")
        .collect();
    assert_eq!(kept, reports);
    assert_eq!(app.db.count("bill_line").await, 0);
    assert_eq!(app.db.count("bill_run").await, 0);
}

/// A run renews its lease while one account's bill takes longer than the lease: another
/// instance cannot take the run over under it.
async fn a_run_keeps_its_lease_while_one_account_outlasts_it(backend: Backend) {
    let (fake, slow, app) = two_merchants(backend, true).await;
    fake.state.set_bill(DAY, bill(vec![]));
    slow.state.set_bill(DAY, bill(vec![]));
    let path = format!("/admin/bills/reconcile?date={DAY}&channel=wechat");
    let (response, taken) = tokio::join!(crate::reconcile::post(&app, &path), async {
        // On the slow merchant's bill, whose lease was renewed before it began.
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        app.clock.advance(3000);
        tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
        // Past the hour from that renewal, the download still going on.
        app.clock.advance(1000);
        let now = app.clock.now();
        app.store
            .claim_bill_run(
                DAY,
                ChannelId::Wechat,
                "another-instance",
                now,
                now.plus_seconds(600),
            )
            .await
            .expect("claim")
    });
    assert!(!taken, "another instance took the lease of a run going on");
    assert_eq!(response.status(), 200);
    let reports: Vec<Value> = response.json().await.expect("reports");
    assert_eq!(reports.len(), 2, "{reports:?}");
    assert!(
        reports.iter().all(|r| r["status"] == "balanced"),
        "{reports:?}"
    );
}

/// Bad dates and channels are 400; a channel without API credentials is 422.
async fn bad_requests_are_refused(backend: Backend) {
    let app = spawn_app_with(backend, |_| {}).await;
    for query in [
        "date=2026-13-01",
        "date=20261130",
        "date=2026-11-30&channel=paypal",
        "channel=wechat",
    ] {
        let response =
            crate::reconcile::post(&app, &format!("/admin/bills/reconcile?{query}")).await;
        assert_eq!(response.status(), 400, "{query}");
    }
    let response = crate::reconcile::post(
        &app,
        &format!("/admin/bills/reconcile?date={DAY}&channel=wechat"),
    )
    .await;
    assert_eq!(response.status(), 422);
    let response = app
        .client
        .post(app.url(&format!("/admin/bills/reconcile?date={DAY}")))
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_run_held_elsewhere_is_refused() {
    a_run_held_elsewhere_is_refused(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_run_held_elsewhere_is_refused() {
    a_run_held_elsewhere_is_refused(Backend::Mysql).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_run_held_elsewhere_is_refused() {
    a_run_held_elsewhere_is_refused(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_bad_requests_are_refused() {
    bad_requests_are_refused(Backend::Sqlite).await
}

/// The daily job's work: yesterday (Beijing) for every channel, then a day of the week
/// before whose report was unavailable, again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_the_daily_run_reconciles_yesterday_and_retries_what_was_unavailable() {
    let fake = fake().await;
    let app = app_with(Backend::Sqlite, &fake).await;
    const BEFORE: &str = "2026-11-29";
    fake.state.set_bill(
        BEFORE,
        FakeBill {
            lines: vec![],
            fault: Some(BillFault::SummaryOff),
        },
    );
    let first = reconcile(&app, BEFORE, "wechat").await;
    assert_eq!(first[0]["status"], "unavailable");
    fake.state.set_bill(BEFORE, bill(vec![]));
    fake.state.set_bill(DAY, bill(vec![]));
    // 10:30 on 12-01 in Beijing: "yesterday" is 11-30, whatever the UTC date.
    app.clock.set(beijing(1, 10, 30, 0, 0));
    let reports = app.bills.daily().await.expect("daily run");
    let mut seen: Vec<(String, String, String)> = reports
        .iter()
        .map(|r| {
            (
                r.date.clone(),
                r.channel.as_str().to_owned(),
                r.status.as_str().to_owned(),
            )
        })
        .collect();
    seen.sort();
    let expected = |d: &str, c: &str| (d.to_owned(), c.to_owned(), "balanced".to_owned());
    assert_eq!(
        seen,
        vec![
            expected(BEFORE, "wechat"),
            expected(DAY, "alipay"),
            expected(DAY, "wechat"),
        ]
    );
}

/// `paynotify bills reconcile` as an operator runs it: the reports printed, and the exit
/// code the contract gives them (0 balanced, 1 mismatched, 2 unavailable).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_exits_0_balanced_1_mismatched_2_unavailable() {
    use crate::support::keys::{private_key_path, public_key_path, rsa_key};
    use crate::support::provider::{MERCHANT_KEY, MERCHANT_SERIAL};

    let fake = fake().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let platform = crate::wechat::sandbox('A');
    rsa_key(MERCHANT_KEY);
    rsa_key("wechat-a");
    let config = dir.path().join("paynotify.toml");
    std::fs::write(
        &config,
        format!(
            r#"[database]
url = "sqlite://{db}"

[[wechat.merchants]]
mchid = "{mchid}"
appid = "{appid}"
apiv3_key = "{apiv3}"
private_key_file = "{private}"
merchant_serial = "{serial}"
api_base = "{url}"
certificates = "static"

[[wechat.merchants.platform_keys]]
serial = "{platform_serial}"
public_key_file = "{public}"
"#,
            db = dir.path().join("p.db").display(),
            mchid = platform.mchid,
            appid = platform.appid,
            apiv3 = crate::wechat::APIV3_A,
            private = private_key_path(MERCHANT_KEY).display(),
            serial = MERCHANT_SERIAL,
            url = fake.url,
            platform_serial = platform.serial,
            public = public_key_path("wechat-a").display(),
        ),
    )
    .expect("config");
    fake.state.set_bill("2026-11-28", bill(vec![]));
    fake.state.set_bill(
        "2026-11-27",
        bill(vec![line(
            "wechat",
            "CLI-UNKNOWN",
            100,
            "2026-11-27 09:00:00",
        )]),
    );
    fake.state.set_bill(
        "2026-11-26",
        FakeBill {
            lines: vec![],
            fault: Some(BillFault::WrongSignature),
        },
    );
    let run = |date: &'static str, json: bool| {
        let config = config.clone();
        tokio::task::spawn_blocking(move || {
            let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_paynotify"));
            command
                .args([
                    "bills",
                    "reconcile",
                    "--channel",
                    "wechat",
                    "--date",
                    date,
                    "--config",
                ])
                .arg(&config);
            if json {
                command.arg("--json");
            }
            command.output().expect("paynotify runs")
        })
    };
    let out = run("2026-11-28", false).await.expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with("2026-11-28 wechat 1900000001: balanced"),
        "{stdout}"
    );

    let out = run("2026-11-27", true).await.expect("run");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reports: Vec<Value> = serde_json::from_slice(&out.stdout).expect("--json prints JSON");
    assert_eq!(reports[0]["status"], "mismatched");
    assert_eq!(
        item(&reports[0], "MISSING_HERE", "CLI-UNKNOWN")["resolution"],
        "open"
    );

    let out = run("2026-11-26", false).await.expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(2), "{stdout}");
    assert!(stdout.contains("unavailable (bad_signature:"), "{stdout}");
}

/// The bill lists each sub-order of a combined payment as a payment of its own; WeChat knows
/// a sub-order only through its combination, so a lost one is recovered by the combine query
/// and applied with its combination, in one transaction.
async fn wechat_a_lost_sub_order_is_recovered_through_its_combination(backend: Backend) {
    use crate::support::wechat_combine::transaction_id as sub_transaction;
    let fake = fake().await;
    let app = app_with(backend, &fake).await;
    let response = app
        .client
        .post(app.url("/combined-orders"))
        .bearer_auth(&app.api_token)
        .json(
            &serde_json::json!({"combine_out_trade_no": "BC-1", "channel": "wechat",
            "account": crate::reconcile::MCHID,
            "sub_orders": [{"order_no": "BC-1-1", "amount_fen": 100},
                           {"order_no": "BC-1-2", "amount_fen": 200}]}),
        )
        .send()
        .await
        .expect("POST /combined-orders");
    assert_eq!(response.status(), 201);
    let mchid = crate::reconcile::MCHID;
    fake.state.wechat_combinations.register(
        "BC-1",
        mchid,
        "wx0000000000000001",
        &[(mchid, "BC-1-1", 100), (mchid, "BC-1-2", 200)],
    );
    fake.state.wechat_combinations.pay("BC-1");
    let sub_line = |no: &str, fen: i64, at: &str| FakeLine {
        transaction_id: sub_transaction(no),
        ..line("wechat", no, fen, at)
    };
    fake.state.set_bill(
        DAY,
        bill(vec![
            sub_line("BC-1-1", 100, "2026-11-30 12:00:00"),
            sub_line("BC-1-2", 200, "2026-11-30 12:00:00"),
        ]),
    );
    fake.state.set_bill(NEXT, bill(vec![]));
    app.clock.set(beijing(1, 10, 30, 0, 0));
    reconcile(&app, DAY, "wechat").await;
    for no in ["BC-1-1", "BC-1-2"] {
        let order = app.get_order(no).await;
        assert_eq!(order["status"], "PAID", "{no}");
        assert_eq!(order["transaction_id"], sub_transaction(no), "{no}");
    }
    let paid = app.outbox("ORDER_PAID").await;
    assert_eq!(paid.len(), 2, "each sub-order paid once");
    assert!(
        paid.iter()
            .all(|m| m.payload.0["combine_out_trade_no"] == "BC-1")
    );
    assert!(
        fake.state
            .wechat_combinations
            .asked()
            .iter()
            .all(|a| a.call == crate::support::wechat_combine::Call::Query),
        "asked only through the combine query"
    );
}
