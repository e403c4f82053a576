//! The platform keys the channels verify with: configured and downloaded, with the days
//! each has left, and a refresh.

use actix_web::{HttpRequest, HttpResponse, web};
use maud::html;

use super::NAV;
use crate::app::App;
use crate::console::auth::{CsrfForm, Viewer, see_other};
use crate::console::error::ConsoleError;
use crate::console::html::at_opt;
use crate::console::layout::{page, post_button};

pub const PATH: &str = "/admin/console/certificates";
pub const TITLE: &str = "Certificates";
/// The alert's threshold (`PaynotifyPlatformCertificateExpiring`): fewer days are marked.
const WARN_DAYS: i64 = 7;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(PATH, web::get().to(list)).route(
        "/admin/console/certificates/refresh",
        web::post().to(refresh),
    );
}

async fn list(viewer: Viewer, state: web::Data<App>) -> HttpResponse {
    let now = state.clock.now().unix_seconds();
    let keys = state.certificates.keys();
    let body = html! {
        p { (post_button(&viewer, "/admin/console/certificates/refresh", "Download now")) " "
            span.muted { "Asks every merchant set to download its platform certificates." } }
        @if keys.is_empty() {
            p.empty { "No platform key is known." }
        } @else {
            table #certificates {
                thead { tr { th { "Channel" } th { "Merchant" } th { "Serial" } th { "Source" } th { "Effective" } th { "Expires (UTC)" } th { "Days left" } th { "Downloaded" } } }
                tbody {
                    @for k in &keys {
                        @let left = k.expire_at.map(|e| (e.unix_seconds() - now).div_euclid(86_400));
                        tr {
                            td { (k.channel.as_str()) }
                            td { code { (k.mchid) } }
                            td { code { (k.serial) } }
                            td { (k.source.as_str()) }
                            td { (at_opt(k.effective_at)) }
                            td { (at_opt(k.expire_at)) }
                            td.num.fail[left.is_some_and(|d| d < WARN_DAYS)] { (left.map(|d| d.to_string()).unwrap_or_default()) }
                            td { (at_opt(k.fetched_at)) }
                        }
                    }
                }
            }
        }
    };
    page(&viewer, NAV, PATH, TITLE, body)
}

async fn refresh(
    req: HttpRequest,
    viewer: Viewer,
    state: web::Data<App>,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, ConsoleError> {
    viewer.check_form(&req, &form.csrf)?;
    let certificates = std::sync::Arc::clone(&state.certificates);
    state
        .detach(async move { Ok(certificates.refresh_now().await) })
        .await??;
    Ok(see_other(PATH))
}
