//! The provider accounts: those of the file and those added through `/admin/merchants`, by
//! channel and status, with their platform keys (two or more: a rotation's overlap) and a
//! Disable for an enabled stored account.

use std::sync::Arc;

use actix_web::{HttpRequest, HttpResponse, web};
use maud::html;
use serde::Deserialize;

use super::{NAV, given};
use crate::app::App;
use crate::console::auth::{CsrfForm, Viewer, see_other};
use crate::console::error::ConsoleError;
use crate::console::html::at_opt;
use crate::console::layout::{page, post_button};
use crate::merchants::live::ListFilter;
use crate::merchants::store::Status;
use crate::notice::ChannelId;

pub const PATH: &str = "/admin/console/merchants";
pub const TITLE: &str = "Merchants";
/// How many accounts the page lists.
const PAGE: i64 = 500;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(PATH, web::get().to(list)).route(
        "/admin/console/merchants/{channel}/{account}/disable",
        web::post().to(disable),
    );
}

#[derive(Deserialize)]
struct Filters {
    channel: Option<String>,
    status: Option<String>,
}

async fn list(
    viewer: Viewer,
    state: web::Data<App>,
    query: web::Query<Filters>,
) -> Result<HttpResponse, ConsoleError> {
    let channel = match given(&query.channel) {
        None => None,
        Some(c) => Some(ChannelId::parse(&c).ok_or_else(|| {
            ConsoleError::BadRequest(format!("channel: wechat or alipay, not {c:?}"))
        })?),
    };
    let status = match given(&query.status) {
        None => None,
        Some(s) => Some(Status::parse(&s).ok_or_else(|| {
            ConsoleError::BadRequest(format!("status: enabled or disabled, not {s:?}"))
        })?),
    };
    let merchants = Arc::clone(&state.merchants);
    let rows = state
        .runtime
        .spawn(async move {
            merchants
                .list(ListFilter {
                    channel,
                    status,
                    after: None,
                    limit: PAGE,
                })
                .await
        })
        .await
        .map_err(|e| ConsoleError::Database(e.into()))??;
    let body = html! {
        form.filters method="get" action=(PATH) {
            div {
                label for="channel" { "Channel" }
                select #channel name="channel" {
                    option value="" { "all" }
                    @for c in [ChannelId::Wechat, ChannelId::Alipay] {
                        option value=(c.as_str()) selected[channel == Some(c)] { (c.as_str()) }
                    }
                }
            }
            div {
                label for="status" { "Status" }
                select #status name="status" {
                    option value="" { "all" }
                    @for s in [Status::Enabled, Status::Disabled] {
                        option value=(s.as_str()) selected[status == Some(s)] { (s.as_str()) }
                    }
                }
            }
            button type="submit" { "Show" }
        }
        @if rows.is_empty() {
            p.empty { "No such account." }
        } @else {
            table #merchants {
                thead { tr {
                    th { "Channel" } th { "Account" } th { "Mode" } th { "Provider" } th { "Source" }
                    th { "Status" } th { "Platform keys" } th { "API" } th { "Version" } th { "Changed (UTC)" } th { "" }
                } }
                tbody {
                    @for m in &rows {
                        tr {
                            td { (m.channel) }
                            td { code { (m.account) } }
                            td { (m.mode) }
                            td { @if let Some(sp) = &m.sp_account { code { (sp) } } }
                            td { (m.source) }
                            td.fail[m.status == "disabled"] { (m.status) }
                            td {
                                @for serial in &m.platform_serials { code { (serial) } " " }
                                @if m.platform_serials.len() > 1 { span.muted { "(rotation overlap)" } }
                            }
                            td { @if m.has_api_credentials { "yes" } @else if m.has_app_auth_token { "token" } @else { "no" } }
                            td.num { (m.keys_version) }
                            td { (at_opt(m.updated_at)) }
                            td {
                                @if m.source == "api" && m.status == "enabled" {
                                    (post_button(&viewer, &format!("{PATH}/{}/{}/disable", m.channel, m.account), "Disable"))
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(page(&viewer, NAV, PATH, TITLE, body))
}

async fn disable(
    req: HttpRequest,
    viewer: Viewer,
    state: web::Data<App>,
    path: web::Path<(String, String)>,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, ConsoleError> {
    viewer.check_form(&req, &form.csrf)?;
    let (channel, account) = path.into_inner();
    let merchants = Arc::clone(&state.merchants);
    state
        .runtime
        .spawn(async move { merchants.disable(&channel, &account).await })
        .await
        .map_err(|e| ConsoleError::Database(e.into()))??;
    Ok(see_other(PATH))
}
