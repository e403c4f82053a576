//! One receipt: what arrived (headers, body as text when printable), every check `explain`
//! makes of it with the order's, and a re-apply.

use actix_web::{HttpRequest, HttpResponse, web};
use maud::html;

use super::NAV;
use crate::app::App;
use crate::console::auth::{CsrfForm, Viewer, see_other};
use crate::console::error::ConsoleError;
use crate::console::html::{at, at_opt};
use crate::console::layout::{page, post_button};
use crate::receipts::explain::{Request, check_order, explain};
use crate::receipts::printable;
use crate::receipts::store::StoredReceipt;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/admin/console/receipts/{id}", web::get().to(show))
        .route(
            "/admin/console/receipts/{id}/reapply",
            web::post().to(reapply),
        );
}

async fn load(state: &web::Data<App>, id: i64) -> Result<StoredReceipt, ConsoleError> {
    let store = state.store.clone();
    state
        .detach(async move { store.receipt(id).await })
        .await?
        .ok_or_else(|| {
            ConsoleError::NotFound(format!(
                "no receipt {id} (never stored, or purged after receipts.keep_days)"
            ))
        })
}

async fn show(
    viewer: Viewer,
    state: web::Data<App>,
    id: web::Path<i64>,
) -> Result<HttpResponse, ConsoleError> {
    let receipt = load(&state, id.into_inner()).await?;
    let report = match Request::from_receipt(&receipt).and_then(|r| explain(state.providers(), r)) {
        Ok(mut report) => {
            let store = state.store.clone();
            let (checked, report) = state
                .detach(async move {
                    let checked = check_order(&mut report, &store).await;
                    Ok((checked, report))
                })
                .await?;
            checked?;
            Ok(report)
        }
        Err(e) => Err(e.to_string()),
    };
    let body_bytes = crate::receipts::decode_body(&receipt.body_b64);
    let headers: Vec<(String, String)> = receipt
        .headers
        .0
        .as_object()
        .into_iter()
        .flatten()
        .flat_map(|(name, values)| {
            let values: Vec<String> = match values {
                serde_json::Value::Array(items) => items
                    .iter()
                    .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
                    .collect(),
                other => vec![other.to_string()],
            };
            values.into_iter().map(move |v| (name.clone(), v))
        })
        .collect();
    let action = format!("/admin/console/receipts/{}/reapply", receipt.id);
    let title = format!("Receipt #{}", receipt.id);
    let body = html! {
        @if let Some(outcome) = &receipt.reapply_outcome {
            p.notice role="status" #reapply-outcome {
                "Last re-applied " (at_opt(receipt.reapplied_at)) " UTC: " code { (outcome) }
            }
        }
        table.facts {
            tr { th { "Received (UTC)" } td { (at(receipt.received_at)) } }
            tr { th { "Channel / route" } td { (receipt.channel) " " (receipt.route.as_deref().unwrap_or("")) } }
            tr { th { "Peer" } td { (receipt.peer.as_deref().unwrap_or("")) } }
            tr { th { "Answered" } td { (receipt.status) " " code { (receipt.outcome) } } }
            tr { th { "Detail" } td #detail { (receipt.detail.as_deref().unwrap_or("")) } }
            tr { th { "Order" } td { (receipt.out_trade_no.as_deref().unwrap_or("")) } }
        }
        p { (post_button(&viewer, &action, "Re-apply")) " "
            span.muted { "Verified again with the keys configured now, at the time it arrived; applied once." } }
        h2 { "explain" }
        @match &report {
            Ok(report) => {
                p.muted { (report.source) }
                table #checks {
                    thead { tr { th { "#" } th { "" } th { "Check" } th { "Found" } } }
                    tbody {
                        @for (i, check) in report.explanation.checks.iter().enumerate() {
                            tr class=(check.verdict.label()) {
                                td.num { (i + 1) } td { (check.verdict.label()) }
                                td { (check.name) } td { (check.detail) }
                            }
                        }
                    }
                }
                @match report.first_failure() {
                    Some(check) => p.fail { "First failing check: " strong { (check.name) } ": " (check.detail) },
                    None => p.pass { "Every check passes." },
                }
            }
            Err(e) => p.error { (e) },
        }
        h2 { "Headers" }
        table #headers { @for (name, value) in &headers { tr { th { (name) } td { code { (value) } } } } }
        h2 { "Body (" (receipt.body_bytes) " bytes)" }
        @match body_bytes.as_deref().and_then(printable) {
            Some(text) => pre #body { (text) },
            None => { p.muted { "Not printable; base64:" } pre #body { (receipt.body_b64) } },
        }
    };
    Ok(page(&viewer, NAV, super::refused::PATH, &title, body))
}

async fn reapply(
    req: HttpRequest,
    viewer: Viewer,
    state: web::Data<App>,
    id: web::Path<i64>,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, ConsoleError> {
    viewer.check_form(&req, &form.csrf)?;
    let receipt = load(&state, id.into_inner()).await?;
    let (reapplier, id) = (std::sync::Arc::clone(&state.reapplier), receipt.id);
    state
        .detach(async move { reapplier.reapply(&receipt).await })
        .await?;
    Ok(see_other(&format!("/admin/console/receipts/{id}")))
}
