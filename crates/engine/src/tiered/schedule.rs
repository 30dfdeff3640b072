//! The schedule of a pass: hidden layers forward partition by partition, then backward layer
//! by layer (the output layer gives the loss and the logits' gradients; each layer's gradient
//! blocks complete before the layer below), evaluation, and the refusal after a failed pass.

use grinnder_nn::model::LayerTape;

use super::*;

/// Layer 1's input rows over its columns ([`Executor::layer0_columns`]), with what layer 0's
/// backward reads: its input (`Â x` over the columns) and its tape.
pub(super) struct Layer0Columns<B: Backend> {
    x: B::Mat,
    pre: B::Mat,
    tape: LayerTape<B>,
    /// The partition's columns as rows (what layer 0 ran on).
    columns: Graph<B>,
}

impl<'a, B: Backend> Executor<'a, B> {
    /// Forward over all partitions: hidden layers into the store, and the output layer's
    /// transform when it runs split (its aggregation happens where the logits are used).
    pub(super) fn forward_layers(&mut self, train: bool, epoch: u64) -> Result<(), TrainError> {
        self.forward_to(self.model.layers(), train, epoch)
    }

    /// [`Executor::forward_layers`] up to layer `upto - 1`: its output rows (layer `upto`'s
    /// input) end in the store; `upto = layers()` is the whole forward. With
    /// [`Executor::fused`], layer 0 runs only inside layer 1, so `upto` is then at least 2.
    pub(super) fn forward_to(&mut self, upto: usize, train: bool, epoch: u64) -> Result<(), TrainError> {
        let b = self.b;
        let layers = self.model.layers();
        assert!(upto > 1 || !self.fused, "layer 0's output is never a block when fused");
        let inside = self.fused_transform();
        assert!(upto != 2 || !inside, "layer 1's output is never a block with layer 2's transform inside");
        for l in 0..upto.min(layers) {
            let top = l + 1 == layers;
            if l == 0 && self.fused {
                continue;
            }
            // without a backward to come, a layer's input goes once the layer read it
            let spent = !train && self.forward_input_is_block(l);
            if self.split(l) {
                // (with layer 2's transform inside layer 1, its rows were made there)
                if !(l == 2 && inside) {
                    self.forward_transform(l, spent, train, epoch)?;
                }
                if top {
                    break;
                }
                let pb = self.layer_bar(l, &self.local.clone().collect::<Vec<_>>());
                for q in self.local.clone() {
                    pb.iter().for_each(|pb| pb.inc(self.parts[q].own as u64));
                    let h = self.gather_kind(BlockKind::Xw, l, q, true)?;
                    let x = self.split_own_input(l, q)?;
                    self.prefetch(BlockKind::Xw, l, q + 1, true, &[])?;
                    let t = Instant::now();
                    let (y, _) =
                        self.model.split_forward(b, &self.parts[q].graph, l, &h, x.as_deref(), train, epoch);
                    drop(h);
                    self.give_back(x);
                    self.stats.compute_s += t.elapsed().as_secs_f64();
                    self.put(BlockKind::Act, l + 1, q, y)?;
                }
                self.sync_act(l + 1)?;
                self.mark("forward aggregation", l);
                if !train {
                    self.remove_layer_inputs(l, spent)?;
                }
                continue;
            }
            if top {
                break;
            }
            let pb = self.layer_bar(l, &self.local.clone().collect::<Vec<_>>());
            for q in self.local.clone() {
                pb.iter().for_each(|pb| pb.inc(self.parts[q].own as u64));
                let inp = if l == 1 && self.fused {
                    let x = self.layer0_columns(q, q + 1, train, epoch)?.x;
                    Inputs { x: Some(Own::Copy(x)), pre: None }
                } else {
                    let inp = self.inputs(l, q)?;
                    self.prefetch(BlockKind::Act, l, q + 1, !(l == 0 && self.pre), &[])?;
                    inp
                };
                let x0 = self.initial_rows(l, q)?;
                let t = Instant::now();
                let g = &self.parts[q].graph;
                let (x, pre) = (inp.x(), inp.pre.as_deref());
                let (y, tape, made) =
                    self.model.layer_forward_initial(b, g, l, x, pre, x0.as_deref(), train, epoch);
                drop(tape);
                self.give_back_inputs(inp);
                self.give_back(x0);
                if let Some(x0) = made {
                    self.stats.compute_s += t.elapsed().as_secs_f64();
                    self.put(BlockKind::Initial, 0, q, x0)?;
                    self.put(BlockKind::Act, l + 1, q, y)?;
                    continue;
                }
                if l == 1 && inside {
                    let h = self.model.split_transform(b, 2, &y);
                    drop(y);
                    self.stats.compute_s += t.elapsed().as_secs_f64();
                    self.put(BlockKind::Xw, 2, q, h)?;
                    continue;
                }
                self.stats.compute_s += t.elapsed().as_secs_f64();
                self.put(BlockKind::Act, l + 1, q, y)?;
            }
            if l == 1 && inside {
                self.sync_mirrors(BlockKind::Xw, 2)?;
            } else {
                self.sync_act(l + 1)?;
            }
            self.mark("forward", l);
            if !train {
                self.remove_layer_inputs(l, spent)?;
            }
        }
        Ok(())
    }

    /// Split layer `l`'s transform over every partition, its rows put as blocks; its input
    /// removed partition by partition where `spent` and its aggregation does not read it again.
    fn forward_transform(
        &mut self,
        l: usize,
        spent: bool,
        train: bool,
        epoch: u64,
    ) -> Result<(), TrainError> {
        let read_again = self.model.split_reads_own_input(l);
        for q in self.local.clone() {
            let x = if l == 1 && self.fused {
                Own::Copy(self.layer0(q, train, epoch)?)
            } else {
                let x = self.own(BlockKind::Act, l, q)?;
                self.prefetch(BlockKind::Act, l, q + 1, false, &[])?;
                x
            };
            let t = Instant::now();
            let h = self.model.split_transform(self.b, l, &x);
            self.give_back(Some(x));
            self.stats.compute_s += t.elapsed().as_secs_f64();
            if spent && !read_again {
                self.remove(act(l, q))?;
            }
            self.put(BlockKind::Xw, l, q, h)?;
        }
        self.sync_mirrors(BlockKind::Xw, l)?;
        self.mark("forward transform", l);
        Ok(())
    }

    /// Partition `q`'s rows of the initial representation where layer `l` reads it (GCNII's
    /// layers after the first: [`BlockKind::Initial`]).
    pub(super) fn initial_rows(&mut self, l: usize, q: usize) -> Result<Option<Own<B>>, TrainError> {
        if l > 0 && self.model.has_initial() {
            Ok(Some(self.own(BlockKind::Initial, 0, q)?))
        } else {
            Ok(None)
        }
    }

    /// Asserts that a model with an initial representation runs every layer unsplit, unfused
    /// and recomputed for its backward: x0 is read and its gradient summed on that path alone
    /// ([`Executor::initial_rows`], [`Executor::initial_grad`]; GCNII's layers never split).
    pub(super) fn assert_initial_runs_whole(&self) {
        let m = &self.model;
        let whole =
            |l: usize| !m.split(l, l == 0 && self.pre) && !m.backward_from_output(l, l == 0 && self.pre);
        assert!(
            !m.has_initial() || (!self.fused && (0..m.layers()).all(whole)),
            "a model with an initial representation runs its layers unsplit and recomputed"
        );
    }

    /// Partition `q`'s rows of the initial representation's gradient for layer `l`'s backward
    /// where the model has one: zeros for a layer that reads `x0` to add its part to (written
    /// back into [`BlockKind::GradInitial`]), the later layers' sum for layer 0, which makes it
    /// (`None` where no later layer reads it).
    fn initial_grad(&mut self, l: usize, q: usize) -> Result<Option<B::Mat>, TrainError> {
        if !self.model.has_initial() {
            return Ok(None);
        }
        let (own, c) = (self.parts[q].own, self.width(BlockKind::GradInitial, 0));
        if l > 0 {
            return Ok(Some(self.b.zeros(own, c)));
        }
        let id = BlockId { kind: BlockKind::GradInitial, layer: 0, part: q };
        if self.model.layers() == 1 || !self.written(id) {
            return Ok(None);
        }
        Ok(Some(match self.own(BlockKind::GradInitial, 0, q)? {
            Own::Copy(m) => m,
            lent => {
                // (the block is the GPU tier's: the layer adds to its own copy)
                let mut m = self.b.output(own, c);
                self.b.copy(&lent, &mut m);
                self.give_back(Some(lent));
                m
            }
        }))
    }

    /// Whether layer `l`'s input is a block a pass makes (a hidden layer's output): not the
    /// features or layer 0's aggregation, made once for every pass, nor layer 1's input where
    /// layer 0 runs inside layer 1, nor layer 2's where its transform runs inside layer 1
    /// ([`Executor::fused_transform`]).
    pub(super) fn forward_input_is_block(&self, l: usize) -> bool {
        l >= 1 && !(l == 1 && self.fused) && !(l == 2 && self.fused_transform())
    }

    /// Removes what a forward pass without a backward is done with once layer `l` ran (not the
    /// output layer): its transformed rows, and its input where `spent`
    /// ([`Executor::forward_input_is_block`]), every partition's, mirrors included.
    fn remove_layer_inputs(&mut self, l: usize, spent: bool) -> Result<(), TrainError> {
        for q in 0..self.parts.len() {
            self.remove(BlockId { kind: BlockKind::Xw, layer: l, part: q })?;
            if spent {
                self.remove(act(l, q))?;
            }
        }
        Ok(())
    }

    /// Layer 0's output rows of partition `q` (layer 1's input, never stored when
    /// [`Executor::fused`]).
    pub(super) fn layer0(&mut self, q: usize, train: bool, epoch: u64) -> Result<B::Mat, TrainError> {
        let inp = self.inputs(0, q)?;
        self.prefetch(BlockKind::Act, 0, q + 1, false, &[])?;
        let t = Instant::now();
        let g = &self.parts[q].graph;
        let (y, tape) = self.model.layer_forward(self.b, g, 0, inp.x(), inp.pre.as_deref(), train, epoch);
        drop(tape);
        self.give_back_inputs(inp);
        self.stats.compute_s += t.elapsed().as_secs_f64();
        Ok(y)
    }

    /// Layer 1's input rows over its columns when layer 0 runs inside layer 1 unsplit
    /// ([`Executor::fusible`]): layer 0's aggregation gathered over the columns (partition
    /// `next`'s read ahead) and layer 0 run on every row of it, the halo rows as their owners
    /// make them (the same rows in, dropout keyed by node); with that aggregation and layer 0's
    /// tape, for its backward.
    pub(super) fn layer0_columns(
        &mut self,
        q: usize,
        next: usize,
        train: bool,
        epoch: u64,
    ) -> Result<Layer0Columns<B>, TrainError> {
        let pre = self.gather_kind(BlockKind::Pre, 0, q, true)?;
        self.prefetch(BlockKind::Pre, 0, next, true, &[])?;
        let t = Instant::now();
        let columns = self.parts[q].graph.columns_only();
        let (x, tape) = self.model.layer_forward(self.b, &columns, 0, &pre, Some(&pre), train, epoch);
        self.stats.compute_s += t.elapsed().as_secs_f64();
        Ok(Layer0Columns { x, pre, tape, columns })
    }

    /// Layers 1 (unsplit) and 0 backward on partition `q` when [`Executor::fused`]: layer 0
    /// remade over layer 1's columns ([`Executor::layer0_columns`]), layer 1 forward and
    /// backward on it, and layer 0's backward on every column's input gradient at once (its
    /// weight gradient sums over rows: each halo row's share adds here what its owner would).
    fn fused_columns_backward(
        &mut self,
        q: usize,
        loss: &mut f64,
        correct: &mut usize,
        epoch: u64,
    ) -> Result<(), TrainError> {
        let b = self.b;
        let top = self.model.layers() == 2;
        let inside = self.fused_transform();
        let Layer0Columns { x: x1, pre, tape: tape0, columns } =
            self.layer0_columns(q, q + 1, true, epoch)?;
        if inside {
            self.prefetch(BlockKind::GradXw, 2, q + 1, false, &[])?;
        } else if !top {
            self.prefetch(BlockKind::Grad, 2, q + 1, false, &[])?;
        }
        let t = Instant::now();
        let g = &self.parts[q].graph;
        let (y, tape) = self.model.layer_forward(b, g, 1, &x1, None, true, epoch);
        self.stats.compute_s += t.elapsed().as_secs_f64();
        let dy = if inside {
            // layer 2's transform backward on the rows just remade: its weight gradient, and
            // the gradient of layer 1's output
            let dh = self.own(BlockKind::GradXw, 2, q)?;
            let t = Instant::now();
            let dy = self.model.split_transform_backward(b, 2, &y, &dh, true).expect("an input gradient");
            self.stats.compute_s += t.elapsed().as_secs_f64();
            self.give_back(Some(dh));
            self.remove(BlockId { kind: BlockKind::GradXw, layer: 2, part: q })?;
            dy
        } else {
            self.output_grad(1, q, &y, loss, correct)?
        };
        drop(y);
        let t = Instant::now();
        let g = &self.parts[q].graph;
        let dx1 =
            self.model.layer_backward(b, g, 1, &x1, None, tape, &dy, true, None).expect("an input gradient");
        drop((x1, dy));
        let dx0 = self.model.layer_backward(b, &columns, 0, &pre, Some(&pre), tape0, &dx1, false, None);
        assert!(dx0.is_none(), "layer 0 makes no input gradient");
        self.stats.compute_s += t.elapsed().as_secs_f64();
        Ok(())
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
        self.measured_working = None;
        self.measured_device_working = None;
        let transform_inside = self.fused_transform();
        self.forward_layers(true, epoch)?;
        let (mut loss, mut correct) = (0.0, 0usize);
        for l in (0..layers).rev() {
            let top = l + 1 == layers;
            let next_grad: &[BlockKind] = if top { &[] } else { &[BlockKind::Grad] };
            if l == 0 && self.fused {
                // ran inside layer 1's backward
                continue;
            }
            if self.split(l) {
                // aggregation backward: dh of own rows here, of halo rows to their owners
                for q in self.local.clone() {
                    let h = self.gather_kind(BlockKind::Xw, l, q, true)?;
                    let x = self.split_own_input(l, q)?;
                    self.prefetch(BlockKind::Xw, l, q + 1, true, next_grad)?;
                    let t = Instant::now();
                    let g = &self.parts[q].graph;
                    let (y, tape) = self.model.split_forward(b, g, l, &h, x.as_deref(), true, epoch);
                    drop(h);
                    self.stats.compute_s += t.elapsed().as_secs_f64();
                    let dy = self.output_grad(l, q, &y, &mut loss, &mut correct)?;
                    drop(y);
                    let t = Instant::now();
                    let g = &self.parts[q].graph;
                    let (dh, dx_root) = self.model.split_backward(b, g, l, x.as_deref(), tape, &dy, l > 0);
                    drop(dy);
                    self.give_back(x);
                    self.stats.compute_s += t.elapsed().as_secs_f64();
                    let t = Instant::now();
                    self.write_back(BlockKind::GradXw, l, q, dh)?;
                    if let Some(d) = dx_root {
                        self.write_back(BlockKind::Grad, l, q, d)?;
                    }
                    self.stats.write_back_s += t.elapsed().as_secs_f64();
                }
                self.flush_mirrors(BlockKind::GradXw, l)?;
                self.mark("backward aggregation", l);
                // the transformed rows are spent (the transform's backward reads its input and
                // their gradient): blocks go as soon as nothing reads them, so that the most
                // held at once, not every block an epoch makes, is what must fit
                for q in 0..self.parts.len() {
                    self.remove(BlockId { kind: BlockKind::Xw, layer: l, part: q })?;
                }
                // (with layer 2's transform inside layer 1, its backward runs inside layer 1's,
                // which removes each partition's dh once read: fused_columns_backward)
                let inside = l == 2 && transform_inside;
                let input_spent = self.input_spent_after_transform(l);
                // transform backward, once every dh row is complete
                for q in if inside { 0..0 } else { self.local.clone() } {
                    if l == 1 && self.fused {
                        self.fused_backward(q, epoch)?;
                        self.remove(BlockId { kind: BlockKind::GradXw, layer: l, part: q })?;
                        continue;
                    }
                    let x = self.own(BlockKind::Act, l, q)?;
                    let dh = self.own(BlockKind::GradXw, l, q)?;
                    self.prefetch(BlockKind::Act, l, q + 1, false, &[BlockKind::GradXw])?;
                    let t = Instant::now();
                    let dx = self.model.split_transform_backward(b, l, &x, &dh, l > 0);
                    self.give_back(Some(x));
                    self.give_back(Some(dh));
                    self.stats.compute_s += t.elapsed().as_secs_f64();
                    self.remove(BlockId { kind: BlockKind::GradXw, layer: l, part: q })?;
                    if input_spent {
                        self.remove(act(l, q))?;
                    }
                    if let Some(dx) = dx {
                        let t = Instant::now();
                        self.write_back(BlockKind::Grad, l, q, dx)?;
                        self.stats.write_back_s += t.elapsed().as_secs_f64();
                    }
                }
                if !inside {
                    self.mark("backward transform", l);
                    for q in 0..self.parts.len() {
                        self.remove(BlockId { kind: BlockKind::GradXw, layer: l, part: q })?;
                    }
                }
            } else {
                let from_output = self.model.backward_from_output(l, l == 0 && self.pre);
                for q in self.local.clone() {
                    if l == 1 && self.fused {
                        self.fused_columns_backward(q, &mut loss, &mut correct, epoch)?;
                        continue;
                    }
                    let inp = self.inputs(l, q)?;
                    let (x, pre) = (inp.x(), inp.pre.as_deref());
                    let next: &[BlockKind] =
                        if from_output { &[BlockKind::Act, BlockKind::Grad] } else { next_grad };
                    self.prefetch(BlockKind::Act, l, q + 1, !(l == 0 && self.pre), next)?;
                    let dx = if from_output {
                        // the stored output is the ReLU/dropout mask: no recomputation
                        let out = self.own(BlockKind::Act, l + 1, q)?;
                        let dy = self.own(BlockKind::Grad, l + 1, q)?;
                        let t = Instant::now();
                        let tape =
                            self.model.tape_from_output(l, l == 0 && self.pre, epoch).expect("allowed");
                        let g = &self.parts[q].graph;
                        let dx = self.model.layer_backward(b, g, l, x, pre, tape, &dy, l > 0, Some(&out));
                        self.stats.compute_s += t.elapsed().as_secs_f64();
                        self.give_back(Some(out));
                        self.give_back(Some(dy));
                        dx
                    } else {
                        let x0 = self.initial_rows(l, q)?;
                        let t = Instant::now();
                        let g = &self.parts[q].graph;
                        let (y, tape, _) =
                            self.model.layer_forward_initial(b, g, l, x, pre, x0.as_deref(), true, epoch);
                        self.stats.compute_s += t.elapsed().as_secs_f64();
                        let dy = self.output_grad(l, q, &y, &mut loss, &mut correct)?;
                        drop(y);
                        let mut dx0 = self.initial_grad(l, q)?;
                        let t = Instant::now();
                        let g = &self.parts[q].graph;
                        let initial = (x0.as_deref(), dx0.as_mut());
                        let dx =
                            self.model.layer_backward_initial(b, g, l, x, pre, initial, tape, &dy, l > 0);
                        self.stats.compute_s += t.elapsed().as_secs_f64();
                        self.give_back(x0);
                        // a reader's part of x0's gradient, into the sum layer 0 reads
                        if let Some(dx0) = dx0.filter(|_| l > 0) {
                            let t = Instant::now();
                            self.write_back(BlockKind::GradInitial, 0, q, dx0)?;
                            self.stats.write_back_s += t.elapsed().as_secs_f64();
                        }
                        dx
                    };
                    self.give_back_inputs(inp);
                    if let Some(dx) = dx {
                        let t = Instant::now();
                        self.write_back(BlockKind::Grad, l, q, dx)?;
                        self.stats.write_back_s += t.elapsed().as_secs_f64();
                    }
                }
                if l > 0 && !(l == 1 && self.fused) {
                    self.flush_mirrors(BlockKind::Grad, l)?;
                }
                self.mark("backward", l);
            }
            // layer l + 1's blocks are spent (and layer 2's dh where its transform's backward
            // ran inside layer 1's: mirrors too); x0 once layer 1 read it, its gradient once
            // layer 0 did
            for q in 0..self.parts.len() {
                if l == 1 {
                    self.remove(BlockId { kind: BlockKind::Initial, layer: 0, part: q })?;
                }
                if l == 0 {
                    self.remove(BlockId { kind: BlockKind::GradInitial, layer: 0, part: q })?;
                }
                self.remove(BlockId { kind: BlockKind::Grad, layer: l + 1, part: q })?;
                if !top {
                    self.remove(act(l + 1, q))?;
                }
                if l == 1 && transform_inside {
                    self.remove(BlockId { kind: BlockKind::GradXw, layer: 2, part: q })?;
                }
            }
        }
        self.tiers.store.sync().map_err(io_err)?;
        if calibrate {
            self.calibrated = true;
            self.place_more()?;
        }
        Ok((loss, correct))
    }

    /// Measures the heap's growth since the last mark, the working set of the phase that just
    /// ended (with `--block-cache 0` the store holds only blocks in use, so the growth is all
    /// working set); logs it at trace level and keeps the largest for
    /// [`Executor::take_measured_working`].
    pub(super) fn mark(&mut self, phase: &str, l: usize) {
        grinnder_graph::progress::activity_phase(&format!("{phase} of layer {l} done"));
        if let (Some(live), Some(peak)) = (crate::heap::live_bytes(), crate::heap::peak_bytes()) {
            let grew = peak.saturating_sub(self.marked);
            tracing::trace!("{phase} of layer {l}: heap grew {:.1} MiB", grew as f64 / 1048576.0);
            self.measured_working = Some(self.measured_working.unwrap_or(0).max(grew));
            crate::heap::reset_peak();
            self.marked = live;
        }
        if let (Some(peak), Some(m)) = (self.b.phase_memory_peak(), self.b.device_memory()) {
            let blocks = self.device_block_bytes();
            let (used, before) = self.device_marked;
            // what the phase held beyond what was in use when it began, less the GPU tier's
            // blocks then, and the blocks it holds at its end (blocks dropped after the last
            // mark no longer count): its kernels' inputs, outputs and temporaries
            let grew = peak.saturating_sub(used.saturating_sub(before)).saturating_sub(blocks);
            tracing::trace!("{phase} of layer {l}: GPU memory grew {:.1} MiB", grew as f64 / 1048576.0);
            self.measured_device_working = Some(self.measured_device_working.unwrap_or(0).max(grew));
            self.device_marked = (m.used, blocks);
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
        self.measured_working.take()
    }

    /// The largest growth of the backend's memory in a phase beyond the GPU-tier blocks it
    /// added (see [`Executor::mark`]); `None` where memory is not a device's.
    pub fn take_measured_device_working(&mut self) -> Option<u64> {
        self.measured_device_working.take()
    }

    /// Layers 1 (its transform) and 0 backward on partition `q` when [`Executor::fused`]: layer
    /// 0's output is remade from its inputs, layer 1's weight gradient and input gradient made
    /// from it, and layer 0's backward run on that gradient at once.
    pub(super) fn fused_backward(&mut self, q: usize, epoch: u64) -> Result<(), TrainError> {
        let b = self.b;
        let inp = self.inputs(0, q)?;
        let dh = self.own(BlockKind::GradXw, 1, q)?;
        self.prefetch(BlockKind::Act, 0, q + 1, false, &[])?;
        self.prefetch(BlockKind::GradXw, 1, q + 1, false, &[])?;
        let t = Instant::now();
        let g = &self.parts[q].graph;
        let (x1, tape) = self.model.layer_forward(b, g, 0, inp.x(), inp.pre.as_deref(), true, epoch);
        let dx1 = self.model.split_transform_backward(b, 1, &x1, &dh, true).expect("an input gradient");
        drop(x1);
        self.give_back(Some(dh));
        let g = &self.parts[q].graph;
        let dx0 = self.model.layer_backward(b, g, 0, inp.x(), inp.pre.as_deref(), tape, &dx1, false, None);
        assert!(dx0.is_none(), "layer 0 makes no input gradient");
        self.give_back_inputs(inp);
        self.stats.compute_s += t.elapsed().as_secs_f64();
        Ok(())
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
        let b = self.b;
        let l = self.model.layers() - 1;
        let next = next.unwrap_or(usize::MAX);
        if self.split(l) {
            let h = self.gather_kind(BlockKind::Xw, l, q, true)?;
            let x = self.split_own_input(l, q)?;
            self.prefetch(BlockKind::Xw, l, next, true, &[])?;
            let t = Instant::now();
            let (y, _) = self.model.split_forward(b, &self.parts[q].graph, l, &h, x.as_deref(), false, epoch);
            self.stats.compute_s += t.elapsed().as_secs_f64();
            self.give_back(x);
            return Ok(y);
        }
        if l == 1 && self.fused {
            return self.layer1_over_columns(q, next, epoch);
        }
        let inp = self.inputs(l, q)?;
        self.prefetch(BlockKind::Act, l, next, !(l == 0 && self.pre), &[])?;
        let x0 = self.initial_rows(l, q)?;
        let t = Instant::now();
        let g = &self.parts[q].graph;
        let (x, pre) = (inp.x(), inp.pre.as_deref());
        let (y, _, _) = self.model.layer_forward_initial(b, g, l, x, pre, x0.as_deref(), false, epoch);
        self.stats.compute_s += t.elapsed().as_secs_f64();
        self.give_back_inputs(inp);
        self.give_back(x0);
        Ok(y)
    }

    /// Layer 1's output rows of partition `q` without dropout where layer 0 runs over its
    /// columns ([`Executor::layer0_columns`]; `next`: the partition whose inputs to start
    /// loading): the output layer's, or rows that are never a block
    /// ([`Executor::fused_transform`]).
    pub(super) fn layer1_over_columns(
        &mut self,
        q: usize,
        next: usize,
        epoch: u64,
    ) -> Result<B::Mat, TrainError> {
        let x = self.layer0_columns(q, next, false, epoch)?.x;
        let t = Instant::now();
        let (y, _) = self.model.layer_forward(self.b, &self.parts[q].graph, 1, &x, None, false, epoch);
        self.stats.compute_s += t.elapsed().as_secs_f64();
        Ok(y)
    }

    /// Removes what a forward pass up to layer `upto` left: the hidden layers' outputs and the
    /// output layer's transformed rows.
    pub(super) fn remove_forward_blocks(&mut self, upto: usize) -> Result<(), TrainError> {
        let layers = self.model.layers();
        for q in 0..self.parts.len() {
            for layer in 1..=upto.min(layers - 1) {
                self.remove(act(layer, q))?;
            }
            if upto == layers {
                self.remove(BlockId { kind: BlockKind::Xw, layer: layers - 1, part: q })?;
            }
            self.remove(BlockId { kind: BlockKind::Initial, layer: 0, part: q })?;
        }
        self.tiers.store.sync().map_err(io_err)
    }

    /// Phase times and store counters since the last call.
    pub fn take_stats(&mut self) -> PhaseStats {
        let mut s = std::mem::take(&mut self.stats);
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
