//! Progress bars for long steps. Bars draw on stderr only when it is a terminal and the user
//! did not ask for quiet; otherwise they are hidden and cost nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

pub use indicatif::ProgressBar;
use indicatif::{MultiProgress, ProgressDrawTarget, ProgressStyle};

static QUIET: AtomicBool = AtomicBool::new(false);
/// Every bar of the process draws through this, so nested bars (training's epochs, an epoch's
/// batches) stack instead of overwriting each other.
static BARS: OnceLock<MultiProgress> = OnceLock::new();

/// Turns every progress bar of the process off (the CLI's `--quiet`).
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// A bar of `len` units (bytes when `bytes` is true) labelled `msg`.
pub fn bar(len: u64, msg: &str, bytes: bool) -> ProgressBar {
    let pb = add(ProgressBar::new(len));
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

/// A bar counting `len` `unit`s (e.g. batches) with their rate.
pub fn counter(len: u64, msg: &str, unit: &str) -> ProgressBar {
    let pb = add(ProgressBar::new(len));
    let template =
        format!("{{msg:>12}} [{{bar:30}}] {{human_pos}}/{{human_len}} {unit} ({{per_sec}}) eta {{eta}}");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(msg.to_string());
    pb
}

/// A spinner for steps of unknown length.
pub fn spinner(msg: &str) -> ProgressBar {
    let pb = add(ProgressBar::no_length());
    if let Ok(style) = ProgressStyle::with_template("{msg:>12} {spinner} {elapsed}") {
        pb.set_style(style);
    }
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(std::time::Duration::from_millis(200));
    pb
}

fn add(pb: ProgressBar) -> ProgressBar {
    if QUIET.load(Ordering::Relaxed) {
        pb.set_draw_target(ProgressDrawTarget::hidden());
        return pb;
    }
    // indicatif hides the stderr target by itself when stderr is not a terminal.
    BARS.get_or_init(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr())).add(pb)
}
