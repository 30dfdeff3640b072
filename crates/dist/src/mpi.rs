//! Open MPI through the `mpi` crate: ranks launched by `mpirun`.

use mpi::datatype::{Partition, PartitionMut};
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;
use mpi::Count;

use crate::Comm;

/// MPI for the process: initialised once, finalised when dropped.
pub struct Mpi {
    // fields drop in order: the communicator before MPI is finalised
    world: SimpleCommunicator,
    _universe: mpi::environment::Universe,
}

impl Mpi {
    /// Initialises MPI (only the calling thread makes MPI calls); `None` if it already was.
    pub fn init() -> Option<Mpi> {
        let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Funneled)?;
        let world = universe.world();
        Some(Mpi { world, _universe: universe })
    }

    /// Every rank of the job (drop it before `self`).
    pub fn world(&self) -> MpiComm {
        MpiComm { comm: self.world.duplicate() }
    }
}

/// A group of MPI ranks.
pub struct MpiComm {
    comm: SimpleCommunicator,
}

impl MpiComm {
    /// This rank's place among the ranks sharing its machine (MPI's shared-memory split):
    /// (its index there, how many there are).
    pub fn local(&self) -> (usize, usize) {
        let node = self.comm.split_shared(self.comm.rank());
        (node.rank() as usize, node.size() as usize)
    }
}

fn counts(bufs: &[Vec<u8>]) -> Vec<Count> {
    bufs.iter()
        .map(|b| Count::try_from(b.len()).expect("an MPI message over 2 GiB: use more partitions"))
        .collect()
}

fn displs(counts: &[Count]) -> Vec<Count> {
    let mut at: Count = 0;
    counts
        .iter()
        .map(|&c| {
            let d = at;
            at = at.checked_add(c).expect("an MPI exchange over 2 GiB: use more partitions");
            d
        })
        .collect()
}

fn unflatten(buf: &[u8], counts: &[Count], displs: &[Count]) -> Vec<Vec<u8>> {
    counts.iter().zip(displs).map(|(&c, &d)| buf[d as usize..(d + c) as usize].to_vec()).collect()
}

impl Comm for MpiComm {
    fn rank(&self) -> usize {
        self.comm.rank() as usize
    }

    fn size(&self) -> usize {
        self.comm.size() as usize
    }

    fn all_to_all(&self, send: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
        assert_eq!(send.len(), self.size(), "one buffer per rank");
        if self.size() == 1 {
            return send;
        }
        let sc = counts(&send);
        let mut rc = vec![0 as Count; sc.len()];
        self.comm.all_to_all_into(&sc[..], &mut rc[..]);
        let (sd, rd) = (displs(&sc), displs(&rc));
        let flat: Vec<u8> = send.concat();
        let total: usize = rc.iter().map(|&c| c as usize).sum();
        // never an empty allocation: two empty vectors share one dangling address, and MPI
        // refuses a send buffer that is the receive buffer (MPI_ERR_ARG)
        let mut recv = vec![0u8; total.max(1)];
        {
            let s = Partition::new(&flat[..], &sc[..], &sd[..]);
            let mut r = PartitionMut::new(&mut recv[..total], &rc[..], &rd[..]);
            self.comm.all_to_all_varcount_into(&s, &mut r);
        }
        unflatten(&recv, &rc, &rd)
    }

    fn all_gather(&self, data: &[u8]) -> Vec<Vec<u8>> {
        let n = Count::try_from(data.len()).expect("an MPI message over 2 GiB");
        let mut rc = vec![0 as Count; self.size()];
        self.comm.all_gather_into(&n, &mut rc[..]);
        let rd = displs(&rc);
        let total: usize = rc.iter().map(|&c| c as usize).sum();
        // as in `all_to_all`: the receive buffer is a real allocation
        let mut recv = vec![0u8; total.max(1)];
        {
            let mut r = PartitionMut::new(&mut recv[..total], &rc[..], &rd[..]);
            self.comm.all_gather_varcount_into(data, &mut r);
        }
        unflatten(&recv, &rc, &rd)
    }

    fn barrier(&self) {
        self.comm.barrier();
    }

    fn split(&self, color: usize) -> Box<dyn Comm> {
        let c = Color::with_value(i32::try_from(color).expect("a color below 2^31"));
        let comm = self.comm.split_by_color(c).expect("a group for every color");
        Box::new(MpiComm { comm })
    }

    fn describe(&self) -> String {
        format!("{} MPI ranks", self.size())
    }
}
