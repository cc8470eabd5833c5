//! Issue #15 (part): `status.loadBalancer` on the Ingresses the chart's configuration serves,
//! written by the real controller on the real API server: served Ingresses get the configured
//! address, an Ingress of another class gets none, one moved to another class loses it, and a
//! refused one (a hostile path) gets none, and a status another writer changed is written back.

use crate::env;

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
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
    let controller = ControllerProcess::launch(env, &namespace, "haptic", controller_dir, &journal, &launch)?;

    wait_for(&ingresses, "served", &[ADDRESS]).await.with_context(|| controller.log_tail())?;
    wait_for(&ingresses, "moving", &[ADDRESS]).await?;
    env::holds_throughout(
        Duration::from_secs(1),
        "an Ingress of another class, or a refused one, got an address",
        || async {
            Ok(addresses(&ingresses, "other").await?.is_empty() && addresses(&ingresses, "hostile").await?.is_empty())
        },
    )
    .await?;

    // Another writer changes a served Ingress's status: only an ignored field changed (the
    // chart's `ignoreFields: ["status"]`), no render follows, and the status writer puts it back.
    let overwrite = json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.99"}]}}});
    ingresses.patch_status("served", &PatchParams::default(), &Patch::Merge(&overwrite)).await?;
    wait_for(&ingresses, "served", &[ADDRESS]).await.context("a status another writer changed is written back")?;

    // Moved to another class: the address goes.
    let patch = json!({"spec": {"ingressClassName": "nginx"}});
    ingresses.patch("moving", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    wait_for(&ingresses, "moving", &[]).await?;
    ensure!(addresses(&ingresses, "served").await? == [ADDRESS], "the served Ingress lost its address");
    Ok(())
}

/// The field managers that wrote an Ingress's status (`haptic@<replica>` for haptic's writes).
async fn status_writers(ingresses: &Api<Ingress>, name: &str) -> Result<Vec<String>> {
    let ingress = ingresses.get(name).await?;
    Ok(ingress
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter(|entry| entry.subresource.as_deref() == Some("status"))
        .filter_map(|entry| entry.manager)
        .collect())
}

/// Whether the replica says it leads; an API that does not answer, or no `haptic_leader`
/// metric, is an error, never "not leading".
async fn leads(api: &str) -> Result<bool> {
    let text = reqwest::get(format!("{api}/metrics")).await?.error_for_status()?.text().await?;
    let line = text.lines().find(|l| l.starts_with("haptic_leader ")).context("no haptic_leader metric")?;
    Ok(line.trim_end().ends_with(" 1"))
}

/// Two replicas: only the leader writes `status.loadBalancer`, with the HAProxy Service's
/// load-balancer address, on the Ingresses of its class and on class-less ones, since the
/// IngressClass carries the default-class annotation; when it goes, the next leader writes. The
/// IngressClass's parameters are the Ingresses' defaults.
#[tokio::test]
async fn only_the_leader_writes_the_haproxy_services_address() -> Result<()> {
    let env = env::environment();
    let client = env.kube_client().await?;
    env::chart::apply_chart_crd(&client).await?;
    let namespace = env.fresh_namespace(&client, "status-leader").await?;
    let work = tempfile::tempdir()?;
    let class = format!("{namespace}-class");
    // The HAProxy Service the chart makes (release "lead": lead-haptic-haproxy), its address
    // given as a cloud's load balancer would.
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client.clone(), &namespace);
    let service = serde_json::from_value(json!({
        "metadata": {"name": "lead-haptic-haproxy"},
        "spec": {"type": "LoadBalancer", "ports": [{"name": "http", "port": 80}]}
    }))?;
    services.create(&PostParams::default(), &service).await?;
    let published = json!({"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.9"}]}}});
    services.patch_status("lead-haptic-haproxy", &PatchParams::default(), &Patch::Merge(&published)).await?;
    // The class, marked the cluster's default (IngressClasses are cluster-wide: one per test).
    let classes: Api<k8s_openapi::api::networking::v1::IngressClass> = Api::all(client.clone());
    let ingress_class = serde_json::from_value(json!({
        "metadata": {"name": class, "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}},
        "spec": {"controller": "haptic.dev/ingress-controller", "parameters": {
            "kind": "ConfigMap", "name": "lead-haptic-class-parameters",
            "namespace": namespace, "scope": "Namespace"}}
    }))?;
    classes.create(&PostParams::default(), &ingress_class).await?;
    // Its parameters: defaults for every Ingress of the class (as ingressClass.parameters makes them).
    let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let parameters = serde_json::from_value(json!({
        "metadata": {"name": "lead-haptic-class-parameters"}, "data": {"timeout-server": "42s"}
    }))?;
    configmaps.create(&PostParams::default(), &parameters).await?;

    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    let mut served = ingress_to("served", "served.example.com", "svc")?;
    served.spec.as_mut().context("spec")?.ingress_class_name = Some(class.clone());
    ingresses.create(&PostParams::default(), &served).await?;
    let mut classless = ingress_to("classless", "classless.example.com", "svc")?;
    classless.spec.as_mut().context("spec")?.ingress_class_name = None;
    ingresses.create(&PostParams::default(), &classless).await?;
    // Deploying replicas (no pod matches, so nothing is deployed), with the Dataplane credentials.
    env::fixtures::dataplane_secret(&client, &namespace, "admin", "status-secret").await?;
    let values = [("ingressClass.name", class.clone()), ("haproxy.dataplane.existingSecret", "dataplane".to_owned())];
    apply_library_config_with(&client, &namespace, "lead", "127.1.3.4", work.path(), &values).await?;

    let lease = format!("{namespace}-lease");
    let (dir_a, dir_b) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let (journal_a, journal_b) = (dir_a.path().join("journal"), dir_b.path().join("journal"));
    let a =
        ControllerProcess::launch(env, &namespace, "haptic", dir_a, &journal_a, &Launch::elected(&lease, "replica-a"))?;
    let api_a = a.api_url().await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !leads(&api_a).await.unwrap_or(false) {
        ensure!(Instant::now() < deadline, "replica A did not lead\n{}", a.log_tail());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let b =
        ControllerProcess::launch(env, &namespace, "haptic", dir_b, &journal_b, &Launch::elected(&lease, "replica-b"))?;
    let api_b = b.api_url().await?;

    wait_for(&ingresses, "served", &["203.0.113.9"]).await?;
    wait_for(&ingresses, "classless", &["203.0.113.9"]).await?;
    // B runs the same configuration but follows: the status is A's alone.
    // The class's parameters reach the Ingresses' backends.
    b.wait_for_config("replica B's render, with the class's parameters", Duration::from_secs(30), |cfg| {
        cfg.contains("timeout server 42s")
    })
    .await?;
    ensure!(!leads(&api_b).await?, "both replicas lead");
    for name in ["served", "classless"] {
        let writers = status_writers(&ingresses, name).await?;
        ensure!(writers == ["haptic@replica-a"], "{name}'s status was written by {writers:?}, not the leader alone");
    }

    // The leader goes: B takes the lease and writes the next Ingress's status.
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !leads(&api_b).await.unwrap_or(false) {
        ensure!(Instant::now() < deadline, "replica B did not take over\n{}", b.log_tail());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut later = ingress_to("later", "later.example.com", "svc")?;
    later.spec.as_mut().context("spec")?.ingress_class_name = Some(class.clone());
    ingresses.create(&PostParams::default(), &later).await?;
    wait_for(&ingresses, "later", &["203.0.113.9"]).await?;
    let writers = status_writers(&ingresses, "later").await?;
    ensure!(writers == ["haptic@replica-b"], "later's status was written by {writers:?}, not the new leader");
    let _ = classes.delete(&class, &Default::default()).await;
    Ok(())
}

/// Two installs, two classes, one namespace: each renders only its class's Ingresses and writes
/// only their status, and an Ingress moved from one class to the other changes hands cleanly.
#[tokio::test]
async fn two_installs_serve_two_classes_without_touching_each_others_ingresses() -> Result<()> {
    let env = env::environment();
    let client = env.kube_client().await?;
    env::chart::apply_chart_crd(&client).await?;
    let namespace = env.fresh_namespace(&client, "two-installs").await?;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    let mut installs = Vec::new();
    for (release, address, frontend) in [("one", "192.0.2.61", "127.1.3.5"), ("two", "192.0.2.62", "127.1.3.6")] {
        let class = format!("{namespace}-{release}");
        let mut ingress = ingress_to(&format!("app-{release}"), &format!("{release}.example.com"), "svc")?;
        ingress.spec.as_mut().context("spec")?.ingress_class_name = Some(class.clone());
        ingresses.create(&PostParams::default(), &ingress).await?;
        let work = tempfile::tempdir()?;
        let values = [
            ("config.name", release.to_owned()),
            ("ingressClass.name", class),
            ("ingressClass.statusAddresses", format!("{{{address}}}")),
        ];
        apply_library_config_with(&client, &namespace, release, frontend, work.path(), &values).await?;
        let launch = Launch { args: vec!["--render-only".into()], ..Launch::default() };
        let controller_dir = tempfile::tempdir()?;
        let journal = controller_dir.path().join("journal");
        let controller = ControllerProcess::launch(env, &namespace, release, controller_dir, &journal, &launch)?;
        installs.push((release, address, controller, work));
    }
    let routed = |controller: &ControllerProcess, host: &str| controller.file("maps/host-prefix.map").contains(host);
    for (release, address, controller, _) in &installs {
        wait_for(&ingresses, &format!("app-{release}"), &[address]).await.with_context(|| controller.log_tail())?;
    }
    let (one, two) = (&installs[0].2, &installs[1].2);
    ensure!(routed(one, "one.example.com") && !routed(one, "two.example.com"), "install one routes another class");
    ensure!(routed(two, "two.example.com") && !routed(two, "one.example.com"), "install two routes another class");

    // app-one moves to class two: install two takes it, install one lets it go.
    let patch = json!({"spec": {"ingressClassName": format!("{namespace}-two")}});
    ingresses.patch("app-one", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    wait_for(&ingresses, "app-one", &["192.0.2.62"]).await?;
    two.wait_for_config("install two with app-one", Duration::from_secs(30), |_| {
        std::fs::read_to_string(two.render_dir.join("maps/host-prefix.map"))
            .is_ok_and(|m| m.contains("one.example.com"))
    })
    .await?;
    env::holds_throughout(
        Duration::from_secs(1),
        "install one still routes an Ingress it no longer serves",
        || async { Ok(!routed(one, "one.example.com")) },
    )
    .await?;
    ensure!(addresses(&ingresses, "app-one").await? == ["192.0.2.62"], "app-one's status changed hands unevenly");
    ensure!(addresses(&ingresses, "app-two").await? == ["192.0.2.62"], "app-two lost its address");
    Ok(())
}
