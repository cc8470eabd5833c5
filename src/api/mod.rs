//! HTTP API: read-only views of every pod's sync state, the current render, health and metrics.
//!
//! Reads from the fleet and the journal; never changes them. Built in the operations issue (#6).
