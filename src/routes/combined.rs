//! Combined payments: `POST /combined-orders`, `GET /combined-orders/{combine_out_trade_no}`,
//! `POST /combined-orders/{combine_out_trade_no}/close`.
//!
//! The checks run in the contract's order: 400 (the body), then the number (200 for the same
//! body, 409 for another), then the sub-orders' numbers (409), then the accounts (400).

use actix_web::{HttpResponse, web};

use super::{ApiError, Authorized, ErrorBody};
use crate::app::App;
use crate::combined::{CombinationView, CombineRequest, Created};
use crate::reconcile::Closing;

#[utoipa::path(post, path = "/combined-orders", tag = "combined orders", request_body = CombineRequest,
    responses(
        (status = 201, description = "Created, with every sub-order", body = CombinationView),
        (status = 200, description = "The same request again: the combination as it is now", body = CombinationView),
        (status = 400, description = "A malformed body, or an unknown or disabled account", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 409, description = "The number with another body, or a sub-order's order_no that exists", body = ErrorBody),
        (status = 503, description = "Database unavailable", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    _: Authorized,
    state: web::Data<App>,
    body: web::Json<CombineRequest>,
) -> Result<HttpResponse, ApiError> {
    let request = body.into_inner();
    let channel = request.validate().map_err(|m| ApiError::BadRequest(m.0))?;
    let (combined, now) = (std::sync::Arc::clone(&state.combined), state.clock.now());
    let expire_after = state.expire_after_secs;
    let created = state
        .detach(async move { combined.create(&request, channel, expire_after, now).await })
        .await?;
    match created {
        Created::Fresh(stored) => Ok(HttpResponse::Created().json(CombinationView::from(&stored))),
        Created::Repeat(stored) => Ok(HttpResponse::Ok().json(CombinationView::from(&stored))),
        Created::OtherRequest => Err(ApiError::Conflict(
            "a combination with this combine_out_trade_no exists with another body".to_owned(),
        )),
        Created::OrderExists(no) => Err(ApiError::Conflict(format!(
            "sub_orders: an order {no} exists already"
        ))),
        Created::BadAccount(why) => Err(ApiError::BadRequest(why)),
    }
}

#[utoipa::path(get, path = "/combined-orders/{combine_out_trade_no}", tag = "combined orders",
    params(("combine_out_trade_no" = String, Path)),
    responses(
        (status = 200, description = "The combination, its status derived from its sub-orders", body = CombinationView),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 404, description = "No such combination", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(
    _: Authorized,
    state: web::Data<App>,
    no: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let combined = std::sync::Arc::clone(&state.combined);
    match state.detach(async move { combined.get(&no).await }).await? {
        Some(stored) => Ok(HttpResponse::Ok().json(CombinationView::from(&stored))),
        None => Err(ApiError::NotFound("no such combination".to_owned())),
    }
}

#[utoipa::path(post, path = "/combined-orders/{combine_out_trade_no}/close", tag = "combined orders",
    description = "Closes the combination as POST /orders/{order_no}/close closes an order: a WeChat combination whole at WeChat first (the combine close, then the combine query decides); an Alipay combination sub-order by sub-order. A sub-order that is or becomes paid has its payment applied (409).",
    params(("combine_out_trade_no" = String, Path)),
    responses(
        (status = 200, description = "Closed now, or already closed", body = CombinationView),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 404, description = "No such combination", body = ErrorBody),
        (status = 409, description = "A sub-order is paid (or became paid, and its payment was applied)", body = ErrorBody),
        (status = 503, description = "The provider could not be asked: the combination stays open; try again", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn close(
    _: Authorized,
    state: web::Data<App>,
    no: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let (combined, reconciler) = (
        std::sync::Arc::clone(&state.combined),
        std::sync::Arc::clone(&state.reconciler),
    );
    let no = no.into_inner();
    let closed = state
        .detach(async move {
            let Some(stored) = combined.get(&no).await? else {
                return Ok(None);
            };
            let closing = reconciler.close_combined(&stored).await?;
            Ok(Some((closing, combined.get(&no).await?)))
        })
        .await?;
    let Some((closing, Some(after))) = closed else {
        return Err(ApiError::NotFound("no such combination".to_owned()));
    };
    let view = CombinationView::from(&after);
    if view.sub_orders.iter().any(|s| {
        matches!(
            s.status,
            crate::order::OrderStatus::Paid | crate::order::OrderStatus::Refunded
        )
    }) {
        return Err(ApiError::Conflict(format!(
            "the combination is {}: a paid sub-order is never closed",
            view.status
        )));
    }
    match closing {
        Closing::Pending => Err(ApiError::Unavailable(
            "the provider could not be asked to close the combination; it stays open: try again"
                .to_owned(),
        )),
        Closing::Done(_) if view.status == "CLOSED" => Ok(HttpResponse::Ok().json(view)),
        Closing::Done(_) => Err(ApiError::Unavailable(format!(
            "the combination is {} after the close; try again",
            view.status
        ))),
    }
}
