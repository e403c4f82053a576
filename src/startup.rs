//! Builds the running service: pools, migrations, routes, and the HTTP server.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::Service;
use actix_web::dev::{Server, ServerHandle};
use actix_web::{App, HttpServer, web};

use crate::body_deadline;
use crate::channel::alipay::Alipay;
use crate::channel::wechat::WechatPay;
use crate::config::{ConfigError, Secret, Settings, SinkKind};
use crate::gate::Gate;
use crate::jobs::Jobs;
use crate::metrics::{Metrics, ROUTE_UNMATCHED, method_label};
use crate::relay::{Relay, Sink, sink};
use crate::routes::{ApiError, admin, health, orders};
use crate::routes::{notify, openapi};
use crate::store::{Store, StoreError};
use crate::time::{Clock, SystemClock};

/// How long a graceful shutdown waits for in-flight requests before closing them.
pub const SHUTDOWN_TIMEOUT_SECS: u64 = 15;

/// What every handler shares.
pub struct AppState {
    pub store: Store,
    /// The Redis gate, when `redis.url` is set.
    pub gate: Option<Arc<Gate>>,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
    pub api_token: Secret,
    pub expire_after_secs: u64,
    /// The runtime that database work runs on, detached from the request (see
    /// `routes::detach`); the runtime `Application::build` was called on.
    pub runtime: tokio::runtime::Handle,
    /// Where the relay delivers (`relay.sink`); `/readyz` reports whether it is up.
    pub sink: Arc<dyn Sink>,
}

/// Extra routes mounted beside the built-in ones (tests mount a double channel this way).
pub type ExtraRoutes = Arc<dyn Fn(&mut web::ServiceConfig) + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("scheduler: {0}")]
    Scheduler(String),
    #[error("database: {0}")]
    Database(StoreError),
    /// The database did not answer at start-up: where and why, in one line.
    #[error("{0}")]
    DatabaseUnreachable(String),
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
}

impl Application {
    /// Connects to the database (migrating it when `database.auto_migrate`), binds the
    /// listener and builds the server; nothing runs until [`Application::run_until_stopped`].
    pub async fn build(settings: &Settings, options: Options) -> Result<Self, StartupError> {
        // Keys first: a bad key file should stop start-up before anything connects.
        let now = options.clock.now();
        let wechat = web::Data::new(WechatPay::from_settings(&settings.wechat, now)?);
        let alipay = web::Data::new(Alipay::from_settings(&settings.alipay, now)?);
        let store = Store::connect(&settings.database)?;
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

        let addr = settings.server.listen;
        let listener =
            TcpListener::bind(addr).map_err(|source| StartupError::Listen { addr, source })?;
        let port = listener
            .local_addr()
            .map_err(|source| StartupError::Listen { addr, source })?
            .port();

        // Built, not connected: a sink that is down at start-up only delays delivery.
        let sink_timeout = Duration::from_millis(settings.redis.timeout_ms.max(1000));
        // The key whose value the sink could not use.
        let sink_key = match settings.relay.sink {
            SinkKind::Log => "relay.sink",
            SinkKind::RedisStream => "redis.url",
            SinkKind::Http => "relay.http_url",
        };
        let sink: Arc<dyn Sink> = Arc::from(
            sink::from_settings(&settings.relay, &settings.redis.url, sink_timeout).map_err(
                |message| ConfigError::Invalid {
                    key: sink_key.into(),
                    message,
                },
            )?,
        );

        let metrics = Arc::new(Metrics::new());
        let gate = if settings.redis.url.is_empty() {
            None
        } else {
            let gate = Gate::new(
                &settings.redis,
                &settings.redis.key_prefix,
                Arc::clone(&metrics),
            )
            .map_err(|message| ConfigError::Invalid {
                key: "redis.url".into(),
                message,
            })?;
            Some(Arc::new(gate))
        };
        let state = web::Data::new(AppState {
            store: store.clone(),
            gate,
            metrics: Arc::clone(&metrics),
            clock: options.clock,
            api_token: settings.server.api_token.clone(),
            expire_after_secs: settings.orders.expire_after_secs,
            runtime: tokio::runtime::Handle::current(),
            sink: Arc::clone(&sink),
        });
        let max_body = settings.server.max_body_bytes;
        let body_timeout = Duration::from_millis(settings.server.body_timeout_ms);
        let extra = options.extra_routes;
        let request_metrics = Arc::clone(&metrics);
        let server = HttpServer::new(move || {
            let json = web::JsonConfig::default()
                .limit(max_body)
                .error_handler(|err, _| ApiError::BadRequest(err.to_string()).into());
            let path = web::PathConfig::default()
                .error_handler(|err, _| ApiError::BadRequest(err.to_string()).into());
            let query = web::QueryConfig::default()
                .error_handler(|err, _| ApiError::BadRequest(err.to_string()).into());
            let latency = Arc::clone(&request_metrics);
            let mut app = App::new()
                // Innermost: every body is read under server.body_timeout_ms (408 after).
                .wrap_fn(move |mut req, srv| {
                    let expired = body_deadline::arm(&mut req, body_timeout);
                    let response = srv.call(req);
                    async move { Ok(body_deadline::answer(response.await?, &expired)) }
                })
                .wrap_fn(move |req, srv| {
                    let started = std::time::Instant::now();
                    // Both labels come from fixed sets: a registered route pattern or
                    // `unmatched`, a standard method or `other`. Never the raw request.
                    let route = req
                        .match_pattern()
                        .unwrap_or_else(|| ROUTE_UNMATCHED.to_owned());
                    let method = method_label(req.method());
                    let histogram = latency
                        .request_seconds
                        .with_label_values(&[route.as_str(), method]);
                    let response = srv.call(req);
                    async move {
                        let response = response.await;
                        histogram.observe(started.elapsed().as_secs_f64());
                        response
                    }
                })
                .wrap(tracing_actix_web::TracingLogger::default())
                .app_data(state.clone())
                .app_data(web::PayloadConfig::new(max_body))
                .app_data(json)
                .app_data(path)
                .app_data(query)
                .route("/healthz", web::get().to(health::healthz))
                .route("/readyz", web::get().to(health::readyz))
                .route("/metrics", web::get().to(health::metrics))
                .route("/orders", web::post().to(orders::create))
                .route("/orders/{order_no}", web::get().to(orders::get))
                .route("/orders/{order_no}/close", web::post().to(orders::close))
                .route("/admin/messages", web::get().to(admin::messages))
                .route(
                    "/admin/messages/{id}/redrive",
                    web::post().to(admin::redrive),
                )
                .route("/admin/callbacks", web::get().to(admin::callbacks))
                .app_data(wechat.clone())
                .route("/notify/wechat/pay", web::post().to(notify::wechat_pay))
                .route(
                    "/notify/wechat/refund",
                    web::post().to(notify::wechat_refund),
                )
                .app_data(alipay.clone())
                .route("/notify/alipay", web::post().to(notify::alipay))
                .route("/openapi.json", web::get().to(openapi::document));
            if let Some(extra) = &extra {
                let extra = Arc::clone(extra);
                app = app.configure(move |cfg| extra(cfg));
            }
            app
        })
        .disable_signals()
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

    /// Starts the relay, order-expiry and retention jobs with the sink `relay.sink` names.
    /// A sink that is down does not stop them: the relay keeps its rows and retries.
    pub async fn start_jobs(
        &self,
        settings: &Settings,
        clock: Arc<dyn Clock>,
    ) -> Result<Jobs, StartupError> {
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
            relay,
            Duration::from_millis(settings.relay.interval_ms),
            settings.retention.keep_days,
        )
        .await
        .map_err(|e| StartupError::Scheduler(e.to_string()))
    }

    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    /// Serves until [`ServerHandle::stop`] is called; in-flight requests finish first.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        self.server.await
    }
}
