//! Builds the running service: pools, migrations, routes, and the HTTP server.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::Service;
use actix_web::dev::{Server, ServerHandle};
use actix_web::{App, HttpServer, web};

use crate::archive::Archiver;
use crate::bills::Bills;
use crate::body_deadline;
use crate::certificates::Certificates;
use crate::channel;
use crate::config::{ConfigError, Settings};
use crate::gate::Gate;
use crate::jobs::{Jobs, Retention, Work};
use crate::metrics::Metrics;
use crate::providers;
use crate::receipts::Receipts;
use crate::reconcile::Reconciler;
use crate::refunds::Refunds;
use crate::relay::{Relay, Sink, sinks};
use crate::routes::{self, AppState, ExtraRoutes};
use crate::store::{Store, StoreError, partitions};
use crate::time::{Clock, SystemClock};

/// How long a graceful shutdown waits for in-flight requests before closing them.
pub const SHUTDOWN_TIMEOUT_SECS: u64 = 15;

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("scheduler: {0}")]
    Scheduler(#[from] tokio_cron_scheduler::JobSchedulerError),
    #[error("database: {0}")]
    Database(StoreError),
    /// The database did not answer at start-up: where and why, in one line.
    #[error("{0}")]
    DatabaseUnreachable(String),
    /// `retention.archive_dir` cannot be created: the archive would fail every hour.
    #[error("retention.archive_dir: cannot create {}: {source}", path.display())]
    ArchiveDir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// The operating system's random generator failed.
    #[error("no random bytes for {0}")]
    Random(&'static str),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

// Not `#[from]`: that would make the store error the source too, and `{:#}` would print
// its message twice.
impl From<StoreError> for StartupError {
    fn from(error: StoreError) -> Self {
        Self::Database(error)
    }
}

/// A store error at start-up, with where and why when the database cannot be reached.
pub async fn explain(store: &Store, error: StoreError) -> StartupError {
    match store.unreachable_message(&error).await {
        Some(message) => StartupError::DatabaseUnreachable(message),
        None => StartupError::Database(error),
    }
}

/// The bill reconciliation without the HTTP service (`paynotify bills reconcile`): the
/// providers' API clients, the database (migrated when `database.auto_migrate`), the
/// downloaded platform certificates.
pub async fn bills_only(
    settings: &Settings,
    clock: Arc<dyn Clock>,
) -> Result<Arc<Bills>, StartupError> {
    crate::https::install_crypto();
    let mut apis = Vec::new();
    let mut key_sources = Vec::new();
    let mut bill_sources = Vec::new();
    for mounted in providers::mount_all(settings, clock.now())? {
        apis.extend(mounted.api);
        key_sources.extend(mounted.keys);
        bill_sources.extend(mounted.bills);
    }
    let store = Store::connect(&settings.database)?;
    store.check_server().await?;
    if settings.database.auto_migrate
        && let Err(e) = store.migrate().await
    {
        return Err(explain(&store, e).await);
    }
    let metrics = Arc::new(Metrics::new());
    let certificates = Certificates::new(
        key_sources,
        store.clone(),
        Arc::clone(&metrics),
        Arc::clone(&clock),
        &settings.certificates,
    );
    if let Err(e) = certificates.load().await {
        return Err(explain(&store, e).await);
    }
    let apis = apis
        .into_iter()
        .map(|api| certificates.guard(api))
        .collect();
    Ok(Arc::new(Bills::new(
        bill_sources,
        apis,
        certificates,
        store,
        metrics,
        clock,
        &settings.bills,
    )?))
}

/// Knobs for building an [`Application`]; the defaults are production's.
pub struct Options {
    pub clock: Arc<dyn Clock>,
    pub extra_routes: Option<ExtraRoutes>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            clock: Arc::new(SystemClock),
            extra_routes: None,
        }
    }
}

pub struct Application {
    server: Server,
    port: u16,
    store: Store,
    metrics: Arc<Metrics>,
    sink: Arc<dyn Sink>,
    reconciler: Arc<Reconciler>,
    certificates: Arc<Certificates>,
    bills: Arc<Bills>,
    refunds: Arc<Refunds>,
}

impl Application {
    /// Connects to the database (migrating it when `database.auto_migrate`), binds the
    /// listener and builds the server; nothing runs until [`Application::run_until_stopped`].
    pub async fn build(settings: &Settings, options: Options) -> Result<Self, StartupError> {
        // Keys first: a bad key file should stop start-up before anything connects.
        let now = options.clock.now();
        crate::https::install_crypto();
        let mut providers = Vec::new();
        let mut operated: Vec<Arc<dyn channel::Provider>> = Vec::new();
        let mut apis = Vec::new();
        let mut key_sources = Vec::new();
        let mut bill_sources = Vec::new();
        for mounted in providers::mount_all(settings, now)? {
            providers.push(mounted.mount);
            operated.push(mounted.provider);
            apis.extend(mounted.api);
            key_sources.extend(mounted.keys);
            bill_sources.extend(mounted.bills);
        }
        let providers: Arc<[channel::Mount]> = providers.into();
        let store = Store::connect(&settings.database)?;
        store.check_server().await?;
        if settings.database.auto_migrate {
            let applied = match store.migrate().await {
                Ok(applied) => applied,
                Err(e) => return Err(explain(&store, e).await),
            };
            if !applied.is_empty() {
                tracing::info!(backend = store.backend(), ?applied, "migrations applied");
            }
        }
        if let Err(e) = store.ping().await {
            return Err(explain(&store, e).await);
        }
        // Today's partitions and the next days', before the first request; a table whose DDL
        // cannot run now takes its rows in its future partition until the retention job can.
        for table in [partitions::OUTBOX, partitions::RECEIPTS] {
            if let Err(e) = store
                .maintain_partitions(table, options.clock.now(), None)
                .await
            {
                tracing::warn!(table = table.table, error = %e, "partitions not created ahead; the retention job retries");
            }
        }

        let addr = settings.server.listen;
        let listener =
            TcpListener::bind(addr).map_err(|source| StartupError::Listen { addr, source })?;
        let port = listener
            .local_addr()
            .map_err(|source| StartupError::Listen { addr, source })?
            .port();

        // Built, not connected: a sink that is down at start-up only delays delivery.
        let sink_timeout = Duration::from_millis(settings.redis.timeout_ms.max(1000));
        let sink: Arc<dyn Sink> = Arc::from(sinks::from_settings(
            &settings.relay,
            &settings.redis,
            sink_timeout,
            &providers::client_settings(settings),
        )?);

        let metrics = Arc::new(Metrics::new());
        // Every certificate a previous run (or another instance) downloaded: a restart
        // needs no network.
        let certificates = Certificates::new(
            key_sources,
            store.clone(),
            Arc::clone(&metrics),
            Arc::clone(&options.clock),
            &settings.certificates,
        );
        match certificates.load().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(certificates = n, "stored platform certificates loaded"),
            Err(e) => return Err(explain(&store, e).await),
        }
        let apis: Vec<_> = apis
            .into_iter()
            .map(|api| certificates.guard(api))
            .collect();
        let bills = Arc::new(Bills::new(
            bill_sources,
            apis.clone(),
            Arc::clone(&certificates),
            store.clone(),
            Arc::clone(&metrics),
            Arc::clone(&options.clock),
            &settings.bills,
        )?);
        let gate = if !settings.redis.is_set() {
            None
        } else {
            let gate = Gate::new(
                &settings.redis,
                &settings.redis.key_prefix,
                Arc::clone(&metrics),
            )?
            .with_writer(Arc::clone(store.writer()));
            Some(Arc::new(gate))
        };
        let refunds = Arc::new(Refunds::new(
            apis.clone(),
            store.clone(),
            Arc::clone(&metrics),
            Arc::clone(&options.clock),
            &settings.refunds,
            Duration::from_millis(settings.reconcile.timeout_ms),
        ));
        let reconciler = Arc::new(Reconciler::new(
            apis,
            store.clone(),
            Arc::clone(&metrics),
            &settings.reconcile,
            Arc::clone(&options.clock),
        ));
        // A change of database writer from now on: ids moved on, acknowledged orders rechecked.
        crate::reconcile::failover::follow(&reconciler, Arc::clone(&metrics));
        if settings.server.api_token.is_empty() {
            tracing::warn!(
                listen = %settings.server.listen,
                "server.api_token is empty: /admin and /orders answer any process on this \
                 machine without a token; requests relayed by a proxy (Forwarded, \
                 X-Forwarded-For, X-Real-IP), naming another host, or sent by a browser \
                 from another site are refused"
            );
        }
        let state = web::Data::new(AppState {
            reconciler: Arc::clone(&reconciler),
            store: store.clone(),
            gate,
            metrics: Arc::clone(&metrics),
            clock: options.clock,
            api_token: settings.server.api_token.clone(),
            expire_after_secs: settings.orders.expire_after_secs,
            runtime: tokio::runtime::Handle::current(),
            sink: Arc::clone(&sink),
            receipts: Receipts::start(&settings.receipts, store.clone(), Arc::clone(&metrics)),
            providers: operated,
            certificates: Arc::clone(&certificates),
            bills: Arc::clone(&bills),
            refunds: Arc::clone(&refunds),
        });
        let console = web::Data::new(
            crate::console::Keys::new(&settings.server.api_token)
                .map_err(|_| StartupError::Random("the console's signing key"))?
                .plain_http(settings.server.console_plain_http),
        );
        let limits = routes::Limits {
            max_body: settings.server.max_body_bytes,
        };
        let body_timeout = Duration::from_millis(settings.server.body_timeout_ms);
        let extra = options.extra_routes;
        let request_metrics = Arc::clone(&metrics);
        let server = HttpServer::new(move || {
            let latency = Arc::clone(&request_metrics);
            let (state, providers, extra) = (state.clone(), Arc::clone(&providers), extra.clone());
            let console = console.clone();
            App::new()
                // Innermost: every body is read under server.body_timeout_ms (408 after).
                .wrap_fn(move |mut req, srv| {
                    let expired = body_deadline::arm(&mut req, body_timeout);
                    let response = srv.call(req);
                    async move { Ok(body_deadline::answer(response.await?, &expired)) }
                })
                .wrap_fn(move |req, srv| {
                    let timer = latency.time_request(&req);
                    let response = srv.call(req);
                    async move {
                        let response = response.await;
                        timer.observe();
                        response
                    }
                })
                .wrap(tracing_actix_web::TracingLogger::<
                    crate::telemetry::RequestSpan,
                >::new())
                .configure(|cfg| routes::configure(cfg, state, limits, &providers, extra.as_ref()))
                .configure(|cfg| crate::console::configure(cfg, console))
        })
        .disable_signals()
        .workers(settings.server.http_workers())
        // In-flight requests get this long after SIGTERM; a slow body is cut sooner by
        // server.body_timeout_ms.
        .shutdown_timeout(SHUTDOWN_TIMEOUT_SECS)
        .listen(listener)
        .map_err(|source| StartupError::Listen { addr, source })?
        .run();

        Ok(Self {
            server,
            port,
            store,
            metrics,
            sink,
            reconciler,
            certificates,
            bills,
            refunds,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.metrics)
    }

    /// The platform certificates kept fresh (`[certificates]`).
    pub fn certificates(&self) -> Arc<Certificates> {
        Arc::clone(&self.certificates)
    }

    /// The daily bill reconciliation (`[bills]`).
    pub fn bills(&self) -> Arc<Bills> {
        Arc::clone(&self.bills)
    }

    /// Refunds started through paynotify (`[refunds]`).
    pub fn refunds(&self) -> Arc<Refunds> {
        Arc::clone(&self.refunds)
    }

    /// The provider queries and closes the reconcile and expiry jobs run.
    pub fn reconciler(&self) -> Arc<Reconciler> {
        Arc::clone(&self.reconciler)
    }

    /// Starts the relay, order-expiry and retention jobs with the sink `relay.sink` names.
    /// A sink that is down does not stop them: the relay keeps its rows and retries.
    pub async fn start_jobs(
        &self,
        settings: &Settings,
        clock: Arc<dyn Clock>,
    ) -> Result<Jobs, StartupError> {
        let archive_dir = &settings.retention.archive_dir;
        std::fs::create_dir_all(archive_dir).map_err(|source| StartupError::ArchiveDir {
            path: archive_dir.clone(),
            source,
        })?;
        let relay = Arc::new(Relay::new(
            self.store.clone(),
            Arc::clone(&self.sink),
            Arc::clone(&clock),
            Arc::clone(&self.metrics),
            settings.relay.batch_size,
            settings.relay.max_attempts,
        ));
        Jobs::start(
            self.store.clone(),
            clock,
            Work {
                reconciler: Arc::clone(&self.reconciler),
                certificates: Arc::clone(&self.certificates),
                bills: self.daily_bills(settings)?,
                refunds: Arc::clone(&self.refunds),
            },
            relay,
            Duration::from_millis(settings.relay.interval_ms),
            Retention {
                every: Duration::from_secs(settings.retention.every_secs),
                keep_days: settings.retention.keep_days,
                receipts_keep_days: settings.receipts.keep_days,
                archive: Archiver {
                    bill_items_keep_days: settings.retention.bill_items_keep_days,
                    bill_lines_keep_days: settings.retention.bill_lines_keep_days,
                    ..Archiver::new(
                        settings.retention.archive_dir.clone(),
                        settings.retention.orders_keep_days,
                    )
                },
            },
        )
        .await
        .map_err(StartupError::from)
    }

    /// The daily bill job and its schedule, when `bills.enabled` and some account's bills
    /// can be fetched.
    fn daily_bills(
        &self,
        settings: &Settings,
    ) -> Result<Option<(Arc<Bills>, String)>, StartupError> {
        if !settings.bills.enabled {
            return Ok(None);
        }
        if !self.bills.fetches() {
            tracing::warn!(
                "bills.enabled, but no merchant or app has API credentials: no daily bill job"
            );
            return Ok(None);
        }
        Ok(Some((
            Arc::clone(&self.bills),
            Bills::schedule(&settings.bills)?,
        )))
    }

    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    /// Serves until [`ServerHandle::stop`] is called; in-flight requests finish first.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        self.server.await
    }
}
