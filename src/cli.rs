//! Command line: flags are parsed here into plain values; the work happens in library modules.

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

use crate::dataplane::{Credentials, DataplaneClient, Endpoint};
use crate::telemetry::LogFormat;

/// haptic: a Kubernetes ingress controller for a fleet of HAProxy load balancers.
#[derive(Debug, Parser)]
#[command(name = "haptic", version, about, long_about = None)]
pub struct Cli {
    /// Log line format on stderr.
    #[arg(long, value_enum, default_value = "text", env = "HAPTIC_LOG_FORMAT", global = true)]
    pub log_format: LogFormat,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check that an HAProxy pod's Dataplane API answers, and print its versions.
    Probe(ProbeArgs),
}

/// Arguments of `haptic probe`.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Base URL of the Dataplane API, e.g. http://10.0.0.7:5555/v3.
    pub endpoint: String,
    /// Dataplane API user.
    #[arg(long, env = "HAPTIC_DATAPLANE_USERNAME", default_value = "admin")]
    pub username: String,
    /// Dataplane API password.
    #[arg(long, env = "HAPTIC_DATAPLANE_PASSWORD", hide_env_values = true)]
    pub password: String,
}

/// Runs `haptic probe`: one line per fact, so scripts and operators can read it.
pub async fn probe(args: ProbeArgs) -> Result<()> {
    let endpoint = Endpoint::parse(&args.endpoint)?;
    let client = DataplaneClient::new(endpoint, Credentials::new(args.username, args.password));
    let info = client.info().await.context("reading the Dataplane API's identity")?;
    let health = client.health().await.context("reading HAProxy's health")?;
    let version = client.configuration_version().await.context("reading the configuration version")?;
    println!("endpoint: {}", client.endpoint());
    println!("dataplane_api: {}", info.version);
    println!("haproxy: {health:?}");
    println!("configuration_version: {version}");
    Ok(())
}
