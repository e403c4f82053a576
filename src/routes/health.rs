//! `GET /healthz` (the process runs) and `GET /readyz` (the database answers).

use actix_web::{HttpResponse, web};
use serde_json::json;

use crate::startup::AppState;

pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "status": "ok" }))
}

/// 200 when the database answers, 503 otherwise. Redis never makes the service unready:
/// correctness does not depend on it.
pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let database_up = match state.store.ping().await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, "readiness: database down");
            false
        }
    };
    let redis = match &state.gate {
        None => "disabled",
        Some(gate) if gate.is_up().await => "up",
        Some(_) => "down",
    };
    let body = json!({
        "status": if database_up { "ready" } else { "unready" },
        "database": if database_up { "up" } else { "down" },
        "redis": redis,
    });
    if database_up {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}
