//! The rendered file set: what render produces, what plan compares, what the journal records.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// SHA-256 of a file's content; the identity of what a pod was given.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Checksum([u8; 32]);

impl Checksum {
    /// The checksum of some content.
    pub fn of(content: &[u8]) -> Self {
        Self(Sha256::digest(content).into())
    }

    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A checksum from its raw digest (as stored).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }
}

impl fmt::Display for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Twelve hex digits tell checksums apart in logs and test failures.
        write!(f, "Checksum({})", &self.to_string()[..12])
    }
}

/// One rendered file and its checksum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderedFile {
    /// The text.
    pub content: String,
    /// SHA-256 of `content`.
    pub checksum: Checksum,
}

impl RenderedFile {
    /// Wraps content, computing its checksum.
    pub fn new(content: String) -> Self {
        let checksum = Checksum::of(content.as_bytes());
        Self { content, checksum }
    }
}

/// Everything one render produces for the fleet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileSet {
    /// The main configuration.
    pub haproxy_cfg: RenderedFile,
    /// Map files by name.
    pub maps: BTreeMap<String, RenderedFile>,
    /// General files (error pages...) by name.
    pub files: BTreeMap<String, RenderedFile>,
}

impl FileSet {
    /// Every file with its path relative to an output directory: `haproxy.cfg`, `maps/<name>`,
    /// `files/<name>`, in a stable order.
    pub fn entries(&self) -> impl Iterator<Item = (String, &RenderedFile)> {
        std::iter::once(("haproxy.cfg".to_owned(), &self.haproxy_cfg))
            .chain(self.maps.iter().map(|(name, file)| (format!("maps/{name}"), file)))
            .chain(self.files.iter().map(|(name, file)| (format!("files/{name}"), file)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_is_sha256_in_hex() {
        assert_eq!(Checksum::of(b"").to_string(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }

    #[test]
    fn entries_list_config_then_maps_then_files() {
        let set = FileSet {
            haproxy_cfg: RenderedFile::new("global\n".into()),
            maps: BTreeMap::from([("host.map".into(), RenderedFile::new(String::new()))]),
            files: BTreeMap::from([("500.http".into(), RenderedFile::new(String::new()))]),
        };
        let names: Vec<_> = set.entries().map(|(name, _)| name).collect();
        assert_eq!(names, ["haproxy.cfg", "maps/host.map", "files/500.http"]);
    }
}
