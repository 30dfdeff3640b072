//! Block files of the storage tier: one file per block, a 4 KiB header page then the payload
//! padded to 4 KiB, written and read whole with `O_DIRECT` (the page cache would only double
//! the memory a block costs) from 4 KiB-aligned buffers.
//!
//! Header (little-endian): magic `GRNDBLK1`, format version, dtype, rows, cols, payload
//! bytes, the payload's checksum (xxh3 of the xxh3 sums of its [`SUM_CHUNK`]-byte chunks),
//! xxh3 of the header bytes before it. A block that does not verify is an error naming its
//! file; it is never decoded. A few rows are read without the rest
//! ([`BlockFiles::read_chunks`]): the chunks that hold them, each checked against its sum,
//! which the writer kept.
//!
//! Transfers go through io_uring: a block is cut into 1 MiB requests with at most
//! [`QUEUE_DEPTH`] in flight. Where io_uring is unavailable (old kernels, seccomp filters)
//! plain `pread`/`pwrite` are used, and where the file system refuses `O_DIRECT` (tmpfs, some
//! overlay file systems) files are opened buffered; the store announces either fallback once.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use io_uring::{opcode, types, IoUring};
use rayon::prelude::*;

use xxhash_rust::xxh3::xxh3_64;

pub const ALIGN: usize = 4096;
const MAGIC: &[u8; 8] = b"GRNDBLK1";
const VERSION: u32 = 2;
/// Bytes per checksummed chunk of a payload: the unit of a partial read. 64 KiB requests
/// still run at an NVMe drive's sequential rate, and a halo row of a 256-wide f32 block (1 KiB)
/// costs at most 64 times its bytes.
pub const SUM_CHUNK: usize = 64 << 10;

/// How a block's elements are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32 = 0,
    F64 = 1,
    Bf16 = 2,
}

impl Dtype {
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F64 => 8,
            Dtype::Bf16 => 2,
        }
    }
    fn from_u32(x: u32) -> Option<Dtype> {
        [Dtype::F32, Dtype::F64, Dtype::Bf16].into_iter().find(|d| *d as u32 == x)
    }
}

/// A zeroed heap buffer aligned to [`ALIGN`], its length a multiple of it.
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is uniquely owned heap memory.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn new(len: usize) -> AlignedBuf {
        let len = len.div_ceil(ALIGN).max(1) * ALIGN;
        let layout = Layout::from_size_align(len, ALIGN).expect("aligned layout");
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, len }
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised (zeroed) bytes for the buffer's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and we hold the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len, ALIGN).expect("aligned layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr, layout) }
    }
}

/// Shape and encoding of a stored block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockHeader {
    pub dtype: Dtype,
    pub rows: u64,
    pub cols: u64,
}

impl BlockHeader {
    pub fn payload_len(&self) -> usize {
        self.rows as usize * self.cols as usize * self.dtype.size()
    }
    /// Bytes of the whole file (header page and padded payload).
    pub fn file_len(&self) -> usize {
        file_len_of(self.payload_len())
    }
}

/// Bytes of a block file holding `payload` bytes: the header page and the payload padded to
/// whole pages.
pub fn file_len_of(payload: usize) -> usize {
    ALIGN + payload.div_ceil(ALIGN) * ALIGN
}

/// The xxh3 sum of every [`SUM_CHUNK`]-byte chunk of `payload` (the last one short).
pub fn chunk_sums(payload: &[u8]) -> Vec<u64> {
    payload.par_chunks(SUM_CHUNK).map(xxh3_64).collect()
}

/// The payload checksum of the header: of the chunk sums.
fn payload_sum(sums: &[u64]) -> u64 {
    let bytes: Vec<u8> = sums.iter().flat_map(|s| s.to_le_bytes()).collect();
    xxh3_64(&bytes)
}

/// A block's file contents in an aligned buffer: header page, then payload. Returns the
/// payload's chunk sums, for partial reads.
pub fn encode_header(h: &BlockHeader, buf: &mut AlignedBuf) -> Vec<u64> {
    let payload_len = h.payload_len();
    let sums = chunk_sums(&buf.as_slice()[ALIGN..ALIGN + payload_len]);
    let sum = payload_sum(&sums);
    let b = buf.as_mut_slice();
    b[0..8].copy_from_slice(MAGIC);
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&(h.dtype as u32).to_le_bytes());
    b[16..24].copy_from_slice(&h.rows.to_le_bytes());
    b[24..32].copy_from_slice(&h.cols.to_le_bytes());
    b[32..40].copy_from_slice(&(payload_len as u64).to_le_bytes());
    b[40..48].copy_from_slice(&sum.to_le_bytes());
    let hsum = xxh3_64(&b[0..48]);
    b[48..56].copy_from_slice(&hsum.to_le_bytes());
    sums
}

/// Checks a read file: the header, the expected shape, the payload checksum.
pub fn verify(buf: &[u8], read: usize, expect: &BlockHeader, path: &Path) -> io::Result<()> {
    let bad = |why: String| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {why}", path.display()));
    if read < ALIGN {
        return Err(bad(format!("truncated: {read} bytes, no complete header")));
    }
    let u32_at = |o: usize| u32::from_le_bytes(buf[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(buf[o..o + 8].try_into().unwrap());
    if &buf[0..8] != MAGIC {
        return Err(bad("not a grinnder block file (bad magic)".into()));
    }
    if xxh3_64(&buf[0..48]) != u64_at(48) {
        return Err(bad("header checksum mismatch".into()));
    }
    if u32_at(8) != VERSION {
        return Err(bad(format!("block format version {} (this build reads {VERSION})", u32_at(8))));
    }
    let found = BlockHeader {
        dtype: Dtype::from_u32(u32_at(12)).ok_or_else(|| bad(format!("unknown dtype {}", u32_at(12))))?,
        rows: u64_at(16),
        cols: u64_at(24),
    };
    if found != *expect {
        return Err(bad(format!("holds {found:?}, expected {expect:?}")));
    }
    let len = u64_at(32) as usize;
    if len != expect.payload_len() || read < ALIGN + len {
        return Err(bad(format!("truncated: {read} bytes for a {len}-byte payload")));
    }
    if payload_sum(&chunk_sums(&buf[ALIGN..ALIGN + len])) != u64_at(40) {
        return Err(bad("payload checksum mismatch (corrupted block)".into()));
    }
    Ok(())
}

/// Requests in flight per transfer.
pub const QUEUE_DEPTH: u32 = 8;
/// Bytes per request.
const CHUNK: usize = 1 << 20;

/// Opens, writes and reads block files.
pub struct BlockFiles {
    dir: PathBuf,
    /// `O_DIRECT` works in this directory.
    pub direct: bool,
    /// `None`: io_uring is unavailable, `pread`/`pwrite` are used.
    ring: Option<Mutex<IoUring>>,
    /// Fault injection (tests).
    pub faults: Faults,
    writes: std::sync::atomic::AtomicUsize,
    reads: std::sync::atomic::AtomicUsize,
    /// A file buffer given back once its read is decoded or its write done
    /// ([`BlockFiles::recycle`]), for the next read or write: a new 430 MB buffer took 0.14 s
    /// to zero, and its pages as long again to fault in under the read, on the 2-core VM
    /// (2026-12-04) — a third of a block's read time.
    spare: Mutex<Option<AlignedBuf>>,
}

/// Fault injection for tests: block-file writes after this many fail with ENOSPC, reads after
/// this many with EIO (counted from the store's start).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    pub writes_after: Option<usize>,
    pub reads_after: Option<usize>,
}

pub use grinnder_graph::io::files::free_bytes;

/// Reads or writes `len` bytes at `ptr` from offset 0 of `file` through `ring`, at most
/// [`QUEUE_DEPTH`] requests of [`CHUNK`] bytes in flight; returns the bytes transferred before
/// the end of the file (reads) or all of them (writes).
fn uring_transfer(
    ring: &mut IoUring,
    file: &File,
    ptr: *mut u8,
    len: usize,
    write: bool,
) -> io::Result<usize> {
    uring_transfer_ranges(ring, file, ptr, &[(0, 0, len)], write)
}

/// [`uring_transfer`] of several ranges: `(file offset, offset in the buffer at ptr, bytes)`,
/// each cut into requests of at most [`CHUNK`] bytes, the ranges' buffer bytes disjoint.
///
/// On the first failed request no more are queued, and every request still in flight is
/// reaped before the error is returned (the caller's buffer may then go away). Completions
/// are reaped one at a time, so none is ever taken from the ring without being accounted for.
fn uring_transfer_ranges(
    ring: &mut IoUring,
    file: &File,
    ptr: *mut u8,
    ranges: &[(u64, usize, usize)],
    write: bool,
) -> io::Result<usize> {
    let fd = types::Fd(file.as_raw_fd());
    // (file offset, buffer offset, length) of each request still to complete; a short
    // transfer re-queues the rest
    let mut pending: Vec<(u64, usize, usize)> = ranges
        .iter()
        .flat_map(|&(at, off, len)| {
            (0..len).step_by(CHUNK).map(move |o| (at + o as u64, off + o, CHUNK.min(len - o)))
        })
        .collect();
    pending.reverse();
    let mut inflight: std::collections::HashMap<u64, (u64, usize, usize)> = std::collections::HashMap::new();
    let (mut done, mut eof_at) = (0usize, u64::MAX);
    let mut next_id = 0u64;
    let mut failure: Option<io::Error> = None;
    while (failure.is_none() && !pending.is_empty()) || !inflight.is_empty() {
        while failure.is_none() && inflight.len() < QUEUE_DEPTH as usize {
            let Some((at, off, n)) = pending.pop() else { break };
            if at >= eof_at {
                continue;
            }
            // SAFETY: [ptr + off, ptr + off + n) lies inside the caller's buffer (the ranges
            // are the caller's, inside it), which outlives this call, and no other request
            // covers these bytes.
            let buf = unsafe { ptr.add(off) };
            let entry = if write {
                opcode::Write::new(fd, buf, n as u32).offset(at).build()
            } else {
                opcode::Read::new(fd, buf, n as u32).offset(at).build()
            };
            next_id += 1;
            // SAFETY: the entry's buffer stays valid until its completion is reaped below.
            match unsafe { ring.submission().push(&entry.user_data(next_id)) } {
                Ok(()) => {
                    inflight.insert(next_id, (at, off, n));
                }
                Err(_) => {
                    pending.push((at, off, n));
                    failure = Some(io::Error::other("io_uring submission queue full"));
                }
            }
        }
        if inflight.is_empty() {
            break;
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if retry_wait(&e) => continue,
            Err(e) => {
                // the kernel still owns the buffers of the requests in flight: returning (or
                // unwinding) would free memory it may write into; a ring that cannot be waited
                // on is a kernel or program fault, not an I/O error
                eprintln!("io_uring: waiting with {} requests in flight failed: {e}", inflight.len());
                std::process::abort();
            }
        }
        while let Some(c) = ring.completion().next() {
            let (id, res) = (c.user_data(), c.result());
            let (at, off, n) = inflight.remove(&id).expect("a request we submitted");
            if failure.is_some() {
                continue; // reaped only so that the buffer is free again
            }
            if res < 0 {
                let e = io::Error::from_raw_os_error(-res);
                if e.kind() == io::ErrorKind::Interrupted {
                    pending.push((at, off, n));
                } else {
                    failure = Some(e);
                }
                continue;
            }
            let k = res as usize;
            done += k;
            if k == 0 {
                if write {
                    failure = Some(io::Error::new(io::ErrorKind::WriteZero, "io_uring wrote nothing"));
                } else {
                    eof_at = eof_at.min(at);
                }
            } else if k < n {
                pending.push((at + k as u64, off + k, n - k));
            }
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(done),
    }
}

/// Reads `buf.len()` bytes of `f` from `at` with `pread`, fewer at the end of the file;
/// returns the bytes read.
fn read_full_at(f: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut read = 0usize;
    while read < buf.len() {
        match f.read_at(&mut buf[read..], at + read as u64) {
            Ok(0) => break,
            Ok(k) => read += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(read)
}

/// Errors of `io_uring_enter` after which waiting again is right: a signal (EINTR), or the
/// kernel short of resources for the moment (EAGAIN, EBUSY).
fn retry_wait(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Interrupted || matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY))
}

const O_DIRECT: i32 = 0o40000;

impl BlockFiles {
    /// Checks that `parent` exists and is writable, creates the run's private directory in it
    /// (mode 0700, an unpredictable name: no other process or run can plant or see files
    /// there), and finds out whether it takes `O_DIRECT`. The directory and everything in it
    /// is removed when the returned guard is dropped.
    pub fn create(parent: &Path) -> io::Result<(BlockFiles, crate::scratch::RunDir)> {
        let meta = std::fs::metadata(parent)
            .map_err(|e| io::Error::new(e.kind(), format!("storage directory {}: {e}", parent.display())))?;
        if !meta.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("storage directory {} is not a directory", parent.display()),
            ));
        }
        let not_writable = |e: io::Error| {
            io::Error::new(e.kind(), format!("storage directory {} is not writable: {e}", parent.display()))
        };
        let run = crate::scratch::RunDir::create(parent).map_err(not_writable)?;
        let dir = run.path().to_path_buf();
        let probe = dir.join("probe");
        let direct = match OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(O_DIRECT | libc::O_NOFOLLOW)
            .open(&probe)
        {
            Ok(f) => {
                let mut b = AlignedBuf::new(ALIGN);
                b.as_mut_slice()[0] = 1;
                let ok = f.write_all_at(b.as_slice(), 0).is_ok();
                ok
            }
            Err(e) if e.raw_os_error() == Some(22) => false, // EINVAL: no O_DIRECT here
            Err(e) => return Err(not_writable(e)),
        };
        if !direct {
            // buffered must work at least
            let _ = std::fs::remove_file(&probe);
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&probe)
                .and_then(|f| f.write_all_at(b"probe", 0))
                .map_err(not_writable)?;
        }
        let _ = std::fs::remove_file(&probe);
        let ring = match IoUring::new(QUEUE_DEPTH * 2) {
            Ok(r) => Some(Mutex::new(r)),
            Err(e) => {
                tracing::warn!("io_uring is unavailable ({e}); block files use pread/pwrite");
                None
            }
        };
        let files = BlockFiles {
            dir,
            direct,
            ring,
            faults: Faults::default(),
            writes: std::sync::atomic::AtomicUsize::new(0),
            reads: std::sync::atomic::AtomicUsize::new(0),
            spare: Mutex::new(None),
        };
        Ok((files, run))
    }

    /// The run's private directory, where the block files are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether transfers go through io_uring.
    pub fn uring(&self) -> bool {
        self.ring.is_some()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn open(&self, path: &Path, write: bool) -> io::Result<File> {
        let mut o = OpenOptions::new();
        if write {
            o.write(true).create(true).truncate(true);
        } else {
            o.read(true);
        }
        // the directory is private, and still no link is followed
        o.custom_flags(libc::O_NOFOLLOW | if self.direct { O_DIRECT } else { 0 });
        o.open(path).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
    }

    /// Writes a whole block file (`buf` holds header page and payload, see [`encode_header`]).
    pub fn write(&self, name: &str, buf: &AlignedBuf, len: usize) -> io::Result<()> {
        let path = self.path(name);
        self.count_op(&path, true)?;
        let f = self.open(&path, true)?;
        assert!(len <= buf.as_slice().len());
        let res = match &self.ring {
            Some(r) => {
                let mut ring = r.lock().unwrap_or_else(|e| e.into_inner());
                uring_transfer(&mut ring, &f, buf.as_slice().as_ptr() as *mut u8, len, true).map(|_| ())
            }
            None => f.write_all_at(&buf.as_slice()[..len], 0),
        };
        res.map_err(|e| io::Error::new(e.kind(), format!("writing {}: {e}", path.display())))
    }

    /// Reads a whole block file into an aligned buffer and verifies it.
    pub fn read(&self, name: &str, expect: &BlockHeader) -> io::Result<AlignedBuf> {
        let path = self.path(name);
        self.count_op(&path, false)?;
        let f = self.open(&path, false)?;
        let len = expect.file_len();
        let mut buf = self.buffer(len);
        let read_err = |e: io::Error| io::Error::new(e.kind(), format!("reading {}: {e}", path.display()));
        let read = match &self.ring {
            Some(r) => {
                let mut ring = r.lock().unwrap_or_else(|e| e.into_inner());
                uring_transfer(&mut ring, &f, buf.as_mut_slice().as_mut_ptr(), len, false)
                    .map_err(read_err)?
            }
            None => read_full_at(&f, &mut buf.as_mut_slice()[..len], 0).map_err(read_err)?,
        };
        verify(buf.as_slice(), read, expect, &path)?;
        Ok(buf)
    }

    /// A buffer of at least `len` bytes for a block file: the kept one where it is large
    /// enough (its bytes are a previous file's), else a new one (the kept one goes: one file
    /// buffer at a time is what the memory plan counts).
    pub fn buffer(&self, len: usize) -> AlignedBuf {
        let spare = self.spare.lock().unwrap_or_else(|e| e.into_inner()).take();
        match spare {
            Some(b) if b.len >= len => b,
            _ => AlignedBuf::new(len),
        }
    }

    /// Gives back the buffer of a read whose contents were taken, or of a finished write: the
    /// next read or write that fits in it uses it ([`BlockFiles::buffer`]). One is kept, the
    /// larger.
    pub fn recycle(&self, buf: AlignedBuf) {
        let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        if spare.as_ref().is_none_or(|s| s.len < buf.len) {
            *spare = Some(buf);
        }
    }

    /// Reads the chunks `runs` (ranges of chunk indices, ascending and disjoint) of a block
    /// file's payload of `payload_len` bytes into one aligned buffer, run after run (each run
    /// from a multiple of [`SUM_CHUNK`] in it), every chunk checked against `sums`; returns
    /// the buffer and the bytes read. The header is not read: the caller knows the shape.
    pub fn read_chunks(
        &self,
        name: &str,
        payload_len: usize,
        sums: &[u64],
        runs: &[std::ops::Range<usize>],
    ) -> io::Result<(AlignedBuf, usize)> {
        let path = self.path(name);
        self.count_op(&path, false)?;
        // (file offset, buffer offset, bytes) of each run, whole pages (the file's payload is
        // padded to a page)
        let mut ranges = Vec::with_capacity(runs.len());
        let mut at = 0;
        for r in runs {
            let (from, to) = (r.start * SUM_CHUNK, (r.end * SUM_CHUNK).min(payload_len));
            let len = (to - from).div_ceil(ALIGN) * ALIGN;
            ranges.push(((ALIGN + from) as u64, at, len));
            at += (r.end - r.start) * SUM_CHUNK;
        }
        let f = self.open(&path, false)?;
        let mut buf = AlignedBuf::new(at);
        let read_err = |e: io::Error| io::Error::new(e.kind(), format!("reading {}: {e}", path.display()));
        match &self.ring {
            Some(r) => {
                let mut ring = r.lock().unwrap_or_else(|e| e.into_inner());
                uring_transfer_ranges(&mut ring, &f, buf.as_mut_slice().as_mut_ptr(), &ranges, false)
                    .map_err(read_err)?;
            }
            None => {
                for &(from, off, len) in &ranges {
                    read_full_at(&f, &mut buf.as_mut_slice()[off..off + len], from).map_err(read_err)?;
                }
            }
        }
        let bytes = ranges.iter().map(|r| r.2).sum();
        let mut off = 0;
        for r in runs {
            for c in r.clone() {
                let len = SUM_CHUNK.min(payload_len - c * SUM_CHUNK);
                if xxh3_64(&buf.as_slice()[off..off + len]) != sums[c] {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "{}: chunk {c} checksum mismatch (corrupted or truncated block)",
                            path.display()
                        ),
                    ));
                }
                off += SUM_CHUNK;
            }
        }
        Ok((buf, bytes))
    }

    /// Counts a read or write of the file at `path`; fails it where fault injection says so
    /// (ENOSPC for writes, EIO for reads).
    fn count_op(&self, path: &Path, write: bool) -> io::Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        let (k, after, errno, what) = if write {
            (self.writes.fetch_add(1, Relaxed), self.faults.writes_after, libc::ENOSPC, "writing")
        } else {
            (self.reads.fetch_add(1, Relaxed), self.faults.reads_after, libc::EIO, "reading")
        };
        if after.is_some_and(|n| k >= n) {
            let e = io::Error::from_raw_os_error(errno);
            return Err(io::Error::new(e.kind(), format!("{what} {}: {e} (injected fault)", path.display())));
        }
        Ok(())
    }

    /// Block-file reads and writes attempted so far.
    pub fn ops(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.reads.load(Relaxed), self.writes.load(Relaxed))
    }

    pub fn remove(&self, name: &str) {
        let _ = std::fs::remove_file(self.path(name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on its own thread; fails the test if it has not returned after `secs` (a hang
    /// must fail, not stall the suite).
    fn within<R: Send + 'static>(secs: u64, f: impl FnOnce() -> R + Send + 'static) -> R {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(secs)).expect("the transfer hung")
    }

    /// A block file with `rows × cols` f32 values `seed + i`.
    fn block(files: &BlockFiles, name: &str, rows: u64, cols: u64, seed: f32) -> (BlockHeader, Vec<u8>) {
        let h = BlockHeader { dtype: Dtype::F32, rows, cols };
        let payload: Vec<u8> = (0..rows * cols).flat_map(|i| (seed + i as f32).to_le_bytes()).collect();
        let mut buf = AlignedBuf::new(h.file_len());
        buf.as_mut_slice()[ALIGN..ALIGN + payload.len()].copy_from_slice(&payload);
        encode_header(&h, &mut buf);
        files.write(name, &buf, h.file_len()).unwrap();
        (h, payload)
    }

    #[test]
    fn a_recycled_buffer_reads_a_smaller_block_then_a_larger_one_exactly() {
        let parent = tempfile::tempdir().unwrap();
        let (files, _run) = BlockFiles::create(parent.path()).unwrap();
        let (big, big_payload) = block(&files, "big", 300, 40, 1.0);
        let (small, small_payload) = block(&files, "small", 7, 40, -5.0);
        let payload = |b: &AlignedBuf, h: &BlockHeader| b.as_slice()[ALIGN..ALIGN + h.payload_len()].to_vec();
        let first = files.read("big", &big).unwrap();
        assert_eq!(payload(&first, &big), big_payload);
        let at = first.as_slice().as_ptr();
        files.recycle(first);
        // the small block lands in the big block's buffer: the bytes past it are stale, the
        // header and payload are the small block's
        let second = files.read("small", &small).unwrap();
        assert_eq!(second.as_slice().as_ptr(), at, "the spare buffer is reused");
        assert_eq!(payload(&second, &small), small_payload);
        files.recycle(second);
        // a corrupted small file is still caught in the reused buffer
        let path = files.path("small");
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0xff; 4], ALIGN as u64 + 8).unwrap();
        let err = files.read("small", &small).err().expect("a corrupted block is refused");
        assert!(err.to_string().contains("checksum"), "{err}");
        assert_eq!(payload(&files.read("big", &big).unwrap(), &big), big_payload);
    }

    #[test]
    fn a_full_disk_fails_every_request_in_flight_without_hanging() {
        // /dev/full fails every write with ENOSPC; 8 MiB is QUEUE_DEPTH requests of CHUNK bytes
        // in flight at once, whose failures the kernel completes together
        let Ok(mut ring) = IoUring::new(QUEUE_DEPTH * 2) else {
            eprintln!("io_uring unavailable here: the pread/pwrite path needs no draining");
            return;
        };
        for len in [QUEUE_DEPTH as usize * CHUNK, 3 * QUEUE_DEPTH as usize * CHUNK + 4096] {
            let err = within(30, move || {
                let full = OpenOptions::new().write(true).open("/dev/full").unwrap();
                let buf = AlignedBuf::new(len);
                uring_transfer(&mut ring, &full, buf.as_slice().as_ptr() as *mut u8, len, true).map(|_| ring)
            });
            match err {
                Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}"),
                Ok(_) => panic!("a write to /dev/full succeeded"),
            }
            ring = IoUring::new(QUEUE_DEPTH * 2).unwrap();
        }
        // the ring is usable after a failure: nothing of the failed transfer is left in it
        let dir = tempfile::tempdir().unwrap();
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("b"))
            .unwrap();
        let full = OpenOptions::new().write(true).open("/dev/full").unwrap();
        let mut buf = AlignedBuf::new(2 * CHUNK);
        buf.as_mut_slice()[5] = 7;
        let ptr = buf.as_mut_slice().as_mut_ptr();
        assert!(uring_transfer(&mut ring, &full, ptr, 2 * CHUNK, true).is_err());
        assert_eq!(uring_transfer(&mut ring, &f, ptr, 2 * CHUNK, true).unwrap(), 2 * CHUNK);
        let mut back = AlignedBuf::new(2 * CHUNK);
        let got = uring_transfer(&mut ring, &f, back.as_mut_slice().as_mut_ptr(), 2 * CHUNK, false).unwrap();
        assert_eq!((got, back.as_slice()[5]), (2 * CHUNK, 7));
    }
}
