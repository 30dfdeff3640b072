//! `grinnder`: the command-line front end (the library half of this crate, `grinnder_cli`,
//! holds the commands; this file starts the process: logging, threads, the allocator, and the
//! exit code).

use std::sync::atomic::{AtomicBool, Ordering};

use clap::Parser;
use grinnder_cli::{args, commands};

/// Large matrices are allocated and freed every epoch; mimalloc keeps freed pages for reuse
/// instead of returning them to the kernel and faulting them in (zeroed) again. Its use is
/// counted (`grinnder_engine::heap`): the memory plan budgets with what is in use, not with
/// what the allocator happens to keep.
#[global_allocator]
static ALLOC: grinnder_engine::heap::Counting<mimalloc::MiMalloc> =
    grinnder_engine::heap::Counting(mimalloc::MiMalloc);

fn main() -> std::process::ExitCode {
    grinnder_engine::process::mark_process_start();
    // setup lines are stamped with the seconds since here
    grinnder_graph::progress::mark_start();
    let cli = args::Cli::parse();
    // under mpirun, rank 0 reports: the others log warnings and errors only
    let follower = grinnder_dist::launched_rank().is_some_and(|r| r > 0);
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::builder()
                .with_default_directive(
                    if cli.quiet || follower {
                        "warn"
                    } else if cli.verbose {
                        "debug"
                    } else {
                        "info"
                    }
                    .parse()
                    .expect("valid directive"),
                )
                .from_env_lossy(),
        )
        .with_writer(std::io::stderr)
        // colour only on a terminal, and never where NO_COLOR is set (no-color.org) or TERM is
        // dumb: a batch job's log file gets plain text
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none()
                && std::env::var("TERM").map_or(true, |t| t != "dumb"),
        )
        .without_time()
        .with_target(false)
        .init();
    grinnder_graph::progress::set_quiet(cli.quiet);
    remove_storage_on_signals();
    // ranks sharing a machine share its cores unless --threads says otherwise
    let threads = cli.threads.or_else(|| {
        let local = grinnder_dist::launched_local_ranks().filter(|&n| n > 1)?;
        // the cores this process may use (affinity and any CPU quota), and those its affinity
        // allows: a launcher may have bound it to fewer than its share
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let online = cpu_list("/sys/devices/system/cpu/online", None).unwrap_or(cores);
        let allowed = cpu_list("/proc/self/status", Some("Cpus_allowed_list:")).unwrap_or(online);
        if allowed < online / local {
            tracing::warn!(
                "this rank may run on {allowed} of the machine's {online} cores (the launcher bound it): `mpirun --bind-to none` lets the {local} ranks here share them"
            );
            return Some(cores.min(allowed));
        }
        Some((cores / local).max(1))
    });
    if let Some(t) = threads {
        if let Err(e) = rayon::ThreadPoolBuilder::new().num_threads(t).build_global() {
            eprintln!("error: cannot start {t} threads: {e}");
            return std::process::ExitCode::FAILURE;
        }
    }
    // an allocation past --gpu-mem, or one the device refuses, unwinds out of the trainer (destructors clean up storage
    // files) and is reported as an error, not as a crash
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if budget_message(info.payload()).is_none() && !broken_pipe(info.payload()) {
            default_hook(info);
        }
    }));
    let result = std::panic::catch_unwind(|| commands::run(cli.command));
    if result.as_ref().map_or(true, |r| r.is_err()) && INTERRUPTED.load(Ordering::SeqCst) {
        // the run failed because the signal thread removed its storage under it (a block file
        // gone mid-read): that thread ends the process with the signal's code, not this error
        loop {
            std::thread::park();
        }
    }
    match result {
        Ok(Ok(())) => std::process::ExitCode::SUCCESS,
        // the reader of our output went away (`grinnder partition … | head -1`): it has what
        // it wanted, so stop quietly, as `cat` or `grep` would
        Ok(Err(e)) if e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(is_epipe)) => {
            std::process::ExitCode::SUCCESS
        }
        Err(payload) if broken_pipe(payload.as_ref()) => std::process::ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("error: {}", message(&e));
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

/// Set once SIGINT or SIGTERM arrived: the signal thread is removing the storage directories
/// and will end the process (CI saw a run fail on a removed block file and exit 1 first).
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// At SIGINT (Ctrl-C) or SIGTERM (a batch system's cancel), removes the runs' storage
/// directories and the temporaries of outputs not yet renamed into place (predict, generate,
/// convert, export, checkpoints) before the process ends: killed that way, a command leaves
/// nothing behind.
fn remove_storage_on_signals() {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = match signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot watch for SIGINT and SIGTERM ({e}): an interrupted run may leave its storage directory (grinnder clean removes it) and temporaries (the next run writing the same output removes them)");
            return;
        }
    };
    std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            INTERRUPTED.store(true, Ordering::SeqCst);
            for p in grinnder_engine::scratch::remove_live() {
                eprintln!("removed the storage directory {}", p.display());
            }
            for p in grinnder_graph::io::files::remove_temporaries() {
                eprintln!("removed the unfinished {}", p.display());
            }
            eprintln!("interrupted ({})", if sig == SIGINT { "SIGINT" } else { "SIGTERM" });
            std::process::exit(128 + sig);
        }
    });
}

/// The message of a panic raised by the GPU memory budget, or by a device out of memory.
fn budget_message(payload: &(dyn std::any::Any + Send)) -> Option<String> {
    let m =
        payload.downcast_ref::<String>().map(String::as_str).or(payload.downcast_ref::<&str>().copied())?;
    (m.starts_with("GPU memory budget exceeded") || m.starts_with("GPU out of memory")).then(|| m.to_string())
}

/// A panic of `println!` whose reader closed the pipe (Rust ignores SIGPIPE, so writes fail
/// with EPIPE and the print macros panic).
fn broken_pipe(payload: &(dyn std::any::Any + Send)) -> bool {
    let m = payload.downcast_ref::<String>().map(String::as_str).or(payload.downcast_ref::<&str>().copied());
    m.is_some_and(|m| m.starts_with("failed printing to stdout") && m.contains("Broken pipe"))
}

fn is_epipe(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::BrokenPipe
}

/// The number of CPUs in a Linux CPU list ("0-31", "0-3,8-11"): the whole file, or the line
/// starting with `key`.
fn cpu_list(path: &str, key: Option<&str>) -> Option<usize> {
    let text = std::fs::read_to_string(path).ok()?;
    let list = match key {
        None => text.trim().to_string(),
        Some(k) => text.lines().find_map(|l| l.strip_prefix(k))?.trim().to_string(),
    };
    list.split(',').try_fold(0, |n, r| {
        let (a, b) = r.split_once('-').unwrap_or((r, r));
        Some(n + b.parse::<usize>().ok()? + 1 - a.parse::<usize>().ok()?)
    })
}

/// `e` and its causes, joined by ": ", leaving out a cause its wrapper already quotes (errors
/// that name their source in their own message: "cannot read model file m: No such file…"
/// would otherwise say it twice).
fn message(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.contains(&c) {
            msg = format!("{msg}: {c}");
        }
    }
    msg
}
