//! haptic: a Kubernetes ingress controller for a fleet of HAProxy load balancers.
//!
//! The pipeline runs watch → render → plan → per-pod state machine → Dataplane client,
//! with the journal, the HTTP API, telemetry and leader election at the side. `docs/ARCHITECTURE.md`
//! describes each module, what it owns and what it may call.

pub mod admission;
pub mod api;
pub mod checks;
pub mod cli;
pub mod config;
pub mod controller;
pub mod dataplane;
pub mod election;
pub mod files;
pub mod fleet;
pub mod gateway;
pub mod journal;
pub mod memory;
pub mod migrate;
pub mod offline;
pub mod plan;
pub mod pod;
pub mod render;
pub mod store;
pub mod syntax;
pub mod tasks;
pub mod telemetry;
pub mod tls;
pub mod watch;

#[cfg(test)]
mod fuzz;
