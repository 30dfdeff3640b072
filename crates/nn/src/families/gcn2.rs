//! GCNII (Chen et al., "Simple and Deep Graph Convolutional Networks"), as PyG's `GCN2Conv`
//! with shared weights, self loops and the symmetric normalisation:
//! `s = (1 − α) Â x + α x₀` (initial residual) and `y = (1 − β) s + β s W` (identity mapping),
//! `β = ln(θ / l + 1)` for layer `l` (1-based, as PyG's `layer`). Shapes: `x` `[cols, C]` (own
//! rows first), `x₀` `[rows, C]` (the initial representation of the output rows), `W`
//! `[C, C]` applied as `s W` (PyG's `weight1`, not transposed), `y` `[rows, C]`.
//!
//! The model is PyG's GCNII example (`examples/gcn2_cora.py`): `x₀ = relu(lins.0(drop(x)))`,
//! then for each of the `L` layers `x = relu(conv(drop(x), x₀))`, then `lins.1(drop(x))`. Its
//! layer `l` here ([`GcniiConv`]) is the `l`-th `GCN2Conv` with the maps around it: layer 0
//! begins with `lins.0` and makes `x₀` ([`Initial::Makes`]), every later layer reads `x₀`'s
//! output rows ([`Initial::Reads`]), and the output layer ends with ReLU, dropout and
//! `lins.1`. The model applies ReLU and dropout between layers as for every family, so
//! `--layers` counts the `GCN2Conv` layers and the dropouts fall where PyG's example puts
//! them (the one before the first conv and the one before `lins.1` are the layers' own,
//! [`Side::drop`]).

use grinnder_tensor::{Backend, Binary, MaskKey, Unary};

use crate::aggregation::Aggregation;
use crate::conv::{Cache, Conv, Family, Initial, LayerSpec, Side};
use crate::graph::Graph;
use crate::linear::Linear;
use crate::memory::{Held, Shape};
use crate::param::Param;
use crate::work::{Passes, Work};

pub struct Gcn2Conv<B: Backend> {
    /// `W`, applied as `s W` (PyG's `weight1`).
    pub weight: Param<B>,
    pub alpha: f64,
    pub beta: f64,
}

/// What backward needs: `s`, the layer's input to the identity mapping.
pub struct Gcn2Cache<B: Backend> {
    s: B::Mat,
}

impl<B: Backend> Gcn2Conv<B> {
    /// Layer `layer` (1-based, as PyG's) of `channels` with `α` and `θ`; its weight is named
    /// `{name}.weight1` (PyG's, shared weights).
    pub fn init(b: &B, name: &str, channels: usize, alpha: f64, theta: f64, layer: usize, seed: u64) -> Self {
        assert!(layer >= 1, "GCN2Conv's layer index is 1-based, as PyG's");
        Gcn2Conv {
            weight: Param::glorot(b, format!("{name}.weight1"), channels, channels, seed),
            alpha,
            beta: (theta / layer as f64 + 1.0).ln(),
        }
    }

    /// `g.rows` output rows from `x` (the columns' rows) and `x0` (the output rows').
    pub fn forward(&self, b: &B, g: &Graph<B>, x: &B::Mat, x0: &B::Mat) -> (B::Mat, Gcn2Cache<B>) {
        let c = b.dims(x).1;
        let a = g.adjacency(Aggregation::GcnNorm);
        let mut s = b.output(g.rows, c);
        a.spmm(b, false, x, 0.0, &mut s);
        b.unary(Unary::Scale(1.0 - self.alpha), &mut s);
        let mut initial = b.output(g.rows, c);
        b.copy(x0, &mut initial);
        b.unary(Unary::Scale(self.alpha), &mut initial);
        b.binary(Binary::Add, &initial, &mut s);
        drop(initial);
        let mut y = b.output(g.rows, c);
        b.copy(&s, &mut y);
        b.gemm(self.beta, &s, false, &self.weight.value, false, 1.0 - self.beta, &mut y);
        (y, Gcn2Cache { s })
    }

    /// Accumulates `W`'s gradient; returns the gradients of `x` (`g.cols` rows, when
    /// `need_dx`) and of `x0`.
    pub fn backward(
        &mut self,
        b: &B,
        g: &Graph<B>,
        cache: Gcn2Cache<B>,
        dy: &B::Mat,
        need_dx: bool,
    ) -> (Option<B::Mat>, B::Mat) {
        let Gcn2Cache { s } = cache;
        let (rows, c) = b.dims(dy);
        b.gemm(self.beta, &s, true, dy, false, 1.0, &mut self.weight.grad);
        drop(s);
        let mut ds = b.output(rows, c);
        b.copy(dy, &mut ds);
        b.gemm(self.beta, dy, false, &self.weight.value, true, 1.0 - self.beta, &mut ds);
        let mut dx0 = b.output(rows, c);
        b.copy(&ds, &mut dx0);
        b.unary(Unary::Scale(self.alpha), &mut dx0);
        let dx = need_dx.then(|| {
            let mut dx = b.output(g.cols, c);
            g.adjacency(Aggregation::GcnNorm).spmm(b, true, &ds, 0.0, &mut dx);
            b.unary(Unary::Scale(1.0 - self.alpha), &mut dx);
            dx
        });
        (dx, dx0)
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param<B>> {
        vec![&mut self.weight]
    }
}

/// Layer `l` of PyG's GCNII example model: the `l`-th `GCN2Conv` (`convs.{l}.weight1`), after
/// `lins.0` in layer 0 and before `lins.1` in the output layer (see the module).
pub struct GcniiConv<B: Backend> {
    /// `lins.0` (input → channels, then ReLU): layer 0's, which makes `x₀`.
    pub first: Option<Linear<B>>,
    pub conv: Gcn2Conv<B>,
    /// `lins.1` (channels → classes): the output layer's.
    pub last: Option<Linear<B>>,
    /// The channels `C` (the conv's width).
    channels: u64,
}

/// What a GCNII layer's backward needs.
struct GcniiCache<B: Backend> {
    /// Layer 0: `relu(lins.0(x))` over the columns, and whether the conv aggregated a dropped
    /// copy of it.
    h: Option<B::Mat>,
    dropped: bool,
    conv: Gcn2Cache<B>,
    /// The output layer: the conv's output after ReLU and dropout (`lins.1`'s input).
    act: Option<B::Mat>,
}

/// The dropout site of the output layer's dropout before `lins.1`, beside the site the model
/// gives the layer (that of the dropout before the conv).
const LAST_SITE: u64 = 1 << 23;

impl<B: Backend> GcniiConv<B> {
    /// A GCNII layer as `spec` describes it: `spec.hidden` channels, `spec.alpha`,
    /// `spec.theta`.
    pub fn of(b: &B, spec: &LayerSpec) -> Self {
        let channels = spec.hidden;
        let first = (spec.l == 0)
            .then(|| Linear::init(b, "lins.0", spec.in_dim, channels, true, spec.seed.wrapping_add(1 << 32)));
        let last = spec.last().then(|| {
            Linear::init(b, "lins.1", channels, spec.out_dim, true, spec.seed.wrapping_add(2 << 32))
        });
        let conv = Gcn2Conv::init(b, &spec.name(), channels, spec.alpha, spec.theta, spec.l + 1, spec.seed);
        GcniiConv { first, conv, last, channels: channels as u64 }
    }
}

/// Dropout `(key, p)` when it is on.
fn on(drop: Option<(MaskKey, f64)>) -> Option<(MaskKey, f64)> {
    drop.filter(|&(_, p)| p > 0.0)
}

fn last_key(key: MaskKey) -> MaskKey {
    MaskKey { site: key.site | LAST_SITE, ..key }
}

impl<B: Backend> Conv<B> for GcniiConv<B> {
    fn forward(&self, b: &B, g: &Graph<B>, x: &B::Mat, side: Side<'_, B>) -> (B::Mat, Cache) {
        let dropout = on(side.drop);
        let h = self.first.as_ref().map(|lin| {
            let mut h = lin.forward(b, x);
            b.unary(Unary::Relu, &mut h);
            h
        });
        let dropped = h.as_ref().zip(dropout).map(|(h, (key, p))| {
            let (n, d) = b.dims(h);
            let mut m = b.output(n, d);
            b.copy(h, &mut m);
            b.dropout(key, p, g.ids_of_rows(b.dims(h).0), &mut m);
            m
        });
        let own = h.as_ref().and_then(|h| g.own_rows(b, h));
        let x0 = match &h {
            Some(h) => own.as_ref().unwrap_or(h),
            None => side.x0.expect("a GCNII layer after the first reads x0 (Side::x0)"),
        };
        let input = dropped.as_ref().or(h.as_ref()).unwrap_or(x);
        let (y, conv) = self.conv.forward(b, g, input, x0);
        drop(own);
        // (the conv's backward reads its own cache, not its input)
        let dropped = dropped.is_some();
        let Some(lin) = &self.last else {
            return (y, Cache::new(GcniiCache::<B> { h, dropped, conv, act: None }));
        };
        let mut act = y;
        b.unary(Unary::Relu, &mut act);
        if let Some((key, p)) = dropout {
            b.dropout(last_key(key), p, g.row_ids(), &mut act);
        }
        let out = lin.forward(b, &act);
        (out, Cache::new(GcniiCache::<B> { h, dropped, conv, act: Some(act) }))
    }

    fn backward(
        &mut self,
        b: &B,
        g: &Graph<B>,
        x: &B::Mat,
        side: Side<'_, B>,
        cache: Cache,
        dy: &B::Mat,
        need_dx: bool,
        dx0: Option<&mut B::Mat>,
    ) -> Option<B::Mat> {
        let GcniiCache { h, dropped, conv, act } = cache.take();
        let dropout = on(side.drop);
        let dy_conv = self.last.as_mut().map(|lin| {
            let act = act.expect("the output layer keeps lins.1's input");
            let mut da = lin.backward(b, &act, dy, true).expect("asked for");
            if let Some((key, p)) = dropout {
                b.dropout(last_key(key), p, g.row_ids(), &mut da);
            }
            b.binary(Binary::ReluGrad, &act, &mut da);
            da
        });
        let dy = dy_conv.as_ref().unwrap_or(dy);
        let Some(lin) = &mut self.first else {
            let (dx, dx0_own) = self.conv.backward(b, g, conv, dy, need_dx);
            let sum = dx0.expect("a GCNII layer after the first adds to x0's gradient");
            b.binary(Binary::Add, &dx0_own, sum);
            return dx;
        };
        let (dh, dx0_own) = self.conv.backward(b, g, conv, dy, true);
        let mut dh = dh.expect("asked for");
        if let (true, Some((key, p))) = (dropped, dropout) {
            b.dropout(key, p, g.ids_of_rows(b.dims(&dh).0), &mut dh);
        }
        // x₀ is h's own rows: its gradient, this layer's and the later layers' sum, joins h's
        g.add_own_rows(b, &dx0_own, &mut dh);
        if let Some(sum) = dx0 {
            g.add_own_rows(b, sum, &mut dh);
        }
        let h = h.expect("layer 0 keeps relu(lins.0(x))");
        b.binary(Binary::ReluGrad, &h, &mut dh);
        drop(h);
        lin.backward(b, x, &dh, need_dx)
    }

    fn initial(&self) -> Initial {
        if self.first.is_some() {
            Initial::Makes
        } else {
            Initial::Reads
        }
    }

    fn initial_of(&self, b: &B, g: &Graph<B>, cache: &Cache) -> Option<B::Mat> {
        let h = cache.get::<GcniiCache<B>>().h.as_ref()?;
        Some(g.own_rows(b, h).unwrap_or_else(|| {
            let (n, d) = b.dims(h);
            let mut m = b.output(n, d);
            b.copy(h, &mut m);
            m
        }))
    }

    fn params_mut(&mut self) -> Vec<&mut Param<B>> {
        let mut v = self.first.as_mut().map(|l| l.params_mut()).unwrap_or_default();
        v.extend(self.conv.params_mut());
        v.extend(self.last.as_mut().map(|l| l.params_mut()).unwrap_or_default());
        v
    }

    fn held(&self, s: Shape, i: u64, o: u64, _: bool, need_dx: bool, dropout: bool) -> Held {
        held(s, i, self.channels, o, self.first.is_some(), self.last.is_some(), dropout, need_dx)
    }

    fn work(&self, s: Shape, i: u64, o: u64, _: bool, need_dx: bool) -> Passes {
        work(s, i, self.channels, o, self.first.is_some(), self.last.is_some(), need_dx)
    }
}

/// Elements a GCNII layer holds on a partition of shape `s` from `i` to `o` wide with `c`
/// channels (see [`crate::memory`]; `first`: it begins with `lins.0`, `last`: it ends with
/// `lins.1`, `dropout`: its own dropout is on). Forward: `h` (kept) and its dropped copy over
/// the columns and `x₀`'s own rows (layer 0); `Â x`, `α x₀` and `s` (kept), then `y`; the
/// output layer's activation (kept) and logits. Backward, phase by phase as allocated:
/// `lins.1`'s input gradient beside the tape; `W`'s gradient from `s` (then `s` and the
/// activation are gone); `ds`, `x₀`'s part and the columns' `dx` (or layer 0's `dh`); layer
/// 0's `dh` through ReLU into `lins.0`.
#[allow(clippy::too_many_arguments)]
pub fn held(s: Shape, i: u64, c: u64, o: u64, first: bool, last: bool, dropout: bool, need_dx: bool) -> Held {
    let (rows, cols) = (s.rows * c, s.cols * c);
    let h = if first { cols + if dropout { cols } else { 0 } + s.own_copy(c) } else { 0 };
    let act = if last { rows } else { 0 };
    let kept = if first { cols } else { 0 } + rows + act;
    let out = if last { s.rows * o } else { rows };
    let conv_forward = 3 * rows + h;
    let forward = conv_forward.max(kept + rows + out);
    let dact = if last { rows } else { 0 };
    let h_keep = if first { cols } else { 0 };
    let lin1_back = kept + dact;
    let weight_grad = h_keep + rows + dact;
    let conv_back = h_keep + dact + 2 * rows + if first || need_dx { cols } else { 0 };
    let dx = if need_dx { s.cols * i } else { 0 };
    let lin0_back = if first { 2 * cols + rows + dx } else { 0 };
    let backward = lin1_back.max(weight_grad).max(conv_back).max(lin0_back);
    Held { forward, kept, backward }
}

/// Work of a GCNII layer (see [`held`]): `lins.0` over the columns in layer 0, the conv's
/// sparse product and `s W`, `lins.1` in the output layer; backward the same in reverse with
/// the weight gradients.
pub fn work(s: Shape, i: u64, c: u64, o: u64, first: bool, last: bool, need_dx: bool) -> Passes {
    let none = Work::default;
    let lin0 = if first { Work::gemm(s.cols, i, c) } else { none() };
    let lin1 = if last { Work::gemm(s.rows, c, o) } else { none() };
    let conv =
        Work::spmm(s.nnz, c, false).and(Work::gemm(s.rows, c, c)).and(Work::elementwise(6 * s.rows * c));
    let lin1_back = if last { Work::gemm(o, s.rows, c).and(Work::gemm(s.rows, o, c)) } else { none() };
    let conv_back = Work::gemm(c, s.rows, c).and(Work::gemm(s.rows, c, c)).and(if first || need_dx {
        Work::spmm(s.nnz, c, true)
    } else {
        none()
    });
    let lin0_back = match (first, need_dx) {
        (true, true) => Work::gemm(c, s.cols, i).and(Work::gemm(s.cols, c, i)),
        (true, false) => Work::gemm(c, s.cols, i),
        _ => none(),
    };
    Passes {
        forward: lin0.and(conv.clone()).and(lin1.clone()),
        backward: lin1_back.and(conv_back).and(lin0_back).and(Work::elementwise(4 * s.rows * c)),
    }
}

/// GCNII as a family: `gcnii` (also `gcn2`), PyG's `GCN2Conv` in its example model, on `Â`.
pub struct Gcnii;

impl Family for Gcnii {
    /// `weight1`, with `lins.0` in layer 0 and `lins.1` in the output layer.
    fn values(&self, s: &LayerSpec) -> u128 {
        let (i, c, o) = (s.in_dim as u128, s.hidden as u128, s.out_dim as u128);
        let first = if s.l == 0 { i * c + c } else { 0 };
        let last = if s.last() { c * o + o } else { 0 };
        first + c * c + last
    }

    fn name(&self) -> &'static str {
        "gcnii"
    }

    fn aliases(&self) -> &'static [&'static str] {
        &["gcn2"]
    }

    fn pyg_layer(&self) -> &'static str {
        "GCN2Conv"
    }

    fn aggregation(&self) -> Aggregation {
        Aggregation::GcnNorm
    }

    fn drops_its_input(&self) -> bool {
        true
    }

    fn has_initial(&self) -> bool {
        true
    }

    /// PyG's `GCN2Conv` takes `edge_weight` into the same normalisation as `GCNConv`.
    fn takes_edge_weight(&self) -> bool {
        true
    }

    /// `lins.0` acts before anything is aggregated.
    fn precomputes_input(&self) -> bool {
        false
    }

    /// `lins.0.weight` `[C, in]` for layer 0 (the only one asked), `weight1` `[C, C]` after.
    fn first_map(&self, l: usize) -> String {
        if l == 0 {
            "lins.0.weight".into()
        } else {
            format!("convs.{l}.weight1")
        }
    }

    fn output_map(&self, _: usize) -> String {
        "lins.1.weight".into()
    }

    fn markers(&self) -> Vec<String> {
        vec!["lins.0.weight".into(), "convs.0.weight1".into(), "lins.1.weight".into()]
    }
}
