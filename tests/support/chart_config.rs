//! The chart's default HAProxyTemplateConfig, as `helm template` renders it, for benchmarks.

use std::path::PathBuf;

use haptic::config::HAProxyTemplateConfig;

/// The chart's configuration with these `--set` values; `None` without Helm (at `$HAPTIC_HELM`
/// or `~/.cache/haptic-env/bin/helm`, which `make env-install` builds).
pub fn chart_config_with(values: &[&str]) -> Option<HAProxyTemplateConfig> {
    let helm = std::env::var_os("HAPTIC_HELM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/haptic-env/bin/helm"));
    let chart = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("chart");
    let output = std::process::Command::new(&helm)
        .args(["template", "bench"])
        .arg(&chart)
        .args(["--namespace", "haptic-system", "--kube-version", "1.36.3"])
        .args(values.iter().flat_map(|value| ["--set", value]))
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let text = String::from_utf8(output.stdout).ok()?;
    let document = text.split("\n---").find(|d| d.contains("kind: HAProxyTemplateConfig"))?;
    serde_saphyr::from_str(document).ok()
}
