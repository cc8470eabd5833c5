//! Watch: one watcher per watched resource type (per namespace when the configuration names
//! namespaces), feeding the stores and announcing each real change.
//!
//! A thin adapter over kube-runtime: types are found through discovery, so any resource the
//! API server serves works, custom resources included. Re-lists (after an API server restart
//! or an expired watch) replace a store's content atomically and announce a change only when
//! the content really differs. Renders are coalesced by [`debounce`].

pub mod debounce;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::Value as Json;
use thiserror::Error;
use tokio::sync::{Notify, mpsc};
use tracing::{debug, info, warn};

use k8s_openapi::api::core::v1::Pod;

use crate::config::{HAProxyTemplateConfigSpec, WatchedResource};
use crate::render::PodInfo;
use crate::store::{Applied, ObjectKey, ObjectRef, ResourceStore, StoreError, StoredObject, Stores, object_key};

/// One change that may call for a render.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// An object was added or changed.
    Applied(ObjectRef),
    /// An object was deleted.
    Deleted(ObjectRef),
    /// A re-list found different content (objects changed while nobody was watching).
    Relisted {
        /// The alias re-listed.
        alias: String,
    },
    /// The set of ready HAProxy pods (or one's address) changed.
    Pods,
    /// Only an object's `ignoreFields` values changed: no render, but the Ingress status
    /// writer reads them (a status another writer changed is written back).
    IgnoredFields(ObjectRef),
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Applied(object) => write!(f, "{object} applied"),
            Self::Deleted(object) => write!(f, "{object} deleted"),
            Self::Relisted { alias } => write!(f, "{alias} re-listed with changes"),
            Self::Pods => f.write_str("HAProxy pods changed"),
            Self::IgnoredFields(object) => write!(f, "{object} changed in ignored fields only"),
        }
    }
}

/// Errors starting watches, each naming the alias.
#[derive(Debug, Error)]
pub enum WatchError {
    /// The API server does not serve this type.
    #[error("spec.watchedResources.{alias}: the API server does not serve {api_version} {kind}: {source}")]
    Discovery {
        /// The alias.
        alias: String,
        /// Its apiVersion.
        api_version: String,
        /// Its kind.
        kind: String,
        /// Discovery's error.
        source: kube::Error,
    },
    /// An `indexBy`, `ignoreFields` or `fields` path does not parse (or cannot be kept).
    #[error("spec.watchedResources.{alias}: {detail}")]
    FieldPath {
        /// The alias.
        alias: String,
        /// What is wrong.
        detail: crate::store::fieldpath::PathError,
    },
}

/// How many streams have listed their objects once, shared by the streams and their owner.
#[derive(Clone, Debug, Default)]
struct SyncCount(Arc<(AtomicUsize, Notify)>);

impl SyncCount {
    fn add_one(&self) {
        self.0.0.fetch_add(1, Ordering::AcqRel);
        self.0.1.notify_waiters();
    }

    fn get(&self) -> usize {
        self.0.0.load(Ordering::Acquire)
    }

    async fn wait_for(&self, streams: usize) {
        loop {
            let notified = self.0.1.notified();
            if self.get() >= streams {
                return;
            }
            notified.await;
        }
    }
}

/// A store shared between its watcher (which writes) and renders (which take snapshots).
/// Writes copy the store only while a snapshot of it is still in use.
#[derive(Debug)]
pub struct SharedStore(Mutex<Arc<ResourceStore>>);

impl SharedStore {
    fn new(store: ResourceStore) -> Self {
        Self(Mutex::new(Arc::new(store)))
    }

    /// The store as it is now; later changes do not affect it.
    pub fn snapshot(&self) -> Arc<ResourceStore> {
        self.0.lock().map(|store| store.clone()).unwrap_or_else(|poisoned| poisoned.into_inner().clone())
    }

    fn update<R>(&self, change: impl FnOnce(&mut ResourceStore) -> R) -> R {
        let mut guard = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        change(Arc::make_mut(&mut guard))
    }
}

/// An HAProxy pod as the pod watch sees it: what templates see of it, and what the fleet
/// needs to know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HaproxyPod {
    /// The pod as templates see it.
    pub info: PodInfo,
    /// Ready (its Ready condition is True): it takes traffic, and templates see it.
    pub ready: bool,
    /// Running, with an IP, not being deleted, and its Dataplane API container ready: it can
    /// be deployed to. A pod is often not Ready until it has been (its HAProxy answers its
    /// readiness probe only with a configuration from haptic), so deploying only to Ready pods
    /// would never configure one.
    pub deployable: bool,
}

/// The running watches of one configuration. Dropping it stops them.
pub struct Watches {
    stores: BTreeMap<String, Arc<SharedStore>>,
    pods: Arc<Mutex<Vec<HaproxyPod>>>,
    tasks: Vec<crate::tasks::OwnedTask>,
    streams: usize,
    synced: SyncCount,
}

impl Watches {
    /// Finds every watched type through discovery and starts its watchers. Changes are sent to
    /// `changes` once each stream has listed its objects for the first time.
    /// The HAProxy pods are those in `pod_namespace` matching `spec.podSelector`.
    pub async fn start(
        client: kube::Client,
        spec: &HAProxyTemplateConfigSpec,
        pod_namespace: &str,
        changes: mpsc::Sender<Change>,
        tasks: &crate::tasks::TaskTree,
    ) -> Result<Self, WatchError> {
        let mut watches = Self {
            pods: Arc::new(Mutex::new(Vec::new())),
            stores: BTreeMap::new(),
            tasks: Vec::new(),
            streams: 0,
            synced: SyncCount::default(),
        };
        for (alias, watched) in &spec.watched_resources {
            let resource = discover(&client, alias, watched).await?;
            let store =
                ResourceStore::shaped(&watched.kind, &watched.index_by, &watched.ignore_fields, &watched.fields)
                    .map_err(|detail| WatchError::FieldPath { alias: alias.clone(), detail })?;
            let store = Arc::new(SharedStore::new(store));
            watches.stores.insert(alias.clone(), store.clone());
            let namespaces: Vec<Option<String>> = match &watched.namespaces {
                Some(namespaces) => namespaces.iter().cloned().map(Some).collect(),
                None => vec![None],
            };
            for namespace in namespaces {
                let stream = AliasStream {
                    alias: alias.clone(),
                    namespace,
                    resource: resource.clone(),
                    store: store.clone(),
                    changes: changes.clone(),
                    synced: watches.synced.clone(),
                };
                let config = watcher_config(watched);
                watches.tasks.push(tasks.spawn("watch", stream.run(client.clone(), config)));
                watches.streams += 1;
            }
        }
        let pod_stream = PodStream {
            namespace: pod_namespace.to_owned(),
            dataplane_port: spec.dataplane.port,
            pods: watches.pods.clone(),
            changes,
            synced: watches.synced.clone(),
        };
        let selector =
            spec.pod_selector.match_labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
        watches.tasks.push(tasks.spawn("pod watch", pod_stream.run(client, selector)));
        watches.streams += 1;
        Ok(watches)
    }

    /// The ready HAProxy pods, in (namespace, name) order: what templates see.
    pub fn pods(&self) -> Vec<PodInfo> {
        self.all_pods().into_iter().filter(|pod| pod.ready).map(|pod| pod.info).collect()
    }

    /// Every HAProxy pod that exists (deleted ones are gone), in (namespace, name) order.
    pub fn all_pods(&self) -> Vec<HaproxyPod> {
        self.pods.lock().map(|pods| pods.clone()).unwrap_or_default()
    }

    /// Waits until every stream has listed its objects once.
    pub async fn wait_synced(&self) {
        self.synced.wait_for(self.streams).await;
    }

    /// Whether every stream has listed its objects once.
    pub fn is_synced(&self) -> bool {
        self.synced.get() >= self.streams
    }

    /// Every store as it is now.
    pub fn snapshot(&self) -> Stores {
        self.view().snapshot()
    }

    /// A handle on the stores and pods that outlives no watch but can be read from elsewhere
    /// (the admission webhook): each read sees them as they are then.
    pub fn view(&self) -> StoresView {
        StoresView { stores: self.stores.clone(), pods: self.pods.clone() }
    }
}

/// The stores and pods of a `Watches`, readable from another task.
#[derive(Clone)]
pub struct StoresView {
    stores: BTreeMap<String, Arc<SharedStore>>,
    pods: Arc<Mutex<Vec<HaproxyPod>>>,
}

impl StoresView {
    /// Every store as it is now.
    pub fn snapshot(&self) -> Stores {
        self.stores.iter().map(|(alias, store)| (alias.clone(), store.snapshot())).collect()
    }

    /// The ready HAProxy pods, as templates see them.
    pub fn pods(&self) -> Vec<PodInfo> {
        let pods = self.pods.lock().map(|pods| pods.clone()).unwrap_or_default();
        pods.into_iter().filter(|pod| pod.ready).map(|pod| pod.info).collect()
    }
}

/// Retry pacing for interrupted watches: quick (at most 5 s apart) because a control-plane
/// restart should not leave routing stale for long, jittered so many watches do not reconnect
/// in lockstep.
pub fn reconnect_backoff() -> impl kube::runtime::utils::Backoff {
    kube::runtime::utils::ResetTimerBackoff::new(
        watcher::ExponentialBackoff::from(
            backon::ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(500))
                .with_max_delay(Duration::from_secs(5))
                .with_factor(2.0)
                .with_jitter()
                .without_max_times(),
        ),
        Duration::from_secs(60),
    )
}

fn watcher_config(watched: &WatchedResource) -> watcher::Config {
    let mut config = watcher::Config::default();
    if let Some(labels) = &watched.label_selector {
        config = config.labels(labels);
    }
    if let Some(fields) = &watched.field_selector {
        config = config.fields(fields);
    }
    config
}

async fn discover(client: &kube::Client, alias: &str, watched: &WatchedResource) -> Result<ApiResource, WatchError> {
    let (group, version) = match watched.api_version.split_once('/') {
        Some((group, version)) => (group.to_owned(), version.to_owned()),
        None => (String::new(), watched.api_version.clone()),
    };
    let gvk = GroupVersionKind::gvk(&group, &version, &watched.kind);
    let (resource, _) = kube::discovery::pinned_kind(client, &gvk).await.map_err(|source| WatchError::Discovery {
        alias: alias.to_owned(),
        api_version: watched.api_version.clone(),
        kind: watched.kind.clone(),
        source,
    })?;
    Ok(resource)
}

/// The HAProxy pods that exist, with their readiness and whether they can be deployed to. Only
/// a change of those (or of a pod's address) is announced, not every status update of a pod.
struct PodStream {
    namespace: String,
    dataplane_port: u16,
    pods: Arc<Mutex<Vec<HaproxyPod>>>,
    changes: mpsc::Sender<Change>,
    synced: SyncCount,
}

impl PodStream {
    async fn run(self, client: kube::Client, selector: String) {
        let api: Api<Pod> = Api::namespaced(client, &self.namespace);
        let mut stream =
            watcher::watcher(api, watcher::Config::default().labels(&selector)).backoff(reconnect_backoff()).boxed();
        let mut known: BTreeMap<String, HaproxyPod> = BTreeMap::new();
        let mut relist: BTreeMap<String, HaproxyPod> = BTreeMap::new();
        let mut first_sync = true;
        while let Some(event) = stream.next().await {
            let before = known.clone();
            match event {
                Ok(Event::Init) => relist.clear(),
                Ok(Event::InitApply(pod)) => {
                    if let Some(pod) = haproxy_pod(&pod, self.dataplane_port) {
                        relist.insert(pod.info.uid.clone(), pod);
                    }
                }
                Ok(Event::InitDone) => {
                    known = std::mem::take(&mut relist);
                    if first_sync {
                        first_sync = false;
                        self.publish(&known);
                        self.synced.add_one();
                        info!(namespace = %self.namespace, pods = known.len(), "HAProxy pods synced");
                        continue;
                    }
                }
                Ok(Event::Apply(pod)) => {
                    let uid = pod.metadata.uid.clone().unwrap_or_default();
                    match haproxy_pod(&pod, self.dataplane_port) {
                        Some(pod) => known.insert(uid, pod),
                        None => known.remove(&uid),
                    };
                }
                Ok(Event::Delete(pod)) => {
                    known.remove(&pod.metadata.uid.clone().unwrap_or_default());
                }
                Err(error) => warn!(namespace = %self.namespace, %error, "pod watch interrupted, retrying"),
            }
            if !first_sync && known != before {
                self.publish(&known);
                if self.changes.send(Change::Pods).await.is_err() {
                    return;
                }
            }
        }
    }

    fn publish(&self, known: &BTreeMap<String, HaproxyPod>) {
        let mut pods: Vec<HaproxyPod> = known.values().cloned().collect();
        pods.sort_by(|a, b| (&a.info.namespace, &a.info.name).cmp(&(&b.info.namespace, &b.info.name)));
        if let Ok(mut shared) = self.pods.lock() {
            *shared = pods;
        }
    }
}

/// An HAProxy pod as the fleet and templates see it; `None` for a pod without a UID.
/// The Dataplane API container is the one declaring `dataplane_port`; a pod none of whose
/// containers declares it is deployable only once all its containers are ready.
pub fn haproxy_pod(pod: &Pod, dataplane_port: u16) -> Option<HaproxyPod> {
    let uid = pod.metadata.uid.clone()?;
    let status = pod.status.clone().unwrap_or_default();
    let ip = status.pod_ip.clone().filter(|ip| !ip.is_empty());
    let terminating = pod.metadata.deletion_timestamp.is_some();
    let condition = |kind: &str| status.conditions.iter().flatten().any(|c| c.type_ == kind && c.status == "True");
    let dataplane_container = pod.spec.iter().flat_map(|spec| &spec.containers).find(|container| {
        container.ports.iter().flatten().any(|port| port.container_port == i32::from(dataplane_port))
    });
    let dataplane_ready = match dataplane_container {
        Some(container) => status.container_statuses.iter().flatten().any(|s| s.name == container.name && s.ready),
        None => condition("ContainersReady"),
    };
    let running = status.phase.as_deref() == Some("Running");
    let info = PodInfo {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid,
        ip: ip.clone().unwrap_or_default(),
    };
    Some(HaproxyPod {
        info,
        ready: !terminating && ip.is_some() && condition("Ready"),
        deployable: !terminating && ip.is_some() && running && dataplane_ready,
    })
}

/// One watch stream: an alias, in one namespace or all.
struct AliasStream {
    alias: String,
    namespace: Option<String>,
    resource: ApiResource,
    store: Arc<SharedStore>,
    changes: mpsc::Sender<Change>,
    synced: SyncCount,
}

impl AliasStream {
    async fn run(self, client: kube::Client, config: watcher::Config) {
        let api: Api<DynamicObject> = match &self.namespace {
            Some(namespace) => Api::namespaced_with(client, namespace, &self.resource),
            None => Api::all_with(client, &self.resource),
        };
        let mut stream = watcher::watcher(api, config).backoff(reconnect_backoff()).boxed();
        // A re-list's objects, prepared as they arrive: at 10,000 objects, holding their JSON
        // until the list ends would hold the whole list twice over.
        let mut relist: Vec<StoredObject> = Vec::new();
        let mut unusable: Option<StoreError> = None;
        let mut first_sync = true;
        while let Some(event) = stream.next().await {
            let change = match event {
                Ok(Event::Init) => {
                    relist.clear();
                    unusable = None;
                    None
                }
                Ok(Event::InitApply(object)) => {
                    match self.store.snapshot().prepare(self.normalize(object)) {
                        Ok(stored) => relist.push(stored),
                        Err(error) => unusable = Some(error),
                    }
                    None
                }
                Ok(Event::InitDone) => {
                    let objects = std::mem::take(&mut relist);
                    let count = objects.len();
                    let changed = match unusable.take() {
                        Some(error) => Err(error),
                        None => Ok(self
                            .store
                            .update(|store| store.replace_scope_prepared(self.namespace.as_deref(), objects))),
                    };
                    if first_sync {
                        first_sync = false;
                        self.synced.add_one();
                        info!(alias = %self.alias, namespace = ?self.namespace, objects = count, "watch synced");
                    }
                    match changed {
                        Ok(true) => Some(Change::Relisted { alias: self.alias.clone() }),
                        Ok(false) => None,
                        Err(error) => {
                            warn!(alias = %self.alias, %error, "re-list had an unusable object");
                            None
                        }
                    }
                }
                Ok(Event::Apply(object)) => {
                    let object = self.normalize(object);
                    let reference = self.reference(&object);
                    match self.store.update(|store| store.apply_noting(object)) {
                        Ok(Applied::Changed) => reference.map(Change::Applied),
                        Ok(Applied::IgnoredFieldsOnly) => reference.map(Change::IgnoredFields),
                        Ok(Applied::Unchanged) => None,
                        Err(error) => {
                            warn!(alias = %self.alias, %error, "ignored an object");
                            None
                        }
                    }
                }
                Ok(Event::Delete(object)) => {
                    let object = self.normalize(object);
                    let reference = self.reference(&object);
                    let key = object_key(&object);
                    let deleted = key.is_some_and(|key: ObjectKey| self.store.update(|store| store.delete(&key)));
                    if deleted { reference.map(Change::Deleted) } else { None }
                }
                Err(error) => {
                    // The backoff retries; the watch resumes or re-lists by itself.
                    warn!(alias = %self.alias, namespace = ?self.namespace, %error, "watch interrupted, retrying");
                    None
                }
            };
            if let Some(change) = change {
                debug!(alias = %self.alias, %change, "watched change");
                let alias = crate::telemetry::metrics::AliasLabels { alias: self.alias.clone() };
                crate::telemetry::metrics::metrics().watch_events.get_or_create(&alias).inc();
                // Before the first sync nobody renders yet; the sync itself is reported.
                if !first_sync && self.changes.send(change).await.is_err() {
                    return;
                }
            }
        }
    }

    /// The object as JSON with `apiVersion` and `kind` always set: list items lack them while
    /// watch events carry them, and the difference must not count as a change.
    fn normalize(&self, object: DynamicObject) -> Json {
        let mut json = serde_json::to_value(&object).unwrap_or(Json::Null);
        if let Some(map) = json.as_object_mut() {
            map.insert("apiVersion".into(), Json::from(self.resource.api_version.clone()));
            map.insert("kind".into(), Json::from(self.resource.kind.clone()));
        }
        json
    }

    fn reference(&self, object: &Json) -> Option<ObjectRef> {
        object_key(object).map(|key| ObjectRef { kind: self.resource.kind.as_str().into(), key })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "haproxy-0", "namespace": "web", "uid": "u1"},
            "spec": {"containers": [
                {"name": "haproxy", "ports": [{"name": "http", "containerPort": 80}]},
                {"name": "dataplaneapi", "ports": [{"name": "dataplane", "containerPort": 5555}]}
            ]},
            "status": status
        }))
        .unwrap()
    }

    fn containers(haproxy: bool, dataplane: bool) -> serde_json::Value {
        serde_json::json!([
            {"name": "haproxy", "ready": haproxy, "restartCount": 0, "image": "i", "imageID": ""},
            {"name": "dataplaneapi", "ready": dataplane, "restartCount": 0, "image": "i", "imageID": ""}
        ])
    }

    #[test]
    fn a_fresh_pod_is_deployable_before_it_is_ready() {
        // The chart's pod: HAProxy answers its readiness probe only once haptic deployed.
        let fresh = haproxy_pod(
            &pod(serde_json::json!({"phase": "Running", "podIP": "10.0.0.7",
                "conditions": [{"type": "Ready", "status": "False"}],
                "containerStatuses": containers(false, true)})),
            5555,
        )
        .unwrap();
        assert_eq!((fresh.ready, fresh.deployable), (false, true));
        assert_eq!(fresh.info.ip, "10.0.0.7");
    }

    #[test]
    fn a_pod_without_its_dataplane_api_or_address_is_not_deployable() {
        let no_dataplane = pod(serde_json::json!({"phase": "Running", "podIP": "10.0.0.7",
            "containerStatuses": containers(true, false)}));
        assert!(!haproxy_pod(&no_dataplane, 5555).unwrap().deployable);
        let pending = pod(serde_json::json!({"phase": "Pending"}));
        let pending = haproxy_pod(&pending, 5555).unwrap();
        assert_eq!((pending.ready, pending.deployable), (false, false), "it exists, so its record is kept");
    }

    #[test]
    fn a_ready_pod_is_seen_by_templates_and_a_terminating_one_by_nobody() {
        let status = serde_json::json!({"phase": "Running", "podIP": "10.0.0.7",
            "conditions": [{"type": "Ready", "status": "True"}], "containerStatuses": containers(true, true)});
        let ready = haproxy_pod(&pod(status.clone()), 5555).unwrap();
        assert_eq!((ready.ready, ready.deployable), (true, true));
        let mut terminating = pod(status);
        terminating.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        let terminating = haproxy_pod(&terminating, 5555).unwrap();
        assert_eq!((terminating.ready, terminating.deployable), (false, false));
    }

    #[test]
    fn without_a_declared_dataplane_port_every_container_must_be_ready() {
        let status = serde_json::json!({"phase": "Running", "podIP": "10.0.0.7",
            "conditions": [{"type": "ContainersReady", "status": "True"}]});
        assert!(haproxy_pod(&pod(status.clone()), 9999).unwrap().deployable);
        let status = serde_json::json!({"phase": "Running", "podIP": "10.0.0.7"});
        assert!(!haproxy_pod(&pod(status), 9999).unwrap().deployable);
    }
}
