/*  kernels/cuda/block.cu — one token's decode block from o's projection to the next layer's
    q,k,v in one persistent kernel (the CUDA backend's decode_block). CPU reference: the ops it
    stands for, in order (kernels/cpu: ls_matmul_forward on the 16-bit inputs, the RMSNorm
    with its residual add, SiLU·mul), which the CPU backend runs one by one.

    Why: at one token a decode layer is a chain of small kernels between four GEMVs, and every
    link costs a grid's drain and the next one's launch and ramp while HBM idles (an H200's
    batch-1 layer 123 µs against ~103 of weights). Here one cooperative launch, a CTA of 32
    warps an SM, runs the block as phases with a grid barrier between them: every CTA builds
    a phase's input in shared memory from the whole row (attention's output; the RMSNorm of
    x + y, 16 KB of L2 reads at Llama-3-8B's width; SiLU·mul's output), takes an equal share of
    the projection's rows cut into units of 2 KB (one 16-byte load a lane, four a unit) dealt
    over its warps — every warp busy to its CTA's end, two units a warp in flight — and loads
    the next projection's first unit into registers between arriving at the barrier and
    waiting there (arriving first: the arrival's release would wait for those loads). gate_up
    takes its rows in pairs (gate i with up i), so SiLU·mul runs in its epilogue. The kernel
    is launched programmatically: its CTAs load o's first units on the SMs attention leaves
    free, then wait for it. Why each piece is as it is: kernels/cuda/dev/dev_layer.cu and the
    README there ("A decode layer in one persistent kernel"). Measured on an H200: the layer
    (with the production RoPE and attention kernels before this one) 123.1 / 136.4 µs at 4K /
    16K cached positions against the chain of kernels' 130.0 / 141.5 (dev_layer), and the
    batch-1 decode step (bench_base_cuda --decode-batch 1, against --no-block) 3.99 against
    4.26 ms at 128 cached tokens, 4.21-4.22 against 4.48-4.49 at 4K, 4.62 against 4.82-4.88 at
    16K (docs/benchmarks.md, "The base path"). What its chain still loses against the dev
    bench's own form of it (120.1-120.4 µs at 4K) was not found: the parts swapped in one at a
    time there (this file's GEMV, RMSNorm, barrier, shared memory) each cost nothing; the
    widths here are the launch's, there constants.

    Phases (x the residual in and out, x1 and act scratch):
      o        y = W_o a (+ b_o)                                    barrier 1
      norm     x1 = x + y (CTA 0 writes it); h = rmsnorm(x1) · g2
      gate_up  act_i = silu(W_g h + b_g)_i · (W_u h + b_u)_i (bf16)   barrier 2
      down     y = W_d act (+ b_d); without a next layer x = x1 (the final RMSNorm adds y)
    and with a next layer:                                          barrier 3
      norm     x = x1 + y (CTA 0); h = rmsnorm(x) · g1'
      q,k,v    qkv = W_qkv' h (+ b_qkv')
    The roundings are the ops': the RMSNorm as k_rmsnorm_reg (a double sum of squares, h
    rounded to bf16), act rounded to bf16, y and qkv fp32 sums (in another order than the
    GEMV's: units of 1,024 elements, each a warp's lanes' sums, then a row's units in order —
    the same bits on every run).

    The barrier: one 64-bit counter that only grows, a release reduction a CTA an arrival
    (s_wait says how a launch finds its own barriers' counts); no reset, so graph replays
    need nothing between launches.
*/
#include <assert.h>

#include "common.cuh"
#include "ops_cuda.h"

typedef __nv_bfloat16 bf16;

enum { BK_THREADS = 1024, BK_WARPS = BK_THREADS / 32, BK_U = 4, BK_UNIT = 32 * BK_U * 8 };

// A CTA's share of a projection's rows, out rows or (glu) out / 2 pairs, cut into units of
// BK_UNIT elements of a row (S a row, the last one short where in is not a multiple)
struct s_share_t {
    int S, r0, r1, units, n16;
    bool glu;
    __device__ s_share_t(int in, int out, bool pairs) : glu(pairs) {
        int n = pairs ? out / 2 : out;
        n16 = in / 8;
        S = (in + BK_UNIT - 1) / BK_UNIT;
        r0 = (int)((long)blockIdx.x * n / gridDim.x);
        r1 = (int)((long)(blockIdx.x + 1) * n / gridDim.x);
        units = (r1 - r0) * S * (pairs ? 2 : 1);
    }
    // the row of the share's r-th row (glu: the first rows, then their pairs')
    __device__ int row(int out, int r) const {
        int n = r1 - r0;
        return glu && r >= n ? out / 2 + r0 + r - n : r0 + r;
    }
};

// A warp's walk over units j = warp, warp + BK_WARPS, ...: unit j is segment sg of the share's
// r-th row (j = r · S + sg), stepped without a division a unit
struct s_walk_t {
    int r, sg, dr, dsg, S;
    __device__ s_walk_t(int j, int S_) : r(j / S_), sg(j % S_), dr(BK_WARPS / S_), dsg(BK_WARPS % S_), S(S_) {}
    __device__ void step() {
        r += dr, sg += dsg;
        if (sg >= S)
            sg -= S, r++;
    }
};

// the loads of lane in segment sg of row `row` (FULL: every row a whole number of units; else
// zeros past the row)
template <bool FULL>
__device__ __forceinline__ void s_load(const bf16 *w, int in, int n16, int row, int sg, int lane,
                                       uint4 (&v)[BK_U]) {
    const uint4 *p = reinterpret_cast<const uint4 *>(w + (size_t)row * in);
    int c = sg * 32 * BK_U + lane;
#pragma unroll
    for (int u = 0; u < BK_U; u++)
        v[u] = FULL || c + 32 * u < n16 ? ls_ld_stream(p + c + 32 * u) : make_uint4(0, 0, 0, 0);
}

// the first unit of the CTA's share of the next projection, for s_gemv to start from
__device__ __forceinline__ void s_pre(const bf16 *w, int in, int out, bool glu, int warp, int lane,
                                      uint4 (&cur)[BK_U]) {
    s_share_t f(in, out, glu);
    if (warp < f.units) {
        s_walk_t k(warp, f.S);
        if (in % BK_UNIT == 0)
            s_load<true>(w, in, f.n16, f.row(out, k.r), k.sg, lane, cur);
        else
            s_load<false>(w, in, f.n16, f.row(out, k.r), k.sg, lane, cur);
    }
}

// 8 bf16 weights times 8 bf16 inputs added into acc
__device__ __forceinline__ float s_dot8(uint4 w, uint4 x, float acc) {
    const unsigned ww[4] = {w.x, w.y, w.z, w.w}, xx[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        acc = fmaf(__uint_as_float(ww[k] << 16), __uint_as_float(xx[k] << 16), acc);
        acc = fmaf(__uint_as_float(ww[k] & 0xffff0000u), __uint_as_float(xx[k] & 0xffff0000u), acc);
    }
    return acc;
}

// The CTA's share of y = w · xs (+ bias), or (glu) act_i = silu(g_i) · u_i with g, u rows i and
// out / 2 + i; cur: the first unit's loads, made here unless have. xs: the input in shared
// memory (in bf16); part: a float a unit. FULL: in a multiple of BK_UNIT (no unit runs past
// its row: no bounds in the loop)
template <bool FULL>
__device__ void s_gemv_t(const bf16 *w, int in, int out, bool glu, const void *bias,
                         ls_cu_dtype_t bias_dt, const bf16 *xs, float *y, bf16 *act, float *part,
                         int warp, int lane, uint4 (&cur)[BK_U], bool have) {
    s_share_t f(in, out, glu);
    const uint4 *xv = reinterpret_cast<const uint4 *>(xs);
    s_walk_t k(warp, f.S), kn = k;
    kn.step();
    if (warp < f.units && !have)
        s_load<FULL>(w, in, f.n16, f.row(out, k.r), k.sg, lane, cur);
    for (int j = warp; j < f.units; j += BK_WARPS) {
        uint4 nx[BK_U];
        if (j + BK_WARPS < f.units)
            s_load<FULL>(w, in, f.n16, f.row(out, kn.r), kn.sg, lane, nx);
        int c = k.sg * 32 * BK_U + lane;
        float acc = 0.0f;
#pragma unroll
        for (int u = 0; u < BK_U; u++)
            if (FULL || c + 32 * u < f.n16)
                acc = s_dot8(cur[u], xv[c + 32 * u], acc);
        acc = ls_warp_sum(acc);
        if (lane == 0)
            part[j] = acc;
#pragma unroll
        for (int u = 0; u < BK_U; u++)
            cur[u] = nx[u];
        k = kn;
        kn.step();
    }
    __syncthreads();
    int n = f.r1 - f.r0;
    for (int r = threadIdx.x; r < n; r += BK_THREADS) {
        int o = f.r0 + r;
        float v = 0.0f;
        for (int s = 0; s < f.S; s++)
            v += part[r * f.S + s];
        if (!glu) {
            y[o] = bias ? __fadd_rn(v, ls_bias_at(bias, bias_dt, o)) : v;
            continue;
        }
        float u = 0.0f;
        for (int s = 0; s < f.S; s++)
            u += part[(n + r) * f.S + s];
        if (bias) {
            v = __fadd_rn(v, ls_bias_at(bias, bias_dt, o));
            u = __fadd_rn(u, ls_bias_at(bias, bias_dt, out / 2 + o));
        }
        act[o] = __float2bfloat16_rn(ls_silu_mul(v, u));
    }
}

__device__ __forceinline__ void s_gemv(const bf16 *w, int in, int out, bool glu, const void *bias,
                                       ls_cu_dtype_t bias_dt, const bf16 *xs, float *y, bf16 *act,
                                       float *part, int warp, int lane, uint4 (&cur)[BK_U],
                                       bool have) {
    if (in % BK_UNIT == 0)
        s_gemv_t<true>(w, in, out, glu, bias, bias_dt, xs, y, act, part, warp, lane, cur, have);
    else
        s_gemv_t<false>(w, in, out, glu, bias, bias_dt, xs, y, act, part, warp, lane, cur, have);
}

// xs = bf16(rmsnorm(x + y) · g) over H values as k_rmsnorm_reg rounds them; CTA 0 writes
// x + y to x_out. x and y through L2 (written by other SMs in this launch), loaded once: up
// to 4 · BK_THREADS values (Llama-3-8B's 4,096) one float4 a thread in registers, g's four
// values loaded beside them; wider rows wait in xn (H floats of shared memory) for the sum of
// squares (a version of the kernel with that path alone was ~1 µs slower a norm: dev_layer)
__device__ void s_norm(const float *x, const float *y, const bf16 *g, float *x_out, bf16 *xs,
                       float *xn, int H, float eps, double *scratch) {
    auto sum = [&](int i) {
        float4 a = __ldcg(reinterpret_cast<const float4 *>(x + i));
        float4 b = __ldcg(reinterpret_cast<const float4 *>(y + i));
        return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z),
                           __fadd_rn(a.w, b.w));
    };
    auto sq = [](float4 v) {
        return (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
    };
    auto put = [&](int i, float4 v, uint2 gw, float inv) {
        float o[4] = {v.x, v.y, v.z, v.w};
        unsigned gg[2] = {gw.x, gw.y}, p[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            float lo = __fmul_rn(__fmul_rn(o[2 * k], inv), __uint_as_float(gg[k] << 16));
            float hi = __fmul_rn(__fmul_rn(o[2 * k + 1], inv), __uint_as_float(gg[k] & 0xffff0000u));
            __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
            p[k] = *reinterpret_cast<unsigned *>(&h);
        }
        *reinterpret_cast<uint2 *>(xs + i) = make_uint2(p[0], p[1]);
    };
    double ss = 0.0;
    if (H <= 4 * BK_THREADS) {
        int i = 4 * threadIdx.x;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        uint2 gw = make_uint2(0, 0);
        if (i < H) {
            gw = __ldg(reinterpret_cast<const uint2 *>(g + i));
            v = sum(i);
            if (blockIdx.x == 0)
                *reinterpret_cast<float4 *>(x_out + i) = v;
            ss = sq(v);
        }
        ss = ls_block_sum(ss, scratch);
        float inv = __fdiv_rn(1.0f, sqrtf(__fadd_rn((float)(ss / H), eps)));
        if (i < H)
            put(i, v, gw, inv);
    } else {
        for (int i = 4 * threadIdx.x; i < H; i += 4 * BK_THREADS) {
            float4 v = sum(i);
            *reinterpret_cast<float4 *>(xn + i) = v;
            if (blockIdx.x == 0)
                *reinterpret_cast<float4 *>(x_out + i) = v;
            ss += sq(v);
        }
        ss = ls_block_sum(ss, scratch); // its barriers order xn's stores before the reads below
        float inv = __fdiv_rn(1.0f, sqrtf(__fadd_rn((float)(ss / H), eps)));
        for (int i = 4 * threadIdx.x; i < H; i += 4 * BK_THREADS)
            put(i, *reinterpret_cast<const float4 *>(xn + i),
                __ldg(reinterpret_cast<const uint2 *>(g + i)), inv);
    }
    __syncthreads();
}

// xs = n bf16 values from src (n % 8 == 0)
__device__ void s_copy_in(bf16 *xs, const bf16 *src, int n) {
    for (int i = threadIdx.x; i < n / 8; i += BK_THREADS)
        reinterpret_cast<uint4 *>(xs)[i] = __ldcg(reinterpret_cast<const uint4 *>(src) + i);
    __syncthreads();
}

__device__ __forceinline__ unsigned long long s_ld_acquire(const unsigned long long *p) {
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// The grid barrier's halves: arrive (every thread's writes before it released), then the next
// projection's first loads, then wait for barrier n of this launch. The counter only grows:
// every launch arrives BK_BARRIERS times a CTA, so when a CTA first reads it (after the launch
// before has ended) it holds that launch's end, k · BK_BARRIERS · grid, plus fewer arrivals
// of this launch than one barrier's worth of every CTA's: base rounds them off.
enum { BK_BARRIERS = 3 };
__device__ __forceinline__ void s_arrive(unsigned long long *sync) {
    __syncthreads();
    if (threadIdx.x == 0)
        asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(sync) : "memory");
}
__device__ __forceinline__ void s_wait(const unsigned long long *sync, unsigned long long base,
                                       int n) {
    if (threadIdx.x == 0)
        while (s_ld_acquire(sync) < base + (unsigned long long)n * gridDim.x)
            ;
    __syncthreads();
}

// xs_bytes: the input's room in shared memory; xn after it where H needs it, then part (s_smem)
__global__ void __launch_bounds__(BK_THREADS, 1) k_decode_block(ls_cu_block_t b, int xs_bytes) {
    extern __shared__ __align__(16) unsigned char s_mem[];
    __shared__ double scratch[32];
    bf16 *xs = reinterpret_cast<bf16 *>(s_mem);
    float *xn = reinterpret_cast<float *>(s_mem + xs_bytes);
    float *part = xn + (b.H > 4 * BK_THREADS ? b.H : 0);
    const bf16 *a = (const bf16 *)b.a;
    bf16 *act = (bf16 *)b.act;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint4 cur[BK_U] = {};
    bool next = b.w_qkv != NULL;
    s_pre((const bf16 *)b.w_o, b.q_dim, b.H, false, warp, lane, cur); // weights: before the wait
    ls_dep_wait();
    __shared__ unsigned long long base;
    if (threadIdx.x == 0) {
        unsigned long long per = (unsigned long long)BK_BARRIERS * gridDim.x;
        base = s_ld_acquire(b.sync) / per * per;
    }
    s_copy_in(xs, a, b.q_dim);
    s_gemv((const bf16 *)b.w_o, b.q_dim, b.H, false, b.b_o, b.b_dt, xs, b.y, act, part, warp, lane,
           cur, true);
    s_arrive(b.sync);
    s_pre((const bf16 *)b.w_gu, b.H, 2 * b.inter, true, warp, lane, cur);
    s_wait(b.sync, base, 1);
    s_norm(b.x, b.y, (const bf16 *)b.g2, b.x1, xs, xn, b.H, b.eps, scratch);
    s_gemv((const bf16 *)b.w_gu, b.H, 2 * b.inter, true, b.b_gu, b.b_dt, xs, NULL, act, part, warp,
           lane, cur, true);
    s_arrive(b.sync);
    s_pre((const bf16 *)b.w_d, b.inter, b.H, false, warp, lane, cur);
    s_wait(b.sync, base, 2);
    if (!next && blockIdx.x == 0) // no CTA reads x past barrier 1's norm
        for (int i = threadIdx.x; i < b.H; i += BK_THREADS)
            b.x[i] = __ldcg(b.x1 + i);
    s_copy_in(xs, act, b.inter);
    s_gemv((const bf16 *)b.w_d, b.inter, b.H, false, b.b_d, b.b_dt, xs, b.y, act, part, warp, lane,
           cur, true);
    s_arrive(b.sync);
    if (next) {
        s_pre((const bf16 *)b.w_qkv, b.H, b.qkv_dim, false, warp, lane, cur);
        s_wait(b.sync, base, 3);
        s_norm(b.x1, b.y, (const bf16 *)b.g1, b.x, xs, xn, b.H, b.eps, scratch);
        s_gemv((const bf16 *)b.w_qkv, b.H, b.qkv_dim, false, b.b_qkv, b.b_dt, xs, b.qkv, act, part,
               warp, lane, cur, true);
    }
}

// shared memory: xs, the widest input; xn, the RMSNorm's H floats where rows are wider than its
// registers take; part, a float a unit of the largest share
static void s_smem(const ls_cu_block_t *b, int G, int *xs_bytes, size_t *total) {
    auto units = [&](int in, int rows, int per) {
        long r = (rows + G - 1) / G;
        return r * per * ((in + BK_UNIT - 1) / BK_UNIT);
    };
    int widest = b->q_dim > b->H ? b->q_dim : b->H;
    widest = b->inter > widest ? b->inter : widest;
    long u = units(b->q_dim, b->H, 1), v;
    if ((v = units(b->H, b->inter, 2)) > u)
        u = v;
    if ((v = units(b->inter, b->H, 1)) > u)
        u = v;
    if (b->w_qkv && (v = units(b->H, b->qkv_dim, 1)) > u)
        u = v;
    *xs_bytes = (widest * 2 + 15) / 16 * 16;
    size_t xn = b->H > 4 * BK_THREADS ? (size_t)b->H : 0; // s_norm's staging, for wide rows
    *total = (size_t)*xs_bytes + (xn + (size_t)u) * sizeof(float);
}

int ls_cu_decode_block_ok(const ls_cu_block_t *b) {
    const ls_cu_props_t *pr = ls_cu_props();
    int xs_bytes;
    size_t smem;
    s_smem(b, pr->sms, &xs_bytes, &smem);
    // at 1,024 threads the launch bounds keep the registers to an SM's file: a CTA fits an SM
    // wherever its shared memory does (the static scratch beside the dynamic part)
    if (b->H <= 0 || b->H % 8 || b->q_dim % 8 || b->inter % 8 || b->qkv_dim % 8 ||
        smem + 1024 > (size_t)pr->smem_optin)
        return 0;
    uintptr_t al = (uintptr_t)b->a | (uintptr_t)b->w_o | (uintptr_t)b->w_gu | (uintptr_t)b->w_d |
                   (uintptr_t)b->w_qkv | (uintptr_t)b->g1 | (uintptr_t)b->g2 | (uintptr_t)b->x |
                   (uintptr_t)b->x1 | (uintptr_t)b->y | (uintptr_t)b->act;
    if (al % 16)
        return 0;
    // raised here, before any launch (the backend asks in its probe pass, outside a capture)
    static size_t raised[LS_CU_MAX_DEVICES]; // the dynamic shared memory allowed so far
    size_t &have = raised[ls_cu_device()];
    if (smem > have) {
        if (cudaFuncSetAttribute((const void *)k_decode_block,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        have = smem;
    }
    return 1;
}

cudaError_t ls_cu_decode_block(const ls_cu_block_t *b, cudaStream_t stream) {
    assert(ls_cu_decode_block_ok(b));
    int xs_bytes;
    size_t smem;
    s_smem(b, ls_cu_props()->sms, &xs_bytes, &smem);
    // cooperative: every CTA resident at once (the barriers need it); programmatic: the CTAs
    // load o's first units while attention drains
    cudaLaunchAttribute attr[2];
    int n = ls_cu_launch_attrs(attr, true, 1);
    attr[n].id = cudaLaunchAttributeCooperative;
    attr[n++].val.cooperative = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)ls_cu_props()->sms);
    cfg.blockDim = dim3(BK_THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, k_decode_block, *b, xs_bytes);
}
