//! Journal throughput and footprint: durable commits per second (each flushed to disk before
//! it returns, as the controller needs), and the size on disk after N transitions spread over
//! 3 pods with the default retention of 100 transitions per pod.
//!
//! Run with `cargo bench --bench journal` (N = 100,000), or `-- N` for another count.

use std::time::{Duration, Instant, UNIX_EPOCH};

use haptic::files::Checksum;
use haptic::journal::{Journal, JournaledPod, TransitionEntry};
use haptic::pod::{EventKind, LeaderTerm, PodUid, State};
use haptic::telemetry::traces::TraceId;

fn main() {
    let count: u64 = std::env::args().skip(1).find_map(|arg| arg.parse().ok()).unwrap_or(100_000);
    let dir = tempfile::tempdir().expect("temp dir");
    let (journal, _) = Journal::open(&dir.path().join("journal"), 100).expect("journal opens");
    let files: Vec<(String, Checksum)> = ["haproxy.cfg", "maps/host.map", "maps/path.map", "files/503.http"]
        .iter()
        .map(|name| (name.to_string(), Checksum::of(name.as_bytes())))
        .collect();
    let mut latencies = Vec::with_capacity(count as usize);
    let started = Instant::now();
    for seq in 1..=count {
        let pod = seq % 3;
        let to = if seq % 2 == 0 { State::InSync } else { State::Syncing };
        let record = JournaledPod {
            uid: PodUid(format!("0d4c2f7a-7a44-4c1b-9d7e-00000000000{pod}")),
            namespace: "haptic".into(),
            name: format!("haproxy-{pod}"),
            state: to,
            pushed: Some(files.clone()),
            copy: None,
            versions: Default::default(),
            last_transition: TransitionEntry {
                seq: seq / 3 + 1,
                at: UNIX_EPOCH + Duration::from_millis(1_700_000_000_000 + seq),
                from: State::Validating,
                to,
                reason: Some(EventKind::Pushed),
                error: None,
                // Every real record now carries a term and (with tracing on) a trace id.
                term: LeaderTerm(1),
                trace_id: Some(TraceId([seq as u8; 16])),
            },
        };
        let one = Instant::now();
        journal.commit(&record).expect("commit");
        latencies.push(one.elapsed());
    }
    let elapsed = started.elapsed();
    latencies.sort();
    let percentile = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p) as usize];
    println!(
        "journal: {count} durable commits in {:.1} s: {:.0} commits/s",
        elapsed.as_secs_f64(),
        count as f64 / elapsed.as_secs_f64()
    );
    println!(
        "journal: commit latency p50 {:?}, p99 {:?}, max {:?}",
        percentile(0.5),
        percentile(0.99),
        percentile(1.0)
    );
    println!(
        "journal: size on disk after {count} transitions (3 pods, 100 kept per pod): {:.1} MiB",
        journal.size_on_disk() as f64 / 1048576.0
    );
}
