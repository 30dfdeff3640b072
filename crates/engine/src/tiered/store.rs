//! The tiered store (docs/design.md): activation and gradient blocks, one per (kind, layer,
//! partition), cached in host RAM within a byte budget and spilled to block files beyond it.
//!
//! Invariants: a block's bytes are in RAM, on disk, or both; a block in RAM that differs from
//! its file (or has none) is dirty and is written before its memory is released, and a clean
//! block is never written again. Pinned blocks are not evicted. The bytes held — resident
//! blocks, writes in flight, prefetched reads — never exceed the budget except while the
//! pinned blocks alone exceed it.
//!
//! Overlap: one I/O thread performs block-file writes (evictions return at once) and
//! prefetches (the executor asks for the next partition's blocks while the current one
//! computes). A read of a block waits for its own write in flight; a prefetched buffer is used
//! only if the block has not changed since it was asked for (a version per block); an error of
//! an asynchronous write surfaces at the next store call.

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::Path;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

pub use grinnder_tensor::scalar::{from_bf16, to_bf16};
use grinnder_tensor::Scalar;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::files::{encode_header, AlignedBuf, BlockFiles, BlockHeader, Dtype, Faults, ALIGN};

/// Bytes each parallel task of a row copy handles.
const PAR_BYTES: usize = 1 << 20;

pub use super::block::{BlockId, BlockKind, CacheMode};

/// Element type of blocks in the host cache and in files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TierDtype {
    /// The compute type (f32 in training).
    F32,
    /// bfloat16: half the bytes, 8 bits of mantissa.
    Bf16,
}

impl TierDtype {
    /// Bytes of a stored element whose compute type has `compute` bytes.
    pub fn bytes(self, compute: usize) -> usize {
        match self {
            TierDtype::F32 => compute,
            TierDtype::Bf16 => 2,
        }
    }
}

/// Counters of one epoch (reset by [`Store::take_stats`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TierStats {
    /// Block reads served from RAM.
    pub hits: u64,
    /// Block reads that had to load the file.
    pub misses: u64,
    /// Bytes read from storage into RAM.
    pub storage_read_bytes: u64,
    /// Bytes written from RAM to storage.
    pub storage_write_bytes: u64,
    /// Bytes copied out of the host cache (gathers) and into it (write-backs).
    pub host_read_bytes: u64,
    pub host_write_bytes: u64,
    pub evictions: u64,
    /// Misses served by a prefetch started earlier.
    pub prefetch_hits: u64,
    /// Seconds in storage reads and in storage writes.
    pub read_s: f64,
    pub write_s: f64,
    /// Most bytes resident in the host cache at once.
    pub peak_cache_bytes: u64,
    /// Of the blocks read from storage, the bytes their callers asked for (partial reads: the
    /// rows; whole loads: the block), against `storage_read_bytes`.
    pub storage_needed_bytes: u64,
    /// Partial reads: rows of a block read from its file without loading it.
    pub row_reads: u64,
}

enum Data<T> {
    Full(Vec<T>),
    Bf16(Vec<u16>),
}

impl<T: Scalar> Data<T> {
    fn bytes(&self) -> u64 {
        match self {
            Data::Full(v) => (v.len() * std::mem::size_of::<T>()) as u64,
            Data::Bf16(v) => (v.len() * 2) as u64,
        }
    }
}

/// `v`'s first `out.len()` elements as bf16 into `out` (a chunk of a block: blocks are encoded
/// on every core, [`Store::make_data`]; on one core the encoding ran at about 2 GB/s and bound
/// an epoch's write-back, papers-like at full size on an H100: 128 of 148 s).
fn encode_into<T: Scalar>(v: &[T], out: &mut [u16]) {
    out.iter_mut().zip(v).for_each(|(h, x)| *h = to_bf16(x.f64() as f32));
}

struct Entry<T> {
    rows: usize,
    cols: usize,
    data: Option<Data<T>>,
    dirty: bool,
    on_disk: bool,
    last_use: u64,
    /// Bumped on every change: a prefetched buffer of an older version is discarded.
    version: u64,
    /// The chunk sums of the file's payload (see [`BlockFiles::read_chunks`]), from its write.
    sums: Vec<u64>,
}

enum Job {
    Read { id: BlockId, version: u64, header: BlockHeader },
    Write { id: BlockId, buf: AlignedBuf, len: usize },
}

enum Done {
    Read { id: BlockId, version: u64, result: io::Result<AlignedBuf>, secs: f64, bytes: u64 },
    Write { id: BlockId, result: io::Result<()>, secs: f64, bytes: u64 },
}

/// The I/O thread: block-file jobs in order of submission.
struct IoThread {
    tx: Option<Sender<Job>>,
    rx: Receiver<Done>,
    handle: Option<JoinHandle<()>>,
}

impl IoThread {
    fn start(files: Arc<BlockFiles>) -> IoThread {
        let (tx, jobs) = channel::<Job>();
        let (done, rx) = channel::<Done>();
        let handle = std::thread::Builder::new()
            .name("grinnder-io".into())
            .spawn(move || {
                for job in jobs {
                    let t = Instant::now();
                    let msg = match job {
                        Job::Read { id, version, header } => {
                            let result = files.read(&id.file_name(), &header);
                            let secs = t.elapsed().as_secs_f64();
                            Done::Read { id, version, result, secs, bytes: header.file_len() as u64 }
                        }
                        Job::Write { id, buf, len } => {
                            let result = files.write(&id.file_name(), &buf, len);
                            files.recycle(buf);
                            Done::Write { id, result, secs: t.elapsed().as_secs_f64(), bytes: len as u64 }
                        }
                    };
                    if done.send(msg).is_err() {
                        break;
                    }
                }
            })
            .expect("spawning the I/O thread");
        IoThread { tx: Some(tx), rx, handle: Some(handle) }
    }

    fn send(&self, job: Job) {
        self.tx.as_ref().expect("running").send(job).expect("the I/O thread runs while the store lives");
    }
}

impl Drop for IoThread {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Settings of a store.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Host cache bytes; `None`: everything stays in RAM.
    pub budget: Option<u64>,
    /// `LruLayer` or `PartitionLru` (`Auto` is resolved by the caller's plan).
    pub mode: CacheMode,
    pub dtype: TierDtype,
    /// Fault injection for tests.
    pub faults: Faults,
}

pub struct Store<T: Scalar> {
    cfg: StoreConfig,
    entries: HashMap<BlockId, Entry<T>>,
    resident: u64,
    clock: u64,
    pinned: HashSet<BlockId>,
    files: Option<Arc<BlockFiles>>,
    io: Option<IoThread>,
    /// Writes in flight per block, and their bytes (held until written).
    writing: HashMap<BlockId, usize>,
    writing_bytes: u64,
    /// Prefetches in flight, and finished ones waiting to be used, with their bytes.
    reading: HashSet<BlockId>,
    ready: HashMap<BlockId, (u64, io::Result<AlignedBuf>)>,
    prefetch_bytes: u64,
    /// The first error of an asynchronous write, reported at the next call.
    deferred: Option<io::Error>,
    keep_files: bool,
    /// Whether a block's file outlives the block's read back into RAM (so that evicting it
    /// again, unchanged, writes nothing): the files then grow to every block's bytes. Off
    /// ([`Store::remove_files_once_read`]) where the disk holds only the spill.
    keep_read_files: bool,
    /// The run's private storage directory (removed on drop unless `keep_files`).
    run_dir: Option<crate::scratch::RunDir>,
    stats: TierStats,
    /// Buffers of blocks replaced or removed, for the next block of their length
    /// (store_spare.rs), their bytes, and the most bytes the blocks in RAM have held at once.
    spare: Vec<Data<T>>,
    spare_bytes: u64,
    peak_live: u64,
}

fn elem_dtype<T: Scalar>() -> Dtype {
    if std::mem::size_of::<T>() == 8 {
        Dtype::F64
    } else {
        Dtype::F32
    }
}

impl<T: Scalar> Store<T> {
    /// A store spilling into a private directory of its own inside `dir` when given (checked
    /// to exist and be writable); the directory goes when the store does, unless `keep_files`.
    pub fn new(cfg: StoreConfig, dir: Option<&Path>, keep_files: bool) -> io::Result<Store<T>> {
        let (mut files, run_dir) = match dir.map(BlockFiles::create).transpose()? {
            Some((f, d)) => (Some(f), Some(d)),
            None => (None, None),
        };
        if let Some(f) = files.as_mut() {
            f.faults = cfg.faults;
        }
        if let Some(f) = &files {
            if !f.direct {
                tracing::warn!(
                    "storage directory does not take O_DIRECT; block files go through the page cache (buffered pread/pwrite)"
                );
            }
        }
        let files = files.map(Arc::new);
        let io = files.as_ref().map(|f| IoThread::start(f.clone()));
        Ok(Store {
            cfg,
            entries: HashMap::new(),
            resident: 0,
            clock: 0,
            pinned: HashSet::new(),
            files,
            io,
            writing: HashMap::new(),
            writing_bytes: 0,
            reading: HashSet::new(),
            ready: HashMap::new(),
            prefetch_bytes: 0,
            deferred: None,
            spare: Vec::new(),
            spare_bytes: 0,
            peak_live: 0,
            keep_files,
            keep_read_files: true,
            run_dir,
            stats: TierStats::default(),
        })
    }

    /// From now on a block's file is removed once the block is back in RAM, and when the block
    /// is replaced: the files hold only what is not in RAM (the spill beyond the budget), at
    /// the price of writing a block again each time it leaves, changed or not.
    pub fn remove_files_once_read(&mut self) {
        self.keep_read_files = false;
    }

    /// Removes block `id`'s file (once its writes in flight are done) where the files hold the
    /// spill alone.
    fn spill_only(&mut self, id: BlockId) -> io::Result<()> {
        if self.keep_read_files {
            return Ok(());
        }
        self.wait_writes(id)?;
        let Some(e) = self.entries.get_mut(&id) else { return Ok(()) };
        if e.on_disk {
            if let Some(f) = &self.files {
                f.remove(&id.file_name());
            }
            e.on_disk = false;
            e.dirty = true;
        }
        Ok(())
    }

    /// Bytes held: resident blocks, writes in flight, prefetched buffers, spares.
    fn held(&self) -> u64 {
        self.resident + self.writing_bytes + self.prefetch_bytes + self.spare_bytes
    }

    /// Takes finished I/O jobs (waiting for one when `wait`); returns a deferred write error.
    fn poll(&mut self, wait: bool) -> io::Result<()> {
        let Some(io) = &self.io else { return Ok(()) };
        let mut done = Vec::new();
        if wait {
            match io.rx.recv() {
                Ok(d) => done.push(d),
                Err(_) => return Err(io::Error::other("the I/O thread stopped")),
            }
        }
        done.extend(io.rx.try_iter());
        for d in done {
            match d {
                Done::Write { id, result, secs, bytes } => {
                    self.stats.write_s += secs;
                    self.stats.storage_write_bytes += bytes;
                    self.writing_bytes -= bytes;
                    let n = self.writing.get_mut(&id).expect("a write we sent");
                    *n -= 1;
                    if *n == 0 {
                        self.writing.remove(&id);
                    }
                    if let Err(e) = result {
                        self.deferred.get_or_insert(e);
                    }
                }
                Done::Read { id, version, result, secs, bytes } => {
                    self.stats.read_s += secs;
                    self.stats.storage_read_bytes += bytes;
                    self.reading.remove(&id);
                    let current =
                        self.entries.get(&id).is_some_and(|e| e.version == version && e.data.is_none());
                    if current {
                        self.ready.insert(id, (bytes, result));
                    } else {
                        self.prefetch_bytes -= bytes;
                    }
                }
            }
        }
        match self.deferred.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Waits for every write in flight; reports any write error.
    pub fn sync(&mut self) -> io::Result<()> {
        while !self.writing.is_empty() || !self.reading.is_empty() {
            self.poll(true)?;
        }
        self.poll(false)
    }

    /// Starts reading blocks that are on disk only, while the budget has room for them.
    pub fn prefetch(&mut self, ids: impl IntoIterator<Item = BlockId>) -> io::Result<()> {
        self.poll(false)?;
        let (Some(_), Some(budget)) = (&self.io, self.cfg.budget) else { return Ok(()) };
        let dtype = self.file_dtype();
        for id in ids {
            let Some(e) = self.entries.get(&id) else { continue };
            if e.data.is_some() || !e.on_disk || self.reading.contains(&id) || self.ready.contains_key(&id) {
                continue;
            }
            let header = BlockHeader { dtype, rows: e.rows as u64, cols: e.cols as u64 };
            let (bytes, version) = (header.file_len() as u64, e.version);
            if bytes > budget {
                continue;
            }
            // room by eviction under the cache mode (writes queue behind and release their bytes
            // when done, so a prefetch may have to wait for a later call)
            self.evict_down_to(budget - bytes, None)?;
            self.poll(false)?;
            // an evicted block's write buffer (header page, aligned payload) can outweigh its
            // RAM copy: never leave the budget exceeded by queued writes
            while self.held() > budget && !self.writing.is_empty() {
                self.poll(true)?;
            }
            if self.held() + bytes > budget {
                break;
            }
            self.prefetch_bytes += bytes;
            self.reading.insert(id);
            self.io.as_ref().expect("checked").send(Job::Read { id, version, header });
        }
        Ok(())
    }

    /// Drops a prefetched buffer of `id` (it is stale or about to be replaced).
    fn forget_prefetch(&mut self, id: BlockId) {
        if let Some((bytes, _)) = self.ready.remove(&id) {
            self.prefetch_bytes -= bytes;
        }
    }

    /// Waits until no write of `id` is in flight.
    fn wait_writes(&mut self, id: BlockId) -> io::Result<()> {
        while self.writing.contains_key(&id) {
            self.poll(true)?;
        }
        Ok(())
    }

    pub fn mode(&self) -> CacheMode {
        self.cfg.mode
    }

    /// Whether block files use O_DIRECT and io_uring (`None`: no storage tier).
    pub fn direct_io(&self) -> Option<(bool, bool)> {
        self.files.as_ref().map(|f| (f.direct, f.uring()))
    }

    /// The counters since the last call.
    pub fn take_stats(&mut self) -> TierStats {
        let mut s = std::mem::take(&mut self.stats);
        s.peak_cache_bytes = s.peak_cache_bytes.max(self.resident);
        self.stats.peak_cache_bytes = self.resident;
        s
    }

    pub fn resident_bytes(&self) -> u64 {
        self.resident
    }

    pub fn contains(&self, id: BlockId) -> bool {
        self.entries.contains_key(&id)
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn encode(&mut self, v: Vec<T>) -> Data<T> {
        match self.cfg.dtype {
            TierDtype::F32 => Data::Full(v),
            TierDtype::Bf16 => {
                self.make_data(v.len(), |_, _| unreachable!(), |at, c| encode_into(&v[at..], c))
            }
        }
    }

    /// Stores `data` (`rows × cols`, row-major) as block `id`, replacing what was there.
    pub fn put(&mut self, id: BlockId, rows: usize, cols: usize, data: Vec<T>) -> io::Result<()> {
        assert_eq!(data.len(), rows * cols, "block {id:?}: data is rows × cols");
        // a deferred write error before the block's data is retired: the block stays whole
        self.poll(false)?;
        self.retire_ram(id);
        let data = self.encode(data);
        self.put_data(id, rows, cols, data)
    }

    /// [`Store::put`] of a copy of `data`, encoded straight from it: a bf16 block never holds
    /// an f32 copy (a block downloaded from a device goes from the staging buffer to bf16 on
    /// every core).
    pub fn put_slice(&mut self, id: BlockId, rows: usize, cols: usize, data: &[T]) -> io::Result<()> {
        assert_eq!(data.len(), rows * cols, "block {id:?}: data is rows × cols");
        self.put_made(
            id,
            rows,
            cols,
            |at, c| c.copy_from_slice(&data[at..at + c.len()]),
            |at, c| encode_into(&data[at..], c),
        )
    }

    /// Block `id` (`rows × cols`) replaced by one [`Store::make_data`] makes with `full` or
    /// `half` (into the replaced block's buffer where it fits).
    fn put_made(
        &mut self,
        id: BlockId,
        rows: usize,
        cols: usize,
        full: impl Fn(usize, &mut [T]) + Sync,
        half: impl Fn(usize, &mut [u16]) + Sync,
    ) -> io::Result<()> {
        // a deferred write error before the block's data is retired: the block stays whole
        self.poll(false)?;
        self.retire_ram(id);
        let data = self.make_data(rows * cols, full, half);
        self.put_data(id, rows, cols, data)
    }

    fn put_data(&mut self, id: BlockId, rows: usize, cols: usize, data: Data<T>) -> io::Result<()> {
        self.poll(false)?;
        self.retire_ram(id);
        self.forget_prefetch(id);
        // the file of the version replaced goes now, not when this one is written
        self.spill_only(id)?;
        let version = self.entries.get(&id).map_or(0, |e| e.version + 1);
        let bytes = data.bytes();
        self.stats.host_write_bytes += bytes;
        let last_use = self.tick();
        // a file of an earlier version is stale: on_disk false, so it is rewritten on eviction
        self.entries.insert(
            id,
            Entry {
                rows,
                cols,
                data: Some(data),
                dirty: true,
                on_disk: false,
                last_use,
                version,
                sums: Vec::new(),
            },
        );
        self.resident += bytes;
        self.trim_spares();
        self.make_room(Some(id))
    }

    /// The run's private directory holding the block files (`None` without storage).
    pub fn storage_dir(&self) -> Option<&Path> {
        self.files.as_ref().map(|f| f.dir())
    }

    /// Block-file reads and writes attempted so far (`(0, 0)` without storage).
    pub fn storage_ops(&self) -> (usize, usize) {
        self.files.as_ref().map_or((0, 0), |f| f.ops())
    }

    /// `(rows, cols)` of block `id`.
    pub fn shape(&self, id: BlockId) -> Option<(usize, usize)> {
        self.entries.get(&id).map(|e| (e.rows, e.cols))
    }

    /// Copies rows of block `id` into `out` (`idx` rows in order, or all rows). Some rows of
    /// a block that is on disk only, where the cache cannot hold a layer
    /// ([`CacheMode::PartitionLru`]), are read from its file alone: the pages that hold them,
    /// without loading the block.
    pub fn read_rows(&mut self, id: BlockId, idx: Option<&[u32]>, out: &mut [T]) -> io::Result<()> {
        self.read_rows_as(id, idx, out, &T::of, &|h| T::of(from_bf16(h) as f64))
    }

    /// Bytes of a stored element (f32 or bf16 blocks).
    pub(super) fn elem_bytes(&self) -> usize {
        self.cfg.dtype.bytes(std::mem::size_of::<T>())
    }

    /// Adds `src` (`k × cols`) into rows `idx` of block `id` (the first `k` rows when `None`),
    /// creating the block as `rows × cols` zeros when absent.
    pub fn add_rows(
        &mut self,
        id: BlockId,
        rows: usize,
        cols: usize,
        idx: Option<&[u32]>,
        src: &[T],
    ) -> io::Result<()> {
        if !self.entries.contains_key(&id) {
            let zeros = self.make_data(rows * cols, |_, c| c.fill(T::zero()), |_, c| c.fill(0));
            self.put_data(id, rows, cols, zeros)?;
        }
        if self.load(id)? {
            self.stats.storage_needed_bytes += (rows * cols * self.elem_bytes()) as u64;
        }
        let e = self.entries.get_mut(&id).expect("loaded");
        assert_eq!((e.rows, e.cols), (rows, cols), "block {id:?}: shape");
        let data = e.data.as_mut().expect("loaded");
        match data {
            Data::Full(v) => add_into(v, (rows, cols), idx, src, &|row: &mut [T], s: &[T]| {
                row.iter_mut().zip(s).for_each(|(x, &y)| *x += y);
            }),
            Data::Bf16(v) => add_into(v, (rows, cols), idx, src, &|row: &mut [u16], s: &[T]| {
                for (x, &y) in row.iter_mut().zip(s) {
                    *x = to_bf16(from_bf16(*x) + y.f64() as f32);
                }
            }),
        }
        e.dirty = true;
        e.version += 1;
        self.stats.host_write_bytes += (src.len() * self.elem_bytes()) as u64;
        Ok(())
    }

    /// Drops block `id` from RAM and storage.
    pub fn remove(&mut self, id: BlockId) -> io::Result<()> {
        // no transfer of this block may land after it is gone (a later block of the same id
        // starts its versions afresh)
        self.wait_writes(id)?;
        while self.reading.contains(&id) {
            self.poll(true)?;
        }
        self.retire_ram(id);
        self.forget_prefetch(id);
        if let Some(e) = self.entries.remove(&id) {
            if e.on_disk {
                if let Some(f) = &self.files {
                    f.remove(&id.file_name());
                }
            }
        }
        Ok(())
    }

    fn remove_ram(&mut self, id: BlockId) {
        if let Some(e) = self.entries.get_mut(&id) {
            if let Some(d) = e.data.take() {
                self.resident -= d.bytes();
            }
        }
    }

    /// Pins blocks: they stay in RAM until [`Store::unpin_all`].
    pub fn pin(&mut self, ids: impl IntoIterator<Item = BlockId>) {
        if self.cfg.mode == CacheMode::PartitionLru {
            self.pinned.extend(ids);
        }
    }

    pub fn unpin_all(&mut self) {
        self.pinned.clear();
    }

    /// Brings block `id` into RAM; whether it came from storage (now or read ahead).
    fn load(&mut self, id: BlockId) -> io::Result<bool> {
        let t = self.tick();
        let e = self.entries.get_mut(&id).unwrap_or_else(|| panic!("block {id:?} was never written"));
        e.last_use = t;
        if e.data.is_some() {
            self.stats.hits += 1;
            return Ok(false);
        }
        self.stats.misses += 1;
        let (rows, cols, version) = (e.rows as u64, e.cols as u64, e.version);
        let header = BlockHeader { dtype: self.file_dtype(), rows, cols };
        self.poll(false)?;
        self.wait_writes(id)?;
        while self.reading.contains(&id) {
            self.poll(true)?;
        }
        let buf = match self.ready.remove(&id) {
            Some((bytes, result)) => {
                self.prefetch_bytes -= bytes;
                self.stats.prefetch_hits += 1;
                result?
            }
            None => {
                // room first: the block's bytes exist from the read on
                let payload = header.payload_len() as u64;
                self.make_room_for(payload, Some(id))?;
                let files = self.files.as_ref().expect("a block left RAM only with a storage tier");
                let start = Instant::now();
                let buf = files.read(&id.file_name(), &header)?;
                self.stats.read_s += start.elapsed().as_secs_f64();
                self.stats.storage_read_bytes += header.file_len() as u64;
                buf
            }
        };
        debug_assert_eq!(self.entries[&id].version, version);
        let payload = &buf.as_slice()[ALIGN..ALIGN + header.payload_len()];
        // on every core: one core decoded 430 MB in 0.14 s (2-core VM, 2026-12-04), while the
        // training thread waited
        let data = match header.dtype {
            Dtype::Bf16 => {
                Data::Bf16(payload.par_chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect())
            }
            Dtype::F32 => Data::Full(
                payload
                    .par_chunks_exact(4)
                    .map(|c| T::of(f32::from_le_bytes(c.try_into().unwrap()) as f64))
                    .collect(),
            ),
            Dtype::F64 => Data::Full(
                payload
                    .par_chunks_exact(8)
                    .map(|c| T::of(f64::from_le_bytes(c.try_into().unwrap())))
                    .collect(),
            ),
        };
        if let Some(files) = &self.files {
            files.recycle(buf);
        }
        let bytes = data.bytes();
        let e = self.entries.get_mut(&id).expect("present");
        e.data = Some(data);
        e.dirty = false;
        self.resident += bytes;
        self.trim_spares();
        self.spill_only(id)?;
        self.make_room(Some(id))?;
        Ok(true)
    }

    fn file_dtype(&self) -> Dtype {
        match self.cfg.dtype {
            TierDtype::F32 => elem_dtype::<T>(),
            TierDtype::Bf16 => Dtype::Bf16,
        }
    }

    /// Evicts until the budget holds (or only pinned blocks and `keep` remain), then waits
    /// for writes in flight while they keep the held bytes over budget.
    fn make_room(&mut self, keep: Option<BlockId>) -> io::Result<()> {
        self.make_room_for(0, keep)
    }

    /// [`Store::make_room`] for `extra` more bytes about to arrive.
    fn make_room_for(&mut self, extra: u64, keep: Option<BlockId>) -> io::Result<()> {
        self.stats.peak_cache_bytes = self.stats.peak_cache_bytes.max(self.held());
        let Some(budget) = self.cfg.budget.map(|b| b.saturating_sub(extra)) else { return Ok(()) };
        self.evict_down_to(budget, keep)?;
        // prefetched buffers give way first (after spares), then writes drain
        if self.held() > budget {
            let ids: Vec<BlockId> = self.ready.keys().copied().collect();
            for id in ids {
                self.forget_prefetch(id);
            }
        }
        while self.held() > budget && !self.writing.is_empty() {
            self.poll(true)?;
        }
        Ok(())
    }

    /// Evicts victims under the cache mode until the blocks and buffers read ahead in RAM are
    /// at most `target` bytes (or only pinned blocks and `keep` remain in RAM).
    fn evict_down_to(&mut self, target: u64, keep: Option<BlockId>) -> io::Result<()> {
        // spares go before any block, prefetched buffer or wait on a write
        if self.held() > target {
            self.drop_spares();
        }
        // writes in flight leave by themselves (the callers wait for them). Counted here, an
        // evicted block's write buffer (a page more than its RAM copy) kept each eviction from
        // lowering the figure: making room for one block emptied the cache of dirty blocks
        while self.resident + self.prefetch_bytes > target {
            let victims = self.victims(keep);
            if victims.is_empty() {
                break; // the pinned working set alone is over budget
            }
            for v in victims {
                self.evict(v)?;
                if self.cfg.mode == CacheMode::PartitionLru && self.resident + self.prefetch_bytes <= target {
                    break;
                }
            }
        }
        Ok(())
    }

    fn evictable(&self, keep: Option<BlockId>) -> impl Iterator<Item = (&BlockId, &Entry<T>)> {
        self.entries
            .iter()
            .filter(move |(id, e)| e.data.is_some() && Some(**id) != keep && !self.pinned.contains(id))
    }

    /// The next blocks to leave RAM under the cache mode.
    fn victims(&self, keep: Option<BlockId>) -> Vec<BlockId> {
        let evictable: Vec<(BlockId, u64)> = self.evictable(keep).map(|(id, e)| (*id, e.last_use)).collect();
        super::eviction::victims_of(self.cfg.mode, &evictable)
    }

    fn evict(&mut self, id: BlockId) -> io::Result<()> {
        let needs_write = {
            let e = &self.entries[&id];
            e.dirty || !e.on_disk
        };
        if needs_write {
            self.write(id)?;
        }
        self.remove_ram(id);
        self.stats.evictions += 1;
        Ok(())
    }

    fn write(&mut self, id: BlockId) -> io::Result<()> {
        if self.io.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                "the host budget is exceeded and there is no storage directory to spill to (give --storage-dir or more --host-mem)",
            ));
        }
        let e = &self.entries[&id];
        let header = BlockHeader { dtype: self.file_dtype(), rows: e.rows as u64, cols: e.cols as u64 };
        let len = header.file_len();
        let files = self.files.as_ref().expect("a storage tier with an I/O thread");
        let mut buf = files.buffer(len);
        {
            let (out, padding) = buf.as_mut_slice()[ALIGN..len].split_at_mut(header.payload_len());
            // a kept buffer holds an earlier file's bytes: the page's tail is zeroed
            padding.fill(0);
            // on every core, as reads decode
            match e.data.as_ref().expect("writing a resident block") {
                Data::Bf16(v) => out
                    .par_chunks_exact_mut(2)
                    .zip(v.par_iter())
                    .for_each(|(o, x)| o.copy_from_slice(&x.to_le_bytes())),
                Data::Full(v) if header.dtype == Dtype::F64 => out
                    .par_chunks_exact_mut(8)
                    .zip(v.par_iter())
                    .for_each(|(o, x)| o.copy_from_slice(&x.f64().to_le_bytes())),
                Data::Full(v) => out
                    .par_chunks_exact_mut(4)
                    .zip(v.par_iter())
                    .for_each(|(o, x)| o.copy_from_slice(&(x.f64() as f32).to_le_bytes())),
            }
        }
        let sums = encode_header(&header, &mut buf);
        self.io.as_ref().expect("checked above").send(Job::Write { id, buf, len });
        *self.writing.entry(id).or_insert(0) += 1;
        self.writing_bytes += len as u64;
        let e = self.entries.get_mut(&id).expect("present");
        e.sums = sums;
        e.dirty = false;
        e.on_disk = true;
        Ok(())
    }
}

impl<T: Scalar> Drop for Store<T> {
    fn drop(&mut self) {
        // finish (or fail) every write before the directory goes
        self.io.take();
        if let Some(d) = self.run_dir.take() {
            if self.keep_files {
                match d.keep() {
                    Ok(kept) => tracing::info!(
                        "block files kept in {} (left for you: no later run or grinnder clean removes it)",
                        kept.display()
                    ),
                    Err(e) => tracing::warn!("{e}"),
                }
            } else if let Err(e) = d.close() {
                tracing::warn!("cannot remove the storage directory: {e}");
            }
        }
    }
}

#[path = "store_partial.rs"]
mod partial;

#[path = "store_bus.rs"]
mod bus;

#[path = "store_spare.rs"]
mod spare;

#[path = "store_add.rs"]
mod add;
use add::add_into;

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
