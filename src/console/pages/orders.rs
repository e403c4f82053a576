//! Recent orders, of one status or all, newest first; or one order by its number.

use actix_web::{HttpResponse, web};
use maud::html;
use serde::Deserialize;

use super::{LIST_LIMIT, NAV, given};
use crate::app::App;
use crate::console::auth::Viewer;
use crate::console::error::ConsoleError;
use crate::console::html::{at, at_opt, yuan};
use crate::console::layout::page;
use crate::order::OrderStatus;

pub const PATH: &str = "/admin/console/orders";
pub const TITLE: &str = "Orders";

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(PATH, web::get().to(list));
}

#[derive(Deserialize)]
struct Filters {
    status: Option<String>,
    order_no: Option<String>,
}

async fn list(
    viewer: Viewer,
    state: web::Data<App>,
    query: web::Query<Filters>,
) -> Result<HttpResponse, ConsoleError> {
    let status = match given(&query.status) {
        None => None,
        Some(s) => Some(OrderStatus::parse(&s).ok_or_else(|| {
            ConsoleError::BadRequest(format!(
                "status: WAIT_PAY, PAID, REFUNDED or CLOSED, not {s:?}"
            ))
        })?),
    };
    let (store, order_no) = (state.store.clone(), given(&query.order_no));
    let rows = state
        .detach(async move {
            match order_no {
                Some(no) => Ok(store
                    .order(&no)
                    .await?
                    .into_iter()
                    .filter(|o| status.is_none_or(|s| o.status == s))
                    .collect()),
                None => store.recent_orders(status, LIST_LIMIT).await,
            }
        })
        .await?;
    let body = html! {
        form.filters method="get" action=(PATH) {
            div {
                label for="status" { "Status" }
                select #status name="status" {
                    option value="" { "any" }
                    @for s in OrderStatus::ALL {
                        option value=(s.as_str()) selected[status == Some(s)] { (s.as_str()) }
                    }
                }
            }
            div { label for="order_no" { "Order" } input #order_no name="order_no" value=[query.order_no.as_deref()]; }
            button type="submit" { "Show" }
        }
        @if rows.is_empty() {
            p.empty { "No such order." }
        } @else {
            table #orders {
                thead { tr {
                    th { "Order" } th { "Status" } th { "Amount" } th { "Refunded" } th { "Channel" }
                    th { "Transaction" } th { "Created (UTC)" } th { "Paid" } th { "Closed" }
                } }
                tbody {
                    @for o in &rows {
                        tr {
                            td { code { (o.order_no) } }
                            td { (o.status.as_str()) }
                            td.num { (yuan(o.amount_fen)) " " (o.currency) }
                            td.num { (yuan(o.refunded_fen)) }
                            td { (o.channel.as_deref().unwrap_or("")) }
                            td { code { (o.transaction_id.as_deref().unwrap_or("")) } }
                            td { (at(o.created_at)) }
                            td { (at_opt(o.paid_at)) }
                            td { (at_opt(o.closed_at)) }
                        }
                    }
                }
            }
        }
    };
    Ok(page(&viewer, NAV, PATH, TITLE, body))
}
