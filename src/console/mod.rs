//! The console: a few server-rendered pages for the on-call engineer under `/admin/console`
//! — refused deliveries with their `explain` and a re-apply, anomalies, dead letters with a
//! redrive, recent orders by status, merchant transfers with a cancel, the bill and query
//! reconciliation, the platform keys.
//!
//! No JavaScript and nothing from elsewhere: the binary serves every byte, the pages are HTML
//! forms, every value is escaped by the templates (`maud`), and the answers carry a strict
//! `Content-Security-Policy` (`layout`). The same bearer token as the rest of `/admin` lets a
//! request in; a browser signs in with it once and keeps a session cookie (`auth`). Each page
//! is one module of `pages`, with its routes and its entry in the navigation.

mod auth;
mod error;
mod html;
mod layout;
mod pages;
mod store;

use actix_web::web;

pub use auth::Keys;

/// Mounts the console's routes; `keys` sign its sessions and CSRF tokens.
pub fn configure(cfg: &mut web::ServiceConfig, keys: web::Data<Keys>) {
    cfg.app_data(keys);
    auth::routes(cfg);
    html::routes(cfg);
    pages::routes(cfg);
}
