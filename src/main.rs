//! The `haptic` binary: parses the command line and hands off to the library.

use std::process::ExitCode;

use clap::Parser;
use haptic::cli::{Cli, Command};

/// jemalloc, the same in the glibc build and the static musl image (see `haptic::memory`).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's compiled-in settings (`haptic::memory::JEMALLOC_SETTINGS`), read as its
/// `malloc_conf`: a pointer to a C string.
#[used]
#[unsafe(export_name = "_rjem_malloc_conf")]
static JEMALLOC_CONF: &[u8; haptic::memory::JEMALLOC_CONF.len()] = haptic::memory::JEMALLOC_CONF;

fn main() -> ExitCode {
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
        Command::MigrateCheck(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(haptic::cli::migrate_check(args))
        }
        Command::Run(args) => {
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            runtime.block_on(haptic::cli::run(*args))
        }
    }
}
