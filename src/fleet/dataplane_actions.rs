//! [`PodActions`] through the HAProxy Dataplane API: the adapter between a pod's state machine
//! and the pod.
//!
//! The Dataplane API does not store the configuration it is sent: it stores its parser's
//! layout of it (sections reordered, its own indentation, `# _md5hash=` and `# _version=` lines
//! on top). So every pushed file carries a marker line naming the checksum of the render it
//! came from, and the push's answer (the file as stored) gives the checksum of the stored
//! layout; verification recognises a push by both (see [`recognise`]).
//!
//! Verify reads the configuration and every stored map and general file and checksums them.
//! Validate uploads the auxiliary files that differ, remembering what they replaced, then
//! validates the whole configuration on the pod; what each upload replaces is journaled before
//! it is replaced. Push writes it as one raw update on top of the configuration version last
//! read (a conflict when the pod moved on), reloads, then removes files no longer desired. A
//! rejected configuration's uploads, and those of a configuration whose reload failed, are put
//! back as they were, from the journal, so a restart in between loses nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::driver::PodActions;
use super::pod::{ActionError, Desired, Patched, PodTarget, Reading, Validation};
use crate::dataplane::{
    Access, ConfigBody, ConfigVersion, DataplaneClient, DataplaneError, Endpoint, PushMode, PushOutcome, ReloadEnd,
    ReloadId, StorageKind, StoredConfig, WriteGuard,
};
use crate::files::{CERTIFICATE_MANIFEST, Checksum};
use crate::journal::{Journal, on_blocking_pool};
use crate::plan::{AddressChanges, RuntimeAction, runtime_actions_header};
use crate::pod::{LeaderTerm, PodUid, PodVersions, StoredCopy};

/// How long a reload may take before the push counts as failed.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(30);
/// The comment that names, inside a pushed configuration, the render it came from.
const RENDER_MARKER: &str = "# haptic-render: ";

/// The Dataplane adapter for every pod.
pub struct DataplaneActions {
    access: Mutex<Access>,
    clients: Mutex<HashMap<String, DataplaneClient>>,
    /// Where what a validation replaces is recorded before it is replaced, so that it can be put
    /// back even by a controller that restarted in between.
    journal: Arc<Journal>,
    /// Asked before every write to a pod (the leader's lease, in production).
    guard: Arc<dyn WriteGuard>,
    /// Each pod's HAProxy version, as its last reading said.
    haproxy_versions: Mutex<HashMap<PodUid, String>>,
    /// Renders a pod's HAProxy accepted, with that HAProxy's version: another pod running the
    /// same version is not asked again (one `haproxy -c` per render and version, not per pod,
    /// which on a large fleet is most of a deployment's work). The push still has the pod's
    /// Dataplane API check the configuration before it writes it, so a pod that would refuse
    /// it refuses it there.
    validated: Mutex<std::collections::VecDeque<(Checksum, String)>>,
}

/// How many accepted (render, HAProxy version) pairs are remembered.
const VALIDATED_KEPT: usize = 16;

/// Lets writes out while this replica holds the lease in the term the fleet deploys in, and
/// for no longer than it may still hold it.
#[derive(Debug)]
pub struct LeaseGuard {
    fence: Arc<crate::election::Fence>,
    term: LeaderTerm,
}

impl LeaseGuard {
    /// A guard for writes planned in `term`.
    pub fn new(fence: Arc<crate::election::Fence>, term: LeaderTerm) -> Self {
        Self { fence, term }
    }
}

impl WriteGuard for LeaseGuard {
    fn allow(&self) -> Result<Option<Duration>, String> {
        self.fence.remaining(self.term).map_err(|fenced| fenced.to_string())
    }
}

impl DataplaneActions {
    /// An adapter reaching every pod with `access`, recording uploads in `journal`, writing
    /// only while `guard` allows.
    pub fn new(access: Access, journal: Arc<Journal>, guard: Arc<dyn WriteGuard>) -> Self {
        Self {
            access: Mutex::new(access),
            clients: Mutex::new(HashMap::new()),
            journal,
            guard,
            haproxy_versions: Mutex::new(HashMap::new()),
            validated: Mutex::new(std::collections::VecDeque::new()),
        }
    }

    /// Replaces the credentials or TLS settings (a Secret changed); connections are rebuilt
    /// with them. Unchanged settings keep the open connections.
    /// The credentials replaced stay a fallback (unless the Secret names the previous password
    /// itself): pods started with them hold them until they are rolled.
    pub fn set_access(&self, mut access: Access) {
        if let Ok(mut current) = self.access.lock() {
            if access.previous_credentials.is_none() {
                access.previous_credentials = if current.credentials == access.credentials {
                    current.previous_credentials.clone()
                } else {
                    Some(current.credentials.clone())
                };
            }
            if *current == access {
                return;
            }
            *current = access;
        }
        if let Ok(mut clients) = self.clients.lock() {
            clients.clear();
        }
    }

    fn client(&self, pod: &PodTarget) -> Result<DataplaneClient, ActionError> {
        let mut clients = self.clients.lock().map_err(|_| failed("client cache poisoned"))?;
        if let Some(client) = clients.get(&pod.endpoint) {
            return Ok(client.clone());
        }
        let endpoint = Endpoint::parse(&pod.endpoint).map_err(failed)?;
        let access = self.access.lock().map_err(|_| failed("access settings poisoned"))?.clone();
        let client = access.client(endpoint).map_err(failed)?.guarded(self.guard.clone());
        clients.insert(pod.endpoint.clone(), client.clone());
        Ok(client)
    }

    /// Records what an upload is about to replace; no upload is made unless this is on disk.
    async fn record_upload(
        &self,
        uid: &PodUid,
        kind: StorageKind,
        name: &str,
        original: Option<&str>,
    ) -> Result<(), ActionError> {
        let (uid, name, original) = (uid.clone(), name.to_owned(), original.map(|o| o.as_bytes().to_vec()));
        on_blocking_pool(&self.journal, move |journal| journal.record_upload(&uid, kind, &name, original.as_deref()))
            .await
            .map_err(|error| ActionError::Failed(error.to_string()))
    }
}

fn failed(error: impl ToString) -> ActionError {
    ActionError::Failed(error.to_string())
}

/// The configuration as pushed: the render, with the marker naming it as its last line (last,
/// so that HAProxy's messages name the render's own line numbers).
pub fn with_render_marker(config: &Arc<str>, render: &Checksum) -> ConfigBody {
    // The render's text shared, not copied (see `dataplane::body`).
    ConfigBody::with_last_line(config.clone(), &format!("{RENDER_MARKER}{render}\n"))
}

/// The render a stored configuration claims to come from (its marker line), if any.
fn claimed_render(stored: &StoredConfig) -> Option<Checksum> {
    // The API keeps a trailing comment inside the last section, indented like its lines.
    stored
        .text
        .lines()
        .find_map(|line| line.trim_start().strip_prefix(RENDER_MARKER))
        .and_then(|hex| Checksum::from_hex(hex.trim()))
}

/// The checksum of a stored configuration's layout, without the lines the API rewrites on
/// every write.
pub fn stored_checksum(stored: &StoredConfig) -> Checksum {
    Checksum::of_lines(stored.content())
}

/// What a stored configuration is, as the machine compares it: the render its marker names,
/// unless haptic knows that push stored differently (the file was changed since, keeping the
/// marker); otherwise the checksum of the text itself, which no render has.
///
/// `in_doubt`, nothing is taken on its marker's word: a runtime patch was cut short or did not
/// take, so the files (stored before the runtime changes are made) may be there without their
/// effect on the running HAProxy, whatever the configuration file says; only a full sync
/// settles it.
pub fn recognise(stored: &StoredConfig, known: Option<&StoredCopy>, in_doubt: bool) -> (Checksum, Option<StoredCopy>) {
    let layout = stored_checksum(stored);
    let trusted = |render: Checksum| match known {
        _ if in_doubt => false,
        Some(known) if known.render == render => known.stored == layout,
        _ => true,
    };
    match claimed_render(stored) {
        Some(render) if trusted(render) => {
            (render, Some(StoredCopy { render, stored: layout, version: stored.version }))
        }
        _ => (Checksum::of(stored.text.as_bytes()), None),
    }
}

fn desired_storage(desired: &Desired) -> Vec<(StorageKind, &str, &str)> {
    let maps = desired.files.maps.iter().map(|(name, file)| (StorageKind::Maps, name.as_str(), file.content.as_ref()));
    let general =
        desired.files.files.iter().map(|(name, file)| (StorageKind::General, name.as_str(), file.content.as_ref()));
    maps.chain(general).collect()
}

fn prefix(kind: StorageKind) -> &'static str {
    match kind {
        StorageKind::Maps => "maps",
        StorageKind::General => "files",
        StorageKind::Certificates => "certs",
    }
}

fn render_checksum(desired: &Desired) -> Checksum {
    desired.files.haproxy_cfg.checksum
}

/// Waits for a queued reload (`DataplaneClient::await_reload`).
async fn wait_for_reload(client: &DataplaneClient, id: &ReloadId) -> Result<(), ActionError> {
    match client.await_reload(id, RELOAD_TIMEOUT).await.map_err(failed)? {
        ReloadEnd::Succeeded => Ok(()),
        ReloadEnd::Failed(output) => {
            Err(ActionError::ReloadFailed(format!("reload {id} failed: {}", haproxy_alerts(&output))))
        }
        ReloadEnd::StillRunning => {
            Err(failed(format!("reload {id} still in progress after {}s", RELOAD_TIMEOUT.as_secs())))
        }
    }
}

/// HAProxy's ALERT lines from a reload's output (its NOTICE lines name paths and pids), or
/// the whole output when it has none.
fn haproxy_alerts(output: &str) -> String {
    let alerts: Vec<&str> = output.lines().filter(|line| line.contains("[ALERT]")).map(str::trim).collect();
    if alerts.is_empty() { output.trim().to_owned() } else { alerts.join("; ") }
}

/// Whether the running HAProxy shows what `action` set (weights are not read back: the
/// Runtime API's server view does not carry them).
async fn runtime_state_matches(client: &DataplaneClient, action: &RuntimeAction) -> Result<bool, DataplaneError> {
    Ok(match action {
        RuntimeAction::SetAddress { backend, server, address, port } => {
            let seen = client.runtime_server(backend, server).await?;
            seen.address == *address && seen.port.map(|p| p.to_string()).as_deref() == Some(port.as_str())
        }
        RuntimeAction::SetState { backend, server, ready } => {
            let seen = client.runtime_server(backend, server).await?;
            (seen.admin_state == "ready") == *ready
        }
        // Weights are not in the server view; maps and certificates are read back apart.
        _ => true,
    })
}

fn write_error(error: DataplaneError) -> ActionError {
    match error {
        DataplaneError::VersionConflict { .. } => ActionError::VersionConflict(error.to_string()),
        // The pod's HAProxy refused the file at the write (the validation ran elsewhere, or
        // the pod changed since): nothing was written; the same files are not tried again.
        DataplaneError::InvalidConfiguration { .. } => ActionError::ReloadFailed(error.to_string()),
        other => failed(other),
    }
}

impl DataplaneActions {
    /// Writes the configuration without a reload, with the server actions for the API to run,
    /// and reads the servers back: the stored copy, or what the patch came to when it did not
    /// take.
    async fn patch_servers(
        &self,
        client: &DataplaneClient,
        pod: &PodTarget,
        desired: &Desired,
        actions: &[RuntimeAction],
        base: ConfigVersion,
    ) -> Result<Result<StoredCopy, Patched>, ActionError> {
        let header = runtime_actions_header(actions);
        let render = render_checksum(desired);
        let config = with_render_marker(&desired.files.haproxy_cfg.content, &render);
        let stored = match client.push_raw_runtime(config, base, &header).await {
            Ok(PushOutcome::Applied(stored) | PushOutcome::ReloadQueued(_, stored)) => stored,
            Ok(PushOutcome::Valid) => return Err(failed("a runtime patch was answered as a validation")),
            Err(error @ DataplaneError::VersionConflict { .. }) => {
                return Err(ActionError::VersionConflict(error.to_string()));
            }
            // Refused, or an action the runtime did not take (the API writes the file before it
            // runs the actions, and answers 500 when one fails): a full sync follows, rather
            // than retrying something that cannot work.
            Err(error @ (DataplaneError::InvalidConfiguration { .. } | DataplaneError::UnexpectedStatus { .. })) => {
                tracing::warn!(pod = %pod.name, %error, "runtime patch refused; falling back to a full sync");
                return Ok(Err(Patched::NotTaken(None)));
            }
            Err(error) => return Err(failed(error)),
        };
        // Read the running HAProxy back: a patch that did not take, or cannot be read back
        // (v3.2.7 answers 404 for a server of HAProxy 2.6 when it speaks to 2.6's master
        // socket, see docs/environment.md), is a full sync.
        for action in actions.iter().filter(|a| a.is_server_action()) {
            match runtime_state_matches(client, action).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(pod = %pod.name, %action, "the runtime does not show a patched value; full sync");
                    return Ok(Err(Patched::NotTaken(Some(stored.version))));
                }
                Err(error) => {
                    tracing::warn!(pod = %pod.name, %action, %error, "a patched value cannot be read back; full sync");
                    return Ok(Err(Patched::NotTaken(Some(stored.version))));
                }
            }
        }
        Ok(Ok(StoredCopy { render, stored: stored_checksum(&stored), version: stored.version }))
    }

    /// Stores every map the actions change, applies their entry changes in order, and reads
    /// each changed map back; the first thing that differs is the error.
    async fn patch_maps(
        &self,
        client: &DataplaneClient,
        desired: &Desired,
        actions: &[RuntimeAction],
    ) -> Result<(), String> {
        let mut changed: Vec<&str> = Vec::new();
        for map in actions.iter().filter_map(RuntimeAction::map) {
            if !changed.contains(&map) {
                changed.push(map);
            }
        }
        for map in &changed {
            let file = desired.files.maps.get(*map).ok_or_else(|| format!("{map} is not a desired map"))?;
            client.put_storage(StorageKind::Maps, map, &file.content, true).await.map_err(|e| e.to_string())?;
        }
        let started = Instant::now();
        for action in actions {
            let applied = match action {
                RuntimeAction::AddMapEntry { map, key, value } => client.add_runtime_map_entry(map, key, value).await,
                RuntimeAction::SetMapEntry { map, key, value } => client.set_runtime_map_entry(map, key, value).await,
                RuntimeAction::DeleteMapEntry { map, key } => client.delete_runtime_map_entry(map, key).await,
                _ => continue,
            };
            applied.map_err(|error| format!("{action}: {error}"))?;
        }
        for map in changed {
            let wanted = desired.files.maps.get(map).and_then(|file| crate::plan::maps::entries(&file.content));
            let running =
                client.runtime_map_entries(map).await.map_err(|error| format!("reading {map} back: {error}"))?;
            let mut seen = std::collections::BTreeMap::new();
            for (key, value) in running {
                if seen.insert(key, value).is_some() {
                    return Err(format!("{map} holds a key twice in the running HAProxy"));
                }
            }
            if wanted.as_ref() != Some(&seen) {
                return Err(format!("{map} in the running HAProxy is not the desired map"));
            }
        }
        // Entries are read back per map, so each entry change is given the time of them all.
        for action in actions.iter().filter(|a| a.map().is_some()) {
            observe(action, started);
        }
        Ok(())
    }

    /// Stores every renewed certificate, has the running HAProxy serve it, and reads its
    /// fingerprint back; then names the certificates' content in the manifest.
    async fn patch_certificates(
        &self,
        client: &DataplaneClient,
        desired: &Desired,
        actions: &[RuntimeAction],
    ) -> Result<(), String> {
        let mut renewed = false;
        for action in actions {
            let RuntimeAction::RenewCertificate { name } = action else { continue };
            let started = Instant::now();
            let pem =
                &desired.files.certs.get(name).ok_or_else(|| format!("{name} is not a desired certificate"))?.content;
            let file =
                client.replace_stored_certificate(name, pem).await.map_err(|e| format!("storing {name}: {e}"))?;
            client.renew_runtime_certificate(&file, pem).await.map_err(|e| format!("{action}: {e}"))?;
            let served =
                client.runtime_certificate_sha1(&file).await.map_err(|e| format!("reading {name} back: {e}"))?;
            if crate::tls::first_certificate_sha1(pem).as_deref() != Some(served.as_str()) {
                return Err(format!("the running HAProxy does not serve the renewed {name}"));
            }
            observe(action, started);
            renewed = true;
        }
        if renewed {
            write_manifest(client, desired).await.map_err(|error| error.to_string())?;
        }
        Ok(())
    }
}

/// Takes free slots for new endpoints: `del server`, `add server` at the new address, `ready`,
/// read back. A slot HAProxy will not delete (the departed endpoint's connections still count,
/// idle keep-alive ones included until HAProxy purges them, seconds later) keeps its server: its
/// address is changed in place while it is out of traffic, then it is put in traffic, by the
/// configuration's write (`in_place`), which needs no empty slot and no reload. Gives those
/// actions.
async fn replace_servers(client: &DataplaneClient, actions: &[RuntimeAction]) -> Result<Vec<RuntimeAction>, String> {
    let mut deferred = Vec::new();
    for action in actions {
        let RuntimeAction::ReplaceServer { backend, server, address, port, weight } = action else { continue };
        let started = Instant::now();
        if let Err(error) = client.delete_runtime_server(backend, server).await {
            tracing::debug!(%action, %error, "the free slot is not empty yet: its address changes in place");
            deferred.extend(in_place(action));
            continue;
        }
        add_server(client, action, backend, server, (address, port), weight.as_deref(), true).await?;
        observe(action, started);
    }
    Ok(deferred)
}

/// A free slot taken without deleting its server: `SetServerAddr` while it is in maintenance
/// (HAProxy drops the server's idle connections when its address changes), its weight, then
/// `ready`, in that order.
fn in_place(action: &RuntimeAction) -> Vec<RuntimeAction> {
    let RuntimeAction::ReplaceServer { backend, server, address, port, weight } = action else { return Vec::new() };
    let mut actions = vec![RuntimeAction::SetAddress {
        backend: backend.clone(),
        server: server.clone(),
        address: address.clone(),
        port: port.clone(),
    }];
    if let Some(weight) = weight {
        actions.push(RuntimeAction::SetWeight {
            backend: backend.clone(),
            server: server.clone(),
            weight: weight.clone(),
        });
    }
    actions.push(RuntimeAction::SetState { backend: backend.clone(), server: server.clone(), ready: true });
    actions
}

/// `add server` for `action`: the server at `address:port`, put in traffic when `ready`,
/// then read back.
async fn add_server(
    client: &DataplaneClient,
    action: &RuntimeAction,
    backend: &str,
    server: &str,
    (address, port): (&str, &str),
    weight: Option<&str>,
    ready: bool,
) -> Result<(), String> {
    let port = port.parse::<u16>().map_err(|_| format!("{action}: {port} is not a port"))?;
    let weight = weight.map(|w| w.parse::<u32>().map_err(|_| format!("{action}: {w} is not a weight"))).transpose()?;
    let failed = |error: DataplaneError| format!("{action}: {error}");
    client.add_runtime_server(backend, server, address, port, weight).await.map_err(failed)?;
    if ready {
        client.set_runtime_server_state(backend, server, "ready").await.map_err(failed)?;
    }
    let state = if ready { "ready" } else { "maint" };
    let seen =
        client.runtime_server(backend, server).await.map_err(|error| format!("reading {server} back: {error}"))?;
    if seen.address != address || seen.port != Some(port) || seen.admin_state != state {
        return Err(format!("the running HAProxy does not show {action} ({state})"));
    }
    Ok(())
}

/// Adds the servers the configuration (already written) gained, puts those that take traffic
/// in it, and reads each back.
async fn add_servers(client: &DataplaneClient, actions: &[RuntimeAction]) -> Result<(), String> {
    for action in actions {
        let RuntimeAction::AddServer { backend, server, address, port, weight, ready } = action else { continue };
        let started = Instant::now();
        add_server(client, action, backend, server, (address, port), weight.as_deref(), *ready).await?;
        observe(action, started);
    }
    Ok(())
}

/// Records how long a runtime change took, by its kind.
fn observe(action: &RuntimeAction, started: Instant) {
    let labels = crate::telemetry::metrics::RuntimeActionLabels { kind: action.kind() };
    let metrics = crate::telemetry::metrics::metrics();
    metrics.runtime_action_seconds.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
}

/// The certificates' content by name, as a manifest names them (`<checksum> <name>` lines).
fn read_manifest(text: &str) -> HashMap<String, Checksum> {
    text.lines()
        .filter_map(|line| {
            let (checksum, name) = line.trim().split_once(' ')?;
            Some((name.trim().to_owned(), Checksum::from_hex(checksum)?))
        })
        .collect()
}

/// The manifest of the desired certificates.
fn manifest_text(desired: &Desired) -> String {
    desired.files.certs.iter().map(|(name, file)| format!("{} {name}\n", file.checksum)).collect()
}

/// Writes the manifest of the desired certificates, unless the pod has it already; removes it
/// when no certificate is desired.
async fn write_manifest(client: &DataplaneClient, desired: &Desired) -> Result<(), ActionError> {
    let kind = StorageKind::General;
    let wanted = manifest_text(desired);
    let current = client.get_storage(kind, CERTIFICATE_MANIFEST).await.map_err(failed)?;
    if wanted.is_empty() {
        if current.is_some() {
            client.delete_storage(kind, CERTIFICATE_MANIFEST).await.map_err(failed)?;
        }
    } else if current.as_deref() != Some(wanted.as_str()) {
        client.put_storage(kind, CERTIFICATE_MANIFEST, &wanted, current.is_some()).await.map_err(failed)?;
    }
    Ok(())
}

impl PodActions for DataplaneActions {
    async fn verify(
        &self,
        pod: &PodTarget,
        known: Option<&StoredCopy>,
        in_doubt: bool,
    ) -> Result<Reading, ActionError> {
        let client = self.client(pod)?;
        // The version a write is checked against is the API's own, read first: the file's
        // `_version` line can lag it (a failed reload puts an older file back, line and all).
        let version = client.configuration_version().await.map_err(failed)?;
        let stored = client.raw_configuration().await.map_err(failed)?;
        let (config, copy) = recognise(&stored, known, in_doubt);
        let mut observed = vec![("haproxy.cfg".to_owned(), config)];
        let mut manifest = None;
        for kind in [StorageKind::Maps, StorageKind::General] {
            let mut names = client.list_storage(kind).await.map_err(failed)?;
            names.sort();
            for name in names {
                if let Some(content) = client.get_storage(kind, &name).await.map_err(failed)? {
                    if kind == StorageKind::General && name == CERTIFICATE_MANIFEST {
                        manifest = Some(read_manifest(&content));
                        continue;
                    }
                    observed.push((format!("{}/{name}", prefix(kind)), Checksum::of(content.as_bytes())));
                }
            }
        }
        // Certificates are never given back: a certificate file has the content the manifest
        // names for it, and one the manifest does not name has none a render could have.
        let manifest = manifest.unwrap_or_default();
        let mut certificates = client.list_storage(StorageKind::Certificates).await.map_err(failed)?;
        certificates.sort();
        for name in certificates {
            let path = format!("certs/{name}");
            let content =
                manifest.get(&name).copied().unwrap_or_else(|| Checksum::of(format!("unknown {path}").as_bytes()));
            observed.push((path, content));
        }
        // HAProxy's version decides which address changes can be made at run time; a runtime
        // that does not answer gets the cautious answer (it takes no runtime patch anyway).
        // It is also shown by the API and checked against the configuration's minimum.
        let haproxy = match client.runtime_info().await {
            Ok(info) => info["info"]["version"].as_str().map(str::to_owned),
            Err(error) => {
                tracing::debug!(pod = %pod.name, %error, "HAProxy's runtime information is unreadable");
                None
            }
        };
        let address_changes = haproxy.as_deref().map(AddressChanges::of_version).unwrap_or_default();
        let dataplane_api = match client.info().await {
            Ok(info) => Some(info.version),
            Err(error) => {
                tracing::debug!(pod = %pod.name, %error, "the Dataplane API's information is unreadable");
                None
            }
        };
        if let (Some(version), Ok(mut known)) = (&haproxy, self.haproxy_versions.lock()) {
            known.insert(pod.uid.clone(), version.clone());
        }
        let versions = PodVersions { haproxy, dataplane_api };
        Ok(Reading { observed, version, copy, address_changes, versions })
    }

    async fn validate(&self, pod: &PodTarget, desired: &Desired) -> Result<Validation, ActionError> {
        let client = self.client(pod)?;
        // A new certificate goes up beside the others, and is removed again if the
        // configuration is refused. A renewed one replaces its file: its old content cannot be
        // read back to put it back, but the pair was checked when it was rendered, and the
        // running HAProxy keeps serving the old one until the push reloads it.
        let present = client.list_storage(StorageKind::Certificates).await.map_err(failed)?;
        let manifest = match client.get_storage(StorageKind::General, CERTIFICATE_MANIFEST).await.map_err(failed)? {
            Some(text) => read_manifest(&text),
            None => HashMap::new(),
        };
        for (name, file) in &desired.files.certs {
            let kind = StorageKind::Certificates;
            let stored = if !present.contains(name) {
                self.record_upload(&pod.uid, kind, name, None).await?;
                client.put_storage(kind, name, &file.content, false).await
            } else if manifest.get(name) != Some(&file.checksum) {
                client.put_storage(kind, name, &file.content, true).await
            } else {
                Ok(())
            };
            match stored {
                Ok(()) => {}
                // A certificate the storage cannot read is the render's fault, as HAProxy's
                // refusal would be: not an action to retry.
                Err(error @ DataplaneError::FileRefused { .. }) => return Ok(Validation::Rejected(error.to_string())),
                Err(error) => return Err(failed(error)),
            }
        }
        for (kind, name, content) in desired_storage(desired) {
            let current = client.get_storage(kind, name).await.map_err(failed)?;
            if current.as_deref() != Some(content) {
                self.record_upload(&pod.uid, kind, name, current.as_deref()).await?;
                client.put_storage(kind, name, content, current.is_some()).await.map_err(failed)?;
            }
        }
        let accepted = self
            .haproxy_versions
            .lock()
            .ok()
            .and_then(|known| known.get(&pod.uid).cloned())
            .map(|version| (render_checksum(desired), version));
        if let (Some(key), Ok(validated)) = (&accepted, self.validated.lock())
            && validated.contains(key)
        {
            tracing::debug!(pod = %pod.name, haproxy = %key.1, "this render was accepted by the same HAProxy version");
            return Ok(Validation::Passed);
        }
        // `only_validate` checks no version and writes nothing.
        let config = with_render_marker(&desired.files.haproxy_cfg.content, &render_checksum(desired));
        match client.push_raw(config, ConfigVersion(0), PushMode::ValidateOnly).await {
            Ok(_) => {
                if let (Some(key), Ok(mut validated)) = (accepted, self.validated.lock()) {
                    if validated.len() >= VALIDATED_KEPT {
                        validated.pop_front();
                    }
                    validated.push_back(key);
                }
                Ok(Validation::Passed)
            }
            Err(DataplaneError::InvalidConfiguration { message, .. }) => Ok(Validation::Rejected(message)),
            Err(error) => Err(failed(error)),
        }
    }

    async fn push(&self, pod: &PodTarget, desired: &Desired, base: ConfigVersion) -> Result<StoredCopy, ActionError> {
        let client = self.client(pod)?;
        let render = render_checksum(desired);
        let config = with_render_marker(&desired.files.haproxy_cfg.content, &render);
        // Reloaded at once, not on the API's next reload tick (up to `reload_delay`, 1 s in the
        // chart, later): haptic already coalesces changes into one push per pod.
        let stored = match client.push_raw(config, base, PushMode::ForceReload).await.map_err(write_error)? {
            PushOutcome::ReloadQueued(id, stored) => {
                wait_for_reload(&client, &id).await?;
                stored
            }
            PushOutcome::Applied(stored) => stored,
            PushOutcome::Valid => return Err(failed("a push was answered as a validation")),
        };
        // The configuration that referred to them is gone: remove files no longer desired.
        let wanted: Vec<(StorageKind, &str)> = desired_storage(desired).into_iter().map(|(k, n, _)| (k, n)).collect();
        for kind in [StorageKind::Maps, StorageKind::General, StorageKind::Certificates] {
            for name in client.list_storage(kind).await.map_err(failed)? {
                let certificate_wanted = kind == StorageKind::Certificates && desired.files.certs.contains_key(&name);
                let manifest = kind == StorageKind::General && name == CERTIFICATE_MANIFEST;
                if !certificate_wanted && !manifest && !wanted.contains(&(kind, name.as_str())) {
                    client.delete_storage(kind, &name).await.map_err(failed)?;
                }
            }
        }
        write_manifest(&client, desired).await?;
        // Pushed: what validation uploaded is what the pod runs now.
        let uid = pod.uid.clone();
        on_blocking_pool(&self.journal, move |journal| journal.settle_uploads(&uid, &[]))
            .await
            .map_err(|error| ActionError::Failed(error.to_string()))?;
        Ok(StoredCopy { render, stored: stored_checksum(&stored), version: stored.version })
    }

    async fn runtime_patch(
        &self,
        pod: &PodTarget,
        desired: &Desired,
        actions: &[RuntimeAction],
        rewrite_config: bool,
        base: ConfigVersion,
    ) -> Result<Patched, ActionError> {
        let client = self.client(pod)?;
        // Free slots taken first: three quick runtime commands each, not waiting for the
        // configuration's write (which checks the whole configuration before it returns).
        let in_place = match replace_servers(&client, actions).await {
            Ok(in_place) => in_place,
            Err(detail) => {
                tracing::warn!(pod = %pod.name, %detail, "a free slot could not be taken at run time; full sync");
                return Ok(Patched::NotTaken(Some(base)));
            }
        };
        let with_in_place: Vec<RuntimeAction>;
        let actions = if in_place.is_empty() {
            actions
        } else {
            with_in_place = actions.iter().cloned().chain(in_place).collect();
            &with_in_place[..]
        };
        let servers: Vec<&RuntimeAction> = actions.iter().filter(|a| a.is_server_action()).collect();
        let mut copy = None;
        if rewrite_config || !servers.is_empty() {
            let started = Instant::now();
            match self.patch_servers(&client, pod, desired, actions, base).await? {
                Ok(stored) => copy = Some(stored),
                Err(not_taken) => return Ok(not_taken),
            }
            for action in servers {
                observe(action, started);
            }
        }
        let written_at = copy.map(|c: StoredCopy| c.version);
        let build_on = Some(written_at.unwrap_or(base));
        if let Err(detail) = add_servers(&client, actions).await {
            tracing::warn!(pod = %pod.name, %detail, "a server could not be added at run time; full sync");
            return Ok(Patched::NotTaken(build_on));
        }
        // A failure from here on leaves the configuration where it was or where this patch put
        // it: the full sync that follows writes on top of that (`build_on`).
        // Maps and certificates: each file is stored first (a reload from here on starts from
        // the desired files), then changed in the running HAProxy, then read back.
        if let Err(detail) = self.patch_maps(&client, desired, actions).await {
            tracing::warn!(pod = %pod.name, %detail, "a map change did not take at run time; full sync");
            return Ok(Patched::NotTaken(build_on));
        }
        if let Err(detail) = self.patch_certificates(&client, desired, actions).await {
            tracing::warn!(pod = %pod.name, %detail, "a certificate renewal did not take at run time; full sync");
            return Ok(Patched::NotTaken(build_on));
        }
        Ok(Patched::Taken(copy))
    }

    fn forget_pod(&self, pod: &PodTarget) {
        if let Ok(mut clients) = self.clients.lock() {
            clients.remove(&pod.endpoint);
        }
        if let Ok(mut versions) = self.haproxy_versions.lock() {
            versions.remove(&pod.uid);
        }
    }

    async fn restore_files(&self, pod: &PodTarget) -> Result<(), String> {
        let client = self.client(pod).map_err(|e| e.to_string())?;
        let uid = pod.uid.clone();
        let pending = on_blocking_pool(&self.journal, move |journal| journal.pending_uploads(&uid))
            .await
            .map_err(|error| error.to_string())?;
        // Every file is put back that can be; those that cannot stay recorded for next time.
        let mut errors = Vec::new();
        let mut left = Vec::new();
        for upload in pending.into_iter().rev() {
            let restored = match &upload.original {
                Some(content) => {
                    let content = String::from_utf8_lossy(content);
                    client.put_storage(upload.kind, &upload.name, &content, true).await
                }
                None => client.delete_storage(upload.kind, &upload.name).await,
            };
            if let Err(error) = restored {
                errors.push(error.to_string());
                left.push(upload);
            }
        }
        let uid = pod.uid.clone();
        on_blocking_pool(&self.journal, move |journal| journal.settle_uploads(&uid, &left))
            .await
            .map_err(|error| error.to_string())?;
        if errors.is_empty() { Ok(()) } else { Err(errors.join("; ")) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(version: u64, body: &str) -> StoredConfig {
        StoredConfig::from_text(format!("# _md5hash=00ff\n# _version={version}\n{body}"), None).unwrap()
    }

    #[test]
    fn a_stored_push_is_recognised_by_its_marker_whatever_layout_the_api_gave_it() {
        let render = Checksum::of(b"global\n    maxconn 10");
        let pushed = with_render_marker(&Arc::from("global\n    maxconn 10"), &render).to_text();
        assert_eq!(
            pushed,
            format!("global\n    maxconn 10\n{RENDER_MARKER}{render}\n"),
            "the render's lines as they are"
        );
        // The API's layout (as v3.2.7 stored it): its own indentation and header lines, and the
        // trailing marker kept inside the last section, indented.
        let on_pod = stored(4, &format!("\nglobal\n  maxconn 10\n  {RENDER_MARKER}{render}\n"));
        let (observed, copy) = recognise(&on_pod, None, false);
        assert_eq!(observed, render);
        let copy = copy.unwrap();
        assert_eq!((copy.render, copy.version), (render, ConfigVersion(4)));
        // The same file at another version (a later write of the same text) is the same push.
        assert_eq!(
            recognise(&stored(9, &format!("\nglobal\n  maxconn 10\n  {RENDER_MARKER}{render}\n")), Some(&copy), false)
                .0,
            render
        );
    }

    #[test]
    fn a_file_changed_since_its_push_is_not_that_push_even_with_the_marker() {
        let render = Checksum::of(b"r");
        let (_, copy) = recognise(&stored(4, &format!("{RENDER_MARKER}{render}\nglobal\n  maxconn 10\n")), None, false);
        // Edited through the API's fine-grained endpoints: the marker stays, the file changed.
        let edited = stored(5, &format!("{RENDER_MARKER}{render}\nglobal\n  maxconn 99\n"));
        let (observed, recognised) = recognise(&edited, copy.as_ref(), false);
        assert_ne!(observed, render);
        assert_eq!(recognised, None);
        // Without the marker (a file pushed by hand, the bootstrap file) it is nobody's push.
        let (observed, recognised) = recognise(&stored(2, "global\n"), copy.as_ref(), false);
        assert!(observed != render && recognised.is_none());
    }

    #[test]
    fn after_a_runtime_patch_cut_short_no_push_is_taken_on_its_marker() {
        let (old, new) = (Checksum::of(b"old"), Checksum::of(b"new"));
        let old_file = stored(4, &format!("global\n  {RENDER_MARKER}{old}\n"));
        let (_, known) = recognise(&old_file, None, false);
        // The patch wrote the new file; whether HAProxy took its actions is unknown.
        let written = stored(5, &format!("global\n  maxconn 9\n  {RENDER_MARKER}{new}\n"));
        assert_eq!(recognise(&written, known.as_ref(), false).0, new, "normally the marker is believed");
        let (observed, copy) = recognise(&written, known.as_ref(), true);
        assert!(observed != new && copy.is_none(), "in doubt, a full sync makes it certain");
        // A patch of maps alone leaves the configuration as it was: that is no proof either.
        let (observed, copy) = recognise(&old_file, known.as_ref(), true);
        assert!(observed != old && copy.is_none(), "in doubt even about the known push");
    }

    #[test]
    fn a_failed_reload_names_haprox_alerts_not_its_notices() {
        let output = "[NOTICE]   (1) : haproxy version is 2.8.25\n[ALERT]    (1) : Binding [/p/haproxy.cfg:15] for frontend http: cannot bind socket\n[WARNING]  (1) : Loading failure!";
        assert_eq!(
            haproxy_alerts(output),
            "[ALERT]    (1) : Binding [/p/haproxy.cfg:15] for frontend http: cannot bind socket"
        );
        assert_eq!(haproxy_alerts("plain"), "plain");
    }
}

/// Request shapes only: what the adapter sends for a validate-then-push of a configuration
/// with one new map and one new certificate, against a scripted server answering as v3.2.7
/// does. The real API is exercised by the integration tests (tests/pods/dataplane.rs, tests/pods/deploy.rs).
#[cfg(test)]
mod request_shapes {
    use std::collections::BTreeMap;

    use wiremock::matchers::{method, path, query_param};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    use super::*;
    use crate::dataplane::Credentials;

    fn unguarded() -> Arc<dyn WriteGuard> {
        let fence = Arc::new(crate::election::Fence::unbounded(LeaderTerm::default()));
        Arc::new(LeaseGuard::new(fence, LeaderTerm::default()))
    }
    use crate::files::{FileSet, RenderedFile};

    #[tokio::test]
    async fn validate_uploads_the_map_without_reload_then_push_uses_the_version_and_cleans_up() {
        let server = MockServer::start().await;
        let base = "/v3/services/haproxy";
        let json = |body: &str| ResponseTemplate::new(200).set_body_raw(body.to_owned(), "application/json");
        Mock::given(method("GET"))
            .and(path(format!("{base}/storage/maps/host.map")))
            .respond_with(ResponseTemplate::new(404))
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path(format!("{base}/storage/maps")))
            .and(query_param("skip_reload", "true"))
            .respond_with(ResponseTemplate::new(201))
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path(format!("{base}/configuration/raw")))
            .and(query_param("only_validate", "true"))
            .respond_with(ResponseTemplate::new(202))
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path(format!("{base}/configuration/raw")))
            .and(query_param("version", "4"))
            .and(query_param("force_reload", "true"))
            // As v3.2.7 answers a forced reload: done, with the file as it now stores it.
            .respond_with(
                ResponseTemplate::new(201).set_body_raw("# _md5hash=aa\n# _version=5\nglobal\n", "text/plain"),
            )
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path(format!("{base}/storage/maps")))
            .respond_with(json(r#"[{"storage_name":"host.map"},{"storage_name":"old.map"}]"#))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path(format!("{base}/storage/general")))
            .respond_with(json("[]"))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path(format!("{base}/storage/ssl_certificates")))
            .respond_with(json(r#"[{"storage_name":"web_shop_000000000000.pem"}]"#))
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path(format!("{base}/storage/ssl_certificates")))
            .and(query_param("skip_reload", "true"))
            .respond_with(ResponseTemplate::new(201))
            .mount(&server)
            .await;
        Mock::given(method("DELETE"))
            .and(path(format!("{base}/storage/ssl_certificates/web_shop_000000000000.pem")))
            .and(query_param("skip_reload", "true"))
            .respond_with(ResponseTemplate::new(204))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path(format!("{base}/storage/general/{CERTIFICATE_MANIFEST}")))
            .respond_with(ResponseTemplate::new(404))
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path(format!("{base}/storage/general")))
            .and(query_param("skip_reload", "true"))
            .respond_with(ResponseTemplate::new(201))
            .mount(&server)
            .await;
        Mock::given(method("DELETE"))
            .and(path(format!("{base}/storage/maps/old.map")))
            .and(query_param("skip_reload", "true"))
            .respond_with(ResponseTemplate::new(204))
            .mount(&server)
            .await;

        let dir = tempfile::tempdir().unwrap();
        let journal = Arc::new(Journal::open(&dir.path().join("journal"), 10).unwrap().0);
        let actions = DataplaneActions::new(Access::plain(Credentials::new("admin", "secret")), journal, unguarded());
        let pod = PodTarget {
            uid: PodUid("u".into()),
            namespace: "n".into(),
            name: "p".into(),
            endpoint: format!("{}/v3", server.uri()),
        };
        let desired = Desired::new(FileSet {
            haproxy_cfg: RenderedFile::new("global\n"),
            maps: BTreeMap::from([("host.map".to_owned(), RenderedFile::new("example.com be_app\n"))]),
            files: BTreeMap::new(),
            certs: BTreeMap::from([(
                "web_shop_5f1c0d9e2a7b.pem".to_owned(),
                RenderedFile::sensitive("-----BEGIN CERTIFICATE-----\n"),
            )]),
        });
        assert_eq!(actions.validate(&pod, &desired).await.unwrap(), Validation::Passed);
        let copy = actions.push(&pod, &desired, ConfigVersion(4)).await.unwrap();
        assert_eq!((copy.render, copy.version), (desired.files.haproxy_cfg.checksum, ConfigVersion(5)));

        let requests = server.received_requests().await.unwrap();
        let seen: Vec<String> =
            requests.iter().map(|r| format!("{} {}", r.method, r.url.path().trim_start_matches(base))).collect();
        assert_eq!(
            seen,
            [
                "GET /storage/ssl_certificates",
                "GET /storage/general/haptic-certificates.sum",
                "POST /storage/ssl_certificates",
                "GET /storage/maps/host.map",
                "POST /storage/maps",
                "POST /configuration/raw",
                "POST /configuration/raw",
                "GET /storage/maps",
                "DELETE /storage/maps/old.map",
                "GET /storage/general",
                "GET /storage/ssl_certificates",
                "DELETE /storage/ssl_certificates/web_shop_000000000000.pem",
                "GET /storage/general/haptic-certificates.sum",
                "POST /storage/general",
            ]
        );
        let certificate = String::from_utf8_lossy(&requests[2].body);
        assert!(certificate.contains("filename=\"web_shop_5f1c0d9e2a7b.pem\""), "{certificate}");
        let upload = String::from_utf8_lossy(&requests[4].body);
        assert!(
            upload.contains("name=\"file_upload\"; filename=\"host.map\"") && upload.contains("example.com be_app"),
            "{upload}"
        );
        let manifest = String::from_utf8_lossy(&requests[13].body);
        let checksum = desired.files.certs["web_shop_5f1c0d9e2a7b.pem"].checksum;
        assert!(manifest.contains(&format!("{checksum} web_shop_5f1c0d9e2a7b.pem\n")), "{manifest}");
        assert!(requests.iter().all(|r| r.headers.get("authorization").is_some()), "every call authenticates");
    }

    #[tokio::test]
    async fn a_render_is_validated_once_per_haproxy_version_not_once_per_pod() {
        let base = "/v3/services/haproxy";
        let pod_api = || async {
            let server = MockServer::start().await;
            let json = |body: &str| ResponseTemplate::new(200).set_body_raw(body.to_owned(), "application/json");
            Mock::given(method("GET"))
                .and(path(format!("{base}/storage/ssl_certificates")))
                .respond_with(json("[]"))
                .mount(&server)
                .await;
            Mock::given(method("GET"))
                .and(path(format!("{base}/storage/general/{CERTIFICATE_MANIFEST}")))
                .respond_with(ResponseTemplate::new(404))
                .mount(&server)
                .await;
            Mock::given(method("POST"))
                .and(path(format!("{base}/configuration/raw")))
                .and(query_param("only_validate", "true"))
                .respond_with(ResponseTemplate::new(202))
                .mount(&server)
                .await;
            server
        };
        let servers = [pod_api().await, pod_api().await, pod_api().await];
        let dir = tempfile::tempdir().unwrap();
        let journal = Arc::new(Journal::open(&dir.path().join("journal"), 10).unwrap().0);
        let actions = DataplaneActions::new(Access::plain(Credentials::new("admin", "secret")), journal, unguarded());
        let pods: Vec<PodTarget> = servers
            .iter()
            .enumerate()
            .map(|(i, server)| PodTarget {
                uid: PodUid(format!("u{i}")),
                namespace: "n".into(),
                name: format!("p{i}"),
                endpoint: format!("{}/v3", server.uri()),
            })
            .collect();
        // As their readings said: two pods run 2.8.25, one 2.6.12.
        for (pod, version) in pods.iter().zip(["2.8.25-5cf5d0683", "2.8.25-5cf5d0683", "2.6.12-1+deb12u4"]) {
            actions.haproxy_versions.lock().unwrap().insert(pod.uid.clone(), version.to_owned());
        }
        let desired = Desired::new(FileSet {
            haproxy_cfg: RenderedFile::new("global\n"),
            maps: BTreeMap::new(),
            files: BTreeMap::new(),
            certs: BTreeMap::new(),
        });
        for pod in &pods {
            assert_eq!(actions.validate(pod, &desired).await.unwrap(), Validation::Passed);
        }
        let mut asked = Vec::new();
        for server in &servers {
            let requests = server.received_requests().await.unwrap();
            asked.push(requests.iter().filter(|r| r.url.query().is_some_and(|q| q.contains("only_validate"))).count());
        }
        assert_eq!(asked, [1, 0, 1], "the second 2.8 pod is not asked again; the 2.6 pod is");
        // Another render is asked again.
        let other = Desired::new(FileSet {
            haproxy_cfg: RenderedFile::new("global\n  maxconn 9\n"),
            ..(*desired.files).clone()
        });
        assert_eq!(actions.validate(&pods[1], &other).await.unwrap(), Validation::Passed);
        let requests = servers[1].received_requests().await.unwrap();
        assert_eq!(requests.iter().filter(|r| r.url.query().is_some_and(|q| q.contains("only_validate"))).count(), 1);
    }

    #[tokio::test]
    async fn a_runtime_patch_writes_without_reload_sends_its_actions_and_reads_them_back() {
        use wiremock::matchers::header;
        let server = MockServer::start().await;
        let base = "/v3/services/haproxy";
        let json = |body: &str| ResponseTemplate::new(200).set_body_raw(body.to_owned(), "application/json");
        let stored = || ResponseTemplate::new(201).set_body_raw("# _version=10\nbackend be_web\n", "text/plain");
        Mock::given(method("POST"))
            .and(path(format!("{base}/configuration/raw")))
            .and(query_param("version", "9"))
            .and(query_param("skip_reload", "true"))
            .and(header(
                "X-Runtime-Actions",
                "SetServerAddr be_web srv1 10.0.0.2 8080;SetServerState be_web srv2 maint",
            ))
            .respond_with(stored())
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path(format!("{base}/runtime/backends/be_web/servers/srv1")))
            .respond_with(json(r#"{"name":"srv1","address":"10.0.0.2","port":8080,"admin_state":"ready"}"#))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path(format!("{base}/runtime/backends/be_web/servers/srv2")))
            .respond_with(json(r#"{"name":"srv2","address":"127.0.0.1","port":1,"admin_state":"maint"}"#))
            .mount(&server)
            .await;
        let dir = tempfile::tempdir().unwrap();
        let journal = Arc::new(Journal::open(&dir.path().join("journal"), 10).unwrap().0);
        let actions = DataplaneActions::new(Access::plain(Credentials::new("admin", "secret")), journal, unguarded());
        let pod = PodTarget {
            uid: PodUid("u".into()),
            namespace: "n".into(),
            name: "p".into(),
            endpoint: format!("{}/v3", server.uri()),
        };
        let desired = Desired::new(FileSet {
            haproxy_cfg: RenderedFile::new("backend be_web\n"),
            maps: BTreeMap::new(),
            files: BTreeMap::new(),
            certs: BTreeMap::new(),
        });
        let patch = [
            RuntimeAction::SetAddress {
                backend: "be_web".into(),
                server: "srv1".into(),
                address: "10.0.0.2".into(),
                port: "8080".into(),
            },
            RuntimeAction::SetState { backend: "be_web".into(), server: "srv2".into(), ready: false },
        ];
        let Patched::Taken(Some(copy)) =
            actions.runtime_patch(&pod, &desired, &patch, true, ConfigVersion(9)).await.unwrap()
        else {
            panic!("the patch read back as intended")
        };
        assert_eq!(copy.version, ConfigVersion(10));

        // A value the runtime does not show is no patch: the machine falls back to a full sync.
        let not_taken = [RuntimeAction::SetAddress {
            backend: "be_web".into(),
            server: "srv1".into(),
            address: "10.0.0.9".into(),
            port: "8080".into(),
        }];
        Mock::given(method("POST"))
            .and(path(format!("{base}/configuration/raw")))
            .and(header("X-Runtime-Actions", "SetServerAddr be_web srv1 10.0.0.9 8080"))
            .respond_with(stored())
            .mount(&server)
            .await;
        assert_eq!(
            actions.runtime_patch(&pod, &desired, &not_taken, true, ConfigVersion(9)).await.unwrap(),
            Patched::NotTaken(Some(ConfigVersion(10))),
            "written at version 10, but not taken"
        );

        // A refused patch is no patch either, not an endless retry.
        let refused =
            [RuntimeAction::SetWeight { backend: "be_web".into(), server: "srv1".into(), weight: "7".into() }];
        Mock::given(method("POST"))
            .and(path(format!("{base}/configuration/raw")))
            .and(header("X-Runtime-Actions", "SetServerWeight be_web srv1 7"))
            .respond_with(ResponseTemplate::new(422).set_body_raw(r#"{"message":"no"}"#, "application/json"))
            .mount(&server)
            .await;
        assert_eq!(
            actions.runtime_patch(&pod, &desired, &refused, true, ConfigVersion(9)).await.unwrap(),
            Patched::NotTaken(None)
        );
    }
}
