//! The daily bill reconciliation's endpoints: run it now, or read the stored reports.

use actix_web::{HttpResponse, web};
use chrono::NaiveDate;
use serde::Deserialize;

use super::{ApiError, Authorized, ErrorBody};
use crate::app::App;
use crate::bills::RunError;
use crate::bills::report::Report;
use crate::notice::ChannelId;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct BillQuery {
    /// The bill date, a provider-local day: `YYYY-MM-DD`.
    pub date: String,
    /// `wechat` or `alipay`; every channel when absent.
    pub channel: Option<String>,
}

impl BillQuery {
    fn parsed(&self) -> Result<(NaiveDate, Option<ChannelId>), ApiError> {
        let date = NaiveDate::parse_from_str(&self.date, "%Y-%m-%d")
            .ok()
            .filter(|d| d.format("%Y-%m-%d").to_string() == self.date)
            .ok_or_else(|| {
                ApiError::BadRequest(format!("date: YYYY-MM-DD, not {:?}", self.date))
            })?;
        let channel = match self.channel.as_deref() {
            None => None,
            Some(c) => Some(ChannelId::parse(c).ok_or_else(|| {
                ApiError::BadRequest(format!("channel: wechat or alipay, not {c:?}"))
            })?),
        };
        Ok((date, channel))
    }
}

#[utoipa::path(post, path = "/admin/bills/reconcile", tag = "operations", params(BillQuery),
    description = "Fetches the providers' bills of the date and compares them with the ledger now (a rerun replaces the stored report): a payment the bill has and the ledger lacks is asked about at the provider and applied when its signed answer says paid; a difference the ledger has is raised once as PAYMENT_ANOMALY (BILL_MISMATCH).",
    responses(
        (status = 200, description = "One report per account compared", body = Vec<Report>),
        (status = 400, description = "Bad date or channel", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 409, description = "A run of that date and channel is going on now (a retry of this call, the daily job, another instance)", body = ErrorBody),
        (status = 422, description = "No merchant or app of that channel has API credentials", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn reconcile(
    _: Authorized,
    state: web::Data<App>,
    query: web::Query<BillQuery>,
) -> Result<HttpResponse, ApiError> {
    let (date, channel) = query.parsed()?;
    let bills = std::sync::Arc::clone(&state.bills);
    // Run to its end even if the caller hangs up: the lease is released by the run itself.
    let reports = state
        .runtime
        .spawn(async move { bills.reconcile(date, channel).await })
        .await
        .map_err(|e| ApiError::Database(crate::store::StoreError::Task(e)))?
        .map_err(|e| match e {
            RunError::Store(e) => ApiError::Database(e),
            RunError::Busy { .. } => ApiError::Conflict(e.to_string()),
            RunError::NoSource(_) => ApiError::Unprocessable(e.to_string()),
        })?;
    Ok(HttpResponse::Ok().json(reports))
}

#[utoipa::path(get, path = "/admin/bills", tag = "operations", params(BillQuery),
    responses(
        (status = 200, description = "The stored reports of the date", body = Vec<Report>),
        (status = 400, description = "Bad date or channel", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn reports(
    _: Authorized,
    state: web::Data<App>,
    query: web::Query<BillQuery>,
) -> Result<HttpResponse, ApiError> {
    let (date, channel) = query.parsed()?;
    let day = date.format("%Y-%m-%d").to_string();
    let store = state.store.clone();
    let reports = state
        .detach(async move { store.bill_reports(&day, channel).await })
        .await?;
    Ok(HttpResponse::Ok().json(reports))
}
