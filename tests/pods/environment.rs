//! The local environment is real: these tests talk to the real API server, every real
//! Dataplane API and every real HAProxy that `tests/env/envctl.py` started.

use crate::env;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};

#[tokio::test]
async fn api_server_stores_pods_and_their_status() -> Result<()> {
    let env = env::environment();
    let client = env.kube_client().await?;
    let namespace = env.fresh_namespace(&client, "api-server-pods").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);

    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "probe", "labels": {"app": "probe"}},
        "spec": {"containers": [{"name": "c", "image": "example"}]}
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let read = pods.get("probe").await?;
    assert_eq!(read.metadata.labels.unwrap_or_default().get("app").map(String::as_str), Some("probe"));

    let status = serde_json::json!({"status": {
        "phase": "Running", "podIP": "127.1.9.9",
        "conditions": [{"type": "Ready", "status": "True"}]
    }});
    pods.patch_status("probe", &PatchParams::default(), &Patch::Merge(status)).await?;
    let patched = pods.get_status("probe").await?.status.context("status")?;
    assert_eq!(patched.pod_ip.as_deref(), Some("127.1.9.9"));
    assert!(patched.conditions.unwrap_or_default().iter().any(|c| c.type_ == "Ready" && c.status == "True"));

    // The environment's HAProxy pods are registered Ready, as a controller would discover them.
    for env_pod in &env.pods {
        let registered = pods.get(&env_pod.name).await?;
        let status = registered.status.context("registered pod has a status")?;
        assert_eq!(status.pod_ip.as_deref(), Some(env_pod.ip.as_str()));
    }
    Ok(())
}

#[tokio::test]
async fn api_server_enforces_rbac() -> Result<()> {
    let env = env::environment();
    let admin = env.kube_client().await?;
    let namespace = env.fresh_namespace(&admin, "api-server-rbac").await?;

    let mut config = env.kube_config().await?;
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{namespace}:nobody"));
    let nobody = kube::Client::try_from(config)?;
    let pods: Api<Pod> = Api::namespaced(nobody, &namespace);
    match pods.list(&Default::default()).await {
        Err(kube::Error::Api(status)) if status.code == 403 => Ok(()),
        other => bail!("a service account without any role listed pods: {other:?}"),
    }
}

#[tokio::test]
async fn every_haproxy_pod_routes_to_a_named_backend() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let mut versions = std::collections::HashSet::new();
    for (index, pod) in env.pods.iter().enumerate() {
        let backend = &env.backends[(index + 1) % env.backends.len()];
        // Through the pod's Dataplane API: it watches the file and rewrites it when it changes
        // behind its back, so a direct write would race with it.
        let dataplane = env.dataplane(pod);
        let config = env::config_routing_to(backend);
        env::push_raw_at_current_version(&dataplane, &config, haptic::dataplane::PushMode::ForceReload).await?;
        let answer = env::get_until_answered_by(&http, &pod.http_address, &backend.name).await?;
        assert!(answer.starts_with(&format!("backend={} ", backend.name)), "{}: {answer}", pod.name);
        versions.insert(pod.haproxy_version.clone());
    }
    if env.pods.len() > 1 {
        assert!(versions.len() > 1, "pods should run both HAProxy versions, got {versions:?}");
    }
    Ok(())
}

/// `make env-up` then `make env-down` on a separate address range leaves no process, no
/// network namespace and no veth behind.
#[test]
fn env_up_then_down_leaves_no_process_and_no_network_namespace_behind() -> Result<()> {
    let state = tempfile::tempdir()?;
    let dir = state.path().to_str().context("utf-8 temp dir")?.to_owned();
    let mut environment = MakeEnvironment { dir: dir.clone(), up: false };
    environment.make("env-up")?;
    environment.up = true;
    let recorded = recorded_pids(state.path())?;
    // The API server, the backends, and per pod HAProxy (plus its Dataplane API when built).
    ensure!(recorded.len() >= 4, "expected at least the apiserver, the backends and 2 HAProxy, got {recorded:?}");
    for pid in &recorded {
        ensure!(Path::new(&format!("/proc/{pid}")).exists(), "pid {pid} should be running after env-up");
    }
    // The backend host: a network namespace joined by a veth pair, answering on 198.18.2.2.
    ensure!(ip(&["netns", "list"])?.split_whitespace().any(|n| n == "haptic-env-2"), "no namespace after env-up");
    ensure!(ip(&["link", "show", "hptenv2o"]).is_ok(), "no veth after env-up");
    let ping = Command::new("ip").args(["netns", "exec", "haptic-env-2", "ip", "-4", "addr", "show"]).output()?;
    ensure!(String::from_utf8_lossy(&ping.stdout).contains("198.18.2.2/24"), "the namespace lacks 198.18.2.2");
    environment.make("env-down")?;
    environment.up = false;
    let survivors: Vec<_> = processes_mentioning(&dir)?.into_iter().chain(processes_in_groups(&recorded)?).collect();
    ensure!(survivors.is_empty(), "processes left after env-down: {survivors:?}");
    ensure!(!ip(&["netns", "list"])?.contains("haptic-env-2"), "network namespace left after env-down");
    ensure!(ip(&["link", "show", "hptenv2o"]).is_err(), "veth left after env-down");
    Ok(())
}

/// `ip ARGS`' output, or an error with what it said.
fn ip(args: &[&str]) -> Result<String> {
    let output = Command::new("ip").args(args).output()?;
    ensure!(output.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    Ok(String::from_utf8(output.stdout)?)
}

/// An environment started through `make`, stopped on drop if a check failed halfway.
struct MakeEnvironment {
    dir: String,
    up: bool,
}

impl MakeEnvironment {
    fn make(&self, target: &str) -> Result<()> {
        let output = Command::new("make")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args([target, &format!("ENV_DIR={}", self.dir), "ENV_NET=2", "PODS=2"])
            .output()?;
        ensure!(
            output.status.success(),
            "make {target} failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(())
    }
}

impl Drop for MakeEnvironment {
    fn drop(&mut self) {
        if self.up {
            let _ = self.make("env-down");
        }
    }
}

fn recorded_pids(state_dir: &Path) -> Result<Vec<u32>> {
    let text = std::fs::read_to_string(state_dir.join("processes.json"))?;
    let processes: Vec<serde_json::Value> = serde_json::from_str(&text)?;
    Ok(processes.iter().filter_map(|p| p["pid"].as_u64()).map(|pid| pid as u32).collect())
}

fn proc_entries() -> Result<Vec<(u32, String)>> {
    let mut entries = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let entry = entry?;
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) {
            entries.push((pid, stat));
        }
    }
    Ok(entries)
}

fn processes_mentioning(text: &str) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for (pid, _) in proc_entries()? {
        if let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(text) {
                found.push(format!("{pid}: {cmdline}"));
            }
        }
    }
    Ok(found)
}

fn processes_in_groups(groups: &[u32]) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for (pid, stat) in proc_entries()? {
        let after_name = &stat[stat.rfind(')').map(|i| i + 2).unwrap_or(0)..];
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        let (Some(state), Some(group)) = (fields.first(), fields.get(2).and_then(|g| g.parse::<u32>().ok())) else {
            continue;
        };
        if groups.contains(&group) && *state != "Z" {
            found.push(format!("{pid} (group {group})"));
        }
    }
    Ok(found)
}
