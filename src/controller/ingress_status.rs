//! `status.loadBalancer` of the Ingresses a configuration serves: what each should say, as a
//! plain function of the render's stores ([`changes`]), and the writer that sends only the
//! differences, in a task of its own ([`StatusWriter`]). An Ingress of another class, or one the render left out, loses the addresses
//! this controller wrote (and keeps any another controller wrote).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value as Json, json};
use tracing::warn;

use crate::config::IngressStatusSettings;
use crate::store::{ObjectRef, Stores};

/// One Ingress whose `status.loadBalancer.ingress` must change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IngressStatusChange {
    /// Namespace (the store's string, shared: a change is owed for each of 10,000 Ingresses
    /// at a start, and a render under the backlog offers them all again).
    pub namespace: Arc<str>,
    /// Name (shared, as the namespace).
    pub name: Arc<str>,
    /// The new list (empty: none), shared: every served Ingress is owed the same list, and
    /// a copy each was 38 MiB at 10,000 Ingresses on the first render (a heap profile's
    /// largest transient).
    pub ingress: Arc<[Json]>,
}

fn entries(addresses: &[String]) -> Vec<Json> {
    addresses
        .iter()
        .map(|address| {
            if address.parse::<std::net::IpAddr>().is_ok() {
                json!({"ip": address})
            } else {
                json!({"hostname": address})
            }
        })
        .collect()
}

/// The Ingresses whose status must change: those served (of the class, not left out) that do
/// not say `addresses` (the pods' IPs when none are configured), and those no longer served
/// that still say exactly what this controller writes.
pub fn changes(
    stores: &Stores,
    settings: &IngressStatusSettings,
    pod_ips: &[String],
    left_out: &[ObjectRef],
) -> Vec<IngressStatusChange> {
    changes_among(stores, settings, pod_ips, left_out, None)
}

/// [`changes`], looking only at the Ingresses `only` names (all of them without it): the
/// status tick rechecks the Ingresses whose ignored fields changed, not all 10,000 each time
/// (the echoes of its own writes arrive as such changes).
pub fn changes_among(
    stores: &Stores,
    settings: &IngressStatusSettings,
    pod_ips: &[String],
    left_out: &[ObjectRef],
    only: Option<&HashSet<ObjectRef>>,
) -> Vec<IngressStatusChange> {
    let addresses = if !settings.addresses.is_empty() {
        settings.addresses.clone()
    } else {
        let published = settings.service.as_ref().map(|service| service_addresses(stores, service)).unwrap_or_default();
        if published.is_empty() { pod_ips.to_vec() } else { published }
    };
    let ours: Arc<[Json]> = entries(&addresses).into();
    let none: Arc<[Json]> = Arc::from(Vec::new());
    let takes_classless = settings.default_class || class_is_default(stores, &settings.ingress_class);
    let mut out = Vec::new();
    for store in stores.values().filter(|store| store.kind() == "Ingress") {
        for object in store.iter() {
            if only.is_some_and(|only| !only.contains(&object.reference)) {
                continue;
            }
            // Read from the stored template value: no copy of each Ingress on every render.
            let at = |path: &[&str]| at(object, path);
            let class = at(&["spec", "ingressClassName"])
                .or_else(|| {
                    at(&["metadata", "annotations"])
                        .and_then(|a| a.get_item(&"kubernetes.io/ingress.class".into()).ok())
                })
                .and_then(|class| class.as_str().map(str::to_owned))
                .unwrap_or_default();
            let of_class = class == settings.ingress_class || (class.is_empty() && takes_classless);
            let served = of_class && !left_out.contains(&object.reference);
            let current: Vec<Json> = at(&["status", "loadBalancer", "ingress"])
                .and_then(|list| serde_json::to_value(&list).ok())
                .and_then(|list| list.as_array().cloned())
                .unwrap_or_default();
            let wanted = if served {
                &ours
            } else if !current.is_empty() && current[..] == ours[..] {
                &none
            } else {
                continue;
            };
            if current[..] != wanted[..] {
                out.push(IngressStatusChange {
                    namespace: object.reference.key.namespace.clone(),
                    name: object.reference.key.name.clone(),
                    ingress: wanted.clone(),
                });
            }
        }
    }
    out
}

/// An Ingress, by (namespace, name).
type IngressKey = (Arc<str>, Arc<str>);

/// The changes owed, by (namespace, name): the latest of each Ingress.
type Owed = BTreeMap<IngressKey, IngressStatusChange>;

/// How many status writes are in flight at once.
const WRITES_IN_FLIGHT: usize = 8;

/// What the writer owes and what it is writing.
#[derive(Default)]
pub(super) struct Ledger {
    /// Changes not yet taken by a pass.
    owed: Owed,
    /// The lists a pass has taken and not yet written: a render offers every Ingress whose
    /// stored status still differs, and at a start 10,000 writes take minutes to drain, so
    /// without this each one still waiting in the pass was owed (and written) a second time.
    writing: HashMap<IngressKey, Arc<[Json]>>,
}

impl Ledger {
    /// Whether exactly this list is being written to this Ingress.
    fn being_written(&self, key: &IngressKey, ingress: &Arc<[Json]>) -> bool {
        self.writing.get(key).is_some_and(|writing| Arc::ptr_eq(writing, ingress) || writing[..] == ingress[..])
    }
}

impl super::writers::Owed for Ledger {
    type Offer = Vec<IngressStatusChange>;

    /// Owes these changes, but for those the running pass is writing already.
    fn merge(&mut self, changes: Vec<IngressStatusChange>) -> bool {
        let mut owed_any = false;
        for change in changes {
            let key = (change.namespace.clone(), change.name.clone());
            if self.being_written(&key, &change.ingress) {
                continue;
            }
            self.owed.insert(key, change);
            owed_any = true;
        }
        owed_any
    }
}

/// Writes Ingress statuses beside the controller's loop: at 10,000 Ingresses one batch is
/// 10,000 PATCHes, which in the loop held every render back for over a minute. What is owed is
/// one map, the latest change of each Ingress replacing an unwritten one: memory stays bounded
/// by the Ingresses however many renders offer the same changes while a pass is running (a
/// queue of batches grew past a gigabyte at 10,000 under churn), and a change the running pass
/// will write anyway is not owed again.
pub(super) struct IngressWrites {
    client: kube::Client,
}

impl IngressWrites {
    /// Writes through `client`.
    pub(super) fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl super::writers::StatusWrites for IngressWrites {
    type Owed = Ledger;

    /// A replica that may not write (it lost the lease) drops what it owed: the new leader
    /// computes its own. Failures are logged; the next render, which still sees the
    /// difference, owes them again.
    async fn pass(&mut self, owed: &super::writers::SharedOwed<Ledger>, may_write: bool) -> bool {
        let pass = {
            let mut ledger = owed.lock();
            let pass = std::mem::take(&mut ledger.owed);
            ledger.writing = pass.iter().map(|(key, change)| (key.clone(), change.ingress.clone())).collect();
            pass
        };
        let client = &self.client;
        futures::stream::iter(pass)
            .for_each_concurrent(WRITES_IN_FLIGHT, |(key, change)| async move {
                if may_write {
                    write_one(client, &change).await;
                }
                // Written or not, what comes next for this Ingress is owed again.
                owed.lock().writing.remove(&key);
            })
            .await;
        false
    }
}

/// Sends one change as a merge patch of the Ingress's status; a failure is logged and the next
/// render (which still sees the difference) tries again.
async fn write_one(client: &kube::Client, change: &IngressStatusChange) {
    let api: Api<k8s_openapi::api::networking::v1::Ingress> = Api::namespaced(client.clone(), &change.namespace);
    let list = if change.ingress.is_empty() { Json::Null } else { Json::Array(change.ingress.to_vec()) };
    let patch = json!({"status": {"loadBalancer": {"ingress": list}}});
    // The replica's own field manager: an Ingress's managedFields say which replica wrote it.
    let params =
        PatchParams { field_manager: Some(crate::dataplane::status_field_manager()), ..PatchParams::default() };
    if let Err(error) = api.patch_status(&change.name, &params, &Patch::Merge(&patch)).await {
        warn!(namespace = %change.namespace, name = %change.name, %error, "could not write the Ingress status");
    }
}

/// Follows a path of attributes in a stored object's template value.
fn at(object: &crate::store::StoredObject, path: &[&str]) -> Option<minijinja::Value> {
    let mut value = object.value.clone();
    for key in path {
        value = value.get_attr(key).ok().filter(|v| !v.is_undefined() && !v.is_none())?;
    }
    Some(value)
}

/// The load-balancer addresses (IPs, else hostnames) the Service's status shows.
fn service_addresses(stores: &Stores, service: &crate::config::ServiceRef) -> Vec<String> {
    let found =
        stores.values().filter(|store| store.kind() == "Service").flat_map(|store| store.iter()).find(|object| {
            *object.reference.key.namespace == *service.namespace && *object.reference.key.name == *service.name
        });
    let Some(list) = found.and_then(|object| at(object, &["status", "loadBalancer", "ingress"])) else {
        return Vec::new();
    };
    list.try_iter()
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let field = |name: &str| entry.get_attr(name).ok().and_then(|v| v.as_str().map(str::to_owned));
            field("ip").or_else(|| field("hostname"))
        })
        .collect()
}

/// Whether the IngressClass `class` (when watched) is the cluster's default: its
/// `ingressclass.kubernetes.io/is-default-class` annotation says "true".
pub fn class_is_default(stores: &Stores, class: &str) -> bool {
    stores
        .values()
        .filter(|store| store.kind() == "IngressClass")
        .flat_map(|store| store.iter())
        .filter(|object| &*object.reference.key.name == class)
        .any(|object| {
            at(object, &["metadata", "annotations"])
                .and_then(|a| a.get_item(&"ingressclass.kubernetes.io/is-default-class".into()).ok())
                .and_then(|v| v.as_str().map(|v| v.trim().eq_ignore_ascii_case("true")))
                == Some(true)
        })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::controller::writers::StatusTask;
    use crate::store::{ObjectKey, ResourceStore};

    /// An API server that answers the status PATCHes of Ingress `ns/a` after `delay`.
    async fn status_api(delay: Duration) -> (wiremock::MockServer, kube::Client) {
        use wiremock::{Mock, MockServer, ResponseTemplate, matchers};
        let server = MockServer::start().await;
        let ingress = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                             "metadata": {"name": "a", "namespace": "ns"}});
        Mock::given(matchers::method("PATCH"))
            .and(matchers::path("/apis/networking.k8s.io/v1/namespaces/ns/ingresses/a/status"))
            .respond_with(ResponseTemplate::new(200).set_body_json(&ingress).set_delay(delay))
            .mount(&server)
            .await;
        let config = kube::Config::new(server.uri().parse().expect("a URL"));
        let client = kube::Client::try_from(config).expect("a client");
        (server, client)
    }

    #[tokio::test]
    async fn a_replica_that_may_not_write_drops_what_it_owed() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let (server, client) = status_api(Duration::ZERO).await;
        let leading = Arc::new(AtomicBool::new(false));
        let asked = leading.clone();
        let tree = crate::tasks::TaskTree::default();
        let writer = StatusTask::start(&tree, "ingress status", IngressWrites::new(client), move || {
            asked.load(Ordering::SeqCst)
        });
        let change = || IngressStatusChange {
            namespace: "ns".into(),
            name: "a".into(),
            ingress: vec![json!({"ip": "10.0.0.1"})].into(),
        };
        let patches = || async { server.received_requests().await.unwrap_or_default().len() };
        writer.offer(vec![change()]);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert_eq!(patches().await, 0, "a follower writes nothing");
        // Leading again: only what is offered now is written (what was owed was dropped).
        leading.store(true, Ordering::SeqCst);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert_eq!(patches().await, 0, "nothing owed from before");
        writer.offer(vec![change()]);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while patches().await == 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(patches().await, 1);
    }

    #[tokio::test]
    async fn a_change_the_running_pass_is_writing_is_not_owed_again() {
        // A slow API server: the pass is still writing when the next renders offer again.
        let (server, client) = status_api(Duration::from_millis(400)).await;
        let tree = crate::tasks::TaskTree::default();
        let writer = StatusTask::start(&tree, "ingress status", IngressWrites::new(client), || true);
        let list = |ip: &str| -> Arc<[Json]> { vec![json!({"ip": ip})].into() };
        let change = |ingress: Arc<[Json]>| IngressStatusChange { namespace: "ns".into(), name: "a".into(), ingress };
        let written = || async {
            let requests = server.received_requests().await.unwrap_or_default();
            requests.iter().map(|r| String::from_utf8_lossy(&r.body).into_owned()).collect::<Vec<_>>()
        };
        writer.offer(vec![change(list("10.0.0.1"))]);
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Renders during the write still see the old status.
        writer.offer(vec![change(list("10.0.0.1"))]);
        writer.offer(vec![change(list("10.0.0.1"))]);
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert_eq!(written().await.len(), 1, "written once: {:?}", written().await);
        // A different list during a write is owed, and so is the same one after the write
        // (another writer changed it back).
        writer.offer(vec![change(list("10.0.0.1"))]);
        tokio::time::sleep(Duration::from_millis(100)).await;
        writer.offer(vec![change(list("10.0.0.2"))]);
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let bodies = written().await;
        assert_eq!(bodies.len(), 3, "{bodies:?}");
        assert!(bodies[2].contains("10.0.0.2"), "{bodies:?}");
    }

    fn stores(objects: Vec<Json>) -> Stores {
        let mut store = ResourceStore::new("Ingress", Vec::new());
        for object in objects {
            store.apply(object).expect("an Ingress");
        }
        Stores::from([("ingresses".to_owned(), Arc::new(store))])
    }

    fn ingress(name: &str, class: &str, status: Json) -> Json {
        json!({"metadata": {"namespace": "ns", "name": name}, "spec": {"ingressClassName": class}, "status": status})
    }

    #[test]
    fn served_ingresses_get_the_addresses_and_others_lose_only_ours() {
        let settings = IngressStatusSettings {
            ingress_class: "haproxy".into(),
            default_class: false,
            addresses: vec!["192.0.2.1".into(), "lb.example.com".into()],
            service: None,
        };
        let ours = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}, {"hostname": "lb.example.com"}]}});
        let theirs = json!({"loadBalancer": {"ingress": [{"ip": "198.51.100.9"}]}});
        let stores = stores(vec![
            ingress("new", "haproxy", json!({})),
            ingress("done", "haproxy", ours.clone()),
            ingress("moved", "nginx", ours.clone()),
            ingress("other", "nginx", theirs),
            ingress("refused", "haproxy", ours),
        ]);
        let refused =
            ObjectRef { kind: "Ingress".into(), key: ObjectKey { namespace: "ns".into(), name: "refused".into() } };
        let changes = changes(&stores, &settings, &[], &[refused]);
        let names: Vec<(&str, usize)> = changes.iter().map(|c| (&*c.name, c.ingress.len())).collect();
        assert_eq!(names, vec![("moved", 0), ("new", 2), ("refused", 0)]);
        // One list shared by every change that owes it, not a copy each (10,000 at once), and
        // the names the store's own.
        assert!(Arc::ptr_eq(&changes[0].ingress, &changes[2].ingress), "the empty list is shared");
        let stored = stores["ingresses"].iter().find(|object| &*object.reference.key.name == "new").expect("stored");
        assert!(Arc::ptr_eq(&changes[1].name, &stored.reference.key.name), "the name is the store's");
        assert!(Arc::ptr_eq(&changes[1].namespace, &stored.reference.key.namespace), "the namespace is the store's");
        // The status tick looks only at the Ingresses whose ignored fields changed.
        let reference = |name: &str| ObjectRef {
            kind: "Ingress".into(),
            key: ObjectKey { namespace: "ns".into(), name: name.into() },
        };
        let only: HashSet<ObjectRef> = [reference("new"), reference("done")].into();
        let rechecked = changes_among(&stores, &settings, &[], &[reference("refused")], Some(&only));
        let names: Vec<&str> = rechecked.iter().map(|c| &*c.name).collect();
        assert_eq!(names, ["new"]);
    }

    #[test]
    fn without_addresses_the_pods_ips_are_written() {
        let settings = IngressStatusSettings {
            ingress_class: "haproxy".into(),
            default_class: true,
            addresses: vec![],
            service: None,
        };
        let stores = stores(vec![json!({"metadata": {"namespace": "ns", "name": "classless"}, "spec": {}})]);
        let changes = changes(&stores, &settings, &["10.0.0.7".into()], &[]);
        assert_eq!(changes[0].ingress.to_vec(), vec![json!({"ip": "10.0.0.7"})]);
    }

    #[test]
    fn the_services_load_balancer_address_comes_before_the_pods_ips() {
        let mut stores = stores(vec![ingress("web", "haproxy", json!({}))]);
        let mut services = ResourceStore::new("Service", Vec::new());
        services
            .apply(json!({"metadata": {"namespace": "system", "name": "lb"},
                          "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.9"}, {"hostname": "lb.example.net"}]}}}))
            .expect("a Service");
        stores.insert("services".into(), Arc::new(services));
        let settings = IngressStatusSettings {
            ingress_class: "haproxy".into(),
            default_class: false,
            addresses: vec![],
            service: Some(crate::config::ServiceRef { namespace: "system".into(), name: "lb".into() }),
        };
        let changes = changes(&stores, &settings, &["10.0.0.7".into()], &[]);
        assert_eq!(
            changes[0].ingress.to_vec(),
            vec![json!({"ip": "203.0.113.9"}), json!({"hostname": "lb.example.net"})]
        );
        let unpublished = IngressStatusSettings {
            service: Some(crate::config::ServiceRef { namespace: "system".into(), name: "missing".into() }),
            ..settings
        };
        assert_eq!(changes_of(&stores, &unpublished), vec![json!({"ip": "10.0.0.7"})]);
    }

    fn changes_of(stores: &Stores, settings: &IngressStatusSettings) -> Vec<Json> {
        changes(stores, settings, &["10.0.0.7".into()], &[]).remove(0).ingress.to_vec()
    }

    #[test]
    fn an_ingressclass_annotated_default_takes_classless_ingresses() {
        let mut stores = stores(vec![json!({"metadata": {"namespace": "ns", "name": "classless"}, "spec": {}})]);
        let settings = IngressStatusSettings {
            ingress_class: "haproxy".into(),
            default_class: false,
            addresses: vec!["192.0.2.1".into()],
            service: None,
        };
        assert!(changes(&stores, &settings, &[], &[]).is_empty());
        let mut classes = ResourceStore::new("IngressClass", Vec::new());
        classes
            .apply(json!({"metadata": {"name": "haproxy", "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}}}))
            .expect("an IngressClass");
        stores.insert("ingressclasses".into(), Arc::new(classes));
        assert_eq!(changes(&stores, &settings, &[], &[]).len(), 1);
    }
}
