//! The project's own dataset file (`.grnd`): one memory-mappable file, fast to open.
//!
//! Layout (little-endian): a 4096-byte header, then sections each starting on a 4096-byte
//! boundary: `row_ptr` u64[N+1], `col_idx` u32[E], `labels` i32[N], `train`/`valid`/`test`
//! u32[..], `features` [N·F] of f32, f16 or bf16 (the features' entry in the section table
//! names the type; version 1 files, all f32, hold 0 there, and a file with narrow features is
//! version 2, so that a build that reads only version 1 refuses it instead of misreading
//! it). A graph with edge weights has an eighth section, `edge_weight` f32[E] aligned with
//! `col_idx`, and a graph whose edges were taken as given (`--directed`) says so in the
//! header's flags (byte 4080, bit 0): both make the file version 3, which older builds refuse
//! (they would train unweighted or on one direction without a word); every other file keeps
//! its version. The header holds magic, format version, counts, flags, the section table and
//! its own checksum. Every section is checksummed as a tree: xxh3 of each chunk
//! (64 MiB, or a whole number of feature rows), then xxh3 of the chunk hashes; chunks verify in
//! parallel. Opening maps the file and verifies; nothing is copied, so features larger than RAM
//! are paged in on use. Files are written to a temporary name, synced, then renamed.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::sync_channel;
use std::sync::Arc;

use memmap2::Mmap;
use rayon::prelude::*;
use xxhash_rust::xxh3::xxh3_64;

use crate::buf::{as_bytes, Buf, Pod};
use crate::csr::Csr;
use crate::dataset::{Dataset, Splits};
use crate::error::{GraphError, Result};
use crate::features::{FeatureData, FeatureDtype, FeatureElem, Features};
use crate::progress;

pub const MAGIC: &[u8; 8] = b"GRINNDER";
/// The format version of files with float32 features (every version-1 reader reads them).
pub const VERSION: u32 = 1;
/// The format version of files with narrow (f16, bf16) features.
pub const VERSION_NARROW: u32 = 2;
/// The format version of files with edge weights or a directed graph (any feature type).
pub const VERSION_GRAPH: u32 = 3;
/// Where the header's flags are (a u64 below the checksum; zero in every older file).
const FLAGS_AT: usize = HEADER_BYTES - 16;
/// Flag: the edges were taken as given, not made symmetric.
const FLAG_DIRECTED: u64 = 1;
const HEADER_BYTES: usize = 4096;
const ALIGN: u64 = 4096;
const CHUNK_BYTES: u64 = 64 << 20;
const SECTION_ENTRY: usize = 48;
const TABLE_AT: usize = 112;
const NAME_BYTES: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
enum Kind {
    RowPtr = 1,
    ColIdx = 2,
    Labels = 3,
    Train = 4,
    Valid = 5,
    Test = 6,
    Features = 7,
    EdgeWeight = 8,
}

/// The sections every file has, in table order; a weighted graph's file has
/// [`Kind::EdgeWeight`] after them.
const KINDS: [Kind; 7] =
    [Kind::RowPtr, Kind::ColIdx, Kind::Labels, Kind::Train, Kind::Valid, Kind::Test, Kind::Features];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::RowPtr => "row_ptr",
            Kind::ColIdx => "col_idx",
            Kind::Labels => "labels",
            Kind::Train => "train",
            Kind::Valid => "valid",
            Kind::Test => "test",
            Kind::Features => "features",
            Kind::EdgeWeight => "edge_weight",
        }
    }
    fn elem_bytes(self) -> u64 {
        match self {
            Kind::RowPtr => 8,
            _ => 4,
        }
    }
}

/// One entry of the section table.
#[derive(Clone, Copy, Debug)]
struct Section {
    kind: Kind,
    offset: u64,
    bytes: u64,
    chunk_bytes: u64,
    checksum: u64,
    /// The element type's code ([`FeatureDtype::code`]; 0 for every section but narrow features).
    dtype: u32,
}

/// How much of the file to verify when opening.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Verify {
    /// Every section's checksum: reads the whole file once.
    #[default]
    Full,
    /// Everything but the features (for feature files much larger than RAM).
    SkipFeatures,
}

/// Source of feature rows for writers, so features can be streamed (from a mapped file or a
/// generator) instead of held in memory.
pub trait FeatureSource: Sync {
    fn dim(&self) -> usize;
    fn rows(&self) -> usize;
    /// How the source's values are stored: what a writer keeps unless told otherwise.
    fn stored_dtype(&self) -> FeatureDtype {
        FeatureDtype::F32
    }
    /// Fills `out` (a whole number of rows) with rows starting at `row0`.
    fn fill(&self, row0: usize, out: &mut [f32]) -> Result<()>;
}

impl FeatureSource for Features {
    fn dim(&self) -> usize {
        self.dim
    }
    fn rows(&self) -> usize {
        self.num_rows()
    }
    fn stored_dtype(&self) -> FeatureDtype {
        self.dtype()
    }
    fn fill(&self, row0: usize, out: &mut [f32]) -> Result<()> {
        self.data.read_into(row0 * self.dim, out).map_err(|e| crate::error::GraphError::io("features", e))
    }
}

/// Tree checksum of `data` in chunks of `chunk_bytes`.
fn tree_hash(data: &[u8], chunk_bytes: u64) -> u64 {
    let leaves: Vec<u64> = data.par_chunks(chunk_bytes.max(1) as usize).map(xxh3_64).collect();
    xxh3_64(as_bytes(&leaves))
}

struct Out {
    path: PathBuf,
    w: BufWriter<File>,
    pos: u64,
}

impl Out {
    fn write(&mut self, b: &[u8]) -> Result<()> {
        self.w.write_all(b).map_err(|e| GraphError::io(&self.path, e))?;
        self.pos += b.len() as u64;
        Ok(())
    }
    fn pad(&mut self) -> Result<()> {
        let pad = (ALIGN - self.pos % ALIGN) % ALIGN;
        self.write(&vec![0u8; pad as usize])
    }
    fn section<T: Pod>(&mut self, kind: Kind, data: &[T]) -> Result<Section> {
        self.pad()?;
        let bytes = as_bytes(data);
        let s = Section {
            kind,
            offset: self.pos,
            bytes: bytes.len() as u64,
            chunk_bytes: CHUNK_BYTES,
            checksum: tree_hash(bytes, CHUNK_BYTES),
            dtype: 0,
        };
        for piece in bytes.chunks(CHUNK_BYTES as usize) {
            self.write(piece)?;
        }
        Ok(s)
    }
}

/// Incremental xxh3 of consecutive `chunk_bytes` pieces of a stream: the leaves of a
/// section's tree checksum, computed while the section is written.
struct Leaves {
    chunk_bytes: u64,
    cur: xxhash_rust::xxh3::Xxh3,
    cur_len: u64,
    leaves: Vec<u64>,
}

impl Leaves {
    fn new(chunk_bytes: u64) -> Self {
        Leaves { chunk_bytes, cur: xxhash_rust::xxh3::Xxh3::new(), cur_len: 0, leaves: Vec::new() }
    }
    fn update(&mut self, mut b: &[u8]) {
        while !b.is_empty() {
            let take = ((self.chunk_bytes - self.cur_len) as usize).min(b.len());
            self.cur.update(&b[..take]);
            self.cur_len += take as u64;
            b = &b[take..];
            if self.cur_len == self.chunk_bytes {
                self.leaves.push(self.cur.digest());
                self.cur.reset();
                self.cur_len = 0;
            }
        }
    }
    fn finish(mut self) -> u64 {
        if self.cur_len > 0 {
            self.leaves.push(self.cur.digest());
        }
        xxh3_64(as_bytes(&self.leaves))
    }
}

/// Writes a native file in one forward pass: the column indices first, streamed in pieces
/// (so a generator never holds them twice), then everything else. The section table records
/// where each section landed, so file order need not be table order.
pub struct NativeWriter {
    path: PathBuf,
    /// The file being written, under an unpredictable name beside `path`; removed if the
    /// writer is dropped before [`NativeWriter::finish`].
    tmp: super::files::Temp,
    out: Out,
    name: String,
    num_nodes: u64,
    col: Option<(u64, Leaves)>,
    written_cols: u64,
    /// How the features are stored (`None`: as the source stores them).
    feature_dtype: Option<FeatureDtype>,
    /// The edges were taken as given (the header's directed flag).
    directed: bool,
}

impl NativeWriter {
    /// Starts `path`, written under a new unpredictable name beside it (`.NAME.XXXXXX`, created
    /// with `O_EXCL`) until [`NativeWriter::finish`] renames it into place.
    pub fn create(path: &Path, name: &str, num_nodes: u64) -> Result<NativeWriter> {
        crate::csr::check_node_count(num_nodes)?;
        super::files::check_replaceable(path).map_err(|e| GraphError::io(path, e))?;
        let tmp = super::files::temp_for(path).map_err(|e| GraphError::io(path, e))?;
        let file = tmp.as_file().try_clone().map_err(|e| GraphError::io(tmp.path(), e))?;
        let mut out =
            Out { path: tmp.path().to_path_buf(), w: BufWriter::with_capacity(8 << 20, file), pos: 0 };
        out.write(&[0u8; HEADER_BYTES])?;
        let col = Some((out.pos, Leaves::new(CHUNK_BYTES)));
        Ok(NativeWriter {
            path: path.to_path_buf(),
            tmp,
            out,
            name: name.to_string(),
            num_nodes,
            col,
            written_cols: 0,
            feature_dtype: None,
            directed: false,
        })
    }

    /// Stores the features as `dtype` (values rounded to nearest where narrower than the
    /// source's) instead of as the source stores them.
    pub fn with_feature_dtype(mut self, dtype: Option<FeatureDtype>) -> NativeWriter {
        self.feature_dtype = dtype;
        self
    }

    /// Marks the graph as directed (its edges taken as given): the file is then version 3.
    pub fn with_directed(mut self, directed: bool) -> NativeWriter {
        self.directed = directed;
        self
    }

    /// Appends column indices (rows in order).
    pub fn push_cols(&mut self, cols: &[u32]) -> Result<()> {
        let (_, leaves) = self.col.as_mut().expect("columns come before finish");
        let b = as_bytes(cols);
        leaves.update(b);
        self.written_cols += cols.len() as u64;
        self.out.write(b)
    }

    /// Writes `graph`'s columns, then [`NativeWriter::finish`]es with the rest.
    pub fn finish_graph(mut self, graph: &Csr, rest: Rest<'_>) -> Result<()> {
        for piece in graph.col_idx().chunks(CHUNK_BYTES as usize / 4) {
            self.push_cols(piece)?;
        }
        self.finish(graph.row_ptr(), rest)
    }

    /// Writes the remaining sections and the header, syncs, and renames into place.
    pub fn finish(mut self, row_ptr: &[u64], rest: Rest<'_>) -> Result<()> {
        let Rest { labels, num_classes, splits, features, edge_weight } = rest;
        let n = self.num_nodes as usize;
        assert_eq!(row_ptr.len(), n + 1, "row_ptr has N + 1 entries");
        assert_eq!(row_ptr[n], self.written_cols, "row_ptr ends at the number of columns written");
        assert_eq!(labels.len(), n, "one label per node");
        assert_eq!(features.rows(), n, "one feature row per node");
        let (col_at, leaves) = self.col.take().expect("finish once");
        let col = Section {
            kind: Kind::ColIdx,
            offset: col_at,
            bytes: self.written_cols * 4,
            chunk_bytes: CHUNK_BYTES,
            checksum: leaves.finish(),
            dtype: 0,
        };
        let out = &mut self.out;
        let mut sections = vec![out.section(Kind::RowPtr, row_ptr)?, col, out.section(Kind::Labels, labels)?];
        for (kind, ids) in
            [(Kind::Train, &splits.train), (Kind::Valid, &splits.valid), (Kind::Test, &splits.test)]
        {
            sections.push(out.section(kind, ids)?);
        }
        let dtype = self.feature_dtype.unwrap_or(features.stored_dtype());
        sections.push(match dtype {
            FeatureDtype::F32 => write_features::<f32>(out, features)?,
            FeatureDtype::F16 => write_features::<half::f16>(out, features)?,
            FeatureDtype::Bf16 => write_features::<half::bf16>(out, features)?,
        });
        if let Some(w) = edge_weight {
            assert_eq!(w.len() as u64, self.written_cols, "one weight per column written");
            sections.push(out.section(Kind::EdgeWeight, w)?);
        }
        let tmp = out.path.clone();
        out.w.flush().map_err(|e| GraphError::io(&tmp, e))?;
        let mut file = self.out.w.into_inner().map_err(|e| GraphError::io(&tmp, e.into_error()))?;
        let header = encode_header(
            &self.name,
            [self.num_nodes, self.written_cols, features.dim() as u64],
            num_classes,
            self.directed,
            &sections,
        );
        file.seek(SeekFrom::Start(0)).map_err(|e| GraphError::io(&tmp, e))?;
        file.write_all(&header).map_err(|e| GraphError::io(&tmp, e))?;
        file.sync_all().map_err(|e| GraphError::io(&tmp, e))?;
        self.tmp.persist(&self.path).map_err(|e| GraphError::io(&self.path, e))
    }
}

/// What a file holds besides its structure (what [`NativeWriter::finish`] writes after the
/// columns).
pub struct Rest<'a> {
    pub labels: &'a [i32],
    pub num_classes: u32,
    pub splits: &'a Splits,
    pub features: &'a dyn FeatureSource,
    /// One weight per column written (`None`: an unweighted graph, no section).
    pub edge_weight: Option<&'a [f32]>,
}

/// Writes an unweighted, undirected dataset whose features come from `features` (streamed in
/// parallel batches).
pub fn write(
    path: &Path,
    name: &str,
    graph: &Csr,
    labels: &[i32],
    num_classes: u32,
    splits: &Splits,
    features: &dyn FeatureSource,
) -> Result<()> {
    let rest = Rest { labels, num_classes, splits, features, edge_weight: None };
    NativeWriter::create(path, name, graph.num_nodes() as u64)?.finish_graph(graph, rest)
}

/// The features' section, its values stored as `E` (converted from the source's float32 rows
/// as they are filled, on every core).
fn write_features<E: FeatureElem>(out: &mut Out, src: &dyn FeatureSource) -> Result<Section> {
    out.pad()?;
    let dim = src.dim();
    let row_bytes = (dim * std::mem::size_of::<E>()) as u64;
    let rows_per_chunk = (CHUNK_BYTES / row_bytes).max(1) as usize;
    let chunk_bytes = rows_per_chunk as u64 * row_bytes;
    let n = src.rows();
    let offset = out.pos;
    let chunks: Vec<std::ops::Range<usize>> = (0..n.div_ceil(rows_per_chunk))
        .map(|c| c * rows_per_chunk..((c + 1) * rows_per_chunk).min(n))
        .collect();
    let batch = rayon::current_num_threads().max(2);
    let pb = progress::bar(n as u64 * row_bytes, "features", true);
    let mut leaves = Vec::with_capacity(chunks.len());
    // the writer thread drains filled batches while the next batch is produced
    let (tx, rx) = sync_channel::<Vec<Vec<E>>>(1);
    std::thread::scope(|s| -> Result<()> {
        let writer = s.spawn(move || -> Result<()> {
            for bufs in rx {
                for b in bufs {
                    out.write(as_bytes(&b))?;
                    pb.inc(std::mem::size_of_val(b.as_slice()) as u64);
                }
            }
            pb.finish_and_clear();
            Ok(())
        });
        for group in chunks.chunks(batch) {
            let filled: Vec<Result<(Vec<E>, u64)>> = group
                .par_iter()
                .map(|r| {
                    let mut buf = vec![0f32; r.len() * dim];
                    src.fill(r.start, &mut buf)?;
                    // (for f32 the identity, collected in place)
                    let buf: Vec<E> = buf.into_iter().map(E::from_f32).collect();
                    let h = xxh3_64(as_bytes(&buf));
                    Ok((buf, h))
                })
                .collect();
            let mut bufs = Vec::with_capacity(filled.len());
            for f in filled {
                let (b, h) = f?;
                leaves.push(h);
                bufs.push(b);
            }
            if tx.send(bufs).is_err() {
                break;
            }
        }
        drop(tx);
        writer.join().expect("writer thread panicked")
    })?;
    Ok(Section {
        kind: Kind::Features,
        offset,
        bytes: n as u64 * row_bytes,
        chunk_bytes,
        checksum: xxh3_64(as_bytes(&leaves)),
        dtype: E::DTYPE.code(),
    })
}

/// The header of a file of `[nodes, edges, feature columns]` (see the module docs for the
/// version each file gets).
fn encode_header(
    name: &str,
    [n, e, dim]: [u64; 3],
    classes: u32,
    directed: bool,
    sections: &[Section],
) -> Vec<u8> {
    let mut h = vec![0u8; HEADER_BYTES];
    h[..8].copy_from_slice(MAGIC);
    let narrow = sections.iter().any(|s| s.dtype != 0);
    let graph = directed || sections.len() > KINDS.len();
    let version = if graph {
        VERSION_GRAPH
    } else if narrow {
        VERSION_NARROW
    } else {
        VERSION
    };
    h[8..12].copy_from_slice(&version.to_le_bytes());
    h[FLAGS_AT..FLAGS_AT + 8].copy_from_slice(&(if directed { FLAG_DIRECTED } else { 0 }).to_le_bytes());
    h[12..16].copy_from_slice(&(HEADER_BYTES as u32).to_le_bytes());
    h[16..24].copy_from_slice(&n.to_le_bytes());
    h[24..32].copy_from_slice(&e.to_le_bytes());
    h[32..40].copy_from_slice(&dim.to_le_bytes());
    h[40..44].copy_from_slice(&classes.to_le_bytes());
    h[44..48].copy_from_slice(&(sections.len() as u32).to_le_bytes());
    let name = name.as_bytes();
    let k = name.len().min(NAME_BYTES);
    h[48..48 + k].copy_from_slice(&name[..k]);
    for (i, s) in sections.iter().enumerate() {
        let at = TABLE_AT + i * SECTION_ENTRY;
        h[at..at + 4].copy_from_slice(&(s.kind as u32).to_le_bytes());
        h[at + 4..at + 8].copy_from_slice(&s.dtype.to_le_bytes());
        h[at + 8..at + 16].copy_from_slice(&s.offset.to_le_bytes());
        h[at + 16..at + 24].copy_from_slice(&s.bytes.to_le_bytes());
        h[at + 24..at + 32].copy_from_slice(&s.chunk_bytes.to_le_bytes());
        h[at + 32..at + 40].copy_from_slice(&s.checksum.to_le_bytes());
    }
    let sum = xxh3_64(&h[..HEADER_BYTES - 8]);
    h[HEADER_BYTES - 8..].copy_from_slice(&sum.to_le_bytes());
    h
}

/// Counts and name read from a native file's header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub name: String,
    pub num_nodes: u64,
    pub num_edges: u64,
    pub feat_dim: u64,
    pub num_classes: u32,
    /// How the features are stored.
    pub feature_dtype: FeatureDtype,
    /// The edges were taken as given (`--directed`), not made symmetric.
    pub directed: bool,
    /// The file holds edge weights.
    pub weighted: bool,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn decode_header(path: &Path, b: &[u8], file_len: u64) -> Result<(Header, Vec<Section>)> {
    let err = |off: usize, msg: String| GraphError::format(path, off as u64, msg);
    if b.len() < HEADER_BYTES {
        return Err(err(
            0,
            format!("file of {} bytes is shorter than the {HEADER_BYTES}-byte header", b.len()),
        ));
    }
    if &b[..8] != MAGIC {
        return Err(err(0, "not a grinnder dataset (bad magic)".into()));
    }
    let version = u32_at(b, 8);
    if ![VERSION, VERSION_NARROW, VERSION_GRAPH].contains(&version) {
        return Err(err(
            8,
            format!("format version {version}, this build reads versions {VERSION} to {VERSION_GRAPH}"),
        ));
    }
    let sum = u64_at(b, HEADER_BYTES - 8);
    if xxh3_64(&b[..HEADER_BYTES - 8]) != sum {
        return Err(err(HEADER_BYTES - 8, "header checksum mismatch: the header is corrupted".into()));
    }
    let name_raw = &b[48..48 + NAME_BYTES];
    let name_len = name_raw.iter().position(|&c| c == 0).unwrap_or(NAME_BYTES);
    let header = Header {
        name: String::from_utf8_lossy(&name_raw[..name_len]).into_owned(),
        num_nodes: u64_at(b, 16),
        num_edges: u64_at(b, 24),
        feat_dim: u64_at(b, 32),
        num_classes: u32_at(b, 40),
        feature_dtype: FeatureDtype::F32,
        directed: u64_at(b, FLAGS_AT) & FLAG_DIRECTED != 0,
        weighted: false,
    };
    let mut header = header;
    crate::csr::check_node_count(header.num_nodes)?;
    let flags = u64_at(b, FLAGS_AT);
    if flags & !FLAG_DIRECTED != 0 || (flags != 0 && version != VERSION_GRAPH) {
        return Err(err(FLAGS_AT, format!("flags {flags:#x} this version does not have")));
    }
    let count = u32_at(b, 44) as usize;
    // a weighted graph's file (version 3) has the edge weights' section too
    let kinds: &[Kind] = &[&KINDS[..], &[Kind::EdgeWeight]].concat();
    let expected =
        if version == VERSION_GRAPH { [KINDS.len(), kinds.len()].to_vec() } else { vec![KINDS.len()] };
    if !expected.contains(&count) {
        return Err(err(44, format!("{count} sections, expected {}", KINDS.len())));
    }
    header.weighted = count > KINDS.len();
    let mut sections = Vec::with_capacity(count);
    for (i, &kind) in kinds[..count].iter().enumerate() {
        let at = TABLE_AT + i * SECTION_ENTRY;
        let s = Section {
            kind,
            offset: u64_at(b, at + 8),
            bytes: u64_at(b, at + 16),
            chunk_bytes: u64_at(b, at + 24),
            checksum: u64_at(b, at + 32),
            dtype: u32_at(b, at + 4),
        };
        if u32_at(b, at) != kind as u32 {
            return Err(err(at, format!("section {i} should be {}", kind.name())));
        }
        // an element type only where the version has one: the features of a version-2 or 3 file
        let dtype = match (kind, version) {
            (Kind::Features, VERSION_NARROW) => {
                FeatureDtype::from_code(s.dtype).filter(|d| *d != FeatureDtype::F32)
            }
            (Kind::Features, VERSION_GRAPH) => FeatureDtype::from_code(s.dtype),
            _ => (s.dtype == 0).then_some(FeatureDtype::F32),
        };
        let Some(dtype) = dtype else {
            return Err(err(
                at + 4,
                format!("section {} has element type {}, not one this version has", kind.name(), s.dtype),
            ));
        };
        if kind == Kind::Features {
            header.feature_dtype = dtype;
        }
        let elem_bytes = if kind == Kind::Features { dtype.bytes() as u64 } else { kind.elem_bytes() };
        let expected = match kind {
            Kind::RowPtr => Some((header.num_nodes + 1) * 8),
            Kind::ColIdx => Some(header.num_edges * 4),
            Kind::Labels => Some(header.num_nodes * 4),
            Kind::EdgeWeight => Some(header.num_edges * 4),
            Kind::Features => {
                header.num_nodes.checked_mul(header.feat_dim).and_then(|x| x.checked_mul(elem_bytes))
            }
            _ => None,
        };
        let in_file = s.offset.checked_add(s.bytes).is_some_and(|end| end <= file_len);
        if s.offset % ALIGN != 0
            || !in_file
            || s.chunk_bytes == 0
            || s.bytes % elem_bytes != 0
            || expected.is_some_and(|x| x != s.bytes)
        {
            return Err(err(
                at,
                format!(
                    "section {} (offset {}, {} bytes) does not fit the header's counts or the file of {file_len} bytes (truncated?)",
                    kind.name(),
                    s.offset,
                    s.bytes
                ),
            ));
        }
        sections.push(s);
    }
    Ok((header, sections))
}

/// Reads only the header (cheap: for `info` on huge files).
pub fn read_header(path: &Path) -> Result<Header> {
    let map = map(path)?;
    Ok(decode_header(path, &map, map.len() as u64)?.0)
}

fn map(path: &Path) -> Result<Mmap> {
    Ok(map_file(path)?.1)
}

/// The file, and its read-only mapping from its first byte.
fn map_file(path: &Path) -> Result<(Arc<std::fs::File>, Mmap)> {
    let file = super::files::open_input(path).map_err(|e| GraphError::io(path, e))?;
    // SAFETY: read-only mapping; the file must not be truncated by another process while
    // mapped (ARCHITECTURE.md documents this for all mapped inputs).
    let map = unsafe { Mmap::map(&file) }.map_err(|e| GraphError::io(path, e))?;
    Ok((Arc::new(file), map))
}

/// How much of the features one verifying thread holds before handing the pages back.
const VERIFY_PIECE_BYTES: usize = 4 << 20;

/// Opens a native dataset: maps it, verifies checksums (per `verify`) and every structural
/// invariant, and returns views into the mapping.
pub fn open(path: &Path, verify: Verify) -> Result<Dataset> {
    let (file, map) = map_file(path)?;
    let map = Arc::new(map);
    let (header, sections) = decode_header(path, &map, map.len() as u64)?;
    // read ahead what is read whole (the features are read a piece at a time, and may be
    // larger than memory)
    #[cfg(target_os = "linux")]
    for s in sections.iter().filter(|s| s.kind != Kind::Features) {
        let _ = map.advise_range(memmap2::Advice::WillNeed, s.offset as usize, s.bytes as usize);
    }
    let to_check: Vec<&Section> =
        sections.iter().filter(|s| verify == Verify::Full || s.kind != Kind::Features).collect();
    let total: u64 = to_check.iter().map(|s| s.bytes).sum();
    let pb = progress::bar(total, "verify", true);
    for s in to_check {
        let data = &map[s.offset as usize..(s.offset + s.bytes) as usize];
        let chunk = s.chunk_bytes as usize;
        let features = s.kind == Kind::Features;
        let leaves: Vec<u64> = data
            .par_chunks(chunk)
            .enumerate()
            .map(|(i, c)| {
                if !features {
                    pb.inc(c.len() as u64);
                    return xxh3_64(c);
                }
                // the features are read a partition at a time later, and may exceed the memory
                // budget: hashed a few MiB at a time (the same hash as at once), each piece
                // then leaves the resident set
                let mut h = xxhash_rust::xxh3::Xxh3::new();
                for (j, piece) in c.chunks(VERIFY_PIECE_BYTES).enumerate() {
                    h.update(piece);
                    let at = s.offset as usize + i * chunk + j * VERIFY_PIECE_BYTES;
                    // SAFETY: `map` is this file's read-only mapping, never written through
                    unsafe { crate::buf::release_file_pages(&map, at..at + piece.len()) };
                    pb.inc(piece.len() as u64);
                }
                h.digest()
            })
            .collect();
        if xxh3_64(as_bytes(&leaves)) != s.checksum {
            return Err(GraphError::format(
                path,
                s.offset,
                format!(
                    "checksum mismatch in section {} (bytes {}..{}): the file is corrupted",
                    s.kind.name(),
                    s.offset,
                    s.offset + s.bytes
                ),
            ));
        }
    }
    pb.finish_and_clear();
    let view = |i: usize, elem: u64| (sections[i].offset as usize, (sections[i].bytes / elem) as usize);
    fn buf<T: Pod>(path: &Path, map: &Arc<Mmap>, (off, len): (usize, usize)) -> Result<Buf<T>> {
        Buf::mapped(map.clone(), off, len)
            .ok_or_else(|| GraphError::format(path, off as u64, "misaligned section"))
    }
    let graph = Csr::from_parts(buf(path, &map, view(0, 8))?, buf(path, &map, view(1, 4))?)
        .map_err(|m| GraphError::invalid(path, format!("invalid graph structure: {m}")))?;
    let ds = Dataset {
        name: header.name.clone(),
        graph,
        // feature rows are read with pread (a partition's rows at a time: never resident)
        features: Features {
            dim: header.feat_dim as usize,
            data: match header.feature_dtype {
                FeatureDtype::F32 => FeatureData::F32(buf(path, &map, view(6, 4))?.read_through(file)),
                FeatureDtype::F16 => FeatureData::F16(buf(path, &map, view(6, 2))?.read_through(file)),
                FeatureDtype::Bf16 => FeatureData::Bf16(buf(path, &map, view(6, 2))?.read_through(file)),
            },
        },
        labels: buf(path, &map, view(2, 4))?,
        num_classes: header.num_classes,
        splits: Splits {
            train: buf(path, &map, view(3, 4))?,
            valid: buf(path, &map, view(4, 4))?,
            test: buf(path, &map, view(5, 4))?,
        },
        directed: header.directed,
        edge_weight: if header.weighted { Some(buf(path, &map, view(7, 4))?) } else { None },
    };
    ds.validate(path)?;
    Ok(ds)
}

/// Writes an in-memory dataset (its features stored as they are).
pub fn save(ds: &Dataset, path: &Path) -> Result<()> {
    save_as(ds, path, None)
}

/// [`save`] with the features stored as `dtype` (`None`: as they are).
pub fn save_as(ds: &Dataset, path: &Path, dtype: Option<FeatureDtype>) -> Result<()> {
    let rest = Rest {
        labels: &ds.labels,
        num_classes: ds.num_classes,
        splits: &ds.splits,
        features: &ds.features,
        edge_weight: ds.edge_weight.as_deref(),
    };
    NativeWriter::create(path, &ds.name, ds.graph.num_nodes() as u64)?
        .with_feature_dtype(dtype)
        .with_directed(ds.directed)
        .finish_graph(&ds.graph, rest)
}
