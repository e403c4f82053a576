//! The exactly-once core, on both backends: one transition per payment, conflicts and
//! anomalies that leave orders alone, rollback on failure, state that only moves forward.

use paynotify::notice::{
    AnomalyReason, ChannelId, Notice, NoticeKind, Outcome, Refund, RefundAmount,
};
use paynotify::store::ledger::CloseResult;
use paynotify::time::Clock;

use crate::support::helpers::{Backend, TestApp, released_together, spawn_app};
use crate::support::test_channel::TestNotification;

crate::on_every_backend!(
    fifty_concurrent_deliveries_make_exactly_one_transition,
    five_hundred_mixed_notices_at_once_each_get_their_answer_and_rows,
    five_hundred_mixed_notices_without_group_apply,
    payments_released_together_share_groups_and_each_commits_once,
    a_failed_group_is_retried_payment_by_payment,
    same_payment_with_different_content_is_a_conflict_and_changes_nothing,
    a_second_payment_under_the_same_key_is_recorded_once,
    a_refund_of_another_payment_leaves_the_order_alone,
    a_provider_close_is_recorded_and_changes_nothing,
    late_repeats_after_retention_are_duplicates,
    the_longest_provider_ids_fit,
    amount_or_currency_mismatch_is_an_anomaly_and_the_order_stays_unpaid,
    merchant_mismatch_is_an_anomaly_and_the_order_stays_unpaid,
    payment_after_close_is_an_anomaly,
    payment_by_a_second_channel_is_a_duplicate_payment_anomaly,
    a_failure_after_the_cas_rolls_back_everything,
    unknown_order_writes_nothing,
    repeat_after_its_callback_row_was_purged_is_still_a_duplicate,
    partial_refunds_add_up_to_a_full_refund,
    refund_with_different_content_is_a_conflict,
    refund_before_payment_writes_nothing,
    closing_twice_writes_one_message,
    a_refund_of_a_payment_recorded_as_an_anomaly_is_recorded_too,
    state_never_moves_backwards,
);

fn paid(order_no: &str, transaction_id: &str, amount_fen: i64) -> Notice {
    TestNotification::paid(order_no, transaction_id, amount_fen).to_notice()
}

/// A refund of the payment `T-{order_no}`.
fn refund(order_no: &str, out_refund_no: &str, refund_fen: i64) -> Notice {
    refund_of(
        order_no,
        &format!("T-{order_no}"),
        out_refund_no,
        refund_fen,
    )
}

/// A refund of the payment `transaction_id`.
fn refund_of(order_no: &str, transaction_id: &str, out_refund_no: &str, refund_fen: i64) -> Notice {
    let mut n = paid(order_no, transaction_id, 0);
    n.kind = NoticeKind::Refunded(Refund {
        out_refund_no: out_refund_no.into(),
        refund_id: format!("RID-{out_refund_no}"),
        amount: RefundAmount::This(refund_fen),
    });
    n
}

fn pair(reason: &str, biz_key: &str) -> (String, String) {
    (reason.to_owned(), biz_key.to_owned())
}

/// The `reason` of the only anomaly message of an order.
async fn anomaly_reason(app: &TestApp, order_no: &str) -> String {
    let anomalies: Vec<_> = app
        .outbox("PAYMENT_ANOMALY")
        .await
        .into_iter()
        .filter(|m| m.payload.0["order_no"] == order_no)
        .collect();
    assert_eq!(anomalies.len(), 1, "one anomaly message for {order_no}");
    anomalies[0].payload.0["reason"]
        .as_str()
        .expect("reason")
        .to_owned()
}

async fn fifty_concurrent_deliveries_make_exactly_one_transition(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_order("O-50", 19900).await;
    let notice = paid("O-50", "T-50", 19900);
    let now = app.clock.now();
    let outcomes: Vec<Outcome> = released_together(50, |_| {
        let (store, notice) = (app.store.clone(), notice.clone());
        async move { store.apply(&notice, now).await }
    })
    .await
    .into_iter()
    .map(|result| result.expect("no database error"))
    .collect();
    let applied = outcomes.iter().filter(|o| **o == Outcome::Applied).count();
    assert_eq!(applied, 1, "{outcomes:?}");
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Outcome::Applied | Outcome::Duplicate)),
        "{outcomes:?}"
    );
    assert_eq!(app.status_of("O-50").await, "PAID");
    assert_eq!(
        app.db
            .count("pay_callback WHERE out_trade_no = 'O-50'")
            .await,
        1
    );
    assert_eq!(app.messages("ORDER_PAID").await, 1);
    assert_eq!(app.db.count("local_message").await, 1);
}

/// 500 notices released at once: first deliveries with their twin, first deliveries racing a
/// conflicting copy (same transaction, other amount), amount anomalies, unknown orders, and
/// refunds with their twin. Every answer is one the rules allow, and the rows add up.
async fn five_hundred_mixed_notices_at_once_each_get_their_answer_and_rows(backend: Backend) {
    let app = five_hundred_mixed_notices(backend, 64).await;
    let counts = app.store.group_stats();
    assert!(
        counts.groups > 0 && counts.payments > counts.groups && counts.decided > 0,
        "payments released together share groups: {counts:?}"
    );
}

/// The same with `database.group_apply_max = 0`: every payment on its own.
async fn five_hundred_mixed_notices_without_group_apply(backend: Backend) {
    let app = five_hundred_mixed_notices(backend, 0).await;
    assert_eq!(app.store.group_stats(), Default::default());
}

async fn five_hundred_mixed_notices(backend: Backend, group_apply_max: u32) -> TestApp {
    // 500 notices queue for 8 connections: generous waits, so a machine busy with other
    // work slows this test down instead of turning a wait into a 503.
    let app = crate::support::helpers::spawn_app_with(backend, |s| {
        s.database.acquire_timeout_ms = 60_000;
        s.database.statement_timeout_ms = 60_000;
        s.database.group_apply_max = group_apply_max;
    })
    .await;
    let mut groups: Vec<(&str, Vec<Notice>)> = Vec::new();
    for i in 0..100 {
        let no = format!("MX-P{i}");
        app.create_order(&no, 19900).await;
        let n = paid(&no, &format!("T-{no}"), 19900);
        groups.push(("twin", vec![n.clone(), n]));
    }
    for i in 0..50 {
        let no = format!("MX-C{i}");
        app.create_order(&no, 19900).await;
        let txn = format!("T-{no}");
        groups.push((
            "conflict",
            vec![paid(&no, &txn, 19900), paid(&no, &txn, 100)],
        ));
    }
    for i in 0..50 {
        let no = format!("MX-A{i}");
        app.create_order(&no, 19900).await;
        groups.push(("anomaly", vec![paid(&no, &format!("T-{no}"), 100)]));
    }
    for i in 0..50 {
        let no = format!("MX-U{i}");
        groups.push(("unknown", vec![paid(&no, &format!("T-{no}"), 19900)]));
    }
    for i in 0..50 {
        let no = format!("MX-R{i}");
        app.create_and_apply(&paid(&no, &format!("T-{no}"), 10000))
            .await;
        let r = refund(&no, "R1", 10000);
        groups.push(("refund", vec![r.clone(), r]));
    }
    let total: usize = groups.iter().map(|(_, g)| g.len()).sum();
    assert_eq!(total, 500);

    let now = app.clock.now();
    let all: Vec<(&str, Notice)> = groups
        .iter()
        .flat_map(|(group, notices)| notices.iter().map(|n| (*group, n.clone())))
        .collect();
    let results = released_together(total, |i| {
        let (store, (group, notice)) = (app.store.clone(), all[i].clone());
        let order = notice.out_trade_no.clone();
        async move { (group, order, store.apply(&notice, now).await) }
    })
    .await;
    let mut answers: std::collections::BTreeMap<String, Vec<Outcome>> = Default::default();
    let mut kinds: std::collections::BTreeMap<String, &str> = Default::default();
    for (group, order, result) in results {
        let outcome = result.unwrap_or_else(|e| panic!("{group} {order}: {e}"));
        answers.entry(order.clone()).or_default().push(outcome);
        kinds.insert(order, group);
    }
    let (mut conflicts_applied, mut conflicts_anomaly) = (0, 0);
    for (order, outcomes) in &mut answers {
        outcomes.sort_by_key(|o| o.as_str());
        let got = outcomes.as_slice();
        let mismatch = AnomalyReason::AmountMismatch;
        match kinds[order] {
            "twin" | "refund" => {
                assert_eq!(got, [Outcome::Applied, Outcome::Duplicate], "{order}")
            }
            "conflict" => match got {
                [Outcome::Applied, Outcome::Conflict] | [Outcome::Conflict, Outcome::Applied] => {
                    conflicts_applied += 1
                }
                [Outcome::Anomaly(r), Outcome::Conflict]
                | [Outcome::Conflict, Outcome::Anomaly(r)]
                    if *r == mismatch =>
                {
                    conflicts_anomaly += 1
                }
                other => panic!("{order}: {other:?}"),
            },
            "anomaly" => assert_eq!(got, [Outcome::Anomaly(mismatch)], "{order}"),
            "unknown" => assert_eq!(got, [Outcome::UnknownOrder], "{order}"),
            other => panic!("{other}"),
        }
    }
    assert_eq!(conflicts_applied + conflicts_anomaly, 50);

    let count = |sql: String| {
        let db = &app.db;
        async move { db.count(&sql).await }
    };
    assert_eq!(
        count("orders WHERE order_no LIKE 'MX-P%' AND status = 'PAID'".into()).await,
        100
    );
    assert_eq!(
        count("orders WHERE order_no LIKE 'MX-C%' AND status = 'PAID'".into()).await,
        conflicts_applied
    );
    assert_eq!(
        count("orders WHERE order_no LIKE 'MX-A%' AND status = 'WAIT_PAY'".into()).await,
        50
    );
    assert_eq!(
        count("orders WHERE order_no LIKE 'MX-R%' AND status = 'REFUNDED'".into()).await,
        50
    );
    assert_eq!(count("orders WHERE order_no LIKE 'MX-U%'".into()).await, 0);
    // One callback row per paid, conflicting (the first copy's), anomalous and refunded order.
    assert_eq!(
        count("pay_callback WHERE out_trade_no LIKE 'MX-U%'".into()).await,
        0
    );
    assert_eq!(count("pay_callback".into()).await, 100 + 50 + 50 + 50);
    assert_eq!(count("refund_callback".into()).await, 50);
    assert_eq!(
        app.messages("ORDER_PAID").await,
        100 + conflicts_applied + 50
    );
    assert_eq!(
        app.messages("PAYMENT_ANOMALY").await,
        conflicts_anomaly + 50
    );
    assert_eq!(app.messages("ORDER_REFUNDED").await, 50);
    assert_eq!(
        count("local_message".into()).await,
        100 + 50 + 50 + 50 + 50,
        "nothing else"
    );
    // One message per order and topic.
    assert_eq!(
        count("(SELECT topic, biz_key FROM local_message GROUP BY topic, biz_key HAVING count(*) > 1) AS dup".into()).await,
        0
    );
    app
}

/// First deliveries of 200 orders released at once, with group apply: they share groups
/// (fewer groups than payments), every one is applied exactly once, and a group's rows are
/// all there: one callback row, one `PAID` order and one `ORDER_PAID` per order, stamped with
/// the notice's own time.
async fn payments_released_together_share_groups_and_each_commits_once(backend: Backend) {
    let app = crate::support::helpers::spawn_app_with(backend, |s| {
        s.database.acquire_timeout_ms = 60_000;
        s.database.statement_timeout_ms = 60_000;
        s.database.group_apply_max = 16;
    })
    .await;
    let notices: Vec<Notice> = orders_with_payments(&app, 200, "GR").await;
    let now = app.clock.now();
    let outcomes = apply_at_once(&app, &notices, now).await;
    for (n, outcome) in notices.iter().zip(&outcomes) {
        assert_eq!(
            outcome.as_ref().expect("no database error"),
            &Outcome::Applied,
            "{}",
            n.out_trade_no
        );
    }
    let counts = app.store.group_stats();
    assert_eq!(counts.payments, 200, "every payment went through a group");
    assert_eq!(counts.decided, 200, "and was decided there: {counts:?}");
    assert!(counts.groups < counts.payments, "{counts:?}");
    assert_eq!(counts.failed, 0);
    assert_eq!(
        app.db
            .count("orders WHERE order_no LIKE 'GR-%' AND status = 'PAID'")
            .await,
        200
    );
    assert_eq!(app.db.count("pay_callback").await, 200);
    assert_eq!(app.messages("ORDER_PAID").await, 200);
    assert_eq!(app.db.count("local_message").await, 200);
    // Each payment's own values landed on its own order: nothing bound out of step.
    let paid = app.outbox("ORDER_PAID").await;
    for (i, n) in notices.iter().enumerate() {
        let at = serde_json::json!(now.plus_seconds(i64::try_from(i).expect("small")));
        let message = paid
            .iter()
            .find(|m| m.biz_key == n.out_trade_no)
            .unwrap_or_else(|| panic!("ORDER_PAID of {}", n.out_trade_no));
        let p = &message.payload.0;
        assert_eq!(p["order_no"], n.out_trade_no.as_str());
        assert_eq!(p["transaction_id"], n.transaction_id.as_str());
        assert_eq!(p["amount_fen"], n.amount_fen);
        assert_eq!(
            p["paid_at"], at,
            "{}: the notice's own time",
            n.out_trade_no
        );
        let order = app.get_order(&n.out_trade_no).await;
        assert_eq!(order["status"], "PAID");
        assert_eq!(order["transaction_id"], n.transaction_id.as_str());
        assert_eq!(order["paid_at"], at, "{}", n.out_trade_no);
    }
    assert_eq!(
        app.db
            .count("pay_callback c JOIN orders o ON o.order_no = c.out_trade_no WHERE c.amount_fen = o.amount_fen AND c.transaction_id = o.transaction_id")
            .await,
        200,
        "every callback row carries its own payment's amount and transaction"
    );

    // Redelivered together: duplicates, decided in groups, nothing written.
    let again = apply_at_once(&app, &notices, app.clock.now()).await;
    assert!(
        again.iter().all(|o| matches!(o, Ok(Outcome::Duplicate))),
        "{again:?}"
    );
    assert_eq!(app.db.count("local_message").await, 200);
    let counts = app.store.group_stats();
    assert_eq!((counts.payments, counts.decided), (400, 400), "{counts:?}");
}

/// A group that fails as a whole (here: one order's `ORDER_PAID` insert fails, so the
/// group's outbox insert fails) is undone and its payments are applied one by one: the one
/// that cannot be written fails alone, every other one is applied.
async fn a_failed_group_is_retried_payment_by_payment(backend: Backend) {
    let app = crate::support::helpers::spawn_app_with(backend, |s| {
        s.database.acquire_timeout_ms = 60_000;
        s.database.statement_timeout_ms = 60_000;
    })
    .await;
    // Rounds until the poisoned payment shared a group (the first, as a rule).
    for round in 0..10 {
        let prefix = format!("FG{round}");
        let notices = orders_with_payments(&app, 30, &prefix).await;
        let poisoned = &notices[7].out_trade_no;
        app.db.poison_outbox(poisoned).await;
        let before = app.store.group_stats();
        let outcomes = apply_at_once(&app, &notices, app.clock.now()).await;
        for (n, outcome) in notices.iter().zip(&outcomes) {
            if &n.out_trade_no == poisoned {
                assert!(outcome.is_err(), "{poisoned}: {outcome:?}");
                assert_eq!(app.status_of(poisoned).await, "WAIT_PAY");
            } else {
                assert_eq!(
                    outcome.as_ref().ok(),
                    Some(&Outcome::Applied),
                    "{}",
                    n.out_trade_no
                );
                assert_eq!(app.status_of(&n.out_trade_no).await, "PAID");
            }
        }
        assert_eq!(
            app.db
                .count(&format!(
                    "pay_callback WHERE out_trade_no LIKE '{prefix}-%'"
                ))
                .await,
            29,
            "nothing of the poisoned payment"
        );
        // Done once a failed group carried other payments besides the poisoned one (each of
        // them applied above, one by one).
        let after = app.store.group_stats();
        if after.failed_payments - before.failed_payments > after.failed - before.failed {
            return;
        }
    }
    panic!("the poisoned payment never shared a group in ten rounds");
}

/// `count` orders `{prefix}-{i}` of 19900 + i fen, and a first delivery for each
/// (transaction `T-{order}`), so a payment's values never match another's.
async fn orders_with_payments(app: &TestApp, count: usize, prefix: &str) -> Vec<Notice> {
    let mut notices = Vec::with_capacity(count);
    for i in 0..count {
        let no = format!("{prefix}-{i:03}");
        let fen = 19900 + i64::try_from(i).expect("small");
        app.create_order(&no, fen).await;
        notices.push(paid(&no, &format!("T-{no}"), fen));
    }
    notices
}

/// Applies every notice at once (released by one barrier), the i-th received `now` + i
/// seconds; answers in order.
async fn apply_at_once(
    app: &TestApp,
    notices: &[Notice],
    now: paynotify::time::Timestamp,
) -> Vec<Result<Outcome, paynotify::store::StoreError>> {
    released_together(notices.len(), |i| {
        let (store, notice) = (app.store.clone(), notices[i].clone());
        let now = now.plus_seconds(i64::try_from(i).expect("small"));
        async move { store.apply(&notice, now).await }
    })
    .await
}

async fn same_payment_with_different_content_is_a_conflict_and_changes_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_and_apply(&paid("O-C", "T-1", 19900)).await;
    let before = app.get_order("O-C").await;

    // The same transaction id with another amount, currency or merchant: the provider
    // contradicts itself.
    assert_eq!(app.apply(&paid("O-C", "T-1", 100)).await, Outcome::Conflict);
    let mut usd = paid("O-C", "T-1", 19900);
    usd.currency = "USD".into();
    assert_eq!(app.apply(&usd).await, Outcome::Conflict);
    let mut other_app = paid("O-C", "T-1", 19900);
    other_app.merchant.app_id = Some("wx-other".into());
    assert_eq!(app.apply(&other_app).await, Outcome::Conflict);

    assert_eq!(app.get_order("O-C").await, before);
    assert_eq!(before["transaction_id"], "T-1");
    assert_eq!(app.db.count("pay_callback").await, 1);
    assert_eq!(app.db.count("local_message").await, 1);
}

async fn a_second_payment_under_the_same_key_is_recorded_once(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_and_apply(&paid("O-2P", "T-1", 19900)).await;
    let before = app.get_order("O-2P").await;

    // Another merchant of the channel took a second, real payment for the same order.
    let second = paid("O-2P", "T-2", 19900);
    assert_eq!(
        app.apply(&second).await,
        Outcome::Anomaly(AnomalyReason::DuplicatePayment)
    );
    for _ in 0..3 {
        assert_eq!(app.apply(&second).await, Outcome::Duplicate, "its retries");
    }
    assert_eq!(app.get_order("O-2P").await, before, "the order untouched");
    assert_eq!(
        app.anomalies("O-2P").await,
        [pair("DUPLICATE_PAYMENT", "O-2P:wechat:T-2")]
    );
    // The first payment's repeat is still a plain duplicate.
    assert_eq!(
        app.apply(&paid("O-2P", "T-1", 19900)).await,
        Outcome::Duplicate
    );
    assert_eq!(app.db.count("pay_callback").await, 1);
    assert_eq!(app.messages("ORDER_PAID").await, 1);
}

async fn a_refund_of_another_payment_leaves_the_order_alone(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_and_apply(&paid("O-OR", "T-A", 10000)).await;
    assert_eq!(
        app.apply(&paid("O-OR", "T-B", 10000)).await,
        Outcome::Anomaly(AnomalyReason::DuplicatePayment)
    );

    // Payment B is refunded in full: payment A still stands.
    let refund_b = refund_of("O-OR", "T-B", "R-B", 10000);
    assert_eq!(
        app.apply(&refund_b).await,
        Outcome::Anomaly(AnomalyReason::OtherPaymentRefunded)
    );
    assert_eq!(app.apply(&refund_b).await, Outcome::Duplicate);
    assert_eq!(app.refund_state("O-OR").await, ("PAID".into(), 0));
    assert_eq!(
        app.anomalies("O-OR").await,
        [
            pair("DUPLICATE_PAYMENT", "O-OR:wechat:T-B"),
            pair("OTHER_PAYMENT_REFUNDED", "O-OR:wechat:R-B"),
        ]
    );
    assert_eq!(app.messages("ORDER_REFUNDED").await, 0);

    // A refund through the channel that did not pay the order is another payment's too.
    let mut alipay = refund_of("O-OR", "T-A", "R-ALI", 10000);
    alipay.channel = ChannelId::Alipay;
    assert_eq!(
        app.apply(&alipay).await,
        Outcome::Anomaly(AnomalyReason::OtherPaymentRefunded)
    );
    assert_eq!(app.refund_state("O-OR").await, ("PAID".into(), 0));

    // The order's own payment refunded: that one moves it.
    assert_eq!(
        app.apply(&refund_of("O-OR", "T-A", "R-A", 10000)).await,
        Outcome::Applied
    );
    assert_eq!(app.refund_state("O-OR").await, ("REFUNDED".into(), 10000));
    assert_eq!(app.messages("ORDER_REFUNDED").await, 1);
}

async fn a_provider_close_is_recorded_and_changes_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_order("O-PCL", 19900).await;
    let mut closed = paid("O-PCL", "ALI-T", 19900);
    closed.channel = ChannelId::Alipay;
    closed.kind = NoticeKind::Closed;
    assert_eq!(app.apply(&closed).await, Outcome::Ignored);
    assert_eq!(app.apply(&closed).await, Outcome::Duplicate);
    assert_eq!(app.status_of("O-PCL").await, "WAIT_PAY");
    assert_eq!(app.messages("ORDER_CLOSED").await, 0);
    let recorded = app.store.callbacks_of("O-PCL").await.expect("callbacks");
    assert_eq!(recorded.statuses.len(), 1);
    assert_eq!(recorded.statuses[0].status, "CLOSED");
    assert_eq!(recorded.statuses[0].transaction_id, "ALI-T");

    // The buyer pays the same order through the other channel.
    assert_eq!(
        app.apply(&paid("O-PCL", "WX-T", 19900)).await,
        Outcome::Applied
    );
    assert_eq!(app.status_of("O-PCL").await, "PAID");

    closed.out_trade_no = "NOPE".into();
    assert_eq!(app.apply(&closed).await, Outcome::UnknownOrder);
    assert_eq!(app.db.count("status_callback").await, 1);
}

/// Every event is emitted once for the life of its order: after retention ran over old
/// rows, a provider's late repeat is still a duplicate.
async fn late_repeats_after_retention_are_duplicates(backend: Backend) {
    let app = spawn_app(backend).await;
    let now = app.clock.now();
    // A payment after close.
    app.create_order("L-PAC", 1000).await;
    app.store
        .close_order("L-PAC", "api", now)
        .await
        .expect("close");
    let after_close = paid("L-PAC", "T-PAC", 1000);
    // A payment through a second channel, and a second payment of the same channel.
    app.create_order("L-DUP", 1000).await;
    let first = paid("L-DUP", "T-DUP", 1000);
    let mut by_alipay = paid("L-DUP", "ALI-DUP", 1000);
    by_alipay.channel = ChannelId::Alipay;
    let second = paid("L-DUP", "T-DUP-2", 1000);
    // A fully refunded order.
    app.create_order("L-REF", 1000).await;
    let pay_ref = paid("L-REF", "T-L-REF", 1000);
    let full_refund = refund("L-REF", "R-1", 1000);
    let notices = [
        &after_close,
        &first,
        &by_alipay,
        &second,
        &pay_ref,
        &full_refund,
    ];
    for n in notices {
        let outcome = app.apply(n).await;
        assert!(
            matches!(outcome, Outcome::Applied | Outcome::Anomaly(_)),
            "{outcome:?}"
        );
    }
    let events = app.db.count("local_message").await;
    assert_eq!(
        events, 7,
        "three anomalies, two paid, one refunded, one closed"
    );

    // Everything delivered long ago, then retention.
    app.db
        .execute("UPDATE local_message SET status = 1, sent_at = created_at")
        .await;
    app.clock.advance(90 * 86_400);
    paynotify::jobs::purge(&app.store, app.clock.as_ref(), 7, 7)
        .await
        .expect("purge");

    let now = app.clock.now();
    for n in notices {
        let outcome = app.store.apply(n, now).await.expect("no database error");
        assert_eq!(outcome, Outcome::Duplicate, "{n:?}");
    }
    assert_eq!(
        app.db.count("local_message WHERE status = 0").await,
        0,
        "no event emitted twice"
    );
}

/// Provider ids at their documented maxima fit every column they land in, on every backend
/// (on PostgreSQL a value wider than its column is an error the provider retries forever).
async fn the_longest_provider_ids_fit(backend: Backend) {
    use paynotify::notice::max_len;
    let app = spawn_app(backend).await;
    let order_no = "O".repeat(max_len::ORDER_NO);
    let txn = "T".repeat(max_len::TRANSACTION_ID);
    let out_refund_no = |c: &str| c.repeat(max_len::OUT_REFUND_NO);
    app.create_and_apply(&paid(&order_no, &txn, 1000)).await;
    let long_refund = |out_refund_no: String, txn: &str, fen| {
        let mut n = refund_of(&order_no, txn, &out_refund_no, fen);
        if let NoticeKind::Refunded(r) = &mut n.kind {
            // Alipay's refund id: trade_no:out_biz_no.
            r.refund_id = format!("{}:{}", "9".repeat(max_len::TRANSACTION_ID), out_refund_no);
            assert_eq!(r.refund_id.len(), max_len::REFUND_ID);
        }
        n.channel = ChannelId::Alipay;
        n
    };
    // A refund anomaly's key is the longest: order, channel and the refund id.
    let mut alipay = paid(&order_no, &txn, 1000);
    alipay.channel = ChannelId::Alipay;
    assert_eq!(
        app.apply(&alipay).await,
        Outcome::Anomaly(AnomalyReason::DuplicatePayment)
    );
    assert_eq!(
        app.apply(&long_refund(out_refund_no("A"), &txn, 1000))
            .await,
        Outcome::Anomaly(AnomalyReason::OtherPaymentRefunded)
    );
    let mut foreign = long_refund(out_refund_no("B"), &txn, 1000);
    foreign.merchant_matches = false;
    assert_eq!(
        app.apply(&foreign).await,
        Outcome::Anomaly(AnomalyReason::MerchantMismatch)
    );
    // ORDER_REFUNDED: order and refund number.
    let mut own = long_refund(out_refund_no("C"), &txn, 1000);
    own.channel = ChannelId::Wechat;
    assert_eq!(app.apply(&own).await, Outcome::Applied);
    assert_eq!(app.refund_state(&order_no).await, ("REFUNDED".into(), 1000));
    assert_eq!(app.db.count("refund_callback").await, 3);
}

async fn amount_or_currency_mismatch_is_an_anomaly_and_the_order_stays_unpaid(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_order("O-A", 19900).await;
    let short = paid("O-A", "T-A", 100);
    assert_eq!(
        app.apply(&short).await,
        Outcome::Anomaly(AnomalyReason::AmountMismatch)
    );
    assert_eq!(
        app.apply(&short).await,
        Outcome::Duplicate,
        "repeat of the anomaly"
    );
    assert_eq!(app.status_of("O-A").await, "WAIT_PAY");
    assert_eq!(anomaly_reason(&app, "O-A").await, "AMOUNT_MISMATCH");
    assert_eq!(app.messages("ORDER_PAID").await, 0);
    assert_eq!(
        app.db
            .count("pay_callback WHERE out_trade_no = 'O-A'")
            .await,
        1
    );

    app.create_order("O-CUR", 19900).await;
    let mut usd = paid("O-CUR", "T-CUR", 19900);
    usd.currency = "USD".into();
    assert_eq!(
        app.apply(&usd).await,
        Outcome::Anomaly(AnomalyReason::AmountMismatch)
    );
    assert_eq!(app.status_of("O-CUR").await, "WAIT_PAY");
}

async fn merchant_mismatch_is_an_anomaly_and_the_order_stays_unpaid(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_order("O-M", 19900).await;
    let mut foreign = paid("O-M", "T-M", 19900);
    foreign.merchant_matches = false;
    assert_eq!(
        app.apply(&foreign).await,
        Outcome::Anomaly(AnomalyReason::MerchantMismatch)
    );
    assert_eq!(app.status_of("O-M").await, "WAIT_PAY");
    assert_eq!(anomaly_reason(&app, "O-M").await, "MERCHANT_MISMATCH");
    assert_eq!(app.messages("ORDER_PAID").await, 0);
}

async fn payment_after_close_is_an_anomaly(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_order("O-PC", 19900).await;
    let closed = app.store.close_order("O-PC", "api", app.clock.now()).await;
    assert!(matches!(closed, Ok(CloseResult::Closed(_))), "{closed:?}");
    assert_eq!(
        app.apply(&paid("O-PC", "T-PC", 19900)).await,
        Outcome::Anomaly(AnomalyReason::PaidAfterClose)
    );
    assert_eq!(app.status_of("O-PC").await, "CLOSED");
    assert_eq!(anomaly_reason(&app, "O-PC").await, "PAID_AFTER_CLOSE");
}

async fn payment_by_a_second_channel_is_a_duplicate_payment_anomaly(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_and_apply(&paid("O-2C", "WX-1", 19900)).await;
    let mut alipay = paid("O-2C", "ALI-1", 19900);
    alipay.channel = ChannelId::Alipay;
    assert_eq!(
        app.apply(&alipay).await,
        Outcome::Anomaly(AnomalyReason::DuplicatePayment)
    );
    let order = app.get_order("O-2C").await;
    assert_eq!(order["status"], "PAID");
    assert_eq!(order["channel"], "wechat");
    assert_eq!(order["transaction_id"], "WX-1");
    assert_eq!(anomaly_reason(&app, "O-2C").await, "DUPLICATE_PAYMENT");
    assert_eq!(
        app.db
            .count("pay_callback WHERE out_trade_no = 'O-2C'")
            .await,
        2
    );
    assert_eq!(app.messages("ORDER_PAID").await, 1);
}

async fn a_failure_after_the_cas_rolls_back_everything(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_order("O-RB", 19900).await;
    // The ORDER_PAID insert — the last statement, after the order CAS — fails.
    app.db.poison_outbox("O-RB").await;
    let notice = paid("O-RB", "T-RB", 19900);
    let result = app.store.apply(&notice, app.clock.now()).await;
    assert!(result.is_err(), "the outbox insert must fail: {result:?}");
    assert_eq!(
        app.status_of("O-RB").await,
        "WAIT_PAY",
        "order CAS rolled back"
    );
    assert_eq!(
        app.db.count("pay_callback").await,
        0,
        "callback row rolled back"
    );
    assert_eq!(app.db.count("local_message").await, 0, "no message");

    // Nothing half-written blocks the provider's retry once the fault is gone.
    app.db.unpoison_outbox("O-RB").await;
    assert_eq!(app.apply(&notice).await, Outcome::Applied);
    assert_eq!(app.status_of("O-RB").await, "PAID");
}

async fn unknown_order_writes_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    assert_eq!(
        app.apply(&paid("NOPE", "T-N", 19900)).await,
        Outcome::UnknownOrder
    );
    assert_eq!(
        app.apply(&refund("NOPE", "R-N", 100)).await,
        Outcome::UnknownOrder
    );
    assert_eq!(app.db.count("pay_callback").await, 0);
    assert_eq!(app.db.count("refund_callback").await, 0);
    assert_eq!(app.db.count("local_message").await, 0);
    // The order may be created late; the provider's retry then succeeds.
    app.create_and_apply(&paid("NOPE", "T-N", 19900)).await;
}

async fn repeat_after_its_callback_row_was_purged_is_still_a_duplicate(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_order("O-P", 19900).await;
    let notice = paid("O-P", "T-P", 19900);
    assert_eq!(app.apply(&notice).await, Outcome::Applied);
    app.db.execute("DELETE FROM pay_callback").await;
    assert_eq!(app.apply(&notice).await, Outcome::Duplicate);
    assert_eq!(
        app.db.count("pay_callback").await,
        0,
        "nothing written for a duplicate"
    );
    assert_eq!(app.db.count("local_message").await, 1);
}

/// Order `order_no` of 10000 fen paid (transaction `T-{order_no}`), then refunded 3000 fen
/// by refund `R1`.
async fn paid_then_refunded_3000(app: &TestApp, order_no: &str) {
    app.create_and_apply(&paid(order_no, &format!("T-{order_no}"), 10000))
        .await;
    assert_eq!(
        app.apply(&refund(order_no, "R1", 3000)).await,
        Outcome::Applied
    );
}

async fn partial_refunds_add_up_to_a_full_refund(backend: Backend) {
    let app = spawn_app(backend).await;
    paid_then_refunded_3000(&app, "O-R").await;
    assert_eq!(
        app.apply(&refund("O-R", "R1", 3000)).await,
        Outcome::Duplicate
    );
    assert_eq!(app.refund_state("O-R").await, ("PAID".into(), 3000));

    assert_eq!(
        app.apply(&refund("O-R", "R2", 7000)).await,
        Outcome::Applied
    );
    assert_eq!(app.refund_state("O-R").await, ("REFUNDED".into(), 10000));
    assert_eq!(app.messages("ORDER_REFUNDED").await, 2);

    // More than was paid: recorded as an anomaly, never applied.
    assert_eq!(
        app.apply(&refund("O-R", "R3", 1)).await,
        Outcome::Anomaly(AnomalyReason::AmountMismatch)
    );
    assert_eq!(app.get_order("O-R").await["refunded_fen"], 10000);
}

async fn refund_with_different_content_is_a_conflict(backend: Backend) {
    let app = spawn_app(backend).await;
    paid_then_refunded_3000(&app, "O-RC").await;
    assert_eq!(
        app.apply(&refund("O-RC", "R1", 4000)).await,
        Outcome::Conflict
    );
    assert_eq!(app.get_order("O-RC").await["refunded_fen"], 3000);
}

async fn refund_before_payment_writes_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_order("O-E", 10000).await;
    assert_eq!(
        app.apply(&refund("O-E", "R1", 3000)).await,
        Outcome::TooEarly
    );
    assert_eq!(app.db.count("refund_callback").await, 0);
    assert_eq!(app.db.count("local_message").await, 0);
    app.apply(&paid("O-E", "T-O-E", 10000)).await;
    assert_eq!(
        app.apply(&refund("O-E", "R1", 3000)).await,
        Outcome::Applied
    );
}

async fn a_refund_of_a_payment_recorded_as_an_anomaly_is_recorded_too(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_order("O-AR", 10000).await;
    // Paid the wrong amount: recorded, order unpaid. Then that money is refunded.
    assert_eq!(
        app.apply(&paid("O-AR", "T-O-AR", 500)).await,
        Outcome::Anomaly(AnomalyReason::AmountMismatch)
    );
    assert_eq!(
        app.apply(&refund("O-AR", "R1", 500)).await,
        Outcome::Anomaly(AnomalyReason::OtherPaymentRefunded),
        "recorded, not 404 until the order expires"
    );
    assert_eq!(app.status_of("O-AR").await, "WAIT_PAY");
    assert_eq!(app.db.count("refund_callback").await, 1);
    assert_eq!(app.messages("PAYMENT_ANOMALY").await, 2);
}

async fn closing_twice_writes_one_message(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_order("O-CL", 100).await;
    let now = app.clock.now();
    assert!(matches!(
        app.store.close_order("O-CL", "api", now).await,
        Ok(CloseResult::Closed(_))
    ));
    assert!(matches!(
        app.store.close_order("O-CL", "api", now).await,
        Ok(CloseResult::AlreadyClosed(_))
    ));
    assert_eq!(app.messages("ORDER_CLOSED").await, 1);
    assert_eq!(
        app.store.close_order("MISSING", "api", now).await.ok(),
        Some(CloseResult::NotFound)
    );
}

/// Every operation applied to an order in every status: the status after it is the one in
/// the table, and never a move the state machine forbids.
async fn state_never_moves_backwards(backend: Backend) {
    use paynotify::order::OrderStatus::{self, *};

    #[derive(Debug, Clone, Copy)]
    enum Op {
        PayWechat,
        PayAlipay,
        RefundFull,
        RefundPartial,
        CloseApi,
        CloseByProvider,
    }
    use Op::*;
    let ops = [
        PayWechat,
        PayAlipay,
        RefundFull,
        RefundPartial,
        CloseApi,
        CloseByProvider,
    ];
    // The expected status after each op, in the order of `ops`.
    let table: [(OrderStatus, [OrderStatus; 6]); 4] = [
        // A provider's close of its trade never closes the order (the buyer may still pay).
        (WaitPay, [Paid, Paid, WaitPay, WaitPay, Closed, WaitPay]),
        (Paid, [Paid, Paid, Refunded, Paid, Paid, Paid]),
        (
            Refunded,
            [Refunded, Refunded, Refunded, Refunded, Refunded, Refunded],
        ),
        (Closed, [Closed, Closed, Closed, Closed, Closed, Closed]),
    ];

    let app = spawn_app(backend).await;
    let now = app.clock.now();
    for (i, (start, expected)) in table.iter().enumerate() {
        for (j, op) in ops.iter().enumerate() {
            let no = format!("S{i}-{j}");
            app.create_order(&no, 1000).await;
            // Bring the order to `start` through real operations.
            if matches!(start, Paid | Refunded) {
                assert_eq!(
                    app.apply(&paid(&no, "T-START", 1000)).await,
                    Outcome::Applied
                );
            }
            if *start == Refunded {
                assert_eq!(
                    app.apply(&refund_of(&no, "T-START", &format!("{no}-R0"), 1000))
                        .await,
                    Outcome::Applied
                );
            }
            if *start == Closed {
                app.store.close_order(&no, "api", now).await.expect("close");
            }
            assert_eq!(app.status_of(&no).await, start.as_str());

            match op {
                PayWechat => {
                    app.apply(&paid(&no, "T-START", 1000)).await;
                }
                PayAlipay => {
                    let mut n = paid(&no, "ALI-1", 1000);
                    n.channel = ChannelId::Alipay;
                    app.apply(&n).await;
                }
                RefundFull => {
                    app.apply(&refund_of(&no, "T-START", &format!("{no}-RF"), 1000))
                        .await;
                }
                RefundPartial => {
                    app.apply(&refund_of(&no, "T-START", &format!("{no}-RP"), 1))
                        .await;
                }
                CloseApi => {
                    app.store.close_order(&no, "api", now).await.expect("close");
                }
                CloseByProvider => {
                    let mut n = paid(&no, "T-START", 1000);
                    n.kind = NoticeKind::Closed;
                    app.apply(&n).await;
                }
            }
            let after = OrderStatus::parse(&app.status_of(&no).await).expect("known status");
            assert_eq!(after, expected[j], "{start:?} then {op:?}");
            // The only moves the state machine has (staying put is always allowed).
            let forward = [(WaitPay, Paid), (Paid, Refunded), (WaitPay, Closed)];
            assert!(
                *start == after || forward.contains(&(*start, after)),
                "{start:?} -> {after:?} after {op:?}"
            );
        }
    }
}

/// A group whose statement times out (the database too busy) answers every payment in it
/// "unavailable" (503, the provider retries) at once, without retrying each alone for as long
/// again; nothing is written, and the retry after the database is free applies each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_times_out_is_503_for_all_and_not_retried_alone() {
    let app = crate::support::helpers::spawn_app_with(Backend::Postgres, |s| {
        s.database.statement_timeout_ms = 300;
    })
    .await;
    let notices = orders_with_payments(&app, 20, "TO").await;
    // Every callback insert waits for this lock longer than a statement may run.
    let lock = app
        .db
        .hold_table_lock("pay_callback", std::time::Duration::from_millis(2000))
        .await;
    let outcomes = apply_at_once(&app, &notices, app.clock.now()).await;
    for (n, outcome) in notices.iter().zip(&outcomes) {
        match outcome {
            Err(e) => assert!(e.is_unavailable(), "{}: {e}", n.out_trade_no),
            Ok(o) => panic!("{}: {o:?} while the table is locked", n.out_trade_no),
        }
    }
    let counts = app.store.group_stats();
    assert_eq!(counts.payments, 20, "{counts:?}");
    assert_eq!(counts.failed, 0, "not retried one by one: {counts:?}");
    lock.await.expect("lock released");
    assert_eq!(app.db.count("pay_callback").await, 0);
    assert_eq!(app.db.count("local_message").await, 0);

    let again = apply_at_once(&app, &notices, app.clock.now()).await;
    assert!(
        again.iter().all(|o| matches!(o, Ok(Outcome::Applied))),
        "{again:?}"
    );
    assert_eq!(app.messages("ORDER_PAID").await, 20);
}
