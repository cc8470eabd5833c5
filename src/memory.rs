//! How the process asks its allocator to hand memory back. With glibc's defaults, a controller
//! whose renders are megabytes (a 4 MB configuration at 10,000 Ingresses, copied into each
//! push) keeps a heap arena per thread that touched such buffers and raises its mapping
//! threshold past them, so freed renders stay in the process: measured under churn at 10,000
//! Ingresses, 461 MiB peak against 351 MiB with the settings below (docs/benchmarks.md).

/// Caps glibc's arenas and has buffers of 1 MiB or more mapped apart (returned to the system
/// when freed), unless the environment sets either (`MALLOC_ARENA_MAX`,
/// `MALLOC_MMAP_THRESHOLD_`), which glibc then follows. Elsewhere (musl, the image's static
/// binary, returns large buffers by itself) it does nothing.
pub fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const ARENAS: libc::c_int = 2;
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
