//! The machine's measured speeds the cost model turns traffic and arithmetic into seconds with
//! ([`measure_rates`], `grinnder bench rates`).

use std::path::Path;
use std::time::Instant;

use grinnder_nn::work::Work;
use grinnder_tensor::{Backend, Mat, Rows, Scalar, SparseMatrix};
use serde::{Deserialize, Serialize};

use super::executor::par_copy;
use super::files::Faults;
use super::ledger::Traffic;
use super::store::{BlockId, BlockKind, CacheMode, Store, StoreConfig, TierDtype};

/// A predicted epoch's seconds by term; `epoch_s` is their sum.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Seconds {
    pub compute_s: f64,
    pub transfer_s: f64,
    pub host_copy_s: f64,
    pub storage_s: f64,
    pub epoch_s: f64,
}

/// A sparse product's measured speed at one width: entries times columns per second.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SparseRate {
    pub width: u64,
    pub transposed: bool,
    pub entry_columns_per_s: f64,
}

/// Measured speeds of a machine ([`measure_rates`], `grinnder bench rates`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// The backend measured (`cpu`, or the GPU's name).
    pub device: String,
    /// Whether the dense products ran in TF32.
    pub tf32: bool,
    pub gemm_flops_per_s: f64,
    pub sparse: Vec<SparseRate>,
    /// Bytes read and written per second by an element-wise kernel.
    pub elementwise_bytes_per_s: f64,
    /// Host rows through the backend's staging (a host copy, then the transfer).
    pub upload_bytes_per_s: f64,
    /// Whole page-locked host blocks to the backend.
    pub pinned_upload_bytes_per_s: f64,
    pub download_bytes_per_s: f64,
    /// Rows of a page-locked host block read in place by the backend (a zero-copy gather in
    /// random order), and whole blocks written into one; absent from rates measured before
    /// 2026-12-07 (then the cost model takes `pinned_upload_bytes_per_s` for both).
    #[serde(default)]
    pub mapped_read_bytes_per_s: Option<f64>,
    #[serde(default)]
    pub pinned_download_bytes_per_s: Option<f64>,
    /// Host memory copies on every core.
    pub host_copy_bytes_per_s: f64,
    /// Host blocks made (page-locked on a GPU), bytes per second; absent from rates measured
    /// before 2026-12-04.
    #[serde(default)]
    pub page_lock_bytes_per_s: Option<f64>,
    /// The store's block files (O_DIRECT through io_uring where available, checksums and
    /// decoding included), where a storage directory was measured.
    pub storage_read_bytes_per_s: Option<f64>,
    pub storage_write_bytes_per_s: Option<f64>,
}

impl Rates {
    /// Entries times columns per second of a sparse product of `width` columns: interpolated
    /// between the measured widths (linearly in the width's logarithm), the nearest beyond them.
    fn sparse_rate(&self, width: u64, transposed: bool) -> f64 {
        let mut at: Vec<&SparseRate> = self.sparse.iter().filter(|r| r.transposed == transposed).collect();
        if at.is_empty() {
            at = self.sparse.iter().collect();
        }
        at.sort_by_key(|r| r.width);
        let Some(first) = at.first() else { return f64::INFINITY };
        let w = width.max(1) as f64;
        if w <= first.width as f64 {
            return first.entry_columns_per_s;
        }
        for p in at.windows(2) {
            let (a, b) = (p[0], p[1]);
            if w <= b.width as f64 {
                let f = (w.ln() - (a.width as f64).ln()) / ((b.width as f64).ln() - (a.width as f64).ln());
                return a.entry_columns_per_s + f * (b.entry_columns_per_s - a.entry_columns_per_s);
            }
        }
        at.last().expect("non-empty").entry_columns_per_s
    }
}

impl Rates {
    /// Seconds of `w` at these rates (`elem`: bytes per element).
    pub(super) fn compute_seconds(&self, w: &Work, elem: u64) -> f64 {
        let sparse: f64 = w
            .sparse
            .iter()
            .map(|s| (s.entries * s.width) as f64 / self.sparse_rate(s.width, s.transposed))
            .sum();
        w.gemm_flops as f64 / self.gemm_flops_per_s
            + sparse
            + (w.elementwise * elem) as f64 / self.elementwise_bytes_per_s
    }

    /// An epoch's seconds: `compute_s`, and each tier's traffic at its rate.
    pub(super) fn seconds(&self, t: &Traffic, compute_s: f64) -> Seconds {
        let staged_up = t.upload_bytes.saturating_sub(t.pinned_upload_bytes + t.mapped_read_bytes);
        let staged_down = t.download_bytes.saturating_sub(t.pinned_download_bytes);
        // whole page-locked blocks go ahead, on the backend's second stream beside the previous
        // partition's compute: only what the compute does not cover counts; rows read in place
        // and writes into page-locked blocks are queued with the compute, at the bus's rates
        let pinned_s = t.pinned_upload_bytes as f64 / self.pinned_upload_bytes_per_s;
        let mapped = self.mapped_read_bytes_per_s.unwrap_or(self.pinned_upload_bytes_per_s);
        let pinned_down = self.pinned_download_bytes_per_s.unwrap_or(self.pinned_upload_bytes_per_s);
        let transfer_s = staged_up as f64 / self.upload_bytes_per_s
            + (pinned_s - compute_s).max(0.0)
            + t.mapped_read_bytes as f64 / mapped
            + staged_down as f64 / self.download_bytes_per_s
            + t.pinned_download_bytes as f64 / pinned_down;
        let host_copy_s = t.host_copy_bytes as f64 / self.host_copy_bytes_per_s;
        let rate = |x: Option<f64>| x.unwrap_or(f64::INFINITY);
        let storage_s = t.storage_read_bytes as f64 / rate(self.storage_read_bytes_per_s)
            + t.storage_write_bytes as f64 / rate(self.storage_write_bytes_per_s);
        Seconds {
            compute_s,
            transfer_s,
            host_copy_s,
            storage_s,
            epoch_s: compute_s + transfer_s + host_copy_s + storage_s,
        }
    }
}

/// The median of `reps` timed runs of `f` after one warm-up, in seconds.
fn median_secs(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// Sparse products on a random graph of 16 entries per row (65,536 × `scale` rows), at widths
/// 16, 64 and 256, each way.
fn sparse_rates<B: Backend>(b: &B, scale: usize, reps: usize) -> Vec<SparseRate> {
    let n = 65536 * scale;
    let deg = 16;
    let row_ptr: Vec<u64> = (0..=n as u64).map(|r| r * deg).collect();
    let mut rng = grinnder_graph::rng::Stream::new(&[7, 7]);
    let col_idx: Vec<u32> = (0..n)
        .flat_map(|_| {
            let mut c: Vec<u32> = (0..deg).map(|_| (rng.next_u64() % n as u64) as u32).collect();
            c.sort_unstable();
            c
        })
        .collect();
    let sm = SparseMatrix::new(n, n, row_ptr, col_idx).with_transpose();
    let entries = sm.nnz() as u64;
    // the values the executor's partition graphs keep by default: factored (a row factor and
    // a column factor, as GCN's) or, with GRINNDER_FACTORED=0, one per entry
    let factored = super::setup::factors_values(false, false);
    let sm = if factored { sm.without_entry_order() } else { sm };
    let s = b.sparse(&sm);
    let vals = b.upload(&Mat::from_vec(sm.nnz(), 1, vec![B::T::of(1.0 / deg as f64); sm.nnz()]));
    let factor = b.upload(&Mat::from_vec(n, 1, vec![B::T::of(0.25); n]));
    let mut sparse = Vec::new();
    for width in [16u64, 64, 256] {
        let d = width as usize;
        let h =
            b.upload(&Mat::from_vec(n, d, (0..n * d).map(|i| B::T::of((i % 97) as f64 * 0.01)).collect()));
        let mut z = b.output(n, d);
        for transposed in [false, true] {
            let t = median_secs(reps, || {
                if factored {
                    b.spmm_factored(&s, Some(&factor), Some(&factor), transposed, &h, 0.0, &mut z);
                } else {
                    b.spmm(&s, &vals, transposed, &h, 0.0, &mut z);
                }
                b.synchronize();
            });
            sparse.push(SparseRate { width, transposed, entry_columns_per_s: (entries * width) as f64 / t });
        }
    }
    sparse
}

/// Measures `b`'s rates for [`Executor::predict_epoch`] (`device`: its name, `tf32` whether its
/// products run in TF32): a 256-wide layer's three dense products, sparse products on a
/// random graph at widths 16 to 256 each way, an element-wise copy, uploads and downloads
/// through the backend's staging, host copies and, with `storage_dir`, the store's block files
/// (written and read back whole). `scale` sizes the problems (1: about 1 M entries and 64 MiB
/// blocks; a GPU wants 16).
pub fn measure_rates<B: Backend>(
    b: &B,
    device: &str,
    tf32: bool,
    storage_dir: Option<&Path>,
    scale: usize,
) -> std::io::Result<Rates> {
    let reps = 3;
    let scale = scale.max(1);
    let sync = || b.synchronize();
    // the dense products of a 256-wide layer over `m` rows: the transform (`x Wᵀ`), the input
    // gradient (`dy W`) and the weight gradient (`dyᵀ x`, a long inner dimension), as a layer
    // runs them once each
    let m = 32768 * scale;
    let x =
        b.upload(&Mat::from_vec(m, 256, (0..m * 256).map(|i| B::T::of((i % 89) as f64 * 0.01)).collect()));
    let w =
        b.upload(&Mat::from_vec(256, 256, (0..65536).map(|i| B::T::of((i % 83) as f64 * 0.01)).collect()));
    let mut y = b.output(m, 256);
    let mut dw = b.output(256, 256);
    let gemm_s = median_secs(reps, || {
        b.gemm(1.0, &x, false, &w, true, 0.0, &mut y);
        b.gemm(1.0, &x, false, &w, false, 0.0, &mut y);
        b.gemm(1.0, &y, true, &x, false, 0.0, &mut dw);
        sync();
    });
    let gemm_flops_per_s = (3 * 2 * m * 256 * 256) as f64 / gemm_s;
    let bytes = (m * 256 * std::mem::size_of::<B::T>()) as f64;
    let elementwise_s = median_secs(reps, || {
        b.copy(&x, &mut y);
        sync();
    });
    let elementwise_bytes_per_s = 2.0 * bytes / elementwise_s;
    drop((x, y, w, dw));
    let sparse = sparse_rates(b, scale, reps);
    // uploads through the staging and downloads, as the executor moves host rows
    let rows = 65536 * scale;
    let host = vec![B::T::of(0.5); rows * 256];
    let mut up = None;
    let upload_s = median_secs(reps, || {
        up = Some(b.upload_with(rows, 256, &mut |buf: &mut [B::T]| buf.copy_from_slice(&host)));
        sync();
    });
    let up = up.expect("uploaded");
    let mut back = Vec::new();
    let download_s = median_secs(reps, || {
        b.download_with(&up, &mut |h| back = h.to_vec());
    });
    b.release_staging();
    let host_bytes = (host.len() * std::mem::size_of::<B::T>()) as f64;
    // whole page-locked blocks, as the fixed blocks go when no host budget is set; the time
    // to make one (page-locking it) too
    let t = Instant::now();
    let (made, page_lock_s) = (b.new_host_block(rows, 256), t.elapsed().as_secs_f64());
    // and rows read from one in place in a random order (a halo's), and whole blocks written
    // into one (a block kept there)
    let mut order: Vec<u32> = (0..rows as u32).collect();
    grinnder_graph::rng::Stream::new(&[7, 9]).shuffle(&mut order);
    let (pinned_upload_s, mapped_read_s, pinned_download_s) = match made {
        Some(mut h) => {
            b.host_block_mut(&mut h).copy_from_slice(&host);
            let upload = median_secs(reps, || {
                drop(b.arrived(b.upload_host_block(&h)));
                sync();
            });
            let mut out = b.output(rows, 256);
            let read = median_secs(reps, || {
                b.gather_host_block(&h, Rows::Index(&order), &mut out, 0);
                sync();
            });
            let write = median_secs(reps, || {
                b.download_into_host_block(&up, 0, &mut h);
                sync();
            });
            (upload, Some(read), Some(write))
        }
        None => (upload_s, None, None),
    };
    let mut copy = vec![B::T::of(0.0); host.len()];
    let host_copy_s = median_secs(reps, || par_copy(&host, &mut copy));
    let (storage_read_bytes_per_s, storage_write_bytes_per_s) = match storage_dir {
        None => (None, None),
        Some(dir) => {
            let (r, w) = storage_rates::<B::T>(dir, host)?;
            (Some(r), Some(w))
        }
    };
    Ok(Rates {
        device: device.to_string(),
        tf32,
        gemm_flops_per_s,
        sparse,
        elementwise_bytes_per_s,
        upload_bytes_per_s: host_bytes / upload_s,
        pinned_upload_bytes_per_s: host_bytes / pinned_upload_s,
        download_bytes_per_s: host_bytes / download_s,
        mapped_read_bytes_per_s: mapped_read_s.map(|s| host_bytes / s),
        pinned_download_bytes_per_s: pinned_download_s.map(|s| host_bytes / s),
        host_copy_bytes_per_s: host_bytes / host_copy_s,
        page_lock_bytes_per_s: Some(host_bytes / page_lock_s),
        storage_read_bytes_per_s,
        storage_write_bytes_per_s,
    })
}

/// The store's write and read rates (bytes per second) in `dir`: blocks of `data` spilled by
/// a store that holds nothing in RAM, then read back whole.
fn storage_rates<T: Scalar>(dir: &Path, data: Vec<T>) -> std::io::Result<(f64, f64)> {
    let cfg = StoreConfig {
        budget: Some(0),
        mode: CacheMode::LruLayer,
        dtype: TierDtype::F32,
        faults: Faults::default(),
    };
    let mut store = Store::<T>::new(cfg, Some(dir), false)?;
    let (rows, cols) = (data.len() / 256, 256);
    let blocks = 4;
    let t = Instant::now();
    for part in 0..blocks {
        store.put(BlockId { kind: BlockKind::Act, layer: 1, part }, rows, cols, data.clone())?;
    }
    // a small block after them: the last one goes to its file too
    store.put(BlockId { kind: BlockKind::Act, layer: 2, part: 0 }, 1, cols, vec![T::zero(); cols])?;
    store.sync()?;
    let write_s = t.elapsed().as_secs_f64();
    let mut out = data;
    let t = Instant::now();
    for part in 0..blocks {
        store.read_rows(BlockId { kind: BlockKind::Act, layer: 1, part }, None, &mut out)?;
    }
    let read_s = t.elapsed().as_secs_f64();
    let s = store.take_stats();
    Ok((s.storage_read_bytes as f64 / read_s, s.storage_write_bytes as f64 / write_s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rates(mapped: Option<f64>, pinned_down: Option<f64>) -> Rates {
        Rates {
            device: "test".into(),
            tf32: false,
            gemm_flops_per_s: 1.0,
            sparse: Vec::new(),
            elementwise_bytes_per_s: 1.0,
            upload_bytes_per_s: 10.0,
            pinned_upload_bytes_per_s: 50.0,
            download_bytes_per_s: 5.0,
            mapped_read_bytes_per_s: mapped,
            pinned_download_bytes_per_s: pinned_down,
            host_copy_bytes_per_s: 1.0,
            page_lock_bytes_per_s: None,
            storage_read_bytes_per_s: None,
            storage_write_bytes_per_s: None,
        }
    }

    #[test]
    fn each_kind_of_transfer_is_priced_at_its_own_rate() {
        // 100 bytes staged up, 200 whole blocks up beside the compute, 40 read in place; 50
        // staged down, 80 written into page-locked blocks
        let t = Traffic {
            upload_bytes: 340,
            pinned_upload_bytes: 200,
            mapped_read_bytes: 40,
            download_bytes: 130,
            pinned_download_bytes: 80,
            ..Traffic::default()
        };
        let s = rates(Some(20.0), Some(40.0)).seconds(&t, 1.0);
        // 100/10 + (200/50 - 1) + 40/20 + 50/5 + 80/40
        assert!((s.transfer_s - (10.0 + 3.0 + 2.0 + 10.0 + 2.0)).abs() < 1e-12, "{s:?}");
        assert!((s.epoch_s - (s.transfer_s + 1.0)).abs() < 1e-12);
        // rates measured before the two in-place rates: the whole-block rate stands in
        let s = rates(None, None).seconds(&t, 10.0);
        assert!((s.transfer_s - (10.0 + 0.0 + 40.0 / 50.0 + 10.0 + 80.0 / 50.0)).abs() < 1e-12, "{s:?}");
    }
}
