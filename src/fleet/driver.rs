//! The driver of one pod: the thin async shell around [`DriverCore`]. It waits for renders,
//! timers and stop; feeds each to the core; journals the transition the core answers with
//! durably before anything else; then performs the actions it queued through [`PodActions`]
//! and feeds their outcomes back. Every decision (pacing, retries, drift, what an action
//! carries) is the core's, a plain function tested without IO. Start-up is the same loop
//! seeded from the journal: the machine starts Unknown with what the journal says was pushed,
//! so its first action is a verification, and a pod that already runs the desired files is
//! left untouched.
//!
//! What an action does to a pod is behind [`PodActions`] (the Dataplane adapter in
//! production, scripted fakes in these tests).

use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;
use tracing::field::Empty;
use tracing::{Instrument, error, info, info_span, warn};

use super::core::{Cause, Clock, DriverCore, Input, Note, Outcome, Transitioned, Work};
use super::machine::{Action, Event, PodMachine};
use super::pod::{ActionError, Desired, Patched, PodTarget, Reading, Validation};
use crate::dataplane::ConfigVersion;
use crate::journal::Journal;
use crate::plan::RuntimeAction;
use crate::pod::{LeaderTerm, State, StoredCopy};
use crate::telemetry::traces::trace_id_of;

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
    /// Forgets what is kept for a pod its driver left (gone, or reached otherwise now): pods
    /// come and go for as long as the controller runs.
    fn forget_pod(&self, _pod: &PodTarget) {}
}

/// The fleet's bounds on actions in flight at once, shared by every driver (`maxParallel`
/// of each kind), resized when a new configuration says so.
#[derive(Clone, Debug)]
pub struct ActionSlots {
    /// Validations, pushes and runtime patches.
    pub deploy: Slots,
    /// Verifications: each downloads the pod's configuration, so drift checks and a new
    /// leader's first reads of every pod are bounded too.
    pub verify: Slots,
}

impl ActionSlots {
    /// `parallel` of each kind (at least one).
    pub fn new(parallel: usize) -> Self {
        Self { deploy: Slots::new(parallel), verify: Slots::new(parallel) }
    }

    /// Keeps `parallel` of each kind from now on.
    pub fn resize(&self, parallel: usize) {
        self.deploy.resize(parallel);
        self.verify.resize(parallel);
    }
}

/// A resizable bound on actions of one kind in flight.
#[derive(Clone, Debug)]
pub struct Slots {
    semaphore: Arc<Semaphore>,
    bound: Arc<std::sync::Mutex<SlotBound>>,
}

#[derive(Debug)]
struct SlotBound {
    size: usize,
    /// Slots in use that a smaller bound took away: each is forgotten when it is handed back.
    owed: usize,
}

/// One action's slot, handed back when dropped.
pub struct Slot {
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    bound: Arc<std::sync::Mutex<SlotBound>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut bound = self.bound.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(permit) = self.permit.take()
            && bound.owed > 0
        {
            bound.owed -= 1;
            permit.forget();
        }
    }
}

impl Slots {
    /// `parallel` at once (at least one).
    pub fn new(parallel: usize) -> Self {
        let size = parallel.max(1);
        Self {
            semaphore: Arc::new(Semaphore::new(size)),
            bound: Arc::new(std::sync::Mutex::new(SlotBound { size, owed: 0 })),
        }
    }

    /// Waits for a slot.
    pub async fn acquire(&self) -> Option<Slot> {
        let permit = self.semaphore.clone().acquire_owned().await.ok()?;
        Some(Slot { permit: Some(permit), bound: self.bound.clone() })
    }

    /// Keeps `parallel` (at least one) from now on: more at once; fewer as actions in flight
    /// end.
    pub fn resize(&self, parallel: usize) {
        let size = parallel.max(1);
        let mut bound = self.bound.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if size > bound.size {
            let more = size - bound.size;
            let forgiven = more.min(bound.owed);
            bound.owed -= forgiven;
            self.semaphore.add_permits(more - forgiven);
        } else {
            let fewer = bound.size - size;
            let free = self.semaphore.forget_permits(fewer);
            bound.owed += fewer - free;
        }
        bound.size = size;
    }

    /// Slots free now.
    pub fn available(&self) -> usize {
        self.semaphore.available_permits()
    }
}

/// Drives one pod until `stop` turns true.
pub struct PodDriver<A: PodActions> {
    target: PodTarget,
    core: DriverCore,
    journal: Arc<Journal>,
    actions: Arc<A>,
    slots: ActionSlots,
    /// The span of the work in progress: one event and the actions it led to.
    span: tracing::Span,
}

fn clock() -> Clock {
    Clock { now: Instant::now(), wall: SystemTime::now() }
}

impl<A: PodActions> PodDriver<A> {
    /// A driver for `target`, seeded from its journal record if it has one.
    pub fn new(
        target: PodTarget,
        journal: Arc<Journal>,
        actions: Arc<A>,
        slots: ActionSlots,
        term: LeaderTerm,
        desired: Arc<Desired>,
    ) -> Self {
        let record = journal.pod(&target.uid).unwrap_or_else(|error| {
            warn!(pod = %target.name, uid = %target.uid, %error, "journal record unreadable; verifying from scratch");
            None
        });
        if let Some(record) = &record
            && record.last_transition.term != term
        {
            info!(pod = %target.name, uid = %target.uid, record_term = %record.last_transition.term,
                  %term, "journal record from another leader term: verifying the pod before trusting it");
        }
        let core = DriverCore::new(target.clone(), term, desired, record, Instant::now());
        Self { target, core, journal, actions, slots, span: tracing::Span::none() }
    }

    /// The machine, for inspection.
    pub fn machine(&self) -> &PodMachine {
        self.core.machine()
    }

    /// Opens the span of a new burst of work, in the trace of the render it serves (a drift
    /// check starts a trace of its own).
    fn begin(&mut self, cause: Cause) {
        let span = info_span!(
            "pod",
            k8s.namespace.name = %self.target.namespace,
            k8s.pod.name = %self.target.name,
            k8s.pod.uid = %self.target.uid,
            haptic.cause = ?cause,
            haptic.decision = Empty,
            haptic.state = Empty,
            haptic.desired.checksum = %self.core.desired().main_checksum(),
            otel.status_code = Empty,
            otel.status_message = Empty,
        );
        if cause != Cause::DriftCheck
            && let Some(parent) = &self.core.desired().trace
        {
            parent.adopt(&span);
        }
        self.span = span;
    }

    /// Runs until `stop` turns true or its sender is dropped.
    pub async fn run(mut self, mut desired: watch::Receiver<Arc<Desired>>, mut stop: watch::Receiver<bool>) {
        self.begin(Cause::Start);
        loop {
            if *stop.borrow() {
                return;
            }
            // One action at a time; its outcome is the next input.
            if let Some(work) = self.core.next_work() {
                let span = self.span.clone();
                let outcome = self.perform(work).instrument(span.clone()).await;
                self.step(Input::Done(outcome)).instrument(span).await;
                continue;
            }
            // Nothing left to do for this burst: its span ends here.
            self.span = tracing::Span::none();
            let (due, timer) = self.core.next_timer();
            let input = tokio::select! {
                changed = desired.changed() => {
                    if changed.is_err() { return; }
                    Input::Render(desired.borrow_and_update().clone())
                }
                _ = tokio::time::sleep_until(due) => Input::Timer(timer),
                _ = stop.changed() => return,
            };
            self.step(input).await;
        }
    }

    /// Feeds the core one input and does what it answers: the pace note, the counts, and the
    /// transition journaled durably before any work it queued.
    async fn step(&mut self, input: Input) {
        let output = self.core.step(input, clock());
        if let Some(cause) = output.began {
            self.begin(cause);
        }
        self.note(&output.notes, output.pace_note);
        let Some(transitioned) = output.transition else { return };
        let span = self.span.clone();
        if let Err(error) = self.commit(transitioned).instrument(span).await {
            error!(pod = %self.target.name, %error, "journal commit failed; the action waits for a retry");
            let output = self.core.step(Input::CommitFailed, clock());
            self.note(&output.notes, output.pace_note);
        }
    }

    /// Journals a transition (the commit fsyncs: it runs on the blocking pool, so no async
    /// worker, lease renewal among them, waits on the disk), then says it.
    async fn commit(&self, transitioned: Transitioned) -> Result<(), String> {
        let Transitioned { event, step, mut record, error_before } = transitioned;
        count(&event, &step);
        self.trace_step(&event, &step);
        record.last_transition.trace_id = trace_id_of(&self.span);
        crate::journal::on_blocking_pool(&self.journal, move |journal| journal.commit(&record))
            .await
            .map_err(|error| error.to_string())?;
        let error = &self.core.machine().last_error;
        if step.from != step.to {
            info!(pod = %self.target.name, uid = %self.target.uid, from = %step.from, to = %step.to,
                  reason = ?event.kind(), error = ?error, "pod transition");
        } else if let Some(error) = error
            && error_before.as_ref() != Some(error)
        {
            // A pod failing in place (unreachable, refusing our certificate...) is said once
            // per new reason, not on every retry.
            warn!(pod = %self.target.name, uid = %self.target.uid, state = %step.to, %error, "pod action failed");
        }
        Ok(())
    }

    /// Counts and says what the core noted, and shows the pod's wait for the pace.
    fn note(&self, notes: &[Note], pace: Option<Option<SystemTime>>) {
        use crate::telemetry::metrics::{ReloadLabels, RuntimeActionLabels, metrics};
        for note in notes {
            match note {
                Note::Reloaded(reason) => {
                    metrics().reloads.get_or_create(&ReloadLabels { reason: reason.as_str() }).inc();
                }
                Note::RuntimeActions(kinds) => {
                    for kind in kinds {
                        metrics().runtime_actions.get_or_create(&RuntimeActionLabels { kind }).inc();
                    }
                }
                Note::VersionConflict(detail) => {
                    warn!(pod = %self.target.name, %detail, "configuration version conflict: the pod is read again");
                }
                Note::RestoreFailed(error) => {
                    warn!(pod = %self.target.name, %error, "could not put back the files of a rejected configuration");
                }
            }
        }
        if let Some(until) = pace {
            self.journal.set_paced(&self.target.uid, until);
        }
    }

    /// Performs one action on the pod (deployments of different pods in parallel up to
    /// maxParallel, verifications likewise), timed and traced.
    async fn perform(&self, work: Work) -> Outcome {
        let slots = match work.action() {
            Action::Validate | Action::Push | Action::RuntimePatch => Some(&self.slots.deploy),
            Action::Verify => Some(&self.slots.verify),
            Action::RestoreFiles | Action::ScheduleRetry => None,
        };
        let _slot = match slots {
            Some(slots) => slots.acquire().await,
            None => None,
        };
        let timer = ActionTimer::start(work.action());
        let span =
            info_span!("action", otel.name = timer.action, otel.status_code = Empty, otel.status_message = Empty);
        let outcome = self.act(work).instrument(span.clone()).await;
        if let Some(error) = outcome.failure() {
            span.record("otel.status_code", "ERROR");
            span.record("otel.status_message", error);
        }
        outcome
    }

    async fn act(&self, work: Work) -> Outcome {
        let pod = &self.target;
        let actions = &self.actions;
        // A write goes on top of the version last seen; never seen (a retry after a failed
        // read, say) means read it first.
        let based = |base: Option<ConfigVersion>| {
            base.ok_or_else(|| ActionError::VersionConflict("no version read yet".into()))
        };
        match work {
            Work::Verify { known, in_doubt } => Outcome::Verified(actions.verify(pod, known.as_ref(), in_doubt).await),
            Work::Validate { desired } => Outcome::Validated(actions.validate(pod, &desired).await),
            Work::Push { desired, base } => {
                Outcome::Pushed(async { actions.push(pod, &desired, based(base)?).await }.await)
            }
            Work::RuntimePatch { desired, actions: changes, rewrite_config, base } => Outcome::Patched(
                async { actions.runtime_patch(pod, &desired, &changes, rewrite_config, based(base)?).await }.await,
            ),
            Work::RestoreFiles => Outcome::Restored(actions.restore_files(pod).await),
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::config::HaproxyVersion;
    use crate::files::{Checksum, FileSet, RenderedFile};
    use crate::fleet::pod::Pacing;
    use crate::journal::{JournaledPod, TransitionEntry};
    use crate::plan::AddressChanges;
    use crate::pod::{EventKind, FileChecksums, PodUid, PodVersions};

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

    /// `desired`, its pod checked for drift every `interval`.
    fn drifting_every(interval: Duration, desired: Arc<Desired>) -> Arc<Desired> {
        let pacing = Pacing { drift_interval: interval, ..desired.pacing };
        Arc::new(Arc::unwrap_or_clone(desired).paced(pacing))
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
        start_with(seed, runs, first, Duration::from_secs(60))
    }

    fn start_with(
        seed: impl FnOnce(&Journal),
        runs: Option<FileChecksums>,
        first: Arc<Desired>,
        drift_interval: Duration,
    ) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let (journal, _) = Journal::open(&dir.path().join("journal"), 100).unwrap();
        seed(&journal);
        let journal = Arc::new(journal);
        let fake = FakePod::new(journal.clone(), runs);
        let first = drifting_every(drift_interval, first);
        let driver = PodDriver::new(
            target(),
            journal.clone(),
            fake.clone(),
            ActionSlots::new(2),
            LeaderTerm::default(),
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
                            reason: Some(EventKind::Pushed),
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
        h.until("reload failed", |p| p.last_transition.reason == Some(EventKind::ReloadFailed)).await;
        let pod = h.journal.pod(&target().uid).unwrap().unwrap();
        assert_eq!(pod.last_transition.error.as_deref(), Some("cannot bind socket"));
        assert_eq!(pod.pushed, Some(desired("a").checksums.clone()), "the pod keeps its last good files");
        tokio::time::sleep(Duration::from_secs(600)).await;
        let pushes = h.fake.calls().iter().filter(|c| *c == "push").count();
        assert_eq!(pushes, 2, "ten drift intervals later, no second try: {:?}", h.fake.calls());
        let pod = h.journal.pod(&target().uid).unwrap().unwrap();
        assert_eq!(
            pod.last_transition.reason,
            Some(EventKind::ReloadFailed),
            "idle drift ticks do not bury the reason"
        );
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

    /// `maxParallel` changed by a new configuration takes effect at once when it grows, and
    /// as actions in flight end when it shrinks (issue #46: it was read only when the fleet
    /// started).
    #[tokio::test]
    async fn action_slots_follow_a_new_bound() {
        let slots = Slots::new(2);
        let (a, b) = (slots.acquire().await.unwrap(), slots.acquire().await.unwrap());
        assert_eq!(slots.available(), 0);
        slots.resize(4);
        assert_eq!(slots.available(), 2, "more at once");
        let (c, d) = (slots.acquire().await.unwrap(), slots.acquire().await.unwrap());
        slots.resize(1);
        assert_eq!(slots.available(), 0);
        drop((a, b, c));
        assert_eq!(slots.available(), 0, "three handed back, all three taken away");
        drop(d);
        assert_eq!(slots.available(), 1, "the new bound");
        // Shrunk while all are busy, grown back before any ends: nothing is lost.
        let e = slots.acquire().await.unwrap();
        slots.resize(0);
        assert_eq!(slots.available(), 0, "at least one");
        slots.resize(3);
        assert_eq!(slots.available(), 2);
        drop(e);
        assert_eq!(slots.available(), 3);
    }

    /// A render waiting for the reload pace must not be what a drift repair pushes: the machine
    /// would not know it, call the push's result "not desired" and validate and push again,
    /// back to back, for ever.
    #[tokio::test(start_paused = true)]
    async fn a_drift_repair_while_a_render_waits_for_the_pace_is_no_reload_loop() {
        let h = start_with(|_| {}, None, desired("a"), Duration::from_secs(1));
        h.until("in sync", |p| p.state == State::InSync).await;
        for round in 0..20 {
            // Renders every 300 ms, and the pod edited by hand now and then.
            h.desired_tx.send(drifting_every(Duration::from_secs(1), desired(&format!("render {round}")))).unwrap();
            if round % 5 == 0 {
                *h.fake.runs.lock().unwrap() = Some(desired("edited by hand").checksums.clone());
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let pushes = h.fake.calls().iter().filter(|c| *c == "push").count();
        // 6 s of renders at a 2 s pace, plus the first push and the drift repairs it may take.
        assert!(pushes <= 1 + 3 + 4 + 1, "{pushes} pushes in 6 s: {:?}", h.fake.calls());
        h.stop().await;
    }
}
