//! Figures the live benches and tests read: latency samples, reloads counted by the pods'
//! own HAProxy masters, and the controller's metrics.

use std::time::Duration;

use anyhow::Result;

use super::Manifest;

/// The value after `--name` on a bench's command line (`cargo bench --bench B -- --name V`).
#[allow(dead_code)]
pub fn flag(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

/// The `p` quantile (0 to 1) of sorted samples, by nearest rank.
pub fn percentile<T: Copy>(sorted: &[T], p: f64) -> T {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// Prints `what: n=…, median, p95, min, max` in milliseconds, then `tail`.
pub fn print_samples(what: &str, mut samples: Vec<Duration>, tail: &str) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{what}: n={} median {:.0} ms, p95 {:.0} ms, min {:.0} ms, max {:.0} ms, {tail}",
        samples.len(),
        ms(percentile(&samples, 0.5)),
        ms(percentile(&samples, 0.95)),
        ms(samples[0]),
        ms(samples[samples.len() - 1]),
    );
}

/// Whether any pod is starved, from each sample's per-pod times (`every_pod_answers_each`):
/// each pod's median time over the samples, and the slowest pod's against the median pod's.
pub fn print_pod_spread(what: &str, per_sample: &[Vec<Duration>], names: &[String]) {
    if per_sample.is_empty() || names.is_empty() {
        return;
    }
    let mut medians: Vec<(Duration, &str)> = (0..names.len())
        .map(|pod| {
            let mut times: Vec<Duration> = per_sample.iter().filter_map(|sample| sample.get(pod).copied()).collect();
            times.sort();
            (if times.is_empty() { Duration::ZERO } else { percentile(&times, 0.5) }, names[pod].as_str())
        })
        .collect();
    medians.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (fastest, slowest, middle) = (medians[0], medians[medians.len() - 1], percentile(&medians, 0.5));
    let ratio = ms(slowest.0) / ms(middle.0).max(f64::EPSILON);
    println!(
        "{what}: per-pod median over {} samples: fastest {} {:.0} ms, median pod {:.0} ms, slowest {} {:.0} ms; \
         slowest/median {ratio:.2}",
        per_sample.len(),
        fastest.1,
        ms(fastest.0),
        ms(middle.0),
        slowest.1,
        ms(slowest.0),
    );
}

/// Reloads of every pod of the environment so far, summed, divided by the pods.
pub fn reloads_per_pod(env: &Manifest) -> Result<u64> {
    let mut total = 0;
    for pod in &env.pods {
        total += pod.reloads()?;
    }
    Ok(total / env.pods.len() as u64)
}

/// The sum of a metric's samples whose line starts with `prefix`, in a text exposition.
/// The sum of the series starting with `prefix`, when the controller declares the metric
/// (its `# TYPE` line; a counter's without `_total`): a metric renamed or gone is an error,
/// not a sum of 0.
pub fn declared_metric_sum(metrics: &str, prefix: &str) -> anyhow::Result<f64> {
    let family = prefix.split('{').next().unwrap_or(prefix);
    let declared = metrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE ")?.split_whitespace().next())
        .any(|name| name == family || family.strip_suffix("_total") == Some(name));
    anyhow::ensure!(declared, "the controller declares no metric {family}");
    Ok(metric_sum(metrics, prefix))
}

pub fn metric_sum(metrics: &str, prefix: &str) -> f64 {
    metrics.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}
