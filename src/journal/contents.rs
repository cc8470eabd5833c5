//! File contents the journal keeps (the originals of files a validation replaced on a pod), one
//! plain file per content, named by its checksum, in a directory beside sled's own files.
//!
//! Why not in sled: sled 0.34 writes a page over about 128 KiB (a map file at a few thousand
//! Ingresses) as a blob file of its own and never deletes it, not when the value is removed and
//! not after a reopen. Stored in sled, every validation's map originals grew the journal by
//! their whole size for ever (measured: 300 replacements of a 700 KB file, 6 kept, left 437 MiB
//! on disk; under churn at 10,000 Ingresses the journal grew ~9 MiB a minute), and sled held
//! the newest of them in memory too.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::files::Checksum;

use super::JournalError;

/// The directory's name inside the journal directory (sled leaves names it does not own alone).
const DIR_NAME: &str = "file-contents";
/// Prefix of a content being written, renamed into place once it is on disk.
const PARTIAL: &str = ".partial-";

/// A content-addressed directory of file contents.
pub(crate) struct Contents {
    dir: PathBuf,
}

impl Contents {
    /// The store inside `journal_dir`, created when missing.
    pub(crate) fn open(journal_dir: &Path) -> Result<Self, JournalError> {
        let dir = journal_dir.join(DIR_NAME);
        std::fs::create_dir_all(&dir).map_err(|source| error(&dir, "creating the file contents directory", source))?;
        Ok(Self { dir })
    }

    fn path(&self, checksum: &Checksum) -> PathBuf {
        self.dir.join(checksum.to_string())
    }

    /// Stores `content` under its checksum, durably: when this returns the content is on disk
    /// under its final name (written aside and renamed, so a crash never leaves a partial file
    /// there).
    pub(crate) fn put(&self, content: &[u8]) -> Result<Checksum, JournalError> {
        let checksum = Checksum::of(content);
        let path = self.path(&checksum);
        if path.exists() {
            return Ok(checksum);
        }
        // A name of its own per write: two pods' validations may store the same content at once.
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let write_number = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let partial = self.dir.join(format!("{PARTIAL}{checksum}-{}-{write_number}", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::File::create(&partial)?;
            file.write_all(content)?;
            file.sync_all()?;
            std::fs::rename(&partial, &path)?;
            // The rename is durable once the directory is.
            std::fs::File::open(&self.dir)?.sync_all()
        };
        write().map_err(|source| error(&path, "storing a file's content", source))?;
        Ok(checksum)
    }

    /// A stored content, checked against its checksum (`None`: not stored).
    pub(crate) fn get(&self, checksum: &Checksum) -> Result<Option<Vec<u8>>, JournalError> {
        let path = self.path(checksum);
        let content = match std::fs::read(&path) {
            Ok(content) => content,
            Err(source) if source.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(error(&path, "reading a file's content", source)),
        };
        if Checksum::of(&content) != *checksum {
            return Err(JournalError::CorruptContent { path });
        }
        Ok(Some(content))
    }

    /// Removes every content not in `keep` (and anything half written: the journal calls this
    /// only under the lock its writers take); returns how many.
    pub(crate) fn retain(&self, keep: &HashSet<Checksum>) -> Result<usize, JournalError> {
        let entries =
            std::fs::read_dir(&self.dir).map_err(|source| error(&self.dir, "listing the file contents", source))?;
        let mut removed = 0;
        for entry in entries {
            let entry = entry.map_err(|source| error(&self.dir, "listing the file contents", source))?;
            let name = entry.file_name();
            let kept = name.to_str().and_then(Checksum::from_hex).is_some_and(|checksum| keep.contains(&checksum));
            if !kept {
                let path = entry.path();
                std::fs::remove_file(&path).map_err(|source| error(&path, "removing a file's content", source))?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Bytes the contents occupy.
    pub(crate) fn size(&self) -> u64 {
        std::fs::read_dir(&self.dir)
            .map(|entries| entries.flatten().filter_map(|entry| entry.metadata().ok()).map(|meta| meta.len()).sum())
            .unwrap_or_default()
    }
}

fn error(path: &Path, action: &'static str, source: std::io::Error) -> JournalError {
    JournalError::Contents { path: path.to_owned(), action, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contents_are_stored_once_read_back_checked_and_removed_unless_kept() {
        let dir = tempfile::tempdir().unwrap();
        let contents = Contents::open(dir.path()).unwrap();
        let kept = contents.put(b"kept").unwrap();
        assert_eq!(contents.put(b"kept").unwrap(), kept);
        let dropped = contents.put(b"dropped").unwrap();
        std::fs::write(dir.path().join(DIR_NAME).join(format!("{PARTIAL}{dropped}")), b"half").unwrap();
        assert_eq!(contents.get(&kept).unwrap().as_deref(), Some(&b"kept"[..]));
        assert_eq!(contents.retain(&HashSet::from([kept])).unwrap(), 2, "the unkept and the half written");
        assert_eq!(contents.get(&dropped).unwrap(), None);
        assert_eq!(contents.get(&kept).unwrap().as_deref(), Some(&b"kept"[..]));
    }

    #[test]
    fn a_content_that_no_longer_matches_its_checksum_is_an_error_naming_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let contents = Contents::open(dir.path()).unwrap();
        let checksum = contents.put(b"original").unwrap();
        std::fs::write(contents.path(&checksum), b"bit rot").unwrap();
        let error = contents.get(&checksum).unwrap_err().to_string();
        assert!(error.contains(&checksum.to_string()), "{error}");
    }
}
