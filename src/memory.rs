//! How the process allocates and hands freed memory back. The `haptic` binary allocates with
//! jemalloc (its `#[global_allocator]` is in `main.rs`), in the glibc build and in the static
//! musl image alike, so what the benchmarks measure is what the image runs. Under churn at
//! 10,000 Ingresses it used less memory and CPU than glibc's allocator at its best settings
//! (one arena, large buffers mapped apart, a trim every 5 s; issue #17's churn runs), and musl's
//! own allocator was never measured there.
//!
//! The settings below are compiled in; `_RJEM_MALLOC_CONF` in the environment overrides them
//! (jemalloc reads it after these).

/// jemalloc's settings: one arena (the controller's threads seldom allocate at once: renders
/// run one at a time, and each more arena keeps its own partly used pages), no thread caches
/// (`tcache:false`: each of the controller's dozen threads — tokio's workers and blocking
/// pool, sled's — kept freed small objects of its own; under churn at 10,000 Ingresses that
/// was 13 MiB of the peak; a render, which without one took a third longer, gets one for its
/// length: [`with_thread_cache`]; issue #17), freed pages handed back by jemalloc's
/// own background thread within a second (`dirty_decay_ms`) and at once after that
/// (`muzzy_decay_ms:0`: no lazily freed stage that still counts as resident).
pub const JEMALLOC_SETTINGS: &str =
    "background_thread:true,narenas:1,tcache:false,dirty_decay_ms:1000,muzzy_decay_ms:0";

/// The settings as jemalloc looks for them at start (a C string; `main.rs` exports it under
/// the prefixed name tikv-jemalloc-sys builds jemalloc with, `_rjem_malloc_conf`).
pub const JEMALLOC_CONF: &[u8; JEMALLOC_SETTINGS.len() + 1] = &{
    let mut with_nul = [0u8; JEMALLOC_SETTINGS.len() + 1];
    let settings = JEMALLOC_SETTINGS.as_bytes();
    let mut at = 0;
    while at < settings.len() {
        with_nul[at] = settings[at];
        at += 1;
    }
    with_nul
};

/// What jemalloc holds, in bytes: the live heap and the pages around it. Read through
/// jemalloc's own statistics (an epoch advanced first, as they are cached), so they say nothing
/// of a process that allocates otherwise (a test binary on the system allocator reads jemalloc's
/// own few pages).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapFigures {
    /// Bytes the program has allocated and not freed, touched or not (sled's zeroed metric
    /// histograms and page tables, ~27 MiB never touched, count here and not in the RSS).
    pub allocated: usize,
    /// Bytes in pages that hold live allocations (`allocated` and the free room in those pages).
    pub active: usize,
    /// jemalloc's own bookkeeping.
    pub metadata: usize,
    /// At most this many bytes of jemalloc's pages are resident (active, metadata and freed
    /// pages not yet handed back; pages never touched count too, so it can exceed the RSS).
    pub resident: usize,
    /// Bytes in the extents jemalloc has mapped and uses.
    pub mapped: usize,
    /// Address space kept for reuse (not resident).
    pub retained: usize,
}

impl HeapFigures {
    /// The figures by name, as `/metrics` labels them.
    pub fn named(&self) -> [(&'static str, usize); 6] {
        [
            ("allocated", self.allocated),
            ("active", self.active),
            ("metadata", self.metadata),
            ("resident", self.resident),
            ("mapped", self.mapped),
            ("retained", self.retained),
        ]
    }
}

/// jemalloc's figures now; none when jemalloc does not answer.
pub fn heap_figures() -> Option<HeapFigures> {
    use tikv_jemalloc_ctl::{epoch, stats};
    epoch::advance().ok()?;
    Some(HeapFigures {
        allocated: stats::allocated::read().ok()?,
        active: stats::active::read().ok()?,
        metadata: stats::metadata::read().ok()?,
        resident: stats::resident::read().ok()?,
        mapped: stats::mapped::read().ok()?,
        retained: stats::retained::read().ok()?,
    })
}

/// Runs `work` with a jemalloc thread cache on this thread, and hands the cache back (its freed
/// objects to the arena, its own memory to jemalloc) when `work` ends, returns or unwinds.
///
/// Why: the compiled-in settings turn thread caches off, which saves the idle caches of a dozen
/// threads but makes a render from nothing, which allocates and frees millions of small
/// objects, a third slower. A render is one thread's burst: it gets a cache for its length.
/// Where the thread already has a cache (jemalloc's default settings), nothing changes.
pub fn with_thread_cache<T>(work: impl FnOnce() -> T) -> T {
    use tikv_jemalloc_ctl::{Access, AsName};
    /// Turns this thread's cache back off when dropped.
    struct CacheBack;
    impl Drop for CacheBack {
        fn drop(&mut self) {
            // Turning the cache off flushes it and frees it (jemalloc's `tcache_cleanup`).
            let _ = b"thread.tcache.enabled\0".name().write(false);
        }
    }
    let enabled = b"thread.tcache.enabled\0".name();
    let had_one: bool = enabled.read().unwrap_or(true);
    // Made only when this call turned the cache on (a guard made and dropped at once would
    // turn a cache the thread had off).
    let _back = if !had_one && enabled.write(true).is_ok() { Some(CacheBack) } else { None };
    work()
}

#[cfg(test)]
mod tests {
    #[test]
    fn settings_reach_jemalloc_nul_terminated() {
        assert_eq!(super::JEMALLOC_CONF.last(), Some(&0));
        assert_eq!(&super::JEMALLOC_CONF[..super::JEMALLOC_SETTINGS.len()], super::JEMALLOC_SETTINGS.as_bytes());
    }

    /// jemalloc answers for its statistics, whichever allocator the test binary uses, and its
    /// figures nest as its documentation says.
    #[test]
    fn jemalloc_gives_its_heap_figures() {
        let figures = super::heap_figures().expect("jemalloc's statistics");
        assert!(figures.allocated <= figures.active, "{figures:?}");
        assert!(figures.active <= figures.resident, "{figures:?}");
        assert!(figures.active <= figures.mapped, "{figures:?}");
        assert_eq!(figures.named().len(), 6);
    }

    /// A thread without a cache has one while the work runs and none after; one that had a
    /// cache keeps it.
    #[test]
    fn a_thread_cache_lasts_as_long_as_the_work() {
        use tikv_jemalloc_ctl::{Access, AsName};
        let enabled = || -> bool { b"thread.tcache.enabled\0".name().read().expect("jemalloc answers") };
        std::thread::spawn(move || {
            b"thread.tcache.enabled\0".name().write(false).expect("jemalloc answers");
            assert!(super::with_thread_cache(enabled));
            assert!(!enabled());
            let unwound = std::panic::catch_unwind(|| super::with_thread_cache(|| panic!("a render that fails")));
            assert!(unwound.is_err());
            assert!(!enabled(), "the cache is handed back when the work unwinds");
            b"thread.tcache.enabled\0".name().write(true).expect("jemalloc answers");
            assert!(super::with_thread_cache(enabled));
            assert!(enabled(), "a cache the thread had stays");
        })
        .join()
        .expect("the thread ends");
    }
}
