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

/// The start of the process's clock for setup lines ([`mark_start`], else the first phase).
static START: OnceLock<std::time::Instant> = OnceLock::new();

/// The phases begun so far: name, start, seconds (when ended), announced.
static PHASES: std::sync::Mutex<Vec<PhaseEntry>> = std::sync::Mutex::new(Vec::new());

struct PhaseEntry {
    name: String,
    start: std::time::Instant,
    secs: Option<f64>,
    announced: bool,
    /// A step inside another phase ([`step`]): announced, but not one of [`phase_times`].
    step: bool,
}

/// A phase open longer than this is announced while it runs (off a terminal, where no spinner
/// shows it), and its end is logged.
const ANNOUNCE_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Starts the clock that setup lines are stamped with (the binary calls it first thing).
pub fn mark_start() {
    START.get_or_init(std::time::Instant::now);
}

fn since_start() -> f64 {
    START.get_or_init(std::time::Instant::now).elapsed().as_secs_f64()
}

/// A setup step (loading, partitioning, building blocks, …), timed until dropped: a spinner on
/// a terminal; off one, a line stamped with the seconds since start once it has run for a
/// second, and another when it ends — a batch job's log shows what a long setup is doing. Every
/// phase's time is kept for the summary ([`phase_times`]).
pub struct Phase {
    index: usize,
    spin: ProgressBar,
}

/// Begins the phase `name` (see [`Phase`]).
pub fn phase(name: &str) -> Phase {
    begin(name, false)
}

/// Begins a step inside the phase under way (a partitioner's coarsening level, say): shown and
/// announced as a phase is, but its time is its phase's, so [`phase_times`] leaves it out.
pub fn step(name: &str) -> Phase {
    begin(name, true)
}

fn begin(name: &str, step: bool) -> Phase {
    mark_start();
    let index = {
        let mut all = PHASES.lock().unwrap_or_else(|e| e.into_inner());
        all.push(PhaseEntry {
            name: name.to_string(),
            start: std::time::Instant::now(),
            secs: None,
            announced: false,
            step,
        });
        all.len() - 1
    };
    start_watch();
    Phase { index, spin: spinner(name) }
}

impl Drop for Phase {
    fn drop(&mut self) {
        self.spin.finish_and_clear();
        let mut all = PHASES.lock().unwrap_or_else(|e| e.into_inner());
        let e = &mut all[self.index];
        let secs = e.start.elapsed().as_secs_f64();
        e.secs = Some(secs);
        if e.announced && !QUIET.load(Ordering::Relaxed) {
            tracing::info!("[{:.1} s] {} done in {secs:.1} s", since_start(), e.name);
        }
    }
}

/// Every ended phase with its seconds, in the order they began (not the [`step`]s within).
pub fn phase_times() -> Vec<(String, f64)> {
    let all = PHASES.lock().unwrap_or_else(|e| e.into_inner());
    all.iter().filter(|e| !e.step).filter_map(|e| Some((e.name.clone(), e.secs?))).collect()
}

/// One thread per process announces the phases that run past [`ANNOUNCE_AFTER`] where no
/// spinner shows them (stderr not a terminal).
fn start_watch() {
    static WATCH: OnceLock<()> = OnceLock::new();
    WATCH.get_or_init(|| {
        if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            return;
        }
        let spawned = std::thread::Builder::new().name("setup-phases".into()).spawn(|| loop {
            std::thread::sleep(std::time::Duration::from_millis(250));
            let mut all = PHASES.lock().unwrap_or_else(|e| e.into_inner());
            for e in all.iter_mut().filter(|e| e.secs.is_none() && !e.announced) {
                if e.start.elapsed() >= ANNOUNCE_AFTER {
                    e.announced = true;
                    if !QUIET.load(Ordering::Relaxed) {
                        // stamped with the phase's start
                        let at = since_start() - e.start.elapsed().as_secs_f64();
                        tracing::info!("[{:.1} s] {} …", at.max(0.0), e.name);
                    }
                }
            }
        });
        if let Err(e) = spawned {
            tracing::debug!("no thread to announce setup phases: {e}");
        }
    });
}

/// What a long step (an epoch) is doing now, for a ticker on another thread to show: the
/// phase it is in, the partition steps done and the bytes it has moved. The engine reports
/// ([`activity_begin`], [`activity_phase`], [`activity_step`], [`activity_bytes`]); a caller
/// that shows progress reads [`activity`]. Relaxed atomics: a ticker's view may lag a step.
struct Activity {
    /// The pass the phase belongs to, where not the training pass ("evaluation").
    pass: std::sync::Mutex<&'static str>,
    phase: std::sync::Mutex<String>,
    steps: std::sync::atomic::AtomicU64,
    /// (bytes counted before the reporter's counter last restarted, its last reading)
    bytes: std::sync::Mutex<(u64, u64)>,
}

static ACTIVITY: Activity = Activity {
    pass: std::sync::Mutex::new(""),
    phase: std::sync::Mutex::new(String::new()),
    steps: std::sync::atomic::AtomicU64::new(0),
    bytes: std::sync::Mutex::new((0, 0)),
};

/// A new long step begins: nothing done yet.
pub fn activity_begin() {
    ACTIVITY.steps.store(0, Ordering::Relaxed);
    *ACTIVITY.bytes.lock().unwrap_or_else(|e| e.into_inner()) = (0, 0);
    activity_pass("");
    activity_phase("");
}

/// The pass under way within the same step, where not the training pass (an epoch's
/// "evaluation" after its training pass): it names the phases [`activity`] reports.
pub fn activity_pass(pass: &'static str) {
    *ACTIVITY.pass.lock().unwrap_or_else(|e| e.into_inner()) = pass;
}

/// The phase now under way (e.g. "forward aggregation of layer 1").
pub fn activity_phase(phase: &str) {
    let mut p = ACTIVITY.phase.lock().unwrap_or_else(|e| e.into_inner());
    p.clear();
    p.push_str(phase);
}

/// One more partition step done.
pub fn activity_step() {
    ACTIVITY.steps.fetch_add(1, Ordering::Relaxed);
}

/// The reporter's count of bytes moved (between tiers: to and from the GPU, storage); a count
/// that went down was restarted (the step's figures taken mid-way), and adds to what it had.
pub fn activity_bytes(count: u64) {
    let mut b = ACTIVITY.bytes.lock().unwrap_or_else(|e| e.into_inner());
    if count < b.1 {
        b.0 += b.1;
    }
    b.1 = count;
}

/// (phase, partition steps done, bytes moved) of the long step under way.
pub fn activity() -> (String, u64, u64) {
    let mut p = ACTIVITY.phase.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let pass = *ACTIVITY.pass.lock().unwrap_or_else(|e| e.into_inner());
    if !pass.is_empty() {
        p = if p.is_empty() { pass.to_string() } else { format!("{pass}: {p}") };
    }
    let (before, now) = *ACTIVITY.bytes.lock().unwrap_or_else(|e| e.into_inner());
    (p, ACTIVITY.steps.load(Ordering::Relaxed), before + now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_evaluations_phases_say_so() {
        activity_begin();
        activity_phase("forward of layer 1 done");
        assert_eq!(activity().0, "forward of layer 1 done");
        activity_pass("evaluation");
        assert_eq!(activity().0, "evaluation: forward of layer 1 done");
        activity_phase("");
        assert_eq!(activity().0, "evaluation");
        activity_begin();
        assert_eq!(activity().0, "", "a new step is a training pass again");
    }

    #[test]
    fn a_long_phase_is_announced_off_a_terminal_and_every_phase_is_timed() {
        let short = phase("a short phase");
        drop(short);
        let long = phase("a long phase");
        let inner = step("a long step");
        std::thread::sleep(ANNOUNCE_AFTER + std::time::Duration::from_millis(600));
        drop(inner);
        drop(long);
        let times = phase_times();
        let secs = |name: &str| times.iter().find(|(n, _)| n == name).map(|t| t.1);
        assert!(secs("a short phase").is_some_and(|s| s < 1.0), "{times:?}");
        assert!(secs("a long phase").is_some_and(|s| s >= 1.5), "{times:?}");
        assert!(secs("a long step").is_none(), "a step is its phase's time, not a phase: {times:?}");
        let all = PHASES.lock().unwrap();
        let announced = |name: &str| all.iter().find(|e| e.name == name).map(|e| e.announced);
        assert_eq!(announced("a short phase"), Some(false));
        if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            assert_eq!(announced("a long phase"), Some(true), "announced while it ran");
            assert_eq!(announced("a long step"), Some(true), "a step is announced as a phase is");
        }
    }
}
