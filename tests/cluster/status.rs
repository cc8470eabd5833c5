//! The configuration's status and Events, written by the real binary to the real API server:
//! conditions Valid, Rendered, Validated and Synced (n/m) with the observed generation; a
//! Warning Event for each failure and a Normal one for each recovery; no write when nothing
//! changed. The pod is Ready in Kubernetes with no Dataplane API behind it (docs/environment.md),
//! so Synced reports it failing; Validated stays Unknown until a pod can validate.

use crate::env;

use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use env::controller::{ControllerProcess, create_test_config, ensure_haptic_crd};
use haptic::config::{Condition, HAProxyTemplateConfig};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

async fn wait_for_status(
    configs: &Api<HAProxyTemplateConfig>,
    what: &str,
    accept: impl Fn(i64, &[Condition]) -> bool,
) -> Result<Vec<Condition>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let config = configs.get_status("test").await?;
        if let Some(status) = &config.status
            && accept(status.observed_generation.unwrap_or_default(), &status.conditions)
        {
            return Ok(status.conditions.clone());
        }
        if Instant::now() > deadline {
            bail!("{what}: not reached; status is {:#?}", config.status);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn has(conditions: &[Condition], type_: &str, status: &str, reason: &str) -> bool {
    conditions.iter().any(|c| c.type_ == type_ && c.status == status && c.reason == reason)
}

async fn events_with_reason(events: &Api<Event>, reason: &str) -> Result<Vec<Event>> {
    let all = events.list(&ListParams::default()).await?;
    Ok(all
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter(|e| e.regarding.as_ref().is_some_and(|r| r.kind.as_deref() == Some("HAProxyTemplateConfig")))
        .collect())
}

async fn wait_for_event(events: &Api<Event>, reason: &str, type_: &str) -> Result<Event> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(event) =
            events_with_reason(events, reason).await?.into_iter().find(|e| e.type_.as_deref() == Some(type_))
        {
            return Ok(event);
        }
        if Instant::now() > deadline {
            bail!("no {type_} Event {reason} on the configuration");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn conditions_and_events_follow_failures_and_recoveries_and_nothing_is_rewritten_idly() -> Result<()> {
    let env = env::environment();
    let client = env.kube_client().await?;
    ensure_haptic_crd(&client).await?;
    let namespace = env.fresh_namespace(&client, "status").await?;
    env::fixtures::dataplane_secret(&client, &namespace, "admin", "status-secret").await?;
    env::fixtures::ghost_pod(&client, &namespace, "ghost", "127.1.9.41", "status").await?;
    let good = "global\n    maxconn 100\n";
    create_test_config(
        &client,
        &namespace,
        json!({
            "podSelector": {"matchLabels": {"haptic.dev/test": "status"}},
            "watchedResources": {"services": {"apiVersion": "v1", "kind": "Service", "namespaces": [namespace]}},
            "dataplane": {"credentialsSecretRef": {"name": "dataplane"}},
            "templates": {"haproxyConfig": good}
        }),
    )
    .await?;
    let configs: Api<HAProxyTemplateConfig> = Api::namespaced(client.clone(), &namespace);
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let controller = ControllerProcess::start(env, &namespace, "test")?;

    let conditions = wait_for_status(&configs, "generation 1 failing on its pod", |generation, c| {
        generation == 1
            && has(c, "Valid", "True", "Accepted")
            && has(c, "Rendered", "True", "Rendered")
            && has(c, "Validated", "Unknown", "NotValidatedYet")
            && has(c, "Synced", "False", "PodsFailing")
    })
    .await?;
    let synced = conditions.iter().find(|c| c.type_ == "Synced").map(|c| c.message.clone()).unwrap_or_default();
    ensure!(synced.starts_with("0/1 pods in sync; failing: ghost (") && synced.contains("127.1.9.41:5555"), "{synced}");
    let warning = wait_for_event(&events, "PodsFailing", "Warning").await?;
    ensure!(warning.note.as_deref().is_some_and(|n| n.contains("ghost")), "{warning:?}");

    // Idle: the pod keeps failing the same way; neither the status nor the Events move.
    let before = configs.get_status("test").await?.metadata.resource_version;
    env::holds_throughout(Duration::from_secs(4), "the status was rewritten with nothing changed", || async {
        Ok(configs.get_status("test").await?.metadata.resource_version == before)
    })
    .await?;
    ensure!(events_with_reason(&events, "PodsFailing").await?.len() == 1, "a failure is announced once");

    // A template that compiles but fails to render: Rendered False, a Warning; then fixed.
    let broken = Patch::Merge(json!({"spec": {"templates": {"haproxyConfig": "{{ resources.services.get('x') }}"}}}));
    configs.patch("test", &PatchParams::default(), &broken).await?;
    let conditions = wait_for_status(&configs, "generation 2's render failure", |generation, c| {
        generation == 2 && has(c, "Rendered", "False", "RenderFailed")
    })
    .await?;
    let rendered = conditions.iter().find(|c| c.type_ == "Rendered").map(|c| c.message.clone()).unwrap_or_default();
    ensure!(
        rendered.contains("haproxy.cfg line 1") && rendered.contains("last good configuration stays"),
        "{rendered}"
    );
    wait_for_event(&events, "RenderFailed", "Warning").await?;
    ensure!(controller.file("haproxy.cfg").contains("maxconn 100"), "the last good render stays");

    let fixed = Patch::Merge(json!({"spec": {"templates": {"haproxyConfig": good}}}));
    configs.patch("test", &PatchParams::default(), &fixed).await?;
    wait_for_status(&configs, "generation 3 rendered", |generation, c| {
        generation == 3 && has(c, "Rendered", "True", "Rendered")
    })
    .await?;
    let recovery = wait_for_event(&events, "Rendered", "Normal").await?;
    ensure!(recovery.note.as_deref().is_some_and(|n| n.contains("1 files rendered")), "{recovery:?}");
    Ok(())
}
