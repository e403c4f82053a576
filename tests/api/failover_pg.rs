//! A real change of PostgreSQL writer: two private clusters (`initdb` + `pg_ctl` on free
//! ports, never the shared server), a multi-host URL, the first stopped with `-m immediate`.
//! The second has the order but not its payment, as an asynchronous standby promoted without
//! the last commits would: the service notices the new writer on its first connection to it
//! and pays the order again through the provider query.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use paynotify::config::{DatabaseSettings, Secret};
use paynotify::metrics::Metrics;
use paynotify::store::Store;

use crate::support::helpers::{Backend, eventually, free_port, spawn_app_with};

/// The newest PostgreSQL server binaries installed.
fn pg_bin() -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists())
        .collect();
    found.sort();
    found.pop()
}

/// Runs `program` as the `postgres` user when this is root (initdb refuses root).
fn as_postgres(program: &Path) -> Command {
    if nix_is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn nix_is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// A PostgreSQL cluster of this test's own, stopped (immediately) and removed on drop.
struct PrivatePg {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl PrivatePg {
    fn start(bin: &Path, name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "paynotify-failover-{}-{name}-{}",
            std::process::id(),
            paynotify::random::token(b"abcdefghijklmnopqrstuvwxyz", 8).expect("random")
        ));
        std::fs::create_dir_all(&dir).expect("dir");
        if nix_is_root() {
            let chown = Command::new("chown")
                .arg("postgres")
                .arg(&dir)
                .status()
                .expect("chown");
            assert!(chown.success());
        }
        let pg = Self {
            bin: bin.to_owned(),
            dir,
            port: free_port(),
        };
        let data = pg.dir.join("data");
        let init = as_postgres(&bin.join("initdb"))
            .args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
            ])
            .arg(&data)
            .output()
            .expect("initdb");
        assert!(init.status.success(), "initdb: {init:?}");
        let start = as_postgres(&bin.join("pg_ctl"))
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(pg.dir.join("log"))
            .args(["-w", "-t", "60", "-o"])
            .arg(format!(
                "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c fsync=off",
                pg.port,
                pg.dir.display()
            ))
            .arg("start")
            .output()
            .expect("pg_ctl start");
        assert!(start.status.success(), "pg_ctl start: {start:?}");
        pg.psql("postgres", "CREATE DATABASE paynotify");
        pg
    }

    fn psql(&self, db: &str, sql: &str) -> String {
        let out = Command::new("psql")
            .args([
                "-X",
                "-q",
                "-At",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-v",
                "ON_ERROR_STOP=1",
            ])
            .arg("-p")
            .arg(self.port.to_string())
            .args(["-d", db, "-c", sql])
            .output()
            .expect("psql");
        assert!(out.status.success(), "psql {sql}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/paynotify", self.port)
    }

    fn stop(&self) {
        let _ = as_postgres(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_the_new_postgres_writer_lacks_is_paid_again_after_the_failover() {
    let Some(bin) = pg_bin() else {
        panic!("no PostgreSQL server binaries under /usr/lib/postgresql");
    };
    let (old, new) = (PrivatePg::start(&bin, "old"), PrivatePg::start(&bin, "new"));
    // Two clusters: two system identifiers.
    let identifier = "SELECT system_identifier FROM pg_control_system()";
    assert_ne!(
        old.psql("postgres", identifier),
        new.psql("postgres", identifier)
    );
    let migrate_new = Store::connect(&DatabaseSettings {
        url: Secret::new(new.url()),
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
        let rows = old.psql("paynotify", &format!("COPY {table} TO STDOUT"));
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
        new.psql("paynotify", "SELECT status FROM orders"),
        "WAIT_PAY"
    );

    old.stop();
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
    assert_eq!(new.psql("paynotify", "SELECT status FROM orders"), "PAID");
    let writer = app.store.writer();
    assert_eq!(writer.failovers(), 1);
    assert_ne!(writer.identity().as_deref(), Some(first.as_str()));
    assert_eq!(
        Metrics::count(&app.metrics.failover_rechecks, &["recovered"]),
        1
    );
    assert_eq!(fake.state.calls().len(), 1, "through the provider query");
}
