//! `haptic migrate-check` on 30 Ingresses written as ingress-nginx users write them
//! (tests/migrate/ingress-nginx/): from the directory, the expected table and exit status;
//! from the real API server, the same verdicts.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, PostParams};
use serde_json::Value as Json;

use crate::env;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

const FIXTURES: &str = "tests/migrate/ingress-nginx";

/// The verdicts of a JSON report as comparable rows, with namespaces mapped by `rename`.
fn verdicts(report: &Json, rename: &dyn Fn(&str) -> String) -> BTreeSet<String> {
    let mut rows = BTreeSet::new();
    for ingress in report["ingresses"].as_array().into_iter().flatten() {
        rows.insert(format!("{} {}", rename(ingress["ingress"].as_str().unwrap_or_default()), ingress["fate"]));
    }
    for row in report["annotations"].as_array().into_iter().flatten() {
        rows.insert(format!(
            "{} {} {} {}",
            rename(row["ingress"].as_str().unwrap_or_default()),
            row["annotation"],
            row["outcome"],
            row["detail"]
        ));
    }
    rows
}

#[test]
fn migrate_check_of_a_directory_gives_the_expected_table_and_fails_on_refusals() -> Result<()> {
    let output = Command::new(env!("CARGO_BIN_EXE_haptic"))
        .args(["migrate-check", "--dir", FIXTURES])
        .current_dir(repo())
        .output()?;
    let expected = std::fs::read_to_string(repo().join("tests/migrate/ingress-nginx.expected"))?;
    let table = String::from_utf8(output.stdout)?;
    ensure!(table == expected, "the table differs from tests/migrate/ingress-nginx.expected:\n{table}");
    ensure!(!output.status.success(), "two Ingresses would be refused: the command must fail");
    let stderr = String::from_utf8(output.stderr)?;
    ensure!(stderr.contains("2 of 30 Ingresses would be refused"), "{stderr}");

    let json = Command::new(env!("CARGO_BIN_EXE_haptic"))
        .args(["migrate-check", "--dir", FIXTURES, "--format", "json"])
        .current_dir(repo())
        .output()?;
    let report: Json = serde_json::from_slice(&json.stdout).context("--format json prints one JSON document")?;
    ensure!(report["ingresses"].as_array().map(Vec::len) == Some(30), "{report}");
    let refused = report["ingresses"].as_array().into_iter().flatten().filter(|i| i["fate"] == "refused").count();
    ensure!(refused == 2, "{refused} refused");

    // Without the two (27 and 28), nothing is refused and the command succeeds.
    let served = tempfile::tempdir()?;
    for entry in std::fs::read_dir(repo().join(FIXTURES))? {
        let path = entry?.path();
        let number: u32 = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.get(..2))
            .and_then(|n| n.parse().ok())
            .unwrap_or(99);
        if !(27..=28).contains(&number) {
            std::fs::copy(&path, served.path().join(path.file_name().unwrap_or_default()))?;
        }
    }
    let status = Command::new(env!("CARGO_BIN_EXE_haptic"))
        .args(["migrate-check", "--dir"])
        .arg(served.path())
        .current_dir(repo())
        .output()?
        .status;
    ensure!(status.success(), "nothing refused: {status}");
    Ok(())
}

#[tokio::test]
async fn migrate_check_of_a_cluster_judges_its_ingresses_as_the_directory() -> Result<()> {
    let env = env::environment();
    let client = env.kube_client().await?;
    let shop = env.fresh_namespace_with(&client, "migrate-shop", &[]).await?;
    let monitoring = env.fresh_namespace_with(&client, "migrate-monitoring", &[]).await?;
    let objects = haptic::offline::load_objects(&repo().join(FIXTURES))?;
    for (_, object) in &objects {
        let mut object = object.clone();
        let namespace = if object["metadata"]["namespace"] == "monitoring" { &monitoring } else { &shop };
        object["metadata"]["namespace"] = namespace.as_str().into();
        let ingress: Ingress = serde_json::from_value(object)?;
        Api::<Ingress>::namespaced(client.clone(), namespace).create(&PostParams::default(), &ingress).await?;
    }
    let output = Command::new(env!("CARGO_BIN_EXE_haptic"))
        .args(["migrate-check", "--format", "json", "-n", &shop, "-n", &monitoring])
        .env("KUBECONFIG", &env.kubeconfig)
        .current_dir(repo())
        .output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let from_cluster: Json =
        serde_json::from_slice(&output.stdout).with_context(|| format!("not a JSON report; stderr: {stderr}"))?;
    let from_dir: Json = serde_json::from_slice(
        &Command::new(env!("CARGO_BIN_EXE_haptic"))
            .args(["migrate-check", "--dir", FIXTURES, "--format", "json"])
            .current_dir(repo())
            .output()?
            .stdout,
    )?;
    let back =
        |ingress: &str| ingress.replace(&format!("{shop}/"), "shop/").replace(&format!("{monitoring}/"), "monitoring/");
    let same = |ingress: &str| ingress.to_owned();
    let (cluster, dir) = (verdicts(&from_cluster, &back), verdicts(&from_dir, &same));
    ensure!(
        cluster == dir,
        "the cluster's verdicts differ:\nonly from the cluster: {:?}\nonly from the directory: {:?}",
        cluster.difference(&dir),
        dir.difference(&cluster)
    );
    ensure!(!output.status.success() && stderr.contains("2 of 30"), "{stderr}");
    Ok(())
}
