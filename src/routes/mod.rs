//! HTTP routes and the JSON error shape of the internal API.

pub mod admin;
pub mod bills;
pub mod health;
pub mod notify;
pub mod openapi;
pub mod orders;
pub mod refunds;

use std::future::{Ready, ready};

use actix_web::http::StatusCode;
use actix_web::http::header::AUTHORIZATION;
use actix_web::{FromRequest, HttpRequest, HttpResponse, ResponseError, web};

use std::sync::Arc;

use crate::channel::Mount;
use crate::config::Secret;
use crate::gate::Gate;
use crate::metrics::Metrics;
use crate::notice::Digest;
use crate::relay::Sink;
use crate::store::{Store, StoreError};
use crate::time::Clock;

/// What every handler shares.
pub struct AppState {
    pub store: Store,
    /// The Redis gate, when `redis.url` is set.
    pub gate: Option<Arc<Gate>>,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
    pub api_token: Secret,
    pub expire_after_secs: u64,
    /// The runtime that database work runs on, detached from the request (see [`detach`]);
    /// the runtime the application was built on.
    pub runtime: tokio::runtime::Handle,
    /// Where the relay delivers (`relay.sink`); `/readyz` reports whether it is up.
    pub sink: Arc<dyn Sink>,
    /// Where the notify handler leaves what arrived (`receipts.store`).
    pub receipts: crate::receipts::Receipts,
    /// Every provider's operations side: re-apply verifies stored requests with these.
    pub providers: Vec<Arc<dyn crate::channel::Provider>>,
    /// Asks the providers about an order and closes it there (`[reconcile]`).
    pub reconciler: Arc<crate::reconcile::Reconciler>,
    /// The platform keys the providers hand out, kept fresh (`[certificates]`).
    pub certificates: Arc<crate::certificates::Certificates>,
    /// The daily bill reconciliation (`[bills]`).
    pub bills: Arc<crate::bills::Bills>,
    /// Refunds started through paynotify (`[refunds]`).
    pub refunds: Arc<crate::refunds::Refunds>,
}

/// Extra routes mounted beside the built-in ones (tests mount a double channel this way).
pub type ExtraRoutes = Arc<dyn Fn(&mut web::ServiceConfig) + Send + Sync>;

/// Request limits every extractor shares.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_body: usize,
}

/// The route table: the internal API, operations, and every provider's notify routes.
pub fn configure(
    cfg: &mut web::ServiceConfig,
    state: web::Data<AppState>,
    limits: Limits,
    providers: &[Mount],
    extra: Option<&ExtraRoutes>,
) {
    let bad_request =
        |message: String| -> actix_web::Error { ApiError::BadRequest(message).into() };
    cfg.app_data(state)
        .app_data(web::PayloadConfig::new(limits.max_body))
        .app_data(
            web::JsonConfig::default()
                .limit(limits.max_body)
                .error_handler(move |err, _| bad_request(err.to_string())),
        )
        .app_data(
            web::PathConfig::default().error_handler(move |err, _| bad_request(err.to_string())),
        )
        .app_data(
            web::QueryConfig::default().error_handler(move |err, _| bad_request(err.to_string())),
        )
        .route("/healthz", web::get().to(health::healthz))
        .route("/readyz", web::get().to(health::readyz))
        .route("/metrics", web::get().to(health::metrics))
        .route("/orders", web::post().to(orders::create))
        .route("/orders/{order_no}", web::get().to(orders::get))
        .route("/orders/{order_no}/close", web::post().to(orders::close))
        .route("/orders/{order_no}/refunds", web::post().to(refunds::start))
        .route("/orders/{order_no}/refunds", web::get().to(refunds::list))
        .route("/admin/messages", web::get().to(admin::messages))
        .route(
            "/admin/messages/{id}/redrive",
            web::post().to(admin::redrive),
        )
        .route("/admin/callbacks", web::get().to(admin::callbacks))
        .route(
            "/admin/orders/{order_no}/reconcile",
            web::post().to(admin::reconcile),
        )
        .route("/admin/certificates", web::get().to(admin::certificates))
        .route(
            "/admin/certificates/refresh",
            web::post().to(admin::refresh_certificates),
        )
        .route("/admin/bills", web::get().to(bills::reports))
        .route("/admin/bills/reconcile", web::post().to(bills::reconcile))
        .route("/admin/receipts", web::get().to(admin::receipts))
        .route(
            "/admin/receipts/reapply",
            web::post().to(admin::reapply_many),
        )
        .route("/admin/receipts/{id}", web::get().to(admin::receipt))
        .route(
            "/admin/receipts/{id}/reapply",
            web::post().to(admin::reapply),
        )
        .route("/openapi.json", web::get().to(openapi::document));
    for mount in providers {
        mount(cfg);
    }
    if let Some(extra) = extra {
        extra(cfg);
    }
}

/// An error of the internal API, rendered as `{"error": "…"}`.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("missing or wrong bearer token")]
    Unauthorized,
    #[error("{0}")]
    Forbidden(&'static str),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Unprocessable(String),
    /// A provider could not be asked; the caller may try again.
    #[error("{0}")]
    Unavailable(String),
    /// Answered 503 when the database is out of reach, 500 when a statement failed; the
    /// cause is logged, never sent.
    #[error("{}", if .0.is_unavailable() { "database unavailable" } else { "internal error" })]
    Database(#[from] StoreError),
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Database(e) if e.is_unavailable() => StatusCode::SERVICE_UNAVAILABLE,
            Self::Database(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let Self::Database(cause) = self {
            // The cause is for operators, not for callers.
            tracing::error!(error = %cause, "request failed on the database");
        }
        HttpResponse::build(self.status_code()).json(error_body(&self.to_string()))
    }
}

/// Runs database work to its end on the service's runtime, whether or not the caller is still
/// connected. A client that hangs up drops its request future; work dropped mid-transaction
/// would leave a half-used connection behind (on SQLite, diesel-async's blocking wrapper even
/// panics the worker, and the next checkout of that connection panics too). Spawned, a
/// verified notice's transaction commits or rolls back, and its connection goes back to the
/// pool idle.
pub async fn detach<T, F>(state: &AppState, work: F) -> Result<T, StoreError>
where
    F: Future<Output = Result<T, StoreError>> + Send + 'static,
    T: Send + 'static,
{
    state.runtime.spawn(work).await.map_err(StoreError::Task)?
}

/// The error shape of the internal API.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: String,
}

pub fn error_body(message: &str) -> serde_json::Value {
    serde_json::json!({ "error": message })
}

/// Headers a reverse proxy adds to what it relays. With no token configured (loopback
/// only), a request carrying one came from beyond this machine through a proxy, and the
/// loopback address no longer says who sent it.
pub const PROXY_HEADERS: [&str; 3] = ["forwarded", "x-forwarded-for", "x-real-ip"];

/// Whether a browser says it sent the request from a page of another site: `Sec-Fetch-Site`
/// (every current browser), else an `Origin` that is not this host. A page of a sibling on
/// the same host (`same-site`) counts as another site. Requests from programs carry neither.
pub fn from_another_site(req: &HttpRequest) -> bool {
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = header("sec-fetch-site") {
        return !matches!(site, "same-origin" | "none");
    }
    match (header("origin"), header("host")) {
        (Some("null"), _) => true,
        (Some(origin), Some(host)) => origin
            .split_once("://")
            .is_none_or(|(_, authority)| authority != host),
        _ => false,
    }
}

/// Why a request that changes something is refused whatever its credential: a browser says
/// it sent it from a page of another site ([`from_another_site`]). A gateway in front may add
/// the bearer header to every request of a browser, so the header alone does not show that
/// an operator meant it. Logged once. Every `POST` of the internal API and the console
/// (their [`Authorized`] and the console's forms) goes through here; reads do not, since a
/// page of another site cannot read what it is answered.
pub fn refused_from_another_site(req: &HttpRequest) -> Option<&'static str> {
    if !from_another_site(req) {
        return None;
    }
    tracing::warn!(
        method = %req.method(),
        path = req.path(),
        "request a browser sent from another site refused"
    );
    Some("requests a browser sends from another site are refused")
}

/// Whether the request names a host other than this machine (`Host`, or the HTTP/2
/// authority): a page of `evil.example` whose name was made to resolve to 127.0.0.1 (DNS
/// rebinding) is the same origin to the browser, and only its `Host` gives it away.
fn names_another_host(req: &HttpRequest) -> bool {
    let host = req
        .headers()
        .get(actix_web::http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()));
    let Some(host) = host else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    !(name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback()))
}

/// Why a request is refused when `server.api_token` is empty (config allows that on a
/// loopback listen address only): relayed by a proxy (which would open the service to
/// whoever reaches the proxy), naming another host (DNS rebinding), or sent by a browser
/// from a page of another site (a web page open on this machine posting a form). Logged
/// once with the reason.
pub fn refused_without_token(req: &HttpRequest) -> Option<&'static str> {
    if let Some(header) = PROXY_HEADERS
        .iter()
        .find(|name| req.headers().contains_key(**name))
    {
        tracing::warn!(
            header,
            path = req.path(),
            "request relayed by a proxy refused: server.api_token is empty"
        );
        return Some("server.api_token is empty: requests relayed by a proxy are refused");
    }
    if names_another_host(req) {
        tracing::warn!(
            path = req.path(),
            "request naming another host refused: server.api_token is empty"
        );
        return Some(
            "server.api_token is empty: requests naming a host other than this machine are refused",
        );
    }
    if from_another_site(req) {
        tracing::warn!(
            path = req.path(),
            "request a browser sent from another site refused: server.api_token is empty"
        );
        return Some(
            "server.api_token is empty: requests a browser sends from another site are refused",
        );
    }
    None
}

/// Proof that the request carried `Authorization: Bearer <server.api_token>`, or that no
/// token is configured and nothing in [`refused_without_token`] applies; and, for a request
/// that may change something (any method but `GET`, `HEAD`, `OPTIONS`), that a browser did
/// not send it from another site ([`refused_from_another_site`]). The handlers of `/orders`
/// and `/admin` take it.
#[derive(Debug, Clone, Copy)]
pub struct Authorized;

impl FromRequest for Authorized {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        let Some(state) = req.app_data::<web::Data<AppState>>() else {
            return ready(Err(ApiError::Unauthorized));
        };
        let expected = state.api_token.expose();
        if expected.is_empty() {
            return ready(match refused_without_token(req) {
                None => Ok(Authorized),
                Some(why) => Err(ApiError::Forbidden(why)),
            });
        }
        let presented = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        // Comparing digests keeps the comparison's timing independent of the token.
        if Digest::of(presented.as_bytes()) != Digest::of(expected.as_bytes()) {
            return ready(Err(ApiError::Unauthorized));
        }
        if !req.method().is_safe()
            && let Some(why) = refused_from_another_site(req)
        {
            return ready(Err(ApiError::Forbidden(why)));
        }
        ready(Ok(Authorized))
    }
}
