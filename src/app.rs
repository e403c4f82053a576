//! The application's services, built once from the settings: the database, the providers,
//! the intake of notifications and every feature's service. The HTTP server
//! (`startup.rs`) hands it to its handlers as `web::Data<App>`; the command line uses the
//! same `App` for its commands (`paynotify bills reconcile`).

use std::sync::Arc;
use std::time::Duration;

use crate::bills::Bills;
use crate::certificates::Certificates;
use crate::channel::{NotifyRoute, Provider};
use crate::combined::{ChannelAccounts as CombinedAccounts, Combinations};
use crate::config::{ConfigError, Secret, Settings};
use crate::gate::Gate;
use crate::intake::Intake;
use crate::merchants::live::{LoadError, Merchants};
use crate::metrics::Metrics;
use crate::providers;
use crate::receipts::Receipts;
use crate::receipts::reapply::Reapplier;
use crate::reconcile::Reconciler;
use crate::refunds::Refunds;
use crate::relay::{Sink, sinks};
use crate::store::{Store, StoreError};
use crate::time::Clock;
use crate::transfers::{ChannelAccounts, Transfers};

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

/// Every service of the application. Built once; cloning an `Arc` of it is how a handler,
/// a job or a command reaches a service.
pub struct App {
    pub store: Store,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
    /// The runtime the application was built on: database work runs on it detached from
    /// the request that asked for it ([`App::detach`]).
    pub runtime: tokio::runtime::Handle,
    /// Verifies and settles notifications (the gate and the ledger behind it).
    pub intake: Arc<Intake>,
    /// Every provider's notify routes, for the HTTP room to mount.
    pub notify_routes: Vec<NotifyRoute>,
    /// Where the relay delivers (`relay.sink`); `/readyz` reports whether it is up.
    pub sink: Arc<dyn Sink>,
    /// Where the notify handler leaves what arrived (`receipts.store`).
    pub receipts: Receipts,
    /// Re-applies stored requests; holds every provider's operations side.
    pub reapplier: Arc<Reapplier>,
    /// Asks the providers about an order and closes it there (`[reconcile]`).
    pub reconciler: Arc<Reconciler>,
    /// The platform keys the providers hand out, kept fresh (`[certificates]`).
    pub certificates: Arc<Certificates>,
    /// The daily bill reconciliation (`[bills]`).
    pub bills: Arc<Bills>,
    /// Refunds started through paynotify (`[refunds]`).
    pub refunds: Arc<Refunds>,
    /// Merchant transfers started through paynotify (`[transfers]`).
    pub transfers: Arc<Transfers>,
    /// The accounts stored through `/admin/merchants`, live in every channel.
    pub merchants: Arc<Merchants>,
    /// Combined payments (`POST /combined-orders`).
    pub combined: Arc<Combinations>,
    /// `server.api_token`: who may use `/orders` and `/admin`.
    pub api_token: Secret,
    /// `orders.expire_after_secs`: an order's default lifetime.
    pub expire_after_secs: u64,
}

impl App {
    /// Loads the providers' keys (a bad key file stops start-up before anything connects),
    /// connects to the database (migrating it when `database.auto_migrate`), loads the
    /// stored platform certificates and builds every service. Nothing is served and no job
    /// runs; the sink and Redis are built, not connected.
    pub async fn build(settings: &Settings, clock: Arc<dyn Clock>) -> Result<Self, StartupError> {
        crate::https::install_crypto();
        let mut notify_routes = Vec::new();
        let mut operated: Vec<Arc<dyn Provider>> = Vec::new();
        let mut apis = Vec::new();
        let mut key_sources = Vec::new();
        let mut bill_sources = Vec::new();
        let mut books = Vec::new();
        for mounted in providers::mount_all(settings, clock.now())? {
            books.push(mounted.accounts);
            notify_routes.extend(mounted.routes);
            operated.push(mounted.provider);
            apis.extend(mounted.api);
            key_sources.extend(mounted.keys);
            bill_sources.extend(mounted.bills);
        }
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

        // Built, not connected: a sink that is down at start-up only delays delivery.
        let sink_timeout = Duration::from_millis(settings.redis.timeout_ms.max(1000));
        let sink: Arc<dyn Sink> = Arc::from(sinks::from_settings(
            &settings.relay,
            &settings.redis,
            sink_timeout,
            &providers::client_settings(settings),
        )?);

        let metrics = Arc::new(Metrics::new());
        // The accounts stored through /admin/merchants, before the certificates stored for
        // them are read (those of an account not installed would be skipped).
        let channel_books: Vec<_> = books.iter().map(|b| (b.channel(), Arc::clone(b))).collect();
        let merchants = Arc::new(Merchants::new(
            store.clone(),
            books,
            settings.secrets.master_key()?,
            Arc::clone(&metrics),
            Arc::clone(&clock),
            settings.merchants.reload_secs,
        ));
        match merchants.load().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(accounts = n, "stored accounts loaded"),
            Err(LoadError::Config(e)) => return Err(e.into()),
            Err(LoadError::Store(e)) => return Err(explain(&store, e).await),
        }
        // Every certificate a previous run (or another instance) downloaded: a restart
        // needs no network.
        let certificates = Certificates::new(
            key_sources,
            store.clone(),
            Arc::clone(&metrics),
            Arc::clone(&clock),
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
            Arc::clone(&clock),
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
            Arc::clone(&clock),
            &settings.refunds,
            settings.provider_api.timeout(),
        ));
        let combined = Arc::new(Combinations::new(
            store.clone(),
            channel_books
                .into_iter()
                .map(|(channel, book)| CombinedAccounts {
                    channel,
                    book,
                    api: apis.iter().find(|a| a.channel() == channel).cloned(),
                })
                .collect(),
        ));
        let transfers = Arc::new(Transfers::new(
            operated
                .iter()
                .map(|p| ChannelAccounts {
                    channel: p.channel(),
                    provider: Arc::clone(p),
                    api: apis.iter().find(|a| a.channel() == p.channel()).cloned(),
                })
                .collect(),
            store.clone(),
            Arc::clone(&metrics),
            Arc::clone(&clock),
            &settings.transfers,
            settings.provider_api.timeout(),
        ));
        let reconciler = Arc::new(Reconciler::new(
            apis,
            store.clone(),
            Arc::clone(&metrics),
            &settings.reconcile,
            Arc::clone(&clock),
        ));
        // A change of database writer from now on: ids moved on, acknowledged orders rechecked.
        crate::reconcile::failover::follow(&reconciler, Arc::clone(&metrics));
        let runtime = tokio::runtime::Handle::current();
        let intake = Arc::new(Intake::new(
            store.clone(),
            gate,
            Arc::clone(&metrics),
            Arc::clone(&certificates),
            runtime.clone(),
        ));
        let reapplier = Arc::new(Reapplier::new(
            Arc::clone(&intake),
            operated,
            store.clone(),
            Arc::clone(&clock),
        ));
        Ok(Self {
            receipts: Receipts::start(&settings.receipts, store.clone(), Arc::clone(&metrics)),
            store,
            metrics,
            clock,
            runtime,
            intake,
            notify_routes,
            sink,
            reapplier,
            reconciler,
            certificates,
            bills,
            refunds,
            transfers,
            merchants,
            combined,
            api_token: settings.server.api_token.clone(),
            expire_after_secs: settings.orders.expire_after_secs,
        })
    }

    /// Every provider's operations side (re-apply and `explain` verify stored requests
    /// with these).
    pub fn providers(&self) -> &[Arc<dyn Provider>] {
        self.reapplier.providers()
    }

    /// Runs database work to its end on the service's runtime, whether or not the caller is
    /// still connected. A client that hangs up drops its request future; work dropped
    /// mid-transaction would leave a half-used connection behind (on SQLite, diesel-async's
    /// blocking wrapper even panics the worker, and the next checkout of that connection
    /// panics too). Spawned, a transaction commits or rolls back, and its connection goes
    /// back to the pool idle.
    pub async fn detach<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
        T: Send + 'static,
    {
        self.runtime.spawn(work).await.map_err(StoreError::Task)?
    }
}
