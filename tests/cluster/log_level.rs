//! The log filter from the configuration (#16), live: `spec.logLevel` takes effect in the
//! running controller at activation (warn silences info lines, debug adds debug lines, absent
//! goes back to the controller's own), and one that is not a filter is refused as a problem.

use crate::env;

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use env::controller::{ControllerProcess, Launch};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// Waits for the line saying the filter changed to `level`, then returns how many lines the log
/// holds a moment later: lines after that count were all written under the new filter.
///
/// The moment matters: the marker is said just before the switch when only the old filter shows
/// it, and a line another thread had already let through may land just after it.
async fn lines_after_switch(controller: &ControllerProcess, level: Option<&str>) -> Result<usize> {
    let marker = format!("log_level={level:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let switched = controller
            .log_text()
            .lines()
            .any(|l| l.contains("log filter from the configuration") && l.contains(&marker));
        if switched {
            tokio::time::sleep(Duration::from_millis(300)).await;
            return Ok(controller.log_text().lines().count());
        }
        ensure!(Instant::now() < deadline, "the controller never took log level {level:?}:\n{}", controller.log_tail());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn the_configurations_log_level_takes_effect_without_a_restart() -> Result<()> {
    let env = env::environment();
    let template = "global\n{% for i in resources.ingresses.list() %}# {{ i.metadata.name | bare_word }}\n{% endfor %}";
    let (client, namespace, configs) =
        env::controller::ingress_test_namespace(env, "log-level", json!({"templates": {"haproxyConfig": template}}))
            .await?;
    let launch = Launch {
        env: vec![("RUST_LOG".into(), "info".into())],
        args: vec!["--render-only".into()],
        ..Launch::default()
    };
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("journal");
    let controller = ControllerProcess::launch(env, &namespace, "test", dir, &journal, &launch)?;
    controller.wait_for_config("the first render", Duration::from_secs(30), |c| c.starts_with("global")).await?;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    let mut made = 0;
    let mut change = |level: &str| {
        made += 1;
        let name = format!("after-{level}-{made}");
        let object: Ingress = serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"defaultBackend": {"service": {"name": "web", "port": {"number": 80}}}}}))
        .expect("an Ingress");
        (name, object)
    };
    let set = |level: Option<&str>| Patch::Merge(json!({"spec": {"logLevel": level}}));

    for (level, shown, hidden) in [("warn", None, Some(" INFO ")), ("debug", Some(" DEBUG "), None)] {
        configs.patch("test", &PatchParams::default(), &set(Some(level))).await?;
        let from = lines_after_switch(&controller, Some(level)).await?;
        let (name, object) = change(level);
        ingresses.create(&PostParams::default(), &object).await?;
        controller.wait_for_config(&format!("{name} rendered"), Duration::from_secs(30), |c| c.contains(&name)).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let log = controller.log_text();
        let after: Vec<&str> = log.lines().skip(from).collect();
        if let Some(hidden) = hidden {
            ensure!(
                !after.iter().any(|l| l.contains(hidden)),
                "{level}: {hidden:?} lines still written:\n{}",
                after.join("\n")
            );
        }
        if let Some(shown) = shown {
            ensure!(after.iter().any(|l| l.contains(shown)), "{level}: no {shown:?} line:\n{}", after.join("\n"));
        }
    }
    // Absent: the controller's own filter again (RUST_LOG=info here).
    configs.patch("test", &PatchParams::default(), &set(None)).await?;
    let from = lines_after_switch(&controller, None).await?;
    let (name, object) = change("default");
    ingresses.create(&PostParams::default(), &object).await?;
    controller.wait_for_config(&format!("{name} rendered"), Duration::from_secs(30), |c| c.contains(&name)).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = controller.log_text();
    let after: Vec<&str> = log.lines().skip(from).collect();
    ensure!(
        after.iter().any(|l| l.contains(" INFO ")) && !after.iter().any(|l| l.contains(" DEBUG ")),
        "{}",
        after.join("\n")
    );

    // Not a filter: the version is refused, the previous one stays.
    configs.patch("test", &PatchParams::default(), &set(Some("haptic=loudest"))).await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = configs.get_status("test").await?.status.unwrap_or_default();
        if let Some(valid) = status.conditions.iter().find(|c| c.type_ == "Valid" && c.status == "False") {
            ensure!(valid.message.contains("spec.logLevel: is not a log filter"), "{valid:#?}");
            break;
        }
        ensure!(Instant::now() < deadline, "a log level that is no filter was not refused: {status:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}
