//! The daemon's HTTP endpoints: `/metrics`, `/healthz`, `/readyz`, `/nodes`, `/nodes/NAME`,
//! `/guards`, `/whoami`.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::report::NodeReport;
use crate::status::{ReportRequest, Shared};

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/nodes", get(nodes))
        .route("/nodes/{name}", get(node))
        .route("/guards", get(guards))
        .route(crate::whoami::PATH, get(whoami))
        .with_state(shared)
}

/// Serves until `stop` turns true.
pub async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let app = router(shared);
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "HTTP server failed");
    }
}

async fn metrics(State(s): State<Arc<Shared>>) -> Response {
    // Whether this instance may write is a deadline: read it now, not as of the last pass.
    let leadership = s
        .leadership
        .read()
        .ok()
        .and_then(|l| l.as_ref().and_then(|l| l.read().ok().map(|l| l.clone())));
    s.metrics.set_leadership(leadership.as_ref());
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
        .into_response()
}

/// Alive: the decision loop completed a pass recently (a wedged loop fails this).
async fn healthz(State(s): State<Arc<Shared>>) -> Response {
    if s.loop_alive() || !s.synced.load(std::sync::atomic::Ordering::Relaxed) {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "decision loop has not run recently\n",
        )
            .into_response()
    }
}

/// Ready: the node cache is synced and the API server answers the watches.
async fn readyz(State(s): State<Arc<Shared>>) -> Response {
    if s.ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else if !s.synced.load(std::sync::atomic::Ordering::Relaxed) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "node cache not synced yet\n",
        )
            .into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "Kubernetes API not reachable: watches are failing\n",
        )
            .into_response()
    }
}

/// How long a report request waits for the decision loop.
const REPORT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Reports as the decision loop renders them now: one node's, or every node's.
async fn ask_reports(s: &Shared, node: Option<String>) -> Result<Vec<NodeReport>, Response> {
    let busy = |why: &str| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({ "error": why })),
        )
            .into_response()
    };
    let (reply, answer) = tokio::sync::oneshot::channel();
    s.reports
        .try_send(ReportRequest { node, reply })
        .map_err(|_| busy("the decision loop has too many report requests waiting; try again"))?;
    match tokio::time::timeout(REPORT_WAIT, answer).await {
        Ok(Ok(reports)) => Ok(reports),
        Ok(Err(_)) => Err(busy("the decision loop is stopping")),
        Err(_) => Err(busy(&format!(
            "the decision loop did not answer within {}s",
            REPORT_WAIT.as_secs()
        ))),
    }
}

async fn nodes(State(s): State<Arc<Shared>>) -> Response {
    match ask_reports(&s, None).await {
        Ok(reports) => axum::Json(reports).into_response(),
        Err(busy) => busy,
    }
}

async fn node(State(s): State<Arc<Shared>>, Path(name): Path<String>) -> Response {
    let report = match ask_reports(&s, Some(name.clone())).await {
        Ok(mut reports) => reports.pop(),
        Err(busy) => return busy,
    };
    match report {
        Some(r) => axum::Json(r).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(serde_json::json!({
                "error": format!("node {name:?} is not in oobfence's cache (datacenter {})", s.datacenter)
            })),
        )
            .into_response(),
    }
}

/// What holds fences back, as of the last pass: the pause, the view, each scope's counts,
/// storm and freeze, and the fences of the budget window.
async fn guards(State(s): State<Arc<Shared>>) -> Response {
    let Ok(calm) = s.calm.read() else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let scopes: Vec<serde_json::Value> = calm
        .scopes
        .iter()
        .map(|(scope, st)| {
            serde_json::json!({
                "scope": scope.label(),
                "nodes": st.count.nodes,
                "unhealthy": st.count.unhealthy,
                "sources_read": st.count.sources_read,
                "sources_failing": st.count.sources_failing,
                "storm_since": st.storm_since,
                "storm_ended": st.storm_ended,
                "frozen_since": st.frozen_since,
                "thawed": st.thawed,
            })
        })
        .collect();
    axum::Json(serde_json::json!({
        "datacenter": s.datacenter,
        "standby": calm.standby,
        "paused_by": calm.pause.by,
        "view_stale": calm.stale,
        "view_recovered": calm.view_recovered,
        "leases": calm.leases.0,
        "leases_late": calm.leases_late,
        "leases_stale": calm.leases.1,
        "lease_storm_since": calm.lease_storm_since,
        "scopes": scopes,
        "fences_in_budget_window": calm.fences.iter().map(|(at, uid)| serde_json::json!({"at": at, "uid": uid})).collect::<Vec<_>>(),
    }))
    .into_response()
}

/// Who this daemon is: a command checks it before it believes anything else served here.
async fn whoami(State(s): State<Arc<Shared>>) -> Response {
    match s.whoami.read().ok().and_then(|w| w.clone()) {
        Some(who) => axum::Json(who).into_response(),
        None => (StatusCode::SERVICE_UNAVAILABLE, "starting\n").into_response(),
    }
}
