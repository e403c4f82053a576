//! A read deadline for request bodies (`server.body_timeout_ms`).
//!
//! actix-web's `client_request_timeout` covers the request head only: a client that sends
//! `Content-Length: 60000` and then a few bytes would hold its connection (and a graceful
//! shutdown) for as long as it likes. Here every body is read through [`DeadlinePayload`],
//! which fails the read once the deadline has passed; the request is then answered
//! `408 Request Timeout` — in the provider's own shape on the notify routes (their handler
//! renders it) — and the
//! connection is closed.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::body::BoxBody;
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::error::PayloadError;
use actix_web::http::{ConnectionType, StatusCode};
use actix_web::web::Bytes;
use actix_web::{HttpMessage, HttpResponse};
use futures_core::Stream;

const MESSAGE: &str = "request body not received within the deadline";

/// The request's payload, failing with a timeout once `deadline` has passed before its end.
pub struct DeadlinePayload {
    inner: Payload,
    deadline: Pin<Box<tokio::time::Sleep>>,
    expired: Arc<AtomicBool>,
    done: bool,
}

impl Stream for DeadlinePayload {
    type Item = Result<Bytes, PayloadError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if let Poll::Ready(item) = Pin::new(&mut this.inner).poll_next(cx) {
            this.done = item.is_none();
            return Poll::Ready(item);
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            this.done = true;
            this.expired.store(true, Ordering::Release);
            return Poll::Ready(Some(Err(PayloadError::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                MESSAGE,
            )))));
        }
        Poll::Pending
    }
}

/// Puts the deadline on `req`'s body; the flag turns true if the deadline cut it short.
pub fn arm(req: &mut ServiceRequest, deadline: Duration) -> Arc<AtomicBool> {
    let expired = Arc::new(AtomicBool::new(false));
    let inner = req.take_payload();
    if matches!(inner, Payload::None) {
        return expired;
    }
    let stream: Pin<Box<dyn Stream<Item = Result<Bytes, PayloadError>>>> =
        Box::pin(DeadlinePayload {
            inner,
            deadline: Box::pin(tokio::time::sleep(deadline)),
            expired: Arc::clone(&expired),
            done: false,
        });
    req.set_payload(Payload::from(stream));
    expired
}

/// The handler's answer, or — when the body deadline cut the read short — a `408` that
/// closes the connection (the rest of the body is never read). A notify handler answers the
/// cut-off read with its provider's own 408, which is kept; any other route gets what
/// `timed_out` renders of the message (the API's `{"error": …}`).
pub fn answer<B>(
    response: ServiceResponse<B>,
    expired: &AtomicBool,
    timed_out: impl FnOnce(&str) -> HttpResponse,
) -> ServiceResponse<BoxBody>
where
    B: actix_web::body::MessageBody + 'static,
{
    if !expired.load(Ordering::Acquire) {
        return response.map_into_boxed_body();
    }
    let pattern = response.request().match_pattern();
    tracing::warn!(
        route = pattern.as_deref().unwrap_or("unmatched"),
        "request body not received within server.body_timeout_ms: 408"
    );
    let mut response = if response.status() == StatusCode::REQUEST_TIMEOUT {
        response.map_into_boxed_body()
    } else {
        let (request, _) = response.into_parts();
        ServiceResponse::new(request, timed_out(MESSAGE).map_into_boxed_body())
    };
    response
        .response_mut()
        .head_mut()
        .set_connection_type(ConnectionType::Close);
    response
}
