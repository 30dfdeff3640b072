//! `grinnder`: the command-line front end. Raw flags are turned into validated settings here
//! and nowhere else (Architecture invariant: only cli parses flags).

mod args;
mod bench;
mod commands;
mod plot;
mod train;

use clap::Parser;

/// Large matrices are allocated and freed every epoch; mimalloc keeps freed pages for reuse
/// instead of returning them to the kernel and faulting them in (zeroed) again.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = args::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::builder()
                .with_default_directive(
                    if cli.quiet { "warn" } else { "info" }.parse().expect("valid directive"),
                )
                .from_env_lossy(),
        )
        .with_writer(std::io::stderr)
        .without_time()
        .with_target(false)
        .init();
    grinnder_graph::progress::set_quiet(cli.quiet);
    if let Some(t) = cli.threads {
        if let Err(e) = rayon::ThreadPoolBuilder::new().num_threads(t).build_global() {
            eprintln!("error: cannot start {t} threads: {e}");
            return std::process::ExitCode::FAILURE;
        }
    }
    match commands::run(cli.command) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
