//! The schedule of a pass: hidden layers forward partition by partition, then backward layer
//! by layer (the output layer gives the loss and the logits' gradients; each layer's gradient
//! blocks complete before the layer below), evaluation, and the refusal after a failed pass.

use grinnder_tensor::Backend;

use crate::config::TrainError;

use super::dist::CommStats;
use super::executor::{io_err, Executor};
use super::meters::PhaseStats;

impl<'a, B: Backend> Executor<'a, B> {
    /// Forward over all partitions: hidden layers into the store, and the output layer's
    /// transform when it runs split (its aggregation happens where the logits are used).
    pub(super) fn forward_layers(&mut self, train: bool, epoch: u64) -> Result<(), TrainError> {
        self.forward_to(self.model.layers(), train, epoch)
    }

    /// [`Executor::forward_layers`] up to layer `upto - 1`: its output rows (layer `upto`'s
    /// input) end in the store; `upto = layers()` is the whole forward. With
    /// [`Executor::fused`], layer 0 runs only inside layer 1, so `upto` is then at least 2.
    /// The steps are [`Executor::forward_steps`]'s.
    pub(super) fn forward_to(&mut self, upto: usize, train: bool, epoch: u64) -> Result<(), TrainError> {
        let steps = self.forward_steps(upto, train);
        let y = self.run(&steps, train, epoch)?.y;
        assert!(y.is_none(), "a forward pass puts every output it makes");
        Ok(())
    }

    /// Asserts that a model with an initial representation runs every layer unsplit, unfused
    /// and recomputed for its backward: x0 is read and its gradient summed on that path alone
    /// ([`Executor::initial_steps`], and the `Dx0` operand of
    /// [`Executor::unsplit_backward_steps`]; GCNII's layers never split).
    pub(super) fn assert_initial_runs_whole(&self) {
        let m = &self.model;
        let whole =
            |l: usize| !m.split(l, l == 0 && self.pre) && !m.backward_from_output(l, l == 0 && self.pre);
        assert!(
            !m.has_initial() || (!self.fused && (0..m.layers()).all(whole)),
            "a model with an initial representation runs its layers unsplit and recomputed"
        );
    }

    /// Whether layer `l`'s input is a block a pass makes (a hidden layer's output): not the
    /// features or layer 0's aggregation, made once for every pass, nor layer 1's input where
    /// layer 0 runs inside layer 1, nor layer 2's where its transform runs inside layer 1
    /// ([`Executor::fused_transform`]).
    pub(super) fn forward_input_is_block(&self, l: usize) -> bool {
        l >= 1 && !(l == 1 && self.fused) && !(l == 2 && self.fused_transform())
    }

    /// Whether split layer `l`'s input block is spent once the layer's transform backward read
    /// a partition's rows: it is a block (not layer 0's features or aggregation, nor layer 1's
    /// input made by layer 0 inside it), and the layer below recomputes its output rather than
    /// read this block as its ReLU mask ([`Model::backward_from_output`]).
    pub(super) fn input_spent_after_transform(&self, l: usize) -> bool {
        self.forward_input_is_block(l) && !self.model.backward_from_output(l - 1, l == 1 && self.pre)
    }

    /// One training pass: accumulates every parameter's gradient (the caller zeroes them) and
    /// returns the summed training loss and the number of correct training predictions.
    pub fn forward_backward(&mut self, epoch: u64) -> Result<(f64, usize), TrainError> {
        // (the trainer refuses first, naming the fix: see Trainer::for_model)
        assert!(!self.inference, "a training pass on an executor planned to predict");
        self.guarded(|ex| ex.forward_backward_pass(epoch))
    }

    /// `pass`, unless an earlier one failed; its error stops the executor.
    pub(super) fn guarded<R>(
        &mut self,
        pass: impl FnOnce(&mut Self) -> Result<R, TrainError>,
    ) -> Result<R, TrainError> {
        if let Some(e) = &self.stopped {
            return Err(TrainError::Stopped(e.clone()));
        }
        let r = pass(self);
        match &r {
            Err(e) => self.stopped = Some(e.to_string()),
            // a pass gives back every block it lent (invariant 2 of the module)
            Ok(_) => assert!(self.tiers.none_lent(), "a pass ended with a block still lent"),
        }
        r
    }

    // stays whole: the pass is the schedule (forward layers, then each layer's backward over
    // every partition, its gradient blocks flushed before the layer below) read top to bottom
    pub(super) fn forward_backward_pass(&mut self, epoch: u64) -> Result<(f64, usize), TrainError> {
        let b = self.b;
        let layers = self.model.layers();
        let calibrate = self.gpu_mem.is_some() && !self.calibrated;
        if calibrate {
            b.reset_memory_peak();
        }
        self.mark("the time before the pass", 0);
        grinnder_graph::progress::activity_begin();
        self.meters.begin_pass();
        let mut steps = self.forward_steps(layers, true);
        steps.extend(self.backward_steps());
        let ran = self.run(&steps, true, epoch)?;
        self.tiers.store.sync().map_err(io_err)?;
        if calibrate {
            self.calibrated = true;
            self.place_more()?;
        }
        Ok((ran.loss, ran.correct))
    }

    /// Measures the heap's growth since the last mark, the working set of the phase that just
    /// ended (with `--block-cache 0` the store holds only blocks in use, so the growth is all
    /// working set); logs it at trace level and keeps the largest for
    /// [`Executor::take_measured_working`].
    pub(super) fn mark(&mut self, phase: &str, l: usize) {
        grinnder_graph::progress::activity_phase(&format!("{phase} of layer {l} done"));
        if let (Some(live), Some(peak)) = (crate::heap::live_bytes(), crate::heap::peak_bytes()) {
            let grew = self.meters.heap(live, peak);
            tracing::trace!("{phase} of layer {l}: heap grew {:.1} MiB", grew as f64 / 1048576.0);
            crate::heap::reset_peak();
        }
        if let (Some(peak), Some(m)) = (self.b.phase_memory_peak(), self.b.device_memory()) {
            let grew = self.meters.device(m.used, peak, self.device_block_bytes());
            tracing::trace!("{phase} of layer {l}: GPU memory grew {:.1} MiB", grew as f64 / 1048576.0);
        }
    }

    /// Bytes of the blocks the GPU tier holds now.
    fn device_block_bytes(&self) -> u64 {
        let elem = std::mem::size_of::<B::T>();
        self.tiers.device_blocks().map(|m| self.b.dims(m)).map(|(r, c)| (r * c * elem) as u64).sum()
    }

    /// The largest heap growth of a phase since the last call (see [`Executor::mark`]);
    /// `None` without the counting allocator.
    pub fn take_measured_working(&mut self) -> Option<u64> {
        self.meters.take_working()
    }

    /// The largest growth of the backend's memory in a phase beyond the GPU-tier blocks it
    /// added (see [`Executor::mark`]); `None` where memory is not a device's.
    pub fn take_measured_device_working(&mut self) -> Option<u64> {
        self.meters.take_device_working()
    }

    /// Evaluation pass (no dropout): correct predictions on train, valid and test.
    pub fn evaluate(&mut self, epoch: u64) -> Result<[usize; 3], TrainError> {
        self.guarded(|ex| ex.evaluate_pass(epoch))
    }

    pub(super) fn evaluate_pass(&mut self, epoch: u64) -> Result<[usize; 3], TrainError> {
        let b = self.b;
        // (its steps count on in the epoch's: progress says which pass they are)
        grinnder_graph::progress::activity_pass("evaluation");
        grinnder_graph::progress::activity_phase("");
        if cfg!(debug_assertions) {
            // the evaluation's runs, checked as one stream (a sync missing before the output
            // layer's halo reads shows only so)
            let mut steps = self.forward_steps(self.model.layers(), false);
            self.local.clone().for_each(|q| steps.extend(self.output_steps(q, q + 1)));
            steps.extend(self.remove_forward_steps(self.model.layers()));
            super::pass::check(&steps);
        }
        self.forward_layers(false, epoch)?;
        let mut correct = [0usize; 3];
        for q in self.local.clone() {
            let y = self.output_rows(q, Some(q + 1), epoch)?;
            let part = &self.parts[q];
            for (k, rows) in part.split_rows.iter().enumerate() {
                correct[k] += b.count_correct(&y, &part.labels, rows);
            }
        }
        self.remove_forward_blocks(self.model.layers())?;
        Ok(correct)
    }

    /// The output layer's rows of partition `q` without dropout, once the hidden layers ran
    /// ([`Executor::forward_layers`]); `next` is the partition whose inputs to start loading.
    pub(super) fn output_rows(
        &mut self,
        q: usize,
        next: Option<usize>,
        epoch: u64,
    ) -> Result<B::Mat, TrainError> {
        let steps = self.output_steps(q, next.unwrap_or(usize::MAX));
        Ok(self.run(&steps, false, epoch)?.y.expect("the output layer's rows"))
    }

    /// Removes what a forward pass up to layer `upto` left: the hidden layers' outputs and the
    /// output layer's transformed rows ([`Executor::remove_forward_steps`]).
    pub(super) fn remove_forward_blocks(&mut self, upto: usize) -> Result<(), TrainError> {
        let steps = self.remove_forward_steps(upto);
        self.run(&steps, false, 0)?;
        self.tiers.store.sync().map_err(io_err)
    }

    /// Phase times and store counters since the last call.
    pub fn take_stats(&mut self) -> PhaseStats {
        let mut s = std::mem::take(&mut self.meters.stats);
        s.tier = self.tiers.store.take_stats();
        if let Some(d) = self.dist.as_mut() {
            d.take_comm_seconds();
            // every rank's bytes, summed (the counters of this reduction count next time)
            let mine = std::mem::take(&mut d.stats);
            let all = d.reduce.all_gather(&serde_json::to_vec(&mine).expect("counters serialise"));
            let mut total = CommStats::default();
            for b in all {
                let c: CommStats = serde_json::from_slice(&b).expect("counters deserialise");
                total.add(&c);
            }
            s.comm = Some(total);
        }
        s
    }
}
