//! NumPy `.npz` archives, read and written a member at a time.
//!
//! An `.npz` is a zip archive of `.npy` files, one per array (`edge_index.npy`, …):
//! `np.savez_compressed` deflates each member, `np.savez` stores it as is; numpy writes every
//! member as zip64, so members may be larger than 4 GiB. Reading never holds the archive or a
//! member in memory: [`Npz::member`] parses a member's `.npy` header from the decompressing
//! stream and hands out its data in pieces, which loaders convert straight into their
//! destination. A member's CRC is checked when its data has been read to the end
//! ([`Member::finish`]). Every error names the archive and the member
//! (`raw/data.npz: member node_feat.npy: …`).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use zip::read::ZipFile;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipArchive, ZipWriter};

use super::npy::{header_in, parse_header, DType};
use crate::buf::{as_bytes, Pod};
use crate::error::{GraphError, Result};

const MAGIC: &[u8; 6] = b"\x93NUMPY";
/// Bytes a member's data is handed out in.
const PIECE: usize = 4 << 20;

/// An open `.npz` archive (its central directory read, nothing else).
pub struct Npz {
    path: PathBuf,
    zip: ZipArchive<BufReader<File>>,
    /// The archive's size in bytes.
    len: u64,
}

impl Npz {
    /// Opens `path` and reads the archive's directory.
    pub fn open(path: &Path) -> Result<Npz> {
        let file = super::files::open_input(path).map_err(|e| GraphError::io(path, e))?;
        let len = file.metadata().map_err(|e| GraphError::io(path, e))?.len();
        let zip = ZipArchive::new(BufReader::with_capacity(1 << 20, file)).map_err(|e| {
            GraphError::invalid(path, format!("not a readable .npz (zip) archive, truncated or damaged: {e}"))
        })?;
        Ok(Npz { path: path.to_path_buf(), zip, len })
    }

    /// The archive's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The arrays the archive holds: its members' names without `.npy`, in archive order.
    pub fn arrays(&self) -> Vec<String> {
        self.zip.file_names().map(|n| n.strip_suffix(".npy").unwrap_or(n).to_string()).collect()
    }

    /// True when the archive holds array `name`.
    pub fn has(&self, name: &str) -> bool {
        self.zip.index_for_name(&format!("{name}.npy")).is_some()
    }

    /// Array `name` (member `name.npy`), its header read; `layout` describes the archive's
    /// expected content for the message when the member is missing.
    pub fn member(&mut self, name: &str, layout: &str) -> Result<Member<'_>> {
        let file = format!("{name}.npy");
        let origin = member_origin(&self.path, &file);
        if !self.has(name) {
            let have = self.zip.file_names().collect::<Vec<_>>().join(", ");
            return Err(GraphError::invalid(
                &self.path,
                format!("no member {file} (the archive holds: {have}); expected {layout}"),
            ));
        }
        let reader = self.zip.by_name(&file).map_err(|e| GraphError::invalid(&origin, e.to_string()))?;
        let mut m = Member { origin, reader, dtype: DType::U8, shape: Vec::new(), fortran: false, at: 0 };
        m.read_header()?;
        m.check_size(self.len)?;
        Ok(m)
    }
}

/// How errors name a member: the archive's path, then `member NAME`.
pub(crate) fn member_origin(npz: &Path, file: &str) -> PathBuf {
    PathBuf::from(format!("{}: member {file}", npz.display()))
}

/// One array of an archive, being read.
pub struct Member<'a> {
    origin: PathBuf,
    reader: ZipFile<'a, BufReader<File>>,
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// Column-major storage (2-D only): [`Member::position`] maps storage order to row-major.
    pub fortran: bool,
    /// Bytes of the member read so far (header included).
    at: u64,
}

impl Member<'_> {
    /// The archive and member, as errors name them.
    pub fn origin(&self) -> &Path {
        &self.origin
    }

    /// Elements in the array.
    pub fn len(&self) -> u64 {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An error about this member.
    pub fn invalid(&self, msg: impl Into<String>) -> GraphError {
        GraphError::invalid(&self.origin, msg)
    }

    /// Fills `buf` from the member's stream; an early end says how much was there.
    fn fill(&mut self, buf: &mut [u8], what: &str) -> Result<()> {
        let mut got = 0;
        while got < buf.len() {
            match self.reader.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(self.invalid(format!(
                        "truncated: the member ends after {} bytes, inside its {what}",
                        self.at + got as u64
                    )))
                }
                Ok(k) => got += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(GraphError::Decode {
                        path: self.origin.clone(),
                        offset: self.at + got as u64,
                        cause: e,
                    })
                }
            }
        }
        self.at += got as u64;
        Ok(())
    }

    fn read_header(&mut self) -> Result<()> {
        let mut head = [0u8; 10];
        self.fill(&mut head, "header")?;
        if &head[..6] != MAGIC {
            return Err(self.invalid("not a .npy array (magic \\x93NUMPY missing)"));
        }
        let len = match head[6] {
            1 => u16::from_le_bytes([head[8], head[9]]) as usize,
            2 | 3 => {
                let mut more = [0u8; 2];
                self.fill(&mut more, "header")?;
                u32::from_le_bytes([head[8], head[9], more[0], more[1]]) as usize
            }
            v => return Err(self.invalid(format!("unsupported .npy version {v}.{}", head[7]))),
        };
        if len > 1 << 20 {
            return Err(self.invalid(format!("a .npy header of {len} bytes (damaged?)")));
        }
        let mut text = vec![0u8; len];
        self.fill(&mut text, "header")?;
        let text = String::from_utf8(text).map_err(|_| self.invalid("the .npy header is not text"))?;
        let (dtype, fortran, shape) =
            parse_header(&text).map_err(|msg| self.invalid(format!("bad .npy header {text:?}: {msg}")))?;
        if fortran && shape.len() > 2 {
            return Err(self.invalid(
                "Fortran-ordered arrays of more than 2 dimensions are not supported; save with np.ascontiguousarray",
            ));
        }
        self.fortran = fortran && shape.len() == 2;
        self.dtype = dtype;
        self.shape = shape;
        if self.len().checked_mul(dtype.size() as u64).is_none() {
            return Err(self.invalid(format!("shape {:?} overflows", self.shape)));
        }
        Ok(())
    }

    /// Refuses a header whose data the member cannot hold (before anything is allocated for
    /// it): more than the member's declared size, or than its compressed bytes can inflate to
    /// (deflate expands at most 1032-fold), where those lie inside the archive's `file_len`.
    fn check_size(&self, file_len: u64) -> Result<()> {
        let need = self.at + self.len() * self.dtype.size() as u64;
        let (size, packed) = (self.reader.size(), self.reader.compressed_size());
        let most = match self.reader.compression() {
            CompressionMethod::Stored => packed,
            _ => packed.saturating_mul(1032).saturating_add(1024),
        };
        if packed > file_len {
            return Err(self.invalid(format!("says it holds {packed} bytes, the archive has {file_len}")));
        }
        if need > size.min(most) {
            return Err(self.invalid(format!(
                "truncated: shape {:?} of {:?} needs {need} bytes, the member holds {}",
                self.shape,
                self.dtype,
                size.min(most)
            )));
        }
        Ok(())
    }

    /// Requires the given number of dimensions; `names` describe them for the message.
    pub fn expect_shape(&self, names: &[&str]) -> Result<()> {
        if self.shape.len() != names.len() {
            return Err(self.invalid(format!(
                "expected a {}-dimensional array [{}], found shape {:?}",
                names.len(),
                names.join(", "),
                self.shape
            )));
        }
        Ok(())
    }

    /// The row-major index of the element at storage index `k` (the identity unless the
    /// array is a Fortran-ordered matrix).
    pub fn position(&self, k: u64) -> u64 {
        if self.fortran {
            let (rows, cols) = (self.shape[0], self.shape[1]);
            (k % rows) * cols + k / rows
        } else {
            k
        }
    }

    /// Reads the data into `dst` (exactly the member's data bytes, in storage order), in pieces,
    /// calling `done(bytes)` after each.
    pub fn read_all_into(&mut self, dst: &mut [u8], done: &mut dyn FnMut(usize)) -> Result<()> {
        assert_eq!(dst.len() as u64, self.len() * self.dtype.size() as u64, "the member's data size");
        for piece in dst.chunks_mut(PIECE) {
            self.fill(piece, "data")?;
            done(piece.len());
        }
        Ok(())
    }

    /// Streams the data in pieces of whole elements: `f(storage index of the first, bytes)`.
    pub fn for_each_piece(&mut self, f: &mut dyn FnMut(u64, &[u8]) -> Result<()>) -> Result<()> {
        let size = self.dtype.size() as u64;
        let total = self.len() * size;
        let mut buf = vec![0u8; (PIECE as u64).min(total) as usize];
        let mut off = 0u64;
        while off < total {
            let k = ((total - off) as usize).min(buf.len());
            self.fill(&mut buf[..k], "data")?;
            f(off / size, &buf[..k])?;
            off += k as u64;
        }
        Ok(())
    }

    /// Every element as i64, in storage order, streamed: `f(storage index, value)`. Integer
    /// dtypes, and floats that are integral (`None` for NaN, which OGB's labels use for "none").
    pub fn for_each_int(&mut self, f: &mut dyn FnMut(u64, Option<i64>) -> Result<()>) -> Result<()> {
        let dtype = self.dtype;
        let origin = self.origin.clone();
        self.for_each_piece(&mut |first, bytes| {
            for (i, b) in bytes.chunks_exact(dtype.size()).enumerate() {
                let k = first + i as u64;
                let v = int_value(dtype, b).map_err(|x| {
                    GraphError::invalid(&origin, format!("element {k} is {x}, not an integer"))
                })?;
                f(k, v)?;
            }
            Ok(())
        })
    }

    /// Checks that the member's data ends here (and so its CRC, which the archive checks at
    /// the end of the stream).
    pub fn finish(mut self) -> Result<()> {
        let mut one = [0u8; 1];
        let read = loop {
            match self.reader.read(&mut one) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                r => break r,
            }
        };
        match read {
            Ok(0) => Ok(()),
            Ok(_) => Err(self.invalid(format!(
                "longer than its shape {:?} of {:?}: data continues after byte {}",
                self.shape, self.dtype, self.at
            ))),
            Err(e) => Err(GraphError::Decode { path: self.origin.clone(), offset: self.at, cause: e }),
        }
    }
}

/// An element as an integer: `Ok(None)` for a NaN float, `Err(value)` for a fractional or
/// infinite float or an unsigned value beyond i64.
fn int_value(dtype: DType, b: &[u8]) -> std::result::Result<Option<i64>, String> {
    let float = |x: f64| {
        if x.is_nan() {
            Ok(None)
        } else if x.is_finite() && x.fract() == 0.0 && x.abs() < 9.0e15 {
            Ok(Some(x as i64))
        } else {
            Err(if x != 0.0 && !(1e-4..1e16).contains(&x.abs()) { format!("{x:e}") } else { x.to_string() })
        }
    };
    Ok(Some(match dtype {
        DType::Bool | DType::U8 => b[0] as i64,
        DType::I8 => b[0] as i8 as i64,
        DType::I16 => i16::from_le_bytes([b[0], b[1]]) as i64,
        DType::U16 => u16::from_le_bytes([b[0], b[1]]) as i64,
        DType::I32 => i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64,
        DType::U32 => u32::from_le_bytes(b.try_into().expect("4 bytes")) as i64,
        DType::I64 => i64::from_le_bytes(b.try_into().expect("8 bytes")),
        DType::U64 => {
            let v = u64::from_le_bytes(b.try_into().expect("8 bytes"));
            i64::try_from(v).map_err(|_| v.to_string())?
        }
        DType::F16 => return float(half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64()),
        DType::F32 => return float(f32::from_le_bytes(b.try_into().expect("4 bytes")) as f64),
        DType::F64 => return float(f64::from_le_bytes(b.try_into().expect("8 bytes"))),
    }))
}

/// Float elements as f32 into `out` (values of `dtype`, little-endian, in `bytes`).
pub(crate) fn floats_into(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    match dtype {
        DType::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes(b.try_into().expect("4 bytes"));
            }
        }
        DType::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        DType::F64 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(8)) {
                *o = f64::from_le_bytes(b.try_into().expect("8 bytes")) as f32;
            }
        }
        other => unreachable!("floats_into is called for float dtypes only, not {other:?}"),
    }
}

/// Writes an `.npz` archive as `np.savez_compressed` does: each array a deflated, zip64
/// member `NAME.npy` holding a (version 1.0) `.npy` file.
pub struct NpzWriter {
    path: PathBuf,
    /// The archive under a temporary name beside `path`, renamed into place by
    /// [`NpzWriter::finish`].
    tmp: super::files::Temp,
    zip: ZipWriter<BufWriter<File>>,
    /// Data bytes the current member still expects.
    remaining: u64,
    compression: CompressionMethod,
}

impl NpzWriter {
    /// Creates `path`; `compressed`: deflated members (`savez_compressed`), else stored (`savez`).
    pub fn create(path: &Path, compressed: bool) -> Result<NpzWriter> {
        super::files::check_replaceable(path).map_err(|e| GraphError::io(path, e))?;
        let tmp = super::files::temp_for(path).map_err(|e| GraphError::io(path, e))?;
        let file = tmp.as_file().try_clone().map_err(|e| GraphError::io(path, e))?;
        Ok(NpzWriter {
            path: path.to_path_buf(),
            tmp,
            zip: ZipWriter::new(BufWriter::with_capacity(1 << 20, file)),
            remaining: 0,
            compression: if compressed { CompressionMethod::Deflated } else { CompressionMethod::Stored },
        })
    }

    fn zip_error(&self, e: zip::result::ZipError) -> GraphError {
        GraphError::io(&self.path, std::io::Error::other(e))
    }

    /// Starts array `name` of `dtype` and `shape`; its data follows through [`NpzWriter::write`].
    pub fn begin(&mut self, name: &str, dtype: DType, shape: &[u64]) -> Result<()> {
        self.begin_in(name, dtype, shape, false)
    }

    /// [`NpzWriter::begin`] for data in C (row-major) or, `fortran`, column-major order (as
    /// numpy writes a Fortran-contiguous array).
    pub fn begin_in(&mut self, name: &str, dtype: DType, shape: &[u64], fortran: bool) -> Result<()> {
        assert_eq!(self.remaining, 0, "{}: the previous array is incomplete", self.path.display());
        let opts = SimpleFileOptions::default().compression_method(self.compression).large_file(true);
        self.zip.start_file(format!("{name}.npy"), opts).map_err(|e| self.zip_error(e))?;
        let head = header_in(dtype, shape, fortran);
        self.zip.write_all(&head).map_err(|e| GraphError::io(&self.path, e))?;
        self.remaining = shape.iter().product::<u64>() * dtype.size() as u64;
        Ok(())
    }

    /// Appends elements to the current array (their size must match its dtype's).
    pub fn write<T: Pod>(&mut self, data: &[T]) -> Result<()> {
        let bytes = as_bytes(data);
        assert!(bytes.len() as u64 <= self.remaining, "more data than the declared shape");
        self.remaining -= bytes.len() as u64;
        self.zip.write_all(bytes).map_err(|e| GraphError::io(&self.path, e))
    }

    /// A whole array in one call.
    pub fn array<T: Pod>(&mut self, name: &str, dtype: DType, shape: &[u64], data: &[T]) -> Result<()> {
        self.begin(name, dtype, shape)?;
        self.write(data)
    }

    /// Writes the archive's directory, syncs, and renames the archive into place.
    pub fn finish(self) -> Result<()> {
        assert_eq!(self.remaining, 0, "{}: the last array is incomplete", self.path.display());
        let path = self.path.clone();
        let w = self.zip.finish().map_err(|e| GraphError::io(&path, std::io::Error::other(e)))?;
        w.into_inner()
            .map_err(|e| GraphError::io(&path, e.into_error()))?
            .sync_all()
            .map_err(|e| GraphError::io(&path, e))?;
        self.tmp.persist(&path).map_err(|e| GraphError::io(&path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_round_trip_in_pieces_and_damage_names_the_member() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.npz");
        let big: Vec<i64> = (0..3 * PIECE as i64 / 8 + 5).collect();
        let mut w = NpzWriter::create(&p, true).unwrap();
        w.array("x", DType::I64, &[big.len() as u64], &big).unwrap();
        w.array("h", DType::F16, &[2, 2], &[0x3c00u16, 0x4000, 0x3800, 0x7e00]).unwrap();
        w.finish().unwrap();
        let mut z = Npz::open(&p).unwrap();
        assert_eq!(z.arrays(), vec!["x", "h"]);
        let mut m = z.member("x", "x and h").unwrap();
        assert_eq!((m.dtype, m.shape.clone()), (DType::I64, vec![big.len() as u64]));
        let mut got = Vec::new();
        m.for_each_int(&mut |k, v| {
            assert_eq!(k as usize, got.len());
            got.push(v.unwrap());
            Ok(())
        })
        .unwrap();
        m.finish().unwrap();
        assert_eq!(got, big);
        let mut m = z.member("h", "").unwrap();
        let mut raw = vec![0u8; 8];
        m.read_all_into(&mut raw, &mut |_| {}).unwrap();
        m.finish().unwrap();
        let mut f = [0f32; 4];
        floats_into(DType::F16, &raw, &mut f);
        assert_eq!(&f[..3], &[1.0, 2.0, 0.5]);
        assert!(f[3].is_nan());
        let err = z.member("y", "x and h").err().unwrap().to_string();
        assert!(
            err.contains("a.npz: no member y.npy (the archive holds: x.npy, h.npy); expected x and h"),
            "{err}"
        );

        // a flipped byte inside the deflated data of x: a decode or checksum error naming x
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[2000] ^= 0x55;
        std::fs::write(&p, &bytes).unwrap();
        let mut z = Npz::open(&p).unwrap();
        let err = match z.member("x", "") {
            Err(e) => e,
            Ok(mut m) => m.for_each_int(&mut |_, _| Ok(())).and_then(|_| m.finish()).unwrap_err(),
        }
        .to_string();
        assert!(err.contains("a.npz: member x.npy: "), "{err}");
    }

    #[test]
    fn a_shape_the_member_cannot_hold_is_refused_before_allocating() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("b.npz");
        let mut w = ZipWriter::new(File::create(&p).unwrap());
        let opts = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);
        w.start_file("huge.npy", opts).unwrap();
        w.write_all(&header_in(DType::F32, &[1 << 40, 1 << 10], false)).unwrap();
        w.write_all(&[0u8; 64]).unwrap();
        w.finish().unwrap();
        let mut z = Npz::open(&p).unwrap();
        let err = z.member("huge", "").err().unwrap().to_string();
        assert!(
            err.contains("b.npz: member huge.npy: truncated: shape [1099511627776, 1024] of F32 needs"),
            "{err}"
        );
    }
}
