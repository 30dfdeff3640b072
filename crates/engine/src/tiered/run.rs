//! The executor running a pass's steps ([`pass`]): reads into operands, computations on them,
//! results into blocks. The cost model walks the same steps over its ledger (`cost.rs`).

use std::collections::HashMap;
use std::time::Instant;

use grinnder_graph::progress;
use grinnder_nn::model::LayerTape;
use grinnder_nn::Graph;
use grinnder_tensor::Backend;

use crate::config::TrainError;

use super::executor::{Executor, Own};
use super::pass::{self, Op, Reg, Span, Step};
use super::store::BlockKind;

/// Layer 0 run over layer 1's columns for a backward ([`Op::ColumnsForTape`]): its rows (layer
/// 1's input), its input, its tape, and the columns as rows.
struct Columns<B: Backend> {
    x: B::Mat,
    pre: B::Mat,
    tape: LayerTape<B>,
    graph: Graph<B>,
}

/// The operands and results between steps, the tapes between a forward and its backward, the
/// loss so far and the progress bar of the layer running.
struct Regs<B: Backend> {
    regs: HashMap<Reg, Own<B>>,
    tape: Option<LayerTape<B>>,
    columns: Option<Columns<B>>,
    loss: f64,
    correct: usize,
    bar: Option<progress::ProgressBar>,
}

/// What a run of steps leaves: the output rows (`Y`) where the steps end with them, and the
/// training loss and correct predictions their [`Op::Loss`] steps summed.
pub(super) struct Ran<B: Backend> {
    pub y: Option<B::Mat>,
    pub loss: f64,
    pub correct: usize,
}

impl<B: Backend> Regs<B> {
    fn new() -> Self {
        Regs { regs: HashMap::new(), tape: None, columns: None, loss: 0.0, correct: 0, bar: None }
    }

    fn fill(&mut self, r: Reg, m: Own<B>) {
        let old = self.regs.insert(r, m);
        assert!(old.is_none(), "operand {r:?} filled twice: a step's result was never used");
    }

    /// Fills `r` with `m` where a computation made it.
    fn fill_some(&mut self, r: Reg, m: Option<B::Mat>) {
        if let Some(m) = m {
            self.fill(r, Own::Copy(m));
        }
    }

    /// An operand a computation reads and leaves for a later one.
    fn kept(&self, r: Reg) -> Option<&B::Mat> {
        self.regs.get(&r).map(|m| &**m)
    }

    fn result(&mut self, r: Reg) -> B::Mat {
        match self.regs.remove(&r) {
            Some(Own::Copy(m)) => m,
            Some(Own::Lent(id, _)) => panic!("{id:?} lent as operand {r:?} cannot become a block"),
            None => panic!("operand {r:?} used before a step made it"),
        }
    }
}

impl<B: Backend> Executor<'_, B> {
    /// Runs `steps` (dropout where `train`, keyed by `epoch`); returns the output rows (`Y`)
    /// they leave, if any. Every other operand is used by a step: a step that fills one twice,
    /// or reads one no step made, panics naming it.
    pub(super) fn run(&mut self, steps: &[Step], train: bool, epoch: u64) -> Result<Ran<B>, TrainError> {
        if cfg!(debug_assertions) {
            pass::check(steps);
        }
        let mut r = Regs::new();
        for step in steps {
            match *step {
                Step::Read { into, id, span } => {
                    let m = match span {
                        Span::Own => self.own(id.kind, id.layer, id.part)?,
                        Span::Columns => Own::Copy(self.gather_kind(id.kind, id.layer, id.part, true)?),
                        Span::Copy => Own::Copy(self.gather_kind(id.kind, id.layer, id.part, false)?),
                    };
                    r.fill(into, m);
                }
                Step::Prefetch { kind, layer, part, halo, extra } => {
                    self.prefetch(kind, layer, part, halo, extra)?
                }
                Step::Compute { part, op } => {
                    let t = Instant::now();
                    self.compute(&mut r, part, op, train, epoch);
                    // (the loss was never timed as compute: the figures stay comparable)
                    if op != Op::Loss {
                        self.meters.stats.compute_s += t.elapsed().as_secs_f64();
                    }
                }
                Step::Put { from, id } => {
                    let m = r.result(from);
                    self.put(id.kind, id.layer, id.part, m)?;
                }
                Step::WriteBack { from, id, span } => {
                    let m = r.result(from);
                    let (rows, part) = (self.b.dims(&m).0, &self.parts[id.part]);
                    let want = if span == Span::Own { part.own } else { part.graph.cols };
                    assert_eq!(rows, want, "{id:?}'s gradient written back over {span:?} has {rows} rows");
                    let t = Instant::now();
                    self.write_back(id.kind, id.layer, id.part, m)?;
                    self.meters.stats.write_back_s += t.elapsed().as_secs_f64();
                }
                Step::Sync { kind, layer } => self.sync_mirrors(kind, layer)?,
                Step::Flush { kind, layer } => self.flush_mirrors(kind, layer)?,
                Step::Remove(id) => self.remove(id)?,
                Step::Mark { phase, layer } => {
                    // a layer's bar ends with its phase
                    r.bar = None;
                    self.mark(phase, layer);
                }
                Step::Bar { layer } => r.bar = self.layer_bar(layer, &self.local.clone().collect::<Vec<_>>()),
                Step::Tick { part } => {
                    if let Some(pb) = &r.bar {
                        pb.inc(self.parts[part].own as u64);
                    }
                }
            }
        }
        let y = r.regs.contains_key(&Reg::Y).then(|| r.result(Reg::Y));
        assert!(
            r.regs.is_empty(),
            "operands left unused by the pass: {:?}",
            r.regs.keys().collect::<Vec<_>>()
        );
        assert!(r.tape.is_none() && r.columns.is_none(), "a forward's tape left without its backward");
        Ok(Ran { y, loss: r.loss, correct: r.correct })
    }

    /// `op` on partition `q`: its operands taken (lent blocks given back once it ran), its
    /// results filled.
    fn compute(&mut self, r: &mut Regs<B>, q: usize, op: Op, train: bool, epoch: u64) {
        let mut operands: Vec<Option<Own<B>>> = op.reads().iter().map(|k| r.regs.remove(k)).collect();
        match op {
            Op::Forward { .. } | Op::ColumnsForward | Op::Transform { .. } | Op::Aggregate { .. } => {
                self.compute_forward(r, q, op, &operands, train, epoch)
            }
            Op::FusedBackward | Op::ColumnsForTape | Op::Layer1ForTape { .. } | Op::ColumnsBackward => {
                self.compute_fused(r, q, op, &mut operands, epoch)
            }
            _ => self.compute_backward(r, q, op, &mut operands, epoch),
        }
        for m in operands {
            self.give_back(m);
        }
    }

    /// [`Executor::compute`] of a forward's `op` on its `operands`.
    fn compute_forward(
        &mut self,
        r: &mut Regs<B>,
        q: usize,
        op: Op,
        operands: &[Option<Own<B>>],
        train: bool,
        epoch: u64,
    ) {
        let b = self.b;
        let arg = |i: usize| operands[i].as_deref();
        let g = &self.parts[q].graph;
        match op {
            Op::Forward { l, into, made } => {
                let (x, pre, x0) = (arg(0), arg(1), arg(2));
                let x = x.or(pre).expect("a layer's input rows");
                let (y, tape, x0_made) = self.model.layer_forward_initial(b, g, l, x, pre, x0, train, epoch);
                drop(tape);
                r.fill(into, Own::Copy(y));
                match (made, x0_made) {
                    (Some(m), Some(x0)) => r.fill(m, Own::Copy(x0)),
                    (Some(_), None) => panic!("layer {l} made no initial representation"),
                    (None, _) => {}
                }
            }
            Op::ColumnsForward => {
                let pre = arg(0).expect("layer 0's aggregation over the columns");
                let columns = g.columns_only();
                let (x, tape) = self.model.layer_forward(b, &columns, 0, pre, Some(pre), train, epoch);
                drop(tape);
                r.fill(Reg::X, Own::Copy(x));
            }
            Op::Transform { l, .. } => {
                let h = self.model.split_transform(b, l, arg(0).expect("the rows to transform"));
                r.fill(Reg::H, Own::Copy(h));
            }
            Op::Aggregate { l } => {
                let h = arg(0).expect("the transformed rows");
                let (y, _) = self.model.split_forward(b, g, l, h, arg(1), train, epoch);
                r.fill(Reg::Y, Own::Copy(y));
            }
            _ => unreachable!("a backward's step"),
        }
    }

    /// [`Executor::compute`] of a backward's `op` (dropout as the forward's of `epoch`).
    fn compute_backward(
        &mut self,
        r: &mut Regs<B>,
        q: usize,
        op: Op,
        operands: &mut [Option<Own<B>>],
        epoch: u64,
    ) {
        let b = self.b;
        let g = &self.parts[q].graph;
        match op {
            Op::AggregateForTape { l, into } => {
                let h = operands[0].as_deref().expect("the transformed rows");
                let (y, tape) = self.model.split_forward(b, g, l, h, r.kept(Reg::Root), true, epoch);
                r.tape = Some(tape);
                r.fill_some(into.unwrap_or(Reg::Y), into.map(|_| y));
            }
            Op::SplitBackward { l } => {
                let (root, dy) = (operands[0].as_deref(), operands[1].as_deref().expect("dy"));
                let tape = r.tape.take().expect("the aggregation's tape");
                let (dh, dx) = self.model.split_backward(b, g, l, root, tape, dy, l > 0);
                r.fill(Reg::Dh, Own::Copy(dh));
                r.fill_some(Reg::Dx, dx);
            }
            Op::Loss if self.given.is_some() => {
                let given = self.given.as_mut().and_then(|g| g[q].take());
                r.fill(Reg::Dy, Own::Copy(given.expect("one output gradient per partition")));
            }
            Op::Loss => {
                let y = operands[0].as_deref().expect("the output rows");
                let part = &self.parts[q];
                let (rows, cols) = b.dims(y);
                let mut dy = b.zeros(rows, cols);
                let scale = 1.0 / self.n_train as f64;
                let (s, c) = b.cross_entropy(y, &part.labels, &part.split_rows[0], scale, &mut dy);
                (r.loss, r.correct) = (r.loss + s, r.correct + c);
                r.fill(Reg::Dy, Own::Copy(dy));
            }
            Op::TransformBackward { l, into, .. } => {
                let (x, dh) =
                    (operands[0].as_deref().expect("the input rows"), operands[1].as_deref().expect("dh"));
                let dx = self.model.split_transform_backward(b, l, x, dh, l > 0);
                r.fill_some(into, dx);
            }
            Op::BackwardFromOutput { l } => {
                let (x, pre) = (operands[0].as_deref(), operands[1].as_deref());
                let (out, dy) = (operands[2].as_deref(), operands[3].as_deref().expect("dy"));
                let on_pre = l == 0 && self.pre;
                let tape = self.model.tape_from_output(l, on_pre, epoch).expect("allowed");
                let x = x.or(pre).expect("the layer's input");
                let dx = self.model.layer_backward(b, g, l, x, pre, tape, dy, l > 0, out);
                r.fill_some(Reg::Dx, dx);
            }
            Op::ForwardForTape { l, into } => {
                let (x, pre, x0) = (r.kept(Reg::X), r.kept(Reg::Pre), r.kept(Reg::X0));
                let x = x.or(pre).expect("the layer's input");
                let (y, tape, _) = self.model.layer_forward_initial(b, g, l, x, pre, x0, true, epoch);
                r.tape = Some(tape);
                r.fill_some(into.unwrap_or(Reg::Y), into.map(|_| y));
            }
            Op::Backward { l } => {
                // x0's gradient: zeros a reader adds its part to, or the sum layer 0 reads
                let mut dx0 = match operands[4].take() {
                    Some(Own::Copy(m)) => Some(m),
                    Some(Own::Lent(id, _)) => panic!("{id:?} lent where its copy is added to"),
                    None if l > 0 && self.model.has_initial() => {
                        Some(b.zeros(self.parts[q].own, self.width(BlockKind::GradInitial, 0)))
                    }
                    None => None,
                };
                let (x, pre, x0) = (operands[0].as_deref(), operands[1].as_deref(), operands[2].as_deref());
                let (x, dy) = (x.or(pre).expect("the layer's input"), operands[3].as_deref().expect("dy"));
                let tape = r.tape.take().expect("the forward's tape");
                let dx =
                    self.model.layer_backward_initial(b, g, l, x, pre, (x0, dx0.as_mut()), tape, dy, l > 0);
                r.fill_some(Reg::Dx, dx);
                r.fill_some(Reg::Dx0, dx0.filter(|_| l > 0));
            }
            _ => unreachable!("a fused layer's or a forward's step"),
        }
    }

    /// [`Executor::compute`] of layers 0 and 1 together where layer 0 runs inside
    /// layer 1 ([`Executor::fused`]), `operands` taken.
    fn compute_fused(
        &mut self,
        r: &mut Regs<B>,
        q: usize,
        op: Op,
        operands: &mut [Option<Own<B>>],
        epoch: u64,
    ) {
        let b = self.b;
        let g = &self.parts[q].graph;
        match op {
            Op::FusedBackward => {
                let (x, pre, dh) = (operands[0].as_deref(), operands[1].as_deref(), operands[2].as_deref());
                let (x, dh) = (x.or(pre).expect("layer 0's input"), dh.expect("dh"));
                let (x1, tape) = self.model.layer_forward(b, g, 0, x, pre, true, epoch);
                let dx1 =
                    self.model.split_transform_backward(b, 1, &x1, dh, true).expect("an input gradient");
                drop(x1);
                let dx0 = self.model.layer_backward(b, g, 0, x, pre, tape, &dx1, false, None);
                assert!(dx0.is_none(), "layer 0 makes no input gradient");
            }
            Op::ColumnsForTape => {
                let Some(Own::Copy(pre)) = operands[0].take() else {
                    panic!("layer 0's aggregation over the columns")
                };
                let graph = g.columns_only();
                let (x, tape) = self.model.layer_forward(b, &graph, 0, &pre, Some(&pre), true, epoch);
                r.columns = Some(Columns { x, pre, tape, graph });
            }
            Op::Layer1ForTape { into } => {
                let c = r.columns.as_ref().expect("layer 0 over the columns");
                let (y, tape) = self.model.layer_forward(b, g, 1, &c.x, None, true, epoch);
                r.tape = Some(tape);
                r.fill_some(into.unwrap_or(Reg::Y), into.map(|_| y));
            }
            Op::ColumnsBackward => {
                let dy = operands[0].as_deref().expect("dy");
                let c = r.columns.take().expect("layer 0 over the columns");
                let tape = r.tape.take().expect("layer 1's tape");
                let dx1 = self
                    .model
                    .layer_backward(b, g, 1, &c.x, None, tape, dy, true, None)
                    .expect("an input gradient");
                let dx0 = self.model.layer_backward(
                    b,
                    &c.graph,
                    0,
                    &c.pre,
                    Some(&c.pre),
                    c.tape,
                    &dx1,
                    false,
                    None,
                );
                assert!(dx0.is_none(), "layer 0 makes no input gradient");
            }
            _ => unreachable!("a step of an unfused layer"),
        }
    }
}

impl<B: Backend> Executor<'_, B> {
    /// Seconds of partition `q`'s computations in `steps` (the cost model's compute, measured:
    /// `calibrate.rs`): each read fills its operand with values of the right shape instead
    /// of the block's rows, each computation runs as [`Executor::run`] runs it, timed between
    /// synchronisations of the backend (making its operands does not count), and results are
    /// dropped instead of put. Other partitions' steps, reads ahead, mirrors and removals are
    /// not run. Gradients accumulate into the model's.
    pub(super) fn time_steps(
        &mut self,
        steps: &[Step],
        q: usize,
        fill: &dyn Fn(usize, usize) -> B::Mat,
    ) -> f64 {
        let b = self.b;
        let mut r = Regs::new();
        let mut secs = 0.0;
        for step in steps {
            match *step {
                Step::Read { into, id, span } if id.part == q => {
                    let part = &self.parts[q];
                    let rows = if span == Span::Columns { part.graph.cols } else { part.own };
                    r.fill(into, Own::Copy(fill(rows, self.width(id.kind, id.layer))));
                }
                Step::Compute { part, op } if part == q => {
                    b.synchronize();
                    let t = Instant::now();
                    self.compute(&mut r, q, op, true, 0);
                    b.synchronize();
                    secs += t.elapsed().as_secs_f64();
                }
                Step::Put { from, id } | Step::WriteBack { from, id, .. } if id.part == q => {
                    drop(r.result(from));
                }
                _ => {}
            }
        }
        assert!(
            r.regs.is_empty() && r.tape.is_none() && r.columns.is_none(),
            "partition {q}'s steps left operands"
        );
        secs
    }
}
