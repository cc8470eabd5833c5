//! Plan: compares what a pod last received (from the journal) with the desired file set
//! and decides no-op, runtime patch or full sync, with the config diff behind that choice.
//!
//! Pure functions over plain data, property-tested. Built in the fleet and runtime issues (#4, #5).
