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
mod records;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sled::Transactional;
use thiserror::Error;
use tracing::{error, info};

use crate::dataplane::ConfigVersion;
use crate::files::Checksum;
use crate::fleet::machine::{FileChecksums, State};
use codec::{CodecError, RecordKind};
pub use records::SCHEMA_VERSION;
use records::{MetaV1, PodRecordV1, TransitionRecordV1, state_code, state_from_code};

/// A pod's identity: its UID. A pod recreated under the same name is a new pod.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodUid(pub String);

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

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
    /// Why (the event, in words).
    pub reason: String,
    /// The failure it recorded, if any.
    pub error: Option<String>,
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
    /// The Dataplane configuration version seen after that push.
    pub config_version: Option<ConfigVersion>,
    /// The last transition.
    pub last_transition: TransitionEntry,
}

/// Errors of the journal, each saying what it was doing.
#[derive(Debug, Error)]
pub enum JournalError {
    /// sled failed (disk full, I/O error...).
    #[error("journal at {dir}: {action}: {source}")]
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
}

impl JournalError {
    /// Whether sled found its files corrupt (as opposed to unreachable or locked).
    fn is_corruption(&self) -> bool {
        matches!(self, Self::Store { source: sled::Error::Corruption { .. }, .. })
    }
}

/// What opening the journal found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenReport {
    /// Where an unreadable journal was moved, and why it was unreadable.
    pub moved_aside: Option<(PathBuf, String)>,
    /// How many pods the journal knows.
    pub pods: usize,
}

/// The open journal.
pub struct Journal {
    dir: PathBuf,
    db: sled::Db,
    pods: sled::Tree,
    log: sled::Tree,
    files: sled::Tree,
    retention: u64,
}

/// sled's default cache is 1 GiB; the journal's working set is a few records per pod.
const CACHE_BYTES: u64 = 16 * 1024 * 1024;
const SCHEMA_KEY: &[u8] = b"schema";

impl Journal {
    /// Opens (or creates) the journal in `dir`, keeping the last `retention` transitions per
    /// pod. An unreadable journal is moved aside to `<dir>.unreadable-<unix seconds>` and a
    /// fresh one is opened in its place.
    pub fn open(dir: &Path, retention: u64) -> Result<(Self, OpenReport), JournalError> {
        match Self::open_checked(dir, retention) {
            Ok(journal) => {
                let pods = journal.pods.len();
                info!(dir = %dir.display(), pods, "journal opened");
                Ok((journal, OpenReport { moved_aside: None, pods }))
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
                let journal = Self::open_checked(dir, retention).map_err(|e| match e {
                    OpenFailure::Store(error) => error,
                    other => JournalError::Record {
                        dir: dir.to_owned(),
                        what: "a fresh journal".into(),
                        source: CodecError::Encode { kind: RecordKind::Meta, detail: other.to_string() },
                    },
                })?;
                Ok((journal, OpenReport { moved_aside: Some((aside, why)), pods: 0 }))
            }
        }
    }

    fn open_checked(dir: &Path, retention: u64) -> Result<Self, OpenFailure> {
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
            files: db.open_tree("files").map_err(store("opening the files tree"))?,
            db,
            retention: retention.max(1),
        };
        match journal.db.get(SCHEMA_KEY).map_err(store("reading the schema version"))? {
            None if journal.pods.is_empty() => {
                let meta = codec::encode(RecordKind::Meta, SCHEMA_VERSION, &MetaV1 { schema: SCHEMA_VERSION })
                    .map_err(OpenFailure::Unreadable)?;
                journal.db.insert(SCHEMA_KEY, meta).map_err(store("writing the schema version"))?;
                journal.db.flush().map_err(store("flushing"))?;
            }
            None => return Err(OpenFailure::NoSchema),
            Some(bytes) => {
                let (version, payload) = codec::open(RecordKind::Meta, &bytes).map_err(OpenFailure::Unreadable)?;
                let meta: MetaV1 =
                    codec::decode_payload(RecordKind::Meta, version, payload).map_err(OpenFailure::Unreadable)?;
                if meta.schema != SCHEMA_VERSION {
                    return Err(OpenFailure::UnknownSchema(meta.schema));
                }
            }
        }
        // Every pod record must decode, or the journal cannot be trusted at all.
        for entry in journal.pods.iter() {
            let (_, bytes) = entry.map_err(store("reading pod records"))?;
            decode_pod(&bytes).map_err(OpenFailure::Unreadable)?;
        }
        Ok(journal)
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
            .map_err(|error| JournalError::Store {
                dir: self.dir.clone(),
                action: "committing a transition",
                source: match error {
                    sled::transaction::TransactionError::Storage(source) => source,
                    sled::transaction::TransactionError::Abort(()) => sled::Error::ReportableBug("aborted".into()),
                },
            })?;
        self.flush()
    }

    fn flush(&self) -> Result<(), JournalError> {
        self.db.flush().map(drop).map_err(|source| JournalError::Store {
            dir: self.dir.clone(),
            action: "flushing to disk",
            source,
        })
    }

    /// One pod's record.
    pub fn pod(&self, uid: &PodUid) -> Result<Option<JournaledPod>, JournalError> {
        let bytes = self.pods.get(uid.0.as_bytes()).map_err(|source| self.store("reading a pod", source))?;
        bytes.map(|bytes| decode_pod(&bytes).map_err(|source| self.record(format!("pod {uid}"), source))).transpose()
    }

    /// Every pod the journal knows.
    pub fn pods(&self) -> Result<Vec<JournaledPod>, JournalError> {
        self.pods
            .iter()
            .map(|entry| {
                let (key, bytes) = entry.map_err(|source| self.store("reading pods", source))?;
                decode_pod(&bytes)
                    .map_err(|source| self.record(format!("pod {}", String::from_utf8_lossy(&key)), source))
            })
            .collect()
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
        for key in self.log.scan_prefix(log_prefix(uid)).keys() {
            let key = key.map_err(|source| self.store("forgetting a pod's log", source))?;
            self.log.remove(key).map_err(|source| self.store("forgetting a pod's log", source))?;
        }
        self.flush()
    }

    /// Stores a file's content once, under its checksum.
    pub fn put_file(&self, content: &[u8]) -> Result<Checksum, JournalError> {
        let checksum = Checksum::of(content);
        if !self.files.contains_key(checksum.as_bytes()).map_err(|source| self.store("checking a file", source))? {
            self.files.insert(checksum.as_bytes(), content).map_err(|source| self.store("storing a file", source))?;
        }
        Ok(checksum)
    }

    /// A stored file's content.
    pub fn file(&self, checksum: &Checksum) -> Result<Option<Vec<u8>>, JournalError> {
        let content = self.files.get(checksum.as_bytes()).map_err(|source| self.store("reading a file", source))?;
        Ok(content.map(|bytes| bytes.to_vec()))
    }

    /// Removes stored files no pod's last push refers to; returns how many.
    pub fn collect_files(&self) -> Result<usize, JournalError> {
        let mut referenced = std::collections::HashSet::new();
        for pod in self.pods()? {
            referenced.extend(pod.pushed.unwrap_or_default().into_iter().map(|(_, checksum)| checksum));
        }
        let mut removed = 0;
        for key in self.files.iter().keys() {
            let key = key.map_err(|source| self.store("collecting files", source))?;
            let known = <[u8; 32]>::try_from(key.as_ref()).ok().map(Checksum::from_bytes);
            if known.is_none_or(|checksum| !referenced.contains(&checksum)) {
                self.files.remove(key).map_err(|source| self.store("collecting files", source))?;
                removed += 1;
            }
        }
        self.flush()?;
        Ok(removed)
    }

    /// Bytes the journal occupies on disk.
    pub fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or_default()
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

fn pod_record(pod: &JournaledPod) -> PodRecordV1 {
    PodRecordV1 {
        uid: pod.uid.0.clone(),
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        state: state_code(pod.state),
        pushed: pod.pushed.as_ref().map(|files| files.iter().map(|(n, c)| (n.clone(), *c.as_bytes())).collect()),
        config_version: pod.config_version.map(|v| v.0),
        last: transition_record(&pod.last_transition),
    }
}

fn transition_record(entry: &TransitionEntry) -> TransitionRecordV1 {
    TransitionRecordV1 {
        seq: entry.seq,
        at_ms: millis(entry.at),
        from: state_code(entry.from),
        to: state_code(entry.to),
        reason: entry.reason.clone(),
        error: entry.error.clone(),
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
    let (version, payload) = codec::open(RecordKind::Pod, bytes)?;
    let record: PodRecordV1 = codec::decode_payload(RecordKind::Pod, version, payload)?;
    let kind = RecordKind::Pod;
    Ok(JournaledPod {
        uid: PodUid(record.uid),
        namespace: record.namespace,
        name: record.name,
        state: state(record.state, kind, version)?,
        pushed: record.pushed.map(|files| files.into_iter().map(|(n, c)| (n, Checksum::from_bytes(c))).collect()),
        config_version: record.config_version.map(ConfigVersion),
        last_transition: transition_entry(record.last, kind, version)?,
    })
}

fn decode_transition(bytes: &[u8]) -> Result<TransitionEntry, CodecError> {
    let (version, payload) = codec::open(RecordKind::Transition, bytes)?;
    let record: TransitionRecordV1 = codec::decode_payload(RecordKind::Transition, version, payload)?;
    transition_entry(record, RecordKind::Transition, version)
}

fn transition_entry(record: TransitionRecordV1, kind: RecordKind, version: u16) -> Result<TransitionEntry, CodecError> {
    Ok(TransitionEntry {
        seq: record.seq,
        at: from_millis(record.at_ms),
        from: state(record.from, kind, version)?,
        to: state(record.to, kind, version)?,
        reason: record.reason,
        error: record.error,
    })
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
            config_version: Some(ConfigVersion(seq)),
            last_transition: TransitionEntry {
                seq,
                at: from_millis(1_700_000_000_000 + seq),
                from: State::Syncing,
                to,
                reason: format!("step {seq}"),
                error: None,
            },
        }
    }

    #[test]
    fn commits_survive_a_reopen_and_the_log_keeps_only_the_last_transitions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        {
            let (journal, report) = Journal::open(&path, 3).unwrap();
            assert_eq!(report, OpenReport { moved_aside: None, pods: 0 });
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
