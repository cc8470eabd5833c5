//! A configuration version taking effect: checked, its templates compiled and its own tests run,
//! its watches started and listed, its Dataplane credentials read. Runs beside the loop (listing
//! everything takes up to a minute), so leadership changes and renders are not held up by it.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

use super::credentials;
use super::{Trigger, ValidCondition};
use crate::config::HAProxyTemplateConfigSpec;
use crate::config::validate::problems;
use crate::render::Renderer;
use crate::tasks::{OwnedTask, TaskTree};
use crate::watch::debounce::{self, DebounceSettings};
use crate::watch::{Change, Watches};

/// How long a new configuration's watches may take to list everything before it is refused.
const SYNC_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The configuration version in force: its templates and its watches.
pub(super) struct Active {
    pub(super) generation: i64,
    pub(super) spec: HAProxyTemplateConfigSpec,
    pub(super) renderer: Arc<Renderer>,
    pub(super) watches: Watches,
    /// Dataplane credentials and TLS settings, when the configuration names them and they
    /// could be read.
    pub(super) access: Option<crate::dataplane::Access>,
    /// The watch of the Secrets behind `access` (a rotation is deployed with at once).
    pub(super) _secrets_watch: Option<OwnedTask>,
}

/// A configuration version being activated beside the loop; dropping it stops the activation.
pub(super) struct Activation {
    pub(super) generation: i64,
    pub(super) spec: HAProxyTemplateConfigSpec,
    _task: OwnedTask,
    outcome: oneshot::Receiver<Result<Active, ValidCondition>>,
}

/// What an activation started with, besides the version itself.
pub(super) struct ActivationInputs {
    pub(super) client: kube::Client,
    pub(super) namespace: String,
    pub(super) changes: mpsc::Sender<Change>,
    pub(super) access_changes: mpsc::Sender<credentials::AccessChanged>,
    pub(super) validation_requests: Option<crate::checks::Requests>,
    pub(super) tasks: TaskTree,
}

impl Activation {
    /// Starts activating version `generation` under `inputs.tasks`.
    pub(super) fn start(generation: i64, spec: HAProxyTemplateConfigSpec, inputs: ActivationInputs) -> Self {
        let tasks = inputs.tasks.clone();
        let task_spec = spec.clone();
        let (task, outcome) = tasks.spawn_returning("activation", async move {
            let ActivationInputs { client, namespace, changes, access_changes, validation_requests, tasks } = inputs;
            let requests = validation_requests.as_ref();
            let outcome = activate(&client, &task_spec, &namespace, generation, changes, requests, &tasks).await;
            outcome.map(|mut active| {
                // Started after the access was read: a change from here on is seen.
                let watch = credentials::watch(client, task_spec, namespace, generation, access_changes);
                active._secrets_watch = Some(tasks.spawn("credentials watch", watch));
                active
            })
        });
        Self { generation, spec, _task: task, outcome }
    }

    /// Whether this activation is of exactly this version.
    pub(super) fn is_of(&self, generation: i64, spec: &HAProxyTemplateConfigSpec) -> bool {
        self.generation == generation && self.spec == *spec
    }
}

/// The outcome of the activation under way; pending while there is none.
pub(super) async fn outcome_of(activation: &mut Option<Activation>) -> Result<Active, ValidCondition> {
    let Some(running) = activation.as_mut() else { return std::future::pending().await };
    let generation = running.generation;
    (&mut running.outcome).await.unwrap_or_else(|_| {
        Err(ValidCondition::refused(generation, "ActivationFailed", "activation stopped before it finished".into()))
    })
}

/// Checks a configuration version and starts its watches; on failure, the condition to report.
async fn activate(
    client: &kube::Client,
    spec: &HAProxyTemplateConfigSpec,
    namespace: &str,
    generation: i64,
    changes: mpsc::Sender<Change>,
    validation_requests: Option<&crate::checks::Requests>,
    tasks: &TaskTree,
) -> Result<Active, ValidCondition> {
    let found = problems(spec);
    if !found.is_empty() {
        let message = found.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
        return Err(ValidCondition::refused(generation, "InvalidSpec", message));
    }
    let renderer = Renderer::compile(spec)
        .map_err(|error| ValidCondition::refused(generation, "TemplateError", error.to_string()))?;
    // The configuration's own tests, before anything of it is watched or served.
    if !spec.validation_tests.is_empty() {
        let report = crate::checks::run(spec, &renderer, &[], validation_requests).await;
        if !report.passed() {
            return Err(ValidCondition::refused(generation, "ValidationTestFailed", report.summary()));
        }
        let skipped: usize = report.tests.iter().map(|t| t.skipped).sum();
        info!(tests = report.tests.len(), skipped_requests = skipped, "validation tests passed");
    }
    let watches = Watches::start(client.clone(), spec, namespace, changes, tasks)
        .await
        .map_err(|error| ValidCondition::refused(generation, "UnknownResource", error.to_string()))?;
    if tokio::time::timeout(SYNC_TIMEOUT, watches.wait_synced()).await.is_err() {
        return Err(ValidCondition::refused(
            generation,
            "WatchNotSynced",
            format!(
                "the watched resources were not all listed within {}s (check RBAC and the API server)",
                SYNC_TIMEOUT.as_secs()
            ),
        ));
    }
    let access = match super::deploy::access(client, spec, namespace).await {
        Ok(access) => Some(access),
        Err(why) => {
            warn!(%why, "cannot reach the pods' Dataplane APIs; rendering only");
            None
        }
    };
    Ok(Active { generation, spec: spec.clone(), renderer: Arc::new(renderer), watches, access, _secrets_watch: None })
}

/// The debouncer task and its input; replaced when the debounce settings change.
pub(super) struct Coalescer {
    pub(super) settings: DebounceSettings,
    input: mpsc::Sender<Trigger>,
    _task: OwnedTask,
}

impl Coalescer {
    /// Starts a debouncer under `tasks` that hands coalesced triggers to `renders`.
    pub(super) fn start(tasks: &TaskTree, settings: DebounceSettings, renders: mpsc::Sender<Vec<Trigger>>) -> Self {
        let (input, changes) = mpsc::channel(1024);
        let task = tasks.spawn("debouncer", debounce::run(settings, changes, renders));
        Self { settings, input, _task: task }
    }

    /// Hands it a trigger.
    pub(super) async fn send(&self, trigger: Trigger) {
        let _ = self.input.send(trigger).await;
    }
}

/// The debounce settings a configuration states.
pub(super) fn debounce_settings(spec: &HAProxyTemplateConfigSpec) -> DebounceSettings {
    let debounce = &spec.dataplane.debounce;
    DebounceSettings { window: debounce.window.get(), max_delay: debounce.max_delay.get() }
}
