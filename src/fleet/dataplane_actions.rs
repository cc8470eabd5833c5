//! [`PodActions`] through the HAProxy Dataplane API: the adapter between a pod's state machine
//! and the pod.
//!
//! Verify reads the configuration and every stored map and general file and checksums them
//! (the `# _version=` line the API maintains is not part of what was pushed). Validate uploads
//! the auxiliary files that differ, remembering what they replaced, then validates the whole
//! configuration on the pod. Push writes it as one raw update with the version the pod reports
//! (re-reading it on a conflict), waits for the reload, then removes files no longer desired.
//! A rejected configuration's uploads are put back as they were.
//!
//! Note: the Dataplane API cannot be built on this project's machines yet (docs/environment.md);
//! this adapter follows the API's specification and is exercised for real only in its failure
//! paths (an unreachable pod) until it can be.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::driver::{Desired, PodActions, PodTarget, Validation};
use super::machine::FileChecksums;
use crate::dataplane::{
    Credentials, DataplaneClient, DataplaneError, Endpoint, PushMode, PushOutcome, ReloadId, ReloadStatus, StorageKind,
};
use crate::files::Checksum;
use crate::journal::PodUid;
use crate::plan::{RuntimeAction, runtime_actions_header};

/// How long a reload may take before the push counts as failed.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(30);
/// Pushes retried after a version conflict (someone else wrote in between).
const CONFLICT_RETRIES: usize = 3;

/// One auxiliary file replaced during validation, and what was there before.
#[derive(Clone, Debug)]
struct Upload {
    kind: StorageKind,
    name: String,
    original: Option<String>,
}

/// The Dataplane adapter for every pod.
pub struct DataplaneActions {
    credentials: Mutex<Credentials>,
    clients: Mutex<HashMap<String, DataplaneClient>>,
    uploads: Mutex<HashMap<PodUid, Vec<Upload>>>,
}

impl DataplaneActions {
    /// An adapter using these credentials for every pod.
    pub fn new(credentials: Credentials) -> Self {
        Self {
            credentials: Mutex::new(credentials),
            clients: Mutex::new(HashMap::new()),
            uploads: Mutex::new(HashMap::new()),
        }
    }

    /// Replaces the credentials (the Secret changed); connections are rebuilt with them.
    pub fn set_credentials(&self, credentials: Credentials) {
        if let Ok(mut current) = self.credentials.lock() {
            *current = credentials;
        }
        if let Ok(mut clients) = self.clients.lock() {
            clients.clear();
        }
    }

    fn client(&self, pod: &PodTarget) -> Result<DataplaneClient, String> {
        let mut clients = self.clients.lock().map_err(|_| "client cache poisoned".to_owned())?;
        if let Some(client) = clients.get(&pod.endpoint) {
            return Ok(client.clone());
        }
        let endpoint = Endpoint::parse(&pod.endpoint).map_err(|e| e.to_string())?;
        let credentials = self.credentials.lock().map_err(|_| "credentials poisoned".to_owned())?.clone();
        let client = DataplaneClient::new(endpoint, credentials);
        clients.insert(pod.endpoint.clone(), client.clone());
        Ok(client)
    }

    fn record_upload(&self, uid: &PodUid, upload: Upload) {
        if let Ok(mut uploads) = self.uploads.lock() {
            uploads.entry(uid.clone()).or_default().push(upload);
        }
    }

    fn take_uploads(&self, uid: &PodUid) -> Vec<Upload> {
        self.uploads.lock().ok().and_then(|mut uploads| uploads.remove(uid)).unwrap_or_default()
    }
}

/// The configuration as it was pushed: without the `# _version=` line the API adds.
pub fn without_version_line(raw: &str) -> String {
    raw.lines().filter(|line| !line.starts_with("# _version=")).map(|line| format!("{line}\n")).collect()
}

fn desired_storage(desired: &Desired) -> Vec<(StorageKind, &str, &str)> {
    let maps = desired.files.maps.iter().map(|(name, file)| (StorageKind::Maps, name.as_str(), file.content.as_str()));
    let general =
        desired.files.files.iter().map(|(name, file)| (StorageKind::General, name.as_str(), file.content.as_str()));
    maps.chain(general).collect()
}

fn prefix(kind: StorageKind) -> &'static str {
    match kind {
        StorageKind::Maps => "maps",
        StorageKind::General => "files",
        StorageKind::Certificates => "certs",
    }
}

async fn wait_for_reload(client: &DataplaneClient, id: &ReloadId) -> Result<(), String> {
    let deadline = Instant::now() + RELOAD_TIMEOUT;
    loop {
        let reload = client.reload(id).await.map_err(|e| e.to_string())?;
        match reload.status {
            ReloadStatus::Succeeded => return Ok(()),
            ReloadStatus::Failed => {
                return Err(format!("reload {id} failed: {}", reload.response.unwrap_or_default()));
            }
            ReloadStatus::InProgress if Instant::now() > deadline => {
                return Err(format!("reload {id} still in progress after {}s", RELOAD_TIMEOUT.as_secs()));
            }
            ReloadStatus::InProgress => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
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
        RuntimeAction::SetWeight { .. } => true,
    })
}

impl PodActions for DataplaneActions {
    async fn verify(&self, pod: &PodTarget) -> Result<Option<FileChecksums>, String> {
        let client = self.client(pod)?;
        let (_, raw) = client.raw_configuration().await.map_err(|e| e.to_string())?;
        let mut checksums = vec![("haproxy.cfg".to_owned(), Checksum::of(without_version_line(&raw).as_bytes()))];
        for kind in [StorageKind::Maps, StorageKind::General] {
            let mut names = client.list_storage(kind).await.map_err(|e| e.to_string())?;
            names.sort();
            for name in names {
                if let Some(content) = client.get_storage(kind, &name).await.map_err(|e| e.to_string())? {
                    checksums.push((format!("{}/{name}", prefix(kind)), Checksum::of(content.as_bytes())));
                }
            }
        }
        // Certificates are never given back; their names carry their content's hash, and a
        // certificate is known by its name (see Desired::new).
        let mut certificates = client.list_storage(StorageKind::Certificates).await.map_err(|e| e.to_string())?;
        certificates.sort();
        for name in certificates {
            let path = format!("certs/{name}");
            checksums.push((path.clone(), Checksum::of(path.as_bytes())));
        }
        Ok(Some(checksums))
    }

    async fn validate(&self, pod: &PodTarget, desired: &Desired) -> Result<Validation, String> {
        let client = self.client(pod)?;
        // New certificates go up beside the old ones (a changed one has a new name).
        let present = client.list_storage(StorageKind::Certificates).await.map_err(|e| e.to_string())?;
        for (name, file) in &desired.files.certs {
            if !present.contains(name) {
                let kind = StorageKind::Certificates;
                self.record_upload(&pod.uid, Upload { kind, name: name.clone(), original: None });
                client.put_storage(kind, name, &file.content, false).await.map_err(|e| e.to_string())?;
            }
        }
        for (kind, name, content) in desired_storage(desired) {
            let current = client.get_storage(kind, name).await.map_err(|e| e.to_string())?;
            if current.as_deref() != Some(content) {
                let exists = current.is_some();
                self.record_upload(&pod.uid, Upload { kind, name: name.to_owned(), original: current });
                client.put_storage(kind, name, content, exists).await.map_err(|e| e.to_string())?;
            }
        }
        let version = client.configuration_version().await.map_err(|e| e.to_string())?;
        match client.push_raw(&desired.files.haproxy_cfg.content, version, PushMode::ValidateOnly).await {
            Ok(_) => Ok(Validation::Passed),
            Err(DataplaneError::InvalidConfiguration { message, .. }) => Ok(Validation::Rejected(message)),
            Err(error) => Err(error.to_string()),
        }
    }

    async fn push(&self, pod: &PodTarget, desired: &Desired) -> Result<FileChecksums, String> {
        let client = self.client(pod)?;
        let config = &desired.files.haproxy_cfg.content;
        let mut attempt = 0;
        loop {
            let version = client.configuration_version().await.map_err(|e| e.to_string())?;
            match client.push_raw(config, version, PushMode::Reload).await {
                Ok(PushOutcome::ReloadQueued(id)) => {
                    wait_for_reload(&client, &id).await?;
                    break;
                }
                Ok(PushOutcome::Applied | PushOutcome::Valid) => break,
                Err(DataplaneError::VersionConflict { .. }) if attempt < CONFLICT_RETRIES => attempt += 1,
                Err(error) => return Err(error.to_string()),
            }
        }
        // The configuration that referred to them is gone: remove files no longer desired.
        let wanted: Vec<(StorageKind, &str)> = desired_storage(desired).into_iter().map(|(k, n, _)| (k, n)).collect();
        for kind in [StorageKind::Maps, StorageKind::General, StorageKind::Certificates] {
            for name in client.list_storage(kind).await.map_err(|e| e.to_string())? {
                let certificate_wanted = kind == StorageKind::Certificates && desired.files.certs.contains_key(&name);
                if !certificate_wanted && !wanted.contains(&(kind, name.as_str())) {
                    client.delete_storage(kind, &name).await.map_err(|e| e.to_string())?;
                }
            }
        }
        self.take_uploads(&pod.uid);
        Ok(desired.checksums.clone())
    }

    async fn runtime_patch(
        &self,
        pod: &PodTarget,
        desired: &Desired,
        actions: &[RuntimeAction],
    ) -> Result<Option<FileChecksums>, String> {
        let client = self.client(pod)?;
        let header = runtime_actions_header(actions);
        let mut attempt = 0;
        loop {
            let version = client.configuration_version().await.map_err(|e| e.to_string())?;
            match client.push_raw_runtime(&desired.files.haproxy_cfg.content, version, &header).await {
                Ok(_) => break,
                Err(DataplaneError::VersionConflict { .. }) if attempt < CONFLICT_RETRIES => attempt += 1,
                // Refused (a 4xx answer, an action the API does not take): a full sync follows,
                // rather than retrying something that cannot work.
                Err(error @ DataplaneError::InvalidConfiguration { .. }) => {
                    tracing::warn!(pod = %pod.name, %error, "runtime patch refused; falling back to a full sync");
                    return Ok(None);
                }
                Err(error @ DataplaneError::UnexpectedStatus { status, .. }) if status.is_client_error() => {
                    tracing::warn!(pod = %pod.name, %error, "runtime patch refused; falling back to a full sync");
                    return Ok(None);
                }
                Err(error) => return Err(error.to_string()),
            }
        }
        // Read the running HAProxy back: a patch that did not take is a full sync.
        for action in actions {
            if !runtime_state_matches(&client, action).await.map_err(|e| e.to_string())? {
                tracing::warn!(pod = %pod.name, %action, "the runtime does not show a patched value; full sync");
                return Ok(None);
            }
        }
        Ok(Some(desired.checksums.clone()))
    }

    async fn restore_files(&self, pod: &PodTarget) -> Result<(), String> {
        let client = self.client(pod)?;
        for upload in self.take_uploads(&pod.uid).into_iter().rev() {
            match &upload.original {
                Some(content) => client.put_storage(upload.kind, &upload.name, content, true).await,
                None => client.delete_storage(upload.kind, &upload.name).await,
            }
            .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_line_is_not_part_of_what_was_pushed() {
        assert_eq!(without_version_line("# _version=7\nglobal\n    maxconn 10\n"), "global\n    maxconn 10\n");
        assert_eq!(without_version_line("global\n"), "global\n");
    }
}

/// Request shapes only: what the adapter sends for a validate-then-push of a configuration
/// with one new map and one new certificate, against a scripted server. The real API is exercised by the
/// integration tests once it can be built here.
#[cfg(test)]
mod request_shapes {
    use std::collections::BTreeMap;

    use wiremock::matchers::{method, path, query_param};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    use super::*;
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
        Mock::given(method("GET"))
            .and(path(format!("{base}/configuration/version")))
            .respond_with(json("4"))
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
            .respond_with(ResponseTemplate::new(202).insert_header("Reload-ID", "2026-12-02-1"))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path(format!("{base}/reloads/2026-12-02-1")))
            .respond_with(json(r#"{"id":"2026-12-02-1","status":"succeeded"}"#))
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
        Mock::given(method("DELETE"))
            .and(path(format!("{base}/storage/maps/old.map")))
            .and(query_param("skip_reload", "true"))
            .respond_with(ResponseTemplate::new(204))
            .mount(&server)
            .await;

        let actions = DataplaneActions::new(Credentials::new("admin", "secret"));
        let pod = PodTarget {
            uid: PodUid("u".into()),
            namespace: "n".into(),
            name: "p".into(),
            endpoint: format!("{}/v3", server.uri()),
        };
        let desired = Desired::new(FileSet {
            haproxy_cfg: RenderedFile::new("global\n".into()),
            maps: BTreeMap::from([("host.map".to_owned(), RenderedFile::new("example.com be_app\n".into()))]),
            files: BTreeMap::new(),
            certs: BTreeMap::from([(
                "web_shop_5f1c0d9e2a7b.pem".to_owned(),
                RenderedFile::sensitive("-----BEGIN CERTIFICATE-----\n".into()),
            )]),
        });
        assert_eq!(actions.validate(&pod, &desired).await.unwrap(), Validation::Passed);
        assert_eq!(actions.push(&pod, &desired).await.unwrap(), desired.checksums);

        let requests = server.received_requests().await.unwrap();
        let seen: Vec<String> =
            requests.iter().map(|r| format!("{} {}", r.method, r.url.path().trim_start_matches(base))).collect();
        assert_eq!(
            seen,
            [
                "GET /storage/ssl_certificates",
                "POST /storage/ssl_certificates",
                "GET /storage/maps/host.map",
                "POST /storage/maps",
                "GET /configuration/version",
                "POST /configuration/raw",
                "GET /configuration/version",
                "POST /configuration/raw",
                "GET /reloads/2026-12-02-1",
                "GET /storage/maps",
                "DELETE /storage/maps/old.map",
                "GET /storage/general",
                "GET /storage/ssl_certificates",
                "DELETE /storage/ssl_certificates/web_shop_000000000000.pem",
            ]
        );
        let certificate = String::from_utf8_lossy(&requests[1].body);
        assert!(certificate.contains("filename=\"web_shop_5f1c0d9e2a7b.pem\""), "{certificate}");
        let upload = String::from_utf8_lossy(&requests[3].body);
        assert!(
            upload.contains("name=\"file_upload\"; filename=\"host.map\"") && upload.contains("example.com be_app"),
            "{upload}"
        );
        assert!(requests.iter().all(|r| r.headers.get("authorization").is_some()), "every call authenticates");
    }

    #[tokio::test]
    async fn a_runtime_patch_writes_without_reload_sends_its_actions_and_reads_them_back() {
        use wiremock::matchers::header;
        let server = MockServer::start().await;
        let base = "/v3/services/haproxy";
        let json = |body: &str| ResponseTemplate::new(200).set_body_raw(body.to_owned(), "application/json");
        Mock::given(method("GET"))
            .and(path(format!("{base}/configuration/version")))
            .respond_with(json("9"))
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path(format!("{base}/configuration/raw")))
            .and(query_param("version", "9"))
            .and(query_param("skip_reload", "true"))
            .and(header(
                "X-Runtime-Actions",
                "SetServerAddr be_web srv1 10.0.0.2 8080;SetServerState be_web srv2 maint",
            ))
            .respond_with(ResponseTemplate::new(201))
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
        let actions = DataplaneActions::new(Credentials::new("admin", "secret"));
        let pod = PodTarget {
            uid: PodUid("u".into()),
            namespace: "n".into(),
            name: "p".into(),
            endpoint: format!("{}/v3", server.uri()),
        };
        let desired = Desired::new(FileSet {
            haproxy_cfg: RenderedFile::new("backend be_web\n".into()),
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
        assert_eq!(actions.runtime_patch(&pod, &desired, &patch).await.unwrap(), Some(desired.checksums.clone()));

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
            .respond_with(ResponseTemplate::new(201))
            .mount(&server)
            .await;
        assert_eq!(actions.runtime_patch(&pod, &desired, &not_taken).await.unwrap(), None);

        // A refused patch is no patch either, not an endless retry.
        let refused =
            [RuntimeAction::SetWeight { backend: "be_web".into(), server: "srv1".into(), weight: "7".into() }];
        Mock::given(method("POST"))
            .and(path(format!("{base}/configuration/raw")))
            .and(header("X-Runtime-Actions", "SetServerWeight be_web srv1 7"))
            .respond_with(ResponseTemplate::new(422).set_body_raw(r#"{"message":"no"}"#, "application/json"))
            .mount(&server)
            .await;
        assert_eq!(actions.runtime_patch(&pod, &desired, &refused).await.unwrap(), None);
    }
}
