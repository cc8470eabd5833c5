//! The HTTP API of the real binary, checked against its own OpenAPI document by schemathesis
//! (from PyPI, installed by `make env-install`): every route, status and body must match.

use crate::env;

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use env::controller::{ControllerProcess, create_test_config, ensure_haptic_crd};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use serde_json::json;

#[tokio::test]
async fn the_api_matches_its_openapi_document() -> Result<()> {
    let env = env::environment();
    let client = env.kube_client().await?;
    ensure_haptic_crd(&client).await?;
    let namespace = env.fresh_namespace(&client, "api-schema").await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let secret = serde_json::from_value(json!({"metadata": {"name": "dataplane"},
        "stringData": {"dataplane_username": "admin", "dataplane_password": "x"}}))?;
    secrets.create(&PostParams::default(), &secret).await?;
    create_test_config(
        &client,
        &namespace,
        json!({
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "haproxy"}},
            "watchedResources": {"services": {"apiVersion": "v1", "kind": "Service", "namespaces": [namespace]}},
            "dataplane": {"credentialsSecretRef": {"name": "dataplane"}},
            "templates": {"haproxyConfig": "global\n", "maps": {"host.map": "a b\n"}}
        }),
    )
    .await?;
    let controller = ControllerProcess::start(env, &namespace, "test")?;
    let api = controller.api_url().await?;
    // Every pod with a journal record first, so the pod routes have something to show.
    controller
        .wait_for_pods("a journal record for every pod", env.pods.len(), Duration::from_secs(30), |pod| {
            pod["lastTransition"].is_object()
        })
        .await?;

    let st = schemathesis()?;
    // schemathesis keeps a cache in its working directory; keep it out of the project.
    let scratch = tempfile::tempdir()?;
    let output = Command::new(&st)
        .current_dir(scratch.path())
        .args([
            "run",
            &format!("{api}/api/v1/openapi.json"),
            "--checks",
            "all",
            "--max-examples",
            "30",
            "--seed",
            "20261202",
        ])
        .args(["--url", &api])
        .output()
        .context("running schemathesis")?;
    let report = String::from_utf8_lossy(&output.stdout);
    println!("{report}");
    ensure!(report.contains("passed"), "schemathesis ran no test:\n{report}");
    ensure!(
        output.status.success(),
        "schemathesis found the API and its document disagreeing:\n{}{}\n--- controller log ---\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        controller.log_tail()
    );
    Ok(())
}

fn schemathesis() -> Result<std::path::PathBuf> {
    let cache = crate::env::cache_dir();
    let st = cache.join("schemathesis-venv/bin/st");
    ensure!(st.exists(), "{} is missing; run `make env-install`", st.display());
    Ok(st)
}
