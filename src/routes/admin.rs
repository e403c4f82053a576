//! Operations endpoints behind the bearer token: the outbox by status, redriving a dead
//! message, and every callback recorded for an order.

use actix_web::{HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::{ApiError, Authorized, ErrorBody, detach};
use crate::outbox::status;
use crate::store::outbox::StoredMessage;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct MessagesQuery {
    /// `pending`, `sent` or `dead`; all when absent.
    pub status: Option<String>,
    /// 1 to 1000, default 50.
    pub limit: Option<i64>,
}

#[utoipa::path(get, path = "/admin/messages", tag = "operations", params(MessagesQuery),
    responses(
        (status = 200, description = "Outbox rows, newest first", body = Vec<StoredMessage>),
        (status = 400, description = "Bad status or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn messages(
    _: Authorized,
    state: web::Data<AppState>,
    query: web::Query<MessagesQuery>,
) -> Result<HttpResponse, ApiError> {
    let wanted = match query.status.as_deref() {
        None => None,
        Some("pending") => Some(status::PENDING),
        Some("sent") => Some(status::SENT),
        Some("dead") => Some(status::DEAD),
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "status: pending, sent or dead, not {other:?}"
            )));
        }
    };
    let limit = query.limit.unwrap_or(50);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::BadRequest("limit: between 1 and 1000".to_owned()));
    }
    let store = state.store.clone();
    let messages = detach(&state, async move { store.messages(wanted, limit).await }).await?;
    Ok(HttpResponse::Ok().json(messages))
}

#[utoipa::path(post, path = "/admin/messages/{id}/redrive", tag = "operations",
    params(("id" = i64, Path)),
    responses(
        (status = 200, description = "Pending again with attempts = 0", body = Object),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 404, description = "No such message", body = ErrorBody),
        (status = 409, description = "Not a dead message", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn redrive(
    _: Authorized,
    state: web::Data<AppState>,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    let (store, now) = (state.store.clone(), state.clock.now());
    if detach(&state, async move { store.redrive(id, now).await }).await? {
        tracing::info!(id, "dead message redriven");
        return Ok(HttpResponse::Ok().json(json!({ "id": id, "status": status::PENDING })));
    }
    let store = state.store.clone();
    match detach(&state, async move { store.message_status(id).await }).await? {
        None => Err(ApiError::NotFound("no such message".to_owned())),
        Some(_) => Err(ApiError::Conflict(
            "only a dead message can be redriven".to_owned(),
        )),
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct CallbacksQuery {
    pub order_no: String,
}

#[utoipa::path(get, path = "/admin/callbacks", tag = "operations", params(CallbacksQuery),
    responses(
        (status = 200, description = "Every payment, refund and status callback of the order (`statuses`: recorded without a state change, e.g. Alipay TRADE_CLOSED)", body = Object),
        (status = 400, description = "`order_no` missing (or an unknown query parameter)", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn callbacks(
    _: Authorized,
    state: web::Data<AppState>,
    query: web::Query<CallbacksQuery>,
) -> Result<HttpResponse, ApiError> {
    let (store, order_no) = (state.store.clone(), query.order_no.clone());
    let callbacks = detach(&state, async move { store.callbacks_of(&order_no).await }).await?;
    Ok(HttpResponse::Ok().json(json!({
        "order_no": query.order_no,
        "payments": callbacks.payments,
        "refunds": callbacks.refunds,
        "statuses": callbacks.statuses,
    })))
}
