//! Model gradients against f64 central finite differences for every option; f32 against f64;
//! node relabelling permutes outputs and leaves parameter gradients unchanged.
#![allow(clippy::needless_range_loop)] // index loops mirror the formulas being checked

use grinnder_graph::rng::Stream;
use grinnder_graph::{BuildOptions, Csr};
use grinnder_nn::{Graph, Kind, Model, ModelConfig, Norm};
use grinnder_tensor::ops::*;
use grinnder_tensor::{Backend, Cpu, Mat, Scalar};

const N: usize = 14;
const F: usize = 5;
const C: usize = 3;

fn random_graph(seed: u64) -> Csr {
    let mut s = Stream::new(&[seed, 1]);
    let m = 30;
    let src: Vec<u32> = (0..m).map(|_| s.below(N as u64) as u32).collect();
    let dst: Vec<u32> = (0..m).map(|_| s.below(N as u64) as u32).collect();
    Csr::from_edges(N as u64, &src, &dst, BuildOptions::default()).unwrap()
}

fn random_x(seed: u64) -> Mat<f64> {
    let mut s = Stream::new(&[seed, 2]);
    Mat::from_vec(N, F, (0..N * F).map(|_| s.normal()).collect())
}

fn labels() -> Vec<i32> {
    (0..N as i32).map(|v| v % C as i32).collect()
}

fn train_rows() -> Vec<u32> {
    (0..N as u32).filter(|v| v % 3 != 1).collect()
}

/// Loss and parameter gradients of one training-mode pass (epoch 0).
fn loss_and_grads<B: Backend>(
    b: &B,
    model: &mut Model<B>,
    g: &Graph<B>,
    x: &B::Mat,
) -> (f64, Vec<Mat<B::T>>) {
    model.zero_grad(b);
    let (logits, tape) = model.forward(b, g, x, true, 0);
    let rows = train_rows();
    let (r, c) = b.dims(&logits);
    let mut dl = b.zeros(r, c);
    let (sum, _) = b.cross_entropy(&logits, &labels(), &rows, 1.0 / rows.len() as f64, &mut dl);
    model.backward(b, g, x, tape, dl);
    let grads = model.params_mut().into_iter().map(|p| b.download(&p.grad)).collect();
    (sum / rows.len() as f64, grads)
}

fn configs() -> Vec<ModelConfig> {
    let mut out = Vec::new();
    for kind in Kind::ALL {
        for (layers, hidden) in [(1, 4), (2, 3), (2, 7), (3, 6)] {
            for norm in [Norm::None, Norm::Layer] {
                for residual in [false, true] {
                    for (dropout, input_dropout) in [(0.0, 0.0), (0.4, 0.3)] {
                        // GAT: 2 heads (concatenated in hidden layers), attention dropout too
                        let (heads, attn_dropout) =
                            if kind.family().has_heads() { (2, dropout) } else { (1, 0.0) };
                        out.push(ModelConfig {
                            kind,
                            layers,
                            hidden,
                            dropout,
                            input_dropout,
                            norm,
                            residual,
                            heads,
                            attn_dropout,
                            // GIN: ε trained with the residual variants, fixed without
                            gin_eps: 0.3,
                            train_eps: residual,
                            alpha: grinnder_nn::model::DEFAULT_ALPHA,
                            theta: grinnder_nn::model::DEFAULT_THETA,
                            seed: 11,
                        });
                    }
                }
            }
        }
    }
    out
}

#[test]
fn model_gradients_match_finite_differences() {
    let b = Cpu::<f64>::new();
    let csr = random_graph(3);
    let g = Graph::new(&b, &csr);
    let x = random_x(4);
    for cfg in configs() {
        let mut model = Model::init(&b, cfg.clone(), F, C);
        // check at a generic point: with zero biases, a row whose attention is all dropped
        // sits exactly on a ReLU kink, where central differences average two slopes
        let mut s = Stream::new(&[77]);
        for p in model.params_mut() {
            p.value.data.iter_mut().for_each(|v| *v += 0.1 * s.normal());
        }
        model.prepare(&b, &g, &x);
        let (_, grads) = loss_and_grads(&b, &mut model, &g, &x);
        let h = 1e-5;
        let n_params = grads.len();
        for pi in 0..n_params {
            for i in 0..grads[pi].data.len() {
                let mut at = |delta: f64| {
                    let p = &mut model.params_mut()[pi];
                    p.value.data[i] += delta;
                    let (l, _) = loss_and_grads(&b, &mut model, &g, &x);
                    model.params_mut()[pi].value.data[i] -= delta;
                    l
                };
                let fd = (at(h) - at(-h)) / (2.0 * h);
                let an = grads[pi].data[i];
                let err = (fd - an).abs() / fd.abs().max(an.abs()).max(1e-4);
                assert!(
                    err <= 1e-6,
                    "{cfg:?}: parameter {pi} element {i}: analytic {an:e}, finite difference {fd:e}"
                );
            }
        }
    }
}

#[test]
fn fixed_input_precomputation_changes_nothing() {
    let b = Cpu::<f64>::new();
    let g = Graph::new(&b, &random_graph(5));
    let x = random_x(6);
    for kind in [Kind::Gcn, Kind::Sage, Kind::Gin] {
        for hidden in [3, 8] {
            let cfg = ModelConfig {
                kind,
                layers: 2,
                hidden,
                dropout: 0.3,
                input_dropout: 0.0,
                norm: Norm::None,
                residual: false,
                heads: 1,
                attn_dropout: 0.0,
                gin_eps: -0.2,
                train_eps: true,
                alpha: grinnder_nn::model::DEFAULT_ALPHA,
                theta: grinnder_nn::model::DEFAULT_THETA,
                seed: 2,
            };
            let mut plain = Model::init(&b, cfg.clone(), F, C);
            let mut pre = Model::init(&b, cfg, F, C);
            pre.prepare(&b, &g, &x);
            let (l1, g1) = loss_and_grads(&b, &mut plain, &g, &x);
            let (l2, g2) = loss_and_grads(&b, &mut pre, &g, &x);
            assert!((l1 - l2).abs() < 1e-12);
            for (a, c) in g1.iter().zip(&g2) {
                assert!(a.max_rel_err(c, 1e-9) < 1e-10);
            }
            // GCN reads only the aggregation from here: the features may go (the in-memory
            // trainer frees them), giving the same bits
            assert_eq!(pre.reads_only_pre(), kind == Kind::Gcn, "{kind:?}");
            assert!(!plain.reads_only_pre(), "nothing prepared");
            if pre.reads_only_pre() {
                let (l3, g3) = loss_and_grads(&b, &mut pre, &g, &Mat::zeros(0, F));
                assert_eq!(l3.to_bits(), l2.to_bits(), "loss without the features");
                assert_eq!(g3, g2, "gradients without the features");
            }
        }
    }
}

#[test]
fn f32_matches_f64() {
    let b64 = Cpu::<f64>::new();
    let b32 = Cpu::<f32>::new();
    let csr = random_graph(7);
    let (g64, g32) = (Graph::new(&b64, &csr), Graph::new(&b32, &csr));
    let x = random_x(8);
    let x32 = x.cast::<f32>();
    for cfg in configs() {
        let mut m64 = Model::init(&b64, cfg.clone(), F, C);
        let mut m32 = Model::init(&b32, cfg.clone(), F, C);
        // same initial values (the f32 model's are the f64 draws rounded)
        for (p32, p64) in m32.params_mut().into_iter().zip(m64.params_mut()) {
            p64.value = p32.value.cast::<f64>();
        }
        m64.prepare(&b64, &g64, &x);
        m32.prepare(&b32, &g32, &x32);
        let (l64, gr64) = loss_and_grads(&b64, &mut m64, &g64, &x);
        let (l32, gr32) = loss_and_grads(&b32, &mut m32, &g32, &x32);
        assert!((l64 - l32.f64()).abs() <= 1e-4 * l64.abs().max(1.0), "{cfg:?}: loss");
        for (a, c) in gr64.iter().zip(&gr32) {
            let err = a.max_rel_err(&c.cast::<f64>(), 1e-2);
            assert!(err <= 1e-4, "{cfg:?}: gradient relative error {err:e}");
        }
    }
}

#[test]
fn relabelling_nodes_permutes_outputs_and_keeps_gradients() {
    let b = Cpu::<f64>::new();
    let csr = random_graph(9);
    let x = random_x(10);
    // a permutation: new id of old node v
    let mut s = Stream::new(&[99]);
    let mut perm: Vec<u32> = (0..N as u32).collect();
    s.shuffle(&mut perm);
    let (src, dst) = csr.to_coo();
    let psrc: Vec<u32> = src.iter().map(|&v| perm[v as usize]).collect();
    let pdst: Vec<u32> = dst.iter().map(|&v| perm[v as usize]).collect();
    let pcsr = Csr::from_edges(N as u64, &psrc, &pdst, BuildOptions::default()).unwrap();
    let mut px = Mat::zeros(N, F);
    for v in 0..N {
        px.row_mut(perm[v] as usize).copy_from_slice(x.row(v));
    }
    let (g, pg) = (Graph::new(&b, &csr), Graph::new(&b, &pcsr));
    for kind in Kind::ALL {
        for norm in [Norm::None, Norm::Layer] {
            let cfg = ModelConfig {
                kind,
                layers: 3,
                hidden: 6,
                dropout: 0.0,
                input_dropout: 0.0,
                heads: 3,
                attn_dropout: 0.0,
                gin_eps: 0.2,
                train_eps: true,
                alpha: 0.2,
                theta: 1.5,
                norm,
                residual: true,
                seed: 4,
            };
            let m = Model::init(&b, cfg.clone(), F, C);
            let pm = Model::init(&b, cfg, F, C);
            let (y, _) = m.forward(&b, &g, &x, false, 0);
            let (py, _) = pm.forward(&b, &pg, &px, false, 0);
            for v in 0..N {
                let (a, c) = (y.row(v), py.row(perm[v] as usize));
                assert!(a.iter().zip(c).all(|(a, c)| (a - c).abs() < 1e-12), "output row {v} not permuted");
            }
            // loss over all nodes with permuted labels: identical gradients
            let grads = |model: Model<Cpu<f64>>, g: &Graph<Cpu<f64>>, x: &Mat<f64>, relabel: bool| {
                let mut model = model;
                let (logits, tape) = model.forward(&b, g, x, true, 0);
                let mut lab = vec![0i32; N];
                for v in 0..N {
                    lab[if relabel { perm[v] as usize } else { v }] = (v % C) as i32;
                }
                let rows: Vec<u32> = (0..N as u32).collect();
                let mut dl = Mat::zeros(N, C);
                b.cross_entropy(&logits, &lab, &rows, 1.0 / N as f64, &mut dl);
                model.backward(&b, g, x, tape, dl);
                model.params_mut().into_iter().map(|p| p.grad.clone()).collect::<Vec<_>>()
            };
            let (ga, gb) = (grads(m, &g, &x, false), grads(pm, &pg, &px, true));
            // summed in another order: each element within 1e-10 of itself, or where terms as
            // large as the matrix's largest cancel to below 1e-4 of it, within 1e-14 of that
            // largest (a few hundred roundings of its terms: GATv2's lin_r gradient has an
            // element of 1.8e-9 beside 1.2e-3, 2.3e-18 apart between the two orders)
            for (a, c) in ga.iter().zip(&gb) {
                let largest = c.data.iter().fold(0.0f64, |m, x| m.max(x.abs()));
                let err = a.max_rel_err(c, 1e-9f64.max(1e-4 * largest));
                assert!(
                    err < 1e-10,
                    "{kind:?} {norm:?}: parameter gradients changed under relabelling ({err:e})"
                );
            }
        }
    }
}
