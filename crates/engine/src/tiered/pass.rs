//! The pass as a value: the steps of a training pass (forward, then backward), of a forward
//! alone and of the output layer's rows, made once from the model, the partitioning and the
//! placement ([`Executor::forward_steps`], [`Executor::backward_steps`],
//! [`Executor::output_steps`]), then run by the executor (`run.rs`) and by the cost model's
//! ledger (`cost.rs`) alike: a read ahead, a removal or a new operand added here is moved by
//! the one and counted by the other. [`check`] asserts the executor's block invariants over
//! them (debug builds, every run).
//!
//! A step names blocks and the executor's operands ([`Reg`]): reads fill operands, a
//! [`Step::Compute`] consumes its operands ([`Op::reads`]) and fills its results, puts and
//! write-backs take results into blocks. What a computation needs between two steps of one
//! partition (a layer's tape from its forward to its backward) the executor keeps.

use grinnder_tensor::Backend;

use super::executor::Executor;
use super::plan::act;
use super::store::{BlockId, BlockKind};

/// An operand or result of a step: the rows one computation reads or makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Reg {
    /// A layer's input rows (own rows, or its columns: own then halo).
    X,
    /// Layer 0's aggregation `Â x` (own rows, or over layer 1's columns).
    Pre,
    /// The initial representation's own rows (GCNII's `x0`).
    X0,
    /// A split layer's transformed rows over its columns.
    H,
    /// A split layer's own input rows besides `H` (SAGE's root term).
    Root,
    /// A layer's output rows.
    Y,
    /// `x0`'s rows where layer 0 makes them.
    Made,
    /// A layer's stored output rows (its ReLU mask, for a backward without recomputation).
    Out,
    /// A layer's output gradient.
    Dy,
    /// The gradient of a split layer's transformed rows.
    Dh,
    /// A layer's input gradient (over its columns, or its own rows).
    Dx,
    /// `x0`'s gradient: a reader's part, or the sum layer 0 reads.
    Dx0,
}

/// Which rows of a partition's block a read takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Span {
    /// Its own rows (a GPU-tier block lent, not copied).
    Own,
    /// Own rows, then the halo rows from their owners' blocks (a copy).
    Columns,
    /// Its own rows, always a copy of the computation's own.
    Copy,
}

/// A computation on one partition's operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    /// Layer `l` unsplit on `X` (or `Pre`, and `X0` where read) into `into`; `x0` where layer
    /// 0 makes it, into `made` (dropped without).
    Forward { l: usize, into: Reg, made: Option<Reg> },
    /// Layer 0 over layer 1's columns (`Pre` gathered over them) into `X`.
    ColumnsForward,
    /// Split layer `l`'s transform of `from` into `H`.
    Transform { l: usize, from: Reg },
    /// Split layer `l`'s aggregation of `H` (and `Root`) into `Y`.
    Aggregate { l: usize },
    /// The same for its backward: `H` read, `Root` kept for [`Op::SplitBackward`], the tape
    /// kept, the output rows into `into` (dropped without).
    AggregateForTape { l: usize, into: Option<Reg> },
    /// Split layer `l`'s aggregation backward on `Dy`: `Dh` over the columns, and `Dx` of
    /// the root term's own rows where the layer has one and is not layer 0.
    SplitBackward { l: usize },
    /// The loss of the output rows `Y` into `Dy` (the loss and correct counts summed).
    Loss,
    /// Split layer `l`'s transform backward of `from` and `Dh`: its weight gradient, the input
    /// gradient into `into` (where `l > 0`).
    TransformBackward { l: usize, from: Reg, into: Reg },
    /// Layer 0 (its inputs) remade and layer 1's transform backward on `Dh`, then layer 0's
    /// backward: layers 1 and 0 where layer 0 runs inside layer 1 ([`Executor::fused`]).
    FusedBackward,
    /// Layer `l`'s backward from its stored output `Out` and `Dy` into `Dx`.
    BackwardFromOutput { l: usize },
    /// Layer `l` forward again on `X`/`Pre`/`X0` (kept), the tape kept, the output into
    /// `into` (dropped without).
    ForwardForTape { l: usize, into: Option<Reg> },
    /// Layer `l`'s backward on the tape and `Dy`: `Dx` where `l > 0`; with `x0`, its gradient
    /// (a reader's part into `Dx0`; layer 0 reads the sum from `Dx0`).
    Backward { l: usize },
    /// Layer 0 over layer 1's columns (`Pre` read) with its tape, kept for
    /// [`Op::ColumnsBackward`]; its rows kept as layer 1's input.
    ColumnsForTape,
    /// Layer 1 forward on those rows, its tape kept, its output into `into` (dropped without).
    Layer1ForTape { into: Option<Reg> },
    /// Layer 1's backward on `Dy`, then layer 0's on every column's input gradient at once.
    ColumnsBackward,
}

impl Op {
    /// The operands the computation reads, in the order it gives them back.
    pub(super) fn reads(&self) -> &'static [Reg] {
        match self {
            Op::Forward { .. } => &[Reg::X, Reg::Pre, Reg::X0],
            Op::ColumnsForward => &[Reg::Pre],
            Op::Transform { from: Reg::Y, .. } => &[Reg::Y],
            Op::Transform { .. } => &[Reg::X],
            Op::Aggregate { .. } => &[Reg::H, Reg::Root],
            Op::AggregateForTape { .. } => &[Reg::H],
            Op::SplitBackward { .. } => &[Reg::Root, Reg::Dy],
            Op::Loss => &[Reg::Y],
            Op::TransformBackward { from: Reg::Y, .. } => &[Reg::Y, Reg::Dh],
            Op::TransformBackward { .. } => &[Reg::X, Reg::Dh],
            Op::FusedBackward => &[Reg::X, Reg::Pre, Reg::Dh],
            Op::BackwardFromOutput { .. } => &[Reg::X, Reg::Pre, Reg::Out, Reg::Dy],
            Op::ColumnsForTape => &[Reg::Pre],
            Op::ForwardForTape { .. } | Op::Layer1ForTape { .. } => &[],
            Op::Backward { .. } => &[Reg::X, Reg::Pre, Reg::X0, Reg::Dy, Reg::Dx0],
            Op::ColumnsBackward => &[Reg::Dy],
        }
    }
}

/// One step of a pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Partition `id.part`'s rows of block `id` into operand `into`.
    Read { into: Reg, id: BlockId, span: Span },
    /// Start loading what partition `part` will read of the `kind` blocks of `layer` (with
    /// `halo`, its halo blocks' too) and its `extra` blocks ([`Executor::prefetch`]).
    Prefetch { kind: BlockKind, layer: usize, part: usize, halo: bool, extra: &'static [BlockKind] },
    /// A computation on partition `part`.
    Compute { part: usize, op: Op },
    /// Result `from` becomes block `id`.
    Put { from: Reg, id: BlockId },
    /// Gradient `from` added into block `id` (its own rows; with `Span::Columns` its halo
    /// rows into their owners' blocks too: [`Executor::write_back`]).
    WriteBack { from: Reg, id: BlockId, span: Span },
    /// Ranks: the halo gradients added into mirrors of the `kind` blocks of `layer` go to
    /// their owners ([`Executor::flush_mirrors`]).
    Flush { kind: BlockKind, layer: usize },
    /// Ranks: mirrors of the `kind` blocks of `layer` synced ([`Executor::sync_mirrors`]).
    Sync { kind: BlockKind, layer: usize },
    /// Block `id` (every tier's copy, a mirror too) is spent.
    Remove(BlockId),
    /// A phase ended ([`Executor::mark`]).
    Mark { phase: &'static str, layer: usize },
    /// A progress bar over layer `layer`'s rows of the local partitions begins.
    Bar { layer: usize },
    /// Partition `part` is done in the current bar.
    Tick { part: usize },
}

/// Asserts the executor's block invariants over a run of steps (the module's list in
/// `mod.rs`; the executor asserts the operands' as it runs them):
/// - a removed block is not read again unless put or written again first;
/// - a layer's gradient blocks are complete before any is read (invariant 3): no write-back
///   into the `kind` blocks of a layer once one of them was read, and a flush of the mirrors
///   between a write-back of halo rows and the first read;
/// - mirrors are synced after a layer's outputs exist and before any halo row of them is read
///   (invariant 4).
///
/// Panics naming the step and the rule it breaks.
pub(super) fn check(steps: &[Step]) {
    use std::collections::{HashMap, HashSet};
    let mut removed = HashSet::new();
    // per (kind, layer): gradients read, halo rows written and not yet flushed, the last put
    // and the last sync
    let (mut read, mut unflushed) = (HashSet::new(), HashMap::new());
    let (mut put, mut synced) = (HashMap::new(), HashMap::new());
    for (i, step) in steps.iter().enumerate() {
        match *step {
            Step::Read { id, span, .. } => {
                assert!(!removed.contains(&id), "step {i}: {id:?} read after its removal");
                let key = (id.kind, id.layer);
                // a partition's columns are other partitions' rows too: none of the layer's
                // blocks may be gone
                if span == Span::Columns {
                    if let Some(gone) = removed.iter().find(|r: &&BlockId| (r.kind, r.layer) == key) {
                        panic!("step {i}: halo rows of {id:?} read after the removal of {gone:?}");
                    }
                }
                if let Some(w) = unflushed.get(&key) {
                    panic!("step {i}: {id:?} read before the halo rows written at step {w} were flushed");
                }
                read.insert(key);
                if span == Span::Columns {
                    if let Some(&p) = put.get(&key) {
                        let s = synced.get(&key).copied();
                        assert!(
                            s.is_some_and(|s| s > p),
                            "step {i}: halo rows of {id:?} read before their mirrors' sync"
                        );
                    }
                }
            }
            Step::Put { id, .. } => {
                removed.remove(&id);
                put.insert((id.kind, id.layer), i);
            }
            Step::WriteBack { id, span, .. } => {
                removed.remove(&id);
                let key = (id.kind, id.layer);
                assert!(
                    !read.contains(&key),
                    "step {i}: {id:?} written back after a read of its layer's gradients"
                );
                if span == Span::Columns {
                    unflushed.insert(key, i);
                }
            }
            Step::Flush { kind, layer } => {
                unflushed.remove(&(kind, layer));
            }
            Step::Sync { kind, layer } => {
                synced.insert((kind, layer), i);
            }
            Step::Remove(id) => {
                removed.insert(id);
            }
            Step::Compute { .. }
            | Step::Prefetch { .. }
            | Step::Mark { .. }
            | Step::Bar { .. }
            | Step::Tick { .. } => {}
        }
    }
}

/// The read ahead of partition `part`'s own rows of the `kind` block of `layer` alone.
fn own_ahead(kind: BlockKind, layer: usize, part: usize) -> Step {
    Step::Prefetch { kind, layer, part, halo: false, extra: &[] }
}

fn id(kind: BlockKind, layer: usize, part: usize) -> BlockId {
    BlockId { kind, layer, part }
}

impl<B: Backend> Executor<'_, B> {
    /// [`Executor::forward_to`]'s steps: layers `0..upto` forward over every local partition,
    /// their outputs put as blocks (the output layer's only where it runs split: its
    /// transform); without `train`, each layer's inputs removed once read.
    pub(super) fn forward_steps(&self, upto: usize, train: bool) -> Vec<Step> {
        let layers = self.model.layers();
        assert!(upto > 1 || !self.fused, "layer 0's output is never a block when fused");
        let inside = self.fused_transform();
        assert!(upto != 2 || !inside, "layer 1's output is never a block with layer 2's transform inside");
        let mut s = Vec::new();
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
                    self.transform_steps(&mut s, l, spent);
                }
                if top {
                    break;
                }
                s.push(Step::Bar { layer: l });
                for q in self.local.clone() {
                    s.push(Step::Tick { part: q });
                    self.aggregate_steps(&mut s, l, q, q + 1);
                    s.push(Step::Put { from: Reg::Y, id: act(l + 1, q) });
                }
                self.sync_act_steps(&mut s, l + 1);
                s.push(Step::Mark { phase: "forward aggregation", layer: l });
                if !train {
                    self.remove_inputs_steps(&mut s, l, spent);
                }
                continue;
            }
            if top {
                break;
            }
            s.push(Step::Bar { layer: l });
            let made = (l == 0 && self.model.has_initial()).then_some(Reg::Made);
            for q in self.local.clone() {
                s.push(Step::Tick { part: q });
                if l == 1 && self.fused {
                    self.columns_steps(&mut s, q, q + 1);
                } else {
                    self.input_steps(&mut s, l, q);
                    s.push(self.input_prefetch(l, q + 1, &[]));
                    self.initial_steps(&mut s, l, q);
                }
                s.push(Step::Compute { part: q, op: Op::Forward { l, into: Reg::Y, made } });
                if made.is_some() {
                    s.push(Step::Put { from: Reg::Made, id: id(BlockKind::Initial, 0, q) });
                }
                if l == 1 && inside {
                    s.push(Step::Compute { part: q, op: Op::Transform { l: 2, from: Reg::Y } });
                    s.push(Step::Put { from: Reg::H, id: id(BlockKind::Xw, 2, q) });
                } else {
                    s.push(Step::Put { from: Reg::Y, id: act(l + 1, q) });
                }
            }
            if l == 1 && inside {
                s.push(Step::Sync { kind: BlockKind::Xw, layer: 2 });
            } else {
                self.sync_act_steps(&mut s, l + 1);
            }
            s.push(Step::Mark { phase: "forward", layer: l });
            if !train {
                self.remove_inputs_steps(&mut s, l, spent);
            }
        }
        s
    }

    /// Split layer `l`'s transform over every local partition, its rows put as blocks; its
    /// input removed partition by partition where `spent` and its aggregation does not read
    /// it again.
    fn transform_steps(&self, s: &mut Vec<Step>, l: usize, spent: bool) {
        let read_again = self.model.split_reads_own_input(l);
        for q in self.local.clone() {
            let from = if l == 1 && self.fused {
                // layer 0's output rows, never a block
                s.extend(self.layer0_steps(q));
                Reg::Y
            } else {
                s.push(Step::Read { into: Reg::X, id: act(l, q), span: Span::Own });
                s.push(own_ahead(BlockKind::Act, l, q + 1));
                Reg::X
            };
            s.push(Step::Compute { part: q, op: Op::Transform { l, from } });
            if spent && !read_again {
                s.push(Step::Remove(act(l, q)));
            }
            s.push(Step::Put { from: Reg::H, id: id(BlockKind::Xw, l, q) });
        }
        s.push(Step::Sync { kind: BlockKind::Xw, layer: l });
        s.push(Step::Mark { phase: "forward transform", layer: l });
    }

    /// Split layer `l`'s aggregation on partition `q` into `Y` (`next`: the partition to read
    /// ahead for).
    fn aggregate_steps(&self, s: &mut Vec<Step>, l: usize, q: usize, next: usize) {
        s.push(Step::Read { into: Reg::H, id: id(BlockKind::Xw, l, q), span: Span::Columns });
        if self.model.split_reads_own_input(l) {
            s.push(Step::Read { into: Reg::Root, id: act(l, q), span: Span::Own });
        }
        s.push(Step::Prefetch { kind: BlockKind::Xw, layer: l, part: next, halo: true, extra: &[] });
        s.push(Step::Compute { part: q, op: Op::Aggregate { l } });
    }

    /// Layer 0 over partition `q`'s columns into `X` ([`Executor::fusible`]: layer 1's
    /// input rows, halo rows as their owners make them), `next`'s aggregation read ahead.
    fn columns_steps(&self, s: &mut Vec<Step>, q: usize, next: usize) {
        s.push(Step::Read { into: Reg::Pre, id: id(BlockKind::Pre, 0, q), span: Span::Columns });
        s.push(Step::Prefetch { kind: BlockKind::Pre, layer: 0, part: next, halo: true, extra: &[] });
        s.push(Step::Compute { part: q, op: Op::ColumnsForward });
    }

    /// The reads of layer `l`'s inputs on partition `q`: its input over its columns, or at
    /// layer 0 on `Â x` its own rows of that (and of the input where the layer reads it
    /// beside).
    pub(super) fn input_steps(&self, s: &mut Vec<Step>, l: usize, q: usize) {
        if l == 0 && self.pre {
            s.push(Step::Read { into: Reg::Pre, id: id(BlockKind::Pre, 0, q), span: Span::Own });
            if self.model.reads_input_beside_pre() {
                s.push(Step::Read { into: Reg::X, id: act(0, q), span: Span::Own });
            }
        } else {
            s.push(Step::Read { into: Reg::X, id: act(l, q), span: Span::Columns });
        }
    }

    /// The read ahead of layer `l`'s inputs for partition `next` (with `extra` blocks).
    pub(super) fn input_prefetch(&self, l: usize, next: usize, extra: &'static [BlockKind]) -> Step {
        let halo = !(l == 0 && self.pre);
        Step::Prefetch { kind: BlockKind::Act, layer: l, part: next, halo, extra }
    }

    /// Partition `q`'s rows of the initial representation where layer `l` reads it.
    pub(super) fn initial_steps(&self, s: &mut Vec<Step>, l: usize, q: usize) {
        if l > 0 && self.model.has_initial() {
            s.push(Step::Read { into: Reg::X0, id: id(BlockKind::Initial, 0, q), span: Span::Own });
        }
    }

    /// Mirrors of layer `l`'s activations where a layer reads their halo rows.
    fn sync_act_steps(&self, s: &mut Vec<Step>, l: usize) {
        if !self.split(l) {
            s.push(Step::Sync { kind: BlockKind::Act, layer: l });
        }
    }

    /// What a forward pass without a backward is done with once layer `l` ran: its
    /// transformed rows, and its input where `spent`, every partition's (mirrors too).
    fn remove_inputs_steps(&self, s: &mut Vec<Step>, l: usize, spent: bool) {
        for q in 0..self.parts.len() {
            s.push(Step::Remove(id(BlockKind::Xw, l, q)));
            if spent {
                s.push(Step::Remove(act(l, q)));
            }
        }
    }

    /// The output layer's rows of partition `q` into `Y` once the hidden layers ran
    /// (`next`: the partition whose inputs to read ahead; `usize::MAX` for none).
    pub(super) fn output_steps(&self, q: usize, next: usize) -> Vec<Step> {
        let l = self.model.layers() - 1;
        let mut s = Vec::new();
        if self.split(l) {
            self.aggregate_steps(&mut s, l, q, next);
        } else {
            if l == 1 && self.fused {
                self.columns_steps(&mut s, q, next);
            } else {
                self.input_steps(&mut s, l, q);
                s.push(self.input_prefetch(l, next, &[]));
                self.initial_steps(&mut s, l, q);
            }
            s.push(Step::Compute { part: q, op: Op::Forward { l, into: Reg::Y, made: None } });
        }
        s
    }

    /// Layer 0's output rows of partition `q` into `Y` where they are never a block
    /// ([`Executor::fused`]).
    pub(super) fn layer0_steps(&self, q: usize) -> Vec<Step> {
        let mut s = Vec::new();
        self.input_steps(&mut s, 0, q);
        s.push(own_ahead(BlockKind::Act, 0, q + 1));
        s.push(Step::Compute { part: q, op: Op::Forward { l: 0, into: Reg::Y, made: None } });
        s
    }

    /// Layer 1's output rows of partition `q` into `Y` where layer 0 runs over its columns
    /// (`next`: the partition to read ahead for).
    pub(super) fn layer1_over_columns_steps(&self, q: usize, next: usize) -> Vec<Step> {
        let mut s = Vec::new();
        self.columns_steps(&mut s, q, next);
        s.push(Step::Compute { part: q, op: Op::Forward { l: 1, into: Reg::Y, made: None } });
        s
    }

    /// What a forward pass up to layer `upto` left, removed: the hidden layers' outputs, the
    /// output layer's transformed rows, and `x0`.
    pub(super) fn remove_forward_steps(&self, upto: usize) -> Vec<Step> {
        let layers = self.model.layers();
        let mut s = Vec::new();
        for q in 0..self.parts.len() {
            for layer in 1..=upto.min(layers - 1) {
                s.push(Step::Remove(act(layer, q)));
            }
            if upto == layers {
                s.push(Step::Remove(id(BlockKind::Xw, layers - 1, q)));
            }
            s.push(Step::Remove(id(BlockKind::Initial, 0, q)));
        }
        s
    }

    /// [`Executor::forward_backward_pass`]'s backward, once the forward ran: each layer's
    /// backward over every local partition from the output layer down, its gradient blocks
    /// complete (flushed to their owners) before the layer below, what it read removed after.
    pub(super) fn backward_steps(&self) -> Vec<Step> {
        let layers = self.model.layers();
        let mut s = Vec::new();
        for l in (0..layers).rev() {
            if l == 0 && self.fused {
                // ran inside layer 1's backward
                continue;
            }
            if self.split(l) {
                self.split_backward_steps(&mut s, l);
            } else {
                self.unsplit_backward_steps(&mut s, l);
            }
            // layer l + 1's blocks are spent (and layer 2's dh where its transform's backward
            // ran inside layer 1's); x0 once layer 1 read it, its gradient once layer 0 did
            let initial = self.model.has_initial();
            for q in 0..self.parts.len() {
                if l == 1 && initial {
                    s.push(Step::Remove(id(BlockKind::Initial, 0, q)));
                }
                if l == 0 && initial {
                    s.push(Step::Remove(id(BlockKind::GradInitial, 0, q)));
                }
                s.push(Step::Remove(id(BlockKind::Grad, l + 1, q)));
                if l + 1 < layers {
                    s.push(Step::Remove(act(l + 1, q)));
                }
                if l == 1 && self.fused_transform() {
                    s.push(Step::Remove(id(BlockKind::GradXw, 2, q)));
                }
            }
        }
        s
    }

    /// The output gradient of layer `l` on partition `q` into `Dy`, once its output rows are
    /// in `Y` at the top (the loss), or read from its block.
    fn output_grad_steps(&self, s: &mut Vec<Step>, l: usize, q: usize) {
        if l + 1 == self.model.layers() {
            s.push(Step::Compute { part: q, op: Op::Loss });
        } else {
            s.push(Step::Read { into: Reg::Dy, id: id(BlockKind::Grad, l + 1, q), span: Span::Copy });
        }
    }

    /// Split layer `l` backward: its aggregation's (dh of own rows here, of halo rows to their
    /// owners), then, once every dh row is complete, its transform's.
    fn split_backward_steps(&self, s: &mut Vec<Step>, l: usize) {
        let top = l + 1 == self.model.layers();
        let next_grad: &'static [BlockKind] = if top { &[] } else { &[BlockKind::Grad] };
        let root = self.model.split_reads_own_input(l);
        let into = top.then_some(Reg::Y);
        for q in self.local.clone() {
            s.push(Step::Read { into: Reg::H, id: id(BlockKind::Xw, l, q), span: Span::Columns });
            if root {
                s.push(Step::Read { into: Reg::Root, id: act(l, q), span: Span::Own });
            }
            s.push(Step::Prefetch {
                kind: BlockKind::Xw,
                layer: l,
                part: q + 1,
                halo: true,
                extra: next_grad,
            });
            s.push(Step::Compute { part: q, op: Op::AggregateForTape { l, into } });
            self.output_grad_steps(s, l, q);
            s.push(Step::Compute { part: q, op: Op::SplitBackward { l } });
            s.push(Step::WriteBack { from: Reg::Dh, id: id(BlockKind::GradXw, l, q), span: Span::Columns });
            if root && l > 0 {
                s.push(Step::WriteBack { from: Reg::Dx, id: id(BlockKind::Grad, l, q), span: Span::Own });
            }
        }
        s.push(Step::Flush { kind: BlockKind::GradXw, layer: l });
        s.push(Step::Mark { phase: "backward aggregation", layer: l });
        // the transformed rows are spent (the transform's backward reads its input and their
        // gradient): blocks go as soon as nothing reads them, so that the most held at once,
        // not every block an epoch makes, is what must fit
        for q in 0..self.parts.len() {
            s.push(Step::Remove(id(BlockKind::Xw, l, q)));
        }
        // (with layer 2's transform inside layer 1, its backward runs inside layer 1's, which
        // removes each partition's dh once read)
        if l == 2 && self.fused_transform() {
            return;
        }
        let input_spent = self.input_spent_after_transform(l);
        for q in self.local.clone() {
            if l == 1 && self.fused {
                self.input_steps(s, 0, q);
                s.push(Step::Read { into: Reg::Dh, id: id(BlockKind::GradXw, 1, q), span: Span::Own });
                s.push(own_ahead(BlockKind::Act, 0, q + 1));
                s.push(own_ahead(BlockKind::GradXw, 1, q + 1));
                s.push(Step::Compute { part: q, op: Op::FusedBackward });
                s.push(Step::Remove(id(BlockKind::GradXw, l, q)));
                continue;
            }
            s.push(Step::Read { into: Reg::X, id: act(l, q), span: Span::Own });
            s.push(Step::Read { into: Reg::Dh, id: id(BlockKind::GradXw, l, q), span: Span::Own });
            let extra = &[BlockKind::GradXw];
            s.push(Step::Prefetch { kind: BlockKind::Act, layer: l, part: q + 1, halo: false, extra });
            s.push(Step::Compute { part: q, op: Op::TransformBackward { l, from: Reg::X, into: Reg::Dx } });
            s.push(Step::Remove(id(BlockKind::GradXw, l, q)));
            if input_spent {
                s.push(Step::Remove(act(l, q)));
            }
            if l > 0 {
                s.push(Step::WriteBack { from: Reg::Dx, id: id(BlockKind::Grad, l, q), span: Span::Own });
            }
        }
        s.push(Step::Mark { phase: "backward transform", layer: l });
        for q in 0..self.parts.len() {
            s.push(Step::Remove(id(BlockKind::GradXw, l, q)));
        }
    }

    /// Unsplit layer `l` backward on every local partition: from its stored output where the
    /// layer allows, else after its forward again; its input gradient into the blocks below.
    fn unsplit_backward_steps(&self, s: &mut Vec<Step>, l: usize) {
        let layers = self.model.layers();
        let top = l + 1 == layers;
        let on_pre = l == 0 && self.pre;
        let from_output = self.model.backward_from_output(l, on_pre);
        let initial = self.model.has_initial();
        let next: &'static [BlockKind] = match (from_output, top) {
            (true, _) => &[BlockKind::Act, BlockKind::Grad],
            (false, true) => &[],
            (false, false) => &[BlockKind::Grad],
        };
        for q in self.local.clone() {
            if l == 1 && self.fused {
                self.columns_backward_steps(s, q);
                continue;
            }
            self.input_steps(s, l, q);
            s.push(self.input_prefetch(l, q + 1, next));
            if from_output {
                // the stored output is the ReLU/dropout mask: no recomputation
                s.push(Step::Read { into: Reg::Out, id: act(l + 1, q), span: Span::Own });
                s.push(Step::Read { into: Reg::Dy, id: id(BlockKind::Grad, l + 1, q), span: Span::Own });
                s.push(Step::Compute { part: q, op: Op::BackwardFromOutput { l } });
            } else {
                self.initial_steps(s, l, q);
                s.push(Step::Compute { part: q, op: Op::ForwardForTape { l, into: top.then_some(Reg::Y) } });
                self.output_grad_steps(s, l, q);
                if initial && l == 0 && layers > 1 && self.parts[q].own > 0 {
                    // the later layers' sum of x0's gradient, a copy layer 0 adds its part to
                    // (none for a partition without rows: nothing to add)
                    s.push(Step::Read {
                        into: Reg::Dx0,
                        id: id(BlockKind::GradInitial, 0, q),
                        span: Span::Copy,
                    });
                }
                s.push(Step::Compute { part: q, op: Op::Backward { l } });
                if initial && l > 0 {
                    // a reader's part of x0's gradient, into the sum layer 0 reads
                    s.push(Step::WriteBack {
                        from: Reg::Dx0,
                        id: id(BlockKind::GradInitial, 0, q),
                        span: Span::Own,
                    });
                }
            }
            if l > 0 {
                let span = if on_pre { Span::Own } else { Span::Columns };
                s.push(Step::WriteBack { from: Reg::Dx, id: id(BlockKind::Grad, l, q), span });
            }
        }
        if l > 0 && !(l == 1 && self.fused) {
            s.push(Step::Flush { kind: BlockKind::Grad, layer: l });
        }
        s.push(Step::Mark { phase: "backward", layer: l });
    }

    /// Layers 1 (unsplit) and 0 backward on partition `q` when [`Executor::fused`]: layer 0
    /// remade over layer 1's columns, layer 1 forward and backward on it, and layer 0's
    /// backward on every column's input gradient at once (its weight gradient sums over rows:
    /// each halo row's share adds here what its owner would).
    fn columns_backward_steps(&self, s: &mut Vec<Step>, q: usize) {
        let top = self.model.layers() == 2;
        let inside = self.fused_transform();
        s.push(Step::Read { into: Reg::Pre, id: id(BlockKind::Pre, 0, q), span: Span::Columns });
        s.push(Step::Prefetch { kind: BlockKind::Pre, layer: 0, part: q + 1, halo: true, extra: &[] });
        s.push(Step::Compute { part: q, op: Op::ColumnsForTape });
        if inside {
            s.push(own_ahead(BlockKind::GradXw, 2, q + 1));
        } else if !top {
            s.push(own_ahead(BlockKind::Grad, 2, q + 1));
        }
        let into = (inside || top).then_some(Reg::Y);
        s.push(Step::Compute { part: q, op: Op::Layer1ForTape { into } });
        if inside {
            // layer 2's transform backward on the rows just remade: its weight gradient, and
            // the gradient of layer 1's output
            s.push(Step::Read { into: Reg::Dh, id: id(BlockKind::GradXw, 2, q), span: Span::Own });
            s.push(Step::Compute {
                part: q,
                op: Op::TransformBackward { l: 2, from: Reg::Y, into: Reg::Dy },
            });
            s.push(Step::Remove(id(BlockKind::GradXw, 2, q)));
        } else {
            self.output_grad_steps(s, 1, q);
        }
        s.push(Step::Compute { part: q, op: Op::ColumnsBackward });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grad(layer: usize, part: usize) -> BlockId {
        id(BlockKind::Grad, layer, part)
    }

    fn read(i: BlockId, span: Span) -> Step {
        Step::Read { into: Reg::Dy, id: i, span }
    }

    fn write(i: BlockId, span: Span) -> Step {
        Step::WriteBack { from: Reg::Dx, id: i, span }
    }

    /// The rules hold for a stream that keeps them, and each stream breaking one panics.
    #[test]
    fn the_check_refuses_each_broken_rule() {
        let flush = Step::Flush { kind: BlockKind::Grad, layer: 1 };
        // halo rows written into two partitions' blocks, flushed, then read
        check(&[
            write(grad(1, 0), Span::Columns),
            write(grad(1, 1), Span::Columns),
            flush.clone(),
            read(grad(1, 0), Span::Copy),
        ]);
        let broken: [(&str, Vec<Step>); 6] = [
            (
                "read before the halo rows",
                vec![write(grad(1, 0), Span::Columns), read(grad(1, 1), Span::Copy)],
            ),
            (
                "written back after a read",
                vec![
                    write(grad(1, 0), Span::Own),
                    read(grad(1, 0), Span::Copy),
                    write(grad(1, 1), Span::Own),
                ],
            ),
            ("read after its removal", vec![Step::Remove(act(1, 0)), read(act(1, 0), Span::Own)]),
            ("halo rows of", vec![Step::Remove(act(1, 1)), read(act(1, 0), Span::Columns)]),
            (
                "before their mirrors' sync",
                vec![Step::Put { from: Reg::Y, id: act(1, 0) }, read(act(1, 0), Span::Columns)],
            ),
            (
                "before their mirrors' sync",
                vec![
                    Step::Sync { kind: BlockKind::Act, layer: 1 },
                    Step::Put { from: Reg::Y, id: act(1, 1) },
                    read(act(1, 0), Span::Columns),
                ],
            ),
        ];
        for (rule, steps) in broken {
            let e = std::panic::catch_unwind(|| check(&steps)).expect_err(rule);
            let msg = e.downcast_ref::<String>().expect("a message");
            assert!(msg.contains(rule), "{rule}: {msg}");
        }
        // a block put again after its removal is read
        check(&[
            Step::Remove(act(1, 0)),
            Step::Put { from: Reg::Y, id: act(1, 0) },
            read(act(1, 0), Span::Own),
        ]);
    }
}
