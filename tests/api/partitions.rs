//! Day partitions of the outbox and the receipts (PostgreSQL, MySQL/MariaDB) on a controlled
//! clock: created ahead, filled, dropped whole past their window, and never an insert
//! without a partition to take it.

use std::sync::Arc;

use chrono::{Days, NaiveDate};
use paynotify::jobs::purge;
use paynotify::relay::Relay;

use paynotify::relay::sinks::LogSink;

use crate::support::helpers::{Backend, TestApp, spawn_app};
use crate::support::test_channel::TestNotification;

mod postgres {
    use crate::support::helpers::Backend;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn days_are_created_ahead_and_dropped_whole_past_the_window() {
        super::days_are_created_ahead_and_dropped_whole_past_the_window(Backend::Postgres).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_row_ahead_of_every_day_waits_in_future_and_moves_to_its_day() {
        super::a_row_ahead_of_every_day_waits_in_future_and_moves_to_its_day(Backend::Postgres)
            .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_instance_at_a_time_keeps_the_partitions() {
        super::one_instance_at_a_time_keeps_the_partitions(Backend::Postgres).await
    }
}

mod mysql {
    use crate::support::helpers::Backend;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn days_are_created_ahead_and_dropped_whole_past_the_window() {
        super::days_are_created_ahead_and_dropped_whole_past_the_window(Backend::Mysql).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_row_ahead_of_every_day_waits_in_future_and_moves_to_its_day() {
        super::a_row_ahead_of_every_day_waits_in_future_and_moves_to_its_day(Backend::Mysql).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_instance_at_a_time_keeps_the_partitions() {
        super::one_instance_at_a_time_keeps_the_partitions(Backend::Mysql).await
    }
}

/// The day the test clock starts on (2026-11-30 08:00 UTC).
fn start() -> NaiveDate {
    NaiveDate::from_ymd_opt(2026, 11, 30).expect("date")
}

fn plus(day: NaiveDate, days: u64) -> NaiveDate {
    day.checked_add_days(Days::new(days)).expect("date")
}

/// Whether `table` has the partition `name`, from the catalog.
async fn has_partition(app: &TestApp, backend: Backend, table: &str, name: &str) -> bool {
    let sql = match backend {
        Backend::Mysql => format!(
            "information_schema.PARTITIONS WHERE TABLE_SCHEMA = DATABASE() \
             AND TABLE_NAME = '{table}' AND PARTITION_NAME = '{name}'"
        ),
        _ => format!(
            "pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             WHERE i.inhparent = '{table}'::regclass AND c.relname = '{name}'"
        ),
    };
    app.db.count(&sql).await == 1
}

async fn partitions_of(app: &TestApp, backend: Backend, table: &str) -> i64 {
    let sql = match backend {
        Backend::Mysql => format!(
            "information_schema.PARTITIONS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{table}'"
        ),
        _ => format!("pg_inherits WHERE inhparent = '{table}'::regclass"),
    };
    app.db.count(&sql).await
}

fn day_name(table: &str, day: NaiveDate) -> String {
    format!("{table}_{}", day.format("%Y%m%d"))
}

fn relay(app: &TestApp) -> Relay {
    Relay::new(
        app.store.clone(),
        Arc::new(LogSink),
        app.clock.clone(),
        app.metrics.clone(),
        100,
        5,
    )
}

/// Twelve days of one paid order a day, each message sent, the retention job run each day
/// with a 7-day window: every run finds today and three days ahead ready, the outbox holds
/// exactly the last seven days' messages, and it got there by dropping partitions, not by
/// deleting rows.
async fn days_are_created_ahead_and_dropped_whole_past_the_window(backend: Backend) {
    let app = spawn_app(backend).await;
    for day in 0..=3 {
        let name = day_name("local_message", plus(start(), day));
        assert!(
            has_partition(&app, backend, "local_message", &name).await,
            "{name} made at start-up"
        );
    }
    let relay = relay(&app);
    for n in 1..=12u64 {
        let order = format!("PT-{n}");
        app.create_and_apply(&TestNotification::paid(&order, &format!("T-{n}"), 100).to_notice())
            .await;
        assert_eq!(relay.tick().await.expect("tick").published, 1);
        app.clock.advance(86_400);
        let done = purge(&app.store, app.clock.as_ref(), 7, 7)
            .await
            .expect("purge");
        assert_eq!(done.rows, 0, "day {n}: no row deleted one by one: {done:?}");
        let today = plus(start(), n);
        for ahead in 0..=3 {
            let name = day_name("local_message", plus(today, ahead));
            assert!(
                has_partition(&app, backend, "local_message", &name).await,
                "day {n}: {name} ready"
            );
        }
        // The cutoff is today 08:00 minus 7 days: the day before it ended at its midnight.
        let gone = day_name(
            "local_message",
            plus(today, 0).checked_sub_days(Days::new(8)).expect("date"),
        );
        assert!(
            !has_partition(&app, backend, "local_message", &gone).await,
            "day {n}: {gone} dropped"
        );
        assert_eq!(
            app.db.count("local_message").await,
            n.min(7) as i64,
            "day {n}: the last seven days' messages: {done:?}"
        );
        // The receipts' partitions are kept the same way.
        assert!(
            has_partition(
                &app,
                backend,
                "notify_receipt",
                &day_name("notify_receipt", plus(today, 3))
            )
            .await,
            "day {n}: receipts ready ahead"
        );
    }
    // Eight days of window and today, three ahead, the future partition: nothing piles up.
    assert!(
        partitions_of(&app, backend, "local_message").await <= 13,
        "{} partitions",
        partitions_of(&app, backend, "local_message").await
    );
    // Every paid order is still a duplicate to its provider, its callback row kept.
    for n in 1..=12u64 {
        let order = format!("PT-{n}");
        let repeat = TestNotification::paid(&order, &format!("T-{n}"), 100).to_notice();
        assert_eq!(
            app.apply(&repeat).await,
            paynotify::notice::Outcome::Duplicate,
            "{order}"
        );
    }
}

/// A clock thirty days ahead of the job (it has not run since): the payment's message lands
/// in the future partition, is delivered from there, and the next run moves it into its day.
async fn a_row_ahead_of_every_day_waits_in_future_and_moves_to_its_day(backend: Backend) {
    let app = spawn_app(backend).await;
    app.clock.advance(30 * 86_400);
    app.create_and_apply(&TestNotification::paid("PF-1", "T-F1", 100).to_notice())
        .await;
    let future = match backend {
        Backend::Mysql => "local_message PARTITION (local_message_future)".to_string(),
        _ => "local_message_future".to_string(),
    };
    assert_eq!(app.db.count(&future).await, 1);
    let done = purge(&app.store, app.clock.as_ref(), 7, 7)
        .await
        .expect("purge");
    let day = day_name("local_message", plus(start(), 30));
    assert!(done.outbox.created.contains(&day), "{done:?}");
    assert_eq!(app.db.count(&future).await, 0, "moved out of the future");
    let in_day = match backend {
        Backend::Mysql => format!("local_message PARTITION ({day}) WHERE status = 0"),
        _ => format!("{day} WHERE status = 0"),
    };
    assert_eq!(app.db.count(&in_day).await, 1, "pending, in its day");
    assert_eq!(relay(&app).tick().await.expect("tick").published, 1);
    assert_eq!(app.db.count("local_message WHERE status = 1").await, 1);
}

/// Another instance keeping the partitions (its lock held by a session of its own): this one's
/// run does nothing to them; once that one is done, the next run does the work.
async fn one_instance_at_a_time_keeps_the_partitions(backend: Backend) {
    use diesel_async::{AsyncConnection, SimpleAsyncConnection};
    let app = spawn_app(backend).await;
    app.clock.advance(10 * 86_400);
    let url = app.db.url().to_owned();
    let (take, give) = match backend {
        Backend::Mysql => (
            "DO GET_LOCK(CONCAT('paynotify.partitions.', DATABASE()), 10)",
            "DO RELEASE_LOCK(CONCAT('paynotify.partitions.', DATABASE()))",
        ),
        _ => (
            "SELECT pg_advisory_lock(hashtext('paynotify.partitions'))",
            "SELECT pg_advisory_unlock(hashtext('paynotify.partitions'))",
        ),
    };
    let run = async || {
        purge(&app.store, app.clock.as_ref(), 7, 7)
            .await
            .expect("purge")
    };
    let day = day_name("local_message", plus(start(), 10));
    match backend {
        Backend::Mysql => {
            let mut other = diesel_async::AsyncMysqlConnection::establish(&url)
                .await
                .expect("connect");
            other.batch_execute(take).await.expect("lock");
            let done = run().await;
            assert_eq!(done.outbox, Default::default(), "{done:?}");
            other.batch_execute(give).await.expect("unlock");
        }
        _ => {
            let mut other = diesel_async::AsyncPgConnection::establish(&url)
                .await
                .expect("connect");
            other.batch_execute(take).await.expect("lock");
            let done = run().await;
            assert_eq!(done.outbox, Default::default(), "{done:?}");
            other.batch_execute(give).await.expect("unlock");
        }
    }
    assert!(!has_partition(&app, backend, "local_message", &day).await);
    let done = run().await;
    assert!(done.outbox.created.contains(&day), "{done:?}");
    assert!(has_partition(&app, backend, "local_message", &day).await);
}
