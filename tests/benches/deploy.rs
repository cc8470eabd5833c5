//! Change → served, against live pods: the environment's real Dataplane APIs and HAProxy 2.8
//! and 2.6 pods, the real API server and the real `haptic` binary with the chart's default
//! library. Each sample writes one change through the API server and times until a request
//! through every pod is answered as the change says (polled every 5 ms).
//!
//! - Ingress change: a new host routed to the Service (which has a backend: map entries through
//!   the Runtime API, no reload, since issue #13; `cargo bench --bench runtime` has the reload
//!   path).
//! - EndpointSlice change: the Service's endpoint moves to another port (its server keeps its
//!   slot: a runtime change on HAProxy 2.8; on 2.6 a serving server moves with a reload).
//!
//! Run with `cargo bench --bench deploy` (20 samples each, `-- N` for another count); it
//! starts the environment if it is not running (`make env-up` style, state in target/test-env).

#[path = "../env/mod.rs"]
mod env;

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use env::controller::ControllerProcess;
use env::standalone::{
    apply_library_config_for_pods, backend_host_address, ingress_to, library_namespace, service_with_endpoints,
    start_backends,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

async fn until_served(env: &env::Manifest, host: &str, backend: &str) -> Result<()> {
    env::every_pod_answers(env, host, backend, Duration::from_millis(5)).await
}

#[tokio::main]
async fn main() -> Result<()> {
    let samples: usize = std::env::args().skip(1).find_map(|arg| arg.parse().ok()).unwrap_or(20);
    let env = env::environment();
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "bench-deploy").await?;
    let work = tempfile::tempdir()?;
    let address = backend_host_address()?;
    let _backends = start_backends(work.path(), &address, &[("web-a".into(), 18400), ("web-b".into(), 18401)])?;
    service_with_endpoints(&client, &namespace, "web", &address, 18400).await?;
    apply_library_config_for_pods(&client, &namespace, "bench").await?;
    let controller = ControllerProcess::launch_library(env, &namespace, &work.path().join("journal"))?;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    let ingress = |host: &str| ingress_to(&host.replace('.', "-"), host, "web");
    ingresses.create(&PostParams::default(), &ingress("warm.bench.example")?).await?;
    until_served(env, "warm.bench.example", "web-a").await.with_context(|| controller.log_tail())?;
    controller.wait_all_in_sync(env.pods.len(), Duration::from_secs(60)).await?;

    let mut ingress_samples = Vec::new();
    let reloads_before = env::measure::reloads_per_pod(env)?;
    for i in 0..samples {
        let host = format!("h{i}.bench.example");
        let started = Instant::now();
        ingresses.create(&PostParams::default(), &ingress(&host)?).await?;
        until_served(env, &host, "web-a").await.with_context(|| controller.log_tail())?;
        ingress_samples.push(started.elapsed());
        controller.wait_all_in_sync(env.pods.len(), Duration::from_secs(60)).await?;
        // Past the reload pace (minDeploymentInterval, 2 s): each sample times the path, not
        // the wait a change right after a reload is given on purpose.
        tokio::time::sleep(Duration::from_millis(2100)).await;
    }
    let ingress_reloads = env::measure::reloads_per_pod(env)? - reloads_before;

    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
    let mut slice_samples = Vec::new();
    let reloads_before = env::measure::reloads_per_pod(env)?;
    for i in 0..samples {
        let (port, backend) = if i % 2 == 0 { (18401, "web-b") } else { (18400, "web-a") };
        // The 2.6 pod reloads for this change: past its reload pace, as above.
        tokio::time::sleep(Duration::from_millis(2100)).await;
        let started = Instant::now();
        let patch = json!({"ports": [{"name": "http", "port": port}]});
        slices.patch("web-1", &PatchParams::default(), &Patch::Merge(patch)).await?;
        until_served(env, "warm.bench.example", backend).await.with_context(|| controller.log_tail())?;
        slice_samples.push(started.elapsed());
        controller.wait_all_in_sync(env.pods.len(), Duration::from_secs(60)).await?;
    }
    let slice_reloads = env::measure::reloads_per_pod(env)? - reloads_before;

    println!("{} live pods (HAProxy {}), chart's default library", env.pods.len(), {
        let versions: Vec<&str> = env.pods.iter().map(|p| p.haproxy_version.as_str()).collect();
        versions.join(", ")
    });
    let per_change = |reloads: u64| format!("reloads per pod per change {:.2}", reloads as f64 / samples as f64);
    env::measure::print_samples(
        "Ingress change (new host) -> served on all pods",
        ingress_samples,
        &per_change(ingress_reloads),
    );
    env::measure::print_samples(
        "EndpointSlice change (endpoint port) -> served on all pods",
        slice_samples,
        &per_change(slice_reloads),
    );
    Ok(())
}
