//! Merchant transfers, of one status or all, newest first; a transfer's page with what its
//! provider last said, its events, and a cancel where WeChat can still take one.

use std::sync::Arc;

use actix_web::{HttpRequest, HttpResponse, web};
use maud::{Markup, html};
use serde::Deserialize;

use super::{LIST_LIMIT, NAV, given};
use crate::app::App;
use crate::console::auth::{CsrfForm, Viewer, see_other};
use crate::console::error::ConsoleError;
use crate::console::html::{at, at_opt, yuan};
use crate::console::layout::{page, post_button};
use crate::outbox::status;
use crate::transfer::TransferStatus;
use crate::transfers::{Cancelled, TransferView, Transfers};

pub const PATH: &str = "/admin/console/transfers";
pub const TITLE: &str = "Transfers";

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(PATH, web::get().to(list))
        .route(
            "/admin/console/transfers/{out_bill_no}",
            web::get().to(show),
        )
        .route(
            "/admin/console/transfers/{out_bill_no}/cancel",
            web::post().to(cancel),
        );
}

fn link(out_bill_no: &str) -> String {
    // A stored out_bill_no is letters and digits: nothing to encode.
    format!("{PATH}/{out_bill_no}")
}

#[derive(Deserialize)]
struct Filters {
    status: Option<String>,
    out_bill_no: Option<String>,
}

async fn list(
    viewer: Viewer,
    state: web::Data<App>,
    query: web::Query<Filters>,
) -> Result<HttpResponse, ConsoleError> {
    let status = match given(&query.status) {
        None => None,
        Some(s) => Some(TransferStatus::parse(&s).ok_or_else(|| {
            ConsoleError::BadRequest(format!(
                "status: PROCESSING, WAIT_USER_CONFIRM, SUCCESS, FAIL or CANCELLED, not {s:?}"
            ))
        })?),
    };
    let (transfers, out_bill_no) = (Arc::clone(&state.transfers), given(&query.out_bill_no));
    let rows = state
        .detach(async move {
            match out_bill_no {
                Some(no) => Ok(transfers
                    .get(&no)
                    .await?
                    .into_iter()
                    .filter(|t| status.is_none_or(|s| t.status == s))
                    .collect()),
                None => transfers.list(status, LIST_LIMIT).await,
            }
        })
        .await?;
    let body = html! {
        form.filters method="get" action=(PATH) {
            div {
                label for="status" { "Status" }
                select #status name="status" {
                    option value="" { "all" }
                    @for s in TransferStatus::ALL {
                        option value=(s.as_str()) selected[status == Some(s)] { (s.as_str()) }
                    }
                }
            }
            div { label for="out_bill_no" { "Transfer" } input #out_bill_no name="out_bill_no" value=[query.out_bill_no.as_deref()]; }
            button type="submit" { "Show" }
        }
        @if rows.is_empty() {
            p.empty { "No such transfer." }
        } @else {
            table #transfers {
                thead { tr {
                    th { "Transfer" } th { "Status" } th { "Amount" } th { "Channel" } th { "Account" }
                    th { "Payee" } th { "Provider state" } th { "Created (UTC)" } th { "Finished" }
                } }
                tbody {
                    @for t in &rows {
                        tr {
                            td { a href=(link(&t.out_bill_no)) { code { (t.out_bill_no) } } }
                            td.fail[t.status == TransferStatus::Fail] { (t.status.as_str()) }
                            td.num { (yuan(t.amount_fen)) }
                            td { (t.channel) }
                            td { code { (t.account) } }
                            td { code { (t.payee.to_string()) } }
                            td { (t.provider_state.as_deref().unwrap_or("")) }
                            td { (at(t.created_at)) }
                            td { (at_opt(t.finished_at)) }
                        }
                    }
                }
            }
        }
    };
    Ok(page(&viewer, NAV, PATH, TITLE, body))
}

#[derive(Deserialize)]
struct Shown {
    cancel: Option<String>,
}

async fn show(
    viewer: Viewer,
    state: web::Data<App>,
    out_bill_no: web::Path<String>,
    shown: web::Query<Shown>,
) -> Result<HttpResponse, ConsoleError> {
    let (store, no) = (state.store.clone(), out_bill_no.into_inner());
    let found = state
        .detach(async move {
            let Some(row) = store.transfer(&no).await? else {
                return Ok(None);
            };
            let events = store
                .transfer_events(&row.out_bill_no, &row.channel, row.created_at)
                .await?;
            Ok(Some((row, events)))
        })
        .await?;
    let Some((row, events)) = found else {
        return Err(ConsoleError::NotFound("no such transfer".to_owned()));
    };
    let cancellable = Transfers::cancellable(&row);
    let (attempts, next_call) = (row.attempts, row.next_attempt_at);
    let t = TransferView::from(row);
    let action = format!("{}/cancel", link(&t.out_bill_no));
    let title = format!("Transfer {}", t.out_bill_no);
    let body = html! {
        @match shown.cancel.as_deref() {
            Some("sent") => p.notice role="status" #cancel-outcome {
                "WeChat accepted the cancel (" code { "CANCELING" } "): " code { "CANCELLED" }
                " and its event come through the query or the notification."
            },
            Some("already") => p.notice role="status" #cancel-outcome { "Already CANCELLED: nothing sent." },
            _ => {},
        }
        table.facts #transfer {
            tr { th { "Status" } td.fail[t.status == TransferStatus::Fail] { (t.status.as_str()) } }
            tr { th { "Amount" } td { (yuan(t.amount_fen)) " (" (t.amount_fen) " fen)" } }
            tr { th { "Channel / account" } td { (t.channel) " " code { (t.account) } } }
            tr { th { "Payee" } td { code { (t.payee.to_string()) } } }
            tr { th { "Remark" } td { (t.remark) } }
            tr { th { "Provider state" } td {
                @match &t.provider_state {
                    Some(state) => code { (state) },
                    None => span.muted { "none: the provider has not answered; the job sends it again under the same number" },
                }
            } }
            tr { th { "Provider bill no" } td { code { (t.provider_bill_no.as_deref().unwrap_or("")) } } }
            tr { th { "package_info" } td { code { (t.package_info.as_deref().unwrap_or("")) } } }
            tr { th { "Fail reason" } td.fail { (t.fail_reason.as_deref().unwrap_or("")) } }
            tr { th { "Created (UTC)" } td { (at(t.created_at)) } }
            tr { th { "Updated" } td { (at(t.updated_at)) } }
            tr { th { "Finished" } td { (at_opt(t.finished_at)) } }
            tr { th { "Calls / next" } td {
                (attempts) @if !t.status.is_final() { " · next " (at(next_call)) }
            } }
        }
        p { (cancel_control(&viewer, &action, cancellable)) }
        h2 { "Events" }
        @if events.is_empty() {
            p.empty { "No event: none is written before the transfer is final or an anomaly is raised (sent ones are kept retention.keep_days)." }
        } @else {
            table #events {
                thead { tr { th { "Id" } th { "Created (UTC)" } th { "Topic" } th { "Key" } th { "Delivery" } th { "Payload" } } }
                tbody {
                    @for m in &events {
                        tr {
                            td.num { (m.id) }
                            td { (at(m.created_at)) }
                            td.fail[m.topic == "TRANSFER_ANOMALY"] { code { (m.topic) } }
                            td { code { (m.biz_key) } }
                            td { (delivery(m.status)) }
                            td { pre { (serde_json::to_string_pretty(&m.payload.0).unwrap_or_default()) } }
                        }
                    }
                }
            }
        }
    };
    Ok(page(&viewer, NAV, PATH, &title, body))
}

/// The cancel button, or why there is none.
fn cancel_control(viewer: &Viewer, action: &str, cancellable: Result<(), String>) -> Markup {
    match cancellable {
        Ok(()) => html! {
            (post_button(viewer, action, "Cancel"))
            " " span.muted { "Asks WeChat to cancel it; possible until the user confirms." }
        },
        Err(why) => html! { span.muted #no-cancel { "No cancel: " (why) "." } },
    }
}

fn delivery(status: i16) -> &'static str {
    match status {
        status::PENDING => "pending",
        status::SENT => "sent",
        status::DEAD => "dead",
        _ => "",
    }
}

async fn cancel(
    req: HttpRequest,
    viewer: Viewer,
    state: web::Data<App>,
    out_bill_no: web::Path<String>,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, ConsoleError> {
    viewer.check_form(&req, &form.csrf)?;
    let (transfers, no) = (Arc::clone(&state.transfers), out_bill_no.into_inner());
    let cancelled = state
        .detach(async move { Ok(transfers.cancel(&no).await) })
        .await??;
    let (view, outcome) = match cancelled {
        Cancelled::Sent(view) => (view, "sent"),
        Cancelled::Already(view) => (view, "already"),
    };
    tracing::info!(out_bill_no = %view.out_bill_no, outcome, "transfer cancel asked from the console");
    Ok(see_other(&format!(
        "{}?cancel={outcome}",
        link(&view.out_bill_no)
    )))
}
