//! [`GraphOps`] for the CUDA backend: SpMM (through [`crate::spmm`]'s choice), SDDMM and the
//! attention kernels, edge dropout.

use super::*;
use crate::spmm::SpValues;

impl GraphOps for Cuda {
    fn spmm(&self, s: &DSparse, vals: &DMat, transpose: bool, x: &DMat, beta: f64, out: &mut DMat) {
        let _p = self.span_shaped(if transpose { "spmm (transposed)" } else { "spmm" }, || {
            format!("{}x{} nnz {} width {}", approx(s.rows), approx(s.cols), approx(s.nnz), x.cols)
        });
        assert_eq!(vals.rows, s.nnz, "one value per stored entry");
        assert!(
            !transpose || s.t_perm.is_some(),
            "a structure kept without its transpose's entry order multiplies only factored values"
        );
        let (rows, inner) = if transpose { (s.cols, s.rows) } else { (s.rows, s.cols) };
        assert_eq!(x.rows, inner, "spmm: x rows");
        assert_eq!((out.rows, out.cols), (rows, x.cols), "spmm: output shape");
        self.spmm_any(s, SpValues::Entries(vals), transpose, x, beta, out);
    }
    fn spmm_factored(
        &self,
        s: &DSparse,
        rows: Option<&DMat>,
        cols: Option<&DMat>,
        transpose: bool,
        x: &DMat,
        beta: f64,
        out: &mut DMat,
    ) {
        let _p = self.span_shaped(if transpose { "spmm (transposed)" } else { "spmm" }, || {
            format!("{}x{} nnz {} width {} (factored)", approx(s.rows), approx(s.cols), approx(s.nnz), x.cols)
        });
        let (n, inner) = if transpose { (s.cols, s.rows) } else { (s.rows, s.cols) };
        assert_eq!(x.rows, inner, "spmm: x rows");
        assert_eq!((out.rows, out.cols), (n, x.cols), "spmm: output shape");
        assert!(rows.is_none_or(|f| (f.rows, f.cols) == (s.rows, 1)), "one row factor per row");
        assert!(cols.is_none_or(|f| (f.rows, f.cols) == (s.cols, 1)), "one column factor per column");
        self.spmm_any(s, SpValues::Factored(rows, cols), transpose, x, beta, out);
    }
    fn sddmm(&self, s: &DSparse, a: &DMat, b: &DMat, out: &mut DMat) {
        let _p = self.span("sddmm");
        assert_eq!(out.rows, s.nnz, "sddmm: one output row per entry");
        assert_eq!((a.rows, b.rows, a.cols), (s.rows, s.cols, b.cols), "sddmm: operand shapes");
        if s.rows == 0 {
            return;
        }
        let (r64, w, k) = (s.rows as i64, a.cols as i32, out.cols as i32);
        let mut l = self.stream.launch_builder(self.func("sddmm"));
        l.arg(&s.row_ptr)
            .arg(&s.col_idx)
            .arg(&r64)
            .arg(&a.data)
            .arg(&b.data)
            .arg(&w)
            .arg(&k)
            .arg(&mut out.data);
        // SAFETY: shapes checked above.
        unsafe { l.launch(warps(s.rows)) }.expect("CUDA sddmm");
    }
    fn head_dots(&self, z: &DMat, att: &DMat, out: &mut DMat) {
        let _p = self.span("head_dots");
        let (k, f) = (att.rows, att.cols);
        assert_eq!((z.cols, out.cols, out.rows), (k * f, k, z.rows), "head_dots shapes");
        let (n, k32, f32_) = (z.rows as i64, k as i32, f as i32);
        let mut l = self.stream.launch_builder(self.func("head_dots"));
        l.arg(&z.data).arg(&att.data).arg(&n).arg(&k32).arg(&f32_).arg(&mut out.data);
        // SAFETY: shapes checked above.
        unsafe { l.launch(grid(z.rows * k)) }.expect("CUDA head_dots");
    }
    fn head_dots_backward(&self, z: &DMat, att: &DMat, ds: &DMat, dz: &mut DMat, datt: &mut DMat) {
        let _p = self.span("head_dots_backward");
        let (k, f) = (att.rows, att.cols);
        assert_eq!(
            (ds.rows, ds.cols, dz.rows, dz.cols),
            (z.rows, k, z.rows, k * f),
            "head_dots_backward shapes"
        );
        let (n, k32, f32_) = (z.rows as i64, k as i32, f as i32);
        let mut l = self.stream.launch_builder(self.func("head_dots_dz"));
        l.arg(&att.data).arg(&ds.data).arg(&n).arg(&k32).arg(&f32_).arg(&mut dz.data);
        // SAFETY: shapes checked above.
        unsafe { l.launch(grid(z.rows * k * f)) }.expect("CUDA head_dots_dz");
        self.col_reduce(&z.data, Some(&ds.data), None, z.rows, k * f, f, 1, 1.0, &mut datt.data);
    }
    fn edge_softmax(&self, s: &DSparse, src: &DMat, dst: &DMat, slope: f64, out: &mut DMat) {
        let _p = self.span("edge_softmax");
        let k = out.cols;
        assert_eq!((out.rows, src.cols, dst.cols), (s.nnz, k, k), "edge_softmax shapes");
        let (r64, k32, sl) = (s.rows as i64, k as i32, slope as f32);
        let mut l = self.stream.launch_builder(self.func("edge_softmax"));
        l.arg(&s.row_ptr).arg(&s.col_idx).arg(&r64).arg(&src.data).arg(&dst.data).arg(&k32).arg(&sl);
        l.arg(&mut out.data);
        // SAFETY: shapes checked above.
        unsafe { l.launch(grid(s.rows * k)) }.expect("CUDA edge_softmax");
    }
    fn edge_softmax_backward(
        &self,
        s: &DSparse,
        src: &DMat,
        dst: &DMat,
        slope: f64,
        alpha: &DMat,
        dalpha: &DMat,
        dpre: &mut DMat,
    ) {
        let _p = self.span("edge_softmax_backward");
        let k = alpha.cols;
        let (r64, k32, sl) = (s.rows as i64, k as i32, slope as f32);
        let mut l = self.stream.launch_builder(self.func("edge_softmax_backward"));
        l.arg(&s.row_ptr).arg(&s.col_idx).arg(&r64).arg(&src.data).arg(&dst.data).arg(&k32).arg(&sl);
        l.arg(&alpha.data).arg(&dalpha.data).arg(&mut dpre.data);
        // SAFETY: shapes as in edge_softmax.
        unsafe { l.launch(grid(s.rows * k)) }.expect("CUDA edge_softmax_backward");
    }
    fn pair_softmax(&self, s: &DSparse, xl: &DMat, xr: &DMat, att: &DMat, slope: f64, alpha: &mut DMat) {
        let _p = self.span("pair_softmax");
        let (k, f) = (att.rows, att.cols);
        assert_eq!(
            (alpha.rows, alpha.cols),
            (s.nnz, k),
            "pair_softmax: one row per entry, a column per head"
        );
        assert_eq!(
            (xl.rows, xr.rows, xl.cols, xr.cols),
            (s.cols, s.rows, k * f, k * f),
            "pair_softmax shapes"
        );
        let (r64, k32, f32_, sl) = (s.rows as i64, k as i32, f as i32, slope as f32);
        let mut l = self.stream.launch_builder(self.func("pair_softmax"));
        l.arg(&s.row_ptr).arg(&s.col_idx).arg(&r64).arg(&xl.data).arg(&xr.data).arg(&att.data);
        l.arg(&k32).arg(&f32_).arg(&sl).arg(&mut alpha.data);
        // SAFETY: shapes checked above.
        unsafe { l.launch(grid(s.rows * k)) }.expect("CUDA pair_softmax");
    }
    fn pair_softmax_backward(
        &self,
        s: &DSparse,
        xl: &DMat,
        xr: &DMat,
        att: &DMat,
        slope: f64,
        alpha: &DMat,
        dalpha: &DMat,
        grads: PairGrads<'_, DMat>,
    ) {
        let _p = self.span("pair_softmax_backward");
        let (k, f) = (att.rows, att.cols);
        let w = k * f;
        let PairGrads { dxl, dxr, datt } = grads;
        assert_eq!(
            (dxl.rows, dxr.rows, dxl.cols, dxr.cols),
            (s.cols, s.rows, w, w),
            "pair_softmax_backward shapes"
        );
        let perm =
            s.t_perm.as_ref().expect("pair_softmax_backward reads the transposed structure's entry order");
        let (r64, c64, k32, f32_, sl) = (s.rows as i64, s.cols as i64, k as i32, f as i32, slope as f32);
        let mut ds = self.output(s.nnz, k);
        let mut l = self.stream.launch_builder(self.func("pair_score_grad"));
        l.arg(&s.row_ptr).arg(&r64).arg(&k32).arg(&alpha.data).arg(&dalpha.data).arg(&mut ds.data);
        // SAFETY: alpha, dalpha and ds are nnz × k.
        unsafe { l.launch(grid(s.rows * k)) }.expect("CUDA pair_score_grad");
        let mut part = self.output(s.rows, w);
        let mut l = self.stream.launch_builder(self.func("pair_dxr"));
        l.arg(&s.row_ptr).arg(&s.col_idx).arg(&r64).arg(&xl.data).arg(&xr.data).arg(&att.data).arg(&ds.data);
        l.arg(&k32).arg(&f32_).arg(&sl).arg(&mut dxr.data).arg(&mut part.data);
        // SAFETY: shapes checked above; part is rows × w.
        unsafe { l.launch(grid(s.rows * w)) }.expect("CUDA pair_dxr");
        self.col_reduce(&part.data, None, None, s.rows, w, 1, 0, 1.0, &mut datt.data);
        let mut l = self.stream.launch_builder(self.func("pair_dxl"));
        l.arg(&s.t_row_ptr).arg(&s.t_col_idx).arg(perm).arg(&c64).arg(&xl.data).arg(&xr.data).arg(&att.data);
        l.arg(&ds.data).arg(&k32).arg(&f32_).arg(&sl).arg(&mut dxl.data);
        // SAFETY: shapes checked above; the transposed structure indexes rows and entries of s.
        unsafe { l.launch(grid(s.cols * w)) }.expect("CUDA pair_dxl");
    }
    fn edge_dropout(&self, s: &DSparse, key: MaskKey, p: f64, vals: &mut DMat) {
        let _p = self.span("edge_dropout");
        assert!((0.0..1.0).contains(&p), "dropout probability {p} outside [0, 1)");
        if p == 0.0 || s.rows == 0 {
            return;
        }
        let (r64, k, t, scale) = (s.rows as i64, vals.cols as i32, thr(p), (1.0 / (1.0 - p)) as f32);
        let (rids, cids, has) = match &s.ids {
            Some((r, c)) => (r, c, 1i32),
            None => (&self.dummy_u32, &self.dummy_u32, 0),
        };
        let mut l = self.stream.launch_builder(self.func("edge_dropout"));
        l.arg(&s.row_ptr).arg(&s.col_idx).arg(&r64).arg(rids).arg(cids).arg(&has).arg(&mut vals.data).arg(&k);
        l.arg(&key.seed).arg(&key.epoch).arg(&key.site).arg(&t).arg(&scale);
        // SAFETY: vals has nnz × k entries.
        unsafe { l.launch(warps(s.rows)) }.expect("CUDA edge_dropout");
    }
}
