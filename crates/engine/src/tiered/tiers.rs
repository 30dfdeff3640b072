//! Where each block lives: the GPU tier (the backend's memory), the backend's page-locked host
//! memory (fixed blocks, when nothing bounds host memory) or the store (the host cache, with
//! block files under it). `Tiers` owns all three, and the rule that **a block is in at most one
//! of them — exactly one once written** (checked in debug builds at every change of place):
//! a block the plan placed in the GPU tier is never also pinned or stored, a pinned block never
//! also stored. A device block lent to a computation ([`Tiers::lend`]) is absent until it is
//! given back, and reading it meanwhile panics, naming it.

use std::collections::{HashMap, HashSet};

use grinnder_tensor::Backend;

use super::store::{BlockId, Store};

pub(super) struct Tiers<B: Backend> {
    /// Blocks the plan placed in the GPU tier (present or not yet written).
    placed: HashSet<BlockId>,
    /// The placed blocks present now.
    dev: HashMap<BlockId, B::Mat>,
    /// Placed blocks lent to a computation, not yet given back.
    lent: HashSet<BlockId>,
    pinned: HashMap<BlockId, B::HostBlock>,
    /// Page-locked host blocks given up by removed blocks, by shape `(rows, cols)`, for the next
    /// block of that shape: page-locking is paid once a run, not once an epoch.
    free: HashMap<(usize, usize), Vec<B::HostBlock>>,
    pub(super) store: Store<B::T>,
    /// Which blocks the backend's page-locked host memory holds when nothing bounds host
    /// memory: the fixed blocks (features, layer 0's aggregation) with `pin_fixed`, and with
    /// `pin_all` every block, written and added to by the device over the bus.
    pub(super) pin_fixed: bool,
    pub(super) pin_all: bool,
    /// Whole pinned blocks of the next partition, uploaded while this one computes
    /// ([`Executor::prefetch`](super::executor::Executor::prefetch)); taken by the gather that
    /// reads them.
    pub(super) ahead: Vec<(BlockId, B::Arriving)>,
}

impl<B: Backend> Tiers<B> {
    pub(super) fn new(store: Store<B::T>) -> Self {
        Tiers {
            placed: HashSet::new(),
            dev: HashMap::new(),
            lent: HashSet::new(),
            pinned: HashMap::new(),
            free: HashMap::new(),
            store,
            pin_fixed: false,
            pin_all: false,
            ahead: Vec::new(),
        }
    }

    /// Whether the plan put `id` in the GPU tier.
    pub(super) fn on_device(&self, id: BlockId) -> bool {
        self.placed.contains(&id)
    }

    /// How many blocks the GPU tier holds (placed, written or not).
    pub(super) fn placed_count(&self) -> usize {
        self.placed.len()
    }

    /// Puts `id` in the GPU tier (its matrix follows with [`Tiers::put_device`]); the caller
    /// has taken it out of the host tiers.
    pub(super) fn place(&mut self, id: BlockId) {
        self.placed.insert(id);
        self.check(id);
    }

    /// The device block `id`, `None` before it is written. Panics when it is lent.
    pub(super) fn device(&self, id: BlockId) -> Option<&B::Mat> {
        assert!(!self.lent.contains(&id), "block {id:?} read while lent to a computation");
        self.dev.get(&id)
    }

    /// The device block `id`, made by `zeros` if not yet written (a gradient block's first add).
    pub(super) fn device_or(&mut self, id: BlockId, zeros: impl FnOnce() -> B::Mat) -> &mut B::Mat {
        assert!(!self.lent.contains(&id), "block {id:?} written while lent to a computation");
        debug_assert!(self.placed.contains(&id), "block {id:?} is not in the GPU tier");
        self.dev.entry(id).or_insert_with(zeros)
    }

    /// Writes the device block `id` (placed in the GPU tier).
    pub(super) fn put_device(&mut self, id: BlockId, m: B::Mat) {
        assert!(!self.lent.contains(&id), "block {id:?} written while lent to a computation");
        debug_assert!(self.placed.contains(&id), "block {id:?} is not in the GPU tier");
        self.dev.insert(id, m);
    }

    /// Takes the device block `id` for a computation to read without a copy; `None` when it is
    /// not written. It must come back ([`Tiers::give_back`]) before anything else reads it.
    pub(super) fn lend(&mut self, id: BlockId) -> Option<B::Mat> {
        let m = self.dev.remove(&id)?;
        self.lent.insert(id);
        Some(m)
    }

    /// Returns a lent block.
    pub(super) fn give_back(&mut self, id: BlockId, m: B::Mat) {
        assert!(self.lent.remove(&id), "block {id:?} given back without being lent");
        self.dev.insert(id, m);
    }

    /// Whether every lent block is back (each pass ends so).
    pub(super) fn none_lent(&self) -> bool {
        self.lent.is_empty()
    }

    /// The device blocks written (not those lent out).
    pub(super) fn device_blocks(&self) -> impl Iterator<Item = &B::Mat> {
        self.dev.values()
    }

    /// Drops the device block `id`.
    pub(super) fn remove_device(&mut self, id: BlockId) {
        assert!(!self.lent.contains(&id), "block {id:?} removed while lent to a computation");
        self.dev.remove(&id);
    }

    pub(super) fn pinned(&self, id: BlockId) -> Option<&B::HostBlock> {
        self.pinned.get(&id)
    }

    pub(super) fn is_pinned(&self, id: BlockId) -> bool {
        self.pinned.contains_key(&id)
    }

    /// Whether `id` belongs to the store's tier (neither the GPU tier nor page-locked memory).
    pub(super) fn in_store(&self, id: BlockId) -> bool {
        !self.placed.contains(&id) && !self.pinned.contains_key(&id)
    }

    pub(super) fn any_pinned(&self) -> bool {
        !self.pinned.is_empty()
    }

    /// Keeps `id` in the backend's page-locked host memory.
    pub(super) fn pin(&mut self, id: BlockId, h: B::HostBlock) {
        self.pinned.insert(id, h);
        self.check(id);
    }

    /// The page-locked block `id`, for the device to write into.
    pub(super) fn pinned_mut(&mut self, id: BlockId) -> Option<&mut B::HostBlock> {
        self.pinned.get_mut(&id)
    }

    /// Takes `id` out of page-locked host memory (to move it, or to drop it).
    pub(super) fn unpin(&mut self, id: BlockId) -> Option<B::HostBlock> {
        self.pinned.remove(&id)
    }

    /// Takes `id` (of shape `dims`) out of page-locked host memory and keeps its memory for
    /// the next block of that shape ([`Tiers::take_free`]).
    pub(super) fn retire(&mut self, id: BlockId, dims: (usize, usize)) {
        if let Some(h) = self.pinned.remove(&id) {
            self.free.entry(dims).or_default().push(h);
        }
    }

    /// A page-locked block of shape `dims` a removed block gave up (its elements as that block
    /// left them).
    pub(super) fn take_free(&mut self, dims: (usize, usize)) -> Option<B::HostBlock> {
        self.free.get_mut(&dims)?.pop()
    }

    /// Stores `id` in the host cache (and its file), the tier of everything else.
    pub(super) fn store_put(
        &mut self,
        id: BlockId,
        rows: usize,
        cols: usize,
        data: Vec<B::T>,
    ) -> std::io::Result<()> {
        self.store.put(id, rows, cols, data)?;
        self.check(id);
        Ok(())
    }

    /// [`Tiers::store_put`] of a copy of `data` ([`Store::put_slice`]).
    pub(super) fn store_put_slice(
        &mut self,
        id: BlockId,
        rows: usize,
        cols: usize,
        data: &[B::T],
    ) -> std::io::Result<()> {
        self.store.put_slice(id, rows, cols, data)?;
        self.check(id);
        Ok(())
    }

    /// [`Tiers::store_put`] of bf16 elements ([`Store::put_bf16`]).
    pub(super) fn store_put_bf16(
        &mut self,
        id: BlockId,
        rows: usize,
        cols: usize,
        data: &[u16],
    ) -> std::io::Result<()> {
        self.store.put_bf16(id, rows, cols, data)?;
        self.check(id);
        Ok(())
    }

    /// Adds `src` into rows `rows` of the stored block `id` (made at zero if absent).
    pub(super) fn store_add_rows(
        &mut self,
        id: BlockId,
        own: usize,
        d: usize,
        rows: Option<&[u32]>,
        src: &[B::T],
    ) -> std::io::Result<()> {
        self.store.add_rows(id, own, d, rows, src)?;
        self.check(id);
        Ok(())
    }

    /// The places that hold `id`: at most one (debug builds).
    fn check(&self, id: BlockId) {
        if cfg!(debug_assertions) {
            let places = [self.placed.contains(&id), self.pinned.contains_key(&id), self.store.contains(id)];
            assert!(
                places.iter().filter(|&&p| p).count() <= 1,
                "block {id:?} in two tiers (GPU tier, page-locked host, store: {places:?})"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use grinnder_tensor::Cpu;

    use super::*;
    use crate::tiered::store::{BlockKind, CacheMode, StoreConfig, TierDtype};

    fn tiers() -> Tiers<Cpu<f32>> {
        let cfg = StoreConfig {
            budget: None,
            mode: CacheMode::LruLayer,
            dtype: TierDtype::F32,
            faults: Default::default(),
        };
        Tiers::new(Store::new(cfg, None, false).expect("a store in RAM"))
    }

    const ID: BlockId = BlockId { kind: BlockKind::Act, layer: 1, part: 0 };

    #[test]
    #[should_panic(expected = "in two tiers")]
    #[cfg(debug_assertions)]
    fn a_block_placed_on_the_device_cannot_also_be_stored() {
        let mut t = tiers();
        t.place(ID);
        t.store_put(ID, 1, 1, vec![1.0]).unwrap();
    }

    #[test]
    #[should_panic(expected = "in two tiers")]
    #[cfg(debug_assertions)]
    fn a_pinned_block_cannot_also_be_stored() {
        let mut t = tiers();
        t.pin(ID, grinnder_tensor::Mat::zeros(1, 1));
        t.store_add_rows(ID, 1, 1, None, &[1.0]).unwrap();
    }

    #[test]
    #[should_panic(expected = "read while lent")]
    fn a_lent_block_is_not_read_before_it_comes_back() {
        let mut t = tiers();
        t.place(ID);
        t.put_device(ID, grinnder_tensor::Mat::zeros(2, 2));
        let m = t.lend(ID).expect("written");
        assert!(!t.none_lent());
        let _ = t.device(ID);
        t.give_back(ID, m);
    }

    #[test]
    fn a_lent_block_given_back_is_read_again() {
        let mut t = tiers();
        t.place(ID);
        t.put_device(ID, grinnder_tensor::Mat::from_vec(1, 2, vec![1.0, 2.0]));
        let m = t.lend(ID).expect("written");
        t.give_back(ID, m);
        assert!(t.none_lent());
        assert_eq!(t.device(ID).map(|m| m.data.clone()), Some(vec![1.0, 2.0]));
    }
}
