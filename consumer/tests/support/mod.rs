//! Databases of the test's own on the machine's PostgreSQL (127.0.0.1:5432, trust) and
//! MariaDB/MySQL (127.0.0.1:3306, root), and SQLite files in a temporary folder; each is
//! dropped when its guard is, passed or failed.
#![allow(dead_code)]

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use diesel::sqlite::SqliteConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{
    AsyncConnection, AsyncMysqlConnection, AsyncPgConnection, SimpleAsyncConnection,
};

pub type Sqlite = SyncConnectionWrapper<SqliteConnection>;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A name no other test (of this run or a parallel one) uses.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} must be installed: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn pg_server() -> String {
    std::env::var("PAYNOTIFY_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

pub fn mysql_server() -> String {
    std::env::var("PAYNOTIFY_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".to_owned())
}

/// A PostgreSQL database of the test's own.
pub struct PgDb {
    pub name: String,
    pub url: String,
}

impl PgDb {
    pub fn create() -> Self {
        let name = unique("pnc_test");
        let server = pg_server();
        run(
            "psql",
            &[&server, "-qc", &format!("CREATE DATABASE {name}")],
        );
        let base = server.rsplit_once('/').map(|(b, _)| b).unwrap_or(&server);
        Self {
            url: format!("{base}/{name}"),
            name,
        }
    }

    pub async fn connect(&self) -> AsyncPgConnection {
        AsyncPgConnection::establish(&self.url)
            .await
            .expect("connect to the test database")
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args([
                &pg_server(),
                "-qc",
                &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
            ])
            .output();
    }
}

/// A MariaDB/MySQL database of the test's own; connections use UTC and READ COMMITTED
/// like a careful application would (REPEATABLE READ works too: the inbox reads a
/// duplicate's result outside its transaction).
pub struct MysqlDb {
    pub name: String,
    pub url: String,
}

impl MysqlDb {
    pub fn create() -> Self {
        let name = unique("pnc_test");
        run(
            "mariadb",
            &[
                "-h",
                "127.0.0.1",
                "-u",
                "root",
                "-e",
                &format!("CREATE DATABASE {name}"),
            ],
        );
        Self {
            url: format!("{}/{name}", mysql_server()),
            name,
        }
    }

    pub async fn connect(&self) -> AsyncMysqlConnection {
        let mut conn = AsyncMysqlConnection::establish(&self.url)
            .await
            .expect("connect to the test database");
        conn.batch_execute("SET time_zone = '+00:00'")
            .await
            .expect("session settings");
        conn
    }
}

impl Drop for MysqlDb {
    fn drop(&mut self) {
        let _ = Command::new("mariadb")
            .args([
                "-h",
                "127.0.0.1",
                "-u",
                "root",
                "-e",
                &format!("DROP DATABASE IF EXISTS {}", self.name),
            ])
            .output();
    }
}

/// A SQLite file in a temporary folder of the test's own.
pub struct SqliteDb {
    pub dir: tempfile::TempDir,
    pub path: String,
}

impl SqliteDb {
    pub fn create() -> Self {
        let dir = tempfile::tempdir().expect("temporary folder");
        let path = dir
            .path()
            .join("consumer.db")
            .to_string_lossy()
            .into_owned();
        Self { dir, path }
    }

    /// With a busy timeout (a second writer waits for the first) and WAL.
    pub async fn connect(&self) -> Sqlite {
        let mut conn = Sqlite::establish(&self.path)
            .await
            .expect("open the test database");
        conn.batch_execute("PRAGMA busy_timeout = 10000; PRAGMA journal_mode = WAL;")
            .await
            .expect("pragmas");
        conn
    }
}
