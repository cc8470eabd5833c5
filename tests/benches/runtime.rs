//! Issue #13: how fast a change is served when the Runtime API makes it, and how many reloads a
//! mix of changes costs, against live pods (the environment's real Dataplane APIs, HAProxy 2.8
//! and 2.6, the real API server and the real `haptic` binary with the chart's default library).
//! Each sample writes one change through the API server and times until a request through
//! every pod is answered as the change says (polled every 5 ms).
//!
//! - Route change (map only): a new host to a Service that has a backend.
//! - Server change (runtime): an endpoint added to a Service, in a free slot of its backend.
//! - Reload path: a new host to a Service without a backend (samples 2.1 s apart, past the
//!   reload pace).
//! - Reloads per 100 mixed changes (new hosts, route moves and removals, scale steps, routes
//!   to new Services), with the chart's library and with the example templates
//!   (`docs/examples/config.yaml`: a backend per route, no runtime routing) for comparison.
//!
//! Run with `cargo bench --bench runtime` (20 samples each, `-- N` for another count); the
//! environment must be up (`make env-up`).

#[path = "../env/mod.rs"]
mod env;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use env::controller::{ControllerProcess, Launch, create_test_config, ensure_haptic_crd};
use env::standalone::{
    apply_library_config_for_pods, backend_host_address, endpoint_slice, ingress_to, library_namespace,
    service_with_endpoints, start_backends,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const BACKEND: u16 = 18950;
/// The mix's Services' endpoints: m0, m1, m2, and m0's second.
const MIX_BACKEND: u16 = 18960;
/// Past the debouncer's quiet window (500 ms): a change after it renders at once (the leading
/// edge), as an operator's single change does; changes closer together are coalesced on
/// purpose, and a sample would time that wait, not the path.
const QUIET: Duration = Duration::from_millis(700);

async fn served(env: &env::Manifest, host: &str, backend: &str) -> Result<()> {
    env::every_pod_answers(env, host, backend, Duration::from_millis(5)).await
}

/// Waits as `served` does, and keeps each pod's time: the sample is the slowest pod's.
async fn served_each(
    env: &env::Manifest,
    host: &str,
    backend: &str,
    per_pod: &mut Vec<Vec<Duration>>,
) -> Result<Duration> {
    let times = env::every_pod_answers_each(env, host, backend, Duration::from_millis(5)).await?;
    let slowest = times.iter().copied().max().unwrap_or_default();
    per_pod.push(times);
    Ok(slowest)
}

/// The mix: 100 changes of every kind an operator makes, the same list for both configurations.
#[derive(Clone, Debug)]
enum Change {
    NewHost(usize, usize),
    MoveRoute(usize, usize),
    RemoveRoute(usize),
    Scale(bool),
    NewService(usize),
}

fn mix() -> Vec<Change> {
    let mut state = 0x13_u64;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as usize % n
    };
    let mut routes: Vec<bool> = vec![false; 20];
    let mut scaled = false;
    let mut new_services = 0;
    let mut changes = Vec::new();
    while changes.len() < 100 {
        let slot = next(routes.len());
        let change = match next(10) {
            0..=3 if !routes[slot] => Change::NewHost(slot, next(3)),
            0..=5 if routes[slot] => Change::MoveRoute(slot, next(3)),
            6 if routes[slot] => Change::RemoveRoute(slot),
            7 | 8 => Change::Scale(!scaled),
            9 if new_services < 10 => Change::NewService(new_services),
            _ => continue,
        };
        match &change {
            Change::NewHost(slot, _) => routes[*slot] = true,
            Change::RemoveRoute(slot) => routes[*slot] = false,
            Change::Scale(up) => scaled = *up,
            Change::NewService(_) => new_services += 1,
            Change::MoveRoute(..) => {}
        }
        changes.push(change);
    }
    changes
}

/// Applies the mix in `namespace` (whose Services `m0..m2` have backends, and `n0..n9` are
/// there without routes), each change served before the next; the reloads per pod.
async fn run_mix(
    env: &env::Manifest,
    client: &kube::Client,
    namespace: &str,
    controller: &ControllerProcess,
    address: &str,
) -> Result<u64> {
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), namespace);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
    let before = env::measure::reloads_per_pod(env)?;
    for change in mix() {
        match change {
            Change::NewHost(slot, service) | Change::MoveRoute(slot, service) => {
                let name = format!("r{slot}");
                let wanted = ingress_to(&name, &format!("r{slot}.mix.example"), &format!("m{service}"))?;
                if ingresses.get_opt(&name).await?.is_some() {
                    let spec = json!({"spec": serde_json::to_value(&wanted)?["spec"].clone()});
                    ingresses.patch(&name, &PatchParams::default(), &Patch::Merge(spec)).await?;
                } else {
                    ingresses.create(&PostParams::default(), &wanted).await?;
                }
            }
            Change::RemoveRoute(slot) => {
                ingresses.delete(&format!("r{slot}"), &DeleteParams::default()).await?;
            }
            Change::Scale(true) => {
                slices
                    .create(&PostParams::default(), &endpoint_slice("m0-extra", "m0", address, MIX_BACKEND + 3)?)
                    .await?;
            }
            Change::Scale(false) => {
                slices.delete("m0-extra", &DeleteParams::default()).await?;
            }
            Change::NewService(i) => {
                let ingress = ingress_to(&format!("n{i}"), &format!("n{i}.mix.example"), &format!("n{i}"))?;
                ingresses.create(&PostParams::default(), &ingress).await?;
            }
        }
        // Each change deployed everywhere before the next (renders in between would coalesce).
        tokio::time::sleep(QUIET).await;
        controller.wait_all_in_sync(env.pods.len(), Duration::from_secs(60)).await?;
    }
    Ok(env::measure::reloads_per_pod(env)? - before)
}

/// The Services of the mix: `m0..m2` (with routes, so with backends; each its own endpoint)
/// and `n0..n9`.
async fn mix_services(client: &kube::Client, namespace: &str, address: &str) -> Result<()> {
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), namespace);
    for i in 0..3 {
        service_with_endpoints(client, namespace, &format!("m{i}"), address, MIX_BACKEND + i).await?;
        let ingress = ingress_to(&format!("m{i}"), &format!("m{i}.mix.example"), &format!("m{i}"))?;
        ingresses.create(&PostParams::default(), &ingress).await?;
    }
    for i in 0..10 {
        service_with_endpoints(client, namespace, &format!("n{i}"), address, BACKEND).await?;
    }
    Ok(())
}

/// The example templates, placed for the environment's pods (their address, their storage
/// and runtime socket below /var/run/haproxy, the HTTP port 8080, a `maxconn` their file limit
/// allows) and watching `namespace`.
fn example_spec(namespace: &str) -> Result<serde_json::Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/examples/config.yaml");
    let config = haptic::offline::load_config(&path)?;
    let mut spec = serde_json::to_value(&config.spec)?;
    spec["podSelector"] = json!({"matchLabels": {"app.kubernetes.io/name": "haproxy"}});
    for resource in ["ingresses", "services", "endpoints"] {
        spec["watchedResources"][resource]["namespaces"] = json!([namespace]);
    }
    spec["dataplane"]["mapsDir"] = json!("/var/run/haproxy/maps");
    spec["dataplane"]["generalDir"] = json!("/var/run/haproxy/general");
    spec["dataplane"]["credentialsSecretRef"] = json!({"name": "dataplane"});
    spec["templates"]["extraContext"]["httpBind"] = json!("\"${POD_IP}\":8080");
    // The environment's processes may open 20,000 files; 20,000 connections need twice that.
    spec["templates"]["extraContext"]["maxconn"] = json!(2000);
    let config = spec["templates"]["haproxyConfig"].as_str().context("haproxyConfig")?;
    spec["templates"]["haproxyConfig"] =
        json!(config.replace("/var/run/haproxy-runtime.sock", "/var/run/haproxy/runtime.sock"));
    Ok(spec)
}

#[tokio::main]
async fn main() -> Result<()> {
    let samples: usize = std::env::args().skip(1).find_map(|arg| arg.parse().ok()).unwrap_or(20);
    let env = env::environment();
    let client = env.kube_client().await?;
    let work = tempfile::tempdir()?;
    let address = backend_host_address()?;
    let _backends = start_backends(
        work.path(),
        &address,
        &[
            ("web-a".into(), BACKEND),
            ("web-b".into(), BACKEND + 1),
            ("fresh".into(), BACKEND + 2),
            ("m0".into(), MIX_BACKEND),
            ("m1".into(), MIX_BACKEND + 1),
            ("m2".into(), MIX_BACKEND + 2),
            ("m0".into(), MIX_BACKEND + 3),
        ],
    )?;

    // The chart's library.
    let namespace = library_namespace(env, &client, "bench-runtime").await?;
    service_with_endpoints(&client, &namespace, "web", &address, BACKEND).await?;
    for i in 0..samples {
        service_with_endpoints(&client, &namespace, &format!("fresh{i}"), &address, BACKEND + 2).await?;
    }
    mix_services(&client, &namespace, &address).await?;
    apply_library_config_for_pods(&client, &namespace, "bench").await?;
    let controller = ControllerProcess::launch_library(env, &namespace, &work.path().join("journal"))?;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    let ingress = |host: &str, service: &str| ingress_to(&host.replace('.', "-"), host, service);
    ingresses.create(&PostParams::default(), &ingress("warm.bench.example", "web")?).await?;
    served(env, "warm.bench.example", "web-a").await.with_context(|| controller.log_tail())?;
    controller.wait_all_in_sync(env.pods.len(), Duration::from_secs(60)).await?;

    let (mut route_samples, mut route_pods) = (Vec::new(), Vec::new());
    let before = env::measure::reloads_per_pod(env)?;
    for i in 0..samples {
        let host = format!("route{i}.bench.example");
        tokio::time::sleep(QUIET).await;
        let started = Instant::now();
        ingresses.create(&PostParams::default(), &ingress(&host, "web")?).await?;
        let written = started.elapsed();
        let slowest = served_each(env, &host, "web-a", &mut route_pods).await.with_context(|| controller.log_tail())?;
        route_samples.push(written + slowest);
        controller.wait_all_in_sync(env.pods.len(), Duration::from_secs(60)).await?;
    }
    let route_reloads = env::measure::reloads_per_pod(env)? - before;

    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
    let (mut server_samples, mut server_pods) = (Vec::new(), Vec::new());
    let before = env::measure::reloads_per_pod(env)?;
    for _ in 0..samples {
        tokio::time::sleep(QUIET).await;
        let started = Instant::now();
        slices.create(&PostParams::default(), &endpoint_slice("web-b", "web", &address, BACKEND + 1)?).await?;
        let written = started.elapsed();
        // Round robin between the two: web-b answers once its server takes traffic.
        let slowest = served_each(env, "warm.bench.example", "web-b", &mut server_pods)
            .await
            .with_context(|| controller.log_tail())?;
        server_samples.push(written + slowest);
        controller.wait_all_in_sync(env.pods.len(), Duration::from_secs(60)).await?;
        slices.delete("web-b", &DeleteParams::default()).await?;
        tokio::time::sleep(QUIET).await;
        controller.wait_all_in_sync(env.pods.len(), Duration::from_secs(60)).await?;
    }
    let server_reloads = env::measure::reloads_per_pod(env)? - before;

    let (mut reload_samples, mut reload_pods) = (Vec::new(), Vec::new());
    let before = env::measure::reloads_per_pod(env)?;
    for i in 0..samples {
        let host = format!("fresh{i}.bench.example");
        let started = Instant::now();
        ingresses.create(&PostParams::default(), &ingress(&host, &format!("fresh{i}"))?).await?;
        let written = started.elapsed();
        let slowest =
            served_each(env, &host, "fresh", &mut reload_pods).await.with_context(|| controller.log_tail())?;
        reload_samples.push(written + slowest);
        controller.wait_all_in_sync(env.pods.len(), Duration::from_secs(60)).await?;
        tokio::time::sleep(Duration::from_millis(2100)).await;
    }
    let reload_path_reloads = env::measure::reloads_per_pod(env)? - before;
    let library_mix = run_mix(env, &client, &namespace, &controller, &address).await?;
    drop(controller);

    // The example templates, the same mix.
    ensure_haptic_crd(&client).await?;
    let example = env.fresh_namespace(&client, "bench-example").await?;
    env::fixtures::dataplane_secret(&client, &example, &env.dataplane.username, &env.dataplane.password).await?;
    mix_services(&client, &example, &address).await?;
    create_test_config(&client, &example, example_spec(&example)?).await?;
    let example_dir = tempfile::tempdir()?;
    let journal = example_dir.path().join("journal");
    let controller = ControllerProcess::launch(env, &example, "test", example_dir, &journal, &Launch::default())?;
    controller.wait_all_in_sync(env.pods.len(), Duration::from_secs(60)).await?;
    served(env, "m0.mix.example", "m0").await.with_context(|| controller.log_tail())?;
    let example_mix = run_mix(env, &client, &example, &controller, &address).await?;

    println!("{} live pods (HAProxy {})", env.pods.len(), {
        let versions: Vec<&str> = env.pods.iter().map(|p| p.haproxy_version.as_str()).collect();
        versions.join(", ")
    });
    let per_pod = |reloads: u64| format!("reloads per pod {reloads}");
    let print = env::measure::print_samples;
    print("Route change (map only) -> served on all pods", route_samples, &per_pod(route_reloads));
    print("Server change (endpoint into a free slot) -> served on all pods", server_samples, &per_pod(server_reloads));
    print("Reload path (route to a new Service) -> served on all pods", reload_samples, &per_pod(reload_path_reloads));
    let names: Vec<String> = env.pods.iter().map(|pod| pod.name.clone()).collect();
    let spread = env::measure::print_pod_spread;
    spread("Route change", &route_pods, &names);
    spread("Server change", &server_pods, &names);
    spread("Reload path", &reload_pods, &names);
    let kinds = mix().iter().fold([0usize; 5], |mut counts, change| {
        counts[match change {
            Change::NewHost(..) => 0,
            Change::MoveRoute(..) => 1,
            Change::RemoveRoute(_) => 2,
            Change::Scale(_) => 3,
            Change::NewService(_) => 4,
        }] += 1;
        counts
    });
    println!(
        "100 mixed changes ({} new hosts, {} route moves, {} removals, {} scale steps, {} routes to new Services): \
         reloads per pod: chart library {library_mix}, example templates {example_mix}",
        kinds[0], kinds[1], kinds[2], kinds[3], kinds[4]
    );
    Ok(())
}
