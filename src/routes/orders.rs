//! The internal orders API: create (with `Idempotency-Key`), read, close.

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};

use super::{ApiError, Authorized, ErrorBody, error_body};
use crate::app::App;
use crate::channel::Provider;
use crate::notice::{ChannelId, Digest};
use crate::order::NewOrder;
use crate::order::Order;
use crate::reconcile::Closing;
use crate::store::ledger::CloseResult;
use crate::store::orders::{CreateOutcome, CreateResult, IdempotencyKey, StoredResponse};

const MAX_ORDER_NO: usize = crate::notice::max_len::ORDER_NO;
const MAX_SUBJECT: usize = 256;
const MAX_IDEMPOTENCY_KEY: usize = 255;
/// Ten trillion yuan: far above any real order, far below where sums of fen could overflow.
const MAX_AMOUNT_FEN: i64 = 1_000_000_000_000_000;
pub use crate::order::MAX_EXPIRE_AFTER_SECS;

#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateOrderRequest {
    pub order_no: String,
    pub amount_fen: i64,
    #[serde(default = "default_currency")]
    pub currency: String,
    #[serde(default)]
    pub subject: String,
    pub expire_after_secs: Option<u64>,
    /// The WeChat Pay merchant this order is paid through: only it is asked about the order
    /// (`[reconcile]`). Without either id every merchant/app with API credentials is asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wechat_mchid: Option<String>,
    /// The Alipay app this order is paid through, as `wechat_mchid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alipay_app_id: Option<String>,
}

/// A stored answer as the Redis gate keeps it (the database keeps the same in
/// `idempotency_key`; Redis only spares the round trip).
#[derive(Debug, Serialize, Deserialize)]
struct CachedAnswer {
    request: String,
    status: u16,
    body: String,
}

fn default_currency() -> String {
    "CNY".to_owned()
}

impl CreateOrderRequest {
    /// Each field that may name a provider account, by its name in the request: the
    /// provider whose [`Provider::order_field`] it is owns the account.
    fn named_accounts(&self) -> [(&'static str, Option<&String>); 2] {
        [
            ("wechat_mchid", self.wechat_mchid.as_ref()),
            ("alipay_app_id", self.alipay_app_id.as_ref()),
        ]
    }

    /// The accounts the order names, each on the channel of the provider whose field named
    /// it; 400 for an id that provider has not configured.
    fn accounts(
        &self,
        providers: &[Arc<dyn Provider>],
    ) -> Result<Vec<(ChannelId, String)>, ApiError> {
        let mut accounts = Vec::new();
        for (field, id) in self.named_accounts() {
            let Some(id) = id else { continue };
            let provider = providers.iter().find(|p| p.order_field() == field);
            match provider {
                Some(p) if p.has_account(id) => accounts.push((p.channel(), id.clone())),
                Some(p) => {
                    return Err(ApiError::BadRequest(format!(
                        "{field}: {id} is not a configured {} merchant/app",
                        p.channel()
                    )));
                }
                // A field no provider of this build claims names nothing that is configured.
                None => {
                    return Err(ApiError::BadRequest(format!(
                        "{field}: {id} is not a configured merchant/app"
                    )));
                }
            }
        }
        Ok(accounts)
    }

    /// Both providers accept `out_trade_no` of letters, digits and `_-|*`; WeChat up to 32
    /// characters, Alipay up to 64.
    fn validate(&self) -> Result<(), ApiError> {
        let bad = |m: &str| Err(ApiError::BadRequest(m.to_owned()));
        let no = &self.order_no;
        if no.is_empty()
            || no.len() > MAX_ORDER_NO
            || !no
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-|*".contains(&b))
        {
            return bad("order_no: 1 to 64 characters of A-Z a-z 0-9 _ - | *");
        }
        if !(1..=MAX_AMOUNT_FEN).contains(&self.amount_fen) {
            return bad("amount_fen: a positive integer (fen), at most 10^15");
        }
        if self.currency.len() != 3 || !self.currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return bad("currency: three upper-case letters, e.g. CNY");
        }
        if self.subject.chars().count() > MAX_SUBJECT {
            return bad("subject: at most 256 characters");
        }
        if let Some(secs) = self.expire_after_secs
            && !(1..=MAX_EXPIRE_AFTER_SECS).contains(&secs)
        {
            return bad("expire_after_secs: between 1 and 2592000");
        }
        for (name, id) in self.named_accounts() {
            if let Some(id) = id
                && (id.is_empty()
                    || id.len() > 32
                    || !id.bytes().all(|b| b.is_ascii_alphanumeric()))
            {
                return Err(ApiError::BadRequest(format!(
                    "{name}: 1 to 32 letters and digits"
                )));
            }
        }
        Ok(())
    }
}

fn idempotency_key(request: &HttpRequest) -> Result<Option<&str>, ApiError> {
    let Some(value) = request.headers().get("Idempotency-Key") else {
        return Ok(None);
    };
    let key = value.to_str().unwrap_or("");
    if key.is_empty()
        || key.len() > MAX_IDEMPOTENCY_KEY
        || !key.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(ApiError::BadRequest(
            "Idempotency-Key: 1 to 255 visible ASCII characters".to_owned(),
        ));
    }
    Ok(Some(key))
}

fn render_create(outcome: &CreateOutcome) -> StoredResponse {
    match outcome {
        CreateOutcome::Created(order) => StoredResponse {
            status: StatusCode::CREATED.as_u16(),
            body: serde_json::to_string(order).unwrap_or_default(),
        },
        CreateOutcome::OrderExists => StoredResponse {
            status: StatusCode::CONFLICT.as_u16(),
            body: error_body("an order with this order_no exists").to_string(),
        },
    }
}

fn stored(response: StoredResponse) -> HttpResponse {
    let status = StatusCode::from_u16(response.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    HttpResponse::build(status)
        .content_type("application/json")
        .body(response.body)
}

#[utoipa::path(post, path = "/orders", tag = "orders", request_body = CreateOrderRequest,
    params(("Idempotency-Key" = Option<String>, Header, description = "A repeat with the same key and body returns the first answer byte for byte")),
    responses(
        (status = 201, description = "Created", body = Order),
        (status = 400, description = "Invalid order", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 409, description = "An order with this order_no exists", body = ErrorBody),
        (status = 422, description = "The key was used with another request", body = ErrorBody),
        (status = 503, description = "Database unavailable", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    _: Authorized,
    state: web::Data<App>,
    request: HttpRequest,
    body: web::Json<CreateOrderRequest>,
) -> Result<HttpResponse, ApiError> {
    body.validate()?;
    let accounts = body.accounts(state.providers())?;
    let key = idempotency_key(&request)?;
    // Same key + same parsed request = a replay, whatever the JSON whitespace or key order.
    let request_digest = Digest::of(serde_json::to_string(&*body).unwrap_or_default().as_bytes());
    let now = state.clock.now();
    let expire_after = body.expire_after_secs.unwrap_or(state.expire_after_secs);
    let new = NewOrder {
        order_no: body.order_no.clone(),
        amount_fen: body.amount_fen,
        currency: body.currency.clone(),
        subject: body.subject.clone(),
        created_at: now,
        expire_at: now.plus_seconds(i64::try_from(expire_after).unwrap_or(i64::MAX / 2)),
        accounts,
        combine_out_trade_no: None,
    };
    if let (Some(gate), Some(key)) = (state.intake.gate(), key)
        && let Some(cached) = gate.idempotent_answer(key).await
        && let Ok(cached) = serde_json::from_str::<CachedAnswer>(&cached)
        && cached.request == request_digest.as_str()
    {
        return Ok(stored(StoredResponse {
            status: cached.status,
            body: cached.body,
        }));
    }
    let store = state.store.clone();
    let owned_key = key.map(str::to_owned);
    let digest = request_digest.clone();
    let created = state
        .detach(async move {
            let idem = owned_key.as_deref().map(|key| IdempotencyKey {
                key,
                request: &digest,
            });
            store.create_order(&new, idem, render_create).await
        })
        .await?;
    match created {
        CreateResult::Fresh(response) | CreateResult::Replayed(response) => {
            if let (Some(gate), Some(key)) = (state.intake.gate(), key) {
                let cached = CachedAnswer {
                    request: request_digest.as_str().to_owned(),
                    status: response.status,
                    body: response.body.clone(),
                };
                if let Ok(text) = serde_json::to_string(&cached) {
                    gate.remember_answer(key, &text).await;
                }
            }
            Ok(stored(response))
        }
        CreateResult::KeyReused => Err(ApiError::Unprocessable(
            "Idempotency-Key was used with a different request".to_owned(),
        )),
    }
}

#[utoipa::path(get, path = "/orders/{order_no}", tag = "orders",
    params(("order_no" = String, Path)),
    responses(
        (status = 200, description = "The order", body = Order),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 404, description = "No such order", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(
    _: Authorized,
    state: web::Data<App>,
    order_no: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let store = state.store.clone();
    match state
        .detach(async move { store.order(&order_no).await })
        .await?
    {
        Some(order) => Ok(HttpResponse::Ok().json(order)),
        None => Err(ApiError::NotFound("no such order".to_owned())),
    }
}

#[utoipa::path(post, path = "/orders/{order_no}/close", tag = "orders",
    description = "Closes the trade at every provider asked about this order (see [reconcile]), then the order. A provider that says the trade is paid has its payment applied instead (409, the order is PAID).",
    params(("order_no" = String, Path)),
    responses(
        (status = 200, description = "Closed now, or already closed", body = Order),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 404, description = "No such order", body = ErrorBody),
        (status = 409, description = "Paid or refunded: never closed; or a sub-order of a WeChat combination, which closes only whole", body = ErrorBody),
        (status = 503, description = "A provider could not be asked to close its trade: the order stays WAIT_PAY; try again", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn close(
    _: Authorized,
    state: web::Data<App>,
    order_no: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let (reconciler, now) = (std::sync::Arc::clone(&state.reconciler), state.clock.now());
    let order_no = order_no.into_inner();
    let closing = state
        .detach(async move {
            let store = reconciler.store();
            let target = store.reconcile_target(&order_no).await?;
            let combination = target
                .as_ref()
                .and_then(|o| o.combine_out_trade_no.as_deref());
            if reconciler
                .wechat_combination_of(combination)
                .await?
                .is_some()
            {
                return Ok(None);
            }
            match target {
                Some(order) if order.status == crate::order::OrderStatus::WaitPay => {
                    reconciler
                        .close(&order, "api", false, &mut Vec::new())
                        .await
                }
                _ => Ok(Closing::Done(
                    store.close_order(&order_no, "api", now).await?,
                )),
            }
            .map(Some)
        })
        .await?;
    let Some(closing) = closing else {
        return Err(ApiError::Conflict(
            "a sub-order of a WeChat combination is closed only with its combination: POST /combined-orders/{combine_out_trade_no}/close".to_owned(),
        ));
    };
    match closing {
        Closing::Done(CloseResult::Closed(order) | CloseResult::AlreadyClosed(order)) => {
            Ok(HttpResponse::Ok().json(order))
        }
        Closing::Done(CloseResult::NotClosable(order)) => Err(ApiError::Conflict(format!(
            "order is {} and cannot be closed",
            order.status.as_str()
        ))),
        Closing::Done(CloseResult::NotFound) => Err(ApiError::NotFound("no such order".to_owned())),
        Closing::Pending => Err(ApiError::Unavailable(
            "a provider could not be asked to close its trade; the order stays WAIT_PAY: try again"
                .to_owned(),
        )),
    }
}
