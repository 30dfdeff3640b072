//! The cost model's ledger of the store ([`super::cost`]): each block's size, recency and
//! flags (in RAM, dirty, on disk), the cache modes' eviction as [`Store`] does it, and the
//! traffic that follows. Its own file so that the walk over the schedule reads alone.

use std::collections::HashMap;

use serde::Deserialize;
use serde::Serialize;

use super::files::{ALIGN, SUM_CHUNK};
use super::store::{BlockId, CacheMode};

/// Bytes an epoch moves.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Traffic {
    /// Host rows handed to the backend, and results taken back (on a GPU: the bus).
    pub upload_bytes: u64,
    /// Of them, whole blocks of the backend's page-locked host memory (one copy each, no
    /// staging, beside the compute), and rows its threads read from such blocks in place on
    /// the compute stream (zero-copy gathers, the rows an addition reads).
    pub pinned_upload_bytes: u64,
    #[serde(default)]
    pub mapped_read_bytes: u64,
    pub download_bytes: u64,
    /// Of them, what the backend writes into its page-locked host blocks (whole blocks, added
    /// rows, zeros), on the compute stream.
    #[serde(default)]
    pub pinned_download_bytes: u64,
    /// Rows copied out of and added into the host cache.
    pub host_copy_bytes: u64,
    pub storage_read_bytes: u64,
    pub storage_write_bytes: u64,
}

/// What the ledger knows of a stored block.
#[derive(Clone, Copy, Debug)]
struct Entry {
    bytes: u64,
    rows: u64,
    in_ram: bool,
    dirty: bool,
    on_disk: bool,
    last_use: u64,
}

/// The store as the cost model sees it: sizes and flags, the eviction of [`Store`].
pub(super) struct Ledger {
    budget: Option<u64>,
    pub(super) mode: CacheMode,
    entries: HashMap<BlockId, Entry>,
    held: u64,
    tick: u64,
    pub(super) traffic: Traffic,
    /// Blocks read ahead and not yet used: held, not evictable, dropped first when room is short.
    ahead: std::collections::HashSet<BlockId>,
    /// Bytes of the host's blocks that exist now (in the cache or in files, and page-locked),
    /// and the most at any time of the walk.
    live: u64,
    pub(super) peak: u64,
}

/// Bytes of a block file holding `payload` bytes.
fn file_len(payload: u64) -> u64 {
    super::files::file_len_of(payload as usize) as u64
}

impl Ledger {
    /// An empty store with a host cache of `budget` bytes (`None`: unlimited) in `mode`.
    pub(super) fn new(budget: Option<u64>, mode: CacheMode) -> Self {
        Ledger {
            budget,
            mode,
            entries: HashMap::new(),
            held: 0,
            tick: 0,
            traffic: Traffic::default(),
            ahead: Default::default(),
            live: 0,
            peak: 0,
        }
    }

    fn touch(&mut self, id: BlockId) {
        self.tick += 1;
        if let Some(e) = self.entries.get_mut(&id) {
            e.last_use = self.tick;
        }
    }

    /// A host block of `bytes` more exists (or, negative, no longer does).
    pub(super) fn live_add(&mut self, bytes: i64) {
        self.live = self.live.saturating_add_signed(bytes);
        self.peak = self.peak.max(self.live);
    }

    pub(super) fn put(&mut self, id: BlockId, rows: u64, bytes: u64) {
        self.remove(id);
        self.live_add(bytes as i64);
        self.tick += 1;
        let e = Entry { bytes, rows, in_ram: true, dirty: true, on_disk: false, last_use: self.tick };
        self.entries.insert(id, e);
        self.held += bytes;
        self.traffic.host_copy_bytes += bytes;
        self.make_room(Some(id), 0);
    }

    /// Whether block `id` came from storage.
    fn load(&mut self, id: BlockId) -> bool {
        self.touch(id);
        let Some(e) = self.entries.get(&id).copied() else { return false };
        if self.ahead.remove(&id) {
            return true;
        }
        if e.in_ram {
            return false;
        }
        self.make_room(Some(id), e.bytes);
        self.traffic.storage_read_bytes += file_len(e.bytes);
        let e = self.entries.get_mut(&id).expect("present");
        e.in_ram = true;
        e.dirty = false;
        self.held += e.bytes;
        self.make_room(Some(id), 0);
        true
    }

    /// Rows `idx` of block `id` (`None`: all of them), `row_bytes` each.
    pub(super) fn read_rows(&mut self, id: BlockId, idx: Option<&[u32]>, row_bytes: u64) {
        let Some(e) = self.entries.get(&id).copied() else { return };
        let n = idx.map_or(e.rows, |i| i.len() as u64);
        self.traffic.host_copy_bytes += n * row_bytes;
        match idx {
            Some(idx) if self.mode == CacheMode::PartitionLru && !e.in_ram && e.on_disk => {
                self.touch(id);
                self.traffic.storage_read_bytes += partial_read_bytes(idx, row_bytes, e.bytes);
            }
            _ => {
                self.load(id);
            }
        }
    }

    pub(super) fn add_rows(&mut self, id: BlockId, rows: u64, row_bytes: u64, added: u64) {
        if !self.entries.contains_key(&id) {
            self.put(id, rows, rows * row_bytes);
        }
        self.load(id);
        if let Some(e) = self.entries.get_mut(&id) {
            e.dirty = true;
        }
        self.traffic.host_copy_bytes += added * row_bytes;
    }

    /// [`Store::prefetch`]: blocks on disk only read ahead while the budget has room.
    pub(super) fn prefetch(&mut self, ids: &[BlockId]) {
        let Some(budget) = self.budget else { return };
        for id in ids {
            let Some(e) = self.entries.get(id).copied() else { continue };
            if e.in_ram || !e.on_disk {
                continue;
            }
            let bytes = file_len(e.bytes);
            if bytes > budget {
                continue;
            }
            self.evict_down_to(budget - bytes, None);
            if self.held + bytes > budget {
                break;
            }
            self.traffic.storage_read_bytes += bytes;
            self.ahead.insert(*id);
            let e = self.entries.get_mut(id).expect("present");
            e.in_ram = true;
            e.dirty = false;
            self.held += e.bytes;
        }
    }

    pub(super) fn remove(&mut self, id: BlockId) {
        self.ahead.remove(&id);
        if let Some(e) = self.entries.remove(&id) {
            self.live_add(-(e.bytes as i64));
            if e.in_ram {
                self.held -= e.bytes;
            }
        }
    }

    fn evict(&mut self, id: BlockId) {
        let e = self.entries.get_mut(&id).expect("a victim is present");
        if e.dirty || !e.on_disk {
            self.traffic.storage_write_bytes += file_len(e.bytes);
        }
        e.on_disk = true;
        e.dirty = false;
        e.in_ram = false;
        self.held -= e.bytes;
    }

    /// [`Store`]'s `make_room_for`: victims under the cache mode until `extra` more bytes
    /// fit, then blocks read ahead give way.
    fn make_room(&mut self, keep: Option<BlockId>, extra: u64) {
        let Some(budget) = self.budget.map(|b| b.saturating_sub(extra)) else { return };
        self.evict_down_to(budget, keep);
        if self.held > budget {
            for id in std::mem::take(&mut self.ahead) {
                if let Some(e) = self.entries.get_mut(&id) {
                    e.in_ram = false;
                    self.held -= e.bytes;
                }
            }
        }
    }

    /// [`Store`]'s `evict_down_to`.
    fn evict_down_to(&mut self, target: u64, keep: Option<BlockId>) {
        while self.held > target {
            let evictable: Vec<(BlockId, u64)> = self
                .entries
                .iter()
                .filter(|(id, e)| e.in_ram && Some(**id) != keep && !self.ahead.contains(id))
                .map(|(id, e)| (*id, e.last_use))
                .collect();
            let victims = super::eviction::victims_of(self.mode, &evictable);
            if victims.is_empty() {
                break;
            }
            for v in victims {
                self.evict(v);
                if self.mode == CacheMode::PartitionLru && self.held <= target {
                    break;
                }
            }
        }
    }
}

/// Bytes a partial read of rows `idx` (`row_bytes` each) of a `payload`-byte block transfers:
/// the [`SUM_CHUNK`] chunks that hold them, each run of chunks padded to whole pages.
fn partial_read_bytes(idx: &[u32], row_bytes: u64, payload: u64) -> u64 {
    let chunk = SUM_CHUNK as u64;
    let chunks = payload.div_ceil(chunk) as usize;
    let mut wanted = vec![false; chunks];
    for &r in idx {
        let (from, to) = (r as u64 * row_bytes, (r as u64 + 1) * row_bytes);
        if to > from {
            for w in &mut wanted[(from / chunk) as usize..=((to - 1) / chunk) as usize] {
                *w = true;
            }
        }
    }
    let mut bytes = 0;
    let mut c = 0;
    while c < chunks {
        if !wanted[c] {
            c += 1;
            continue;
        }
        let start = c;
        while c < chunks && wanted[c] {
            c += 1;
        }
        let len = (c as u64 * chunk).min(payload) - start as u64 * chunk;
        bytes += len.div_ceil(ALIGN as u64) * ALIGN as u64;
    }
    bytes
}
