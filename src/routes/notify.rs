//! The one handler behind every notify URL: verify, decode, apply, acknowledge.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};

use crate::channel::{Channel, Inbound, Rejection, Reply};
use crate::gate::Decision;
use crate::notice::Outcome;
use crate::startup::AppState;

/// The reply the provider gets for what the ledger did.
pub fn reply_for(outcome: Outcome) -> Reply<'static> {
    match outcome {
        Outcome::Applied | Outcome::Duplicate | Outcome::Anomaly(_) | Outcome::Ignored => {
            Reply::Success
        }
        Outcome::Conflict => Reply::Failure {
            status: StatusCode::CONFLICT,
            message: "business content differs from the first delivery of this key",
        },
        Outcome::UnknownOrder => Reply::Failure {
            status: StatusCode::NOT_FOUND,
            message: "unknown order",
        },
        Outcome::TooEarly => Reply::Failure {
            status: StatusCode::NOT_FOUND,
            message: "order not paid yet",
        },
        Outcome::Contended => Reply::Failure {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "order busy, retry",
        },
    }
}

/// Handles `POST` on a provider's notify URL. The body arrives as raw bytes, bounded by
/// `server.max_body_bytes` (413 in the provider's shape when larger).
pub async fn notify<C: Channel>(
    channel: web::Data<C>,
    state: web::Data<AppState>,
    request: HttpRequest,
    body: Result<web::Bytes, actix_web::Error>,
) -> HttpResponse {
    let id = channel.id();
    let body = match body {
        Ok(body) => body,
        Err(e) => {
            let status = e.as_response_error().status_code();
            let (status, message) = if status == StatusCode::PAYLOAD_TOO_LARGE {
                (status, "body too large")
            } else {
                (StatusCode::BAD_REQUEST, "unreadable body")
            };
            tracing::warn!(channel = %id, error = %e, "notification rejected: {message}");
            let reason = if status == StatusCode::PAYLOAD_TOO_LARGE {
                "too_large"
            } else {
                "bad_request"
            };
            state
                .metrics
                .rejections
                .with_label_values(&[id.as_str(), reason])
                .inc();
            return channel.render(Reply::Failure { status, message });
        }
    };
    let now = state.clock.now();
    let inbound = Inbound {
        headers: request.headers(),
        body: &body,
        now,
    };
    let notice = match channel.verify(&inbound).and_then(|v| channel.decode(v)) {
        Ok(notice) => notice,
        Err(rejection) => {
            if let Rejection::Undecryptable(_) = rejection {
                // Our key is wrong, not the provider: an operator must act while it retries.
                tracing::error!(channel = %id, detail = %rejection, "notification verified but not decryptable: check the configured key");
            } else {
                tracing::warn!(channel = %id, reason = rejection.reason(), detail = %rejection, "notification rejected");
            }
            state
                .metrics
                .rejections
                .with_label_values(&[id.as_str(), rejection.reason()])
                .inc();
            let message = rejection.to_string();
            return channel.render(Reply::Failure {
                status: rejection.status(),
                message: &message,
            });
        }
    };
    let marker = match &state.gate {
        None => None,
        Some(gate) => match gate.enter(&notice).await {
            Decision::Proceed(marker) => marker,
            Decision::Answered => {
                // The same content was applied before: the same answer, no database.
                state
                    .metrics
                    .notifications
                    .with_label_values(&[id.as_str(), "duplicate_cached"])
                    .inc();
                return channel.render(Reply::Success);
            }
            Decision::Busy => {
                state
                    .metrics
                    .notifications
                    .with_label_values(&[id.as_str(), "in_flight"])
                    .inc();
                return channel.render(Reply::Failure {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    message: "the same notification is being processed; retry",
                });
            }
        },
    };
    let result = state.store.apply(&notice, now).await;
    if let Some(gate) = &state.gate {
        gate.leave(&notice, marker, result.as_ref().ok().copied())
            .await;
    }
    match result {
        Ok(outcome) => {
            state
                .metrics
                .notifications
                .with_label_values(&[id.as_str(), outcome.as_str()])
                .inc();
            if let Outcome::Anomaly(reason) = outcome {
                state
                    .metrics
                    .anomalies
                    .with_label_values(&[id.as_str(), reason.as_str()])
                    .inc();
            }
            tracing::info!(
                channel = %id,
                out_trade_no = %notice.out_trade_no,
                transaction_id = %notice.transaction_id,
                outcome = outcome.as_str(),
                anomaly = ?matches!(outcome, Outcome::Anomaly(_)).then_some(outcome),
                "notification applied"
            );
            channel.render(reply_for(outcome))
        }
        Err(e) => {
            state
                .metrics
                .notifications
                .with_label_values(&[id.as_str(), "db_unavailable"])
                .inc();
            tracing::error!(channel = %id, out_trade_no = %notice.out_trade_no, error = %e, "notification not stored; the provider will retry");
            channel.render(Reply::Failure {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: "temporarily unavailable",
            })
        }
    }
}
