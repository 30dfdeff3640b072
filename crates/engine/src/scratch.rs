//! A run's private storage directories: `grinnder-run-<host>-<pid>-<random>` (mode 0700) inside
//! the directory the user names, so runs sharing one never meet.
//!
//! Ownership: a run directory holds an identity file, [`IDENTITY`], that says grinnder made it,
//! and the run holds an exclusive lock (`flock`) on that file for its whole life. Nothing is
//! removed on a name alone: a folder without the identity file is not grinnder's and is left
//! as it is, and inside one of ours only the files grinnder makes there (block files, the
//! probe, the identity) are removed — anything else stays, and the directory with it. Whether
//! a run is live is judged by trying its lock, never by a process id (a PID of another
//! namespace, or a reused one, says nothing about this run).
//!
//! Nothing is left behind: a directory goes with its [`RunDir`] (on success and on error), with
//! the process on SIGINT or SIGTERM ([`remove_live`], called by the binary's signal thread), and
//! what a killed run left (SIGKILL, a lost node) — its identity file there, its lock free — is
//! removed by the next run in the same directory or by `grinnder clean` ([`State::Ended`]). So
//! is a directory whose run died while making it (between its `mkdir` and its identity file
//! taking its name): named as this host's run, holding nothing but the identity file being
//! made (its lock free), untouched for [`MAKING_S`] seconds.
//! A directory kept with `--keep-storage` is marked [`KEPT`] and left for the user: later
//! runs make their own beside it and `grinnder clean` lists it without removing it.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use grinnder_graph::io::files::try_lock;

/// The prefix of every run directory.
pub const PREFIX: &str = "grinnder-run-";

/// The identity file of a run directory: its presence says grinnder made the directory; the
/// run holds a lock on it while it lives.
pub const IDENTITY: &str = ".grinnder-run";

/// The mark of a run directory kept with `--keep-storage`: left for the user.
pub const KEPT: &str = ".grinnder-kept";

/// How long a run directory may stay without its identity file before its run is taken to
/// have died making it (a run names it microseconds after its `mkdir`).
pub const MAKING_S: u64 = 60;

/// The directories of this process's live runs, for [`remove_live`].
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// A run's private directory; removed with the files grinnder made in it when dropped, unless
/// kept. Holds the lock on its identity file.
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
    /// The identity file, locked; `None` once kept or removed.
    lock: Option<File>,
}

impl RunDir {
    /// Creates a run directory inside `parent`, first removing those whose runs ended without
    /// cleaning up (their identity file there, its lock free).
    pub fn create(parent: &Path) -> io::Result<RunDir> {
        for d in find(parent).into_iter().filter(|f| f.state == State::Ended) {
            match remove_ended(&d.path) {
                Ok(()) => tracing::info!(
                    "removed {} ({:.1} MiB), left by run {} that ended without cleaning up",
                    d.path.display(),
                    d.bytes as f64 / 1048576.0,
                    d.pid
                ),
                Err(e) => tracing::warn!("cannot remove {} left by an ended run: {e}", d.path.display()),
            }
        }
        let prefix = format!("{PREFIX}{}-{}-", host(), std::process::id());
        let dir = grinnder_graph::io::files::private_dir_in(parent, &prefix)?;
        // (dropped on error: the new directory holds nothing but our own files)
        let lock = identify(dir.path())?;
        let path = dir.keep();
        LIVE.lock().unwrap_or_else(|e| e.into_inner()).push(path.clone());
        Ok(RunDir { path, lock: Some(lock) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Keeps the directory and its files for the user, marked [`KEPT`] so that no later run
    /// and no `grinnder clean` removes them; returns its path.
    pub fn keep(mut self) -> io::Result<PathBuf> {
        forget(&self.path);
        let lock = self.lock.take();
        let text = "kept by --keep-storage: grinnder leaves this directory to you (remove it when done)\n";
        let marked = new_file(&self.path.join(KEPT)).and_then(|mut f| f.write_all(text.as_bytes()));
        drop(lock);
        marked.map(|()| self.path.clone()).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot mark {} as kept ({e}): a later run in its storage directory may remove it",
                    self.path.display()
                ),
            )
        })
    }

    /// Removes the directory now, reporting a failure.
    pub fn close(mut self) -> io::Result<()> {
        forget(&self.path);
        let result = remove_ours(&self.path);
        self.lock = None;
        result
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if self.lock.is_some() {
            forget(&self.path);
            if let Err(e) = remove_ours(&self.path) {
                tracing::warn!("cannot remove the storage directory: {e}");
            }
        }
    }
}

fn forget(path: &Path) {
    LIVE.lock().unwrap_or_else(|e| e.into_inner()).retain(|p| p != path);
}

/// A new file at `path` (mode 0600, never through a link, never an existing one).
fn new_file(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Writes the identity file of the new run directory `dir`, locked before it appears under
/// its name (a `clean` at that moment sees no identity, so leaves the directory alone, or sees
/// it locked); returns it, to hold for the run's life.
fn identify(dir: &Path) -> io::Result<File> {
    let tmp = dir.join(format!("{IDENTITY}.new"));
    let mut f = new_file(&tmp)?;
    if !try_lock(&f)? {
        return Err(io::Error::other(format!("{} is locked by another process", tmp.display())));
    }
    writeln!(
        f,
        "grinnder run directory, made by process {} on {}; the run holds a lock on this file while it lives",
        std::process::id(),
        host()
    )?;
    std::fs::rename(&tmp, dir.join(IDENTITY))?;
    Ok(f)
}

/// Whether `name`, a regular file in a run directory, is one grinnder makes there.
fn made_by_us(name: &str) -> bool {
    name.ends_with(".blk")
        || name == "probe"
        || name == IDENTITY
        || name == KEPT
        || name == format!("{IDENTITY}.new")
}

/// Removes the run directory `dir`: the files grinnder made in it, then the directory. Files
/// it did not make (anything else, links, subfolders) are left, and the directory with them
/// (an error naming them); the identity file goes last, so a directory left half-removed is
/// still recognisably ours.
fn remove_ours(dir: &Path) -> io::Result<()> {
    let mut others = Vec::new();
    let mut last = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        // file_type does not follow links: a link named like a block file is not ours
        if !(e.file_type()?.is_file() && made_by_us(&name)) {
            others.push(name);
        } else if name.starts_with(".grinnder-") {
            last.push(e.path());
        } else {
            remove_file(&e.path())?;
        }
    }
    if !others.is_empty() {
        others.sort();
        return Err(io::Error::new(
            io::ErrorKind::DirectoryNotEmpty,
            format!(
                "{} holds {} that grinnder did not make ({}); left as it is: move them out, then remove it",
                dir.display(),
                if others.len() == 1 { "an entry" } else { "entries" },
                others.join(", ")
            ),
        ));
    }
    for p in last {
        remove_file(&p)?;
    }
    std::fs::remove_dir(dir)
}

fn remove_file(p: &Path) -> io::Result<()> {
    match std::fs::remove_file(p) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Removes the run directory `dir` if its run has ended: takes its lock first (held while
/// removing), so a live run's directory is never touched.
pub fn remove_ended(dir: &Path) -> io::Result<()> {
    if std::fs::symlink_metadata(dir.join(IDENTITY)).is_err() && unfinished(dir) {
        return remove_unfinished(dir);
    }
    let lock = open_identity(dir)?;
    if !try_lock(&lock)? {
        return Err(io::Error::other(format!("{} is in use by a live run", dir.display())));
    }
    if std::fs::symlink_metadata(dir.join(KEPT)).is_ok() {
        return Err(io::Error::other(format!("{} was kept with --keep-storage", dir.display())));
    }
    remove_ours(dir)
}

/// Whether `dir`, without an identity file, is a run directory whose run died while making it:
/// nothing in it but the identity file being made (a regular file whose lock is free), and
/// untouched for [`MAKING_S`] seconds.
fn unfinished(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else { return false };
    let making = format!("{IDENTITY}.new");
    let mut being_made = false;
    for e in entries {
        let Ok(e) = e else { return false };
        if e.file_name().to_str() != Some(making.as_str()) || !e.file_type().is_ok_and(|t| t.is_file()) {
            return false;
        }
        being_made = true;
    }
    let age = std::fs::symlink_metadata(dir).and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
    if age.is_none_or(|a| a.as_secs() < MAKING_S) {
        return false;
    }
    !being_made || open_regular(&dir.join(making)).and_then(|f| try_lock(&f)).unwrap_or(false)
}

/// Removes a run directory whose run died making it ([`unfinished`]), holding the lock of its
/// identity file being made, if any, meanwhile; a directory something else entered is left
/// (`remove_dir` fails on it).
fn remove_unfinished(dir: &Path) -> io::Result<()> {
    let making = dir.join(format!("{IDENTITY}.new"));
    let lock = match open_regular(&making) {
        Ok(f) if try_lock(&f)? => Some(f),
        Ok(_) => return Err(io::Error::other(format!("{} is being made by a live run", dir.display()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    remove_file(&making)?;
    drop(lock);
    std::fs::remove_dir(dir)
}

/// The identity file of `dir`, opened to lock it: a regular file, never through a link.
fn open_identity(dir: &Path) -> io::Result<File> {
    open_regular(&dir.join(IDENTITY))
}

/// `path` opened to lock it: a regular file, never through a link.
fn open_regular(path: &Path) -> io::Result<File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::other(format!("{} is not a regular file", path.display())));
    }
    Ok(f)
}

/// Removes the directories of this process's live runs (at SIGINT or SIGTERM, before the
/// process exits); returns those removed. A write in flight may recreate nothing: the files
/// are created only inside the directory, which is gone.
pub fn remove_live() -> Vec<PathBuf> {
    let live = std::mem::take(&mut *LIVE.lock().unwrap_or_else(|e| e.into_inner()));
    live.into_iter()
        .filter(|p| {
            // another thread may be creating a file in it: try again a few times
            (0..5).any(|_| remove_ours(p).is_ok() || !p.exists())
        })
        .collect()
}

/// What a run directory found in a storage directory is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Its run holds the lock.
    Live,
    /// Its run ended without removing it (its lock is free): safe to remove.
    Ended,
    /// Kept with `--keep-storage`: the user's.
    Kept,
    /// Made on another machine (named in it): judged there, where its lock is sure to be seen.
    OtherHost(String),
    /// No identity file: not made by grinnder (or by a version before identity files); never
    /// touched.
    NotOurs,
    /// Its identity file cannot be opened or locked (the error): left alone.
    Unknown(String),
}

/// A run directory found in a storage directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub path: PathBuf,
    /// The host and process named in it (`None`: a name without a host, from an older
    /// version).
    pub host: Option<String>,
    pub pid: u32,
    /// Bytes of its files.
    pub bytes: u64,
    pub state: State,
}

/// The folders inside `parent` named like run directories, and what each is.
pub fn find(parent: &Path) -> Vec<Found> {
    let Ok(entries) = std::fs::read_dir(parent) else { return Vec::new() };
    let me = host();
    let mut found: Vec<Found> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let (host, pid) = parse(&name)?;
            let path = e.path();
            let state = state_of(&path, host.as_deref(), &me);
            Some(Found { bytes: size(&path), path, host, pid, state })
        })
        .collect();
    found.sort_by(|a, b| a.path.cmp(&b.path));
    found
}

fn state_of(dir: &Path, host: Option<&str>, me: &str) -> State {
    match std::fs::symlink_metadata(dir.join(IDENTITY)) {
        Ok(m) if m.file_type().is_file() => {}
        // a run of this host that died making its directory
        _ if host == Some(me) && unfinished(dir) => return State::Ended,
        _ => return State::NotOurs,
    }
    if std::fs::symlink_metadata(dir.join(KEPT)).is_ok() {
        return State::Kept;
    }
    match host {
        Some(h) if h != me => return State::OtherHost(h.to_string()),
        None => return State::NotOurs,
        _ => {}
    }
    // the lock taken here is released when the file closes, at the end of this call
    match open_identity(dir).and_then(|f| try_lock(&f)) {
        Ok(true) => State::Ended,
        Ok(false) => State::Live,
        Err(e) => State::Unknown(e.to_string()),
    }
}

/// `(host, pid)` of a run directory's name: `grinnder-run-<host>-<pid>-<random>`, or the older
/// `grinnder-run-<pid>-<random>`.
fn parse(name: &str) -> Option<(Option<String>, u32)> {
    let rest = name.strip_prefix(PREFIX)?;
    let (head, random) = rest.rsplit_once('-')?;
    if random.is_empty() || !random.chars().all(|c| c.is_ascii_alphanumeric()) {
        return None;
    }
    match head.rsplit_once('-') {
        Some((host, pid)) => Some((Some(host.to_string()), pid.parse().ok()?)),
        None => Some((None, head.parse().ok()?)),
    }
}

/// This machine's name, as a run directory's name holds it (letters, digits, `.` and `_`).
pub fn host() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is valid for its length; gethostname NUL-terminates within it or truncates.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = if ok { String::from_utf8_lossy(&buf[..end]).into_owned() } else { String::new() };
    let clean: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '_' { c } else { '_' })
        .collect();
    if clean.is_empty() {
        "localhost".into()
    } else {
        clean
    }
}

/// Bytes of the regular files directly inside `dir` (run directories hold no subfolders).
fn size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|es| es.filter_map(|e| e.ok()?.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_say_host_and_process() {
        assert_eq!(parse("grinnder-run-node-7.local-123-aB3xYz"), Some((Some("node-7.local".into()), 123)));
        assert_eq!(parse("grinnder-run-123-aB3xYz"), Some((None, 123)));
        assert_eq!(parse("grinnder-run-x"), None);
        assert_eq!(parse("other-123-abc"), None);
        assert!(!host().contains('-'));
    }

    /// A directory in `parent` named as a run of this host would name it, with `files` in it.
    fn named_like_a_run(parent: &Path, pid: u32, files: &[&str]) -> PathBuf {
        let d = parent.join(format!("{PREFIX}{}-{pid}-abc123", host()));
        std::fs::create_dir(&d).unwrap();
        for f in files {
            std::fs::write(d.join(f), vec![0u8; 4096]).unwrap();
        }
        d
    }

    #[test]
    fn an_ended_runs_directory_is_reclaimed_and_a_live_ones_is_not() {
        let parent = tempfile::tempdir().unwrap();
        // an ended run: its identity file there, nobody holding its lock (whatever its pid)
        let left = named_like_a_run(parent.path(), std::process::id(), &[IDENTITY, "act-l0-p0.blk"]);
        let other_host = parent.path().join(format!("{PREFIX}elsewhere-1-abc123"));
        std::fs::create_dir(&other_host).unwrap();
        std::fs::write(other_host.join(IDENTITY), b"").unwrap();
        let found = find(parent.path());
        assert_eq!(found.len(), 2);
        let mine = found.iter().find(|f| f.path == left).unwrap();
        assert!(mine.state == State::Ended && mine.bytes == 8192, "{mine:?}");
        let other = found.iter().find(|f| f.path == other_host).unwrap();
        assert_eq!(other.state, State::OtherHost("elsewhere".into()));

        let run = RunDir::create(parent.path()).unwrap();
        assert!(!left.exists(), "the ended run's directory is removed by the next run");
        assert!(other_host.exists(), "another host's directory is never removed");
        let live = find(parent.path()).into_iter().find(|f| f.path == run.path()).unwrap();
        assert_eq!(live.state, State::Live, "this run holds its lock");
        assert!(remove_ended(run.path()).is_err() && run.path().join(IDENTITY).exists());
        let path = run.path().to_path_buf();
        // (remove_live itself would take the directories of the other tests in this process)
        assert!(LIVE.lock().unwrap().contains(&path), "registered for removal at a signal");
        drop(run);
        assert!(!path.exists() && !LIVE.lock().unwrap().contains(&path));
    }

    #[test]
    fn folders_grinnder_did_not_make_are_never_touched() {
        let parent = tempfile::tempdir().unwrap();
        // named like a run of this host, but no identity file: a user's folder
        let users = named_like_a_run(parent.path(), 1, &["act-l0-p0.blk", "thesis.tex"]);
        std::fs::create_dir(users.join("figures")).unwrap();
        // an ended run's directory into which someone put a file and a folder of their own
        let mixed = named_like_a_run(parent.path(), 2, &[IDENTITY, "act-l0-p0.blk", "notes.txt"]);
        std::fs::create_dir(mixed.join("sub")).unwrap();
        std::fs::write(mixed.join("sub/data"), b"mine").unwrap();
        let states: Vec<State> = find(parent.path()).into_iter().map(|f| f.state).collect();
        assert_eq!(states, [State::NotOurs, State::Ended]);
        let run = RunDir::create(parent.path()).unwrap();
        assert!(users.join("thesis.tex").exists() && users.join("act-l0-p0.blk").exists());
        assert!(users.join("figures").is_dir());
        let err = remove_ended(&mixed).unwrap_err().to_string();
        assert!(err.contains("notes.txt") && err.contains("sub") && err.contains("did not make"), "{err}");
        assert!(mixed.join("notes.txt").exists() && mixed.join("sub/data").exists());
        assert!(mixed.join(IDENTITY).exists(), "still recognisably a run directory");
        run.close().unwrap();
    }

    #[test]
    fn a_directory_whose_run_died_making_it_is_reclaimed_once_it_is_old() {
        let parent = tempfile::tempdir().unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(MAKING_S + 5);
        let age = |d: &Path| {
            let times = std::fs::FileTimes::new().set_modified(old).set_accessed(old);
            File::open(d).unwrap().set_times(times).unwrap();
        };
        // killed after its mkdir; killed after making the identity file, before naming it
        let empty = named_like_a_run(parent.path(), 1, &[]);
        let making = named_like_a_run(parent.path(), 2, &[".grinnder-run.new"]);
        // the same, but fresh: its run may be making it right now
        let fresh = named_like_a_run(parent.path(), 3, &[]);
        // old and empty, but of another host: judged there
        let elsewhere = parent.path().join(format!("{PREFIX}elsewhere-4-abc123"));
        std::fs::create_dir(&elsewhere).unwrap();
        // a user's file beside the identity file being made: not only ours
        let users = named_like_a_run(parent.path(), 5, &[".grinnder-run.new", "notes.txt"]);
        for d in [&empty, &making, &elsewhere, &users] {
            age(d);
        }
        let state = |d: &Path| find(parent.path()).into_iter().find(|f| f.path == d).unwrap().state;
        assert_eq!(state(&empty), State::Ended);
        assert_eq!(state(&making), State::Ended);
        assert_eq!(state(&fresh), State::NotOurs);
        assert_eq!(state(&elsewhere), State::NotOurs);
        assert_eq!(state(&users), State::NotOurs);
        // its lock held: a live run is naming it
        let held = File::open(making.join(".grinnder-run.new")).unwrap();
        assert!(try_lock(&held).unwrap());
        assert_eq!(state(&making), State::NotOurs);
        drop(held);
        let run = RunDir::create(parent.path()).unwrap();
        assert!(!empty.exists() && !making.exists(), "the next run removes them");
        assert!(fresh.exists() && elsewhere.exists() && users.join("notes.txt").exists());
        run.close().unwrap();
    }

    #[test]
    fn kept_storage_is_left_for_the_user() {
        let parent = tempfile::tempdir().unwrap();
        let run = RunDir::create(parent.path()).unwrap();
        std::fs::write(run.path().join("act-l0-p0.blk"), b"block").unwrap();
        let kept = run.keep().unwrap();
        assert!(!LIVE.lock().unwrap().contains(&kept));
        assert_eq!(find(parent.path())[0].state, State::Kept);
        // a later run makes its own directory beside it; removal is refused
        let next = RunDir::create(parent.path()).unwrap();
        assert!(kept.join("act-l0-p0.blk").exists() && next.path() != kept);
        assert!(remove_ended(&kept).is_err() && kept.join("act-l0-p0.blk").exists());
        next.close().unwrap();
    }
}
