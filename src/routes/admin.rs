//! Operations endpoints behind the bearer token: the outbox by status, redriving a dead
//! message, and every callback recorded for an order.

use actix_web::{HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

use super::{ApiError, Authorized};
use crate::outbox::status;
use crate::startup::AppState;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessagesQuery {
    pub status: Option<String>,
    pub limit: Option<i64>,
}

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
    Ok(HttpResponse::Ok().json(state.store.messages(wanted, limit).await?))
}

pub async fn redrive(
    _: Authorized,
    state: web::Data<AppState>,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    if state.store.redrive(id, state.clock.now()).await? {
        tracing::info!(id, "dead message redriven");
        return Ok(HttpResponse::Ok().json(json!({ "id": id, "status": status::PENDING })));
    }
    match state.store.message_status(id).await? {
        None => Err(ApiError::NotFound("no such message".to_owned())),
        Some(_) => Err(ApiError::Conflict(
            "only a dead message can be redriven".to_owned(),
        )),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallbacksQuery {
    pub order_no: String,
}

pub async fn callbacks(
    _: Authorized,
    state: web::Data<AppState>,
    query: web::Query<CallbacksQuery>,
) -> Result<HttpResponse, ApiError> {
    let (payments, refunds) = state.store.callbacks_of(&query.order_no).await?;
    Ok(HttpResponse::Ok().json(json!({
        "order_no": query.order_no,
        "payments": payments,
        "refunds": refunds,
    })))
}
