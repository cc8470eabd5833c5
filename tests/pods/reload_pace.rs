//! The reload pace under churn, live (issue #45, defect 1): with `minDeploymentInterval` 2 s,
//! a drift check every second and a change that needs a reload every 300 ms, each real HAProxy
//! pod reloads at most once per pace (counted by its own master), ends running the last render,
//! and is not reloaded again while nothing changes for 20 s.
//!
//! The churn lasts 20 s in `make test`; `make soak` runs the full 60 s
//! (`HAPTIC_SOAK=1`).

use crate::env;

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use env::controller::{ControllerProcess, Launch, deployment_namespace_with, every_pod_runs, own_template, rendered};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, PostParams};
use serde_json::json;

const PACE: Duration = Duration::from_secs(2);
const CHANGE_EVERY: Duration = Duration::from_millis(300);
const QUIET: Duration = Duration::from_secs(20);
const WITHIN: Duration = Duration::from_secs(60);

fn churn_length() -> Duration {
    if std::env::var_os("HAPTIC_SOAK").is_some() { Duration::from_secs(60) } else { Duration::from_secs(20) }
}

#[tokio::test]
async fn changes_every_300ms_reload_each_pod_at_most_once_per_pace_and_a_quiet_fleet_not_at_all() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let hint = format!("pace-{}", std::process::id());
    let settings = json!({"driftPreventionInterval": "1s", "minDeploymentInterval": "2s"});
    let templates = json!({"haproxyConfig": own_template(env, &hint, "")});
    let (client, namespace) = deployment_namespace_with(env, "pace", &env.pods, settings, templates).await?;
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("journal");
    let controller = ControllerProcess::launch(env, &namespace, "test", dir, &journal, &Launch::default())?;
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;

    // Every Ingress is a backend section of its own: each change needs a reload.
    let ingresses: Api<Ingress> = Api::namespaced(client, &namespace);
    let reloads_before = reloads_of_every_pod(env)?;
    let churn = churn_length();
    let started = Instant::now();
    let mut created = 0;
    while started.elapsed() < churn {
        let ingress = serde_json::from_value(json!({"metadata": {"name": format!("churn-{created}")},
            "spec": {"ingressClassName": "haproxy", "defaultBackend":
                {"service": {"name": "web", "port": {"number": 80}}}}}))?;
        ingresses.create(&PostParams::default(), &ingress).await?;
        created += 1;
        tokio::time::sleep_until((started + CHANGE_EVERY * created).into()).await;
    }
    let churned = started.elapsed();
    let last = format!("backend ingress_churn-{}", created - 1);
    controller.wait_for_config("the last change rendered", WITHIN, |config| config.contains(&last)).await?;
    every_pod_runs(&controller, env.pods.len(), &rendered(&controller)?, WITHIN).await?;
    let reloads_churned = reloads_of_every_pod(env)?;
    let allowed = (churned + PACE).as_secs() / PACE.as_secs() + 1;
    for ((pod, before), after) in env.pods.iter().zip(&reloads_before).zip(&reloads_churned) {
        let reloads = after - before;
        println!("{}: {reloads} reloads for {created} changes in {churned:?} (at most {allowed})", pod.name);
        ensure!(
            reloads <= allowed,
            "{}: {reloads} reloads for {created} changes in {churned:?} and the catch-up, at a {PACE:?} pace: \
             at most {allowed}\n{}",
            pod.name,
            controller.log_tail()
        );
    }

    // Nothing changes: drift checks every second read the pods, and nothing reloads them.
    tokio::time::sleep(QUIET).await;
    let reloads_quiet = reloads_of_every_pod(env)?;
    ensure!(
        reloads_quiet == reloads_churned,
        "pods reloaded while nothing changed for {QUIET:?}: {reloads_churned:?} → {reloads_quiet:?}\n{}",
        controller.log_tail()
    );
    Ok(())
}

fn reloads_of_every_pod(env: &env::Manifest) -> Result<Vec<u64>> {
    env.pods.iter().map(|pod| pod.reloads().with_context(|| format!("{}'s reloads", pod.name))).collect()
}
