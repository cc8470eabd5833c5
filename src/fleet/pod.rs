//! The plain data of one pod's deployment: who the pod is, what it should run, what reading,
//! validating, pushing or patching it came to, and the driver's settings. Both the driver's
//! pure core and its IO shell speak these types; nothing here does IO.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::config::HaproxyVersion;
use crate::dataplane::ConfigVersion;
use crate::files::FileSet;
use crate::plan::AddressChanges;
use crate::pod::{FileChecksums, PodUid, PodVersions, StoredCopy};
use crate::telemetry::traces::TraceParent;

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
    /// The timing of the configuration that rendered them.
    pub pacing: Pacing,
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
        Self { files: Arc::new(files), checksums, trace: None, minimum_haproxy: None, pacing: Pacing::default() }
    }

    /// The same render, for pods whose HAProxy is at least `minimum`.
    pub fn requiring(self, minimum: Option<HaproxyVersion>) -> Self {
        Self { minimum_haproxy: minimum, ..self }
    }

    /// The same render, timed by `pacing`.
    pub fn paced(self, pacing: Pacing) -> Self {
        Self { pacing, ..self }
    }

    /// The same render, traced under `trace`.
    pub fn traced(self, trace: Option<TraceParent>) -> Self {
        Self { trace, ..self }
    }

    /// The checksum of the desired `haproxy.cfg`, as spans show it.
    pub fn main_checksum(&self) -> String {
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

/// The configuration's timing of a pod's work. It travels with every render (`Desired`), so a
/// new configuration's timing takes effect with its first render, not at the next leader term.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pacing {
    /// How often an InSync pod is checked for drift.
    pub drift_interval: Duration,
    /// The least time between two reloads of this pod: a render that needs one sooner waits,
    /// and renders meanwhile coalesce into that one reload. Runtime patches are not paced.
    pub min_reload_interval: Duration,
    /// How long a write begun before this driver started (by another leader, or by this
    /// controller before a restart) may still land on the pod: a write its fence cut short
    /// can be finished by the pod after the first verification. The pod is verified once more
    /// when that has passed (zero: no second check). Read when a driver starts.
    pub write_settle: Duration,
}

impl Default for Pacing {
    /// The configuration's defaults (`driftPreventionInterval` 60 s, `minDeploymentInterval`
    /// 2 s), without the second check.
    fn default() -> Self {
        Self {
            drift_interval: Duration::from_secs(60),
            min_reload_interval: Duration::from_secs(2),
            write_settle: Duration::ZERO,
        }
    }
}
