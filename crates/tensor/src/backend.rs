//! The Backend trait: the few operations every layer is written on, grouped by family
//! ([`Memory`], [`Transfers`], [`HandOffs`], [`DenseOps`], [`GraphOps`], [`TrainOps`]) so that each
//! trait stays small and a backend is read one family at a time.
//! A backend owns where matrices live (host memory, GPU memory); layers only call these.
//!
//! Conventions: matrices are row-major `rows × cols`; `beta` in an output-producing operation
//! means `out = result + beta · out` (`beta = 0` overwrites, `1` accumulates). Sparse
//! operations take a structure (`Self::Sparse`) and a value set (`Self::Mat` of shape
//! `nnz × k`, in CSR order; `k` = 1, or heads for attention).

use crate::mat::Mat;
use crate::scalar::Scalar;
use crate::sparse::SparseMatrix;

/// Where a dropout mask comes from: bit-identical wherever the same element is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaskKey {
    pub seed: u64,
    pub epoch: u64,
    /// Which dropout site (layer and place within it).
    pub site: u64,
}

/// A device's memory in use now and at most since the last reset, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceMemory {
    pub used: u64,
    pub peak: u64,
}

/// A list of row numbers: a range, or explicit indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows<'a> {
    /// `start, start + 1, …, start + len - 1`
    Range(usize, usize),
    Index(&'a [u32]),
}

impl Rows<'_> {
    pub fn len(&self) -> usize {
        match self {
            Rows::Range(_, n) => *n,
            Rows::Index(i) => i.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The `i`-th row number.
    pub fn get(&self, i: usize) -> usize {
        match self {
            Rows::Range(s, _) => s + i,
            Rows::Index(idx) => idx[i] as usize,
        }
    }
    /// One past the largest row number (0 when empty).
    pub fn end(&self) -> usize {
        match self {
            Rows::Range(s, n) => s + n,
            Rows::Index(idx) => idx.iter().max().map_or(0, |&m| m as usize + 1),
        }
    }
}

/// Element-wise maps applied in place.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unary {
    Relu,
    Scale(f64),
}

/// Element-wise combinations `b = f(a, b)`, in place on `b`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Binary {
    /// `b = a + b`
    Add,
    /// `b = b · [a > 0]` (ReLU backward given the ReLU output `a`)
    ReluGrad,
    /// `b = a ⊙ b` (element-wise product)
    Mul,
}

/// Which side of a sparse matrix an edge reduction collects on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Sum over each row's entries (a node's in-edges).
    Row,
    /// Sum over each column's entries (a node's out-edges).
    Col,
}

/// One optimizer step's hyper-parameters (PyTorch's definitions; see `grinnder_nn::optim`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StepRule {
    /// Adam with L2 decay added to the gradient (`decoupled = false`) or AdamW's decoupled
    /// decay (`decoupled = true`); `t` is the 1-based step number.
    Adam { lr: f64, beta1: f64, beta2: f64, eps: f64, weight_decay: f64, decoupled: bool, t: u64 },
    /// SGD with momentum in PyTorch's form `buf = m·buf + g; p -= lr·buf`, L2 decay added to `g`.
    Sgd { lr: f64, momentum: f64, weight_decay: f64, first: bool },
}

/// Everything a layer computes with, as one bound: the op-family traits below, each a
/// supertrait (burn's `Backend` is built the same way). A type that implements every family is
/// a `Backend`; code generic over `B: Backend` calls any family's methods without importing it,
/// code on a concrete backend (tests, the CLI) imports the families it uses.
pub trait Backend: Memory + Transfers + HandOffs + DenseOps + GraphOps + TrainOps {}

impl<B: Memory + Transfers + HandOffs + DenseOps + GraphOps + TrainOps> Backend for B {}

/// Where a backend's matrices live: their types, allocation, copies and the device's memory.
pub trait Memory: Send + Sync + 'static {
    type T: Scalar;
    type Mat: Send + Sync + 'static;
    type Sparse: Send + Sync;
    /// Host memory for blocks written once and read many times (input features, layer 0's
    /// aggregation): page-locked on a GPU, so they reach the device by DMA or by device
    /// threads, with no staging copy on the host; a host matrix on the CPU.
    type HostBlock: Send + Sync;
    /// A matrix still being filled by a copy queued ahead of its use
    /// ([`HandOffs::upload_host_rows`]); [`HandOffs::arrived`] makes it a matrix to compute with.
    /// The matrix itself where copies finish within the call.
    type Arriving: Send;
    /// A loss still on its way to the host ([`TrainOps::cross_entropy_later`]); the values
    /// themselves where the call computes them.
    type Loss: Send;
    /// A matrix on its way to the host ([`HandOffs::download_ahead`]); the matrix itself where
    /// it is host memory.
    type Leaving: Send;

    /// Bytes the backend holds in its own memory (a GPU's); `None` where matrices live in host
    /// memory (counted in the process's resident set).
    fn device_memory(&self) -> Option<DeviceMemory> {
        None
    }
    /// Starts a new peak for [`Memory::device_memory`].
    fn reset_memory_peak(&self) {}
    /// The most device bytes in use at once since the last call (or
    /// [`Memory::reset_memory_peak`]), without ending [`Memory::device_memory`]'s peak; `None`
    /// where memory is not the device's.
    fn phase_memory_peak(&self) -> Option<u64> {
        None
    }
    fn zeros(&self, rows: usize, cols: usize) -> Self::Mat;
    /// A matrix whose contents are unspecified, for an output the next operation overwrites in
    /// full (with `beta = 0`): the GPU skips clearing it. The CPU backend fills it with NaN in
    /// debug builds, so a use that reads it fails the tests.
    fn output(&self, rows: usize, cols: usize) -> Self::Mat {
        self.zeros(rows, cols)
    }
    fn dims(&self, m: &Self::Mat) -> (usize, usize);
    /// `dst = src` (same shape).
    fn copy(&self, src: &Self::Mat, dst: &mut Self::Mat);

    /// Waits for all work queued on the backend (a no-op where calls return finished): epoch
    /// timings end here.
    fn synchronize(&self) {}
}

/// Moving matrices between the host and the backend, and host blocks (page-locked memory a
/// GPU reads by DMA or with its own threads).
pub trait Transfers: Memory {
    /// Moves a sparse structure into the backend, with its transpose: built by the backend
    /// where `s` comes without one ([`SparseMatrix::csr_only`]).
    fn sparse(&self, s: &SparseMatrix) -> Self::Sparse;
    fn upload(&self, m: &Mat<Self::T>) -> Self::Mat;
    fn download(&self, m: &Self::Mat) -> Mat<Self::T>;
    /// [`Transfers::upload`] of a matrix the caller gives up (a move where memory is shared).
    fn upload_owned(&self, m: Mat<Self::T>) -> Self::Mat {
        self.upload(&m)
    }
    /// A `rows × cols` matrix whose elements `fill` writes on the host (row-major): an upload
    /// without an intermediate copy where the backend stages uploads in host memory of its own
    /// (a GPU: page-locked, copied at the bus's full speed).
    fn upload_with(&self, rows: usize, cols: usize, fill: &mut dyn FnMut(&mut [Self::T])) -> Self::Mat {
        let mut m = Mat::zeros(rows, cols);
        fill(&mut m.data);
        self.upload_owned(m)
    }
    /// Hands `m`'s elements (row-major) to `read` on the host: a download into the backend's
    /// staging memory, or `m` itself where it is host memory.
    fn download_with(&self, m: &Self::Mat, read: &mut dyn FnMut(&[Self::T])) {
        read(&self.download(m).data)
    }
    /// Whether [`Transfers::upload_bf16_with`] and [`Transfers::download_bf16_with`] convert
    /// on the backend's side of a bus, so that bf16 elements cross it at half the bytes (a GPU);
    /// where not (the host), their defaults convert on the host and gain nothing. A backend
    /// that converts also has bf16 host blocks ([`Transfers::new_host_block_bf16`]).
    fn converts_bf16(&self) -> bool {
        false
    }
    /// [`Transfers::upload_with`] of elements `fill` writes as bf16 ([`crate::scalar::to_bf16`]'s
    /// encoding), each the f32 it holds once uploaded.
    fn upload_bf16_with(&self, rows: usize, cols: usize, fill: &mut dyn FnMut(&mut [u16])) -> Self::Mat {
        let mut h = vec![0u16; rows * cols];
        fill(&mut h);
        let data = h.iter().map(|&x| Self::T::of(crate::scalar::from_bf16(x) as f64)).collect();
        self.upload_owned(Mat::from_vec(rows, cols, data))
    }
    /// [`Transfers::download_with`] of `m`'s elements rounded to bf16 (to nearest, ties to
    /// even: the bits of [`crate::scalar::to_bf16`]).
    fn download_bf16_with(&self, m: &Self::Mat, read: &mut dyn FnMut(&[u16])) {
        self.download_with(m, &mut |h| {
            let v: Vec<u16> = h.iter().map(|x| crate::scalar::to_bf16(x.f64() as f32)).collect();
            read(&v)
        })
    }
    /// Frees the staging memory [`Transfers::upload_with`] and [`Transfers::download_with`]
    /// grew to (after a phase of transfers larger than later ones: it is kept otherwise); the
    /// next staged transfer allocates again.
    fn release_staging(&self) {}
    /// [`Transfers::download`] of a matrix the caller gives up.
    fn download_owned(&self, m: Self::Mat) -> Mat<Self::T> {
        self.download(&m)
    }
    /// `m` as a [`Memory::HostBlock`]; `m` back where the backend cannot have one now (page-locked
    /// memory exhausted), for the caller to keep it elsewhere.
    fn host_block(&self, m: Mat<Self::T>) -> Result<Self::HostBlock, Mat<Self::T>>;
    /// A new `rows × cols` [`Memory::HostBlock`] (its elements unspecified until written);
    /// `None` where the backend cannot have one now.
    fn new_host_block(&self, rows: usize, cols: usize) -> Option<Self::HostBlock> {
        self.host_block(Mat::zeros(rows, cols)).ok()
    }
    /// [`Transfers::new_host_block`] holding bf16 ([`crate::scalar::to_bf16`]'s bits: what the
    /// operations on host blocks write is rounded so, what they read widened back), for a tier
    /// of bf16 blocks; `None` where the backend has none (the default: the host keeps bf16
    /// blocks in its store) or cannot have one now.
    fn new_host_block_bf16(&self, _rows: usize, _cols: usize) -> Option<Self::HostBlock> {
        None
    }
    /// `m` rounded into a bf16 host block ([`Transfers::new_host_block_bf16`]); `m` back where
    /// the backend cannot have one.
    fn host_block_bf16(&self, m: Mat<Self::T>) -> Result<Self::HostBlock, Mat<Self::T>> {
        Err(m)
    }
    /// `h` = rows `from..from + h.rows` of `m` (of `h`'s width): on a GPU straight into the
    /// page-locked block, no staging copy, queued behind the work that makes `m` (the host waits
    /// only where it reads the block: [`Transfers::host_block_mut`]).
    fn download_into_host_block(&self, m: &Self::Mat, from: usize, h: &mut Self::HostBlock);
    /// `h[rows[i]] += m[from + i]`, the rows distinct: on a GPU device threads read and write
    /// the host block's rows over the bus (no staging, no host work), queued as
    /// [`Transfers::download_into_host_block`] is.
    fn scatter_add_host_block(&self, m: &Self::Mat, from: usize, rows: Rows<'_>, h: &mut Self::HostBlock);
    /// `h = 0`, queued as [`Transfers::download_into_host_block`] is.
    fn zero_host_block(&self, h: &mut Self::HostBlock);
    fn host_block_dims(&self, h: &Self::HostBlock) -> (usize, usize);
    /// A host block's elements (not a bf16 one's), for writing; waits for copies still reading
    /// it.
    fn host_block_mut<'h>(&self, h: &'h mut Self::HostBlock) -> &'h mut [Self::T];
    /// `out[at + i] = h[rows[i]]` (on a GPU: device threads read the rows from host memory).
    fn gather_host_block(&self, h: &Self::HostBlock, rows: Rows<'_>, out: &mut Self::Mat, at: usize);
}

/// Work handed from one stream to another: structures and uploads made ahead of their use,
/// copies queued on a second stream and the point where the compute stream waits for them.
pub trait HandOffs: Transfers {
    /// [`Transfers::sparse`] and [`Transfers::upload`] for structures made off the training
    /// thread ahead of their use (a mini-batch's blocks, by its sampling thread): on a device,
    /// on a stream of their own, so that they wait neither for the compute queued meanwhile nor
    /// make it wait; the first use waits for them. The same as `sparse` and `upload` elsewhere.
    fn sparse_ahead(&self, s: &SparseMatrix) -> Self::Sparse {
        self.sparse(s)
    }
    fn upload_ahead(&self, m: &Mat<Self::T>) -> Self::Mat {
        self.upload(m)
    }
    /// The first `rows` rows of a host block as a backend matrix, once [`HandOffs::arrived`]. On a
    /// GPU the copy is queued on a second stream: it overlaps the work queued before it and
    /// until `arrived`; the block may be written again at once ([`Transfers::host_block_mut`]
    /// waits).
    fn upload_host_rows(&self, h: &Self::HostBlock, rows: usize) -> Self::Arriving;
    /// A whole host block as a backend matrix ([`HandOffs::upload_host_rows`] of every row).
    fn upload_host_block(&self, h: &Self::HostBlock) -> Self::Arriving {
        self.upload_host_rows(h, self.host_block_dims(h).0)
    }
    /// The matrix of an upload queued ahead, for computing with: on a GPU, the work queued from
    /// here on waits for the copy (the work queued before it does not).
    fn arrived(&self, m: Self::Arriving) -> Self::Mat;
    /// Starts copying `m` to host memory once the work queued so far (which fills it) is done:
    /// on a GPU on a second stream, into page-locked memory, so that the work queued next runs
    /// beside the copy. [`HandOffs::downloaded`] hands the rows over.
    fn download_ahead(&self, m: Self::Mat) -> Self::Leaving;
    /// The elements (row-major) of a matrix whose download was started ahead, to `read`, once
    /// the copy is done.
    fn downloaded(&self, l: Self::Leaving, read: &mut dyn FnMut(&[Self::T]));
}

/// Dense compute: products, row gathers and scatters, element-wise maps, dropout, LayerNorm.
pub trait DenseOps: Memory {
    /// `c = alpha · op(a) · op(b) + beta · c`, `op` transposing when asked.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        alpha: f64,
        a: &Self::Mat,
        ta: bool,
        b: &Self::Mat,
        tb: bool,
        beta: f64,
        c: &mut Self::Mat,
    );

    /// `out[at + i, :] = x[rows[i], :]` (a partition's own and halo rows from larger matrices).
    fn gather_rows(&self, x: &Self::Mat, rows: Rows<'_>, out: &mut Self::Mat, at: usize);
    /// `out[rows[i], :] += src[from + i, :]` (halo gradients back to their owners); indexed rows
    /// may repeat.
    fn scatter_add_rows(&self, src: &Self::Mat, from: usize, rows: Rows<'_>, out: &mut Self::Mat);

    fn unary(&self, op: Unary, x: &mut Self::Mat);
    fn binary(&self, op: Binary, a: &Self::Mat, b: &mut Self::Mat);
    /// `x[r, :] += row` for every row (bias).
    fn add_row(&self, row: &Self::Mat, x: &mut Self::Mat);
    /// `out[0, :] = Σ_r x[r, :] + beta · out` (bias gradient).
    fn col_sums(&self, x: &Self::Mat, beta: f64, out: &mut Self::Mat);

    /// Inverted dropout in place: element `(r, c)` is kept with probability `1 - p` and scaled
    /// by `1 / (1 - p)`, the decision keyed by (key, node, c) where the node is `ids[r]`, or `r`
    /// when `ids` is `None`. Applying it to a gradient with the same key and rows is the
    /// backward pass.
    fn dropout(&self, key: MaskKey, p: f64, ids: Option<&[u32]>, x: &mut Self::Mat);

    /// LayerNorm over each row: `y = (x - μ) / sqrt(σ² + eps) · gamma + beta`, biased variance.
    /// Writes `y` and per-row `(μ, 1/σ)` into `stats` (`rows × 2`).
    #[allow(clippy::too_many_arguments)]
    fn layer_norm(
        &self,
        x: &Self::Mat,
        gamma: &Self::Mat,
        beta: &Self::Mat,
        eps: f64,
        y: &mut Self::Mat,
        stats: &mut Self::Mat,
    );
    /// Backward of [`DenseOps::layer_norm`]: writes `dx`, accumulates `dgamma`, `dbeta`.
    #[allow(clippy::too_many_arguments)]
    fn layer_norm_backward(
        &self,
        x: &Self::Mat,
        gamma: &Self::Mat,
        stats: &Self::Mat,
        dy: &Self::Mat,
        dx: &mut Self::Mat,
        dgamma: &mut Self::Mat,
        dbeta: &mut Self::Mat,
    );
}

/// Where [`GraphOps::pair_softmax_backward`] accumulates: the gradients of its `xl`, `xr` and
/// `att`.
pub struct PairGrads<'a, M> {
    pub dxl: &'a mut M,
    pub dxr: &'a mut M,
    pub datt: &'a mut M,
}

/// Compute over a sparse structure's entries: SpMM, and attention's SDDMM, per-head dots,
/// edge softmax and edge dropout.
pub trait GraphOps: Memory {
    /// `out = op(A) · x + beta · out` with `A` the structure `s` carrying values `vals`. With
    /// `k = vals.cols > 1` (attention heads), `x` has `k` column blocks of width `x.cols / k`
    /// and block `h` is multiplied by the matrix of values `vals[:, h]`.
    fn spmm(
        &self,
        s: &Self::Sparse,
        vals: &Self::Mat,
        transpose: bool,
        x: &Self::Mat,
        beta: f64,
        out: &mut Self::Mat,
    );

    /// `out = op(A) · x + beta · out` with `A`'s entry `(r, c)` = `rows[r] · cols[c]` over the
    /// structure `s` (`rows` and `cols` column vectors of one factor per row and per column; one
    /// absent: 1). A normalisation that factors so (GCN's `d̂^{-1/2}` on both sides, SAGE's
    /// `1/deg` on the rows, GIN's ones) is kept per node instead of per entry, and the
    /// transpose needs no entry order ([`SparseMatrix::without_entry_order`]).
    #[allow(clippy::too_many_arguments)]
    fn spmm_factored(
        &self,
        s: &Self::Sparse,
        rows: Option<&Self::Mat>,
        cols: Option<&Self::Mat>,
        transpose: bool,
        x: &Self::Mat,
        beta: f64,
        out: &mut Self::Mat,
    );

    /// Sampled dense-dense product over the entries of `s`: `out[e, h] = a[r, block h] ·
    /// b[c, block h]` for entry `e = (r, c)`, `k = out.cols` blocks.
    fn sddmm(&self, s: &Self::Sparse, a: &Self::Mat, b: &Self::Mat, out: &mut Self::Mat);

    /// Per-head dot products: `out[v, h] = Σ_f z[v, h·F + f] · att[h, f]` (`att` is `k × F`).
    fn head_dots(&self, z: &Self::Mat, att: &Self::Mat, out: &mut Self::Mat);
    /// Backward of [`GraphOps::head_dots`] for upstream `ds` (`n × k`): accumulates
    /// `dz[v, h·F + f] += ds[v, h] · att[h, f]` and `datt[h, f] += Σ_v ds[v, h] · z[v, h·F + f]`.
    fn head_dots_backward(
        &self,
        z: &Self::Mat,
        att: &Self::Mat,
        ds: &Self::Mat,
        dz: &mut Self::Mat,
        datt: &mut Self::Mat,
    );

    /// Attention coefficients: for entry `e = (r, c)` and head `h`, score
    /// `LeakyReLU(src[c, h] + dst[r, h])` with `slope`, softmax over each row's entries.
    fn edge_softmax(
        &self,
        s: &Self::Sparse,
        src: &Self::Mat,
        dst: &Self::Mat,
        slope: f64,
        alpha: &mut Self::Mat,
    );
    /// Backward of [`GraphOps::edge_softmax`] through the LeakyReLU: `dpre[e] = leaky'(pre[e]) ·
    /// α[e] · (dα[e] − Σ_{e' in row} α[e'] dα[e'])`.
    #[allow(clippy::too_many_arguments)]
    fn edge_softmax_backward(
        &self,
        s: &Self::Sparse,
        src: &Self::Mat,
        dst: &Self::Mat,
        slope: f64,
        alpha: &Self::Mat,
        dalpha: &Self::Mat,
        dpre: &mut Self::Mat,
    );
    /// GATv2's attention (Brody et al., PyG's `GATv2Conv`): for entry `e = (r, c)` and head `h`
    /// the score `Σ_f att[h, f] · LeakyReLU(xl[c, h·F + f] + xr[r, h·F + f])` with `slope`,
    /// softmax over each row's entries. `xl` has a row per column of `s`, `xr` a row per row,
    /// `att` is `k × F`, `alpha` `nnz × k`.
    fn pair_softmax(
        &self,
        s: &Self::Sparse,
        xl: &Self::Mat,
        xr: &Self::Mat,
        att: &Self::Mat,
        slope: f64,
        alpha: &mut Self::Mat,
    );
    /// Backward of [`GraphOps::pair_softmax`] for upstream `dalpha`: accumulates the gradients
    /// of `xl`, `xr` and `att` into `grads`. Reads the transposed structure's entry order.
    #[allow(clippy::too_many_arguments)]
    fn pair_softmax_backward(
        &self,
        s: &Self::Sparse,
        xl: &Self::Mat,
        xr: &Self::Mat,
        att: &Self::Mat,
        slope: f64,
        alpha: &Self::Mat,
        dalpha: &Self::Mat,
        grads: PairGrads<'_, Self::Mat>,
    );
    /// Inverted dropout on per-entry values (`nnz × k`), the decision for entry `(r, c)`, head
    /// `h` keyed by (key, r, c·k + h): the same wherever the entry is computed.
    fn edge_dropout(&self, s: &Self::Sparse, key: MaskKey, p: f64, vals: &mut Self::Mat);
}

/// The end of a training step: the loss, accuracy counting and optimizer updates.
pub trait TrainOps: Memory {
    /// Softmax cross-entropy over the rows `rows` of `logits` with integer `labels` (indexed by
    /// row): returns `(Σ loss, number of correct argmax predictions)` and writes
    /// `grad[r] = scale · (softmax(logits[r]) - onehot)` for those rows (other rows untouched).
    fn cross_entropy(
        &self,
        logits: &Self::Mat,
        labels: &[i32],
        rows: &[u32],
        scale: f64,
        grad: &mut Self::Mat,
    ) -> (f64, usize) {
        let l = self.cross_entropy_later(logits, labels, rows, scale, grad);
        self.loss_value(l)
    }
    /// [`TrainOps::cross_entropy`] whose sums the caller reads later ([`TrainOps::loss_value`]):
    /// on a GPU the loss kernel writes them into host memory, so the host goes on queueing
    /// work (a training step's backward pass, the next batch) instead of waiting for the
    /// forward pass to finish.
    fn cross_entropy_later(
        &self,
        logits: &Self::Mat,
        labels: &[i32],
        rows: &[u32],
        scale: f64,
        grad: &mut Self::Mat,
    ) -> Self::Loss;
    /// `(Σ loss, correct count)` of a loss queued before (waits for the work that computes it).
    fn loss_value(&self, l: Self::Loss) -> (f64, usize);

    /// Updates `p` in place from gradient `g` and optimizer state `s1`, `s2` (same shape;
    /// Adam's moments, or SGD's momentum buffer in `s1`).
    fn step(&self, rule: StepRule, p: &mut Self::Mat, g: &Self::Mat, s1: &mut Self::Mat, s2: &mut Self::Mat);

    /// Number of `rows` whose argmax of `logits` equals their label.
    fn count_correct(&self, logits: &Self::Mat, labels: &[i32], rows: &[u32]) -> usize;
}
