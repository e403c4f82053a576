//! A write is answered only once it is committed. Every write path meets a database that
//! refuses the commit: on PostgreSQL a `DEFERRABLE INITIALLY DEFERRED` constraint trigger
//! that raises when the transaction (explicit or the implicit one of a single statement)
//! commits — after the statement has returned its rows; on MySQL and SQLite, which have no
//! deferred triggers, a trigger that raises as the row is written. The answer must then be an
//! error, never "applied", and nothing may be left behind; once the fault is gone the
//! provider's retry applies normally.

use paynotify::notice::{ChannelId, Notice, NoticeKind, Outcome, Refund, RefundAmount};
use paynotify::time::Clock;

use crate::support::helpers::{Backend, TestApp, TestDb, spawn_app, spawn_app_with};
use crate::support::test_channel::{TestNotification, deliver};

crate::on_every_backend!(
    a_payment_refused_at_commit_is_never_applied,
    a_payment_whose_group_is_refused_at_commit_is_never_applied,
    a_notification_refused_at_commit_is_not_answered_success,
    an_anomaly_refused_at_commit_is_never_recorded,
    a_refund_refused_at_commit_is_never_applied,
    a_provider_close_refused_at_commit_is_never_recorded,
    an_order_refused_at_commit_is_never_created,
);

/// Makes every insert into `table` fail when it commits (PostgreSQL) or when it is written.
async fn refuse_commits_on(db: &TestDb, table: &str) {
    let sql = match db {
        TestDb::Postgres { .. } => format!(
            "CREATE OR REPLACE FUNCTION refuse_{table}() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$; \
             CREATE CONSTRAINT TRIGGER refuse_{table} AFTER INSERT ON {table} \
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_{table}();"
        ),
        TestDb::Mysql { .. } => format!(
            "CREATE TRIGGER refuse_{table} AFTER INSERT ON {table} FOR EACH ROW \
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused at commit'"
        ),
        TestDb::Sqlite { .. } => format!(
            "CREATE TRIGGER refuse_{table} AFTER INSERT ON {table} \
             BEGIN SELECT RAISE(ABORT, 'refused at commit'); END;"
        ),
    };
    db.execute(&sql).await;
}

async fn allow_commits_on(db: &TestDb, table: &str) {
    let sql = match db {
        TestDb::Postgres { .. } => format!("DROP TRIGGER refuse_{table} ON {table}"),
        _ => format!("DROP TRIGGER refuse_{table}"),
    };
    db.execute(&sql).await;
}

/// The outcome of every receipt stored, newest first.
async fn receipt_outcomes(app: &TestApp) -> Vec<String> {
    let receipts = app
        .store
        .receipts(&paynotify::receipts::store::ReceiptFilter {
            limit: 10,
            ..Default::default()
        })
        .await
        .expect("receipts");
    receipts.into_iter().map(|r| r.outcome).collect()
}

fn paid(order_no: &str) -> Notice {
    TestNotification::paid(order_no, &format!("T-{order_no}"), 19900).to_notice()
}

async fn assert_untouched(app: &TestApp, order_no: &str) {
    assert_eq!(
        app.status_of(order_no).await,
        "WAIT_PAY",
        "{order_no} did not move"
    );
    assert_eq!(app.db.count("pay_callback").await, 0, "no callback row");
    assert_eq!(app.messages("ORDER_PAID").await, 0, "no ORDER_PAID");
}

/// The payment's own statement path: PostgreSQL's one-statement fast path (with group apply
/// off), MySQL's and SQLite's transaction.
async fn a_payment_refused_at_commit_is_never_applied(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.database.group_apply_max = 0).await;
    app.create_order("O-C1", 19900).await;
    refuse_commits_on(&app.db, "pay_callback").await;
    let result = app.store.apply(&paid("O-C1"), app.clock.now()).await;
    assert!(result.is_err(), "a refused commit is an error: {result:?}");
    assert_untouched(&app, "O-C1").await;

    allow_commits_on(&app.db, "pay_callback").await;
    let retried = app.store.apply(&paid("O-C1"), app.clock.now()).await;
    assert_eq!(retried.expect("the retry"), Outcome::Applied);
    assert_eq!(app.status_of("O-C1").await, "PAID");
    assert_eq!(app.messages("ORDER_PAID").await, 1);
}

/// Group apply on (the default): the group's statement or transaction is refused, and so is
/// each payment's one-by-one retry that follows.
async fn a_payment_whose_group_is_refused_at_commit_is_never_applied(backend: Backend) {
    let app = spawn_app(backend).await;
    let orders: Vec<String> = (0..8).map(|i| format!("O-G{i}")).collect();
    for order_no in &orders {
        app.create_order(order_no, 19900).await;
    }
    refuse_commits_on(&app.db, "pay_callback").await;
    let tasks: Vec<_> = orders
        .iter()
        .map(|order_no| {
            let (store, notice, now) = (app.store.clone(), paid(order_no), app.clock.now());
            tokio::spawn(async move { store.apply(&notice, now).await })
        })
        .collect();
    for (task, order_no) in tasks.into_iter().zip(&orders) {
        let result = task.await.expect("task");
        assert!(
            result.is_err(),
            "{order_no}: a refused commit is an error: {result:?}"
        );
        assert_eq!(app.status_of(order_no).await, "WAIT_PAY");
    }
    assert_untouched(&app, "O-G0").await;
}

/// Over HTTP: the provider is not told 2xx (it would stop retrying), and the receipt does not
/// say "applied".
async fn a_notification_refused_at_commit_is_not_answered_success(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_order("O-C3", 19900).await;
    refuse_commits_on(&app.db, "pay_callback").await;
    let notification = TestNotification::paid("O-C3", "T-O-C3", 19900);
    let (status, body) = deliver(&app, &notification).await;
    assert!(
        status.is_server_error(),
        "a refused commit is answered with a retryable error: {status} {body}"
    );
    assert_untouched(&app, "O-C3").await;
    assert_eq!(
        app.receipts_stored(1).await,
        1,
        "the refusal leaves a receipt"
    );
    assert_eq!(receipt_outcomes(&app).await, ["db_error"]);

    allow_commits_on(&app.db, "pay_callback").await;
    let (status, body) = deliver(&app, &notification).await;
    assert!(
        status.is_success(),
        "the provider's retry applies: {status} {body}"
    );
    assert_eq!(app.status_of("O-C3").await, "PAID");
}

/// The full transaction of a payment that does not move the order (here another merchant's):
/// its anomaly message is refused.
async fn an_anomaly_refused_at_commit_is_never_recorded(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.database.group_apply_max = 0).await;
    app.create_order("O-C4", 19900).await;
    refuse_commits_on(&app.db, "local_message").await;
    let mut foreign = paid("O-C4");
    foreign.merchant_matches = false;
    let result = app.store.apply(&foreign, app.clock.now()).await;
    assert!(result.is_err(), "a refused commit is an error: {result:?}");
    assert_untouched(&app, "O-C4").await;
    assert_eq!(app.db.count("local_message").await, 0, "no anomaly message");

    allow_commits_on(&app.db, "local_message").await;
    let retried = app.store.apply(&foreign, app.clock.now()).await;
    assert!(
        matches!(retried, Ok(Outcome::Anomaly(_))),
        "the retry records the anomaly: {retried:?}"
    );
}

async fn a_refund_refused_at_commit_is_never_applied(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_order("O-C5", 19900).await;
    assert_eq!(
        app.store
            .apply(&paid("O-C5"), app.clock.now())
            .await
            .expect("payment"),
        Outcome::Applied
    );
    refuse_commits_on(&app.db, "refund_callback").await;
    let mut refund = paid("O-C5");
    refund.kind = NoticeKind::Refunded(Refund {
        out_refund_no: "R-C5".into(),
        refund_id: "RID-C5".into(),
        amount: RefundAmount::This(19900),
    });
    let result = app.store.apply(&refund, app.clock.now()).await;
    assert!(result.is_err(), "a refused commit is an error: {result:?}");
    assert_eq!(app.refund_state("O-C5").await, ("PAID".into(), 0));
    assert_eq!(app.db.count("refund_callback").await, 0);
    assert_eq!(app.messages("ORDER_REFUNDED").await, 0);

    allow_commits_on(&app.db, "refund_callback").await;
    let retried = app.store.apply(&refund, app.clock.now()).await;
    assert_eq!(retried.expect("the retry"), Outcome::Applied);
    assert_eq!(app.refund_state("O-C5").await, ("REFUNDED".into(), 19900));
}

/// A status callback is one statement outside a transaction on every backend.
async fn a_provider_close_refused_at_commit_is_never_recorded(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_order("O-C6", 19900).await;
    refuse_commits_on(&app.db, "status_callback").await;
    let mut closed = paid("O-C6");
    closed.channel = ChannelId::Alipay;
    closed.kind = NoticeKind::Closed;
    let result = app.store.apply(&closed, app.clock.now()).await;
    assert!(result.is_err(), "a refused commit is an error: {result:?}");
    assert_eq!(app.db.count("status_callback").await, 0);

    allow_commits_on(&app.db, "status_callback").await;
    let retried = app.store.apply(&closed, app.clock.now()).await;
    assert_eq!(retried.expect("the retry"), Outcome::Ignored);
    assert_eq!(app.db.count("status_callback").await, 1);
}

async fn an_order_refused_at_commit_is_never_created(backend: Backend) {
    let app = spawn_app(backend).await;
    refuse_commits_on(&app.db, "orders").await;
    let create = || {
        app.client
            .post(app.url("/orders"))
            .bearer_auth(&app.api_token)
            .header("Idempotency-Key", "K-C7")
            .json(&serde_json::json!({
                "order_no": "O-C7", "amount_fen": 19900, "currency": "CNY", "subject": "test"
            }))
            .send()
    };
    let response = create().await.expect("POST /orders");
    assert!(
        response.status().is_server_error(),
        "a refused commit is not 201: {}",
        response.status()
    );
    assert_eq!(app.db.count("orders").await, 0);
    assert_eq!(app.db.count("idempotency_key").await, 0);

    allow_commits_on(&app.db, "orders").await;
    let response = create().await.expect("POST /orders");
    assert_eq!(
        response.status(),
        201,
        "the retry under the same key creates it"
    );
    assert_eq!(app.status_of("O-C7").await, "WAIT_PAY");
}

/// A payment handed to a group that does not answer within the caller's deadline may still
/// commit: the provider gets 503 (it retries) and the receipt says `undecided`, not that
/// nothing was stored. MySQL and SQLite: a lock wait (InnoDB's at least 1 s, SQLite's busy
/// timeout 5 s) outlasts the deadline (`acquire_timeout_ms + statement_timeout_ms`, 300 ms
/// here), and the group commits once the lock is gone. PostgreSQL's `statement_timeout` ends
/// a group's statement within the same deadline, so only a group's time in the queue or a
/// commit in flight can pass it there — not something a test can arrange reliably.
async fn a_group_past_its_deadline_is_answered_undecided(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.database.acquire_timeout_ms = 100;
        s.database.statement_timeout_ms = 200;
    })
    .await;
    app.create_order("O-D", 19900).await;
    let lock = app
        .db
        .hold_write_lock("O-D", std::time::Duration::from_millis(800))
        .await;
    let notification = TestNotification::paid("O-D", "T-O-D", 19900);
    let (status, body) = deliver(&app, &notification).await;
    assert_eq!(status, 503, "{body}");
    lock.await.expect("lock holder");

    assert_eq!(app.receipts_stored(1).await, 1, "the 503 leaves a receipt");
    assert_eq!(receipt_outcomes(&app).await, ["undecided"]);
    assert_eq!(
        crate::support::helpers::metric(
            &app,
            "paynotify_notifications_total",
            &["wechat", "undecided"]
        ),
        1
    );

    // The group committed after its caller stopped waiting; the retry is a duplicate.
    let paid = crate::support::helpers::eventually(std::time::Duration::from_secs(5), || async {
        app.status_of("O-D").await == "PAID"
    })
    .await;
    assert!(paid, "the group committed once the lock was gone");
    let (status, body) = deliver(&app, &notification).await;
    assert!(status.is_success(), "{status} {body}");
    assert_eq!(app.messages("ORDER_PAID").await, 1);
}

mod deadline {
    use crate::support::helpers::Backend;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mysql_a_group_past_its_deadline_is_answered_undecided() {
        super::a_group_past_its_deadline_is_answered_undecided(Backend::Mysql).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_a_group_past_its_deadline_is_answered_undecided() {
        super::a_group_past_its_deadline_is_answered_undecided(Backend::Sqlite).await
    }
}
