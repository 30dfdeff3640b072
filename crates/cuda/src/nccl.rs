//! NCCL between the GPUs of a job (issue 9/10): one communicator per group of ranks, each rank
//! on its own GPU, its unique id passed from the group's rank 0 over the host communicator
//! (MPI). It moves the partition-parallel executor's halo rows and gradient sums between device
//! buffers (grouped sends and receives; an all-reduce) on the backend's stream, so they are
//! ordered with the compute around them.

use grinnder_tensor::ops::*;
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaStream;
use cudarc::nccl::{self, ReduceOp};
use grinnder_tensor::MatComm;

use crate::clock::EventClock;
use crate::{err, Cuda, CudaError, DMat};

/// Whether the NCCL library can be loaded here.
pub fn nccl_present() -> bool {
    // SAFETY: only tries to dlopen the library under its usual names.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

/// A NCCL communicator over the ranks of a host group.
pub struct Nccl {
    comm: nccl::Comm,
    device: usize,
    /// The backend's stream, which the communicator's operations run on, and their timing.
    stream: Arc<CudaStream>,
    clock: Mutex<EventClock>,
}

impl Nccl {
    /// One communicator over `group`'s ranks (collective over `group`): rank 0 makes the unique
    /// id and every rank receives it over `group`. Ranks must be on distinct GPUs.
    pub fn new(gpu: &Cuda, group: &dyn grinnder_dist::Comm) -> Result<Nccl, CudaError> {
        // every rank says whether it can take part before any waits in NCCL's set-up: a rank
        // without the library, or a rank 0 that cannot make the id, fails them all at once
        let ready =
            if nccl_present() { Ok(()) } else { Err("the NCCL library (libnccl) is not installed".into()) };
        let id = grinnder_dist::share_from_root(group, ready, || {
            let id = nccl::Id::new().map_err(|e| format!("no NCCL unique id: {e:?}"))?;
            Ok(id.internal().iter().map(|&c| c as u8).collect())
        })
        .map_err(|e| CudaError::Driver(format!("NCCL cannot start: {e}")))?;
        let mut internal = [0 as std::ffi::c_char; 128];
        if id.len() != internal.len() {
            return Err(CudaError::Driver(format!("NCCL's unique id from rank 0 has {} bytes", id.len())));
        }
        for (d, &s) in internal.iter_mut().zip(&id) {
            *d = s as std::ffi::c_char;
        }
        let comm =
            nccl::Comm::from_rank(gpu.stream.clone(), group.rank(), group.size(), nccl::Id::uninit(internal))
                .map_err(err)?;
        Ok(Nccl { comm, device: gpu.ctx.ordinal(), stream: gpu.stream.clone(), clock: Default::default() })
    }
}

impl MatComm<Cuda> for Nccl {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn size(&self) -> usize {
        self.comm.world_size()
    }

    fn all_to_all(&self, b: &Cuda, send: Vec<DMat>, recv_rows: &[usize], cols: usize) -> Vec<DMat> {
        let (me, n) = (self.rank(), self.size());
        assert_eq!(send.len(), n, "one matrix per rank");
        assert_eq!(recv_rows.len(), n, "one row count per rank");
        let mut recv: Vec<DMat> = recv_rows.iter().map(|&r| b.output(r, cols)).collect();
        let mut send = send;
        // this rank's own buffer does not travel
        std::mem::swap(&mut recv[me], &mut send[me]);
        // only the time is read back: the executor counts the bytes itself
        EventClock::time(&self.clock, &self.stream, 0, || {
            let mut group = self.comm.group();
            for (r, m) in send.iter().enumerate().filter(|&(r, _)| r != me) {
                let len = m.rows * m.cols;
                if len > 0 {
                    group.send(m.data.slice(0..len), r as i32).expect("NCCL send");
                }
            }
            for (r, m) in recv.iter_mut().enumerate().filter(|&(r, _)| r != me) {
                let len = m.rows * m.cols;
                if len > 0 {
                    group.recv(m.data.slice_mut(0..len), r as i32).expect("NCCL receive");
                }
            }
        });
        recv
    }

    fn all_reduce_sum(&self, _b: &Cuda, mats: &mut [&mut DMat]) {
        if self.size() == 1 {
            return;
        }
        EventClock::time(&self.clock, &self.stream, 0, || {
            let mut group = self.comm.group();
            for m in mats.iter_mut() {
                let len = m.rows * m.cols;
                if len > 0 {
                    group
                        .all_reduce_in_place(m.data.slice_mut(0..len), &ReduceOp::Sum)
                        .expect("NCCL all-reduce");
                }
            }
        });
    }

    fn describe(&self) -> String {
        format!("NCCL, {} ranks, this one on GPU {}", self.size(), self.device)
    }

    fn keeps_time(&self) -> bool {
        true
    }

    fn take_seconds(&self) -> f64 {
        let mut c = self.clock.lock().unwrap_or_else(|p| p.into_inner());
        c.settle();
        std::mem::take(&mut c.secs)
    }
}
