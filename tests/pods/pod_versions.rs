//! Version-aware pods (#16), live: every pod's HAProxy and Dataplane API versions in
//! `/api/v1/pods`, and a pod whose HAProxy is older than the configuration's minimum given
//! nothing and shown refused, until the minimum allows it.

use crate::env;

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use env::controller::{ControllerProcess, Launch};
use haptic::config::{HAProxyTemplateConfig, HaproxyVersion};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

#[tokio::test]
async fn a_pod_below_the_minimum_haproxy_is_refused_and_shown_and_deployed_once_the_minimum_allows_it() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let minimum = HaproxyVersion::parse("2.7").expect("a version");
    let old = |version: &str| HaproxyVersion::parse(version).is_none_or(|v| v < minimum);
    let old_pods: Vec<_> = env.pods.iter().filter(|pod| old(&pod.haproxy_version)).collect();
    ensure!(
        !old_pods.is_empty() && old_pods.len() < env.pods.len(),
        "the environment must run HAProxy both older and newer than {minimum}: {:?}",
        env.pods.iter().map(|p| &p.haproxy_version).collect::<Vec<_>>()
    );
    let tag = format!("versions-{}", std::process::id());
    let template = env::controller::own_template(env, &tag, "");
    let dataplane = json!({"driftPreventionInterval": "2s", "minimumHAProxyVersion": "2.7"});
    let (client, namespace) = env::controller::deployment_namespace_with(
        env,
        "pod-versions",
        &env.pods,
        dataplane,
        json!({"haproxyConfig": template}),
    )
    .await?;
    let mut writes_before = Vec::new();
    for pod in &old_pods {
        writes_before.push(env.writes(pod).await?);
    }
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("journal");
    let controller = ControllerProcess::launch(env, &namespace, "test", dir, &journal, &Launch::default())?;

    let version_of = |name: &str| env.pods.iter().find(|p| p.name == name).map(|p| p.haproxy_version.clone());
    let shown = controller
        .wait_for_pods(
            "versions shown, old pods refused, the others in sync",
            env.pods.len(),
            Duration::from_secs(60),
            |pod| {
                let Some(version) = pod["name"].as_str().and_then(version_of) else { return false };
                let versions_shown = pod["haproxyVersion"].as_str().is_some_and(|v| v.starts_with(&version))
                    && pod["dataplaneApiVersion"].as_str().is_some_and(|v| v.starts_with("v3."));
                let error = pod["lastError"].as_str().unwrap_or_default();
                let expected = if old(&version) {
                    pod["state"] == "Unknown"
                        && error.contains(&version)
                        && error.contains("2.7.0")
                        && error.contains("refused")
                } else {
                    pod["state"] == "InSync"
                };
                versions_shown && expected
            },
        )
        .await?;
    // Drift checks come and go (every 2 s): the old pods are read, never written.
    env::holds_throughout(Duration::from_secs(5), "an old pod was written to, or runs this render", || async {
        for (pod, before) in old_pods.iter().zip(&writes_before) {
            let raw = env.dataplane(pod).raw_configuration().await?.text;
            if env.writes(pod).await? != *before || raw.contains(&format!("# test {tag}")) {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .await
    .with_context(|| format!("{shown:#?}"))?;
    let still: Vec<_> = controller.pods_view().await?;
    for pod in &still {
        let refused = pod["name"].as_str().and_then(version_of).is_some_and(|v| old(&v));
        ensure!(!refused || pod["state"] == "Unknown", "a refused pod stays refused: {pod:#?}");
    }

    // The minimum lowered: every pod is deployed to.
    let configs: Api<HAProxyTemplateConfig> = Api::namespaced(client.clone(), &namespace);
    let patch = json!({"spec": {"dataplane": {"minimumHAProxyVersion": "2.6"}}});
    configs.patch("test", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    let pods = controller.wait_all_in_sync(env.pods.len(), Duration::from_secs(60)).await?;
    ensure!(pods.iter().all(|p| p["lastError"].is_null()), "{pods:#?}");
    for pod in &old_pods {
        let raw = env.dataplane(pod).raw_configuration().await?.text;
        ensure!(raw.contains(&format!("# test {tag}")), "{} now runs the render", pod.name);
    }
    Ok(())
}
