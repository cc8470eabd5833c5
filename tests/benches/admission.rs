//! Admission latency (issue #16: p95 < 500 ms at 1,000 Ingresses): one review of a new Ingress
//! against the chart's default library with 1,000 Ingresses (each with its Service and a
//! 3-endpoint EndpointSlice) in the stores: the dry-run render with the object in place and
//! HAProxy's check of the result (`haproxy -c`, the validator the webhook uses with
//! `--validation-haproxy`). Prints p50, p95 and p99 over 40 reviews, with and without HAProxy.
//!
//! Run with `cargo bench --bench admission`; needs Helm (`make env-install`) to render the
//! chart and an HAProxy binary (`HAPTIC_BENCH_HAPROXY`, else `haproxy` in PATH).

#[path = "../support/chart_config.rs"]
mod chart_config;
#[path = "../support/synthetic.rs"]
mod synthetic;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use haptic::admission::{Judged, LocalHaproxy, Proposal, Snapshot, Verdict, judge, judge_object};
use haptic::config::HAProxyTemplateConfig;
use haptic::render::Renderer;

fn chart_config() -> HAProxyTemplateConfig {
    chart_config::chart_config_with(&[]).expect("the chart's config: needs Helm (make env-install)")
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
        let validator = LocalHaproxy(haproxy.clone());
        for with_haproxy in [false, true] {
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
                let verdict = if with_haproxy {
                    runtime.block_on(judge(judged, &snapshot.spec, Some(&validator)))
                } else {
                    match judged {
                        Judged::Render(_) => Verdict::Allowed(None),
                        Judged::Decided(verdict) => verdict,
                    }
                };
                samples.push(started.elapsed());
                assert!(matches!(verdict, Verdict::Allowed(_)), "a valid Ingress refused: {verdict:?}");
            }
            let what = if with_haproxy { "render + haproxy -c" } else { "render only" };
            println!("admission @{count} Ingresses, {what}: {}", percentiles(samples));
        }
    }
}
