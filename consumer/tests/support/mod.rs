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

/// A MariaDB/MySQL database of the test's own on `PAYNOTIFY_TEST_MYSQL_URL` (default
/// `mysql://root@127.0.0.1:3306`); connections use UTC and the server's isolation level
/// (InnoDB's REPEATABLE READ unless the server says otherwise).
pub struct MysqlDb {
    pub name: String,
    pub url: String,
}

/// Runs one statement on the MySQL server itself (no database selected), on a runtime of
/// its own in a thread of its own, so it works from sync code, async tests and `Drop`.
fn mysql_server_statement(sql: String) -> Result<(), String> {
    let server = mysql_server();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(async move {
            let mut conn = AsyncMysqlConnection::establish(&server)
                .await
                .map_err(|e| format!("{server}: {e}"))?;
            conn.batch_execute(&sql).await.map_err(|e| e.to_string())
        })
    })
    .join()
    .map_err(|_| "the statement's thread panicked".to_owned())?
}

impl MysqlDb {
    pub fn create() -> Self {
        let name = unique("pnc_test");
        mysql_server_statement(format!("CREATE DATABASE {name}"))
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
        Self {
            url: format!("{}/{name}", mysql_server().trim_end_matches('/')),
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
        let _ = mysql_server_statement(format!("DROP DATABASE IF EXISTS {}", self.name));
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

/// The example binary, `target/<profile>/examples/inventory`. `cargo test --test NAME`
/// builds only that test, so the example is brought up to date here (a no-op when
/// `cargo test` built it already), with the same target folder and profile.
pub fn inventory_example() -> std::path::PathBuf {
    static BUILT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("test binary");
            let profile_dir = exe
                .parent()
                .and_then(|deps| deps.parent())
                .expect("target/<profile>/deps");
            let target_dir = profile_dir.parent().expect("target/");
            let mut build = Command::new(env!("CARGO"));
            build
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .args([
                    "build",
                    "--quiet",
                    "-p",
                    "paynotify-consumer",
                    "--example",
                    "inventory",
                ])
                .arg("--target-dir")
                .arg(target_dir);
            match profile_dir.file_name().and_then(|p| p.to_str()) {
                Some("debug") | None => {}
                Some("release") => {
                    build.arg("--release");
                }
                Some(profile) => {
                    build.args(["--profile", profile]);
                }
            }
            let mut child = build.spawn().expect("cargo build --example inventory");
            let start = std::time::Instant::now();
            let status = loop {
                if let Some(status) = child.try_wait().expect("cargo build") {
                    break status;
                }
                if start.elapsed() > std::time::Duration::from_secs(900) {
                    let _ = child.kill();
                    panic!("cargo build --example inventory took longer than 15 minutes");
                }
                std::thread::sleep(std::time::Duration::from_millis(200));
            };
            assert!(
                status.success(),
                "cargo build --example inventory: {status}"
            );
            let path = profile_dir.join("examples").join("inventory");
            assert!(path.exists(), "{}", path.display());
            path
        })
        .clone()
}
