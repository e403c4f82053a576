//! Operations endpoints behind the bearer token: the outbox by status, redriving a dead
//! message, every callback recorded for an order, and the receipts of notify requests with
//! their re-apply.

use actix_web::{HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

use super::{ApiError, Authorized, ErrorBody};
use crate::app::App;
use crate::channel::platform::KnownKey;
use crate::outbox::status;
use crate::receipts::reapply::Reapplied;
use crate::receipts::store::{ReceiptFilter, StoredReceipt};
use crate::receipts::{decode_body, printable};
use crate::reconcile::{ReconcileOrderError, Reconciled};
use crate::store::outbox::StoredMessage;
use crate::time::Timestamp;

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
    state: web::Data<App>,
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
    let messages = state
        .detach(async move { store.messages(wanted, limit).await })
        .await?;
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
    state: web::Data<App>,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    let (store, now) = (state.store.clone(), state.clock.now());
    if state
        .detach(async move { store.redrive(id, now).await })
        .await?
    {
        tracing::info!(id, "dead message redriven");
        return Ok(HttpResponse::Ok().json(json!({ "id": id, "status": status::PENDING })));
    }
    let store = state.store.clone();
    match state
        .detach(async move { store.message_status(id).await })
        .await?
    {
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
    state: web::Data<App>,
    query: web::Query<CallbacksQuery>,
) -> Result<HttpResponse, ApiError> {
    let (store, order_no) = (state.store.clone(), query.order_no.clone());
    let callbacks = state
        .detach(async move { store.callbacks_of(&order_no).await })
        .await?;
    Ok(HttpResponse::Ok().json(json!({
        "order_no": query.order_no,
        "payments": callbacks.payments,
        "refunds": callbacks.refunds,
        "statuses": callbacks.statuses,
    })))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ReceiptsQuery {
    /// `wechat`, `alipay`, …
    pub channel: Option<String>,
    /// What became of it: `bad_signature`, `stale`, `bad_request`, `wrong_event_type`,
    /// `undecryptable`, `too_large`, `body_timeout`, or a ledger outcome (`applied`, `unknown_order`, …).
    pub outcome: Option<String>,
    /// The `out_trade_no` decoded from it (refused requests before decryption have none).
    pub order_no: Option<String>,
    /// RFC 3339: received at or after.
    pub since: Option<String>,
    /// 1 to 1000; default 50 (listing) or 100 (bulk re-apply).
    pub limit: Option<i64>,
}

impl ReceiptsQuery {
    /// The filter of this query; `for_reapply`: oldest first and only receipts no re-apply
    /// has touched yet, so that a bulk re-apply repeated goes on to the next ones.
    fn filter(&self, default_limit: i64, for_reapply: bool) -> Result<ReceiptFilter, ApiError> {
        let limit = self.limit.unwrap_or(default_limit);
        if !(1..=1000).contains(&limit) {
            return Err(ApiError::BadRequest("limit: between 1 and 1000".to_owned()));
        }
        let since = match &self.since {
            None => None,
            Some(text) => Some(
                chrono::DateTime::parse_from_rfc3339(text)
                    .map(|t| Timestamp::new(t.with_timezone(&chrono::Utc)))
                    .map_err(|e| ApiError::BadRequest(format!("since: RFC 3339 ({e})")))?,
            ),
        };
        Ok(ReceiptFilter {
            channel: self.channel.clone(),
            outcome: self.outcome.clone(),
            order_no: self.order_no.clone(),
            since,
            limit,
            oldest_first: for_reapply,
            refused_only: false,
            not_reapplied: for_reapply,
        })
    }
}

#[utoipa::path(get, path = "/admin/receipts", tag = "operations", params(ReceiptsQuery),
    responses(
        (status = 200, description = "Receipts of notify requests, newest first", body = Vec<StoredReceipt>),
        (status = 400, description = "Bad since or limit (or an unknown query parameter)", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn receipts(
    _: Authorized,
    state: web::Data<App>,
    query: web::Query<ReceiptsQuery>,
) -> Result<HttpResponse, ApiError> {
    let filter = query.filter(50, false)?;
    let store = state.store.clone();
    let rows = state
        .detach(async move { store.receipts(&filter).await })
        .await?;
    Ok(HttpResponse::Ok().json(rows))
}

#[utoipa::path(get, path = "/admin/receipts/{id}", tag = "operations",
    params(("id" = i64, Path)),
    responses(
        (status = 200, description = "The receipt with its headers, body_b64, and body_text when the body is printable", body = Object),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 404, description = "No such receipt (or purged after receipts.keep_days)", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn receipt(
    _: Authorized,
    state: web::Data<App>,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let receipt = load_receipt(&state, id.into_inner()).await?;
    let body_text = decode_body(&receipt.body_b64).and_then(|b| printable(&b));
    let mut value = serde_json::to_value(&receipt)
        .map_err(|e| ApiError::Unprocessable(format!("receipt not representable: {e}")))?;
    value["body_text"] = body_text.map_or(serde_json::Value::Null, serde_json::Value::String);
    Ok(HttpResponse::Ok().json(value))
}

async fn load_receipt(state: &web::Data<App>, id: i64) -> Result<StoredReceipt, ApiError> {
    let store = state.store.clone();
    state
        .detach(async move { store.receipt(id).await })
        .await?
        .ok_or_else(|| ApiError::NotFound("no such receipt".to_owned()))
}

/// [`App::reapplier`]'s re-apply of one receipt, run to its end even if the caller hangs up.
async fn reapply_receipt(state: &App, receipt: StoredReceipt) -> Result<Reapplied, ApiError> {
    let reapplier = std::sync::Arc::clone(&state.reapplier);
    Ok(state
        .detach(async move { reapplier.reapply(&receipt).await })
        .await?)
}

#[utoipa::path(post, path = "/admin/receipts/{id}/reapply", tag = "operations",
    params(("id" = i64, Path)),
    responses(
        (status = 200, description = "Verified again with the keys configured now (without the timestamp window: the receipt proves when it arrived) and applied through the ledger; `outcome` says what happened", body = Reapplied),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 404, description = "No such receipt", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn reapply(
    _: Authorized,
    state: web::Data<App>,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let receipt = load_receipt(&state, id.into_inner()).await?;
    Ok(HttpResponse::Ok().json(reapply_receipt(&state, receipt).await?))
}

#[utoipa::path(post, path = "/admin/receipts/reapply", tag = "operations", params(ReceiptsQuery),
    responses(
        (status = 200, description = "Each matching receipt not re-applied yet (oldest first, at most `limit`, default 100) re-applied as by /admin/receipts/{id}/reapply: `count`, `outcomes` by outcome, and `results`", body = Object),
        (status = 400, description = "Bad since or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn reapply_many(
    _: Authorized,
    state: web::Data<App>,
    query: web::Query<ReceiptsQuery>,
) -> Result<HttpResponse, ApiError> {
    let filter = query.filter(100, true)?;
    let reapplier = std::sync::Arc::clone(&state.reapplier);
    let done = state
        .detach(async move { reapplier.reapply_many(&filter).await })
        .await?;
    let (results, outcomes) = (done.results, done.outcomes);
    Ok(HttpResponse::Ok().json(json!({
        "count": results.len(),
        "outcomes": outcomes,
        "results": results,
    })))
}

#[utoipa::path(post, path = "/admin/orders/{order_no}/reconcile", tag = "operations",
    description = "Asks every provider account of the order (those it names, else every one with API credentials) now, applies a paid answer through the ledger as its notification would be, and returns what each said.",
    params(("order_no" = String, Path)),
    responses(
        (status = 200, description = "What each provider said and the order's status after", body = Reconciled),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 404, description = "No such order", body = ErrorBody),
        (status = 409, description = "No merchant or app has API credentials", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn reconcile(
    _: Authorized,
    state: web::Data<App>,
    order_no: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(reconcile_order(&state, order_no.into_inner()).await?))
}

/// [`crate::reconcile::Reconciler::reconcile_order`] as the internal API answers it.
async fn reconcile_order(state: &App, order_no: String) -> Result<Reconciled, ApiError> {
    let reconciler = std::sync::Arc::clone(&state.reconciler);
    state
        .detach(async move { Ok(reconciler.reconcile_order(order_no).await) })
        .await?
        .map_err(|e| match e {
            ReconcileOrderError::NoCredentials => ApiError::Conflict(e.to_string()),
            ReconcileOrderError::NoSuchOrder => ApiError::NotFound(e.to_string()),
            ReconcileOrderError::Store(e) => ApiError::Database(e),
        })
}

#[utoipa::path(get, path = "/admin/certificates", tag = "operations",
    description = "Every platform key the channels verify with: configured (platform_keys) and downloaded (GET /v3/certificates), by merchant and serial.",
    responses(
        (status = 200, description = "The keys", body = Vec<KnownKey>),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn certificates(_: Authorized, state: web::Data<App>) -> HttpResponse {
    HttpResponse::Ok().json(state.certificates.keys())
}

#[utoipa::path(post, path = "/admin/certificates/refresh", tag = "operations",
    description = "Downloads the platform certificates of every merchant set to download them, now, and lists the keys as GET /admin/certificates does.",
    responses(
        (status = 200, description = "Every downloading merchant was asked; the keys now", body = Vec<KnownKey>),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 503, description = "A provider could not be asked, or its answer did not verify: the keys known keep working", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn refresh_certificates(
    _: Authorized,
    state: web::Data<App>,
) -> Result<HttpResponse, ApiError> {
    refresh_all_certificates(&state).await?;
    Ok(HttpResponse::Ok().json(state.certificates.keys()))
}

/// Downloads every downloading merchant's platform certificates now, to its end even if the
/// caller hangs up; `Unavailable` naming each that failed (the keys known keep working).
async fn refresh_all_certificates(state: &App) -> Result<(), ApiError> {
    let certificates = std::sync::Arc::clone(&state.certificates);
    state
        .detach(async move { Ok(certificates.refresh_now().await) })
        .await?
        .map_err(|e| ApiError::Unavailable(e.to_string()))
}
