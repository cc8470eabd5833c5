//! Journal: what every pod was last given and how it got there, in sled, so a restarted
//! controller knows what each pod runs.
//!
//! Behind this one small interface: per pod UID its current record (state, last-pushed
//! checksums, configuration version, last transition, last error); an append-only transition
//! log per pod with bounded retention; file contents stored once by checksum. Every value is a
//! versioned record ([`codec`], [`records`]). A commit is flushed to disk before it returns, so
//! no network call acts on a transition that could be lost. A journal that cannot be opened or
//! read is moved aside and a fresh one started: the journal speeds restarts, the pods are the
//! truth, and every pod is verified anyway.

pub mod codec;
mod contents;
mod records;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sled::Transactional;
use thiserror::Error;
use tracing::{error, info};

use crate::dataplane::{ConfigVersion, StorageKind};
use crate::files::Checksum;
use crate::pod::{EventKind, FileChecksums, LeaderTerm, PodUid, PodVersions, State, StoredCopy};
use crate::telemetry::traces::TraceId;
use codec::{CodecError, RecordKind};
pub use records::SCHEMA_VERSION;
use records::{
    BackendSlotsV1, MetaV1, PodRecordV1, PodRecordV2, PodRecordV3, PodRecordV4, PodRecordV5, SlotsV1, StoredCopyV1,
    TransitionRecordV1, TransitionRecordV2, TransitionRecordV3, UploadsV1, VersionsV1, reason_code, reason_from_code,
    state_code, state_from_code,
};

/// One transition, as the log keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransitionEntry {
    /// Its number in the pod's log (1, 2, ...).
    pub seq: u64,
    /// When it was committed.
    pub at: SystemTime,
    /// The state before.
    pub from: State,
    /// The state after.
    pub to: State,
    /// The event it was taken on (`None`: a record of an older schema whose reason this build
    /// does not know).
    pub reason: Option<EventKind>,
    /// The failure it recorded, if any.
    pub error: Option<String>,
    /// The leader term of the replica that wrote it.
    pub term: LeaderTerm,
    /// The trace of the reconciliation it belongs to, when traces are exported.
    pub trace_id: Option<TraceId>,
}

/// A pod as the journal knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournaledPod {
    /// Its identity.
    pub uid: PodUid,
    /// Its namespace.
    pub namespace: String,
    /// Its name (for people; identity is the UID).
    pub name: String,
    /// Its state after the last transition.
    pub state: State,
    /// What was last pushed to it successfully.
    pub pushed: Option<FileChecksums>,
    /// The last push to it, as it stores it (with the configuration version it left).
    pub copy: Option<StoredCopy>,
    /// The versions it reported when last read.
    pub versions: PodVersions,
    /// The last transition.
    pub last_transition: TransitionEntry,
}

/// An auxiliary file a validation replaced on a pod, and what it replaced: what is put back
/// when the pod refuses the files it came with, even after a restart.
#[derive(Clone, PartialEq, Eq)]
pub struct PendingUpload {
    /// Which storage.
    pub kind: StorageKind,
    /// The file's name there.
    pub name: String,
    /// What was there before, or `None` when the file was new.
    pub original: Option<Vec<u8>>,
}

impl fmt::Debug for PendingUpload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Certificates hold keys: the content is never shown.
        f.debug_struct("PendingUpload")
            .field("kind", &self.kind)
            .field("name", &self.name)
            .field("original_bytes", &self.original.as_ref().map(Vec::len))
            .finish()
    }
}

/// Stable codes for storage kinds on disk.
fn storage_code(kind: StorageKind) -> u8 {
    match kind {
        StorageKind::Maps => 0,
        StorageKind::General => 1,
        StorageKind::Certificates => 2,
    }
}

fn storage_from_code(code: u8) -> Option<StorageKind> {
    Some(match code {
        0 => StorageKind::Maps,
        1 => StorageKind::General,
        2 => StorageKind::Certificates,
        _ => return None,
    })
}

/// Errors of the journal, each saying what it was doing.
#[derive(Debug, Error)]
pub enum JournalError {
    /// Journal work panicked on the blocking pool.
    #[error("journal work panicked: {0}")]
    WorkPanicked(String),
    /// sled failed (disk full, I/O error...); the message says what to do where it can tell.
    #[error("journal at {dir}: {action}: {source}{}", store_hint(source))]
    Store {
        /// The journal directory.
        dir: PathBuf,
        /// What was being done.
        action: &'static str,
        /// sled's error.
        source: sled::Error,
    },
    /// A stored record does not decode.
    #[error("journal at {dir}: {what}: {source}")]
    Record {
        /// The journal directory.
        dir: PathBuf,
        /// Which record.
        what: String,
        /// Why.
        source: CodecError,
    },
    /// Moving an unreadable journal aside failed.
    #[error("journal at {dir} is unreadable ({why}) and could not be moved aside: {source}")]
    MoveAside {
        /// The journal directory.
        dir: PathBuf,
        /// Why it was unreadable.
        why: String,
        /// Why the move failed.
        source: std::io::Error,
    },
    /// Reading or writing a stored file content failed.
    #[error("journal file content {path}: {action}: {source}")]
    Contents {
        /// The content's file (or the contents directory).
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// A stored file content no longer matches the checksum it is stored under.
    #[error("journal file content {path} no longer matches its checksum (corrupt on disk)")]
    CorruptContent {
        /// The content's file.
        path: PathBuf,
    },
}

impl JournalError {
    /// Whether another handle (a process, or one of ours not yet released) holds the lock.
    fn is_lock_held(&self) -> bool {
        matches!(self, Self::Store { source: sled::Error::Io(error), .. } if error.to_string().contains("could not acquire lock"))
    }

    /// Whether sled found its files corrupt (as opposed to unreachable or locked).
    fn is_corruption(&self) -> bool {
        matches!(self, Self::Store { source: sled::Error::Corruption { .. }, .. })
    }
}

/// What an operator can do about a store failure, where its cause is plain: a journal the
/// controller crash-loops on must say why in the one line it leaves.
fn store_hint(source: &sled::Error) -> &'static str {
    let sled::Error::Io(error) = source else { return "" };
    if error.to_string().contains("could not acquire lock") {
        " (another haptic process holds this journal: each replica needs a volume of its own, \
         and a replica being replaced must stop before its successor opens the same volume)"
    } else if error.kind() == std::io::ErrorKind::PermissionDenied {
        " (the directory is not writable by the controller's user: the chart sets fsGroup on the \
         journal volume; check the volume's ownership)"
    } else if error.raw_os_error() == Some(28) {
        " (the volume is full: grow it, or lower --journal-retention)"
    } else if error.raw_os_error() == Some(30) {
        " (the volume is mounted read-only)"
    } else {
        ""
    }
}

/// What opening the journal found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenReport {
    /// Where an unreadable journal was moved, and why it was unreadable.
    pub moved_aside: Option<(PathBuf, String)>,
    /// How many pods the journal knows.
    pub pods: usize,
    /// The older schema the journal was upgraded from on this open, if any.
    pub upgraded_from: Option<u16>,
}

/// The open journal.
pub struct Journal {
    dir: PathBuf,
    db: sled::Db,
    pods: sled::Tree,
    log: sled::Tree,
    /// File contents as schemas before 5 kept them, in sled; moved to `contents` by the upgrade.
    legacy_files: sled::Tree,
    /// File contents by checksum (originals of uploads to put back), outside sled.
    contents: contents::Contents,
    /// Held while uploads are recorded or settled and contents collected: a content stored for
    /// one pod's upload is not collected before the record that refers to it is written.
    uploads_lock: std::sync::Mutex<()>,
    /// `SlotsV1` records (every backend of a configuration in one), as builds before
    /// `backend_slots` wrote them: read when a configuration has no record there, removed
    /// once its slots are written again.
    slots: sled::Tree,
    /// `BackendSlotsV1` records, keyed by [`backend_slots_key`].
    backend_slots: sled::Tree,
    uploads: sled::Tree,
    retention: u64,
    /// Every pod's current record, as last committed: read by the API and the status every
    /// second, from memory (decoded once at open, replaced at each commit), never from disk.
    snapshot: std::sync::RwLock<std::collections::BTreeMap<String, JournaledPod>>,
    /// Pods whose next reload waits for the pace (`minDeploymentInterval`), until when: where
    /// a pod stands between two transitions, kept in memory only (a restart forgets it, and
    /// the pod's driver sets it again).
    paced: std::sync::RwLock<std::collections::BTreeMap<String, SystemTime>>,
}

/// sled's default cache is 1 GiB; the journal's working set is a few records per pod.
const CACHE_BYTES: u64 = 16 * 1024 * 1024;
/// How many backends' slot records go into one sled batch.
const SLOT_BATCH: usize = 256;
const SCHEMA_KEY: &[u8] = b"schema";
/// Lock attempts 50 ms apart before a held lock is reported (another process holds it).
const LOCK_RETRIES: u32 = 20;

/// Runs journal work (an fsync, a read of the store) on tokio's blocking pool and awaits it:
/// no async worker, which lease renewal shares, waits on the disk. The error is the work's, or
/// the work's panic.
pub async fn on_blocking_pool<T: Send + 'static>(
    journal: &std::sync::Arc<Journal>,
    work: impl FnOnce(&Journal) -> Result<T, JournalError> + Send + 'static,
) -> Result<T, JournalError> {
    let journal = std::sync::Arc::clone(journal);
    tokio::task::spawn_blocking(move || work(&journal))
        .await
        .unwrap_or_else(|panicked| Err(JournalError::WorkPanicked(panicked.to_string())))
}

impl Journal {
    /// Opens (or creates) the journal in `dir`, keeping the last `retention` transitions per
    /// pod. An unreadable journal is moved aside to `<dir>.unreadable-<unix seconds>` and a
    /// fresh one is opened in its place.
    pub fn open(dir: &Path, retention: u64) -> Result<(Self, OpenReport), JournalError> {
        // sled releases its file lock only when its last background job for a dropped handle
        // ends; a reopen right after a close (in this process) may find it still held.
        let mut attempt = 0;
        let opened = loop {
            match Self::open_checked(dir, retention) {
                Err(OpenFailure::Store(error)) if error.is_lock_held() && attempt < LOCK_RETRIES => {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(50));
                }
                other => break other,
            }
        };
        match opened {
            Ok((journal, upgraded_from)) => {
                let pods = journal.pods.len();
                info!(dir = %dir.display(), pods, schema = SCHEMA_VERSION, ?upgraded_from, "journal opened");
                Ok((journal, OpenReport { moved_aside: None, pods, upgraded_from }))
            }
            // Not being able to open the store at all (another process holds its lock, the disk
            // is gone) is not a bad journal: moving it aside could throw away a live one.
            Err(OpenFailure::Store(error)) if !error.is_corruption() => Err(error),
            Err(why) => {
                let why = why.to_string();
                let seconds = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
                let aside = PathBuf::from(format!("{}.unreadable-{seconds}", dir.display()));
                std::fs::rename(dir, &aside).map_err(|source| JournalError::MoveAside {
                    dir: dir.to_owned(),
                    why: why.clone(),
                    source,
                })?;
                error!(dir = %dir.display(), moved_to = %aside.display(), reason = %why,
                       "journal unreadable: moved aside; starting a fresh one, every pod will be verified");
                let (journal, _) = Self::open_checked(dir, retention).map_err(|e| match e {
                    OpenFailure::Store(error) => error,
                    other => JournalError::Record {
                        dir: dir.to_owned(),
                        what: "a fresh journal".into(),
                        source: CodecError::Encode { kind: RecordKind::Meta, detail: other.to_string() },
                    },
                })?;
                Ok((journal, OpenReport { moved_aside: Some((aside, why)), pods: 0, upgraded_from: None }))
            }
        }
    }

    /// Opens the store, checks its schema and every pod record, and upgrades an older schema.
    fn open_checked(dir: &Path, retention: u64) -> Result<(Self, Option<u16>), OpenFailure> {
        let store = |action: &'static str| {
            let dir = dir.to_owned();
            move |source| OpenFailure::Store(JournalError::Store { dir, action, source })
        };
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(CACHE_BYTES)
            .flush_every_ms(None)
            .open()
            .map_err(store("opening"))?;
        let journal = Self {
            dir: dir.to_owned(),
            pods: db.open_tree("pods").map_err(store("opening the pods tree"))?,
            log: db.open_tree("log").map_err(store("opening the log tree"))?,
            legacy_files: db.open_tree("files").map_err(store("opening the files tree"))?,
            contents: contents::Contents::open(dir).map_err(OpenFailure::Store)?,
            uploads_lock: std::sync::Mutex::new(()),
            slots: db.open_tree("slots").map_err(store("opening the slots tree"))?,
            backend_slots: db.open_tree("backend_slots").map_err(store("opening the backend slots tree"))?,
            uploads: db.open_tree("uploads").map_err(store("opening the uploads tree"))?,
            db,
            retention: retention.max(1),
            snapshot: Default::default(),
            paced: Default::default(),
        };
        let schema = match journal.db.get(SCHEMA_KEY).map_err(store("reading the schema version"))? {
            None if journal.pods.is_empty() => {
                journal.write_schema().map_err(OpenFailure::Store)?;
                SCHEMA_VERSION
            }
            None => return Err(OpenFailure::NoSchema),
            Some(bytes) => {
                let (version, payload) = codec::open(RecordKind::Meta, &bytes).map_err(OpenFailure::Unreadable)?;
                let meta: MetaV1 =
                    codec::decode_payload(RecordKind::Meta, version, payload).map_err(OpenFailure::Unreadable)?;
                meta.schema
            }
        };
        if !(1..=SCHEMA_VERSION).contains(&schema) {
            return Err(OpenFailure::UnknownSchema(schema));
        }
        // Every pod record must decode, or the journal cannot be trusted at all.
        let mut snapshot = std::collections::BTreeMap::new();
        for entry in journal.pods.iter() {
            let (_, bytes) = entry.map_err(store("reading pod records"))?;
            let pod = decode_pod(&bytes).map_err(OpenFailure::Unreadable)?;
            snapshot.insert(pod.uid.0.clone(), pod);
        }
        if let Ok(mut kept) = journal.snapshot.write() {
            *kept = snapshot;
        }
        if schema == SCHEMA_VERSION {
            return Ok((journal, None));
        }
        journal.upgrade(schema)?;
        Ok((journal, Some(schema)))
    }

    fn write_schema(&self) -> Result<(), JournalError> {
        let meta = codec::encode(RecordKind::Meta, SCHEMA_VERSION, &MetaV1 { schema: SCHEMA_VERSION })
            .map_err(|source| self.record("the schema version".into(), source))?;
        self.db.insert(SCHEMA_KEY, meta).map_err(|source| self.store("writing the schema version", source))?;
        self.flush()
    }

    /// Rewrites every record of an older schema in the current one (see migrations/README.md).
    /// Records carry their own version, so an upgrade cut short is simply run again.
    fn upgrade(&self, from: u16) -> Result<(), OpenFailure> {
        let failed = |what: &str, source: CodecError| {
            OpenFailure::Unreadable(CodecError::Payload {
                kind: RecordKind::Meta,
                version: from,
                detail: format!("upgrading {what}: {source}"),
            })
        };
        let mut pods = Vec::new();
        for entry in self.pods.iter() {
            let (key, bytes) = entry.map_err(|source| OpenFailure::Store(self.store("reading pod records", source)))?;
            let pod = decode_pod(&bytes).map_err(|e| failed("a pod record", e))?;
            pods.push((
                key,
                codec::encode(RecordKind::Pod, SCHEMA_VERSION, &pod_record(&pod))
                    .map_err(|e| failed("a pod record", e))?,
            ));
        }
        let mut log = Vec::new();
        for entry in self.log.iter() {
            let (key, bytes) = entry.map_err(|source| OpenFailure::Store(self.store("reading the log", source)))?;
            let transition = decode_transition(&bytes).map_err(|e| failed("a transition", e))?;
            let record = transition_record(&transition);
            log.push((
                key,
                codec::encode(RecordKind::Transition, SCHEMA_VERSION, &record)
                    .map_err(|e| failed("a transition", e))?,
            ));
        }
        (&self.pods, &self.log)
            .transaction(|(pods_tree, log_tree)| {
                for (key, bytes) in &pods {
                    pods_tree.insert(key.as_ref(), bytes.as_slice())?;
                }
                for (key, bytes) in &log {
                    log_tree.insert(key.as_ref(), bytes.as_slice())?;
                }
                Ok::<(), sled::transaction::ConflictableTransactionError<()>>(())
            })
            .map_err(|error| OpenFailure::Store(self.transaction_error("upgrading the schema", error)))?;
        let moved = self.move_legacy_files().map_err(OpenFailure::Store)?;
        self.write_schema().map_err(OpenFailure::Store)?;
        info!(dir = %self.dir.display(), from, to = SCHEMA_VERSION, pods = pods.len(), transitions = log.len(),
              files_moved = moved, "journal schema upgraded");
        Ok(())
    }

    /// Moves the file contents an older schema kept in sled to the contents directory, each on
    /// disk before it leaves the tree (a move cut short is run again by the next open's upgrade).
    /// The space sled took for them stays sled's: it reclaims no blob (migrations/README.md).
    fn move_legacy_files(&self) -> Result<usize, JournalError> {
        let mut moved = 0;
        for entry in self.legacy_files.iter() {
            let (key, content) = entry.map_err(|source| self.store("reading the files tree", source))?;
            self.contents.put(&content)?;
            self.legacy_files.remove(key).map_err(|source| self.store("emptying the files tree", source))?;
            moved += 1;
        }
        self.flush()?;
        Ok(moved)
    }

    fn transaction_error(&self, action: &'static str, error: sled::transaction::TransactionError<()>) -> JournalError {
        JournalError::Store {
            dir: self.dir.clone(),
            action,
            source: match error {
                sled::transaction::TransactionError::Storage(source) => source,
                sled::transaction::TransactionError::Abort(()) => sled::Error::ReportableBug("aborted".into()),
            },
        }
    }

    /// Records a transition of a pod and its new current record, durably: when this returns,
    /// both are on disk and the action the transition calls for may start.
    pub fn commit(&self, pod: &JournaledPod) -> Result<(), JournalError> {
        let entry = &pod.last_transition;
        let record = codec::encode(RecordKind::Pod, SCHEMA_VERSION, &pod_record(pod)).map_err(|source| {
            JournalError::Record { dir: self.dir.clone(), what: format!("pod {}", pod.uid), source }
        })?;
        let transition =
            codec::encode(RecordKind::Transition, SCHEMA_VERSION, &transition_record(entry)).map_err(|source| {
                JournalError::Record { dir: self.dir.clone(), what: format!("transition of pod {}", pod.uid), source }
            })?;
        let stale = entry.seq.checked_sub(self.retention).filter(|seq| *seq > 0).map(|seq| log_key(&pod.uid, seq));
        (&self.pods, &self.log)
            .transaction(|(pods, log)| {
                pods.insert(pod.uid.0.as_bytes(), record.as_slice())?;
                log.insert(log_key(&pod.uid, entry.seq), transition.as_slice())?;
                if let Some(stale) = &stale {
                    log.remove(stale.as_slice())?;
                }
                Ok::<(), sled::transaction::ConflictableTransactionError<()>>(())
            })
            .map_err(|error| self.transaction_error("committing a transition", error))?;
        self.flush()?;
        if let Ok(mut snapshot) = self.snapshot.write() {
            snapshot.insert(pod.uid.0.clone(), pod.clone());
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), JournalError> {
        self.db.flush().map(drop).map_err(|source| JournalError::Store {
            dir: self.dir.clone(),
            action: "flushing to disk",
            source,
        })
    }

    /// One pod's record (from memory: what the last commit wrote).
    pub fn pod(&self, uid: &PodUid) -> Result<Option<JournaledPod>, JournalError> {
        Ok(self.snapshot.read().ok().and_then(|snapshot| snapshot.get(&uid.0).cloned()))
    }

    /// Notes that a pod's next reload waits until `until` (`None`: it no longer waits).
    pub fn set_paced(&self, uid: &PodUid, until: Option<SystemTime>) {
        if let Ok(mut paced) = self.paced.write() {
            match until {
                Some(until) => paced.insert(uid.0.clone(), until),
                None => paced.remove(&uid.0),
            };
        }
    }

    /// Until when a pod's next reload waits for the pace, if it does.
    pub fn paced(&self, uid: &PodUid) -> Option<SystemTime> {
        self.paced.read().ok().and_then(|paced| paced.get(&uid.0).copied())
    }

    /// Every pod the journal knows, in UID order (from memory: what the last commits wrote).
    pub fn pods(&self) -> Result<Vec<JournaledPod>, JournalError> {
        Ok(self.snapshot.read().map(|snapshot| snapshot.values().cloned().collect()).unwrap_or_default())
    }

    /// A page of a pod's transitions, oldest first, after `after_seq`.
    pub fn transitions(
        &self,
        uid: &PodUid,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<TransitionEntry>, JournalError> {
        let start = log_key(uid, after_seq.saturating_add(1));
        let end = log_key(uid, u64::MAX);
        self.log
            .range(start..=end)
            .take(limit)
            .map(|entry| {
                let (_, bytes) = entry.map_err(|source| self.store("reading transitions", source))?;
                decode_transition(&bytes).map_err(|source| self.record(format!("a transition of pod {uid}"), source))
            })
            .collect()
    }

    /// Forgets a pod that is gone, with its log.
    pub fn forget(&self, uid: &PodUid) -> Result<(), JournalError> {
        self.pods.remove(uid.0.as_bytes()).map_err(|source| self.store("forgetting a pod", source))?;
        if let Ok(mut snapshot) = self.snapshot.write() {
            snapshot.remove(&uid.0);
        }
        self.set_paced(uid, None);
        self.uploads.remove(uid.0.as_bytes()).map_err(|source| self.store("forgetting a pod's uploads", source))?;
        for key in self.log.scan_prefix(log_prefix(uid)).keys() {
            let key = key.map_err(|source| self.store("forgetting a pod's log", source))?;
            self.log.remove(key).map_err(|source| self.store("forgetting a pod's log", source))?;
        }
        self.flush()
    }

    /// Records changes to the server slots of a configuration (`namespace/name`), durably, so a
    /// restarted controller gives every endpoint the server name the pods already run: each
    /// backend's new table, or `None` for a backend gone. Only the changed backends are
    /// written (one batch, then a flush).
    pub fn put_slot_changes(&self, config: &str, changes: &[SlotChange]) -> Result<(), JournalError> {
        // A configuration still in the older whole record has every backend written anew,
        // changed or not, before that record goes.
        let legacy =
            self.slots.contains_key(config.as_bytes()).map_err(|source| self.store("reading slots", source))?;
        let merged: Vec<SlotChange>;
        let written = if legacy {
            let mut all = self.legacy_slots(config);
            for (backend, table) in changes {
                match table {
                    Some(table) => all.insert(backend.clone(), Arc::new(table.clone())),
                    None => all.remove(backend),
                };
            }
            merged = all.into_iter().map(|(backend, table)| (backend, Some(Arc::unwrap_or_clone(table)))).collect();
            merged.as_slice()
        } else {
            changes
        };
        // Batches of a few hundred backends: sled holds every node an insert replaced until its
        // batch ends; the 10,000 backends of a first render left the process 57 MiB resident
        // written in one batch, 24 MiB in batches of 256 (sled 0.34.7, 120-byte records).
        // Each backend's record stands alone; the legacy record goes only after all of them.
        for chunk in written.chunks(SLOT_BATCH) {
            let mut batch = sled::Batch::default();
            for (backend, table) in chunk {
                let key = backend_slots_key(config, backend);
                match table {
                    Some(table) => {
                        let record = BackendSlotsV1 { slots: table.slots.clone() };
                        let bytes = codec::encode(RecordKind::BackendSlots, 1, &record)
                            .map_err(|source| self.record(format!("the slots of {config} {backend}"), source))?;
                        batch.insert(key, bytes);
                    }
                    None => batch.remove(key),
                }
            }
            self.backend_slots.apply_batch(batch).map_err(|source| self.store("storing slots", source))?;
        }
        if legacy {
            self.slots.remove(config.as_bytes()).map_err(|source| self.store("storing slots", source))?;
        }
        self.flush()
    }

    /// The server slots last recorded for a configuration (empty when none; an unreadable
    /// record is dropped, its backend's slots assigned afresh: slots only spare reloads, so a
    /// bad record never fails the start).
    pub fn slots(&self, config: &str) -> crate::plan::slots::Slots {
        let prefix = backend_slots_key(config, "");
        let mut slots = crate::plan::slots::Slots::new();
        for entry in self.backend_slots.scan_prefix(&prefix) {
            let Ok((key, bytes)) = entry else { continue };
            let backend = String::from_utf8_lossy(&key[prefix.len()..]).into_owned();
            let decoded = codec::open(RecordKind::BackendSlots, &bytes).and_then(|(version, payload)| {
                codec::decode_payload::<BackendSlotsV1>(RecordKind::BackendSlots, version, payload)
            });
            match decoded {
                Ok(record) => {
                    slots.insert(backend, Arc::new(crate::plan::slots::SlotTable { slots: record.slots }));
                }
                Err(error) => {
                    error!(dir = %self.dir.display(), config, backend, %error,
                           "server slots unreadable; assigning afresh");
                }
            }
        }
        if slots.is_empty() { self.legacy_slots(config) } else { slots }
    }

    /// A configuration's slots in the older whole record, if it has one.
    fn legacy_slots(&self, config: &str) -> crate::plan::slots::Slots {
        let Ok(Some(bytes)) = self.slots.get(config.as_bytes()) else { return Default::default() };
        let decoded = codec::open(RecordKind::Slots, &bytes)
            .and_then(|(version, payload)| codec::decode_payload::<SlotsV1>(RecordKind::Slots, version, payload));
        match decoded {
            Ok(record) => record
                .backends
                .into_iter()
                .map(|(backend, slots)| (backend, Arc::new(crate::plan::slots::SlotTable { slots })))
                .collect(),
            Err(error) => {
                error!(dir = %self.dir.display(), config, %error, "server slots unreadable; assigning afresh");
                Default::default()
            }
        }
    }

    /// Records, durably and before the upload is made, that a validation is about to replace a
    /// file on a pod; the first original of a file is kept (it is what the pod's last good files
    /// used).
    pub fn record_upload(
        &self,
        uid: &PodUid,
        kind: StorageKind,
        name: &str,
        original: Option<&[u8]>,
    ) -> Result<(), JournalError> {
        let _recording = self.lock_uploads();
        let mut record = self.uploads_record(uid)?;
        if !record.files.iter().any(|(k, n, _)| *k == storage_code(kind) && n == name) {
            let original = original.map(|content| self.put_file(content)).transpose()?;
            record.files.push((storage_code(kind), name.to_owned(), original.map(|c| *c.as_bytes())));
            self.write_uploads(uid, &record)?;
        }
        Ok(())
    }

    /// The uploads recorded for a pod and not yet settled, with what each replaced.
    pub fn pending_uploads(&self, uid: &PodUid) -> Result<Vec<PendingUpload>, JournalError> {
        let record = self.uploads_record(uid)?;
        let mut pending = Vec::with_capacity(record.files.len());
        for (code, name, original) in record.files {
            let Some(kind) = storage_from_code(code) else { continue };
            let original = match original {
                Some(checksum) => Some(self.file(&Checksum::from_bytes(checksum))?.unwrap_or_default()),
                None => None,
            };
            pending.push(PendingUpload { kind, name, original });
        }
        Ok(pending)
    }

    /// Settles a pod's uploads: `keep` are those still to be put back (none after a push); the
    /// originals no pod needs any more are removed.
    pub fn settle_uploads(&self, uid: &PodUid, keep: &[PendingUpload]) -> Result<(), JournalError> {
        let _settling = self.lock_uploads();
        if keep.is_empty() {
            self.uploads.remove(uid.0.as_bytes()).map_err(|source| self.store("settling uploads", source))?;
            self.flush()?;
        } else {
            let files = keep
                .iter()
                .map(|upload| {
                    let original = upload.original.as_deref().map(|content| self.put_file(content)).transpose()?;
                    Ok((storage_code(upload.kind), upload.name.clone(), original.map(|c| *c.as_bytes())))
                })
                .collect::<Result<Vec<_>, JournalError>>()?;
            self.write_uploads(uid, &UploadsV1 { files })?;
        }
        self.collect_unlocked().map(drop)
    }

    fn lock_uploads(&self) -> std::sync::MutexGuard<'_, ()> {
        // The lock guards no data: a panic while it was held leaves nothing to distrust.
        self.uploads_lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn uploads_record(&self, uid: &PodUid) -> Result<UploadsV1, JournalError> {
        let Some(bytes) = self.uploads.get(uid.0.as_bytes()).map_err(|source| self.store("reading uploads", source))?
        else {
            return Ok(UploadsV1 { files: Vec::new() });
        };
        codec::open(RecordKind::Uploads, &bytes)
            .and_then(|(version, payload)| codec::decode_payload::<UploadsV1>(RecordKind::Uploads, version, payload))
            .map_err(|source| self.record(format!("the uploads of pod {uid}"), source))
    }

    fn write_uploads(&self, uid: &PodUid, record: &UploadsV1) -> Result<(), JournalError> {
        let bytes = codec::encode(RecordKind::Uploads, 1, record)
            .map_err(|source| self.record(format!("the uploads of pod {uid}"), source))?;
        self.uploads.insert(uid.0.as_bytes(), bytes).map_err(|source| self.store("recording an upload", source))?;
        self.flush()
    }

    /// Stores a file's content once, under its checksum, durably.
    pub fn put_file(&self, content: &[u8]) -> Result<Checksum, JournalError> {
        self.contents.put(content)
    }

    /// A stored file's content, checked against its checksum.
    pub fn file(&self, checksum: &Checksum) -> Result<Option<Vec<u8>>, JournalError> {
        self.contents.get(checksum)
    }

    /// Removes stored files no pod's last push, and no pending upload, refers to; returns how many.
    /// Settling uploads does this too.
    pub fn collect_files(&self) -> Result<usize, JournalError> {
        let _collecting = self.lock_uploads();
        self.collect_unlocked()
    }

    fn collect_unlocked(&self) -> Result<usize, JournalError> {
        let mut referenced = std::collections::HashSet::new();
        for pod in self.pods()? {
            referenced.extend(pod.pushed.unwrap_or_default().into_iter().map(|(_, checksum)| checksum));
        }
        for entry in self.uploads.iter().values() {
            let bytes = entry.map_err(|source| self.store("collecting files", source))?;
            let record = codec::open(RecordKind::Uploads, &bytes).and_then(|(version, payload)| {
                codec::decode_payload::<UploadsV1>(RecordKind::Uploads, version, payload)
            });
            if let Ok(record) = record {
                referenced
                    .extend(record.files.into_iter().filter_map(|(_, _, original)| original.map(Checksum::from_bytes)));
            }
        }
        self.contents.retain(&referenced)
    }

    /// Bytes the journal occupies on disk (sled's files and the file contents).
    pub fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or_default() + self.contents.size()
    }

    fn store(&self, action: &'static str, source: sled::Error) -> JournalError {
        JournalError::Store { dir: self.dir.clone(), action, source }
    }

    fn record(&self, what: String, source: CodecError) -> JournalError {
        JournalError::Record { dir: self.dir.clone(), what, source }
    }
}

/// Why a journal could not be opened as it is.
#[derive(Debug, Error)]
enum OpenFailure {
    #[error("{0}")]
    Store(JournalError),
    #[error("a record does not decode: {0}")]
    Unreadable(CodecError),
    #[error("it holds pods but no schema version")]
    NoSchema,
    #[error("it was written with schema {0}, which this build does not know (it knows {SCHEMA_VERSION})")]
    UnknownSchema(u16),
}

fn log_prefix(uid: &PodUid) -> Vec<u8> {
    let mut key = uid.0.as_bytes().to_vec();
    key.push(0);
    key
}

/// One backend's slot change: its new table, or `None` when the backend is gone.
pub type SlotChange = (String, Option<crate::plan::slots::SlotTable>);

/// `<configuration>\0<backend>`: a configuration's backends are one prefix scan apart
/// (neither a `namespace/name` nor a backend name holds a NUL).
fn backend_slots_key(config: &str, backend: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(config.len() + 1 + backend.len());
    key.extend_from_slice(config.as_bytes());
    key.push(0);
    key.extend_from_slice(backend.as_bytes());
    key
}

fn log_key(uid: &PodUid, seq: u64) -> Vec<u8> {
    let mut key = log_prefix(uid);
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

fn millis(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64
}

fn from_millis(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn pod_record(pod: &JournaledPod) -> PodRecordV5 {
    PodRecordV5 {
        uid: pod.uid.0.clone(),
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        state: state_code(pod.state),
        pushed: pod.pushed.as_ref().map(|files| files.iter().map(|(n, c)| (n.clone(), *c.as_bytes())).collect()),
        copy: pod.copy.map(|copy| StoredCopyV1 {
            render: *copy.render.as_bytes(),
            stored: *copy.stored.as_bytes(),
            version: copy.version.0,
        }),
        versions: VersionsV1 {
            haproxy: pod.versions.haproxy.clone(),
            dataplane_api: pod.versions.dataplane_api.clone(),
        },
        last: transition_record(&pod.last_transition),
    }
}

fn transition_record(entry: &TransitionEntry) -> TransitionRecordV3 {
    TransitionRecordV3 {
        seq: entry.seq,
        at_ms: millis(entry.at),
        from: state_code(entry.from),
        to: state_code(entry.to),
        reason: reason_code(entry.reason),
        error: entry.error.clone(),
        term: entry.term.0,
        trace_id: entry.trace_id.map(|id| id.0),
    }
}

fn state(code: u8, kind: RecordKind, version: u16) -> Result<State, CodecError> {
    state_from_code(code).ok_or_else(|| CodecError::Payload {
        kind,
        version,
        detail: format!("unknown state code {code}"),
    })
}

fn decode_pod(bytes: &[u8]) -> Result<JournaledPod, CodecError> {
    let kind = RecordKind::Pod;
    let (version, payload) = codec::open(kind, bytes)?;
    let v4 = |v3: PodRecordV3| PodRecordV5::from(PodRecordV4::from(v3));
    let record: PodRecordV5 = match version {
        1 => v4(PodRecordV2::from(codec::decode_payload::<PodRecordV1>(kind, version, payload)?).into()),
        2 => v4(codec::decode_payload::<PodRecordV2>(kind, version, payload)?.into()),
        3 => v4(codec::decode_payload::<PodRecordV3>(kind, version, payload)?),
        // Schema 5 moved file contents out of sled; pod records are schema 4's.
        4 | 5 => codec::decode_payload::<PodRecordV4>(kind, version, payload)?.into(),
        6 => codec::decode_payload(kind, version, payload)?,
        _ => return Err(CodecError::Payload { kind, version, detail: "a version this build does not know".into() }),
    };
    Ok(JournaledPod {
        uid: PodUid(record.uid),
        namespace: record.namespace,
        name: record.name,
        state: state(record.state, kind, version)?,
        pushed: record.pushed.map(|files| files.into_iter().map(|(n, c)| (n, Checksum::from_bytes(c))).collect()),
        copy: record.copy.map(|copy| StoredCopy {
            render: Checksum::from_bytes(copy.render),
            stored: Checksum::from_bytes(copy.stored),
            version: ConfigVersion(copy.version),
        }),
        versions: PodVersions { haproxy: record.versions.haproxy, dataplane_api: record.versions.dataplane_api },
        last_transition: transition_entry(record.last, kind, version)?,
    })
}

fn decode_transition(bytes: &[u8]) -> Result<TransitionEntry, CodecError> {
    let kind = RecordKind::Transition;
    let (version, payload) = codec::open(kind, bytes)?;
    // Schemas 3 to 5 left transitions as schema 2 had them.
    let record: TransitionRecordV3 = match version {
        1 => TransitionRecordV2::from(codec::decode_payload::<TransitionRecordV1>(kind, version, payload)?).into(),
        2..=5 => codec::decode_payload::<TransitionRecordV2>(kind, version, payload)?.into(),
        6 => codec::decode_payload(kind, version, payload)?,
        _ => return Err(CodecError::Payload { kind, version, detail: "a version this build does not know".into() }),
    };
    transition_entry(record, kind, version)
}

fn transition_entry(record: TransitionRecordV3, kind: RecordKind, version: u16) -> Result<TransitionEntry, CodecError> {
    Ok(TransitionEntry {
        seq: record.seq,
        at: from_millis(record.at_ms),
        from: state(record.from, kind, version)?,
        to: state(record.to, kind, version)?,
        reason: reason_from_code(record.reason),
        error: record.error,
        term: LeaderTerm(record.term),
        trace_id: record.trace_id.map(TraceId),
    })
}

#[cfg(test)]
mod open_failure_tests {
    use super::*;

    #[test]
    fn a_journal_that_cannot_open_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let locked = JournalError::Store {
            dir: dir.path().to_owned(),
            action: "opening",
            source: sled::Error::Io(std::io::Error::other("could not acquire lock on \"db\"")),
        };
        assert!(locked.to_string().contains("each replica needs a volume of its own"), "{locked}");
        let denied = JournalError::Store {
            dir: dir.path().to_owned(),
            action: "opening",
            source: sled::Error::Io(std::io::Error::from(std::io::ErrorKind::PermissionDenied)),
        };
        assert!(denied.to_string().contains("not writable by the controller's user"), "{denied}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, seq: u64, to: State) -> JournaledPod {
        JournaledPod {
            uid: PodUid(uid.into()),
            namespace: "haptic".into(),
            name: format!("haproxy-{uid}"),
            state: to,
            pushed: Some(vec![("haproxy.cfg".into(), Checksum::of(uid.as_bytes()))]),
            copy: Some(StoredCopy {
                render: Checksum::of(uid.as_bytes()),
                stored: Checksum::of(b"stored"),
                version: ConfigVersion(seq),
            }),
            versions: PodVersions { haproxy: Some("2.8.25".into()), dataplane_api: Some("v3.2.7".into()) },
            last_transition: TransitionEntry {
                seq,
                at: from_millis(1_700_000_000_000 + seq),
                from: State::Syncing,
                to,
                reason: [EventKind::DesiredChanged, EventKind::Verified, EventKind::Pushed]
                    .get(seq as usize % 3)
                    .copied(),
                error: None,
                term: LeaderTerm(3),
                trace_id: Some(TraceId([seq as u8; 16])),
            },
        }
    }

    #[test]
    fn commits_survive_a_reopen_and_the_log_keeps_only_the_last_transitions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        {
            let (journal, report) = Journal::open(&path, 3).unwrap();
            assert_eq!(report, OpenReport { moved_aside: None, pods: 0, upgraded_from: None });
            for seq in 1..=5 {
                journal.commit(&pod("a", seq, State::InSync)).unwrap();
            }
            journal.commit(&pod("b", 1, State::Validating)).unwrap();
        }
        let (journal, report) = Journal::open(&path, 3).unwrap();
        assert_eq!(report.pods, 2);
        assert_eq!(journal.pod(&PodUid("a".into())).unwrap(), Some(pod("a", 5, State::InSync)));
        let seqs: Vec<u64> = journal.transitions(&PodUid("a".into()), 0, 10).unwrap().iter().map(|t| t.seq).collect();
        assert_eq!(seqs, [3, 4, 5], "bounded retention keeps the last 3");
        assert_eq!(journal.transitions(&PodUid("a".into()), 3, 1).unwrap()[0].seq, 4, "pages resume after a seq");
        journal.forget(&PodUid("a".into())).unwrap();
        assert_eq!(journal.pods().unwrap(), vec![pod("b", 1, State::Validating)]);
        assert!(journal.transitions(&PodUid("a".into()), 0, 10).unwrap().is_empty());
    }

    /// Copies a committed fixture journal (migrations/fixtures) where a test may change it.
    fn fixture(name: &str) -> (tempfile::TempDir, PathBuf) {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/fixtures").join(name);
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("journal");
        std::fs::create_dir_all(&target).unwrap();
        for entry in std::fs::read_dir(&source).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_file() {
                std::fs::copy(entry.path(), target.join(entry.file_name())).unwrap();
            }
        }
        (dir, target)
    }

    #[test]
    fn uploads_to_put_back_survive_a_reopen_keep_the_first_original_and_their_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        let uid = PodUid("u".into());
        {
            let (journal, _) = Journal::open(&path, 10).unwrap();
            journal.record_upload(&uid, StorageKind::Maps, "host.map", Some(b"last good\n")).unwrap();
            journal.record_upload(&uid, StorageKind::Maps, "host.map", Some(b"a refused one\n")).unwrap();
            journal.record_upload(&uid, StorageKind::General, "503.http", None).unwrap();
        }
        let (journal, _) = Journal::open(&path, 10).unwrap();
        assert_eq!(journal.collect_files().unwrap(), 0, "originals to put back are kept");
        let pending = journal.pending_uploads(&uid).unwrap();
        assert_eq!(pending.len(), 2);
        assert_eq!((pending[0].kind, pending[0].name.as_str()), (StorageKind::Maps, "host.map"));
        assert_eq!(pending[0].original.as_deref(), Some(&b"last good\n"[..]), "the first original wins");
        assert_eq!(pending[1].original, None, "a new file is deleted to put it back");
        assert!(!format!("{pending:?}").contains("last good"), "contents are never shown");
        journal.settle_uploads(&uid, &pending[1..]).unwrap();
        assert_eq!(journal.pending_uploads(&uid).unwrap().len(), 1);
        journal.settle_uploads(&uid, &[]).unwrap();
        assert!(journal.pending_uploads(&uid).unwrap().is_empty());
        assert_eq!(journal.file(&Checksum::of(b"last good\n")).unwrap(), None, "settled, the original is collected");
        assert_eq!(journal.collect_files().unwrap(), 0);
    }

    /// Two pods' validations store the same original at once (the bug a churn run found: both
    /// wrote one partial file, and the second rename found it gone).
    #[test]
    fn pods_storing_the_same_original_at_once_both_succeed_and_it_is_kept_while_either_needs_it() {
        let dir = tempfile::tempdir().unwrap();
        let (journal, _) = Journal::open(&dir.path().join("journal"), 10).unwrap();
        let journal = Arc::new(journal);
        let original = vec![b'm'; 200_000];
        let pods: Vec<_> = (0..4)
            .map(|pod| {
                let (journal, original) = (journal.clone(), original.clone());
                std::thread::spawn(move || {
                    let uid = PodUid(format!("pod-{pod}"));
                    for _ in 0..25 {
                        journal.record_upload(&uid, StorageKind::Maps, "host.map", Some(&original)).unwrap();
                        let pending = journal.pending_uploads(&uid).unwrap();
                        assert_eq!(pending[0].original.as_deref(), Some(&original[..]));
                        journal.settle_uploads(&uid, &[]).unwrap();
                    }
                })
            })
            .collect();
        for pod in pods {
            pod.join().unwrap();
        }
        assert_eq!(journal.file(&Checksum::of(&original)).unwrap(), None, "collected once no pod needs it");
    }

    /// The bug schema 5 fixed: originals kept in sled stayed on disk after they were collected
    /// (sled never deletes a blob), so every validation grew the journal by its map files.
    #[test]
    fn the_journal_does_not_grow_with_the_originals_it_has_collected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        let (journal, _) = Journal::open(&path, 10).unwrap();
        let uid = PodUid("u".into());
        let mut original = vec![b'#'; 700_000];
        for round in 0..40u32 {
            original[..4].copy_from_slice(&round.to_be_bytes());
            journal.record_upload(&uid, StorageKind::Maps, "host.map", Some(&original)).unwrap();
            journal.settle_uploads(&uid, &[]).unwrap();
        }
        let size = journal.size_on_disk();
        // 40 originals of 700 KB (28 MB) went through; sled's own files stay a few MB.
        assert!(size < 8 << 20, "journal holds {size} bytes after its originals were collected");
    }

    #[test]
    fn a_schema_4_journal_has_its_file_contents_moved_out_of_sled() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        let uid = PodUid("u".into());
        let original = b"example.com be_web\n";
        {
            // What a schema 4 build left: an upload to put back, its original in the files tree.
            let (journal, _) = Journal::open(&path, 10).unwrap();
            journal.commit(&pod("a", 1, State::Validating)).unwrap();
            let checksum = Checksum::of(original);
            journal.legacy_files.insert(checksum.as_bytes(), &original[..]).unwrap();
            let record = UploadsV1 { files: vec![(0, "host.map".into(), Some(*checksum.as_bytes()))] };
            journal.uploads.insert(uid.0.as_bytes(), codec::encode(RecordKind::Uploads, 1, &record).unwrap()).unwrap();
            let meta = codec::encode(RecordKind::Meta, 4, &MetaV1 { schema: 4 }).unwrap();
            journal.db.insert(SCHEMA_KEY, meta).unwrap();
            journal.flush().unwrap();
        }
        let (journal, report) = Journal::open(&path, 10).unwrap();
        assert_eq!(report.upgraded_from, Some(4));
        assert!(journal.legacy_files.is_empty(), "nothing is left in sled");
        let pending = journal.pending_uploads(&uid).unwrap();
        assert_eq!(pending[0].original.as_deref(), Some(&original[..]), "the original to put back survives");
        assert_eq!(journal.pods().unwrap().len(), 1);
    }

    #[test]
    fn a_schema_2_journal_is_upgraded_to_3_and_its_pods_keep_what_was_pushed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        let pushed = vec![("haproxy.cfg".to_owned(), *Checksum::of(b"global\n").as_bytes())];
        let last = TransitionRecordV2 {
            seq: 4,
            at_ms: 1_700_000_000_000,
            from: state_code(State::Syncing),
            to: state_code(State::InSync),
            reason: "Pushed".into(),
            error: None,
            term: 2,
            trace_id: None,
        };
        {
            // Exactly what the schema 2 build wrote: its metadata, one pod and its transition.
            let db = sled::Config::new().path(&path).open().unwrap();
            let meta = codec::encode(RecordKind::Meta, 2, &MetaV1 { schema: 2 }).unwrap();
            db.insert(SCHEMA_KEY, meta).unwrap();
            let record = PodRecordV2 {
                uid: "u2".into(),
                namespace: "haptic".into(),
                name: "haproxy-0".into(),
                state: state_code(State::InSync),
                pushed: Some(pushed.clone()),
                config_version: None,
                last: last.clone(),
            };
            db.open_tree("pods").unwrap().insert("u2", codec::encode(RecordKind::Pod, 2, &record).unwrap()).unwrap();
            let log = codec::encode(RecordKind::Transition, 2, &last).unwrap();
            db.open_tree("log").unwrap().insert(log_key(&PodUid("u2".into()), 4), log).unwrap();
            db.flush().unwrap();
        }
        let (journal, report) = Journal::open(&path, 100).unwrap();
        assert_eq!((report.upgraded_from, report.pods), (Some(2), 1), "{report:?}");
        let pod = journal.pod(&PodUid("u2".into())).unwrap().unwrap();
        assert_eq!(pod.pushed, Some(vec![("haproxy.cfg".into(), Checksum::of(b"global\n"))]));
        assert_eq!((pod.state, pod.copy, pod.last_transition.term), (State::InSync, None, LeaderTerm(2)));
        assert_eq!(pod.last_transition.reason, Some(EventKind::Pushed), "the name is read as its kind");
        assert_eq!(journal.transitions(&PodUid("u2".into()), 0, 10).unwrap().len(), 1);
    }

    /// Schema 5 stored a transition's reason as the event kind's `Debug` name, which the
    /// controller compared with "ValidationRejected"; schema 6 stores a code (issue #46).
    #[test]
    fn a_schema_5_journal_is_upgraded_to_6_and_its_reasons_are_kinds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        let transition = |seq: u64, reason: &str| TransitionRecordV2 {
            seq,
            at_ms: 1_700_000_000_000 + seq,
            from: state_code(State::Validating),
            to: state_code(State::Validating),
            reason: reason.into(),
            error: Some("[ALERT] haproxy.cfg:3".into()),
            term: 4,
            trace_id: None,
        };
        {
            // Exactly what the schema 5 build wrote: pod records of schema 4, transitions of 2.
            let db = sled::Config::new().path(&path).open().unwrap();
            db.insert(SCHEMA_KEY, codec::encode(RecordKind::Meta, 5, &MetaV1 { schema: 5 }).unwrap()).unwrap();
            let record = PodRecordV4 {
                uid: "u5".into(),
                namespace: "haptic".into(),
                name: "haproxy-0".into(),
                state: state_code(State::Validating),
                pushed: None,
                copy: None,
                versions: VersionsV1 { haproxy: Some("2.8.25".into()), dataplane_api: None },
                last: transition(2, "ValidationRejected"),
            };
            db.open_tree("pods").unwrap().insert("u5", codec::encode(RecordKind::Pod, 5, &record).unwrap()).unwrap();
            let log = db.open_tree("log").unwrap();
            for (seq, reason) in [(1, "DesiredChanged"), (2, "ValidationRejected")] {
                let bytes = codec::encode(RecordKind::Transition, 5, &transition(seq, reason)).unwrap();
                log.insert(log_key(&PodUid("u5".into()), seq), bytes).unwrap();
            }
            db.flush().unwrap();
        }
        let (journal, report) = Journal::open(&path, 100).unwrap();
        assert_eq!((report.upgraded_from, report.pods), (Some(5), 1), "{report:?}");
        let pod = journal.pod(&PodUid("u5".into())).unwrap().unwrap();
        assert_eq!(pod.last_transition.reason, Some(EventKind::ValidationRejected));
        assert_eq!(pod.versions.haproxy.as_deref(), Some("2.8.25"));
        let reasons: Vec<_> =
            journal.transitions(&PodUid("u5".into()), 0, 10).unwrap().iter().map(|t| t.reason).collect();
        assert_eq!(reasons, [Some(EventKind::DesiredChanged), Some(EventKind::ValidationRejected)]);
        drop(journal);
        let (journal, report) = Journal::open(&path, 100).unwrap();
        assert_eq!(report.upgraded_from, None, "upgraded once");
        assert_eq!(
            journal.pod(&PodUid("u5".into())).unwrap().unwrap().last_transition.reason,
            Some(EventKind::ValidationRejected)
        );
    }

    #[test]
    fn a_schema_1_journal_is_upgraded_in_place_and_every_record_survives() {
        let (_dir, path) = fixture("journal-v1");
        let (journal, report) = Journal::open(&path, 100).unwrap();
        assert_eq!((report.moved_aside.clone(), report.upgraded_from, report.pods), (None, Some(1), 2), "{report:?}");
        let pods = journal.pods().unwrap();
        let names: Vec<_> = pods.iter().map(|p| (p.name.as_str(), p.state)).collect();
        assert_eq!(names, [("haproxy-0", State::InSync), ("haproxy-1", State::Unknown)]);
        let in_sync = &pods[0];
        assert_eq!(in_sync.uid, PodUid("0b0e7f5e-1d7c-4c56-9d0a-1a2b3c4d5e01".into()));
        assert_eq!(
            in_sync.pushed,
            Some(vec![
                ("haproxy.cfg".into(), Checksum::of(b"global\n")),
                ("maps/host.map".into(), Checksum::of(b"example.com backend-0\n")),
            ])
        );
        assert_eq!(in_sync.copy, None, "schemas 1 and 2 knew no stored copies");
        assert_eq!((in_sync.last_transition.term, in_sync.last_transition.trace_id), (LeaderTerm(0), None));
        let failed = &pods[1].last_transition;
        assert!(failed.error.as_deref().is_some_and(|e| e.contains("connection refused")), "{failed:?}");
        for pod in &pods {
            let log = journal.transitions(&pod.uid, 0, 10).unwrap();
            let seqs: Vec<_> = log.iter().map(|t| (t.seq, t.reason)).collect();
            // Schema 1's fixture wrote reasons ("step 1") that are no event kind's name.
            assert_eq!(seqs, [(1, None), (2, None), (3, None)]);
            assert_eq!(log[2], pod.last_transition);
        }
        journal.commit(&pod("c", 1, State::InSync)).unwrap();
        drop(journal);
        let (journal, report) = Journal::open(&path, 100).unwrap();
        assert_eq!((report.upgraded_from, report.pods), (None, 3), "upgraded once, written in the new schema after");
        assert_eq!(journal.pod(&PodUid("c".into())).unwrap(), Some(pod("c", 1, State::InSync)));
    }

    #[test]
    fn a_schema_3_journal_is_upgraded_to_4_and_knows_no_versions_until_the_pods_are_read() {
        let (_dir, path) = fixture("journal-v3");
        let (journal, report) = Journal::open(&path, 100).unwrap();
        assert_eq!((report.moved_aside.clone(), report.upgraded_from, report.pods), (None, Some(3), 2), "{report:?}");
        let pods = journal.pods().unwrap();
        let states: Vec<_> = pods.iter().map(|p| (p.name.as_str(), p.state)).collect();
        assert_eq!(states, [("haproxy-0", State::InSync), ("haproxy-1", State::Validating)]);
        for pod in &pods {
            assert_eq!(pod.versions, PodVersions::default(), "schema 3 kept no versions");
            assert_eq!(
                pod.pushed,
                Some(vec![
                    ("haproxy.cfg".into(), Checksum::of(b"global\n")),
                    ("maps/host.map".into(), Checksum::of(b"example.com backend-0\n")),
                ])
            );
            let copy = pod.copy.expect("the stored copy survives");
            assert_eq!(
                (copy.render, copy.stored, copy.version),
                (Checksum::of(b"global\n"), Checksum::of(b"stored\n"), ConfigVersion(7))
            );
            assert_eq!(
                (pod.last_transition.term, pod.last_transition.trace_id),
                (LeaderTerm(3), Some(TraceId([3; 16])))
            );
            let seqs: Vec<_> = journal.transitions(&pod.uid, 0, 10).unwrap().iter().map(|t| t.seq).collect();
            assert_eq!(seqs, [1, 2, 3]);
        }
        assert!(pods[1].last_transition.error.as_deref().is_some_and(|e| e.contains("haproxy.cfg:12")));
        let mut read = pods[0].clone();
        read.versions = PodVersions { haproxy: Some("2.6.12-1+deb12u4".into()), dataplane_api: Some("v3.2.7".into()) };
        journal.commit(&read).unwrap();
        drop(journal);
        let (journal, report) = Journal::open(&path, 100).unwrap();
        assert_eq!(report.upgraded_from, None);
        assert_eq!(journal.pod(&read.uid).unwrap(), Some(read), "versions are kept once read");
    }

    #[test]
    fn a_journal_from_a_newer_build_is_moved_aside_not_misread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        {
            let (journal, _) = Journal::open(&path, 10).unwrap();
            journal.commit(&pod("a", 1, State::InSync)).unwrap();
            let meta = codec::encode(RecordKind::Meta, 1, &MetaV1 { schema: SCHEMA_VERSION + 1 }).unwrap();
            journal.db.insert(SCHEMA_KEY, meta).unwrap();
            journal.db.flush().unwrap();
        }
        let (_, report) = Journal::open(&path, 10).unwrap();
        let (_, why) = report.moved_aside.expect("moved aside");
        assert!(why.contains(&format!("schema {}", SCHEMA_VERSION + 1)), "{why}");
    }

    #[test]
    fn server_slots_survive_a_reopen_and_a_bad_record_is_dropped_not_fatal() {
        use crate::plan::slots::{SlotTable, Slots};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        let web = SlotTable { slots: vec![Some(("10.0.0.3".into(), 8080)), None, Some(("10.0.0.2".into(), 8080))] };
        let api = SlotTable { slots: vec![Some(("10.0.0.9".into(), 80))] };
        {
            let (journal, _) = Journal::open(&path, 10).unwrap();
            assert!(journal.slots("haptic/web").is_empty());
            journal
                .put_slot_changes(
                    "haptic/web",
                    &[("be_web".into(), Some(web.clone())), ("be_api".into(), Some(api.clone()))],
                )
                .unwrap();
            // Another configuration's backends are apart, even one whose name extends this one's.
            journal.put_slot_changes("haptic/web2", &[("be_other".into(), Some(api.clone()))]).unwrap();
        }
        let (journal, report) = Journal::open(&path, 10).unwrap();
        assert_eq!(report.moved_aside, None);
        let both: Slots = [("be_api".to_owned(), Arc::new(api.clone())), ("be_web".to_owned(), Arc::new(web.clone()))]
            .into_iter()
            .collect::<Slots>();
        assert_eq!(journal.slots("haptic/web"), both);
        // Only what changed is written; a backend gone is removed.
        journal.put_slot_changes("haptic/web", &[("be_api".into(), None)]).unwrap();
        assert_eq!(
            journal.slots("haptic/web"),
            [("be_web".to_owned(), Arc::new(web.clone()))].into_iter().collect::<Slots>()
        );
        journal.backend_slots.insert(backend_slots_key("haptic/web", "be_web"), &[6u8, 1, 0, 0xff][..]).unwrap();
        assert!(journal.slots("haptic/web").is_empty(), "an unreadable record means assigning afresh");
        assert_eq!(journal.slots("haptic/web2").len(), 1);
    }

    #[test]
    fn slot_changes_of_more_backends_than_one_batch_are_all_written_and_removed() {
        use crate::plan::slots::SlotTable;
        let dir = tempfile::tempdir().unwrap();
        let (journal, _) = Journal::open(&dir.path().join("journal"), 10).unwrap();
        let backends = 2 * SLOT_BATCH + 3;
        let table = |i: usize| SlotTable { slots: vec![Some((format!("10.0.{}.{}", i / 250, i % 250), 80))] };
        let all: Vec<SlotChange> = (0..backends).map(|i| (format!("be_{i:04}"), Some(table(i)))).collect();
        journal.put_slot_changes("haptic/web", &all).unwrap();
        let slots = journal.slots("haptic/web");
        assert_eq!(slots.len(), backends);
        assert!((0..backends).all(|i| slots.get(&format!("be_{i:04}")).map(|t| &**t) == Some(&table(i))));
        let gone: Vec<SlotChange> =
            (0..backends).filter(|i| i % 2 == 0).map(|i| (format!("be_{i:04}"), None)).collect();
        journal.put_slot_changes("haptic/web", &gone).unwrap();
        assert_eq!(journal.slots("haptic/web").len(), backends - gone.len());
    }

    #[test]
    fn slots_in_the_older_whole_record_are_read_and_rewritten_per_backend_at_the_next_change() {
        use crate::plan::slots::{SlotTable, Slots};
        let dir = tempfile::tempdir().unwrap();
        let (journal, _) = Journal::open(&dir.path().join("journal"), 10).unwrap();
        let web = SlotTable { slots: vec![Some(("10.0.0.3".into(), 8080)), None] };
        let api = SlotTable { slots: vec![Some(("10.0.0.9".into(), 80))] };
        // What builds before the backend_slots tree wrote: every backend in one record.
        let legacy =
            SlotsV1 { backends: vec![("be_api".into(), api.slots.clone()), ("be_web".into(), web.slots.clone())] };
        journal.slots.insert(b"haptic/web", codec::encode(RecordKind::Slots, 1, &legacy).unwrap()).unwrap();
        let both: Slots = [("be_api".to_owned(), Arc::new(api.clone())), ("be_web".to_owned(), Arc::new(web.clone()))]
            .into_iter()
            .collect::<Slots>();
        assert_eq!(journal.slots("haptic/web"), both);
        // One backend changes: the other, unchanged, is carried over before the record goes.
        let moved = SlotTable { slots: vec![Some(("10.0.0.4".into(), 8080)), None] };
        journal.put_slot_changes("haptic/web", &[("be_web".into(), Some(moved.clone()))]).unwrap();
        assert!(journal.slots.get(b"haptic/web").unwrap().is_none(), "the whole record is gone");
        assert_eq!(
            journal.slots("haptic/web"),
            [("be_api".to_owned(), Arc::new(api)), ("be_web".to_owned(), Arc::new(moved))]
                .into_iter()
                .collect::<Slots>()
        );
    }

    #[test]
    fn files_are_stored_once_and_collected_when_no_push_refers_to_them() {
        let dir = tempfile::tempdir().unwrap();
        let (journal, _) = Journal::open(&dir.path().join("journal"), 10).unwrap();
        let kept = journal.put_file(b"a").unwrap();
        assert_eq!(journal.put_file(b"a").unwrap(), kept);
        let orphan = journal.put_file(b"orphan").unwrap();
        journal.commit(&pod("a", 1, State::InSync)).unwrap();
        assert_eq!(journal.collect_files().unwrap(), 1);
        assert_eq!(journal.file(&kept).unwrap().as_deref(), Some(&b"a"[..]));
        assert_eq!(journal.file(&orphan).unwrap(), None);
    }

    #[test]
    fn an_unreadable_journal_is_moved_aside_and_a_fresh_one_starts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        {
            let (journal, _) = Journal::open(&path, 10).unwrap();
            journal.commit(&pod("a", 1, State::InSync)).unwrap();
            // A record that does not decode, as a torn or foreign write would leave.
            journal.pods.insert(b"b", &[1u8, 1, 0, 0xff, 0xff][..]).unwrap();
            journal.db.flush().unwrap();
        }
        let (journal, report) = Journal::open(&path, 10).unwrap();
        let (aside, why) = report.moved_aside.expect("moved aside");
        assert!(aside.exists() && aside.display().to_string().contains("journal.unreadable-"), "{}", aside.display());
        assert!(why.contains("does not decode"), "{why}");
        assert_eq!(report.pods, 0);
        assert!(journal.pods().unwrap().is_empty());
        journal.commit(&pod("a", 1, State::InSync)).unwrap();
    }

    #[test]
    fn a_journal_in_use_by_another_process_is_an_error_not_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        let (first, _) = Journal::open(&path, 10).unwrap();
        first.commit(&pod("a", 1, State::InSync)).unwrap();
        let error = Journal::open(&path, 10).err().expect("the lock is held");
        assert!(error.to_string().contains("could not acquire lock"), "{error}");
        assert_eq!(first.pods().unwrap().len(), 1, "the live journal is untouched");
        assert!(
            !dir.path().read_dir().unwrap().any(|e| e.unwrap().file_name().to_string_lossy().contains("unreadable"))
        );
    }

    #[test]
    fn garbage_in_place_of_the_journal_is_moved_aside_too() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        std::fs::create_dir_all(&path).unwrap();
        std::fs::write(path.join("db"), vec![0xAB; 4096]).unwrap();
        std::fs::write(path.join("conf"), b"not a sled config").unwrap();
        let (journal, report) = Journal::open(&path, 10).unwrap();
        assert!(report.moved_aside.is_some(), "{report:?}");
        journal.commit(&pod("a", 1, State::InSync)).unwrap();
    }
}
