//! Prometheus metrics: one process-wide registry, filled where things happen and encoded by the
//! HTTP API on `/metrics`. Names and labels are listed in `docs/metrics.md`.

use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// `outcome` of a render.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `ok` or `error` (renders); `reused` or `rendered` (blocks).
    pub outcome: &'static str,
}

/// A figure of jemalloc's (`haptic::memory::HeapFigures`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HeapLabels {
    /// `allocated`, `active`, `metadata`, `resident`, `mapped` or `retained`.
    pub kind: &'static str,
}

/// What triggered a reconciliation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TriggerLabels {
    /// `watch`, `pods` or `config`.
    pub trigger: &'static str,
}

/// A watched alias.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AliasLabels {
    /// The alias from `spec.watchedResources`.
    pub alias: String,
}

/// A pod state transition.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    /// The state before.
    pub from: String,
    /// The state after.
    pub to: String,
}

/// A deployment to one pod.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeploymentLabels {
    /// `full`, `runtime` or `noop`.
    pub kind: &'static str,
    /// `ok` or `error`.
    pub result: &'static str,
}

/// An action on a pod.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    /// `verify`, `validate`, `push`, `runtime_patch`, `restore_files`.
    pub action: &'static str,
}

/// Why a pod was reloaded.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// `unverified`, `drift`, `configuration`, `server-address`, `map`, `certificate`, `file`, `retry`.
    pub reason: &'static str,
}

/// A kind of runtime change.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuntimeActionLabels {
    /// `server-address`, `server-weight`, `server-state`, `map-add`, `map-set`, `map-delete`,
    /// `certificate`.
    pub kind: &'static str,
}

/// One request to a pod's Dataplane API.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DataplaneRequestLabels {
    /// `GET`, `PUT`, `POST`, `DELETE` or `other`.
    pub method: &'static str,
    /// `2xx`, `3xx`, `4xx`, `5xx` or `unreachable` (no answer).
    pub answer: &'static str,
}

/// A pod state, for the gauge of pods per state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// The state.
    pub state: String,
}

/// Every metric haptic exports.
pub struct Metrics {
    registry: Registry,
    /// Renders by outcome.
    pub renders: Family<OutcomeLabels, Counter>,
    /// Render duration.
    pub render_seconds: Histogram,
    /// `render_each` blocks of successful renders, reused or rendered.
    pub render_blocks: Family<OutcomeLabels, Counter>,
    /// Time to judge one admission review (render with the object, HAProxy's check).
    pub admission_seconds: Histogram,
    /// Reconciliations (coalesced batches of changes) by what triggered them.
    pub reconciliations: Family<TriggerLabels, Counter>,
    /// Watch events that changed a store, by alias.
    pub watch_events: Family<AliasLabels, Counter>,
    /// Pod state transitions.
    pub transitions: Family<TransitionLabels, Counter>,
    /// Deployments by kind and result.
    pub deployments: Family<DeploymentLabels, Counter>,
    /// HAProxy reloads caused (full deployments that completed), by the difference that needed one.
    pub reloads: Family<ReloadLabels, Counter>,
    /// Runtime changes applied (and read back) without a reload, by kind.
    pub runtime_actions: Family<RuntimeActionLabels, Counter>,
    /// Time a runtime change took on a pod, from its request to its read-back, by kind (server
    /// changes ride on one request with the configuration's write: each is given its time).
    pub runtime_action_seconds: Family<RuntimeActionLabels, Histogram>,
    /// Drift found on a pod that was in sync.
    pub drift_detections: Counter,
    /// Action duration by action (validation durations among them).
    pub action_seconds: Family<ActionLabels, Histogram>,
    /// Requests to pods' Dataplane APIs, by method and answer: the load the controller puts
    /// on the fleet (drift checks download each pod's configuration).
    pub dataplane_requests: Family<DataplaneRequestLabels, Counter>,
    /// Bytes of the Dataplane APIs' answers read.
    pub dataplane_answer_bytes: Counter,
    /// Pods per state, set when scraped.
    pub pods: Family<StateLabels, Gauge>,
    /// Journal size on disk, set when scraped.
    pub journal_bytes: Gauge,
    /// jemalloc's figures (live heap, pages it holds), set when scraped.
    pub heap_bytes: Family<HeapLabels, Gauge>,
    /// 1 while this replica may deploy.
    pub leader: Gauge,
    /// Pod drivers that died (panicked) and were restarted.
    pub driver_restarts: Counter,
}

fn duration_buckets() -> impl Iterator<Item = f64> {
    // 1 ms to about 65 s.
    exponential_buckets(0.001, 2.0, 17)
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("haptic");
        let metrics = Self {
            renders: Family::default(),
            render_seconds: Histogram::new(duration_buckets()),
            render_blocks: Family::default(),
            admission_seconds: Histogram::new(duration_buckets()),
            reconciliations: Family::default(),
            watch_events: Family::default(),
            transitions: Family::default(),
            deployments: Family::default(),
            reloads: Family::default(),
            runtime_actions: Family::default(),
            runtime_action_seconds: Family::new_with_constructor(|| Histogram::new(duration_buckets())),
            drift_detections: Counter::default(),
            action_seconds: Family::new_with_constructor(|| Histogram::new(duration_buckets())),
            dataplane_requests: Family::default(),
            dataplane_answer_bytes: Counter::default(),
            pods: Family::default(),
            journal_bytes: Gauge::default(),
            heap_bytes: Family::default(),
            leader: Gauge::default(),
            driver_restarts: Counter::default(),
            registry: Registry::default(),
        };
        registry.register("renders", "Renders by outcome", metrics.renders.clone());
        registry.register("render_duration_seconds", "Time to render every file", metrics.render_seconds.clone());
        registry.register(
            "render_blocks",
            "Blocks of successful renders, reused from the last render or rendered",
            metrics.render_blocks.clone(),
        );
        registry.register(
            "admission_duration_seconds",
            "Time to judge one admission review (render with the object, HAProxy's check)",
            metrics.admission_seconds.clone(),
        );
        registry.register("reconciliations", "Coalesced reconciliations by trigger", metrics.reconciliations.clone());
        registry.register(
            "watch_events",
            "Watched changes that changed a store, by alias",
            metrics.watch_events.clone(),
        );
        registry.register("pod_transitions", "Pod state machine transitions", metrics.transitions.clone());
        registry.register("deployments", "Deployments to pods by kind and result", metrics.deployments.clone());
        registry.register(
            "reloads",
            "HAProxy reloads caused by full deployments, by the kind of difference that needed one",
            metrics.reloads.clone(),
        );
        registry.register(
            "runtime_actions",
            "Runtime changes applied and read back without a reload, by kind",
            metrics.runtime_actions.clone(),
        );
        registry.register(
            "runtime_action_duration_seconds",
            "Time of runtime changes on a pod, request to read-back, by kind",
            metrics.runtime_action_seconds.clone(),
        );
        registry.register(
            "drift_detections",
            "Pods found differing from what was pushed",
            metrics.drift_detections.clone(),
        );
        registry.register("pod_action_duration_seconds", "Time of actions on pods", metrics.action_seconds.clone());
        registry.register(
            "dataplane_requests",
            "Requests to pods' Dataplane APIs by method and answer class",
            metrics.dataplane_requests.clone(),
        );
        registry.register(
            "dataplane_answer_bytes",
            "Bytes of Dataplane API answers read",
            metrics.dataplane_answer_bytes.clone(),
        );
        registry.register("pods", "Known HAProxy pods by state", metrics.pods.clone());
        registry.register("journal_size_bytes", "Journal size on disk", metrics.journal_bytes.clone());
        registry.register(
            "heap_bytes",
            "jemalloc's figures: allocated (live heap), active (its pages), metadata, resident, mapped, retained",
            metrics.heap_bytes.clone(),
        );
        registry.register("leader", "1 while this replica deploys", metrics.leader.clone());
        registry.register(
            "driver_restarts",
            "Pod drivers that died and were restarted",
            metrics.driver_restarts.clone(),
        );
        Self { registry, ..metrics }
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_exported_under_the_haptic_prefix() {
        let m = metrics();
        m.renders.get_or_create(&OutcomeLabels { outcome: "ok" }).inc();
        m.action_seconds.get_or_create(&ActionLabels { action: "push" }).observe(0.02);
        // A family is exported once it has a series (the fleet declares every reload reason
        // at its start); run alone, this test must not lean on another test's reload.
        let _ = m.reloads.get_or_create(&ReloadLabels { reason: "drift" });
        let text = m.encode();
        for name in [
            "haptic_renders_total{outcome=\"ok\"}",
            "haptic_pod_action_duration_seconds_bucket",
            "haptic_reloads_total",
            "haptic_leader",
        ] {
            assert!(text.contains(name), "{name} missing:\n{text}");
        }
    }
}
