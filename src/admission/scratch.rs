//! Validation by a scratch Dataplane API: one that serves no traffic (the chart runs it beside
//! the controller, on the pod's loopback, with the HAProxy image's binary and no HAProxy
//! running). The render's maps, general files and certificates are put in its storage, at the
//! same paths the pods have, and `only_validate` has its HAProxy check the configuration. No
//! pod of the fleet is asked or written to, so a review has no side effect on the cluster; and
//! the image of the controller needs no HAProxy of its own.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::Mutex;

use crate::admission::{Check, Validator};
use crate::config::HAProxyTemplateConfigSpec;
use crate::dataplane::{
    Access, ConfigVersion, Credentials, DataplaneClient, DataplaneError, Endpoint, PushMode, StorageKind,
};
use crate::files::{Checksum, FileSet};

/// How long one request to the scratch API may take: below the webhook's own timeout (5 s in
/// the chart), so that a stalled validator is answered for, not timed out by the API server.
const REQUEST_LIMIT: Duration = Duration::from_secs(4);

/// What the scratch API's storage holds, as this process put it there: a file's checksum, or
/// `None` for a file found there that this process did not write.
type Held = HashMap<(StorageKind, String), Option<Checksum>>;

/// A Dataplane API used only to validate renders.
pub struct ScratchDataplane {
    client: DataplaneClient,
    /// One review at a time: the storage is shared by all of them. `None` until listed (and
    /// again after a failed write, when what it holds is no longer known).
    held: Mutex<Option<Held>>,
}

impl ScratchDataplane {
    /// A validator reached at `endpoint` (`http://127.0.0.1:5555/v3` beside the controller).
    pub fn new(endpoint: &str, credentials: Credentials) -> Result<Self, DataplaneError> {
        let access = Access { credentials, tls: None, request_timeout: Some(REQUEST_LIMIT) };
        Ok(Self { client: access.client(Endpoint::parse(endpoint)?)?, held: Mutex::new(None) })
    }

    async fn check(&self, files: &FileSet) -> Result<Check, DataplaneError> {
        let mut guard = self.held.lock().await;
        let held = match guard.as_mut() {
            Some(held) => held,
            None => guard.insert(self.list().await?),
        };
        let wanted = stored_files(files);
        for (kind, name, content, checksum) in &wanted {
            let key = (*kind, (*name).to_owned());
            match held.get(&key) {
                Some(Some(known)) if known == checksum => continue,
                present => {
                    let exists = present.is_some();
                    // Not known after a failed write: listed again at the next review.
                    held.remove(&key);
                    self.client.put_storage(*kind, name, content, exists).await?;
                    held.insert(key, Some(*checksum));
                }
            }
        }
        let outcome = self.client.push_raw(&files.haproxy_cfg.content, ConfigVersion(0), PushMode::ValidateOnly).await;
        // Files no render wants any more go, so the storage stays the size of one render.
        let stale: Vec<(StorageKind, String)> = held
            .keys()
            .filter(|(kind, name)| !wanted.iter().any(|(k, n, _, _)| k == kind && n == name))
            .cloned()
            .collect();
        for (kind, name) in stale {
            held.remove(&(kind, name.clone()));
            self.client.delete_storage(kind, &name).await?;
        }
        match outcome {
            Ok(_) => Ok(Check::Accepted),
            Err(DataplaneError::InvalidConfiguration { message, .. }) => {
                Ok(Check::Refused(format!("HAProxy refuses the render: {}", as_rendered(&message))))
            }
            Err(other) => Err(other),
        }
    }

    async fn list(&self) -> Result<Held, DataplaneError> {
        let mut held = Held::new();
        for kind in [StorageKind::Maps, StorageKind::General, StorageKind::Certificates] {
            for name in self.client.list_storage(kind).await? {
                held.insert((kind, name), None);
            }
        }
        Ok(held)
    }
}

impl Validator for ScratchDataplane {
    fn validate<'a>(
        &'a self,
        files: &'a FileSet,
        _spec: &'a HAProxyTemplateConfigSpec,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Check> + Send + 'a>> {
        Box::pin(async move {
            match self.check(files).await {
                Ok(check) => check,
                Err(error) => {
                    *self.held.lock().await = None;
                    Check::Unavailable(format!("the validating Dataplane API: {error}"))
                }
            }
        })
    }
}

/// Every file of `files` the storage keeps, with its kind, name, content and checksum.
fn stored_files(files: &FileSet) -> Vec<(StorageKind, &str, &str, Checksum)> {
    let kinds = [
        (StorageKind::Maps, &files.maps),
        (StorageKind::General, &files.files),
        (StorageKind::Certificates, &files.certs),
    ];
    kinds
        .into_iter()
        .flat_map(|(kind, set)| {
            set.iter().map(move |(name, file)| (kind, name.as_str(), file.content.as_str(), file.checksum))
        })
        .collect()
}

/// HAProxy's message as the API relays it (`validation error: exit status 1: msg="..."`, one
/// `msg` a line), its lines alone, without the closing "Fatal errors found", and with the API's
/// scratch file (`/tmp/onlyvalidate<digits>`, client-native's `os.CreateTemp`) named as the
/// render's `haproxy.cfg`, whose lines it counts.
pub fn as_rendered(message: &str) -> String {
    let lines: Vec<&str> = message
        .lines()
        .filter_map(|line| line.split_once("msg=\"").map(|(_, said)| said.strip_suffix('"').unwrap_or(said)))
        .filter(|said| !said.contains("Fatal errors found in configuration"))
        .collect();
    let said = if lines.is_empty() { message.to_owned() } else { lines.join("; ") };
    const SCRATCH: &str = "/tmp/onlyvalidate";
    let mut shown = String::with_capacity(said.len());
    let mut rest = said.as_str();
    while let Some(at) = rest.find(SCRATCH) {
        shown.push_str(&rest[..at]);
        shown.push_str("haproxy.cfg");
        rest = rest[at + SCRATCH.len()..].trim_start_matches(|c: char| c.is_ascii_digit());
    }
    shown.push_str(rest);
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scratch_file_is_named_as_the_render() {
        let message = "validation error: exit status 1: msg=\"config Parsing [/tmp/onlyvalidate1120494981:10]: \
                       failed to parse\"\nmsg=\"config Fatal errors found in configuration.\"";
        let shown = as_rendered(message);
        assert_eq!(shown, "config Parsing [haproxy.cfg:10]: failed to parse");
        assert_eq!(as_rendered("no file named"), "no file named");
    }

    #[tokio::test]
    async fn an_unreachable_validator_leaves_the_render_unchecked_not_refused() {
        // Port 9 of loopback: nothing listens (connection refused at once).
        let validator = ScratchDataplane::new("http://127.0.0.1:9/v3", Credentials::new("admin", "secret"))
            .expect("a valid endpoint");
        let files = FileSet {
            haproxy_cfg: crate::files::RenderedFile::new("global\n".into()),
            maps: [("hosts.map".to_owned(), crate::files::RenderedFile::new("a.example web\n".into()))].into(),
            files: Default::default(),
            certs: Default::default(),
        };
        let spec: HAProxyTemplateConfigSpec =
            serde_json::from_value(serde_json::json!({"podSelector": {"matchLabels": {}}, "watchedResources": {}, "templates": {"haproxyConfig": "global\n"}}))
                .expect("a spec");
        match validator.validate(&files, &spec).await {
            Check::Unavailable(why) => assert!(why.contains("validating Dataplane API"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
