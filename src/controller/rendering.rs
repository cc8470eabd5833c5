//! One render of the configuration in force, off the async threads, with its span, metrics and
//! side outputs (refusals, Ingress statuses); and the facts about the pods the status reports.

use tracing::field::Empty;
use tracing::{Instrument, error, info_span, warn};

use std::sync::Arc;

use super::activation::Active;
use super::{PodFact, RenderSink, Trigger, ingress_status, quarantine, status};
use crate::watch::Change;

/// Why a render gave no files.
#[derive(Debug, thiserror::Error)]
pub(super) enum RenderFailed {
    /// The templates failed.
    #[error(transparent)]
    Render(#[from] crate::render::RenderError),
    /// The render's task panicked.
    #[error("the render task failed: {0}")]
    Panicked(String),
}

/// The HAProxy pods being deployed to, as their journal records show them against the last render.
pub(super) fn pod_facts(
    journal: &crate::journal::Journal,
    pods: &[crate::watch::HaproxyPod],
    files: &crate::files::FileSet,
) -> Vec<PodFact> {
    // Called every second: the checksums only, not a copy of the whole render.
    let desired = crate::fleet::deployed_checksums(files);
    pods.iter()
        .filter(|pod| pod.deployable)
        .map(|pod| &pod.info)
        .map(|pod| {
            let record = journal.pod(&crate::pod::PodUid(pod.uid.clone())).ok().flatten();
            let state = record.as_ref().map_or(crate::pod::State::Unknown, |r| r.state);
            let error = record.as_ref().and_then(|r| r.last_transition.error.clone());
            let rejected = error.is_some()
                && state == crate::pod::State::Validating
                && record
                    .as_ref()
                    .is_some_and(|r| r.last_transition.reason == Some(crate::pod::EventKind::ValidationRejected));
            PodFact {
                name: pod.name.clone(),
                state,
                runs_desired: record.as_ref().and_then(|r| r.pushed.as_ref()) == Some(&desired),
                error,
                rejected,
            }
        })
        .collect()
}

/// A search for the objects behind the current render that a pod refused.
pub(super) fn search_job(
    active: &Active,
    quarantine: &mut quarantine::Quarantine,
    checker: &Arc<dyn crate::admission::Validator>,
    max_culprits: usize,
) -> quarantine::SearchJob {
    let (stores, _) = quarantine.apply(&active.watches.snapshot());
    quarantine::SearchJob {
        generation: active.generation,
        spec: active.spec.clone(),
        renderer: active.renderer.clone(),
        stores,
        pods: active.watches.pods(),
        validator: checker.clone(),
        max_culprits,
    }
}

/// The root span of one reconciliation: what triggered it (the first change names the
/// object; the count says how many changes the debouncer coalesced).
pub(super) fn reconcile_span(triggers: &[Trigger], generation: i64) -> tracing::Span {
    let span = info_span!(
        "reconcile",
        haptic.trigger = Empty,
        haptic.trigger.count = triggers.len(),
        haptic.config.generation = generation,
        k8s.resource.kind = Empty,
        k8s.namespace.name = Empty,
        k8s.resource.name = Empty,
    );
    match triggers.first() {
        Some(Trigger::Watch(Change::Applied(object) | Change::Deleted(object))) => {
            span.record("haptic.trigger", tracing::field::display(&triggers[0]));
            span.record("k8s.resource.kind", object.kind.as_ref() as &str);
            span.record("k8s.namespace.name", object.key.namespace.as_ref() as &str);
            span.record("k8s.resource.name", object.key.name.as_ref() as &str);
        }
        Some(trigger) => {
            span.record("haptic.trigger", tracing::field::display(trigger));
        }
        None => {}
    }
    span
}

/// What a render gives the loop besides its files.
pub(super) struct Rendered {
    /// The files to deploy.
    pub(super) files: crate::files::FileSet,
    /// Objects the render left out, for their Events.
    pub(super) refused: Vec<status::Refusal>,
    /// Ingress statuses to write.
    pub(super) ingresses: Vec<ingress_status::IngressStatusChange>,
    /// The objects the render left out, which are not served (their status says nothing).
    pub(super) offenders: Vec<crate::store::ObjectRef>,
    /// The Gateway API status the render owes, when the configuration serves the Gateway API.
    pub(super) gateway_status: Option<crate::gateway::Owed>,
    /// The server slots as the render left them, to journal.
    pub(super) slots: std::sync::Arc<crate::plan::slots::Slots>,
}

/// Ingress statuses that differ from what the last render decided, from the stores as they are
/// now: a change in ignored fields only (`ignoreFields`, a status another writer changed) asks
/// for no render, so the status writer reads it here.
pub(super) fn ingress_status_owed(
    active: &Active,
    offenders: &[crate::store::ObjectRef],
    changed: &std::collections::HashSet<crate::store::ObjectRef>,
) -> Vec<ingress_status::IngressStatusChange> {
    let Some(settings) = &active.spec.ingress_status else { return Vec::new() };
    let stores = active.watches.snapshot();
    let pod_ips: Vec<String> =
        active.watches.pods().iter().map(|pod| pod.ip.clone()).filter(|ip| !ip.is_empty()).collect();
    ingress_status::changes_among(&stores, settings, &pod_ips, offenders, Some(changed))
}

/// Renders the active configuration from the current stores, off the async threads.
pub(super) async fn render(
    active: &Active,
    quarantine: &mut quarantine::Quarantine,
    triggers: Vec<Trigger>,
    sink: &RenderSink,
    max_left_out: usize,
) -> Result<Rendered, RenderFailed> {
    let renderer = active.renderer.clone();
    let stores_before = active.watches.snapshot();
    let (stores, held_out) = quarantine.apply(&stores_before);
    let started = std::time::Instant::now();
    let pods = active.watches.pods();
    let pod_ips: Vec<String> = pods.iter().map(|pod| pod.ip.clone()).filter(|ip| !ip.is_empty()).collect();
    let span = info_span!(
        "render",
        haptic.files = Empty,
        haptic.left_out = Empty,
        otel.status_code = Empty,
        otel.status_message = Empty
    );
    let result = tokio::task::spawn_blocking(move || renderer.render_leaving_out(&stores, &pods, max_left_out))
        .instrument(span.clone())
        .await;
    match &result {
        Ok(Ok(render)) => {
            span.record("haptic.files", render.files.entries().count());
            span.record("haptic.left_out", render.left_out.len());
        }
        Ok(Err(error)) => {
            span.record("otel.status_code", "ERROR");
            span.record("otel.status_message", tracing::field::display(error));
        }
        Err(_) => {
            span.record("otel.status_code", "ERROR");
        }
    }
    drop(span);
    let elapsed = started.elapsed();
    let metrics = crate::telemetry::metrics::metrics();
    metrics.render_seconds.observe(elapsed.as_secs_f64());
    let trigger = match triggers.first() {
        Some(Trigger::Watch(Change::Pods)) => "pods",
        Some(Trigger::Watch(_)) => "watch",
        _ => "config",
    };
    metrics.reconciliations.get_or_create(&crate::telemetry::metrics::TriggerLabels { trigger }).inc();
    let outcome = |outcome| crate::telemetry::metrics::OutcomeLabels { outcome };
    metrics.renders.get_or_create(&outcome(if matches!(result, Ok(Ok(_))) { "ok" } else { "error" })).inc();
    let triggers: Vec<String> = triggers.iter().map(ToString::to_string).collect();
    match result {
        Ok(Ok(render)) => {
            let crate::render::Render { files, mut left_out, gateway_status, slots, blocks, notices } = render;
            metrics.render_blocks.get_or_create(&outcome("reused")).inc_by(blocks.reused);
            metrics.render_blocks.get_or_create(&outcome("rendered")).inc_by(blocks.rendered);
            left_out.extend(held_out);
            for error in &left_out {
                warn!(%error, "left an object out of the render");
            }
            sink.record(active.generation, &files, &triggers, left_out.len(), elapsed, blocks);
            let refused = left_out
                .iter()
                .filter_map(|error| status::Refusal::of(&stores_before, error))
                .chain(notices.iter().filter_map(|notice| status::Refusal::notice(&stores_before, notice)))
                .collect();
            let offenders: Vec<_> = left_out.iter().filter_map(|e| e.offending_object().cloned()).collect();
            let ingresses = match &active.spec.ingress_status {
                Some(settings) => ingress_status::changes(&stores_before, settings, &pod_ips, &offenders),
                None => Vec::new(),
            };
            Ok(Rendered { files, refused, ingresses, offenders, gateway_status, slots })
        }
        Ok(Err(error)) => {
            error!(%error, "render failed; the last good files stay in force");
            Err(RenderFailed::Render(error))
        }
        Err(panic) => {
            error!(%panic, "render task failed");
            Err(RenderFailed::Panicked(panic.to_string()))
        }
    }
}
