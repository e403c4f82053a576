//! `GET /healthz` (the process runs) and `GET /readyz` (the database answers; Redis and the
//! relay sink are reported).

use actix_web::{HttpResponse, web};
use serde_json::json;

use super::AppState;
use super::detach;

#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "The process runs", body = Object, example = json!({"status": "ok"}))))]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "status": "ok" }))
}

/// The body of `GET /readyz`.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Readiness {
    /// `ready` or `unready`.
    pub status: String,
    /// `up` or `down`.
    pub database: String,
    /// `up`, `down` or `disabled`.
    pub redis: String,
    /// `up` or `down`: whether the relay sink (`relay.sink`) can take events now. A sink
    /// that is down never makes the service unready: the outbox keeps the events.
    pub sink: String,
}

/// 200 when the database answers, 503 otherwise. Neither Redis nor the relay sink makes the
/// service unready: correctness does not depend on them.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "The database answers", body = Readiness),
        (status = 503, description = "The database does not answer", body = Readiness)))]
pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let store = state.store.clone();
    let database_up = match detach(&state, async move { store.ping().await }).await {
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
    let sink = if state.sink.is_up().await {
        "up"
    } else {
        "down"
    };
    let body = json!({
        "status": if database_up { "ready" } else { "unready" },
        "database": if database_up { "up" } else { "down" },
        "redis": redis,
        "sink": sink,
    });
    if database_up {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

/// `GET /metrics`: Prometheus text. Outbox and pool gauges are read at scrape time.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain", body = String)))]
pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    let m = &state.metrics;
    let store = state.store.clone();
    // The outbox's statement is the scrape's database check, as `/readyz`'s ping is its own.
    match detach(&state, async move { store.outbox_stats().await }).await {
        Ok(stats) => {
            m.outbox(
                stats.pending,
                stats.dead,
                stats.oldest_pending_secs(state.clock.now()),
            );
            m.database_up.set(1);
        }
        Err(e) => {
            tracing::warn!(error = %e, "metrics: outbox gauges not refreshed");
            m.database_up.set(0);
        }
    }
    m.sink_up.set(i64::from(state.sink.is_up().await));
    m.pool(state.store.pool_status());
    let groups = state.store.group_stats();
    m.groups(groups.groups, groups.payments, groups.failed);
    let open = state.gate.as_ref().is_some_and(|g| g.breaker_open());
    m.gate_breaker_open.set(i64::from(open));
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(m.render())
}
