//! Full render time of the example templates for 100, 1,000 and 10,000 Ingresses (each with its
//! Service and an EndpointSlice of 3 endpoints), and the memory the stores hold at each size.
//!
//! Run with `cargo bench --bench render`. The target (issue #3) is at most 20 µs per Ingress
//! at 10,000. The same fleets are rendered with the chart's default library too (six maps,
//! TLS, server slots), when Helm is at hand (`make env-install` builds it) to render the chart.
//! Each group's `_plan` twin times what a pod's driver does with such a render (a plan against
//! the same files with one endpoint moved) and prints the peak heap it takes (issue #17).

#[path = "../support/chart_config.rs"]
mod chart_config;
#[path = "../support/synthetic.rs"]
mod synthetic;

use chart_config::chart_config_with;

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use haptic::config::HAProxyTemplateConfig;
use haptic::render::Renderer;
use haptic::store::Stores;

/// Counts live heap bytes so the stores' footprint can be measured; allocates with jemalloc,
/// as the `haptic` binary does (`haptic::memory`), so render times are the binary's.
struct CountingAllocator;

static JEMALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Live bytes counted by threads other than the one that measures (a render's checksum thread).
static COUNTED_ELSEWHERE: AtomicIsize = AtomicIsize::new(0);
/// Whether the measuring thread keeps `PEAK_BYTES` (only while a plan's peak is measured).
static KEEPING_PEAK: AtomicBool = AtomicBool::new(false);
/// The most the live bytes have been while `KEEPING_PEAK` (a plan's transient peak).
static PEAK_BYTES: AtomicIsize = AtomicIsize::new(0);

thread_local! {
    /// Live bytes counted by the thread that measures (`Some` there only, see `measure_here`):
    /// a render's allocations are counted without an atomic operation. A shared atomic counter
    /// with a peak kept on every allocation cost a tenth of a full render, which the binary
    /// does not pay. Const-initialised and without a destructor, so an allocator may use it.
    static COUNTED_HERE: Cell<Option<isize>> = const { Cell::new(None) };
}

/// Makes this thread the one that measures: its allocations are counted in `COUNTED_HERE`.
fn measure_here() {
    COUNTED_HERE.with(|here| here.set(Some(here.get().unwrap_or(0))));
}

/// The heap bytes live now (counted from the process's start), read by the measuring thread.
/// Exact: every allocation and free is counted in one of the two counters, wherever it is freed.
fn live_bytes() -> isize {
    COUNTED_HERE.with(Cell::get).unwrap_or(0) + COUNTED_ELSEWHERE.load(Ordering::Relaxed)
}

fn count(change: isize) {
    let counted_here = COUNTED_HERE.with(|here| match here.get() {
        Some(bytes) => {
            here.set(Some(bytes + change));
            true
        }
        None => false,
    });
    if !counted_here {
        COUNTED_ELSEWHERE.fetch_add(change, Ordering::Relaxed);
    } else if KEEPING_PEAK.load(Ordering::Relaxed) {
        PEAK_BYTES.fetch_max(live_bytes(), Ordering::Relaxed);
    }
}

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        unsafe { JEMALLOC.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        unsafe { JEMALLOC.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        unsafe { JEMALLOC.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// jemalloc's settings as the `haptic` binary compiles them in (one arena, no thread caches but
/// the render's own), so a render here allocates as the controller's does.
#[used]
#[unsafe(export_name = "_rjem_malloc_conf")]
static JEMALLOC_CONF: &[u8; haptic::memory::JEMALLOC_CONF.len()] = haptic::memory::JEMALLOC_CONF;

fn example_config() -> HAProxyTemplateConfig {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/examples/config.yaml");
    haptic::offline::load_config(&path).expect("example config")
}

fn stores_for(config: &HAProxyTemplateConfig, objects: &[serde_json::Value]) -> Stores {
    let sourced: Vec<_> = objects.iter().map(|o| (PathBuf::from("synthetic"), o.clone())).collect();
    haptic::offline::build_stores(&config.spec, &sourced).expect("stores build")
}

/// The chart's default configuration, as `helm template` renders it.
fn chart_config() -> Option<HAProxyTemplateConfig> {
    chart_config_with(&[])
}

fn render(c: &mut Criterion) {
    measure_here();
    // As issue #3 states it: one path per Ingress, to its Service.
    render_fleets(c, "full_render", &example_config(), 1);
    // Twice the routes: two paths per Ingress, one by port number and one by port name.
    render_fleets(c, "full_render_two_paths", &example_config(), 2);
    match chart_config() {
        Some(config) => {
            stores_as_served(&config);
            render_fleets(c, "chart_library", &config, 1);
            render_changes(c, &config);
            render_annotated(&config);
        }
        None => println!("chart_library: skipped (no Helm at $HAPTIC_HELM or ~/.cache/haptic-env/bin/helm)"),
    }
    // The Gateway API (issue #14): N HTTPRoutes, each with its Service and EndpointSlice.
    match chart_config_with(&["gatewayAPI.enabled=true"]) {
        Some(config) => render_httproutes(c, &config),
        None => println!("gateway_library: skipped (no Helm)"),
    }
}

/// The stores of 10,000 Ingresses whose Services and EndpointSlices carry what an API server
/// serves (cluster IPs, status, target refs, node names...), kept whole and as the chart's
/// `fields` keep them (issue #17: keep only what templates read).
fn stores_as_served(config: &HAProxyTemplateConfig) {
    let count = 10_000;
    let objects = synthetic::served(synthetic::ingress_fleet(count));
    let whole = synthetic::keeping_whole_objects(config);
    let held = |config: &HAProxyTemplateConfig| {
        // Parts the stores share are held by a process-wide pool: none of the last stores'.
        haptic::store::compact::sweep_shared_parts();
        let before = live_bytes();
        let stores = stores_for(config, &objects);
        let held = live_bytes() - before;
        drop(stores);
        held as f64 / 1048576.0
    };
    let (kept, all) = (held(config), held(&whole));
    println!(
        "chart_library: stores for {count} Ingresses as an API server serves them (+ Services, EndpointSlices): {all:.1} MiB whole, {kept:.1} MiB keeping the chart's fields ({:.0}% less)",
        100.0 * (1.0 - kept / all)
    );
}

/// Incremental rendering (issue #17): one Ingress changed (its path, back and forth), or one
/// endpoint moved, then a render by the renderer that rendered the fleet before, reusing the
/// blocks nothing changed for.
fn render_changes(c: &mut Criterion, config: &HAProxyTemplateConfig) {
    let mut group = c.benchmark_group("chart_library_one_change");
    group.sample_size(20);
    for count in [1_000usize, 10_000] {
        let renderer = Renderer::compile(&config.spec).expect("the chart's configuration compiles");
        let objects = synthetic::ingress_fleet(count);
        let mut stores = stores_for(config, &objects);
        let started = std::time::Instant::now();
        let live = live_bytes();
        let files = renderer.render(&stores, &[]).expect("renders").files;
        let kept = live_bytes() - live - files.entries().map(|(_, f)| f.content.len() as isize).sum::<isize>();
        println!(
            "chart_library_one_change: {count} Ingresses: first render {:.1} ms, {} blocks kept, {:.1} MiB held after it beyond the stores (objects as template values, blocks, slots)",
            started.elapsed().as_secs_f64() * 1e3,
            renderer.blocks_kept(),
            kept as f64 / 1048576.0
        );
        drop(files);
        let middle = count / 2;
        let mut ingress = objects.iter().filter(|o| o["kind"] == "Ingress").nth(middle).expect("an Ingress").clone();
        let mut slice = objects.iter().filter(|o| o["kind"] == "EndpointSlice").nth(middle).expect("a slice").clone();
        let mut flip = false;
        group.bench_function(BenchmarkId::new("nothing", count), |b| {
            b.iter(|| black_box(renderer.render(&stores, &[]).expect("renders").files));
        });
        group.bench_function(BenchmarkId::new("ingress_path", count), |b| {
            b.iter(|| {
                flip = !flip;
                move_path(&mut stores, &mut ingress, flip);
                black_box(renderer.render(&stores, &[]).expect("renders").files)
            });
        });
        // A render under churn takes in a few seconds of changes, and edits come in runs (one
        // Ingress after the other): five Ingresses in a row, their paths changed.
        let mut in_a_row: Vec<_> = objects
            .iter()
            .filter(|o| o["kind"] == "Ingress" && o["metadata"]["namespace"] == "team-8")
            .cloned()
            .collect();
        in_a_row.sort_by(|a, b| a["metadata"]["name"].as_str().cmp(&b["metadata"]["name"].as_str()));
        let mut in_a_row: Vec<_> = in_a_row.into_iter().skip(count / 34).take(5).collect();
        group.bench_function(BenchmarkId::new("five_ingresses_in_a_row", count), |b| {
            b.iter(|| {
                flip = !flip;
                for ingress in &mut in_a_row {
                    move_path(&mut stores, ingress, flip);
                }
                black_box(renderer.render(&stores, &[]).expect("renders").files)
            });
        });
        group.bench_function(BenchmarkId::new("endpoint_moved", count), |b| {
            b.iter(|| {
                flip = !flip;
                slice["endpoints"][0]["addresses"][0] = if flip { "198.19.0.1".into() } else { "198.19.0.2".into() };
                std::sync::Arc::make_mut(stores.get_mut("endpoints").expect("endpoints"))
                    .apply(slice.clone())
                    .expect("applies");
                black_box(renderer.render(&stores, &[]).expect("renders").files)
            });
        });
        // The same changes again, timed one by one (the change applied outside the timing).
        print_fastest(count, "nothing", || timed(|| renderer.render(&stores, &[])));
        print_fastest(count, "an Ingress's path", || {
            flip = !flip;
            move_path(&mut stores, &mut ingress, flip);
            timed(|| renderer.render(&stores, &[]))
        });
        print_fastest(count, "five Ingresses in a row", || {
            flip = !flip;
            for ingress in &mut in_a_row {
                move_path(&mut stores, ingress, flip);
            }
            timed(|| renderer.render(&stores, &[]))
        });
    }
    group.finish();
}

/// How long a render takes (its files dropped after the timing).
fn timed<T, E: std::fmt::Debug>(render: impl FnOnce() -> Result<T, E>) -> std::time::Duration {
    let started = std::time::Instant::now();
    let files = render().expect("renders");
    let took = started.elapsed();
    drop(black_box(files));
    took
}

/// The fastest and the median of `runs` timings `run` makes, in seconds. On a shared machine
/// other work only ever adds time, so the fastest run is the figure least disturbed by it;
/// criterion's estimates (means and medians) say how much the machine disturbed.
fn fastest_and_median(runs: usize, mut run: impl FnMut() -> std::time::Duration) -> (f64, f64) {
    let mut times: Vec<f64> = (0..runs).map(|_| run().as_secs_f64()).collect();
    times.sort_by(f64::total_cmp);
    (times[0], times[times.len() / 2])
}

/// Prints `fastest_and_median` of 50 renders after one change.
fn print_fastest(count: usize, change: &str, run: impl FnMut() -> std::time::Duration) {
    let (fastest, median) = fastest_and_median(50, run);
    println!(
        "chart_library_one_change: {count} Ingresses: {change}: fastest of 50 renders {:.2} ms, median {:.2} ms",
        fastest * 1e3,
        median * 1e3
    );
}

/// An Ingress's first path moved (`flip`) or back, in the stores.
fn move_path(stores: &mut Stores, ingress: &mut serde_json::Value, flip: bool) {
    ingress["spec"]["rules"][0]["http"]["paths"][0]["path"] = if flip { "/moved".into() } else { "/".into() };
    std::sync::Arc::make_mut(stores.get_mut("ingresses").expect("ingresses")).apply(ingress.clone()).expect("applies");
}

fn render_httproutes(c: &mut Criterion, config: &HAProxyTemplateConfig) {
    let renderer = Renderer::compile(&config.spec).expect("the chart's configuration compiles");
    let mut group = c.benchmark_group("gateway_library");
    group.sample_size(10);
    for count in [1_000usize, 10_000] {
        let stores = stores_for(config, &synthetic::httproute_fleet(count));
        let files = renderer.render(&stores, &[]).expect("renders").files;
        let gateway_lines = files.haproxy_cfg.content.lines().filter(|l| l.contains("txn.gwr")).count();
        // The model alone (reading the objects, attaching, ranking), without the templates.
        let settings = config.spec.gateway_api.clone().expect("the Gateway API is on");
        let started = std::time::Instant::now();
        let inputs = haptic::gateway::Inputs::from_stores(&stores, Vec::new(), None);
        let read = started.elapsed();
        let model = haptic::gateway::build(&settings, &inputs);
        println!(
            "gateway_library: {count} HTTPRoutes: model {:.1} ms (reading the objects {:.1} ms), {} frontends",
            started.elapsed().as_secs_f64() * 1e3,
            read.as_secs_f64() * 1e3,
            model.frontends.len()
        );
        println!(
            "gateway_library: {count} HTTPRoutes: haproxy.cfg {} KiB ({gateway_lines} routing lines), gw-prefix.map {} KiB",
            files.haproxy_cfg.content.len() / 1024,
            files.maps.get("gw-prefix.map").map_or(0, |m| m.content.len() / 1024),
        );
        group.throughput(Throughput::Elements(count as u64));
        group.bench_with_input(BenchmarkId::from_parameter(count), &stores, |b, stores| {
            b.iter(|| black_box(renderer.render(stores, &[]).expect("renders").files));
        });
    }
    group.finish();
}

/// 10,000 Ingresses, 10% of them with ingress-nginx's annotations (issue #48), beside the same
/// fleet without any, each a full render from a renderer given the slots of a first render:
/// fastest of 10, taken in turns so a slow phase of the machine slows both alike.
fn render_annotated(config: &HAProxyTemplateConfig) {
    let count = 10_000;
    let fleets = [
        ("without annotations", synthetic::ingress_fleet(count)),
        ("10% annotated", synthetic::ingress_fleet_annotated(count, 10)),
    ];
    let prepared: Vec<_> = fleets
        .iter()
        .map(|(name, objects)| {
            let stores = stores_for(config, objects);
            let renderer = Renderer::compile(&config.spec).expect("compiles");
            let files = renderer.render(&stores, &[]).expect("renders").files;
            (name, stores, renderer, files.haproxy_cfg.content.len())
        })
        .collect();
    let mut fastest = vec![f64::MAX; prepared.len()];
    for _ in 0..10 {
        for (index, (_, stores, renderer, _)) in prepared.iter().enumerate() {
            let fresh = Renderer::compile(&config.spec).expect("compiles");
            fresh.seed_slots(renderer.slots());
            let started = std::time::Instant::now();
            let files = fresh.render(stores, &[]).expect("renders").files;
            fastest[index] = fastest[index].min(started.elapsed().as_secs_f64());
            drop(black_box((fresh, files)));
        }
    }
    for ((name, _, _, cfg_bytes), fastest) in prepared.iter().zip(fastest) {
        println!(
            "chart_library_annotated: {count} Ingresses, {name}: full render fastest of 10 {:.1} ms ({:.1} µs per Ingress); haproxy.cfg {} KiB",
            fastest * 1e3,
            fastest * 1e6 / count as f64,
            cfg_bytes / 1024
        );
    }
}

fn render_fleets(c: &mut Criterion, name: &str, config: &HAProxyTemplateConfig, paths: usize) {
    let renderer = Renderer::compile(&config.spec).expect("example compiles");
    let mut group = c.benchmark_group(name);
    group.sample_size(10);
    let mut plans = Vec::new();
    for count in [100usize, 1_000, 10_000] {
        let objects = synthetic::ingress_fleet_with_paths(count, paths);
        haptic::store::compact::sweep_shared_parts();
        let before = live_bytes();
        let stores = stores_for(config, &objects);
        let stored = live_bytes() - before;
        // The first render builds each object's template value once (part of the store) and
        // leaves the renderer's server slots; the files themselves are not counted.
        let files = renderer.render(&stores, &[]).expect("renders").files;
        let held = live_bytes() - before - files.entries().map(|(_, f)| f.content.len() as isize).sum::<isize>();
        let mib = |bytes: isize| bytes as f64 / 1048576.0;
        println!(
            "{name}: stores for {count} Ingresses (+ Services, EndpointSlices): {:.1} MiB held after a render ({:.1} MiB before it), {:.1} KiB per Ingress; haproxy.cfg {} KiB",
            mib(held),
            mib(stored),
            held as f64 / 1024.0 / count as f64,
            files.haproxy_cfg.content.len() / 1024
        );
        drop(objects);
        group.throughput(Throughput::Elements(count as u64));
        // A full render: a renderer with no blocks of an earlier render to reuse (compiled
        // outside the timing), as after a start or a new configuration, given the server slots
        // of the render before (as the journal gives them at a start).
        let started = std::time::Instant::now();
        let fresh = Renderer::compile(&config.spec).expect("compiles");
        let compiled = started.elapsed();
        black_box(fresh.render(&stores, &[]).expect("renders").files);
        println!(
            "{name}: {count} Ingresses: a render from nothing (no blocks, no slots) {:.1} ms",
            (started.elapsed() - compiled).as_secs_f64() * 1e3
        );
        group.bench_with_input(BenchmarkId::from_parameter(count), &stores, |b, stores| {
            b.iter_batched(
                || {
                    let fresh = Renderer::compile(&config.spec).expect("compiles");
                    fresh.seed_slots(renderer.slots());
                    fresh
                },
                // The renderer is handed back, so its drop (blocks and all) is not timed.
                |fresh| {
                    let files = fresh.render(stores, &[]).expect("renders").files;
                    black_box((fresh, files))
                },
                criterion::BatchSize::PerIteration,
            );
        });
        if count == 10_000 {
            let (fastest, median) = fastest_and_median(10, || {
                let fresh = Renderer::compile(&config.spec).expect("compiles");
                fresh.seed_slots(renderer.slots());
                let started = std::time::Instant::now();
                let files = fresh.render(&stores, &[]).expect("renders").files;
                let took = started.elapsed();
                drop(black_box((fresh, files)));
                took
            });
            println!(
                "{name}: {count} Ingresses: full render fastest of 10 {:.1} ms ({:.1} µs per Ingress), median {:.1} ms",
                fastest * 1e3,
                fastest * 1e6 / count as f64,
                median * 1e3
            );
        }
        plans.push((count, files));
    }
    group.finish();
    // What each pod's driver does with a render: plan it against the files the pod runs, here
    // one endpoint moved in the last backend (a runtime change), and the heap it takes to.
    let mut group = c.benchmark_group(format!("{name}_plan"));
    group.sample_size(10);
    for (count, before) in plans {
        let text = &before.haproxy_cfg.content;
        let last_server = text.rfind("    server ").expect("a server line");
        let address_end = last_server + text[last_server..].find(':').expect("an address");
        let address_start = text[..address_end].rfind(' ').expect("an address") + 1;
        let moved = format!("{}198.19.255.254{}", &text[..address_start], &text[address_end..]);
        let mut after = before.clone();
        after.haproxy_cfg = haptic::files::RenderedFile::new(moved);
        let changes = haptic::plan::AddressChanges::Followed;
        let live = live_bytes();
        PEAK_BYTES.store(live, Ordering::Relaxed);
        KEEPING_PEAK.store(true, Ordering::Relaxed);
        let plan = haptic::plan::plan(&before, &after, changes);
        KEEPING_PEAK.store(false, Ordering::Relaxed);
        let peak = PEAK_BYTES.load(Ordering::Relaxed) - live;
        assert!(matches!(plan, haptic::plan::Plan::Runtime(_)), "{plan:?}");
        println!("{name}_plan: {count} Ingresses: a plan's peak heap {:.2} MiB", peak as f64 / 1048576.0);
        group.bench_with_input(BenchmarkId::from_parameter(count), &(before, after), |b, (before, after)| {
            b.iter(|| black_box(haptic::plan::plan(before, after, changes)));
        });
    }
    group.finish();
}

criterion_group!(benches, render);
criterion_main!(benches);
