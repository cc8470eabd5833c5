//! The fleet against the real API server and the real binary, where the Dataplane API side is
//! genuinely absent: a Ready pod whose address has no Dataplane API behind it. The controller
//! must journal it with its error, back off, and resume from the journal after a restart.
//! (Deployment to live pods needs the Dataplane API, which cannot be built here yet; see
//! docs/environment.md.)

use crate::env;

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use env::controller::{ControllerProcess, create_test_config, ensure_haptic_crd};
use haptic::journal::Journal;
use haptic::pod::{PodUid, State};
use serde_json::json;

#[tokio::test]
async fn an_unreachable_pod_is_journaled_with_its_error_backs_off_and_resumes_after_a_restart() -> Result<()> {
    let env = env::environment();
    let client = env.kube_client().await?;
    ensure_haptic_crd(&client).await?;
    let namespace = env.fresh_namespace(&client, "fleet-unreachable").await?;

    env::fixtures::dataplane_secret(&client, &namespace, "admin", "not-logged-anywhere").await?;
    // Nothing listens on 127.1.9.9: the pod is Ready in Kubernetes but its Dataplane API is gone.
    let uid = PodUid(env::fixtures::ghost_pod(&client, &namespace, "ghost", "127.1.9.9", "ghost").await?);

    create_test_config(
        &client,
        &namespace,
        json!({
            "podSelector": {"matchLabels": {"haptic.dev/test": "ghost"}},
            "watchedResources": {"services": {"apiVersion": "v1", "kind": "Service", "namespaces": [namespace]}},
            "dataplane": {"credentialsSecretRef": {"name": "dataplane"}},
            "templates": {"haproxyConfig": "global\n    maxconn 100\n"}
        }),
    )
    .await?;

    let dir = tempfile::tempdir()?;
    let journal_dir = dir.path().join("journal");
    let controller = ControllerProcess::start_in(env, &namespace, "test", dir, &journal_dir)?;
    // Verification fails at once, then after 1 s and 2 s of backoff: wait for two attempts.
    let api = controller.api_url().await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        // (No record yet: not found.)
        let answer = reqwest::get(format!("{api}/api/v1/pods/{namespace}/ghost?limit=2")).await?;
        let one: serde_json::Value = if answer.status().is_success() { answer.json().await? } else { json!({}) };
        if one["transitions"].as_array().is_some_and(|t| t.len() == 2) {
            break;
        }
        ensure!(std::time::Instant::now() < deadline, "no second attempt within 20 s: {one}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The HTTP API shows the same, and keeps the password to itself.
    let answer = reqwest::get(format!("{api}/api/v1/pods")).await?.text().await?;
    let pods: serde_json::Value = serde_json::from_str(&answer)?;
    ensure!(pods["pods"][0]["uid"] == uid.0.as_str() && pods["pods"][0]["state"] == "Unknown", "{answer}");
    ensure!(pods["pods"][0]["lastError"].as_str().is_some_and(|e| e.contains("127.1.9.9:5555")), "{answer}");
    ensure!(!answer.contains("not-logged-anywhere"), "the API must never show the password");
    let metrics = reqwest::get(format!("{api}/metrics")).await?.text().await?;
    ensure!(metrics.contains("haptic_pods{state=\"Unknown\"} 1"), "{metrics}");
    ensure!(metrics.contains("haptic_renders_total{outcome=\"ok\"}"), "{metrics}");
    let one: serde_json::Value =
        reqwest::get(format!("{api}/api/v1/pods/{namespace}/ghost?limit=2")).await?.json().await?;
    ensure!(one["transitions"].as_array().is_some_and(|t| t.len() == 2), "{one}");
    let log = controller.log_text();
    ensure!(!log.contains("not-logged-anywhere"), "the Dataplane password appeared in the log");
    let dir = controller.kill();

    let (journal, report) = Journal::open(&journal_dir, 100)?;
    ensure!(report.moved_aside.is_none(), "the journal of a killed controller must still open: {report:?}");
    let record = journal.pod(&uid)?.with_context(|| format!("no journal record for the pod; log:\n{log}"))?;
    ensure!(record.state == State::Unknown, "an unreachable pod stays Unknown, got {:?}", record.state);
    let error = record.last_transition.error.clone().unwrap_or_default();
    ensure!(
        error.contains("unreachable") && error.contains("127.1.9.9:5555"),
        "error names the pod's endpoint: {error}"
    );
    let failures = journal.transitions(&uid, 0, 100)?.iter().filter(|t| t.error.is_some()).count();
    ensure!(failures >= 2, "expected repeated, backed-off attempts, got {failures}");
    let seq_before = record.last_transition.seq;
    drop(journal);

    // Restart on the same journal: the record is resumed and the attempts go on from it.
    let controller = ControllerProcess::start_in(env, &namespace, "test", dir, &journal_dir)?;
    let api = controller.api_url().await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let answer = reqwest::get(format!("{api}/api/v1/pods/{namespace}/ghost?limit=1")).await?;
        let one: serde_json::Value = if answer.status().is_success() { answer.json().await? } else { json!({}) };
        if one["pod"]["lastTransition"]["seq"].as_u64().is_some_and(|seq| seq > seq_before) {
            break;
        }
        ensure!(std::time::Instant::now() < deadline, "no attempt after the restart within 20 s: {one}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = controller.log_text();
    // Keep the directory (and the journal in it) alive until the end of the test.
    let _dir = controller.kill();
    let (journal, report) = Journal::open(&journal_dir, 100)?;
    ensure!(report.moved_aside.is_none(), "{report:?}");
    let resumed = journal.pod(&uid)?.with_context(|| format!("no record after the restart; log:\n{log}"))?;
    ensure!(resumed.last_transition.seq > seq_before, "the restarted controller continued the pod's log");
    Ok(())
}
