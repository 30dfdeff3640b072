//! SpMM on the GPU for a graph file: `grinnder-spmm-bench GRAPH.grnd [WIDTH ...]` times the
//! GCN-normalised `Â·X` and `Âᵀ·X` (X random) at each width, as the trainer calls them, and
//! prints milliseconds and the rate of gathered bytes. `GRINNDER_SPMM=warp` forces the general
//! kernel, for comparison.

use std::time::Instant;

use grinnder_cuda::Cuda;
use grinnder_graph::io::{self, Format, LoadOptions};
use grinnder_graph::norm;
use grinnder_tensor::{Backend, Mat, SparseMatrix};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).ok_or("usage: grinnder-spmm-bench GRAPH.grnd [WIDTH ...]")?;
    let widths: Vec<usize> = if args.len() > 2 {
        args[2..].iter().map(|w| w.parse()).collect::<Result<_, _>>()?
    } else {
        vec![16, 47, 64, 128, 256]
    };
    let ds = io::open(std::path::Path::new(path), Format::Auto, &LoadOptions::default())?;
    let g = Cuda::new(0)?;
    let looped = ds.graph.with_self_loops();
    let vals = norm::gcn_norm(&looped);
    let n = looped.num_nodes();
    let sm = SparseMatrix::new(n, n, looped.row_ptr().to_vec(), looped.col_idx().to_vec());
    let s = g.sparse(&sm);
    let v = g.upload(&Mat::from_vec(vals.len(), 1, vals.iter().map(|&x| x as f32).collect()));
    println!("{}: {n} nodes, {} entries (with self loops)", ds.name, sm.nnz());
    for d in widths {
        let x = g.upload(&Mat::from_vec(n, d, (0..n * d).map(|i| ((i % 97) as f32) * 0.01).collect()));
        let mut out = g.zeros(n, d);
        for transpose in [false, true] {
            g.spmm(&s, &v, transpose, &x, 0.0, &mut out); // warm-up
            g.synchronize();
            let reps = 10;
            let t = Instant::now();
            for _ in 0..reps {
                g.spmm(&s, &v, transpose, &x, 0.0, &mut out);
            }
            g.synchronize();
            let ms = t.elapsed().as_secs_f64() * 1e3 / reps as f64;
            let gathered = sm.nnz() as f64 * d as f64 * 4.0;
            println!(
                "width {d:>4} {:<11} {ms:>8.2} ms  {:>6.2} TB/s of gathered rows",
                if transpose { "transposed" } else { "forward" },
                gathered / ms / 1e9
            );
        }
    }
    Ok(())
}
