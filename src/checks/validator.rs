//! The validator: a Dataplane API beside the controller that serves no traffic (the chart's
//! `validator` containers: the HAProxy image's Dataplane API and an HAProxy of its own, on the
//! pod's loopback). The controller's image holds no HAProxy; this one checks renders for the
//! admission webhook (`check`: the render's maps, general files and certificates put in its
//! storage, at the pods' paths, then `only_validate`) and runs them for the configuration's
//! validation-test requests (`serve`: the render instrumented as for a local HAProxy, pushed
//! and reloaded, then asked on loopback). No pod of the fleet is ever asked or written to.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::{Mutex, MutexGuard};

use super::haproxy::{HaproxyError, free_local_port, until_listening};
use super::instrument::{Instrumented, instrument};
use crate::dataplane::{
    Access, ConfigVersion, Credentials, DataplaneClient, DataplaneError, Endpoint, PushMode, PushOutcome, ReloadEnd,
    StorageKind,
};
use crate::files::{Checksum, FileSet};

/// Where the instrumented render's sockets go on the validator: its run directory (an
/// `emptyDir` in the chart).
const RUN_DIR: &str = "/var/run/haproxy";
/// How long the validator's HAProxy may take to reload and listen.
const START_LIMIT: Duration = Duration::from_secs(15);

/// How long one request to the scratch API may take: below the webhook's own timeout (5 s in
/// the chart), so that a stalled validator is answered for, not timed out by the API server.
const REQUEST_LIMIT: Duration = Duration::from_secs(4);

/// What the scratch API's storage holds, as this process put it there: a file's checksum, or
/// `None` for a file found there that this process did not write.
type Held = HashMap<(StorageKind, String), Option<Checksum>>;

/// What a check made of a render.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// HAProxy accepts it.
    Accepted,
    /// HAProxy refuses it: its message, at the rendered file's lines.
    Refused(String),
}

/// The validator's Dataplane API.
pub struct ValidatorApi {
    /// Its base URL, as messages name it.
    endpoint: String,
    client: DataplaneClient,
    /// One review at a time: the storage is shared by all of them. `None` until listed (and
    /// again after a failed write, when what it holds is no longer known).
    held: Mutex<Option<Held>>,
}

impl ValidatorApi {
    /// A validator reached at `endpoint` (`http://127.0.0.1:5555/v3` beside the controller).
    pub fn new(endpoint: &str, credentials: Credentials) -> Result<Self, DataplaneError> {
        let access =
            Access { credentials, previous_credentials: None, tls: None, request_timeout: Some(REQUEST_LIMIT) };
        let client = access.client(Endpoint::parse(endpoint)?)?;
        Ok(Self { endpoint: endpoint.to_owned(), client, held: Mutex::new(None) })
    }

    /// Whether HAProxy accepts `files` (`only_validate`; nothing runs it).
    pub async fn check(&self, files: &FileSet) -> Result<Verdict, DataplaneError> {
        let mut guard = self.held.lock().await;
        let outcome = match self.store(&mut guard, files).await {
            Ok(()) => {
                self.client.push_raw(files.haproxy_cfg.content.clone(), ConfigVersion(0), PushMode::ValidateOnly).await
            }
            Err(error) => Err(error),
        };
        match outcome {
            Ok(_) => Ok(Verdict::Accepted),
            Err(DataplaneError::InvalidConfiguration { message, .. }) => {
                Ok(Verdict::Refused(format!("HAProxy refuses the render: {}", as_rendered(&message))))
            }
            Err(error @ DataplaneError::FileRefused { .. }) => {
                Ok(Verdict::Refused(format!("HAProxy refuses the render: {error}")))
            }
            Err(other) => {
                *guard = None;
                Err(other)
            }
        }
    }

    /// Has the validator's HAProxy run `files`, instrumented as for a local HAProxy (binds
    /// moved to free loopback ports, every HTTP backend answering in its own name), and waits
    /// until it listens. The validator serves nothing else until the answer is dropped.
    pub async fn serve(&self, files: &FileSet) -> Result<Serving<'_>, HaproxyError> {
        let unavailable = |error: DataplaneError| HaproxyError::Validator(error.to_string());
        let mut guard = self.held.lock().await;
        if let Err(error) = self.store(&mut guard, files).await {
            *guard = None;
            return Err(unavailable(error));
        }
        // The validator's storage is at the pods' paths: only sockets move (to its run directory).
        let mut next_port = free_local_port;
        let instrumented = instrument(&files.haproxy_cfg.content, &[], std::path::Path::new(RUN_DIR), &mut next_port)
            .map_err(HaproxyError::Instrument)?;
        let version = self.client.configuration_version().await.map_err(unavailable)?;
        match self.client.push_raw(&instrumented.config, version, PushMode::ForceReload).await {
            Ok(PushOutcome::ReloadQueued(id, _)) => match self.client.await_reload(&id, START_LIMIT).await {
                Ok(ReloadEnd::Succeeded) => {}
                Ok(ReloadEnd::Failed(output)) => {
                    return Err(HaproxyError::Validator(format!("its HAProxy did not reload: {}", output.trim())));
                }
                Ok(ReloadEnd::StillRunning) => {
                    return Err(HaproxyError::Validator(format!(
                        "its HAProxy did not reload within {}s",
                        START_LIMIT.as_secs()
                    )));
                }
                Err(error) => return Err(unavailable(error)),
            },
            Ok(_) => {}
            Err(DataplaneError::InvalidConfiguration { message, .. }) => {
                return Err(HaproxyError::Refused(format!("{} (instrumented to run here)", as_rendered(&message))));
            }
            Err(error) => return Err(unavailable(error)),
        }
        let deadline = tokio::time::Instant::now() + START_LIMIT;
        if let Err(port) = until_listening(&instrumented, deadline, || false).await {
            return Err(HaproxyError::Validator(format!(
                "its HAProxy did not listen on 127.0.0.1:{port} within {}s",
                START_LIMIT.as_secs()
            )));
        }
        Ok(Serving { _turn: guard, instrumented })
    }

    /// Puts the files of `files` the storage lacks (or holds otherwise) in it, and removes
    /// those no render wants any more, so the storage stays the size of one render.
    async fn store(&self, guard: &mut Option<Held>, files: &FileSet) -> Result<(), DataplaneError> {
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
        let stale: Vec<(StorageKind, String)> = held
            .keys()
            .filter(|(kind, name)| !wanted.iter().any(|(k, n, _, _)| k == kind && n == name))
            .cloned()
            .collect();
        for (kind, name) in stale {
            // The API keeps a map the stored configuration names (409): it stays, harmless.
            if self.client.delete_storage(kind, &name).await.is_ok() {
                held.remove(&(kind, name));
            }
        }
        Ok(())
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

impl std::fmt::Debug for ValidatorApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValidatorApi").field("endpoint", &self.endpoint).finish_non_exhaustive()
    }
}

/// The validator's HAProxy running a render, asked on loopback; the validator is held
/// (no review, no other test runs on it) while this lives.
pub struct Serving<'a> {
    _turn: MutexGuard<'a, Option<Held>>,
    /// The render as it runs: where each bind went.
    pub instrumented: Instrumented,
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
            set.iter().map(move |(name, file)| (kind, name.as_str(), file.content.as_ref(), file.checksum))
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
    async fn an_unreachable_validator_is_an_error_not_a_verdict() {
        // Port 9 of loopback: nothing listens (connection refused at once).
        let validator =
            ValidatorApi::new("http://127.0.0.1:9/v3", Credentials::new("admin", "secret")).expect("a valid endpoint");
        let files = FileSet {
            haproxy_cfg: crate::files::RenderedFile::new("global\n"),
            maps: [("hosts.map".to_owned(), crate::files::RenderedFile::new("a.example web\n"))].into(),
            files: Default::default(),
            certs: Default::default(),
        };
        assert!(validator.check(&files).await.is_err());
        assert!(matches!(validator.serve(&files).await, Err(HaproxyError::Validator(_))));
    }
}
