//! Inference through the executor: a forward pass without dropout up to the requested layer,
//! whose rows are handed out partition by partition with their nodes' ids in the dataset —
//! never the whole output at once, under the same plan, tiers and ranks as training. No
//! gradient block is made. In the output layer only the partitions holding a requested node
//! are computed.

use std::time::Instant;

use grinnder_graph::progress;
use grinnder_tensor::{Backend, Scalar};

use crate::config::TrainError;

use super::executor::Executor;
use super::store::BlockKind;

/// How a mode hands on its output: `emit(ids, rows, width)`, `rows` row-major, row i being node
/// `ids[i]` of the dataset. The rows are borrowed (on a GPU, straight from the page-locked
/// buffer they were downloaded into).
pub type Emit<'a> = dyn FnMut(&[u32], &[f32], usize) -> Result<(), TrainError> + 'a;

impl<'a, B: Backend> Executor<'a, B> {
    /// The output of layer `upto - 1` (`upto = layers()`: the logits) for the nodes of this
    /// rank's partitions, a partition at a time: `emit(ids, rows)`, row i being node `ids[i]`
    /// of the dataset. Partitions without a node `wanted` accepts are skipped in that layer.
    pub fn predict(
        &mut self,
        upto: usize,
        wanted: &dyn Fn(u32) -> bool,
        emit: &mut Emit<'_>,
    ) -> Result<(), TrainError> {
        let layers = self.model.layers();
        if !(1..=layers).contains(&upto) {
            return Err(TrainError::Config(format!(
                "layer {} has no output: the model has layers 0 to {}",
                upto as i64 - 1,
                layers - 1
            )));
        }
        self.progress = true;
        let r = self.guarded(|ex| ex.predict_pass(upto, wanted, emit));
        self.progress = false;
        r
    }

    fn predict_pass(
        &mut self,
        upto: usize,
        wanted: &dyn Fn(u32) -> bool,
        emit: &mut Emit<'_>,
    ) -> Result<(), TrainError> {
        let layers = self.model.layers();
        // layer 0's output is no block when it runs inside layer 1, nor layer 1's where layer
        // 2's transform runs inside it: made per partition below
        let fused0 = upto == 1 && self.fused;
        let fused1 = upto == 2 && self.fused_transform();
        if !fused0 && !fused1 {
            self.forward_to(upto, false, 0)?;
        }
        let todo: Vec<usize> =
            self.local.clone().filter(|&q| self.own_ids(q).iter().any(|&v| wanted(v))).collect();
        let pb = self.layer_bar(upto - 1, &todo);
        // a partition's rows travel to the host while the next one computes, and are handed on
        // while the one after is queued
        let mut pending: Option<(Vec<u32>, usize, B::Leaving)> = None;
        for (i, &q) in todo.iter().enumerate() {
            let next = todo.get(i + 1).copied();
            let y = if upto == layers {
                self.output_rows(q, next, 0)?
            } else if fused0 || fused1 {
                // (layer 0's rows; layer 1's over its columns)
                let steps = if fused0 {
                    self.layer0_steps(q)
                } else {
                    self.layer1_over_columns_steps(q, next.unwrap_or(usize::MAX))
                };
                self.run(&steps, false, 0)?.y.expect("the layer's rows")
            } else {
                let own = self.own(BlockKind::Act, upto, q)?;
                self.prefetch(BlockKind::Act, upto, next.unwrap_or(usize::MAX), false, &[])?;
                let (n, d) = self.b.dims(&own);
                let mut y = self.b.output(n, d);
                self.b.copy(&own, &mut y);
                self.give_back(Some(own));
                y
            };
            let (rows, width) = self.b.dims(&y);
            self.meters.stats.download_bytes += (rows * width * std::mem::size_of::<B::T>()) as u64;
            let leaving = self.b.download_ahead(y);
            if let Some(done) = pending.replace((self.own_ids(q).to_vec(), width, leaving)) {
                self.hand_on(done, emit)?;
            }
            if let Some(pb) = &pb {
                pb.inc(rows as u64);
            }
        }
        if let Some(done) = pending.take() {
            self.hand_on(done, emit)?;
        }
        if let Some(pb) = pb {
            pb.finish_and_clear();
        }
        if !fused0 && !fused1 {
            self.remove_forward_blocks(upto)?;
        }
        Ok(())
    }

    /// Rows whose download started ahead to `emit` once they are on the host (without another
    /// copy where they are f32); the wait counts as write-back time.
    fn hand_on(
        &mut self,
        (ids, width, l): (Vec<u32>, usize, B::Leaving),
        emit: &mut Emit<'_>,
    ) -> Result<(), TrainError> {
        let t = Instant::now();
        let mut r = Ok(());
        let stats = &mut self.meters.stats;
        self.b.downloaded(l, &mut |host: &[B::T]| {
            stats.write_back_s += t.elapsed().as_secs_f64();
            r = match bytemuck::try_cast_slice::<B::T, f32>(host) {
                Ok(rows) => emit(&ids, rows, width),
                Err(_) => emit(&ids, &host.iter().map(|x| x.f64() as f32).collect::<Vec<f32>>(), width),
            };
        });
        r
    }

    /// The dataset's ids of partition `q`'s own nodes, in row order.
    pub(super) fn own_ids(&self, q: usize) -> &[u32] {
        let first = self.partitioning.ptr[q] as usize;
        &self.partitioning.inv_perm[first..first + self.parts[q].own]
    }

    /// A progress bar over the rows of `parts` for layer `l`, while [`Executor::predict`] runs.
    pub(super) fn layer_bar(&self, l: usize, parts: &[usize]) -> Option<progress::ProgressBar> {
        let rows: usize = parts.iter().map(|&q| self.parts[q].own).sum();
        self.progress.then(|| progress::counter(rows as u64, &format!("layer {l}"), "rows"))
    }
}
