//! The one handler behind every notify URL: verify, decode, apply, acknowledge. Each
//! provider's routes (in its file under `channel/`) call [`notify`] with its channel.

use actix_web::error::PayloadError;
use actix_web::http::StatusCode;
use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};

use super::AppState;
use crate::certificates::Learned;
use crate::channel::{Answer, Channel, Inbound, Rejection, Reply, admit_signed};
use crate::gate::Decision;
use crate::metrics::{Counted, Refusal};
use crate::notice::{Notice, NoticeKind, Outcome};
use crate::receipts::{Arrival, Provenance};
use crate::store::StoreError;
use crate::time::Timestamp;

/// Declares a provider's notify handler under a name of its own, so its OpenAPI attribute
/// (`#[utoipa::path(…)]`) has something to describe; it calls the shared
/// `routes::notify::notify` with the provider's channel.
macro_rules! notify_handler {
    ($(#[$attr:meta])* $name:ident, $channel:ty) => {
        $(#[$attr])*
        pub async fn $name(
            channel: actix_web::web::Data<$channel>,
            state: actix_web::web::Data<$crate::routes::AppState>,
            request: actix_web::HttpRequest,
            body: Result<actix_web::web::Bytes, actix_web::Error>,
        ) -> actix_web::HttpResponse {
            $crate::routes::notify::notify(channel, state, request, body).await
        }
    };
}
pub(crate) use notify_handler;

/// The reply the provider gets for what the ledger did.
pub fn reply_for(outcome: Outcome) -> Reply<'static> {
    match outcome {
        Outcome::Applied | Outcome::Duplicate | Outcome::Anomaly(_) | Outcome::Ignored => {
            Reply::Success
        }
        Outcome::Conflict => Reply::Failure {
            status: 409,
            message: "business content differs from the first delivery of this key",
        },
        Outcome::UnknownOrder => Reply::Failure {
            status: 404,
            message: "unknown order",
        },
        Outcome::TooEarly => Reply::Failure {
            status: 404,
            message: "order not paid yet",
        },
        Outcome::Contended => Reply::Failure {
            status: 503,
            message: "order busy, retry",
        },
    }
}

/// A provider's answer as an HTTP response.
pub fn respond(answer: Answer) -> HttpResponse {
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = HttpResponse::build(status);
    match answer.content_type {
        Some(content_type) => response.content_type(content_type).body(answer.body),
        None => response.finish(),
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

/// Remembers a payment or refund answered 2xx, for the recheck after a failover
/// (`reconcile/failover.rs`).
fn acknowledged(state: &AppState, notice: &Notice) {
    if matches!(notice.kind, NoticeKind::Paid | NoticeKind::Refunded(_)) {
        state.store.writer().acknowledged(&notice.out_trade_no);
    }
}

/// Gate, ledger, gate: everything a verified notice needs, as one task that runs to its end.
async fn settle(state: std::sync::Arc<AppState>, notice: Notice, now: Timestamp) -> Settled {
    let marker = match &state.gate {
        None => None,
        Some(gate) => match gate.enter(&notice).await {
            Decision::Proceed(marker) => marker,
            Decision::Answered => {
                acknowledged(&state, &notice);
                return Settled::Cached;
            }
            Decision::Busy => return Settled::Busy,
        },
    };
    let result = state.store.apply(&notice, now).await;
    if let Some(gate) = &state.gate {
        gate.leave(&notice, marker, result.as_ref().ok().copied())
            .await;
    }
    if let Ok(Outcome::Applied | Outcome::Duplicate) = result {
        acknowledged(&state, &notice);
    }
    Settled::Applied(result)
}

/// Why a body could not be read: its refusal, status and message.
fn unreadable(e: &actix_web::Error) -> (Refusal, u16, &'static str) {
    let timed_out = e.as_error::<PayloadError>().is_some_and(
        |p| matches!(p, PayloadError::Io(io) if io.kind() == std::io::ErrorKind::TimedOut),
    );
    if timed_out {
        // The body deadline (`body_deadline`) cut the read short.
        (Refusal::BodyTimeout, 408, "body not received in time")
    } else if e.as_response_error().status_code() == StatusCode::PAYLOAD_TOO_LARGE {
        (Refusal::TooLarge, 413, "body too large")
    } else {
        (Refusal::BadRequest, 400, "unreadable body")
    }
}

/// What a notify request came to, for its receipt.
struct Disposition {
    /// A ledger outcome, a gate or database result, or a refusal (the metrics' labels).
    outcome: &'static str,
    detail: Option<String>,
    out_trade_no: Option<String>,
    /// Whether the request's signature verified (it may have been refused after).
    signed: bool,
    /// Refused for naming a key not known yet (WeChat's `Wechatpay-Serial`).
    unknown_key: bool,
}

impl Disposition {
    fn refused(why: Refusal, detail: String) -> Self {
        Self {
            outcome: why.label(),
            detail: Some(detail),
            out_trade_no: None,
            signed: false,
            unknown_key: matches!(why, Refusal::UnknownSerial),
        }
    }

    fn of_notice(outcome: &'static str, notice: &Notice) -> Self {
        Self {
            outcome,
            detail: None,
            signed: true,
            unknown_key: false,
            out_trade_no: (!notice.out_trade_no.is_empty()).then(|| notice.out_trade_no.clone()),
        }
    }
}

/// Handles `POST` on a provider's notify URL. The body arrives as raw bytes, bounded by
/// `server.max_body_bytes` (413 in the provider's shape when larger). What arrived and what
/// it was answered goes to the receipt queue (`receipts.store`) without waiting.
pub async fn notify<C: Channel>(
    channel: web::Data<C>,
    state: web::Data<AppState>,
    request: HttpRequest,
    body: Result<web::Bytes, actix_web::Error>,
) -> HttpResponse {
    let received_at = state.clock.now();
    let body = body.map_err(|e| {
        let (why, status, message) = unreadable(&e);
        tracing::warn!(channel = %channel.id(), error = %e, "notification rejected: {message}");
        (why, status, message, e.to_string())
    });
    // The route as registered (a percent-encoded path names the same one), kept with the
    // receipt so a re-apply and `explain` check the event type against it too.
    let route = request.match_pattern();
    let (response, disposition) = match &body {
        Ok(bytes) => {
            handle(
                &channel,
                &state,
                &request,
                route.as_deref(),
                bytes,
                received_at,
            )
            .await
        }
        Err((why, status, message, error)) => {
            state.metrics.refused(channel.id(), *why);
            let response = respond(channel.render(Reply::Failure {
                status: *status,
                message,
            }));
            (response, Disposition::refused(*why, error.clone()))
        }
    };
    if state.receipts.wants(response.status().is_success()) {
        let bytes: &[u8] = body.as_ref().map_or(&[], |b| b.as_ref());
        let provenance = if disposition.signed {
            Provenance::Signed
        } else {
            let standing = channel.standing(&Inbound {
                headers: request.headers(),
                body: bytes,
                now: received_at,
                route: route.as_deref(),
            });
            Provenance::unsigned(standing, disposition.unknown_key)
        };
        state.receipts.keep(Arrival {
            channel: channel.id(),
            received_at,
            peer: request.peer_addr(),
            request_id: request
                .extensions()
                .get::<tracing_actix_web::RequestId>()
                .map(ToString::to_string),
            route: route.as_deref(),
            headers: request.headers(),
            signature_headers: channel.signature_headers(),
            body: bytes,
            status: response.status().as_u16(),
            outcome: disposition.outcome,
            detail: disposition.detail,
            out_trade_no: disposition.out_trade_no,
            provenance,
        });
    }
    response
}

/// Verify, decode, settle and answer one notification whose body was read.
async fn handle<C: Channel>(
    channel: &web::Data<C>,
    state: &web::Data<AppState>,
    request: &HttpRequest,
    route: Option<&str>,
    body: &[u8],
    now: Timestamp,
) -> (HttpResponse, Disposition) {
    let id = channel.id();
    let answer = |reply: Reply<'_>| respond(channel.render(reply));
    let started = std::time::Instant::now();
    let inbound = Inbound {
        headers: request.headers(),
        body,
        now,
        route,
    };
    let (mut admitted, mut signed) = admit_signed(channel.as_ref(), &inbound);
    if let Err(Rejection::UnknownSerial(_)) = &admitted {
        // A key rotated, or one not downloaded yet: the merchant's certificates are fetched
        // (once, however many requests wait for it), then the request is verified again.
        match state.certificates.unknown_serial(channel.id(), None).await {
            Learned::Asked => (admitted, signed) = admit_signed(channel.as_ref(), &inbound),
            Learned::Nobody => {}
            Learned::TimedOut => {
                let message = "platform certificates are being fetched; retry";
                tracing::warn!(channel = %id, "notification names an unknown serial and its merchant's certificates did not arrive in time; answered 503 so the provider retries");
                let response = answer(Reply::Failure {
                    status: 503,
                    message,
                });
                return (
                    response,
                    Disposition::refused(Refusal::UnknownSerial, message.to_owned()),
                );
            }
        }
    }
    let notice = match admitted {
        Ok(notice) => notice,
        Err(rejection) => {
            if let Rejection::Undecryptable(_) = rejection {
                // Our key is wrong, not the provider: an operator must act while it retries.
                tracing::error!(channel = %id, detail = %rejection, "notification verified but not decryptable: check the configured key");
            } else {
                tracing::warn!(channel = %id, route = route.unwrap_or("-"), reason = Refusal::from(&rejection).label(), detail = %rejection, "notification rejected");
            }
            let why = Refusal::from(&rejection);
            state.metrics.refused(id, why);
            let message = rejection.to_string();
            let response = answer(Reply::Failure {
                status: rejection.status(),
                message: &message,
            });
            let mut disposition = Disposition::refused(why, message);
            disposition.signed = signed;
            return (response, disposition);
        }
    };
    let (counted, reply) = settle_notice(state, &notice, now, started).await;
    let mut disposition = Disposition::of_notice(counted.label(), &notice);
    if let Reply::Failure { message, .. } = reply {
        disposition.detail = Some(message.to_owned());
    }
    (answer(reply), disposition)
}

/// Gate and ledger for a verified notice, run to its end even if the provider hangs up;
/// what it came to and the reply. Re-apply (`routes::admin`) goes through here too.
pub async fn settle_notice(
    state: &web::Data<AppState>,
    notice: &Notice,
    now: Timestamp,
    started: std::time::Instant,
) -> (Counted, Reply<'static>) {
    let id = notice.channel;
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
            state.metrics.notified(id, Counted::DuplicateCached);
            return (Counted::DuplicateCached, Reply::Success);
        }
        Ok(Settled::Busy) => {
            state.metrics.notified(id, Counted::InFlight);
            return (
                Counted::InFlight,
                Reply::Failure {
                    status: 503,
                    message: "the same notification is being processed; retry",
                },
            );
        }
        Ok(Settled::Applied(result)) => result,
        Err(e) => Err(StoreError::Task(e)),
    };
    match result {
        Ok(outcome) => {
            state.metrics.notified(id, Counted::Ledger(outcome));
            tracing::info!(
                channel = %id,
                out_trade_no = %notice.out_trade_no,
                transaction_id = %notice.transaction_id,
                outcome = outcome.as_str(),
                anomaly = ?matches!(outcome, Outcome::Anomaly(_)).then_some(outcome),
                latency_ms = started.elapsed().as_secs_f64() * 1000.0,
                "notification applied"
            );
            (Counted::Ledger(outcome), reply_for(outcome))
        }
        Err(e) => {
            // The provider retries: 503 when the database is out of reach or the payment's
            // group did not answer in time (it may still commit: the retry finds out), 500
            // when a statement failed (a bug to look at). Only the first two say nothing
            // about what was stored; a failed statement stored nothing.
            let (counted, status, message) = if let StoreError::Undecided(_) = e {
                (
                    Counted::Undecided,
                    503,
                    "not known yet whether it was stored; retry",
                )
            } else if e.is_unavailable() {
                (Counted::DbUnavailable, 503, "temporarily unavailable")
            } else {
                (Counted::DbError, 500, "internal error")
            };
            state.metrics.notified(id, counted);
            tracing::error!(channel = %id, out_trade_no = %notice.out_trade_no, error = %e, "notification not stored; the provider will retry");
            (counted, Reply::Failure { status, message })
        }
    }
}
