//! The ground floor: what every layer knows of an HAProxy pod. Its identity (the pod UID),
//! the leader term a record was written in, where its state machine stands, the checksums of
//! the files it runs, the push it stores and the versions it reports. The fleet drives pods
//! with these, the journal keeps them, the API shows them; this module calls nothing above it.

use std::fmt;

use crate::dataplane::ConfigVersion;
use crate::files::Checksum;

/// A pod's identity: its UID. A pod recreated under the same name is a new pod.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodUid(pub String);

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The leader term of the replica that wrote a record: each new lease holder gets a higher
/// one. 0 means written without leader election.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaderTerm(pub u64);

impl fmt::Display for LeaderTerm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Where a pod stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum State {
    /// Not verified since the controller started (or since the pod became unreachable).
    Unknown,
    /// The desired configuration is being validated on the pod.
    Validating,
    /// The validated configuration is being pushed.
    Syncing,
    /// A runtime-only change is being applied without a reload.
    RuntimePatching,
    /// The pod runs exactly the desired files.
    InSync,
    /// The pod differs from what was pushed to it; it is being re-deployed.
    Drifted,
}

impl State {
    /// Every state, in diagram order.
    pub const ALL: [State; 6] =
        [State::Unknown, State::Validating, State::Syncing, State::RuntimePatching, State::InSync, State::Drifted];
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The checksums of one complete file set (config, maps, general files), in a stable order.
pub type FileChecksums = Vec<(String, Checksum)>;

/// What a pod's state machine took a transition on: the kind of event, without its data. It
/// indexes the transition table and is the reason each journaled transition records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A new render is desired for the pod.
    DesiredChanged,
    /// A verification read what the pod runs.
    Verified,
    /// The pod's HAProxy accepted the desired configuration.
    ValidationPassed,
    /// The pod's HAProxy refused the desired configuration.
    ValidationRejected,
    /// A push (and its reload) succeeded.
    Pushed,
    /// A runtime patch applied and read back as intended.
    RuntimePatched,
    /// A runtime patch did not read back as intended.
    RuntimePatchMismatch,
    /// Someone else wrote the configuration since it was last read.
    VersionConflict,
    /// The pod's HAProxy failed to reload the pushed files.
    ReloadFailed,
    /// An action could not be completed.
    ActionFailed,
    /// The retry time of the current failure came.
    RetryDue,
    /// The drift-prevention interval passed.
    DriftTick,
    /// The pod cannot be given the desired files (its HAProxy is below the minimum).
    Unsupported,
}

impl EventKind {
    /// Every kind.
    pub const ALL: [EventKind; 13] = [
        Self::DesiredChanged,
        Self::Verified,
        Self::ValidationPassed,
        Self::ValidationRejected,
        Self::Pushed,
        Self::RuntimePatched,
        Self::RuntimePatchMismatch,
        Self::VersionConflict,
        Self::ReloadFailed,
        Self::ActionFailed,
        Self::RetryDue,
        Self::DriftTick,
        Self::Unsupported,
    ];

    /// Its name, as the API, the diagrams and schema 5's journal records spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::DesiredChanged => "DesiredChanged",
            Self::Verified => "Verified",
            Self::ValidationPassed => "ValidationPassed",
            Self::ValidationRejected => "ValidationRejected",
            Self::Pushed => "Pushed",
            Self::RuntimePatched => "RuntimePatched",
            Self::RuntimePatchMismatch => "RuntimePatchMismatch",
            Self::VersionConflict => "VersionConflict",
            Self::ReloadFailed => "ReloadFailed",
            Self::ActionFailed => "ActionFailed",
            Self::RetryDue => "RetryDue",
            Self::DriftTick => "DriftTick",
            Self::Unsupported => "Unsupported",
        }
    }

    /// The kind a name stands for.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
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

/// The versions a pod reports, as read (`None`: it did not say, or could not be asked).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodVersions {
    /// HAProxy's, from its runtime (`2.8.25-5cf5d0683`).
    pub haproxy: Option<String>,
    /// The Dataplane API's (`v3.2.7 3f1e3ef3`).
    pub dataplane_api: Option<String>,
}
