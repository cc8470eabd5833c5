//! The per-pod state machine: the transition table as data, and the pure step over it.
//!
//! A pod's machine holds what the controller wants the pod to run (`desired`), what it last
//! pushed successfully (`pushed`, journaled), and the current failure if any. Events are the
//! results of actions (verification, validation, push, runtime patch) and outside news (a new
//! render, the drift timer, a retry falling due). [`PodMachine::step`] finds the first row of
//! [`TABLE`] matching the state, the event and the row's guard, and returns the actions the
//! driver must perform; the driver journals the transition before performing any of them.
//! Failures stay in their state with an error and a retry time (backoff), never a state of
//! their own.

use std::fmt;
use std::time::Duration;

use crate::pod::{EventKind, FileChecksums, State};

/// Something that happened to a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A new render is desired for the pod; `runtime_only` says the planner found every
    /// difference from what was pushed runtime-eligible.
    DesiredChanged {
        /// The new desired checksums.
        desired: FileChecksums,
        /// Whether the change from `pushed` can be applied without a reload.
        runtime_only: bool,
    },
    /// The cheap check read what the pod runs (`None` when it cannot be matched to any push).
    Verified {
        /// The pod's current checksums as far as they can be read.
        observed: Option<FileChecksums>,
    },
    /// The pod's HAProxy accepted the desired configuration (`only_validate`).
    ValidationPassed,
    /// The pod's HAProxy refused the desired configuration; nothing will be pushed.
    ValidationRejected {
        /// HAProxy's message.
        error: String,
    },
    /// The push (and its reload) succeeded with exactly these checksums.
    Pushed {
        /// What the pod now runs.
        pushed: FileChecksums,
    },
    /// The runtime patch applied and read back as intended.
    RuntimePatched {
        /// What the pod now runs.
        pushed: FileChecksums,
    },
    /// The runtime patch did not read back as intended; a full sync follows.
    RuntimePatchMismatch,
    /// The pod's configuration version was not the one the action was based on: someone
    /// wrote in between, so what the pod runs must be read again (after a backoff) before
    /// anything is pushed.
    VersionConflict,
    /// HAProxy on the pod refused to reload with the pushed configuration; the Dataplane API
    /// put the last good file back and HAProxy still runs it. Like a rejected validation, the
    /// same desired files are not pushed to this pod again.
    ReloadFailed {
        /// HAProxy's output.
        error: String,
    },
    /// An action could not be completed (unreachable, timeout, 5xx, reload failed).
    ActionFailed {
        /// What went wrong.
        error: String,
    },
    /// The retry time of the current failure has come.
    RetryDue,
    /// The drift-prevention interval has passed.
    DriftTick,
    /// The pod cannot be given the desired files at all (its HAProxy is older than the
    /// configuration's minimum, or does not say): it is left as it is, and only read again
    /// on the drift timer or a new render. Stands in for the `Verified` or `DesiredChanged`
    /// that found it so.
    Unsupported {
        /// The desired checksums (as `DesiredChanged` would carry them).
        desired: FileChecksums,
        /// Why, naming both versions.
        reason: String,
    },
}

impl Event {
    /// The kind of this event.
    pub fn kind(&self) -> EventKind {
        match self {
            Self::DesiredChanged { .. } => EventKind::DesiredChanged,
            Self::Verified { .. } => EventKind::Verified,
            Self::ValidationPassed => EventKind::ValidationPassed,
            Self::ValidationRejected { .. } => EventKind::ValidationRejected,
            Self::Pushed { .. } => EventKind::Pushed,
            Self::RuntimePatched { .. } => EventKind::RuntimePatched,
            Self::RuntimePatchMismatch => EventKind::RuntimePatchMismatch,
            Self::VersionConflict => EventKind::VersionConflict,
            Self::ReloadFailed { .. } => EventKind::ReloadFailed,
            Self::ActionFailed { .. } => EventKind::ActionFailed,
            Self::RetryDue => EventKind::RetryDue,
            Self::DriftTick => EventKind::DriftTick,
            Self::Unsupported { .. } => EventKind::Unsupported,
        }
    }
}

/// What the driver must do after a transition (after journaling it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Read the pod's configuration version, checksum and auxiliary files.
    Verify,
    /// Upload changed auxiliary files and validate the desired configuration on the pod.
    Validate,
    /// Push the validated configuration as one raw update and confirm the reload.
    Push,
    /// Apply the runtime-only change without a reload and read it back.
    RuntimePatch,
    /// Put back the auxiliary files uploaded for a rejected configuration.
    RestoreFiles,
    /// Arm the retry timer for the current failure (backoff from the attempt count).
    ScheduleRetry,
}

/// A condition on the machine's data that a row needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Guard {
    /// No condition.
    Always,
    /// What was last pushed is exactly what is desired.
    PushedIsDesired,
    /// What was last pushed is not what is desired.
    PushedIsNotDesired,
    /// The pod runs what was pushed, and that is what is desired.
    ObservedIsPushedIsDesired,
    /// The pod does not run what was pushed (or it cannot be told).
    ObservedIsNotPushed,
    /// The pod runs what was pushed and the change from it to `desired` is runtime-only.
    RuntimeOnly,
    /// This pod refused the desired files (validation or reload): wait for others.
    Refused,
}

impl fmt::Display for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Always => "",
            Self::PushedIsDesired => "pushed = desired",
            Self::PushedIsNotDesired => "pushed ≠ desired",
            Self::ObservedIsPushedIsDesired => "observed = pushed = desired",
            Self::ObservedIsNotPushed => "observed ≠ pushed",
            Self::RuntimeOnly => "runtime-only",
            Self::Refused => "desired refused",
        })
    }
}

/// One row of the transition table.
#[derive(Clone, Copy, Debug)]
pub struct Transition {
    /// The state the row applies in.
    pub from: State,
    /// The event it applies to.
    pub on: EventKind,
    /// The condition it needs.
    pub guard: Guard,
    /// The state after.
    pub to: State,
    /// What the driver must do.
    pub actions: &'static [Action],
}

const fn row(from: State, on: EventKind, guard: Guard, to: State, actions: &'static [Action]) -> Transition {
    Transition { from, on, guard, to, actions }
}

use Action::*;
use EventKind as E;
use Guard as G;
use State::*;

/// The transition table. Rows are tried in order; the first whose state, event and guard
/// match applies. A (state, event) with no matching row leaves the machine unchanged: the
/// driver only delivers results of the action in flight, so such an event is stray.
/// The drift timer fires only when no action is in flight, so in every state but InSync it
/// re-drives the pending work: no state can be left waiting for an answer that never comes.
pub const TABLE: &[Transition] = &[
    // Start, and after losing track of a pod: verify before anything else.
    row(Unknown, E::Verified, G::ObservedIsPushedIsDesired, InSync, &[]),
    row(Unknown, E::Verified, G::RuntimeOnly, RuntimePatching, &[RuntimePatch]),
    // Files this pod refused are not tried again until the desired files change (a version
    // conflict after the refusal reads the pod again; that is no reason to retry).
    row(Unknown, E::Verified, G::Refused, Validating, &[]),
    row(Unknown, E::Verified, G::Always, Validating, &[Validate]),
    row(Unknown, E::DesiredChanged, G::Always, Unknown, &[Verify]),
    row(Unknown, E::ActionFailed, G::Always, Unknown, &[ScheduleRetry]),
    row(Unknown, E::RetryDue, G::Always, Unknown, &[Verify]),
    row(Unknown, E::DriftTick, G::Always, Unknown, &[Verify]),
    // Validation: a refusal never leads to a push; the uploaded files are put back.
    row(Validating, E::ValidationPassed, G::Always, Syncing, &[Push]),
    row(Validating, E::ValidationRejected, G::Always, Validating, &[RestoreFiles]),
    row(Validating, E::ActionFailed, G::Always, Validating, &[ScheduleRetry]),
    row(Validating, E::RetryDue, G::Always, Validating, &[Validate]),
    row(Validating, E::DesiredChanged, G::PushedIsDesired, Unknown, &[Verify]),
    // A render of the very files this pod refused (another object changed, a pod's
    // readiness moved): nothing new to try.
    row(Validating, E::DesiredChanged, G::Refused, Validating, &[]),
    row(Validating, E::DesiredChanged, G::Always, Validating, &[Validate]),
    // Refused files are not tried again on a timer: a reload storm helps no one.
    row(Validating, E::DriftTick, G::Refused, Validating, &[]),
    row(Validating, E::DriftTick, G::Always, Validating, &[Validate]),
    // Push.
    row(Syncing, E::Pushed, G::PushedIsDesired, InSync, &[]),
    row(Syncing, E::Pushed, G::PushedIsNotDesired, Validating, &[Validate]),
    row(Syncing, E::ReloadFailed, G::Always, Validating, &[RestoreFiles]),
    row(Syncing, E::VersionConflict, G::Always, Unknown, &[ScheduleRetry]),
    row(Syncing, E::ActionFailed, G::Always, Syncing, &[ScheduleRetry]),
    row(Syncing, E::RetryDue, G::Always, Syncing, &[Push]),
    row(Syncing, E::DesiredChanged, G::Always, Validating, &[Validate]),
    row(Syncing, E::DriftTick, G::Always, Syncing, &[Push]),
    // Runtime patch: anything unexpected falls back to a full sync.
    row(RuntimePatching, E::RuntimePatched, G::PushedIsDesired, InSync, &[]),
    row(RuntimePatching, E::RuntimePatched, G::PushedIsNotDesired, Validating, &[Validate]),
    row(RuntimePatching, E::RuntimePatchMismatch, G::Always, Validating, &[Validate]),
    row(RuntimePatching, E::VersionConflict, G::Always, Unknown, &[ScheduleRetry]),
    row(RuntimePatching, E::ActionFailed, G::Always, RuntimePatching, &[ScheduleRetry]),
    row(RuntimePatching, E::RetryDue, G::Always, RuntimePatching, &[RuntimePatch]),
    row(RuntimePatching, E::DesiredChanged, G::PushedIsDesired, InSync, &[]),
    row(RuntimePatching, E::DesiredChanged, G::RuntimeOnly, RuntimePatching, &[RuntimePatch]),
    row(RuntimePatching, E::DesiredChanged, G::Always, Validating, &[Validate]),
    row(RuntimePatching, E::DriftTick, G::Always, RuntimePatching, &[RuntimePatch]),
    // In sync: act on new renders and on drift.
    row(InSync, E::DesiredChanged, G::PushedIsDesired, InSync, &[]),
    row(InSync, E::DesiredChanged, G::RuntimeOnly, RuntimePatching, &[RuntimePatch]),
    row(InSync, E::DesiredChanged, G::Always, Validating, &[Validate]),
    row(InSync, E::DriftTick, G::Always, InSync, &[Verify]),
    row(InSync, E::Verified, G::ObservedIsPushedIsDesired, InSync, &[]),
    row(InSync, E::Verified, G::ObservedIsNotPushed, Drifted, &[Validate]),
    row(InSync, E::Verified, G::Always, Validating, &[Validate]),
    row(InSync, E::ActionFailed, G::Always, Unknown, &[ScheduleRetry]),
    // Drifted: re-deploy what is desired.
    row(Drifted, E::ValidationPassed, G::Always, Syncing, &[Push]),
    row(Drifted, E::ValidationRejected, G::Always, Validating, &[RestoreFiles]),
    row(Drifted, E::ActionFailed, G::Always, Drifted, &[ScheduleRetry]),
    row(Drifted, E::RetryDue, G::Always, Drifted, &[Validate]),
    row(Drifted, E::DesiredChanged, G::Always, Drifted, &[Validate]),
    row(Drifted, E::DriftTick, G::Always, Drifted, &[Validate]),
    // A pod the configuration does not support (its HAProxy is too old) is left alone, whatever
    // it was doing, and read again on the drift timer (from Unknown, above).
    row(Unknown, E::Unsupported, G::Always, Unknown, &[]),
    row(Validating, E::Unsupported, G::Always, Unknown, &[]),
    row(Syncing, E::Unsupported, G::Always, Unknown, &[]),
    row(RuntimePatching, E::Unsupported, G::Always, Unknown, &[]),
    row(InSync, E::Unsupported, G::Always, Unknown, &[]),
    row(Drifted, E::Unsupported, G::Always, Unknown, &[]),
];

/// A pod's machine: its state and the data its guards read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodMachine {
    /// Where the pod stands.
    pub state: State,
    /// What the controller wants the pod to run.
    pub desired: FileChecksums,
    /// Whether the change from `pushed` to `desired` is runtime-only (from the planner).
    pub runtime_only: bool,
    /// What was last pushed successfully (journaled).
    pub pushed: Option<FileChecksums>,
    /// What the last verification read, if it was the last thing learned about the pod.
    pub observed: Option<FileChecksums>,
    /// The current failure, if any.
    pub last_error: Option<String>,
    /// Consecutive failures, for backoff.
    pub attempts: u32,
    /// Desired files this pod refused (validation or reload), until the desired files change.
    pub refused: Option<FileChecksums>,
}

/// The result of one step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The state before.
    pub from: State,
    /// The state after.
    pub to: State,
    /// The row that applied, if any (`None`: the event changed nothing).
    pub row: Option<usize>,
    /// What the driver must do, after journaling the step.
    pub actions: Vec<Action>,
}

impl PodMachine {
    /// A pod seen for the first time, or resumed from the journal with what was pushed to it.
    /// It starts Unknown, so its first action is a verification.
    pub fn new(desired: FileChecksums, pushed: Option<FileChecksums>) -> Self {
        Self {
            state: Unknown,
            desired,
            runtime_only: false,
            pushed,
            observed: None,
            last_error: None,
            attempts: 0,
            refused: None,
        }
    }

    fn holds(&self, guard: Guard) -> bool {
        let pushed_is_desired = self.pushed.as_ref() == Some(&self.desired);
        let observed_is_pushed = self.observed.is_some() && self.observed == self.pushed;
        match guard {
            G::Always => true,
            G::PushedIsDesired => pushed_is_desired,
            G::PushedIsNotDesired => !pushed_is_desired,
            G::ObservedIsPushedIsDesired => observed_is_pushed && pushed_is_desired,
            G::ObservedIsNotPushed => !observed_is_pushed,
            // A runtime patch is computed from what was pushed: the pod must run exactly that.
            G::RuntimeOnly => self.runtime_only && observed_is_pushed && !pushed_is_desired,
            G::Refused => self.refused.as_ref() == Some(&self.desired),
        }
    }

    /// Applies one event: updates the data it carries, then takes the first matching row.
    /// An event no row takes changes nothing at all, data included.
    pub fn step(&mut self, event: &Event) -> Step {
        let from = self.state;
        let before = self.clone();
        match event {
            Event::DesiredChanged { desired, runtime_only } => {
                if *desired != self.desired {
                    self.refused = None;
                }
                self.desired = desired.clone();
                self.runtime_only = *runtime_only;
            }
            Event::Verified { observed } => {
                self.observed = observed.clone();
                // A pod found running exactly the desired files has been given them, whoever
                // pushed them (another replica, an earlier term): nothing to redeploy.
                if observed.as_ref() == Some(&self.desired) {
                    self.pushed = observed.clone();
                }
            }
            Event::Pushed { pushed } | Event::RuntimePatched { pushed } => {
                self.pushed = Some(pushed.clone());
                self.observed = Some(pushed.clone());
                self.refused = None;
            }
            Event::ValidationRejected { error } | Event::ReloadFailed { error } => {
                self.last_error = Some(error.clone());
                self.attempts = self.attempts.saturating_add(1);
                self.refused = Some(self.desired.clone());
            }
            Event::ActionFailed { error } => {
                self.last_error = Some(error.clone());
                self.attempts = self.attempts.saturating_add(1);
            }
            Event::VersionConflict => {
                // Verified again after a backoff: a pod someone keeps writing is no hot loop.
                self.last_error = Some("the pod's configuration version moved under the push: verifying again".into());
                self.attempts = self.attempts.saturating_add(1);
            }
            Event::Unsupported { desired, reason } => {
                if *desired != self.desired {
                    self.refused = None;
                }
                self.desired = desired.clone();
                // Whatever was planned against what the pod ran, the next change is a full sync.
                self.runtime_only = false;
                self.last_error = Some(reason.clone());
            }
            Event::ValidationPassed | Event::RuntimePatchMismatch | Event::RetryDue | Event::DriftTick => {}
        }
        let kind = event.kind();
        let found = TABLE.iter().position(|t| t.from == from && t.on == kind && self.holds(t.guard));
        let Some(index) = found else {
            *self = before;
            return Step { from, to: from, row: None, actions: Vec::new() };
        };
        let transition = &TABLE[index];
        self.state = transition.to;
        // Success clears the failure; a verification that found the pod as intended does too.
        // (A render of files this pod already refused keeps the refusal's error on show.)
        // A refusal lasts until the desired files change or a push takes (see above): a
        // verification or a validation passing says nothing about whether HAProxy would
        // reload with them, and keeps the refusal's error on show.
        let success = matches!(kind, E::ValidationPassed | E::Pushed | E::RuntimePatched | E::Verified);
        if (success || kind == E::DesiredChanged) && self.refused.is_none() {
            self.last_error = None;
            self.attempts = 0;
        }
        Step { from, to: transition.to, row: Some(index), actions: transition.actions.to_vec() }
    }

    /// How long to wait before retrying the current failure: 1 s doubling up to 5 minutes.
    pub fn retry_delay(&self) -> Duration {
        backoff(self.attempts, Duration::from_secs(300))
    }
}

/// The wait after `failures` failures in a row: 1 s, doubling with each, up to `cap`.
pub fn backoff(failures: u32, cap: Duration) -> Duration {
    Duration::from_secs(1u64 << failures.saturating_sub(1).min(16)).min(cap)
}

/// The state machine as a Mermaid `stateDiagram-v2`, generated from [`TABLE`].
pub fn mermaid() -> String {
    let mut out = String::from("%% Generated by `haptic state-diagram` from src/fleet/machine.rs; do not edit.\n");
    out.push_str("stateDiagram-v2\n    [*] --> Unknown : pod discovered / Verify\n");
    for t in TABLE {
        let mut label = t.on.name().to_owned();
        if t.guard != G::Always {
            label.push_str(&format!(" [{}]", t.guard));
        }
        if !t.actions.is_empty() {
            let actions: Vec<String> = t.actions.iter().map(|a| format!("{a:?}")).collect();
            label.push_str(&format!(" / {}", actions.join(", ")));
        }
        out.push_str(&format!("    {} --> {} : {}\n", t.from, t.to, label));
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use proptest::test_runner::FileFailurePersistence;

    use super::*;
    use crate::files::Checksum;

    fn files(tag: u8) -> FileChecksums {
        vec![("haproxy.cfg".into(), Checksum::of(&[tag]))]
    }

    #[test]
    fn a_new_pod_is_verified_validated_pushed_and_in_sync() {
        let mut pod = PodMachine::new(files(1), None);
        assert_eq!(pod.step(&Event::Verified { observed: None }).actions, [Validate]);
        assert_eq!(pod.step(&Event::ValidationPassed).actions, [Push]);
        assert_eq!(pod.step(&Event::Pushed { pushed: files(1) }).to, InSync);
    }

    #[test]
    fn resume_of_an_in_sync_pod_writes_nothing() {
        let mut pod = PodMachine::new(files(1), Some(files(1)));
        let step = pod.step(&Event::Verified { observed: Some(files(1)) });
        assert_eq!((step.to, step.actions), (InSync, vec![]));
    }

    #[test]
    fn a_pod_already_running_the_desired_files_is_adopted_without_a_push() {
        // A new leader with no record of the pod (or one from an older term): the pod is the truth.
        let mut pod = PodMachine::new(files(1), None);
        let step = pod.step(&Event::Verified { observed: Some(files(1)) });
        assert_eq!((step.to, step.actions), (InSync, vec![]));
        assert_eq!(pod.pushed, Some(files(1)));
        let mut stale = PodMachine::new(files(1), Some(files(7)));
        assert_eq!(stale.step(&Event::Verified { observed: Some(files(1)) }).to, InSync);
    }

    #[test]
    fn out_of_band_changes_are_drift_and_are_undone() {
        let mut pod = PodMachine::new(files(1), Some(files(1)));
        pod.step(&Event::Verified { observed: Some(files(1)) });
        assert_eq!(pod.step(&Event::DriftTick).actions, [Verify]);
        let step = pod.step(&Event::Verified { observed: Some(files(9)) });
        assert_eq!((step.to, step.actions), (Drifted, vec![Validate]));
        pod.step(&Event::ValidationPassed);
        assert_eq!(pod.step(&Event::Pushed { pushed: files(1) }).to, InSync);
    }

    #[test]
    fn a_rejected_validation_puts_files_back_and_waits_for_a_new_render() {
        let mut pod = PodMachine::new(files(1), Some(files(1)));
        pod.step(&Event::Verified { observed: Some(files(1)) });
        pod.step(&Event::DesiredChanged { desired: files(2), runtime_only: false });
        let step = pod.step(&Event::ValidationRejected { error: "[ALERT] line 3".into() });
        assert_eq!((step.to, step.actions), (Validating, vec![RestoreFiles]));
        assert_eq!(pod.last_error.as_deref(), Some("[ALERT] line 3"));
        assert_eq!(pod.step(&Event::RetryDue).actions, [Validate], "a retry validates again, never pushes");
    }

    #[test]
    fn failures_back_off_inside_their_state() {
        let mut pod = PodMachine::new(files(1), None);
        pod.step(&Event::Verified { observed: None });
        pod.step(&Event::ValidationPassed);
        for expected in [1, 2, 4, 8] {
            let step = pod.step(&Event::ActionFailed { error: "connection refused".into() });
            assert_eq!((step.to, step.actions), (Syncing, vec![ScheduleRetry]));
            assert_eq!(pod.retry_delay(), Duration::from_secs(expected));
            assert_eq!(pod.step(&Event::RetryDue).actions, [Push]);
        }
    }

    #[test]
    fn a_failed_reload_keeps_the_last_good_files_and_is_not_pushed_again_until_the_render_changes() {
        let mut pod = PodMachine::new(files(1), Some(files(1)));
        pod.step(&Event::Verified { observed: Some(files(1)) });
        pod.step(&Event::DesiredChanged { desired: files(2), runtime_only: false });
        pod.step(&Event::ValidationPassed);
        let step = pod.step(&Event::ReloadFailed { error: "cannot bind socket".into() });
        assert_eq!((step.to, step.actions), (Validating, vec![RestoreFiles]));
        assert_eq!(pod.pushed, Some(files(1)), "the pod runs its last good files");
        assert_eq!(pod.last_error.as_deref(), Some("cannot bind socket"));
        for _ in 0..5 {
            assert_eq!(pod.step(&Event::DriftTick).actions, [], "no push on a timer");
        }
        // A render of the same files (another object changed, a pod's readiness moved) is
        // nothing new to try: validating would pass and push them into the same failure.
        let same = pod.step(&Event::DesiredChanged { desired: files(2), runtime_only: false });
        assert_eq!(same.actions, [], "the refused files are not validated again");
        assert_eq!(pod.last_error.as_deref(), Some("cannot bind socket"), "the refusal stays on show");
        assert_eq!(pod.step(&Event::DriftTick).actions, [], "the same files stay refused");
        // Read again (a version conflict sends a pod back to verification): still refused.
        pod.state = Unknown;
        let verified = pod.step(&Event::Verified { observed: Some(files(1)) });
        assert_eq!((verified.to, verified.actions), (Validating, vec![]));
        assert_eq!(pod.refused, Some(files(2)));
        assert_eq!(pod.last_error.as_deref(), Some("cannot bind socket"));
        pod.step(&Event::DesiredChanged { desired: files(3), runtime_only: false });
        assert_eq!(pod.refused, None, "new files are a new chance");
        assert_eq!(pod.step(&Event::ValidationPassed).actions, [Push]);
    }

    #[test]
    fn a_version_conflict_sends_the_pod_back_to_verification() {
        let mut pod = PodMachine::new(files(1), None);
        pod.step(&Event::Verified { observed: None });
        pod.step(&Event::ValidationPassed);
        let step = pod.step(&Event::VersionConflict);
        assert_eq!((step.to, step.actions), (Unknown, vec![ScheduleRetry]));
        assert_eq!(pod.step(&Event::RetryDue).actions, [Verify]);
        let step = pod.step(&Event::Verified { observed: Some(files(1)) });
        assert_eq!((step.to, step.actions), (InSync, vec![]), "someone else pushed the desired files");
    }

    #[test]
    fn the_diagram_has_one_edge_per_row() {
        assert_eq!(mermaid().lines().filter(|l| l.contains("-->")).count(), TABLE.len() + 1);
    }

    #[test]
    fn the_committed_diagram_matches_the_table() {
        let committed = include_str!("../../state-diagrams/pod-state-machine.mmd");
        assert!(
            committed == mermaid(),
            "state-diagrams/pod-state-machine.mmd is out of date: run `haptic state-diagram > state-diagrams/pod-state-machine.mmd`"
        );
    }

    #[test]
    fn an_unsupported_pod_is_left_alone_from_any_state_and_read_again_on_the_drift_timer() {
        for state in State::ALL {
            let mut pod = PodMachine::new(files(2), Some(files(1)));
            pod.state = state;
            let step = pod.step(&Event::Unsupported { desired: files(2), reason: "HAProxy 2.6.12 is older".into() });
            assert_eq!((step.to, step.actions.as_slice()), (Unknown, &[][..]), "from {state}");
            assert_eq!(pod.last_error.as_deref(), Some("HAProxy 2.6.12 is older"));
            assert_eq!(pod.pushed, Some(files(1)), "what the pod runs is still known");
        }
        let mut pod = PodMachine::new(files(2), Some(files(1)));
        pod.step(&Event::Unsupported { desired: files(2), reason: "too old".into() });
        assert_eq!(pod.step(&Event::DriftTick).actions, [Verify]);
        // Supported again (the minimum was lowered, the pod upgraded): deployed as any pod.
        assert_eq!(pod.step(&Event::Verified { observed: Some(files(1)) }).actions, [Validate]);
        assert_eq!(pod.last_error, None);
    }

    fn checksums() -> impl Strategy<Value = FileChecksums> {
        (0u8..3).prop_map(files)
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            (checksums(), any::<bool>())
                .prop_map(|(desired, runtime_only)| Event::DesiredChanged { desired, runtime_only }),
            proptest::option::of(checksums()).prop_map(|observed| Event::Verified { observed }),
            Just(Event::ValidationPassed),
            Just(Event::ValidationRejected { error: "rejected".into() }),
            checksums().prop_map(|pushed| Event::Pushed { pushed }),
            checksums().prop_map(|pushed| Event::RuntimePatched { pushed }),
            Just(Event::RuntimePatchMismatch),
            Just(Event::VersionConflict),
            Just(Event::ReloadFailed { error: "cannot bind".into() }),
            Just(Event::ActionFailed { error: "unreachable".into() }),
            Just(Event::RetryDue),
            Just(Event::DriftTick),
            checksums().prop_map(|desired| Event::Unsupported { desired, reason: "HAProxy 2.6 < 2.8".into() }),
        ]
    }

    /// Answers the machine's actions the way a healthy pod with a valid config would.
    fn healthy_answer(pod: &PodMachine, action: Action) -> Option<Event> {
        match action {
            Verify => Some(Event::Verified { observed: pod.pushed.clone() }),
            Validate => Some(Event::ValidationPassed),
            Push => Some(Event::Pushed { pushed: pod.desired.clone() }),
            RuntimePatch => Some(Event::RuntimePatched { pushed: pod.desired.clone() }),
            RestoreFiles | ScheduleRetry => None,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig {
        // Regressions live beside the source, not in a directory at the top of the project.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::with_cases(512)
    })]

        /// Invariants over any sequence of events: InSync only with pushed = desired, and a
        /// Push only while the current desired has passed validation.
        #[test]
        fn in_sync_needs_a_push_of_exactly_the_desired_and_rejections_never_push(
            start_pushed in proptest::option::of(checksums()),
            desired in checksums(),
            events in proptest::collection::vec(event(), 0..60),
        ) {
            let mut pod = PodMachine::new(desired, start_pushed);
            let mut validated = false;
            for event in &events {
                let desired_before = pod.desired.clone();
                let step = pod.step(event);
                if step.row.is_some() {
                    if matches!(event, Event::ValidationPassed) { validated = true; }
                    if matches!(event, Event::ValidationRejected { .. }) { validated = false; }
                }
                if pod.desired != desired_before { validated = false; }
                if step.actions.contains(&Push) {
                    prop_assert!(validated, "Push without a passed validation of the current desired: {event:?} in {:?}", step.from);
                }
                if pod.state == InSync {
                    prop_assert_eq!(pod.pushed.as_ref(), Some(&pod.desired));
                }
            }
        }

        /// From anywhere, a healthy pod with a valid configuration reaches InSync: the retry
        /// timer or the drift timer gets it going, and the actions then succeed.
        #[test]
        fn every_state_leads_back_to_in_sync_when_all_is_healthy(
            start_pushed in proptest::option::of(checksums()),
            desired in checksums(),
            events in proptest::collection::vec(event(), 0..40),
        ) {
            let mut pod = PodMachine::new(desired, start_pushed);
            for event in &events { pod.step(event); }
            let mut pending: Vec<Action> = vec![];
            for _ in 0..20 {
                if pod.state == InSync { break; }
                let action = pending.pop();
                let next = match action.and_then(|a| healthy_answer(&pod, a)) {
                    Some(event) => event,
                    // Nothing in flight: time passes, so a retry or the drift timer fires.
                    None => if pod.last_error.is_some() { Event::RetryDue } else { Event::DriftTick },
                };
                let step = pod.step(&next);
                pending = step.actions.into_iter().filter(|a| !matches!(a, RestoreFiles | ScheduleRetry)).collect();
                if pod.last_error.is_some() && pending.is_empty() && pod.state == Validating {
                    // A rejected configuration waits for a new render: give it a valid one.
                    let desired = pod.desired.clone();
                    pending = pod.step(&Event::DesiredChanged { desired, runtime_only: false }).actions;
                }
            }
            prop_assert_eq!(pod.state, InSync, "stuck: {:?}", pod);
        }
    }
}
