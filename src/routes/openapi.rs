//! The OpenAPI 3 document of every endpoint, generated from the handlers' annotations
//! (served at `/openapi.json`; `docs/openapi.json` is checked against it by a test).

use actix_web::HttpResponse;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{ErrorBody, admin, bills, combined, health, merchants, orders, refunds, transfers};
use crate::providers::PROVIDERS;

struct BearerToken;

impl Modify for BearerToken {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "paynotify", description = "WeChat Pay and Alipay notifications, applied exactly once."),
    paths(
        orders::create,
        orders::get,
        orders::close,
        refunds::start,
        refunds::list,
        transfers::start,
        transfers::get,
        transfers::cancel,
        combined::create,
        combined::get,
        combined::close,
        merchants::create,
        merchants::list,
        merchants::get,
        merchants::update,
        merchants::disable,
        admin::messages,
        admin::redrive,
        admin::callbacks,
        admin::receipts,
        admin::receipt,
        admin::reapply,
        admin::reapply_many,
        admin::reconcile,
        admin::certificates,
        admin::refresh_certificates,
        bills::reconcile,
        bills::reports,
        health::healthz,
        health::readyz,
        health::metrics,
        document,
    ),
    components(schemas(ErrorBody, health::Readiness, crate::reconcile::Reconciled, crate::reconcile::Said, crate::channel::platform::KnownKey, crate::channel::platform::KeyOrigin, crate::bills::report::Report, crate::refunds::RefundView, crate::order::RefundStatus, refunds::RefundRequest, crate::transfers::TransferView, crate::transfer::TransferStatus, crate::transfer::SceneReportInfo, transfers::TransferRequest, crate::merchants::view::NewMerchant, crate::merchants::view::MerchantChange, crate::merchants::view::MerchantView, crate::combined::CombineRequest, crate::combined::SubOrderRequest, crate::combined::CombinationView, crate::combined::SubOrderView)),
    modifiers(&BearerToken)
)]
pub struct ApiDoc;

/// The whole document: these endpoints and every provider's notify routes.
pub fn document_of_everything() -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    for provider in &PROVIDERS {
        doc.merge((provider.openapi)());
    }
    doc
}

/// The document as pretty JSON, exactly as `docs/openapi.json` holds it.
pub fn pretty_json() -> String {
    document_of_everything()
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

#[utoipa::path(get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "This document", body = Object)))]
pub async fn document() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(pretty_json())
}
