//! Communicators for partition-parallel training (docs/design.md): the collectives the executor
//! needs — all-to-all of byte buffers (halo rows and halo gradients), all-gather (reductions
//! that every rank computes in the same order, so parameters stay bit-identical on every rank),
//! barrier and split (per-server and server-head groups).
//!
//! Implementations: [`Solo`] (one rank), [`ThreadComm`] (ranks as threads of one process: tests
//! and emulation), and `MpiComm` (feature `mpi`: Open MPI through the `mpi` crate, for ranks
//! launched by `mpirun`).

#[cfg(feature = "mpi")]
pub mod mpi;
mod thread;

pub use thread::ThreadComm;

/// A group of ranks. Every rank of the group makes the same collective calls in the same order.
pub trait Comm {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Sends `send[r]` to rank `r` (`send.len() == size`); returns `recv` with `recv[r]` what
    /// rank `r` sent here.
    fn all_to_all(&self, send: Vec<Vec<u8>>) -> Vec<Vec<u8>>;
    /// Every rank's `data`, in rank order.
    fn all_gather(&self, data: &[u8]) -> Vec<Vec<u8>>;
    fn barrier(&self) {
        self.all_gather(&[]);
    }
    /// The ranks that pass the same `color`, as a group ordered by rank here.
    fn split(&self, color: usize) -> Box<dyn Comm>;
    /// What the group runs on, for logs.
    fn describe(&self) -> String;
}

/// Whether this process was started by an MPI launcher (`mpirun`, `srun`), and as one of how
/// many ranks: Open MPI's, PMIx's and PMI's size variables.
pub fn launched_ranks() -> Option<usize> {
    ["OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"].iter().find_map(|v| std::env::var(v).ok()?.parse().ok())
}

/// This process's rank in the job its launcher started (Open MPI's, PMIx's, PMI's variables).
pub fn launched_rank() -> Option<usize> {
    ["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"].iter().find_map(|v| std::env::var(v).ok()?.parse().ok())
}

/// How many ranks of the job share this machine (Open MPI's and MPICH's variables).
pub fn launched_local_ranks() -> Option<usize> {
    ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"].iter().find_map(|v| std::env::var(v).ok()?.parse().ok())
}

/// A single rank.
#[derive(Clone, Copy, Debug, Default)]
pub struct Solo;

impl Comm for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_to_all(&self, send: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
        assert_eq!(send.len(), 1, "one buffer per rank");
        send
    }
    fn all_gather(&self, data: &[u8]) -> Vec<Vec<u8>> {
        vec![data.to_vec()]
    }
    fn split(&self, _color: usize) -> Box<dyn Comm> {
        Box::new(Solo)
    }
    fn describe(&self) -> String {
        "one process".into()
    }
}

/// Rank 0's `make()` handed to every rank of `comm` once every rank has said whether it is
/// `ready` (collective: every rank calls it). When a rank is not ready, or rank 0's `make`
/// fails, every rank returns the same error naming the ranks and their reasons: none is left
/// waiting for a rank that gave up (a communicator's unique id, e.g. NCCL's, travels this way).
pub fn share_from_root(
    comm: &dyn Comm,
    ready: Result<(), String>,
    make: impl FnOnce() -> Result<Vec<u8>, String>,
) -> Result<Vec<u8>, String> {
    // one status byte (1: ready, 0: not), then rank 0's payload or the reason
    let mine = match ready.and_then(|()| if comm.rank() == 0 { make() } else { Ok(Vec::new()) }) {
        Ok(payload) => [vec![1u8], payload].concat(),
        Err(why) => [vec![0u8], why.into_bytes()].concat(),
    };
    let all = comm.all_gather(&mine);
    let failed: Vec<String> = all
        .iter()
        .enumerate()
        .filter(|(_, m)| m.first() != Some(&1))
        .map(|(r, m)| format!("rank {r}: {}", String::from_utf8_lossy(m.get(1..).unwrap_or_default())))
        .collect();
    if failed.is_empty() {
        Ok(all[0][1..].to_vec())
    } else {
        Err(failed.join("; "))
    }
}

/// Element types that travel as bytes.
pub use bytemuck::Pod;

/// `v` as bytes.
pub fn to_bytes<T: Pod>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// Bytes back into elements (any alignment).
pub fn from_bytes<T: Pod>(b: &[u8]) -> Vec<T> {
    assert_eq!(b.len() % std::mem::size_of::<T>(), 0, "a whole number of elements");
    bytemuck::pod_collect_to_vec(b)
}

/// Element-wise sum over the ranks, added in rank order on every rank, so every rank gets the
/// same bits whatever the transport does.
pub fn all_reduce_sum<T: Pod + std::ops::AddAssign>(comm: &dyn Comm, v: &mut [T]) {
    if comm.size() == 1 {
        return;
    }
    let all = comm.all_gather(bytemuck::cast_slice(v));
    let mut first = true;
    for b in all {
        let part: Vec<T> = from_bytes(&b);
        assert_eq!(part.len(), v.len(), "every rank reduces the same length");
        if first {
            v.copy_from_slice(&part);
            first = false;
        } else {
            for (a, x) in v.iter_mut().zip(part) {
                *a += x;
            }
        }
    }
}

/// Which ranks share a server: `ranks_per_server` consecutive ranks each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub ranks: usize,
    pub ranks_per_server: usize,
}

impl Layout {
    pub fn server(&self, rank: usize) -> usize {
        rank / self.ranks_per_server.max(1)
    }

    pub fn servers(&self) -> usize {
        self.ranks.div_ceil(self.ranks_per_server.max(1))
    }

    pub fn same_server(&self, a: usize, b: usize) -> bool {
        self.server(a) == self.server(b)
    }
}

/// The three groups of GraNNDis (docs/design.md): every rank, the ranks of this server, and one
/// head rank per server (`None` on the others).
pub struct Groups {
    pub global: Box<dyn Comm>,
    pub server: Box<dyn Comm>,
    pub heads: Option<Box<dyn Comm>>,
    pub layout: Layout,
}

impl Groups {
    /// Splits `global` into servers of `ranks_per_server` consecutive ranks.
    pub fn new(global: Box<dyn Comm>, ranks_per_server: usize) -> Groups {
        let layout =
            Layout { ranks: global.size(), ranks_per_server: ranks_per_server.clamp(1, global.size()) };
        let me = global.rank();
        let server = global.split(layout.server(me));
        // heads get color 0, the rest a group of their own that they drop
        let is_head = server.rank() == 0;
        let heads = global.split(if is_head { 0 } else { 1 + me });
        Groups { global, server, heads: is_head.then_some(heads), layout }
    }

    /// Element-wise sum over every rank, by the hierarchy: summed within each server (rank
    /// order), then among the servers' heads (server order), then handed down from each head
    /// to its server — each server's sum crosses between servers once. Every rank gets the same
    /// bits. Returns the bytes this rank sent within its server and to other servers.
    pub fn all_reduce_sum<T: Pod + std::ops::AddAssign>(&self, v: &mut [T]) -> (u64, u64) {
        let bytes = std::mem::size_of_val(v) as u64;
        let peers = self.server.size() as u64 - 1;
        all_reduce_sum(self.server.as_ref(), v);
        let (mut intra, mut inter) = (bytes * peers, 0);
        if let Some(h) = &self.heads {
            all_reduce_sum(h.as_ref(), v);
            inter += bytes * (h.size() as u64 - 1);
            intra += bytes * peers;
        }
        if peers > 0 {
            // the head's sum to the others of its server
            let mine = if self.heads.is_some() { bytemuck::cast_slice(v).to_vec() } else { Vec::new() };
            let all = self.server.all_gather(&mine);
            v.copy_from_slice(&from_bytes::<T>(&all[0]));
        }
        (intra, inter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_payload_reaches_every_rank_or_every_rank_fails() {
        // all ready: rank 0's bytes everywhere, `make` called on rank 0 only
        let got = ThreadComm::run(3, |c| {
            share_from_root(c, Ok(()), || {
                assert_eq!(c.rank(), 0, "only rank 0 makes the payload");
                Ok(vec![7, 8, 9])
            })
        });
        assert!(got.iter().all(|g| g.as_deref() == Ok(&[7u8, 8, 9][..])), "{got:?}");
        // one rank not ready: every rank gets the same error, naming it (nobody hangs)
        let got = ThreadComm::run(3, |c| {
            let ready = if c.rank() == 2 { Err("no libnccl".to_string()) } else { Ok(()) };
            share_from_root(c, ready, || Ok(vec![1]))
        });
        for g in &got {
            assert_eq!(g.as_ref().unwrap_err(), "rank 2: no libnccl");
        }
        // rank 0's payload cannot be made: the same on every rank
        let got = ThreadComm::run(2, |c| share_from_root(c, Ok(()), || Err("no id".into())));
        assert!(got.iter().all(|g| g.as_ref().unwrap_err() == "rank 0: no id"), "{got:?}");
        // an empty payload is still a payload
        let got = ThreadComm::run(2, |c| share_from_root(c, Ok(()), || Ok(Vec::new())));
        assert!(got.iter().all(|g| g.as_ref().is_ok_and(Vec::is_empty)), "{got:?}");
    }

    #[test]
    fn reductions_are_identical_on_every_rank() {
        let out = ThreadComm::run(4, |c| {
            let mut v: Vec<f32> = (0..5).map(|i| 0.1 * (i + c.rank()) as f32).collect();
            all_reduce_sum(c, &mut v);
            v
        });
        for v in &out {
            assert_eq!(v, &out[0]);
        }
        let want: Vec<f32> =
            (0..5).map(|i| (0..4).map(|r| 0.1 * (i + r) as f32).fold(0.0, |a, x| a + x)).collect();
        assert_eq!(out[0], want);
    }

    #[test]
    fn all_to_all_delivers_each_buffer_to_its_rank() {
        let out = ThreadComm::run(3, |c| {
            let send = (0..3).map(|r| vec![c.rank() as u8, r as u8, 7]).collect();
            let recv = c.all_to_all(send);
            // twice, to check that consecutive collectives do not mix
            let again = c.all_to_all((0..3).map(|r| vec![r as u8; r]).collect());
            (recv, again)
        });
        for (me, (recv, again)) in out.iter().enumerate() {
            for (r, b) in recv.iter().enumerate() {
                assert_eq!(b, &vec![r as u8, me as u8, 7]);
            }
            assert!(again.iter().all(|b| b == &vec![me as u8; me]));
        }
    }

    #[test]
    fn a_failing_rank_ends_the_others_collectives() {
        let r = std::panic::catch_unwind(|| {
            ThreadComm::run(3, |c| {
                let server = c.split(c.rank() / 2);
                if c.rank() == 0 {
                    panic!("rank 0 fails");
                }
                server.barrier();
                c.barrier();
            })
        });
        assert!(r.is_err(), "the run fails instead of waiting forever");
    }

    #[test]
    fn groups_split_servers_and_heads() {
        let out = ThreadComm::run(4, |c| {
            let g = Groups::new(Box::new(c.clone()), 2);
            let sum = {
                let mut v = [g.global.rank() as u64];
                all_reduce_sum(g.server.as_ref(), &mut v);
                v[0]
            };
            (g.server.rank(), g.server.size(), g.heads.as_ref().map(|h| (h.rank(), h.size())), sum)
        });
        assert_eq!(out[0], (0, 2, Some((0, 2)), 1));
        assert_eq!(out[1], (1, 2, None, 1));
        assert_eq!(out[2], (0, 2, Some((1, 2)), 5));
        assert_eq!(out[3], (1, 2, None, 5));
    }

    #[test]
    fn hierarchical_sums_are_identical_on_every_rank() {
        for (ranks, per_server) in [(4, 2), (5, 2), (3, 1), (3, 3)] {
            let out = ThreadComm::run(ranks, |c| {
                let g = Groups::new(Box::new(c.clone()), per_server);
                let mut v: Vec<f32> = (0..7).map(|i| 0.1 * (i * 3 + c.rank()) as f32 + 1e-3).collect();
                let bytes = g.all_reduce_sum(&mut v);
                (v, bytes)
            });
            let want: Vec<f64> =
                (0..7).map(|i| (0..ranks).map(|r| (0.1 * (i * 3 + r) as f32 + 1e-3) as f64).sum()).collect();
            let servers = ranks.div_ceil(per_server);
            for (r, (v, (intra, inter))) in out.iter().enumerate() {
                assert_eq!(v, &out[0].0, "{ranks} ranks, {per_server} per server: rank {r}'s bits");
                for (a, b) in v.iter().zip(&want) {
                    assert!((*a as f64 - b).abs() <= 1e-5 * b, "{a} vs {b}");
                }
                let head = r % per_server == 0;
                let peers = (ranks - r / per_server * per_server).min(per_server) as u64 - 1;
                assert_eq!(*intra, 28 * peers * if head { 2 } else { 1 }, "rank {r}");
                assert_eq!(*inter, if head { 28 * (servers as u64 - 1) } else { 0 }, "rank {r}");
            }
        }
    }
}
