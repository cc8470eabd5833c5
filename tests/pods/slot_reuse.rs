//! Free server slots reused under keep-alive (issue #45, defect 12), live with the chart's
//! library on every HAProxy version of the environment: a Service scaled between 1 and 10
//! endpoints over 20 steps, each step moving endpoints to addresses no slot held before, while
//! keep-alive requests flow through every pod. A slot whose departed endpoint still holds idle
//! connections cannot be deleted at run time; its address is then changed in place. No pod
//! reloads, and every step is served.

use crate::env;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Result, ensure};
use env::controller::{ControllerProcess, every_pod_runs, rendered};
use env::standalone::{
    apply_library_config_for_pods, backend_host_address, ingress_to, library_namespace, service_with_endpoints,
    start_backends,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const WITHIN: Duration = Duration::from_secs(60);
const FIRST_PORT: u16 = 18700;
/// Endpoints each step may use: more than the most at once, so a step brings new addresses.
const PORTS: u16 = 14;
const HOST: &str = "scaled.slots.example";
/// Endpoints after each step: up and down between 1 and 10.
const STEPS: [usize; 20] = [3, 7, 10, 4, 1, 6, 9, 2, 8, 5, 10, 3, 1, 7, 4, 9, 2, 6, 10, 1];

#[tokio::test]
async fn twenty_scale_steps_under_keep_alive_reload_no_pod() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "slot-reuse").await?;
    let work = tempfile::tempdir()?;
    let address = backend_host_address()?;
    let specs: Vec<(String, u16)> = (0..PORTS).map(|i| ("scaled".to_owned(), FIRST_PORT + i)).collect();
    let _backends = start_backends(work.path(), &address, &specs)?;
    service_with_endpoints(&client, &namespace, "scaled", &address, FIRST_PORT).await?;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    ingresses.create(&PostParams::default(), &ingress_to("scaled", HOST, "scaled")?).await?;
    apply_library_config_for_pods(&client, &namespace, "slot-reuse").await?;
    let controller = ControllerProcess::launch_library(env, &namespace, &work.path().join("journal"))?;
    let pods = env.pods.len();
    controller.wait_all_in_sync(pods, WITHIN).await?;
    env::every_pod_answers(env, HOST, "scaled", Duration::from_millis(100)).await?;
    let mut render = rendered(&controller)?;
    every_pod_runs(&controller, pods, &render, WITHIN).await?;

    // Keep-alive requests through every pod, all along: HAProxy keeps idle connections to the
    // endpoints, which is what stops a departed endpoint's slot from being deleted.
    let stop = Arc::new(AtomicBool::new(false));
    let (answered, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut traffic = Vec::new();
    for pod in &env.pods {
        let (stop, answered, failed, failures) = (stop.clone(), answered.clone(), failed.clone(), failures.clone());
        let pod_name = format!("{} (HAProxy {})", pod.name, pod.haproxy_version);
        let url = format!("http://{}/hello", pod.http_address);
        traffic.push(tokio::spawn(async move {
            let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).pool_max_idle_per_host(4).build();
            let Ok(http) = http else { return };
            while !stop.load(Ordering::Relaxed) {
                let failure = match http.get(&url).header("Host", HOST).send().await {
                    Ok(response) if response.status().is_success() => None,
                    Ok(response) => Some(format!("answered {}", response.status())),
                    Err(error) => Some(format!("{error:?}")),
                };
                if let Some(failure) = failure {
                    failed.fetch_add(1, Ordering::Relaxed);
                    let at = unix_time();
                    if let Ok(mut failures) = failures.lock() {
                        failures.push(format!("{pod_name} at {at}: {failure}"));
                    }
                } else {
                    answered.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    let mut before = Vec::new();
    for pod in &env.pods {
        before.push(pod.reloads()?);
    }
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
    let mut next_port = 1u16;
    for (step, count) in STEPS.iter().enumerate() {
        // Each step keeps some endpoints and brings new ones at ports not used just before.
        let ports: Vec<u16> = (0..*count as u16).map(|i| FIRST_PORT + (next_port + i) % PORTS).collect();
        next_port = (next_port + (*count as u16).div_ceil(2)) % PORTS;
        // Endpoints on one address differ by port, which a slice holds once: a slice each.
        let names: Vec<String> = ports.iter().map(|port| format!("scaled-{port}")).collect();
        // The new endpoints first, then the old ones go: the Service is never empty.
        for (port, name) in ports.iter().zip(&names) {
            let slice: EndpointSlice = serde_json::from_value(json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": name, "labels": {"kubernetes.io/service-name": "scaled"}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": port}],
                "endpoints": [{"addresses": [address], "conditions": {"ready": true}}]
            }))?;
            slices.patch(name, &PatchParams::apply("slot-reuse").force(), &Patch::Apply(&slice)).await?;
        }
        for existing in slices.list(&Default::default()).await?.items {
            let name = existing.metadata.name.clone().unwrap_or_default();
            if !names.contains(&name) {
                slices.delete(&name, &Default::default()).await?;
            }
        }
        // The step's slices arrive one by one: wait for the render that holds them all.
        let serves = |config: &str| {
            let servers = config.lines().filter(|l| l.contains(&format!(" {address}:")) && !l.contains("disabled"));
            let mut seen: Vec<u16> =
                servers.filter_map(|l| l.rsplit(':').next()?.split(' ').next()?.parse().ok()).collect();
            seen.sort_unstable();
            let mut wanted = ports.clone();
            wanted.sort_unstable();
            seen == wanted
        };
        controller.wait_for_config(&format!("step {step}'s endpoints"), WITHIN, serves).await?;
        let now = rendered(&controller)?;
        if now != render {
            render = now;
            every_pod_runs(&controller, pods, &render, WITHIN).await?;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for task in traffic {
        let _ = task.await;
    }
    let (answered, failed) = (answered.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    println!("{answered} keep-alive requests answered, {failed} failed, over {} scale steps", STEPS.len());
    ensure!(answered > 100, "too few requests flowed: {answered}");
    let failures = failures.lock().map(|f| f.join("\n")).unwrap_or_default();
    if failed > 0 {
        let _ = std::fs::copy(controller.log_path(), "/tmp/slot_reuse_controller.log");
    }
    ensure!(failed == 0, "{failed} requests failed while the Service scaled:\n{failures}");
    let metrics = reqwest::get(format!("{}/metrics", controller.api_url().await?)).await?.text().await?;
    let actions: Vec<&str> =
        metrics.lines().filter(|l| l.starts_with("haptic_runtime_actions_total{kind=\"server")).collect();
    println!("runtime server actions: {}", actions.join(", "));
    for (pod, before) in env.pods.iter().zip(before) {
        let reloads = pod.reloads()? - before;
        println!("{} (HAProxy {}): {reloads} reloads over {} scale steps", pod.name, pod.haproxy_version, STEPS.len());
        ensure!(reloads == 0, "{}: {reloads} reloads over the scale steps\n{}", pod.name, controller.log_tail());
    }
    Ok(())
}

/// Seconds since the Unix epoch, to line a failure up with the pods' logs.
fn unix_time() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("{}.{:03}", now.as_secs(), now.subsec_millis())
}
