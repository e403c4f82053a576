//! Dead letters: outbox messages the relay gave up on, with the last error and a redrive
//! (pending again, attempts back to 0).

use actix_web::{HttpRequest, HttpResponse, web};
use maud::html;
use serde::Deserialize;

use super::{LIST_LIMIT, NAV};
use crate::app::App;
use crate::console::auth::{CsrfForm, Viewer, see_other};
use crate::console::error::ConsoleError;
use crate::console::html::at;
use crate::console::layout::{page, post_button};
use crate::outbox::status;

pub const PATH: &str = "/admin/console/dead";
pub const TITLE: &str = "Dead letters";

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(PATH, web::get().to(list))
        .route("/admin/console/dead/{id}/redrive", web::post().to(redrive));
}

#[derive(Deserialize)]
struct Shown {
    redriven: Option<i64>,
}

async fn list(
    viewer: Viewer,
    state: web::Data<App>,
    shown: web::Query<Shown>,
) -> Result<HttpResponse, ConsoleError> {
    let store = state.store.clone();
    let rows = state
        .detach(async move { store.messages(Some(status::DEAD), LIST_LIMIT).await })
        .await?;
    let body = html! {
        @if let Some(id) = shown.redriven {
            p.notice role="status" { "Message " (id) " is pending again; the relay sends it next." }
        }
        @if rows.is_empty() {
            p.empty { "No dead letter." }
        } @else {
            table #dead {
                thead { tr { th { "Id" } th { "Created (UTC)" } th { "Topic" } th { "Key" } th { "Attempts" } th { "Last error" } th {} } }
                tbody {
                    @for m in &rows {
                        tr {
                            td.num { (m.id) }
                            td { (at(m.created_at)) }
                            td { code { (m.topic) } }
                            td { code { (m.biz_key) } }
                            td.num { (m.attempts) }
                            td.fail { (m.last_error.as_deref().unwrap_or("")) }
                            td { (post_button(&viewer, &format!("/admin/console/dead/{}/redrive", m.id), "Redrive")) }
                        }
                    }
                }
            }
        }
    };
    Ok(page(&viewer, NAV, PATH, TITLE, body))
}

async fn redrive(
    req: HttpRequest,
    viewer: Viewer,
    state: web::Data<App>,
    id: web::Path<i64>,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, ConsoleError> {
    viewer.check_form(&req, &form.csrf)?;
    let (id, store, now) = (id.into_inner(), state.store.clone(), state.clock.now());
    if state
        .detach(async move { store.redrive(id, now).await })
        .await?
    {
        tracing::info!(id, "dead message redriven from the console");
        return Ok(see_other(&format!("{PATH}?redriven={id}")));
    }
    Err(ConsoleError::NotFound(format!(
        "message {id} is not a dead letter (redriven already, or no such message)"
    )))
}
