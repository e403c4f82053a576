//! A throw-away PostgreSQL database for one benchmark run.

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};

pub struct BenchDatabase {
    admin: AsyncPgConnection,
    name: String,
    pub url: String,
}

impl BenchDatabase {
    /// Creates `{prefix}_{pid}` on the server at $PAYNOTIFY_BENCH_PG_URL (default
    /// postgres://postgres@127.0.0.1:5432/postgres).
    pub async fn create(prefix: &str) -> Self {
        let admin_url = std::env::var("PAYNOTIFY_BENCH_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let name = format!("{prefix}_{}", std::process::id());
        let base = admin_url
            .rsplit_once('/')
            .map_or(admin_url.as_str(), |(b, _)| b)
            .to_owned();
        let mut admin = AsyncPgConnection::establish(&admin_url)
            .await
            .expect("PostgreSQL");
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
            .await
            .expect("drop old");
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create database");
        Self {
            url: format!("{base}/{name}"),
            admin,
            name,
        }
    }

    /// A connection of its own to the bench database (not every bench needs one).
    #[allow(dead_code)]
    pub async fn connect(&self) -> AsyncPgConnection {
        AsyncPgConnection::establish(&self.url)
            .await
            .expect("bench database")
    }

    pub async fn drop(mut self) {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let _ = self.admin.batch_execute(&sql).await;
    }
}
