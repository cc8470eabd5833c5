//! The driver's pure core: one pod's machine with everything the driver knows beside it (the
//! desired render, the render or push waiting for the reload pace, the pending actions, the
//! retry and drift timers, what the last push left), stepped by plain inputs at a given time.
//!
//! [`DriverCore::step`] takes an input (a render, a timer falling due, an action's outcome)
//! and answers with what the shell must do: the transition to journal before anything else,
//! the pace note, what to count. [`DriverCore::next_work`] hands out the next action with
//! the data it needs. No IO, no clock of its own: the async shell (`driver.rs`) supplies both,
//! and the property tests below drive this core through long interleavings of renders,
//! failures, drift and timers.
//!
//! One rule keeps the machine honest: the render the machine is told of is the render every
//! action works on. A render waiting for the reload pace is held aside, unseen by the machine
//! and by every action, until the pace lets it through; and any push is held until the pace
//! allows a reload, whatever led to it (a render, a retry, a drift repair).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::machine::{Action, Event, PodMachine, Step, backoff};
use super::pod::{ActionError, Desired, Pacing, Patched, PodTarget, Reading, Validation};
use crate::dataplane::ConfigVersion;
use crate::files::FileSet;
use crate::journal::{JournaledPod, TransitionEntry};
use crate::plan::{AddressChanges, Plan, ReloadReason, RuntimeAction};
use crate::pod::{EventKind, LeaderTerm, PodVersions, State, StoredCopy};

/// The time a step happens at: the monotonic instant for timers, the wall clock for records.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// For timers and pacing.
    pub now: Instant,
    /// For the journal and the API.
    pub wall: SystemTime,
}

/// What started a burst of work on a pod, as traces name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The driver started (controller start, new pod, or regained leadership).
    Start,
    /// A new render.
    DesiredChanged,
    /// A retry after a failure.
    Retry,
    /// The periodic drift check: a trace of its own.
    DriftCheck,
}

/// A timer of the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timer {
    /// The reload pace lets a held render or push through.
    Pace,
    /// The current failure's retry falls due.
    Retry,
    /// The periodic drift check.
    Drift,
    /// Putting back the files of a refused configuration, which failed, is tried again.
    Restore,
}

/// What the core is told.
#[derive(Clone, Debug)]
pub enum Input {
    /// A new render (between bursts of work only).
    Render(Arc<Desired>),
    /// A timer fell due (between bursts of work only).
    Timer(Timer),
    /// The action last handed out by [`DriverCore::next_work`] came to this.
    Done(Outcome),
    /// The journal could not commit the last transition: nothing it queued may run.
    CommitFailed,
}

/// What an action came to, as the pod answered.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// A verification.
    Verified(Result<Reading, ActionError>),
    /// A validation.
    Validated(Result<Validation, ActionError>),
    /// A push with its reload.
    Pushed(Result<StoredCopy, ActionError>),
    /// A runtime patch.
    Patched(Result<Patched, ActionError>),
    /// Putting back the files of a refused configuration.
    Restored(Result<(), String>),
}

impl Outcome {
    /// The failure to show on the action's span, if it failed or was refused.
    pub fn failure(&self) -> Option<&str> {
        match self {
            Self::Verified(Err(e)) | Self::Validated(Err(e)) | Self::Pushed(Err(e)) | Self::Patched(Err(e)) => {
                match e {
                    ActionError::Failed(message) | ActionError::ReloadFailed(message) => Some(message),
                    ActionError::VersionConflict(_) => None,
                }
            }
            Self::Validated(Ok(Validation::Rejected(message))) => Some(message),
            _ => None,
        }
    }
}

/// An action to perform on the pod, with what it needs.
#[derive(Clone, Debug)]
pub enum Work {
    /// Read what the pod runs; see [`super::PodActions::verify`].
    Verify {
        /// The last push to this pod haptic knows of.
        known: Option<StoredCopy>,
        /// No push is taken on its file's word.
        in_doubt: bool,
    },
    /// Upload auxiliary files and validate the configuration.
    Validate {
        /// The render to validate.
        desired: Arc<Desired>,
    },
    /// Push the configuration and reload.
    Push {
        /// The render to push.
        desired: Arc<Desired>,
        /// The configuration version to write on top of (`None`: never read, a conflict).
        base: Option<ConfigVersion>,
    },
    /// Apply a runtime-only change.
    RuntimePatch {
        /// The render to bring the pod to.
        desired: Arc<Desired>,
        /// The Runtime API changes, in order.
        actions: Vec<RuntimeAction>,
        /// Whether the configuration file differs from the one the pod runs.
        rewrite_config: bool,
        /// The configuration version to write on top of (`None`: never read, a conflict).
        base: Option<ConfigVersion>,
    },
    /// Put back the files uploaded for a refused configuration.
    RestoreFiles,
}

impl Work {
    /// The machine's action this work performs.
    pub fn action(&self) -> Action {
        match self {
            Self::Verify { .. } => Action::Verify,
            Self::Validate { .. } => Action::Validate,
            Self::Push { .. } => Action::Push,
            Self::RuntimePatch { .. } => Action::RuntimePatch,
            Self::RestoreFiles => Action::RestoreFiles,
        }
    }
}

/// A transition to journal before the work it queued is performed.
#[derive(Clone, Debug)]
pub struct Transitioned {
    /// The event that made it.
    pub event: Event,
    /// The machine's step.
    pub step: Step,
    /// The pod's record after it (its trace id is the shell's to fill in).
    pub record: JournaledPod,
    /// The failure on show before the step, so that a failure in place is said once.
    pub error_before: Option<String>,
}

/// Something the shell counts or says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Note {
    /// A push reloaded the pod, for this reason.
    Reloaded(ReloadReason),
    /// A runtime patch took: the kind of each of its changes.
    RuntimeActions(Vec<&'static str>),
    /// A write met a configuration version that moved: the pod is read again.
    VersionConflict(String),
    /// The files of a refused configuration could not be put back.
    RestoreFailed(String),
}

/// What the shell must do after a step.
#[derive(Clone, Debug, Default)]
pub struct Output {
    /// A burst of work began (its span opens before the transition is traced).
    pub began: Option<Cause>,
    /// The transition to journal, before any work it queued.
    pub transition: Option<Transitioned>,
    /// The pod's wait for the reload pace changed: until when it waits now (`None`: no longer).
    pub pace_note: Option<Option<SystemTime>>,
    /// What to count or say.
    pub notes: Vec<Note>,
}

/// What waits for the reload pace.
#[derive(Clone, Debug, Default)]
struct Pace {
    /// When the pace lets a reload through.
    until: Option<Instant>,
    /// A render that needs a reload, kept from the machine until then (the latest one).
    render: Option<Arc<Desired>>,
    /// The push the machine asked for, held until then.
    push: bool,
}

impl Pace {
    /// Until when something waits, if anything does.
    fn waiting_until(&self) -> Option<Instant> {
        self.until.filter(|_| self.render.is_some() || self.push)
    }
}

/// One pod's driver, without its IO.
#[derive(Clone, Debug)]
pub struct DriverCore {
    target: PodTarget,
    /// The leader term this replica deploys in (0 without leader election); journal records
    /// of another term are not trusted until the pod confirms them.
    term: LeaderTerm,
    /// The timing of the latest render taken (held ones included).
    pacing: Pacing,
    machine: PodMachine,
    /// The sequence number of the last journaled transition.
    seq: u64,
    /// The render the machine is told of, which every action works on.
    desired: Arc<Desired>,
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
    /// Why the push in flight reloads, decided when it was handed out.
    push_reason: ReloadReason,
    /// The actions the last transitions queued, in order.
    pending: VecDeque<Action>,
    retry_at: Option<Instant>,
    drift_at: Instant,
    /// The state of the drift checks' jitter (xorshift, seeded from the pod's UID).
    jitter: u64,
    /// When putting back a refused configuration's files, which failed, is tried again, and
    /// how many times in a row it failed (its own timer: the machine's retry would validate the
    /// refused files again).
    restore_at: Option<Instant>,
    restore_failures: u32,
    pace: Pace,
}

impl DriverCore {
    /// A core for `target` in leader `term`, seeded from its journal record if it has one;
    /// its first work is a verification. A record of another term is not trusted for what was
    /// pushed. Its timing is the render's.
    pub fn new(
        target: PodTarget,
        term: LeaderTerm,
        desired: Arc<Desired>,
        record: Option<JournaledPod>,
        now: Instant,
    ) -> Self {
        // What a push left on the pod stays evidence whoever made it: a file still stored
        // exactly as that push left it runs that push.
        let copy = record.as_ref().and_then(|record| record.copy);
        let versions = record.as_ref().map(|record| record.versions.clone()).unwrap_or_default();
        let patch_in_doubt = record.as_ref().is_some_and(|record| record.state == State::RuntimePatching);
        let (pushed, seq) = match record {
            Some(record) if record.last_transition.term == term => (record.pushed, record.last_transition.seq),
            Some(record) => (None, record.last_transition.seq),
            None => (None, 0),
        };
        let machine = PodMachine::new(desired.checksums.clone(), pushed);
        // Pods that start together (a controller start, a new leader) spread their first drift
        // check over the second half of the interval, each at a point its UID picks.
        let mut jitter = seed(&target.uid.0);
        let fraction = next_fraction(&mut jitter);
        let pacing = desired.pacing;
        let mut drift_at = now + pacing.drift_interval.mul_f64(0.5 + 0.5 * fraction);
        // A write of the term before (its fence cut it short, the pod finished it anyway) can
        // land after the first verification: one more check once none can still land.
        if !pacing.write_settle.is_zero() {
            drift_at = drift_at.min(now + pacing.write_settle.mul_f64(1.0 + 0.2 * fraction));
        }
        Self {
            target,
            term,
            pacing,
            machine,
            seq,
            desired,
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
            push_reason: ReloadReason::Unverified,
            pending: VecDeque::from([Action::Verify]),
            retry_at: None,
            drift_at,
            jitter,
            restore_at: None,
            restore_failures: 0,
            pace: Pace::default(),
        }
    }

    /// The machine, for inspection.
    pub fn machine(&self) -> &PodMachine {
        &self.machine
    }

    /// The render the machine is told of.
    pub fn desired(&self) -> &Arc<Desired> {
        &self.desired
    }

    /// The next timer to fall due, and when. Timers are looked at only between bursts.
    pub fn next_timer(&self) -> (Instant, Timer) {
        let mut next = (self.drift_at, Timer::Drift);
        let timers = [
            (self.retry_at, Timer::Retry),
            (self.pace.waiting_until(), Timer::Pace),
            (self.restore_at, Timer::Restore),
        ];
        for (at, timer) in timers {
            if let Some(at) = at
                && at <= next.0
            {
                next = (at, timer);
            }
        }
        next
    }

    /// Takes one input at `clock` and says what the shell must do.
    pub fn step(&mut self, input: Input, clock: Clock) -> Output {
        let waiting_before = self.pace.waiting_until();
        let mut out = Output::default();
        let outside = matches!(input, Input::Render(_) | Input::Timer(_));
        let event = match input {
            Input::Render(desired) => {
                self.repace(desired.pacing, clock.now);
                self.take_render(desired, clock.now)
            }
            Input::Timer(Timer::Pace) => self.pace_due(clock.now),
            Input::Timer(Timer::Retry) => {
                self.retry_at = None;
                self.cause = Cause::Retry;
                Some(Event::RetryDue)
            }
            Input::Timer(Timer::Drift) => {
                // Every later check comes within the interval, a fifth of it at random earlier,
                // so the pods' checks stay spread however they started.
                let fraction = 0.8 + 0.2 * next_fraction(&mut self.jitter);
                self.drift_at = clock.now + self.pacing.drift_interval.mul_f64(fraction);
                self.cause = Cause::DriftCheck;
                Some(Event::DriftTick)
            }
            Input::Timer(Timer::Restore) => {
                self.restore_at = None;
                self.pending.push_back(Action::RestoreFiles);
                None
            }
            Input::Done(outcome) => self.outcome_event(outcome, clock.now, &mut out.notes),
            Input::CommitFailed => {
                // Never act on a transition that is not on disk: retry the step later.
                self.pending.clear();
                self.pace.push = false;
                self.retry_at = Some(clock.now + self.machine.retry_delay().max(Duration::from_secs(1)));
                None
            }
        };
        if let Some(event) = event {
            out.transition = self.apply(event, clock);
            if out.transition.is_some() {
                let paced_until = self.reload_paced_until(clock.now);
                self.pace.hold_push(&mut self.pending, paced_until);
            }
        }
        if outside && (out.transition.is_some() || !self.pending.is_empty()) {
            out.began = Some(self.cause);
        }
        let waiting_after = self.pace.waiting_until();
        if waiting_after != waiting_before {
            out.pace_note = Some(waiting_after.map(|until| clock.wall + until.saturating_duration_since(clock.now)));
        }
        out
    }

    /// The next action to perform, with what it needs, if the last transitions queued one.
    pub fn next_work(&mut self) -> Option<Work> {
        let action = self.pending.pop_front()?;
        let desired = self.desired.clone();
        Some(match action {
            Action::Verify => Work::Verify { known: self.copy, in_doubt: self.patch_in_doubt },
            Action::Validate => Work::Validate { desired },
            Action::Push => {
                // What the reload is for, from the files the pod ran, which are let go while the
                // push runs: until its answer the pod's files are in doubt, and from `Syncing`
                // only a full push follows, until `InSync` names the files anew. Kept, each pod
                // being pushed to held two renders' files (2–3 MB each at 10,000 Ingresses) for
                // the push's ten seconds under churn.
                self.push_reason = match self.cause {
                    Cause::DriftCheck => ReloadReason::Drift,
                    _ => crate::plan::reload_reason(self.pushed_files.as_deref(), &desired.files, self.address_changes),
                };
                self.pushed_files = None;
                Work::Push { desired, base: self.base_version }
            }
            Action::RuntimePatch => {
                // The patch was planned from the files the pod runs: its configuration is
                // rewritten when the desired one differs from theirs.
                let rewrite_config = self
                    .pushed_files
                    .as_ref()
                    .is_none_or(|pushed| pushed.haproxy_cfg.checksum != desired.files.haproxy_cfg.checksum);
                Work::RuntimePatch {
                    desired,
                    actions: self.runtime_actions.clone(),
                    rewrite_config,
                    base: self.base_version,
                }
            }
            Action::RestoreFiles => Work::RestoreFiles,
            // The retry timer is armed when its transition applies (`apply`), never queued.
            Action::ScheduleRetry => return self.next_work(),
        })
    }

    /// A new render: held aside while it needs a reload the pace does not allow yet (the
    /// latest one held replaces the one before), else told to the machine at once.
    fn take_render(&mut self, desired: Arc<Desired>, now: Instant) -> Option<Event> {
        let planned = self.runtime_plan(&desired);
        let needs_reload = planned.is_none() && self.machine.pushed.as_ref() != Some(&desired.checksums);
        if needs_reload && let Some(until) = self.reload_paced_until(now) {
            self.pace.until = Some(until);
            self.pace.render = Some(desired);
            return None;
        }
        // A render the pod can take without a reload supersedes one held for the pace.
        self.pace.render = None;
        self.cause = Cause::DesiredChanged;
        self.desired = desired;
        Some(self.desired_changed(planned))
    }

    /// Takes a new configuration's timing: a shorter drift interval brings the next check
    /// forward, and whatever waits for the reload pace waits for the new one.
    fn repace(&mut self, pacing: Pacing, now: Instant) {
        if pacing == self.pacing {
            return;
        }
        let shorter = pacing.drift_interval < self.pacing.drift_interval;
        self.pacing = pacing;
        if shorter {
            let fraction = 0.8 + 0.2 * next_fraction(&mut self.jitter);
            self.drift_at = self.drift_at.min(now + pacing.drift_interval.mul_f64(fraction));
        }
        if self.pace.until.is_some() {
            self.pace.until = Some(self.reload_paced_until(now).unwrap_or(now));
        }
    }

    /// The pace let a reload through: a held render goes to the machine (whatever push was held
    /// is for older files), else a held push is performed.
    fn pace_due(&mut self, now: Instant) -> Option<Event> {
        if let Some(until) = self.reload_paced_until(now) {
            // Another reload came in between: wait for the pace again.
            self.pace.until = Some(until);
            return None;
        }
        self.pace.until = None;
        if let Some(desired) = self.pace.render.take() {
            self.pace.push = false;
            self.cause = Cause::DesiredChanged;
            self.desired = desired;
            let planned = self.runtime_plan(&self.desired);
            return Some(self.desired_changed(planned));
        }
        if std::mem::take(&mut self.pace.push) {
            self.pending.push_front(Action::Push);
        }
        None
    }

    /// The machine's event for an action's outcome, after keeping what it says of the pod.
    fn outcome_event(&mut self, outcome: Outcome, now: Instant, notes: &mut Vec<Note>) -> Option<Event> {
        Some(match outcome {
            Outcome::Verified(Ok(reading)) => {
                self.base_version = Some(reading.version);
                self.address_changes = reading.address_changes;
                if reading.copy.is_some() {
                    self.copy = reading.copy;
                }
                self.versions = reading.versions;
                self.versions_read = true;
                self.unsupported().unwrap_or(Event::Verified { observed: Some(reading.observed) })
            }
            Outcome::Validated(Ok(Validation::Passed)) => Event::ValidationPassed,
            Outcome::Validated(Ok(Validation::Rejected(error))) => Event::ValidationRejected { error },
            Outcome::Pushed(Ok(copy)) => {
                self.last_reload = Some(now);
                notes.push(Note::Reloaded(self.push_reason));
                self.base_version = Some(copy.version);
                self.copy = Some(copy);
                self.patch_in_doubt = false;
                Event::Pushed { pushed: self.desired.checksums.clone() }
            }
            Outcome::Pushed(Err(error)) => {
                // A push that may have landed keeps its base: retried, it meets a conflict
                // and the pod is read again. A failed reload put an older file back.
                if !matches!(error, ActionError::Failed(_)) {
                    self.base_version = None;
                }
                failed(error, notes)
            }
            Outcome::Patched(Ok(Patched::Taken(copy))) => {
                notes.push(Note::RuntimeActions(self.runtime_actions.iter().map(RuntimeAction::kind).collect()));
                if let Some(copy) = copy {
                    self.base_version = Some(copy.version);
                    self.copy = Some(copy);
                }
                self.patch_in_doubt = false;
                Event::RuntimePatched { pushed: self.desired.checksums.clone() }
            }
            Outcome::Patched(Ok(Patched::NotTaken(written_at))) => {
                // The file may claim the new render without its effect: only the full
                // sync that follows may settle it, on top of the version it left.
                self.base_version = written_at;
                self.patch_in_doubt = true;
                Event::RuntimePatchMismatch
            }
            Outcome::Patched(Err(error)) => {
                if !matches!(error, ActionError::Failed(_)) {
                    self.base_version = None;
                }
                self.patch_in_doubt = true;
                failed(error, notes)
            }
            Outcome::Verified(Err(error)) | Outcome::Validated(Err(error)) => failed(error, notes),
            Outcome::Restored(Ok(())) => {
                self.restore_failures = 0;
                return None;
            }
            Outcome::Restored(Err(error)) => {
                // Tried again after a backoff (1 s doubling up to 5 minutes), until it is done.
                self.restore_failures = self.restore_failures.saturating_add(1);
                self.restore_at = Some(now + backoff(self.restore_failures, Duration::from_secs(300)));
                notes.push(Note::RestoreFailed(error));
                return None;
            }
        })
    }

    /// Steps the machine and queues its actions; the transition is the shell's to journal
    /// before any of them is performed. A step that changes nothing and calls for nothing (a
    /// drift tick on a pod waiting for new files) is not a transition: journaling it would
    /// bury the reason the pod waits.
    fn apply(&mut self, event: Event, clock: Clock) -> Option<Transitioned> {
        let before = self.machine.clone();
        let step = self.machine.step(&event);
        if step.row.is_none() || (self.machine == before && step.actions.is_empty()) {
            return None;
        }
        // Whatever push was held, the machine has decided its next actions anew.
        self.pace.push = false;
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
                at: clock.wall,
                from: step.from,
                to: step.to,
                reason: Some(event.kind()),
                error: self.machine.last_error.clone(),
                term: self.term,
                trace_id: None,
            },
        };
        // An action's answer settles the failure a pending retry was for: a retry left from
        // before it would repeat what was just answered (validate refused files again, push
        // twice). The answer's own failure schedules a retry anew.
        let answered = !matches!(event.kind(), EventKind::DesiredChanged | EventKind::RetryDue | EventKind::DriftTick);
        if answered {
            self.retry_at = None;
        }
        for action in &step.actions {
            match action {
                Action::ScheduleRetry => self.retry_at = Some(clock.now + self.machine.retry_delay()),
                other => self.pending.push_back(*other),
            }
        }
        if step.to == State::InSync {
            self.retry_at = None;
            // In sync means the pod runs exactly the desired files: the base of the next plan.
            self.pushed_files = Some(self.desired.files.clone());
        }
        Some(Transitioned { event, step, record, error_before: before.last_error })
    }

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
        Some(Event::Unsupported { desired: self.desired.checksums.clone(), reason: reason.to_string() })
    }

    /// Until when a reload must wait, if the last one was less than the pace ago.
    fn reload_paced_until(&self, now: Instant) -> Option<Instant> {
        let until = self.last_reload? + self.pacing.min_reload_interval;
        (now < until).then_some(until)
    }

    /// The runtime changes that take the pod from the files it runs to `desired`, when that is
    /// all it takes (see `plan::plan`); `None` calls for a full sync.
    fn runtime_plan(&self, desired: &Desired) -> Option<Vec<RuntimeAction>> {
        let pushed = self.pushed_files.as_ref()?;
        match crate::plan::plan(pushed, &desired.files, self.address_changes) {
            Plan::Runtime(actions) => Some(actions),
            Plan::NoOp | Plan::Full => None,
        }
    }
}

impl Pace {
    /// Holds a push at the head of `pending` while `paced_until` says a reload must wait.
    fn hold_push(&mut self, pending: &mut VecDeque<Action>, paced_until: Option<Instant>) {
        if let Some(until) = paced_until
            && pending.front() == Some(&Action::Push)
        {
            pending.pop_front();
            self.push = true;
            self.until = Some(until);
        }
    }
}

/// A jitter seed from a pod's UID (FNV-1a; never zero, which xorshift would keep).
fn seed(uid: &str) -> u64 {
    let hash = uid
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3));
    hash.max(1)
}

/// The next number in [0, 1) of a xorshift sequence.
fn next_fraction(state: &mut u64) -> f64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    // The top 53 bits, as many as an f64 holds exactly.
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// The machine's event for an action that did not complete.
fn failed(error: ActionError, notes: &mut Vec<Note>) -> Event {
    match error {
        ActionError::Failed(error) => Event::ActionFailed { error },
        ActionError::VersionConflict(detail) => {
            notes.push(Note::VersionConflict(detail));
            Event::VersionConflict
        }
        ActionError::ReloadFailed(error) => Event::ReloadFailed { error },
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use proptest::test_runner::FileFailurePersistence;

    use super::*;
    use crate::files::{Checksum, RenderedFile};
    use crate::pod::{FileChecksums, PodUid};

    const PACE: Duration = Duration::from_secs(2);
    const DRIFT: Duration = Duration::from_secs(1);
    /// How long each action on the model pod takes.
    const ACTION: Duration = Duration::from_millis(50);

    /// A render: `generation` changes need a reload, `address` changes are runtime-only, and a
    /// `refused` render is one HAProxy will not validate.
    fn render(generation: u32, address: u8, refused: bool) -> Arc<Desired> {
        let refusal = if refused { "    refused\n" } else { "" };
        Arc::new(Desired::new(FileSet {
            haproxy_cfg: RenderedFile::new(format!(
                "global\n    description {generation}\n{refusal}backend be_web\n    server srv1 10.0.0.{address}:8080\n"
            )),
            maps: BTreeMap::new(),
            files: BTreeMap::new(),
            certs: BTreeMap::new(),
        })
        .paced(PACING))
    }

    /// The tests' timing: drift checks every `DRIFT`, reloads paced by `PACE`.
    const PACING: Pacing = Pacing { drift_interval: DRIFT, min_reload_interval: PACE, write_settle: Duration::ZERO };

    fn refused(desired: &Desired) -> bool {
        desired.files.haproxy_cfg.content.contains("refused")
    }

    /// What happens to the pod between bursts of work.
    #[derive(Clone, Debug)]
    enum Happening {
        /// A render that needs a reload.
        Reload { refused: bool },
        /// A render only the Runtime API's address change separates from the last one.
        Address,
        /// Time passes, timers fall due.
        Wait(Duration),
        /// Someone edits the pod's configuration by hand.
        EditByHand,
        /// The pod's next actions fail (unreachable).
        Unreachable(u32),
        /// The journal cannot commit the next transition.
        JournalFails,
        /// The pod's next restores of refused files fail.
        RestoresFail(u32),
    }

    fn happening() -> impl Strategy<Value = Happening> {
        prop_oneof![
            4 => Just(Happening::Reload { refused: false }),
            1 => Just(Happening::Reload { refused: true }),
            3 => Just(Happening::Address),
            5 => (0u64..2500).prop_map(|ms| Happening::Wait(Duration::from_millis(ms))),
            1 => Just(Happening::EditByHand),
            1 => (1u32..4).prop_map(Happening::Unreachable),
            1 => Just(Happening::JournalFails),
            1 => (1u32..4).prop_map(Happening::RestoresFail),
        ]
    }

    /// A pod as the Dataplane API shows it, with the driver's world around it.
    struct World {
        core: DriverCore,
        now: Instant,
        wall: SystemTime,
        /// What the pod runs.
        runs: FileChecksums,
        /// Its configuration version.
        version: u64,
        /// Actions still to fail.
        failing: u32,
        /// Restores still to fail, and restores asked for.
        restores_failing: u32,
        restores: Vec<Instant>,
        journal_fails: bool,
        /// When each reload happened.
        reloads: Vec<Instant>,
        /// Validations asked of the pod.
        validations: u32,
        /// The last render handed to the driver.
        latest: Arc<Desired>,
        generation: u32,
        address: u8,
    }

    impl World {
        fn new() -> Self {
            let now = Instant::now();
            let target = PodTarget {
                uid: PodUid("uid-1".into()),
                namespace: "haptic".into(),
                name: "haproxy-0".into(),
                endpoint: "http://127.0.0.1:5555/v3".into(),
            };
            let first = render(0, 1, false);
            Self {
                core: DriverCore::new(target, LeaderTerm::default(), first.clone(), None, now),
                now,
                wall: SystemTime::UNIX_EPOCH,
                runs: Vec::new(),
                version: 1,
                failing: 0,
                restores_failing: 0,
                restores: Vec::new(),
                journal_fails: false,
                reloads: Vec::new(),
                validations: 0,
                latest: first,
                generation: 0,
                address: 1,
            }
        }

        fn clock(&self) -> Clock {
            Clock { now: self.now, wall: self.wall }
        }

        fn feed(&mut self, input: Input) {
            let output = self.core.step(input, self.clock());
            if output.transition.is_some() && std::mem::take(&mut self.journal_fails) {
                self.core.step(Input::CommitFailed, self.clock());
            }
        }

        /// Performs every action queued, one at a time, as the shell would.
        fn settle(&mut self) {
            while let Some(work) = self.core.next_work() {
                self.now += ACTION;
                let outcome = self.perform(work);
                self.feed(Input::Done(outcome));
            }
        }

        fn perform(&mut self, work: Work) -> Outcome {
            let unreachable = || ActionError::Failed("connection refused".into());
            let failing = self.failing > 0;
            self.failing = self.failing.saturating_sub(1);
            let conflict = |base: Option<ConfigVersion>, version| {
                (base != Some(ConfigVersion(version))).then(|| ActionError::VersionConflict("moved".into()))
            };
            match work {
                Work::Verify { .. } if failing => Outcome::Verified(Err(unreachable())),
                Work::Verify { .. } => Outcome::Verified(Ok(Reading {
                    observed: self.runs.clone(),
                    version: ConfigVersion(self.version),
                    copy: None,
                    address_changes: AddressChanges::Followed,
                    versions: PodVersions { haproxy: Some("2.8.25".into()), dataplane_api: None },
                })),
                Work::Validate { .. } if failing => {
                    self.validations += 1;
                    Outcome::Validated(Err(unreachable()))
                }
                Work::Validate { desired } if refused(&desired) => {
                    self.validations += 1;
                    Outcome::Validated(Ok(Validation::Rejected("[ALERT] line 3".into())))
                }
                Work::Validate { .. } => {
                    self.validations += 1;
                    Outcome::Validated(Ok(Validation::Passed))
                }
                Work::Push { .. } if failing => Outcome::Pushed(Err(unreachable())),
                Work::Push { desired, base } => {
                    if let Some(error) = conflict(base, self.version) {
                        return Outcome::Pushed(Err(error));
                    }
                    self.version += 1;
                    self.runs = desired.checksums.clone();
                    self.reloads.push(self.now);
                    let render = desired.files.haproxy_cfg.checksum;
                    let stored = Checksum::of(b"stored");
                    Outcome::Pushed(Ok(StoredCopy { render, stored, version: ConfigVersion(self.version) }))
                }
                Work::RuntimePatch { .. } if failing => Outcome::Patched(Err(unreachable())),
                Work::RuntimePatch { desired, base, .. } => {
                    if let Some(error) = conflict(base, self.version) {
                        return Outcome::Patched(Err(error));
                    }
                    self.version += 1;
                    self.runs = desired.checksums.clone();
                    let render = desired.files.haproxy_cfg.checksum;
                    let stored = Checksum::of(b"stored");
                    let copy = StoredCopy { render, stored, version: ConfigVersion(self.version) };
                    Outcome::Patched(Ok(Patched::Taken(Some(copy))))
                }
                Work::RestoreFiles => {
                    self.restores.push(self.now);
                    if self.restores_failing > 0 {
                        self.restores_failing -= 1;
                        Outcome::Restored(Err("connection refused".into()))
                    } else {
                        Outcome::Restored(Ok(()))
                    }
                }
            }
        }

        /// Lets `duration` pass, with every timer falling due in it.
        fn wait(&mut self, duration: Duration) {
            let until = self.now + duration;
            loop {
                self.settle();
                let (due, timer) = self.core.next_timer();
                if due > until {
                    break;
                }
                self.now = self.now.max(due);
                self.feed(Input::Timer(timer));
            }
            self.now = self.now.max(until);
        }

        fn happen(&mut self, happening: Happening) {
            self.settle();
            match happening {
                Happening::Reload { refused } => {
                    self.generation += 1;
                    self.give(render(self.generation, self.address, refused));
                }
                Happening::Address => {
                    self.address = self.address % 200 + 1;
                    let refused = refused(&self.latest);
                    self.give(render(self.generation, self.address, refused));
                }
                Happening::Wait(duration) => self.wait(duration),
                Happening::EditByHand => {
                    self.runs = render(9999, 9, false).checksums.clone();
                    self.version += 1;
                }
                Happening::Unreachable(actions) => self.failing = actions,
                Happening::JournalFails => self.journal_fails = true,
                Happening::RestoresFail(restores) => self.restores_failing = restores,
            }
        }

        fn give(&mut self, desired: Arc<Desired>) {
            self.latest = desired.clone();
            self.feed(Input::Render(desired));
        }
    }

    /// Found by the property test below: a validation that failed (the pod unreachable) left
    /// a retry timer; a drift tick validated meanwhile and HAProxy refused the files; the
    /// stale retry then validated the refused files again and put their uploads back again,
    /// a refusal retried on a timer.
    #[test]
    fn a_retry_left_from_an_unreachable_moment_does_not_validate_refused_files_again() {
        use Happening::{EditByHand, Reload, Unreachable, Wait};
        let ms = Duration::from_millis;
        let happenings = [
            Wait(ms(579)),
            Wait(ms(1089)),
            EditByHand,
            Reload { refused: false },
            Wait(ms(332)),
            Reload { refused: false },
            Wait(ms(845)),
            Reload { refused: false },
            Wait(ms(1036)),
            Wait(ms(1290)),
            Wait(ms(613)),
            Reload { refused: true },
            Unreachable(3),
            Wait(ms(1606)),
            Unreachable(3),
        ];
        let mut world = World::new();
        for happening in happenings {
            world.happen(happening);
        }
        world.wait(Duration::from_secs(30));
        assert!(world.core.machine().refused.is_some(), "the pod refused the render");
        let (validations, restores) = (world.validations, world.restores.len());
        world.wait(Duration::from_secs(120));
        assert_eq!((world.validations, world.restores.len()), (validations, restores), "refused files tried again");
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
            ..ProptestConfig::with_cases(512)
        })]

        /// Renders, runtime changes, drift, failures and journal trouble, interleaved with
        /// timers: reloads never come closer than the pace, and once things go quiet the pod
        /// runs the latest render (or, if the pod refused it, keeps its files), and is then left
        /// alone: no reload while nothing changes.
        #[test]
        fn reloads_keep_the_pace_and_a_quiet_pod_is_left_alone(
            happenings in proptest::collection::vec(happening(), 0..60),
        ) {
            let mut world = World::new();
            for happening in happenings {
                world.happen(happening);
            }
            for pair in world.reloads.windows(2) {
                prop_assert!(pair[1] - pair[0] >= PACE, "reloads {:?} apart", pair[1] - pair[0]);
            }
            // Quiet: every retry (backoff up to 8 s after three failures), the pace and the
            // restores of refused files (their own backoff) run out.
            world.wait(Duration::from_secs(30));
            for _ in 0..40 {
                if world.core.restore_at.is_none() {
                    break;
                }
                world.wait(Duration::from_secs(30));
            }
            prop_assert!(world.core.restore_at.is_none(), "restores still failing after 20 minutes");
            let settled = world.reloads.len();
            if refused(&world.latest) {
                prop_assert_ne!(&world.runs, &world.latest.checksums);
            } else {
                prop_assert_eq!(world.core.machine().state, State::InSync);
                prop_assert_eq!(&world.runs, &world.latest.checksums, "the pod runs the latest render");
            }
            let restores = world.restores.len();
            world.wait(Duration::from_secs(20));
            prop_assert_eq!(world.reloads.len(), settled, "a reload while nothing changed");
            prop_assert_eq!(world.restores.len(), restores, "files put back while nothing changed");
        }
    }

    #[test]
    fn pods_that_start_together_spread_their_drift_checks_within_the_interval() {
        let now = Instant::now();
        let pacing = Pacing { drift_interval: Duration::from_secs(60), ..PACING };
        let mut firsts = Vec::new();
        for pod in 0..20 {
            let target = PodTarget {
                uid: PodUid(format!("0b1c{pod}-uid")),
                namespace: "haptic".into(),
                name: format!("haproxy-{pod}"),
                endpoint: String::new(),
            };
            let first = Arc::new(Arc::unwrap_or_clone(render(0, 1, false)).paced(pacing));
            let mut core = DriverCore::new(target, LeaderTerm::default(), first, None, now);
            let (first, timer) = core.next_timer();
            assert_eq!(timer, Timer::Drift);
            assert!(first - now >= Duration::from_secs(30) && first - now <= Duration::from_secs(60));
            firsts.push((first - now).as_secs());
            let clock = Clock { now: first, wall: SystemTime::UNIX_EPOCH };
            core.step(Input::Timer(Timer::Drift), clock);
            let (second, _) = core.next_timer();
            assert!(second - first >= Duration::from_secs(48) && second - first <= Duration::from_secs(60));
        }
        firsts.sort_unstable();
        firsts.dedup();
        assert!(firsts.len() >= 12, "20 pods' first checks fall in {} distinct seconds", firsts.len());
    }

    /// `desired` with `pacing`.
    fn paced(desired: &Arc<Desired>, pacing: Pacing) -> Arc<Desired> {
        Arc::new(Desired::clone(desired).paced(pacing))
    }

    /// A new configuration's drift interval takes effect with its first render, not when the
    /// fleet next starts (issue #46: it was read only when the fleet started).
    #[test]
    fn a_shorter_drift_interval_in_a_render_brings_the_next_check_forward() {
        let mut world = World::new();
        let target = world.core.target.clone();
        world.latest = paced(&world.latest, Pacing { drift_interval: Duration::from_secs(600), ..PACING });
        world.core = DriverCore::new(target, LeaderTerm::default(), world.latest.clone(), None, world.now);
        world.wait(Duration::from_secs(2));
        assert_eq!(world.core.machine().state, State::InSync);
        world.happen(Happening::EditByHand);
        world.wait(Duration::from_secs(5));
        assert_ne!(&world.runs, &world.latest.checksums, "no check within 5 s of a 600 s interval");
        // The same files, from a configuration that checks every second.
        let faster = paced(&world.latest, Pacing { drift_interval: Duration::from_secs(1), ..PACING });
        world.give(faster);
        world.wait(Duration::from_secs(2));
        assert_eq!(&world.runs, &world.latest.checksums, "the edit is undone within the new interval");
    }

    /// A render held for a long reload pace goes out as soon as a configuration with a shorter
    /// pace is rendered, and a longer pace holds the next reload longer.
    #[test]
    fn a_new_reload_pace_takes_effect_with_the_next_render() {
        let mut world = World::new();
        let target = world.core.target.clone();
        let slow = Pacing { min_reload_interval: Duration::from_secs(300), ..PACING };
        world.latest = paced(&world.latest, slow);
        world.core = DriverCore::new(target, LeaderTerm::default(), world.latest.clone(), None, world.now);
        world.wait(Duration::from_secs(2));
        world.give(paced(&render(1, 1, false), slow));
        world.wait(Duration::from_secs(2));
        let reloads = world.reloads.len();
        world.give(paced(&render(2, 1, false), slow));
        world.wait(Duration::from_secs(10));
        assert_eq!(world.reloads.len(), reloads, "held for the 300 s pace");
        world.give(paced(&render(2, 1, false), PACING));
        world.wait(Duration::from_secs(1));
        assert_eq!(world.reloads.len(), reloads + 1, "the 2 s pace lets it through at once");
        assert_eq!(&world.runs, &world.latest.checksums);
    }

    /// A write of the last leader's term that its fence cut short, which the pod finished after
    /// the new driver's first verification, is found once no such write can still land, not a
    /// whole drift interval later.
    #[test]
    fn a_write_of_the_term_before_that_lands_after_the_first_check_is_found_when_writes_have_settled() {
        let mut world = World::new();
        let settle = Duration::from_secs(30);
        let target = world.core.target.clone();
        let pacing = Pacing { drift_interval: Duration::from_secs(600), write_settle: settle, ..PACING };
        world.latest = Arc::new(Arc::unwrap_or_clone(world.latest.clone()).paced(pacing));
        world.core = DriverCore::new(target, LeaderTerm::default(), world.latest.clone(), None, world.now);
        world.wait(Duration::from_secs(2));
        assert_eq!(world.core.machine().state, State::InSync);
        let reloads = world.reloads.len();
        // The last term's push lands now.
        world.happen(Happening::EditByHand);
        world.wait(settle.mul_f64(1.2));
        assert_eq!(&world.runs, &world.latest.checksums, "the late write is undone within the settle time");
        assert_eq!(world.reloads.len(), reloads + 1);
        // And the checks go back to the interval.
        let (next, timer) = world.core.next_timer();
        assert_eq!(timer, Timer::Drift);
        assert!(next - world.now >= Duration::from_secs(400), "{:?}", next - world.now);
    }

    #[test]
    fn putting_back_a_refused_configurations_files_is_tried_again_until_done_and_validates_nothing() {
        let mut world = World::new();
        world.wait(Duration::from_secs(3));
        world.restores_failing = 2;
        world.happen(Happening::Reload { refused: true });
        world.wait(Duration::from_secs(30));
        let gaps: Vec<Duration> = world.restores.windows(2).map(|pair| pair[1] - pair[0]).collect();
        assert_eq!(world.restores.len(), 3, "refused, put back twice in vain, then done: {gaps:?}");
        assert!(gaps[0] >= Duration::from_secs(1) && gaps[1] >= Duration::from_secs(2), "backoff: {gaps:?}");
        assert_eq!(world.core.machine().state, State::Validating, "the refusal stands; nothing validated again");
    }

    /// The defect this core was written to end: a render held for the pace while a drift repair
    /// ran was pushed by the repair without the machine knowing, which then found the push
    /// "not desired" and validated and pushed again, back to back, for ever.
    #[test]
    fn a_drift_repair_while_a_render_waits_for_the_pace_is_one_reload_of_what_the_machine_knows() {
        let mut world = World::new();
        world.wait(Duration::from_millis(500));
        assert_eq!(world.reloads.len(), 1);
        world.happen(Happening::Reload { refused: false });
        world.happen(Happening::EditByHand);
        world.wait(Duration::from_secs(10));
        assert_eq!(world.runs, world.latest.checksums);
        // The repair's push waits for the pace, and the held render supersedes it then: one
        // reload brings the pod back and to the latest render.
        assert_eq!(world.reloads.len(), 2, "the first push, then the latest render: {:?}", world.reloads);
    }
}
