//! The cost model's compute, measured: one partition's layers run on the backend as the
//! schedule runs them (the same model calls, on the partition's own graph), with inputs of
//! the right shapes in place of gathered blocks, each phase timed between synchronisations so
//! that making its inputs does not count. Counting operations alone fell 30–34 % short on an
//! H200 (products-like GCN-256, 2026-12-04: 0.043 s predicted against 0.061–0.065 s), where
//! kernel choices, launches and the element-wise kernels' real speed are not in the rates.

use std::time::Instant;

use grinnder_nn::{Graph, Model};
use grinnder_tensor::{Backend, Mat, Scalar};

use super::executor::Executor;

/// `f` timed between synchronisations of `b`, added to `secs`.
fn timed<B: Backend, R>(b: &B, secs: &mut f64, f: impl FnOnce() -> R) -> R {
    b.synchronize();
    let t = Instant::now();
    let r = f();
    b.synchronize();
    *secs += t.elapsed().as_secs_f64();
    r
}

/// The gradient of a layer's output, given the output.
type OutputGrad<'f, B> =
    &'f dyn Fn(&<B as grinnder_tensor::Memory>::Mat) -> <B as grinnder_tensor::Memory>::Mat;

/// Layer 0 over layer 1's columns from their `Â x` rows `p`, and layer 1 unsplit on them
/// ([`Executor::layer0_columns`]), timed into `secs`; with `output_grad` (the gradient of layer
/// 1's output), both backward as [`Executor::columns_backward_steps`] makes them.
fn time_over_columns<B: Backend>(
    b: &B,
    model: &mut Model<B>,
    g: &Graph<B>,
    p: &B::Mat,
    secs: &mut f64,
    output_grad: Option<OutputGrad<'_, B>>,
) {
    let columns = g.columns_only();
    let (x, tape0) = timed(b, secs, || model.layer_forward(b, &columns, 0, p, Some(p), true, 0));
    let (y, tape) = timed(b, secs, || model.layer_forward(b, g, 1, &x, None, true, 0));
    let Some(output_grad) = output_grad else { return };
    let dy = output_grad(&y);
    drop(y);
    timed(b, secs, || {
        let dx = model.layer_backward(b, g, 1, &x, None, tape, &dy, true, None).expect("an input gradient");
        model.layer_backward(b, &columns, 0, p, Some(p), tape0, &dx, false, None)
    });
}

/// A layer's forward again and its backward, as the schedule runs an unsplit layer's backward,
/// timed into `secs`; `initial`: the initial representation's rows and its gradient's, where
/// the model has one.
#[allow(clippy::too_many_arguments)]
fn time_backward<B: Backend>(
    b: &B,
    model: &mut Model<B>,
    g: &Graph<B>,
    l: usize,
    (x, p): (&B::Mat, Option<&B::Mat>),
    (x0, dx0): (Option<&B::Mat>, Option<&mut B::Mat>),
    output_grad: OutputGrad<'_, B>,
    secs: &mut f64,
) {
    let (y, tape, _) = timed(b, secs, || model.layer_forward_initial(b, g, l, x, p, x0, true, 0));
    let dy = output_grad(&y);
    drop(y);
    timed(b, secs, || drop(model.layer_backward_initial(b, g, l, x, p, (x0, dx0), tape, &dy, l > 0)));
}

/// The training loss's gradient of logits `y`.
fn loss_grad<B: Backend>(b: &B, y: &B::Mat, labels: &[i32], train_rows: &[u32]) -> B::Mat {
    let (rows, w) = b.dims(y);
    let mut dy = b.zeros(rows, w);
    b.cross_entropy(y, labels, train_rows, 1.0, &mut dy);
    dy
}

/// A `rows × w` input of the backend, its values a ramp (timings need no particular values).
fn ramp<B: Backend>(b: &B, rows: usize, w: usize) -> B::Mat {
    let v = (0..rows * w).map(|i| B::T::of((i % 97) as f64 * 0.01 - 0.4)).collect();
    b.upload(&Mat::from_vec(rows, w, v))
}

impl<B: Backend> Executor<'_, B> {
    /// Seconds of partition `q`'s training compute in one epoch (see the module): its layers
    /// forward, then backward, as [`Executor::forward_backward_pass`] runs them. Gradients
    /// accumulate into the model's (the next pass zeroes them first).
    pub(super) fn time_compute(&mut self, q: usize) -> f64 {
        let b = self.b;
        let layers = self.model.layers();
        let (pre, fused) = (self.pre, self.fused);
        let part = &self.parts[q];
        let (own, cols, g) = (part.own, part.graph.cols, &part.graph);
        let (labels, train_rows) = (&part.labels, &part.split_rows[0]);
        let model = &mut self.model;
        let d: Vec<usize> = (0..=layers).map(|l| model.dim(l)).collect();
        let input = |rows: usize, w: usize| ramp(b, rows, w);
        let beside = model.reads_input_beside_pre();
        // a layer's inputs: on `Â x`, its own rows (and the input's where read beside it);
        // otherwise the columns' rows
        let inputs = |l: usize| -> (Option<B::Mat>, Option<B::Mat>) {
            if l == 0 && pre {
                (beside.then(|| input(own, d[0])), Some(input(own, d[0])))
            } else {
                (Some(input(cols, d[l])), None)
            }
        };
        // the loss's gradient of the logits (the top layer), or an output gradient
        let output_grad = |y: &B::Mat, top: bool, rows: usize, w: usize| match top {
            true => loss_grad(b, y, labels, train_rows),
            false => input(rows, w),
        };
        // the initial representation's own rows, for the layers that read it (GCNII's)
        let has_initial = model.has_initial();
        let initial = |l: usize| (l > 0 && has_initial).then(|| input(own, d[1]));
        let mut secs = 0.0;
        for l in 0..layers {
            let top = l + 1 == layers;
            if l == 0 && fused {
                continue;
            }
            if model.split(l, l == 0 && pre) {
                let x = if l == 1 && fused {
                    let (x, p) = inputs(0);
                    let x = x.as_ref().or(p.as_ref()).expect("an input");
                    timed(b, &mut secs, || model.layer_forward(b, g, 0, x, p.as_ref(), true, 0).0)
                } else {
                    input(own, d[l])
                };
                timed(b, &mut secs, || drop(model.split_transform(b, l, &x)));
                if top {
                    break;
                }
                let (h, x_own) =
                    (input(cols, d[l + 1]), model.split_reads_own_input(l).then(|| input(own, d[l])));
                timed(b, &mut secs, || drop(model.split_forward(b, g, l, &h, x_own.as_ref(), true, 0)));
            } else if !top {
                if l == 1 && fused {
                    time_over_columns(b, model, g, &input(cols, d[0]), &mut secs, None);
                    continue;
                }
                let (x, p) = inputs(l);
                let x = x.as_ref().or(p.as_ref()).expect("an input");
                let x0 = initial(l);
                timed(b, &mut secs, || {
                    drop(model.layer_forward_initial(b, g, l, x, p.as_ref(), x0.as_ref(), true, 0))
                });
            }
        }
        for l in (0..layers).rev() {
            let top = l + 1 == layers;
            if l == 0 && fused {
                continue;
            }
            if model.split(l, l == 0 && pre) {
                let (h, x_own) =
                    (input(cols, d[l + 1]), model.split_reads_own_input(l).then(|| input(own, d[l])));
                let (y, tape) =
                    timed(b, &mut secs, || model.split_forward(b, g, l, &h, x_own.as_ref(), true, 0));
                let dy = output_grad(&y, top, own, d[l + 1]);
                drop(y);
                timed(b, &mut secs, || drop(model.split_backward(b, g, l, x_own.as_ref(), tape, &dy, l > 0)));
                drop((h, dy));
                let dh = input(own, d[l + 1]);
                if l == 1 && fused {
                    let (x, p) = inputs(0);
                    let x = x.as_ref().or(p.as_ref()).expect("an input");
                    timed(b, &mut secs, || {
                        let (x1, tape) = model.layer_forward(b, g, 0, x, p.as_ref(), true, 0);
                        let dx1 =
                            model.split_transform_backward(b, 1, &x1, &dh, true).expect("an input gradient");
                        drop(x1);
                        model.layer_backward(b, g, 0, x, p.as_ref(), tape, &dx1, false, None)
                    });
                } else {
                    let x = input(own, d[l]);
                    timed(b, &mut secs, || drop(model.split_transform_backward(b, l, &x, &dh, l > 0)));
                }
                continue;
            }
            if l == 1 && fused {
                let dy = |y: &B::Mat| output_grad(y, top, own, d[2]);
                time_over_columns(b, model, g, &input(cols, d[0]), &mut secs, Some(&dy));
                continue;
            }
            let on_pre = l == 0 && pre;
            let (x, p) = inputs(l);
            let x = x.as_ref().or(p.as_ref()).expect("an input");
            if model.backward_from_output(l, on_pre) {
                let (out, dy) = (input(own, d[l + 1]), input(own, d[l + 1]));
                let tape = model.tape_from_output(l, on_pre, 0).expect("allowed");
                timed(b, &mut secs, || {
                    drop(model.layer_backward(b, g, l, x, p.as_ref(), tape, &dy, l > 0, Some(&out)))
                });
            } else {
                // (x0's gradient: a reader adds to it, the maker reads the sum)
                let (x0, mut dx0) = (initial(l), (has_initial && layers > 1).then(|| input(own, d[1])));
                let dy = |y: &B::Mat| output_grad(y, top, own, d[l + 1]);
                let initial = (x0.as_ref(), dx0.as_mut());
                time_backward(b, model, g, l, (x, p.as_ref()), initial, &dy, &mut secs);
            }
        }
        secs
    }
}
