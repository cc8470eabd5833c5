//! `haptic diff --controller` on live pods (#16): for a change not yet made, what each pod of a
//! running controller would undergo (map entries only, a server's weight, or a reload) is
//! named before the change, and then borne out by the pods' own reload counts once it is made.

use crate::env;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use env::controller::{ControllerProcess, Launch};
use haptic::config::HAProxyTemplateConfig;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// Routes by host through `hosts.map` (in the environment's pod storage, as the chart's pods have it); an Ingress with `test/route-to` only adds a route to
/// another Ingress's backend, any other has a backend of its own with a server weighted by
/// `test/weight`.
fn templates(env: &env::Manifest, tag: &str) -> Value {
    let backend = &env.backends[0];
    let config = format!(
        "# test {tag}\n{}\nfrontend routes\n    bind \"${{POD_IP}}:8090\"\n    use_backend %[req.hdr(host),field(1,:),lower,map(/var/run/haproxy/maps/hosts.map,app)]\n\
         {{% for i in resources.ingresses.list() %}}{{% if not (i.metadata.annotations or {{}})[\"test/route-to\"] %}}\
         backend ingress_{{{{ i.metadata.name | bare_word }}}}\n    server s1 {}:{} weight {{{{ (i.metadata.annotations or {{}})[\"test/weight\"] | default(\"1\") | bare_word }}}}\n\
         {{% endif %}}{{% endfor %}}",
        env::config_routing_to(backend),
        backend.ip,
        backend.port
    );
    let map = "{% for i in resources.ingresses.list() %}{% set to = (i.metadata.annotations or {})[\"test/route-to\"] | default(\"\") %}\
               {% for r in i.spec.rules %}{{ r.host | bare_word }} ingress_{{ (to or i.metadata.name) | bare_word }}\n{% endfor %}{% endfor %}";
    json!({"haproxyConfig": config, "maps": {"hosts.map": map}})
}

fn ingress(namespace: &str, name: &str, host: &str, annotations: Value) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {"rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix",
            "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}
    })
}

/// `haptic render` of `objects` with `config`, into a directory of its own under `work`.
fn render(work: &Path, config: &Path, objects: &[&Value], label: &str) -> Result<PathBuf> {
    let resources = work.join(format!("{label}-resources"));
    std::fs::create_dir_all(&resources)?;
    for (i, object) in objects.iter().enumerate() {
        std::fs::write(resources.join(format!("{i}.json")), serde_json::to_string(object)?)?;
    }
    let out = work.join(format!("{label}-render"));
    let output = Command::new(env!("CARGO_BIN_EXE_haptic"))
        .args(["render", "--config"])
        .arg(config)
        .arg("--resources")
        .arg(&resources)
        .arg("--out")
        .arg(&out)
        .output()?;
    ensure!(output.status.success(), "haptic render: {}", String::from_utf8_lossy(&output.stderr));
    Ok(out)
}

fn diff(api: &str, after: &Path) -> Result<String> {
    let output = Command::new(env!("CARGO_BIN_EXE_haptic"))
        .args(["diff", "--controller", api, "--after"])
        .arg(after)
        .output()?;
    ensure!(output.status.success(), "haptic diff: {}", String::from_utf8_lossy(&output.stderr));
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[tokio::test]
async fn haptic_diff_names_map_server_and_reload_changes_on_live_pods_before_they_are_made() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let tag = format!("diff-{}", std::process::id());
    let (client, namespace) = env::controller::deployment_namespace_with(
        env,
        "diff-live",
        &env.pods,
        json!({"driftPreventionInterval": "60s", "mapsDir": "/var/run/haproxy/maps"}),
        templates(env, &tag),
    )
    .await?;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    let a = ingress(&namespace, "a", "a.example", json!({"test/weight": "10"}));
    ingresses.create(&PostParams::default(), &serde_json::from_value(a.clone())?).await?;
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("journal");
    let controller = ControllerProcess::launch(env, &namespace, "test", dir, &journal, &Launch::default())?;
    let api = controller.api_url().await?;
    controller
        .wait_for_config("ingress a rendered", Duration::from_secs(30), |c| c.contains("backend ingress_a"))
        .await?;
    controller.wait_all_in_sync(env.pods.len(), Duration::from_secs(60)).await?;

    let work = tempfile::tempdir()?;
    let configs: Api<HAProxyTemplateConfig> = Api::namespaced(client.clone(), &namespace);
    let config_file = work.path().join("config.json");
    std::fs::write(&config_file, serde_json::to_string(&configs.get("test").await?)?)?;
    let pods = env.pods.len();
    let reloads = || -> Result<Vec<u64>> { env.pods.iter().map(|pod| pod.reloads()).collect() };

    // Each change: foretold by `haptic diff`, then made, then checked on the pods.
    let b = ingress(&namespace, "b", "b.example", json!({"test/route-to": "a"}));
    let a_heavier = ingress(&namespace, "a", "a.example", json!({"test/weight": "20"}));
    let c = ingress(&namespace, "c", "c.example", json!({}));
    let cases: [(&str, Vec<&Value>, &str, &str, bool); 3] = [
        ("map-only", vec![&a, &b], "runtime: 1 action(s), no reload", "add map hosts.map b.example ingress_a", false),
        ("server", vec![&a_heavier, &b], "runtime: 1 action(s), no reload", "SetServerWeight ingress_a s1 20", false),
        ("reload", vec![&a_heavier, &b, &c], "reload: ", "", true),
    ];
    for (label, objects, verdict, action, reloads_expected) in cases {
        let after = render(work.path(), &config_file, &objects, label)?;
        let said = diff(&api, &after)?;
        ensure!(said.matches(verdict).count() == pods, "{label}: every pod should say {verdict:?}:\n{said}");
        ensure!(said.matches(" (HAProxy ").count() == pods, "{label}: each pod by its HAProxy version:\n{said}");
        ensure!(action.is_empty() || said.matches(action).count() == pods, "{label}: {action:?} on every pod:\n{said}");
        // Now made, through the API server: the pods do what was foretold.
        let before = reloads()?;
        for object in &objects {
            let name = object["metadata"]["name"].as_str().context("name")?;
            let patch = Patch::Apply(object);
            ingresses.patch(name, &PatchParams::apply("diff-live-test").force(), &patch).await?;
        }
        let expected_map = work.path().join(format!("{label}-render/maps/hosts.map"));
        let expected_map = std::fs::read_to_string(expected_map)?;
        let expected_cfg = std::fs::read_to_string(after.join("haproxy.cfg"))?;
        // The controller renders what `haptic render` did.
        let rendered = |c: &str| c == expected_cfg && controller.file("maps/hosts.map") == expected_map;
        controller.wait_for_config(&format!("{label} rendered"), Duration::from_secs(30), rendered).await?;
        // Every pod runs it: in sync, its pushed haproxy.cfg and map being this render's.
        let expected = [("haproxy.cfg", &expected_cfg), ("maps/hosts.map", &expected_map)]
            .map(|(name, content)| (name, haptic::files::Checksum::of(content.as_bytes()).to_string()));
        let runs_it = |pod: &Value| {
            let pushed = pod["pushedChecksums"].as_array().cloned().unwrap_or_default();
            pod["state"] == "InSync"
                && expected.iter().all(|(name, checksum)| {
                    pushed.iter().any(|f| f["name"] == *name && f["checksum"] == checksum.as_str())
                })
        };
        controller.wait_for_pods(&format!("{label} on every pod"), pods, Duration::from_secs(60), runs_it).await?;
        let now = reloads()?;
        for ((pod, was), is) in env.pods.iter().zip(&before).zip(&now) {
            ensure!(
                (is > was) == reloads_expected,
                "{label}: {} reloaded {was} → {is}, but haptic diff said:\n{said}",
                pod.name
            );
        }
    }
    Ok(())
}
