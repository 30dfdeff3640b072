//! Row gathers and scatter-adds: the kernel chosen by rows per warp and alignment, and their
//! launches from device or mapped host memory.

use super::*;

impl Cuda {
    /// Rows each warp of a row gather copies: 1, or 2 (both rows' loads in flight before the
    /// stores; see `gather_rows2`).
    pub fn set_gather_rows_per_warp(&mut self, rows: usize) {
        assert!(rows == 1 || rows == 2, "1 or 2 rows per warp");
        self.gather_rows_per_warp = rows;
    }

    /// Whether gathers from host memory read each row from the start of its 128-byte line
    /// (`gather_rows_aligned`, for widths that leave rows unaligned; the default) or from the
    /// row's start (for comparisons; also `GRINNDER_GATHER_ALIGNED=0`).
    pub fn set_gather_aligned(&mut self, on: bool) {
        self.gather_aligned = on;
    }

    /// The gather kernel and its launch for `n` rows.
    pub(crate) fn gather_kernel(&self, n: usize) -> (&'static str, LaunchConfig) {
        match self.gather_rows_per_warp {
            2 => ("gather_rows2", warps(n.div_ceil(2))),
            _ => ("gather_rows", warps(n)),
        }
    }

    /// [`Cuda::gather_kernel`] for rows of width `d` in host memory (a table's base is
    /// page-aligned): the aligned kernel where rows do not start on 128-byte lines.
    pub(crate) fn host_gather_kernel(&self, n: usize, d: usize) -> (&'static str, LaunchConfig) {
        match self.gather_rows_per_warp {
            1 => (self.one_row_gather(d), warps(n)),
            _ => self.gather_kernel(n),
        }
    }

    /// The one-row-per-warp gather from host memory for width `d` (both kernels stride over the
    /// rows when the grid has fewer warps).
    pub(crate) fn one_row_gather(&self, d: usize) -> &'static str {
        if self.gather_aligned && d % 4 == 0 && d % 32 != 0 {
            "gather_rows_aligned"
        } else {
            "gather_rows"
        }
    }

    /// Launches a row-copy kernel (`gather_rows`, `scatter_add_rows`): `src` (a device address:
    /// device memory, or mapped host memory), the row list (indices uploaded, or a range
    /// start), the width and `dst`.
    pub(crate) fn launch_rows(
        &self,
        name: &str,
        src: u64,
        rows: Rows<'_>,
        d: usize,
        dst: CudaViewMut<'_, f32>,
        cfg: LaunchConfig,
    ) {
        let (idx, start) = match rows {
            Rows::Index(i) => (Some(self.row_lists.get(self, i)), 0i64),
            Rows::Range(s, _) => (None, s as i64),
        };
        self.launch_rows_at(&self.stream, name, src, idx.as_deref(), start, rows.len(), d, dst, cfg);
    }

    /// [`Cuda::launch_rows`] with the row list given as device indices, or a range from `start`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch_rows_at(
        &self,
        stream: &Arc<CudaStream>,
        name: &str,
        src: u64,
        idx: Option<&CudaSlice<u32>>,
        start: i64,
        n: usize,
        d: usize,
        mut dst: CudaViewMut<'_, f32>,
        cfg: LaunchConfig,
    ) {
        let (n, d, null) = (n as i64, d as i32, 0u64);
        let mut l = stream.launch_builder(self.func(name));
        l.arg(&src);
        match idx {
            Some(i) => l.arg(i),
            None => l.arg(&null),
        };
        l.arg(&start).arg(&n).arg(&d).arg(&mut dst);
        // SAFETY: the callers checked every row number against both matrices.
        unsafe { l.launch(cfg) }.expect(name);
    }
}
