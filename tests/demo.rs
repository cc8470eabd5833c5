//! `make demo`: the controller's main job end to end on the local environment. An Ingress
//! names which backend serves a host; the real controller renders the chart's default
//! configuration from it and deploys it to every HAProxy pod through the pod's Dataplane API;
//! a request through each pod's HAProxy reaches that backend. Then the Ingress changes and the
//! pods follow. `make test` runs it like any test; `make demo` runs it with `--nocapture` to
//! show its lines.

mod env;

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use env::controller::{ControllerProcess, Launch};
use env::standalone::{
    apply_library_config_for_pods, backend_host_address, library_namespace, service_with_endpoints, start_backends,
};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

fn say(line: &str) {
    println!("demo: {line}");
}

async fn ask(http: &reqwest::Client, address: &str, host: &str) -> Result<String> {
    let answer = http.get(format!("http://{address}/hello")).header("Host", host).send().await?;
    Ok(format!("{} {}", answer.status().as_u16(), answer.text().await?.trim()))
}

/// Asks every pod until each answers from `backend`.
async fn until_every_pod_answers(http: &reqwest::Client, env: &env::Manifest, backend: &str) -> Result<()> {
    for pod in &env.pods {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let answer = ask(http, &pod.http_address, "shop.demo.example").await.unwrap_or_else(|e| e.to_string());
            if answer.contains(&format!("backend={backend}")) {
                say(&format!(
                    "GET http://shop.demo.example/hello via {} (HAProxy {}) -> {answer}",
                    pod.name, pod.haproxy_version
                ));
                break;
            }
            ensure!(Instant::now() < deadline, "{} did not answer from {backend}: {answer}", pod.name);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

#[tokio::test]
async fn demo() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "demo").await?;
    let address = backend_host_address()?;
    let work = tempfile::tempdir()?;
    let backends = [("blue".to_owned(), 18260), ("green".to_owned(), 18261)];
    let _backends = start_backends(work.path(), &address, &backends)?;
    for (name, port) in &backends {
        service_with_endpoints(&client, &namespace, name, &address, *port).await?;
    }
    say(&format!("Services blue and green in namespace {namespace}, backends on {address}:18260/18261"));
    apply_library_config_for_pods(&client, &namespace, "demo").await?;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    let ingress: Ingress = serde_json::from_value(json!({
        "metadata": {"name": "shop"},
        "spec": {"ingressClassName": "haproxy", "rules": [{"host": "shop.demo.example", "http": {"paths": [
            {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "blue", "port": {"number": 80}}}}]}}]}
    }))?;
    ingresses.create(&PostParams::default(), &ingress).await?;
    say("Ingress shop: host shop.demo.example -> Service blue");

    let dir_controller = tempfile::tempdir()?;
    let journal = dir_controller.path().join("journal");
    let controller =
        ControllerProcess::launch(env, &namespace, "haptic", dir_controller, &journal, &Launch::default())?;
    let api = controller.api_url().await?;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let first = until_every_pod_answers(&http, env, "blue").await;
    if first.is_err() {
        let pods = controller.pods_view().await.unwrap_or_default();
        first.with_context(|| format!("{pods:#?}\n{}", controller.log_tail()))?;
    }

    let switch = Patch::Merge(json!({"spec": {"rules": [{"host": "shop.demo.example", "http": {"paths": [
        {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "green", "port": {"number": 80}}}}]}}]}}));
    ingresses.patch("shop", &PatchParams::default(), &switch).await?;
    say("Ingress shop changed: -> Service green");
    until_every_pod_answers(&http, env, "green").await.with_context(|| controller.log_tail())?;
    let unknown = ask(&http, &env.pods[0].http_address, "nowhere.demo.example").await?;
    say(&format!("GET http://nowhere.demo.example/hello -> {unknown}"));

    let pods = controller.wait_all_in_sync(env.pods.len(), Duration::from_secs(30)).await?;
    for pod in &pods {
        let (name, state) = (pod["name"].as_str().unwrap_or("?"), pod["state"].as_str().unwrap_or("?"));
        say(&format!("{name} is {state} in haptic's API (GET {api}/api/v1/pods)"));
    }
    say("done: the Ingress chose the backend, haptic deployed it through each pod's Dataplane API, HAProxy served it");
    Ok(())
}
