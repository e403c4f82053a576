//! HTTP routes and the JSON error shape of the internal API.

pub mod admin;
pub mod health;
pub mod notify;
pub mod openapi;
pub mod orders;

use std::future::{Ready, ready};

use actix_web::http::StatusCode;
use actix_web::http::header::AUTHORIZATION;
use actix_web::{FromRequest, HttpRequest, HttpResponse, ResponseError, web};

use crate::notice::Digest;
use crate::startup::AppState;
use crate::store::StoreError;

/// An error of the internal API, rendered as `{"error": "…"}`.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("missing or wrong bearer token")]
    Unauthorized,
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Unprocessable(String),
    #[error("database unavailable")]
    Unavailable(#[from] StoreError),
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let Self::Unavailable(cause) = self {
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
    state
        .runtime
        .spawn(work)
        .await
        .map_err(|e| StoreError::Unavailable(format!("database task ended early: {e}")))?
}

/// The error shape of the internal API.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: String,
}

pub fn error_body(message: &str) -> serde_json::Value {
    serde_json::json!({ "error": message })
}

/// Proof that the request carried `Authorization: Bearer <server.api_token>` (or that no
/// token is configured, which config only allows on a loopback address).
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
            return ready(Ok(Authorized));
        }
        let presented = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        // Comparing digests keeps the comparison's timing independent of the token.
        let ok = Digest::of(presented.as_bytes()) == Digest::of(expected.as_bytes());
        ready(if ok {
            Ok(Authorized)
        } else {
            Err(ApiError::Unauthorized)
        })
    }
}
