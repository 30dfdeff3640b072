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
    // under mpirun, rank 0 reports: the others log warnings and errors only
    let follower = grinnder_dist::launched_rank().is_some_and(|r| r > 0);
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::builder()
                .with_default_directive(
                    if cli.quiet || follower { "warn" } else { "info" }.parse().expect("valid directive"),
                )
                .from_env_lossy(),
        )
        .with_writer(std::io::stderr)
        .without_time()
        .with_target(false)
        .init();
    grinnder_graph::progress::set_quiet(cli.quiet);
    // ranks sharing a machine share its cores unless --threads says otherwise
    let threads = cli.threads.or_else(|| {
        let local = grinnder_dist::launched_local_ranks().filter(|&n| n > 1)?;
        // the cores this process may run on (the launcher may have bound it to fewer)
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let online = online_cpus().unwrap_or(cores);
        if cores < online / local {
            tracing::warn!(
                "this rank may run on {cores} of the machine's {online} cores (the launcher bound it): `mpirun --bind-to none` lets the {local} ranks here share them"
            );
            return Some(cores);
        }
        Some((cores / local).max(1))
    });
    if let Some(t) = threads {
        if let Err(e) = rayon::ThreadPoolBuilder::new().num_threads(t).build_global() {
            eprintln!("error: cannot start {t} threads: {e}");
            return std::process::ExitCode::FAILURE;
        }
    }
    // an allocation past --gpu-mem unwinds out of the trainer (destructors clean up storage
    // files) and is reported as an error, not as a crash
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if budget_message(info.payload()).is_none() {
            default_hook(info);
        }
    }));
    let result = std::panic::catch_unwind(|| commands::run(cli.command));
    match result {
        Ok(Ok(())) => std::process::ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
        Err(payload) => match budget_message(payload.as_ref()) {
            Some(m) => {
                eprintln!("error: {m}");
                std::process::ExitCode::FAILURE
            }
            None => std::panic::resume_unwind(payload),
        },
    }
}

/// The message of a panic raised by the GPU memory budget.
fn budget_message(payload: &(dyn std::any::Any + Send)) -> Option<String> {
    let m = payload.downcast_ref::<String>()?;
    m.starts_with("GPU memory budget exceeded").then(|| m.clone())
}

/// The machine's online CPUs (Linux), whatever this process's affinity.
fn online_cpus() -> Option<usize> {
    // "0-31" or "0-3,8-11"
    let list = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
    list.trim().split(',').try_fold(0, |n, r| {
        let (a, b) = r.split_once('-').unwrap_or((r, r));
        Some(n + b.parse::<usize>().ok()? + 1 - a.parse::<usize>().ok()?)
    })
}
