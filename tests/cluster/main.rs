//! The integration tests that need the environment's API server (or nothing of it) but never
//! configure its HAProxy pods, one binary for all: `make test` runs it beside `tests/pods/`.
//! tests/watch_restart.rs, which restarts the API server, and tests/demo.rs (`make demo`) run
//! on their own.

#[path = "../support/chart_config.rs"]
mod chart_config;
#[path = "../env/mod.rs"]
mod env;
#[path = "../support/synthetic.rs"]
mod synthetic;

mod api;
mod architecture;
mod chart;
mod fleet;
mod image;
mod incremental;
mod ingress_status;
mod log_level;
mod migrate;
mod render;
mod settings;
mod shutdown;
mod slots;
mod status;
mod traces;
