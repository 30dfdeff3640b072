//! Partition-parallel runs, the executor's side: mirrors of other ranks' rows synced after a
//! layer's outputs exist, halo gradients flushed to their owners, and the ranks' sums.

use grinnder_dist::{from_bytes, to_bytes};
use grinnder_tensor::{Backend, Mat, Rows, Scalar};

use crate::config::TrainError;

use super::dist::{sum_gradients, sum_gradients_on, Phase};
use super::executor::{io_err, Executor};
use super::store::{BlockId, BlockKind};

impl<'a, B: Backend> Executor<'a, B> {
    /// Partition-parallel runs: the rows of the `kind` blocks of layer `l` that other ranks
    /// mirror go to them, and this rank's mirrors arrive (as blocks of the remote partitions).
    pub(super) fn sync_mirrors(&mut self, kind: BlockKind, l: usize) -> Result<(), TrainError> {
        let Some(dist) = self.dist.as_ref() else { return Ok(()) };
        if dist.device.is_some() {
            return self.sync_mirrors_on_device(kind, l);
        }
        let d = self.width(kind, l);
        let sends: Vec<Vec<(usize, Vec<u32>)>> = dist.sends.clone();
        let mut out = Vec::with_capacity(sends.len());
        for list in &sends {
            let mut data: Vec<B::T> = Vec::with_capacity(list.iter().map(|(_, r)| r.len() * d).sum());
            for (p, rows) in list {
                data.extend(self.read_rows(BlockId { kind, layer: l, part: *p }, rows, d)?);
            }
            out.push(to_bytes(&data));
        }
        let dist = self.dist.as_mut().expect("distributed");
        let got = dist.exchange(out, Phase::Halo);
        let (mirrors, owner) = (dist.mirrors.clone(), dist.owner.clone());
        let mut at = vec![0usize; got.len()];
        let got: Vec<Vec<B::T>> = got.iter().map(|b| from_bytes(b)).collect();
        for (s, rows) in &mirrors {
            let r = owner[*s];
            let n = rows.len() * d;
            let m = Mat::from_vec(rows.len(), d, got[r][at[r]..at[r] + n].to_vec());
            at[r] += n;
            self.put_host(BlockId { kind, layer: l, part: *s }, m)?;
        }
        Ok(())
    }

    /// Partition-parallel runs: the halo gradients this rank added into its mirrors of the
    /// `kind` blocks of layer `l` go to their owners, which add them (in rank order) into
    /// their blocks; the mirrors are dropped.
    pub(super) fn flush_mirrors(&mut self, kind: BlockKind, l: usize) -> Result<(), TrainError> {
        let Some(dist) = self.dist.as_ref() else { return Ok(()) };
        if dist.device.is_some() {
            return self.flush_mirrors_on_device(kind, l);
        }
        let d = self.width(kind, l);
        let (mirrors, owner, sends) = (dist.mirrors.clone(), dist.owner.clone(), dist.sends.clone());
        let mut out: Vec<Vec<B::T>> = vec![Vec::new(); sends.len()];
        for (s, rows) in &mirrors {
            let id = BlockId { kind, layer: l, part: *s };
            let all: Vec<u32> = (0..rows.len() as u32).collect();
            let g = if self.written(id) {
                self.read_rows(id, &all, d)?
            } else {
                vec![B::T::of(0.0); rows.len() * d]
            };
            out[owner[*s]].extend(g);
            self.remove(id)?;
        }
        let dist = self.dist.as_mut().expect("distributed");
        let got = dist.exchange(out.iter().map(|v| to_bytes(v)).collect(), Phase::Grad);
        for (r, bytes) in got.iter().enumerate() {
            let g: Vec<B::T> = from_bytes(bytes);
            let mut at = 0;
            for (p, rows) in &sends[r] {
                let n = rows.len() * d;
                self.add_rows(BlockId { kind, layer: l, part: *p }, rows, d, &g[at..at + n])?;
                at += n;
            }
        }
        Ok(())
    }

    /// [`Executor::sync_mirrors`] over the device transport: each rank's rows gathered into one
    /// matrix where the blocks are, exchanged, and cut into the mirror blocks.
    pub(super) fn sync_mirrors_on_device(&mut self, kind: BlockKind, l: usize) -> Result<(), TrainError> {
        let (b, d) = (self.b, self.width(kind, l));
        let dist = self.dist.as_ref().expect("distributed");
        let (mirrors, owner, sends) = (dist.mirrors.clone(), dist.owner.clone(), dist.sends.clone());
        let mut send = Vec::with_capacity(sends.len());
        for list in &sends {
            let mut m = b.output(list.iter().map(|(_, r)| r.len()).sum(), d);
            let mut at = 0;
            for (p, rows) in list {
                self.rows_into(BlockId { kind, layer: l, part: *p }, Rows::Index(rows), d, &mut m, at)?;
                at += rows.len();
            }
            send.push(m);
        }
        let mut recv_rows = vec![0; sends.len()];
        for (s, rows) in &mirrors {
            recv_rows[owner[*s]] += rows.len();
        }
        let got = self.dist.as_mut().expect("distributed").exchange_mats(b, send, &recv_rows, d, Phase::Halo);
        let mut at = vec![0; got.len()];
        for (s, rows) in &mirrors {
            let r = owner[*s];
            let mut m = b.output(rows.len(), d);
            b.gather_rows(&got[r], Rows::Range(at[r], rows.len()), &mut m, 0);
            at[r] += rows.len();
            self.put(kind, l, *s, m)?;
        }
        Ok(())
    }

    /// [`Executor::flush_mirrors`] over the device transport: the mirrors' gradients packed
    /// per owner, exchanged, and added (in rank order) where the owners' blocks are.
    pub(super) fn flush_mirrors_on_device(&mut self, kind: BlockKind, l: usize) -> Result<(), TrainError> {
        let (b, d) = (self.b, self.width(kind, l));
        let dist = self.dist.as_ref().expect("distributed");
        let (mirrors, owner, sends) = (dist.mirrors.clone(), dist.owner.clone(), dist.sends.clone());
        let mut rows_to = vec![0; sends.len()];
        for (s, rows) in &mirrors {
            rows_to[owner[*s]] += rows.len();
        }
        let mut send: Vec<B::Mat> = rows_to.iter().map(|&n| b.zeros(n, d)).collect();
        let mut at = vec![0; sends.len()];
        for (s, rows) in &mirrors {
            let (id, r) = (BlockId { kind, layer: l, part: *s }, owner[*s]);
            if self.written(id) {
                self.rows_into(id, Rows::Range(0, rows.len()), d, &mut send[r], at[r])?;
            }
            at[r] += rows.len();
            self.remove(id)?;
        }
        let recv_rows: Vec<usize> = sends.iter().map(|l| l.iter().map(|(_, r)| r.len()).sum()).collect();
        let got = self.dist.as_mut().expect("distributed").exchange_mats(b, send, &recv_rows, d, Phase::Grad);
        for (r, g) in got.iter().enumerate() {
            let mut at = 0;
            for (p, rows) in &sends[r] {
                let id = BlockId { kind, layer: l, part: *p };
                let own = self.parts[*p].own;
                if self.tiers.on_device(id) {
                    let block = self.tiers.device_or(id, || b.zeros(own, d));
                    b.scatter_add_rows(g, at, Rows::Index(rows), block);
                } else {
                    let mut m = b.output(rows.len(), d);
                    b.gather_rows(g, Rows::Range(at, rows.len()), &mut m, 0);
                    let h = b.download(&m);
                    self.meters.stats.download_bytes += (h.data.len() * std::mem::size_of::<B::T>()) as u64;
                    self.tiers.store_add_rows(id, own, d, Some(rows), &h.data).map_err(io_err)?;
                }
                at += rows.len();
            }
        }
        Ok(())
    }

    /// Partition-parallel runs: the sum over the ranks of `v` (the same on every rank); a
    /// no-op in one process.
    pub fn reduce<T: grinnder_dist::Pod + std::ops::AddAssign>(&mut self, v: &mut [T]) {
        if let Some(d) = self.dist.as_mut() {
            d.all_reduce(v);
        }
    }

    /// Partition-parallel runs: every parameter gradient summed over the ranks (in a fixed
    /// order on the host, by the transport on the device; the same bits on every rank, so
    /// parameters stay identical).
    pub fn reduce_gradients(&mut self) {
        let Some(d) = self.dist.as_mut() else { return };
        match d.device {
            Some(dev) => sum_gradients_on(self.b, &mut self.model, dev.reduce, d.layout, &mut d.stats),
            None => sum_gradients(self.b, &mut self.model, d.reducer(), &mut d.stats),
        }
    }

    /// The rank and the number of ranks (0 and 1 in one process).
    pub fn rank(&self) -> (usize, usize) {
        self.dist.as_ref().map_or((0, 1), |d| (d.reduce.rank(), d.reduce.size()))
    }
}
