//! The rendered file set: what render produces, what plan compares, what the journal records.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The general file, beside the others on each pod, that names the content of every
/// certificate the last deployment left there. The Dataplane API never gives a certificate
/// back, and a renewed certificate keeps its name, so this is how a verification knows which
/// content a certificate file has. Written after the certificates themselves, so it never
/// claims more than the pod has; no render may name a file so.
pub const CERTIFICATE_MANIFEST: &str = "haptic-certificates.sum";

/// SHA-256 of a file's content; the identity of what a pod was given.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Checksum([u8; 32]);

impl Checksum {
    /// The checksum of some content.
    pub fn of(content: &[u8]) -> Self {
        Self(Sha256::digest(content).into())
    }

    /// The checksum of `lines` each ended by a newline, as `of` their joined text would give,
    /// without building that text (a stored configuration is megabytes at scale).
    pub fn of_lines<'a>(lines: impl IntoIterator<Item = &'a str>) -> Self {
        let mut hasher = Sha256::new();
        for line in lines {
            hasher.update(line.as_bytes());
            hasher.update(b"\n");
        }
        Self(hasher.finalize().into())
    }

    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A checksum from its raw digest (as stored).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// A checksum from the 64 lowercase hex digits it displays as; `None` for anything else.
    pub fn from_hex(text: &str) -> Option<Self> {
        if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return None;
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Self(bytes))
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

/// One rendered file and its checksum. A sensitive file (a certificate with its private key)
/// is deployed like any other but never shown: its `Debug` hides the content, and the HTTP API
/// and the render directory give its checksum only.
#[derive(Clone, PartialEq, Eq)]
pub struct RenderedFile {
    /// The text, shared: a render's files are handed to the API, the deployer and every pod's
    /// driver, and at 10,000 Ingresses the configuration alone is 4 MB.
    pub content: Arc<str>,
    /// SHA-256 of `content`.
    pub checksum: Checksum,
    /// Whether the content is secret (holds a private key).
    pub sensitive: bool,
}

impl RenderedFile {
    /// Wraps content, computing its checksum.
    pub fn new(content: impl Into<Arc<str>>) -> Self {
        let content = content.into();
        let checksum = Checksum::of(content.as_bytes());
        Self { content, checksum, sensitive: false }
    }

    /// Wraps secret content (a certificate with its key).
    pub fn sensitive(content: impl Into<Arc<str>>) -> Self {
        Self { sensitive: true, ..Self::new(content) }
    }
}

impl fmt::Debug for RenderedFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("RenderedFile");
        if self.sensitive {
            debug.field("content", &format_args!("<{} secret bytes>", self.content.len()));
        } else {
            debug.field("content", &self.content);
        }
        debug.field("checksum", &self.checksum).finish()
    }
}

/// Password hashes (the crypt(3) forms HAProxy's userlists take: `$1$`, `$5$`, `$6$`, `$2a$`,
/// `$2b$`, `$2y$`, `$y$`) replaced by `<redacted>`: what the HTTP API, the render directory and
/// error messages show of a configuration whose userlists hold basic-auth users.
/// So are the digests of `{SHA}` users, which the library compares in rules of their own
/// (`http_auth_pass,sha1,base64 -m str '<digest>'`).
pub fn redact_password_hashes(text: &str) -> std::borrow::Cow<'_, str> {
    static HASH: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"\$(?:1|5|6|2[aby]|y)\$[A-Za-z0-9./$=]+").expect("a valid pattern")
    });
    static SHA_DIGEST: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"(http_auth_pass,sha1,base64 -m str )'[A-Za-z0-9+/=]+'").expect("a valid pattern")
    });
    let hashed = HASH.replace_all(text, "<redacted>");
    if !SHA_DIGEST.is_match(&hashed) {
        return hashed;
    }
    std::borrow::Cow::Owned(SHA_DIGEST.replace_all(&hashed, "$1<redacted>").into_owned())
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
    /// TLS certificates (PEM with their keys) by name; always sensitive.
    pub certs: BTreeMap<String, RenderedFile>,
}

impl FileSet {
    /// Every file with its path relative to an output directory: `haproxy.cfg`, `maps/<name>`,
    /// `files/<name>`, `certs/<name>`, in a stable order.
    pub fn entries(&self) -> impl Iterator<Item = (String, &RenderedFile)> {
        std::iter::once(("haproxy.cfg".to_owned(), &self.haproxy_cfg))
            .chain(self.maps.iter().map(|(name, file)| (format!("maps/{name}"), file)))
            .chain(self.files.iter().map(|(name, file)| (format!("files/{name}"), file)))
            .chain(self.certs.iter().map(|(name, file)| (format!("certs/{name}"), file)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checksum_reads_back_from_its_hex() {
        let checksum = Checksum::of(b"global\n");
        assert_eq!(Checksum::from_hex(&checksum.to_string()), Some(checksum));
        assert_eq!(Checksum::from_hex("abc"), None);
        assert_eq!(Checksum::from_hex(&"G".repeat(64)), None);
    }

    #[test]
    fn lines_hash_as_their_joined_text_does() {
        let lines = ["global", "  maxconn 10", "", "backend b"];
        assert_eq!(Checksum::of_lines(lines), Checksum::of(b"global\n  maxconn 10\n\nbackend b\n"));
        assert_eq!(Checksum::of_lines([]), Checksum::of(b""));
    }

    #[test]
    fn checksum_is_sha256_in_hex() {
        assert_eq!(Checksum::of(b"").to_string(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }

    #[test]
    fn entries_list_config_then_maps_then_files() {
        let set = FileSet {
            haproxy_cfg: RenderedFile::new("global\n"),
            maps: BTreeMap::from([("host.map".into(), RenderedFile::new(String::new()))]),
            files: BTreeMap::from([("500.http".into(), RenderedFile::new(String::new()))]),
            certs: BTreeMap::from([("web_shop.pem".into(), RenderedFile::sensitive("KEY"))]),
        };
        let names: Vec<_> = set.entries().map(|(name, _)| name).collect();
        assert_eq!(names, ["haproxy.cfg", "maps/host.map", "files/500.http", "certs/web_shop.pem"]);
    }

    #[test]
    fn password_hashes_are_redacted_and_nothing_else() {
        let config = "userlist ul\n    user alice password $6$abc$Id.W/K=x\n    user bob password $2y$05$abcdefghij\n    http-request set-path /a$1\n    http-request set-var(txn.ok) bool(true) if { http_auth_user -m str carol } { http_auth_pass,sha1,base64 -m str 'qUqP5cyxm6YcTAhz05Hph5gvu9M=' }\n";
        let shown = redact_password_hashes(config);
        assert!(!shown.contains("$6$abc") && !shown.contains("$2y$05") && !shown.contains("qUqP5"), "{shown}");
        assert!(shown.contains("base64 -m str <redacted> }"), "{shown}");
        assert!(shown.contains("user alice password <redacted>") && shown.contains("set-path /a$1"), "{shown}");
    }

    #[test]
    fn sensitive_content_never_shows_in_debug() {
        let shown = format!("{:?}", RenderedFile::sensitive("-----BEGIN PRIVATE KEY-----"));
        assert!(!shown.contains("PRIVATE") && shown.contains("27 secret bytes"), "{shown}");
    }
}
