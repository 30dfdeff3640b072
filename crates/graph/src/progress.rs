//! Progress bars for long steps. Bars draw on stderr only when it is a terminal and the user
//! did not ask for quiet; otherwise they are hidden and cost nothing.

use std::sync::atomic::{AtomicBool, Ordering};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

static QUIET: AtomicBool = AtomicBool::new(false);

/// Turns every progress bar of the process off (the CLI's `--quiet`).
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// A bar of `len` units (bytes when `bytes` is true) labelled `msg`.
pub fn bar(len: u64, msg: &str, bytes: bool) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(len), target());
    let template = if bytes {
        "{msg:>12} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}"
    } else {
        "{msg:>12} [{bar:30}] {human_pos}/{human_len} {per_sec} eta {eta}"
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(msg.to_string());
    pb
}

/// A spinner for steps of unknown length.
pub fn spinner(msg: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(None, target());
    if let Ok(style) = ProgressStyle::with_template("{msg:>12} {spinner} {elapsed}") {
        pb.set_style(style);
    }
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(std::time::Duration::from_millis(200));
    pb
}

fn target() -> ProgressDrawTarget {
    if QUIET.load(Ordering::Relaxed) {
        ProgressDrawTarget::hidden()
    } else {
        // indicatif hides this target by itself when stderr is not a terminal.
        ProgressDrawTarget::stderr()
    }
}
