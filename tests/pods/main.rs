//! The integration tests that deploy to the environment's HAProxy pods, one binary for all.
//!
//! Every test here that configures the pods holds `env::exclusive_pods()` while it does, so
//! they take turns; the tests beside them that only read the pods or talk to the API server run
//! alongside. `make test` runs this binary beside `tests/cluster/`, whose tests never configure a
//! pod, on the same environment.

#[path = "../env/mod.rs"]
mod env;

mod admission;
mod annotations;
mod client_address;
mod credentials;
mod dataplane;
mod dataplane_tls;
mod deploy;
mod diff_live;
mod election;
mod environment;
mod failed_renders;
mod fleet_live;
mod gateway;
mod gateway_deploy;
mod hijack;
mod hostile;
mod hostile_values;
mod library;
mod nginx;
mod observability;
mod pod_versions;
mod reload_pace;
mod runtime;
mod slot_reuse;
mod status_delay;
mod tcp_passthrough;
mod validation_tests;
mod watch;

/// Not a test of haptic: the h2c (gRPC) backends of tests/pods/gateway.rs and
/// tests/pods/annotations.rs, when they run this binary inside the backend host's network
/// namespace (see tests/env/h2c.rs); otherwise it returns at once.
#[tokio::test]
async fn h2c_backends() -> anyhow::Result<()> {
    env::h2c::serve_if_asked().await
}
