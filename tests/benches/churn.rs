//! The whole controller under churn (issue #17), against a running environment: the real API
//! server, the real `haptic` binary on the chart's default library, the environment's real
//! HAProxy pods and Dataplane APIs. It creates N Ingresses, each with its Service and an
//! EndpointSlice of 3 endpoints, waits until every pod is in sync, then applies changes at a set
//! rate for a set time, in turn:
//!
//! - **edit**: one of 200 Ingresses (`--turns`) to the real backend moves to a new host (map entries: the
//!   Runtime API path);
//! - **move**: one of 200 Services with a real endpoint has it move to the other backend's port
//!   (its server's address: the Runtime API path on HAProxy >= 2.7);
//! - **scale**: one of the N Services gains a fourth endpoint or loses it again (a server
//!   enabled or disabled in its slots);
//! - **new**: a new Service, its EndpointSlice and an Ingress to it (a new backend: a reload).
//!
//! Edits, moves and new Services are timed until a request through every pod is answered as the
//! change says (each pod polled every 25 ms for a second, every 100 ms to 10 s, then every
//! 500 ms); scale steps (their endpoints are addresses nothing answers on) are checked at the
//! end in the controller's render. It prints the changes' rate,
//! latencies (p50/p95/p99), reloads per pod, how far the slowest pod trails the median one, the
//! controller's peak RSS and CPU time, jemalloc's figures from its metrics (the live heap and the
//! pages around it: in sync, at the sample of highest RSS, at the end), the errors in its log and
//! its journal's size.
//!
//! `cargo bench --bench churn -- [--ingresses N] [--rate PER_SECOND] [--seconds T] [--max-delay D]
//! [--deployment-timeout D] [--turns K]` (defaults 1,000, 10, 60 and the configuration's own: under a steady stream of changes the
//! debouncer's quiet window never passes, so renders come every `debounce.maxDelay`, 5 s). The environment is the one in `HAPTIC_ENV_DIR` (started if it
//! is not running; `PODS=20 HAPTIC_ENV_NET=2 HAPTIC_ENV_DIR=target/test-env-20` for a fleet of
//! 20 pods beside the usual one).

#[path = "../env/mod.rs"]
mod env;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use env::controller::ControllerProcess;
use env::standalone::{
    apply_library_config_for_pods, backend_host_address, ingress_to, library_namespace, start_backends,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::Mutex;

/// How many Ingresses and Services of the real backend take turns for edits and moves, unless
/// `--turns` says: a change to one should be served long before its turn comes again (200 at
/// 10 changes a second: every 80 s). With too few, an edit not yet served is replaced by the
/// next edit of its Ingress and is never served, which the controller rightly coalesces but
/// the bench would count as lost.
const DEFAULT_TURNS: usize = 200;
/// The real backends (on the environment's backend host): name and port.
const WEB_A: (&str, u16) = ("web-a", 18400);
const WEB_B: (&str, u16) = ("web-b", 18401);
/// How long one change may take to be served everywhere before it counts as lost.
const SERVED_LIMIT: Duration = Duration::from_secs(120);

struct Settings {
    ingresses: usize,
    rate: f64,
    seconds: u64,
    /// `spec.dataplane.debounce.maxDelay`, when not the default (5 s).
    max_delay: Option<String>,
    /// `spec.dataplane.deploymentTimeout`, when not the default (30 s).
    deployment_timeout: Option<String>,
    /// How many Ingresses and Services take turns for edits and moves.
    turns: usize,
}

fn settings() -> Settings {
    let value = env::measure::flag;
    Settings {
        ingresses: value("--ingresses").and_then(|v| v.parse().ok()).unwrap_or(1_000),
        rate: value("--rate").and_then(|v| v.parse().ok()).unwrap_or(10.0),
        seconds: value("--seconds").and_then(|v| v.parse().ok()).unwrap_or(60),
        max_delay: value("--max-delay"),
        deployment_timeout: value("--deployment-timeout"),
        turns: value("--turns").and_then(|v| v.parse().ok()).filter(|t| *t > 0).unwrap_or(DEFAULT_TURNS),
    }
}

/// An address nothing answers on, unique for `n`, in 198.19.0.0/16 (the benchmark range).
fn silent_address(n: usize) -> String {
    format!("198.19.{}.{}", (n / 250) % 250, n % 250 + 1)
}

fn service(name: &str, target_port: u16) -> Result<Service> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": target_port}]}
    }))?)
}

fn slice(service: &str, addresses: &[String], port: u16) -> Result<EndpointSlice> {
    let endpoints: Vec<_> =
        addresses.iter().map(|a| json!({"addresses": [a], "conditions": {"ready": true}})).collect();
    Ok(serde_json::from_value(json!({
        "metadata": {"name": format!("{service}-1"), "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": port}],
        "endpoints": endpoints
    }))?)
}

/// The three silent endpoints of bulk Service `i`, and the fourth a scale step adds.
fn bulk_endpoints(i: usize, count: usize) -> Vec<String> {
    (0..count).map(|k| silent_address(4 * i + k)).collect()
}

/// The bench's namespace, where it writes each routed Service: the Service, its
/// EndpointSlice and an Ingress to it.
struct Writer {
    services: Api<Service>,
    slices: Api<EndpointSlice>,
    ingresses: Api<Ingress>,
}

impl Writer {
    /// Service `name` with its slice (`endpoints` on `port`) and an Ingress for `host` to it.
    async fn routed(&self, name: &str, host: &str, endpoints: &[String], port: u16) -> Result<()> {
        let post = PostParams::default();
        self.services.create(&post, &service(name, port)?).await?;
        self.slices.create(&post, &slice(name, endpoints, port)?).await?;
        self.ingresses.create(&post, &ingress_to(name, host, name)?).await?;
        Ok(())
    }
}

/// The renders (from the controller's `rendered` log lines) that rendered more than half their
/// blocks: each one holds a second set of blocks while the last is alive.
fn renders_from_scratch(log: &str) -> String {
    let field = |line: &str, name: &str| -> Option<u64> {
        let start = line.find(&format!(" {name}="))? + name.len() + 2;
        line[start..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    };
    let mut largely_rendered = Vec::new();
    let mut renders = 0;
    for line in log.lines().filter(|line| line.contains(" rendered ") || line.ends_with(" rendered")) {
        let (Some(render), Some(reused), Some(rendered)) =
            (field(line, "render"), field(line, "blocks_reused"), field(line, "blocks_rendered"))
        else {
            continue;
        };
        renders += 1;
        if rendered > reused {
            largely_rendered.push(format!("#{render} ({rendered} of {})", reused + rendered));
        }
    }
    format!(
        "renders that rendered more blocks than they reused: {} of {renders}: {}",
        largely_rendered.len(),
        largely_rendered.join(", ")
    )
}

/// Runs `writes` 16 at a time, failing on the first that failed.
async fn sixteen_at_a_time(writes: impl futures::Stream<Item = impl Future<Output = Result<()>>>) -> Result<()> {
    writes.buffer_unordered(16).collect::<Vec<_>>().await.into_iter().collect()
}

/// Per change: when each pod first answered it as it should.
type Served = Vec<Duration>;

/// Polls every pod with `host` until `backend` answers there; each pod's time since `started`.
async fn served_everywhere(
    env: &'static env::Manifest,
    http: &reqwest::Client,
    host: &str,
    backend: &str,
    started: Instant,
) -> Result<Served> {
    let per_pod = env.pods.iter().map(|pod| async move {
        let url = format!("http://{}/hello", pod.http_address);
        loop {
            if let Ok(response) = http.get(&url).header("Host", host).send().await
                && response.text().await.unwrap_or_default().contains(&format!("backend={backend} "))
            {
                return Ok(started.elapsed());
            }
            let waited = started.elapsed();
            ensure!(waited < SERVED_LIMIT, "{} never answered {host} from {backend}", pod.name);
            // Finer while it is quick; coarser later, so that many changes in flight on many
            // pods do not load the machine the controller and the pods share.
            let poll = match waited.as_secs() {
                0 => 25,
                1..10 => 100,
                _ => 500,
            };
            tokio::time::sleep(Duration::from_millis(poll)).await;
        }
    });
    futures::future::try_join_all(per_pod).await
}

/// Count and mean of each histogram series the controller times its work with: renders, each
/// kind of action on a pod, each kind of runtime change.
fn time_spent(metrics: &str) -> String {
    let mut series: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for line in metrics.lines() {
        for (prefix, part) in [
            ("haptic_render_duration_seconds", "render"),
            ("haptic_pod_action_duration_seconds", "action"),
            ("haptic_runtime_action_duration_seconds", "runtime"),
        ] {
            let Some(rest) = line.strip_prefix(prefix) else { continue };
            let (is_sum, rest) = match (rest.strip_prefix("_sum"), rest.strip_prefix("_count")) {
                (Some(rest), _) => (true, rest),
                (_, Some(rest)) => (false, rest),
                _ => continue,
            };
            let (labels, value) = rest.rsplit_once(' ').unwrap_or((rest, "0"));
            let label = labels.split('"').nth(1).unwrap_or(part);
            let entry = series.entry(format!("{part} {label}")).or_default();
            let value: f64 = value.trim().parse().unwrap_or_default();
            if is_sum { entry.0 += value } else { entry.1 += value }
        }
    }
    series
        .iter()
        .filter(|(_, (_, count))| *count > 0.0)
        .map(|(name, (sum, count))| format!("{name} n={count:.0} mean {:.0} ms", sum / count * 1000.0))
        .collect::<Vec<_>>()
        .join(", ")
}

/// jemalloc's figures in the controller's metrics now (`haptic_heap_bytes`), in MiB, or why
/// there are none.
async fn heap_figures(http: &reqwest::Client, api_url: &str) -> String {
    let metrics = match http.get(format!("{api_url}/metrics")).send().await {
        Ok(response) => response.text().await,
        Err(error) => Err(error),
    };
    match metrics {
        Ok(metrics) => heap_line(&metrics),
        Err(_) => "(no metrics)".to_owned(),
    }
}

/// jemalloc's figures in a scrape of the controller's metrics, in MiB.
fn heap_line(metrics: &str) -> String {
    ["allocated", "active", "metadata", "resident", "retained"]
        .map(|kind| {
            let bytes = env::measure::metric_sum(metrics, &format!("haptic_heap_bytes{{kind=\"{kind}\"}}"));
            format!("{kind} {:.1}", bytes / 1048576.0)
        })
        .join(", ")
}

/// How many renders took at most each bucket's time (`le`), from the render histogram: a few
/// slow renders and many slow ones are different problems.
fn render_spread(metrics: &str) -> String {
    let mut counted = 0.0;
    let mut buckets = Vec::new();
    for line in metrics.lines().filter(|l| l.starts_with("haptic_render_duration_seconds_bucket")) {
        let bound = line.split('"').nth(1).unwrap_or("?");
        let count: f64 = line.rsplit(' ').next().and_then(|v| v.trim().parse().ok()).unwrap_or_default();
        if count > counted {
            buckets.push(format!("≤{bound} s: {:.0}", count - counted));
            counted = count;
        }
    }
    buckets.join(", ")
}

fn percentiles(samples: &[Duration]) -> String {
    if samples.is_empty() {
        return "n=0".into();
    }
    let mut sorted = samples.to_vec();
    sorted.sort();
    let ms = |p: f64| env::measure::percentile(&sorted, p).as_secs_f64() * 1000.0;
    format!(
        "n={} p50 {:.0} ms, p95 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        sorted.len(),
        ms(0.5),
        ms(0.95),
        ms(0.99),
        ms(1.0)
    )
}

/// The controller's peak and current resident memory (KiB) and CPU time (s), from /proc.
fn process_figures(pid: u32) -> Result<(u64, u64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = |key: &str| -> u64 {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields.get(11..13).map_or(0.0, |f| f.iter().filter_map(|v| v.parse::<f64>().ok()).sum());
    Ok((kib("VmHWM:"), kib("VmRSS:"), ticks / 100.0))
}

fn directory_size(path: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else { return 0 };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => directory_size(&entry.path()),
            Ok(meta) => meta.len(),
            Err(_) => 0,
        })
        .sum()
}

#[tokio::main]
async fn main() -> Result<()> {
    let settings = settings();
    let env: &'static env::Manifest = env::environment();
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "bench-churn").await?;
    let work = tempfile::tempdir()?;
    let address = backend_host_address()?;
    let _backends = start_backends(work.path(), &address, &[(WEB_A.0.into(), WEB_A.1), (WEB_B.0.into(), WEB_B.1)])?;
    let writer = &Writer {
        services: Api::namespaced(client.clone(), &namespace),
        slices: Api::namespaced(client.clone(), &namespace),
        ingresses: Api::namespaced(client.clone(), &namespace),
    };
    let (slices, ingresses) = (&writer.slices, &writer.ingresses);

    // The fleet of objects, written 16 at a time.
    let created = Instant::now();
    sixteen_at_a_time(futures::stream::iter(0..settings.ingresses).map(|i| async move {
        let name = format!("app-{i}");
        writer.routed(&name, &format!("{name}.churn.example"), &bulk_endpoints(i, 3), 8080).await
    }))
    .await?;
    let turns = settings.turns;
    let real = std::slice::from_ref(&address);
    sixteen_at_a_time(futures::stream::iter(0..turns).map(|m| async move {
        let name = format!("edit-{m}");
        writer.routed(&name, &format!("{name}-v0.churn.example"), real, WEB_A.1).await?;
        let name = format!("move-{m}");
        writer.routed(&name, &format!("{name}.churn.example"), real, WEB_A.1).await
    }))
    .await?;
    let objects = 3 * (settings.ingresses + 2 * turns);
    let creation = created.elapsed();

    apply_library_config_for_pods(&client, &namespace, "bench").await?;
    let configs: Api<haptic::config::HAProxyTemplateConfig> = Api::namespaced(client.clone(), &namespace);
    if let Some(max_delay) = &settings.max_delay {
        let patch = json!({"spec": {"dataplane": {"debounce": {"maxDelay": max_delay}}}});
        configs.patch("haptic", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    }
    if let Some(timeout) = &settings.deployment_timeout {
        let patch = json!({"spec": {"dataplane": {"deploymentTimeout": timeout}}});
        configs.patch("haptic", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    }
    let journal = work.path().join("journal");
    let started = Instant::now();
    let controller = ControllerProcess::launch_library(env, &namespace, &journal)?;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).pool_max_idle_per_host(4).build()?;
    served_everywhere(env, &http, &format!("edit-{}-v0.churn.example", turns - 1), WEB_A.0, started)
        .await
        .with_context(|| controller.log_tail())?;
    let first_served = started.elapsed();
    controller
        .wait_all_in_sync(env.pods.len(), Duration::from_secs(600))
        .await
        .with_context(|| controller.log_tail())?;
    let converged = started.elapsed();
    let pid = controller.pid();
    let (_, settled_rss, settled_cpu) = process_figures(pid)?;
    let api_url = controller.api_url().await?;
    let settled_heap = heap_figures(&http, &api_url).await;

    // Churn.
    let reloads_before: Vec<u64> = env.pods.iter().map(|pod| pod.reloads()).collect::<Result<_>>()?;
    let samples: Arc<Mutex<BTreeMap<&'static str, Vec<Served>>>> = Arc::default();
    let failures: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut in_flight = Vec::new();
    let mut scaled: BTreeMap<usize, usize> = BTreeMap::new();
    let mut edit_versions = vec![0usize; turns];
    let mut moved = vec![false; turns];
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / settings.rate));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let churn_started = Instant::now();
    let churn_for = Duration::from_secs(settings.seconds);
    let mut changes = 0usize;
    let mut peak_rss = 0;
    let mut heap_at_peak = String::new();
    while churn_started.elapsed() < churn_for {
        ticker.tick().await;
        let turn = (changes / 4) % turns;
        let at = Instant::now();
        let measured: Option<(&'static str, String, &'static str)> = match changes % 4 {
            0 => {
                edit_versions[turn] += 1;
                let name = format!("edit-{turn}");
                let host = format!("{name}-v{}.churn.example", edit_versions[turn]);
                let patch = json!({"spec": {"rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix",
                    "backend": {"service": {"name": name, "port": {"number": 80}}}}]}}]}});
                ingresses.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                Some(("edit (Ingress host)", host, WEB_A.0))
            }
            1 => {
                moved[turn] = !moved[turn];
                let (backend, port) = if moved[turn] { WEB_B } else { WEB_A };
                let name = format!("move-{turn}");
                let patch = json!({"ports": [{"name": "http", "port": port}]});
                slices.patch(&format!("{name}-1"), &PatchParams::default(), &Patch::Merge(&patch)).await?;
                Some(("move (endpoint port)", format!("{name}.churn.example"), backend))
            }
            2 => {
                let i = (changes / 4 * 7919) % settings.ingresses;
                let count = if scaled.get(&i) == Some(&4) { 3 } else { 4 };
                scaled.insert(i, count);
                let patch = json!({"endpoints": bulk_endpoints(i, count).iter()
                    .map(|a| json!({"addresses": [a], "conditions": {"ready": true}})).collect::<Vec<_>>()});
                slices.patch(&format!("app-{i}-1"), &PatchParams::default(), &Patch::Merge(&patch)).await?;
                None
            }
            _ => {
                let name = format!("new-{}", changes / 4);
                let host = format!("{name}.churn.example");
                writer.routed(&name, &host, real, WEB_A.1).await?;
                Some(("new (Service, slice, Ingress)", host, WEB_A.0))
            }
        };
        changes += 1;
        if let Some((kind, host, backend)) = measured {
            let (samples, failures, http) = (samples.clone(), failures.clone(), http.clone());
            in_flight.push(tokio::spawn(async move {
                match served_everywhere(env, &http, &host, backend, at).await {
                    Ok(served) => samples.lock().await.entry(kind).or_default().push(served),
                    Err(error) => failures.lock().await.push(format!("{kind}: {error:#}")),
                }
            }));
        }
        if changes.is_multiple_of(50) {
            let rss = process_figures(pid)?.1;
            if rss > peak_rss {
                peak_rss = rss;
                heap_at_peak = heap_figures(&http, &api_url).await;
            }
        }
    }
    let churned = churn_started.elapsed();
    for task in in_flight {
        task.await?;
    }
    let drained = churn_started.elapsed();
    controller
        .wait_all_in_sync(env.pods.len(), Duration::from_secs(300))
        .await
        .with_context(|| controller.log_tail())?;
    let reloads: Vec<u64> = env
        .pods
        .iter()
        .zip(&reloads_before)
        .map(|(pod, before)| pod.reloads().map(|now| now - before))
        .collect::<Result<_>>()?;
    let (peak_hwm, end_rss, cpu) = process_figures(pid)?;

    // Scale steps, in the last render: every endpoint of a scaled Service is a server there.
    let config = std::fs::read_to_string(controller.render_dir.join("haproxy.cfg"))?;
    let serving: std::collections::HashSet<&str> = config
        .lines()
        .filter(|l| l.trim_start().starts_with("server ") && !l.contains(" disabled"))
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    let mut scale_missing = 0;
    for (i, count) in &scaled {
        for address in bulk_endpoints(*i, *count) {
            if !serving.contains(format!("{address}:8080").as_str()) {
                scale_missing += 1;
            }
        }
        if *count == 3 && serving.contains(format!("{}:8080", silent_address(4 * i + 3)).as_str()) {
            scale_missing += 1;
        }
    }

    let log = controller.log_text();
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
    let samples = samples.lock().await;
    let failures = failures.lock().await;
    let versions: Vec<&str> = env.pods.iter().map(|p| p.haproxy_version.as_str()).collect();
    if let Some(max_delay) = &settings.max_delay {
        println!("debounce.maxDelay {max_delay}");
    }
    println!(
        "churn: {} Ingresses (each with its Service and a 3-endpoint EndpointSlice; {objects} objects), {} pods (HAProxy {}), chart's default library",
        settings.ingresses,
        env.pods.len(),
        versions.join(", ")
    );
    println!(
        "setup: objects written in {:.1} s; controller start -> first change served on every pod {:.1} s, every pod in sync {:.1} s; RSS then {:.1} MiB, CPU {:.1} s",
        creation.as_secs_f64(),
        first_served.as_secs_f64(),
        converged.as_secs_f64(),
        settled_rss as f64 / 1024.0,
        settled_cpu
    );
    println!(
        "churn: {changes} changes in {:.1} s ({:.2}/s asked {:.1}/s; edits and moves take turns over {turns} objects each), all measured ones served {:.1} s after the start",
        churned.as_secs_f64(),
        changes as f64 / churned.as_secs_f64(),
        settings.rate,
        drained.as_secs_f64()
    );
    let mut per_pod: Vec<Vec<Duration>> = vec![Vec::new(); env.pods.len()];
    for (kind, changes) in samples.iter() {
        let slowest: Vec<Duration> = changes.iter().map(|s| s.iter().copied().max().unwrap_or_default()).collect();
        println!("  {kind} -> served on all pods: {}", percentiles(&slowest));
        for served in changes {
            for (pod, at) in served.iter().enumerate() {
                per_pod[pod].push(*at);
            }
        }
    }
    let medians: Vec<f64> = per_pod
        .iter_mut()
        .map(|s| {
            s.sort();
            if s.is_empty() { 0.0 } else { env::measure::percentile(s, 0.5).as_secs_f64() * 1000.0 }
        })
        .collect();
    let mut sorted = medians.clone();
    sorted.sort_by(f64::total_cmp);
    let median_pod = sorted.get(sorted.len() / 2).copied().unwrap_or_default();
    let slowest_pod = sorted.last().copied().unwrap_or_default();
    println!(
        "  per pod median latency {} ms; slowest/median pod {:.2}",
        medians.iter().map(|m| format!("{m:.0}")).collect::<Vec<_>>().join(", "),
        if median_pod > 0.0 { slowest_pod / median_pod } else { 0.0 }
    );
    println!(
        "  reloads per pod during churn: {} ({:.2} per change)",
        reloads.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
        reloads.iter().sum::<u64>() as f64 / reloads.len() as f64 / changes as f64
    );
    println!(
        "  scale steps: {} Services scaled, {scale_missing} endpoints not as their slice says in the last render",
        scaled.len()
    );
    println!(
        "controller: peak RSS {:.1} MiB (VmHWM; sampled under churn {:.1} MiB), RSS at the end {:.1} MiB, CPU {:.1} s ({:.1} s under churn); {} ERROR lines in its log; journal {:.1} KiB",
        peak_hwm as f64 / 1024.0,
        peak_rss as f64 / 1024.0,
        end_rss as f64 / 1024.0,
        cpu,
        cpu - settled_cpu,
        errors.len(),
        directory_size(&journal) as f64 / 1024.0
    );
    for line in errors.iter().take(5) {
        println!("    {line}");
    }
    // One scrape for the figures at the end: the heap and where a pod's turn went.
    let metrics = http.get(format!("{api_url}/metrics")).send().await?.text().await?;
    println!(
        "  jemalloc (MiB; `allocated` counts ~27 MiB sled never touches): in sync {settled_heap}; at the highest sample {heap_at_peak}; at the end {}",
        heap_line(&metrics)
    );
    // Where a pod's turn goes: the controller's own timings over the whole run.
    println!("  where the time went (the controller's metrics, whole run): {}", time_spent(&metrics));
    println!("  renders by duration: {}", render_spread(&metrics));
    let reused = env::measure::metric_sum(&metrics, "haptic_render_blocks_total{outcome=\"reused\"}");
    let rendered = env::measure::metric_sum(&metrics, "haptic_render_blocks_total{outcome=\"rendered\"}");
    println!(
        "  blocks of successful renders (whole run, the first render's among them): {reused:.0} reused, {rendered:.0} rendered ({:.1}% reused)",
        100.0 * reused / (reused + rendered).max(1.0)
    );
    println!("  {}", renders_from_scratch(&log));
    for failure in failures.iter().take(5) {
        println!("  NOT SERVED: {failure}");
    }
    // The API server keeps nothing of a run (the next one may be larger).
    drop(controller);
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let _ = namespaces.delete(&namespace, &Default::default()).await;
    ensure!(failures.is_empty(), "{} changes were not served within {}s", failures.len(), SERVED_LIMIT.as_secs());
    Ok(())
}
