//! Issue #14, live: Gateway API routes deployed through the real Dataplane API to the
//! environment's real HAProxy pods (2.8 and 2.6) by the real `haptic` binary and the chart's
//! library follow the same reload rules as Ingress routes: a route moved, added or removed
//! among Services that have backends, and a change of weights, reach every pod without a
//! reload; a match the maps cannot hold (a header) is a reload. Reloads are counted from each
//! pod's own HAProxy master; every change is checked by a request through every pod.

use crate::env;

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use env::controller::{ControllerProcess, every_pod_runs_next_render, rendered};
use env::gateway::{api, create, gateway_class, prefix, route, to};
use env::standalone::{
    apply_library_config_for_pods_with, backend_host_address, library_namespace, service_with_endpoints, start_backends,
};
use kube::api::{Patch, PatchParams};
use serde_json::json;

const WITHIN: Duration = Duration::from_secs(60);
const LISTENER_PORT: u16 = 18090;
const SERVICES: [&str; 2] = ["s0", "s1"];
const SERVICE_PORT: u16 = 18930;

/// What a pod answers on the listener for `host`, `path` and headers: `backend=<name>` or the status.
async fn answer(http: &reqwest::Client, pod: &env::EnvPod, host: &str, path: &str, headers: &[(&str, &str)]) -> String {
    let mut request = http.get(format!("http://{}:{LISTENER_PORT}{path}", pod.ip)).header("Host", host);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    match request.send().await {
        Ok(response) if response.status() == 200 => {
            response.text().await.unwrap_or_default().split_whitespace().next().unwrap_or_default().to_owned()
        }
        Ok(response) => response.status().as_u16().to_string(),
        Err(error) => error.to_string(),
    }
}

/// Waits until every pod answers as `expected`.
async fn every_pod_answers(
    http: &reqwest::Client,
    env: &env::Manifest,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
    expected: &str,
) -> Result<()> {
    let deadline = Instant::now() + WITHIN;
    for pod in &env.pods {
        loop {
            let got = answer(http, pod, host, path, headers).await;
            if got == expected {
                break;
            }
            ensure!(Instant::now() < deadline, "{} answered {host}{path} with {got}, not {expected}", pod.name);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

fn reloads(env: &env::Manifest) -> Result<Vec<u64>> {
    env.pods.iter().map(|pod| pod.reloads()).collect()
}

#[tokio::test]
async fn gateway_api_route_and_weight_changes_reach_every_pod_without_a_reload() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "gateway-deploy").await?;
    let work = tempfile::tempdir()?;
    let address = backend_host_address()?;
    let specs: Vec<(String, u16)> =
        SERVICES.iter().enumerate().map(|(i, name)| ((*name).to_owned(), SERVICE_PORT + i as u16)).collect();
    let _backends = start_backends(work.path(), &address, &specs)?;
    for (i, service) in SERVICES.iter().enumerate() {
        service_with_endpoints(&client, &namespace, service, &address, SERVICE_PORT + i as u16).await?;
    }

    let controller_name = format!("haptic.dev/{namespace}");
    let ns = Some(namespace.as_str());
    let class = gateway_class(&client, &namespace, &controller_name).await?;
    create(
        &client,
        "Gateway",
        ns,
        json!({"metadata": {"name": "gw"}, "spec": {"gatewayClassName": class,
        "listeners": [{"name": "web", "port": LISTENER_PORT, "protocol": "HTTP"}]}}),
    )
    .await?;
    let parent = json!({"name": "gw"});
    // Each Service keeps a plain route (so it keeps its shared backend); "moving" is the one changed.
    for (name, host, service) in [("keep0", "k0.gw.example", "s0"), ("keep1", "k1.gw.example", "s1")] {
        create(&client, "HTTPRoute", ns, route(name, parent.clone(), &[host], json!([{"backendRefs": to(service)}])))
            .await?;
    }
    create(
        &client,
        "HTTPRoute",
        ns,
        route(
            "moving",
            parent.clone(),
            &["m.gw.example"],
            json!([{"matches": [prefix("/a")], "backendRefs": to("s0")}]),
        ),
    )
    .await?;
    let weights = |a: u32, b: u32| json!([{"backendRefs": [{"name": "s0", "port": 80, "weight": a}, {"name": "s1", "port": 80, "weight": b}]}]);
    let mirror = json!([{"filters": [{"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "s1", "port": 80}}}],
                         "backendRefs": to("s0")}]);
    create(&client, "HTTPRoute", ns, route("mirrored", parent.clone(), &["mir.gw.example"], mirror)).await?;
    create(&client, "HTTPRoute", ns, route("split", parent.clone(), &["w.gw.example"], weights(1, 1))).await?;

    apply_library_config_for_pods_with(
        &client,
        &namespace,
        "gateway",
        &[
            ("gatewayAPI.enabled", "true".into()),
            ("gatewayAPI.controllerName", controller_name.clone()),
            ("gatewayAPI.gatewayClass.create", "false".into()),
            ("gatewayAPI.namespaces", format!("{{{namespace}}}")),
        ],
    )
    .await?;
    let controller = ControllerProcess::launch_library(env, &namespace, &work.path().join("journal"))?;
    let pods = env.pods.len();
    controller.wait_all_in_sync(pods, WITHIN).await?;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    every_pod_answers(&http, env, "m.gw.example", "/a/x", &[], "backend=s0").await?;
    every_pod_answers(&http, env, "k1.gw.example", "/", &[], "backend=s1").await?;
    // RequestMirror on every pod (HAProxy 2.8 and 2.6): the copy reaches s1 from each. Each probe
    // opens a connection of its own: a kept-alive one may still be served by a worker that a
    // reload is retiring, and a retiring worker starts no new task (so sends no copy).
    let fresh = reqwest::Client::builder().pool_max_idle_per_host(0).timeout(Duration::from_secs(5)).build()?;
    for pod in &env.pods {
        let mut received = false;
        for attempt in 0..5 {
            let probe = format!("/probe-{}-{attempt}", pod.name);
            let routed = answer(&fresh, pod, "mir.gw.example", &probe, &[]).await;
            ensure!(routed == "backend=s0", "{} answered the mirrored route with {routed}", pod.name);
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline && !received {
                let log = std::fs::read_to_string(work.path().join("backends.log")).unwrap_or_default();
                received = log.lines().any(|l| l.starts_with("s1: ") && l.contains(&format!("GET {probe} ")));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if received {
                break;
            }
        }
        ensure!(received, "no mirrored copy reached s1 from {} in 5 tries", pod.name);
    }
    let mut render = rendered(&controller)?;
    let before = reloads(env)?;
    let routes = api(&client, "HTTPRoute", ns);
    let patch = |rules: serde_json::Value| Patch::Merge(json!({"spec": {"rules": rules}}));

    // 1. A route moved to another path and Service: map entries only.
    routes
        .patch("moving", &PatchParams::default(), &patch(json!([{"matches": [prefix("/b")], "backendRefs": to("s1")}])))
        .await?;
    render = every_pod_runs_next_render(&controller, pods, &render, WITHIN).await?;
    every_pod_answers(&http, env, "m.gw.example", "/b/x", &[], "backend=s1").await?;
    every_pod_answers(&http, env, "m.gw.example", "/a/x", &[], "404").await?;
    ensure!(reloads(env)? == before, "moving a route reloaded a pod: {before:?} → {:?}", reloads(env)?);

    // 2. A new route to a Service that has a backend: map entries only.
    create(
        &client,
        "HTTPRoute",
        ns,
        route("added", parent.clone(), &["n.gw.example"], json!([{"backendRefs": to("s0")}])),
    )
    .await?;
    render = every_pod_runs_next_render(&controller, pods, &render, WITHIN).await?;
    every_pod_answers(&http, env, "n.gw.example", "/", &[], "backend=s0").await?;
    ensure!(reloads(env)? == before, "adding a route reloaded a pod: {before:?} → {:?}", reloads(env)?);

    // 3. Weights 1:1 → 3:1: server weights, through the Runtime API.
    let config = std::fs::read_to_string(controller.render_dir.join("haproxy.cfg"))?;
    routes.patch("split", &PatchParams::default(), &patch(weights(3, 1))).await?;
    render = every_pod_runs_next_render(&controller, pods, &render, WITHIN).await?;
    let changed = std::fs::read_to_string(controller.render_dir.join("haproxy.cfg"))?;
    ensure!(
        changed != config && changed.contains("weight 85"),
        "the weights did not reach the configuration:\n{changed}"
    );
    let mut counts = [0u32; 2];
    for _ in 0..40 {
        match answer(&http, &env.pods[0], "w.gw.example", "/", &[]).await.as_str() {
            "backend=s0" => counts[0] += 1,
            "backend=s1" => counts[1] += 1,
            other => anyhow::bail!("the split route answered {other}"),
        }
    }
    ensure!((28..=32).contains(&counts[0]), "3:1 weights over 40 requests gave {counts:?}");
    ensure!(reloads(env)? == before, "changing weights reloaded a pod: {before:?} → {:?}", reloads(env)?);

    // 4. A header match: an ACL in the configuration, so a reload (one per pod).
    routes
        .patch("moving", &PatchParams::default(), &patch(json!([
            {"matches": [prefix("/b")], "backendRefs": to("s1")},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/b"}, "headers": [{"name": "x-canary", "value": "1"}]}],
             "backendRefs": to("s0")},
        ])))
        .await?;
    every_pod_runs_next_render(&controller, pods, &render, WITHIN).await?;
    every_pod_answers(&http, env, "m.gw.example", "/b/x", &[("x-canary", "1")], "backend=s0").await?;
    every_pod_answers(&http, env, "m.gw.example", "/b/x", &[], "backend=s1").await?;
    let after = reloads(env)?;
    let grew: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    ensure!(grew.iter().all(|g| *g == 1), "a header match should reload each pod once, got {grew:?}");
    let status = env::gateway::status_of(&client, "HTTPRoute", ns, "moving").await?;
    ensure!(status["parents"][0]["conditions"][0]["status"] == "True", "the moved route is not Accepted: {status}");
    Ok(())
}
