//! Which SpMM runs: grinnder's kernels (a half-warp, 16-byte vector or general kernel by width)
//! or cuSPARSE's, the faster timed once per shape class.

use super::*;

/// Which SpMM runs: the faster of grinnder's kernel for the shape and cuSPARSE, timed on each
/// shape's first call (`Auto`), or one forced for comparisons (also with
/// `GRINNDER_SPMM=ours|warp|cusparse`; `Warp`: grinnder's general kernel everywhere). cuSPARSE
/// serves single-valued structures (not attention heads); the others always run grinnder's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpmmKernel {
    Auto,
    Ours,
    Warp,
    CuSparse,
}

/// The values an SpMM multiplies by: one per entry (per head), or factors of the rows and the
/// columns (`GraphOps::spmm_factored`).
#[derive(Clone, Copy)]
pub(crate) enum SpValues<'a> {
    Entries(&'a DMat),
    Factored(Option<&'a DMat>, Option<&'a DMat>),
}

/// An SpMM shape: rows, columns and entries of the structure, the width, transposed.
pub(crate) type SpmmShape = (usize, usize, usize, usize, bool);

/// The class of an SpMM shape whose timing decides for all its members: rows, columns and
/// entries each to its half-octave (sizes within a factor √2 share one), width and direction
/// exact. Mini-batches and partitions come in shapes that differ a little each time; timing
/// every one (six runs and four synchronisations) would cost more than the choice saves.
pub(crate) fn shape_class((rows, cols, nnz, width, transposed): SpmmShape) -> SpmmShape {
    let half_octave = |n: usize| if n == 0 { 0 } else { (2.0 * (n as f64).log2()).floor() as usize + 1 };
    (half_octave(rows), half_octave(cols), half_octave(nnz), width, transposed)
}

/// [`SpmmShape`], public.
pub type SpmmShapeInfo = SpmmShape;

impl Cuda {
    /// Forces an SpMM implementation (see [`SpmmKernel`]).
    pub fn set_spmm(&mut self, k: SpmmKernel) {
        self.spmm_kernel = k;
    }

    /// Whether cuSPARSE was found.
    pub fn has_cusparse(&self) -> bool {
        self.sparse_lib.is_some()
    }

    /// An SpMM by grinnder's kernel or cuSPARSE (single-valued or factored values), as
    /// [`SpmmKernel`] picks; shapes checked by the caller.
    pub(crate) fn spmm_any(
        &self,
        s: &DSparse,
        vals: SpValues<'_>,
        transpose: bool,
        x: &DMat,
        beta: f64,
        out: &mut DMat,
    ) {
        let rows = if transpose { s.cols } else { s.rows };
        if rows == 0 || x.cols == 0 {
            return;
        }
        let single = match vals {
            SpValues::Entries(v) => v.cols == 1,
            SpValues::Factored(..) => true,
        };
        let lib = match (&self.sparse_lib, &s.csr32) {
            (Some(l), Some(c)) if single && s.nnz > 0 => Some((l, c)),
            _ => None,
        };
        let use_lib = match (lib, self.spmm_kernel) {
            (None, _) | (_, SpmmKernel::Ours | SpmmKernel::Warp) => false,
            (Some(_), SpmmKernel::CuSparse) => true,
            (Some(_), SpmmKernel::Auto) => self.pick_spmm(s, vals, transpose, x, beta, out),
        };
        if let (true, Some((l, c))) = (use_lib, lib) {
            match self.spmm_lib(l, c, s, vals, transpose, x, beta, out) {
                Ok(()) => return,
                Err(e) => tracing::warn!("cuSPARSE SpMM failed ({e}); grinnder's kernel runs instead"),
            }
        }
        self.spmm_ours(s, vals, transpose, x, beta, out);
    }

    /// grinnder's SpMM kernels (see `spmm` in kernels.cu).
    pub(crate) fn spmm_ours(
        &self,
        s: &DSparse,
        vals: SpValues<'_>,
        transpose: bool,
        x: &DMat,
        beta: f64,
        out: &mut DMat,
    ) {
        let rows = if transpose { s.cols } else { s.rows };
        let (ptr, idx) = if transpose { (&s.t_row_ptr, &s.t_col_idx) } else { (&s.row_ptr, &s.col_idx) };
        let none = &self.dummy_f32;
        // values per entry (read through the transpose's entry order), or the factors of the
        // output's side and the gathered side
        let (perm, v, vc, (in_f, out_f)) = match vals {
            SpValues::Entries(v) => {
                let perm = match (transpose, &s.t_perm) {
                    (false, _) => None,
                    (true, Some(p)) => Some(p),
                    (true, None) => {
                        panic!("a structure kept without its transpose's entry order multiplies only factored values")
                    }
                };
                (perm, &v.data, v.cols as i32, (None, None))
            }
            SpValues::Factored(r, c) => (None, none, 0, if transpose { (r, c) } else { (c, r) }),
        };
        let (factors, in_f, out_f) = self.factor_args(in_f, out_f);
        let (has_perm, perm) = (perm.is_some() as i32, perm.unwrap_or(&self.dummy_u32));
        let (d, r64, beta) = (x.cols as i32, rows as i64, beta as f32);
        // narrow rows: a half-warp each; rows of whole 16-byte vectors (in one head per vector):
        // vector loads; otherwise the general kernel
        let (name, cfg) = match self.spmm_kernel {
            SpmmKernel::Warp => ("spmm", warps(rows)),
            _ if x.cols <= 64 => ("spmm16", grid(rows * 16)),
            _ if x.cols % 4 == 0 && (x.cols / vc.max(1) as usize) % 4 == 0 => ("spmm_v4", warps(rows)),
            _ => ("spmm", warps(rows)),
        };
        let mut l = self.stream.launch_builder(self.func(name));
        l.arg(ptr).arg(idx).arg(perm).arg(&has_perm).arg(v).arg(&vc).arg(in_f).arg(out_f).arg(&factors);
        l.arg(&x.data).arg(&d).arg(&mut out.data).arg(&r64).arg(&beta);
        // SAFETY: the structure's indices are below x's rows (checked when it was built).
        unsafe { l.launch(cfg) }.expect("CUDA spmm");
    }

    /// The kernels' factor arguments: the `factors` bits (1: an input-side factor, 2: an
    /// output-side one) and the two vectors (a placeholder for one absent).
    fn factor_args<'m>(
        &'m self,
        in_f: Option<&'m DMat>,
        out_f: Option<&'m DMat>,
    ) -> (i32, &'m CudaSlice<f32>, &'m CudaSlice<f32>) {
        let factors = in_f.is_some() as i32 | (out_f.is_some() as i32) << 1;
        let none = &self.dummy_f32;
        (factors, in_f.map_or(none, |f| &f.data), out_f.map_or(none, |f| &f.data))
    }

    /// cuSPARSE's SpMM; the transpose through the stored transposed structure, its values
    /// permuted into that order first. Factored values are written out per entry first, in
    /// the order of the structure multiplied (a temporary of one value per entry, as the
    /// permuted values are).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn spmm_lib(
        &self,
        lib: &cusparse::CuSparse,
        c: &cusparse::Csr32,
        s: &DSparse,
        vals: SpValues<'_>,
        transpose: bool,
        x: &DMat,
        beta: f64,
        out: &mut DMat,
    ) -> Result<(), String> {
        let vals = match vals {
            SpValues::Entries(v) => v,
            SpValues::Factored(r, cf) => {
                let (ptr64, ptr, idx, n, (in_f, out_f)) = if transpose {
                    (&s.t_row_ptr, &c.t_ptr, &s.t_col_idx, s.cols, (r, cf))
                } else {
                    (&s.row_ptr, &c.ptr, &s.col_idx, s.rows, (cf, r))
                };
                let (factors, in_f, out_f) = self.factor_args(in_f, out_f);
                let mut v = self.output(s.nnz, 1);
                let n64 = n as i64;
                let mut l = self.stream.launch_builder(self.func("factored_values"));
                l.arg(ptr64).arg(idx).arg(&n64).arg(in_f).arg(out_f).arg(&factors).arg(&mut v.data);
                // SAFETY: the structure's indices are below the factors' lengths (checked when it
                // was built and by the caller); `v` holds one value per entry.
                unsafe { l.launch(warps(n)) }.expect("CUDA factored_values");
                let shape = if transpose { (s.cols, s.rows, s.nnz) } else { (s.rows, s.cols, s.nnz) };
                return lib.spmm(&self.stream, shape, ptr, idx, &v.data, x, beta as f32, out);
            }
        };
        if !transpose {
            let shape = (s.rows, s.cols, s.nnz);
            return lib.spmm(&self.stream, shape, &c.ptr, &s.col_idx, &vals.data, x, beta as f32, out);
        }
        let mut vt = self.output(s.nnz, 1);
        let n = s.nnz as i64;
        let perm = s.t_perm.as_ref().ok_or("a structure without its transpose's entry order")?;
        let mut l = self.stream.launch_builder(self.func("permute"));
        l.arg(&vals.data).arg(perm).arg(&n).arg(&mut vt.data);
        // SAFETY: t_perm holds positions below nnz.
        unsafe { l.launch(grid(s.nnz)) }.expect("CUDA permute");
        let shape = (s.cols, s.rows, s.nnz);
        lib.spmm(&self.stream, shape, &c.t_ptr, &s.t_col_idx, &vt.data, x, beta as f32, out)
    }

    /// Whether cuSPARSE is the faster SpMM for this shape: timed at the first shape of its
    /// class (two runs of each into the output, which the SpMM then overwrites, when `beta` is 0;
    /// into a scratch output otherwise), remembered for the class after.
    pub(crate) fn pick_spmm(
        &self,
        s: &DSparse,
        vals: SpValues<'_>,
        transpose: bool,
        x: &DMat,
        beta: f64,
        out: &mut DMat,
    ) -> bool {
        let shape = (s.rows, s.cols, s.nnz, x.cols, transpose);
        // (factored values reach cuSPARSE through a pass of their own: timed apart)
        let key = (shape_class(shape), matches!(vals, SpValues::Factored(..)));
        if let Some(&(lib, ..)) = self.spmm_pick.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return lib;
        }
        let (Some(lib), Some(c)) = (&self.sparse_lib, &s.csr32) else { return false };
        let rows = if transpose { s.cols } else { s.rows };
        // a large first product (a whole graph's aggregation) gets no second output beside it
        let mut scratch = (beta != 0.0).then(|| self.output(rows, x.cols));
        let scratch = scratch.as_mut().unwrap_or(out);
        let time = |f: &mut dyn FnMut(&mut DMat) -> Result<(), String>, out: &mut DMat| {
            f(out)?;
            self.stream.synchronize().map_err(|e| format!("{e:?}"))?;
            let t = std::time::Instant::now();
            f(out)?;
            f(out)?;
            self.stream.synchronize().map_err(|e| format!("{e:?}"))?;
            Ok::<f64, String>(t.elapsed().as_secs_f64() * 500.0)
        };
        let mut run_ours = |o: &mut DMat| {
            self.spmm_ours(s, vals, transpose, x, 0.0, o);
            Ok(())
        };
        let ours = time(&mut run_ours, scratch).expect("CUDA spmm");
        let theirs = time(&mut |o| self.spmm_lib(lib, c, s, vals, transpose, x, 0.0, o), scratch);
        let pick = match theirs {
            Ok(t) => (t < ours, ours, t, shape),
            Err(e) => {
                tracing::warn!("cuSPARSE SpMM failed ({e}); grinnder's kernels only for this shape");
                (false, ours, f64::NAN, shape)
            }
        };
        tracing::debug!(
            "spmm {}×{} ({} entries) width {}{}: grinnder {:.3} ms, cuSPARSE {:.3} ms",
            shape.0,
            shape.1,
            shape.2,
            shape.3,
            if transpose { " transposed" } else { "" },
            pick.1,
            pick.2
        );
        self.spmm_pick.lock().unwrap_or_else(|e| e.into_inner()).insert(key, pick);
        pick.0
    }

    /// Each SpMM shape timed so far (one per class): (rows, cols, entries, width, transposed),
    /// whether cuSPARSE won, and both times in ms.
    pub fn spmm_choices(&self) -> Vec<(SpmmShapeInfo, bool, f64, f64)> {
        let m = self.spmm_pick.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<_> = m.values().map(|&(l, a, b, shape)| (shape, l, a, b)).collect();
        v.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::shape_class;

    #[test]
    pub(crate) fn spmm_shapes_within_a_half_octave_share_a_timing() {
        let c = |rows, cols, nnz| shape_class((rows, cols, nnz, 256, false));
        // a mini-batch's blocks: a few per cent apart
        assert_eq!(c(150_000, 540_000, 750_000), c(152_000, 545_000, 760_000));
        // twice the rows, or the entries: another class
        assert_ne!(c(150_000, 540_000, 750_000), c(300_000, 540_000, 750_000));
        assert_ne!(c(150_000, 540_000, 750_000), c(150_000, 540_000, 1_500_000));
        // width and direction decide alone
        assert_ne!(shape_class((10, 10, 10, 256, false)), shape_class((10, 10, 10, 128, false)));
        assert_ne!(shape_class((10, 10, 10, 256, false)), shape_class((10, 10, 10, 256, true)));
        assert_eq!(shape_class((0, 0, 0, 1, false)), (0, 0, 0, 1, false));
    }
}
