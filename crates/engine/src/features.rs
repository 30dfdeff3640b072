//! Input features as the trainers read them: preprocessed ([`FeatureNorm`]) whole or by rows,
//! and the sources mini-batches gather their input rows from.

use grinnder_graph::features::{FeatureDtype, FeatureElem};
use grinnder_graph::{with_feature_buf, Buf, Dataset};
use grinnder_tensor::{Backend, Mat, Rows, Scalar};
use rayon::prelude::*;

use crate::config::{FeatureNorm, FeaturePrep};

/// Host features, preprocessed, as a backend matrix: on a device in chunks of
/// [`FEATURE_CHUNK_BYTES`] (see [`features_in_chunks`]).
pub fn features<B: Backend>(b: &B, ds: &Dataset, prep: impl Into<FeaturePrep>) -> B::Mat {
    features_in_chunks(b, ds, prep, b.device_memory().map(|_| FEATURE_CHUNK_BYTES))
}

/// Bytes of preprocessed feature rows that go to a device at a time.
const FEATURE_CHUNK_BYTES: usize = 256 << 20;

/// [`features`], `chunk` bytes of rows at a time where given (each chunk preprocessed,
/// uploaded and copied into place: on a device the host never holds a preprocessed copy of the
/// whole table beside the dataset's — igb-medium-like: 41 GB); `None`: the whole table, made on
/// the host and moved (on the CPU it is the result itself).
pub fn features_in_chunks<B: Backend>(
    b: &B,
    ds: &Dataset,
    prep: impl Into<FeaturePrep>,
    chunk: Option<usize>,
) -> B::Mat {
    let (n, d) = (ds.num_nodes(), ds.features.dim);
    let host = HostFeatures::new(ds, prep);
    let Some(chunk) = chunk.filter(|_| n > 0 && d > 0) else {
        let mut m = Mat::zeros(n, d);
        host.write_rows(None, &mut m.data);
        return b.upload_owned(m);
    };
    let per = (chunk / (d * std::mem::size_of::<B::T>())).clamp(1, n);
    let mut out = b.output(n, d);
    for start in (0..n).step_by(per) {
        let k = per.min(n - start);
        let ids: Vec<u32> = (start as u32..(start + k) as u32).collect();
        let mut m = Mat::zeros(k, d);
        host.write_rows(Some(&ids), &mut m.data);
        let piece = b.upload_owned(m);
        b.gather_rows(&piece, Rows::Range(0, k), &mut out, start);
    }
    out
}

/// What [`FeatureNorm::Row`] shifts every value by: the global minimum (0 for `None`).
pub fn feature_shift(ds: &Dataset, norm: FeatureNorm) -> f64 {
    match norm {
        FeatureNorm::None => 0.0,
        FeatureNorm::Row => features_min(ds, false),
    }
}

/// The least feature value of `ds` (+∞ for no features); with `stop_below_zero`, the first
/// piece's minimum that is negative instead, without reading further.
///
/// A piece at a time, each handed back once read: features mapped from a file larger than the
/// memory budget are never all resident.
fn features_min(ds: &Dataset, stop_below_zero: bool) -> f64 {
    fn min_of<E: FeatureElem>(data: &Buf<E>, stop_below_zero: bool) -> f32 {
        let piece = (FEATURE_PAGES_BYTES / std::mem::size_of::<E>()).max(1);
        let mut min = f32::INFINITY;
        for a in (0..data.len()).step_by(piece) {
            let r = a..(a + piece).min(data.len());
            let m = data[r.clone()].par_iter().map(|x| x.to_f32()).reduce(|| f32::INFINITY, f32::min);
            data.release(r);
            min = min.min(m);
            if stop_below_zero && min < 0.0 {
                break;
            }
        }
        min
    }
    with_feature_buf!(&ds.features.data, b => min_of(b, stop_below_zero)) as f64
}

/// The preprocessing of `ds`'s features when none is asked for, decided by their values alone
/// (never by the dataset's name): row normalisation where no value is negative — bag-of-words
/// counts or TF-IDF, as the Planetoid citation graphs store them, which Kipf & Welling's
/// preprocessing (PyG's `NormalizeFeatures`) divides by the row's sum — and the values as
/// stored otherwise (embeddings and PCA components, as OGB's and IGB's graphs store them).
///
/// Returns the choice with its statistic, so that training does not read the features again.
/// Features with a negative value are told apart by the first piece that holds one; non-negative
/// ones are read whole, the pass [`feature_shift`] would make anyway.
pub fn default_prep(ds: &Dataset) -> FeaturePrep {
    let min = features_min(ds, true);
    if min < 0.0 || ds.features.dim == 0 || ds.num_nodes() == 0 {
        FeaturePrep { norm: FeatureNorm::None, shift: Some(0.0) }
    } else {
        FeaturePrep { norm: FeatureNorm::Row, shift: Some(min) }
    }
}

/// How much of a feature file mapped from disk a read holds before it hands the pages back
/// ([`grinnder_graph::Buf::release`]): the memory plan counts this much of the file, not all of
/// it, so features larger than the host budget are read a piece at a time.
pub const FEATURE_PAGES_BYTES: usize = 16 << 20;

/// The shift `prep` applies to `ds`: its fixed one, else [`feature_shift`].
pub fn shift_of(ds: &Dataset, prep: FeaturePrep) -> f64 {
    prep.shift.unwrap_or_else(|| feature_shift(ds, prep.norm))
}

/// One feature row (stored as `E`: float32 or narrower) preprocessed (`shift` from
/// [`feature_shift`]).
pub fn normalized<T: Scalar, E: FeatureElem>(
    r: &[E],
    norm: FeatureNorm,
    shift: f64,
) -> impl Iterator<Item = T> + '_ {
    let sum = match norm {
        FeatureNorm::None => 1.0,
        FeatureNorm::Row => r.iter().map(|&v| v.to_f32() as f64 - shift).sum::<f64>().max(1.0),
    };
    let shift = if norm == FeatureNorm::Row { shift } else { 0.0 };
    r.iter().map(move |&v| T::of((v.to_f32() as f64 - shift) / sum))
}

/// A row as stored (`E`) into `out` as `T`, unchanged (a plain copy where both are float32).
fn copy_row<T: Scalar, E: FeatureElem>(out: &mut [T], row: &[E]) {
    match bytemuck_f32(row) {
        Some(r) => T::copy_from_f32(out, r),
        None => out.iter_mut().zip(row).for_each(|(o, x)| *o = T::of(x.to_f32() as f64)),
    }
}

/// `row` as float32 values where `E` is float32.
fn bytemuck_f32<E: FeatureElem>(row: &[E]) -> Option<&[f32]> {
    // SAFETY: E is f32 exactly when its dtype is (the trait's implementors); the slice is then
    // the same memory with the same type
    (E::DTYPE == FeatureDtype::F32)
        .then(|| unsafe { std::slice::from_raw_parts(row.as_ptr() as *const f32, row.len()) })
}

/// Features of `ids`, preprocessed (`shift` from [`feature_shift`]). Rows of a feature file
/// are read from it with pread (runs of consecutive ids at once: a partition's own rows are
/// one run where the file is in partition order), so they never enter the resident set; rows
/// of other mapped features through the mapping, its pages handed back every
/// [`FEATURE_PAGES_BYTES`] of rows.
pub fn feature_rows<T: Scalar>(
    ds: &Dataset,
    norm: FeatureNorm,
    shift: f64,
    ids: &[u32],
) -> std::io::Result<Vec<T>> {
    let mut out = vec![T::default(); ids.len() * ds.features.dim];
    feature_rows_into(ds, norm, shift, ids, &mut out)?;
    Ok(out)
}

/// [`feature_rows`] into `out` (`ids.len()` rows of the features' width): a buffer the caller
/// reuses.
pub fn feature_rows_into<T: Scalar>(
    ds: &Dataset,
    norm: FeatureNorm,
    shift: f64,
    ids: &[u32],
    out: &mut [T],
) -> std::io::Result<()> {
    let d = ds.features.dim;
    let src = &ds.features.data;
    assert_eq!(out.len(), ids.len() * d, "feature_rows_into: the output holds the rows");
    if src.reads_through_file() {
        // runs of consecutive ids, read and preprocessed by every core (halo rows are mostly
        // runs of one: a pread each); a run is at most a core's share of FEATURE_PAGES_BYTES,
        // so the read buffers of all cores together stay within what the plan counts
        let most = (FEATURE_PAGES_BYTES / (4 * d).max(1) / rayon::current_num_threads()).max(1);
        let mut runs = Vec::new();
        let mut i = 0;
        while i < ids.len() {
            let mut j = i + 1;
            while j < ids.len() && j - i < most && ids[j] == ids[j - 1] + 1 {
                j += 1;
            }
            runs.push((i, j));
            i = j;
        }
        let mut slices = Vec::with_capacity(runs.len());
        let mut rest = out;
        for &(i, j) in &runs {
            let (a, b) = std::mem::take(&mut rest).split_at_mut((j - i) * d);
            slices.push((i, j, a));
            rest = b;
        }
        // rows kept as stored are read straight into `out` (no copy through a buffer: on a
        // GPU `out` is page-locked memory the rows are uploaded from)
        let as_stored =
            norm == FeatureNorm::None && std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>();
        slices.into_par_iter().try_for_each_init(Vec::new, |buf: &mut Vec<f32>, (i, j, o)| {
            if as_stored {
                return src.read_into(ids[i] as usize * d, bytemuck::cast_slice_mut(o));
            }
            buf.resize((j - i) * d, 0f32);
            src.read_into(ids[i] as usize * d, buf)?;
            for (ro, r) in o.chunks_exact_mut(d).zip(buf.chunks_exact(d)) {
                for (x, v) in ro.iter_mut().zip(normalized::<T, f32>(r, norm, shift)) {
                    *x = v;
                }
            }
            Ok::<(), std::io::Error>(())
        })?;
        return Ok(());
    }
    with_feature_buf!(src, b => rows_mapped(b, d, norm, shift, ids, out));
    Ok(())
}

/// [`feature_rows_into`]'s rows of features in memory or read through their mapping (stored as
/// `E`), a piece at a time, each piece's pages handed back.
fn rows_mapped<T: Scalar, E: FeatureElem>(
    src: &Buf<E>,
    d: usize,
    norm: FeatureNorm,
    shift: f64,
    ids: &[u32],
    out: &mut [T],
) {
    // a row read keeps its pages — one more than it covers, where it straddles a boundary —
    // and the kernel maps the cached pages around a faulting one too (fault-around, 64 KiB by
    // default)
    let row_pages = ((d * std::mem::size_of::<E>()).div_ceil(4096) * 4096 + 4096).max(64 << 10);
    let piece = (FEATURE_PAGES_BYTES / row_pages).max(1);
    // every core copies a share of each piece; the piece's pages go back together, as before
    let share = piece.div_ceil(rayon::current_num_threads()).max(1);
    let release = src.is_mapped();
    for (ids, out) in ids.chunks(piece).zip(out.chunks_mut(piece * d)) {
        ids.par_chunks(share).zip(out.par_chunks_mut(share * d)).for_each(|(ids, out)| {
            for (&v, row) in ids.iter().zip(out.chunks_exact_mut(d)) {
                let r = &src[v as usize * d..(v as usize + 1) * d];
                for (o, x) in row.iter_mut().zip(normalized::<T, E>(r, norm, shift)) {
                    *o = x;
                }
            }
        });
        if release {
            src.release_all();
        }
    }
}

/// Where a batch's input rows come from.
pub trait FeatureSource<B: Backend>: Sync {
    /// The preprocessed feature rows of `ids`, in order, on the backend.
    fn gather(&self, b: &B, ids: &[u32]) -> B::Mat;
    /// Starts gathering `ids` ahead of their batch, beside the backend's current work, where
    /// the source can (the trainer calls it from a thread of its own, as soon as the batch is
    /// sampled); `None`: the trainer calls `gather` when the batch's turn comes.
    fn start(&self, _b: &B, _ids: &[u32]) -> Option<B::Arriving> {
        None
    }
    /// The cross-entropy of `logits` (row i: node `ids[i]`) into `grad`, where the source reads
    /// the labels itself (zero-copy), its sums read later ([`grinnder_tensor::TrainOps::cross_entropy_later`]);
    /// `None`: the trainer passes host labels.
    fn loss(
        &self,
        _b: &B,
        _logits: &B::Mat,
        _ids: &[u32],
        _scale: f64,
        _grad: &mut B::Mat,
    ) -> Option<B::Loss> {
        None
    }
    /// How the rows travel (reported once).
    fn describe(&self) -> String;
    /// Rows the sampling threads gather themselves, each batch's into a host block of the
    /// backend that the trainer then uploads (see [`HostFeatures::staged`]); `None`: the
    /// trainer calls `gather`.
    fn stager(&self) -> Option<&HostFeatures<'_>> {
        None
    }
}

/// The conventional path: the CPU gathers the rows, preprocessed, into the backend's staging
/// memory (page-locked on a GPU), then one copy. Rows are read from the dataset as needed.
pub struct HostFeatures<'a> {
    ds: &'a Dataset,
    norm: FeatureNorm,
    shift: f64,
    staged: bool,
    /// Batches whose rows a sampling thread staged.
    pub(crate) staged_batches: std::sync::atomic::AtomicUsize,
}

impl<'a> HostFeatures<'a> {
    pub fn new(ds: &'a Dataset, prep: impl Into<FeaturePrep>) -> HostFeatures<'a> {
        let prep = prep.into();
        HostFeatures {
            ds,
            norm: prep.norm,
            shift: shift_of(ds, prep),
            staged: false,
            staged_batches: 0.into(),
        }
    }

    /// The same rows gathered by the sampling threads, as a framework's loader workers do:
    /// each batch's into one of a few host blocks of the backend (page-locked on a GPU), whose
    /// upload the trainer starts while the previous batch computes.
    pub fn staged(self) -> HostFeatures<'a> {
        HostFeatures { staged: true, ..self }
    }

    /// How many batches' rows the sampling threads have staged so far.
    pub fn staged_batches(&self) -> usize {
        self.staged_batches.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn dim(&self) -> usize {
        self.ds.features.dim
    }

    /// The preprocessed rows of `ids` (every node in order when `None`) into `out`, in parallel.
    pub fn write_rows<T: Scalar>(&self, ids: Option<&[u32]>, out: &mut [T]) {
        with_feature_buf!(&self.ds.features.data, b => self.write_rows_of(b, ids, out))
    }

    /// [`HostFeatures::write_rows`] of features stored as `E`.
    fn write_rows_of<T: Scalar, E: FeatureElem>(&self, src: &[E], ids: Option<&[u32]>, out: &mut [T]) {
        let d = self.dim();
        // rows as they are (an index_select) where nothing is normalised: a plain copy of each
        let plain = self.norm == FeatureNorm::None;
        out.par_chunks_mut(d.max(1)).with_min_len(64).enumerate().for_each(|(i, o)| {
            let v = ids.map_or(i, |ids| ids[i] as usize);
            // rows lie anywhere in the table: the start of one some rows ahead is requested now
            if let Some(&w) = ids.and_then(|ids| ids.get(i + 8)) {
                let w = w as usize;
                grinnder_graph::buf::as_bytes(&src[w * d..(w + 1) * d])
                    .chunks(64)
                    .take(4)
                    .for_each(grinnder_graph::sample::prefetch);
            }
            let row = &src[v * d..(v + 1) * d];
            if plain {
                copy_row(o, row);
            } else {
                o.iter_mut().zip(normalized::<T, E>(row, self.norm, self.shift)).for_each(|(o, x)| *o = x);
            }
        });
    }
}

impl<B: Backend> FeatureSource<B> for HostFeatures<'_> {
    fn gather(&self, b: &B, ids: &[u32]) -> B::Mat {
        b.upload_with(ids.len(), self.dim(), &mut |buf: &mut [B::T]| self.write_rows(Some(ids), buf))
    }

    fn describe(&self) -> String {
        if self.staged {
            "copy (CPU gather on the sampling threads into page-locked blocks, then one transfer beside the previous batch's compute)".into()
        } else {
            "copy (CPU gather into staging memory, then one transfer)".into()
        }
    }

    fn stager(&self) -> Option<&HostFeatures<'_>> {
        self.staged.then_some(self)
    }
}
