//! `make demo`: the controller's main job end to end on the local environment. An Ingress
//! names which backend serves a host; the real controller renders the chart's default
//! configuration from it; a request through HAProxy reaches that backend.
//!
//! Deployment to HAProxy pods goes through their Dataplane API. Where it cannot be built
//! (docs/environment.md) the demo says BLOCKED and loads the controller's render into a real
//! HAProxy itself, by copy and master-CLI reload, so the rest of the story still shows.
//! `make test` runs it like any test; `make demo` runs it with `--nocapture` to show its lines.

mod env;

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use env::chart::haproxy_binaries;
use env::controller::{ControllerProcess, Launch};
use env::standalone::{
    Haproxy, apply_library_config, install_render, own_address, service_with_endpoints, start_backends,
};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const FRONTEND: &str = "127.0.3.1";

fn say(line: &str) {
    println!("demo: {line}");
}

async fn ask(http: &reqwest::Client, host: &str) -> Result<String> {
    let answer = http.get(format!("http://{FRONTEND}:8080/hello")).header("Host", host).send().await?;
    Ok(format!("{} {}", answer.status().as_u16(), answer.text().await?.trim()))
}

#[tokio::test]
async fn demo() -> Result<()> {
    let env = env::environment();
    let client = env.kube_client().await?;
    env::chart::apply_chart_crd(&client).await?;
    let namespace = env.fresh_namespace(&client, "demo").await?;
    let address = own_address()?;
    let work = tempfile::tempdir()?;
    let dir = work.path().to_owned();
    let backends = [("blue".to_owned(), 18200), ("green".to_owned(), 18201)];
    let _backends = start_backends(&dir, &address, &backends)?;
    for (name, port) in &backends {
        service_with_endpoints(&client, &namespace, name, &address, *port).await?;
    }
    say(&format!("Services blue and green in namespace {namespace}, backends on {address}:18200/18201"));
    apply_library_config(&client, &namespace, "demo", FRONTEND, &dir).await?;
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
    let within = Duration::from_secs(60);
    controller.wait_for_config("the first render", within, |cfg| cfg.contains("shop.demo.example")).await?;
    say(&format!("haptic rendered haproxy.cfg, maps and files (render directory {})", controller.render_dir.display()));
    if !env.dataplane.available {
        say(&format!(
            "BLOCKED: deployment through the Dataplane API: {}",
            env.dataplane.blocked_reason.as_deref().unwrap_or("unavailable")
        ));
        say("loading the render into a real HAProxy 2.8 by copy instead");
    }
    install_render(&controller, &dir, &namespace, &Default::default())?;
    let binary = haproxy_binaries()?.into_iter().next().context("HAProxy 2.8")?;
    let haproxy = Haproxy::start(&binary, &dir, FRONTEND)?;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let first = ask(&http, "shop.demo.example").await?;
    say(&format!("GET http://shop.demo.example/hello via HAProxy {FRONTEND}:8080 -> {first}"));
    ensure!(first.contains("backend=blue"), "the Ingress's backend did not answer: {first}\n{}", haproxy.log());

    let switch = Patch::Merge(json!({"spec": {"rules": [{"host": "shop.demo.example", "http": {"paths": [
        {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "green", "port": {"number": 80}}}}]}}]}}));
    ingresses.patch("shop", &PatchParams::default(), &switch).await?;
    say("Ingress shop changed: -> Service green");
    controller.wait_for_config("the change", within, |cfg| cfg.contains(":18201")).await?;
    install_render(&controller, &dir, &namespace, &Default::default())?;
    haproxy.reload()?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = ask(&http, "shop.demo.example").await?;
    say(&format!("GET http://shop.demo.example/hello via HAProxy {FRONTEND}:8080 -> {second}"));
    ensure!(second.contains("backend=green"), "the changed Ingress's backend did not answer: {second}");
    let unknown = ask(&http, "nowhere.demo.example").await?;
    say(&format!("GET http://nowhere.demo.example/hello -> {unknown}"));
    say("done: the Ingress chose the backend, haptic rendered it, HAProxy served it");
    Ok(())
}
