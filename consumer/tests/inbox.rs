//! The inbox on PostgreSQL, MySQL/MariaDB and SQLite.

mod support;

use paynotify_consumer::inbox::{self, InboxConnection};
use paynotify_consumer::{Outcome, apply_once};
use support::{MysqlDb, PgDb, SqliteDb};

/// The first delivery runs the handler; the second returns its stored result unrun.
async fn second_delivery_returns_the_first_result(conn: &mut impl InboxConnection) {
    inbox::create_table(conn).await.expect("table");
    let first = apply_once(conn, "inventory", "ORDER_PAID:O1", async |_tx| {
        Ok::<_, diesel::result::Error>(41)
    })
    .await
    .expect("first");
    assert_eq!(first, Outcome::Applied(41));
    let second = apply_once(conn, "inventory", "ORDER_PAID:O1", async |_tx| {
        Ok::<_, diesel::result::Error>(-1)
    })
    .await
    .expect("second");
    assert_eq!(second, Outcome::Duplicate(41));
    assert!(
        inbox::seen(conn, "inventory", "ORDER_PAID:O1")
            .await
            .expect("seen")
    );
    assert!(
        !inbox::seen(conn, "billing", "ORDER_PAID:O1")
            .await
            .expect("seen")
    );
}

#[tokio::test]
async fn postgres_second_delivery_returns_the_first_result() {
    let db = PgDb::create();
    second_delivery_returns_the_first_result(&mut db.connect().await).await;
}

#[tokio::test]
async fn mysql_second_delivery_returns_the_first_result() {
    let db = MysqlDb::create();
    second_delivery_returns_the_first_result(&mut db.connect().await).await;
}

#[tokio::test]
async fn sqlite_second_delivery_returns_the_first_result() {
    let db = SqliteDb::create();
    second_delivery_returns_the_first_result(&mut db.connect().await).await;
}
