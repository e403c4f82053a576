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
);

crate::on_every_backend!(
    wechat_a_balanced_day,
    alipay_a_balanced_day,
    wechat_a_day_with_differences,
    alipay_a_day_with_differences,
    wechat_midnight_is_pending_then_settled,
    alipay_midnight_is_pending_then_settled,
    wechat_a_bad_bill_is_never_acted_upon,
    alipay_a_bad_bill_is_never_acted_upon,
);

async fn app_with(backend: Backend, fake: &FakeProvider) -> TestApp {
    let url = fake.url.clone();
    spawn_app_with(backend, move |s| {
        configure(s, &url);
        s.bills.download_timeout_secs = 2;
    })
    .await
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
        merchant: MerchantIds {
            merchant_id: account(channel).to_owned(),
            app_id: None,
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

/// The biz_keys of the `PAYMENT_ANOMALY` messages, sorted; each must be `BILL_MISMATCH`.
async fn anomalies(app: &TestApp) -> Vec<String> {
    let messages = app.outbox("PAYMENT_ANOMALY").await;
    for m in &messages {
        assert_eq!(m.payload.0["reason"], "BILL_MISMATCH", "{:?}", m.payload.0);
    }
    let mut keys: Vec<String> = messages.into_iter().map(|m| m.biz_key).collect();
    keys.sort();
    keys
}

/// Beijing wall-clock time `at` of 2026-11-30 / 12-01, as the service's clock.
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
