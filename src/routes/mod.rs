//! HTTP routes and the JSON error shape of the internal API.

pub mod admin;
pub mod bills;
pub mod combined;
pub mod health;
pub mod merchants;
pub mod notify;
pub mod openapi;
pub mod orders;
pub mod refunds;
pub mod transfers;

use std::future::{Ready, ready};

use actix_web::http::StatusCode;
use actix_web::http::header::AUTHORIZATION;
use actix_web::{FromRequest, HttpRequest, HttpResponse, ResponseError, web};

use crate::app::App;
use crate::channel::NotifyRoute;
use crate::notice::Digest;
use crate::origin::{refused_from_another_site, refused_without_token};
use crate::store::StoreError;

/// Request limits every extractor shares.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_body: usize,
}

/// The route table: the internal API, operations, and every notify route (the providers'
/// and any `extra`, as tests add a stand-in provider's), each served by
/// [`notify::notify`] with its channel.
pub fn configure(
    cfg: &mut web::ServiceConfig,
    app: web::Data<App>,
    limits: Limits,
    extra: &[NotifyRoute],
) {
    let bad_request =
        |message: String| -> actix_web::Error { ApiError::BadRequest(message).into() };
    let notify_routes: Vec<NotifyRoute> = app.notify_routes.iter().chain(extra).cloned().collect();
    cfg.app_data(app)
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
        .route("/combined-orders", web::post().to(combined::create))
        .route(
            "/combined-orders/{combine_out_trade_no}",
            web::get().to(combined::get),
        )
        .route(
            "/combined-orders/{combine_out_trade_no}/close",
            web::post().to(combined::close),
        )
        .route("/transfers", web::post().to(transfers::start))
        .route("/transfers/{out_bill_no}", web::get().to(transfers::get))
        .route(
            "/transfers/{out_bill_no}/cancel",
            web::post().to(transfers::cancel),
        )
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
        .route("/admin/merchants", web::post().to(merchants::create))
        .route("/admin/merchants", web::get().to(merchants::list))
        .route(
            "/admin/merchants/{channel}/{account}",
            web::get().to(merchants::get),
        )
        .route(
            "/admin/merchants/{channel}/{account}",
            web::patch().to(merchants::update),
        )
        .route(
            "/admin/merchants/{channel}/{account}",
            web::delete().to(merchants::disable),
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
    for route in notify_routes {
        cfg.service(
            web::resource(route.path)
                .app_data(web::Data::new(route))
                .route(web::post().to(notify::notify)),
        );
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
    /// Something of this process failed (its random generator); logged where it happened.
    #[error("{0}")]
    Internal(String),
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
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
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

/// The error shape of the internal API.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: String,
}

pub fn error_body(message: &str) -> serde_json::Value {
    serde_json::json!({ "error": message })
}

/// `{"error": message}` with `status`.
pub fn error_response(status: StatusCode, message: &str) -> HttpResponse {
    HttpResponse::build(status).json(error_body(message))
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
        let Some(state) = req.app_data::<web::Data<App>>() else {
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
