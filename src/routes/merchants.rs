//! Provider accounts as data: `POST/GET/PATCH/DELETE /admin/merchants`. The merchants room
//! checks and stores; this file reads bodies and queries and turns its errors into statuses.

use actix_web::{HttpResponse, web};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::{ApiError, Authorized, ErrorBody};
use crate::app::App;
use crate::merchants::live::{ListFilter, MerchantError};
use crate::merchants::store::Status;
use crate::merchants::view::{MerchantChange, MerchantView, NewMerchant};
use crate::notice::ChannelId;

/// `GET /admin/merchants`' query, as text: each value is checked with its own message.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    #[serde(default)]
    channel: Option<String>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    after: Option<String>,
    #[serde(default)]
    limit: Option<String>,
}

impl From<MerchantError> for ApiError {
    fn from(error: MerchantError) -> Self {
        match error {
            MerchantError::NoMasterKey => Self::Unavailable(error.to_string()),
            MerchantError::Invalid(why) => Self::BadRequest(why.to_string()),
            MerchantError::NotFound(why) => Self::NotFound(why),
            MerchantError::Conflict(why) => Self::Conflict(why),
            MerchantError::Store(e) => Self::Database(e),
            MerchantError::Sealing(why) => {
                tracing::error!(error = %why, "account keys not sealed or opened");
                Self::Internal(why)
            }
        }
    }
}

/// A JSON body read field by field: the error names the field (`keys.apiv3_key: …`).
fn body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut json = serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(&mut json).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            ApiError::BadRequest(format!("a JSON object: {}", e.inner()))
        } else {
            ApiError::BadRequest(format!("{path}: {}", e.inner()))
        }
    })
}

#[utoipa::path(post, path = "/admin/merchants", tag = "merchants",
    description = "Adds a provider account (a WeChat merchant or sub-merchant, an Alipay app or authorizing merchant). Every key is parsed before anything is stored; the keys are stored only sealed under secrets.master_key, and no answer shows them. Live on this instance before the answer, on the others within merchants.reload_secs.",
    request_body = NewMerchant,
    responses(
        (status = 201, description = "Added", body = MerchantView),
        (status = 400, description = "A missing or malformed field or key, an unknown mode, a partner_sub whose sp_account is not an enabled keyed account, keys on a WeChat partner_sub; the error names the field", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 409, description = "The account exists (in the file or stored, disabled ones included)", body = ErrorBody),
        (status = 503, description = "secrets.master_key is not set, or the database is unavailable", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    _: Authorized,
    state: web::Data<App>,
    bytes: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let new: NewMerchant = body(&bytes)?;
    let merchants = std::sync::Arc::clone(&state.merchants);
    // To its end even if the caller hangs up: the row and the book change together.
    let view = state
        .runtime
        .spawn(async move { merchants.create(new).await })
        .await
        .map_err(|e| ApiError::Database(e.into()))??;
    Ok(HttpResponse::Created().json(view))
}

#[utoipa::path(get, path = "/admin/merchants", tag = "merchants",
    description = "Every account, from the file (source config) and stored (source api), sorted by (channel, account).",
    params(
        ("channel" = Option<String>, Query, description = "wechat or alipay"),
        ("status" = Option<String>, Query, description = "enabled or disabled"),
        ("after" = Option<String>, Query, description = "The last account of the previous page (with channel)"),
        ("limit" = Option<i64>, Query, description = "1 to 10000, default 1000")),
    responses(
        (status = 200, description = "The accounts", body = Vec<MerchantView>),
        (status = 400, description = "A bad query value", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    _: Authorized,
    state: web::Data<App>,
    query: web::Query<ListQuery>,
) -> Result<HttpResponse, ApiError> {
    let query = query.into_inner();
    let channel = match query.channel.as_deref() {
        None => None,
        Some(c) => Some(
            ChannelId::parse(c)
                .ok_or_else(|| ApiError::BadRequest("channel: wechat or alipay".into()))?,
        ),
    };
    let status = match query.status.as_deref() {
        None => None,
        Some(s) => Some(
            Status::parse(s)
                .ok_or_else(|| ApiError::BadRequest("status: enabled or disabled".into()))?,
        ),
    };
    let limit = match query.limit.as_deref() {
        None => 1000,
        Some(l) => l
            .parse::<i64>()
            .ok()
            .filter(|l| (1..=10_000).contains(l))
            .ok_or_else(|| ApiError::BadRequest("limit: 1 to 10000".into()))?,
    };
    let views = state
        .merchants
        .list(ListFilter {
            channel,
            status,
            after: query.after,
            limit,
        })
        .await?;
    Ok(HttpResponse::Ok().json(views))
}

#[utoipa::path(get, path = "/admin/merchants/{channel}/{account}", tag = "merchants",
    params(("channel" = String, Path), ("account" = String, Path)),
    responses(
        (status = 200, description = "The account", body = MerchantView),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 404, description = "No such account", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(
    _: Authorized,
    state: web::Data<App>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (channel, account) = path.into_inner();
    Ok(HttpResponse::Ok().json(state.merchants.get(&channel, &account).await?))
}

#[utoipa::path(patch, path = "/admin/merchants/{channel}/{account}", tag = "merchants",
    description = "Rotates keys and changes settings: each key given replaces that key (null removes it); platform_keys given replaces the whole list (send the old and the new key to overlap them). \"status\":\"enabled\" re-enables. Bumps keys_version.",
    params(("channel" = String, Path), ("account" = String, Path)),
    request_body = MerchantChange,
    responses(
        (status = 200, description = "Changed", body = MerchantView),
        (status = 400, description = "A change of channel, account, mode or sp_account, or a bad key", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 404, description = "No such account", body = ErrorBody),
        (status = 409, description = "A file account, or changed by another request meanwhile", body = ErrorBody),
        (status = 503, description = "secrets.master_key is not set, or the database is unavailable", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn update(
    _: Authorized,
    state: web::Data<App>,
    path: web::Path<(String, String)>,
    bytes: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let (channel, account) = path.into_inner();
    let change: MerchantChange = body(&bytes)?;
    let merchants = std::sync::Arc::clone(&state.merchants);
    let view = state
        .runtime
        .spawn(async move { merchants.update(&channel, &account, change).await })
        .await
        .map_err(|e| ApiError::Database(e.into()))??;
    Ok(HttpResponse::Ok().json(view))
}

#[utoipa::path(delete, path = "/admin/merchants/{channel}/{account}", tag = "merchants",
    description = "Disables the account: it verifies nothing and is asked nothing; its row, orders and callbacks stay. A repeat answers 200 unchanged.",
    params(("channel" = String, Path), ("account" = String, Path)),
    responses(
        (status = 200, description = "Disabled", body = MerchantView),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 404, description = "No such account", body = ErrorBody),
        (status = 409, description = "A file account, or the sp_account of enabled accounts", body = ErrorBody),
        (status = 503, description = "secrets.master_key is not set, or the database is unavailable", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn disable(
    _: Authorized,
    state: web::Data<App>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (channel, account) = path.into_inner();
    let merchants = std::sync::Arc::clone(&state.merchants);
    let view = state
        .runtime
        .spawn(async move { merchants.disable(&channel, &account).await })
        .await
        .map_err(|e| ApiError::Database(e.into()))??;
    Ok(HttpResponse::Ok().json(view))
}
