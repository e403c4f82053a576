//! Why a console request was not answered with its page, as a page: the causes the internal
//! API answers too (with its statuses and messages), plus signing in.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use maud::html;

use super::html::{bare, sign_in_page};
use crate::certificates::NotRefreshed;
use crate::merchants::live::MerchantError;
use crate::reconcile::ReconcileOrderError;
use crate::store::StoreError;
use crate::transfers::CancelError;

/// Why a console request was not answered with its page. The statuses and messages are the
/// internal API's for the same cause.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// No token, cookie or session: the sign-in page.
    #[error("sign in")]
    SignIn,
    /// The application was built without something the console needs.
    #[error("{0}")]
    Internal(&'static str),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Forbidden(&'static str),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// A provider could not be asked; the operator may try again.
    #[error("{0}")]
    Unavailable(String),
    /// 503 when the database is out of reach, 500 when a statement failed; the cause is
    /// logged, never shown.
    #[error("{}", if .0.is_unavailable() { "database unavailable" } else { "internal error" })]
    Database(StoreError),
}

impl From<StoreError> for ConsoleError {
    fn from(e: StoreError) -> Self {
        Self::Database(e)
    }
}

impl From<ReconcileOrderError> for ConsoleError {
    fn from(e: ReconcileOrderError) -> Self {
        match e {
            ReconcileOrderError::NoCredentials => Self::Conflict(e.to_string()),
            ReconcileOrderError::NoSuchOrder => Self::NotFound(e.to_string()),
            ReconcileOrderError::Store(e) => Self::Database(e),
        }
    }
}

impl From<MerchantError> for ConsoleError {
    fn from(e: MerchantError) -> Self {
        match e {
            MerchantError::NoMasterKey => Self::Unavailable(e.to_string()),
            MerchantError::Invalid(why) => Self::BadRequest(why.to_string()),
            MerchantError::NotFound(why) => Self::NotFound(why),
            MerchantError::Conflict(why) => Self::Conflict(why),
            MerchantError::Store(e) => Self::Database(e),
            MerchantError::Sealing(why) => {
                tracing::error!(error = %why, "account keys not sealed or opened");
                Self::Internal("the account's keys could not be sealed")
            }
        }
    }
}

impl From<NotRefreshed> for ConsoleError {
    fn from(e: NotRefreshed) -> Self {
        Self::Unavailable(e.to_string())
    }
}

impl From<CancelError> for ConsoleError {
    fn from(e: CancelError) -> Self {
        match e {
            CancelError::Disabled => {
                Self::Forbidden("transfers are off (transfers.enabled = false)")
            }
            CancelError::Unknown => Self::NotFound(e.to_string()),
            CancelError::NotCancellable(_) | CancelError::Refused { .. } => {
                Self::Conflict(e.to_string())
            }
            CancelError::Unavailable(why) => Self::Unavailable(why),
            CancelError::Store(e) => Self::Database(e),
        }
    }
}

impl ResponseError for ConsoleError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::SignIn => StatusCode::UNAUTHORIZED,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Database(e) if e.is_unavailable() => StatusCode::SERVICE_UNAVAILABLE,
            Self::Database(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let Self::Database(cause) = self {
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
