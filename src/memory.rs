//! How the process asks its allocator to hand memory back. With glibc's defaults, a controller
//! whose renders are megabytes (a 4 MB configuration at 10,000 Ingresses, copied into each
//! push) keeps a heap arena per thread that touched such buffers and raises its mapping
//! threshold past them, so freed renders stay in the process: measured under churn at 10,000
//! Ingresses, 461 MiB peak against 351 MiB with two arenas and large buffers mapped apart, and
//! 210 / 205 MiB against 188 MiB with one arena instead of two (docs/benchmarks.md).

/// Caps glibc's arenas and has buffers of 1 MiB or more mapped apart (returned to the system
/// when freed), unless the environment sets either (`MALLOC_ARENA_MAX`,
/// `MALLOC_MMAP_THRESHOLD_`), which glibc then follows. Elsewhere (musl, the image's static
/// binary, returns large buffers by itself) it does nothing.
pub fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // One arena: the controller's threads seldom allocate at once (renders run one at a
        // time), and each more arena keeps its own partly used pages (20 MiB at the peak).
        const ARENAS: libc::c_int = 1;
        const MAPPED_FROM: libc::c_int = 1024 * 1024;
        // SAFETY: mallopt only changes allocator parameters; it is called before any thread
        // starts, and a refused setting (0 returned) leaves glibc's default in place.
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            unsafe { libc::mallopt(libc::M_ARENA_MAX, ARENAS) };
        }
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MAPPED_FROM) };
        }
    }
}

/// How often a running controller hands freed heap pages back.
pub const HAND_BACK_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Hands the heap's free pages back to the system (glibc's `malloc_trim`), and says how long
/// it took. glibc returns only the top of a heap by itself: pages freed inside it (a render's
/// and a push's buffers, a status pass's answers) stay the process's until reused. Measured on
/// a controller with 10,000 Ingresses after churn: 298 MiB resident, 220 MiB after one trim.
pub fn hand_back_freed_pages() -> std::time::Duration {
    let started = std::time::Instant::now();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only releases free memory of the allocator's own arenas; it is
        // safe to call from any thread at any time.
        unsafe { libc::malloc_trim(0) };
    }
    started.elapsed()
}

/// Runs [`hand_back_freed_pages`] every [`HAND_BACK_EVERY`] on the blocking pool until the
/// runtime stops.
pub fn spawn_hand_back() {
    tokio::spawn(async {
        let mut every = tokio::time::interval(HAND_BACK_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            match tokio::task::spawn_blocking(hand_back_freed_pages).await {
                Ok(took) => tracing::trace!(?took, "freed heap pages handed back"),
                Err(_) => return,
            }
        }
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn handing_back_freed_pages_keeps_live_memory() {
        let kept: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 64 * 1024]).collect();
        let freed: Vec<Vec<u8>> = (0..64).map(|_| vec![7u8; 64 * 1024]).collect();
        drop(freed);
        super::hand_back_freed_pages();
        assert!(kept.iter().enumerate().all(|(i, block)| block.iter().all(|b| *b == i as u8)));
    }
}
