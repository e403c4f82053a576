//! Why a console request was not answered with its page, as a page: the internal API's
//! errors (`ApiError`: its statuses and messages), plus signing in.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use maud::html;

use super::html::{bare, sign_in_page};
use crate::routes::ApiError;
use crate::store::StoreError;

/// Why a console request was not answered with its page.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// No token, cookie or session: the sign-in page.
    #[error("sign in")]
    SignIn,
    /// The application was built without something the console needs.
    #[error("{0}")]
    Internal(&'static str),
    /// As the JSON endpoints answer it, drawn as a page.
    #[error(transparent)]
    Api(ApiError),
}

impl From<ApiError> for ConsoleError {
    fn from(e: ApiError) -> Self {
        match e {
            ApiError::Unauthorized => Self::SignIn,
            other => Self::Api(other),
        }
    }
}

impl From<StoreError> for ConsoleError {
    fn from(e: StoreError) -> Self {
        Self::Api(ApiError::Database(e))
    }
}

impl ResponseError for ConsoleError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::SignIn => StatusCode::UNAUTHORIZED,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Api(e) => e.status_code(),
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let Self::Api(ApiError::Database(cause)) = self {
            // The cause is for operators, not for the page.
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
