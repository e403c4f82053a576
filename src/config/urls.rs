//! The URLs in the configuration, parsed and checked without connecting: `database.url`,
//! `redis.url`, `relay.amqp_url`.

use std::fmt;

use super::value::{ConfigError, invalid};

/// What `redis.url` names: one node, or the seed nodes of a Redis Cluster.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisNodes {
    /// `redis://[user:password@]host:port[/db]`.
    Single(String),
    /// `redis+cluster://[user:password@]host:port[,host:port…]`, or several nodes
    /// comma-separated (`redis://h1:7000,redis://h2:7001` or `redis://h1:7000,h2:7001`): one
    /// `redis://` URL per seed node. A node written without credentials takes the first
    /// node's.
    Cluster(Vec<String>),
}

impl RedisNodes {
    pub fn parse(url: &str) -> Result<Self, ConfigError> {
        let (cluster, rest) = if let Some(rest) = url.strip_prefix("redis+cluster://") {
            (true, rest)
        } else if let Some(rest) = url.strip_prefix("redis://") {
            (false, rest)
        } else {
            return Err(invalid(
                "redis.url",
                "must be empty or start with redis:// or redis+cluster://",
            ));
        };
        if !cluster && !rest.contains(',') {
            return Ok(Self::Single(url.to_owned()));
        }
        let parts: Vec<&str> = rest
            .split(',')
            .map(|p| p.trim().trim_start_matches("redis://"))
            .collect();
        if parts.iter().any(|p| p.is_empty() || p.contains("://")) {
            return Err(invalid(
                "redis.url",
                "a node list is host:port or redis://host:port entries separated by commas",
            ));
        }
        let credentials = parts
            .first()
            .and_then(|p| p.rsplit_once('@'))
            .map(|(userinfo, _)| userinfo);
        let nodes = parts
            .iter()
            .map(|p| match credentials {
                Some(userinfo) if !p.contains('@') => format!("redis://{userinfo}@{p}"),
                _ => format!("redis://{p}"),
            })
            .collect();
        Ok(Self::Cluster(nodes))
    }
}

impl fmt::Debug for RedisNodes {
    /// How many nodes; never a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Single(_) => f.write_str("Single(<redacted>)"),
            Self::Cluster(nodes) => write!(f, "Cluster({} nodes)", nodes.len()),
        }
    }
}

/// `relay.amqp_url` and `relay.amqp_exchange`, checked without connecting.
pub fn check_amqp(url: &str, exchange: &str) -> Result<(), ConfigError> {
    // The parser's message may quote the URL, password and all: not repeated here.
    let parsed: lapin::uri::AMQPUri = url.parse().map_err(|_: String| {
        invalid(
            "relay.amqp_url",
            "is not a valid URL (amqp://user:password@host:port/vhost)",
        )
    })?;
    if parsed.scheme != lapin::uri::AMQPScheme::AMQP {
        return Err(invalid(
            "relay.amqp_url",
            "must be an amqp:// URL (no TLS in this build)",
        ));
    }
    // An AMQP short string: at most 255 bytes.
    if exchange.is_empty() || exchange.len() > 255 {
        return Err(invalid(
            "relay.amqp_exchange",
            "must be between 1 and 255 bytes",
        ));
    }
    Ok(())
}

const SQLITE_MEMORY_REFUSED: &str = "an in-memory (or temporary) SQLite database is refused: every \
     pooled connection would open its own empty database, so orders written through one connection are \
     missing on the next; use sqlite://PATH (a file)";

/// Whether an SQLite filename opens a database private to one connection: `:memory:`, an
/// empty name (a temporary database), or a `file:` URI naming either or carrying
/// `mode=memory`.
fn is_sqlite_memory(path: &str) -> bool {
    if path.is_empty() || path.eq_ignore_ascii_case(":memory:") {
        return true;
    }
    let Some(uri) = path.strip_prefix("file:") else {
        return false;
    };
    let (name, query) = uri.split_once('?').unwrap_or((uri, ""));
    name.is_empty()
        || name.eq_ignore_ascii_case(":memory:")
        || query.split('&').any(|pair| {
            pair.split_once('=')
                .is_some_and(|(k, v)| k == "mode" && v.eq_ignore_ascii_case("memory"))
        })
}

/// The database named by `database.url`; the scheme picks the backend.
#[derive(Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    /// Checked, with a default `connect_timeout` added (`db_hosts::postgres`).
    Postgres(String),
    /// MySQL 8.0+ or MariaDB 10.6+ (InnoDB).
    Mysql(String),
    /// A file path (relative to the working directory); never an in-memory database.
    Sqlite(String),
}

impl DatabaseUrl {
    pub fn parse(url: &str) -> Result<Self, ConfigError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Self::Postgres(super::db_hosts::postgres(url)?));
        }
        if let Some(path) = url.strip_prefix("sqlite://") {
            if path.is_empty() {
                return Err(invalid("database.url", "sqlite:// needs a file path"));
            }
            if is_sqlite_memory(path) {
                return Err(invalid("database.url", SQLITE_MEMORY_REFUSED));
            }
            return Ok(Self::Sqlite(path.to_owned()));
        }
        if url.starts_with("sqlite:") {
            let message = if is_sqlite_memory(url.trim_start_matches("sqlite:")) {
                SQLITE_MEMORY_REFUSED
            } else {
                "an SQLite database is written sqlite://PATH"
            };
            return Err(invalid("database.url", message));
        }
        if url.starts_with("mysql://") {
            super::db_hosts::MysqlTargets::parse(url)?;
            return Ok(Self::Mysql(url.to_owned()));
        }
        Err(invalid(
            "database.url",
            "must start with postgres://, postgresql://, mysql:// or sqlite://",
        ))
    }

    pub fn backend(&self) -> &'static str {
        match self {
            Self::Postgres(_) => "postgres",
            Self::Mysql(_) => "mysql",
            Self::Sqlite(_) => "sqlite",
        }
    }
}

impl fmt::Debug for DatabaseUrl {
    /// Shows the backend and, for files, the path; never a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Postgres(_) => f.write_str("Postgres(<redacted>)"),
            Self::Mysql(_) => f.write_str("Mysql(<redacted>)"),
            Self::Sqlite(path) => write!(f, "Sqlite({path:?})"),
        }
    }
}
