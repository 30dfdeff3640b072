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
use std::path::Path;

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

/// A new file in `dir` under an unpredictable name starting with `prefix`, created with
/// `O_EXCL` (never through a link) and the usual permissions (0666 less the umask). It is
/// removed when dropped unless persisted (`persist(final_path)` renames it into place).
pub fn temp_in(dir: &Path, prefix: &str) -> io::Result<tempfile::NamedTempFile> {
    tempfile::Builder::new()
        .prefix(prefix)
        .permissions(std::fs::Permissions::from_mode(0o666))
        .tempfile_in(dir)
}

/// Writes `bytes` as the whole of `path`, atomically: into a new temporary beside it (removed
/// on failure), synced, renamed into place (replacing a link at `path`, never following it),
/// and the directory synced. A reader sees the old file or the new one, never a part.
pub fn write_whole(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().map_or("out".into(), |n| n.to_string_lossy().into_owned());
    let mut tmp = temp_in(dir, &format!(".{name}.tmp-"))?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    File::open(dir)?.sync_all()
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
