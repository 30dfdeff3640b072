//! `.npy` files written row by row in any order — predictions come partition by partition, a
//! partition's rows scattered over the node order — by one process or several (ranks that
//! share the output directory).
//!
//! Invariants: the file is made at its full size under an unpredictable temporary name beside
//! its destination before any row is computed, its space reserved (`posix_fallocate`), so a
//! disk too small is refused with the bytes needed before any work; only [`NpyRows::finish`]
//! renames it into place, after a sync. A run that stops early leaves no file under the
//! destination's name (dropped, or at SIGINT or SIGTERM, the temporary is removed; killed
//! outright, the hidden `.NAME.tmp-…` it leaves is removed by the next writer of the same
//! output, its lock being free: see [`files::temp_in`]).
//!
//! Rows are copied into a shared mapping of the file, not written by a system call each: a
//! partition's rows lie scattered over the node order, and one `pwrite` per row cost 2.4 s for
//! products-like's 2.4 M logits rows on an H200 host (2026-12-02), where copies into the
//! mapping cost a page fault per page touched. Once the pages touched reach
//! [`MAPPED_BYTES_MAX`] they leave the process's resident set (`MADV_DONTNEED` on a shared file
//! mapping: the data stays in the page cache, which writes it back), so a process holds at most
//! that much of its output at a time, never the whole file — or the bound its caller sets
//! ([`NpyRows::keep_mapped`]): a partition's rows touch nearly every page of a narrow output,
//! and each page let go faults in again for the next partition (every node's class of
//! papers-like at full size, 847 MiB of int64 over 128 partitions: 10.4 s of writing on an H100
//! machine, 2026-12-07, about 27 M faults where one per page would do).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use memmap2::{MmapMut, UncheckedAdvice};

use super::files;
use super::npy::{header, DType};
use crate::buf::page_size;
use crate::error::{GraphError, Result};

/// Bytes of the output's pages a process keeps mapped in at a time.
pub const MAPPED_BYTES_MAX: usize = 256 << 20;

/// An `.npy` array of `rows` rows under construction (see the module docs).
pub struct NpyRows {
    /// The temporary, when this process made it (and renames it).
    tmp: Option<files::Temp>,
    map: MmapMut,
    /// Pages of the mapping touched since they were last let go (one bit each), their count
    /// and the byte range they lie in.
    touched: Vec<u64>,
    touched_pages: usize,
    span: (usize, usize),
    tmp_path: PathBuf,
    path: PathBuf,
    data_offset: u64,
    row_bytes: u64,
    rows: u64,
    /// Bytes of pages kept mapped in before they are let go ([`NpyRows::keep_mapped`]).
    mapped_max: usize,
}

impl NpyRows {
    /// Creates the temporary of `path` for `rows` rows of `width` `dtype` values (`width` 0: a
    /// one-dimensional array of `rows` values) and reserves its space.
    pub fn create(path: &Path, dtype: DType, rows: u64, width: u64) -> Result<NpyRows> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        files::check_replaceable(path).map_err(|e| GraphError::io(path, e))?;
        let tmp = files::temp_for(path).map_err(|e| {
            GraphError::io(
                dir,
                std::io::Error::new(e.kind(), format!("cannot write into this directory: {e}")),
            )
        })?;
        let head = header(dtype, &shape(rows, width));
        let row_bytes = width.max(1) * dtype.size() as u64;
        let total = head.len() as u64 + rows * row_bytes;
        let free = files::free_bytes(dir).map_err(|e| GraphError::io(dir, e))?;
        if free < total {
            return Err(GraphError::Usage(format!(
                "{} needs {total} bytes ({:.1} MiB) and {} has {free} free: free space or choose another --out",
                path.display(),
                total as f64 / 1048576.0,
                dir.display()
            )));
        }
        let file = tmp.as_file().try_clone().map_err(|e| GraphError::io(tmp.path(), e))?;
        reserve(&file, total).map_err(|e| GraphError::io(tmp.path(), e))?;
        file.write_all_at(&head, 0).map_err(|e| GraphError::io(tmp.path(), e))?;
        let map = map(&file).map_err(|e| GraphError::io(tmp.path(), e))?;
        Ok(NpyRows {
            tmp_path: tmp.path().to_path_buf(),
            tmp: Some(tmp),
            touched: vec![0; pages_of(map.len()).div_ceil(64)],
            touched_pages: 0,
            span: (usize::MAX, 0),
            map,
            path: path.to_path_buf(),
            data_offset: head.len() as u64,
            row_bytes,
            rows,
            mapped_max: MAPPED_BYTES_MAX,
        })
    }

    /// Opens the temporary `tmp_path` another process made with [`NpyRows::create`] for the
    /// same array, to write rows into it (it renames nothing).
    pub fn join(tmp_path: &Path, path: &Path, dtype: DType, rows: u64, width: u64) -> Result<NpyRows> {
        let head = header(dtype, &shape(rows, width));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(tmp_path)
            .map_err(|e| {
                GraphError::io(
                    tmp_path,
                    std::io::Error::new(
                        e.kind(),
                        format!("{e} (every rank writes its rows into one file: the output directory must be one all ranks see)"),
                    ),
                )
            })?;
        let mut have = vec![0u8; head.len()];
        file.read_exact_at(&mut have, 0).map_err(|e| GraphError::io(tmp_path, e))?;
        if have != head {
            return Err(GraphError::invalid(tmp_path, "not the array this rank writes (another header)"));
        }
        let map = map(&file).map_err(|e| GraphError::io(tmp_path, e))?;
        Ok(NpyRows {
            tmp: None,
            touched: vec![0; pages_of(map.len()).div_ceil(64)],
            touched_pages: 0,
            span: (usize::MAX, 0),
            map,
            tmp_path: tmp_path.to_path_buf(),
            path: path.to_path_buf(),
            data_offset: head.len() as u64,
            row_bytes: width.max(1) * dtype.size() as u64,
            rows,
            mapped_max: MAPPED_BYTES_MAX,
        })
    }

    /// The temporary's path (for [`NpyRows::join`]).
    pub fn temp_path(&self) -> &Path {
        &self.tmp_path
    }

    /// The destination.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Keeps up to `bytes` of the output's pages mapped in before letting them go (instead of
    /// [`MAPPED_BYTES_MAX`]; at least a page): more for a caller with room to spare, where
    /// rows arrive scattered over the file.
    pub fn keep_mapped(&mut self, bytes: usize) {
        self.mapped_max = bytes.max(page_size());
    }

    /// Writes rows: row i of `bytes` (each `row_bytes` long) at position `at[i]`.
    pub fn write_rows(&mut self, at: &[u64], bytes: &[u8]) -> Result<()> {
        let rb = self.row_bytes as usize;
        assert_eq!(bytes.len(), at.len() * rb, "{} rows of {rb} bytes", at.len());
        let (base, page) = (self.data_offset as usize, page_size());
        for (i, &p) in at.iter().enumerate() {
            assert!(p < self.rows, "row {p} of {}", self.rows);
            let off = base + p as usize * rb;
            self.map[off..off + rb].copy_from_slice(&bytes[i * rb..(i + 1) * rb]);
            for pg in off / page..=(off + rb - 1) / page {
                let (w, bit) = (pg / 64, 1u64 << (pg % 64));
                if self.touched[w] & bit == 0 {
                    self.touched[w] |= bit;
                    self.touched_pages += 1;
                }
            }
            self.span = (self.span.0.min(off), self.span.1.max(off + rb));
            if self.touched_pages * page >= self.mapped_max {
                self.release()?;
            }
        }
        Ok(())
    }

    /// Lets the pages touched go from the resident set; a file another process renames is
    /// synced first, so its rows are on disk (a shared file system) before that process learns
    /// they were written.
    fn release(&mut self) -> Result<()> {
        let (lo, hi) = std::mem::replace(&mut self.span, (usize::MAX, 0));
        if lo >= hi {
            return Ok(());
        }
        self.touched.iter_mut().for_each(|w| *w = 0);
        self.touched_pages = 0;
        let page = page_size();
        let start = lo / page * page;
        let len = hi - start;
        if self.tmp.is_none() {
            self.map.flush_range(start, len).map_err(|e| GraphError::io(&self.tmp_path, e))?;
        }
        // SAFETY: the mapping is a shared mapping of a regular file: dropping its pages from this
        // process's page tables keeps their contents in the page cache (written back from
        // there), and later reads of the range fault the same bytes in again.
        unsafe { self.map.unchecked_advise_range(UncheckedAdvice::DontNeed, start, len) }
            .map_err(|e| GraphError::io(&self.tmp_path, e))
    }

    /// Syncs what this process wrote (another process's file: before it renames it).
    pub fn flush(&mut self) -> Result<()> {
        self.release()
    }

    /// Syncs the file and renames it into place (the process that created it).
    pub fn finish(self) -> Result<()> {
        let tmp = self.tmp.expect("the process that created the file finishes it");
        self.map.flush().map_err(|e| GraphError::io(&self.tmp_path, e))?;
        drop(self.map);
        tmp.as_file().sync_all().map_err(|e| GraphError::io(&self.tmp_path, e))?;
        tmp.persist(&self.path).map_err(|e| GraphError::io(&self.path, e))?;
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        File::open(dir).and_then(|d| d.sync_all()).map_err(|e| GraphError::io(dir, e))
    }
}

/// A shared, writable mapping of the whole of `file`.
fn map(file: &File) -> std::io::Result<MmapMut> {
    // SAFETY: the file is this run's own temporary (or, joined, the one its rank 0 made for it),
    // under an unpredictable name in a directory of the user's: nothing else truncates it while
    // it is mapped, and its blocks are reserved, so a store into it cannot fault for lack of space.
    unsafe { MmapMut::map_mut(file) }
}

fn pages_of(bytes: usize) -> usize {
    bytes.div_ceil(page_size())
}

fn shape(rows: u64, width: u64) -> Vec<u64> {
    if width == 0 {
        vec![rows]
    } else {
        vec![rows, width]
    }
}

/// Makes `file` `len` bytes long with its blocks allocated where the file system can (so the
/// writes that follow cannot run out of space); a sparse length where it cannot.
fn reserve(file: &File, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fallocate on a file descriptor we own, with integer arguments only.
    let r = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
    match r {
        0 => Ok(()),
        libc::EOPNOTSUPP | libc::EINVAL => file.set_len(len),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::npy::Npy;

    #[test]
    fn rows_in_any_order_from_two_writers_make_the_array() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logits.npy");
        let mut a = NpyRows::create(&path, DType::F32, 5, 2).unwrap();
        let mut b = NpyRows::join(a.temp_path(), &path, DType::F32, 5, 2).unwrap();
        let row = |v: f32| [v.to_le_bytes(), (v + 0.5).to_le_bytes()].concat();
        a.write_rows(&[4, 0, 1], &[row(4.0), row(0.0), row(1.0)].concat()).unwrap();
        b.write_rows(&[3, 2], &[row(3.0), row(2.0)].concat()).unwrap();
        assert!(!path.exists(), "nothing at the destination before finish");
        drop(b);
        a.finish().unwrap();
        let back = Npy::open(&path).unwrap();
        assert_eq!(back.shape, vec![5, 2]);
        assert_eq!(&*back.to_f32().unwrap(), &[0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5]);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary left");
    }

    #[test]
    fn an_unfinished_file_leaves_nothing_and_a_join_checks_the_header() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("class.npy");
        let a = NpyRows::create(&path, DType::I64, 3, 0).unwrap();
        let err = NpyRows::join(a.temp_path(), &path, DType::I64, 4, 0).err().unwrap().to_string();
        assert!(err.contains("another header"), "{err}");
        drop(a);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let err =
            NpyRows::create(&dir.path().join("none/x.npy"), DType::F32, 1, 1).err().unwrap().to_string();
        assert!(err.contains("cannot write into this directory"), "{err}");
    }

    /// Minor page faults of this thread so far.
    fn faults() -> i64 {
        // SAFETY: rusage is plain integers, for which all zeroes is a value
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: getrusage writes the struct it is given
        assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) }, 0);
        u.ru_minflt
    }

    #[test]
    fn pages_kept_mapped_fault_in_once_where_scattered_rows_touch_them_again() {
        // 8-byte rows of 8 "partitions", each a stride over the whole file (as a partition's
        // nodes lie over the node order): every partition touches every page
        let dir = tempfile::tempdir().unwrap();
        let rows = 1u64 << 19; // 4 MiB of int64
        let (parts, page) = (8u64, page_size() as u64);
        // (made first: their own pages' faults are not the writes')
        let batches: Vec<(Vec<u64>, Vec<u8>)> = (0..parts)
            .map(|p| {
                let at: Vec<u64> = (p..rows).step_by(parts as usize).collect();
                let bytes = at.iter().flat_map(|&r| (r as i64).to_le_bytes()).collect();
                (at, bytes)
            })
            .collect();
        let faults_with = |keep: usize| {
            let path = dir.path().join(format!("class-{keep}.npy"));
            let mut f = NpyRows::create(&path, DType::I64, rows, 0).unwrap();
            f.keep_mapped(keep);
            let before = faults();
            for (at, bytes) in &batches {
                f.write_rows(at, bytes).unwrap();
            }
            let n = faults() - before;
            f.finish().unwrap();
            let back = Npy::open(&path).unwrap();
            assert!(back.to_i64().unwrap().iter().enumerate().all(|(i, &v)| v == i as i64));
            n
        };
        let pages = (rows * 8 / page) as i64;
        let kept = faults_with(8 << 20);
        let let_go = faults_with(256 << 10);
        // kept: about a fault per page; let go every 256 KiB: about one per page per partition
        assert!(kept <= 2 * pages, "{kept} faults over {pages} pages kept mapped");
        assert!(let_go >= (parts as i64 / 2) * pages, "{let_go} faults over {pages} pages let go");
    }

    #[test]
    fn a_disk_too_small_is_refused_with_the_bytes_needed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("embedding-0.npy");
        // a petabyte of rows: more than any test machine's disk
        let err = NpyRows::create(&path, DType::F32, 1 << 40, 256).err().unwrap().to_string();
        assert!(err.contains("needs 11258999068427") && err.contains(" free: free space"), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "no temporary left");
    }
}
