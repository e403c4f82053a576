//! The one handler behind every notify URL: verify, decode, apply, acknowledge.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};

use crate::channel::alipay::Alipay;
use crate::channel::wechat::WechatPay;
use crate::channel::{Channel, Inbound, Rejection, Reply};
use crate::gate::Decision;
use crate::notice::{Notice, Outcome};
use crate::startup::AppState;
use crate::store::StoreError;
use crate::time::Timestamp;

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

/// What the gate and the ledger made of a verified notice.
enum Settled {
    /// The gate holds this content's final answer.
    Cached,
    /// The same notification is being applied elsewhere right now.
    Busy,
    Applied(Result<Outcome, StoreError>),
}

/// Gate, ledger, gate: everything a verified notice needs, as one task that runs to its end.
async fn settle(state: std::sync::Arc<AppState>, notice: Notice, now: Timestamp) -> Settled {
    let marker = match &state.gate {
        None => None,
        Some(gate) => match gate.enter(&notice).await {
            Decision::Proceed(marker) => marker,
            Decision::Answered => return Settled::Cached,
            Decision::Busy => return Settled::Busy,
        },
    };
    let result = state.store.apply(&notice, now).await;
    if let Some(gate) = &state.gate {
        gate.leave(&notice, marker, result.as_ref().ok().copied())
            .await;
    }
    Settled::Applied(result)
}

/// WeChat's failure body; success is `204 No Content`.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct WechatFail {
    /// Always `FAIL`.
    pub code: String,
    pub message: String,
}

#[utoipa::path(post, path = "/notify/wechat/pay", tag = "notify",
    description = "WeChat Pay API v3 payment result (TRANSACTION.SUCCESS). Authenticated by the Wechatpay-* signature headers over the raw body.",
    request_body(content = Object, content_type = "application/json"),
    responses(
        (status = 204, description = "Applied, duplicate, or recorded anomaly (including a second payment under the same key)"),
        (status = 400, description = "Missing header, malformed body or field, unsupported signature type", body = WechatFail),
        (status = 401, description = "Bad or missing signature, unknown serial, probe, stale timestamp", body = WechatFail),
        (status = 404, description = "Unknown order (WeChat retries)", body = WechatFail),
        (status = 409, description = "The same payment or refund as before (same transaction id or refund key) with other amount, currency or merchant", body = WechatFail),
        (status = 413, description = "Body larger than server.max_body_bytes", body = WechatFail),
        (status = 500, description = "Signature valid, resource does not decrypt (our apiv3_key is wrong)", body = WechatFail),
        (status = 503, description = "Database unavailable or the same notification in flight", body = WechatFail)))]
pub async fn wechat_pay(
    channel: web::Data<WechatPay>,
    state: web::Data<AppState>,
    request: HttpRequest,
    body: Result<web::Bytes, actix_web::Error>,
) -> HttpResponse {
    notify(channel, state, request, body).await
}

#[utoipa::path(post, path = "/notify/wechat/refund", tag = "notify",
    description = "WeChat Pay API v3 refund result (REFUND.SUCCESS, REFUND.ABNORMAL, REFUND.CLOSED); answers as /notify/wechat/pay.",
    request_body(content = Object, content_type = "application/json"),
    responses(
        (status = 204, description = "Applied, duplicate, recorded anomaly, or acknowledged without change"),
        (status = 400, description = "Bad request", body = WechatFail),
        (status = 401, description = "Bad signature or stale", body = WechatFail),
        (status = 404, description = "Unknown order, or its payment not in yet", body = WechatFail),
        (status = 409, description = "The same payment or refund as before (same transaction id or refund key) with other amount, currency or merchant", body = WechatFail),
        (status = 413, description = "Body too large", body = WechatFail),
        (status = 500, description = "Resource does not decrypt", body = WechatFail),
        (status = 503, description = "Database unavailable or the same notification in flight", body = WechatFail)))]
pub async fn wechat_refund(
    channel: web::Data<WechatPay>,
    state: web::Data<AppState>,
    request: HttpRequest,
    body: Result<web::Bytes, actix_web::Error>,
) -> HttpResponse {
    notify(channel, state, request, body).await
}

#[utoipa::path(post, path = "/notify/alipay", tag = "notify",
    description = "Alipay asynchronous notification (trade_status_sync): payments, refunds, closes. Authenticated by the RSA2 `sign` field; the body is read raw whatever its Content-Type.",
    request_body(content = String, content_type = "application/x-www-form-urlencoded"),
    responses(
        (status = 200, description = "`success`: applied, duplicate, recorded anomaly", content_type = "text/plain", body = String),
        (status = 400, description = "`fail`: malformed form, repeated field, bad amount", content_type = "text/plain", body = String),
        (status = 401, description = "`fail`: bad or missing sign, unknown app_id", content_type = "text/plain", body = String),
        (status = 404, description = "`fail`: unknown order", content_type = "text/plain", body = String),
        (status = 409, description = "`fail`: the same payment or refund as before with other amount or merchant", content_type = "text/plain", body = String),
        (status = 413, description = "`fail`: body too large", content_type = "text/plain", body = String),
        (status = 503, description = "`fail`: database unavailable or the same notification in flight", content_type = "text/plain", body = String)))]
pub async fn alipay(
    channel: web::Data<Alipay>,
    state: web::Data<AppState>,
    request: HttpRequest,
    body: Result<web::Bytes, actix_web::Error>,
) -> HttpResponse {
    notify(channel, state, request, body).await
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
    let started = std::time::Instant::now();
    let body = match body {
        Ok(body) => body,
        Err(e) => {
            let timed_out = e.as_error::<actix_web::error::PayloadError>().is_some_and(|p| {
                matches!(p, actix_web::error::PayloadError::Io(io) if io.kind() == std::io::ErrorKind::TimedOut)
            });
            // (The body deadline's 408 itself is written by `body_deadline`.)
            let (status, message, reason) = if timed_out {
                (
                    StatusCode::REQUEST_TIMEOUT,
                    "body not received in time",
                    "body_timeout",
                )
            } else if e.as_response_error().status_code() == StatusCode::PAYLOAD_TOO_LARGE {
                (StatusCode::PAYLOAD_TOO_LARGE, "body too large", "too_large")
            } else {
                (StatusCode::BAD_REQUEST, "unreadable body", "bad_request")
            };
            tracing::warn!(channel = %id, error = %e, "notification rejected: {message}");
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
    let decoded = channel.verify(&inbound).and_then(|v| channel.decode(v));
    let notice = match decoded
        .and_then(|n| n.check_lengths().map_err(Rejection::BadRequest).map(|()| n))
    {
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
    // From here the notice is the provider's word: settle it to the end even if the provider
    // hangs up (WeChat does after 5 s), so no transaction or connection is left half done.
    let settled = {
        let (state, notice) = (state.clone().into_inner(), notice.clone());
        state
            .runtime
            .clone()
            .spawn(settle(state, notice, now))
            .await
    };
    let result = match settled {
        Ok(Settled::Cached) => {
            // The same content was applied before: the same answer, no database.
            state
                .metrics
                .notifications
                .with_label_values(&[id.as_str(), "duplicate_cached"])
                .inc();
            return channel.render(Reply::Success);
        }
        Ok(Settled::Busy) => {
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
        Ok(Settled::Applied(result)) => result,
        Err(e) => Err(StoreError::Unavailable(format!(
            "ledger task ended early: {e}"
        ))),
    };
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
                latency_ms = started.elapsed().as_secs_f64() * 1000.0,
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
