//! The live deploy path, pod state by pod state, against the environment's real Dataplane API
//! v3.2.7 and real HAProxy 2.8 and 2.6 pods, with the real `haptic` binary (issue #11).
//! Writes to a pod are counted from the pod itself: its configuration version (every write
//! through the Dataplane API adds one) and its HAProxy master's own reload count.

use crate::env;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use env::Writes;
use env::controller::{ControllerProcess, Launch, deployment_test_namespace};
use env::standalone::{
    apply_library_config_for_pods, backend_host_address, ingress_to, library_namespace, service_with_endpoints,
    start_backends,
};
use haptic::config::HAProxyTemplateConfig;
use haptic::pod::State;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const WITHIN: Duration = Duration::from_secs(60);

async fn setup(test: &str, template: &str, drift: &str) -> Result<(kube::Client, String)> {
    deployment_test_namespace(env::environment(), test, template, drift).await
}

fn own_template(tag: &str, extra: &str) -> String {
    env::controller::own_template(env::environment(), tag, extra)
}

async fn writes_of_every_pod() -> Result<Vec<Writes>> {
    let env = env::environment();
    let mut writes = Vec::new();
    for pod in &env.pods {
        writes.push(env.writes(pod).await?);
    }
    Ok(writes)
}

async fn every_pod_answers(env: &env::Manifest, host: &str, backend: &str) -> Result<()> {
    env::every_pod_answers(env, host, backend, Duration::from_millis(100)).await
}

fn launch(env: &env::Manifest, namespace: &str) -> Result<ControllerProcess> {
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("journal");
    ControllerProcess::launch(env, namespace, "test", dir, &journal, &Launch::default())
}

#[tokio::test]
async fn a_fresh_notready_pod_is_configured_becomes_ready_and_an_ingress_change_is_one_push_per_pod() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    for pod in &env.pods {
        env.reset_to_bootstrap(pod).await?;
    }
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "fresh").await?;
    // The prober (kubelet's part) finds them NotReady: their HAProxy says 503 on its readiness port.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let ready = |pod: &Pod| {
        pod.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|conditions| conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    // (A pod that was Ready turns NotReady after three failed probes, 2 s apart, as with kubelet.)
    let deadline = Instant::now() + Duration::from_secs(20);
    while pods.list(&Default::default()).await?.iter().any(ready) {
        ensure!(Instant::now() < deadline, "a pod stayed Ready with the bootstrap configuration");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let work = tempfile::tempdir()?;
    let address = backend_host_address()?;
    let _backends = start_backends(work.path(), &address, &[("blue".into(), 18300), ("green".into(), 18301)])?;
    service_with_endpoints(&client, &namespace, "blue", &address, 18300).await?;
    service_with_endpoints(&client, &namespace, "green", &address, 18301).await?;
    apply_library_config_for_pods(&client, &namespace, "fresh").await?;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    let rule = |service: &str| {
        json!({"host": "shop.fresh.example", "http": {"paths": [
            {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": service, "port": {"number": 80}}}}]}})
    };
    let ingress = serde_json::from_value(json!({"metadata": {"name": "shop"},
        "spec": {"ingressClassName": "haproxy", "rules": [rule("blue")]}}))?;
    ingresses.create(&PostParams::default(), &ingress).await?;

    let controller = ControllerProcess::launch_library(env, &namespace, &work.path().join("journal"))?;
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    let deadline = Instant::now() + WITHIN;
    while !pods.list(&Default::default()).await?.iter().all(ready) {
        ensure!(Instant::now() < deadline, "the configured pods did not turn Ready\n{}", controller.log_tail());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    every_pod_answers(env, "shop.fresh.example", "blue").await?;

    // The route moves to a Service no route went to: a backend of its own appears, which only
    // a reload makes (one push and one reload per pod; blue's backend, now unused, goes with
    // it).
    let before = writes_of_every_pod().await?;
    ingresses
        .patch("shop", &PatchParams::default(), &Patch::Merge(json!({"spec": {"rules": [rule("green")]}})))
        .await?;
    every_pod_answers(env, "shop.fresh.example", "green").await?;
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    let after = writes_of_every_pod().await?;
    for ((pod, before), after) in env.pods.iter().zip(&before).zip(&after) {
        ensure!(
            after.version == before.version + 1 && after.reloads == before.reloads + 1,
            "{}: a route to a Service without a backend should be one push and one reload: {before:?} → {after:?}",
            pod.name
        );
    }
    // A new host to a Service that has a backend: map entries only, through the Runtime API:
    // no write of the configuration, no reload.
    let before = after;
    let second = serde_json::from_value(json!({"metadata": {"name": "blog"},
        "spec": {"ingressClassName": "haproxy", "rules": [
            {"host": "blog.fresh.example", "http": {"paths": [{"path": "/", "pathType": "Prefix",
             "backend": {"service": {"name": "green", "port": {"number": 80}}}}]}}]}}))?;
    ingresses.create(&PostParams::default(), &second).await?;
    every_pod_answers(env, "blog.fresh.example", "green").await?;
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    let after = writes_of_every_pod().await?;
    for ((pod, before), after) in env.pods.iter().zip(&before).zip(&after) {
        ensure!(
            after.version == before.version && after.reloads == before.reloads,
            "{}: a new host to a Service with a backend should write no configuration and reload nothing: \
             {before:?} → {after:?}",
            pod.name
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_restarted_controller_writes_nothing_to_pods_in_sync() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let namespace_hint = format!("restart-{}", std::process::id());
    let (_client, namespace) = setup("restart", &own_template(&namespace_hint, ""), "60s").await?;
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("journal");
    let first = ControllerProcess::launch(env, &namespace, "test", dir, &journal, &Launch::default())?;
    first.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    let before = writes_of_every_pod().await?;
    let dir = first.kill();

    let started = Instant::now();
    let second = ControllerProcess::launch(env, &namespace, "test", dir, &journal, &Launch::default())?;
    // InSync again by a verification of this run, not by the record the first one left.
    let pods = second
        .wait_for_pods("every pod verified InSync after the restart", env.pods.len(), WITHIN, |pod| {
            pod["state"] == "InSync" && pod["lastTransition"]["reason"] == "Verified"
        })
        .await?;
    let took = started.elapsed();
    let after = writes_of_every_pod().await?;
    ensure!(after == before, "a restart wrote to pods in sync: {before:?} → {after:?}\n{}", second.log_tail());
    let opened = log_time(&second.log_text(), "journal opened").context("no `journal opened` line")?;
    for pod in &pods {
        let at = pod["lastTransition"]["at"].as_str().context("a transition time")?;
        let at = at.parse::<k8s_openapi::jiff::Timestamp>().with_context(|| format!("transition time {at}"))?;
        let after_open = at.duration_since(opened);
        ensure!(
            after_open < k8s_openapi::jiff::SignedDuration::from_secs(1),
            "{}: InSync {after_open:?} after the journal was opened",
            pod["name"]
        );
    }
    println!("restart: every pod verified InSync {took:?} after launch, 0 writes");
    Ok(())
}

/// The time of the first log line containing `what`.
fn log_time(log: &str, what: &str) -> Option<k8s_openapi::jiff::Timestamp> {
    log.lines().find(|line| line.contains(what))?.split_whitespace().next()?.parse().ok()
}

/// The drift interval is the one in force: the configuration starts with 600 s, and the 3 s
/// it is changed to while the controller runs takes effect at once, not at the next leader
/// term (issue #46: the fleet read it only when it started).
#[tokio::test]
async fn a_hand_push_to_one_pod_is_undone_within_a_drift_interval_set_while_running_and_the_others_get_no_write()
-> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let hint = format!("drift-{}", std::process::id());
    let (client, namespace) = setup("drift", &own_template(&hint, ""), "600s").await?;
    let controller = launch(env, &namespace)?;
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    let drifted = &env.pods[0];
    let dataplane = env.dataplane(drifted);
    let config = env::config_routing_to(&env.backends[1]);
    env::push_raw_at_current_version(&dataplane, &config, haptic::dataplane::PushMode::ForceReload).await?;
    let undone = || async { anyhow::Ok(dataplane.raw_configuration().await?.text.contains(&format!("# test {hint}"))) };
    // A new controller checks each pod a second time within its first minute (a write of a
    // term before may land late); the interval is the next check after that.
    env::holds_throughout(Duration::from_secs(2), "undone within 2 s of a 600 s interval", || async {
        Ok(!undone().await?)
    })
    .await
    .with_context(|| controller.log_tail())?;
    let before = writes_of_every_pod().await?;
    let configs: Api<HAProxyTemplateConfig> = Api::namespaced(client.clone(), &namespace);
    let faster = Patch::Merge(json!({"spec": {"dataplane": {"driftPreventionInterval": "3s"}}}));
    configs.patch("test", &PatchParams::default(), &faster).await?;
    let changed = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !undone().await? {
        ensure!(Instant::now() < deadline, "the hand push was not undone\n{}", controller.log_tail());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let undone_after = changed.elapsed();
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    ensure!(
        undone_after < Duration::from_secs(3) + Duration::from_secs(2),
        "undone only {undone_after:?} after the interval became 3 s"
    );
    let after = writes_of_every_pod().await?;
    for (index, (before, after)) in before.iter().zip(&after).enumerate().skip(1) {
        ensure!(before == after, "{}: a pod that did not drift was written to", env.pods[index].name);
    }
    println!("drift: undone {undone_after:?} after the interval became 3 s");
    Ok(())
}

#[tokio::test]
async fn an_invalid_configuration_changes_no_pod_says_haproxys_message_and_a_fix_deploys() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let hint = format!("invalid-{}", std::process::id());
    let (client, namespace) = setup("invalid", &own_template(&hint, ""), "60s").await?;
    let configs: Api<HAProxyTemplateConfig> = Api::namespaced(client.clone(), &namespace);
    let with_map = |content: &str| Patch::Merge(json!({"spec": {"templates": {"maps": {"keep.map": content}}}}));
    configs.patch("test", &PatchParams::default(), &with_map("good\n")).await?;
    let controller = launch(env, &namespace)?;
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    let before = writes_of_every_pod().await?;
    // Line 3 of the render is HAProxy's to refuse; its new map is uploaded to validate it.
    let broken = format!("# test {hint}\nglobal\n    no-such-keyword 42\n");
    configs
        .patch(
            "test",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"templates": {"haproxyConfig": broken, "maps": {"keep.map": "refused\n"}}}})),
        )
        .await?;
    let deadline = Instant::now() + WITHIN;
    let condition = loop {
        let status = configs.get_status("test").await?.status.unwrap_or_default();
        if let Some(c) = status.conditions.iter().find(|c| c.type_ == "Validated" && c.status == "False") {
            break c.clone();
        }
        ensure!(Instant::now() < deadline, "no Validated=False condition: {status:?}\n{}", controller.log_tail());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    ensure!(condition.message.contains("no-such-keyword"), "HAProxy's message: {}", condition.message);
    ensure!(condition.message.contains(":3]"), "the render's own line 3: {}", condition.message);
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let event = events
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .find(|e| {
            e.type_.as_deref() == Some("Warning") && e.note.as_deref().is_some_and(|n| n.contains("no-such-keyword"))
        })
        .context("no Warning Event quoting HAProxy")?;
    ensure!(event.note.as_deref().is_some_and(|n| n.contains(":3]")), "{:?}", event.note);
    ensure!(writes_of_every_pod().await? == before, "a refused configuration changed a pod");
    // The map uploaded for the validation is put back (from the journal) on every pod.
    for pod in &env.pods {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let map = std::fs::read_to_string(pod.dir.join("maps/keep.map")).unwrap_or_default();
            if map == "good\n" {
                break;
            }
            ensure!(Instant::now() < deadline, "{}: the refused map stayed: {map:?}", pod.name);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let fixed = own_template(&format!("{hint}-fixed"), "");
    let fix = Patch::Merge(json!({"spec": {"templates": {"haproxyConfig": fixed, "maps": {"keep.map": "good\n"}}}}));
    configs.patch("test", &PatchParams::default(), &fix).await?;
    // Every pod runs the fix: pushed, or patched at run time by a pod whose driver never got to
    // the refused version (the fix differs from the last good files in a comment only, which
    // needs no reload).
    controller.wait_for_config("the fix rendered", WITHIN, |cfg| cfg.contains(&format!("# test {hint}-fixed"))).await?;
    let fix_checksum = haptic::files::Checksum::of(controller.file("haproxy.cfg").as_bytes()).to_string();
    controller
        .wait_for_pods("the fix deployed", env.pods.len(), WITHIN, |pod| {
            let mut pushed = pod["pushedChecksums"].as_array().into_iter().flatten();
            pod["state"] == "InSync"
                && pushed.any(|f| f["name"] == "haproxy.cfg" && f["checksum"] == fix_checksum.as_str())
        })
        .await?;
    for pod in &env.pods {
        let text = env.dataplane(pod).raw_configuration().await?.text;
        ensure!(text.contains(&format!("# test {hint}-fixed")), "{} does not run the fix", pod.name);
    }
    Ok(())
}

#[tokio::test]
async fn a_reload_that_fails_on_a_2_8_and_a_2_6_pod_leaves_both_on_their_last_good_files_unpushed() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let hint = format!("reload-{}", std::process::id());
    let (client, namespace) = setup("reload-fails", &own_template(&hint, ""), "2s").await?;
    let controller = launch(env, &namespace)?;
    // An Ingress in every render (the template writes a backend for it), changed later in a
    // way that renders the same files.
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    let steady = serde_json::from_value(
        json!({"metadata": {"name": "steady"}, "spec": {"rules": [{"host": "steady.example"}]}}),
    )?;
    ingresses.create(&PostParams::default(), &steady).await?;
    controller.wait_for_config("the steady Ingress", WITHIN, |cfg| cfg.contains("ingress_steady")).await?;
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    // A valid configuration with an extra listener whose address is taken on one 2.8 pod and
    // on the 2.6 pod (reloaded by the chart's script, which waits for the reload to take).
    let victims: Vec<&env::EnvPod> = env
        .pods
        .iter()
        .enumerate()
        .filter(|(i, pod)| *i == 0 || pod.haproxy_version.starts_with("2.6"))
        .map(|(_, pod)| pod)
        .take(2)
        .collect();
    let is_victim = |name: &serde_json::Value| victims.iter().any(|v| *name == v.name.as_str());
    let mut taken = Vec::new();
    for victim in &victims {
        taken.push(
            TcpListener::bind((victim.ip.as_str(), 18480))
                .with_context(|| format!("taking a port on {}", victim.name))?,
        );
    }
    let configs: Api<HAProxyTemplateConfig> = Api::namespaced(client.clone(), &namespace);
    let with_listener = own_template(&hint, "frontend extra\n    bind \"${POD_IP}:18480\"\n    default_backend app\n");
    configs
        .patch(
            "test",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"templates": {"haproxyConfig": with_listener}}})),
        )
        .await?;
    let others = env.pods.len() - victims.len();
    let deadline = Instant::now() + WITHIN;
    let failed = loop {
        let pods = controller.pods_view().await?;
        let failed: Vec<serde_json::Value> = pods
            .iter()
            .filter(|p| is_victim(&p["name"]) && p["lastTransition"]["reason"] == "ReloadFailed")
            .cloned()
            .collect();
        let synced = pods.iter().filter(|p| !is_victim(&p["name"]) && p["state"] == "InSync").count();
        if failed.len() == victims.len() && synced == others {
            break failed;
        }
        ensure!(Instant::now() < deadline, "no ReloadFailed on {victims:?}: {pods:#?}\n{}", controller.log_tail());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for (victim, failed) in victims.iter().zip(&failed) {
        let error = failed["lastError"].as_str().unwrap_or_default();
        // 2.8 reports HAProxy's own alert through the master CLI; the 2.6 reload script says
        // that the new configuration did not start.
        ensure!(
            error.contains("cannot bind socket")
                || error.contains("Address already in use")
                || error.contains("does not start on this pod"),
            "{}: {error}",
            victim.name
        );
        // It serves its last good files, and is left alone over several drift intervals.
        let text = env.dataplane(victim).raw_configuration().await?.text;
        ensure!(!text.contains("frontend extra"), "{} kept the refused file", victim.name);
        let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
        env::get_until_answered_by(&http, &victim.http_address, &env.backends[0].name).await?;
    }
    // A render of the same files (the Ingress annotated) and several drift intervals: the
    // refused files are neither validated nor pushed again (a render of them used to be
    // validated, pass, and be pushed into the same failure, every 2 s).
    let before = writes_of_every_pod().await?;
    ingresses
        .patch(
            "steady",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"touched": "yes"}}})),
        )
        .await?;
    env::holds_throughout(Duration::from_secs(7), "the refused files were pushed again", || async {
        Ok(writes_of_every_pod().await? == before)
    })
    .await?;
    let pods = controller.pods_view().await?;
    for victim in &victims {
        let view = pods.iter().find(|p| p["name"] == victim.name.as_str()).context("victim in the view")?;
        ensure!(view["lastTransition"]["reason"] == "ReloadFailed", "{}: {view:#}", victim.name);
    }
    drop(taken);
    Ok(())
}

#[tokio::test]
async fn a_template_without_a_final_newline_or_with_crlf_is_in_sync_after_one_push() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let hint = format!("newline-{}", std::process::id());
    let crlf = own_template(&hint, "").replace('\n', "\r\n");
    let template = crlf.trim_end().to_owned();
    let (_client, namespace) = setup("newline", &template, "2s").await?;
    let controller = launch(env, &namespace)?;
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    let before = writes_of_every_pod().await?;
    // Three drift checks: still the same files, found as pushed, never pushed again.
    env::holds_throughout(Duration::from_secs(6), "a pod drifted forever: re-pushed", || async {
        Ok(writes_of_every_pod().await? == before)
    })
    .await
    .with_context(|| controller.log_tail())?;
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    Ok(())
}

#[tokio::test]
async fn a_pod_whose_dataplane_api_is_down_holds_up_no_other_and_catches_up_when_it_returns() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let hint = format!("down-{}", std::process::id());
    let (client, namespace) = setup("dataplane-down", &own_template(&hint, ""), "60s").await?;
    let controller = launch(env, &namespace)?;
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    let down = &env.pods[1];
    env.dataplane_process(down, "stop")?;
    let restart = Restart { env, pod: down };
    // A change while it is down: the others deploy it as if nothing were wrong.
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    let ingress = serde_json::from_value(json!({"metadata": {"name": "while-down"},
        "spec": {"defaultBackend": {"service": {"name": "web", "port": {"number": 80}}}}}))?;
    ingresses.create(&PostParams::default(), &ingress).await?;
    for pod in env.pods.iter().filter(|p| p.name != down.name) {
        let dataplane = env.dataplane(pod);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !dataplane.raw_configuration().await?.text.contains("backend ingress_while-down") {
            ensure!(Instant::now() < deadline, "{} did not get the change\n{}", pod.name, controller.log_tail());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Its own attempt comes when the reload pace allows it (minDeploymentInterval), like the
    // others'; once it fails the API must not show the pod InSync.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let view = controller.pods_view().await?;
        let failing = view.iter().find(|p| p["name"] == down.name.as_str()).context("the down pod in the API")?;
        if failing["state"] != "InSync" {
            break;
        }
        ensure!(Instant::now() < deadline, "a pod whose Dataplane API is down still shows InSync: {failing:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(restart);
    // Back: it catches up (retries back off to 2, 4, 8 s; well within the minute).
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    ensure!(
        env.dataplane(down).raw_configuration().await?.text.contains("backend ingress_while-down"),
        "the returned pod did not catch up"
    );
    Ok(())
}

/// Starts a stopped Dataplane API again when dropped, so a failing test leaves no pod down.
struct Restart<'a> {
    env: &'a env::Manifest,
    pod: &'a env::EnvPod,
}

impl Drop for Restart<'_> {
    fn drop(&mut self) {
        if let Err(error) = self.env.dataplane_process(self.pod, "start") {
            eprintln!("could not start {}'s Dataplane API again: {error:#}", self.pod.name);
        }
    }
}

#[tokio::test]
async fn killed_ten_times_during_deployment_every_pod_converges_with_no_leftovers() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let hint = format!("killed-{}", std::process::id());
    let (client, namespace) = setup("killed", &own_template(&hint, ""), "60s").await?;
    let configs: Api<HAProxyTemplateConfig> = Api::namespaced(client.clone(), &namespace);
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("journal");
    let mut dir = Some(dir);
    let mut last_seq: std::collections::BTreeMap<String, u64> = Default::default();
    let mut killed_mid_deployment = 0u32;
    for round in 0..10u64 {
        // Each round wants new files: a new configuration and a new map.
        let spec = json!({"spec": {"templates": {
            "haproxyConfig": own_template(&format!("{hint}-{round}"), ""),
            "maps": {"round.map": format!("round {round}\n")}
        }}});
        configs.patch("test", &PatchParams::default(), &Patch::Merge(spec)).await?;
        let controller = ControllerProcess::launch(
            env,
            &namespace,
            "test",
            dir.take().context("dir")?,
            &journal,
            &Launch::default(),
        )?;
        // Killed at a different moment each round: from before the first push to mid-deployment.
        tokio::time::sleep(Duration::from_millis(150 + 120 * round)).await;
        dir = Some(controller.kill());
        let (opened, _) = haptic::journal::Journal::open(&journal, 100)?;
        let mut mid_deployment = false;
        for pod in opened.pods()? {
            let seq = pod.last_transition.seq;
            let before = last_seq.insert(pod.uid.0.clone(), seq).unwrap_or(0);
            ensure!(seq >= before, "{}: transition numbers went backwards ({before} → {seq})", pod.name);
            mid_deployment |= matches!(pod.state, State::Validating | State::Syncing | State::RuntimePatching);
        }
        killed_mid_deployment += u32::from(mid_deployment);
    }
    // The test is about kills that cut a deployment short: some must have.
    ensure!(killed_mid_deployment > 0, "no kill of the ten landed while a pod was being deployed to");
    println!("kills that left a pod mid-deployment: {killed_mid_deployment} of 10");
    let controller =
        ControllerProcess::launch(env, &namespace, "test", dir.take().context("dir")?, &journal, &Launch::default())?;
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    for pod in &env.pods {
        let text = env.dataplane(pod).raw_configuration().await?.text;
        ensure!(text.contains(&format!("# test {hint}-9")), "{} did not converge", pod.name);
        let maps: Vec<_> =
            std::fs::read_dir(pod.dir.join("maps"))?.filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
        ensure!(maps == ["round.map"], "{}: validation leftovers in its maps: {maps:?}", pod.name);
        let map = std::fs::read_to_string(pod.dir.join("maps/round.map"))?;
        ensure!(map == "round 9\n", "{}: the map is not the last round's: {map:?}", pod.name);
        for leftovers in ["general", "ssl"] {
            let entries = std::fs::read_dir(pod.dir.join(leftovers))?.count();
            // (No certificate, so no certificate manifest either.)
            ensure!(entries == 0, "{}: {entries} leftover files in {leftovers}", pod.name);
        }
    }
    Ok(())
}

#[tokio::test]
async fn in_slot_scale_steps_are_runtime_patches_and_a_streaming_connection_survives_them() -> Result<()> {
    // Six steps and a 20 s answer in `make test`; the twenty and 60 s in `make soak`.
    let steps = env::repetitions(6, 20);
    let stream_seconds = if env::soak() { 60 } else { 20 };
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "scale").await?;
    let work = tempfile::tempdir()?;
    let address = backend_host_address()?;
    // Three endpoints of one Service, each its own EndpointSlice (one address here, so each
    // endpoint has a port of its own); steps move between two and three of them.
    let ports = [18700u16, 18701, 18702];
    let specs: Vec<(String, u16)> = ports.iter().map(|port| ("web".to_owned(), *port)).collect();
    let _backends = start_backends(work.path(), &address, &specs)?;
    service_with_endpoints(&client, &namespace, "web", &address, ports[0]).await?;
    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> = Api::namespaced(client.clone(), &namespace);
    let slice = |index: usize| -> Result<k8s_openapi::api::discovery::v1::EndpointSlice> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": format!("web-extra-{index}"), "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": ports[index]}],
            "endpoints": [{"addresses": [address.clone()], "conditions": {"ready": true}}]
        }))?)
    };
    slices.create(&PostParams::default(), &slice(1)?).await?;
    apply_library_config_for_pods(&client, &namespace, "scale").await?;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    ingresses.create(&PostParams::default(), &ingress_to("web", "web.scale.example", "web")?).await?;
    let controller = ControllerProcess::launch_library(env, &namespace, &work.path().join("journal"))?;
    every_pod_answers(env, "web.scale.example", "web").await?;
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;

    // A long answer through every pod, open across all the steps.
    let http = reqwest::Client::builder().timeout(Duration::from_secs(120)).build()?;
    let mut streams = Vec::new();
    for pod in &env.pods {
        let request = http
            .get(format!("http://{}/stream?seconds={stream_seconds}", pod.http_address))
            .header("Host", "web.scale.example")
            .send();
        streams.push((pod.name.clone(), tokio::spawn(async move { request.await?.text().await })));
    }
    let before = writes_of_every_pod().await?;
    for step in 0..steps {
        if step % 2 == 0 {
            slices.create(&PostParams::default(), &slice(2)?).await?;
        } else {
            slices.delete("web-extra-2", &Default::default()).await?;
        }
        // Every pod runs the step's render before the next one.
        let servers = if step % 2 == 0 { 3 } else { 2 };
        controller
            .wait_for_config("the step rendered", WITHIN, |cfg| cfg.matches(&format!(" {address}:")).count() == servers)
            .await?;
        let config = haptic::files::Checksum::of(controller.file("haproxy.cfg").as_bytes()).to_string();
        controller
            .wait_for_pods("the step deployed", env.pods.len(), WITHIN, |pod| {
                let mut pushed = pod["pushedChecksums"].as_array().into_iter().flatten();
                pod["state"] == "InSync"
                    && pushed.any(|f| f["name"] == "haproxy.cfg" && f["checksum"] == config.as_str())
            })
            .await?;
    }
    let after = writes_of_every_pod().await?;
    for ((pod, before), after) in env.pods.iter().zip(&before).zip(&after) {
        let reloads = after.reloads - before.reloads;
        println!("{}: {} writes, {reloads} reloads over {steps} scale steps", pod.name, after.version - before.version);
        ensure!(reloads == 0, "{}: {reloads} reloads over {steps} in-slot scale steps", pod.name);
    }
    // The metrics say the same: runtime deployments on every pod, none failed.
    let api = controller.api_url().await?;
    let metrics = reqwest::get(format!("{api}/metrics")).await?.text().await?;
    let counted = |prefix: &str| env::measure::metric_sum(&metrics, prefix);
    let runtime_ok = counted("haptic_deployments_total{kind=\"runtime\",result=\"ok\"}");
    let pods = env.pods.len() as f64;
    let stepped = steps as f64;
    ensure!(runtime_ok >= stepped * pods, "{runtime_ok} runtime deployments counted for {pods} pods × {steps} steps");
    // Each step moves a server in or out of its slot, counted by kind: a free slot taken is a
    // replaced server, a slot given up a state change (and an address change). The first step
    // has no free slot to take (the chart grows backends one slot at a time where HAProxy adds
    // servers at run time): its server is added.
    let slot_changes = counted("haptic_runtime_actions_total{kind=\"server-state\"}")
        + counted("haptic_runtime_actions_total{kind=\"server-replace\"}")
        + counted("haptic_runtime_actions_total{kind=\"server-add\"}");
    ensure!(slot_changes >= stepped * pods, "{slot_changes} slot changes at run time for {pods} pods × {steps} steps");
    for (name, stream) in streams {
        let text = stream.await??;
        // A line every 200 ms: cut short, it would have far fewer.
        let lines = text.lines().count();
        ensure!(lines >= stream_seconds * 5 * 5 / 6, "{name}: the streaming answer was cut: {lines} lines");
    }
    Ok(())
}

#[tokio::test]
async fn files_uploaded_before_a_crash_are_put_back_by_the_next_run_when_the_pod_refuses_them() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let hint = format!("undo-{}", std::process::id());
    let (client, namespace) = setup("undo", &own_template(&hint, ""), "60s").await?;
    let configs: Api<HAProxyTemplateConfig> = Api::namespaced(client.clone(), &namespace);
    let templates = |config: String, map: &str| {
        Patch::Merge(json!({"spec": {"templates": {"haproxyConfig": config, "maps": {"keep.map": map}}}}))
    };
    configs.patch("test", &PatchParams::default(), &templates(own_template(&hint, ""), "good\n")).await?;
    let dir = tempfile::tempdir()?;
    let journal_dir = dir.path().join("journal");
    let first = ControllerProcess::launch(env, &namespace, "test", dir, &journal_dir, &Launch::default())?;
    first.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    let dir = first.kill();

    // The moment a crash can leave behind: a validation had recorded what it replaced and
    // uploaded the new map, and the controller died before HAProxy's answer.
    let pod = &env.pods[0];
    {
        let (journal, _) = haptic::journal::Journal::open(&journal_dir, 100)?;
        let record = journal.pods()?.into_iter().find(|p| p.name == pod.name).context("the pod's journal record")?;
        journal.record_upload(&record.uid, haptic::dataplane::StorageKind::Maps, "keep.map", Some(b"good\n"))?;
    }
    env.dataplane(pod).put_storage(haptic::dataplane::StorageKind::Maps, "keep.map", "refused\n", true).await?;
    // The files it came with are refused by HAProxy.
    let broken = format!("# test {hint}\nglobal\n    no-such-keyword 42\n");
    configs.patch("test", &PatchParams::default(), &templates(broken, "refused\n")).await?;

    let second = ControllerProcess::launch(env, &namespace, "test", dir, &journal_dir, &Launch::default())?;
    let deadline = Instant::now() + WITHIN;
    loop {
        let map = std::fs::read_to_string(pod.dir.join("maps/keep.map")).unwrap_or_default();
        if map == "good\n" {
            break;
        }
        ensure!(Instant::now() < deadline, "the map uploaded before the crash stayed: {map:?}\n{}", second.log_tail());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// A Service's endpoint moves to another port while every pod has a client's request in
/// flight on a kept-alive connection: the next requests on that same connection reach the new
/// port on every pod. HAProxy 2.6 keeps such a connection on the old address after a runtime
/// address change (it did so for 60 s in the deploy benchmark), so there the move is a reload;
/// on 2.8 it is a runtime change.
#[tokio::test]
async fn an_endpoint_moving_port_reaches_clients_whose_request_was_in_flight_on_every_pod() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "moving").await?;
    let work = tempfile::tempdir()?;
    let address = backend_host_address()?;
    let _backends = start_backends(work.path(), &address, &[("old-port".into(), 18710), ("new-port".into(), 18711)])?;
    service_with_endpoints(&client, &namespace, "web", &address, 18710).await?;
    apply_library_config_for_pods(&client, &namespace, "moving").await?;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    ingresses.create(&PostParams::default(), &ingress_to("web", "web.moving.example", "web")?).await?;
    let controller = ControllerProcess::launch_library(env, &namespace, &work.path().join("journal"))?;
    every_pod_answers(env, "web.moving.example", "old-port").await?;
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;

    // One kept-alive connection per pod, busy with a 3 s answer while the endpoint moves.
    let mut in_flight = Vec::new();
    for pod in &env.pods {
        let http = reqwest::Client::builder().pool_max_idle_per_host(1).timeout(Duration::from_secs(20)).build()?;
        let request = http
            .get(format!("http://{}/stream?seconds=3", pod.http_address))
            .header("Host", "web.moving.example")
            .send();
        let task = tokio::spawn(async move { request.await?.text().await });
        in_flight.push((pod, http, task));
    }
    // The backend logs each answer as it starts it: every pod's request is then in flight.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = std::fs::read_to_string(work.path().join("backends.log")).unwrap_or_default();
        let streaming = log.lines().filter(|l| l.starts_with("old-port: ") && l.contains("/stream?seconds=3")).count();
        if streaming >= env.pods.len() {
            break;
        }
        ensure!(Instant::now() < deadline, "{streaming} of the pods' requests reached the backend within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> = Api::namespaced(client.clone(), &namespace);
    slices
        .patch("web-1", &PatchParams::default(), &Patch::Merge(json!({"ports": [{"name": "http", "port": 18711}]})))
        .await?;
    for (pod, http, task) in in_flight {
        let streamed = task.await??;
        ensure!(streamed.contains("backend=old-port"), "{}: the answer in flight was cut: {streamed}", pod.name);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let answer = http
                .get(format!("http://{}/hello", pod.http_address))
                .header("Host", "web.moving.example")
                .send()
                .await?
                .text()
                .await?;
            if answer.contains("backend=new-port ") {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "{} (HAProxy {}): a kept-alive connection still reaches the old port 15 s after the move: {answer}",
                pod.name,
                pod.haproxy_version
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}

#[tokio::test]
async fn new_hosts_every_600_ms_reload_each_pod_at_most_once_per_pace_and_every_host_is_served() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "burst").await?;
    let work = tempfile::tempdir()?;
    let address = backend_host_address()?;
    let _backends = start_backends(work.path(), &address, &[("blue".into(), 18310)])?;
    service_with_endpoints(&client, &namespace, "blue", &address, 18310).await?;
    apply_library_config_for_pods(&client, &namespace, "burst").await?;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    ingresses.create(&PostParams::default(), &ingress_to("first", "first.burst.example", "blue")?).await?;
    let controller = ControllerProcess::launch_library(env, &namespace, &work.path().join("journal"))?;
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    every_pod_answers(env, "first.burst.example", "blue").await?;

    // Eight new hosts, each to a Service of its own that has no backend yet (a reload), 600 ms
    // apart: past the debouncer's 500 ms quiet window, so each is a render of its own. Unpaced
    // that is 8 reloads per pod; with the chart's 2 s pace, a reload at most every 2 s over the
    // 4.8 s: at most 4.
    for i in 0..8 {
        service_with_endpoints(&client, &namespace, &format!("h{i}"), &address, 18310).await?;
    }
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    let before = writes_of_every_pod().await?;
    for i in 0..8 {
        let host = format!("h{i}.burst.example");
        ingresses.create(&PostParams::default(), &ingress_to(&format!("h{i}"), &host, &format!("h{i}"))?).await?;
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    for i in 0..8 {
        every_pod_answers(env, &format!("h{i}.burst.example"), "blue").await?;
    }
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    let after = writes_of_every_pod().await?;
    for ((pod, before), after) in env.pods.iter().zip(&before).zip(&after) {
        let reloads = after.reloads - before.reloads;
        println!("{}: {reloads} reloads for 8 new hosts 600 ms apart", pod.name);
        ensure!((1..=4).contains(&reloads), "{}: {reloads} reloads for 8 new hosts 600 ms apart", pod.name);
    }
    Ok(())
}
