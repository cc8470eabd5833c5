//! A burst of admission reviews against the leader (issue #45, item 8), live: the real API
//! server, the real `haptic` binary deploying the chart's default library to the environment's
//! pods, its admission webhook judging through the environment's validator Dataplane API as
//! the chart's webhook does. With N Ingresses in the cluster (each with its Service and a
//! 3-endpoint EndpointSlice) and every pod in sync, it sends B reviews of new Ingresses to the
//! webhook at once and prints the controller's resident memory (settled, and its peak during
//! the burst, from the kernel's high-water mark reset just before), how the reviews were
//! answered (admitted, refused, or busy: 503 after waiting for a turn, which the webhook's
//! `failurePolicy` then decides) and their latency.
//!
//! `cargo bench --bench admission_burst -- [--ingresses N] [--reviews B]` (defaults 1,000 and
//! 200). The environment is the one in `HAPTIC_ENV_DIR` (started if it is not running).

#[path = "../env/mod.rs"]
mod env;

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use env::controller::{ControllerProcess, Launch};
use env::measure::print_samples;
use env::standalone::{apply_library_config_for_pods, bulk_routed, ingress_to, library_namespace};
use futures::StreamExt;
use serde_json::json;

struct Settings {
    ingresses: usize,
    reviews: usize,
}

fn settings() -> Settings {
    let value = env::measure::flag;
    Settings {
        ingresses: value("--ingresses").and_then(|v| v.parse().ok()).unwrap_or(1_000),
        reviews: value("--reviews").and_then(|v| v.parse().ok()).unwrap_or(200),
    }
}

/// A resident-memory figure of the process (`VmRSS:`, `VmHWM:`), in MiB.
fn resident_mib(pid: u32, key: &str) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find(|line| line.starts_with(key))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|value| value.parse().ok())
        .with_context(|| format!("no {key} in /proc/{pid}/status"))?;
    Ok(kib / 1024.0)
}

/// The AdmissionReview the API server would send for the creation of Ingress `name`.
fn review(namespace: &str, name: &str) -> Result<serde_json::Value> {
    let mut ingress = serde_json::to_value(ingress_to(name, &format!("{name}.burst.example"), "app-0")?)?;
    ingress["metadata"]["namespace"] = json!(namespace);
    ingress["apiVersion"] = json!("networking.k8s.io/v1");
    ingress["kind"] = json!("Ingress");
    Ok(json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("burst-{name}"),
            "kind": {"group": "networking.k8s.io", "version": "v1", "kind": "Ingress"},
            "resource": {"group": "networking.k8s.io", "version": "v1", "resource": "ingresses"},
            "name": name,
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "bench"},
            "object": ingress,
            "dryRun": false
        }
    }))
}

/// How one review was answered.
enum Answer {
    Admitted,
    Refused(String),
    Busy,
    Failed(String),
}

async fn send(http: &reqwest::Client, url: &str, body: serde_json::Value) -> (Answer, Duration) {
    let started = Instant::now();
    let answer = match http.post(url).json(&body).send().await {
        Ok(response) if response.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE => Answer::Busy,
        Ok(response) => match response.json::<serde_json::Value>().await {
            Ok(review) if review["response"]["allowed"] == json!(true) => Answer::Admitted,
            Ok(review) => Answer::Refused(review["response"]["status"]["message"].to_string()),
            Err(error) => Answer::Failed(error.to_string()),
        },
        Err(error) => Answer::Failed(format!("{:#}", anyhow::Error::from(error))),
    };
    (answer, started.elapsed())
}

#[tokio::main]
async fn main() -> Result<()> {
    let settings = settings();
    let env: &'static env::Manifest = env::environment();
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "bench-burst").await?;
    bulk_routed(&client, &namespace, settings.ingresses, "burst.example").await?;
    apply_library_config_for_pods(&client, &namespace, "bench").await?;

    let work = tempfile::tempdir()?;
    env::fixtures::webhook_certificate(work.path())?;
    let certificates = work.path().display().to_string();
    let webhook = ["--webhook-address", "127.0.0.1:0", "--webhook-cert-dir", certificates.as_str()];
    let journal = work.path().join("journal");
    let launch = Launch::validated(env, &webhook);
    let controller = ControllerProcess::launch(env, &namespace, "haptic", tempfile::tempdir()?, &journal, &launch)?;
    let address = controller.listening_address("admission webhook listening").await?;
    controller
        .wait_all_in_sync(env.pods.len(), Duration::from_secs(600))
        .await
        .with_context(|| controller.log_tail())?;
    let pid = controller.pid();
    // The test certificate is its own CA, which the API server (Go) takes and webpki refuses as
    // a server's certificate; the bench talks to its own controller on loopback.
    let http = reqwest::Client::builder().danger_accept_invalid_certs(true).timeout(Duration::from_secs(30)).build()?;
    let url = format!("https://{address}/validate");
    // One review first, so that the validator's storage holds every map before the burst.
    send(&http, &url, review(&namespace, "warm-up")?).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let settled = resident_mib(pid, "VmRSS:")?;
    // Writing 5 to clear_refs resets the process's high-water mark of resident memory.
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").context("resetting the controller's VmHWM")?;

    let started = Instant::now();
    let bodies: Vec<serde_json::Value> =
        (0..settings.reviews).map(|i| review(&namespace, &format!("burst-{i}"))).collect::<Result<_>>()?;
    let answers: Vec<(Answer, Duration)> = futures::stream::iter(bodies)
        .map(|body| send(&http, &url, body))
        .buffer_unordered(settings.reviews)
        .collect()
        .await;
    let burst = started.elapsed();
    let peak = resident_mib(pid, "VmHWM:")?;

    let count = |wanted: fn(&Answer) -> bool| answers.iter().filter(|(answer, _)| wanted(answer)).count();
    println!(
        "{} Ingresses, {} pods, {} reviews at once, judged through the validator's Dataplane API",
        settings.ingresses,
        env.pods.len(),
        settings.reviews
    );
    println!(
        "  resident memory: {settled:.1} MiB settled, {peak:.1} MiB at the burst's peak (+{:.1} MiB)",
        peak - settled
    );
    println!(
        "  answers in {:.1} s: {} admitted, {} refused, {} busy (503 after the webhook's wait: failurePolicy decides), {} failed",
        burst.as_secs_f64(),
        count(|a| matches!(a, Answer::Admitted)),
        count(|a| matches!(a, Answer::Refused(_))),
        count(|a| matches!(a, Answer::Busy)),
        count(|a| matches!(a, Answer::Failed(_))),
    );
    for (answer, _) in answers.iter().take(200) {
        if let Answer::Refused(why) | Answer::Failed(why) = answer {
            println!("  for example: {why}");
            break;
        }
    }
    let judged: Vec<Duration> =
        answers.iter().filter(|(a, _)| matches!(a, Answer::Admitted | Answer::Refused(_))).map(|(_, d)| *d).collect();
    if !judged.is_empty() {
        print_samples("  judged reviews, send to answer", judged, "");
    }
    let busy: Vec<Duration> = answers.iter().filter(|(a, _)| matches!(a, Answer::Busy)).map(|(_, d)| *d).collect();
    if !busy.is_empty() {
        print_samples("  busy answers, send to answer", busy, "");
    }
    Ok(())
}
