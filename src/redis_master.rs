//! A connection to a Redis master, for the gate and the stream sink: one node named by its
//! URL, or whichever node Redis Sentinel names master.
//!
//! The connection is made on first use, in a task of its own (a caller's tight timeout
//! stops its wait, never the connect, which the next caller then finds made), and only to a
//! node that answers `ROLE` as a master: a URL that names a sentinel or a replica is reported
//! once and treated as Redis being down, never as "up". Through sentinels, a connection that
//! failed (an I/O error, a timeout, `READONLY` from a demoted master) is dropped, and the
//! next call asks the sentinels again; a node named by URL keeps its connection, which
//! reconnects by itself, except after `READONLY`, when it is checked again.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    ConnectionAddr, ErrorKind, IntoConnectionInfo, RedisConnectionInfo, RedisError, Role,
    ServerErrorKind,
};
use tokio::sync::watch;

use crate::config::{ConfigError, Sentinels, invalid};

/// The longest a connect may take, sentinel lookup included, whoever waits for it.
const CONNECT_LIMIT: Duration = Duration::from_secs(5);
/// While calls come, how often the sentinels are asked whether they still name the master
/// connected to: an old master that still answers (a planned failover, a partition) takes
/// writes until the sentinels demote it, and loses them then.
const RECHECK_EVERY: Duration = Duration::from_secs(1);

enum Source {
    Node(redis::Client),
    Sentinels {
        client: tokio::sync::Mutex<SentinelClient>,
        master: String,
    },
}

/// A connection and its number: a failure reported on an older one drops nothing.
#[derive(Clone)]
pub struct Held {
    pub connection: ConnectionManager,
    pub generation: u64,
}

type Connecting = watch::Receiver<Option<Result<Held, RedisError>>>;

pub struct Master {
    source: Source,
    /// The key that names this Redis in the configuration, for log lines.
    key: &'static str,
    connect_timeout: Duration,
    response_timeout: Duration,
    current: Mutex<Option<Held>>,
    /// The connect under way, if any.
    connecting: Mutex<Option<Connecting>>,
    generation: AtomicU64,
    /// The node answered as a sentinel or a replica, and that was logged.
    wrong_role: AtomicBool,
    /// The address of the master last connected to through sentinels (`host:port`).
    last_master: Mutex<String>,
    /// When the sentinels were last asked (connect or recheck), and whether a recheck runs.
    checked_at: Mutex<Instant>,
    rechecking: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `READONLY`: a replica (a demoted master) answered a write.
pub fn read_only(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
}

/// The connection is gone or stalled, or the node is no master: ask again.
fn lost(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_unrecoverable_error()
        || read_only(e)
        || matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::MasterDown | ServerErrorKind::BusyLoading)
        )
        || not_a_master(e)
}

/// How the error for a node that is not a master begins its detail.
const NOT_A_MASTER: &str = "NOTMASTER";

fn not_a_master(e: &RedisError) -> bool {
    e.detail().is_some_and(|d| d.starts_with(NOT_A_MASTER))
}

impl Master {
    /// One node, `url` (the value of `key`); nothing connects yet.
    pub fn node(
        url: &str,
        key: &'static str,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Self, ConfigError> {
        let client = redis::Client::open(url).map_err(|e| invalid(key, e.to_string()))?;
        Ok(Self::with(
            Source::Node(client),
            key,
            connect_timeout,
            response_timeout,
        ))
    }

    /// The master `sentinels` name; nothing connects yet.
    pub fn sentinels(
        sentinels: &Sentinels,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Self, ConfigError> {
        let key = "redis.sentinels";
        let mut auth = RedisConnectionInfo::default();
        if !sentinels.password.is_empty() {
            auth = auth.set_password(sentinels.password.expose());
        }
        let nodes = sentinels
            .addresses
            .iter()
            .map(|(host, port)| {
                ConnectionAddr::Tcp(host.clone(), *port)
                    .into_connection_info()
                    .map(|info| info.set_redis_settings(auth.clone()))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(key, e.to_string()))?;
        let client = SentinelClient::build(
            nodes,
            sentinels.master.clone(),
            Some(SentinelNodeConnectionInfo::default()),
            SentinelServerType::Master,
        )
        .map_err(|e| invalid(key, e.to_string()))?;
        Ok(Self::with(
            Source::Sentinels {
                client: tokio::sync::Mutex::new(client),
                master: sentinels.master.clone(),
            },
            key,
            connect_timeout,
            response_timeout,
        ))
    }

    fn with(
        source: Source,
        key: &'static str,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Self {
        Self {
            source,
            key,
            connect_timeout,
            response_timeout,
            current: Mutex::new(None),
            connecting: Mutex::new(None),
            generation: AtomicU64::new(0),
            wrong_role: AtomicBool::new(false),
            last_master: Mutex::new(String::new()),
            checked_at: Mutex::new(Instant::now()),
            rechecking: AtomicBool::new(false),
        }
    }

    /// Whether the master is found through sentinels.
    pub fn through_sentinels(&self) -> bool {
        matches!(self.source, Source::Sentinels { .. })
    }

    /// The connection, made now if there is none (one connect at a time, in a task of its
    /// own; callers bound their wait themselves).
    pub async fn connection(self: &Arc<Self>) -> Result<Held, RedisError> {
        if let Some(held) = lock(&self.current).clone() {
            self.recheck_if_due(held.generation);
            return Ok(held);
        }
        let mut waiting = {
            let mut connecting = lock(&self.connecting);
            match &*connecting {
                Some(under_way) => under_way.clone(),
                None => {
                    let (done, waiting) = watch::channel(None);
                    *connecting = Some(waiting.clone());
                    let master = Arc::clone(self);
                    tokio::spawn(async move {
                        let made = tokio::time::timeout(CONNECT_LIMIT, master.connect())
                            .await
                            .unwrap_or_else(|_| {
                                Err(RedisError::from((
                                    ErrorKind::Io,
                                    "no connection to the Redis master in time",
                                )))
                            });
                        if let Ok(held) = &made {
                            *lock(&master.current) = Some(held.clone());
                        }
                        *lock(&master.connecting) = None;
                        let _ = done.send(Some(made));
                    });
                    waiting
                }
            }
        };
        let made = waiting
            .wait_for(Option::is_some)
            .await
            .map_err(|_| RedisError::from((ErrorKind::Io, "the connect was abandoned")))?;
        match &*made {
            Some(result) => result.clone(),
            None => Err(RedisError::from((
                ErrorKind::Io,
                "the connect was abandoned",
            ))),
        }
    }

    /// Through sentinels, at most every [`RECHECK_EVERY`]: asks them (in a task of its own)
    /// which node is master, and drops connection `generation` if it is another.
    fn recheck_if_due(self: &Arc<Self>, generation: u64) {
        let Source::Sentinels { master, .. } = &self.source else {
            return;
        };
        {
            let mut checked_at = lock(&self.checked_at);
            if checked_at.elapsed() < RECHECK_EVERY || self.rechecking.swap(true, Ordering::AcqRel)
            {
                return;
            }
            *checked_at = Instant::now();
        }
        let (this, name) = (Arc::clone(self), master.clone());
        tokio::spawn(async move {
            let Source::Sentinels { client, .. } = &this.source else {
                return;
            };
            let named = tokio::time::timeout(CONNECT_LIMIT, async {
                client.lock().await.async_get_client().await
            })
            .await;
            if let Ok(Ok(named)) = named {
                let address = named.get_connection_info().addr().to_string();
                if *lock(&this.last_master) != address {
                    tracing::info!(
                        sentinel_master = %name,
                        address = %address,
                        "the sentinels name another Redis master; reconnecting"
                    );
                    this.forget(generation);
                }
            }
            this.rechecking.store(false, Ordering::Release);
        });
    }

    async fn connect(&self) -> Result<Held, RedisError> {
        let client = match &self.source {
            Source::Node(client) => client.clone(),
            Source::Sentinels { client, .. } => client.lock().await.async_get_client().await?,
        };
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(1);
        *lock(&self.checked_at) = Instant::now();
        let mut connection = client.get_connection_manager_with_config(config).await?;
        self.check_role(&mut connection).await?;
        if let Source::Sentinels { master, .. } = &self.source {
            let address = client.get_connection_info().addr().to_string();
            let mut last = lock(&self.last_master);
            if *last != address {
                tracing::info!(
                    sentinel_master = %master,
                    address = %address,
                    previous = %last,
                    "the sentinels name this Redis master; connected"
                );
                *last = address;
            }
        }
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        Ok(Held {
            connection,
            generation,
        })
    }

    /// `ROLE` must answer master. A node that does not know `ROLE` (renamed, refused by an
    /// ACL) is taken at its word.
    pub async fn check_role(&self, connection: &mut ConnectionManager) -> Result<(), RedisError> {
        let role = redis::cmd("ROLE").query_async::<Role>(connection).await;
        let what = match role {
            Ok(Role::Primary { .. }) => {
                if self.wrong_role.swap(false, Ordering::AcqRel) {
                    tracing::info!(key = self.key, "Redis answers as a master again");
                }
                return Ok(());
            }
            Ok(Role::Replica { .. }) => "a replica",
            Ok(Role::Sentinel { .. }) => "a sentinel",
            // A role this client does not know: taken at its word.
            Ok(_) => return Ok(()),
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::Server(_)
                        | ErrorKind::Extension
                        | ErrorKind::Parse
                        | ErrorKind::UnexpectedReturnType
                ) =>
            {
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        // Through sentinels, a master just demoted is an ordinary moment of a failover: ask
        // again. A URL that names the wrong node is a mistake to fix.
        if !self.through_sentinels() && !self.wrong_role.swap(true, Ordering::AcqRel) {
            tracing::error!(
                key = self.key,
                role = what,
                "{} names {what}, not a Redis master: Redis is treated as down (for Redis \
                 Sentinel set redis.sentinels and redis.sentinel_master instead)",
                self.key
            );
        }
        Err(RedisError::from((
            ErrorKind::Extension,
            "not a Redis master",
            format!("{NOT_A_MASTER} {} names {what}", self.key),
        )))
    }

    /// A call on connection `generation` failed (`error`; `None`: it timed out). Through
    /// sentinels a lost connection is dropped, so the next call asks the sentinels again; a
    /// node named by URL is checked again after `READONLY` or a wrong role only.
    pub fn failed(&self, generation: u64, error: Option<&RedisError>) {
        let drop = match (&self.source, error) {
            (Source::Sentinels { .. }, None) => true,
            (Source::Sentinels { .. }, Some(e)) => lost(e),
            (Source::Node(_), Some(e)) => read_only(e) || not_a_master(e),
            (Source::Node(_), None) => false,
        };
        if drop {
            self.forget(generation);
        }
    }

    /// Drops connection `generation` if it is still the current one.
    pub fn forget(&self, generation: u64) {
        let mut current = lock(&self.current);
        if current.as_ref().is_some_and(|h| h.generation == generation) {
            *current = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_role_and_read_only_count_as_a_lost_master() {
        let wrong = RedisError::from((
            ErrorKind::Extension,
            "not a Redis master",
            format!("{NOT_A_MASTER} redis.url names a sentinel"),
        ));
        assert!(not_a_master(&wrong), "{wrong:?}");
        assert!(lost(&wrong));
        let other = RedisError::from((ErrorKind::Client, "something else"));
        assert!(!lost(&other));
    }
}
