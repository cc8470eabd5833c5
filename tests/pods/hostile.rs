//! Hostile values from the cluster (issue #12), against the chart's library on the
//! environment's pods, through the real API server, the real binary, the real Dataplane APIs
//! and HAProxy: each value is placed where the API server lets it be (hosts, paths, annotations,
//! Service names, Secret data; paths are the maps' keys); an object the API server takes is
//! refused by haptic with an Event naming its field and never its value, the other Ingresses
//! keep serving on every pod, and no pod's files hold any of it.

use crate::env;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use env::controller::ControllerProcess;
use env::standalone::{
    apply_library_config_for_pods, backend_host_address, library_namespace, service_with_endpoints, start_backends,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

const WITHIN: Duration = Duration::from_secs(60);
const BACKEND_PORT: u16 = 18400;

/// Where a hostile value goes.
#[derive(Clone, Copy, Debug)]
enum Place {
    /// `spec.rules[0].host`.
    Host,
    /// `spec.rules[0].http.paths[0].path` (ImplementationSpecific: the laxest the API allows);
    /// paths are the keys of the library's maps.
    Path,
    /// An annotation the library reads, by name.
    Annotation(&'static str),
    /// `spec.rules[0].http.paths[0].backend.service.name`.
    ServiceName,
    /// `tls.crt` of the Secret the Ingress names in `spec.tls` (bytes, not necessarily UTF-8).
    SecretData,
}

/// The hostile values, each with the text that must appear in no file of any pod (its most
/// telling part) and the field its Event must name.
fn hostile_values() -> Vec<(Place, Vec<u8>, &'static str, &'static str)> {
    let long = format!("/{}", "a".repeat(10 * 1024));
    let mut cases: Vec<(Place, Vec<u8>, &'static str, &'static str)> = vec![
        (Place::Host, b"evil.example.com\nbackend x".to_vec(), "backend x", "spec.rules[0].host"),
        (Place::Host, b"evil#.example.com".to_vec(), "evil#", "spec.rules[0].host"),
        (Place::Path, b"/a\nuse_backend x".to_vec(), "use_backend x", "spec.rules[0].http.paths[0].path"),
        (Place::Path, b"/hash#tag".to_vec(), "/hash#tag", "spec.rules[0].http.paths[0].path"),
        (Place::Path, b"/space here".to_vec(), "/space here", "spec.rules[0].http.paths[0].path"),
        (Place::Path, b"/quote\"d'".to_vec(), "/quote\"d'", "spec.rules[0].http.paths[0].path"),
        (Place::Path, b"/back\\slash".to_vec(), "/back\\slash", "spec.rules[0].http.paths[0].path"),
        (Place::Path, b"/fetch%[src]".to_vec(), "%[src]", "spec.rules[0].http.paths[0].path"),
        (Place::Path, b"/x if TRUE".to_vec(), "/x if TRUE", "spec.rules[0].http.paths[0].path"),
        (Place::Path, b"/tab\there".to_vec(), "/tab\there", "spec.rules[0].http.paths[0].path"),
        (Place::Annotation("haptic.dev/timeout-server"), b"5s\n    option x".to_vec(), "option x", "timeout-server"),
        (Place::Annotation("haptic.dev/timeout-connect"), b"5s if TRUE".to_vec(), "5s if TRUE", "timeout-connect"),
        (
            Place::Annotation("haptic.dev/load-balance"),
            b"roundrobin\n    http-request deny".to_vec(),
            "http-request deny",
            "load-balance",
        ),
        (
            Place::Annotation("haptic.dev/allow-list"),
            b"10.0.0.0/8 } or { src 0.0.0.0/0".to_vec(),
            "0.0.0.0/0",
            "allow-list",
        ),
        (
            Place::Annotation("haptic.dev/timeout-server"),
            "5".repeat(10 * 1024).into_bytes(),
            "55555555555",
            "timeout-server",
        ),
        (Place::ServiceName, b"svc-good\nbackend x".to_vec(), "backend x", "spec.rules[0].http.paths[0].backend"),
        (Place::SecretData, b"-----BEGIN CERTIFICATE-----\n\xff\xfe not UTF-8\n".to_vec(), "not UTF-8", "data"),
        (Place::SecretData, b"hello\nbackend x".to_vec(), "backend x", "data"),
    ];
    cases.push((
        Place::Path,
        long.into_bytes(),
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "spec.rules[0].http.paths[0].path",
    ));
    cases
}

/// The Ingress (and Secret) carrying one hostile value; host `hostile-N.example.com`.
fn hostile_objects(index: usize, place: Place, value: &[u8]) -> Result<(Ingress, Option<Secret>)> {
    let text = String::from_utf8_lossy(value).into_owned();
    let name = format!("hostile-{index}");
    let mut host = format!("hostile-{index}.example.com");
    let mut path = "/".to_owned();
    let mut service = "svc-good".to_owned();
    let mut annotations = json!({});
    let mut tls = json!(null);
    let mut secret = None;
    match place {
        Place::Host => host = text,
        Place::Path => path = text,
        Place::Annotation(key) => annotations = json!({ key: text }),
        Place::ServiceName => service = text,
        Place::SecretData => {
            use base64::Engine as _;
            let encode = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
            secret = Some(serde_json::from_value(json!({
                "metadata": {"name": format!("{name}-tls")}, "type": "kubernetes.io/tls",
                "data": {"tls.crt": encode(value), "tls.key": encode(b"not a key")}
            }))?);
            tls = json!([{"hosts": [host], "secretName": format!("{name}-tls")}]);
        }
    }
    let mut spec = json!({"ingressClassName": "haproxy", "rules": [{"host": host, "http": {"paths": [
        {"path": path, "pathType": "ImplementationSpecific",
         "backend": {"service": {"name": service, "port": {"number": 80}}}}]}}]});
    if !tls.is_null() {
        spec["tls"] = tls;
    }
    let ingress =
        serde_json::from_value(json!({"metadata": {"name": name, "annotations": annotations}, "spec": spec}))?;
    Ok((ingress, secret))
}

fn pod_files(pod: &env::EnvPod) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut files = BTreeMap::from([("haproxy.cfg".to_owned(), std::fs::read(&pod.config_file)?)]);
    for dir in ["maps", "general", "ssl"] {
        for entry in std::fs::read_dir(pod.dir.join(dir))? {
            let path = entry?.path();
            files.insert(
                format!("{dir}/{}", path.file_name().unwrap_or_default().to_string_lossy()),
                std::fs::read(&path)?,
            );
        }
    }
    Ok(files)
}

#[tokio::test]
async fn hostile_values_are_refused_with_an_event_naming_the_field_and_reach_no_pod() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "hostile").await?;
    let address = backend_host_address()?;
    let work = tempfile::tempdir()?;
    let _backends = start_backends(work.path(), &address, &[("svc-good".to_owned(), BACKEND_PORT)])?;
    service_with_endpoints(&client, &namespace, "svc-good", &address, BACKEND_PORT).await?;
    apply_library_config_for_pods(&client, &namespace, "hostile").await?;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    let good = env::standalone::ingress_to("good", "good.example.com", "svc-good")?;
    ingresses.create(&PostParams::default(), &good).await?;
    let journal = work.path().join("journal");
    let controller = ControllerProcess::launch_library(env, &namespace, &journal)?;
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    env::every_pod_answers(env, "good.example.com", "svc-good", Duration::from_millis(100)).await?;

    // Each hostile value in its own Ingress; the API server refuses some itself.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let mut taken = Vec::new();
    let mut report = Vec::new();
    for (index, (place, value, marker, field)) in hostile_values().into_iter().enumerate() {
        let (ingress, secret) = hostile_objects(index, place, &value)?;
        if let Some(secret) = secret {
            secrets.create(&PostParams::default(), &secret).await.context("the API server takes any Secret data")?;
        }
        match ingresses.create(&PostParams::default(), &ingress).await {
            Ok(_) => taken.push((index, place, marker, field)),
            Err(kube::Error::Api(refusal)) if refusal.code == 422 => {
                report.push(format!("{place:?} {marker:?}: refused by the API server"));
            }
            Err(other) => return Err(other.into()),
        }
    }
    ensure!(!taken.is_empty(), "the API server refused every hostile value: {report:?}");

    // Every object the API server took gets its Refused Event, naming the field, not the value.
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let deadline = Instant::now() + WITHIN;
    loop {
        let found = events.list(&ListParams::default()).await?.items;
        let refused = |name: &str| {
            found.iter().find(|event| {
                event.reason.as_deref() == Some("Refused")
                    && event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
            })
        };
        let mut missing = Vec::new();
        for (index, place, marker, field) in &taken {
            // A Secret's refusal is on the Secret (its data is what was refused).
            let object = match place {
                Place::SecretData => format!("hostile-{index}-tls"),
                _ => format!("hostile-{index}"),
            };
            match refused(&object) {
                Some(event) => {
                    let note = event.note.as_deref().unwrap_or_default();
                    ensure!(note.contains(field), "{place:?}: the Event does not name {field}: {note}");
                    ensure!(!note.contains(marker), "{place:?}: the Event quotes the value: {note}");
                }
                None if matches!(place, Place::ServiceName) => {
                    // A Service name is only looked up, never printed: an Ingress to a Service
                    // that cannot exist serves no server, and is not refused.
                }
                None => missing.push(object),
            }
        }
        if missing.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            bail!("no Refused Event on {missing:?}\n{}", controller.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // The rest is served on every pod, whose files hold none of the values.
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    env::every_pod_answers(env, "good.example.com", "svc-good", Duration::from_millis(100)).await?;
    for pod in &env.pods {
        for (name, content) in pod_files(pod)? {
            for (_, place, marker, _) in &taken {
                let found = content.windows(marker.len()).any(|window| window == marker.as_bytes());
                ensure!(!found, "{}: {name} holds the hostile value of {place:?} ({marker:?})", pod.name);
            }
        }
    }
    let log = controller.log_text();
    for (_, place, marker, _) in &taken {
        ensure!(!log.contains(marker), "the controller's log quotes the hostile value of {place:?} ({marker:?})");
    }
    eprintln!("hostile values taken by the API server and refused by haptic: {}", taken.len());
    for line in report {
        eprintln!("  {line}");
    }
    Ok(())
}

/// Endpoint addresses that are not IP addresses HAProxy may be sent to (issue #45, defect 10):
/// an FQDN EndpointSlice naming a cloud metadata service is refused with an Event naming the
/// address's field, while the Service's other slice and every Ingress keep being served, and no
/// pod's files hold the name. (Loopback and link-local IPs the API server refuses itself, as
/// this test checks; haptic refuses them too, for stores fed some other way: unit-tested.)
#[tokio::test]
async fn an_fqdn_endpoint_slice_is_refused_and_the_rest_served() -> Result<()> {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "hostile-endpoints").await?;
    let address = backend_host_address()?;
    let work = tempfile::tempdir()?;
    let _backends = start_backends(work.path(), &address, &[("svc-good".to_owned(), BACKEND_PORT + 1)])?;
    service_with_endpoints(&client, &namespace, "svc-good", &address, BACKEND_PORT + 1).await?;
    apply_library_config_for_pods(&client, &namespace, "hostile").await?;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    let good = env::standalone::ingress_to("good", "good.example.com", "svc-good")?;
    ingresses.create(&PostParams::default(), &good).await?;
    let controller = ControllerProcess::launch_library(env, &namespace, &work.path().join("journal"))?;
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;

    // The same Service gets hostile slices beside its good one.
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
    let slice = |name: &str, kind: &str, target: &str| -> Result<EndpointSlice> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/service-name": "svc-good"}},
            "addressType": kind,
            "ports": [{"name": "http", "port": 5555}],
            "endpoints": [{"addresses": [target], "conditions": {"ready": true}}]
        }))?)
    };
    for (name, target) in [("svc-good-loopback", "127.0.0.1"), ("svc-good-metadata", "169.254.169.254")] {
        match slices.create(&PostParams::default(), &slice(name, "IPv4", target)?).await {
            Err(kube::Error::Api(refusal)) if refusal.code == 422 => {}
            other => bail!("the API server took an EndpointSlice at {target}: {other:?}"),
        }
    }
    let fqdn = "metadata.google.internal";
    slices.create(&PostParams::default(), &slice("svc-good-fqdn", "FQDN", fqdn)?).await?;
    let note = env::fixtures::refused_note(&client, &namespace, "svc-good-fqdn", WITHIN)
        .await
        .context(controller.log_tail())?;
    ensure!(note.contains("endpoints[0].addresses[0]"), "the Event does not name the field: {note}");
    ensure!(!note.contains(fqdn), "the Event quotes the value: {note}");
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    env::every_pod_answers(env, "good.example.com", "svc-good", Duration::from_millis(100)).await?;
    for pod in &env.pods {
        for (name, content) in pod_files(pod)? {
            let text = String::from_utf8_lossy(&content);
            ensure!(!text.contains(fqdn), "{}: {name} sends HAProxy to a metadata service", pod.name);
        }
    }
    Ok(())
}
