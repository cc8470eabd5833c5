//! Watch: one watcher per resource type named in the configuration, feeding in-memory
//! stores indexed by the configured keys and signalling (debounced) when a render is due.
//!
//! Owns the Kubernetes watch streams and the stores. Calls nothing downstream directly:
//! it emits change notifications that the reconciler consumes. Built in the render issue (#3).
