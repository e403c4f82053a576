//! Payment anomalies: money the providers say arrived that no order expected as it came
//! (amount mismatch, paid after close, a second transaction…), newest first.

use actix_web::{HttpResponse, web};
use maud::html;

use super::{LIST_LIMIT, NAV};
use crate::app::App;
use crate::console::auth::Viewer;
use crate::console::error::ConsoleError;
use crate::console::html::at;
use crate::console::layout::page;

pub const PATH: &str = "/admin/console/anomalies";
pub const TITLE: &str = "Anomalies";

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(PATH, web::get().to(list));
}

async fn list(viewer: Viewer, state: web::Data<App>) -> Result<HttpResponse, ConsoleError> {
    let store = state.store.clone();
    let rows = state
        .detach(async move { store.recent_anomalies(LIST_LIMIT).await })
        .await?;
    let body = html! {
        @if rows.is_empty() {
            p.empty { "No anomaly recorded." }
        } @else {
            table #anomalies {
                thead { tr { th { "Recorded (UTC)" } th { "Order" } th { "Reason" } th { "Key" } th { "Message" } } }
                tbody {
                    @for a in &rows {
                        tr {
                            td { (at(a.created_at)) }
                            td { a href={ "/admin/console/orders?order_no=" (form_urlencoded::byte_serialize(a.order_no.as_bytes()).collect::<String>()) } { (a.order_no) } }
                            td { code { (a.payload.0.get("reason").and_then(|r| r.as_str()).unwrap_or("")) } }
                            td { code { (a.biz_key) } }
                            td { pre { (serde_json::to_string_pretty(&a.payload.0).unwrap_or_default()) } }
                        }
                    }
                }
            }
        }
    };
    Ok(page(&viewer, NAV, PATH, TITLE, body))
}
