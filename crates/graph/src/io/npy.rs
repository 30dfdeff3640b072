//! The NumPy `.npy` format: header parsing with exact error positions, memory-mapped reading,
//! streaming writing, and the headerless raw arrays IGB ships for its large variants.
//!
//! Hand-written rather than taken from a crate because loaders need three things the crates
//! do not give together: byte offsets in every error, zero-copy views of mapped data (features
//! larger than RAM), and headerless files of a given shape.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use rayon::prelude::*;

use half::f16;

use crate::buf::{as_bytes, Buf, Pod};
use crate::error::{GraphError, Result};
use crate::features::FeatureData;

const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Element types the loaders accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    Bool,
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    F16,
    F32,
    F64,
}

impl DType {
    fn parse(descr: &str) -> Option<DType> {
        let (order, code) = descr.split_at(1.min(descr.len()));
        let little_or_na = matches!(order, "<" | "|" | "=");
        if !little_or_na {
            return None;
        }
        Some(match code {
            "b1" => DType::Bool,
            "i1" => DType::I8,
            "u1" => DType::U8,
            "i2" => DType::I16,
            "u2" => DType::U16,
            "i4" => DType::I32,
            "u4" => DType::U32,
            "i8" => DType::I64,
            "u8" => DType::U64,
            "f2" => DType::F16,
            "f4" => DType::F32,
            "f8" => DType::F64,
            _ => return None,
        })
    }

    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::I8 | DType::U8 => 1,
            DType::I16 | DType::U16 | DType::F16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 => 8,
        }
    }

    fn descr(self) -> &'static str {
        match self {
            DType::Bool => "|b1",
            DType::I8 => "|i1",
            DType::U8 => "|u1",
            DType::I16 => "<i2",
            DType::U16 => "<u2",
            DType::I32 => "<i4",
            DType::U32 => "<u4",
            DType::I64 => "<i8",
            DType::U64 => "<u8",
            DType::F16 => "<f2",
            DType::F32 => "<f4",
            DType::F64 => "<f8",
        }
    }

    fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::F32 | DType::F64)
    }
}

/// A mapped `.npy` array (or raw headerless array) with its shape and element type.
pub struct Npy {
    pub path: PathBuf,
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// Byte offset of the first element.
    pub data_offset: usize,
    /// Column-major storage (2-D only); readers return row-major data either way.
    pub fortran: bool,
    map: Arc<Mmap>,
    /// The mapped file (rows are read from it with pread: [`Buf::read_through`]).
    file: Arc<std::fs::File>,
}

fn map_file(path: &Path) -> Result<(Arc<Mmap>, u64, Arc<std::fs::File>)> {
    let file = super::files::open_input(path).map_err(|e| GraphError::io(path, e))?;
    let len = file.metadata().map_err(|e| GraphError::io(path, e))?.len();
    // SAFETY: the file is opened read-only; like every mmap-based reader we rely on no other
    // process truncating it while mapped (documented in ARCHITECTURE.md).
    let map = unsafe { Mmap::map(&file) }.map_err(|e| GraphError::io(path, e))?;
    Ok((Arc::new(map), len, Arc::new(file)))
}

impl Npy {
    /// Opens a `.npy` file and checks that its data is exactly as long as its header says.
    pub fn open(path: &Path) -> Result<Npy> {
        let (map, len, file) = map_file(path)?;
        let fmt = |off: u64, msg: String| GraphError::format(path, off, msg);
        if map.len() < 10 || &map[..6] != MAGIC {
            return Err(fmt(0, "not a .npy file (magic \\x93NUMPY missing)".into()));
        }
        let major = map[6];
        let (hlen, start) = match major {
            1 => (u16::from_le_bytes([map[8], map[9]]) as usize, 10),
            2 | 3 if map.len() >= 12 => (u32::from_le_bytes([map[8], map[9], map[10], map[11]]) as usize, 12),
            _ => return Err(fmt(6, format!("unsupported .npy version {major}.{}", map[7]))),
        };
        let end = start + hlen;
        if end > map.len() {
            return Err(fmt(
                start as u64,
                format!("header of {hlen} bytes runs past the end of the file ({len} bytes)"),
            ));
        }
        let header = std::str::from_utf8(&map[start..end])
            .map_err(|e| fmt(start as u64 + e.valid_up_to() as u64, "header is not text".into()))?;
        let (dtype, fortran, shape) =
            parse_header(header).map_err(|msg| fmt(start as u64, format!("bad header {header:?}: {msg}")))?;
        if fortran && shape.len() > 2 {
            return Err(fmt(
                start as u64,
                "Fortran-ordered arrays of more than 2 dimensions are not supported; save with np.ascontiguousarray".into(),
            ));
        }
        let fortran = fortran && shape_is_2d(&shape);
        let npy = Npy { path: path.to_path_buf(), dtype, shape, data_offset: end, fortran, map, file };
        npy.check_length(len)?;
        Ok(npy)
    }

    /// Maps a headerless raw file (IGB large/full `node_feat.npy`) of known shape.
    pub fn open_raw(path: &Path, dtype: DType, shape: Vec<u64>) -> Result<Npy> {
        let (map, len, file) = map_file(path)?;
        let npy = Npy { path: path.to_path_buf(), dtype, shape, data_offset: 0, fortran: false, map, file };
        npy.check_length(len)?;
        Ok(npy)
    }

    /// True when the file starts with the `.npy` magic.
    pub fn has_header(path: &Path) -> Result<bool> {
        let mut f = super::files::open_input(path).map_err(|e| GraphError::io(path, e))?;
        let mut m = [0u8; 6];
        use std::io::Read;
        Ok(f.read_exact(&mut m).is_ok() && &m == MAGIC)
    }

    fn check_length(&self, len: u64) -> Result<()> {
        let want = self
            .shape
            .iter()
            .try_fold(self.dtype.size() as u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| GraphError::format(&self.path, 0, "shape overflows"))?;
        let have = len - self.data_offset as u64;
        if have != want {
            let what = if have < want { "truncated" } else { "longer than its shape" };
            return Err(GraphError::format(
                &self.path,
                len.min(self.data_offset as u64 + want),
                format!(
                    "{what}: shape {:?} of {:?} needs {want} data bytes, the file has {have}",
                    self.shape, self.dtype
                ),
            ));
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.shape.iter().product::<u64>() as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn bytes(&self) -> &[u8] {
        &self.map[self.data_offset..]
    }

    /// Requires the given number of dimensions; `names` describe them for the message.
    pub fn expect_shape(&self, names: &[&str]) -> Result<()> {
        if self.shape.len() != names.len() {
            return Err(GraphError::format(
                &self.path,
                0,
                format!(
                    "expected a {}-dimensional array [{}], found shape {:?}",
                    names.len(),
                    names.join(", "),
                    self.shape
                ),
            ));
        }
        Ok(())
    }

    /// Storage position of row-major element `i`.
    fn storage_index(&self, i: usize) -> usize {
        if self.fortran {
            let (r, c) = (self.shape[0] as usize, self.shape[1] as usize);
            (i % c) * r + i / c
        } else {
            i
        }
    }

    /// Row-major element `i`.
    fn elem<T: Pod>(&self, i: usize) -> T {
        let i = self.storage_index(i);
        let s = std::mem::size_of::<T>();
        let b = &self.bytes()[i * s..(i + 1) * s];
        // SAFETY: `b` holds exactly size_of::<T>() bytes and T is Pod; read_unaligned has no
        // alignment requirement.
        unsafe { std::ptr::read_unaligned(b.as_ptr() as *const T) }
    }

    /// Every element as i64; integer types only (floats are accepted when integral, as IGB
    /// stores labels as floats). Error names the element's byte offset.
    pub fn to_i64(&self) -> Result<Vec<i64>> {
        let n = self.len();
        let conv = |i: usize| -> Option<i64> {
            Some(match self.dtype {
                DType::Bool | DType::U8 => self.elem::<u8>(i) as i64,
                DType::I8 => self.elem::<u8>(i) as i8 as i64,
                DType::I16 => self.elem::<i16>(i) as i64,
                DType::U16 => self.elem::<u16>(i) as i64,
                DType::I32 => self.elem::<i32>(i) as i64,
                DType::U32 => self.elem::<u32>(i) as i64,
                DType::I64 => self.elem::<i64>(i),
                DType::U64 => i64::try_from(self.elem::<u64>(i)).ok()?,
                DType::F32 => integral(self.elem::<f32>(i) as f64)?,
                DType::F64 => integral(self.elem::<f64>(i))?,
                DType::F16 => return None,
            })
        };
        if self.dtype == DType::F16 {
            return Err(GraphError::format(&self.path, 0, "expected integers, found float16"));
        }
        let out: Vec<Option<i64>> = (0..n).into_par_iter().map(conv).collect();
        if let Some(i) = out.iter().position(|x| x.is_none()) {
            let what = match self.dtype {
                DType::U64 => format!("{}, past the largest id this reads (2^63 - 1)", self.elem::<u64>(i)),
                DType::F32 => format!("{}, not an integer", self.elem::<f32>(i)),
                _ => format!("{}, not an integer", self.elem::<f64>(i)),
            };
            return Err(GraphError::format(
                &self.path,
                (self.data_offset + i * self.dtype.size()) as u64,
                format!("element {i} is {what}"),
            ));
        }
        Ok(out.into_iter().map(|x| x.unwrap_or_default()).collect())
    }

    /// Labels: integers, where floats must be integral and NaN means "no label" (-1).
    pub fn to_labels(&self) -> Result<Vec<i64>> {
        if self.dtype.is_float() && self.dtype != DType::F16 {
            let vals: Vec<f64> = (0..self.len())
                .into_par_iter()
                .map(|i| match self.dtype {
                    DType::F32 => self.elem::<f32>(i) as f64,
                    _ => self.elem::<f64>(i),
                })
                .collect();
            return vals
                .iter()
                .enumerate()
                .map(|(i, &x)| {
                    if x.is_nan() {
                        Ok(-1)
                    } else {
                        integral(x).ok_or_else(|| {
                            GraphError::format(
                                &self.path,
                                (self.data_offset + i * self.dtype.size()) as u64,
                                format!("label {i} is {x}, not an integer"),
                            )
                        })
                    }
                })
                .collect();
        }
        self.to_i64()
    }

    /// The data as f32, row-major: a zero-copy view for aligned little-endian f32 in C order,
    /// a converted copy for f64 and for Fortran-ordered (column-major) arrays, which are
    /// transposed while loading (half precision is refused).
    pub fn to_f32(&self) -> Result<Buf<f32>> {
        match self.dtype {
            DType::F32 if self.fortran => Ok(Buf::Owned(self.transposed_f32())),
            DType::F32 => Ok(Buf::mapped(self.map.clone(), self.data_offset, self.len()).map_or_else(
                || Buf::Owned((0..self.len()).into_par_iter().map(|i| self.elem::<f32>(i)).collect()),
                |b| b.read_through(self.file.clone()),
            )),
            DType::F64 => {
                Ok(Buf::Owned((0..self.len()).into_par_iter().map(|i| self.elem::<f64>(i) as f32).collect()))
            }
            other => Err(GraphError::format(
                &self.path,
                0,
                format!("expected float32 or float64 features, found {other:?}"),
            )),
        }
    }

    /// Features as stored: float16 kept narrow (a zero-copy view where aligned and in C order,
    /// read through the file as float32 arrays are), float32 as [`Npy::to_f32`], float64
    /// converted to float32.
    pub fn to_features(&self) -> Result<FeatureData> {
        if self.dtype != DType::F16 {
            return self.to_f32().map(FeatureData::F32);
        }
        let view = (!self.fortran)
            .then(|| Buf::<f16>::mapped(self.map.clone(), self.data_offset, self.len()))
            .flatten();
        Ok(FeatureData::F16(match view {
            Some(b) => b.read_through(self.file.clone()),
            None => Buf::Owned((0..self.len()).into_par_iter().map(|i| self.elem::<f16>(i)).collect()),
        }))
    }

    /// A column-major f32 matrix copied into row-major order, a band of rows at a time so that
    /// each column is read as one sequential run per band.
    fn transposed_f32(&self) -> Vec<f32> {
        let (r, c) = (self.shape[0] as usize, self.shape[1] as usize);
        tracing::warn!(
            "{} is Fortran-ordered (column-major): transposing it costs a copy of {:.1} MiB in memory; \
             save it with np.ascontiguousarray to map it without one",
            self.path.display(),
            (r * c * 4) as f64 / (1 << 20) as f64
        );
        const BAND: usize = 256;
        let mut out = vec![0f32; r * c];
        let bytes = self.bytes();
        out.par_chunks_mut(BAND * c.max(1)).enumerate().for_each(|(b, rows)| {
            let r0 = b * BAND;
            let n = rows.len() / c.max(1);
            for j in 0..c {
                let col = &bytes[(j * r + r0) * 4..(j * r + r0 + n) * 4];
                for (i, v) in col.chunks_exact(4).enumerate() {
                    rows[i * c + j] = f32::from_le_bytes(v.try_into().expect("4 bytes"));
                }
            }
        });
        out
    }
}

fn shape_is_2d(shape: &[u64]) -> bool {
    shape.len() == 2
}

/// Every element as f64, row-major (any numeric dtype but half precision).
impl Npy {
    pub fn to_f64(&self) -> Result<Vec<f64>> {
        (0..self.len())
            .map(|i| {
                Ok(match self.dtype {
                    DType::F32 => self.elem::<f32>(i) as f64,
                    DType::F64 => self.elem::<f64>(i),
                    DType::F16 => return Err(GraphError::format(&self.path, 0, "float16 is not supported")),
                    _ => return self.to_i64().map(|v| v[i] as f64),
                })
            })
            .collect()
    }
}

fn integral(x: f64) -> Option<i64> {
    (x.is_finite() && x.fract() == 0.0 && x.abs() < 9.0e15).then_some(x as i64)
}

/// Parses the header dict: `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }`.
pub(crate) fn parse_header(h: &str) -> std::result::Result<(DType, bool, Vec<u64>), String> {
    let h = h.trim_end_matches(['\n', ' ', '\0']);
    let body = h.trim().strip_prefix('{').and_then(|s| s.strip_suffix('}')).ok_or("not a dict")?;
    let value = |key: &str| -> std::result::Result<&str, String> {
        let k = [format!("'{key}'"), format!("\"{key}\"")]
            .into_iter()
            .find_map(|k| body.find(&k).map(|i| i + k.len()))
            .ok_or(format!("no {key:?} key"))?;
        let rest = body[k..].trim_start().strip_prefix(':').ok_or("missing ':'")?.trim_start();
        Ok(rest)
    };
    let descr_rest = value("descr")?;
    let q = descr_rest.chars().next().filter(|c| *c == '\'' || *c == '"').ok_or("descr is not a string")?;
    let descr = descr_rest[1..].split(q).next().ok_or("unterminated descr")?;
    let dtype =
        DType::parse(descr).ok_or(format!("unsupported dtype {descr:?} (little-endian numbers only)"))?;
    let fortran = match value("fortran_order")? {
        s if s.starts_with("False") => false,
        s if s.starts_with("True") => true,
        _ => return Err("fortran_order is not a bool".into()),
    };
    let shape_rest = value("shape")?.strip_prefix('(').ok_or("shape is not a tuple")?;
    let inner = shape_rest.split(')').next().ok_or("unterminated shape")?;
    let shape = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse::<u64>().map_err(|_| format!("bad dimension {s:?}")))
        .collect::<std::result::Result<Vec<u64>, String>>()?;
    Ok((dtype, fortran, shape))
}

/// Writes `.npy` files; data is streamed in pieces so large arrays never sit in memory whole.
/// The file is written under a temporary name beside `path` and renamed into place by
/// [`NpyWriter::finish`]: a partial array never appears under its name.
pub struct NpyWriter {
    path: PathBuf,
    tmp: super::files::Temp,
    out: BufWriter<File>,
    remaining: u64,
}

impl NpyWriter {
    /// Starts `path` for an array of `dtype` and `shape` and writes its (version 1.0) header.
    pub fn create(path: &Path, dtype: DType, shape: &[u64]) -> Result<NpyWriter> {
        super::files::check_replaceable(path).map_err(|e| GraphError::io(path, e))?;
        let tmp = super::files::temp_for(path).map_err(|e| GraphError::io(path, e))?;
        let file = tmp.as_file().try_clone().map_err(|e| GraphError::io(path, e))?;
        let mut out = BufWriter::with_capacity(8 << 20, file);
        out.write_all(&header(dtype, shape)).map_err(|e| GraphError::io(path, e))?;
        Ok(NpyWriter {
            path: path.to_path_buf(),
            tmp,
            out,
            remaining: shape.iter().product::<u64>() * dtype.size() as u64,
        })
    }

    /// Appends elements (their type must match the declared dtype's size).
    pub fn write<T: Pod>(&mut self, data: &[T]) -> Result<()> {
        let bytes = as_bytes(data);
        assert!(bytes.len() as u64 <= self.remaining, "more data than the declared shape");
        self.remaining -= bytes.len() as u64;
        self.out.write_all(bytes).map_err(|e| GraphError::io(&self.path, e))
    }

    /// Flushes, syncs and renames the file into place; errors if fewer elements were written
    /// than declared.
    pub fn finish(mut self) -> Result<()> {
        assert_eq!(self.remaining, 0, "{}: fewer elements written than declared", self.path.display());
        let io = |e| GraphError::io(&self.path, e);
        self.out.flush().map_err(io)?;
        self.out.get_ref().sync_all().map_err(io)?;
        self.tmp.persist(&self.path).map_err(io)
    }
}

/// The (version 1.0) header of an array of `dtype` and `shape`, padded so that the data starts
/// on a 64-byte boundary.
pub(crate) fn header(dtype: DType, shape: &[u64]) -> Vec<u8> {
    header_in(dtype, shape, false)
}

/// [`header`] of an array stored in C (row-major) or, `fortran`, column-major order.
pub(crate) fn header_in(dtype: DType, shape: &[u64], fortran: bool) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    let tuple = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let order = if fortran { "True" } else { "False" };
    let mut header =
        format!("{{'descr': '{}', 'fortran_order': {order}, 'shape': {tuple}, }}", dtype.descr());
    // ending the header with '\n'
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let mut head = Vec::with_capacity(10 + header.len());
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&[1, 0]);
    head.extend_from_slice(&(header.len() as u16).to_le_bytes());
    head.extend_from_slice(header.as_bytes());
    head
}

/// Writes a whole array in one call.
pub fn write_array<T: Pod>(path: &Path, dtype: DType, shape: &[u64], data: &[T]) -> Result<()> {
    let mut w = NpyWriter::create(path, dtype, shape)?;
    w.write(data)?;
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_variants() {
        let (d, f, s) =
            parse_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }   \n").unwrap();
        assert_eq!((d, f, s), (DType::F32, false, vec![3, 4]));
        let (d, _, s) = parse_header("{'descr': '<i8', 'fortran_order': False, 'shape': (7,), }").unwrap();
        assert_eq!((d, s), (DType::I64, vec![7]));
        let (_, _, s) = parse_header("{'descr': '|u1', 'fortran_order': True, 'shape': (), }").unwrap();
        assert!(s.is_empty());
        assert!(parse_header("{'descr': '>f4', 'fortran_order': False, 'shape': (3,), }").is_err());
        assert!(parse_header("{'descr': '<f4', 'shape': (3,), }").is_err());
        assert!(parse_header("{'descr': '<f4', 'fortran_order': False, 'shape': (x,), }").is_err());
    }

    #[test]
    fn round_trip_and_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.npy");
        let data: Vec<f32> = (0..12).map(|i| i as f32 * 0.5).collect();
        write_array(&p, DType::F32, &[3, 4], &data).unwrap();
        let a = Npy::open(&p).unwrap();
        assert_eq!(a.shape, vec![3, 4]);
        assert_eq!(a.data_offset % 64, 0);
        let f = a.to_f32().unwrap();
        assert!(f.is_mapped());
        assert_eq!(&*f, data.as_slice());
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 3]).unwrap();
        let err = Npy::open(&p).err().unwrap().to_string();
        assert!(err.contains("truncated") && err.contains("a.npy"), "{err}");
    }
}
