//! Reconciliation: the day's bill reports (balanced, mismatched with each difference, or
//! unavailable and why), and asking the providers about one order now.

use actix_web::{HttpRequest, HttpResponse, web};
use maud::html;
use serde::Deserialize;

use super::{NAV, given};
use crate::app::App;
use crate::console::auth::Viewer;
use crate::console::error::ConsoleError;
use crate::console::layout::{csrf_field, page};
use crate::reconcile::Reconciled;

pub const PATH: &str = "/admin/console/reconcile";
pub const TITLE: &str = "Reconciliation";

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(PATH, web::get().to(show))
        .route(PATH, web::post().to(ask));
}

#[derive(Deserialize)]
struct Day {
    date: Option<String>,
}

async fn show(
    viewer: Viewer,
    state: web::Data<App>,
    day: web::Query<Day>,
) -> Result<HttpResponse, ConsoleError> {
    render(&viewer, &state, given(&day.date), None).await
}

#[derive(Deserialize)]
struct Ask {
    #[serde(default)]
    csrf: String,
    order_no: String,
}

async fn ask(
    req: HttpRequest,
    viewer: Viewer,
    state: web::Data<App>,
    form: web::Form<Ask>,
) -> Result<HttpResponse, ConsoleError> {
    viewer.check_form(&req, &form.csrf)?;
    let order_no = form.order_no.trim().to_owned();
    if order_no.is_empty() {
        return Err(ConsoleError::BadRequest("order_no: required".to_owned()));
    }
    let reconciler = std::sync::Arc::clone(&state.reconciler);
    let said = state
        .detach(async move { Ok(reconciler.reconcile_order(order_no).await) })
        .await??;
    render(&viewer, &state, None, Some(said)).await
}

async fn render(
    viewer: &Viewer,
    state: &web::Data<App>,
    date: Option<String>,
    said: Option<Reconciled>,
) -> Result<HttpResponse, ConsoleError> {
    let date = match date {
        Some(d) => chrono::NaiveDate::parse_from_str(&d, "%Y-%m-%d")
            .map_err(|_| ConsoleError::BadRequest(format!("date: YYYY-MM-DD, not {d:?}")))?,
        None => state.bills.yesterday(state.clock.now()),
    }
    .format("%Y-%m-%d")
    .to_string();
    let (store, day) = (state.store.clone(), date.clone());
    let reports = state
        .detach(async move { store.bill_reports(&day, None).await })
        .await?;
    let body = html! {
        @if let Some(r) = &said {
            h2 { "What the providers said about " code { (r.order_no) } }
            table #said {
                thead { tr { th { "Channel" } th { "Account" } th { "Call" } th { "Answer" } th { "Detail" } th { "Ledger" } } }
                tbody {
                    @for s in &r.providers {
                        tr {
                            td { (s.channel.as_str()) } td { code { (s.account) } } td { (s.call) }
                            td { code { (s.answer) } } td { (s.detail.as_deref().unwrap_or("")) }
                            td { (s.ledger.unwrap_or("")) }
                        }
                    }
                }
            }
            p { "The order is now " strong { (r.status.as_str()) } "." }
        }
        h2 { "Ask the providers about an order" }
        form.filters method="post" action=(PATH) {
            (csrf_field(viewer))
            div { label for="order_no" { "Order" } input #order_no name="order_no" required; }
            button type="submit" { "Query now" }
            span.muted { "A paid answer is applied through the ledger, as its notification would be." }
        }
        h2 { "Bills of " (date) }
        form.filters method="get" action=(PATH) {
            div { label for="date" { "Bill date" } input #date name="date" type="date" value=(date); }
            button type="submit" { "Show" }
        }
        @if reports.is_empty() {
            p.empty { "No bill was reconciled for " (date) "." }
        } @else {
            @for r in &reports {
                section.report {
                    h2 { (r.channel.as_str()) " " code { (r.account) } ": " (r.status.as_str()) }
                    pre { (r.to_string()) }
                }
            }
        }
    };
    Ok(page(viewer, NAV, PATH, TITLE, body))
}
