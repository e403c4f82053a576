//! `GET /healthz` (the process runs) and `GET /readyz` (a database writer answers and can
//! commit now; Redis and the relay sink are reported).

use actix_web::{HttpResponse, web};
use serde_json::json;

use crate::app::App;
use crate::store::{DatabaseState, DatabaseStatus};

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
    /// `up`; `down` (nothing answers); `failing_over` (no writer answers while
    /// `database.url` lists several hosts, or the server answers but is read-only, in
    /// recovery or shutting down); `degraded` (a commit has waited longer than
    /// `database.sync_wait_alert_ms` for a synchronous standby or a semi-sync
    /// acknowledgement).
    pub database: String,
    /// The database server in use as `host:port` (never credentials); `null` for SQLite or
    /// when no writer answers.
    pub database_host: Option<String>,
    /// `up`, `down` or `disabled`.
    pub redis: String,
    /// `up` or `down`: whether the relay sink (`relay.sink`) can take events now. A sink
    /// that is down never makes the service unready: the outbox keeps the events.
    pub sink: String,
}

/// 200 when a database writer answers and can commit now, 503 otherwise (down, failing
/// over, or commits waiting for a synchronous standby: a payment cannot be acknowledged
/// now). Neither Redis nor the relay sink makes the service unready: correctness does not
/// depend on them.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "A database writer answers", body = Readiness),
        (status = 503, description = "The database is down, failing over or degraded", body = Readiness)))]
pub async fn readyz(state: web::Data<App>) -> HttpResponse {
    let store = state.store.clone();
    let database = state
        .detach(async move { Ok(store.readiness().await) })
        .await
        .unwrap_or_else(|e: crate::store::StoreError| {
            tracing::warn!(error = %e, "readiness: database check did not finish");
            DatabaseStatus {
                state: DatabaseState::Down,
                host: None,
            }
        });
    let database_up = database.state == DatabaseState::Up;
    let redis = match state.intake.gate() {
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
        "database": database.state.as_str(),
        "database_host": database.host,
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
pub async fn metrics(state: web::Data<App>) -> HttpResponse {
    let m = &state.metrics;
    state.merchants.observe().await;
    let store = state.store.clone();
    // The outbox's statement is the scrape's database check, as `/readyz`'s ping is its own.
    match state
        .detach(async move { store.outbox_stats().await })
        .await
    {
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
    let store = state.store.clone();
    match state
        .detach(async move { store.semi_sync_active().await })
        .await
    {
        Ok(active) => m
            .database_semi_sync_active
            .set(active.map_or(-1, i64::from)),
        Err(e) => tracing::warn!(error = %e, "metrics: semi-sync state not refreshed"),
    }
    m.sink_up.set(i64::from(state.sink.is_up().await));
    m.pool(state.store.pool_status());
    let groups = state.store.group_stats();
    m.groups(groups.groups, groups.payments, groups.failed);
    let open = state.intake.gate().is_some_and(|g| g.breaker_open());
    m.gate_breaker_open.set(i64::from(open));
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(m.render())
}
