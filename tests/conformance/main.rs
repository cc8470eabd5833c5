//! The official Gateway API conformance suite (`sigs.k8s.io/gateway-api/conformance`, the
//! version `tests/env/gwconformance/go.mod` names), run unmodified against haptic: the real
//! `haptic` binary on the chart's configuration, configuring the environment's real HAProxy
//! pods through their Dataplane APIs, each Gateway with a Service of its own
//! (`gatewayServices`), in the environment's cluster mode (`envctl.py up --cluster`: Pods run by
//! the process kubelet, all inside the network namespace the mode runs in). This binary must
//! run inside that namespace: `tests/conformance/run` starts it there.
//!
//! `HAPTIC_CONFORMANCE=core` (the default, `make test`) runs the GATEWAY-HTTP core tests only;
//! `HAPTIC_CONFORMANCE=full` (`make conformance`) runs the profiles of `HAPTIC_CONFORMANCE_PROFILES`
//! with the features of `HAPTIC_CONFORMANCE_FEATURES` (else those the GatewayClass's status
//! publishes), and keeps the suite's report in `HAPTIC_CONFORMANCE_REPORT`.

#[path = "../env/mod.rs"]
mod env;

use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail, ensure};
use env::controller::ControllerProcess;
use env::standalone::{apply_library_config_for_pods_with, library_namespace};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use serde_json::json;

/// The release the chart's configuration is rendered as.
const RELEASE: &str = "conformance";
/// The suite's default GatewayClass name, served by this controller name.
const GATEWAY_CLASS: &str = "gateway-conformance";
const CONTROLLER_NAME: &str = "haptic.dev/gateway-controller";
/// The core features of GATEWAY-HTTP: naming them stops the suite from inferring more.
const CORE_FEATURES: &str = "Gateway,HTTPRoute,ReferenceGrant";

#[tokio::test(flavor = "multi_thread")]
async fn the_official_gateway_api_conformance_suite_passes() -> Result<()> {
    let env = env::environment();
    let manifest: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(env.state_dir.join("env.json"))?)?;
    ensure!(
        manifest["cluster"].is_object(),
        "the environment in {} is not in cluster mode: the suite needs Pods that run; use `make conformance` or \
         tests/conformance/run",
        env.state_dir.display()
    );
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "conformance").await?;
    let all = "{}".to_owned();
    apply_library_config_for_pods_with(
        &client,
        &namespace,
        RELEASE,
        &[
            ("gatewayAPI.enabled", "true".into()),
            ("gatewayAPI.controllerName", CONTROLLER_NAME.into()),
            ("gatewayAPI.gatewayClass.create", "false".into()),
            ("gatewayAPI.gatewayServices.enabled", "true".into()),
            ("gatewayAPI.gatewayServices.firstPort", "20000".into()),
            ("gatewayAPI.gatewayServices.lastPort", "20999".into()),
            ("config.watchedResources.services.namespaces", all.clone()),
            ("config.watchedResources.endpoints.namespaces", all.clone()),
            ("config.watchedResources.secrets.namespaces", all),
        ],
    )
    .await?;
    default_certificate(&client, &namespace).await?;
    let controller = ControllerProcess::launch_library(env, &namespace, &env.state_dir.join("conformance-journal"))?;
    env::gateway::create(
        &client,
        "GatewayClass",
        None,
        json!({"metadata": {"name": GATEWAY_CLASS}, "spec": {"controllerName": CONTROLLER_NAME}}),
    )
    .await?;
    // The suite reads the class's supported features before it waits for anything.
    class_accepted(&client).await?;

    let outcome = run_suite(env);
    if outcome.is_err() {
        eprintln!("haptic's log (last lines):\n{}", controller.log_tail());
    }
    outcome
}

/// Waits until haptic has accepted the class and published its features.
async fn class_accepted(client: &kube::Client) -> Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let status = env::gateway::status_of(client, "GatewayClass", None, GATEWAY_CLASS).await?;
        let accepted = status["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["type"] == "Accepted" && c["status"] == "True"));
        if accepted && status["supportedFeatures"].as_array().is_some_and(|f| !f.is_empty()) {
            return Ok(());
        }
        ensure!(std::time::Instant::now() < deadline, "GatewayClass {GATEWAY_CLASS} was not accepted: {status}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// The chart's default certificate, which the library's HTTPS frontend names.
async fn default_certificate(client: &kube::Client, namespace: &str) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (certificate, key) = env::fixtures::self_signed(dir.path(), "haptic-default", &["rsa:2048"])?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": format!("{RELEASE}-haptic-default-cert")}, "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": certificate, "tls.key": key}
    }))?;
    Api::namespaced(client.clone(), namespace).create(&PostParams::default(), &secret).await?;
    Ok(())
}

/// Runs the suite's test binary and judges its outcome.
fn run_suite(env: &env::Manifest) -> Result<()> {
    let mode = std::env::var("HAPTIC_CONFORMANCE").unwrap_or_else(|_| "core".into());
    let suite = env::cache_dir().join("bin/gwconformance.test");
    ensure!(
        suite.exists(),
        "{} is missing: `python3 tests/env/envctl.py conformance-build` builds it",
        suite.display()
    );
    let mut args = vec![
        "-test.run=TestConformance".to_owned(),
        "-test.timeout=2h".into(),
        "-test.v".into(),
        format!("--gateway-class={GATEWAY_CLASS}"),
        "--cleanup-base-resources=true".into(),
    ];
    let report = match mode.as_str() {
        "core" => {
            args.push("--conformance-profiles=GATEWAY-HTTP".into());
            args.push(format!("--supported-features={CORE_FEATURES}"));
            None
        }
        "full" => {
            let profiles = std::env::var("HAPTIC_CONFORMANCE_PROFILES").unwrap_or_else(|_| "GATEWAY-HTTP".into());
            args.push(format!("--conformance-profiles={profiles}"));
            // Without it, the suite reads the features from the GatewayClass's status.
            if let Ok(features) = std::env::var("HAPTIC_CONFORMANCE_FEATURES") {
                args.push(format!("--supported-features={features}"));
            }
            let report = std::env::var("HAPTIC_CONFORMANCE_REPORT")
                .map(PathBuf::from)
                .unwrap_or_else(|_| env.state_dir.join("conformance-report.yaml"));
            args.extend([
                format!("--report-output={}", report.display()),
                "--organization=haptic".into(),
                "--project=haptic".into(),
                "--url=https://github.com/haptic-dev/haptic".into(),
                format!("--version=v{}", env!("CARGO_PKG_VERSION")),
                "--contact=https://github.com/haptic-dev/haptic/issues".into(),
            ]);
            Some(report)
        }
        other => bail!("HAPTIC_CONFORMANCE={other}: core or full"),
    };
    if let Ok(extra) = std::env::var("HAPTIC_CONFORMANCE_ARGS") {
        args.extend(extra.split_whitespace().map(str::to_owned));
    }
    eprintln!("running {} {}", suite.display(), args.join(" "));
    let log = env.state_dir.join("conformance.log");
    let status = Command::new(&suite)
        .args(&args)
        .env("KUBECONFIG", &env.kubeconfig)
        .stdout(std::fs::File::create(&log)?)
        .stderr(Stdio::inherit())
        .status()
        .context("running the conformance suite")?;
    let text = std::fs::read_to_string(&log)?;
    let passed: Vec<&str> = text.lines().filter(|l| l.trim_start().starts_with("--- PASS: TestConformance/")).collect();
    let failed: Vec<&str> = text.lines().filter(|l| l.trim_start().starts_with("--- FAIL: TestConformance/")).collect();
    eprintln!("conformance ({mode}): {} passed, {} failed; log: {}", passed.len(), failed.len(), log.display());
    for line in &failed {
        eprintln!("  {}", line.trim());
    }
    if let Some(report) = report {
        eprintln!("report: {}", report.display());
    }
    ensure!(status.success() && failed.is_empty(), "the conformance suite failed ({status}); see {}", log.display());
    Ok(())
}
