//! Admission latency (issue #16: p95 < 500 ms at 1,000 Ingresses): one review of a new Ingress
//! against the chart's default library with 1,000 Ingresses (each with its Service and a
//! 3-endpoint EndpointSlice) in the stores: the dry-run render with the object in place and
//! HAProxy's check of the result (`haproxy -c`, the validator the webhook uses with
//! `--validation-haproxy`), and, with a running test environment, through its validator's
//! Dataplane API as the chart's webhook does (the render's files put in its storage, then
//! `only_validate`). Prints p50, p95 and p99 over 40 reviews of each.
//!
//! Run with `cargo bench --bench admission`; needs Helm (`make env-install`) to render the
//! chart and an HAProxy binary (`HAPTIC_BENCH_HAPROXY`, else `haproxy` in PATH); the validator's
//! figures need `HAPTIC_ENV_DIR` (an environment `envctl.py up` started there).

#[path = "../support/chart_config.rs"]
mod chart_config;
#[path = "../support/synthetic.rs"]
mod synthetic;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use haptic::admission::{Judged, LocalHaproxy, Proposal, Snapshot, Validator, Verdict, judge, judge_object};
use haptic::checks::validator::ValidatorApi;
use haptic::config::HAProxyTemplateConfig;
use haptic::render::Renderer;

/// The chart's configuration, its files at the environment's pod paths (the validator's
/// storage is there).
fn chart_config() -> HAProxyTemplateConfig {
    let paths = ["maps", "general", "certs"].map(|kind| {
        let dir = if kind == "certs" { "ssl" } else { kind };
        format!("haproxy.paths.{kind}=/var/run/haproxy/{dir}")
    });
    let values: Vec<&str> = paths.iter().map(String::as_str).collect();
    chart_config::chart_config_with(&values).expect("the chart's config: needs Helm (make env-install)")
}

/// The environment's validator, when `HAPTIC_ENV_DIR` names a running environment.
fn environment_validator() -> Option<ValidatorApi> {
    let dir = std::env::var_os("HAPTIC_ENV_DIR")?;
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(PathBuf::from(dir).join("env.json")).ok()?).ok()?;
    let validator = &manifest["validator"];
    let text = |key: &str| validator[key].as_str().unwrap_or_default().to_owned();
    let credentials = haptic::dataplane::Credentials::new(text("username"), text("password"));
    ValidatorApi::new(&text("dataplane_url"), credentials).ok()
}

fn percentiles(mut samples: Vec<Duration>) -> String {
    samples.sort();
    let at = |p: f64| samples[((samples.len() as f64 * p).ceil() as usize).clamp(1, samples.len()) - 1];
    format!(
        "p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms (n={})",
        at(0.50).as_secs_f64() * 1e3,
        at(0.95).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        samples.len()
    )
}

fn main() {
    let config = chart_config();
    let haproxy = std::env::var_os("HAPTIC_BENCH_HAPROXY").map(PathBuf::from).unwrap_or_else(|| "haproxy".into());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    for count in [100usize, 1_000] {
        let objects = synthetic::ingress_fleet_with_paths(count, 1);
        let sourced: Vec<_> = objects.iter().map(|o| (PathBuf::from("synthetic"), o.clone())).collect();
        let stores = haptic::offline::build_stores(&config.spec, &sourced).expect("stores");
        let renderer = Arc::new(Renderer::compile(&config.spec).expect("compiles"));
        renderer.render(&stores, &[]).expect("renders");
        let snapshot = Snapshot { generation: 1, spec: config.spec.clone(), renderer, stores, pods: Vec::new() };
        let local = LocalHaproxy(haproxy.clone());
        let scratch = environment_validator();
        let mut validators: Vec<(&str, Option<&dyn Validator>)> =
            vec![("render only", None), ("render + haproxy -c", Some(&local))];
        match &scratch {
            Some(scratch) => validators.push(("render + the validator's Dataplane API", Some(scratch))),
            None if count == 100 => println!("(no HAPTIC_ENV_DIR: the validator's Dataplane API is not measured)"),
            None => {}
        }
        for (what, validator) in validators {
            let mut samples = Vec::new();
            for i in 0..40 {
                let proposal = Proposal {
                    operation: "CREATE".into(),
                    object: Some(serde_json::json!({
                        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                        "metadata": {"namespace": "team-1", "name": format!("proposed-{i}")},
                        "spec": {"ingressClassName": "haproxy", "rules": [{"host": format!("proposed-{i}.example.com"),
                            "http": {"paths": [{"path": "/", "pathType": "Prefix",
                                "backend": {"service": {"name": "app-1", "port": {"number": 80}}}}]}}]}
                    })),
                };
                let started = Instant::now();
                let judged = judge_object(&snapshot, &proposal);
                let verdict = match (validator, judged) {
                    (Some(validator), judged) => runtime.block_on(judge(judged, &snapshot.spec, Some(validator))),
                    (None, Judged::Render(..)) => Verdict::Allowed(None),
                    (None, Judged::Decided(verdict)) => verdict,
                };
                samples.push(started.elapsed());
                assert!(verdict == Verdict::Allowed(None), "a valid Ingress not admitted as checked: {verdict:?}");
            }
            println!("admission @{count} Ingresses, {what}: {}", percentiles(samples));
        }
    }
}
