//! Issue #15 (part): `status.loadBalancer` on the Ingresses the chart's configuration serves,
//! written by the real controller on the real API server: served Ingresses get the configured
//! address, an Ingress of another class gets none, one moved to another class loses it, and a
//! refused one (a hostile path) gets none.

mod env;

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use env::controller::{ControllerProcess, Launch};
use env::standalone::{apply_library_config_with, ingress_to};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const ADDRESS: &str = "192.0.2.44";

async fn addresses(ingresses: &Api<Ingress>, name: &str) -> Result<Vec<String>> {
    let ingress = ingresses.get(name).await?;
    Ok(ingress
        .status
        .and_then(|s| s.load_balancer)
        .and_then(|lb| lb.ingress)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|i| i.ip.or(i.hostname))
        .collect())
}

async fn wait_for(ingresses: &Api<Ingress>, name: &str, expected: &[&str]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = addresses(ingresses, name).await?;
        if got == expected {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "Ingress {name}: status says {got:?}, not {expected:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn served_ingresses_carry_the_load_balancer_address_and_others_do_not() -> Result<()> {
    let env = env::environment();
    let client = env.kube_client().await?;
    env::chart::apply_chart_crd(&client).await?;
    let namespace = env.fresh_namespace(&client, "ingress-status").await?;
    let work = tempfile::tempdir()?;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    ingresses.create(&PostParams::default(), &ingress_to("served", "served.example.com", "svc")?).await?;
    ingresses.create(&PostParams::default(), &ingress_to("moving", "moving.example.com", "svc")?).await?;
    let mut other = ingress_to("other", "other.example.com", "svc")?;
    if let Some(spec) = other.spec.as_mut() {
        spec.ingress_class_name = Some("nginx".into());
    }
    ingresses.create(&PostParams::default(), &other).await?;
    let hostile: Ingress = serde_json::from_value(json!({
        "metadata": {"name": "hostile"},
        "spec": {"ingressClassName": "haproxy", "rules": [{"host": "hostile.example.com", "http": {"paths": [
            {"path": "/x be_default", "pathType": "ImplementationSpecific",
             "backend": {"service": {"name": "svc", "port": {"number": 80}}}}]}}]}
    }))?;
    ingresses.create(&PostParams::default(), &hostile).await?;
    apply_library_config_with(
        &client,
        &namespace,
        "status",
        "127.1.3.3",
        work.path(),
        &[("ingressClass.statusAddresses", format!("{{{ADDRESS}}}"))],
    )
    .await?;
    let launch = Launch { args: vec!["--render-only".into()], ..Launch::default() };
    let controller_dir = tempfile::tempdir()?;
    let journal = controller_dir.path().join("journal");
    let _controller = ControllerProcess::launch(env, &namespace, "haptic", controller_dir, &journal, &launch)?;

    wait_for(&ingresses, "served", &[ADDRESS]).await?;
    wait_for(&ingresses, "moving", &[ADDRESS]).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    ensure!(addresses(&ingresses, "other").await?.is_empty(), "an Ingress of another class got an address");
    ensure!(addresses(&ingresses, "hostile").await?.is_empty(), "a refused Ingress got an address");

    // Moved to another class: the address goes.
    let patch = json!({"spec": {"ingressClassName": "nginx"}});
    ingresses.patch("moving", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    wait_for(&ingresses, "moving", &[]).await?;
    ensure!(addresses(&ingresses, "served").await? == [ADDRESS], "the served Ingress lost its address");
    Ok(())
}
