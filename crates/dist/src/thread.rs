//! Ranks as threads of one process: the same collectives as MPI over shared mailboxes. Used
//! by tests (real partition-parallel runs without `mpirun`) and to emulate ranks on one machine.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};

use crate::Comm;

/// One rank's handle on a group of threads.
#[derive(Clone)]
pub struct ThreadComm {
    rank: usize,
    shared: Arc<Shared>,
    /// Collectives this rank has started on the group (every rank counts the same).
    seq: Arc<Mutex<u64>>,
}

struct Shared {
    size: usize,
    /// (collective number, from, to) → bytes.
    mail: Mutex<Mail>,
    ready: Condvar,
}

#[derive(Default)]
struct Mail {
    /// A rank of the group (or of the group it was split from) failed.
    failed: bool,
    msgs: HashMap<(u64, usize, usize), Vec<u8>>,
    /// Sub-groups made by `split`: (collective number, color) → the group.
    groups: HashMap<(u64, usize), Arc<Shared>>,
}

impl ThreadComm {
    /// Handles for a group of `size` ranks, one per thread.
    pub fn group(size: usize) -> Vec<ThreadComm> {
        let shared = Arc::new(Shared::new(size));
        (0..size).map(|rank| ThreadComm { rank, shared: shared.clone(), seq: Default::default() }).collect()
    }

    /// Runs `f` on `size` ranks, one thread each; returns their results in rank order. A rank
    /// that panics makes the others' next collective panic too (as `mpirun` ends a job when a
    /// rank fails), so nothing waits forever.
    pub fn run<R: Send>(size: usize, f: impl Fn(&ThreadComm) -> R + Sync) -> Vec<R> {
        let comms = ThreadComm::group(size);
        std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .iter()
                .map(|c| {
                    let f = &f;
                    s.spawn(move || {
                        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(c)));
                        out.unwrap_or_else(|e| {
                            c.shared.fail();
                            std::panic::resume_unwind(e)
                        })
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
        })
    }

    fn next_seq(&self) -> u64 {
        let mut s = self.seq.lock().unwrap_or_else(|e| e.into_inner());
        *s += 1;
        *s
    }
}

impl Shared {
    fn new(size: usize) -> Shared {
        Shared { size, mail: Mutex::new(Mail::default()), ready: Condvar::new() }
    }

    fn post(&self, key: (u64, usize, usize), bytes: Vec<u8>) {
        let mut m = self.mail.lock().unwrap_or_else(|e| e.into_inner());
        m.msgs.insert(key, bytes);
        self.ready.notify_all();
    }

    /// Marks the group and its sub-groups failed and wakes every waiting rank.
    fn fail(&self) {
        let mut m = self.mail.lock().unwrap_or_else(|e| e.into_inner());
        m.failed = true;
        for g in m.groups.values() {
            g.fail();
        }
        self.ready.notify_all();
    }

    fn take(&self, key: (u64, usize, usize)) -> Vec<u8> {
        let mut m = self.mail.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(b) = m.msgs.remove(&key) {
                return b;
            }
            assert!(!m.failed, "another rank failed");
            m = self.ready.wait(m).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Comm for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn all_to_all(&self, send: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
        assert_eq!(send.len(), self.size(), "one buffer per rank");
        let seq = self.next_seq();
        for (to, b) in send.into_iter().enumerate() {
            self.shared.post((seq, self.rank, to), b);
        }
        (0..self.size()).map(|from| self.shared.take((seq, from, self.rank))).collect()
    }

    fn all_gather(&self, data: &[u8]) -> Vec<Vec<u8>> {
        self.all_to_all(vec![data.to_vec(); self.size()])
    }

    fn split(&self, color: usize) -> Box<dyn Comm> {
        let colors: Vec<usize> = self
            .all_gather(&(color as u64).to_le_bytes())
            .iter()
            .map(|b| u64::from_le_bytes(b[..8].try_into().expect("8 bytes")) as usize)
            .collect();
        let seq = *self.seq.lock().unwrap_or_else(|e| e.into_inner());
        let members: Vec<usize> = (0..self.size()).filter(|&r| colors[r] == color).collect();
        let rank = members.iter().position(|&r| r == self.rank).expect("a member");
        let shared = {
            let mut m = self.shared.mail.lock().unwrap_or_else(|e| e.into_inner());
            m.groups.entry((seq, color)).or_insert_with(|| Arc::new(Shared::new(members.len()))).clone()
        };
        Box::new(ThreadComm { rank, shared, seq: Default::default() })
    }

    fn describe(&self) -> String {
        format!("{} ranks as threads of one process", self.size())
    }
}
