//! Payment anomalies: money the providers say arrived that no order expected as it came
//! (amount mismatch, paid after close, a second transaction…), newest first; then transfer
//! anomalies: money the providers say left that no transfer here sent as it went.

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
    let (rows, transfers) = state
        .detach(async move {
            Ok((
                store.recent_anomalies(LIST_LIMIT).await?,
                store.recent_transfer_anomalies(LIST_LIMIT).await?,
            ))
        })
        .await?;
    let body = html! {
        h2 { "Payments" }
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
        h2 { "Transfers" }
        @if transfers.is_empty() {
            p.empty { "No transfer anomaly recorded." }
        } @else {
            p.muted { code { "UNKNOWN_TRANSFER" } ": money left that paynotify did not send (docs/operations.md, \"A transfer nobody started\")." }
            table #transfer-anomalies {
                thead { tr { th { "Recorded (UTC)" } th { "Transfer" } th { "Reason" } th { "Key" } th { "Message" } } }
                tbody {
                    @for a in &transfers {
                        @let reason = a.payload.0.get("reason").and_then(|r| r.as_str()).unwrap_or("");
                        tr {
                            td { (at(a.created_at)) }
                            td {
                                @if reason == "UNKNOWN_TRANSFER" {
                                    code { (a.out_bill_no) }
                                } @else {
                                    a href={ "/admin/console/transfers/" (a.out_bill_no) } { (a.out_bill_no) }
                                }
                            }
                            td.fail { code { (reason) } }
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
