//! Why a console request was not answered with its page, as a page.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use maud::html;

use super::html::{bare, sign_in_page};
use crate::store::StoreError;

/// Why a console request was not answered with its page.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// No token, cookie or session: the sign-in page.
    #[error("sign in")]
    SignIn,
    #[error("{0}")]
    Forbidden(&'static str),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Unprocessable(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(&'static str),
    #[error("{}", if .0.is_unavailable() { "database unavailable: try again" } else { "internal error" })]
    Database(#[from] StoreError),
}

impl From<crate::routes::ApiError> for ConsoleError {
    fn from(e: crate::routes::ApiError) -> Self {
        use crate::routes::ApiError;
        match e {
            ApiError::Database(cause) => Self::Database(cause),
            ApiError::NotFound(m) => Self::NotFound(m),
            ApiError::Conflict(m) => Self::Conflict(m),
            ApiError::Unprocessable(m) => Self::Unprocessable(m),
            ApiError::Unavailable(m) => Self::Unavailable(m),
            ApiError::Forbidden(m) => Self::Forbidden(m),
            ApiError::Unauthorized => Self::SignIn,
            other => Self::BadRequest(other.to_string()),
        }
    }
}

impl ResponseError for ConsoleError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::SignIn => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Database(e) if e.is_unavailable() => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) | Self::Database(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let Self::Database(cause) = self {
            tracing::error!(error = %cause, "console request failed on the database");
        }
        if let Self::SignIn = self {
            return sign_in_page(StatusCode::UNAUTHORIZED, false);
        }
        let status = self.status_code();
        bare(
            status,
            status.canonical_reason().unwrap_or("Error"),
            html! {
                h1 { (status.as_u16()) " " (status.canonical_reason().unwrap_or("")) }
                p.error role="alert" { (self.to_string()) }
                p { a href="/admin/console" { "Back to the console" } }
            },
        )
    }
}
