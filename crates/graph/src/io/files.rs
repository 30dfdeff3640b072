//! Opening and creating files safely: the one place every reader and writer of the project
//! goes through to touch a path.
//!
//! Invariants:
//! - An input is a regular file. It is opened without blocking (a FIFO would block `open`
//!   forever) and its type is checked before a byte is read; FIFOs, devices, sockets and
//!   directories are refused with their kind named.
//! - A whole-file read is bounded by what its format allows ([`read_bounded`]): a link to
//!   `/dev/zero` or a runaway file is refused, never read into memory.
//! - An output is never written through a symbolic link: outputs at names the user chose are
//!   opened with `O_NOFOLLOW` ([`create_output`]); files the project names itself are created
//!   with `O_EXCL` under unpredictable names ([`temp_in`]) and renamed into place, so a link
//!   planted under a predictable name can neither be followed nor become the output.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// What a non-regular file is, for messages.
fn kind_of(t: std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_char_device() {
        "a character device"
    } else {
        "not a regular file"
    }
}

/// Opens `path` for reading; refuses anything but a regular file (links are followed to
/// what they name, which must be a regular file too).
pub fn open_input(path: &Path) -> io::Result<File> {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever
    let file = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(path)?;
    let t = file.metadata()?.file_type();
    if !t.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is {}, expected a regular file", path.display(), kind_of(t)),
        ));
    }
    // back to blocking reads (no effect on regular files, but reads should not see EAGAIN)
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a file descriptor we own, with integer arguments only.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags >= 0 {
        // SAFETY: as above.
        unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) };
    }
    Ok(file)
}

/// Reads a whole regular file of at most `max_bytes`; `what` names the file's role in the
/// message ("config file", "checkpoint").
pub fn read_bounded(path: &Path, max_bytes: u64, what: &str) -> io::Result<Vec<u8>> {
    let file = open_input(path)?;
    let len = file.metadata()?.len();
    let too_big = |len: u64| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} is {len} bytes, more than a {what} can be ({max_bytes} bytes at most)",
                path.display()
            ),
        )
    };
    if len > max_bytes {
        return Err(too_big(len));
    }
    // the length may change under us: never read more than the bound allows
    let mut out = Vec::with_capacity(len as usize);
    file.take(max_bytes + 1).read_to_end(&mut out)?;
    if out.len() as u64 > max_bytes {
        return Err(too_big(out.len() as u64));
    }
    Ok(out)
}

/// [`read_bounded`] as UTF-8 text.
pub fn read_text_bounded(path: &Path, max_bytes: u64, what: &str) -> io::Result<String> {
    String::from_utf8(read_bounded(path, max_bytes, what)?).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not UTF-8 text (byte {})", path.display(), e.utf8_error().valid_up_to()),
        )
    })
}

/// Creates (or truncates) the output file `path` that the user named; refuses to write
/// through a symbolic link at `path`.
pub fn create_output(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} is a symbolic link; refusing to write through it", path.display()),
                )
            } else {
                e
            }
        })
}

/// Refuses an output path that holds something other than a regular file or a link: renaming
/// a finished output over it would replace a device node, a FIFO or a socket with a regular
/// file (run as root, `--out /dev/full` replaced the machine's `/dev/full`).
pub fn check_replaceable(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if !(m.file_type().is_file() || m.file_type().is_symlink()) => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            // (no path: every caller's context names it)
            format!(
                "{}, not a regular file: grinnder never replaces one with its output; name a file's path",
                kind_of(m.file_type())
            ),
        )),
        _ => Ok(()),
    }
}

/// Makes the output folder `dir` (and its parents) where it is missing; a file, device or other
/// non-folder already at `dir` is named as such (the OS says only "File exists").
pub fn create_folder(dir: &Path) -> io::Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => {
            let what = if m.is_file() { "a file" } else { kind_of(m.file_type()) };
            Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{what} is there, and this output is a folder of files: name a new or an existing folder"
                ),
            ))
        }
        _ => std::fs::create_dir_all(dir),
    }
}

/// This process's temporaries not yet renamed into place, for [`remove_temporaries`]; `None`
/// once they were removed at a signal (the process is ending: no new ones are made).
static TEMPS: std::sync::Mutex<Option<Vec<PathBuf>>> = std::sync::Mutex::new(Some(Vec::new()));

fn temps() -> std::sync::MutexGuard<'static, Option<Vec<PathBuf>>> {
    TEMPS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A file being written beside its final path, under a name of its own (see [`temp_in`]):
/// locked while it lives, removed when dropped and at SIGINT or SIGTERM
/// ([`remove_temporaries`]), and renamed into place whole by [`Temp::persist`] — a partial
/// output never appears under the final name.
#[derive(Debug)]
pub struct Temp {
    file: Option<tempfile::NamedTempFile>,
}

impl Temp {
    fn inner(&self) -> &tempfile::NamedTempFile {
        self.file.as_ref().expect("a temporary until persisted or dropped")
    }

    pub fn path(&self) -> &Path {
        self.inner().path()
    }

    pub fn as_file(&self) -> &File {
        self.inner().as_file()
    }

    /// Renames the file to `path` (replacing a regular file or a link there, never following
    /// it; refusing anything else, see [`check_replaceable`]).
    pub fn persist(mut self, path: &Path) -> io::Result<()> {
        check_replaceable(path)?;
        // under the registry's lock: a signal removes the temporary before or not at all
        let mut reg = temps();
        let t = self.file.take().expect("a temporary until persisted or dropped");
        let tmp = t.path().to_path_buf();
        match t.persist(path) {
            Ok(_) => {
                if let Some(list) = reg.as_mut() {
                    list.retain(|p| *p != tmp);
                }
                Ok(())
            }
            Err(e) => {
                self.file = Some(e.file);
                Err(e.error)
            }
        }
    }
}

impl io::Write for Temp {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.as_mut().expect("a temporary until persisted or dropped").write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file.as_mut().expect("a temporary until persisted or dropped").flush()
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let mut reg = temps();
        if let Some(t) = self.file.take() {
            let p = t.path().to_path_buf();
            drop(t);
            if let Some(list) = reg.as_mut() {
                list.retain(|q| *q != p);
            }
        }
    }
}

/// Removes this process's temporaries (at SIGINT or SIGTERM, before the process exits) and
/// makes no new ones; returns those removed.
pub fn remove_temporaries() -> Vec<PathBuf> {
    let list = temps().take().unwrap_or_default();
    list.into_iter().filter(|p| std::fs::remove_file(p).is_ok()).collect()
}

/// Bytes of tempfile's random part of a name.
const RANDOM_CHARS: usize = 6;

/// Removes temporaries of ours that an ended process left in `dir` under `prefix` (killed,
/// its signal never handled): regular files of this user named `prefix` and six letters or
/// digits whose lock nobody holds (a live writer holds its temporary's).
fn remove_stale(dir: &Path, prefix: &str) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    for e in entries.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        let ours = name
            .strip_prefix(prefix)
            .is_some_and(|r| r.len() == RANDOM_CHARS && r.chars().all(|c| c.is_ascii_alphanumeric()));
        if !ours || !e.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let path = e.path();
        let free = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&path)
            .and_then(|f| Ok(f.metadata()?.uid() == me && f.metadata()?.is_file() && try_lock(&f)?));
        if free.unwrap_or(false) && std::fs::remove_file(&path).is_ok() {
            tracing::info!("removed {}, a temporary an interrupted run left", path.display());
        }
    }
}

/// A new file in `dir` under an unpredictable name starting with `prefix` (then six letters or
/// digits), created with `O_EXCL` (never through a link) and the usual permissions (0666 less
/// the umask), and locked while it lives. Temporaries an ended process left under the same
/// prefix are removed first.
pub fn temp_in(dir: &Path, prefix: &str) -> io::Result<Temp> {
    remove_stale(dir, prefix);
    let mut reg = temps();
    let Some(list) = reg.as_mut() else {
        return Err(io::Error::new(io::ErrorKind::Interrupted, "interrupted: the process is ending"));
    };
    let t = tempfile::Builder::new()
        .prefix(prefix)
        .rand_bytes(RANDOM_CHARS)
        .permissions(std::fs::Permissions::from_mode(0o666))
        .tempfile_in(dir)?;
    // (where locks are not supported a stale temporary is not recognised, no more)
    let _ = try_lock(t.as_file());
    list.push(t.path().to_path_buf());
    Ok(Temp { file: Some(t) })
}

/// [`temp_in`] for the output `path`: in its folder, named `.NAME.tmp-XXXXXX`.
pub fn temp_for(path: &Path) -> io::Result<Temp> {
    let name = path.file_name().map_or("out".into(), |n| n.to_string_lossy().into_owned());
    temp_in(parent_of(path), &format!(".{name}.tmp-"))
}

/// The folder of `path` (`.` for a bare name).
pub fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Writes `bytes` as the whole of `path`, atomically: into a new temporary beside it (removed
/// on failure), synced, renamed into place (replacing a link at `path`, never following it;
/// never replacing a device or another non-regular file), and the directory synced. A reader
/// sees the old file or the new one, never a part.
pub fn write_whole(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    check_replaceable(path)?;
    let mut tmp = temp_for(path)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path)?;
    File::open(parent_of(path))?.sync_all()
}

/// Free bytes for an unprivileged writer in the file system holding `dir`.
pub fn free_bytes(dir: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path with a NUL byte"))?;
    // SAFETY: statvfs is plain old data; zeroed is a valid value and the call fills it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid NUL-terminated path and st a valid out pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Tries to take an exclusive lock (`flock`) on `file` without waiting: `Ok(true)` when taken
/// (held until the file is closed), `Ok(false)` when another open file holds it — in this
/// process or any other, whatever its PID namespace. Liveness of a run or of a writer is judged
/// by this lock, never by a process id, which another namespace or a reused id can fake.
/// (libc's `flock`: std's `File::try_lock` is newer than the project's minimum Rust.)
pub fn try_lock(file: &File) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor we own, with integer arguments only.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// A new private directory (mode 0700, unpredictable name starting with `prefix`) inside
/// `dir`; removed with its contents when dropped unless kept (`TempDir::keep`).
pub fn private_dir_in(dir: &Path, prefix: &str) -> io::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(prefix)
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir_in(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_must_be_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = open_input(&fifo).unwrap_err().to_string();
        assert!(err.contains("FIFO") && err.contains("fifo"), "{err}");
        let err = open_input(dir.path()).unwrap_err().to_string();
        assert!(err.contains("a directory"), "{err}");
        let err = read_bounded(Path::new("/dev/zero"), 1 << 20, "config file").unwrap_err().to_string();
        assert!(err.contains("character device"), "{err}");
        let f = dir.path().join("f");
        std::fs::write(&f, vec![b'x'; 100]).unwrap();
        assert_eq!(read_bounded(&f, 100, "x").unwrap().len(), 100);
        let err = read_bounded(&f, 99, "config file").unwrap_err().to_string();
        assert!(err.contains("100 bytes") && err.contains("config file"), "{err}");
    }

    #[test]
    fn outputs_never_follow_links() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let link = dir.path().join("out.npy");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let err = create_output(&link).unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        let t = temp_in(dir.path(), ".out.npy.").unwrap();
        assert!(t.path().file_name().unwrap().to_str().unwrap().starts_with(".out.npy."));
        t.persist(&link).unwrap();
        assert!(!std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        let p = private_dir_in(dir.path(), "run-").unwrap();
        let mode = std::fs::metadata(p.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }
}
