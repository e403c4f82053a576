//! A real change of PostgreSQL writer: two private clusters (`initdb` + `pg_ctl` on free
//! ports, never the shared server), a multi-host URL, the first stopped with `-m immediate`.
//! The second has the order but not its payment, as an asynchronous standby promoted without
//! the last commits would: the service notices the new writer on its first connection to it
//! and pays the order again through the provider query.

use std::process::Command;
use std::time::Duration;

use paynotify::config::{DatabaseSettings, Secret};
use paynotify::metrics::Metrics;
use paynotify::store::Store;

use crate::support::helpers::{Backend, eventually, spawn_app_with};
use crate::support::own_db::OwnPostgres;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_the_new_postgres_writer_lacks_is_paid_again_after_the_failover() {
    let (old, new) = (OwnPostgres::start(), OwnPostgres::start());
    for server in [&old, &new] {
        server.psql("postgres", "CREATE DATABASE paynotify");
    }
    // Two clusters: two system identifiers.
    let identifier = "SELECT system_identifier FROM pg_control_system()";
    assert_ne!(
        old.query("postgres", identifier),
        new.query("postgres", identifier)
    );
    let migrate_new = Store::connect(&DatabaseSettings {
        url: Secret::new(new.url("paynotify")),
        ..DatabaseSettings::default()
    })
    .expect("store");
    migrate_new.migrate().await.expect("migrated");
    drop(migrate_new);

    let fake = crate::reconcile::fake().await;
    let (fake_url, url) = (
        fake.url.clone(),
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/paynotify?target_session_attrs=read-write&connect_timeout=2",
            old.port, new.port
        ),
    );
    let app = spawn_app_with(Backend::Postgres, move |s| {
        crate::reconcile::configure(s, &fake_url);
        s.database.url = Secret::new(url);
    })
    .await;
    let first = app.store.writer().identity().expect("the writer is known");
    crate::reconcile::create(&app, "FO-PG", 19900, "wechat").await;
    // The standby got the order, and not the payment that follows.
    for table in ["orders", "order_account"] {
        let rows = old.query("paynotify", &format!("COPY {table} TO STDOUT"));
        let copy = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "psql -X -q -h 127.0.0.1 -p {} -U postgres -d paynotify -v ON_ERROR_STOP=1 -c 'COPY {table} FROM STDIN'",
                new.port
            ))
            .stdin(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                if let Some(stdin) = child.stdin.as_mut() {
                    stdin.write_all(rows.as_bytes())?;
                    stdin.write_all(b"\n")?;
                }
                drop(child.stdin.take());
                child.wait()
            })
            .expect("copy");
        assert!(copy.success(), "copy {table}");
    }
    crate::reconcile::paid_at(&fake, "FO-PG", 19900, "wechat");
    assert_eq!(
        crate::reconcile::notify_paid(&app, "wechat", "FO-PG", 19900).await,
        204
    );
    assert_eq!(
        new.query("paynotify", "SELECT status FROM orders"),
        "WAIT_PAY"
    );

    old.crash();
    // The service's next connections reach the new writer; it notices, and asks the provider
    // about the order it acknowledged.
    let store = app.store.clone();
    let paid = eventually(Duration::from_secs(30), || {
        let store = store.clone();
        async move {
            matches!(
                store.order("FO-PG").await,
                Ok(Some(order)) if order.status == paynotify::order::OrderStatus::Paid
            )
        }
    })
    .await;
    assert!(paid, "paid again on the new writer");
    assert_eq!(new.query("paynotify", "SELECT status FROM orders"), "PAID");
    let writer = app.store.writer();
    assert_eq!(writer.failovers(), 1);
    assert_ne!(writer.identity().as_deref(), Some(first.as_str()));
    assert_eq!(
        Metrics::count(&app.metrics.failover_rechecks, &["recovered"]),
        1
    );
    assert_eq!(fake.state.calls().len(), 1, "through the provider query");
}
