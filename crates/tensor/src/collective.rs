//! Collectives on a backend's own matrices, for transports that move device memory directly
//! (NCCL between GPUs): the partition-parallel executor's halo exchange and gradient sum
//! without a trip through the host. Byte-level collectives over the host (MPI, threads) live
//! in `grinnder-dist`; the engine adapts them to this trait for backends without a device
//! transport.

use crate::Backend;

/// A group of ranks exchanging `B`'s matrices. Every rank of the group makes the same calls in
/// the same order.
pub trait MatComm<B: Backend> {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Sends `send[r]` (`send.len() == size`, each with `cols` columns) to rank `r`; returns
    /// what each rank sent here, `recv[r]` with `recv_rows[r]` rows (the caller knows them).
    fn all_to_all(&self, b: &B, send: Vec<B::Mat>, recv_rows: &[usize], cols: usize) -> Vec<B::Mat>;
    /// Replaces each of `mats` by its element-wise sum over the ranks; every rank gets the
    /// same bits (parameters updated from them stay identical).
    fn all_reduce_sum(&self, b: &B, mats: &mut [&mut B::Mat]);
    /// What the group runs on, for logs.
    fn describe(&self) -> String;
    /// Whether the transport times its own operations on the device's clock
    /// ([`MatComm::take_seconds`]): callers need not then synchronise the device around its
    /// calls to time them. Transports that return with the work done (through the host) do not.
    fn keeps_time(&self) -> bool {
        false
    }
    /// Seconds this transport's operations took by the device's clock since the last call
    /// (waits for the other ranks included), waiting for those still running; 0 when it keeps
    /// no time.
    fn take_seconds(&self) -> f64 {
        0.0
    }
}
