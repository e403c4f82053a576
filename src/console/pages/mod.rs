//! The console's pages, one module each: its routes and its place in [`NAV`].

mod anomalies;
mod certificates;
mod dead;
mod merchants;
mod orders;
mod receipt;
mod reconcile;
mod refused;
mod transfers;

use actix_web::{HttpResponse, web};

use super::auth::{Viewer, see_other};

/// The navigation, in the order on-call looks: is anything refused, is money arriving that
/// no order expects (or leaving that no transfer sent), is the outbox draining, what orders
/// and transfers did, did the day balance, are the keys fresh.
pub const NAV: &[(&str, &str)] = &[
    (refused::PATH, refused::TITLE),
    (anomalies::PATH, anomalies::TITLE),
    (dead::PATH, dead::TITLE),
    (orders::PATH, orders::TITLE),
    (transfers::PATH, transfers::TITLE),
    (reconcile::PATH, reconcile::TITLE),
    (certificates::PATH, certificates::TITLE),
    (merchants::PATH, merchants::TITLE),
];

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/admin/console", web::get().to(home));
    refused::routes(cfg);
    receipt::routes(cfg);
    anomalies::routes(cfg);
    dead::routes(cfg);
    orders::routes(cfg);
    transfers::routes(cfg);
    reconcile::routes(cfg);
    certificates::routes(cfg);
    merchants::routes(cfg);
}

/// The console opens on the refused deliveries.
async fn home(_: Viewer) -> HttpResponse {
    see_other(refused::PATH)
}

/// How many rows a list shows.
const LIST_LIMIT: i64 = 100;

/// A query parameter given empty (an untouched filter field) is no filter.
fn given(value: &Option<String>) -> Option<String> {
    value
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}
