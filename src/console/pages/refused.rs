//! Refused deliveries: notify requests answered with something other than success, newest
//! first, each with the first check `explain` finds failing; a re-apply for all of them
//! (after a key was fixed) and, on each receipt's page, for one.

use actix_web::{HttpRequest, HttpResponse, web};
use maud::html;
use serde::{Deserialize, Serialize};

use super::{LIST_LIMIT, NAV, given};
use crate::app::App;
use crate::console::auth::Viewer;
use crate::console::error::ConsoleError;
use crate::console::html::at;
use crate::console::layout::{csrf_field, page};
use crate::receipts::explain::{Request, explain};
use crate::receipts::store::{ReceiptFilter, StoredReceipt};

pub const PATH: &str = "/admin/console/refused";
pub const TITLE: &str = "Refused deliveries";
/// The most a bulk re-apply takes at once (oldest first), as `/admin/receipts/reapply`.
const REAPPLY_LIMIT: i64 = 100;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(PATH, web::get().to(list)).route(
        "/admin/console/refused/reapply",
        web::post().to(reapply_all),
    );
}

#[derive(Debug, Default, Deserialize, Serialize)]
struct Filters {
    channel: Option<String>,
    outcome: Option<String>,
    order_no: Option<String>,
}

impl Filters {
    /// `not_reapplied`: for the bulk re-apply, only those no re-apply has touched yet, so each
    /// click takes the next ones instead of the same oldest again.
    fn filter(&self, limit: i64, oldest_first: bool, not_reapplied: bool) -> ReceiptFilter {
        ReceiptFilter {
            channel: given(&self.channel),
            outcome: given(&self.outcome),
            order_no: given(&self.order_no),
            since: None,
            limit,
            oldest_first,
            refused_only: true,
            not_reapplied,
        }
    }
}

/// The first check `explain` finds failing, in words.
fn first_failure(state: &App, receipt: &StoredReceipt) -> String {
    match Request::from_receipt(receipt).and_then(|r| explain(state.providers(), r)) {
        Ok(report) => report.first_failure().map_or_else(
            || "every check passes now".to_owned(),
            |c| format!("{}: {}", c.name, c.detail),
        ),
        Err(e) => e.to_string(),
    }
}

async fn list(
    viewer: Viewer,
    state: web::Data<App>,
    query: web::Query<Filters>,
) -> Result<HttpResponse, ConsoleError> {
    let filter = query.filter(LIST_LIMIT, false, false);
    let store = state.store.clone();
    let rows = state
        .detach(async move { store.receipts(&filter).await })
        .await?;
    let body = html! {
        form.filters method="get" action=(PATH) {
            div { label for="channel" { "Channel" } input #channel name="channel" value=[query.channel.as_deref()]; }
            div { label for="outcome" { "Outcome" } input #outcome name="outcome" placeholder="bad_signature" value=[query.outcome.as_deref()]; }
            div { label for="order_no" { "Order" } input #order_no name="order_no" value=[query.order_no.as_deref()]; }
            button type="submit" { "Filter" }
        }
        @if rows.is_empty() {
            p.empty { "No refused delivery is kept (receipts are purged after receipts.keep_days)." }
        } @else {
            form.filters method="post" action="/admin/console/refused/reapply" {
                (csrf_field(&viewer))
                @for (name, value) in [("channel", &query.channel), ("outcome", &query.outcome), ("order_no", &query.order_no)] {
                    @if let Some(value) = value { input type="hidden" name=(name) value=(value); }
                }
                button type="submit" { "Re-apply those not re-applied yet (oldest " (REAPPLY_LIMIT) ")" }
                span.muted { "Each is verified again with the keys configured now, then applied once; one by one from a receipt's page." }
            }
            table #refused {
                thead { tr {
                    th { "Receipt" } th { "Received (UTC)" } th { "Channel" } th { "Answered" }
                    th { "Outcome" } th { "Order" } th { "First failing check" } th { "Re-applied" }
                } }
                tbody {
                    @for r in &rows {
                        tr {
                            td { a href={ "/admin/console/receipts/" (r.id) } { "#" (r.id) } }
                            td { (at(r.received_at)) }
                            td { (r.channel) br; span.muted.route { (r.route.as_deref().unwrap_or("")) } }
                            td.num { (r.status) }
                            td { code { (r.outcome) } @if let Some(d) = &r.detail { br; span.muted { (d) } } }
                            td { (r.out_trade_no.as_deref().unwrap_or("")) }
                            td.fail { (first_failure(&state, r)) }
                            td { (r.reapply_outcome.as_deref().unwrap_or("")) }
                        }
                    }
                }
            }
        }
    };
    Ok(page(&viewer, NAV, PATH, TITLE, body))
}

#[derive(Deserialize)]
struct ReapplyForm {
    #[serde(default)]
    csrf: String,
    #[serde(flatten)]
    filters: Filters,
}

async fn reapply_all(
    req: HttpRequest,
    viewer: Viewer,
    state: web::Data<App>,
    form: web::Form<ReapplyForm>,
) -> Result<HttpResponse, ConsoleError> {
    viewer.check_form(&req, &form.csrf)?;
    let filter = form.filters.filter(REAPPLY_LIMIT, true, true);
    let reapplier = std::sync::Arc::clone(&state.reapplier);
    let results = state
        .detach(async move { reapplier.reapply_many(&filter).await })
        .await?
        .results;
    tracing::info!(
        count = results.len(),
        "refused receipts re-applied from the console"
    );
    let body = html! {
        p.notice role="status" { (results.len()) " receipts re-applied, oldest first." }
        @if results.len() as i64 == REAPPLY_LIMIT {
            p { "There may be more: re-apply again for the next " (REAPPLY_LIMIT) "." }
        }
        table #reapplied {
            thead { tr { th { "Receipt" } th { "Outcome" } th { "Order" } th { "Detail" } } }
            tbody {
                @for r in &results {
                    tr {
                        td { a href={ "/admin/console/receipts/" (r.id) } { "#" (r.id) } }
                        td { code { (r.outcome) } }
                        td { (r.out_trade_no.as_deref().unwrap_or("")) }
                        td { (r.detail.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
        p { a href=(PATH) { "Back to the refused deliveries" } }
    };
    Ok(page(&viewer, NAV, PATH, "Re-applied", body))
}
