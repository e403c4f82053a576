//! The one handler behind every notify URL: read the body, hand it to the intake (verify,
//! decode, settle), answer in the provider's shape and keep a receipt. Each provider declares
//! its routes as data (`channel::NotifyRoute`); `routes::configure` mounts them here.

use actix_web::error::PayloadError;
use actix_web::http::StatusCode;
use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};

use crate::app::App;
use crate::channel::{Answer, Inbound, NotifyRoute, Reply};
use crate::intake::Refused;
use crate::metrics::Refusal;
use crate::notice::Notice;
use crate::receipts::{Arrival, Provenance};

/// A provider's answer as an HTTP response.
pub fn respond(answer: Answer) -> HttpResponse {
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = HttpResponse::build(status);
    match answer.content_type {
        Some(content_type) => response.content_type(content_type).body(answer.body),
        None => response.finish(),
    }
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

    fn of_refusal(refused: Refused) -> Self {
        Self {
            signed: refused.signed,
            ..Self::refused(refused.why, refused.message)
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

/// The route as registered, with the account of a per-account route filled in
/// (`/notify/wechat/pay/{account}` → `/notify/wechat/pay/1900000101`): a re-apply and
/// `explain` then check the same account.
fn route_of(request: &HttpRequest) -> Option<String> {
    let pattern = request.match_pattern()?;
    match (
        pattern.strip_suffix("/{account}"),
        request.match_info().get("account"),
    ) {
        (Some(base), Some(account)) => Some(format!("{base}/{account}")),
        _ => Some(pattern),
    }
}

/// Handles `POST` on a provider's notify URL. The body arrives as raw bytes, bounded by
/// `server.max_body_bytes` (413 in the provider's shape when larger). What arrived and what
/// it was answered goes to the receipt queue (`receipts.store`) without waiting.
pub async fn notify(
    route: web::Data<NotifyRoute>,
    app: web::Data<App>,
    request: HttpRequest,
    body: Result<web::Bytes, actix_web::Error>,
) -> HttpResponse {
    let channel = route.channel.as_ref();
    let received_at = app.clock.now();
    let started = std::time::Instant::now();
    let bytes: &[u8] = body.as_ref().map_or(&[], |b| b.as_ref());
    // The route as registered (a percent-encoded path names the same one), kept with the
    // receipt so a re-apply and `explain` check the event type against it too.
    let pattern = route_of(&request);
    let inbound = Inbound {
        headers: request.headers(),
        body: bytes,
        now: received_at,
        route: pattern.as_deref(),
    };
    let answer = |reply: Reply<'_>| respond(channel.render(reply));
    let (response, disposition) = match &body {
        Err(e) => {
            let (why, status, message) = unreadable(e);
            tracing::warn!(channel = %channel.id(), error = %e, "notification rejected: {message}");
            app.metrics.refused(channel.id(), why);
            let response = answer(Reply::Failure { status, message });
            (response, Disposition::refused(why, e.to_string()))
        }
        Ok(_) => match app.intake.admit(channel, &inbound).await {
            Err(refused) => {
                let response = answer(Reply::Failure {
                    status: refused.status,
                    message: &refused.message,
                });
                (response, Disposition::of_refusal(refused))
            }
            Ok(notice) => {
                let (counted, reply) = app.intake.settle(&notice, received_at, started).await;
                let mut disposition = Disposition::of_notice(counted.label(), &notice);
                if let Reply::Failure { message, .. } = reply {
                    disposition.detail = Some(message.to_owned());
                }
                (answer(reply), disposition)
            }
        },
    };
    if app.receipts.wants(response.status().is_success()) {
        let provenance = if disposition.signed {
            Provenance::Signed
        } else {
            Provenance::unsigned(channel.standing(&inbound), disposition.unknown_key)
        };
        app.receipts.keep(Arrival {
            channel: channel.id(),
            received_at,
            peer: request.peer_addr(),
            request_id: request
                .extensions()
                .get::<tracing_actix_web::RequestId>()
                .map(ToString::to_string),
            route: pattern.as_deref(),
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
