//! Persisted record types, one per schema version, kept apart from the in-memory types and
//! converted by hand: a stored record's shape is a compatibility promise, the in-memory
//! types are free to change.

use serde::{Deserialize, Serialize};

use crate::pod::{EventKind, State};

/// The schema version this build writes.
pub const SCHEMA_VERSION: u16 = 6;

/// A pod's current record, schema 1.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PodRecordV1 {
    pub(crate) uid: String,
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) state: u8,
    pub(crate) pushed: Option<Vec<(String, [u8; 32])>>,
    pub(crate) config_version: Option<u64>,
    pub(crate) last: TransitionRecordV1,
}

/// One entry of a pod's transition log, schema 1.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TransitionRecordV1 {
    pub(crate) seq: u64,
    pub(crate) at_ms: u64,
    pub(crate) from: u8,
    pub(crate) to: u8,
    pub(crate) reason: String,
    pub(crate) error: Option<String>,
}

/// A pod's current record, schema 2: schema 1 with the leader term and trace id on its
/// last transition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PodRecordV2 {
    pub(crate) uid: String,
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) state: u8,
    pub(crate) pushed: Option<Vec<(String, [u8; 32])>>,
    pub(crate) config_version: Option<u64>,
    pub(crate) last: TransitionRecordV2,
}

/// One entry of a pod's transition log, schema 2: the leader term of the replica that wrote
/// it (0: written without leader election) and the trace of the reconciliation it belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TransitionRecordV2 {
    pub(crate) seq: u64,
    pub(crate) at_ms: u64,
    pub(crate) from: u8,
    pub(crate) to: u8,
    pub(crate) reason: String,
    pub(crate) error: Option<String>,
    pub(crate) term: u64,
    pub(crate) trace_id: Option<[u8; 16]>,
}

impl From<TransitionRecordV1> for TransitionRecordV2 {
    /// Schema 1 knew no terms or traces: term 0, no trace.
    fn from(v1: TransitionRecordV1) -> Self {
        Self {
            seq: v1.seq,
            at_ms: v1.at_ms,
            from: v1.from,
            to: v1.to,
            reason: v1.reason,
            error: v1.error,
            term: 0,
            trace_id: None,
        }
    }
}

impl From<PodRecordV1> for PodRecordV2 {
    fn from(v1: PodRecordV1) -> Self {
        Self {
            uid: v1.uid,
            namespace: v1.namespace,
            name: v1.name,
            state: v1.state,
            pushed: v1.pushed,
            config_version: v1.config_version,
            last: v1.last.into(),
        }
    }
}

/// A pod's current record, schema 3: schema 2 with the push its configuration file is a copy
/// of, as the pod stores it (the Dataplane API rewrites what it is sent in its own layout), in
/// place of the configuration version alone (which schema 2 never filled).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PodRecordV3 {
    pub(crate) uid: String,
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) state: u8,
    pub(crate) pushed: Option<Vec<(String, [u8; 32])>>,
    pub(crate) copy: Option<StoredCopyV1>,
    pub(crate) last: TransitionRecordV2,
}

/// A push as the pod stores it, version 1: the rendered file's checksum, the stored file's
/// checksum (without its version lines) and the configuration version the push left.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredCopyV1 {
    pub(crate) render: [u8; 32],
    pub(crate) stored: [u8; 32],
    pub(crate) version: u64,
}

impl From<PodRecordV2> for PodRecordV3 {
    /// Schema 2 knew no stored copies: the next verification learns nothing from the journal
    /// about the file and reads what the pod says.
    fn from(v2: PodRecordV2) -> Self {
        Self {
            uid: v2.uid,
            namespace: v2.namespace,
            name: v2.name,
            state: v2.state,
            pushed: v2.pushed,
            copy: None,
            last: v2.last,
        }
    }
}

/// A pod's current record, schema 4: schema 3 with the versions the pod reports (HAProxy's
/// and the Dataplane API's), as last read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PodRecordV4 {
    pub(crate) uid: String,
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) state: u8,
    pub(crate) pushed: Option<Vec<(String, [u8; 32])>>,
    pub(crate) copy: Option<StoredCopyV1>,
    pub(crate) versions: VersionsV1,
    pub(crate) last: TransitionRecordV2,
}

/// The versions a pod reports, version 1 (`None`: not read, or not said).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct VersionsV1 {
    pub(crate) haproxy: Option<String>,
    pub(crate) dataplane_api: Option<String>,
}

impl From<PodRecordV3> for PodRecordV4 {
    /// Schema 3 kept no versions: unknown until the next verification reads them.
    fn from(v3: PodRecordV3) -> Self {
        Self {
            uid: v3.uid,
            namespace: v3.namespace,
            name: v3.name,
            state: v3.state,
            pushed: v3.pushed,
            copy: v3.copy,
            versions: VersionsV1::default(),
            last: v3.last,
        }
    }
}

/// One entry of a pod's transition log, schema 6: schema 2 with the reason as a code
/// (`reason_code`) instead of the event kind's name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TransitionRecordV3 {
    pub(crate) seq: u64,
    pub(crate) at_ms: u64,
    pub(crate) from: u8,
    pub(crate) to: u8,
    pub(crate) reason: u8,
    pub(crate) error: Option<String>,
    pub(crate) term: u64,
    pub(crate) trace_id: Option<[u8; 16]>,
}

impl From<TransitionRecordV2> for TransitionRecordV3 {
    /// Schema 2 to 5 wrote the event kind's name: read as the kind of that name, and a name
    /// no kind has (none was ever renamed) as "not known".
    fn from(v2: TransitionRecordV2) -> Self {
        Self {
            seq: v2.seq,
            at_ms: v2.at_ms,
            from: v2.from,
            to: v2.to,
            reason: reason_code(EventKind::from_name(&v2.reason)),
            error: v2.error,
            term: v2.term,
            trace_id: v2.trace_id,
        }
    }
}

/// A pod's current record, schema 6: schema 4 with its last transition a
/// `TransitionRecordV3`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PodRecordV5 {
    pub(crate) uid: String,
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) state: u8,
    pub(crate) pushed: Option<Vec<(String, [u8; 32])>>,
    pub(crate) copy: Option<StoredCopyV1>,
    pub(crate) versions: VersionsV1,
    pub(crate) last: TransitionRecordV3,
}

impl From<PodRecordV4> for PodRecordV5 {
    fn from(v4: PodRecordV4) -> Self {
        Self {
            uid: v4.uid,
            namespace: v4.namespace,
            name: v4.name,
            state: v4.state,
            pushed: v4.pushed,
            copy: v4.copy,
            versions: v4.versions,
            last: v4.last.into(),
        }
    }
}

/// The server slots of one configuration, version 1: per backend, per slot, the endpoint
/// (address, port) it holds or nothing. Stored in a tree of its own, added within schema 2:
/// a build that does not know it leaves it alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SlotsV1 {
    pub(crate) backends: Vec<(String, Vec<StoredSlotV1>)>,
}

/// The server slots of one backend of one configuration, version 1: per slot the endpoint it
/// holds or nothing. Stored in a tree of its own (`backend_slots`, keyed by configuration and
/// backend), added within schema 4, so a render that moves a few endpoints writes a few small
/// records, not its configuration's every backend (`SlotsV1`, 2 MB at 10,000 backends).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BackendSlotsV1 {
    pub(crate) slots: Vec<StoredSlotV1>,
}

/// One slot on disk: the endpoint (address, port) it holds, or nothing.
pub(crate) type StoredSlotV1 = Option<(String, u16)>;

/// The auxiliary files a validation replaced on one pod, version 1: per file its storage kind
/// (`storage_code`), its name, and the checksum (in the files tree) of what it replaced, or
/// nothing when it was new. Stored in a tree of its own, added within schema 3.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct UploadsV1 {
    pub(crate) files: Vec<(u8, String, Option<[u8; 32]>)>,
}

/// The journal's metadata, every schema (unchanged).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MetaV1 {
    pub(crate) schema: u16,
}

/// Stable codes for states on disk; never reuse or renumber one.
pub fn state_code(state: State) -> u8 {
    match state {
        State::Unknown => 0,
        State::Validating => 1,
        State::Syncing => 2,
        State::RuntimePatching => 3,
        State::InSync => 4,
        State::Drifted => 5,
    }
}

/// Stable codes for transition reasons on disk (0: not known); never reuse or renumber one.
pub fn reason_code(reason: Option<EventKind>) -> u8 {
    match reason {
        None => 0,
        Some(EventKind::DesiredChanged) => 1,
        Some(EventKind::Verified) => 2,
        Some(EventKind::ValidationPassed) => 3,
        Some(EventKind::ValidationRejected) => 4,
        Some(EventKind::Pushed) => 5,
        Some(EventKind::RuntimePatched) => 6,
        Some(EventKind::RuntimePatchMismatch) => 7,
        Some(EventKind::VersionConflict) => 8,
        Some(EventKind::ReloadFailed) => 9,
        Some(EventKind::ActionFailed) => 10,
        Some(EventKind::RetryDue) => 11,
        Some(EventKind::DriftTick) => 12,
        Some(EventKind::Unsupported) => 13,
    }
}

/// The reason a code stands for (`None`: not known, whatever the code).
pub fn reason_from_code(code: u8) -> Option<EventKind> {
    EventKind::ALL.into_iter().find(|kind| reason_code(Some(*kind)) == code)
}

/// The state a code stands for.
pub fn state_from_code(code: u8) -> Option<State> {
    Some(match code {
        0 => State::Unknown,
        1 => State::Validating,
        2 => State::Syncing,
        3 => State::RuntimePatching,
        4 => State::InSync,
        5 => State::Drifted,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_has_a_code_that_round_trips() {
        for state in State::ALL {
            assert_eq!(state_from_code(state_code(state)), Some(state));
        }
        assert_eq!(state_from_code(99), None);
    }

    #[test]
    fn every_reason_has_its_own_code_that_round_trips_and_schema_5_names_are_read() {
        let mut codes: Vec<u8> = EventKind::ALL.into_iter().map(|kind| reason_code(Some(kind))).collect();
        for kind in EventKind::ALL {
            assert_eq!(reason_from_code(reason_code(Some(kind))), Some(kind));
        }
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), EventKind::ALL.len());
        assert!(!codes.contains(&0), "0 is 'not known'");
        assert_eq!(reason_from_code(0), None);
        assert_eq!(reason_from_code(200), None);
        let v2 = |reason: &str| TransitionRecordV2 {
            seq: 1,
            at_ms: 0,
            from: 0,
            to: 1,
            reason: reason.into(),
            error: None,
            term: 0,
            trace_id: None,
        };
        // Schema 5 stored `format!("{:?}", kind)`.
        for kind in EventKind::ALL {
            let upgraded = TransitionRecordV3::from(v2(&format!("{kind:?}")));
            assert_eq!(reason_from_code(upgraded.reason), Some(kind));
        }
        assert_eq!(TransitionRecordV3::from(v2("SomethingElse")).reason, 0);
    }
}
