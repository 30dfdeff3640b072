//! `.npy` files written row by row in any order — predictions come partition by partition, a
//! partition's rows scattered over the node order — by one process or several (ranks that
//! share the output directory).
//!
//! Invariants: the file is made at its full size under an unpredictable temporary name beside
//! its destination before any row is computed, its space reserved (`posix_fallocate`), so a
//! disk too small is refused with the bytes needed before any work; rows are written at their
//! positions (`pwrite`, runs of consecutive rows at once); only [`NpyRows::finish`] renames it
//! into place, after a sync. A run that stops early leaves no file under the destination's name
//! (dropped, the temporary is removed; killed, a hidden `.NAME.tmp-…` remains).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::files;
use super::npy::{header, DType};
use crate::error::{GraphError, Result};

/// An `.npy` array of `rows` rows under construction (see the module docs).
pub struct NpyRows {
    /// The temporary, when this process made it (and renames it).
    tmp: Option<tempfile::NamedTempFile>,
    file: File,
    tmp_path: PathBuf,
    path: PathBuf,
    data_offset: u64,
    row_bytes: u64,
    rows: u64,
}

impl NpyRows {
    /// Creates the temporary of `path` for `rows` rows of `width` `dtype` values (`width` 0: a
    /// one-dimensional array of `rows` values) and reserves its space.
    pub fn create(path: &Path, dtype: DType, rows: u64, width: u64) -> Result<NpyRows> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let name = path.file_name().map_or("out".into(), |n| n.to_string_lossy().into_owned());
        let tmp = files::temp_in(dir, &format!(".{name}.tmp-")).map_err(|e| {
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
        Ok(NpyRows {
            tmp_path: tmp.path().to_path_buf(),
            tmp: Some(tmp),
            file,
            path: path.to_path_buf(),
            data_offset: head.len() as u64,
            row_bytes,
            rows,
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
        Ok(NpyRows {
            tmp: None,
            file,
            tmp_path: tmp_path.to_path_buf(),
            path: path.to_path_buf(),
            data_offset: head.len() as u64,
            row_bytes: width.max(1) * dtype.size() as u64,
            rows,
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

    /// Writes rows: row i of `bytes` (each `row_bytes` long) at position `at[i]`.
    pub fn write_rows(&self, at: &[u64], bytes: &[u8]) -> Result<()> {
        let rb = self.row_bytes as usize;
        assert_eq!(bytes.len(), at.len() * rb, "{} rows of {rb} bytes", at.len());
        let mut i = 0;
        while i < at.len() {
            // a run of consecutive positions goes in one write
            let mut j = i + 1;
            while j < at.len() && at[j] == at[j - 1] + 1 {
                j += 1;
            }
            assert!(at[j - 1] < self.rows, "row {} of {}", at[j - 1], self.rows);
            let off = self.data_offset + at[i] * self.row_bytes;
            self.file
                .write_all_at(&bytes[i * rb..j * rb], off)
                .map_err(|e| GraphError::io(&self.tmp_path, e))?;
            i = j;
        }
        Ok(())
    }

    /// Syncs the file and renames it into place (the process that created it).
    pub fn finish(self) -> Result<()> {
        let tmp = self.tmp.expect("the process that created the file finishes it");
        tmp.as_file().sync_all().map_err(|e| GraphError::io(&self.tmp_path, e))?;
        tmp.persist(&self.path).map_err(|e| GraphError::io(&self.path, e.error))?;
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        File::open(dir).and_then(|d| d.sync_all()).map_err(|e| GraphError::io(dir, e))
    }
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
        let a = NpyRows::create(&path, DType::F32, 5, 2).unwrap();
        let b = NpyRows::join(a.temp_path(), &path, DType::F32, 5, 2).unwrap();
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
