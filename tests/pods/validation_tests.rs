//! Validation tests in the configuration (#16), live: a version whose tests fail is not
//! activated (Valid=False, ValidationTestFailed, the failing assertion in the condition and a
//! Warning Event) while the previous one keeps serving, and `haptic validate` fails on it with
//! the same message.

use crate::env;

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use env::controller::{ControllerProcess, Launch};
use haptic::config::HAProxyTemplateConfig;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

#[tokio::test]
async fn a_version_whose_validation_tests_fail_is_not_activated_and_haptic_validate_says_the_same() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let tag = format!("validation-{}", std::process::id());
    let template = env::controller::own_template(env, &tag, "");
    let passing = json!([{"name": "own-marker", "assertions": [{"contains": format!("# test {tag}")}]}]);
    let (client, namespace) = env::controller::deployment_namespace_with(
        env,
        "validation-tests",
        &env.pods,
        json!({"driftPreventionInterval": "3s"}),
        json!({"haproxyConfig": template}),
    )
    .await?;
    let configs: Api<HAProxyTemplateConfig> = Api::namespaced(client.clone(), &namespace);
    configs
        .patch("test", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"validationTests": passing}})))
        .await?;
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("journal");
    let controller = ControllerProcess::launch(env, &namespace, "test", dir, &journal, &Launch::default())?;
    controller.wait_all_in_sync(env.pods.len(), Duration::from_secs(60)).await?;

    // A new version: another configuration, with a test it fails.
    let broken_tag = format!("{tag}-broken");
    let failing = json!([
        {"name": "own-marker", "assertions": [{"contains": format!("# test {broken_tag}")}]},
        {"name": "api-backend", "description": "the library must keep its API backend",
         "assertions": [{"notContains": "server-state"}, {"contains": "backend be_api"}]}
    ]);
    let patch = json!({"spec": {
        "templates": {"haproxyConfig": env::controller::own_template(env, &broken_tag, "")},
        "validationTests": failing
    }});
    let patched = configs.patch("test", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    let expected = "validation test \"api-backend\", assertion 1: haproxy.cfg does not contain \"backend be_api\"";
    let deadline = Instant::now() + Duration::from_secs(30);
    let condition = loop {
        let status = configs.get_status("test").await?.status.unwrap_or_default();
        if let Some(valid) = status.conditions.iter().find(|c| c.type_ == "Valid" && c.status == "False") {
            break valid.clone();
        }
        ensure!(
            Instant::now() < deadline,
            "the failing version was not refused: {status:#?}\n{}",
            controller.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    ensure!(condition.reason == "ValidationTestFailed", "{condition:#?}");
    ensure!(condition.message.contains(expected), "the condition does not name the failing assertion: {condition:#?}");
    ensure!(
        !condition.message.contains("own-marker"),
        "a passing test is not reported as failing: {}",
        condition.message
    );
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found = events.list(&ListParams::default()).await?.items.into_iter().any(|e| {
            e.reason.as_deref() == Some("ValidationTestFailed")
                && e.type_.as_deref() == Some("Warning")
                && e.note.as_deref().is_some_and(|note| note.contains(expected))
        });
        if found {
            break;
        }
        ensure!(Instant::now() < deadline, "no Warning Event ValidationTestFailed naming the assertion");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The previous version keeps serving: every pod still runs its render, drift checks and all.
    env::holds_throughout(Duration::from_secs(4), "a pod stopped running the last good version", || async {
        for pod in &env.pods {
            let raw = env.dataplane(pod).raw_configuration().await?.text;
            if !raw.contains(&format!("# test {tag}\n")) || raw.contains(&broken_tag) {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .await?;
    controller.wait_all_in_sync(env.pods.len(), Duration::from_secs(10)).await?;

    // `haptic validate` on the same configuration: non-zero, the same message.
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), serde_json::to_string(&patched)?)?;
    let output = Command::new(env!("CARGO_BIN_EXE_haptic"))
        .args(["validate", "--no-requests", "--config"])
        .arg(file.path())
        .output()
        .context("running haptic validate")?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    if output.status.success() {
        bail!("haptic validate passed a failing configuration:\n{stdout}");
    }
    ensure!(stderr.contains(expected), "haptic validate said something else:\n{stderr}");
    ensure!(stdout.contains("ok   own-marker") && stdout.contains("FAIL api-backend"), "{stdout}");
    Ok(())
}

/// Routes each Ingress's host to its own backend through a map.
const ROUTING: &str = "global\n    maxconn 100\ndefaults\n    mode http\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n\
frontend http\n    bind 127.0.0.1:80\n    use_backend %[req.hdr(host),lower,map({{ map_path(\"hosts.map\") }})]\n    default_backend none\n\
backend none\n    http-request return status 404\n\
{% for i in resources.ingresses.list() %}backend ingress_{{ i.metadata.name | bare_word }}\n    server s1 10.0.0.1:80\n{% endfor %}";
const HOSTS: &str = "{% for i in resources.ingresses.list() %}{% for r in i.spec.rules or [] %}{{ r.host | map_key }} ingress_{{ i.metadata.name | bare_word }}\n{% endfor %}{% endfor %}";

/// The chart's way inside a cluster, where the controller's image has no HAProxy: the
/// validation tests' requests go through the validator's HAProxy (its Dataplane API beside the
/// controller), the render's map in its storage and its binds moved to loopback ports.
#[tokio::test]
async fn the_controller_runs_the_tests_requests_through_the_validator() -> Result<()> {
    let env = env::environment();
    let _validator = env::exclusive_validator().await;
    let fixture = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": "shop", "namespace": "web"},
        "spec": {"rules": [{"host": "shop.example.com"}]}});
    let tests = |backend: &str| {
        json!([{"name": "routing", "fixtures": [fixture.clone()], "assertions": [
            {"request": {"host": "shop.example.com", "path": "/cart", "expect": {"backend": backend}}},
            {"request": {"host": "unknown.example.com", "expect": {"status": 404}}}
        ]}])
    };
    let spec = json!({
        "templates": {"haproxyConfig": ROUTING, "maps": {"hosts.map": HOSTS}},
        "dataplane": {"mapsDir": "/var/run/haproxy/maps", "certsDir": "/var/run/haproxy/ssl",
                      "generalDir": "/var/run/haproxy/general"},
        "validationTests": tests("ingress_shop")
    });
    let (_client, namespace, configs) =
        env::controller::ingress_test_namespace(env, "validator-requests", spec).await?;
    let launch = Launch::validated(env, &["--render-only"]);
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("journal");
    let controller = ControllerProcess::launch(env, &namespace, "test", dir, &journal, &launch)?;
    controller.wait_for_config("the first version", Duration::from_secs(60), |c| c.contains("backend none")).await?;
    let log = controller.log_text();
    ensure!(
        log.contains("validation tests passed") && log.contains("skipped_requests=0"),
        "the requests were not run:\n{}",
        controller.log_tail()
    );

    // A version whose test expects another backend: refused, the request named.
    configs
        .patch(
            "test",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"validationTests": tests("ingress_cart")}})),
        )
        .await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let message = loop {
        let status = configs.get_status("test").await?.status.unwrap_or_default();
        if let Some(valid) = status.conditions.iter().find(|c| c.type_ == "Valid" && c.status == "False") {
            break valid.message.clone();
        }
        ensure!(Instant::now() < deadline, "the failing version was not refused:\n{}", controller.log_tail());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    ensure!(
        message.contains("GET shop.example.com/cart")
            && message.contains("backend ingress_shop (expected ingress_cart)"),
        "{message}"
    );
    Ok(())
}
