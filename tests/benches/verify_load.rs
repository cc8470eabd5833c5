//! The load drift checks put on a fleet (issue #45, item 7), against a running environment: the
//! real API server, the real `haptic` binary on the chart's default library and the
//! environment's real HAProxy pods and Dataplane APIs. It creates N Ingresses (each with its
//! Service and a 3-endpoint EndpointSlice), waits until every pod is in sync, then, with
//! nothing changing, samples the controller's metrics every 100 ms for a while:
//!
//! - **steady**: the drift checks of one controller (`driftPreventionInterval`, `--drift`);
//! - **new leader**: the controller is killed and a new one started on the same journal, which
//!   adopts the pods it finds in sync by checking each of them: the storm a leadership change
//!   could cause.
//!
//! For each phase it prints the Dataplane API requests per second (mean and the busiest
//! second), the verifications per second (mean, the busiest second, and what an even spread
//! gives: pods / interval), the verifications' time, the bytes the pods answered, and reloads.
//!
//! `cargo bench --bench verify_load -- [--ingresses N] [--drift SECONDS] [--seconds T]`
//! (defaults 1,000, 10 and 60). The environment is the one in `HAPTIC_ENV_DIR` (started if it is
//! not running; `PODS=20 HAPTIC_ENV_NET=2 HAPTIC_ENV_DIR=target/test-env-20` for 20 pods).

#[path = "../env/mod.rs"]
mod env;

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use env::controller::ControllerProcess;
use env::measure::metric_sum;
use env::standalone::{apply_library_config_for_pods_with, bulk_routed, library_namespace};

struct Settings {
    ingresses: usize,
    drift_seconds: u64,
    seconds: u64,
}

fn settings() -> Settings {
    let value = env::measure::flag;
    Settings {
        ingresses: value("--ingresses").and_then(|v| v.parse().ok()).unwrap_or(1_000),
        drift_seconds: value("--drift").and_then(|v| v.parse().ok()).filter(|d| *d > 0).unwrap_or(10),
        seconds: value("--seconds").and_then(|v| v.parse().ok()).unwrap_or(60),
    }
}

/// One scrape's counters.
#[derive(Clone, Copy, Default)]
struct Sample {
    at: Duration,
    requests: f64,
    verifications: f64,
    verify_seconds: f64,
    answer_bytes: f64,
}

impl Sample {
    fn of(at: Duration, metrics: &str) -> Self {
        Self {
            at,
            requests: metric_sum(metrics, "haptic_dataplane_requests_total"),
            verifications: metric_sum(metrics, "haptic_pod_action_duration_seconds_count{action=\"verify\"}"),
            verify_seconds: metric_sum(metrics, "haptic_pod_action_duration_seconds_sum{action=\"verify\"}"),
            answer_bytes: metric_sum(metrics, "haptic_dataplane_answer_bytes_total"),
        }
    }
}

/// Scrapes the controller's metrics every 100 ms for `length`.
async fn sample(http: &reqwest::Client, api_url: &str, length: Duration) -> Result<Vec<Sample>> {
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut ticker = tokio::time::interval(Duration::from_millis(100));
    while started.elapsed() < length {
        ticker.tick().await;
        let metrics = http.get(format!("{api_url}/metrics")).send().await?.text().await?;
        samples.push(Sample::of(started.elapsed(), &metrics));
    }
    Ok(samples)
}

/// The most a counter rose in any window of one second.
fn busiest_second(samples: &[Sample], counter: impl Fn(&Sample) -> f64) -> f64 {
    let mut busiest = 0.0f64;
    for (i, start) in samples.iter().enumerate() {
        let end = samples[i..].iter().take_while(|s| s.at <= start.at + Duration::from_secs(1)).last().unwrap_or(start);
        busiest = busiest.max(counter(end) - counter(start));
    }
    busiest
}

fn report(phase: &str, samples: &[Sample], pods: usize, drift: u64, reloads: u64) {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else { return };
    let seconds = (last.at - first.at).as_secs_f64().max(1e-9);
    let verifications = last.verifications - first.verifications;
    let verify_ms =
        if verifications > 0.0 { 1e3 * (last.verify_seconds - first.verify_seconds) / verifications } else { 0.0 };
    println!("{phase} ({seconds:.0} s):");
    println!(
        "  Dataplane API requests: {:.1}/s mean, {:.0} in the busiest second ({:.2}/s per pod)",
        (last.requests - first.requests) / seconds,
        busiest_second(samples, |s| s.requests),
        (last.requests - first.requests) / seconds / pods as f64
    );
    println!(
        "  verifications: {verifications:.0} ({:.2}/s mean, {:.0} in the busiest second; an even spread: {:.2}/s), {verify_ms:.0} ms each",
        verifications / seconds,
        busiest_second(samples, |s| s.verifications),
        pods as f64 / drift as f64
    );
    println!(
        "  answered: {:.1} MiB ({:.2} MiB/s); reloads: {reloads}",
        (last.answer_bytes - first.answer_bytes) / 1048576.0,
        (last.answer_bytes - first.answer_bytes) / 1048576.0 / seconds
    );
}

fn total_reloads(env: &env::Manifest) -> Result<u64> {
    env.pods.iter().map(|pod| pod.reloads()).sum()
}

#[tokio::main]
async fn main() -> Result<()> {
    let settings = settings();
    let env: &'static env::Manifest = env::environment();
    let pods = env.pods.len();
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "bench-verify").await?;
    bulk_routed(&client, &namespace, settings.ingresses, "verify.example").await?;
    let drift = format!("{}s", settings.drift_seconds);
    apply_library_config_for_pods_with(&client, &namespace, "bench", &[("config.driftPreventionInterval", drift)])
        .await?;
    println!(
        "{} Ingresses, {pods} pods, driftPreventionInterval {} s, sampled every 100 ms",
        settings.ingresses, settings.drift_seconds
    );

    let work = tempfile::tempdir()?;
    let journal = work.path().join("journal");
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let controller = ControllerProcess::launch_library(env, &namespace, &journal)?;
    controller.wait_all_in_sync(pods, Duration::from_secs(600)).await.with_context(|| controller.log_tail())?;
    let api_url = controller.api_url().await?;
    let reloads = total_reloads(env)?;
    let steady = sample(&http, &api_url, Duration::from_secs(settings.seconds)).await?;
    report("steady", &steady, pods, settings.drift_seconds, total_reloads(env)? - reloads);

    // A new leader: the same journal, a new process, every pod to adopt.
    drop(controller.kill());
    let reloads = total_reloads(env)?;
    let controller = ControllerProcess::launch_library(env, &namespace, &journal)?;
    let api_url = controller.api_url().await?;
    let adoption = sample(&http, &api_url, Duration::from_secs(2 * settings.drift_seconds)).await?;
    report(
        "new leader, its first two intervals",
        &adoption,
        pods,
        settings.drift_seconds,
        total_reloads(env)? - reloads,
    );
    Ok(())
}
