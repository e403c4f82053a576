//! Orders' lifetime (`retention.orders_keep_days`): final orders past the window archived
//! with every row that names them, then removed; the rest untouched; the guarantee inside
//! the window unchanged; a failed write removes nothing.

use paynotify::archive::{Archiver, find};
use paynotify::notice::Outcome;
use paynotify::time::{Clock, Timestamp};

use crate::support::helpers::{Backend, TestApp, spawn_app};
use crate::support::test_channel::TestNotification;

macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(crate::support::helpers::Backend::Postgres).await
            })*
        }
        mod mysql {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(crate::support::helpers::Backend::Mysql).await
            })*
        }
        mod sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(crate::support::helpers::Backend::Sqlite).await
            })*
        }
    };
}

on_every_backend!(
    final_orders_past_the_window_are_archived_with_their_rows_then_removed,
    a_failed_write_removes_nothing,
    batches_take_every_order_past_the_window,
    a_paid_order_stays_a_window_past_its_payment_and_its_last_refund,
    the_archive_waits_for_a_writer_and_then_archives,
    payments_go_on_while_a_batch_is_written,
    anomalies_of_orders_not_here_are_archived_past_the_window,
    bill_differences_and_rows_left_behind_go_past_their_lifetime,
);

const DAY: i64 = 86_400;

fn sql_time(t: Timestamp) -> String {
    t.as_datetime().format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// A refund request of `order_no` in `status`, written straight into its table.
async fn refund_request(app: &TestApp, order_no: &str, out_refund_no: &str, status: &str) {
    let now = sql_time(app.clock.now());
    app.db
        .execute(&format!(
            "INSERT INTO refund_request (out_refund_no, order_no, channel, account, transaction_id, \
             amount_fen, total_fen, status, attempts, next_attempt_at, created_at, updated_at) \
             VALUES ('{out_refund_no}', '{order_no}', 'wechat', '1900000001', 'T-{order_no}', 10, 100, \
             '{status}', 0, '{now}', '{now}', '{now}')"
        ))
        .await;
}

/// Every row of the tables an archived order takes with it that names `order_no`.
async fn rows_of(app: &TestApp, order_no: &str) -> i64 {
    let mut n = 0;
    for (table, column) in [
        ("orders", "order_no"),
        ("order_account", "order_no"),
        ("pay_callback", "out_trade_no"),
        ("refund_callback", "out_trade_no"),
        ("status_callback", "out_trade_no"),
        ("refund_request", "order_no"),
        ("payment_anomaly", "order_no"),
    ] {
        n += app
            .db
            .count(&format!("{table} WHERE {column} = '{order_no}'"))
            .await;
    }
    n
}

/// Orders of every kind, created on day 0; then 401 days later the archive run: the final
/// ones without a refund in flight are in the archive with their callbacks, refund requests
/// and anomalies, and gone from every table; a waiting order, one with a refund in flight and
/// one created inside the window stay whole. A repeat of an archived order's payment is an
/// unknown order; one inside the window is still a duplicate.
async fn final_orders_past_the_window_are_archived_with_their_rows_then_removed(backend: Backend) {
    let app = spawn_app(backend).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let created = app.clock.now();

    // Paid, then refunded in part, with a finished refund request.
    let paid = TestNotification::paid("AR-PAID", "T-AR-PAID", 100);
    app.create_and_apply(&paid.to_notice()).await;
    let mut refund = TestNotification::paid("AR-PAID", "T-AR-PAID", 100);
    refund.kind = "refunded".into();
    refund.refund = Some(("AR-PAID-R1".into(), "RF-1".into(), 30));
    assert_eq!(app.apply(&refund.to_notice()).await, Outcome::Applied);
    refund_request(&app, "AR-PAID", "AR-PAID-R1", "SUCCESS").await;
    // Paid twice under two transactions: an anomaly.
    let twice = TestNotification::paid("AR-TWICE", "T-AR-TWICE-1", 100);
    app.create_and_apply(&twice.to_notice()).await;
    let second = TestNotification::paid("AR-TWICE", "T-AR-TWICE-2", 100);
    assert!(matches!(
        app.apply(&second.to_notice()).await,
        Outcome::Anomaly(_)
    ));
    // Waiting for ever (never paid, never closed), and paid with a refund still in flight.
    app.create_order("AR-WAIT", 100).await;
    let held = TestNotification::paid("AR-HELD", "T-AR-HELD", 100);
    app.create_and_apply(&held.to_notice()).await;
    refund_request(&app, "AR-HELD", "AR-HELD-R1", "PROCESSING").await;
    // Closed by expiry.
    app.create_order("AR-CLOSED", 100).await;
    app.clock.advance(3_600);
    app.db
        .execute("UPDATE orders SET status = 'CLOSED' WHERE order_no = 'AR-CLOSED'")
        .await;
    let mut before = 0;
    for order in ["AR-PAID", "AR-TWICE", "AR-CLOSED"] {
        before += rows_of(&app, order).await;
    }
    assert!(
        app.db
            .count("payment_anomaly WHERE order_no = 'AR-TWICE'")
            .await
            == 1
    );

    // Inside the window until the last day: paid 30 days before the run.
    app.clock.advance(371 * DAY);
    let recent = TestNotification::paid("AR-RECENT", "T-AR-RECENT", 100);
    app.create_and_apply(&recent.to_notice()).await;
    app.clock.advance(30 * DAY);

    let archiver = Archiver::new(dir.path(), 400);
    // Created 399 days ago: nothing yet.
    app.clock.advance(-2 * DAY);
    let early = archiver
        .run(&app.store, app.clock.as_ref())
        .await
        .expect("archive");
    assert_eq!(early.orders, 0, "{early:?}");
    app.clock.advance(2 * DAY);
    let done = archiver
        .run(&app.store, app.clock.as_ref())
        .await
        .expect("archive");
    assert_eq!(done.orders, 3, "{done:?}");
    assert_eq!(done.rows as i64, before, "every row of theirs: {done:?}");
    let day = created.as_datetime().format("%Y%m%d").to_string();
    assert_eq!(done.files.len(), 1, "{done:?}");
    let name = done.files[0]
        .file_name()
        .and_then(|n| n.to_str())
        .expect("name");
    assert!(
        name.starts_with(&format!("orders-{day}-")) && name.ends_with(".jsonl.gz"),
        "{name}"
    );

    for order in ["AR-PAID", "AR-TWICE", "AR-CLOSED"] {
        assert_eq!(rows_of(&app, order).await, 0, "{order} removed");
    }
    for order in ["AR-WAIT", "AR-HELD", "AR-RECENT"] {
        assert!(
            app.db
                .count(&format!("orders WHERE order_no = '{order}'"))
                .await
                == 1,
            "{order} kept"
        );
    }
    assert_eq!(rows_of(&app, "AR-HELD").await, 3, "AR-HELD whole");

    // The archive holds each with what was recorded of it.
    let found = find(
        dir.path(),
        "AR-PAID",
        Some(created.as_datetime().date_naive()),
    )
    .expect("read");
    assert!(found.damaged.is_empty(), "{:?}", found.damaged);
    assert_eq!(found.records.len(), 1);
    let record = &found.records[0];
    assert_eq!(record["format"], 1);
    assert_eq!(record["order"]["status"], "PAID", "refunded in part");
    assert_eq!(record["order"]["amount_fen"], 100);
    assert_eq!(record["order"]["refunded_fen"], 30);
    assert_eq!(record["pay_callbacks"][0]["transaction_id"], "T-AR-PAID");
    assert_eq!(record["refund_callbacks"][0]["out_refund_no"], "AR-PAID-R1");
    assert_eq!(record["refund_callbacks"][0]["refund_fen"], 30);
    // Every column of theirs, the provider's time and Alipay's running total among them.
    for (list, columns) in [
        ("pay_callbacks", &["occurred_at"][..]),
        (
            "refund_callbacks",
            &["occurred_at", "running_total_fen"][..],
        ),
    ] {
        for column in columns {
            assert!(
                record[list][0].get(column).is_some(),
                "{list} carries {column}: {}",
                record[list][0]
            );
        }
    }
    assert_eq!(record["refund_requests"][0]["status"], "SUCCESS");
    let twice = find(dir.path(), "AR-TWICE", None).expect("read");
    assert_eq!(twice.records.len(), 1);
    assert_eq!(twice.records[0]["order"]["status"], "PAID");
    assert_eq!(
        twice.records[0]["anomalies"].as_array().map(Vec::len),
        Some(1),
        "{}",
        twice.records[0]
    );
    let closed = find(dir.path(), "AR-CLOSED", None).expect("read");
    assert_eq!(closed.records[0]["order"]["status"], "CLOSED");
    assert!(
        find(dir.path(), "AR-WAIT", None)
            .expect("read")
            .records
            .is_empty()
    );

    // Outside the window: an unknown order, nothing written. Inside: a duplicate.
    assert_eq!(app.apply(&paid.to_notice()).await, Outcome::UnknownOrder);
    assert_eq!(rows_of(&app, "AR-PAID").await, 0, "nothing written");
    assert_eq!(app.apply(&recent.to_notice()).await, Outcome::Duplicate);
    assert_eq!(app.apply(&held.to_notice()).await, Outcome::Duplicate);

    // Once is enough: the next run finds nothing.
    let again = archiver
        .run(&app.store, app.clock.as_ref())
        .await
        .expect("archive");
    assert_eq!(again.orders, 0, "{again:?}");
}

/// The archive directory cannot be written: the run fails and every row stays.
async fn a_failed_write_removes_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let blocked = dir.path().join("not-a-directory");
    std::fs::write(&blocked, b"a file where the archive would go").expect("file");
    let paid = TestNotification::paid("AF-1", "T-AF-1", 100);
    app.create_and_apply(&paid.to_notice()).await;
    app.clock.advance(401 * DAY);
    let err = Archiver::new(&blocked, 400)
        .run(&app.store, app.clock.as_ref())
        .await
        .expect_err("the write fails");
    assert!(
        matches!(err, paynotify::archive::store::BatchError::Write(_)),
        "{err}"
    );
    assert_eq!(
        rows_of(&app, "AF-1").await,
        2,
        "the order and its callback stay"
    );
    assert_eq!(app.apply(&paid.to_notice()).await, Outcome::Duplicate);
    // Writable again: archived then.
    let done = Archiver::new(dir.path().join("archive"), 400)
        .run(&app.store, app.clock.as_ref())
        .await
        .expect("archive");
    assert_eq!(done.orders, 1);
    assert_eq!(rows_of(&app, "AF-1").await, 0);
}

/// More orders than a batch: every one archived once, over several batches of one run.
async fn batches_take_every_order_past_the_window(backend: Backend) {
    let app = spawn_app(backend).await;
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..25 {
        let paid = TestNotification::paid(&format!("AB-{i}"), &format!("T-AB-{i}"), 100);
        app.create_and_apply(&paid.to_notice()).await;
        // Across two creation days.
        app.clock.advance(3 * 3_600);
    }
    app.clock.advance(401 * DAY);
    let mut archiver = Archiver::new(dir.path(), 400);
    archiver.batch = 4;
    let done = archiver
        .run(&app.store, app.clock.as_ref())
        .await
        .expect("archive");
    assert_eq!(done.orders, 25, "{done:?}");
    assert_eq!(done.rows, 50, "{done:?}");
    assert!(done.files.len() >= 2, "a file per creation day: {done:?}");
    assert_eq!(app.db.count("orders").await, 0);
    assert_eq!(app.db.count("pay_callback").await, 0);
    for i in 0..25 {
        let found = find(dir.path(), &format!("AB-{i}"), None).expect("read");
        assert_eq!(found.records.len(), 1, "AB-{i} once");
        assert!(found.damaged.is_empty());
    }
}

/// A refund counts from the payment, not the order's creation: an order paid a month after it
/// was created, one refunded since, and one whose refund request changed since stay a whole
/// window past that; an order paid when it was created goes at the end of its window.
async fn a_paid_order_stays_a_window_past_its_payment_and_its_last_refund(backend: Backend) {
    let app = spawn_app(backend).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let created = app.clock.now();
    // Day 0: created; paid at once.
    for order in ["AW-EARLY", "AW-REFUNDED", "AW-REQUESTED"] {
        let paid = TestNotification::paid(order, &format!("T-{order}"), 100);
        app.create_and_apply(&paid.to_notice()).await;
    }
    // Day 0: created, paid a month later.
    app.create_order("AW-LATE", 100).await;
    app.clock.advance(30 * DAY);
    let late = TestNotification::paid("AW-LATE", "T-AW-LATE", 100);
    assert_eq!(app.apply(&late.to_notice()).await, Outcome::Applied);
    // Day 300: a refund of one, a refund request of another brought to its end.
    app.clock.advance(270 * DAY);
    let mut refund = TestNotification::paid("AW-REFUNDED", "T-AW-REFUNDED", 100);
    refund.kind = "refunded".into();
    refund.refund = Some(("AW-REFUNDED-R1".into(), "RF-AW-1".into(), 30));
    assert_eq!(app.apply(&refund.to_notice()).await, Outcome::Applied);
    refund_request(&app, "AW-REQUESTED", "AW-REQUESTED-R1", "SUCCESS").await;

    let archiver = Archiver::new(dir.path(), 380);
    // Day 395: created 395 days ago, paid 365 days ago (WeChat still takes its refund).
    app.clock.advance(95 * DAY);
    let done = archiver
        .run(&app.store, app.clock.as_ref())
        .await
        .expect("archive");
    assert_eq!(
        done.orders, 1,
        "only the one paid when it was created: {done:?}"
    );
    assert!(
        !find(dir.path(), "AW-EARLY", None)
            .expect("read")
            .records
            .is_empty()
    );
    for order in ["AW-LATE", "AW-REFUNDED", "AW-REQUESTED"] {
        assert_eq!(
            app.db
                .count(&format!("orders WHERE order_no = '{order}'"))
                .await,
            1,
            "{order} kept"
        );
    }
    // Its refund still finds it.
    let mut late_refund = TestNotification::paid("AW-LATE", "T-AW-LATE", 100);
    late_refund.kind = "refunded".into();
    late_refund.refund = Some(("AW-LATE-R1".into(), "RF-AW-2".into(), 10));
    assert_eq!(app.apply(&late_refund.to_notice()).await, Outcome::Applied);

    // Day 681: a window past the refunds of day 300; the late order's refund of day 395
    // keeps it until day 776.
    app.clock.advance(286 * DAY);
    let done = archiver
        .run(&app.store, app.clock.as_ref())
        .await
        .expect("archive");
    assert_eq!(done.orders, 2, "{done:?}");
    assert_eq!(rows_of(&app, "AW-REFUNDED").await, 0);
    assert_eq!(rows_of(&app, "AW-REQUESTED").await, 0);
    assert_eq!(app.status_of("AW-LATE").await, "PAID");
    app.clock.advance(96 * DAY);
    let done = archiver
        .run(&app.store, app.clock.as_ref())
        .await
        .expect("archive");
    assert_eq!(done.orders, 1, "{done:?}");
    // Its file is still the day it was created.
    let found = find(
        dir.path(),
        "AW-LATE",
        Some(created.as_datetime().date_naive()),
    )
    .expect("read");
    assert_eq!(found.records.len(), 1);
    assert_eq!(found.records[0]["refund_callbacks"][0]["refund_fen"], 10);
}

/// Another writer holds its lock when the archive starts (SQLite: the one writer of the file;
/// PostgreSQL and MySQL: the order's row): the archive waits for it, then archives.
async fn the_archive_waits_for_a_writer_and_then_archives(backend: Backend) {
    let app = spawn_app(backend).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let paid = TestNotification::paid("AL-1", "T-AL-1", 100);
    app.create_and_apply(&paid.to_notice()).await;
    app.clock.advance(401 * DAY);
    let held = app
        .db
        .hold_write_lock("AL-1", std::time::Duration::from_millis(300))
        .await;
    let done = Archiver::new(dir.path(), 400)
        .run(&app.store, app.clock.as_ref())
        .await
        .expect("the archive waits for the writer, it is not refused");
    held.await.expect("the writer commits");
    assert_eq!(done.orders, 1, "{done:?}");
    assert_eq!(rows_of(&app, "AL-1").await, 0);
}

/// While a batch's file is written (gzipped and synced), payments of other orders are applied:
/// the batch holds no lock they need (on SQLite, not the file's write lock). What changed of a
/// batch's own order meanwhile stays for the next run.
async fn payments_go_on_while_a_batch_is_written(backend: Backend) {
    let app = spawn_app(backend).await;
    let archived = TestNotification::paid("AN-OLD", "T-AN-OLD", 100);
    app.create_and_apply(&archived.to_notice()).await;
    app.clock.advance(401 * DAY);
    app.create_order("AN-NEW", 100).await;
    let fresh = TestNotification::paid("AN-NEW", "T-AN-NEW", 100).to_notice();
    let cutoff = app.clock.now().plus_seconds(-400 * DAY);
    let store = app.store.clone();
    let now = app.clock.now();
    let mut during = None;
    let (store, fresh, during_write) = (&store, &fresh, &mut during);
    let done = app
        .store
        .archive_batch(cutoff, 10, async move |batch| {
            assert_eq!(batch.len(), 1);
            // A deadlock guard only: a payment waiting for the archive's lock would wait for
            // ever (the archive waits for this write) until the busy timeout failed it.
            *during_write = Some(
                tokio::time::timeout(std::time::Duration::from_secs(30), store.apply(fresh, now))
                    .await,
            );
            Ok(())
        })
        .await
        .expect("archive");
    let during = during.expect("the batch was written");
    assert!(
        matches!(during, Ok(Ok(Outcome::Applied))),
        "a payment during the write: {during:?}"
    );
    assert_eq!(done.orders, 1, "{done:?}");
    assert_eq!(rows_of(&app, "AN-OLD").await, 0);
    assert_eq!(app.status_of("AN-NEW").await, "PAID");
}

/// A payment anomaly of `order_no` under `biz_key`, written straight into its table.
async fn anomaly(app: &TestApp, biz_key: &str, order_no: &str) {
    let now = sql_time(app.clock.now());
    app.db
        .execute(&format!(
            "INSERT INTO payment_anomaly (biz_key, order_no, payload, created_at) \
             VALUES ('{biz_key}', '{order_no}', '{{\"order_no\":\"{order_no}\",\"reason\":\"BILL_MISMATCH\"}}', '{now}')"
        ))
        .await;
}

/// A bill's difference about an order never created here has no order to leave with: it is
/// archived (a file of anomalies) and removed once past the orders' window; one inside it,
/// and one whose order is here, stay.
async fn anomalies_of_orders_not_here_are_archived_past_the_window(backend: Backend) {
    let app = spawn_app(backend).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let created = app.clock.now();
    anomaly(
        &app,
        "AO-NONE:wechat:bill:2026-01-01:MISSING_HERE",
        "AO-NONE",
    )
    .await;
    app.create_order("AO-WAIT", 100).await;
    anomaly(
        &app,
        "AO-WAIT:wechat:bill:2026-01-01:MISSING_HERE",
        "AO-WAIT",
    )
    .await;
    app.clock.advance(300 * DAY);
    anomaly(
        &app,
        "AO-RECENT:wechat:bill:2026-10-28:MISSING_HERE",
        "AO-RECENT",
    )
    .await;
    app.clock.advance(101 * DAY);
    let done = Archiver::new(dir.path(), 400)
        .run(&app.store, app.clock.as_ref())
        .await
        .expect("archive");
    assert_eq!((done.orders, done.anomalies), (0, 1), "{done:?}");
    assert_eq!(
        app.db
            .count("payment_anomaly WHERE order_no = 'AO-NONE'")
            .await,
        0
    );
    assert_eq!(
        app.db
            .count("payment_anomaly WHERE order_no = 'AO-WAIT'")
            .await,
        1
    );
    assert_eq!(
        app.db
            .count("payment_anomaly WHERE order_no = 'AO-RECENT'")
            .await,
        1
    );
    let name = format!("anomalies-{}-", created.as_datetime().format("%Y%m%d"));
    assert_eq!(done.files.len(), 1, "{done:?}");
    let file = &done.files[0];
    assert!(
        file.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(&name)),
        "{file:?}"
    );
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::MultiGzDecoder::new(std::fs::File::open(file).expect("open")),
        &mut text,
    )
    .expect("gzip");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert_eq!(lines[0]["format"], 1);
    assert_eq!(
        lines[0]["anomaly"]["biz_key"],
        "AO-NONE:wechat:bill:2026-01-01:MISSING_HERE"
    );
    assert_eq!(lines[0]["anomaly"]["payload"]["reason"], "BILL_MISMATCH");
}

/// The daily bill's differences (`bill_item`) go `retention.bill_items_keep_days` after their
/// bill date; bill rows a run left behind (`bill_line`) `retention.bill_lines_keep_days`
/// after theirs, unless a run of their date and channel holds its lease.
async fn bill_differences_and_rows_left_behind_go_past_their_lifetime(backend: Backend) {
    let app = spawn_app(backend).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let now = app.clock.now();
    let day = |ago: i64| {
        now.plus_seconds(-ago * DAY)
            .as_datetime()
            .format("%Y-%m-%d")
            .to_string()
    };
    for (ago, order) in [(42, "BI-OLD"), (41, "BI-OLD-2"), (39, "BI-KEPT")] {
        app.db
            .execute(&format!(
                "INSERT INTO bill_item (bill_date, channel, account, item_type, out_trade_no, \
                 out_refund_no, transaction_id, provider_status, provider_fen, ours_status, ours_fen, \
                 resolution) VALUES ('{}', 'wechat', '1900000001', 'MISSING_HERE', '{order}', '', \
                 'T-{order}', 'SUCCESS', 100, NULL, NULL, 'open')",
                day(ago)
            ))
            .await;
    }
    for (ago, channel, order) in [
        (12, "wechat", "BL-LEFT"),
        (12, "alipay", "BL-RUNNING"),
        (10, "wechat", "BL-RECENT"),
    ] {
        app.db
            .execute(&format!(
                "INSERT INTO bill_line (bill_date, channel, kind, out_trade_no, out_refund_no, \
                 account, transaction_id, amount_fen, status) VALUES ('{}', '{channel}', 'payment', \
                 '{order}', '', '1900000001', 'T-{order}', 100, 'SUCCESS')",
                day(ago)
            ))
            .await;
    }
    // A rerun of that day is under way on the other channel.
    app.db
        .execute(&format!(
            "INSERT INTO bill_run (bill_date, channel, locked_by, locked_until) \
             VALUES ('{}', 'alipay', 'another instance', '{}')",
            day(12),
            sql_time(now.plus_seconds(600))
        ))
        .await;
    let mut archiver = Archiver::new(dir.path(), 400);
    archiver.bill_items_keep_days = 40;
    archiver.bill_lines_keep_days = 11;
    let done = archiver
        .run(&app.store, app.clock.as_ref())
        .await
        .expect("run");
    assert_eq!((done.bill_items, done.bill_lines), (2, 1), "{done:?}");
    assert_eq!(
        app.db
            .count("bill_item WHERE out_trade_no = 'BI-KEPT'")
            .await,
        1
    );
    assert_eq!(app.db.count("bill_item").await, 1);
    assert_eq!(
        app.db
            .count("bill_line WHERE out_trade_no = 'BL-LEFT'")
            .await,
        0
    );
    assert_eq!(
        app.db.count("bill_line").await,
        2,
        "the run's and the recent one"
    );
    // The run ended without emptying them (it died): they go next time.
    app.clock.advance(601);
    let done = archiver
        .run(&app.store, app.clock.as_ref())
        .await
        .expect("run");
    assert_eq!((done.bill_items, done.bill_lines), (0, 1), "{done:?}");
    assert_eq!(
        app.db
            .count("bill_line WHERE out_trade_no = 'BL-RECENT'")
            .await,
        1
    );
    assert_eq!(app.db.count("bill_line").await, 1);
}

/// `paynotify archive show` finds an archived order in what a run wrote, by its day or in
/// every file, prints its record as one JSON line, and exits 1 for an order not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_show_prints_an_archived_order_and_exits_1_for_one_not_there() {
    let app = spawn_app(Backend::Sqlite).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let created = app.clock.now().as_datetime().date_naive();
    let paid = TestNotification::paid("AS-1", "T-AS-1", 100);
    app.create_and_apply(&paid.to_notice()).await;
    app.clock.advance(401 * DAY);
    let done = Archiver::new(dir.path(), 400)
        .run(&app.store, app.clock.as_ref())
        .await
        .expect("archive");
    assert_eq!(done.orders, 1);

    let show = |order: &str, day: Option<String>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_paynotify"));
        command
            .args(["archive", "show", order, "--dir"])
            .arg(dir.path());
        if let Some(day) = day {
            command.args(["--day", &day]);
        }
        command.output().expect("paynotify runs")
    };
    for day in [None, Some(created.format("%Y-%m-%d").to_string())] {
        let out = show("AS-1", day.clone());
        assert_eq!(out.status.code(), Some(0), "{day:?}: {out:?}");
        let stdout = String::from_utf8(out.stdout).expect("utf-8");
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 1, "{stdout}");
        let record: serde_json::Value = serde_json::from_str(lines[0]).expect("a JSON line");
        assert_eq!(record["order"]["order_no"], "AS-1");
        assert_eq!(record["pay_callbacks"][0]["transaction_id"], "T-AS-1");
    }
    let out = show("AS-2", None);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("AS-2: not in the 1 archive file"));
    let other_day = show("AS-1", Some("2020-01-01".into()));
    assert_eq!(other_day.status.code(), Some(1), "{other_day:?}");
}

/// An archive file whose first line never ends: more than a record's cap of `x` (gzip
/// members of 1 MiB each, one after the other as the archive appends them), then bytes that
/// are not gzip. A reader that held the line past the cap would meet those and fail on them.
fn endless_line_file(dir: &std::path::Path) -> std::path::PathBuf {
    use flate2::Compression;
    use flate2::write::GzEncoder;
    use std::io::Write;
    let mut member = GzEncoder::new(Vec::new(), Compression::fast());
    member.write_all(&vec![b'x'; 1 << 20]).expect("gzip");
    let member = member.finish().expect("gzip");
    let mut bytes = Vec::new();
    for _ in 0..(paynotify::archive::MAX_RECORD_BYTES >> 20) + 2 {
        bytes.extend_from_slice(&member);
    }
    bytes.extend_from_slice(b"not gzip: past the cap");
    let path = dir.join("orders-20251001-r1.jsonl.gz");
    std::fs::write(&path, bytes).expect("write");
    path
}

/// A line without an end is not held whole (a file of one took a gigabyte): reading stops
/// at `MAX_RECORD_BYTES` with the line named, `find` goes on with the other files, and
/// `paynotify archive show` says which file could not be read and why.
#[test]
fn a_line_without_an_end_stops_the_read_at_the_record_cap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = endless_line_file(dir.path());
    let cap = paynotify::archive::MAX_RECORD_BYTES;
    let found = find(dir.path(), "AR-ANY", None).expect("read");
    assert_eq!(found.files_read, 1);
    assert!(found.records.is_empty());
    assert_eq!(found.damaged.len(), 1, "{:?}", found.damaged);
    assert_eq!(found.damaged[0].0, path);
    let reason = &found.damaged[0].1;
    assert!(
        reason.contains(&format!("line 1 is longer than {cap} bytes")),
        "{reason}"
    );

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_paynotify"))
        .args(["archive", "show", "AR-ANY", "--dir"])
        .arg(dir.path())
        .output()
        .expect("archive show runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("orders-20251001-r1.jsonl.gz could not be read to the end")
            && stderr.contains("longer than"),
        "{stderr}"
    );
}
