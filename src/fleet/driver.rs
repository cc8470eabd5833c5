//! The driver of one pod's state machine: it feeds the machine events (action results, new
//! renders, retry and drift timers), journals every transition durably, and only then performs
//! the actions the transition calls for. Start-up is the same loop seeded from the journal:
//! the machine starts Unknown with what the journal says was pushed, so its first action is a
//! verification, and a pod that already runs the desired files is left untouched.
//!
//! What an action does to a pod is behind [`PodActions`] (the Dataplane adapter in
//! production, scripted fakes in these tests).

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;
use tracing::field::Empty;
use tracing::{Instrument, error, info, info_span, warn};

use super::machine::{Action, Event, FileChecksums, PodMachine, State};
use crate::config::HaproxyVersion;
use crate::dataplane::ConfigVersion;
use crate::files::{Checksum, FileSet};
use crate::journal::{Journal, JournaledPod, LeaderTerm, PodUid, TransitionEntry};
use crate::plan::{AddressChanges, Plan, RuntimeAction};
use crate::telemetry::traces::{TraceParent, trace_id_of};

/// The pod a driver works on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodTarget {
    /// Identity.
    pub uid: PodUid,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Where its Dataplane API answers, e.g. `http://10.0.0.7:5555/v3`.
    pub endpoint: String,
}

/// What the controller wants every pod to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    /// The files.
    pub files: Arc<FileSet>,
    /// Their checksums, as the machine compares them.
    pub checksums: FileChecksums,
    /// The reconciliation that rendered them, whose trace the pods' work joins.
    pub trace: Option<TraceParent>,
    /// The oldest HAProxy the configuration supports: older pods are given nothing.
    pub minimum_haproxy: Option<HaproxyVersion>,
}

/// The checksums a pod running `files` shows a verification, as the machine compares them.
pub fn deployed_checksums(files: &FileSet) -> FileChecksums {
    // Every file by its content's checksum; a pod's certificates by the checksums its
    // certificate manifest names (the Dataplane API never gives a certificate back).
    files.entries().map(|(name, file)| (name, file.checksum)).collect()
}

impl Desired {
    /// Wraps a render.
    pub fn new(files: FileSet) -> Self {
        let checksums = deployed_checksums(&files);
        Self { files: Arc::new(files), checksums, trace: None, minimum_haproxy: None }
    }

    /// The same render, for pods whose HAProxy is at least `minimum`.
    pub fn requiring(self, minimum: Option<HaproxyVersion>) -> Self {
        Self { minimum_haproxy: minimum, ..self }
    }

    /// The same render, traced under `trace`.
    pub fn traced(self, trace: Option<TraceParent>) -> Self {
        Self { trace, ..self }
    }

    fn main_checksum(&self) -> String {
        self.checksums.iter().find(|(name, _)| name == "haproxy.cfg").map(|(_, c)| c.to_string()).unwrap_or_default()
    }
}

/// The answer of a validation on the pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Validation {
    /// HAProxy accepted the configuration.
    Passed,
    /// HAProxy refused it, with its message.
    Rejected(String),
}

/// A configuration haptic pushed, as the pod stores it. The Dataplane API does not keep the
/// text it is sent but its own parser's layout of it, so a push is recognised on the pod by
/// the checksum of that layout, learnt from the push's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredCopy {
    /// The checksum of the rendered `haproxy.cfg` that was pushed.
    pub render: Checksum,
    /// The checksum of the file as the pod stores it, without its version lines.
    pub stored: Checksum,
    /// The configuration version the push left: the base of the next write.
    pub version: ConfigVersion,
}

/// What a verification read on a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reading {
    /// The pod's files as the machine compares them (`haproxy.cfg` as the render it is a
    /// copy of, when it is recognised as one).
    pub observed: FileChecksums,
    /// The pod's configuration version: the base of the next write.
    pub version: ConfigVersion,
    /// The push the pod's configuration file is a copy of, when it is recognised as one.
    pub copy: Option<StoredCopy>,
    /// What the pod's HAProxy does with open connections when a server's address changes at
    /// run time (from its version; the cautious answer when it cannot be read).
    pub address_changes: AddressChanges,
    /// The versions the pod reports.
    pub versions: PodVersions,
}

/// The versions a pod reports, as read (`None`: it did not say, or could not be asked).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodVersions {
    /// HAProxy's, from its runtime (`2.8.25-5cf5d0683`).
    pub haproxy: Option<String>,
    /// The Dataplane API's (`v3.2.7 3f1e3ef3`).
    pub dataplane_api: Option<String>,
}

/// What a runtime patch came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Patched {
    /// Written, applied and read back as intended: the configuration as the pod now stores it,
    /// or `None` when it was not rewritten (only maps or certificates changed).
    Taken(Option<StoredCopy>),
    /// Not applied as intended: a full sync follows, on top of this configuration version when
    /// it is known (the patch may have written the file, or left it as it was).
    NotTaken(Option<ConfigVersion>),
}

/// Why an action did not complete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ActionError {
    /// Unreachable, timed out, an unexpected answer: retried with backoff.
    Failed(String),
    /// The pod's configuration version moved since it was read: someone else wrote.
    VersionConflict(String),
    /// HAProxy refused to reload with the pushed file; the Dataplane API put the last good one back.
    ReloadFailed(String),
}

impl fmt::Display for ActionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Failed(error) | Self::VersionConflict(error) | Self::ReloadFailed(error) => f.write_str(error),
        }
    }
}

/// What actions do to a pod.
pub trait PodActions: Send + Sync + 'static {
    /// Reads what the pod runs. `known` is the last push to this pod haptic knows of, so that a
    /// file changed since (whatever still claims to be that push) is not taken for it;
    /// `in_doubt`, no push is taken on its file's word (a runtime patch was cut short or did not
    /// take: the files may be there without their effect).
    fn verify(
        &self,
        pod: &PodTarget,
        known: Option<&StoredCopy>,
        in_doubt: bool,
    ) -> impl Future<Output = Result<Reading, ActionError>> + Send;
    /// Uploads changed auxiliary files and validates the configuration on the pod.
    fn validate(
        &self,
        pod: &PodTarget,
        desired: &Desired,
    ) -> impl Future<Output = Result<Validation, ActionError>> + Send;
    /// Pushes the configuration on top of configuration version `base` (a conflict when the
    /// pod has moved on) and confirms the reload.
    fn push(
        &self,
        pod: &PodTarget,
        desired: &Desired,
        base: ConfigVersion,
    ) -> impl Future<Output = Result<StoredCopy, ActionError>> + Send;
    /// Applies a runtime-only change (the new files written without a reload, the
    /// configuration on top of `base` when `rewrite_config` says it changed, `actions` through
    /// the Runtime API in their order) and reads it back; when it did not take, a full sync
    /// follows.
    fn runtime_patch(
        &self,
        pod: &PodTarget,
        desired: &Desired,
        actions: &[RuntimeAction],
        rewrite_config: bool,
        base: ConfigVersion,
    ) -> impl Future<Output = Result<Patched, ActionError>> + Send;
    /// Puts back the auxiliary files uploaded for a rejected configuration.
    fn restore_files(&self, pod: &PodTarget) -> impl Future<Output = Result<(), String>> + Send;
}

/// Driver settings.
#[derive(Clone, Debug)]
pub struct DriverSettings {
    /// How often an InSync pod is checked for drift.
    pub drift_interval: Duration,
    /// The leader term this replica deploys in (0 without leader election); journal records
    /// of another term are not trusted until the pod confirms them.
    pub term: LeaderTerm,
    /// The least time between two reloads of this pod: a render that needs one sooner waits,
    /// and renders meanwhile coalesce into that one reload. Runtime patches are not paced.
    pub min_reload_interval: Duration,
}

/// Drives one pod until `stop` turns true.
pub struct PodDriver<A: PodActions> {
    target: PodTarget,
    machine: PodMachine,
    seq: u64,
    journal: Arc<Journal>,
    actions: Arc<A>,
    deploy_slots: Arc<Semaphore>,
    settings: DriverSettings,
    desired: Arc<Desired>,
    /// The span of the work in progress: one event and the actions it led to.
    span: tracing::Span,
    /// The files this pod is known to run (pushed, patched or verified by this driver), the
    /// base a runtime patch is planned from; unknown after a restart, so the first change
    /// after one is a full sync.
    pushed_files: Option<Arc<FileSet>>,
    /// The runtime changes planned for the current desired files.
    runtime_actions: Vec<RuntimeAction>,
    /// The last push to this pod haptic knows of, as the pod stores it (journaled).
    copy: Option<StoredCopy>,
    /// The configuration version last read from the pod or left by a push: the base of the
    /// next write, so that a write by anyone else in between is a conflict, not overwritten.
    base_version: Option<ConfigVersion>,
    /// What the pod's HAProxy does with open connections when a server's address changes at
    /// run time, as last verified.
    address_changes: AddressChanges,
    /// A runtime patch was cut short (or the journal says one was in flight when the controller
    /// stopped): the pod's file may claim files whose runtime changes never took, so only a
    /// full sync settles it.
    patch_in_doubt: bool,
    /// When this driver last reloaded the pod (a push), for pacing.
    last_reload: Option<Instant>,
    /// The versions the pod reports: journaled, shown by the API, and checked against the
    /// configuration's minimum.
    versions: PodVersions,
    /// Whether `versions` were read by this driver (not only remembered by the journal):
    /// only then is a new render judged by them without reading the pod first.
    versions_read: bool,
    /// What started the work in progress (a drift check's push is a drift repair).
    cause: Cause,
}

/// What started a burst of work on a pod, as traces name it.
#[derive(Clone, Copy, Debug)]
enum Cause {
    /// The driver started (controller start, new pod, or regained leadership).
    Start,
    /// A new render.
    DesiredChanged,
    /// A retry after a failure.
    Retry,
    /// The periodic drift check: a trace of its own.
    DriftCheck,
}

impl<A: PodActions> PodDriver<A> {
    /// A driver for `target`, seeded from its journal record if it has one.
    pub fn new(
        target: PodTarget,
        journal: Arc<Journal>,
        actions: Arc<A>,
        deploy_slots: Arc<Semaphore>,
        settings: DriverSettings,
        desired: Arc<Desired>,
    ) -> Self {
        let record = journal.pod(&target.uid).unwrap_or_else(|error| {
            warn!(pod = %target.name, uid = %target.uid, %error, "journal record unreadable; verifying from scratch");
            None
        });
        // What a push left on the pod stays evidence whoever made it: a file still stored
        // exactly as that push left it runs that push.
        let copy = record.as_ref().and_then(|record| record.copy);
        let versions = record.as_ref().map(|record| record.versions.clone()).unwrap_or_default();
        let patch_in_doubt = record.as_ref().is_some_and(|record| record.state == State::RuntimePatching);
        let (pushed, seq) = match record {
            Some(record) if record.last_transition.term == settings.term => (record.pushed, record.last_transition.seq),
            Some(record) => {
                info!(pod = %target.name, uid = %target.uid, record_term = %record.last_transition.term,
                      term = %settings.term, "journal record from another leader term: verifying the pod before trusting it");
                (None, record.last_transition.seq)
            }
            None => (None, 0),
        };
        let machine = PodMachine::new(desired.checksums.clone(), pushed);
        Self {
            target,
            machine,
            seq,
            journal,
            actions,
            deploy_slots,
            settings,
            desired,
            span: tracing::Span::none(),
            pushed_files: None,
            runtime_actions: Vec::new(),
            copy,
            base_version: None,
            address_changes: AddressChanges::default(),
            patch_in_doubt,
            last_reload: None,
            versions,
            versions_read: false,
            cause: Cause::Start,
        }
    }

    /// Opens the span of a new burst of work, in the trace of the render it serves (a drift
    /// check starts a trace of its own).
    fn begin(&mut self, cause: Cause) {
        self.cause = cause;
        let span = info_span!(
            "pod",
            k8s.namespace.name = %self.target.namespace,
            k8s.pod.name = %self.target.name,
            k8s.pod.uid = %self.target.uid,
            haptic.cause = ?cause,
            haptic.decision = Empty,
            haptic.state = Empty,
            haptic.desired.checksum = %self.desired.main_checksum(),
            otel.status_code = Empty,
            otel.status_message = Empty,
        );
        if !matches!(cause, Cause::DriftCheck)
            && let Some(parent) = &self.desired.trace
        {
            parent.adopt(&span);
        }
        self.span = span;
    }

    /// The machine, for inspection.
    pub fn machine(&self) -> &PodMachine {
        &self.machine
    }

    /// Runs until `stop` turns true or its sender is dropped.
    pub async fn run(mut self, mut desired: watch::Receiver<Arc<Desired>>, mut stop: watch::Receiver<bool>) {
        let mut pending: VecDeque<Action> = VecDeque::from([Action::Verify]);
        let mut retry_at: Option<Instant> = None;
        let mut drift_at = Instant::now() + self.settings.drift_interval;
        // A render that needs a reload sooner than the pace allows waits until then.
        let mut paced_until: Option<Instant> = None;
        self.begin(Cause::Start);
        loop {
            if *stop.borrow() {
                return;
            }
            // One action at a time; its result is the next event.
            if let Some(action) = pending.pop_front() {
                let span = self.span.clone();
                if let Some(event) = self.perform(action).instrument(span.clone()).await {
                    self.apply(&event, &mut pending, &mut retry_at).instrument(span).await;
                }
                continue;
            }
            // Nothing left to do for this burst: its span ends here.
            self.span = tracing::Span::none();
            let (event, cause) = tokio::select! {
                changed = desired.changed() => {
                    if changed.is_err() { return; }
                    self.desired = desired.borrow_and_update().clone();
                    let planned = self.runtime_plan();
                    let runtime_only = planned.is_some();
                    if !runtime_only && let Some(until) = self.reload_paced_until() {
                        // Renders arriving meanwhile only replace `self.desired`: one reload.
                        // The API shows the pod waiting, until when.
                        paced_until = Some(until);
                        let wall = std::time::SystemTime::now() + until.saturating_duration_since(Instant::now());
                        self.journal.set_paced(&self.target.uid, Some(wall));
                        continue;
                    }
                    if paced_until.take().is_some() {
                        self.journal.set_paced(&self.target.uid, None);
                    }
                    (self.desired_changed(planned), Cause::DesiredChanged)
                }
                _ = sleep_until(paced_until), if paced_until.is_some() => {
                    paced_until = None;
                    self.journal.set_paced(&self.target.uid, None);
                    let planned = self.runtime_plan();
                    (self.desired_changed(planned), Cause::DesiredChanged)
                }
                _ = sleep_until(retry_at), if retry_at.is_some() => {
                    retry_at = None;
                    (Event::RetryDue, Cause::Retry)
                }
                _ = tokio::time::sleep_until(drift_at) => {
                    drift_at = Instant::now() + self.settings.drift_interval;
                    (Event::DriftTick, Cause::DriftCheck)
                }
                _ = stop.changed() => return,
            };
            self.begin(cause);
            let span = self.span.clone();
            self.apply(&event, &mut pending, &mut retry_at).instrument(span).await;
        }
    }

    async fn perform(&mut self, action: Action) -> Option<Event> {
        // Deployments of different pods run in parallel up to maxParallel; a verification is cheap.
        let slots = self.deploy_slots.clone();
        let _slot = match action {
            Action::Validate | Action::Push | Action::RuntimePatch => slots.acquire().await.ok(),
            _ => None,
        };
        let timer = ActionTimer::start(action);
        let span =
            info_span!("action", otel.name = timer.action, otel.status_code = Empty, otel.status_message = Empty);
        let event = self.act(action).instrument(span.clone()).await;
        if let Some(
            Event::ActionFailed { error } | Event::ValidationRejected { error } | Event::ReloadFailed { error },
        ) = &event
        {
            span.record("otel.status_code", "ERROR");
            span.record("otel.status_message", error.as_str());
        }
        event
    }

    async fn act(&mut self, action: Action) -> Option<Event> {
        let pod = &self.target;
        let desired = &self.desired;
        let failed = |error: ActionError| match error {
            ActionError::Failed(error) => Event::ActionFailed { error },
            ActionError::VersionConflict(detail) => {
                warn!(pod = %pod.name, %detail, "configuration version conflict: the pod is read again");
                Event::VersionConflict
            }
            ActionError::ReloadFailed(error) => Event::ReloadFailed { error },
        };
        // A write goes on top of the version last seen; never seen (a retry after a failed
        // read, say) means read it first.
        let base = self.base_version.ok_or_else(|| ActionError::VersionConflict("no version read yet".into()));
        Some(match action {
            Action::Verify => match self.actions.verify(pod, self.copy.as_ref(), self.patch_in_doubt).await {
                Ok(reading) => {
                    self.base_version = Some(reading.version);
                    self.address_changes = reading.address_changes;
                    if reading.copy.is_some() {
                        self.copy = reading.copy;
                    }
                    self.versions = reading.versions;
                    self.versions_read = true;
                    match self.unsupported() {
                        Some(event) => event,
                        None => Event::Verified { observed: Some(reading.observed) },
                    }
                }
                Err(error) => failed(error),
            },
            Action::Validate => match self.actions.validate(pod, desired).await {
                Ok(Validation::Passed) => Event::ValidationPassed,
                Ok(Validation::Rejected(error)) => Event::ValidationRejected { error },
                Err(error) => failed(error),
            },
            Action::Push => {
                // What the reload is for, from the files the pod ran, which are let go while the
                // push runs: until its answer the pod's files are in doubt, and from `Syncing`
                // only a full push follows, until `InSync` names the files anew. Kept, each pod
                // being pushed to held two renders' files (2–3 MB each at 10,000 Ingresses) for
                // the push's ten seconds under churn.
                let reason = match self.cause {
                    Cause::DriftCheck => crate::plan::ReloadReason::Drift,
                    _ => crate::plan::reload_reason(self.pushed_files.as_deref(), &desired.files, self.address_changes),
                };
                self.pushed_files = None;
                match async { self.actions.push(pod, desired, base?).await }.await {
                    Ok(copy) => {
                        self.last_reload = Some(Instant::now());
                        let labels = crate::telemetry::metrics::ReloadLabels { reason: reason.as_str() };
                        crate::telemetry::metrics::metrics().reloads.get_or_create(&labels).inc();
                        self.base_version = Some(copy.version);
                        self.copy = Some(copy);
                        self.patch_in_doubt = false;
                        Event::Pushed { pushed: desired.checksums.clone() }
                    }
                    Err(error) => {
                        // A push that may have landed keeps its base: retried, it meets a conflict
                        // and the pod is read again. A failed reload put an older file back.
                        if !matches!(error, ActionError::Failed(_)) {
                            self.base_version = None;
                        }
                        failed(error)
                    }
                }
            }
            Action::RuntimePatch => {
                // The patch was planned from the files the pod runs: its configuration is
                // rewritten when the desired one differs from theirs.
                let rewrite_config = self
                    .pushed_files
                    .as_ref()
                    .is_none_or(|pushed| pushed.haproxy_cfg.checksum != desired.files.haproxy_cfg.checksum);
                let patch = async {
                    self.actions.runtime_patch(pod, desired, &self.runtime_actions, rewrite_config, base?).await
                };
                match patch.await {
                    Ok(Patched::Taken(copy)) => {
                        let metrics = crate::telemetry::metrics::metrics();
                        for action in &self.runtime_actions {
                            let labels = crate::telemetry::metrics::RuntimeActionLabels { kind: action.kind() };
                            metrics.runtime_actions.get_or_create(&labels).inc();
                        }
                        if let Some(copy) = copy {
                            self.base_version = Some(copy.version);
                            self.copy = Some(copy);
                        }
                        self.patch_in_doubt = false;
                        Event::RuntimePatched { pushed: desired.checksums.clone() }
                    }
                    Ok(Patched::NotTaken(written_at)) => {
                        // The file may claim the new render without its effect: only the full
                        // sync that follows may settle it, on top of the version it left.
                        self.base_version = written_at;
                        self.patch_in_doubt = true;
                        Event::RuntimePatchMismatch
                    }
                    Err(error) => {
                        if !matches!(error, ActionError::Failed(_)) {
                            self.base_version = None;
                        }
                        self.patch_in_doubt = true;
                        failed(error)
                    }
                }
            }
            Action::RestoreFiles => {
                if let Err(error) = self.actions.restore_files(pod).await {
                    warn!(pod = %pod.name, %error, "could not put back the files of a rejected configuration");
                }
                return None;
            }
            Action::ScheduleRetry => return None,
        })
    }

    /// Steps the machine, journals the transition, and queues its actions, in that order.
    async fn apply(&mut self, event: &Event, pending: &mut VecDeque<Action>, retry_at: &mut Option<Instant>) {
        let before = self.machine.clone();
        let step = self.machine.step(event);
        // A step that changes nothing and calls for nothing (a drift tick on a pod waiting for
        // new files) is not a transition: journaling it would bury the reason the pod waits.
        if step.row.is_none() || (self.machine == before && step.actions.is_empty()) {
            return;
        }
        count(event, &step);
        self.trace_step(event, &step);
        self.seq += 1;
        let record = JournaledPod {
            uid: self.target.uid.clone(),
            namespace: self.target.namespace.clone(),
            name: self.target.name.clone(),
            state: step.to,
            pushed: self.machine.pushed.clone(),
            copy: self.copy,
            versions: self.versions.clone(),
            last_transition: TransitionEntry {
                seq: self.seq,
                at: SystemTime::now(),
                from: step.from,
                to: step.to,
                reason: format!("{:?}", event.kind()),
                error: self.machine.last_error.clone(),
                term: self.settings.term,
                trace_id: trace_id_of(&self.span),
            },
        };
        // The commit fsyncs: it runs on the blocking pool, so no async worker (lease renewal
        // shares them) waits on the disk.
        let committed = crate::journal::on_blocking_pool(&self.journal, move |journal| journal.commit(&record)).await;
        if let Err(error) = committed {
            // Never act on a transition that is not on disk: retry the step later.
            error!(pod = %self.target.name, %error, "journal commit failed; the action waits for a retry");
            pending.clear();
            *retry_at = Some(Instant::now() + self.machine.retry_delay().max(Duration::from_secs(1)));
            return;
        }
        if step.from != step.to {
            info!(pod = %self.target.name, uid = %self.target.uid, from = %step.from, to = %step.to,
                  reason = ?event.kind(), error = ?self.machine.last_error, "pod transition");
        } else if let Some(error) = &self.machine.last_error
            && before.last_error.as_ref() != Some(error)
        {
            // A pod failing in place (unreachable, refusing our certificate...) is said once
            // per new reason, not on every retry.
            warn!(pod = %self.target.name, uid = %self.target.uid, state = %step.to, %error, "pod action failed");
        }
        for action in step.actions {
            match action {
                Action::ScheduleRetry => *retry_at = Some(Instant::now() + self.machine.retry_delay()),
                other => pending.push_back(other),
            }
        }
        if step.to == State::InSync {
            *retry_at = None;
            // In sync means the pod runs exactly the desired files: the base of the next plan.
            self.pushed_files = Some(self.desired.files.clone());
        }
    }
}

impl<A: PodActions> PodDriver<A> {
    /// The machine's event for the desired files, planned as `planned` (runtime actions, or
    /// `None` for a full sync); the actions are kept for the patch it may lead to.
    fn desired_changed(&mut self, planned: Option<Vec<RuntimeAction>>) -> Event {
        if self.versions_read
            && let Some(event) = self.unsupported()
        {
            self.runtime_actions.clear();
            return event;
        }
        let runtime_only = planned.is_some();
        self.runtime_actions = planned.unwrap_or_default();
        Event::DesiredChanged { desired: self.desired.checksums.clone(), runtime_only }
    }

    /// `Unsupported` when the pod's HAProxy, as last read, is below the desired files' minimum.
    fn unsupported(&self) -> Option<Event> {
        let reason =
            crate::config::meets_minimum(self.versions.haproxy.as_deref(), self.desired.minimum_haproxy).err()?;
        Some(Event::Unsupported { desired: self.desired.checksums.clone(), reason })
    }

    /// Until when a reload must wait, if the last one was less than the pace ago.
    fn reload_paced_until(&self) -> Option<Instant> {
        let until = self.last_reload? + self.settings.min_reload_interval;
        (Instant::now() < until).then_some(until)
    }

    /// The runtime changes that take the pod from the files it runs to the desired ones, when
    /// that is all it takes (see `plan::plan`); `None` calls for a full sync.
    fn runtime_plan(&self) -> Option<Vec<RuntimeAction>> {
        let pushed = self.pushed_files.as_ref()?;
        match crate::plan::plan(pushed, &self.desired.files, self.address_changes) {
            Plan::Runtime(actions) => Some(actions),
            Plan::NoOp | Plan::Full => None,
        }
    }

    /// Records a step on the span of the work in progress: the decision it took, the state it
    /// reached, what was pushed, and a failure as the span's error.
    fn trace_step(&self, event: &Event, step: &super::machine::Step) {
        let span = &self.span;
        let decision = match (event, step.from, step.to) {
            (Event::DesiredChanged { .. }, State::InSync, State::InSync) => Some("noop"),
            (_, _, State::RuntimePatching) if step.from != State::RuntimePatching => Some("runtime"),
            (_, _, State::Validating | State::Drifted) if step.from == State::Unknown || step.from == State::InSync => {
                Some("full")
            }
            (Event::Verified { .. }, State::Unknown, State::InSync) => Some("noop"),
            _ => None,
        };
        if let Some(decision) = decision {
            span.record("haptic.decision", decision);
        }
        span.record("haptic.state", tracing::field::display(step.to));
        match event {
            Event::ActionFailed { error } | Event::ValidationRejected { error } | Event::ReloadFailed { error } => {
                span.record("otel.status_code", "ERROR");
                span.record("otel.status_message", error.as_str());
            }
            Event::Pushed { .. } | Event::RuntimePatched { .. } | Event::Verified { .. }
                if step.to == State::InSync =>
            {
                span.record("otel.status_code", "OK");
            }
            _ => {}
        }
    }
}

/// Records a step in the metrics: transitions, deployments by kind and result, reloads, drift.
fn count(event: &Event, step: &super::machine::Step) {
    use crate::telemetry::metrics::{DeploymentLabels, TransitionLabels, metrics};
    let metrics = metrics();
    if step.from != step.to {
        let labels = TransitionLabels { from: step.from.to_string(), to: step.to.to_string() };
        metrics.transitions.get_or_create(&labels).inc();
    }
    let deployment = |kind, result| {
        metrics.deployments.get_or_create(&DeploymentLabels { kind, result }).inc();
    };
    match (event, step.from, step.to) {
        // Reloads are counted where the push succeeds, with the difference that needed one.
        (Event::Pushed { .. }, _, _) => deployment("full", "ok"),
        (Event::RuntimePatched { .. }, _, _) => deployment("runtime", "ok"),
        (Event::ActionFailed { .. }, State::Syncing, _) => deployment("full", "error"),
        (Event::ActionFailed { .. }, State::RuntimePatching, _) => deployment("runtime", "error"),
        (Event::DesiredChanged { .. }, State::InSync, State::InSync) => deployment("noop", "ok"),
        (Event::Verified { .. }, State::InSync, State::Drifted) => {
            metrics.drift_detections.inc();
        }
        _ => {}
    }
}

/// Observes an action's duration when dropped.
struct ActionTimer {
    /// The action's name, in metrics and spans.
    action: &'static str,
    started: std::time::Instant,
}

impl ActionTimer {
    fn start(action: Action) -> Self {
        let action = match action {
            Action::Verify => "verify",
            Action::Validate => "validate",
            Action::Push => "push",
            Action::RuntimePatch => "runtime_patch",
            Action::RestoreFiles => "restore_files",
            Action::ScheduleRetry => "schedule_retry",
        };
        Self { action, started: std::time::Instant::now() }
    }
}

impl Drop for ActionTimer {
    fn drop(&mut self) {
        let labels = crate::telemetry::metrics::ActionLabels { action: self.action };
        crate::telemetry::metrics::metrics()
            .action_seconds
            .get_or_create(&labels)
            .observe(self.started.elapsed().as_secs_f64());
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    use super::*;
    use crate::files::RenderedFile;

    /// A scripted pod: runs whatever was last pushed, records every call and the journal's
    /// state for the pod at the moment of each push.
    struct FakePod {
        journal: Arc<Journal>,
        runs: Mutex<Option<FileChecksums>>,
        calls: Mutex<Vec<String>>,
        failing_pushes: AtomicU32,
        failing_reloads: AtomicBool,
        reject: AtomicBool,
        state_at_push: Mutex<Vec<State>>,
        haproxy_version: Mutex<Option<String>>,
        /// Files to count the holders of at each push.
        watched: Mutex<Option<std::sync::Weak<FileSet>>>,
        held_at_push: Mutex<Vec<usize>>,
    }

    impl FakePod {
        fn new(journal: Arc<Journal>, runs: Option<FileChecksums>) -> Arc<Self> {
            Arc::new(Self {
                journal,
                runs: Mutex::new(runs),
                calls: Mutex::new(Vec::new()),
                failing_pushes: AtomicU32::new(0),
                failing_reloads: AtomicBool::new(false),
                reject: AtomicBool::new(false),
                state_at_push: Mutex::new(Vec::new()),
                haproxy_version: Mutex::new(Some("2.8.25-5cf5d0683".into())),
                watched: Mutex::new(None),
                held_at_push: Mutex::new(Vec::new()),
            })
        }

        fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap().clone()
        }

        fn call(&self, name: &str) {
            self.calls.lock().unwrap().push(name.into());
        }
    }

    fn copy_of(desired: &Desired) -> StoredCopy {
        StoredCopy {
            render: desired.files.haproxy_cfg.checksum,
            stored: Checksum::of(b"stored"),
            version: ConfigVersion(1),
        }
    }

    impl PodActions for FakePod {
        async fn verify(&self, _: &PodTarget, _: Option<&StoredCopy>, _: bool) -> Result<Reading, ActionError> {
            self.call("verify");
            let observed = self.runs.lock().unwrap().clone().unwrap_or_default();
            let versions = PodVersions {
                haproxy: self.haproxy_version.lock().unwrap().clone(),
                dataplane_api: Some("v3.2.7 3f1e3ef3".into()),
            };
            Ok(Reading {
                observed,
                version: ConfigVersion(1),
                copy: None,
                address_changes: AddressChanges::Followed,
                versions,
            })
        }
        async fn validate(&self, _: &PodTarget, _: &Desired) -> Result<Validation, ActionError> {
            self.call("validate");
            Ok(if self.reject.load(Ordering::SeqCst) {
                Validation::Rejected("[ALERT] line 3".into())
            } else {
                Validation::Passed
            })
        }
        async fn push(&self, pod: &PodTarget, desired: &Desired, _: ConfigVersion) -> Result<StoredCopy, ActionError> {
            self.call("push");
            let journaled = self.journal.pod(&pod.uid).unwrap().map(|p| p.state);
            self.state_at_push.lock().unwrap().extend(journaled);
            if let Some(watched) = self.watched.lock().unwrap().as_ref() {
                self.held_at_push.lock().unwrap().push(watched.strong_count());
            }
            if self.failing_pushes.load(Ordering::SeqCst) > 0 {
                self.failing_pushes.fetch_sub(1, Ordering::SeqCst);
                return Err(ActionError::Failed("connection refused".into()));
            }
            if self.failing_reloads.load(Ordering::SeqCst) {
                return Err(ActionError::ReloadFailed("cannot bind socket".into()));
            }
            *self.runs.lock().unwrap() = Some(desired.checksums.clone());
            Ok(copy_of(desired))
        }
        async fn runtime_patch(
            &self,
            _: &PodTarget,
            desired: &Desired,
            actions: &[RuntimeAction],
            _: bool,
            _: ConfigVersion,
        ) -> Result<Patched, ActionError> {
            let actions: Vec<String> = actions.iter().map(ToString::to_string).collect();
            self.call(&format!("runtime_patch {}", actions.join(";")));
            *self.runs.lock().unwrap() = Some(desired.checksums.clone());
            Ok(Patched::Taken(Some(copy_of(desired))))
        }
        async fn restore_files(&self, _: &PodTarget) -> Result<(), String> {
            self.call("restore");
            Ok(())
        }
    }

    /// A desired configuration per tag; two tags differ in a way only a reload can apply.
    fn desired(tag: &str) -> Arc<Desired> {
        with_config(format!("global\n    description {tag}\n"))
    }

    fn with_config(config: String) -> Arc<Desired> {
        Arc::new(Desired::new(FileSet {
            haproxy_cfg: RenderedFile::new(config),
            maps: BTreeMap::new(),
            files: BTreeMap::new(),
            certs: BTreeMap::new(),
        }))
    }

    fn target() -> PodTarget {
        PodTarget {
            uid: PodUid("uid-1".into()),
            namespace: "haptic".into(),
            name: "haproxy-0".into(),
            endpoint: "http://127.0.0.2:5555/v3".into(),
        }
    }

    struct Harness {
        journal: Arc<Journal>,
        fake: Arc<FakePod>,
        desired_tx: watch::Sender<Arc<Desired>>,
        stop_tx: watch::Sender<bool>,
        task: tokio::task::JoinHandle<()>,
        _dir: tempfile::TempDir,
    }

    fn start(seed: impl FnOnce(&Journal), runs: Option<FileChecksums>, first: Arc<Desired>) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let (journal, _) = Journal::open(&dir.path().join("journal"), 100).unwrap();
        seed(&journal);
        let journal = Arc::new(journal);
        let fake = FakePod::new(journal.clone(), runs);
        let settings = DriverSettings {
            drift_interval: Duration::from_secs(60),
            term: LeaderTerm::default(),
            min_reload_interval: Duration::from_secs(2),
        };
        let driver = PodDriver::new(
            target(),
            journal.clone(),
            fake.clone(),
            Arc::new(Semaphore::new(2)),
            settings,
            first.clone(),
        );
        let (desired_tx, desired_rx) = watch::channel(first);
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(driver.run(desired_rx, stop_rx));
        Harness { journal, fake, desired_tx, stop_tx, task, _dir: dir }
    }

    impl Harness {
        async fn until(&self, what: &str, done: impl Fn(&JournaledPod) -> bool) {
            for _ in 0..10_000 {
                if let Some(pod) = self.journal.pod(&target().uid).unwrap()
                    && done(&pod)
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("{what}: never happened; calls {:?}", self.fake.calls());
        }

        async fn stop(self) {
            self.stop_tx.send(true).unwrap();
            self.task.await.unwrap();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_pod_is_verified_validated_pushed_and_journaled_before_each_push() {
        let h = start(|_| {}, None, desired("a"));
        h.until("in sync", |p| p.state == State::InSync).await;
        assert_eq!(h.fake.calls(), ["verify", "validate", "push"]);
        assert_eq!(*h.fake.state_at_push.lock().unwrap(), [State::Syncing], "the push acted on a journaled transition");
        assert_eq!(h.journal.pod(&target().uid).unwrap().unwrap().pushed, Some(desired("a").checksums.clone()));
        h.stop().await;
    }

    /// While a push runs, the driver holds no files but those it pushes: the files the pod ran
    /// before (2–3 MB per pod at 10,000 Ingresses, for a push's ten seconds under churn) are let
    /// go, since from `Syncing` only a full push follows until `InSync` names the files anew.
    #[tokio::test(start_paused = true)]
    async fn a_pod_being_pushed_to_lets_go_of_the_files_it_ran() {
        let first = desired("a");
        let first_files = Arc::downgrade(&first.files);
        let h = start(|_| {}, None, first);
        h.until("in sync", |p| p.state == State::InSync).await;
        *h.fake.watched.lock().unwrap() = Some(first_files);
        h.desired_tx.send(desired("b")).unwrap();
        h.until("b pushed", |p| p.state == State::InSync && p.pushed == Some(desired("b").checksums.clone())).await;
        assert_eq!(
            *h.fake.held_at_push.lock().unwrap(),
            [0],
            "the files of the first render were held during the push"
        );
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_resumed_pod_that_runs_the_desired_files_gets_no_write() {
        let wanted = desired("a");
        let seed_pushed = wanted.checksums.clone();
        let h = start(
            |journal| {
                journal
                    .commit(&JournaledPod {
                        uid: target().uid,
                        namespace: "haptic".into(),
                        name: "haproxy-0".into(),
                        state: State::InSync,
                        pushed: Some(seed_pushed.clone()),
                        copy: None,
                        versions: Default::default(),
                        last_transition: TransitionEntry {
                            seq: 7,
                            at: SystemTime::now(),
                            from: State::Syncing,
                            to: State::InSync,
                            reason: "Pushed".into(),
                            error: None,
                            term: LeaderTerm::default(),
                            trace_id: None,
                        },
                    })
                    .unwrap()
            },
            Some(wanted.checksums.clone()),
            wanted,
        );
        h.until("verified in sync", |p| p.last_transition.seq == 8 && p.state == State::InSync).await;
        assert_eq!(h.fake.calls(), ["verify"], "only a read, no write");
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_below_the_minimum_haproxy_gets_nothing_until_the_minimum_allows_it() {
        let requiring =
            |tag: &str, minimum: &str| Arc::new((*desired(tag)).clone().requiring(HaproxyVersion::parse(minimum)));
        let runs = desired("a").checksums.clone();
        let h = start(|_| {}, Some(runs.clone()), requiring("b", "2.8"));
        *h.fake.haproxy_version.lock().unwrap() = Some("2.6.12-1+deb12u4".into());
        h.until("refused", |p| p.last_transition.error.is_some()).await;
        let pod = h.journal.pod(&target().uid).unwrap().unwrap();
        assert_eq!(pod.state, State::Unknown);
        assert_eq!(pod.versions.haproxy.as_deref(), Some("2.6.12-1+deb12u4"), "the versions are journaled");
        assert_eq!(pod.versions.dataplane_api.as_deref(), Some("v3.2.7 3f1e3ef3"));
        let error = pod.last_transition.error.unwrap();
        assert!(error.contains("2.6.12-1+deb12u4") && error.contains("2.8.0"), "{error}");
        // Another render under the same minimum: judged by the versions read, nothing sent.
        h.desired_tx.send(requiring("c", "2.8")).unwrap();
        h.until("judged again", |p| p.last_transition.seq == 2).await;
        assert_eq!(h.fake.calls(), ["verify"], "no validation, no push");
        // The minimum lowered: read again, then deployed as any pod.
        h.desired_tx.send(requiring("c", "2.6")).unwrap();
        h.until("deployed", |p| p.state == State::InSync).await;
        assert_eq!(h.fake.calls(), ["verify", "verify", "validate", "push"]);
        assert_eq!(h.journal.pod(&target().uid).unwrap().unwrap().last_transition.error, None);
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn failing_pushes_back_off_and_the_pod_catches_up() {
        let h = start(|_| {}, None, desired("a"));
        h.fake.failing_pushes.store(3, Ordering::SeqCst);
        let started = Instant::now();
        h.until("in sync after failures", |p| p.state == State::InSync).await;
        assert_eq!(h.fake.calls().iter().filter(|c| *c == "push").count(), 4);
        assert!(Instant::now() - started >= Duration::from_secs(1 + 2 + 4), "backoff 1 s, 2 s, 4 s");
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn reloads_of_a_pod_are_paced_and_a_burst_of_renders_is_one_reload() {
        let h = start(|_| {}, None, desired("a"));
        h.until("in sync", |p| p.state == State::InSync).await;
        let first_push = tokio::time::Instant::now();
        // Three renders needing a reload within the pace: the last one is pushed, once, when
        // the pace allows.
        for tag in ["b", "c", "d"] {
            h.desired_tx.send(desired(tag)).unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(h.journal.paced(&target().uid).is_some(), "the pod is shown waiting for the pace");
        }
        h.until("the last render pushed", |p| p.pushed == Some(desired("d").checksums.clone())).await;
        assert!(
            first_push.elapsed() >= Duration::from_millis(1900),
            "pushed {:?} after the first",
            first_push.elapsed()
        );
        assert_eq!(h.journal.paced(&target().uid), None, "no longer waiting once pushed");
        assert_eq!(h.fake.calls().iter().filter(|c| *c == "push").count(), 2, "{:?}", h.fake.calls());
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn runtime_patches_are_not_paced() {
        let server = |address: &str| with_config(format!("backend be_web\n    server srv1 {address}:8080\n"));
        let h = start(|_| {}, None, server("10.0.0.1"));
        h.until("in sync", |p| p.state == State::InSync).await;
        let pushed_at = tokio::time::Instant::now();
        h.desired_tx.send(server("10.0.0.2")).unwrap();
        h.until("patched", |p| p.pushed == Some(server("10.0.0.2").checksums.clone())).await;
        assert!(pushed_at.elapsed() < Duration::from_millis(500), "a runtime patch waited {:?}", pushed_at.elapsed());
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn drift_is_found_within_one_interval_and_undone() {
        let h = start(|_| {}, None, desired("a"));
        h.until("in sync", |p| p.state == State::InSync).await;
        *h.fake.runs.lock().unwrap() = Some(desired("edited by hand").checksums.clone());
        tokio::time::sleep(Duration::from_secs(61)).await;
        h.until("re-deployed", |p| p.state == State::InSync && p.last_transition.from == State::Syncing).await;
        assert_eq!(h.fake.calls().iter().filter(|c| *c == "push").count(), 2);
        assert_eq!(*h.fake.runs.lock().unwrap(), Some(desired("a").checksums.clone()));
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_address_change_is_a_runtime_patch_with_its_actions_and_no_reload() {
        let server = |address: &str| with_config(format!("backend be_web\n    server srv1 {address}:8080\n"));
        let h = start(|_| {}, None, server("10.0.0.1"));
        h.until("in sync", |p| p.state == State::InSync).await;
        h.desired_tx.send(server("10.0.0.2")).unwrap();
        h.until("patched", |p| p.pushed == Some(server("10.0.0.2").checksums.clone())).await;
        assert_eq!(
            h.fake.calls(),
            ["verify", "validate", "push", "runtime_patch SetServerAddr be_web srv1 10.0.0.2 8080"],
            "no validation round and no push with a reload"
        );
        let pod = h.journal.pod(&target().uid).unwrap().unwrap();
        assert_eq!((pod.state, pod.last_transition.from), (State::InSync, State::RuntimePatching));
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_route_change_is_a_runtime_patch_of_map_entries_that_leaves_the_configuration_alone() {
        let routes = |map: &str| {
            Arc::new(Desired::new(FileSet {
                haproxy_cfg: RenderedFile::new("backend be_a\nbackend be_b\n"),
                maps: BTreeMap::from([("host.map".to_owned(), RenderedFile::new(map))]),
                files: BTreeMap::new(),
                certs: BTreeMap::new(),
            }))
        };
        let h = start(|_| {}, None, routes("a.example/ be_a\n"));
        h.until("in sync", |p| p.state == State::InSync).await;
        h.desired_tx.send(routes("a.example/ be_b\nb.example/ be_a\n")).unwrap();
        let wanted = routes("a.example/ be_b\nb.example/ be_a\n").checksums.clone();
        h.until("patched", |p| p.pushed == Some(wanted.clone())).await;
        // Entries set and added (removals would come last), no validation, no push with a reload.
        assert_eq!(
            h.fake.calls(),
            [
                "verify",
                "validate",
                "push",
                "runtime_patch set map host.map a.example/ be_b;add map host.map b.example/ be_a"
            ]
        );
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_resumed_pod_verified_in_sync_is_runtime_patched_on_the_next_server_change() {
        let server = |address: &str| with_config(format!("backend be_web\n    server srv1 {address}:8080\n"));
        let seeded = server("10.0.0.1").checksums.clone();
        let h = start(|_| {}, Some(seeded), server("10.0.0.1"));
        h.until("in sync", |p| p.state == State::InSync).await;
        // Resumed from the journal and verified: the pod runs exactly these files, which makes
        // them the base of the next plan.
        h.desired_tx.send(server("10.0.0.3")).unwrap();
        h.until("patched", |p| p.pushed == Some(server("10.0.0.3").checksums.clone())).await;
        assert!(h.fake.calls().iter().any(|c| c.starts_with("runtime_patch")), "{:?}", h.fake.calls());
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_reload_is_journaled_with_its_reason_and_not_pushed_again_on_a_timer() {
        let h = start(|_| {}, None, desired("a"));
        h.until("in sync", |p| p.state == State::InSync).await;
        h.fake.failing_reloads.store(true, Ordering::SeqCst);
        h.desired_tx.send(desired("b")).unwrap();
        h.until("reload failed", |p| p.last_transition.reason == "ReloadFailed").await;
        let pod = h.journal.pod(&target().uid).unwrap().unwrap();
        assert_eq!(pod.last_transition.error.as_deref(), Some("cannot bind socket"));
        assert_eq!(pod.pushed, Some(desired("a").checksums.clone()), "the pod keeps its last good files");
        tokio::time::sleep(Duration::from_secs(600)).await;
        let pushes = h.fake.calls().iter().filter(|c| *c == "push").count();
        assert_eq!(pushes, 2, "ten drift intervals later, no second try: {:?}", h.fake.calls());
        let pod = h.journal.pod(&target().uid).unwrap().unwrap();
        assert_eq!(pod.last_transition.reason, "ReloadFailed", "idle drift ticks do not bury the reason");
        h.fake.failing_reloads.store(false, Ordering::SeqCst);
        h.desired_tx.send(desired("c")).unwrap();
        h.until("new files deployed", |p| p.state == State::InSync && p.pushed == Some(desired("c").checksums.clone()))
            .await;
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_rejected_configuration_is_never_pushed_and_its_files_are_put_back() {
        let h = start(|_| {}, None, desired("a"));
        h.until("in sync", |p| p.state == State::InSync).await;
        h.fake.reject.store(true, Ordering::SeqCst);
        h.desired_tx.send(desired("broken")).unwrap();
        h.until("rejected", |p| p.last_transition.error.is_some()).await;
        let pod = h.journal.pod(&target().uid).unwrap().unwrap();
        assert_eq!(pod.state, State::Validating);
        assert_eq!(pod.last_transition.error.as_deref(), Some("[ALERT] line 3"), "HAProxy's message is journaled");
        assert_eq!(pod.pushed, Some(desired("a").checksums.clone()), "the pod keeps its last good files");
        assert_eq!(h.fake.calls(), ["verify", "validate", "push", "validate", "restore"]);
        h.stop().await;
    }
}
