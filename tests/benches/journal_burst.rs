//! A burst of journal transitions against the async side of the controller (issue #12): while
//! 50 pod drivers commit 10,000 transitions as fast as the disk takes them (each commit
//! durable, on the blocking pool as the driver does it), does a timer standing in for lease
//! renewal still fire on time, and does `/api/v1/pods` (the real HTTP API, on the same
//! runtime) answer within 100 ms at p99?
//!
//! The runtime has 2 worker threads, as the controller has on a 2-core node. `-- --inline`
//! commits on the async workers instead (how the controller did it before), for comparison.
//! With `HAPTIC_ENV_DIR` naming a running environment (`make env-up`), the real election runs
//! too, on a Lease of the environment's API server (15 s lease, 5 s grace, as the chart sets
//! them), on the same runtime: the bench counts leadership losses and fence closures.
//! Run with `cargo bench --bench journal_burst` (N = 10,000), or `-- N` for another count.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, UNIX_EPOCH};

use haptic::api::{ApiState, bind, serve};
use haptic::election::{ElectionSettings, Fence, Leadership};
use haptic::files::Checksum;
use haptic::journal::{Journal, JournaledPod, TransitionEntry};
use haptic::pod::{EventKind, LeaderTerm, PodUid, State};

const DRIVERS: u64 = 50;
/// How often the stand-in for lease renewal wakes (the election reads the Lease about as often).
const RENEWAL_PERIOD: Duration = Duration::from_millis(100);

fn record(driver: u64, seq: u64, files: &[(String, Checksum)]) -> JournaledPod {
    let to = if seq.is_multiple_of(2) { State::InSync } else { State::Syncing };
    JournaledPod {
        uid: PodUid(format!("0d4c2f7a-7a44-4c1b-9d7e-{driver:012}")),
        namespace: "haptic".into(),
        name: format!("haproxy-{driver}"),
        state: to,
        pushed: Some(files.to_vec()),
        copy: None,
        versions: Default::default(),
        last_transition: TransitionEntry {
            seq,
            at: UNIX_EPOCH + Duration::from_millis(1_700_000_000_000 + seq),
            from: State::Validating,
            to,
            reason: Some(EventKind::Pushed),
            error: None,
            term: LeaderTerm(1),
            trace_id: None,
        },
    }
}

/// The real election on the environment's API server, once leading.
struct Election {
    fence: Arc<Fence>,
    term: LeaderTerm,
    leadership: tokio::sync::watch::Receiver<Leadership>,
    /// Dropping it would make the election hand the Lease back.
    _keep_running: tokio::sync::oneshot::Sender<()>,
}

/// Starts the real election on the environment's API server and waits until it leads; `None`
/// without an environment.
async fn start_election() -> Option<Election> {
    let dir = std::env::var_os("HAPTIC_ENV_DIR")?;
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(std::path::Path::new(&dir).join("env.json")).ok()?).ok()?;
    let kubeconfig = kube::config::Kubeconfig::read_from(manifest["kubeconfig"].as_str()?).ok()?;
    haptic::tls::install_crypto_provider();
    let options = kube::config::KubeConfigOptions::default();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options).await.ok()?;
    let client = kube::Client::try_from(config).ok()?;
    let settings = ElectionSettings {
        namespace: manifest["namespace"].as_str()?.to_owned(),
        lease_name: format!("journal-burst-{}", std::process::id()),
        identity: "journal-burst".into(),
        duration: Duration::from_secs(15),
        grace: Duration::from_secs(5),
    };
    let fence = Arc::new(Fence::default());
    let (leadership_tx, mut leadership) = tokio::sync::watch::channel(Leadership::Follower);
    let (keep_running, stopped) = tokio::sync::oneshot::channel();
    tokio::spawn(haptic::election::run(client, settings, leadership_tx, fence.clone(), stopped));
    let term = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Leadership::Leader(term) = *leadership.borrow_and_update() {
                return term;
            }
            let _ = leadership.changed().await;
        }
    })
    .await
    .ok()?;
    println!("journal burst: leading the Lease in term {term}, the burst starts");
    Some(Election { fence, term, leadership, _keep_running: keep_running })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted.get(((sorted.len().max(1) - 1) as f64 * p) as usize).copied().unwrap_or_default()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let count: u64 = args.iter().find_map(|arg| arg.parse().ok()).unwrap_or(10_000);
    let inline = args.iter().any(|arg| arg == "--inline");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(burst(count, inline));
}

async fn burst(count: u64, inline: bool) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (journal, _) = Journal::open(&dir.path().join("journal"), 100).expect("journal opens");
    let journal = Arc::new(journal);
    let files: Arc<Vec<(String, Checksum)>> = Arc::new(
        ["haproxy.cfg", "maps/host.map", "maps/path.map", "files/503.http"]
            .iter()
            .map(|name| (name.to_string(), Checksum::of(name.as_bytes())))
            .collect(),
    );
    let listener = bind("127.0.0.1:0".parse().expect("address"), "the HTTP API").await.expect("bind");
    let api = format!("http://{}/api/v1/pods", listener.local_addr().expect("address"));
    let state = ApiState { journal: Some(journal.clone()), ..ApiState::default() };
    tokio::spawn(serve(listener, state));
    let done = Arc::new(AtomicBool::new(false));
    let election = start_election().await;
    // Every step-down during the burst.
    let losses = election.as_ref().map(|election| {
        let mut leadership = election.leadership.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let mut losses = 0u32;
            while !done.load(Ordering::Relaxed) {
                if tokio::time::timeout(RENEWAL_PERIOD, leadership.changed()).await.is_ok_and(|r| r.is_ok())
                    && !leadership.borrow_and_update().is_leader()
                {
                    losses += 1;
                }
            }
            (losses, leadership.borrow().is_leader())
        })
    });

    // The stand-in for lease renewal: how late does each tick fire? With the real election on,
    // each tick also asks its fence whether this replica may still write.
    let renewals = tokio::spawn({
        let done = done.clone();
        let fence = election.as_ref().map(|election| (election.fence.clone(), election.term));
        async move {
            let mut lateness = Vec::new();
            let mut fenced = 0u32;
            let mut next = tokio::time::Instant::now() + RENEWAL_PERIOD;
            while !done.load(Ordering::Relaxed) {
                tokio::time::sleep_until(next).await;
                lateness.push(tokio::time::Instant::now().duration_since(next));
                if let Some((fence, term)) = &fence
                    && fence.remaining(*term).is_err()
                {
                    fenced += 1;
                }
                next += RENEWAL_PERIOD;
            }
            (lateness, fenced)
        }
    });
    // A reader of the API, one request after another.
    let reader = tokio::spawn({
        let done = done.clone();
        async move {
            let http = reqwest::Client::new();
            let mut latencies = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let started = Instant::now();
                let answer = http.get(&api).send().await.expect("the API answers");
                assert!(answer.status().is_success(), "the API answered {}", answer.status());
                let _ = answer.bytes().await;
                latencies.push(started.elapsed());
            }
            latencies
        }
    });

    let started = Instant::now();
    let mut drivers = Vec::new();
    for driver in 0..DRIVERS {
        let (journal, files) = (journal.clone(), files.clone());
        let per_driver = count / DRIVERS + u64::from(driver < count % DRIVERS);
        drivers.push(tokio::spawn(async move {
            for seq in 1..=per_driver {
                let record = record(driver, seq, &files);
                if inline {
                    journal.commit(&record).expect("commit");
                } else {
                    let journal = journal.clone();
                    tokio::task::spawn_blocking(move || journal.commit(&record))
                        .await
                        .expect("commit task")
                        .expect("commit");
                }
            }
        }));
    }
    for driver in drivers {
        driver.await.expect("driver");
    }
    let elapsed = started.elapsed();
    done.store(true, Ordering::Relaxed);
    let (mut lateness, fenced) = renewals.await.expect("renewals");
    let mut latencies = reader.await.expect("reader");
    lateness.sort();
    latencies.sort();
    let mode = if inline { "commits on the async workers" } else { "commits on the blocking pool" };
    println!(
        "journal burst ({mode}): {count} durable transitions from {DRIVERS} drivers in {:.1} s ({:.0}/s)",
        elapsed.as_secs_f64(),
        count as f64 / elapsed.as_secs_f64()
    );
    println!(
        "journal burst: renewal timer ({} ticks of {RENEWAL_PERIOD:?}) late by p50 {:?}, p99 {:?}, max {:?}",
        lateness.len(),
        percentile(&lateness, 0.5),
        percentile(&lateness, 0.99),
        lateness.last().copied().unwrap_or_default()
    );
    if let Some(losses) = losses {
        let (losses, leading) = losses.await.expect("election watcher");
        println!(
            "journal burst: real election (15 s lease, 5 s grace): {losses} leadership losses, fence closed at {fenced} of {} ticks, leading at the end: {leading}",
            lateness.len()
        );
    }
    println!(
        "journal burst: GET /api/v1/pods ({} requests, {DRIVERS} pods) p50 {:?}, p99 {:?}, max {:?}",
        latencies.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or_default()
    );
}
