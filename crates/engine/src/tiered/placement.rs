//! The GPU tier: which blocks live in the backend's memory (placed once, in the order of bus
//! transfers saved per byte, refined after the first epoch's peak), and the host's fixed blocks.

use grinnder_tensor::{Backend, Mat, Rows, Scalar};
use serde::Serialize;

use crate::config::TrainError;

use super::executor::{io_err, Executor};
use super::plan::{block_kinds, fusible, keeps_features, transform_fusible, DevicePlan, GIB, MARGIN_DIVISOR};
use super::settings::TieredConfig;
use super::store::{BlockId, BlockKind, TierDtype};

impl<'a, B: Backend> Executor<'a, B> {
    /// Every block an epoch makes, in the order of bus transfers saved per byte when kept on
    /// the device: GCNII's initial representation and its gradient (read, and added to, by
    /// every layer after the first), hidden activations (written once, read up to three times), the split layers'
    /// narrow rows and their gradients (each read with halo rows), layer 0's aggregation and
    /// the features (read twice, never rewritten), then gradients (written once, read once;
    /// none where the executor only predicts); with each block's bytes at full precision.
    pub(super) fn block_list(&self) -> Vec<(BlockId, u64)> {
        let elem = std::mem::size_of::<B::T>() as u64;
        let mut out = Vec::new();
        for (kind, layer, d) in block_kinds(&self.model, self.pre, self.fused, !self.inference) {
            for (part, p) in self.parts.iter().enumerate() {
                out.push((BlockId { kind, layer, part }, p.own as u64 * d as u64 * elem));
            }
        }
        out
    }

    /// Whether the input features are read after setup: not where layer 0 reads only its
    /// precomputed aggregation (no feature block is made).
    pub(super) fn keeps_features(&self) -> bool {
        keeps_features(&self.model, self.pre)
    }

    /// Whether layer 0 runs inside layer 1 ([`Executor::fusible`], unless the GPU
    /// tier holds every block without it).
    pub fn fused(&self) -> bool {
        self.fused
    }

    /// Whether layer 2's transform runs inside layer 1 too, where layer 0 runs over an unsplit
    /// layer 1's columns ([`Executor::fused`]) and layer 2 runs split on its transformed rows
    /// alone (GCN with 3 layers or more, hidden wider than the layer after): layer 1's output
    /// rows are transformed where they are made, so layer 2's input is never a block; the
    /// backward remakes those rows in layer 1's backward anyway ([`Executor::columns_backward_steps`])
    /// and runs layer 2's transform backward there, so neither is its gradient. Papers-like at
    /// full size with 3 GCN layers of 256: 472 of 984 width-rows of blocks (as bf16, 97.6 of
    /// 203.6 GiB), by the same arithmetic as [`Executor::fusible`]'s. No work is added: the
    /// same products run, in another place.
    pub(super) fn fused_transform(&self) -> bool {
        self.fused && transform_fusible(&self.model, self.pre)
    }

    /// Whether layer 0 can run inside layer 1, partition by partition: layer 0 reads only its
    /// precomputed aggregation (no neighbours, no input gradient: GCN). Layer 1's input is then
    /// never stored: the forward makes it where layer 1 reads it; the backward remakes it (layer
    /// 0 again: one GEMM on rows read for layer 0's weight gradient anyway) where layer 1's
    /// input gradient is made, and runs layer 0's backward right there. Neither that activation
    /// nor its gradient becomes a block. Layer 1 split reads its input's own rows only (its
    /// transform); unsplit, it reads its columns' rows: layer 0 runs on the aggregation's rows
    /// gathered over them ([`Executor::columns_steps`]), half as wide as the activation on a
    /// 128-wide input and 256-wide layers, and layer 0's weight gradient takes every column's
    /// share where it is made (the gradient is linear in the rows), so no halo gradient moves.
    /// GCN with 3 layers on papers-like at full size: 984 of 1,496 width-rows of blocks. Ranks
    /// exchange their rows of the aggregation that other ranks' columns read once, at setup.
    /// The price is layer 0 run on about twice its rows, three times an epoch: cheap on a GPU,
    /// not on a small host — papers-like at scale 0.005, GCN 3×256, 8 parts under `--host-mem
    /// 2500MiB` with storage took 21.1–21.6 s an epoch against 18.0–18.9 s unfused (8b8a560)
    /// on the 2-core VM (2026-12-07), with peak host memory 1.43 GiB against 2.03 GiB.
    /// Choosing by the cost model where the host computes is left to do.
    pub(super) fn fusible(&self) -> bool {
        fusible(&self.model, self.pre)
    }

    /// Whether a block is written once, before the first epoch, and only read after: the input
    /// features and layer 0's aggregation.
    pub(super) fn fixed(id: BlockId) -> bool {
        id.kind == BlockKind::Pre || (id.kind == BlockKind::Act && id.layer == 0)
    }

    /// Whether block `id` lives in the backend's page-locked host memory when the GPU tier
    /// does not hold it: every block with `pin_all`, the fixed ones with `pin_fixed`.
    pub(super) fn pins(&self, id: BlockId) -> bool {
        self.tiers.pin_fixed && (self.tiers.pin_all || Self::fixed(id))
    }

    /// Whether page-locked host blocks hold bf16 (those of a bf16 tier: the device rounds what
    /// it writes there, as the store would, and widens what it reads).
    fn pins_bf16(&self) -> bool {
        self.tiers.store.dtype() == TierDtype::Bf16
    }

    /// Bytes of an element of a page-locked host block, on the bus.
    pub(super) fn pinned_elem(&self) -> u64 {
        if self.pins_bf16() {
            2
        } else {
            std::mem::size_of::<B::T>() as u64
        }
    }

    /// A page-locked host block of `rows × cols` for block `id`: its own (written again), one a
    /// removed block gave up, or a new one; `None` when page-locked memory runs out (then the
    /// remaining blocks go to the store, as in [`Self::keep_host`]).
    fn host_block_for(&mut self, id: BlockId, rows: usize, cols: usize) -> Option<B::HostBlock> {
        let h = self.tiers.unpin(id).or_else(|| self.tiers.take_free((rows, cols)));
        let h = h.or_else(|| {
            if self.pins_bf16() {
                self.b.new_host_block_bf16(rows, cols)
            } else {
                self.b.new_host_block(rows, cols)
            }
        });
        if h.is_none() {
            self.stop_pinning();
        }
        h
    }

    /// Block `id` (one [`Executor::pins`] keeps) downloaded straight into a page-locked host
    /// block; `None` for other blocks, or when page-locked memory runs out.
    pub(super) fn pinned_copy(&mut self, id: BlockId, m: &B::Mat) -> Option<B::HostBlock> {
        if !self.pins(id) {
            return None;
        }
        let (rows, cols) = self.b.dims(m);
        let mut h = self.host_block_for(id, rows, cols)?;
        self.b.download_into_host_block(m, 0, &mut h);
        Some(h)
    }

    /// Adds rows `from..` of `dx` into rows `r` of the page-locked gradient block `id` (of
    /// `rows × d`), made where absent: as the copy of its own rows when those come first and
    /// whole, else at zero. The device writes (and reads) the host rows over the bus. `false`
    /// when page-locked memory ran out (the caller adds through the store).
    pub(super) fn add_pinned(
        &mut self,
        id: BlockId,
        rows: usize,
        dx: &B::Mat,
        from: usize,
        r: Rows<'_>,
    ) -> bool {
        let b = self.b;
        let d = b.dims(dx).1;
        let row = d as u64 * self.pinned_elem();
        if let Some(h) = self.tiers.pinned_mut(id) {
            b.scatter_add_host_block(dx, from, r, h);
            self.meters.stats.pinned_traffic(r.len() as u64 * row, r.len() as u64 * row);
            return true;
        }
        let Some(mut h) = self.host_block_for(id, rows, d) else { return false };
        if matches!(r, Rows::Range(0, n) if n == rows) {
            b.download_into_host_block(dx, from, &mut h);
            self.meters.stats.pinned_traffic(0, rows as u64 * row);
        } else {
            b.zero_host_block(&mut h);
            b.scatter_add_host_block(dx, from, r, &mut h);
            self.meters.stats.pinned_traffic(r.len() as u64 * row, (rows + r.len()) as u64 * row);
        }
        self.tiers.pin(id, h);
        true
    }

    /// Page-locked memory ran out: the remaining fixed blocks go to the store.
    fn stop_pinning(&mut self) {
        tracing::warn!("no page-locked host memory left: the remaining fixed blocks go to the store");
        self.tiers.pin_fixed = false;
    }

    /// Keeps a host block: a fixed one in the backend's host memory where the plan allows
    /// (`pin_fixed`), everything else in the store.
    pub(super) fn keep_host(&mut self, id: BlockId, mut m: Mat<B::T>) -> Result<(), TrainError> {
        if self.tiers.pin_fixed && Self::fixed(id) {
            let made = if self.pins_bf16() { self.b.host_block_bf16(m) } else { self.b.host_block(m) };
            match made {
                Ok(h) => {
                    self.tiers.pin(id, h);
                    return Ok(());
                }
                Err(back) => {
                    self.stop_pinning();
                    m = back;
                }
            }
        }
        self.tiers.store_put(id, m.rows, m.cols, m.data).map_err(io_err)
    }

    /// The GPU tier's share of the plan: what the backend holds now (graphs, parameters), the
    /// largest partition's working set and a margin come off `gpu_mem`; blocks are placed in
    /// [`Executor::block_list`]'s order while they fit.
    pub(super) fn place_on_device(&mut self, tc: &TieredConfig) -> Result<(), TrainError> {
        let resident_bytes = self.b.device_memory().map_or(0, |m| m.used);
        let working_bytes = self.plan.device_working_bytes;
        let (cache_bytes, margin_bytes) = match (tc.device_cache_bytes, tc.gpu_mem) {
            (Some(c), _) => (c, 0),
            (None, Some(g)) => {
                let margin = g / MARGIN_DIVISOR;
                let need = resident_bytes + working_bytes + margin;
                if need > g {
                    return Err(TrainError::Memory(format!(
                        "--gpu-mem {:.2} GiB is too small: the partition graphs and parameters take {:.2} GiB, the largest partition's working set {:.2} GiB and the margin {:.2} GiB; use more --parts or a larger --gpu-mem",
                        g as f64 / GIB,
                        resident_bytes as f64 / GIB,
                        working_bytes as f64 / GIB,
                        margin as f64 / GIB
                    )));
                }
                (g - need, margin)
            }
            (None, None) => return Ok(()),
        };
        self.unfuse_if_fits(cache_bytes);
        let (blocks, placed_bytes) = self.place_while_fits(cache_bytes)?;
        let dp =
            DevicePlan { resident_bytes, working_bytes, margin_bytes, cache_bytes, blocks, placed_bytes };
        tracing::info!(
            "GPU tier: {} blocks ({:.2} GiB) of {:.2} GiB for blocks, beside {:.2} GiB resident and a {:.2} GiB working set",
            dp.blocks,
            placed_bytes as f64 / GIB,
            cache_bytes as f64 / GIB,
            resident_bytes as f64 / GIB,
            working_bytes as f64 / GIB
        );
        self.plan.device = Some(dp);
        Ok(())
    }

    /// After the first epoch, with its peak device memory measured (see
    /// [`Executor::refine_placement`]).
    pub(super) fn place_more(&mut self) -> Result<(), TrainError> {
        if let Some(m) = self.b.device_memory() {
            self.refine_placement(m.peak)?;
        }
        Ok(())
    }

    /// Given the peak backend memory of an epoch, places the blocks that still fit under
    /// `gpu_mem` (less the margin) in the GPU tier — the plan's working-set estimate is an upper
    /// bound. Blocks that exist now (features, layer-0 aggregation) move over. Returns how many
    /// blocks joined.
    pub fn refine_placement(&mut self, peak: u64) -> Result<usize, TrainError> {
        let margin = self.plan.device.as_ref().map(|d| d.margin_bytes);
        let (Some(g), Some(margin)) = (self.gpu_mem, margin) else { return Ok(0) };
        let moved = self.place_within(g.saturating_sub(margin).saturating_sub(peak))?;
        tracing::info!(
            "GPU tier after an epoch at peak {:.2} GiB of {:.2} GiB: {} more blocks ({:.2} GiB), {} in all",
            peak as f64 / GIB,
            g as f64 / GIB,
            moved.0,
            moved.1 as f64 / GIB,
            self.tiers.placed_count()
        );
        Ok(moved.0)
    }

    /// Places what fits in `room` more bytes of the GPU tier (ending the fusion where every
    /// block fits, [`Executor::unfuse_if_fits`]); the count and bytes placed.
    pub(super) fn place_within(&mut self, room: u64) -> Result<(usize, u64), TrainError> {
        self.unfuse_if_fits(room);
        let moved = self.place_while_fits(room)?;
        if let Some(d) = self.plan.device.as_mut() {
            d.blocks += moved.0;
            d.placed_bytes += moved.1;
        }
        Ok(moved)
    }

    /// Ends the fusion of layer 0 into layer 1 when every block of the unfused epoch not yet in
    /// the GPU tier fits in `room` bytes there: recomputing layer 0 only pays where its output
    /// and gradient would not stay on the device (on products-like with every block on an
    /// H200, the fused epoch took 0.0615 s against 0.0533 s).
    pub(super) fn unfuse_if_fits(&mut self, room: u64) {
        if !self.fused {
            return;
        }
        self.fused = false;
        let missing: u64 =
            self.block_list().iter().filter(|(id, _)| !self.tiers.on_device(*id)).map(|(_, b)| b).sum();
        self.fused = missing > room;
    }

    /// Places the blocks not yet in the GPU tier, in [`Executor::block_list`]'s order, while
    /// `room` bytes last; blocks that exist in the host store move over. Returns the count and
    /// bytes placed.
    pub(super) fn place_while_fits(&mut self, mut room: u64) -> Result<(usize, u64), TrainError> {
        let mut placed = (0usize, 0u64);
        self.tiers.ahead.clear();
        if self.tiers.any_pinned() {
            // device threads may still be reading host blocks that move below (zero-copy
            // gathers record no event on them)
            self.b.synchronize();
        }
        for (id, bytes) in self.block_list() {
            if self.tiers.on_device(id) || bytes > room {
                continue;
            }
            // out of the host tier it is in, into the GPU tier
            let moved = if let Some(h) = self.tiers.unpin(id) {
                Some(self.b.arrived(self.b.upload_host_block(&h)))
            } else if let Some((rows, cols)) = self.tiers.store.shape(id) {
                let mut data = vec![B::T::of(0.0); rows * cols];
                self.tiers.store.read_rows(id, None, &mut data).map_err(io_err)?;
                self.tiers.store.remove(id).map_err(io_err)?;
                Some(self.b.upload_owned(Mat::from_vec(rows, cols, data)))
            } else {
                None
            };
            self.tiers.place(id);
            if let Some(m) = moved {
                self.tiers.put_device(id, m);
            }
            room -= bytes;
            placed = (placed.0 + 1, placed.1 + bytes);
        }
        Ok(placed)
    }

    /// Stores a host block where the plan put it.
    pub(super) fn put_host(&mut self, id: BlockId, m: Mat<B::T>) -> Result<(), TrainError> {
        if self.tiers.on_device(id) {
            self.meters.stats.upload_bytes += (m.data.len() * std::mem::size_of::<B::T>()) as u64;
            self.tiers.put_device(id, self.b.upload_owned(m));
            return Ok(());
        }
        self.keep_host(id, m)
    }

    /// Drops a block from whichever tier holds it.
    pub(super) fn remove(&mut self, id: BlockId) -> Result<(), TrainError> {
        if self.tiers.on_device(id) {
            self.tiers.remove_device(id);
            return Ok(());
        }
        self.tiers.ahead.retain(|(a, _)| *a != id);
        if let Some(h) = self.tiers.pinned(id) {
            // kept for the next block of its shape: the device work queued on it stays ordered
            // before whatever the device writes there next (the backend orders it)
            let dims = self.b.host_block_dims(h);
            self.tiers.retire(id, dims);
            return Ok(());
        }
        self.tiers.store.remove(id).map_err(io_err)
    }
}

/// The blocks of one kind and layer, and how many of them the GPU tier holds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BlockGroup {
    pub kind: BlockKind,
    pub layer: usize,
    pub blocks: usize,
    pub bytes: u64,
    pub on_device: usize,
    pub on_device_bytes: u64,
}

impl<B: Backend> Executor<'_, B> {
    /// The blocks an epoch makes by kind and layer, with the GPU tier's share (the rest live in
    /// the host cache, spilling to storage beyond its budget), in the order of placement.
    pub fn block_groups(&self) -> Vec<BlockGroup> {
        let mut out: Vec<BlockGroup> = Vec::new();
        for (id, bytes) in self.block_list() {
            if out.last().is_none_or(|g| (g.kind, g.layer) != (id.kind, id.layer)) {
                let g = BlockGroup {
                    kind: id.kind,
                    layer: id.layer,
                    blocks: 0,
                    bytes: 0,
                    on_device: 0,
                    on_device_bytes: 0,
                };
                out.push(g);
            }
            let g = out.last_mut().expect("pushed");
            g.blocks += 1;
            g.bytes += bytes;
            if self.tiers.on_device(id) {
                g.on_device += 1;
                g.on_device_bytes += bytes;
            }
        }
        out
    }
}
