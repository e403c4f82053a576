//! Refunds started through paynotify: `POST` and `GET /orders/{order_no}/refunds`.

use actix_web::{HttpResponse, web};
use serde::Deserialize;

use super::{ApiError, Authorized, ErrorBody};
use crate::app::App;
use crate::refunds::{Ask, RefundView, StartError, Started};

/// At most 80 characters (WeChat's `reason`; Alipay's `refund_reason` allows 256).
const MAX_REASON: usize = 80;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RefundRequest {
    /// The refund's number, and its idempotency key at the provider (WeChat
    /// `out_refund_no`, Alipay `out_request_no`): 1 to 64 of A-Z a-z 0-9 _ - | * @.
    pub out_refund_no: String,
    /// This refund's amount in fen: > 0 and at most paid − refunded − refunds in flight.
    pub amount_fen: i64,
    #[serde(default)]
    pub reason: Option<String>,
}

impl RefundRequest {
    fn ask(self) -> Result<Ask, ApiError> {
        let bad = |m: &str| Err(ApiError::BadRequest(m.to_owned()));
        let no = &self.out_refund_no;
        if no.is_empty()
            || no.len() > crate::notice::max_len::OUT_REFUND_NO
            || !no
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-|*@".contains(&b))
        {
            return bad("out_refund_no: 1 to 64 characters of A-Z a-z 0-9 _ - | * @");
        }
        if self.amount_fen <= 0 {
            return bad("amount_fen: a positive integer (fen)");
        }
        let reason = self.reason.filter(|r| !r.trim().is_empty());
        if let Some(r) = &reason
            && (r.chars().count() > MAX_REASON || r.chars().any(char::is_control))
        {
            return bad("reason: at most 80 characters, no control characters");
        }
        Ok(Ask {
            out_refund_no: self.out_refund_no,
            amount_fen: self.amount_fen,
            reason,
        })
    }
}

#[utoipa::path(post, path = "/orders/{order_no}/refunds", tag = "orders",
    description = "Refunds the order's own recorded payment (its channel, account and transaction id). The refund is recorded before its provider is called; a timeout or 5xx leaves it SUBMITTING and the same request (same out_refund_no, same amount) is sent again until the provider answers. Not-final refunds are queried ([refunds]); a final signed answer goes through the ledger like the refund notification, so the order moves once.",
    params(("order_no" = String, Path)),
    request_body = RefundRequest,
    responses(
        (status = 202, description = "Recorded and sent: SUBMITTING (no answer yet), PROCESSING, SUCCESS, CLOSED, or ABNORMAL (with error_code when the provider refused)", body = RefundView),
        (status = 200, description = "The same out_refund_no with the same order and amount: the stored refund, nothing sent", body = RefundView),
        (status = 400, description = "Malformed body, amount_fen ≤ 0, bad out_refund_no", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 404, description = "No such order", body = ErrorBody),
        (status = 409, description = "Order not PAID, amount over what is left, or out_refund_no already another refund's", body = ErrorBody),
        (status = 422, description = "No account with API credentials to send it through", body = ErrorBody),
        (status = 503, description = "Database unavailable: nothing recorded", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn start(
    _: Authorized,
    state: web::Data<App>,
    order_no: web::Path<String>,
    body: web::Json<RefundRequest>,
) -> Result<HttpResponse, ApiError> {
    let ask = body.into_inner().ask()?;
    let refunds = std::sync::Arc::clone(&state.refunds);
    let order_no = order_no.into_inner();
    // To its end even if the caller hangs up: the answer is recorded either way.
    let started = state
        .runtime
        .spawn(async move { refunds.start(&order_no, &ask).await })
        .await
        .map_err(|e| ApiError::Database(e.into()))?;
    match started {
        Ok(Started::Sent(view)) => Ok(HttpResponse::Accepted().json(view)),
        Ok(Started::Stored(view)) => Ok(HttpResponse::Ok().json(view)),
        Err(e @ StartError::UnknownOrder) => Err(ApiError::NotFound(e.to_string())),
        Err(
            e @ (StartError::NotRefundable(_)
            | StartError::OverRemainder { .. }
            | StartError::OtherRequest),
        ) => Err(ApiError::Conflict(e.to_string())),
        Err(StartError::NoAccount(why)) => Err(ApiError::Unprocessable(why)),
        Err(StartError::AccountOff(why)) => Err(ApiError::Conflict(why)),
        Err(StartError::Store(e)) => Err(ApiError::Database(e)),
    }
}

#[utoipa::path(get, path = "/orders/{order_no}/refunds", tag = "orders",
    params(("order_no" = String, Path)),
    responses(
        (status = 200, description = "The order's refunds started through paynotify, oldest first", body = Vec<RefundView>),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 404, description = "No such order", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    _: Authorized,
    state: web::Data<App>,
    order_no: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let refunds = std::sync::Arc::clone(&state.refunds);
    let listed = state
        .detach(async move { refunds.list(&order_no).await })
        .await?;
    match listed {
        Some(views) => Ok(HttpResponse::Ok().json(views)),
        None => Err(ApiError::NotFound("no such order".to_owned())),
    }
}
