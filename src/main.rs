//! The `haptic` binary: parses the command line and hands off to the library.

use anyhow::Result;
use clap::Parser;
use haptic::cli::{Cli, Command};

fn main() -> Result<()> {
    let cli = Cli::parse();
    haptic::telemetry::init_logging(cli.log_format);
    haptic::tls::install_crypto_provider();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match cli.command {
        Command::Probe(args) => runtime.block_on(haptic::cli::probe(args)),
    }
}
