//! The HTTP service: the application's services (`app.rs`) behind the router (`routes::configure`
//! and the console), bound to its listener; and the jobs beside it.

use std::net::TcpListener;
use std::sync::Arc;

use actix_web::dev::Service;
use actix_web::dev::{Server, ServerHandle};
use actix_web::http::StatusCode;
use actix_web::{HttpServer, web};

use crate::app::App;
use crate::archive::Archiver;
use crate::bills::Bills;
use crate::body_deadline;
use crate::certificates::Certificates;
use crate::channel::NotifyRoute;
use crate::config::Settings;
use crate::jobs::{Jobs, Retention, Work};
use crate::metrics::Metrics;
use crate::reconcile::Reconciler;
use crate::refunds::Refunds;
use crate::relay::Relay;
use crate::routes;
use crate::store::{Store, partitions};
use crate::time::{Clock, SystemClock};
use crate::transfers::Transfers;

pub use crate::app::{StartupError, explain};

/// How long a graceful shutdown waits for in-flight requests before closing them.
pub const SHUTDOWN_TIMEOUT_SECS: u64 = 15;

/// Knobs for building an [`Application`]; the defaults are production's.
pub struct Options {
    pub clock: Arc<dyn Clock>,
    /// Notify routes served beside the providers' (tests add a stand-in provider's).
    pub extra_notify_routes: Vec<NotifyRoute>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            clock: Arc::new(SystemClock),
            extra_notify_routes: Vec::new(),
        }
    }
}

/// The HTTP service: the application's services behind its router, bound to its listener.
pub struct Application {
    server: Server,
    port: u16,
    app: web::Data<App>,
}

impl Application {
    /// Builds the services ([`crate::app::App::build`]), creates today's partitions, binds
    /// the listener and builds the server; nothing runs until
    /// [`Application::run_until_stopped`].
    pub async fn build(settings: &Settings, options: Options) -> Result<Self, StartupError> {
        let app = App::build(settings, Arc::clone(&options.clock)).await?;
        // Today's partitions and the next days', before the first request; a table whose DDL
        // cannot run now takes its rows in its future partition until the retention job can.
        for table in [partitions::OUTBOX, partitions::RECEIPTS] {
            if let Err(e) = app
                .store
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
        if settings.server.api_token.is_empty() {
            tracing::warn!(
                listen = %settings.server.listen,
                "server.api_token is empty: /admin and /orders answer any process on this \
                 machine without a token; requests relayed by a proxy (Forwarded, \
                 X-Forwarded-For, X-Real-IP), naming another host, or sent by a browser \
                 from another site are refused"
            );
        }
        let console = web::Data::new(
            crate::console::Keys::new(&settings.server.api_token)
                .map_err(|_| StartupError::Random("the console's signing key"))?
                .plain_http(settings.server.console_plain_http),
        );
        let limits = routes::Limits {
            max_body: settings.server.max_body_bytes,
        };
        let body_timeout = settings.server.body_timeout();
        let extra: Arc<[NotifyRoute]> = options.extra_notify_routes.into();
        let app = web::Data::new(app);
        let request_metrics = Arc::clone(&app.metrics);
        let served = app.clone();
        let server = HttpServer::new(move || {
            let latency = Arc::clone(&request_metrics);
            let (app, extra) = (served.clone(), Arc::clone(&extra));
            let console = console.clone();
            actix_web::App::new()
                // Innermost: every body is read under server.body_timeout_ms (408 after).
                .wrap_fn(move |mut req, srv| {
                    let expired = body_deadline::arm(&mut req, body_timeout);
                    let response = srv.call(req);
                    async move {
                        Ok(body_deadline::answer(
                            response.await?,
                            &expired,
                            |message| routes::error_response(StatusCode::REQUEST_TIMEOUT, message),
                        ))
                    }
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
                .configure(|cfg| routes::configure(cfg, app, limits, &extra))
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

        Ok(Self { server, port, app })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The services the server hands its handlers.
    pub fn services(&self) -> &App {
        &self.app
    }

    pub fn store(&self) -> &Store {
        &self.app.store
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.app.metrics)
    }

    /// The platform certificates kept fresh (`[certificates]`).
    pub fn certificates(&self) -> Arc<Certificates> {
        Arc::clone(&self.app.certificates)
    }

    /// The daily bill reconciliation (`[bills]`).
    pub fn bills(&self) -> Arc<Bills> {
        Arc::clone(&self.app.bills)
    }

    /// Refunds started through paynotify (`[refunds]`).
    pub fn refunds(&self) -> Arc<Refunds> {
        Arc::clone(&self.app.refunds)
    }

    /// Merchant transfers started through paynotify (`[transfers]`).
    pub fn transfers(&self) -> Arc<Transfers> {
        Arc::clone(&self.app.transfers)
    }

    /// The accounts stored through `/admin/merchants`.
    pub fn merchants(&self) -> Arc<crate::merchants::live::Merchants> {
        Arc::clone(&self.app.merchants)
    }

    /// The provider queries and closes the reconcile and expiry jobs run.
    pub fn reconciler(&self) -> Arc<Reconciler> {
        Arc::clone(&self.app.reconciler)
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
            self.app.store.clone(),
            Arc::clone(&self.app.sink),
            Arc::clone(&clock),
            Arc::clone(&self.app.metrics),
            settings.relay.batch_size,
            settings.relay.max_attempts,
        ));
        Jobs::start(
            self.app.store.clone(),
            clock,
            Work {
                reconciler: Arc::clone(&self.app.reconciler),
                certificates: Arc::clone(&self.app.certificates),
                bills: self.daily_bills(settings)?,
                refunds: Arc::clone(&self.app.refunds),
                transfers: Arc::clone(&self.app.transfers),
                merchants: Arc::clone(&self.app.merchants),
            },
            relay,
            settings.relay.interval(),
            Retention {
                every: settings.retention.every(),
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

    /// The daily bill job and its schedule, when `bills.enabled` (a run with no account
    /// whose bills can be fetched fetches nothing: accounts come and go through
    /// `/admin/merchants`).
    fn daily_bills(
        &self,
        settings: &Settings,
    ) -> Result<Option<(Arc<Bills>, String)>, StartupError> {
        if !settings.bills.enabled {
            return Ok(None);
        }
        if !self.app.bills.fetches() {
            tracing::warn!(
                "bills.enabled, but no merchant or app has API credentials yet: the daily bill job fetches nothing until one is added"
            );
        }
        Ok(Some((
            Arc::clone(&self.app.bills),
            Bills::schedule(&settings.bills),
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
