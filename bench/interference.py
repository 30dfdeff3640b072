#!/usr/bin/env python3
"""Why does compute slow down beside a zero-copy gather? A micro-benchmark in CuPy.

Runs on the GPU machine (CuPy is there). A products-like host table (rows x d f32) sits in
mapped page-locked host memory; one stream gathers random rows from it while another runs a
compute workload, each timed alone and beside the gather:
  - tiny x400: 400 one-block kernels (launch-bound), also as a CUDA graph;
  - mixed x30: GEMMs and memory-bound kernels, about a training step's mix;
  - one long GEMM; hbm gather x10: random row reads in device memory (SpMM-like).
Side workloads: the copy engine's H2D copy (the copy mode's transfer), and the gather by
warps' loads (grinnder's kernel; with fewer warps, cache operators, stream priorities, a table
registered from transparent huge pages with --thp) or by the Tensor Memory Accelerator
(cp.async.bulk per row, or per row's span of 32/64/128-byte-aligned blocks, 1-4 rows in flight
per warp). Every gather kernel is first checked against the table (exact).

  python3 bench/interference.py [--d 100] [--rows 2400000] [--batch-rows 500000] [--json OUT] [--thp]

What it showed (one H200, 2026-11-30; BENCHMARKS.md, "GPU microbenchmarks", and the runs in
docs/benchmarks-log.md, mini-batch zero-copy, the 2026-11-30 entry measuring a961270): the copy
engine at 55 GB/s slows nothing; the warps' gather slows the other stream's kernels in
proportion to the reads it keeps in flight, not the bytes it moves (512 warps: mixed 2.6x; 256
warps, the bus still full: 1.6-2x; 128 warps: 1.15x but 26 GB/s); huge pages and stream
priorities change nothing; the TMA gather slows them less at the same bandwidth (about half the
excess) but not the training step.
"""
import argparse
import ctypes
import json
import mmap
import time

import cupy as cp
import numpy as np

SRC = r"""
typedef unsigned int u32;
typedef unsigned long long u64;
// PyTorch-Direct's aligned gather (a warp per row, reads from the row's 128-byte line start),
// with the load's cache operator as a variant: LOAD(p) is *p (the read-only path, as in
// grinnder) or __ldcg (L2 only)
#define GATHER(NAME, LOAD)                                                                        \
extern "C" __global__ void NAME(const float* __restrict__ x, const u32* idx, long long n, int d,  \
                                float* __restrict__ out) {                                        \
    int lane = threadIdx.x % 32;                                                                  \
    long long warps = (long long)gridDim.x * blockDim.x / 32;                                     \
    for (long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32; w < n; w += warps) { \
        u64 s = (u64)idx[w] * (u64)d;                                                             \
        u64 a = s & ~(u64)31;                                                                     \
        int o4 = (int)(s - a) / 4;                                                                \
        int m = o4 + d / 4;                                                                       \
        const float4* s4 = (const float4*)(x + a);                                                \
        float4* d4 = (float4*)(out + (u64)w * d) - o4;                                            \
        for (int j = lane; j < m; j += 32) {                                                      \
            float4 v = LOAD(s4 + j);                                                              \
            if (j >= o4) d4[j] = v;                                                               \
        }                                                                                         \
    }                                                                                             \
}
#define PLAIN(p) (*(p))
GATHER(gather_aligned, PLAIN)
GATHER(gather_cg, __ldcg)

// The same rows fetched by the Tensor Memory Accelerator: lane 0 of each warp asks for the
// whole row (d*4 bytes, 16-byte aligned) into the warp's shared buffer with cp.async.bulk and
// an mbarrier; the warp then writes it out. Dynamic shared memory: (blockDim/32) * d * 4 bytes.
extern "C" __global__ void gather_tma(const float* __restrict__ x, const u32* idx, long long n,
                                      int d, float* __restrict__ out) {
    extern __shared__ __align__(128) float buf[];
    __shared__ u64 bars[32];
    int lane = threadIdx.x % 32, wib = threadIdx.x / 32;
    float* mine = buf + (u64)wib * d;
    u32 bar = (u32)__cvta_generic_to_shared(&bars[wib]);
    u32 dst = (u32)__cvta_generic_to_shared(mine);
    if (lane == 0) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar));
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncwarp();
    u32 bytes = (u32)d * 4, phase = 0;
    long long warps = (long long)gridDim.x * blockDim.x / 32;
    for (long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32; w < n; w += warps) {
        const float* src = x + (u64)idx[w] * (u64)d;
        if (lane == 0) {
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
        }
        u32 ok = 0;
        while (!ok)
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                         : "=r"(ok) : "r"(bar), "r"(phase) : "memory");
        phase ^= 1;
        float4* d4 = (float4*)(out + (u64)w * d);
        const float4* m4 = (const float4*)mine;
        for (int j = lane; j < d / 4; j += 32) d4[j] = m4[j];
        __syncwarp();
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
}
// gather_tma with line-aligned requests and k (<= 4) rows in flight per warp: lane j < k asks
// for row r0 + j's span from the start of its first 128-byte line to the end of its last one
// (the table's size must be a multiple of 128 bytes); the warp then writes the rows out.
// Dynamic shared memory: (blockDim/32) * k * stride, stride = ((d + 32) * 4) rounded up to 128.
extern "C" __global__ void gather_tma_lines(const float* __restrict__ x, const u32* idx, long long n,
                                            int d, int k, float* __restrict__ out, int al) {
    extern __shared__ __align__(128) unsigned char sm[];
    __shared__ u64 bars[32 * 4];
    int lane = threadIdx.x % 32, wib = threadIdx.x / 32;
    u32 stride = ((d + 32) * 4 + 127) / 128 * 128;
    unsigned char* mine = sm + (u64)wib * k * stride;
    if (lane < k) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"((u32)__cvta_generic_to_shared(&bars[wib * 4 + lane])));
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncwarp();
    u32 phase = 0;
    long long warps = (long long)gridDim.x * blockDim.x / 32;
    for (long long r0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32 * k; r0 < n; r0 += warps * k) {
        int cnt = (int)(n - r0 < k ? n - r0 : k);
        if (lane < cnt) {
            u64 s = (u64)idx[r0 + lane] * (u64)d, a = s & ~(u64)(al - 1);
            u32 bytes = (u32)((((s - a) + d) * 4 + al * 4 - 1) & ~(u64)(al * 4 - 1));
            u32 bar = (u32)__cvta_generic_to_shared(&bars[wib * 4 + lane]);
            u32 dst = (u32)__cvta_generic_to_shared(mine + lane * stride);
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"(dst), "l"(x + a), "r"(bytes), "r"(bar) : "memory");
        }
        for (int j = 0; j < cnt; j++) {
            u32 bar = (u32)__cvta_generic_to_shared(&bars[wib * 4 + j]), ok = 0;
            while (!ok)
                asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                             : "=r"(ok) : "r"(bar), "r"(phase) : "memory");
        }
        phase ^= 1;
        for (int j = 0; j < cnt; j++) {
            int o = (int)(((u64)idx[r0 + j] * (u64)d) & (al - 1));
            const float4* m4 = (const float4*)((const float*)(mine + j * stride) + o);
            float4* d4 = (float4*)(out + (u64)(r0 + j) * d);
            for (int c = lane; c < d / 4; c += 32) d4[c] = m4[c];
        }
        __syncwarp();
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
}
extern "C" __global__ void tiny(float* x) { if (threadIdx.x == 0) x[blockIdx.x] += 1.0f; }
extern "C" __global__ void axpy(const float* x, float* y, long long n, float a) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        y[i] += a * x[i];
}
"""


def host_table(nbytes, huge):
    """Mapped pinned host memory: cudaHostAlloc, or anonymous THP memory registered."""
    if not huge:
        ptr = cp.cuda.runtime.hostAlloc(nbytes, 0x01 | 0x02)  # portable | mapped
        return ptr, None
    align = 2 << 20
    m = mmap.mmap(-1, nbytes + align, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    ptr = (base + align - 1) // align * align
    ctypes.memset(ptr, 0, nbytes)  # fault the pages in (as huge pages where THP allows)
    cp.cuda.runtime.hostRegister(ptr, nbytes, 0x01 | 0x02)  # portable | mapped
    return ptr, m


def anon_huge_kb():
    for line in open("/proc/meminfo"):
        if line.startswith("AnonHugePages"):
            return int(line.split()[1])
    return -1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=2_400_000)
    p.add_argument("--d", type=int, default=100)
    p.add_argument("--batch-rows", type=int, default=500_000)
    p.add_argument("--json")
    p.add_argument("--thp", action="store_true", help="also a table registered from huge pages")
    p.add_argument("--blocks", action="store_true",
                   help="only the aligned gather, its warps in blocks of 32 to 1,024 threads (on fewer or more SMs)")
    a = p.parse_args()
    mod = cp.RawModule(code=SRC)
    tiny, axpy = (mod.get_function(n) for n in ("tiny", "axpy"))
    kernels = {k: mod.get_function("gather_" + k) for k in ("aligned", "cg", "tma", "tma_lines")}
    plain = (cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True))
    least, greatest = 0, -5  # Hopper's range; CUDA clamps priorities outside it
    ranked = (cp.cuda.Stream(non_blocking=True, priority=greatest),
              cp.cuda.Stream(non_blocking=True, priority=least))
    main_s, side_s = plain
    rng = np.random.default_rng(0)
    idx = cp.asarray(rng.choice(a.rows, a.batch_rows, replace=False).astype(np.uint32))
    out = cp.empty((a.batch_rows, a.d), cp.float32)
    nbytes = a.rows * a.d * 4
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]

    # compute workloads on the main stream
    xs = cp.ones(16 << 20, cp.float32)
    ys = cp.zeros(16 << 20, cp.float32)
    ga = cp.ones((100_000, 256), cp.float32)
    gb = cp.ones((256, 256), cp.float32)
    gc = cp.empty((100_000, 256), cp.float32)
    tiny_buf = cp.zeros(64, cp.float32)
    dev_table = cp.ones((4_000_000, 128), cp.float32)
    dev_idx = cp.asarray(rng.integers(0, 4_000_000, 500_000).astype(np.uint32))
    dev_out = cp.empty((500_000, 128), cp.float32)

    def tiny_work():
        for _ in range(400):
            tiny((1,), (32,), (tiny_buf,))

    def mixed_work():  # ~ a training step's mix: GEMMs and memory-bound kernels
        for _ in range(10):
            cp.matmul(ga, gb, out=gc)
            axpy((sms * 4,), (256,), (xs, ys, np.int64(xs.size), np.float32(0.5)))
            axpy((sms * 4,), (256,), (xs, ys, np.int64(xs.size), np.float32(0.5)))

    with main_s:
        big_a = cp.ones((120_000, 1024), cp.float32)
        big_b = cp.ones((1024, 1024), cp.float32)
        big_c = cp.empty((120_000, 1024), cp.float32)

    def long_work():  # one long GEMM (~1.5 ms), few launches
        cp.matmul(big_a, big_b, out=big_c)

    def hbm_gather_work():  # latency-bound random row reads in device memory (SpMM-like)
        for _ in range(10):
            kernels["aligned"]((500_000 * 32 // 256,), (256,),
                               (np.uint64(dev_table.data.ptr), dev_idx, np.int64(500_000), np.int32(128), dev_out))

    works = {"tiny x400": tiny_work, "mixed x30": mixed_work, "one long GEMM": long_work,
             "hbm gather x10": hbm_gather_work}
    graphs = {}
    for name, fn in list(works.items()):
        try:
            with main_s:
                fn()  # warm (cuBLAS handles, workspaces)
            main_s.synchronize()
            main_s.begin_capture()
            with main_s:
                fn()
            graphs[name] = main_s.end_capture()
        except Exception as e:  # capture is an experiment; report and go on
            print(f"capture of {name} failed: {e!r}")
            try:
                main_s.end_capture()
            except Exception:
                pass

    def timed_on(stream, fn, reps):
        """Median ms of fn's work queued on stream."""
        ts = []
        for _ in range(reps):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(stream)
            with stream:
                fn()
            e1.record(stream)
            e1.synchronize()
            ts.append(cp.cuda.get_elapsed_time(e0, e1))
        return float(np.median(ts))

    def timed(fn, reps=5):
        return timed_on(main_s, fn, reps)

    def gather_launch(table, warps, block=256, kernel="aligned"):
        # tma_lines{k}[/align in bytes]
        k = int(kernel.split("/")[0][-1]) if kernel.startswith("tma_lines") else 1
        al = int(kernel.split("/")[1]) // 4 if "/" in kernel else 32
        blocks = (min(warps, a.batch_rows) * 32 + block - 1) // block
        args = (np.uint64(table), idx, np.int64(a.batch_rows), np.int32(a.d), out)
        if kernel == "tma":
            kernels[kernel]((blocks,), (block,), args, shared_mem=block // 32 * a.d * 4)
        elif k > 1 or kernel.startswith("tma_lines"):
            stride = ((a.d + 32) * 4 + 127) // 128 * 128
            kernels["tma_lines"]((blocks,), (block,), args[:4] + (np.int32(k), out, np.int32(al)),
                                 shared_mem=block // 32 * k * stride)
        else:
            kernels[kernel]((blocks,), (block,), args)

    def side_time(start_fn, reps=5):
        return timed_on(side_s, start_fn, reps)

    def beside(side_fn, fn, side_ms, work_ms):
        """fn on the main stream while side_fn runs back to back on the side stream."""
        reps = max(3, int(4 * work_ms / max(side_ms, 1e-3)) + 2)
        ts = []
        for _ in range(3):
            with side_s:
                for _ in range(reps):
                    side_fn()
            time.sleep(0.002)  # let the side stream start
            ts.append(timed(fn, reps=1))
            side_s.synchronize()
        return float(np.median(ts))

    staging = cp.cuda.runtime.hostAlloc(a.batch_rows * a.d * 4, 0x01)
    copy_dst = cp.empty(a.batch_rows * a.d, cp.float32)

    def h2d():
        cp.cuda.runtime.memcpyAsync(copy_dst.data.ptr, staging, a.batch_rows * a.d * 4, 1, side_s.ptr)

    result = {"sms": sms, "rows": a.rows, "d": a.d, "batch_rows": a.batch_rows,
              "batch_mb": a.batch_rows * a.d * 4 / 1e6, "runs": []}
    alone = {n: timed(f) for n, f in works.items()}
    alone_g = {}
    for n, g in graphs.items():
        alone_g[n] = timed(lambda g=g: g.launch(main_s))
    print(f"stream priorities {least}..{greatest}")
    print(f"SMs {sms}; batch {result['batch_mb']:.0f} MB")
    print("alone:", {k: round(v, 3) for k, v in alone.items()}, "graphs:", {k: round(v, 3) for k, v in alone_g.items()})
    result["alone"], result["alone_graph"] = alone, alone_g

    def row(label, side_fn, streams=plain):
        nonlocal main_s, side_s
        main_s, side_s = streams
        side_ms = side_time(side_fn)
        r = {"side": label, "side_ms": side_ms, "side_gbs": result["batch_mb"] / side_ms}
        for n, f in works.items():
            r[n] = beside(side_fn, f, side_ms, alone[n])
        for n, g in graphs.items():
            r[n + " (graph)"] = beside(side_fn, lambda g=g: g.launch(main_s), side_ms, alone_g[n])
        main_s, side_s = plain
        result["runs"].append(r)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}))

    row("copy engine H2D", h2d)
    for huge in (False, True) if a.thp else (False,):
        before = anon_huge_kb()
        table, keep = host_table(nbytes, huge)
        host = np.ctypeslib.as_array((ctypes.c_float * (a.rows * a.d)).from_address(table))
        host[:] = np.arange(a.rows * a.d, dtype=np.int64) % (1 << 24)  # exact in f32
        want = host.reshape(a.rows, a.d)[cp.asnumpy(idx[:2000])]
        for k in ("aligned",) if a.blocks else ("aligned", "tma", "tma_lines1", "tma_lines2", "tma_lines1/64", "tma_lines1/32", "tma_lines2/32"):
            out.fill(-1)
            with side_s:
                gather_launch(table, 4096, 256, k)
            side_s.synchronize()
            ok = bool(np.array_equal(cp.asnumpy(out[:2000]), want))
            print(f"{k} gathers exactly: {ok}")
            result[f"{k} exact"] = ok
        label = "THP-registered" if huge else "cudaHostAlloc"
        print(f"{label}: AnonHugePages {before} -> {anon_huge_kb()} kB")
        result[label + " AnonHugePages_kB"] = anon_huge_kb() - before
        plan = [("aligned", w, 256, False) for w in (512, 256, 192)]
        plan += [(f"tma_lines1/{al}", w, 256, False) for al in (128, 64, 32) for w in (512, 256, 192)]
        plan += [(f"tma_lines2/{al}", w, 256, False) for al in (128, 32) for w in (256, 128)]
        if huge:
            plan = [("aligned", 1 << 30, 256, False), ("aligned", 256, 256, False)]
        if a.blocks:
            plan = [("aligned", w, b, False) for w in (512, 256) for b in (1024, 512, 256, 64)]
        for kernel, warps, block, prio in plan:
            w = "all" if warps > a.batch_rows else warps
            row(f"zc {kernel} {label} warps={w} block={block}{' priorities' if prio else ''}",
                lambda t=table, w=warps, b=block, k=kernel: gather_launch(t, w, b, k), ranked if prio else plain)
        if huge:
            cp.cuda.runtime.hostUnregister(table)
            del keep
        else:
            cp.cuda.runtime.freeHost(table)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
