//! HTTP API: read-only views of every pod's sync state (from the journal), the current render,
//! and health. It reads what the fleet and the renderer publish; it never changes them.
//! Every error is JSON with the right status; secrets never appear (the journal holds none).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::files::FileSet;
use crate::journal::{Journal, JournaledPod, TransitionEntry};

pub mod auth;
pub mod client;
pub mod tls;
pub mod webhook;

/// The render the API shows.
#[derive(Clone, Debug)]
pub struct CurrentRender {
    /// The configuration generation it came from.
    pub generation: i64,
    /// The files.
    pub files: Arc<FileSet>,
}

/// What the API reads; shared with the controller, which fills it.
#[derive(Clone, Default)]
pub struct ApiState {
    /// The journal, when the controller deploys.
    pub journal: Option<Arc<Journal>>,
    /// The last successful render.
    pub current: Arc<RwLock<Option<CurrentRender>>>,
    /// Whether watches are synced and the journal is open.
    pub ready: Arc<AtomicBool>,
    /// Who may read `/api/v1/*` and `/metrics`; `None` only when a flag turned it off.
    pub auth: Option<Arc<auth::KubeAuthorizer>>,
    /// The controller's loop, beating at each turn: liveness fails when it stops.
    pub heartbeat: Heartbeat,
}

/// How long the controller's loop may go without turning before liveness fails: it turns at
/// least once a second (its status tick) when nothing else happens.
pub const LOOP_STALL: Duration = Duration::from_secs(60);

/// When a loop last turned, in milliseconds since the process first asked (0: never yet).
#[derive(Clone, Debug, Default)]
pub struct Heartbeat(Arc<AtomicU64>);

impl Heartbeat {
    /// The loop turned now.
    pub fn beat(&self) {
        self.0.store(u64::try_from(since_start().as_millis()).unwrap_or(u64::MAX).max(1), Ordering::Release);
    }

    /// How long since the loop last turned (`None`: it has not started, which liveness allows:
    /// start-up is the startup probe's to judge).
    pub fn stalled_for(&self) -> Option<Duration> {
        self.stalled_at(since_start())
    }

    fn stalled_at(&self, now: Duration) -> Option<Duration> {
        let last = self.0.load(Ordering::Acquire);
        (last != 0).then(|| now.saturating_sub(Duration::from_millis(last)))
    }
}

/// Time since this process first read the clock for a heartbeat.
fn since_start() -> Duration {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed()
}

impl ApiState {
    /// Publishes a successful render.
    pub fn set_render(&self, generation: i64, files: Arc<FileSet>) {
        if let Ok(mut current) = self.current.write() {
            *current = Some(CurrentRender { generation, files });
        }
    }

    fn current(&self) -> Option<CurrentRender> {
        self.current.read().ok().and_then(|current| current.clone())
    }
}

/// The API's routes, all behind `auth`; health is served on a port of its own
/// ([`health_router`]), so a network policy can open it to probes and nothing else.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/api/v1/pods", get(pods))
        .route("/api/v1/pods/{namespace}/{name}", get(pod))
        .route("/api/v1/config", get(config))
        .route("/api/v1/config/files/{*name}", get(config_file))
        .route("/api/v1/openapi.json", get(|| async { Json(openapi()) }))
        .route("/metrics", get(metrics))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), authorize))
        .fallback(not_found)
        .with_state(state)
}

/// Liveness and readiness, open to all (probes carry no token) and saying nothing else.
pub fn health_router(state: ApiState) -> Router {
    Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz)).fallback(not_found).with_state(state)
}

async fn not_found(uri: axum::http::Uri) -> Response {
    error(StatusCode::NOT_FOUND, format!("no such resource: {}", uri.path()))
}

/// Lets a request through when its bearer token may read the API (or auth is off): 401
/// without a valid token, 403 for a user without the reader role, 503 when the API server
/// cannot review it. The token is never logged.
async fn authorize(
    State(state): State<ApiState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(authorizer) = &state.auth else { return next.run(request).await };
    let token =
        request.headers().get(header::AUTHORIZATION).and_then(|value| value.to_str().ok()).and_then(auth::bearer_token);
    let Some(token) = token else {
        return error(StatusCode::UNAUTHORIZED, "a Kubernetes bearer token is required".into());
    };
    // Metrics are read by Prometheus with its own token; everything else needs haptic's audience.
    let bound = request.uri().path() != "/metrics";
    match authorizer.review(token, bound).await {
        Ok(auth::Decision::Allowed) => next.run(request).await,
        Ok(auth::Decision::Unauthenticated) => {
            error(StatusCode::UNAUTHORIZED, "the bearer token is not valid for this cluster".into())
        }
        Ok(auth::Decision::Forbidden { user }) => error(
            StatusCode::FORBIDDEN,
            format!("{user} may not get {}.{} (the chart's reader role grants it)", auth::RESOURCE, auth::GROUP),
        ),
        Err(failure) => {
            tracing::warn!(error = %failure, "an API request could not be authorized");
            error(StatusCode::SERVICE_UNAVAILABLE, format!("the request could not be authorized: {failure}"))
        }
    }
}

/// Serves the API on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, state: ApiState) -> std::io::Result<()> {
    axum::serve(listener, router(state)).await
}

/// Serves the API over TLS on `listener` until the task is dropped.
pub async fn serve_tls(listener: tokio::net::TcpListener, config: rustls::ServerConfig, state: ApiState) {
    tls::serve(listener, config, router(state), "the HTTP API").await
}

/// Serves health on `listener` until the task is dropped.
pub async fn serve_health(listener: tokio::net::TcpListener, state: ApiState) -> std::io::Result<()> {
    axum::serve(listener, health_router(state)).await
}

/// Binds one of the HTTP listeners (`what`: "the HTTP API", "health"); the error names it.
pub async fn bind(address: SocketAddr, what: &str) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("binding {what} to {address}: {e}")))
}

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(json!({"error": message, "status": status.as_u16()}))).into_response()
}

/// Runs a handler's journal reads on the blocking pool: sled may wait on the disk, and the
/// async workers are shared with deployment and lease renewal.
async fn off_the_async_threads(work: impl FnOnce() -> Response + Send + 'static) -> Response {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|failure| error(StatusCode::INTERNAL_SERVER_ERROR, format!("the request failed: {failure}")))
}

async fn metrics(State(state): State<ApiState>) -> Response {
    off_the_async_threads(move || metrics_now(&state)).await
}

fn metrics_now(state: &ApiState) -> Response {
    use crate::telemetry::metrics::{HeapLabels, StateLabels, metrics};
    let metrics = metrics();
    if let Some(journal) = &state.journal {
        metrics.pods.clear();
        for pod in journal.pods().unwrap_or_default() {
            metrics.pods.get_or_create(&StateLabels { state: pod.state.to_string() }).inc();
        }
        metrics.journal_bytes.set(i64::try_from(journal.size_on_disk()).unwrap_or(i64::MAX));
    }
    if let Some(heap) = crate::memory::heap_figures() {
        for (kind, bytes) in heap.named() {
            metrics.heap_bytes.get_or_create(&HeapLabels { kind }).set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], metrics.encode())
        .into_response()
}

async fn healthz(State(state): State<ApiState>) -> Response {
    match liveness(state.heartbeat.stalled_for()) {
        Ok(()) => Json(json!({"status": "ok"})).into_response(),
        Err(why) => error(StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

/// Alive unless the controller's loop has stalled for longer than [`LOOP_STALL`].
fn liveness(stalled: Option<Duration>) -> Result<(), String> {
    match stalled {
        Some(stalled) if stalled > LOOP_STALL => {
            Err(format!("the controller's loop has not turned for {} s", stalled.as_secs()))
        }
        _ => Ok(()),
    }
}

async fn readyz(State(state): State<ApiState>) -> Response {
    if state.ready.load(Ordering::Acquire) {
        Json(json!({"status": "ready"})).into_response()
    } else {
        error(StatusCode::SERVICE_UNAVAILABLE, "watches are not synced or the journal is not open yet".into())
    }
}

/// A transition as the API shows it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TransitionView {
    seq: u64,
    at: String,
    from: String,
    to: String,
    reason: String,
    error: Option<String>,
    /// The leader term of the replica that wrote it.
    term: u64,
    /// The trace of the reconciliation it belongs to, to look up in the tracing backend.
    trace_id: Option<String>,
}

impl From<&TransitionEntry> for TransitionView {
    fn from(entry: &TransitionEntry) -> Self {
        let at = k8s_openapi::jiff::Timestamp::try_from(entry.at).map(|t| t.to_string()).unwrap_or_default();
        Self {
            seq: entry.seq,
            at,
            from: entry.from.to_string(),
            to: entry.to.to_string(),
            reason: entry.reason.map_or("NotRecorded", |kind| kind.name()).to_owned(),
            error: entry.error.clone(),
            term: entry.term.0,
            trace_id: entry.trace_id.map(|id| id.to_string()),
        }
    }
}

/// A pod as the API shows it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PodView {
    namespace: String,
    name: String,
    uid: String,
    state: String,
    desired_checksums: Option<Vec<FileChecksum>>,
    pushed_checksums: Option<Vec<FileChecksum>>,
    last_transition: TransitionView,
    last_error: Option<String>,
    /// When the pod's next reload, waiting for the pace (`minDeploymentInterval`), may go out.
    reload_paced_until: Option<String>,
    /// HAProxy's version, as the pod last reported it.
    haproxy_version: Option<String>,
    /// The Dataplane API's version, as the pod last reported it.
    dataplane_api_version: Option<String>,
}

#[derive(Serialize)]
struct FileChecksum {
    name: String,
    checksum: String,
}

fn pod_view(pod: &JournaledPod, current: Option<&CurrentRender>, paced: Option<std::time::SystemTime>) -> PodView {
    let checksums = |files: &[(String, crate::files::Checksum)]| {
        files.iter().map(|(name, c)| FileChecksum { name: name.clone(), checksum: c.to_string() }).collect()
    };
    PodView {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        uid: pod.uid.0.clone(),
        state: pod.state.to_string(),
        desired_checksums: current.map(|c| {
            c.files.entries().map(|(name, f)| FileChecksum { name, checksum: f.checksum.to_string() }).collect()
        }),
        pushed_checksums: pod.pushed.as_deref().map(checksums),
        last_transition: TransitionView::from(&pod.last_transition),
        last_error: pod.last_transition.error.clone(),
        reload_paced_until: paced
            .and_then(|until| k8s_openapi::jiff::Timestamp::try_from(until).ok())
            .map(|until| until.to_string()),
        haproxy_version: pod.versions.haproxy.clone(),
        dataplane_api_version: pod.versions.dataplane_api.clone(),
    }
}

fn journal(state: &ApiState) -> Result<&Arc<Journal>, Box<Response>> {
    state.journal.as_ref().ok_or_else(|| {
        Box::new(error(StatusCode::SERVICE_UNAVAILABLE, "this controller deploys to no pod (render only)".into()))
    })
}

async fn pods(State(state): State<ApiState>) -> Response {
    // The journal's pod records are a snapshot in memory: no disk on this path.
    pods_now(&state)
}

fn pods_now(state: &ApiState) -> Response {
    let journal = match journal(state) {
        Ok(journal) => journal,
        Err(response) => return *response,
    };
    match journal.pods() {
        Ok(pods) => {
            let current = state.current();
            let mut views: Vec<PodView> =
                pods.iter().map(|pod| pod_view(pod, current.as_ref(), journal.paced(&pod.uid))).collect();
            views.sort_by(|a, b| (&a.namespace, &a.name, &a.uid).cmp(&(&b.namespace, &b.name, &b.uid)));
            Json(json!({"pods": views})).into_response()
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Paging of a pod's transitions.
#[derive(Deserialize)]
struct Page {
    /// Transitions after this sequence number (0 to i64::MAX, as the document says).
    after: Option<i64>,
    /// At most this many (1 to 1000, default 50).
    limit: Option<usize>,
}

async fn pod(
    State(state): State<ApiState>,
    Path((namespace, name)): Path<(String, String)>,
    page: Result<Query<Page>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(page) = match page {
        Ok(page) => page,
        Err(rejection) => return error(StatusCode::BAD_REQUEST, format!("bad query: {}", rejection.body_text())),
    };
    let after = page.after.unwrap_or(0);
    if after < 0 {
        return error(StatusCode::BAD_REQUEST, format!("after must be 0 or more, not {after}"));
    }
    let limit = page.limit.unwrap_or(50);
    if !(1..=1000).contains(&limit) {
        return error(StatusCode::BAD_REQUEST, format!("limit must be between 1 and 1000, not {limit}"));
    }
    off_the_async_threads(move || pod_now(&state, &namespace, &name, after.unsigned_abs(), limit)).await
}

fn pod_now(state: &ApiState, namespace: &str, name: &str, after: u64, limit: usize) -> Response {
    let journal = match journal(state) {
        Ok(journal) => journal,
        Err(response) => return *response,
    };
    let pods = match journal.pods() {
        Ok(pods) => pods,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    // Several UIDs can share a name over time; the newest record is the pod by that name now.
    let Some(found) =
        pods.iter().filter(|p| p.namespace == namespace && p.name == name).max_by_key(|p| p.last_transition.at)
    else {
        return error(StatusCode::NOT_FOUND, format!("no pod {namespace}/{name} is known"));
    };
    match journal.transitions(&found.uid, after, limit) {
        Ok(transitions) => {
            let next = (transitions.len() == limit).then(|| transitions.last().map(|t| t.seq)).flatten();
            let transitions: Vec<TransitionView> = transitions.iter().map(TransitionView::from).collect();
            let view = pod_view(found, state.current().as_ref(), journal.paced(&found.uid));
            Json(json!({"pod": view, "transitions": transitions, "nextAfter": next})).into_response()
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn config(State(state): State<ApiState>) -> Response {
    match state.current() {
        Some(current) => {
            let files: Vec<_> = current
                .files
                .entries()
                .map(|(name, f)| {
                    json!({"name": name, "size": f.content.len(), "checksum": f.checksum.to_string(), "secret": f.sensitive})
                })
                .collect();
            Json(json!({"generation": current.generation, "files": files})).into_response()
        }
        None => error(StatusCode::NOT_FOUND, "nothing has been rendered yet".into()),
    }
}

async fn config_file(State(state): State<ApiState>, Path(name): Path<String>) -> Response {
    let Some(current) = state.current() else {
        return error(StatusCode::NOT_FOUND, "nothing has been rendered yet".into());
    };
    match current.files.entries().find(|(path, _)| *path == name) {
        // A certificate carries its private key: its checksum is listed, its content never served.
        Some((_, file)) if file.sensitive => {
            error(StatusCode::FORBIDDEN, format!("{name} holds a private key and is not served"))
        }
        Some((_, file)) => {
            // Basic-auth password hashes in userlists are the cluster's secrets: shown redacted.
            let shown = crate::files::redact_password_hashes(&file.content).into_owned();
            ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], shown).into_response()
        }
        None => error(StatusCode::NOT_FOUND, format!("no rendered file {name}")),
    }
}

/// The OpenAPI 3 description of these routes.
pub fn openapi() -> serde_json::Value {
    let error = json!({"$ref": "#/components/schemas/Error"});
    let json_response = |description: &str, schema: serde_json::Value| json!({"description": description, "content": {"application/json": {"schema": schema}}});
    let mut document = json!({
        "openapi": "3.0.3",
        "info": {"title": "haptic", "version": env!("CARGO_PKG_VERSION"),
                 "description": "Read-only views of HAProxy pods' sync state and the current render. \
                     Liveness (/healthz) and readiness (/readyz) are served on the health port, not here."},
        "paths": {
            "/api/v1/pods": {"get": {"responses": {
                "200": json_response("every known pod", json!({"type": "object", "required": ["pods"],
                    "properties": {"pods": {"type": "array", "items": {"$ref": "#/components/schemas/Pod"}}}})),
                "503": json_response("render only", error.clone())}}},
            "/api/v1/pods/{namespace}/{name}": {"get": {
                "parameters": [
                    {"name": "namespace", "in": "path", "required": true, "schema": {"type": "string"}},
                    {"name": "name", "in": "path", "required": true, "schema": {"type": "string"}},
                    {"name": "after", "in": "query", "schema": {"type": "integer", "format": "int64", "minimum": 0,
                        "maximum": i64::MAX}},
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}],
                "responses": {
                    "200": json_response("the pod and a page of its transitions", json!({"type": "object",
                        "required": ["pod", "transitions"], "properties": {
                            "pod": {"$ref": "#/components/schemas/Pod"},
                            "transitions": {"type": "array", "items": {"$ref": "#/components/schemas/Transition"}},
                            "nextAfter": {"type": "integer", "nullable": true}}})),
                    "400": json_response("bad parameters", error.clone()),
                    "404": json_response("unknown pod", error.clone()),
                    "503": json_response("render only", error.clone())}}},
            "/api/v1/config": {"get": {"responses": {
                "200": json_response("the current render", json!({"type": "object", "required": ["generation", "files"],
                    "properties": {"generation": {"type": "integer"}, "files": {"type": "array", "items": {
                        "type": "object", "required": ["name", "size", "checksum", "secret"], "properties": {
                            "name": {"type": "string"}, "size": {"type": "integer"}, "checksum": {"type": "string"},
                            "secret": {"type": "boolean"}}}}}})),
                "404": json_response("nothing rendered yet", error.clone())}}},
            "/api/v1/config/files/{name}": {"get": {
                "parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}],
                "responses": {
                    "200": {"description": "the file", "content": {"text/plain": {"schema": {"type": "string"}}}},
                    "403": json_response("a certificate with its private key: never served", error.clone()),
                    "404": json_response("no such file", error.clone())}}},
            "/api/v1/openapi.json": {"get": {"responses": {"200": json_response("this document", json!({"type": "object"}))}}},
            "/metrics": {"get": {"responses": {"200": {"description": "Prometheus metrics (docs/metrics.md)",
                "content": {"application/openmetrics-text": {"schema": {"type": "string"}}}}}}}
        },
        "components": {"schemas": {
            "Error": {"type": "object", "required": ["error", "status"],
                      "properties": {"error": {"type": "string"}, "status": {"type": "integer"}}},
            "Checksum": {"type": "object", "required": ["name", "checksum"],
                         "properties": {"name": {"type": "string"}, "checksum": {"type": "string"}}},
            "Transition": {"type": "object", "required": ["seq", "at", "from", "to", "reason", "term"], "properties": {
                "seq": {"type": "integer"}, "at": {"type": "string"}, "from": {"type": "string"},
                "to": {"type": "string"}, "reason": {"type": "string"}, "error": {"type": "string", "nullable": true},
                "term": {"type": "integer", "minimum": 0},
                "traceId": {"type": "string", "nullable": true, "pattern": "^[0-9a-f]{32}$"}}},
            "Pod": {"type": "object", "required": ["namespace", "name", "uid", "state", "lastTransition"], "properties": {
                "namespace": {"type": "string"}, "name": {"type": "string"}, "uid": {"type": "string"},
                "state": {"type": "string", "enum": ["Unknown", "Validating", "Syncing", "RuntimePatching", "InSync", "Drifted"]},
                "desiredChecksums": {"type": "array", "nullable": true, "items": {"$ref": "#/components/schemas/Checksum"}},
                "pushedChecksums": {"type": "array", "nullable": true, "items": {"$ref": "#/components/schemas/Checksum"}},
                "lastTransition": {"$ref": "#/components/schemas/Transition"},
                "lastError": {"type": "string", "nullable": true},
                "reloadPacedUntil": {"type": "string", "nullable": true},
                "haproxyVersion": {"type": "string", "nullable": true},
                "dataplaneApiVersion": {"type": "string", "nullable": true}}}
        }}
    });
    // Everything is behind a Kubernetes bearer token (see `authorize`).
    if let Some(paths) = document["paths"].as_object_mut() {
        for item in paths.values_mut() {
            let responses = &mut item["get"]["responses"];
            responses["401"] = json_response("no valid Kubernetes bearer token", error.clone());
            let forbidden = format!("the token's user may not get {}.{}", auth::RESOURCE, auth::GROUP);
            let forbidden = match responses["403"]["description"].as_str() {
                Some(already) => format!("{already}; or {forbidden}"),
                None => forbidden,
            };
            responses["403"] = json_response(&forbidden, error.clone());
            if responses.get("503").is_none() {
                responses["503"] = json_response("the API server cannot review the token now", error.clone());
            }
        }
    }
    document
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::files::RenderedFile;
    use crate::pod::{PodUid, State as PodState};

    async fn start(state: ApiState) -> String {
        let listener = bind("127.0.0.1:0".parse().unwrap(), "the HTTP API").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, state));
        format!("http://{address}")
    }

    async fn start_health(state: ApiState) -> String {
        let listener = bind("127.0.0.1:0".parse().unwrap(), "health").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(serve_health(listener, state));
        format!("http://{address}")
    }

    #[tokio::test]
    async fn health_has_its_own_port_and_the_api_port_serves_none() {
        let (state, _dir) = state_with_a_pod();
        let api = start(state.clone()).await;
        let health = start_health(state.clone()).await;
        let status = |url: String| async move { reqwest::get(url).await.unwrap().status().as_u16() };
        assert_eq!(status(format!("{health}/healthz")).await, 200);
        assert_eq!(status(format!("{health}/readyz")).await, 503);
        state.ready.store(true, Ordering::Release);
        assert_eq!(status(format!("{health}/readyz")).await, 200);
        for path in ["/api/v1/pods", "/metrics", "/api/v1/config"] {
            assert_eq!(status(format!("{health}{path}")).await, 404, "{path} on the health port");
        }
        assert_eq!(status(format!("{api}/healthz")).await, 404, "health on the API port");
    }

    #[tokio::test]
    async fn liveness_fails_when_the_controller_loop_stops_turning() {
        let (state, _dir) = state_with_a_pod();
        let health = start_health(state.clone()).await;
        let status = |url: String| async move { reqwest::get(url).await.unwrap().status().as_u16() };
        assert_eq!(status(format!("{health}/healthz")).await, 200, "not started yet: the startup probe's to judge");
        state.heartbeat.beat();
        assert_eq!(status(format!("{health}/healthz")).await, 200);
        // A loop that last turned at 1 ms, asked about at 30 s and at 61 s.
        let stalled = Heartbeat::default();
        assert_eq!(stalled.stalled_at(Duration::from_secs(61)), None, "never turned: not stalled");
        stalled.0.store(1, Ordering::Release);
        assert!(liveness(stalled.stalled_at(Duration::from_secs(30))).is_ok());
        let why = liveness(stalled.stalled_at(Duration::from_secs(61))).unwrap_err();
        assert!(why.contains("has not turned for 60 s"), "{why}");
    }

    fn state_with_a_pod() -> (ApiState, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let (journal, _) = Journal::open(&dir.path().join("journal"), 100).unwrap();
        for seq in 1..=3 {
            journal
                .commit(&JournaledPod {
                    uid: PodUid("uid-1".into()),
                    namespace: "haptic".into(),
                    name: "haproxy-0".into(),
                    state: PodState::InSync,
                    pushed: Some(vec![("haproxy.cfg".into(), crate::files::Checksum::of(b"x"))]),
                    copy: None,
                    versions: Default::default(),
                    last_transition: TransitionEntry {
                        seq,
                        at: UNIX_EPOCH + Duration::from_secs(1_764_000_000 + seq),
                        from: PodState::Syncing,
                        to: PodState::InSync,
                        reason: Some(crate::pod::EventKind::Pushed),
                        error: None,
                        term: crate::pod::LeaderTerm::default(),
                        trace_id: None,
                    },
                })
                .unwrap();
        }
        let state = ApiState { journal: Some(Arc::new(journal)), ..ApiState::default() };
        let files = FileSet {
            haproxy_cfg: RenderedFile::new("global\n"),
            maps: BTreeMap::from([("host.map".into(), RenderedFile::new("a b\n"))]),
            files: BTreeMap::new(),
            certs: BTreeMap::from([("web_shop.pem".into(), RenderedFile::sensitive("PRIVATE KEY x\n"))]),
        };
        state.set_render(4, Arc::new(files));
        (state, dir)
    }

    #[tokio::test]
    async fn pods_config_and_files_are_served_as_documented() {
        let (state, _dir) = state_with_a_pod();
        let base = start(state).await;
        let get = |path: &str| {
            let url = format!("{base}{path}");
            async move { reqwest::get(url).await.unwrap() }
        };
        let pods: serde_json::Value = get("/api/v1/pods").await.json().await.unwrap();
        assert_eq!(pods["pods"][0]["uid"], "uid-1");
        assert_eq!(pods["pods"][0]["state"], "InSync");
        assert_eq!(pods["pods"][0]["lastTransition"]["seq"], 3);
        assert_eq!(pods["pods"][0]["desiredChecksums"][1]["name"], "maps/host.map");

        let pod: serde_json::Value = get("/api/v1/pods/haptic/haproxy-0?after=1&limit=1").await.json().await.unwrap();
        assert_eq!(pod["transitions"][0]["seq"], 2);
        assert_eq!(pod["nextAfter"], 2);

        let config: serde_json::Value = get("/api/v1/config").await.json().await.unwrap();
        assert_eq!(config["generation"], 4);
        assert_eq!(get("/api/v1/config/files/maps/host.map").await.text().await.unwrap(), "a b\n");
        assert_eq!(config["files"][2]["name"], "certs/web_shop.pem");
        assert_eq!(config["files"][2]["secret"], true);
        let certificate = get("/api/v1/config/files/certs/web_shop.pem").await;
        assert_eq!(certificate.status().as_u16(), 403);
        assert!(!certificate.text().await.unwrap().contains("PRIVATE KEY"), "a private key was served");
    }

    #[tokio::test]
    async fn errors_are_json_with_the_right_status() {
        let (state, _dir) = state_with_a_pod();
        let base = start(state).await;
        for (path, status) in [
            ("/nope", 404),
            ("/api/v1/pods/haptic/missing", 404),
            ("/api/v1/pods/haptic/haproxy-0?limit=0", 400),
            ("/api/v1/pods/haptic/haproxy-0?limit=many", 400),
            // Found by schemathesis: the document says after is a non-negative int64.
            ("/api/v1/pods/haptic/haproxy-0?after=-1", 400),
            ("/api/v1/pods/haptic/haproxy-0?after=9223372036854775808", 400),
            ("/api/v1/config/files/none.map", 404),
        ] {
            let response = reqwest::get(format!("{base}{path}")).await.unwrap();
            assert_eq!(response.status().as_u16(), status, "{path}");
            let body: serde_json::Value = response.json().await.unwrap();
            assert_eq!(body["status"], status, "{path}");
            assert!(body["error"].as_str().is_some_and(|e| !e.is_empty()), "{path}");
        }
    }

    #[test]
    fn the_openapi_document_names_every_route() {
        let document = openapi();
        for route in [
            "/api/v1/pods",
            "/api/v1/pods/{namespace}/{name}",
            "/api/v1/config",
            "/api/v1/config/files/{name}",
            "/api/v1/openapi.json",
        ] {
            assert!(document["paths"].get(route).is_some(), "{route}");
        }
    }
}
