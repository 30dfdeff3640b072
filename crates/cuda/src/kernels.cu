// grinnder's CUDA kernels, compiled at run time by NVRTC for the device's architecture.
// Conventions follow the Backend trait (crates/tensor/src/backend.rs): row-major matrices,
// `beta` = 0 overwrites, 1 accumulates; CSR structures with 64-bit row pointers and 32-bit
// column indices; the transpose is read through `perm` (the CSR position of each entry).

typedef unsigned long long u64;
typedef unsigned int u32;
typedef long long i64;

#define FULL 0xffffffffu
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
    return v;
}

__device__ __forceinline__ i64 global_warp() {
    return ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
}

__device__ __forceinline__ i64 global_thread() {
    return (i64)blockIdx.x * blockDim.x + threadIdx.x;
}

// ---- dropout masks: bit-identical to crates/tensor/src/dropout.rs ----

__device__ __forceinline__ u64 mix(u64 z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

__device__ __forceinline__ bool keep(u64 seed, u64 epoch, u64 site, u64 row, u64 col, u32 thr) {
    u64 h = mix(mix(mix(mix(mix(seed) ^ epoch) ^ site) ^ row) ^ (col >> 2));
    return ((h >> (16 * (col & 3))) & 0xFFFF) >= thr;
}

extern "C" __global__ void dropout(float* x, i64 rows, int cols, const u32* ids, int has_ids, u64 seed,
                                   u64 epoch, u64 site, u32 thr, float scale) {
    i64 i = global_thread();
    if (i >= rows * cols) return;
    i64 r = i / cols;
    int c = (int)(i % cols);
    u64 node = has_ids ? (u64)ids[r] : (u64)r;
    x[i] = keep(seed, epoch, site, node, (u64)c, thr) ? x[i] * scale : 0.0f;
}

// one warp per row, lanes over its entries
extern "C" __global__ void edge_dropout(const u64* ptr, const u32* idx, i64 rows, const u32* row_ids,
                                        const u32* col_ids, int has_ids, float* vals, int k, u64 seed,
                                        u64 epoch, u64 site, u32 thr, float scale) {
    i64 r = global_warp();
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    u64 rid = has_ids ? (u64)row_ids[r] : (u64)r;
    for (u64 e = ptr[r] + lane; e < ptr[r + 1]; e += 32) {
        u64 c = has_ids ? (u64)col_ids[idx[e]] : (u64)idx[e];
        for (int h = 0; h < k; ++h) {
            float* v = &vals[e * k + h];
            *v = keep(seed, epoch, site, rid, c * k + h, thr) ? *v * scale : 0.0f;
        }
    }
}

// ---- sparse ----

// out[r, :] = beta · out[r, :] + Σ_e vals[e, head(col)] · x[idx[e], :]; one warp per row.
// Factored values (vc 0, no value per entry): entry e of row r weighs out_f[r] · in_f[idx[e]]
// (`factors & 1`: in_f given, `factors & 2`: out_f given; an absent factor is 1), summed as
// values per entry are.
// The row's entries are read 32 at a time, coalesced (index, entry position, value), and
// broadcast lane to lane; columns go in tiles of 256 (8 per lane, in registers). The gathers of
// consecutive entries are independent, so several are in flight per warp.
#define SPMM_PER_LANE 8
extern "C" __global__ void spmm(const u64* ptr, const u32* idx, const u32* perm, int has_perm,
                                const float* vals, int vc, const float* in_f, const float* out_f, int factors,
                                const float* x, int d, float* out, i64 rows,
                                float beta) {
    i64 r = global_warp();
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    u64 s = ptr[r], e = ptr[r + 1];
    int f = vc > 0 ? d / vc : d;
    float scale = (factors & 2) ? out_f[r] : 1.0f;
    for (int c0 = 0; c0 < d; c0 += 32 * SPMM_PER_LANE) {
        float acc[SPMM_PER_LANE];
#pragma unroll
        for (int i = 0; i < SPMM_PER_LANE; ++i) acc[i] = 0.0f;
        for (u64 base = s; base < e; base += 32) {
            u64 k = base + lane;
            u32 my_col = 0;
            u64 my_ent = 0;
            float my_val = 0.0f;
            if (k < e) {
                my_col = idx[k];
                my_ent = has_perm ? perm[k] : k;
                my_val = vc == 1 ? vals[my_ent] : 1.0f;
                if (factors & 1) my_val *= in_f[my_col];
                my_val *= scale;
            }
            int n = (int)(e - base < 32 ? e - base : 32);
#pragma unroll 4
            for (int j = 0; j < n; ++j) {
                u32 col = __shfl_sync(FULL, my_col, j);
                float w = __shfl_sync(FULL, my_val, j);
                u64 ent = __shfl_sync(FULL, my_ent, j);
                const float* xr = x + (u64)col * d;
#pragma unroll
                for (int i = 0; i < SPMM_PER_LANE; ++i) {
                    int c = c0 + i * 32 + lane;
                    if (c < d) acc[i] += (vc <= 1 ? w : vals[ent * vc + c / f]) * xr[c];
                }
            }
        }
#pragma unroll
        for (int i = 0; i < SPMM_PER_LANE; ++i) {
            int c = c0 + i * 32 + lane;
            if (c < d) out[r * d + c] = (beta == 0.0f ? 0.0f : beta * out[r * d + c]) + acc[i];
        }
    }
}

// vals[e] = out_f[r] · in_f[idx[e]] for every entry e of row r (`factors` as for spmm): factored
// values written out for cuSPARSE, in the order of the structure given (the transpose's for a
// transposed product), each the product the spmm kernels form. One warp per row.
extern "C" __global__ void factored_values(const u64* ptr, const u32* idx, i64 rows, const float* in_f,
                                           const float* out_f, int factors, float* vals) {
    i64 r = global_warp();
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    float o = (factors & 2) ? out_f[r] : 1.0f;
    for (u64 e = ptr[r] + lane; e < ptr[r + 1]; e += 32) {
        vals[e] = (factors & 1) ? in_f[idx[e]] * o : o;
    }
}

// The same product for narrow rows (d ≤ 64): a half-warp per row, up to 4 columns per lane,
// so two rows' gathers are in flight per warp and few lanes idle.
extern "C" __global__ void spmm16(const u64* ptr, const u32* idx, const u32* perm, int has_perm,
                                  const float* vals, int vc, const float* in_f, const float* out_f, int factors,
                                  const float* x, int d, float* out, i64 rows, float beta) {
    i64 r = global_thread() >> 4;
    int lane = threadIdx.x & 15;
    unsigned mask = (threadIdx.x & 16) ? 0xffff0000u : 0x0000ffffu;
    if (r >= rows) return;
    u64 s = ptr[r], e = ptr[r + 1];
    int f = vc > 0 ? d / vc : d;
    float scale = (factors & 2) ? out_f[r] : 1.0f;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (u64 base = s; base < e; base += 16) {
        u64 k = base + lane;
        u32 my_col = 0;
        u64 my_ent = 0;
        float my_val = 0.0f;
        if (k < e) {
            my_col = idx[k];
            my_ent = has_perm ? perm[k] : k;
            my_val = vc == 1 ? vals[my_ent] : 1.0f;
            if (factors & 1) my_val *= in_f[my_col];
            my_val *= scale;
        }
        int n = (int)(e - base < 16 ? e - base : 16);
#pragma unroll 4
        for (int j = 0; j < n; ++j) {
            u32 col = __shfl_sync(mask, my_col, j, 16);
            float w = __shfl_sync(mask, my_val, j, 16);
            u64 ent = __shfl_sync(mask, my_ent, j, 16);
            const float* xr = x + (u64)col * d;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                int c = i * 16 + lane;
                if (c < d) acc[i] += (vc <= 1 ? w : vals[ent * vc + c / f]) * xr[c];
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        int c = i * 16 + lane;
        if (c < d) out[r * d + c] = (beta == 0.0f ? 0.0f : beta * out[r * d + c]) + acc[i];
    }
}

// The same product for rows of a multiple of 4 floats: 16-byte loads, two per lane per tile
// of 256 columns (x and out rows are 16-byte aligned: d % 4 == 0, allocations 256-byte aligned).
extern "C" __global__ void spmm_v4(const u64* ptr, const u32* idx, const u32* perm, int has_perm,
                                   const float* vals, int vc, const float* in_f, const float* out_f, int factors,
                                   const float* x, int d, float* out, i64 rows, float beta) {
    i64 r = global_warp();
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    u64 s = ptr[r], e = ptr[r + 1];
    int f = vc > 0 ? d / vc : d;
    float scale = (factors & 2) ? out_f[r] : 1.0f;
    int d4 = d >> 2;
    const float4* x4 = (const float4*)x;
    float4* out4 = (float4*)out;
    for (int q0 = 0; q0 < d4; q0 += 64) {
        float4 acc[2];
        acc[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        acc[1] = acc[0];
        for (u64 base = s; base < e; base += 32) {
            u64 k = base + lane;
            u32 my_col = 0;
            u64 my_ent = 0;
            float my_val = 0.0f;
            if (k < e) {
                my_col = idx[k];
                my_ent = has_perm ? perm[k] : k;
                my_val = vc == 1 ? vals[my_ent] : 1.0f;
                if (factors & 1) my_val *= in_f[my_col];
                my_val *= scale;
            }
            int n = (int)(e - base < 32 ? e - base : 32);
#pragma unroll 4
            for (int j = 0; j < n; ++j) {
                u32 col = __shfl_sync(FULL, my_col, j);
                float w = __shfl_sync(FULL, my_val, j);
                u64 ent = __shfl_sync(FULL, my_ent, j);
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    int q = q0 + i * 32 + lane;
                    if (q < d4) {
                        float ww = vc <= 1 ? w : vals[ent * vc + (q * 4) / f];
                        float4 v = x4[(u64)col * d4 + q];
                        acc[i].x += ww * v.x;
                        acc[i].y += ww * v.y;
                        acc[i].z += ww * v.z;
                        acc[i].w += ww * v.w;
                    }
                }
            }
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            int q = q0 + i * 32 + lane;
            if (q < d4) {
                float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (beta != 0.0f) {
                    o = out4[r * d4 + q];
                    o.x *= beta;
                    o.y *= beta;
                    o.z *= beta;
                    o.w *= beta;
                }
                o.x += acc[i].x;
                o.y += acc[i].y;
                o.z += acc[i].z;
                o.w += acc[i].w;
                out4[r * d4 + q] = o;
            }
        }
    }
}

// out[e, h] = a[r, block h] · b[idx[e], block h]; one warp per row
extern "C" __global__ void sddmm(const u64* ptr, const u32* idx, i64 rows, const float* a, const float* b,
                                 int width, int k, float* out) {
    i64 r = global_warp();
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    int f = width / k;
    for (u64 e = ptr[r]; e < ptr[r + 1]; ++e) {
        u64 c = idx[e];
        for (int h = 0; h < k; ++h) {
            float acc = 0.0f;
            for (int j = lane; j < f; j += 32) acc += a[r * width + h * f + j] * b[c * width + h * f + j];
            acc = warp_sum(acc);
            if (lane == 0) out[e * k + h] = acc;
        }
    }
}

__device__ __forceinline__ float leaky(float x, float slope) { return x > 0.0f ? x : x * slope; }

// one thread per (row, head)
extern "C" __global__ void edge_softmax(const u64* ptr, const u32* idx, i64 rows, const float* src,
                                        const float* dst, int k, float slope, float* alpha) {
    i64 t = global_thread();
    if (t >= rows * k) return;
    i64 r = t / k;
    int h = (int)(t % k);
    float m = NEG_INF;
    for (u64 e = ptr[r]; e < ptr[r + 1]; ++e) {
        float x = leaky(src[(u64)idx[e] * k + h] + dst[r * k + h], slope);
        alpha[e * k + h] = x;
        m = fmaxf(m, x);
    }
    float sum = 0.0f;
    for (u64 e = ptr[r]; e < ptr[r + 1]; ++e) {
        float x = expf(alpha[e * k + h] - m);
        alpha[e * k + h] = x;
        sum += x;
    }
    for (u64 e = ptr[r]; e < ptr[r + 1]; ++e) alpha[e * k + h] /= sum;
}

extern "C" __global__ void edge_softmax_backward(const u64* ptr, const u32* idx, i64 rows, const float* src,
                                                 const float* dst, int k, float slope, const float* alpha,
                                                 const float* dalpha, float* dpre) {
    i64 t = global_thread();
    if (t >= rows * k) return;
    i64 r = t / k;
    int h = (int)(t % k);
    float dot = 0.0f;
    for (u64 e = ptr[r]; e < ptr[r + 1]; ++e) dot += alpha[e * k + h] * dalpha[e * k + h];
    for (u64 e = ptr[r]; e < ptr[r + 1]; ++e) {
        float pre = src[(u64)idx[e] * k + h] + dst[r * k + h];
        float g = alpha[e * k + h] * (dalpha[e * k + h] - dot);
        dpre[e * k + h] = pre > 0.0f ? g : g * slope;
    }
}

// GATv2's attention (crates/tensor/src/cpu/sparse.rs pair_softmax): one thread per (row, head);
// the score of entry e = (r, c) is att[h] · leaky(xl[c, block h] + xr[r, block h])
extern "C" __global__ void pair_softmax(const u64* ptr, const u32* idx, i64 rows, const float* xl,
                                        const float* xr, const float* att, int k, int f, float slope,
                                        float* alpha) {
    i64 t = global_thread();
    if (t >= rows * k) return;
    i64 r = t / k;
    int h = (int)(t % k);
    i64 w = (i64)k * f;
    const float* a = att + h * f;
    const float* xrr = xr + r * w + h * f;
    float m = NEG_INF;
    for (u64 e = ptr[r]; e < ptr[r + 1]; ++e) {
        const float* xlc = xl + (i64)idx[e] * w + h * f;
        float x = 0.0f;
        for (int j = 0; j < f; ++j) x += leaky(xlc[j] + xrr[j], slope) * a[j];
        alpha[e * k + h] = x;
        m = fmaxf(m, x);
    }
    float sum = 0.0f;
    for (u64 e = ptr[r]; e < ptr[r + 1]; ++e) {
        float x = expf(alpha[e * k + h] - m);
        alpha[e * k + h] = x;
        sum += x;
    }
    for (u64 e = ptr[r]; e < ptr[r + 1]; ++e) alpha[e * k + h] /= sum;
}

// the score's gradient ds = α (dα − Σ_row α dα): one thread per (row, head)
extern "C" __global__ void pair_score_grad(const u64* ptr, i64 rows, int k, const float* alpha,
                                           const float* dalpha, float* ds) {
    i64 t = global_thread();
    if (t >= rows * k) return;
    i64 r = t / k;
    int h = (int)(t % k);
    float dot = 0.0f;
    for (u64 e = ptr[r]; e < ptr[r + 1]; ++e) dot += alpha[e * k + h] * dalpha[e * k + h];
    for (u64 e = ptr[r]; e < ptr[r + 1]; ++e) ds[e * k + h] = alpha[e * k + h] * (dalpha[e * k + h] - dot);
}

// dxr[r, j] += Σ_e ds[e, h] · att[j] · leaky'(pre), and the row's share of datt written to
// part[r, j] = Σ_e ds[e, h] · leaky(pre): one thread per (row, feature)
extern "C" __global__ void pair_dxr(const u64* ptr, const u32* idx, i64 rows, const float* xl, const float* xr,
                                    const float* att, const float* ds, int k, int f, float slope, float* dxr,
                                    float* part) {
    i64 w = (i64)k * f;
    i64 t = global_thread();
    if (t >= rows * w) return;
    i64 r = t / w;
    int j = (int)(t % w);
    int h = j / f;
    float xrj = xr[t], aj = att[j], g = 0.0f, p = 0.0f;
    for (u64 e = ptr[r]; e < ptr[r + 1]; ++e) {
        float pre = xl[(i64)idx[e] * w + j] + xrj;
        float d = ds[e * k + h];
        g += pre > 0.0f ? d * aj : d * aj * slope;
        p += d * leaky(pre, slope);
    }
    dxr[t] += g;
    part[t] = p;
}

// dxl[c, j] += Σ over the column's entries of ds[e, h] · att[j] · leaky'(pre), through the
// transposed structure: one thread per (column, feature)
extern "C" __global__ void pair_dxl(const u64* tptr, const u32* tidx, const u32* perm, i64 cols,
                                    const float* xl, const float* xr, const float* att, const float* ds, int k,
                                    int f, float slope, float* dxl) {
    i64 w = (i64)k * f;
    i64 t = global_thread();
    if (t >= cols * w) return;
    i64 c = t / w;
    int j = (int)(t % w);
    int h = j / f;
    float xlj = xl[t], aj = att[j], g = 0.0f;
    for (u64 q = tptr[c]; q < tptr[c + 1]; ++q) {
        float pre = xlj + xr[(i64)tidx[q] * w + j];
        float d = ds[(u64)perm[q] * k + h];
        g += pre > 0.0f ? d * aj : d * aj * slope;
    }
    dxl[t] += g;
}

// out[n, h] = z[n, block h] · att[h, :]
extern "C" __global__ void head_dots(const float* z, const float* att, i64 n, int k, int f, float* out) {
    i64 t = global_thread();
    if (t >= n * k) return;
    i64 r = t / k;
    int h = (int)(t % k);
    float acc = 0.0f;
    for (int j = 0; j < f; ++j) acc += z[r * k * f + h * f + j] * att[h * f + j];
    out[t] = acc;
}

// dz[n, h·f + j] += ds[n, h] · att[h, j]
extern "C" __global__ void head_dots_dz(const float* att, const float* ds, i64 n, int k, int f, float* dz) {
    i64 t = global_thread();
    if (t >= n * k * f) return;
    i64 r = t / (k * f);
    int c = (int)(t % (k * f));
    dz[t] += ds[r * k + c / f] * att[c];
}

// ---- dense ----

// out[i] = x[idx ? idx[i] : start + i] for n rows of width d (out already offset); one warp per
// row reads it from its start, so with d % 32 == 0 each request is 128-byte aligned, and with
// float4 loads where the width allows (PyTorch-Direct's access pattern; x may be mapped host
// memory).
extern "C" __global__ void gather_rows(const float* __restrict__ x, const u32* idx, i64 start, i64 n,
                                       int d, float* __restrict__ out) {
    int lane = threadIdx.x % 32;
    // a warp per row; a grid smaller than n warps strides (a gather that leaves most of the
    // device to kernels of another stream)
    i64 warps = (i64)gridDim.x * blockDim.x / 32;
    for (i64 w = global_thread() / 32; w < n; w += warps) {
        u64 r = idx ? (u64)idx[w] : (u64)(start + w);
        const float* src = x + r * d;
        float* dst = out + (u64)w * d;
        if (d % 4 == 0) {
            // up to four 16-byte loads in flight per lane before any store (bus latency hiding)
            const float4* s4 = (const float4*)src;
            float4* d4 = (float4*)dst;
            int m = d / 4;
            for (int j = lane; j < m; j += 128) {
                float4 a = s4[j], b, c, e;
                if (j + 32 < m) b = s4[j + 32];
                if (j + 64 < m) c = s4[j + 64];
                if (j + 96 < m) e = s4[j + 96];
                d4[j] = a;
                if (j + 32 < m) d4[j + 32] = b;
                if (j + 64 < m) d4[j + 64] = c;
                if (j + 96 < m) d4[j + 96] = e;
            }
        } else {
            for (int j = lane; j < d; j += 32) dst[j] = src[j];
        }
    }
}

// gather_rows for rows whose starts are not 128-byte aligned (d % 4 == 0, d % 32 != 0; x itself
// 128-byte aligned): each warp reads from the start of the 128-byte line that holds its row's
// first element (PyTorch-Direct's aligned access: whole-line requests over the bus, the few
// floats before the row read and dropped) and writes the row's part.
extern "C" __global__ void gather_rows_aligned(const float* __restrict__ x, const u32* idx, i64 start,
                                               i64 n, int d, float* __restrict__ out) {
    int lane = threadIdx.x % 32;
    i64 warps = (i64)gridDim.x * blockDim.x / 32;
    for (i64 w = global_thread() / 32; w < n; w += warps) {
        u64 r = idx ? (u64)idx[w] : (u64)(start + w);
        u64 s = r * (u64)d;
        u64 a = s & ~(u64)31;
        int o4 = (int)(s - a) / 4;  // float4s before the row in its first line (0..7)
        int m = o4 + d / 4;         // float4s read, from the line's start to the row's end
        const float4* s4 = (const float4*)(x + a);
        float4* d4 = (float4*)(out + (u64)w * d) - o4;
        for (int j = lane; j < m; j += 128) {
            float4 v0 = s4[j], v1, v2, v3;
            if (j + 32 < m) v1 = s4[j + 32];
            if (j + 64 < m) v2 = s4[j + 64];
            if (j + 96 < m) v3 = s4[j + 96];
            if (j >= o4) d4[j] = v0;
            if (j + 32 < m) d4[j + 32] = v1;
            if (j + 64 < m) d4[j + 64] = v2;
            if (j + 96 < m) d4[j + 96] = v3;
        }
    }
}

// gather_rows with two rows per warp: both rows' loads are issued before any store (twice the
// requests in flight per warp; for reads over the bus).
extern "C" __global__ void gather_rows2(const float* __restrict__ x, const u32* idx, i64 start, i64 n,
                                        int d, float* __restrict__ out) {
    i64 w = global_thread() / 32;
    int lane = threadIdx.x % 32;
    i64 r0 = 2 * w;
    if (r0 >= n) return;
    bool two = r0 + 1 < n;
    u64 ra = idx ? (u64)idx[r0] : (u64)(start + r0);
    u64 rb = two ? (idx ? (u64)idx[r0 + 1] : (u64)(start + r0 + 1)) : ra;
    float* da = out + (u64)r0 * d;
    float* db = da + d;
    if (d % 4 == 0) {
        const float4* sa = (const float4*)(x + ra * d);
        const float4* sb = (const float4*)(x + rb * d);
        float4* da4 = (float4*)da;
        float4* db4 = (float4*)db;
        int m = d / 4;
        for (int j = lane; j < m; j += 64) {
            bool h = j + 32 < m;
            float4 a0 = sa[j], b0 = sb[j], a1, b1;
            if (h) {
                a1 = sa[j + 32];
                b1 = sb[j + 32];
            }
            da4[j] = a0;
            if (two) db4[j] = b0;
            if (h) {
                da4[j + 32] = a1;
                if (two) db4[j + 32] = b1;
            }
        }
    } else {
        for (int j = lane; j < d; j += 32) {
            float a = x[ra * d + j], b = x[rb * d + j];
            da[j] = a;
            if (two) db[j] = b;
        }
    }
}

// out[idx ? idx[i] : start + i] += src[i] for n rows of width d (src already offset); atomics
// where indices may repeat.
extern "C" __global__ void scatter_add_rows(const float* src, const u32* idx, i64 start, i64 n,
                                            int d, float* out) {
    i64 t = global_thread();
    if (t >= n * d) return;
    i64 i = t / d;
    u64 o = (idx ? (u64)idx[i] : (u64)(start + i)) * d + t % d;
    if (idx) atomicAdd(&out[o], src[t]);
    else out[o] += src[t];
}

// out[idx ? idx[i] : start + i] += src[i] for n distinct rows of width d, where out is host
// memory mapped into the device (a page-locked block): a warp per row, each lane's 16-byte
// reads of out issued before its adds and writes (bus latency hiding); no atomics (the rows are
// distinct, so every element has one writer and the result is the same every run).
extern "C" __global__ void scatter_add_rows_host(const float* src, const u32* idx, i64 start, i64 n,
                                                 int d, float* out) {
    int lane = threadIdx.x % 32;
    i64 warps = (i64)gridDim.x * blockDim.x / 32;
    for (i64 w = global_thread() / 32; w < n; w += warps) {
        u64 r = idx ? (u64)idx[w] : (u64)(start + w);
        float* o = out + r * d;
        const float* s = src + (u64)w * d;
        if (d % 4 == 0) {
            float4* o4 = (float4*)o;
            const float4* s4 = (const float4*)s;
            int m = d / 4;
            for (int j = lane; j < m; j += 64) {
                bool h = j + 32 < m;
                float4 a = o4[j], b;
                if (h) b = o4[j + 32];
                float4 x = s4[j];
                a.x += x.x; a.y += x.y; a.z += x.z; a.w += x.w;
                o4[j] = a;
                if (h) {
                    float4 y = s4[j + 32];
                    b.x += y.x; b.y += y.y; b.z += y.z; b.w += y.w;
                    o4[j + 32] = b;
                }
            }
        } else {
            for (int j = lane; j < d; j += 32) o[j] += s[j];
        }
    }
}

// out[k] = v[perm[k]]: values into the transposed structure's order
extern "C" __global__ void permute(const float* v, const u32* perm, i64 n, float* out) {
    i64 t = global_thread();
    if (t < n) out[t] = v[perm[t]];
}

// out[i] = i: the entry numbers a structure's conversion to its transpose carries along
extern "C" __global__ void iota_u32(u32* out, i64 n) {
    i64 t = global_thread();
    if (t < n) out[t] = (u32)t;
}

// ---- bf16 across the bus: bit-identical to crates/tensor/src/scalar.rs (to_bf16, from_bf16) ----

// bf16 of x, round to nearest, ties to even (a NaN stays a quiet NaN)
__device__ __forceinline__ u32 bf16_of(float x) {
    u32 b = __float_as_uint(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (b >> 16) | 0x40u;
    return (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
}

// the f32 a bf16 holds (exact)
__device__ __forceinline__ float f32_of(u32 h) {
    return __uint_as_float(h << 16);
}

// out[i] = bf16 of x[i]
extern "C" __global__ void to_bf16(const float* x, i64 n, unsigned short* out) {
    i64 t = global_thread();
    if (t < n) out[t] = (unsigned short)bf16_of(x[t]);
}

// out[i] = the f32 bf16 h[i] holds
extern "C" __global__ void from_bf16(const unsigned short* h, i64 n, float* out) {
    i64 t = global_thread();
    if (t < n) out[t] = f32_of(h[t]);
}

// the 8 bf16 of a 16-byte piece widened into two float4s at o (exact)
__device__ __forceinline__ void widen_piece(uint4 a, float4* o) {
    o[0] = make_float4(f32_of(a.x & 0xffffu), f32_of(a.x >> 16), f32_of(a.y & 0xffffu), f32_of(a.y >> 16));
    o[1] = make_float4(f32_of(a.z & 0xffffu), f32_of(a.z >> 16), f32_of(a.w & 0xffffu), f32_of(a.w >> 16));
}

// gather_rows from a bf16 table in host memory mapped into the device (a page-locked bf16
// block): a warp per row; where rows are whole 16-byte pieces (d % 8 == 0) each lane reads 8
// elements at once, two pieces in flight before the stores; widened to f32 (exact).
extern "C" __global__ void gather_rows_host_bf16(const unsigned short* __restrict__ x, const u32* idx,
                                                 i64 start, i64 n, int d, float* __restrict__ out) {
    int lane = threadIdx.x % 32;
    i64 warps = (i64)gridDim.x * blockDim.x / 32;
    for (i64 w = global_thread() / 32; w < n; w += warps) {
        u64 r = idx ? (u64)idx[w] : (u64)(start + w);
        const unsigned short* s = x + r * (u64)d;
        float* o = out + (u64)w * d;
        if (d % 8 == 0) {
            const uint4* s8 = (const uint4*)s;
            float4* o4 = (float4*)o;
            int m = d / 8;
            for (int j = lane; j < m; j += 64) {
                bool h = j + 32 < m;
                uint4 a = s8[j], b;
                if (h) b = s8[j + 32];
                widen_piece(a, o4 + 2 * j);
                if (h) widen_piece(b, o4 + 2 * (j + 32));
            }
        } else {
            for (int j = lane; j < d; j += 32) o[j] = f32_of(s[j]);
        }
    }
}

// the f32 sums of 8 bf16 (a piece of a host row) and 8 floats, rounded back to bf16 pairs (the
// host's add: to_bf16(from_bf16(h) + x), one rounding of an f32 sum)
__device__ __forceinline__ u32 add_pair(u32 h, float lo, float hi) {
    return bf16_of(__fadd_rn(f32_of(h & 0xffffu), lo)) | (bf16_of(__fadd_rn(f32_of(h >> 16), hi)) << 16);
}

__device__ __forceinline__ uint4 add_piece(uint4 h, float4 a, float4 b) {
    return make_uint4(add_pair(h.x, a.x, a.y), add_pair(h.y, a.z, a.w), add_pair(h.z, b.x, b.y),
                      add_pair(h.w, b.z, b.w));
}

// scatter_add_rows_host into a bf16 table: out[r] = bf16(out[r] + src[i]) for n distinct rows,
// a warp per row, each lane's 16-byte reads of out issued before its adds and writes.
extern "C" __global__ void scatter_add_rows_host_bf16(const float* src, const u32* idx, i64 start, i64 n,
                                                      int d, unsigned short* out) {
    int lane = threadIdx.x % 32;
    i64 warps = (i64)gridDim.x * blockDim.x / 32;
    for (i64 w = global_thread() / 32; w < n; w += warps) {
        u64 r = idx ? (u64)idx[w] : (u64)(start + w);
        unsigned short* o = out + r * (u64)d;
        const float* s = src + (u64)w * d;
        if (d % 8 == 0) {
            uint4* o8 = (uint4*)o;
            const float4* s4 = (const float4*)s;
            int m = d / 8;
            for (int j = lane; j < m; j += 64) {
                bool h = j + 32 < m;
                uint4 a = o8[j], b;
                if (h) b = o8[j + 32];
                o8[j] = add_piece(a, s4[2 * j], s4[2 * j + 1]);
                if (h) o8[j + 32] = add_piece(b, s4[2 * (j + 32)], s4[2 * (j + 32) + 1]);
            }
        } else {
            for (int j = lane; j < d; j += 32) o[j] = (unsigned short)bf16_of(__fadd_rn(f32_of(o[j]), s[j]));
        }
    }
}

// 32-bit offsets (cuSPARSE's) widened to the 64-bit ones grinnder's kernels read
extern "C" __global__ void widen_offsets(const int* in, i64 n, u64* out) {
    i64 t = global_thread();
    if (t < n) out[t] = (u64)(u32)in[t];
}

// op 0: relu, 1: scale
extern "C" __global__ void unary(float* x, i64 n, int op, float s) {
    i64 t = global_thread();
    if (t >= n) return;
    x[t] = op == 0 ? fmaxf(x[t], 0.0f) : x[t] * s;
}

// op 0: b += a, 1: b = b · [a > 0], 2: b = a · b
extern "C" __global__ void binary(const float* a, float* b, i64 n, int op) {
    i64 t = global_thread();
    if (t >= n) return;
    if (op == 0) b[t] += a[t];
    else if (op == 2) b[t] *= a[t];
    else if (a[t] <= 0.0f) b[t] = 0.0f;
}

extern "C" __global__ void add_row(const float* row, float* x, i64 n, int d) {
    i64 t = global_thread();
    if (t >= n * d) return;
    x[t] += row[t % d];
}

// Column reductions in two deterministic passes: partial sums over row slices (grid.y), then
// a fixed-order sum of the partials. The summed term depends on `mode`:
//   0: a[n, j]
//   1: a[n, j] · b[n, j / f]                      (head_dots' attention gradient)
//   2: a[n, j] · (b[n, j] − s[n, 0]) · s[n, 1]    (LayerNorm's gamma gradient: dy · x̂)
extern "C" __global__ void col_partial(const float* a, const float* b, const float* s, i64 n, int w, int f,
                                       int mode, i64 rows_per, float* partial) {
    int j = blockIdx.x * 32 + threadIdx.x;
    i64 r0 = (i64)blockIdx.y * rows_per;
    i64 r1 = r0 + rows_per < n ? r0 + rows_per : n;
    __shared__ float acc[8][33];
    float v = 0.0f;
    if (j < w) {
        for (i64 r = r0 + threadIdx.y; r < r1; r += 8) {
            float x = a[r * w + j];
            if (mode == 1) x *= b[r * (w / f) + j / f];
            else if (mode == 2) x *= (b[r * w + j] - s[2 * r]) * s[2 * r + 1];
            v += x;
        }
    }
    acc[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.y == 0 && j < w) {
        float t = 0.0f;
        for (int y = 0; y < 8; ++y) t += acc[y][threadIdx.x];
        partial[(i64)blockIdx.y * w + j] = t;
    }
}

extern "C" __global__ void col_finish(const float* partial, int parts, int w, float beta, float* out) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= w) return;
    float t = 0.0f;
    for (int p = 0; p < parts; ++p) t += partial[(i64)p * w + j];
    out[j] = t + beta * out[j];
}

// out[j] = Σ_p partial[p, j] + beta · out[j] over a long vector (split-K GEMM's reduction)
extern "C" __global__ void sum_parts(const float* partial, int parts, i64 w, float beta, float* out) {
    i64 j = global_thread();
    if (j >= w) return;
    float t = 0.0f;
    for (int p = 0; p < parts; ++p) t += partial[(i64)p * w + j];
    out[j] = t + beta * out[j];
}

// one warp per row; stats[r] = (mean, 1/σ)
extern "C" __global__ void layer_norm(const float* x, const float* gamma, const float* beta, i64 n, int d,
                                      float eps, float* y, float* stats) {
    i64 r = global_warp();
    int lane = threadIdx.x & 31;
    if (r >= n) return;
    const float* xr = x + r * d;
    float s = 0.0f;
    for (int j = lane; j < d; j += 32) s += xr[j];
    float mean = warp_sum(s) / d;
    float v = 0.0f;
    for (int j = lane; j < d; j += 32) v += (xr[j] - mean) * (xr[j] - mean);
    float rstd = rsqrtf(warp_sum(v) / d + eps);
    for (int j = lane; j < d; j += 32) y[r * d + j] = (xr[j] - mean) * rstd * gamma[j] + beta[j];
    if (lane == 0) {
        stats[2 * r] = mean;
        stats[2 * r + 1] = rstd;
    }
}

extern "C" __global__ void layer_norm_dx(const float* x, const float* gamma, const float* stats,
                                         const float* dy, i64 n, int d, float* dx) {
    i64 r = global_warp();
    int lane = threadIdx.x & 31;
    if (r >= n) return;
    float mean = stats[2 * r], rstd = stats[2 * r + 1];
    float sg = 0.0f, sgx = 0.0f;
    for (int j = lane; j < d; j += 32) {
        float g = dy[r * d + j] * gamma[j];
        sg += g;
        sgx += g * (x[r * d + j] - mean) * rstd;
    }
    sg = warp_sum(sg);
    sgx = warp_sum(sgx);
    for (int j = lane; j < d; j += 32) {
        float xhat = (x[r * d + j] - mean) * rstd;
        dx[r * d + j] = rstd * (dy[r * d + j] * gamma[j] - sg / d - xhat * sgx / d);
    }
}

// one thread per listed row: loss, correctness, and the gradient row
// one row's softmax cross-entropy: its loss and whether the arg-max is the label at slot t,
// the scaled gradient into row r of grad
__device__ void cross_entropy_row(const float* z, u64 r, int y, int c, float scale, float* grad, float* loss,
                                  int* ok, i64 t) {
    const float* zr = z + r * c;
    float mx = NEG_INF;
    int arg = 0;
    for (int j = 0; j < c; ++j) {
        if (zr[j] > zr[arg]) arg = j;
        mx = fmaxf(mx, zr[j]);
    }
    float sum = 0.0f;
    for (int j = 0; j < c; ++j) sum += expf(zr[j] - mx);
    float lse = mx + logf(sum);
    loss[t] = lse - zr[y];
    ok[t] = arg == y;
    for (int j = 0; j < c; ++j) {
        float p = expf(zr[j] - lse);
        grad[r * c + j] = scale * (j == y ? p - 1.0f : p);
    }
}

extern "C" __global__ void cross_entropy(const float* z, const int* labels, const u32* rows, i64 m, int c,
                                         float scale, float* grad, float* loss, int* ok) {
    i64 t = global_thread();
    if (t >= m) return;
    u64 r = rows[t];
    cross_entropy_row(z, r, labels[r], c, scale, grad, loss, ok, t);
}

// rows 0..m with the labels of nodes ids[t], read from a table (mapped host memory: zero-copy)
extern "C" __global__ void cross_entropy_ids(const float* z, const int* table, const u32* ids, i64 m, int c,
                                             float scale, float* grad, float* loss, int* ok) {
    i64 t = global_thread();
    if (t >= m) return;
    cross_entropy_row(z, (u64)t, table[ids[t]], c, scale, grad, loss, ok, t);
}

extern "C" __global__ void count_correct(const float* z, const int* labels, const u32* rows, i64 m, int c,
                                         int* ok) {
    i64 t = global_thread();
    if (t >= m) return;
    u64 r = rows[t];
    const float* zr = z + r * c;
    int arg = 0;
    for (int j = 1; j < c; ++j)
        if (zr[j] > zr[arg]) arg = j;
    ok[t] = arg == labels[r];
}

// Adam / AdamW (PyTorch's definitions)
extern "C" __global__ void adam(float* p, const float* g, float* m, float* v, i64 n, float lr, float beta1,
                                float beta2, float eps, float wd, int decoupled, float bc1, float bc2) {
    i64 t = global_thread();
    if (t >= n) return;
    float pv = p[t], gv = g[t];
    if (decoupled) pv *= 1.0f - lr * wd;
    else gv += wd * pv;
    float mv = beta1 * m[t] + (1.0f - beta1) * gv;
    float vv = beta2 * v[t] + (1.0f - beta2) * gv * gv;
    m[t] = mv;
    v[t] = vv;
    p[t] = pv - (lr / bc1) * mv / (sqrtf(vv / bc2) + eps);
}

extern "C" __global__ void sgd(float* p, const float* g, float* buf, i64 n, float lr, float momentum, float wd,
                               int first) {
    i64 t = global_thread();
    if (t >= n) return;
    float gv = g[t] + wd * p[t];
    float b = (first || momentum == 0.0f) ? gv : momentum * buf[t] + gv;
    buf[t] = b;
    p[t] -= lr * b;
}
