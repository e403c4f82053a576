//! A database that exists only for one test (`TestDb`), on each backend (`Backend`):
//! PostgreSQL databases are copies of a template migrated once per process, MariaDB and
//! SQLite ones start empty (the service migrates them); each is dropped when the test ends.

use std::sync::atomic::{AtomicU32, Ordering};

use chrono::Utc;
use diesel::QueryableByName;
use diesel::sql_types::BigInt;
use diesel_async::{
    AsyncConnection, AsyncMysqlConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection,
};
use paynotify::config::{Secret, Settings};
use paynotify::store::{SqliteAsync, Store};

/// Where the PostgreSQL tests create their databases; trust auth on this machine.
fn pg_admin_url() -> String {
    std::env::var("PAYNOTIFY_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// Where the MySQL/MariaDB tests create their databases: root without a password here.
fn mysql_admin_url() -> String {
    std::env::var("PAYNOTIFY_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/mysql".to_owned())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Mysql,
    Sqlite,
}

/// A database that exists only for one test.
pub enum TestDb {
    Postgres {
        url: String,
        name: String,
    },
    Mysql {
        url: String,
        name: String,
    },
    Sqlite {
        url: String,
        _dir: tempfile::TempDir,
    },
}

/// A connection to a MySQL test database (or, with `None`, the admin database).
async fn mysql_conn(url: &str) -> AsyncMysqlConnection {
    AsyncMysqlConnection::establish(url)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "MySQL/MariaDB is required for these tests and did not answer at {url}: {e}. \
             Start it (bash tests/run.sh does) or set PAYNOTIFY_TEST_MYSQL_URL."
            )
        })
}

/// The tests write times as RFC 3339 (`'2026-01-01T00:00:00.000000Z'`), which PostgreSQL and
/// SQLite take; MySQL's DATETIME wants `'2026-01-01 00:00:00.000000'`.
fn mysql_times(sql: &str) -> String {
    let bytes = sql.as_bytes();
    let mut out = String::with_capacity(sql.len());
    let mut i = 0;
    while i < bytes.len() {
        let looks_like_time = bytes[i] == b'\''
            && bytes.len() > i + 21
            && bytes[i + 5] == b'-'
            && bytes[i + 11] == b'T'
            && bytes[i + 14] == b':';
        if looks_like_time
            && let Some(len) = sql[i + 1..].find('\'')
            && let Some(stamp) = sql[i + 1..i + 1 + len].strip_suffix('Z')
        {
            out.push('\'');
            out.push_str(&stamp.replacen('T', " ", 1));
            out.push('\'');
            i += len + 2;
            continue;
        }
        out.push(char::from(bytes[i]));
        i += 1;
    }
    out
}

static COUNTER: AtomicU32 = AtomicU32::new(0);
const PG_PREFIX: &str = "paynotify_test_";

/// A database name no other test of any run uses; its time stamp lets a later run sweep it.
fn unique_name() -> String {
    format!(
        "{PG_PREFIX}{}_{}_{}",
        Utc::now().timestamp(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// The URL of database `name` on the server of `admin`.
fn database_url(admin: &str, name: &str) -> String {
    let base = admin.rsplit_once('/').map_or(admin, |(b, _)| b);
    format!("{base}/{name}")
}

impl TestDb {
    pub async fn create(backend: Backend) -> Self {
        match backend {
            Backend::Postgres => {
                let admin = pg_admin_url();
                let mut conn = AsyncPgConnection::establish(&admin).await.unwrap_or_else(|e| {
                    panic!(
                        "PostgreSQL is required for these tests and did not answer at {admin}: {e}. \
                         Start it (bash tests/run.sh does) or set PAYNOTIFY_TEST_PG_URL."
                    )
                });
                sweep_old_databases(&mut conn).await;
                let name = unique_name();
                // A copy of the migrated template: the migrations ran once for this process.
                let mut template = migrated_template(&admin, false).await;
                let mut attempts = 0;
                loop {
                    let created = conn
                        .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {template}"))
                        .await;
                    let Err(e) = created else { break };
                    attempts += 1;
                    assert!(attempts < 50, "create test database {name}: {e}");
                    if e.to_string().contains("does not exist") {
                        // Swept by a run on another schema: build it again.
                        template = migrated_template(&admin, true).await;
                    } else {
                        // The template is briefly in use (another test process building or
                        // sweeping): try again.
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                }
                TestDb::Postgres {
                    url: database_url(&admin, &name),
                    name,
                }
            }
            Backend::Mysql => {
                let admin = mysql_admin_url();
                let mut conn = mysql_conn(&admin).await;
                let name = unique_name();
                conn.batch_execute(&format!(
                    "CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
                ))
                .await
                .expect("create test database");
                TestDb::Mysql {
                    url: database_url(&admin, &name),
                    name,
                }
            }
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = format!("sqlite://{}", dir.path().join("paynotify.db").display());
                TestDb::Sqlite { url, _dir: dir }
            }
        }
    }

    /// A database without tables, for a test that runs the migrations itself: as
    /// [`TestDb::create`], but on PostgreSQL an empty database, not a copy of the migrated
    /// template (MySQL and SQLite databases start empty anyway).
    pub async fn create_unmigrated(backend: Backend) -> Self {
        if backend != Backend::Postgres {
            return Self::create(backend).await;
        }
        let admin = pg_admin_url();
        let mut conn = AsyncPgConnection::establish(&admin)
            .await
            .expect("PostgreSQL admin connection");
        let name = unique_name();
        conn.batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create test database");
        TestDb::Postgres {
            url: database_url(&admin, &name),
            name,
        }
    }

    pub fn url(&self) -> &str {
        match self {
            TestDb::Postgres { url, .. }
            | TestDb::Mysql { url, .. }
            | TestDb::Sqlite { url, .. } => url,
        }
    }

    /// Runs SQL that is the same on both backends, on a connection of its own.
    pub async fn execute(&self, sql: &str) {
        match self {
            TestDb::Postgres { url, .. } => {
                let mut c = AsyncPgConnection::establish(url).await.expect("connect");
                c.batch_execute(sql).await.expect("sql");
            }
            TestDb::Mysql { url, .. } => {
                let mut c = mysql_conn(url).await;
                c.batch_execute(&mysql_times(sql)).await.expect("sql");
            }
            TestDb::Sqlite { url, .. } => {
                let path = url.trim_start_matches("sqlite://");
                let mut c = SqliteAsync::establish(path).await.expect("connect");
                // The service's writers (the receipt writer among them) may hold the one
                // write lock for a moment: wait for it as they do.
                c.batch_execute("PRAGMA busy_timeout = 5000")
                    .await
                    .expect("busy timeout");
                c.batch_execute(sql).await.expect("sql");
            }
        }
    }

    /// Makes every outbox insert of `biz_key` fail (a trigger that raises), so a test can see
    /// what a failure after the order's compare-and-set undoes. Undone by
    /// [`TestDb::unpoison_outbox`].
    pub async fn poison_outbox(&self, biz_key: &str) {
        let name = poison_name(biz_key);
        let sql = match self {
            TestDb::Postgres { .. } => format!(
                "CREATE OR REPLACE FUNCTION poison_outbox() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN RAISE EXCEPTION 'poisoned outbox key %', NEW.biz_key; END $$; \
                 CREATE TRIGGER {name} BEFORE INSERT ON local_message FOR EACH ROW \
                 WHEN (NEW.biz_key = '{biz_key}') EXECUTE FUNCTION poison_outbox()"
            ),
            TestDb::Mysql { .. } => format!(
                "CREATE TRIGGER {name} BEFORE INSERT ON local_message FOR EACH ROW \
                 BEGIN IF NEW.biz_key = '{biz_key}' THEN \
                 SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'poisoned outbox key'; END IF; END"
            ),
            TestDb::Sqlite { .. } => format!(
                "CREATE TRIGGER {name} BEFORE INSERT ON local_message \
                 WHEN NEW.biz_key = '{biz_key}' BEGIN SELECT RAISE(ABORT, 'poisoned outbox key'); END"
            ),
        };
        self.execute(&sql).await;
    }

    /// Takes [`TestDb::poison_outbox`] back.
    pub async fn unpoison_outbox(&self, biz_key: &str) {
        let name = poison_name(biz_key);
        let sql = match self {
            TestDb::Postgres { .. } => format!("DROP TRIGGER {name} ON local_message"),
            _ => format!("DROP TRIGGER {name}"),
        };
        self.execute(&sql).await;
    }

    /// Holds a write lock for `hold` on a connection of its own: SQLite's one writer
    /// (`BEGIN IMMEDIATE`), or on PostgreSQL the row of `order_no` (`FOR UPDATE`). Resolves
    /// once the lock is taken; the returned task commits when the time is up.
    pub async fn hold_write_lock(
        &self,
        order_no: &str,
        hold: std::time::Duration,
    ) -> tokio::task::JoinHandle<()> {
        match self {
            TestDb::Postgres { url, .. } => {
                let c = AsyncPgConnection::establish(url).await.expect("connect");
                let lock = format!(
                    "BEGIN; SELECT order_no FROM orders WHERE order_no = '{order_no}' FOR UPDATE"
                );
                hold_lock(c, lock, "COMMIT", hold).await
            }
            TestDb::Mysql { url, .. } => {
                let c = mysql_conn(url).await;
                let lock = format!(
                    "START TRANSACTION; SELECT order_no FROM orders WHERE order_no = '{order_no}' FOR UPDATE"
                );
                hold_lock(c, lock, "COMMIT", hold).await
            }
            TestDb::Sqlite { url, .. } => {
                let path = url.trim_start_matches("sqlite://").to_owned();
                let c = SqliteAsync::establish(&path).await.expect("connect");
                hold_lock(c, "BEGIN IMMEDIATE".to_owned(), "COMMIT", hold).await
            }
        }
    }

    /// PostgreSQL and MySQL: holds a lock on `table` that blocks every write to it, for
    /// `hold` (see `hold_write_lock`).
    pub async fn hold_table_lock(
        &self,
        table: &str,
        hold: std::time::Duration,
    ) -> tokio::task::JoinHandle<()> {
        match self {
            TestDb::Postgres { url, .. } => {
                let c = AsyncPgConnection::establish(url).await.expect("connect");
                let lock = format!("BEGIN; LOCK TABLE {table} IN EXCLUSIVE MODE");
                hold_lock(c, lock, "COMMIT", hold).await
            }
            TestDb::Mysql { url, .. } => {
                let c = mysql_conn(url).await;
                let lock = format!("LOCK TABLES {table} WRITE");
                hold_lock(c, lock, "UNLOCK TABLES", hold).await
            }
            TestDb::Sqlite { .. } => panic!("hold_table_lock is for PostgreSQL and MySQL"),
        }
    }

    /// `SELECT COUNT(*) AS n FROM …` on the test database.
    pub async fn count(&self, from_where: &str) -> i64 {
        #[derive(QueryableByName)]
        struct Count {
            #[diesel(sql_type = BigInt)]
            n: i64,
        }
        let sql = format!("SELECT COUNT(*) AS n FROM {from_where}");
        let row: Count = match self {
            TestDb::Postgres { url, .. } => {
                let mut c = AsyncPgConnection::establish(url).await.expect("connect");
                diesel::sql_query(sql)
                    .get_result(&mut c)
                    .await
                    .expect("count")
            }
            TestDb::Mysql { url, .. } => {
                let mut c = mysql_conn(url).await;
                diesel::sql_query(mysql_times(&sql))
                    .get_result(&mut c)
                    .await
                    .expect("count")
            }
            TestDb::Sqlite { url, .. } => {
                let path = url.trim_start_matches("sqlite://");
                let mut c = SqliteAsync::establish(path).await.expect("connect");
                diesel::sql_query(sql)
                    .get_result(&mut c)
                    .await
                    .expect("count")
            }
        };
        row.n
    }

    /// Drops the database now, even with connections open (PostgreSQL and MySQL).
    pub async fn drop_now(&self) {
        if let TestDb::Mysql { name, .. } = self {
            let mut conn = mysql_conn(&mysql_admin_url()).await;
            conn.batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
                .await
                .expect("drop test database");
        }
        if let TestDb::Postgres { name, .. } = self {
            let mut conn = AsyncPgConnection::establish(&pg_admin_url())
                .await
                .expect("admin");
            conn.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await
                .expect("drop test database");
        }
    }
}

/// Drops a test's PostgreSQL database when the test ends, passed or failed (its connections
/// are closed first). Runs on a thread and runtime of its own: `Drop` cannot await, and the
/// test's runtime may be shutting down.
impl Drop for TestDb {
    fn drop(&mut self) {
        let (name, mysql) = match self {
            TestDb::Postgres { name, .. } => (name.clone(), false),
            TestDb::Mysql { name, .. } => (name.clone(), true),
            TestDb::Sqlite { .. } => return,
        };
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let drop = async {
                    if mysql {
                        let mut conn = AsyncMysqlConnection::establish(&mysql_admin_url())
                            .await
                            .map_err(|e| e.to_string())?;
                        return conn
                            .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
                            .await
                            .map_err(|e| e.to_string());
                    }
                    let mut conn = AsyncPgConnection::establish(&pg_admin_url())
                        .await
                        .map_err(|e| e.to_string())?;
                    conn.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .await
                        .map_err(|e| e.to_string())
                };
                tokio::time::timeout(std::time::Duration::from_secs(10), drop)
                    .await
                    .map_err(|_| "timed out".to_owned())?
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("test database was not dropped: {dropped:?} (a later run sweeps it)");
        }
    }
}

const TEMPLATE_PREFIX: &str = "paynotify_tmpl_";

/// The migrated template of this process, by name, once built.
static TEMPLATE: tokio::sync::Mutex<Option<String>> = tokio::sync::Mutex::const_new(None);

/// A short digest of every file under migrations/postgres: a changed schema gets a new
/// template, never a stale one.
fn migrations_digest() -> String {
    fn files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                files(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/postgres");
    let mut all = Vec::new();
    files(&root, &mut all);
    all.sort();
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for path in all {
        let relative = path.strip_prefix(&root).unwrap_or(&path);
        context.update(relative.to_string_lossy().as_bytes());
        context.update(&std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())));
    }
    paynotify::text::hex(&context.finish().as_ref()[..8])
}

/// The name of a database holding exactly the PostgreSQL migrations, which each test
/// database copies (`CREATE DATABASE … TEMPLATE …`). Built once per process (or again with
/// `rebuild`, when another run swept it), under an advisory lock so parallel test processes
/// never build it twice; published by a rename, so nobody copies a half-migrated one.
/// Templates of other schemas are swept.
async fn migrated_template(admin: &str, rebuild: bool) -> String {
    let mut slot = TEMPLATE.lock().await;
    if let (Some(name), false) = (slot.as_ref(), rebuild) {
        return name.clone();
    }
    let name = format!("{TEMPLATE_PREFIX}{}", migrations_digest());
    let mut conn = AsyncPgConnection::establish(admin)
        .await
        .expect("admin connection");
    conn.batch_execute("SET lock_timeout = '60s'")
        .await
        .expect("lock timeout");
    conn.batch_execute("SELECT pg_advisory_lock(73110011)")
        .await
        .expect("template lock");
    #[derive(QueryableByName)]
    struct Name {
        #[diesel(sql_type = diesel::sql_types::Text)]
        datname: String,
    }
    let existing: Vec<Name> = diesel::sql_query(format!(
        "SELECT datname FROM pg_database WHERE datname LIKE '{TEMPLATE_PREFIX}%'"
    ))
    .load(&mut conn)
    .await
    .expect("list templates");
    if !existing.iter().any(|n| n.datname == name) {
        let building = format!("{name}_b{}", std::process::id());
        // One statement per call: neither may run inside a transaction block.
        for statement in [
            format!("DROP DATABASE IF EXISTS {building} WITH (FORCE)"),
            format!("CREATE DATABASE {building}"),
        ] {
            conn.batch_execute(&statement)
                .await
                .expect("create template");
        }
        let mut settings = Settings::default();
        settings.database.url = Secret::new(database_url(admin, &building));
        let store = Store::connect(&settings.database).expect("template store");
        store.migrate().await.expect("migrate the template");
        drop(store);
        conn.batch_execute(&format!("ALTER DATABASE {building} RENAME TO {name}"))
            .await
            .expect("publish template");
    }
    for Name { datname } in existing {
        if datname != name {
            // Another schema's template (a run of another branch builds its own again if it
            // still needs it).
            let _ = conn
                .batch_execute(&format!("DROP DATABASE IF EXISTS {datname}"))
                .await;
        }
    }
    conn.batch_execute("SELECT pg_advisory_unlock(73110011)")
        .await
        .expect("template unlock");
    *slot = Some(name.clone());
    name
}

/// Databases left by runs that crashed more than an hour ago.
async fn sweep_old_databases(conn: &mut AsyncPgConnection) {
    #[derive(QueryableByName)]
    struct Name {
        #[diesel(sql_type = diesel::sql_types::Text)]
        datname: String,
    }
    let cutoff = Utc::now().timestamp() - 3600;
    let names: Vec<Name> = diesel::sql_query(format!(
        "SELECT datname FROM pg_database WHERE datname LIKE '{PG_PREFIX}%'"
    ))
    .load(conn)
    .await
    .unwrap_or_default();
    for Name { datname } in names {
        let stamp = datname
            .trim_start_matches(PG_PREFIX)
            .split('_')
            .next()
            .and_then(|s| s.parse::<i64>().ok());
        if stamp.is_some_and(|t| t < cutoff) {
            let _ = conn
                .batch_execute(&format!("DROP DATABASE IF EXISTS {datname} WITH (FORCE)"))
                .await;
        }
    }
}

/// Takes a lock with `lock` on `c` and holds it for `hold` on a task of its own, then gives
/// it back with `release`. Resolves once the lock is taken.
async fn hold_lock<C>(
    mut c: C,
    lock: String,
    release: &'static str,
    hold: std::time::Duration,
) -> tokio::task::JoinHandle<()>
where
    C: SimpleAsyncConnection + Send + 'static,
{
    let (taken_tx, taken) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        c.batch_execute(&lock).await.expect("lock");
        let _ = taken_tx.send(());
        tokio::time::sleep(hold).await;
        c.batch_execute(release).await.expect(release);
    });
    taken.await.expect("lock taken");
    task
}

/// A trigger name for an outbox key (letters, digits and `_` only).
fn poison_name(biz_key: &str) -> String {
    let key: String = biz_key
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("poison_{}", key.to_ascii_lowercase())
}
