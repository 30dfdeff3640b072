//! [`DenseOps`] and [`TrainOps`] for the CUDA backend: cuBLAS GEMM (split-K for long inner
//! dimensions), element-wise kernels, dropout, LayerNorm, the loss and optimizer steps.

use super::*;

impl Cuda {
    /// Launches `name` (`cross_entropy` or `cross_entropy_ids`) over `n` rows, the row numbers
    /// or node ids at device address `idx`, the labels at `labels`, writing the per-row losses
    /// and hits into `out` ([`Cuda::loss_buffer`]), which the returned loss holds until read.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn cross_entropy_launch(
        &self,
        name: &'static str,
        logits: &DMat,
        labels: u64,
        idx: u64,
        n: usize,
        out: host::PinnedBuf,
        scale: f64,
        grad: &mut DMat,
    ) -> CudaLoss {
        self.mark("logits");
        let (at_loss, at_hit, _) = host::loss_offsets(n);
        let (loss, hit) = (out.dptr() + at_loss as u64, out.dptr() + at_hit as u64);
        let (m, c32, s) = (n as i64, logits.cols as i32, scale as f32);
        let mut l = self.stream.launch_builder(self.func(name));
        l.arg(&logits.data).arg(&labels).arg(&idx).arg(&m).arg(&c32).arg(&s).arg(&mut grad.data);
        l.arg(&loss).arg(&hit);
        // SAFETY: the callers checked the rows against the logits and the labels' range; `out`
        // holds n losses and n flags, mapped, and stays with the returned loss until the kernel
        // has finished.
        unsafe { l.launch(grid(n)) }.expect(name);
        CudaLoss::queued(out, n, &self.stream)
    }

    /// Column sums of a term (see `col_partial` in kernels.cu) into `out` (`1 × w`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn col_reduce(
        &self,
        a: &CudaSlice<f32>,
        b: Option<&CudaSlice<f32>>,
        s: Option<&CudaSlice<f32>>,
        n: usize,
        w: usize,
        f: usize,
        mode: i32,
        beta: f32,
        out: &mut CudaSlice<f32>,
    ) {
        if w == 0 {
            return;
        }
        let rows_per: usize = 4096;
        let parts = n.div_ceil(rows_per).max(1);
        let mut partial = self.stream.alloc_zeros::<f32>(parts * w).or_oom();
        let cfg = LaunchConfig {
            grid_dim: (w.div_ceil(32) as u32, parts as u32, 1),
            block_dim: (32, 8, 1),
            shared_mem_bytes: 0,
        };
        let (n64, w32, f32_, rp) = (n as i64, w as i32, f.max(1) as i32, rows_per as i64);
        let mut l = self.stream.launch_builder(self.func("col_partial"));
        l.arg(a).arg(b.unwrap_or(a)).arg(s.unwrap_or(a)).arg(&n64).arg(&w32).arg(&f32_).arg(&mode).arg(&rp);
        l.arg(&mut partial);
        // SAFETY: shapes checked by the callers; every index stays inside the buffers.
        unsafe { l.launch(cfg) }.expect("CUDA col_partial");
        let parts32 = parts as i32;
        let mut l = self.stream.launch_builder(self.func("col_finish"));
        l.arg(&partial).arg(&parts32).arg(&w32).arg(&beta).arg(out);
        // SAFETY: as above.
        unsafe { l.launch(grid(w)) }.expect("CUDA col_finish");
    }
}

impl DenseOps for Cuda {
    fn gemm(&self, alpha: f64, a: &DMat, ta: bool, b: &DMat, tb: bool, beta: f64, c: &mut DMat) {
        let (m, ka) = if ta { (a.cols, a.rows) } else { (a.rows, a.cols) };
        let (kb, n) = if tb { (b.cols, b.rows) } else { (b.rows, b.cols) };
        let _p = self.span_shaped("gemm", || {
            format!(
                "{}x{} . {}x{}{}{}",
                approx(m),
                approx(ka),
                approx(kb),
                approx(n),
                if ta { " ta" } else { "" },
                if tb { " tb" } else { "" }
            )
        });
        assert_eq!(ka, kb, "gemm: inner dimensions differ");
        assert_eq!((c.rows, c.cols), (m, n), "gemm: output shape");
        if m == 0 || n == 0 {
            return;
        }
        if ka == 0 {
            self.unary(Unary::Scale(beta), c);
            return;
        }
        let op = |t: bool| if t { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };
        // column-major Cᵀ (n × m) = op(B)ᵀ · op(A)ᵀ
        let cfg = GemmConfig {
            transa: op(tb),
            transb: op(ta),
            m: n as i32,
            n: m as i32,
            k: ka as i32,
            alpha: alpha as f32,
            lda: b.cols as i32,
            ldb: a.cols as i32,
            beta: beta as f32,
            ldc: n as i32,
        };
        // a small output over a long inner dimension (weight gradients) gets few thread blocks
        // from cuBLAS: split K into chunks computed as one strided batch, then sum the partial
        // products in a fixed order (deterministic). Split from 65,536 rows on, into chunks of
        // 16,384 rows or up to 64 parts where that makes more: a 256 × 100 gradient over a
        // mini-batch's 140,000 rows in 64 parts (about 2,000 blocks of cuBLAS's small tiles,
        // the whole GPU) takes half the time of 8 parts on one H200; the partial products stay
        // under 64 MiB.
        let parts = (ka / 16_384).max((ka / 2_048).min(64)).min(256).min((64 << 20) / (4 * m * n).max(1));
        if m * n <= (1 << 20) && ka >= 4 * 16_384 && parts >= 4 {
            let kc = ka / parts;
            // element offsets of K-chunk i: op(A) = A (m × K) advances by columns, Aᵀ (A is
            // K × m) by rows; op(B) = B (K × n) by rows, Bᵀ (B is n × K) by columns
            let a_step = if ta { a.cols } else { 1 };
            let b_step = if tb { 1 } else { b.cols };
            let mut partial = self.stream.alloc_zeros::<f32>(parts * m * n).or_oom();
            let batched = StridedBatchedConfig {
                gemm: GemmConfig { k: kc as i32, beta: 0.0, ..cfg },
                batch_size: parts as i32,
                stride_a: (kc * b_step) as i64,
                stride_b: (kc * a_step) as i64,
                stride_c: (m * n) as i64,
            };
            // SAFETY: each batch member reads a K-chunk inside its operand and writes its own
            // m × n block of `partial`.
            unsafe { self.blas.gemm_strided_batched(batched, &b.data, &a.data, &mut partial) }
                .expect("cuBLAS sgemm (split K)");
            let (p32, w, bt) = (parts as i32, (m * n) as i64, beta as f32);
            let mut l = self.stream.launch_builder(self.func("sum_parts"));
            l.arg(&partial).arg(&p32).arg(&w).arg(&bt).arg(&mut c.data);
            // SAFETY: partial holds parts × w values, c holds w.
            unsafe { l.launch(grid(m * n)) }.expect("CUDA sum_parts");
            let done = parts * kc;
            if done < ka {
                // the remainder of K, accumulated
                let rest = ka - done;
                let (ob, oa) = (done * b_step, done * a_step);
                let tail = GemmConfig { k: rest as i32, beta: 1.0, ..cfg };
                let (bv, av) = (b.data.slice(ob..), a.data.slice(oa..));
                // SAFETY: the views start at the remainder's first element; strides unchanged.
                unsafe { self.blas.gemm(tail, &bv, &av, &mut c.data) }.expect("cuBLAS sgemm (K tail)");
            }
            return;
        }
        // SAFETY: the leading dimensions and sizes above describe the three buffers exactly.
        unsafe { self.blas.gemm(cfg, &b.data, &a.data, &mut c.data) }.expect("cuBLAS sgemm");
    }
    fn gather_rows(&self, x: &DMat, rows: Rows<'_>, out: &mut DMat, at: usize) {
        let _p = self.span("gather_rows");
        let (d, n) = (x.cols, rows.len());
        assert!(out.cols == d && at + n <= out.rows && rows.end() <= x.rows, "gather: shapes");
        if n == 0 || d == 0 {
            return;
        }
        let dst = out.data.slice_mut(at * d..(at + n) * d);
        let (src, _sync) = x.data.device_ptr(&self.stream);
        let (name, cfg) = self.gather_kernel(n);
        self.launch_rows(name, src, rows, d, dst, cfg);
    }
    fn scatter_add_rows(&self, src: &DMat, from: usize, rows: Rows<'_>, out: &mut DMat) {
        let _p = self.span("scatter_add_rows");
        let (d, n) = (out.cols, rows.len());
        assert!(src.cols == d && from + n <= src.rows, "scatter-add: input shape");
        assert!(rows.end() <= out.rows, "scatter-add: row {} out of range", rows.end() - 1);
        if n == 0 || d == 0 {
            return;
        }
        let s = src.data.slice(from * d..(from + n) * d);
        let (s, _sync) = s.device_ptr(&self.stream);
        self.launch_rows("scatter_add_rows", s, rows, d, out.data.slice_mut(..), grid(n * d));
    }
    fn unary(&self, op: Unary, x: &mut DMat) {
        let _p = self.span("unary");
        let n = x.rows * x.cols;
        if n == 0 {
            return;
        }
        let (code, s) = match op {
            Unary::Relu => (0i32, 0.0f32),
            Unary::Scale(s) => (1, s as f32),
        };
        let n64 = n as i64;
        let mut l = self.stream.launch_builder(self.func("unary"));
        l.arg(&mut x.data).arg(&n64).arg(&code).arg(&s);
        // SAFETY: n elements.
        unsafe { l.launch(grid(n)) }.expect("CUDA unary");
    }
    fn binary(&self, op: Binary, a: &DMat, b: &mut DMat) {
        let _p = self.span("binary");
        assert_eq!((a.rows, a.cols), (b.rows, b.cols), "element-wise op on different shapes");
        let n = a.rows * a.cols;
        if n == 0 {
            return;
        }
        let code = match op {
            Binary::Add => 0i32,
            Binary::ReluGrad => 1,
            Binary::Mul => 2,
        };
        let n64 = n as i64;
        let mut l = self.stream.launch_builder(self.func("binary"));
        l.arg(&a.data).arg(&mut b.data).arg(&n64).arg(&code);
        // SAFETY: n elements in both.
        unsafe { l.launch(grid(n)) }.expect("CUDA binary");
    }
    fn add_row(&self, row: &DMat, x: &mut DMat) {
        let _p = self.span("add_row");
        assert_eq!((row.rows, row.cols), (1, x.cols), "bias shape");
        let n = x.rows * x.cols;
        if n == 0 {
            return;
        }
        let (r, d) = (x.rows as i64, x.cols as i32);
        let mut l = self.stream.launch_builder(self.func("add_row"));
        l.arg(&row.data).arg(&mut x.data).arg(&r).arg(&d);
        // SAFETY: shapes checked above.
        unsafe { l.launch(grid(n)) }.expect("CUDA add_row");
    }
    fn col_sums(&self, x: &DMat, beta: f64, out: &mut DMat) {
        let _p = self.span("col_sums");
        assert_eq!((out.rows, out.cols), (1, x.cols), "column-sum shape");
        self.col_reduce(&x.data, None, None, x.rows, x.cols, 1, 0, beta as f32, &mut out.data);
    }
    fn dropout(&self, key: MaskKey, p: f64, ids: Option<&[u32]>, x: &mut DMat) {
        let _p = self.span("dropout");
        assert!((0.0..1.0).contains(&p), "dropout probability {p} outside [0, 1)");
        let n = x.rows * x.cols;
        if p == 0.0 || n == 0 {
            return;
        }
        if let Some(ids) = ids {
            assert_eq!(ids.len(), x.rows, "one node id per row");
        }
        let d_ids = ids.map(|i| self.upload_slice(i));
        let has = d_ids.is_some() as i32;
        let (r, c, t, scale) = (x.rows as i64, x.cols as i32, thr(p), (1.0 / (1.0 - p)) as f32);
        let mut l = self.stream.launch_builder(self.func("dropout"));
        l.arg(&mut x.data).arg(&r).arg(&c).arg(d_ids.as_ref().unwrap_or(&self.dummy_u32)).arg(&has);
        l.arg(&key.seed).arg(&key.epoch).arg(&key.site).arg(&t).arg(&scale);
        // SAFETY: n elements; ids has one entry per row when given.
        unsafe { l.launch(grid(n)) }.expect("CUDA dropout");
    }
    fn layer_norm(&self, x: &DMat, gamma: &DMat, beta: &DMat, eps: f64, y: &mut DMat, stats: &mut DMat) {
        let _p = self.span("layer_norm");
        assert_eq!((stats.rows, stats.cols), (x.rows, 2), "LayerNorm stats are rows × 2");
        if x.rows == 0 {
            return;
        }
        let (n, d, e) = (x.rows as i64, x.cols as i32, eps as f32);
        let mut l = self.stream.launch_builder(self.func("layer_norm"));
        l.arg(&x.data).arg(&gamma.data).arg(&beta.data).arg(&n).arg(&d).arg(&e).arg(&mut y.data);
        l.arg(&mut stats.data);
        // SAFETY: shapes checked above.
        unsafe { l.launch(warps(x.rows)) }.expect("CUDA layer_norm");
    }
    fn layer_norm_backward(
        &self,
        x: &DMat,
        gamma: &DMat,
        stats: &DMat,
        dy: &DMat,
        dx: &mut DMat,
        dgamma: &mut DMat,
        dbeta: &mut DMat,
    ) {
        let _p = self.span("layer_norm_backward");
        if x.rows == 0 {
            return;
        }
        let (n, d) = (x.rows as i64, x.cols as i32);
        let mut l = self.stream.launch_builder(self.func("layer_norm_dx"));
        l.arg(&x.data).arg(&gamma.data).arg(&stats.data).arg(&dy.data).arg(&n).arg(&d).arg(&mut dx.data);
        // SAFETY: shapes as in layer_norm.
        unsafe { l.launch(warps(x.rows)) }.expect("CUDA layer_norm_dx");
        self.col_reduce(
            &dy.data,
            Some(&x.data),
            Some(&stats.data),
            x.rows,
            x.cols,
            1,
            2,
            1.0,
            &mut dgamma.data,
        );
        self.col_reduce(&dy.data, None, None, x.rows, x.cols, 1, 0, 1.0, &mut dbeta.data);
    }
}

impl TrainOps for Cuda {
    fn cross_entropy_later(
        &self,
        logits: &DMat,
        labels: &[i32],
        rows: &[u32],
        scale: f64,
        grad: &mut DMat,
    ) -> CudaLoss {
        let _p = self.span("cross_entropy");
        let c = logits.cols;
        assert_eq!(labels.len(), logits.rows, "one label per row");
        for &r in rows {
            let y = labels[r as usize];
            assert!(y >= 0 && (y as usize) < c, "row {r} has label {y}, outside 0..{c}");
        }
        if rows.is_empty() {
            return CudaLoss::nothing();
        }
        let (dl, dr) = (self.labels.get(self, labels), self.rows.get(self, rows));
        let dl: u64 = dl.as_ref().device_ptr(&self.stream).0;
        let dr: u64 = dr.as_ref().device_ptr(&self.stream).0;
        let out = self.loss_buffer(rows.len(), &[]);
        self.cross_entropy_launch("cross_entropy", logits, dl, dr, rows.len(), out, scale, grad)
    }
    fn loss_value(&self, l: CudaLoss) -> (f64, usize) {
        let _p = self.prof.as_ref().is_some_and(|p| p.host).then(|| self.span("loss read (wait)"));
        let sums = self.loss_sums(l);
        self.mark("loss read");
        sums
    }
    fn step(&self, rule: StepRule, p: &mut DMat, g: &DMat, s1: &mut DMat, s2: &mut DMat) {
        let _p = self.span("step");
        let n = p.rows * p.cols;
        assert_eq!(n, g.rows * g.cols, "parameter and gradient shapes differ");
        let n64 = n as i64;
        match rule {
            StepRule::Adam { lr, beta1, beta2, eps, weight_decay, decoupled, t } => {
                let bc1 = (1.0 - beta1.powi(t as i32)) as f32;
                let bc2 = (1.0 - beta2.powi(t as i32)) as f32;
                let (lr, b1, b2, eps, wd, dec) = (
                    lr as f32,
                    beta1 as f32,
                    beta2 as f32,
                    eps as f32,
                    weight_decay as f32,
                    decoupled as i32,
                );
                let mut l = self.stream.launch_builder(self.func("adam"));
                l.arg(&mut p.data).arg(&g.data).arg(&mut s1.data).arg(&mut s2.data).arg(&n64).arg(&lr);
                l.arg(&b1).arg(&b2).arg(&eps).arg(&wd).arg(&dec).arg(&bc1).arg(&bc2);
                // SAFETY: four buffers of n elements.
                unsafe { l.launch(grid(n)) }.expect("CUDA adam");
            }
            StepRule::Sgd { lr, momentum, weight_decay, first } => {
                let (lr, mo, wd, first) = (lr as f32, momentum as f32, weight_decay as f32, first as i32);
                let mut l = self.stream.launch_builder(self.func("sgd"));
                l.arg(&mut p.data)
                    .arg(&g.data)
                    .arg(&mut s1.data)
                    .arg(&n64)
                    .arg(&lr)
                    .arg(&mo)
                    .arg(&wd)
                    .arg(&first);
                // SAFETY: three buffers of n elements.
                unsafe { l.launch(grid(n)) }.expect("CUDA sgd");
            }
        }
    }
    fn count_correct(&self, logits: &DMat, labels: &[i32], rows: &[u32]) -> usize {
        let _p = self.span("count_correct");
        if rows.is_empty() {
            return 0;
        }
        let (dl, dr) = (self.labels.get(self, labels), self.rows.get(self, rows));
        let (dl, dr) = (dl.as_ref(), dr.as_ref());
        let mut ok = self.stream.alloc_zeros::<i32>(rows.len()).or_oom();
        let (m, c) = (rows.len() as i64, logits.cols as i32);
        let mut l = self.stream.launch_builder(self.func("count_correct"));
        l.arg(&logits.data).arg(dl).arg(dr).arg(&m).arg(&c).arg(&mut ok);
        // SAFETY: rows index logits.
        unsafe { l.launch(grid(rows.len())) }.expect("CUDA count_correct");
        self.stream.clone_dtoh(&ok).expect("CUDA download").iter().filter(|&&o| o != 0).count()
    }
}
