//! OGB's binary node-property layout, the one ogbn-papers100M ships in (OGB marks the dataset
//! `binary` and reads it with `read_binary_graph_raw` and `NodePropPredDataset`):
//!
//! ```text
//! <dir>/raw/data.npz           np.savez_compressed of these arrays:
//!     edge_index.npy           integers [2, E]  source row, target row (each undirected edge once)
//!     node_feat.npy            float16, float32 or float64 [N, F]
//!     num_nodes_list.npy       integers [1]     N
//!     num_edges_list.npy       integers [1]     E
//!     (node_year.npy, edge_feat.npy and any other node_* / edge_* array: ignored)
//! <dir>/raw/node-label.npz     node_label.npy   floats [N, 1] or [N]  (NaN, or -1: no label)
//! <dir>/split/<name>/{train,valid,test}.csv.gz  one node id per line, as in the CSV layout
//! ```
//! It is [`super::Format::Ogb`] like the CSV layout (a folder with `raw/data.npz` and no
//! `raw/edge.csv.gz`), found under the same names (`ogbn-papers100M` → `ogbn_papers100M`), and
//! loads into the same dataset as the CSV layout of the same graph.
//!
//! Members are streamed ([`super::npz`]): neither archive is held in memory, and the features
//! are decompressed straight into the dataset's feature array (owned: the archive cannot be
//! mapped), converted to f32 on the way; `grinnder convert` makes a native file whose features
//! are mapped instead. Fortran-ordered (column-major) members are read in storage order and
//! each element put in its row-major place. Every error names the archive and the member.

use std::path::Path;

use super::npy::DType;
use super::npz::{floats_into, Npz, NpzWriter};
use super::{LoadOptions, MemoryLimit};
use crate::buf::{as_bytes, as_bytes_mut, Buf};
use crate::csr::Csr;
use crate::dataset::{check_non_finite, Dataset, Features, NonFinite, NO_LABEL};
use crate::error::{GraphError, Result};
use crate::features::{FeatureData, FeatureElem};

/// What `raw/data.npz` must hold, for messages.
const DATA_LAYOUT: &str = "OGB's binary layout: raw/data.npz with edge_index.npy [2, E], \
     node_feat.npy [N, F], num_nodes_list.npy [1] and num_edges_list.npy [1]; raw/node-label.npz \
     with node_label.npy [N, 1]; split/<name>/{train,valid,test}.csv.gz";

/// Loads an OGB binary-layout folder (`path` found as [`super::ogb::resolve_dir`] finds it).
pub fn load(path: &Path, opts: &LoadOptions) -> Result<Dataset> {
    let dir = super::ogb::resolve_dir(path).filter(|d| super::ogb::is_npz_dir(d)).ok_or_else(|| {
        GraphError::invalid(
            path,
            format!("no raw/data.npz here or under OGB's folder naming; expected {DATA_LAYOUT}"),
        )
    })?;
    let data_path = dir.join("raw/data.npz");
    let mut z = Npz::open(&data_path)?;
    let n = single(&mut z, "num_nodes_list")?;
    let origin = super::npz::member_origin(&data_path, "num_nodes_list.npy");
    if n <= 0 {
        return Err(GraphError::invalid(&origin, format!("node count {n} must be positive")));
    }
    crate::csr::check_node_count(n as u64)?;
    let n = n as u64;
    let e = single(&mut z, "num_edges_list")?;
    let limit = opts.memory_limit.as_ref();
    let features = read_features(&mut z, n, opts.non_finite, limit)?;
    let (src, dst) = read_edges(&mut z, n, e, features.data.bytes() as u64, limit)?;
    drop(z);
    let (labels, num_classes) = read_labels(&dir.join("raw/node-label.npz"), n)?;
    let splits = super::ogb::load_splits(&dir, opts.split.as_deref(), n)?;
    let spin = crate::progress::spinner("csr");
    let graph = Csr::from_edges(n, &src, &dst, opts.build)?;
    spin.finish_and_clear();
    drop((src, dst));
    super::ogb::checked(&dir, graph, features, (labels, num_classes), splits, opts)
}

/// The one number of a `[1]` array (`num_nodes_list`, `num_edges_list`).
fn single(z: &mut Npz, name: &str) -> Result<i64> {
    let mut m = z.member(name, DATA_LAYOUT)?;
    if m.len() != 1 || m.shape.len() > 1 {
        return Err(m.invalid(format!(
            "shape {:?}: expected one number (a node-property dataset is one graph)",
            m.shape
        )));
    }
    let mut value = None;
    m.for_each_int(&mut |_, v| {
        value = v;
        Ok(())
    })?;
    let value = value.ok_or_else(|| m.invalid("NaN is not a count"))?;
    m.finish()?;
    Ok(value)
}

/// `node_feat`, decompressed straight into the feature array: float16 kept as float16 (as
/// MAG240M ships its features), float32 and float64 as float32; read as is where the stored
/// type is kept and in C order, converted (and transposed, where Fortran-ordered) otherwise.
fn read_features(z: &mut Npz, n: u64, policy: NonFinite, limit: Option<&MemoryLimit>) -> Result<Features> {
    let m = z.member("node_feat", DATA_LAYOUT)?;
    m.expect_shape(&["nodes", "features"])?;
    let (rows, dim) = (m.shape[0], m.shape[1] as usize);
    if rows != n {
        return Err(m.invalid(format!("{rows} feature rows, but num_nodes_list.npy says {n} nodes")));
    }
    if dim == 0 {
        return Err(m.invalid("zero feature columns"));
    }
    let dtype = m.dtype;
    if !matches!(dtype, DType::F16 | DType::F32 | DType::F64) {
        return Err(m.invalid(format!("expected float16, float32 or float64 features, found {dtype:?}")));
    }
    let origin = m.origin().to_path_buf();
    let elem = if dtype == DType::F16 { 2 } else { 4 };
    let what = format!("node_feat's {n} × {dim} values");
    MemoryLimit::check(limit, n.saturating_mul(dim as u64).saturating_mul(elem), &what, &origin)?;
    let data: FeatureData = if dtype == DType::F16 {
        let data: Vec<half::f16> = read_feature_values(m, n, dim, |b, out| {
            for (o, b) in out.iter_mut().zip(b.chunks_exact(2)) {
                *o = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]]));
            }
        })?;
        check_non_finite(&origin, &data, dim, policy)?;
        Buf::Owned(data).into()
    } else {
        let data: Vec<f32> = read_feature_values(m, n, dim, |b, out| floats_into(dtype, b, out))?;
        check_non_finite(&origin, &data, dim, policy)?;
        data.into()
    };
    Ok(Features { dim, data })
}

/// The member's `n × dim` values as `E`: its bytes read into them as they are where it stores
/// `E` in C order, else each piece converted by `conv` (and put in row-major order where the
/// member is Fortran-ordered).
fn read_feature_values<E: FeatureElem + Default>(
    mut m: super::npz::Member<'_>,
    n: u64,
    dim: usize,
    conv: impl Fn(&[u8], &mut [E]),
) -> Result<Vec<E>> {
    let dtype = m.dtype;
    let mut data = vec![E::default(); n as usize * dim];
    let pb = crate::progress::bar(m.len() * dtype.size() as u64, "features", true);
    if dtype.size() == std::mem::size_of::<E>() && !m.fortran {
        m.read_all_into(as_bytes_mut(&mut data), &mut |k| pb.inc(k as u64))?;
    } else {
        // rows × columns stored column by column when Fortran-ordered
        let col_major = m.fortran.then_some((n, dim as u64));
        let mut piece = Vec::new();
        m.for_each_piece(&mut |first, bytes| {
            let k = bytes.len() / dtype.size();
            match col_major {
                None => conv(bytes, &mut data[first as usize..first as usize + k]),
                Some((r, c)) => {
                    piece.resize(k, E::default());
                    conv(bytes, &mut piece);
                    for (i, &x) in piece.iter().enumerate() {
                        let s = first + i as u64;
                        data[((s % r) * c + s / r) as usize] = x;
                    }
                }
            }
            pb.inc(bytes.len() as u64);
            Ok(())
        })?;
    }
    m.finish()?;
    pb.finish_and_clear();
    Ok(data)
}

/// `edge_index` as u32 sources and targets, each id checked in `0..n`.
/// `held`: the bytes already read (the features), which the edges join under `limit`.
fn read_edges(
    z: &mut Npz,
    n: u64,
    e: i64,
    held: u64,
    limit: Option<&MemoryLimit>,
) -> Result<(Vec<u32>, Vec<u32>)> {
    let mut m = z.member("edge_index", DATA_LAYOUT)?;
    m.expect_shape(&["2", "edges"])?;
    if m.shape[0] != 2 {
        return Err(m.invalid(format!("expected shape [2, E], found {:?}", m.shape)));
    }
    let edges = m.shape[1];
    if edges as i64 != e {
        return Err(m.invalid(format!("{edges} edges, but num_edges_list.npy says {e}")));
    }
    let what = format!("edge_index's {edges} edges, with the features read before them,");
    MemoryLimit::check(limit, held.saturating_add(edges.saturating_mul(8)), &what, m.origin())?;
    let fortran = m.fortran;
    let (mut src, mut dst) = (vec![0u32; edges as usize], vec![0u32; edges as usize]);
    let origin = m.origin().to_path_buf();
    m.for_each_int(&mut |k, v| {
        // C order: the sources, then the targets; Fortran order: (source, target) pairs
        let (row, col) = if fortran { (k % 2, k / 2) } else { (k / edges, k % edges) };
        let id = match v {
            Some(v) if (0..n as i64).contains(&v) => v as u32,
            Some(v) => {
                return Err(GraphError::invalid(
                    &origin,
                    format!("edge {col}: node id {v} is outside 0..{n}"),
                ))
            }
            None => return Err(GraphError::invalid(&origin, format!("edge {col}: node id is NaN"))),
        };
        if row == 0 {
            src[col as usize] = id;
        } else {
            dst[col as usize] = id;
        }
        Ok(())
    })?;
    m.finish()?;
    Ok((src, dst))
}

/// `node_label` of `raw/node-label.npz`: NaN (or -1) is no label; classes are one more than
/// the largest label.
fn read_labels(path: &Path, n: u64) -> Result<(Vec<i32>, u32)> {
    let mut z = Npz::open(path)?;
    let mut m = z.member("node_label", DATA_LAYOUT)?;
    let one_col = m.shape.len() == 2 && m.shape[1] == 1;
    if m.shape.first() != Some(&n) || !(m.shape.len() == 1 || one_col) {
        return Err(m.invalid(format!("expected shape [{n}, 1] (one label per node), found {:?}", m.shape)));
    }
    let origin = m.origin().to_path_buf();
    let mut labels = Vec::with_capacity(n as usize);
    m.for_each_int(&mut |k, v| {
        labels.push(match v {
            None | Some(-1) => NO_LABEL,
            Some(y) if (0..i32::MAX as i64).contains(&y) => y as i32,
            Some(y) => {
                return Err(GraphError::invalid(
                    &origin,
                    format!("label of node {k} is {y}, out of range (0 or more)"),
                ))
            }
        });
        Ok(())
    })?;
    m.finish()?;
    let classes = labels.iter().copied().max().unwrap_or(-1) + 1;
    Ok((labels, classes.max(0) as u32))
}

/// Writes `ds` in OGB's binary layout as OGB's own files are written (`np.savez_compressed`:
/// edges as int64 `[2, E]`, each undirected edge once; features float32; labels float64
/// `[N, 1]` with NaN for none), with the split named `split` as CSV.
pub fn write(ds: &Dataset, dir: &Path, split: &str) -> Result<()> {
    let raw = dir.join("raw");
    super::files::create_folder(&raw).map_err(|e| GraphError::io(&raw, e))?;
    let g = &ds.graph;
    let mut e = 0u64;
    super::ogb::edges_once::<GraphError>(g, &mut |_, _| {
        e += 1;
        Ok(())
    })?;
    let (n, dim) = (ds.num_nodes() as u64, ds.features.dim);
    let mut w = NpzWriter::create(&raw.join("data.npz"), true)?;
    w.begin("edge_index", DType::I64, &[2, e])?;
    for side in 0..2 {
        let mut buf: Vec<i64> = Vec::with_capacity(1 << 16);
        super::ogb::edges_once(g, &mut |u, v| {
            buf.push(if side == 0 { u } else { v } as i64);
            if buf.len() == buf.capacity() {
                w.write(&buf)?;
                buf.clear();
            }
            Ok(())
        })?;
        w.write(&buf)?;
    }
    // float16 as float16 (numpy has it), float32 as is, bfloat16 widened to float32
    let f = &ds.features.data;
    let kept = match f {
        FeatureData::F16(b) => Some((DType::F16, as_bytes(b))),
        FeatureData::F32(b) => Some((DType::F32, as_bytes(b))),
        FeatureData::Bf16(_) => None,
    };
    w.begin("node_feat", kept.map_or(DType::F32, |k| k.0), &[n, dim as u64])?;
    match kept {
        Some((_, bytes)) => {
            for piece in bytes.chunks(4 << 20) {
                w.write(piece)?;
            }
        }
        None => {
            let per = ((1 << 20) / dim.max(1)).max(1) * dim;
            let mut rows = Vec::with_capacity(per.min(f.len()));
            for start in (0..f.len()).step_by(per) {
                rows.resize(per.min(f.len() - start), 0f32);
                f.read_into(start, &mut rows).map_err(|e| GraphError::io(&raw, e))?;
                w.write(&rows)?;
            }
        }
    }
    w.array("num_nodes_list", DType::I64, &[1], &[n as i64])?;
    w.array("num_edges_list", DType::I64, &[1], &[e as i64])?;
    w.finish()?;
    let labels: Vec<f64> =
        ds.labels.iter().map(|&y| if y == NO_LABEL { f64::NAN } else { y as f64 }).collect();
    let mut w = NpzWriter::create(&raw.join("node-label.npz"), true)?;
    w.array("node_label", DType::F64, &[n, 1], &labels)?;
    w.finish()?;
    super::ogb::write_splits(ds, &dir.join("split").join(split))
}
