//! A run's private storage directories: `grinnder-run-<host>-<pid>-<random>` (mode 0700) inside
//! the directory the user names, so runs sharing one never meet.
//!
//! Nothing is left behind: a directory goes with its [`RunDir`] (on success and on error), with
//! the process on SIGINT or SIGTERM ([`remove_live`], called by the binary's signal thread), and
//! what a killed run left (SIGKILL, a lost node) is recognisable by its name — this host and a
//! process that no longer exists — and removed by the next run in the same directory or by
//! `grinnder clean` ([`abandoned`]).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The prefix of every run directory.
pub const PREFIX: &str = "grinnder-run-";

/// The directories of this process's live runs, for [`remove_live`].
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// A run's private directory; removed with its contents when dropped, unless kept.
#[derive(Debug)]
pub struct RunDir {
    dir: Option<tempfile::TempDir>,
}

impl RunDir {
    /// Creates a run directory inside `parent`, first removing those that runs of this host
    /// left when killed (their process is gone).
    pub fn create(parent: &Path) -> io::Result<RunDir> {
        for d in abandoned(parent) {
            let bytes = d.bytes;
            match std::fs::remove_dir_all(&d.path) {
                Ok(()) => tracing::info!(
                    "removed {} ({:.1} MiB), left by run {} that ended without cleaning up",
                    d.path.display(),
                    bytes as f64 / 1048576.0,
                    d.pid
                ),
                Err(e) => tracing::warn!("cannot remove {} left by an ended run: {e}", d.path.display()),
            }
        }
        let prefix = format!("{PREFIX}{}-{}-", host(), std::process::id());
        let dir = grinnder_graph::io::files::private_dir_in(parent, &prefix)?;
        LIVE.lock().unwrap_or_else(|e| e.into_inner()).push(dir.path().to_path_buf());
        Ok(RunDir { dir: Some(dir) })
    }

    pub fn path(&self) -> &Path {
        self.dir.as_ref().expect("a run directory until dropped").path()
    }

    /// Keeps the directory and its files; returns its path.
    pub fn keep(mut self) -> PathBuf {
        let dir = self.dir.take().expect("a run directory until dropped");
        forget(dir.path());
        dir.keep()
    }

    /// Removes the directory now, reporting a failure.
    pub fn close(mut self) -> io::Result<()> {
        let dir = self.dir.take().expect("a run directory until dropped");
        forget(dir.path());
        dir.close()
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if let Some(d) = self.dir.take() {
            forget(d.path());
        }
    }
}

fn forget(path: &Path) {
    LIVE.lock().unwrap_or_else(|e| e.into_inner()).retain(|p| p != path);
}

/// Removes the directories of this process's live runs (at SIGINT or SIGTERM, before the
/// process exits); returns those removed. A write in flight may recreate nothing: the files
/// are created only inside the directory, which is gone.
pub fn remove_live() -> Vec<PathBuf> {
    let live = std::mem::take(&mut *LIVE.lock().unwrap_or_else(|e| e.into_inner()));
    live.into_iter()
        .filter(|p| {
            // another thread may be creating a file in it: try again a few times
            (0..5).any(|_| std::fs::remove_dir_all(p).is_ok() || !p.exists())
        })
        .collect()
}

/// A run directory found in a storage directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub path: PathBuf,
    /// The host and process that made it (`None`: a name without a host, from an older
    /// version).
    pub host: Option<String>,
    pub pid: u32,
    /// Bytes of its files.
    pub bytes: u64,
    /// Made on this host by a process that no longer exists: safe to remove.
    pub abandoned: bool,
}

/// The run directories inside `parent`.
pub fn find(parent: &Path) -> Vec<Found> {
    let Ok(entries) = std::fs::read_dir(parent) else { return Vec::new() };
    let me = host();
    let mut found: Vec<Found> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let (host, pid) = parse(&name)?;
            let abandoned = host.as_deref() == Some(me.as_str()) && !alive(pid);
            let path = e.path();
            Some(Found { bytes: size(&path), path, host, pid, abandoned })
        })
        .collect();
    found.sort_by(|a, b| a.path.cmp(&b.path));
    found
}

/// The run directories inside `parent` that runs of this host left when killed.
pub fn abandoned(parent: &Path) -> Vec<Found> {
    find(parent).into_iter().filter(|f| f.abandoned).collect()
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

/// Whether process `pid` exists on this host (one we may not signal exists too).
fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 || *libc::__errno_location() == libc::EPERM }
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

    #[test]
    fn a_dead_runs_directory_is_reclaimed_and_a_live_ones_is_not() {
        let parent = tempfile::tempdir().unwrap();
        // a process that has ended: a child we waited for
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let left = parent.path().join(format!("{PREFIX}{}-{dead}-abc123", host()));
        std::fs::create_dir(&left).unwrap();
        std::fs::write(left.join("act-l0-p0.blk"), vec![0u8; 4096]).unwrap();
        let other_host = parent.path().join(format!("{PREFIX}elsewhere-{dead}-abc123"));
        std::fs::create_dir(&other_host).unwrap();
        let found = find(parent.path());
        assert_eq!(found.len(), 2);
        let mine = found.iter().find(|f| f.path == left).unwrap();
        assert!(mine.abandoned && mine.bytes == 4096, "{mine:?}");
        assert!(!found.iter().find(|f| f.path == other_host).unwrap().abandoned);

        let run = RunDir::create(parent.path()).unwrap();
        assert!(!left.exists(), "the killed run's directory is removed by the next run");
        assert!(other_host.exists(), "another host's directory is never removed");
        let live = find(parent.path()).into_iter().find(|f| f.path == run.path()).unwrap();
        assert!(!live.abandoned, "this process's directory is live");
        let path = run.path().to_path_buf();
        // (remove_live itself would take the directories of the other tests in this process)
        assert!(LIVE.lock().unwrap().contains(&path), "registered for removal at a signal");
        drop(run);
        assert!(!path.exists() && !LIVE.lock().unwrap().contains(&path));
    }
}
