//! The validating admission webhook, over TLS: the API server sends an `AdmissionReview` for
//! each watched object (and for the followed `HAProxyTemplateConfig`) before it stores it, and
//! gets back the verdict of `admission` (the render with the object in place, checked by
//! HAProxy when a validator is set). Every replica serves it, from its own watches.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use thiserror::Error;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tracing::{info, warn};

use crate::admission::{LocalHaproxy, Proposal, Snapshot, Validator, Verdict};
use crate::config::HAProxyTemplateConfigSpec;
use crate::render::Renderer;
use crate::watch::StoresView;

/// Where and how the webhook listens.
#[derive(Clone, Debug)]
pub struct WebhookSettings {
    /// The address (the chart's Service points at it).
    pub address: SocketAddr,
    /// A directory with `tls.crt` and `tls.key` (a `kubernetes.io/tls` Secret mounted there).
    pub certificate_dir: PathBuf,
    /// What checks each render with HAProxy (the HAProxy the validation tests' requests go
    /// through); without it, renders are judged by haptic's own refusals only.
    pub validator: Option<crate::checks::Requests>,
}

/// The validator a review asks: a local HAProxy's `haproxy -c`, or the validator's API.
pub(crate) fn validator_of(requests: &crate::checks::Requests) -> Arc<dyn Validator> {
    match requests {
        crate::checks::Requests::Local(binary) => Arc::new(LocalHaproxy(binary.clone())),
        crate::checks::Requests::Validator(api) => api.clone(),
    }
}

/// The configuration version in force, as the webhook judges against it.
pub struct AdmissionSource {
    /// Its generation.
    pub generation: i64,
    /// Its spec.
    pub spec: HAProxyTemplateConfigSpec,
    /// Its templates.
    pub renderer: Arc<Renderer>,
    /// Its stores and pods, read at each review.
    pub view: StoresView,
}

/// Why the webhook cannot serve.
#[derive(Debug, Error)]
pub enum WebhookError {
    /// The certificate or key is unreadable.
    #[error("the webhook's certificate: {0}")]
    Certificate(#[from] super::tls::ListenerTlsError),
    /// The address cannot be listened on.
    #[error("the admission webhook cannot listen on {address}: {source}")]
    Listen {
        /// The address.
        address: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

#[derive(Clone)]
struct WebhookState {
    source: watch::Receiver<Option<Arc<AdmissionSource>>>,
    config: (String, String),
    validator: Option<Arc<dyn Validator>>,
    /// Reviews judged at once: see [`JUDGED_AT_ONCE`].
    judging: Arc<Semaphore>,
}

/// Reviews judged at once. Each is a whole dry render of the cluster with the proposed object
/// (the model's memory again, and a core), so a burst of writes is judged a few at a time
/// instead of all at once on the leader's memory.
const JUDGED_AT_ONCE: usize = 2;

/// How long a review waits for its turn before it is answered 503, which the API server takes
/// as the webhook failing: the webhook's `failurePolicy` decides (the chart's `webhook.failurePolicy`).
/// Well below the chart's `timeoutSeconds` (5 s), which the judging itself must fit in too.
const QUEUE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// A turn to judge, if one comes within `wait`.
async fn turn(judging: &Arc<Semaphore>, wait: std::time::Duration) -> Option<OwnedSemaphorePermit> {
    tokio::time::timeout(wait, judging.clone().acquire_owned()).await.ok()?.ok()
}

/// Binds the webhook for the configuration `namespace/name`; gives the address it listens on
/// and the serving, for the caller to run on a task it owns.
pub async fn serve(
    settings: &WebhookSettings,
    config: (String, String),
    source: watch::Receiver<Option<Arc<AdmissionSource>>>,
) -> Result<(SocketAddr, impl std::future::Future<Output = ()> + Send + 'static), WebhookError> {
    let tls = super::tls::from_directory(&settings.certificate_dir)?;
    let listener = tokio::net::TcpListener::bind(settings.address)
        .await
        .map_err(|source| WebhookError::Listen { address: settings.address, source })?;
    let address = listener.local_addr().map_err(|source| WebhookError::Listen { address: settings.address, source })?;
    let validator = settings.validator.as_ref().map(validator_of);
    let state = WebhookState { source, config, validator, judging: Arc::new(Semaphore::new(JUDGED_AT_ONCE)) };
    let app = Router::new().route("/validate", post(review)).with_state(state);
    Ok((address, super::tls::serve(listener, tls, app, "the admission webhook")))
}

async fn review(State(state): State<WebhookState>, body: axum::body::Bytes) -> Response {
    let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(&body) {
        Ok(review) => review,
        Err(error) => return (StatusCode::BAD_REQUEST, format!("not an AdmissionReview: {error}")).into_response(),
    };
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(request) => request,
        Err(error) => {
            return (StatusCode::BAD_REQUEST, format!("an AdmissionReview without a request: {error}")).into_response();
        }
    };
    let started = std::time::Instant::now();
    let Some(_turn) = turn(&state.judging, QUEUE_WAIT).await else {
        warn!(kind = %request.kind.kind, name = %request.name, "admission webhook busy: a review waited {} s; its failurePolicy decides", QUEUE_WAIT.as_secs());
        let why = format!(
            "the admission webhook is busy ({JUDGED_AT_ONCE} reviews at once, this one waited {} s)",
            QUEUE_WAIT.as_secs()
        );
        return (StatusCode::SERVICE_UNAVAILABLE, why).into_response();
    };
    let verdict = decide(&state, &request).await;
    let elapsed = started.elapsed();
    let object = format!("{} {}/{}", request.kind.kind, request.namespace.as_deref().unwrap_or_default(), request.name);
    crate::telemetry::metrics::metrics().admission_seconds.observe(elapsed.as_secs_f64());
    let response = AdmissionResponse::from(&request);
    let response = match verdict {
        Verdict::Allowed(note) => {
            tracing::debug!(%object, ?note, seconds = elapsed.as_secs_f64(), "admitted");
            response
        }
        Verdict::Warned(warnings) => {
            tracing::debug!(%object, ?warnings, seconds = elapsed.as_secs_f64(), "admitted, with Warnings");
            let mut response = response;
            // The API server shows each to whoever wrote the object (kubectl prints them).
            response.warnings = Some(warnings.into_iter().map(|w| w.chars().take(1024).collect()).collect());
            response
        }
        Verdict::Denied(why) => {
            info!(%object, %why, seconds = elapsed.as_secs_f64(), "refused at admission");
            response.deny(why)
        }
    };
    axum::Json(response.into_review()).into_response()
}

async fn decide(state: &WebhookState, request: &AdmissionRequest<DynamicObject>) -> Verdict {
    let Some(source) = state.source.borrow().clone() else {
        return Verdict::Allowed(Some("no configuration is in force yet".into()));
    };
    let snapshot = Snapshot {
        generation: source.generation,
        spec: source.spec.clone(),
        renderer: source.renderer.clone(),
        stores: source.view.snapshot(),
        pods: source.view.pods(),
    };
    let validator = state.validator.as_deref().map(|v| v as &dyn Validator);
    let object = request.object.as_ref().and_then(|o| serde_json::to_value(o).ok());
    if request.kind.group == crate::config::GROUP && request.kind.kind == "HAProxyTemplateConfig" {
        let followed = request.namespace.as_deref() == Some(state.config.0.as_str()) && request.name == state.config.1;
        let spec = object.as_ref().and_then(|o| o.get("spec")).cloned();
        let spec: Option<HAProxyTemplateConfigSpec> = spec.and_then(|s| serde_json::from_value(s).ok());
        return match (followed, spec) {
            (false, _) => Verdict::Allowed(Some("not the configuration this controller follows".into())),
            (true, None) => Verdict::Allowed(Some("a deletion, or a spec the API server's schema judges".into())),
            (true, Some(spec)) => {
                let judged = tokio::task::spawn_blocking({
                    let spec = spec.clone();
                    move || crate::admission::judge_config(&spec, Some(&snapshot))
                })
                .await;
                match judged {
                    Ok(judged) => crate::admission::judge(judged, &spec, validator).await,
                    Err(error) => Verdict::Allowed(Some(format!("judging failed: {error}"))),
                }
            }
        };
    }
    let operation = format!("{:?}", request.operation).to_ascii_uppercase();
    let proposal = Proposal { operation, object };
    let current = snapshot.clone();
    let judged = tokio::task::spawn_blocking(move || crate::admission::judge_object(&snapshot, &proposal)).await;
    match judged {
        Ok(judged) => crate::admission::judge_beside_current(judged, current, validator).await,
        // A panic in a render is haptic's bug, not the object's: let it through (and say so).
        Err(error) => Verdict::Allowed(Some(format!("judging failed: {error}"))),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn reviews_beyond_the_bound_wait_their_turn_then_are_answered_busy() {
        let judging = Arc::new(Semaphore::new(JUDGED_AT_ONCE));
        let mut turns = Vec::new();
        for _ in 0..JUDGED_AT_ONCE {
            turns.push(turn(&judging, QUEUE_WAIT).await.expect("a turn while the bound allows"));
        }
        let started = tokio::time::Instant::now();
        assert!(turn(&judging, QUEUE_WAIT).await.is_none(), "a review past the bound is answered busy");
        assert_eq!(started.elapsed(), QUEUE_WAIT, "after waiting its turn");
        // One ends: the next waiting review is judged.
        let freed = turns.pop();
        let waiting = tokio::spawn({
            let judging = judging.clone();
            async move { turn(&judging, QUEUE_WAIT).await.is_some() }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(freed);
        assert!(waiting.await.unwrap(), "the waiting review got the turn that was freed");
    }
}
