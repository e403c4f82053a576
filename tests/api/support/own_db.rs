//! Database servers of a test's own, for tests that make a server read-only, stall it or stop
//! it (never the shared ones): a PostgreSQL cluster (`initdb` + `pg_ctl`) and a MariaDB
//! (`mariadb-install-db` + `mariadbd`), each on a free port under a temporary directory,
//! stopped when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::helpers::free_port;

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// `program args…`, as `user` when this process runs as root (the servers refuse root).
fn as_user(user: &str, program: &Path) -> Command {
    if running_as_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", user, "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn chown(user: &str, dir: &Path) {
    if running_as_root() {
        let ok = Command::new("chown")
            .args(["-R", user])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "chown {user} {}", dir.display());
    }
}

fn run(command: &mut Command, what: &str) {
    let out = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A PostgreSQL cluster of the test's own on 127.0.0.1:`port`, user `postgres`, trust.
pub struct OwnPostgres {
    pub port: u16,
    bin: PathBuf,
    data: PathBuf,
    dir: tempfile::TempDir,
}

impl OwnPostgres {
    pub fn start() -> Self {
        let bin = [
            "/usr/lib/postgresql/15/bin",
            "/usr/local/bin",
            "/usr/lib/postgresql/16/bin",
        ]
        .iter()
        .map(PathBuf::from)
        .find(|d| d.join("pg_ctl").exists() && d.join("initdb").exists())
        .expect("PostgreSQL server binaries (initdb, pg_ctl)");
        let dir = tempfile::tempdir().expect("temp dir");
        chown("postgres", dir.path());
        let data = dir.path().join("data");
        run(
            as_user("postgres", &bin.join("initdb"))
                .arg("-D")
                .arg(&data)
                .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"]),
            "initdb",
        );
        let port = free_port();
        let conf = format!(
            "port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             fsync = off\nmax_connections = 50\n",
            dir.path().display()
        );
        let conf_path = data.join("postgresql.conf");
        let mut all = std::fs::read_to_string(&conf_path).expect("postgresql.conf");
        all.push_str(&conf);
        std::fs::write(&conf_path, all).expect("write postgresql.conf");
        let server = Self {
            port,
            bin,
            data,
            dir,
        };
        server.ctl(&["start"]);
        server
    }

    fn ctl(&self, args: &[&str]) {
        run(
            as_user("postgres", &self.bin.join("pg_ctl"))
                .arg("-D")
                .arg(&self.data)
                .arg("-l")
                .arg(self.dir.path().join("log"))
                .args(["-w", "-t", "20"])
                .args(args),
            "pg_ctl",
        );
    }

    /// `postgres://postgres@127.0.0.1:port/db`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// `sql` through `psql`, for a caller that cannot wait (a settings closure).
    pub fn psql(&self, db: &str, sql: &str) {
        self.query(db, sql);
    }

    /// What `sql` returns, through `psql -At`: one row a line, fields separated by `|`.
    pub fn query(&self, db: &str, sql: &str) -> String {
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
            .args(["-p", &self.port.to_string(), "-d", db, "-c", sql])
            .output()
            .unwrap_or_else(|e| panic!("psql {sql}: {e}"));
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    pub async fn execute(&self, db: &str, sql: &str) {
        use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
        let mut conn = AsyncPgConnection::establish(&self.url(db))
            .await
            .expect("own PostgreSQL answers");
        conn.batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// A setting changed for the whole server (`ALTER SYSTEM` and a reload), in effect
    /// for every session once this returns.
    pub async fn set_system(&self, name: &str, value: &str) {
        use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
        // ALTER SYSTEM runs outside a transaction: a statement of its own.
        self.execute("postgres", &format!("ALTER SYSTEM SET {name} = '{value}'"))
            .await;
        self.execute("postgres", "SELECT pg_reload_conf()").await;
        #[derive(diesel::QueryableByName)]
        struct Shown {
            #[diesel(sql_type = diesel::sql_types::Text)]
            value: String,
        }
        let applied = crate::support::helpers::eventually(Duration::from_secs(5), || async {
            let Ok(mut conn) = AsyncPgConnection::establish(&self.url("postgres")).await else {
                return false;
            };
            diesel::sql_query(format!("SELECT current_setting('{name}') AS value"))
                .get_result::<Shown>(&mut conn)
                .await
                .is_ok_and(|s| s.value == value)
        })
        .await;
        assert!(applied, "{name} = {value} not applied");
    }

    /// `SELECT COUNT(*) FROM {from_where}` in database `db`.
    pub async fn count(&self, db: &str, from_where: &str) -> i64 {
        use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
        #[derive(diesel::QueryableByName)]
        struct Count {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        let mut conn = AsyncPgConnection::establish(&self.url(db))
            .await
            .expect("own PostgreSQL answers");
        diesel::sql_query(format!("SELECT COUNT(*) AS n FROM {from_where}"))
            .get_result::<Count>(&mut conn)
            .await
            .expect("count")
            .n
    }

    /// Stops the server (fast shutdown: sessions are ended).
    pub fn stop(&self) {
        self.ctl(&["-m", "fast", "stop"]);
    }

    /// Stops the server as a crash would (immediate shutdown: no checkpoint, sessions cut).
    pub fn crash(&self) {
        self.ctl(&["-m", "immediate", "stop"]);
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = as_user("postgres", &self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "-t", "10", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A MariaDB of the test's own on 127.0.0.1:`port`; `root@127.0.0.1` without a password.
pub struct OwnMariadb {
    pub port: u16,
    child: Child,
    dir: tempfile::TempDir,
}

impl OwnMariadb {
    /// `extra`: more `mariadbd` options (e.g. semi-sync).
    pub async fn start(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        chown("mysql", dir.path());
        let data = dir.path().join("data");
        let user: &[&str] = if running_as_root() {
            &["--user=mysql"]
        } else {
            &[]
        };
        run(
            Command::new("mariadb-install-db")
                .arg("--no-defaults")
                .args(user)
                .arg(format!("--datadir={}", data.display()))
                .args(["--skip-test-db", "--auth-root-authentication-method=normal"]),
            "mariadb-install-db",
        );
        let port = free_port();
        let child = Command::new("mariadbd")
            .arg("--no-defaults")
            .args(user)
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--port={port}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", dir.path().join("sock").display()))
            .arg(format!("--pid-file={}", dir.path().join("pid").display()))
            .arg(format!("--log-error={}", dir.path().join("log").display()))
            .args(["--innodb-buffer-pool-size=16M", "--max-connections=100"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mariadbd must be installed");
        let server = Self { port, child, dir };
        let started = Instant::now();
        loop {
            let ok = Command::new("mariadb")
                .arg("--no-defaults")
                .arg(format!(
                    "--socket={}",
                    server.dir.path().join("sock").display()
                ))
                .args([
                    "-uroot",
                    "-e",
                    "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'; \
                        GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "own mariadbd did not start: {}",
                std::fs::read_to_string(server.dir.path().join("log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        server
    }

    /// `sql` as root over the socket.
    pub fn sql(&self, sql: &str) {
        run(
            Command::new("mariadb")
                .arg("--no-defaults")
                .arg(format!(
                    "--socket={}",
                    self.dir.path().join("sock").display()
                ))
                .args(["-uroot", "-e", sql]),
            sql,
        );
    }

    /// `SELECT COUNT(*) FROM {from_where}` in database `db`.
    pub fn count(&self, db: &str, from_where: &str) -> i64 {
        let out = Command::new("mariadb")
            .arg("--no-defaults")
            .arg(format!(
                "--socket={}",
                self.dir.path().join("sock").display()
            ))
            .args(["-uroot", "-N", "-B", db, "-e"])
            .arg(format!("SELECT COUNT(*) FROM {from_where}"))
            .output()
            .expect("mariadb client");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("count: {}", String::from_utf8_lossy(&out.stderr)))
    }

    /// `mysql://user@127.0.0.1:port/db`.
    pub fn url(&self, user: &str, db: &str) -> String {
        format!("mysql://{user}@127.0.0.1:{}/{db}", self.port)
    }
}

impl Drop for OwnMariadb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
