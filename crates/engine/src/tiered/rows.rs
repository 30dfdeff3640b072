//! Rows in and out of blocks: gathering a partition's inputs (own rows lent, halo rows staged
//! and uploaded once), reading and adding rows, the next partition's prefetch, and writing a
//! layer's results and gradients back to their tiers.

use std::time::Instant;

use grinnder_tensor::{Backend, Mat, Rows, Scalar};

use crate::config::TrainError;

use super::executor::{io_err, par_to_vec, Executor, Own};
use super::plan::block_width;
use super::store::{BlockId, BlockKind, CacheMode, Store, TierDtype};

impl<'a, B: Backend> Executor<'a, B> {
    /// Rows of the `kind` blocks of layer `l` for partition `q`: its own rows, then (with
    /// `halo`) its halo rows from their owners. Rows of host blocks are gathered into one host
    /// matrix and uploaded once; rows of device blocks are gathered on the device.
    pub(super) fn gather_kind(
        &mut self,
        kind: BlockKind,
        l: usize,
        q: usize,
        halo: bool,
    ) -> Result<B::Mat, TrainError> {
        let t = Instant::now();
        let b = self.b;
        let d = self.width(kind, l);
        let id = |p: usize| BlockId { kind, layer: l, part: p };
        let pinned_elem = self.pinned_elem();
        // a whole block of the backend's host memory alone: one copy (a DMA on a GPU), maybe
        // started ahead
        if !halo || self.parts[q].fetch.is_empty() {
            let (src, n) = (id(q), self.parts[q].own);
            let whole = self.tiers.pinned(src).is_some_and(|h| b.host_block_dims(h).0 == n);
            let m = match self.tiers.ahead.iter().position(|(a, _)| *a == src) {
                Some(i) => Some(self.tiers.ahead.swap_remove(i).1),
                None if whole => self.upload_pinned(src),
                None => None,
            }
            .map(|m| b.arrived(m));
            if let Some(m) = m {
                self.meters.stats.gather_s += t.elapsed().as_secs_f64();
                return Ok(m);
            }
        }
        let part = &self.parts[q];
        // (block, its rows) in output order
        let own = (id(q), Rows::Range(0, part.own));
        let sources: Vec<(BlockId, Rows<'_>)> = std::iter::once(own)
            .chain(part.fetch.iter().filter(|_| halo).map(|(s, idx)| (id(*s), Rows::Index(idx))))
            .collect();
        let rows: usize = sources.iter().map(|(_, r)| r.len()).sum();
        let host_sources: Vec<(BlockId, Rows<'_>)> =
            sources.iter().filter(|(s, _)| self.tiers.in_store(*s)).copied().collect();
        let host_rows: usize = host_sources.iter().map(|(_, r)| r.len()).sum();
        // host rows straight into the backend's staging memory (as bf16 where they cross so)
        let staged = if host_sources.is_empty() {
            None
        } else {
            self.tiers.store.pin(host_sources.iter().map(|(s, _)| *s));
            let bus = (b, self.bf16_bus());
            let staged = upload_stored(
                bus,
                &mut self.tiers.store,
                &host_sources,
                d,
                &mut self.meters.stats.upload_bytes,
            );
            self.tiers.store.unpin_all();
            Some(staged?)
        };
        let m = match staged {
            Some(staged) if host_rows == rows => staged,
            staged => {
                let mut m = b.output(rows, d);
                let (mut at, mut at_host) = (0, 0);
                for (src, r) in &sources {
                    if self.tiers.on_device(*src) {
                        let block = self
                            .tiers
                            .device(*src)
                            .unwrap_or_else(|| panic!("block {src:?} read before it was written"));
                        b.gather_rows(block, *r, &mut m, at);
                    } else if let Some(h) = self.tiers.pinned(*src) {
                        b.gather_host_block(h, *r, &mut m, at);
                        self.meters.stats.pinned_traffic((r.len() * d) as u64 * pinned_elem, 0);
                    } else {
                        let staged = staged.as_ref().expect("host rows were staged");
                        b.gather_rows(staged, Rows::Range(at_host, r.len()), &mut m, at);
                        at_host += r.len();
                    }
                    at += r.len();
                }
                m
            }
        };
        self.meters.stats.gather_s += t.elapsed().as_secs_f64();
        Ok(m)
    }

    /// Layer `l`'s input rows of partition `q`: own rows, then (with `halo`) the halo rows.
    pub(super) fn gather(&mut self, l: usize, q: usize, halo: bool) -> Result<B::Mat, TrainError> {
        self.gather_kind(BlockKind::Act, l, q, halo)
    }

    /// Partition `q`'s own rows of the `kind` block of layer `l` (see [`Own`]).
    pub(super) fn own(&mut self, kind: BlockKind, l: usize, q: usize) -> Result<Own<B>, TrainError> {
        let id = BlockId { kind, layer: l, part: q };
        if self.tiers.on_device(id) {
            if let Some(m) = self.tiers.lend(id) {
                return Ok(Own::Lent(id, m));
            }
        }
        Ok(Own::Copy(self.gather_kind(kind, l, q, false)?))
    }

    /// Returns a lent block to the device tier (a copy is dropped).
    pub(super) fn give_back(&mut self, own: Option<Own<B>>) {
        if let Some(Own::Lent(id, m)) = own {
            self.tiers.give_back(id, m);
        }
    }

    /// Whether layer `l` runs split (transform on own rows, then aggregate the narrower rows).
    pub(super) fn split(&self, l: usize) -> bool {
        self.model.split(l, l == 0 && self.pre)
    }

    pub(super) fn put(&mut self, kind: BlockKind, l: usize, q: usize, m: B::Mat) -> Result<(), TrainError> {
        let t = Instant::now();
        let id = BlockId { kind, layer: l, part: q };
        if self.tiers.on_device(id) {
            self.tiers.put_device(id, m);
        } else if let Some(h) = self.pinned_copy(id, &m) {
            let (rows, cols) = self.b.dims(&m);
            drop(m);
            self.meters.stats.pinned_traffic(0, (rows * cols) as u64 * self.pinned_elem());
            self.tiers.pin(id, h);
        } else if self.tiers.pin_fixed && Self::fixed(id) {
            let (rows, cols) = self.b.dims(&m);
            let mut data = Vec::new();
            self.b.download_with(&m, &mut |h| data = par_to_vec(h));
            drop(m);
            self.meters.stats.download_bytes += (data.len() * std::mem::size_of::<B::T>()) as u64;
            self.keep_host(id, Mat::from_vec(rows, cols, data))?;
        } else {
            // into the store straight from the staging buffer (bf16 blocks encoded from it, or
            // by the backend before they cross the bus)
            let (rows, cols) = self.b.dims(&m);
            let (b, bf16_bus, tiers) = (self.b, self.bf16_bus(), &mut self.tiers);
            let mut put = Ok(());
            if bf16_bus {
                b.download_bf16_with(&m, &mut |h| put = tiers.store_put_bf16(id, rows, cols, h));
            } else {
                b.download_with(&m, &mut |h| put = tiers.store_put_slice(id, rows, cols, h));
            }
            drop(m);
            put.map_err(io_err)?;
            self.meters.stats.download_bytes += (rows * cols) as u64 * self.bus_elem();
        }
        self.meters.stats.write_back_s += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// Whether block `id` has been written (a gradient block no partition added to is not).
    pub(super) fn written(&self, id: BlockId) -> bool {
        if self.tiers.on_device(id) {
            self.tiers.device(id).is_some()
        } else {
            self.tiers.is_pinned(id) || self.tiers.store.shape(id).is_some()
        }
    }

    /// Rows `rows` of block `id` (either tier) into `out` from row `at` on.
    pub(super) fn rows_into(
        &mut self,
        id: BlockId,
        rows: Rows<'_>,
        d: usize,
        out: &mut B::Mat,
        at: usize,
    ) -> Result<(), TrainError> {
        let b = self.b;
        if self.tiers.on_device(id) {
            let block =
                self.tiers.device(id).unwrap_or_else(|| panic!("block {id:?} read before it was written"));
            b.gather_rows(block, rows, out, at);
            return Ok(());
        }
        let pinned_elem = self.pinned_elem();
        if let Some(h) = self.tiers.pinned(id) {
            // (a page-locked block: the device reads the rows in place, as gathers do; ranks'
            // mirrors of layer 0's aggregation, once at setup)
            b.gather_host_block(h, rows, out, at);
            self.meters.stats.pinned_traffic((rows.len() * d) as u64 * pinned_elem, 0);
            return Ok(());
        }
        let bus = (b, self.bf16_bus());
        let m =
            upload_stored(bus, &mut self.tiers.store, &[(id, rows)], d, &mut self.meters.stats.upload_bytes)?;
        b.gather_rows(&m, Rows::Range(0, rows.len()), out, at);
        Ok(())
    }

    /// Whether the store's rows cross the bus as bf16: a bf16 store and a backend that
    /// converts on its side ([`grinnder_tensor::Transfers::converts_bf16`]); the values are the
    /// same bits either way.
    pub(super) fn bf16_bus(&self) -> bool {
        self.tiers.store.dtype() == TierDtype::Bf16 && self.b.converts_bf16()
    }

    /// Bytes of an element of a stored block crossing the bus (its gathers and puts).
    pub(super) fn bus_elem(&self) -> u64 {
        if self.bf16_bus() {
            2
        } else {
            std::mem::size_of::<B::T>() as u64
        }
    }

    /// Row width of the `kind` blocks of layer `l`.
    pub(super) fn width(&self, kind: BlockKind, l: usize) -> usize {
        block_width(&self.model, kind, l)
    }

    /// Rows `rows` of block `id` (either tier) on the host.
    pub(super) fn read_rows(&mut self, id: BlockId, rows: &[u32], d: usize) -> Result<Vec<B::T>, TrainError> {
        let b = self.b;
        if self.tiers.on_device(id) {
            let block =
                self.tiers.device(id).unwrap_or_else(|| panic!("block {id:?} read before it was written"));
            let mut m = b.output(rows.len(), d);
            b.gather_rows(block, Rows::Index(rows), &mut m, 0);
            return Ok(b.download(&m).data);
        }
        if self.tiers.pinned(id).is_some() {
            let mut m = b.output(rows.len(), d);
            self.rows_into(id, Rows::Index(rows), d, &mut m, 0)?;
            return Ok(b.download(&m).data);
        }
        let mut out = vec![B::T::of(0.0); rows.len() * d];
        self.tiers.store.read_rows(id, Some(rows), &mut out).map_err(io_err)?;
        Ok(out)
    }

    /// Adds `src` into rows `rows` of block `id` (either tier; made at zero if absent).
    pub(super) fn add_rows(
        &mut self,
        id: BlockId,
        rows: &[u32],
        d: usize,
        src: &[B::T],
    ) -> Result<(), TrainError> {
        let b = self.b;
        let own = self.parts[id.part].own;
        if self.tiers.on_device(id) {
            let m = b.upload_owned(Mat::from_vec(rows.len(), d, src.to_vec()));
            let block = self.tiers.device_or(id, || b.zeros(own, d));
            b.scatter_add_rows(&m, 0, Rows::Index(rows), block);
            return Ok(());
        }
        self.tiers.store_add_rows(id, own, d, Some(rows), src).map_err(io_err)
    }

    /// A whole block of the backend's host memory on its way to the backend (its bytes counted
    /// as uploaded); `None` when `id` is not such a block.
    pub(super) fn upload_pinned(&mut self, id: BlockId) -> Option<B::Arriving> {
        let h = self.tiers.pinned(id)?;
        let (r, c) = self.b.host_block_dims(h);
        let m = self.b.upload_host_block(h);
        self.meters.stats.upload_bytes += (r * c) as u64 * self.pinned_elem();
        Some(m)
    }

    /// Starts loading what partition `q` will gather from the `kind` blocks of layer `l` (own
    /// rows, halo rows with `halo`, layer 0's aggregation where used) and its `extra` blocks of
    /// layer `l + 1` (`GradXw`: of layer `l`), while the current partition computes.
    pub(super) fn prefetch(
        &mut self,
        kind: BlockKind,
        l: usize,
        q: usize,
        halo: bool,
        extra: &[BlockKind],
    ) -> Result<(), TrainError> {
        // every partition step of a pass asks for its successor's blocks once (the last for one
        // past the end); the fused layer 0 also asks for GradXw, and over layer 1's columns for
        // the output gradient: not steps of their own
        if kind != BlockKind::GradXw && kind != BlockKind::Grad {
            grinnder_graph::progress::activity_step();
            grinnder_graph::progress::activity_bytes(
                self.meters.stats.upload_bytes + self.meters.stats.download_bytes,
            );
        }
        if !self.local.contains(&q) {
            return Ok(());
        }
        let part = &self.parts[q];
        let id = |p: usize| BlockId { kind, layer: l, part: p };
        let mut ids = vec![id(q)];
        if kind == BlockKind::Act && l == 0 && self.pre && !halo {
            ids.push(BlockId { kind: BlockKind::Pre, layer: 0, part: q });
        }
        // halo blocks are read ahead whole only where the cache keeps them for the next
        // partitions; otherwise the gather reads their rows alone
        if halo && self.tiers.store.mode() != CacheMode::PartitionLru {
            ids.extend(part.fetch.iter().map(|(s, _)| id(*s)));
        }
        ids.extend(extra.iter().map(|&k| {
            let layer = if k == BlockKind::GradXw { l } else { l + 1 };
            BlockId { kind: k, layer, part: q }
        }));
        // whole pinned blocks the next partition reads alone (layer 0's aggregation, own rows
        // of this layer's blocks without halo): their copies start now, beside this partition's
        // work (the other blocks it reads alone, `extra`, are copied when read: at most two
        // copies ahead are held, and a copy made ahead that gave way would cross the bus twice)
        // (not layer 0's aggregation gathered over layer 1's columns: the gather reads rows)
        for a in ids.iter().filter(|a| {
            a.part == q && !halo && (a.kind == BlockKind::Pre || (a.kind == kind && a.layer == l))
        }) {
            if self.tiers.ahead.iter().any(|(x, _)| x == a) {
                continue;
            }
            if let Some(m) = self.upload_pinned(*a) {
                if self.tiers.ahead.len() == 2 {
                    self.tiers.ahead.remove(0);
                }
                self.tiers.ahead.push((*a, m));
            }
        }
        ids.retain(|i| self.tiers.in_store(*i));
        self.tiers.store.prefetch(ids).map_err(io_err)
    }

    /// Own rows of `dx` into partition `q`'s `kind` block of layer `l`; rows past the own ones
    /// (the halo) into their owners' blocks. Device blocks are added to on the device,
    /// page-locked host blocks by the device over the bus ([`Executor::add_pinned`]); `dx` is
    /// downloaded once if any destination is in the store.
    pub(super) fn write_back(
        &mut self,
        kind: BlockKind,
        l: usize,
        q: usize,
        dx: B::Mat,
    ) -> Result<(), TrainError> {
        // the halo lists are lent out while the blocks they name are written
        let fetch = std::mem::take(&mut self.parts[q].fetch);
        let r = self.write_back_to(kind, l, q, dx, &fetch);
        self.parts[q].fetch = fetch;
        r
    }

    /// [`Executor::write_back`] with partition `q`'s halo lists `fetch`.
    fn write_back_to(
        &mut self,
        kind: BlockKind,
        l: usize,
        q: usize,
        dx: B::Mat,
        fetch: &[(usize, Vec<u32>)],
    ) -> Result<(), TrainError> {
        let b = self.b;
        let (n, d) = b.dims(&dx);
        let own_rows = self.parts[q].own;
        let id = |p: usize| BlockId { kind, layer: l, part: p };
        if n == own_rows && self.tiers.on_device(id(q)) && self.tiers.device(id(q)).is_none() {
            // own rows only, into a device block nothing has added to yet: it becomes the block
            self.tiers.put_device(id(q), dx);
            return Ok(());
        }
        let own = (q, Rows::Range(0, own_rows));
        let targets: Vec<(usize, Rows<'_>)> = std::iter::once(own)
            .chain(fetch.iter().take_while(|_| n > own_rows).map(|(s, idx)| (*s, Rows::Index(idx))))
            .collect();
        let mut host_targets = Vec::new();
        let mut from = 0;
        for (p, r) in targets {
            let rows = self.parts[p].own;
            if self.tiers.on_device(id(p)) {
                let block = self.tiers.device_or(id(p), || b.zeros(rows, d));
                b.scatter_add_rows(&dx, from, r, block);
            } else if !((self.tiers.is_pinned(id(p)) || self.pins(id(p)))
                && self.add_pinned(id(p), rows, &dx, from, r))
            {
                host_targets.push((p, rows, from, r));
            }
            from += r.len();
        }
        if host_targets.is_empty() {
            return Ok(());
        }
        // one download for every host destination
        let store = &mut self.tiers.store;
        let mut failed = None;
        b.download_with(&dx, &mut |h: &[B::T]| {
            for (p, rows, from, r) in &host_targets {
                let src = &h[from * d..(from + r.len()) * d];
                let idx = match r {
                    Rows::Index(i) => Some(*i),
                    Rows::Range(..) => None,
                };
                if let Err(e) = store.add_rows(id(*p), *rows, d, idx, src) {
                    failed.get_or_insert(e);
                    return;
                }
            }
        });
        self.meters.stats.download_bytes += (n * d * std::mem::size_of::<B::T>()) as u64;
        failed.map_or(Ok(()), |e| Err(io_err(e)))
    }
}

/// Rows of stored blocks (`sources`: blocks and their rows, in order; `d` wide) read into the
/// backend's staging memory and uploaded by `b`, as bf16 where `bf16_bus`
/// ([`Executor::bf16_bus`]); the bytes that crossed added to `uploaded`.
fn upload_stored<B: Backend>(
    (b, bf16_bus): (&B, bool),
    store: &mut Store<B::T>,
    sources: &[(BlockId, Rows<'_>)],
    d: usize,
    uploaded: &mut u64,
) -> Result<B::Mat, TrainError> {
    let rows: usize = sources.iter().map(|(_, r)| r.len()).sum();
    let mut failed = None;
    let (m, elem) = if bf16_bus {
        let m = b.upload_bf16_with(rows, d, &mut |buf: &mut [u16]| {
            failed = read_sources(sources, d, buf, &mut |s, i, o| store.read_rows_bf16(s, i, o))
        });
        (m, 2)
    } else {
        let m = b.upload_with(rows, d, &mut |buf: &mut [B::T]| {
            failed = read_sources(sources, d, buf, &mut |s, i, o| store.read_rows(s, i, o))
        });
        (m, std::mem::size_of::<B::T>())
    };
    if let Some(e) = failed {
        return Err(io_err(e));
    }
    *uploaded += (rows * d * elem) as u64;
    Ok(m)
}

/// A store's read of some rows (`None`: all) of a block into a slice.
type ReadRows<'r, O> = dyn FnMut(BlockId, Option<&[u32]>, &mut [O]) -> std::io::Result<()> + 'r;

/// Rows of `sources` (blocks and their rows, in order) into `buf` (`d` wide) by `read`; the
/// first error, if any.
fn read_sources<O>(
    sources: &[(BlockId, Rows<'_>)],
    d: usize,
    buf: &mut [O],
    read: &mut ReadRows<'_, O>,
) -> Option<std::io::Error> {
    let mut at = 0;
    for (src, r) in sources {
        let idx = match r {
            Rows::Index(i) => Some(*i),
            Rows::Range(..) => None,
        };
        if let Err(e) = read(*src, idx, &mut buf[at * d..(at + r.len()) * d]) {
            return Some(e);
        }
        at += r.len();
    }
    None
}
