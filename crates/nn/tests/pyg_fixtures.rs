//! Every layer, the loss and each optimizer reproduce PyG's golden outputs and gradients
//! (fixtures/README.md): relative error ≤ 1e-10 in f64.

use grinnder_tensor::ops::*;
use std::path::PathBuf;

use grinnder_graph::io::npy::Npy;
use grinnder_graph::{BuildOptions, Csr, SelfLoops};
use grinnder_nn::conv::{Conv, Side};
use grinnder_nn::families::gat::GatConv;
use grinnder_nn::families::gatv2::Gatv2Conv;
use grinnder_nn::families::gcn::GcnConv;
use grinnder_nn::families::gcn2::Gcn2Conv;
use grinnder_nn::families::gin::GinConv;
use grinnder_nn::families::sage::SageConv;
use grinnder_nn::layer_norm::LayerNorm;
use grinnder_nn::{Graph, Kind, Model, ModelConfig, Norm, OptimConfig, Optimizer, Param};
use grinnder_tensor::{Cpu, Mat};

type B = Cpu<f64>;
const TOL: f64 = 1e-10;

fn path(case: &str, file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pyg").join(case).join(file)
}

/// A fixture array as a matrix: 1-D arrays become one row, 3-D `[1, h, d]` become `h × d`.
fn load(case: &str, file: &str) -> Mat<f64> {
    let a = Npy::open(&path(case, file)).unwrap();
    let data = a.to_f64().unwrap();
    let (r, c) = match a.shape.as_slice() {
        [n] => (1, *n as usize),
        [r, c] => (*r as usize, *c as usize),
        [1, h, d] => (*h as usize, *d as usize),
        s => panic!("unexpected shape {s:?}"),
    };
    Mat::from_vec(r, c, data)
}

fn graph(case: &str, n: u64) -> Graph<B> {
    let ei = load(case, "edge_index.npy");
    let e = ei.cols;
    let src: Vec<u32> = ei.data[..e].iter().map(|&v| v as u32).collect();
    let dst: Vec<u32> = ei.data[e..].iter().map(|&v| v as u32).collect();
    let opts = BuildOptions { symmetrise: false, dedup: true, self_loops: SelfLoops::Drop };
    Graph::new(&Cpu::new(), &Csr::from_edges(n, &src, &dst, opts).unwrap())
}

#[track_caller]
fn close(got: &Mat<f64>, case: &str, file: &str) {
    let want = load(case, file);
    let want = Mat::from_vec(got.rows, got.cols, want.data);
    let err = got.max_rel_err(&want, 1e-12);
    assert!(err <= TOL, "{case}/{file}: relative error {err:e}");
}

fn set(p: &mut Param<B>, case: &str, file: &str) {
    let m = load(case, file);
    let (r, c) = (p.value.rows, p.value.cols);
    p.value = Mat::from_vec(r, c, m.data);
}

#[test]
fn gcn_conv_matches_pyg_in_both_evaluation_orders() {
    let b = B::new();
    let case = "gcn";
    let x = load(case, "x.npy");
    let g = graph(case, x.rows as u64);
    let dy = load(case, "upstream.npy");
    for precomputed in [false, true] {
        let mut conv = GcnConv::init(&b, "gcn", 6, 4, 0);
        set(&mut conv.lin.weight, case, "param_lin_weight.npy");
        set(conv.lin.bias.as_mut().unwrap(), case, "param_bias.npy");
        let pre = precomputed.then(|| GcnConv::aggregate(&b, &g, &x));
        let (y, cache) = conv.forward(&b, &g, &x, Side::pre(pre.as_ref()));
        close(&y, case, "out.npy");
        let dx = conv.backward(&b, &g, &x, Side::pre(pre.as_ref()), cache, &dy, true, None).unwrap();
        close(&dx, case, "grad_x.npy");
        close(&conv.lin.weight.grad, case, "grad_lin_weight.npy");
        close(&conv.lin.bias.as_ref().unwrap().grad, case, "grad_bias.npy");
    }
}

#[test]
fn sage_conv_matches_pyg_in_both_evaluation_orders() {
    let b = B::new();
    let case = "sage_mean";
    let x = load(case, "x.npy");
    let g = graph(case, x.rows as u64);
    let dy = load(case, "upstream.npy");
    for precomputed in [false, true] {
        let mut conv = SageConv::init(&b, "sage", 6, 4, 0);
        set(&mut conv.lin_l.weight, case, "param_lin_l_weight.npy");
        set(conv.lin_l.bias.as_mut().unwrap(), case, "param_lin_l_bias.npy");
        set(&mut conv.lin_r.weight, case, "param_lin_r_weight.npy");
        let pre = precomputed.then(|| SageConv::aggregate(&b, &g, &x));
        let (y, cache) = conv.forward(&b, &g, &x, Side::pre(pre.as_ref()));
        close(&y, case, "out.npy");
        let dx = conv.backward(&b, &g, &x, Side::pre(pre.as_ref()), cache, &dy, true, None).unwrap();
        close(&dx, case, "grad_x.npy");
        close(&conv.lin_l.weight.grad, case, "grad_lin_l_weight.npy");
        close(&conv.lin_l.bias.as_ref().unwrap().grad, case, "grad_lin_l_bias.npy");
        close(&conv.lin_r.weight.grad, case, "grad_lin_r_weight.npy");
    }
}

/// A GINConv case: ε fixed (`eps.npy`) or trained (`param_eps.npy`, with its gradient).
fn gin_case(case: &str, train_eps: bool) {
    let b = B::new();
    let x = load(case, "x.npy");
    let g = graph(case, x.rows as u64);
    let dy = load(case, "upstream.npy");
    let w1 = load(case, "param_nn_0_weight.npy");
    let w2 = load(case, "param_nn_2_weight.npy");
    let eps = load(case, if train_eps { "param_eps.npy" } else { "eps.npy" }).data[0];
    for precomputed in [false, true] {
        let mut conv = GinConv::init(&b, "gin", x.cols, w1.rows, w2.rows, eps, train_eps, 0);
        set(&mut conv.lin1.weight, case, "param_nn_0_weight.npy");
        set(conv.lin1.bias.as_mut().unwrap(), case, "param_nn_0_bias.npy");
        set(&mut conv.lin2.weight, case, "param_nn_2_weight.npy");
        set(conv.lin2.bias.as_mut().unwrap(), case, "param_nn_2_bias.npy");
        let pre = precomputed.then(|| GinConv::aggregate(&b, &g, &x));
        let (y, cache) = conv.forward(&b, &g, &x, Side::pre(pre.as_ref()));
        close(&y, case, "out.npy");
        let dx = conv.backward(&b, &g, &x, Side::pre(pre.as_ref()), cache, &dy, true, None).unwrap();
        close(&dx, case, "grad_x.npy");
        close(&conv.lin1.weight.grad, case, "grad_nn_0_weight.npy");
        close(&conv.lin1.bias.as_ref().unwrap().grad, case, "grad_nn_0_bias.npy");
        close(&conv.lin2.weight.grad, case, "grad_nn_2_weight.npy");
        close(&conv.lin2.bias.as_ref().unwrap().grad, case, "grad_nn_2_bias.npy");
        if train_eps {
            close(&conv.eps.grad, case, "grad_eps.npy");
        }
        let names: Vec<String> = conv.params_mut().iter().map(|p| p.name.clone()).collect();
        let mut want = vec!["gin.nn.0.weight", "gin.nn.0.bias", "gin.nn.2.weight", "gin.nn.2.bias"];
        if train_eps {
            want.push("gin.eps");
        }
        assert_eq!(names, want, "PyG's parameter names");
    }
}

#[test]
fn gin_conv_matches_pyg_with_fixed_and_trained_eps() {
    gin_case("gin_fixed_eps", false);
    gin_case("gin_train_eps", true);
}

fn gat_case(case: &str, heads: usize, concat: bool) {
    let b = B::new();
    let x = load(case, "x.npy");
    let g = graph(case, x.rows as u64);
    let dy = load(case, "upstream.npy");
    let out_dim = load(case, "param_att_src.npy").cols;
    let mut conv = GatConv::init(&b, "gat", x.cols, out_dim, heads, concat, 0);
    set(&mut conv.lin.weight, case, "param_lin_weight.npy");
    set(&mut conv.att_src, case, "param_att_src.npy");
    set(&mut conv.att_dst, case, "param_att_dst.npy");
    set(&mut conv.bias, case, "param_bias.npy");
    let (y, cache) = conv.forward(&b, &g, &x, Side::pre(None));
    close(&y, case, "out.npy");
    let dx = conv.backward(&b, &g, &x, Side::pre(None), cache, &dy, true, None).unwrap();
    close(&dx, case, "grad_x.npy");
    close(&conv.lin.weight.grad, case, "grad_lin_weight.npy");
    close(&conv.att_src.grad, case, "grad_att_src.npy");
    close(&conv.att_dst.grad, case, "grad_att_dst.npy");
    close(&conv.bias.grad, case, "grad_bias.npy");
}

#[test]
fn gat_conv_matches_pyg_concat_and_mean() {
    gat_case("gat_h2_concat", 2, true);
    gat_case("gat_h3_mean", 3, false);
}

fn gatv2_case(case: &str, heads: usize, concat: bool) {
    let b = B::new();
    let x = load(case, "x.npy");
    let g = graph(case, x.rows as u64);
    let dy = load(case, "upstream.npy");
    let out_dim = load(case, "param_att.npy").cols;
    let mut conv = Gatv2Conv::init(&b, "gatv2", x.cols, out_dim, heads, concat, 0);
    set(&mut conv.lin_l.weight, case, "param_lin_l_weight.npy");
    set(conv.lin_l.bias.as_mut().unwrap(), case, "param_lin_l_bias.npy");
    set(&mut conv.lin_r.weight, case, "param_lin_r_weight.npy");
    set(conv.lin_r.bias.as_mut().unwrap(), case, "param_lin_r_bias.npy");
    set(&mut conv.att, case, "param_att.npy");
    set(&mut conv.bias, case, "param_bias.npy");
    let (y, cache) = conv.forward(&b, &g, &x, Side::pre(None));
    close(&y, case, "out.npy");
    let dx = conv.backward(&b, &g, &x, Side::pre(None), cache, &dy, true, None).unwrap();
    close(&dx, case, "grad_x.npy");
    for (p, file) in [
        (&conv.lin_l.weight.grad, "grad_lin_l_weight.npy"),
        (&conv.lin_l.bias.as_ref().unwrap().grad, "grad_lin_l_bias.npy"),
        (&conv.lin_r.weight.grad, "grad_lin_r_weight.npy"),
        (&conv.lin_r.bias.as_ref().unwrap().grad, "grad_lin_r_bias.npy"),
        (&conv.att.grad, "grad_att.npy"),
        (&conv.bias.grad, "grad_bias.npy"),
    ] {
        close(p, case, file);
    }
    let names: Vec<String> = conv.params_mut().iter().map(|p| p.name.clone()).collect();
    let want = ["lin_l.weight", "lin_l.bias", "lin_r.weight", "lin_r.bias", "att", "bias"]
        .map(|n| format!("gatv2.{n}"));
    assert_eq!(names, want, "PyG's parameter names");
}

#[test]
fn gatv2_conv_matches_pyg_concat_and_mean() {
    gatv2_case("gatv2_h2_concat", 2, true);
    gatv2_case("gatv2_h3_mean", 3, false);
}

#[test]
fn gcn2_conv_matches_pyg() {
    let b = B::new();
    let case = "gcn2";
    let x = load(case, "x.npy");
    let x0 = load(case, "x_0.npy");
    let g = graph(case, x.rows as u64);
    // α 0.1, θ 0.5, layer 2 (meta.json)
    let mut conv = Gcn2Conv::init(&b, "gcn2", x.cols, 0.1, 0.5, 2, 0);
    set(&mut conv.weight, case, "param_weight1.npy");
    let (y, cache) = conv.forward(&b, &g, &x, &x0);
    close(&y, case, "out.npy");
    let (dx, dx0) = conv.backward(&b, &g, cache, &load(case, "upstream.npy"), true);
    close(&dx.unwrap(), case, "grad_x.npy");
    close(&dx0, case, "grad_x_0.npy");
    close(&conv.weight.grad, case, "grad_weight1.npy");
    let names: Vec<String> = conv.params_mut().iter().map(|p| p.name.clone()).collect();
    assert_eq!(names, ["gcn2.weight1"], "PyG's parameter names");
}

#[test]
fn gcnii_model_matches_pyg() {
    // PyG's GCNII example model (gen_gcnii.py): 3 GCN2Conv layers of 5 channels, α 0.1, θ 0.5
    let b = B::new();
    let case = "gcnii";
    let x = load(case, "x.npy");
    let g = graph(case, x.rows as u64);
    let config = ModelConfig {
        kind: Kind::Gcnii,
        layers: 3,
        hidden: 5,
        dropout: 0.0,
        input_dropout: 0.0,
        norm: Norm::None,
        residual: false,
        heads: 1,
        attn_dropout: 0.0,
        gin_eps: 0.0,
        train_eps: false,
        alpha: 0.1,
        theta: 0.5,
        seed: 0,
    };
    let mut model = Model::init(&b, config, x.cols, 4);
    let mut names = Vec::new();
    for p in model.state_mut() {
        set(p, case, &format!("param_{}.npy", p.name));
        names.push(p.name.clone());
    }
    names.sort();
    let want = ["convs.0.weight1", "convs.1.weight1", "convs.2.weight1", "lins.0.bias", "lins.0.weight"]
        .into_iter()
        .chain(["lins.1.bias", "lins.1.weight"]);
    assert!(names.iter().map(String::as_str).eq(want), "PyG's names: {names:?}");
    let (out, tape) = model.forward(&b, &g, &x, true, 0);
    close(&out, case, "out.npy");
    model.backward(&b, &g, &x, tape, load(case, "upstream.npy"));
    for p in model.state_mut() {
        close(&p.grad, case, &format!("grad_{}.npy", p.name));
    }
}

#[test]
fn layer_norm_matches_pyg() {
    let b = B::new();
    let case = "layernorm";
    let x = load(case, "x.npy");
    let mut ln = LayerNorm::init(&b, "ln", 8);
    set(&mut ln.gamma, case, "param_weight.npy");
    set(&mut ln.beta, case, "param_bias.npy");
    let (y, stats) = ln.forward(&b, &x);
    close(&y, case, "out.npy");
    let dx = ln.backward(&b, &x, &stats, &load(case, "upstream.npy"));
    close(&dx, case, "grad_x.npy");
    close(&ln.gamma.grad, case, "grad_weight.npy");
    close(&ln.beta.grad, case, "grad_bias.npy");
}

#[test]
fn cross_entropy_matches_pyg() {
    let b = B::new();
    let case = "cross_entropy";
    let logits = load(case, "logits.npy");
    let labels: Vec<i32> = load(case, "labels.npy").data.iter().map(|&v| v as i32).collect();
    let idx: Vec<u32> = load(case, "idx.npy").data.iter().map(|&v| v as u32).collect();
    let mut grad = b.zeros(logits.rows, logits.cols);
    let (sum, _) = b.cross_entropy(&logits, &labels, &idx, 1.0 / idx.len() as f64, &mut grad);
    let loss = Mat::from_vec(1, 1, vec![sum / idx.len() as f64]);
    close(&loss, case, "loss.npy");
    close(&grad, case, "grad_logits.npy");
}

fn optimizer_case(case: &str, config: OptimConfig) {
    let b = B::new();
    let mut p = Param::new(&b, "p", &load(case, "param0.npy"));
    let mut opt = Optimizer::new(config);
    for step in 1..=3 {
        p.grad = load(case, &format!("grad_step{step}.npy"));
        opt.step(&b, vec![&mut p]);
        close(&p.value, case, &format!("param_step{step}.npy"));
    }
}

#[test]
fn optimizers_match_pytorch() {
    optimizer_case("opt_adam_wd", OptimConfig::Adam { lr: 0.01, weight_decay: 5e-4 });
    optimizer_case("opt_adamw", OptimConfig::Adamw { lr: 0.01, weight_decay: 0.01 });
    optimizer_case("opt_sgd_momentum", OptimConfig::Sgd { lr: 0.1, momentum: 0.9, weight_decay: 5e-4 });
}
