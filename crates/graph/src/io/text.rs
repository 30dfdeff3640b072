//! Streaming, parallel parsing of (optionally gzip-compressed) CSV text.
//!
//! One thread decompresses the file into blocks cut at line ends; rayon parses batches of
//! blocks in parallel while the next batch decompresses. Every block knows the number of its
//! first line, so an error names `file:line` exactly. Memory is bounded by the batch size, not
//! by the file size.

use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::Arc;

use flate2::read::MultiGzDecoder;
use rayon::prelude::*;

use crate::error::{GraphError, Result};
use crate::progress;

/// Size of one decompressed block handed to a parser.
const BLOCK_BYTES: usize = 4 << 20;

/// The longest line accepted. The widest feature rows in the wild (IGB's 1,024 columns, OGB's
/// 100-dimensional products, bag-of-words rows of a few thousand columns) take well under
/// 100 KiB as text; a longer line is a damaged or foreign file, refused before it takes memory.
pub const LINE_BYTES_MAX: usize = 16 << 20;

/// A run of whole lines of a text file.
pub struct Block {
    pub data: Vec<u8>,
    /// 1-based number of the block's first line in the file.
    pub first_line: u64,
}

impl Block {
    /// The block's lines with their 1-based numbers, `\r` stripped. The empty remainder after
    /// the file's final newline is not a line.
    pub fn lines(&self) -> impl Iterator<Item = (u64, &[u8])> {
        let data = self.data.strip_suffix(b"\n").unwrap_or(&self.data);
        let empty = data.is_empty() && self.data.is_empty();
        data.split(|&b| b == b'\n')
            .filter(move |_| !empty)
            .enumerate()
            .map(|(i, l)| (self.first_line + i as u64, l.strip_suffix(b"\r").unwrap_or(l)))
    }
}

/// Counts bytes pulled from the underlying (compressed) file, for progress.
struct Counting<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Opens `path`, transparently decompressing gzip (recognised by its magic bytes).
fn open(path: &Path, count: Arc<AtomicU64>) -> Result<Box<dyn Read + Send>> {
    let mut file = super::files::open_input(path).map_err(|e| GraphError::io(path, e))?;
    let mut magic = [0u8; 2];
    let got = file.read(&mut magic).map_err(|e| GraphError::io(path, e))?;
    let head = std::io::Cursor::new(magic[..got].to_vec());
    let raw = Counting { inner: head.chain(file), count };
    Ok(if got == 2 && magic == [0x1f, 0x8b] {
        Box::new(MultiGzDecoder::new(BufReader::with_capacity(1 << 20, raw)))
    } else {
        Box::new(raw)
    })
}

/// Finds `stem.csv.gz` or `stem.csv` in `dir`.
pub fn find_csv(dir: &Path, stem: &str) -> Result<PathBuf> {
    for ext in ["csv.gz", "csv"] {
        let p = dir.join(format!("{stem}.{ext}"));
        // anything by that name: opening it says what is wrong when it is not a regular file
        if p.exists() {
            return Ok(p);
        }
    }
    Err(GraphError::io(
        dir.join(format!("{stem}.csv.gz")),
        std::io::Error::new(std::io::ErrorKind::NotFound, "file not found (nor the uncompressed .csv)"),
    ))
}

/// Parses `path` block by block with `parse`, in parallel, returning the results in file order.
pub fn parse_blocks<T, F>(path: &Path, label: &str, parse: F) -> Result<Vec<T>>
where
    T: Send,
    F: Fn(&Block) -> Result<T> + Sync,
{
    let total = std::fs::metadata(path).map_err(|e| GraphError::io(path, e))?.len();
    // small files get small blocks (gzip text expands about 4×)
    let block_bytes = (total as usize).saturating_mul(4).clamp(64 << 10, BLOCK_BYTES);
    let count = Arc::new(AtomicU64::new(0));
    let mut reader = open(path, count.clone())?;
    let batch = rayon::current_num_threads() * 2;
    let pb = progress::bar(total, label, true);
    let (tx, rx) = sync_channel::<Result<Block>>(batch);
    let mut out = Vec::new();
    std::thread::scope(|s| -> Result<()> {
        // the receiver is dropped when this closure returns, early on an error too: the reader
        // then fails its next send and ends, and the scope can join it (held outside, a reader
        // blocked on a full channel would wait forever)
        let rx = rx;
        s.spawn(move || {
            let mut carry: Vec<u8> = Vec::new();
            let mut line = 1u64;
            let mut offset = 0u64;
            loop {
                let mut buf = std::mem::take(&mut carry);
                let start = buf.len();
                buf.resize(start + block_bytes, 0);
                let mut filled = start;
                let mut eof = false;
                while filled < buf.len() {
                    match reader.read(&mut buf[filled..]) {
                        Ok(0) => {
                            eof = true;
                            break;
                        }
                        Ok(k) => filled += k,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            let _ = tx.send(Err(GraphError::Decode {
                                path: path.to_path_buf(),
                                offset: offset + filled as u64,
                                cause: e,
                            }));
                            return;
                        }
                    }
                }
                buf.truncate(filled);
                let cut = if eof {
                    buf.len()
                } else {
                    match buf.iter().rposition(|&b| b == b'\n') {
                        Some(i) => i + 1,
                        None if buf.len() >= LINE_BYTES_MAX => {
                            let _ = tx.send(Err(GraphError::parse(
                                path,
                                line,
                                format!(
                                    "line longer than {} MiB (not a CSV file of this kind?)",
                                    LINE_BYTES_MAX >> 20
                                ),
                            )));
                            return;
                        }
                        None => {
                            // a line longer than a block: keep reading into a bigger buffer
                            carry = buf;
                            continue;
                        }
                    }
                };
                carry = buf[cut..].to_vec();
                buf.truncate(cut);
                offset += cut as u64;
                let lines = buf.iter().filter(|&&b| b == b'\n').count() as u64;
                let block = Block { data: buf, first_line: line };
                line += lines;
                if tx.send(Ok(block)).is_err() || eof {
                    return;
                }
            }
        });
        let mut pending = Vec::with_capacity(batch);
        let mut done = false;
        while !done {
            pending.clear();
            while pending.len() < batch {
                match rx.recv() {
                    Ok(b) => pending.push(b?),
                    Err(_) => {
                        done = true;
                        break;
                    }
                }
            }
            let parsed: Vec<Result<T>> = pending.par_iter().map(&parse).collect();
            for r in parsed {
                out.push(r?);
            }
            pb.set_position(count.load(Ordering::Relaxed));
        }
        Ok(())
    })?;
    pb.finish_and_clear();
    Ok(out)
}

/// Splits a line into its comma-separated fields (surrounding spaces ignored).
pub fn fields(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|&b| b == b',').map(trim)
}

fn trim(mut f: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = f {
        f = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = f {
        f = rest;
    }
    f
}

/// Shows a field in an error message, shortened and made printable.
pub fn show(field: &[u8]) -> String {
    let s = String::from_utf8_lossy(&field[..field.len().min(40)]);
    let more = if field.len() > 40 { "…" } else { "" };
    format!("{s:?}{more}")
}

/// Parses a decimal integer, with an optional sign, or `None`.
pub fn parse_int(f: &[u8]) -> Option<i64> {
    let (neg, digits) = match f {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, f),
    };
    if digits.is_empty() || digits.len() > 18 {
        // longer literals (e.g. "3.0", "1e3", huge ids) go through the float path
        return parse_integral_float(f);
    }
    let mut v: i64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return parse_integral_float(f);
        }
        v = v * 10 + (b - b'0') as i64;
    }
    Some(if neg { -v } else { v })
}

/// Integers written as floats ("3.0", "1e3") are accepted when exact.
fn parse_integral_float(f: &[u8]) -> Option<i64> {
    let x: f64 = std::str::from_utf8(f).ok()?.parse().ok()?;
    (x.is_finite() && x.fract() == 0.0 && x.abs() < 9.0e15).then_some(x as i64)
}

/// Parses a float ("nan" and "inf" included; the caller decides what to do with them).
pub fn parse_f32(f: &[u8]) -> Option<f32> {
    std::str::from_utf8(f).ok()?.parse().ok()
}

/// Parses a node id field: an integer in `0..n`.
pub fn node_id(path: &Path, line: u64, col: usize, f: &[u8], n: u64) -> Result<u32> {
    match parse_int(f) {
        Some(v) if v < 0 => {
            Err(GraphError::parse(path, line, format!("column {col}: node id {v} is negative")))
        }
        Some(v) if v as u64 >= n => Err(GraphError::parse(
            path,
            line,
            format!("column {col}: node id {v} is not below the node count {n}"),
        )),
        Some(v) => Ok(v as u32),
        None => Err(GraphError::parse(path, line, format!("column {col}: {} is not an integer", show(f)))),
    }
}

/// Reads a file holding a single integer (e.g. `num-node-list.csv.gz`).
pub fn single_int(path: &Path) -> Result<i64> {
    let blocks = parse_blocks(path, "read", |b| {
        b.lines()
            .map(|(ln, l)| {
                let mut fs = fields(l);
                let f = fs.next().unwrap_or_default();
                parse_int(f)
                    .map(|v| (ln, v))
                    .ok_or_else(|| GraphError::parse(path, ln, format!("{} is not an integer", show(f))))
            })
            .collect::<Result<Vec<_>>>()
    })?;
    let all: Vec<(u64, i64)> = blocks.into_iter().flatten().collect();
    match all.as_slice() {
        [(_, v)] => Ok(*v),
        [] => Err(GraphError::parse(path, 1, "empty file, expected one integer")),
        [_, (ln, _), ..] => Err(GraphError::parse(
            path,
            *ln,
            "expected a single integer (heterogeneous graphs are not supported)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_and_floats() {
        assert_eq!(parse_int(b"42"), Some(42));
        assert_eq!(parse_int(b"-7"), Some(-7));
        assert_eq!(parse_int(b"3.0"), Some(3));
        assert_eq!(parse_int(b"3.5"), None);
        assert_eq!(parse_int(b""), None);
        assert_eq!(parse_int(b"x1"), None);
        assert_eq!(parse_int(b"nan"), None);
        assert!(parse_f32(b"nan").unwrap().is_nan());
        assert_eq!(parse_f32(b"-1.5e-3"), Some(-1.5e-3));
        assert_eq!(parse_f32(b"1,2"), None);
    }

    #[test]
    fn blocks_number_lines_across_block_boundaries() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.csv");
        let n = 3_000_000u64; // > one block
        let text: String = (0..n).map(|i| format!("{i}\n")).collect();
        std::fs::write(&p, text).unwrap();
        let lines = parse_blocks(&p, "t", |b| {
            Ok(b.lines().map(|(ln, l)| (ln, parse_int(l).unwrap())).collect::<Vec<_>>())
        })
        .unwrap();
        let flat: Vec<(u64, i64)> = lines.into_iter().flatten().collect();
        assert_eq!(flat.len() as u64, n);
        assert!(flat.iter().all(|&(ln, v)| ln == v as u64 + 1));
    }
}
