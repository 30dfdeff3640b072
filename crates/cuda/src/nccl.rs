//! NCCL between the GPUs of a job (issue 9/10): one communicator per group of ranks, each rank
//! on its own GPU, its unique id passed from the group's rank 0 over the host communicator
//! (MPI). It moves the partition-parallel executor's halo rows and gradient sums between device
//! buffers (grouped sends and receives; an all-reduce) on the backend's stream, so they are
//! ordered with the compute around them.

use std::sync::{Arc, Mutex};

use cudarc::driver::CudaStream;
use cudarc::nccl::{self, ReduceOp};
use grinnder_tensor::{Backend, MatComm};

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
        if !nccl_present() {
            return Err(CudaError::NoLibrary("libnccl"));
        }
        // rank 0 sends the id, or nothing if it could not make one (the others must not wait
        // for it)
        let made = if group.rank() == 0 { Some(nccl::Id::new().map_err(err)) } else { None };
        let id: Vec<u8> = match &made {
            Some(Ok(id)) => id.internal().iter().map(|&c| c as u8).collect(),
            _ => Vec::new(),
        };
        let all = group.all_gather(&id);
        if let Some(Err(e)) = made {
            return Err(e);
        }
        let mut internal = [0 as std::ffi::c_char; 128];
        if all[0].len() != internal.len() {
            return Err(CudaError::Driver("rank 0 could not make NCCL's unique id".into()));
        }
        for (d, &s) in internal.iter_mut().zip(&all[0]) {
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
        let bytes = send.iter().map(|m| (m.rows * m.cols * 4) as u64).sum();
        EventClock::time(&self.clock, &self.stream, bytes, || {
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
        let bytes = mats.iter().map(|m| (m.rows * m.cols * 4) as u64).sum();
        EventClock::time(&self.clock, &self.stream, bytes, || {
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
