//! The `haptic` binary: parses the command line and hands off to the library.

use std::process::ExitCode;

use clap::Parser;
use haptic::cli::{Cli, Command};

fn main() -> ExitCode {
    haptic::memory::return_freed_memory();
    let cli = Cli::parse();
    let _telemetry = haptic::telemetry::init(cli.log_format);
    haptic::tls::install_crypto_provider();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // `{:#}` prints the whole chain of causes on one line, without a backtrace.
            eprintln!("haptic: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Probe(args) => {
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            runtime.block_on(haptic::cli::probe(args))
        }
        Command::Crd => haptic::cli::crd(),
        Command::StateDiagram => {
            print!("{}", haptic::fleet::machine::mermaid());
            Ok(())
        }
        Command::Render(args) => haptic::cli::render(args),
        Command::Diff(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(haptic::cli::diff(args))
        }
        Command::Validate(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(haptic::cli::validate(args))
        }
        Command::Run(args) => {
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            runtime.block_on(haptic::cli::run(*args))
        }
    }
}
