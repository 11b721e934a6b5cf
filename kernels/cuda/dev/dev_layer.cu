/*  kernels/cuda/dev/dev_layer.cu — how much of a one-token decode layer's fixed time a
    persistent kernel takes back (measured, not production).

    Why: at batch 1 an H200's decode layer is ~123 µs against the ~103 µs its weights take at
    copy bandwidth (Llama-3-8B, bench_base_cuda --trace). The GEMVs stream at 92-96% of copy
    bandwidth; the rest is the links between kernels — each small kernel (RMSNorm, SiLU·mul,
    RoPE, attention) waits for the grid before it to end and flush, and the GEMV after it for
    that one, while HBM idles but for the GEMV's L2 prefetch. A persistent kernel (one CTA an
    SM for the whole chain, a grid barrier where a kernel boundary was) could load the next
    projection's first weights into registers before the barrier, not merely ask L2 for them,
    and do a small op's work in every CTA at once (each CTA normalizes the whole row for
    itself: 16 KB from L2) instead of in one CTA between two boundaries.

    The chain (both versions, 32 layers of Llama-3-8B's shapes, one token, bf16 weights, fp32
    residual): h = rmsnorm(x) · g1 (bf16); qkv = W_qkv h; o's input is qkv's first 4,096
    values (a stand-in for RoPE and attention, which neither version runs); y = W_o a; x += y;
    h = rmsnorm(x) · g2; gu = W_gu h; a = silu(gate) · up (bf16); y = W_down a; x += y (into
    the next layer's first RMSNorm).

    Versions (all one cooperative launch, a CTA of 32 warps an SM, a phase a projection: every
    CTA builds the projection's input in shared memory — the RMSNorm of x + y, qkv's q part
    rounded, or SiLU·mul — from the whole row, redundantly; CTA 0 writes x back; a grid barrier
    ends the phase):
    - chain: the production kernels from the kernels' library (ls_cu_rmsnorm, ls_cu_gemv,
      ls_cu_silu_mul: 7 launches a layer on programmatic dependent launch, the GEMV's L2
      prefetch as the backend asks for it), in one CUDA graph; "its GEMVs alone": the same
      four ls_cu_gemv a layer with nothing between them.
    - rows: warp gw takes rows gw, gw + W, ... over all of K (as k_gemv), 4 loads a lane in
      flight, the first 4 of the next projection loaded into registers between arriving at the
      barrier and waiting there.
    - flat: CTA b takes an equal share of the rows, cut into units of 2 KB (4 loads a lane),
      dealt over its warps, so that every warp is busy until its CTA's end; two units a warp in
      flight; the first unit of the next projection preloaded as in rows ("pre2": two).
    - barriers: "atomic" (a count the last arrival resets and a generation word it bumps),
      "flags" (each CTA stores its count of barriers reached, thread t of every CTA waits for
      CTA t's), "count" (one counter that only grows, one release reduction a CTA, passed at
      n · grid). A CTA arrives (its fence ordering its y stores), issues the preload, then
      waits: with the preload before the fence, the fence waited for those loads too.
    - fold: gate_up's rows taken in pairs (a CTA's gate rows and the matching up rows), its
      epilogue writing silu(gate) · up as bf16, so the down phase's op is a 28 KB copy instead
      of every CTA reading the fp32 gate_up (115 KB) and computing SiLU·mul itself.
    - "GEMVs alone" (SYNC false): the phases without barriers or small ops (wrong values):
      warps flow from one projection into the next, the streaming bound.
    One launch of "flat count fold" is also traced (%globaltimer at each phase's start, after
    its op, after its GEMV, per CTA) for where a layer's time goes.

    The whole layer (RoPE with the KV store and paged attention too; 128, 4K and 16K cached
    positions on 16-position pages in shuffled order; RoPE's q,k,v row of the chain):
    - chain: the production kernels, 9 a layer (RoPE with the KV store and ls_cu_attention
      writing bf16 for o's GEMV).
    - persist (k_layer_full): the best form above with attention as phases of its own — a
      split of the keys a CTA (8 kv heads x up to 16 splits, each warp rotating q and the new
      key itself, 2 keys a warp in flight, fp32 dot products over the warp; its registers
      spill at 64 a thread), the splits merged by 32 CTAs, 6 barriers a layer.
    - hybrid (k_persist_tail): the production RoPE and attention kernels, then one persistent
      kernel a layer from o to the next layer's q,k,v (3 barriers), launched cooperatively and
      programmatically: its CTAs load o's first units on the SMs attention leaves free before
      they wait for it; "+rope": RoPE and the KV store in its q,k,v epilogue instead of a
      kernel; "with block.cu's GEMV / RMSNorm / barrier / shared memory": one part of the
      production kernel at a time in it.
    - block.cu: the hybrid with the production kernel (../block.cu, compiled in here) as its
      tail.

    Measured (H200, copy bandwidth 4,265 GB/s, µs a layer over 32 layers, two rounds in one
    call; the weights' floor 102.3): chain 118.1 / 118.3 (its GEMVs alone 115.0 / 115.1); rows
    116.9 / 118.3; flat 112.7 / 112.6; flat flags 118.0 / 118.9, with pre2 125.4 / 127.2; flat
    fold 109.4 / 109.4; flat count 110.8 / 110.5; flat count fold 107.1 / 106.9 (1.046 x the
    floor); flat's GEMVs alone 96.5 / 96.5 (0.944: pure reads beat the copy's rate). The
    trace of flat count fold, medians over layers: ops 1.28 (norm) / 0.31 / 1.32 (norm) / 0.50,
    barriers (last CTA's GEMV end to the next phase's first start) 1.75 / 1.75 / 0.75 / 1.50,
    the CTAs' GEMVs ending within 1-3 µs of each other. The whole layer (another call, the
    floor with the KV cache's bytes 103.0 / 106.8 / 118.7 at 128 / 4K / 16K): chain 122.6-123.0
    / 129.7-129.9 / 141.7 (1.19-1.22 x), persist 121.9-122.7 / 143.1-143.7 / 196.1-201.4,
    hybrid 113.6-113.7 / 120.4-120.6 / 132.1-132.6 (1.10-1.13 x); block.cu, the parts and the
    +rope form: the kernels' README. Measured and not kept in the
    file: the rows and flat forms with the preload issued before the fence (118-120 and
    115.0), and a dynamic flat form (items of rows from an atomic counter, a row still summed
    by one CTA; 114.3-114.8 against the static form's 115.0 in that call): the SMs' streaming
    rates were not what the barriers waited for.

    Checked: one layer of each version against a double-precision CPU reference of the same
    chain (bf16 roundings of h and a as the kernels make them), NMSE bound 1e-5, and two whole
    layers of each against the production chain's (the second reads the q,k,v and the cache
    row the first made; the production kernels are checked against their
    CPU references by test_gpu_ops), NMSE bound 1e-4 (attention's q pieces and exponentials
    round differently); then timed over 32 layers, µs a layer against the floor (bytes over
    the run's copy bandwidth).
*/
#include <cstring>
#include <functional>

#include "../block.cu"
#include "common.cuh"
#include "dev_common.cuh"
#include "ops_cuda.h"

typedef __nv_bfloat16 bf16;

enum { H = 4096, QKV = 6144, INTER = 14336, GU = 2 * INTER, LAYERS = 32 };
enum { PL_THREADS = 1024, PL_WARPS = PL_THREADS / 32, PL_U = 4, PL_PART = 1024 };
// Llama-3-8B's attention: q heads, kv heads, head_dim, positions a page; the persistent
// attention's splits a kv head at most and keys a warp in flight
enum { QH = 32, KVH = 8, HD = 128, GRP = QH / KVH, BS = 16, PL_SPLITS = 16, PL_KU = 2 };
static const float EPS = 1e-5f;

struct pl_layer_t {
    const bf16 *g1, *qkv, *o, *g2, *gu, *d;
};

struct pl_args_t {
    const pl_layer_t *layers;
    int n_layers;
    float *x[2]; // the residual, ping-ponged: CTA 0 writes one while every CTA reads the other
    float *y, *qkv, *gu;
    bf16 *act;                // SiLU·mul's output where gate_up's epilogue makes it (FOLD)
    unsigned *bar;            // the atomic barrier: [0] arrivals, [1] generation
    unsigned *flags;          // the flag barrier: CTA b's count of barriers reached, zero at the launch
    unsigned long long *tr;   // or NULL: CTA b's %globaltimer at phase p's start, after its small
                              // op, after its GEMV: tr[(p * grid + b) * 3 + k]
};

__device__ __forceinline__ unsigned long long pl_clock() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ unsigned pl_ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// ---- grid barriers: every CTA arrives before any leaves; what each wrote before arriving is
// visible after. Arrive, then the next projection's first loads, then wait: a fence after
// those loads would wait for them.

// atomic: one count (132 atomics on one word) and a generation word the last arrival bumps
__device__ void pl_arrive_atomic(unsigned *bar, unsigned gen, bool &last) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(&bar[0], 1u) == gridDim.x - 1;
        if (last) {
            bar[0] = 0;
            __threadfence();
            atomicExch(&bar[1], gen + 1);
        }
    }
}
__device__ void pl_wait_atomic(unsigned *bar, unsigned gen, bool last) {
    if (threadIdx.x == 0 && !last)
        while (pl_ld_acquire(&bar[1]) == gen)
            ;
    __syncthreads();
}

// count: one counter that only grows (zero at the launch); barrier n is passed once it reaches
// n · grid. One release reduction a CTA, no generation word, no last-arrival path
__device__ void pl_arrive_count(unsigned *bar) {
    __syncthreads();
    if (threadIdx.x == 0)
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar) : "memory");
}
__device__ void pl_wait_count(const unsigned *bar, unsigned n) {
    if (threadIdx.x == 0)
        while (pl_ld_acquire(bar) < n * gridDim.x)
            ;
    __syncthreads();
}

// flags: each CTA stores its count of barriers reached; thread t waits for CTA t's
__device__ void pl_arrive_flags(unsigned *flags, unsigned n) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flags + blockIdx.x), "r"(n) : "memory");
    }
}
__device__ void pl_wait_flags(const unsigned *flags, unsigned n) {
    if (threadIdx.x < gridDim.x)
        while (pl_ld_acquire(flags + threadIdx.x) < n)
            ;
    __syncthreads();
}

// ---- the rows form: warp gw takes rows gw, gw + W, ... (W warps in all) over all of K, 4
// loads a lane in flight

__device__ __forceinline__ void pl_pre_rows(const bf16 *w, int in, int out, int gw, int lane,
                                            uint4 (&pre)[PL_U]) {
    if (gw < out) {
        const uint4 *wr = reinterpret_cast<const uint4 *>(w + (size_t)gw * in);
#pragma unroll
        for (int u = 0; u < PL_U; u++)
            pre[u] = ls_ld_stream(wr + lane + 32 * u);
    }
}

// y[o] = w[o] · xs (xs in shared memory); pre: the first row's first loads (have)
__device__ void pl_gemv_rows(const bf16 *w, int in, int out, const bf16 *xs, float *y, int gw, int nw,
                             int lane, const uint4 (&pre)[PL_U], bool have) {
    const uint4 *xv = reinterpret_cast<const uint4 *>(xs);
    int n16 = in / 8;
    for (int o = gw; o < out; o += nw) {
        const uint4 *wr = reinterpret_cast<const uint4 *>(w + (size_t)o * in);
        float acc = 0.0f;
        int c0 = 0;
        if (have) {
#pragma unroll
            for (int u = 0; u < PL_U; u++)
                acc = s_dot8(pre[u], xv[lane + 32 * u], acc);
            c0 = 32 * PL_U, have = false;
        }
        for (int c = c0 + lane; c < n16; c += 32 * PL_U) {
            uint4 wv[PL_U];
#pragma unroll
            for (int u = 0; u < PL_U; u++)
                wv[u] = ls_ld_stream(wr + c + 32 * u);
#pragma unroll
            for (int u = 0; u < PL_U; u++)
                acc = s_dot8(wv[u], xv[c + 32 * u], acc);
        }
        acc = ls_warp_sum(acc);
        if (lane == 0)
            y[o] = acc;
    }
}

// ---- the flat form: CTA b takes rows [b · n / G, (b + 1) · n / G) (G CTAs), cut into units of
// 256 · PL_U elements of a row (S a row); its warps take units warp, warp + 32, ... (each warp
// the same bytes to within a unit, busy until the CTA's end), the next unit's loads issued
// before the current one's sums; a unit's sum to part (shared memory), then each row's S
// partial sums added in order. Paired modes take n = out / 2 pairs of rows, the CTA's first
// rows then its second rows, for an epilogue that needs both: PL_GLU (gate_up: rows i and
// INTER + i, the epilogue writing silu(gate) · up as bf16) and PL_ROPE (q,k,v: rows i and
// i + 64 of a head of 128, the epilogue rotating them as RoPE does and storing the new key and
// value in the caches).
enum { PL_PLAIN = 0, PL_GLU = 1, PL_ROPE = 2 };
struct pl_flat_t {
    int S, r0, r1, units, mode;
    __device__ pl_flat_t(int in, int out, int m) : mode(m) {
        int n = m ? out / 2 : out;
        S = in / (256 * PL_U);
        r0 = (int)((long)blockIdx.x * n / gridDim.x);
        r1 = (int)((long)(blockIdx.x + 1) * n / gridDim.x);
        units = (r1 - r0) * S * (m ? 2 : 1);
    }
    // row of pair p: its first (second = false) or second
    __device__ int pair_row(int out, int p, bool second) const {
        if (mode == PL_GLU)
            return second ? out / 2 + p : p;
        return (p / 64) * 128 + p % 64 + (second ? 64 : 0);
    }
    __device__ const uint4 *at(const bf16 *w, int in, int out, int j, int lane) const {
        int r = j / S, n = r1 - r0;
        int row = mode ? pair_row(out, r0 + (r >= n ? r - n : r), r >= n) : r0 + r;
        return reinterpret_cast<const uint4 *>(w + (size_t)row * in) + (j % S) * 32 * PL_U + lane;
    }
};

// PL_ROPE's epilogue: the token's position, RoPE's frequencies, and the caches' addresses of
// its row in the page (k and v heads follow QH q heads in the q,k,v row)
struct pl_rope_out_t {
    const float *inv_freq;
    int pos;
    bf16 *kc, *vc; // the token's row of the page
};

// the first n (1 or 2) units of the CTA's share, into pre and pre2
__device__ __forceinline__ void pl_pre_flat(const bf16 *w, int in, int out, int pair, int warp, int lane,
                                            uint4 (&pre)[PL_U], uint4 (&pre2)[PL_U], int n) {
    pl_flat_t f(in, out, pair);
    if (warp < f.units) {
        const uint4 *p = f.at(w, in, out, warp, lane);
#pragma unroll
        for (int u = 0; u < PL_U; u++)
            pre[u] = ls_ld_stream(p + 32 * u);
    }
    if (n > 1 && warp + PL_WARPS < f.units) {
        const uint4 *p = f.at(w, in, out, warp + PL_WARPS, lane);
#pragma unroll
        for (int u = 0; u < PL_U; u++)
            pre2[u] = ls_ld_stream(p + 32 * u);
    }
}

// y[o] = w[o] · xs; PL_GLU: act[i] = silu(w[i] · xs) · (w[INTER + i] · xs); PL_ROPE: y = w · xs
// rotated (ro: the caches get the new key and value). have: the units already in cur (1) and
// nx2 (2)
__device__ void pl_gemv_flat(const bf16 *w, int in, int out, int pair, const bf16 *xs, float *y,
                             bf16 *act, float *part, int warp, int lane, uint4 (&cur)[PL_U],
                             uint4 (&nx2)[PL_U], int have, const pl_rope_out_t *ro = NULL) {
    pl_flat_t f(in, out, pair);
    const uint4 *xv = reinterpret_cast<const uint4 *>(xs);
    int j = warp;
    if (j < f.units && !have) {
        const uint4 *p = f.at(w, in, out, j, lane);
#pragma unroll
        for (int u = 0; u < PL_U; u++)
            cur[u] = ls_ld_stream(p + 32 * u);
    }
    bool loaded = have > 1;
    for (; j < f.units; j += PL_WARPS) {
        uint4 nx[PL_U];
#pragma unroll
        for (int u = 0; u < PL_U; u++)
            nx[u] = nx2[u];
        int jn = j + PL_WARPS;
        if (jn < f.units && !loaded) {
            const uint4 *p = f.at(w, in, out, jn, lane);
#pragma unroll
            for (int u = 0; u < PL_U; u++)
                nx[u] = ls_ld_stream(p + 32 * u);
        }
        const uint4 *xj = xv + (j % f.S) * 32 * PL_U + lane;
        float acc = 0.0f;
#pragma unroll
        for (int u = 0; u < PL_U; u++)
            acc = s_dot8(cur[u], xj[32 * u], acc);
        acc = ls_warp_sum(acc);
        if (lane == 0)
            part[j] = acc;
#pragma unroll
        for (int u = 0; u < PL_U; u++)
            cur[u] = nx[u];
        loaded = false;
    }
    __syncthreads();
    int n = f.r1 - f.r0;
    for (int r = threadIdx.x; r < n; r += PL_THREADS) {
        float v = 0.0f;
        for (int s = 0; s < f.S; s++)
            v += part[r * f.S + s];
        if (pair == PL_PLAIN) {
            y[f.r0 + r] = v;
            continue;
        }
        float u = 0.0f;
        for (int s = 0; s < f.S; s++)
            u += part[(n + r) * f.S + s];
        if (pair == PL_GLU) {
            act[f.r0 + r] = __float2bfloat16_rn(ls_silu_mul(v, u));
            continue;
        }
        int p = f.r0 + r, head = p / 64, i = p % 64, ra = f.pair_row(out, p, false);
        if (head < QH + KVH) { // q and k rotate, v does not
            float sn, cs;
            sincosf(__fmul_rn((float)ro->pos, ro->inv_freq[i]), &sn, &cs);
            float a = __fsub_rn(__fmul_rn(v, cs), __fmul_rn(u, sn));
            u = __fadd_rn(__fmul_rn(u, cs), __fmul_rn(v, sn));
            v = a;
        }
        y[ra] = v, y[ra + 64] = u;
        if (head >= QH) {
            bf16 *c = (head < QH + KVH ? ro->kc : ro->vc) + ((head - QH) % KVH) * HD + i;
            c[0] = __float2bfloat16_rn(v), c[64] = __float2bfloat16_rn(u);
        }
    }
}

// ---- the small ops, each CTA the whole row

// xs = bf16(rmsnorm(x + y) · g) over H values, as k_rmsnorm_reg rounds (a double sum of
// squares); CTA 0 writes x + y to x_out. x, y through L2 (written by other SMs)
__device__ void pl_norm(const float *x, const float *y, const bf16 *g, float *x_out, bf16 *xs,
                        double *scratch) {
    static_assert(H == 4 * PL_THREADS, "4 values a thread");
    int i = 4 * threadIdx.x;
    float4 a = __ldcg(reinterpret_cast<const float4 *>(x + i));
    if (y) {
        float4 b = __ldcg(reinterpret_cast<const float4 *>(y + i));
        a = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
    }
    double ss = (double)a.x * a.x + (double)a.y * a.y + (double)a.z * a.z + (double)a.w * a.w;
    ss = ls_block_sum(ss, scratch);
    float inv = __fdiv_rn(1.0f, sqrtf(__fadd_rn((float)(ss / H), EPS)));
    if (blockIdx.x == 0 && x_out)
        *reinterpret_cast<float4 *>(x_out + i) = a;
    const float v[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int e = 0; e < 4; e++)
        xs[i + e] = __float2bfloat16_rn(__fmul_rn(__fmul_rn(v[e], inv), __bfloat162float(g[i + e])));
    __syncthreads();
}

// FORM: 0 rows, 1 flat; PRE: units a warp loads of the next projection before waiting at the
// barrier (2: flat only); BAR: 0 atomic, 1 flags, 2 count (in flags[0]); FOLD: SiLU·mul in gate_up's epilogue (flat
// only); SYNC false: no barriers and no small ops (wrong results: the GEMVs' streaming alone)
template <int FORM, int PRE, int BAR, bool FOLD, bool SYNC = true>
__global__ void __launch_bounds__(PL_THREADS, 1) k_persist(pl_args_t a) {
    static_assert(!FOLD || FORM == 1, "the fold is the flat form's");
    __shared__ __align__(16) bf16 xs[INTER];
    __shared__ double scratch[32];
    __shared__ float part[PL_PART];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gw = blockIdx.x * PL_WARPS + warp;
    int nw = gridDim.x * PL_WARPS;
    unsigned gen = BAR == 0 ? pl_ld_acquire(&a.bar[1]) : 0;
    uint4 pre[PL_U] = {}, pre2[PL_U] = {};
    int have = 0, tp = 0;
    auto mark = [&](int k) {
        if (a.tr && threadIdx.x == 0)
            a.tr[((size_t)tp * gridDim.x + blockIdx.x) * 3 + k] = pl_clock();
        tp += k == 2;
    };
    // one projection: its GEMV, the barrier after it with the next projection's first loads
    auto gemv = [&](const bf16 *w, int in, int out, bool pair, float *y, const bf16 *wn, int inn,
                    int outn, bool pairn) {
        if constexpr (FORM == 1)
            pl_gemv_flat(w, in, out, pair, xs, y, a.act, part, warp, lane, pre, pre2, have);
        else
            pl_gemv_rows(w, in, out, xs, y, gw, nw, lane, pre, have);
        mark(2);
        bool last = false;
        if (SYNC) {
            if (BAR == 0)
                pl_arrive_atomic(a.bar, gen, last);
            else if (BAR == 1)
                pl_arrive_flags(a.flags, gen + 1);
            else
                pl_arrive_count(a.flags);
        }
        if (PRE && wn) {
            if constexpr (FORM == 1)
                pl_pre_flat(wn, inn, outn, pairn, warp, lane, pre, pre2, PRE);
            else
                pl_pre_rows(wn, inn, outn, gw, lane, pre);
        }
        have = wn ? PRE : 0;
        if (SYNC) {
            if (BAR == 0)
                pl_wait_atomic(a.bar, gen, last);
            else if (BAR == 1)
                pl_wait_flags(a.flags, gen + 1);
            else
                pl_wait_count(a.flags, gen + 1);
        }
        gen++;
    };
    for (int l = 0; l < a.n_layers; l++) {
        const pl_layer_t &L = a.layers[l];
        // h = rmsnorm(x (+ y: the layer before's down)) -> qkv
        mark(0);
        if (SYNC)
            pl_norm(a.x[0], l ? a.y : NULL, L.g1, a.x[1], xs, scratch);
        mark(1);
        gemv(L.qkv, H, QKV, false, a.qkv, L.o, H, H, false);
        // o on q (the attention stand-in)
        mark(0);
        if (SYNC) {
            for (int i = threadIdx.x; i < H; i += PL_THREADS)
                xs[i] = __float2bfloat16_rn(__ldcg(a.qkv + i));
            __syncthreads();
        }
        mark(1);
        gemv(L.o, H, H, false, a.y, L.gu, H, GU, FOLD);
        // x += y; h = rmsnorm(x) -> gate_up
        mark(0);
        if (SYNC)
            pl_norm(a.x[1], a.y, L.g2, a.x[0], xs, scratch);
        mark(1);
        gemv(L.gu, H, GU, FOLD, a.gu, L.d, INTER, H, false);
        // silu(gate) * up (made by gate_up's epilogue where FOLD) -> down
        mark(0);
        if (SYNC) {
            if (FOLD)
                for (int i = threadIdx.x; i < INTER / 8; i += PL_THREADS)
                    reinterpret_cast<uint4 *>(xs)[i] = __ldcg(reinterpret_cast<const uint4 *>(a.act) + i);
            else
                for (int i = threadIdx.x; i < INTER; i += PL_THREADS)
                    xs[i] = __float2bfloat16_rn(ls_silu_mul(__ldcg(a.gu + i), __ldcg(a.gu + INTER + i)));
            __syncthreads();
        }
        mark(1);
        gemv(L.d, INTER, H, false, a.y, l + 1 < a.n_layers ? a.layers[l + 1].qkv : NULL, H, QKV, false);
    }
}

// ---- the whole layer: RoPE with the KV store and paged decode attention as phases too ----
//
// After q,k,v: CTA b < 8 · splits takes kv head b / splits and an equal share of the keys (the
// split b % splits); each warp rotates q's 4 heads of that kv head and the new key (lane l
// holding dims 4l..4l+3, the rotation's partner dims 64 apart from lane l ^ 16), and walks keys
// warp, warp + 32, ... of the share, 4 in flight, one online softmax a head; the new key comes
// from the warp's registers (rounded to bf16 as the cache holds it), and the split holding it
// stores it. The CTA's warps merge in shared memory in warp order, the split's (m, l, acc) goes
// to apart; a barrier; CTA h < 32 merges q head h's splits in split order into aout (bf16); a
// barrier; o reads aout. 6 barriers a layer. Llama-3-8B's attention: 32 q heads, 8 kv heads,
// head_dim 128, pages of 16 positions.

struct pl_full_t {
    pl_args_t a;
    bf16 *const *kc, *const *vc; // a layer's caches: pages of (BS, KVH · HD), BS · KVH · HD apart
    const int32_t *table;        // the sequence's block table
    const float *inv_freq;       // HD / 2
    int pos;                     // the new token's position: keys 0 .. pos - 1 are cached
    int splits;                  // CTAs a kv head
    float *apart;                // (QH, PL_SPLITS, HD + 2): a split's m, l, acc
    bf16 *aout;                  // (QH · HD)
};

// lane's 4 dims of head row x (HD fp32 values) rotated at angle pos · inv_freq, as
// k_rope_kv_store rotates (pairs i, i + HD/2)
__device__ __forceinline__ void pl_rope4(const float *x, const float *inv_freq, int pos, int lane,
                                         float (&r)[4]) {
    float4 v = __ldcg(reinterpret_cast<const float4 *>(x) + lane);
    const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float other = __shfl_xor_sync(0xffffffffu, e[k], 16);
        int i = (4 * lane + k) % (HD / 2);
        float sn, cs;
        sincosf(__fmul_rn((float)pos, inv_freq[i]), &sn, &cs);
        r[k] = lane < 16 ? __fsub_rn(__fmul_rn(e[k], cs), __fmul_rn(other, sn))
                         : __fadd_rn(__fmul_rn(e[k], cs), __fmul_rn(other, sn));
    }
}

__device__ __forceinline__ void pl_bf16x4(uint2 u, float (&f)[4]) {
    f[0] = __uint_as_float(u.x << 16), f[1] = __uint_as_float(u.x & 0xffff0000u);
    f[2] = __uint_as_float(u.y << 16), f[3] = __uint_as_float(u.y & 0xffff0000u);
}

// one key of an online softmax per head: scores q[g] · k over the warp, then m, l, acc
__device__ __forceinline__ void pl_key(const float (&q)[GRP][4], float (&m)[GRP], float (&lsum)[GRP],
                                       float (&acc)[GRP][4], const float (&kf)[4], const float (&vf)[4]) {
#pragma unroll
    for (int g = 0; g < GRP; g++) {
        float sc = ls_warp_sum(q[g][0] * kf[0] + q[g][1] * kf[1] + q[g][2] * kf[2] + q[g][3] * kf[3]);
        float mn = fmaxf(m[g], sc), corr = __expf(m[g] - mn), p = __expf(sc - mn);
        lsum[g] = lsum[g] * corr + p;
#pragma unroll
        for (int k = 0; k < 4; k++)
            acc[g][k] = acc[g][k] * corr + p * vf[k];
        m[g] = mn;
    }
}

// one split's partial attention for kv head blockIdx.x / splits (CTAs past 8 · splits idle);
// sacc: (PL_WARPS, GRP, HD) floats, sml: (PL_WARPS, GRP, 2)
__device__ void pl_attn_split(const pl_full_t &f, int l, float *sacc, float *sml) {
    int b = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (b >= KVH * f.splits)
        return;
    int h = b / f.splits, s = b % f.splits, N = f.pos + 1;
    int chunk = (N + f.splits - 1) / f.splits, k0 = s * chunk, k1 = min(N, k0 + chunk);
    const float *row = f.a.qkv;
    float q[GRP][4];
    const float qs = rsqrtf((float)HD);
#pragma unroll
    for (int g = 0; g < GRP; g++) {
        pl_rope4(row + (GRP * h + g) * HD, f.inv_freq, f.pos, lane, q[g]);
#pragma unroll
        for (int k = 0; k < 4; k++)
            q[g][k] *= qs;
    }
    const size_t page = (size_t)BS * KVH * HD;
    const bf16 *kc = f.kc[l], *vc = f.vc[l];
    float m[GRP], lsum[GRP], acc[GRP][4];
#pragma unroll
    for (int g = 0; g < GRP; g++) {
        m[g] = -INFINITY, lsum[g] = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++)
            acc[g][k] = 0.0f;
    }
    int kend = min(k1, f.pos); // the cached keys of the share
    for (int j = k0 + warp; j < kend; j += 32 * PL_KU) {
        uint2 kr[PL_KU], vr[PL_KU];
#pragma unroll
        for (int u = 0; u < PL_KU; u++) {
            int jj = j + 32 * u;
            if (jj < kend) {
                size_t at = (size_t)f.table[jj / BS] * page + (size_t)(jj % BS) * KVH * HD + h * HD;
                kr[u] = __ldcg(reinterpret_cast<const uint2 *>(kc + at) + lane);
                vr[u] = __ldcg(reinterpret_cast<const uint2 *>(vc + at) + lane);
            }
        }
#pragma unroll
        for (int u = 0; u < PL_KU; u++) {
            if (j + 32 * u >= kend)
                break;
            float kf[4], vf[4];
            pl_bf16x4(kr[u], kf), pl_bf16x4(vr[u], vf);
            pl_key(q, m, lsum, acc, kf, vf);
        }
    }
    // the new key: rotated here, rounded as the cache holds it, stored, and taken by warp 0
    if (warp == 0 && k0 <= f.pos && f.pos < k1) {
        float kn[4], vn[4];
        pl_rope4(row + (QH + h) * HD, f.inv_freq, f.pos, lane, kn);
        float4 v4 = __ldcg(reinterpret_cast<const float4 *>(row + (QH + KVH + h) * HD) + lane);
        vn[0] = v4.x, vn[1] = v4.y, vn[2] = v4.z, vn[3] = v4.w;
        size_t at = (size_t)f.table[f.pos / BS] * page + (size_t)(f.pos % BS) * KVH * HD + h * HD + 4 * lane;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            bf16 kb = __float2bfloat16_rn(kn[k]), vb = __float2bfloat16_rn(vn[k]);
            f.kc[l][at + k] = kb, f.vc[l][at + k] = vb;
            kn[k] = __bfloat162float(kb), vn[k] = __bfloat162float(vb);
        }
        pl_key(q, m, lsum, acc, kn, vn);
    }
#pragma unroll
    for (int g = 0; g < GRP; g++) {
        *reinterpret_cast<float4 *>(sacc + ((size_t)warp * GRP + g) * HD + 4 * lane) =
            make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
        if (lane == 0)
            sml[(warp * GRP + g) * 2] = m[g], sml[(warp * GRP + g) * 2 + 1] = lsum[g];
    }
    __syncthreads();
    if (threadIdx.x < GRP * HD) {
        int g = threadIdx.x / HD, d = threadIdx.x % HD;
        float M = -INFINITY, L = 0.0f, A = 0.0f;
        for (int w = 0; w < PL_WARPS; w++)
            M = fmaxf(M, sml[(w * GRP + g) * 2]);
        if (M > -INFINITY)
            for (int w = 0; w < PL_WARPS; w++) {
                float c = __expf(sml[(w * GRP + g) * 2] - M);
                L += sml[(w * GRP + g) * 2 + 1] * c;
                A += sacc[((size_t)w * GRP + g) * HD + d] * c;
            }
        float *o = f.apart + ((size_t)(GRP * h + g) * PL_SPLITS + s) * (HD + 2);
        if (d == 0)
            o[0] = M, o[1] = L;
        o[2 + d] = A;
    }
}

// q head blockIdx.x's splits merged in split order into aout (CTAs past QH idle)
__device__ void pl_attn_merge(const pl_full_t &f) {
    int hq = blockIdx.x, d = threadIdx.x;
    if (hq >= QH || d >= HD)
        return;
    const float *p = f.apart + (size_t)hq * PL_SPLITS * (HD + 2);
    float M = -INFINITY, L = 0.0f, A = 0.0f;
    for (int s = 0; s < f.splits; s++)
        M = fmaxf(M, __ldcg(p + s * (HD + 2)));
    for (int s = 0; s < f.splits; s++) {
        float c = __expf(__ldcg(p + s * (HD + 2)) - M);
        L += __ldcg(p + s * (HD + 2) + 1) * c;
        A += __ldcg(p + s * (HD + 2) + 2 + d) * c;
    }
    f.aout[hq * HD + d] = __float2bfloat16_rn(A / L);
}

// The whole layer: the flat form, the count barrier, SiLU·mul in gate_up's epilogue, the next
// projection's first unit preloaded where a GEMV's phase follows (not across attention)
__global__ void __launch_bounds__(PL_THREADS, 1) k_layer_full(pl_full_t f) {
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *xs = reinterpret_cast<bf16 *>(smem);                          // INTER bf16
    float *part = reinterpret_cast<float *>(smem + INTER * 2);          // PL_PART
    float *sacc = part + PL_PART;                                       // PL_WARPS * GRP * HD
    float *sml = sacc + PL_WARPS * GRP * HD;                            // PL_WARPS * GRP * 2
    __shared__ double scratch[32];
    const pl_args_t &a = f.a;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned n = 0;
    uint4 pre[PL_U] = {}, pre2[PL_U] = {};
    int have = 0;
    auto barrier = [&](const bf16 *wn, int inn, int outn, bool pairn) {
        pl_arrive_count(a.flags);
        if (wn)
            pl_pre_flat(wn, inn, outn, pairn, warp, lane, pre, pre2, 1);
        have = wn ? 1 : 0;
        pl_wait_count(a.flags, ++n);
    };
    for (int l = 0; l < a.n_layers; l++) {
        const pl_layer_t &L = a.layers[l];
        pl_norm(a.x[0], l ? a.y : NULL, L.g1, a.x[1], xs, scratch);
        pl_gemv_flat(L.qkv, H, QKV, false, xs, a.qkv, a.act, part, warp, lane, pre, pre2, have);
        barrier(NULL, 0, 0, false);
        pl_attn_split(f, l, sacc, sml);
        barrier(NULL, 0, 0, false);
        pl_attn_merge(f);
        barrier(L.o, H, H, false);
        for (int i = threadIdx.x; i < H / 8; i += PL_THREADS)
            reinterpret_cast<uint4 *>(xs)[i] = __ldcg(reinterpret_cast<const uint4 *>(f.aout) + i);
        __syncthreads();
        pl_gemv_flat(L.o, H, H, false, xs, a.y, a.act, part, warp, lane, pre, pre2, have);
        barrier(L.gu, H, GU, true);
        pl_norm(a.x[1], a.y, L.g2, a.x[0], xs, scratch);
        pl_gemv_flat(L.gu, H, GU, true, xs, a.gu, a.act, part, warp, lane, pre, pre2, have);
        barrier(L.d, INTER, H, false);
        for (int i = threadIdx.x; i < INTER / 8; i += PL_THREADS)
            reinterpret_cast<uint4 *>(xs)[i] = __ldcg(reinterpret_cast<const uint4 *>(a.act) + i);
        __syncthreads();
        pl_gemv_flat(L.d, INTER, H, false, xs, a.y, a.act, part, warp, lane, pre, pre2, have);
        barrier(l + 1 < a.n_layers ? a.layers[l + 1].qkv : NULL, H, QKV, false);
    }
}
// The hybrid: the production RoPE and attention kernels, then one persistent kernel a layer
// for the rest — o (on attention's bf16 output), x += y and the RMSNorm, gate_up with SiLU·mul
// in its epilogue, down, x += y and the next layer's RMSNorm and q,k,v (none after the last
// layer) — 3 barriers inside, launched programmatically so that its CTAs load o's first units
// on the SMs attention leaves before they wait for it. The count barrier's counter is zeroed
// once; launch l passes base = 3 l (barriers before it).
struct pl_tail_t {
    pl_args_t a;
    int l;           // the layer
    unsigned base;   // barriers passed before this launch
    const bf16 *aout;
    pl_rope_out_t ro; // ROPE: the next layer's caches' row for the token
};

// ROPE: the next layer's q,k,v rotated and its new key and value stored in its epilogue
// (PL_ROPE), so that no RoPE kernel runs between this one and attention
// PG: block.cu's GEMV (s_gemv, s_pre) in place of pl_gemv_flat; PN: block.cu's RMSNorm (s_norm,
// x + y staged in shared memory) in place of pl_norm; PB: block.cu's barrier (a 64-bit counter
// in flags, each launch's base read at its start); PS: shared memory as block.cu has it
// (dynamic, xs, then H floats, then part) — the production kernel's parts one at a time
template <bool ROPE, bool PG = false, bool PN = false, bool PB = false, bool PS = false>
__global__ void __launch_bounds__(PL_THREADS, 1) k_persist_tail(pl_tail_t t) {
    __shared__ __align__(16) bf16 xs_s[PS ? 8 : INTER];
    __shared__ double scratch[32];
    __shared__ float part_s[PS ? 4 : PL_PART];
    __shared__ __align__(16) float xn_s[PN && !PS ? H : 4];
    extern __shared__ __align__(16) unsigned char dyn[];
    bf16 *xs = PS ? reinterpret_cast<bf16 *>(dyn) : xs_s;
    float *xn = PS ? reinterpret_cast<float *>(dyn + INTER * 2) : xn_s;
    float *part = PS ? xn + H : part_s;
    unsigned long long *sync64 = reinterpret_cast<unsigned long long *>(t.a.flags);
    __shared__ unsigned long long base;
    const pl_args_t &a = t.a;
    const pl_layer_t &L = a.layers[t.l];
    const pl_layer_t *next = t.l + 1 < a.n_layers ? &a.layers[t.l + 1] : NULL;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned n = t.base;
    uint4 pre[PL_U] = {}, pre2[PL_U] = {};
    auto gemv = [&](const bf16 *w, int in, int out, int pair, float *y, const pl_rope_out_t *ro) {
        if constexpr (PG)
            s_gemv(w, in, out, pair == PL_GLU, NULL, LS_CU_BF16, xs, y, a.act, part, warp, lane, pre, true);
        else
            pl_gemv_flat(w, in, out, pair, xs, y, a.act, part, warp, lane, pre, pre2, 1, ro);
    };
    auto prel = [&](const bf16 *w, int in, int out, int pair) {
        if constexpr (PG)
            s_pre(w, in, out, pair == PL_GLU, warp, lane, pre);
        else
            pl_pre_flat(w, in, out, pair, warp, lane, pre, pre2, 1);
    };
    auto norm = [&](const float *x, const float *y, const bf16 *g, float *x_out) {
        if constexpr (PN)
            s_norm(x, y, g, x_out, xs, xn, H, EPS, scratch);
        else
            pl_norm(x, y, g, x_out, xs, scratch);
    };
    auto arrive = [&] {
        if constexpr (PB)
            s_arrive(sync64);
        else
            pl_arrive_count(a.flags);
    };
    auto wait = [&] {
        ++n;
        if constexpr (PB)
            s_wait(sync64, base, (int)(n - t.base));
        else
            pl_wait_count(a.flags, n);
    };
    prel(L.o, H, H, PL_PLAIN); // weights: before the wait
    ls_dep_wait();
    if (PB && threadIdx.x == 0) {
        unsigned long long per = 3ull * gridDim.x;
        base = s_ld_acquire(sync64) / per * per;
    }
    for (int i = threadIdx.x; i < H / 8; i += PL_THREADS)
        reinterpret_cast<uint4 *>(xs)[i] = __ldcg(reinterpret_cast<const uint4 *>(t.aout) + i);
    __syncthreads();
    gemv(L.o, H, H, PL_PLAIN, a.y, NULL);
    arrive();
    prel(L.gu, H, GU, PL_GLU);
    wait();
    norm(a.x[1], a.y, L.g2, a.x[0]);
    gemv(L.gu, H, GU, PL_GLU, a.gu, NULL);
    arrive();
    prel(L.d, INTER, H, PL_PLAIN);
    wait();
    for (int i = threadIdx.x; i < INTER / 8; i += PL_THREADS)
        reinterpret_cast<uint4 *>(xs)[i] = __ldcg(reinterpret_cast<const uint4 *>(a.act) + i);
    __syncthreads();
    gemv(L.d, INTER, H, PL_PLAIN, a.y, NULL);
    arrive();
    if (next)
        prel(next->qkv, H, QKV, ROPE ? PL_ROPE : PL_PLAIN);
    wait();
    if (next) {
        norm(a.x[0], a.y, next->g1, a.x[1]);
        gemv(next->qkv, H, QKV, ROPE ? PL_ROPE : PL_PLAIN, a.qkv, &t.ro);
    }
}

static const size_t PL_FULL_SMEM =
    INTER * 2 + (PL_PART + PL_WARPS * GRP * HD + PL_WARPS * GRP * 2) * sizeof(float);

// ---- setup, reference, timing ----

__global__ void k_fill(bf16 *p, size_t n, uint64_t seed, float lo, float hi) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + i * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        p[i] = __float2bfloat16_rn(lo + (hi - lo) * (float)(z >> 40) / 16777216.0f);
    }
}

static bf16 *s_fill(size_t n, uint64_t seed, float lo, float hi) {
    bf16 *p;
    DEV_CK(cudaMalloc(&p, n * sizeof *p));
    k_fill<<<1024, 256>>>(p, n, seed, lo, hi);
    DEV_CK(cudaGetLastError());
    return p;
}

static std::vector<float> s_host(const bf16 *d, size_t n) {
    std::vector<bf16> h(n);
    DEV_CK(cudaMemcpy(h.data(), d, n * sizeof *d, cudaMemcpyDeviceToHost));
    std::vector<float> f(n);
    for (size_t i = 0; i < n; i++)
        f[i] = __bfloat162float(h[i]);
    return f;
}

static float s_round(double v) { return __bfloat162float(__float2bfloat16_rn((float)v)); }

static void s_matvec(const std::vector<float> &w, const std::vector<float> &x, int in, int out,
                     std::vector<double> &y) {
    y.assign(out, 0.0);
    for (int o = 0; o < out; o++) {
        double s = 0;
        const float *r = w.data() + (size_t)o * in;
        for (int k = 0; k < in; k++)
            s += (double)r[k] * x[k];
        y[o] = s;
    }
}

// x + y after one layer of the chain on the CPU (doubles; h and a rounded to bf16)
static std::vector<float> s_reference(const pl_layer_t &L, const std::vector<float> &x0) {
    std::vector<float> g1 = s_host(L.g1, H), g2 = s_host(L.g2, H), wq = s_host(L.qkv, (size_t)QKV * H),
                       wo = s_host(L.o, (size_t)H * H), wg = s_host(L.gu, (size_t)GU * H),
                       wd = s_host(L.d, (size_t)H * INTER);
    auto norm = [&](const std::vector<double> &v, const std::vector<float> &g) {
        double ss = 0;
        for (double e : v)
            ss += e * e;
        double inv = 1.0 / std::sqrt(ss / H + EPS);
        std::vector<float> h(H);
        for (int i = 0; i < H; i++)
            h[i] = s_round(v[i] * inv * g[i]);
        return h;
    };
    std::vector<double> x(x0.begin(), x0.end()), qkv, y, gu, dn;
    std::vector<float> h = norm(x, g1), a(H);
    s_matvec(wq, h, H, QKV, qkv);
    for (int i = 0; i < H; i++)
        a[i] = s_round(qkv[i]);
    s_matvec(wo, a, H, H, y);
    for (int i = 0; i < H; i++)
        x[i] += y[i];
    h = norm(x, g2);
    s_matvec(wg, h, H, GU, gu);
    std::vector<float> act(INTER);
    for (int i = 0; i < INTER; i++)
        act[i] = s_round(gu[i] / (1.0 + std::exp(-gu[i])) * gu[INTER + i]);
    s_matvec(wd, act, INTER, H, dn);
    std::vector<float> out(H);
    for (int i = 0; i < H; i++)
        out[i] = (float)(x[i] + dn[i]);
    return out;
}

struct s_bufs_t {
    float *x[2], *y, *qkv, *gu;
    bf16 *h, *act;
    unsigned *bar, *flags;
};

// the production kernels of a layer's head: x += y (layer l > 0), h = rmsnorm(x), q,k,v
static cudaError_t s_head(const std::vector<pl_layer_t> &L, int l, const s_bufs_t &b, cudaStream_t st) {
    cudaError_t e = ls_cu_rmsnorm(NULL, b.h, LS_CU_BF16, NULL, l ? b.x[0] : NULL, l ? b.y : b.x[0], NULL,
                                  L[l].g1, LS_CU_BF16, 1, H, EPS, st);
    return e ? e
             : ls_cu_gemv(b.qkv, b.h, LS_CU_BF16, L[l].qkv, LS_CU_BF16, NULL, LS_CU_F32, 1, H, QKV, 0, 0,
                          LS_CU_GEMV_PF, st);
}

// ... and of its tail: o on a (a_dt), x += y, h = rmsnorm(x), gate_up, SiLU·mul, down
static cudaError_t s_tail(const pl_layer_t &L, const void *a, ls_cu_dtype_t a_dt, const s_bufs_t &b,
                          cudaStream_t st) {
    cudaError_t e;
    if ((e = ls_cu_gemv(b.y, a, a_dt, L.o, LS_CU_BF16, NULL, LS_CU_F32, 1, H, H, 0, 0, LS_CU_GEMV_PF_ATTN, st)) ||
        (e = ls_cu_rmsnorm(NULL, b.h, LS_CU_BF16, NULL, b.x[0], b.y, NULL, L.g2, LS_CU_BF16, 1, H, EPS, st)) ||
        (e = ls_cu_gemv(b.gu, b.h, LS_CU_BF16, L.gu, LS_CU_BF16, NULL, LS_CU_F32, 1, H, GU, 0, 0, LS_CU_GEMV_PF,
                        st)) ||
        (e = ls_cu_silu_mul(NULL, b.act, LS_CU_BF16, NULL, b.gu, NULL, 1, INTER, st)))
        return e;
    return ls_cu_gemv(b.y, b.act, LS_CU_BF16, L.d, LS_CU_BF16, NULL, LS_CU_F32, 1, INTER, H, 0, 0, LS_CU_GEMV_PF,
                      st);
}

// the production kernels' chain over n layers (x[0] in, x[0] + y out)
static cudaError_t s_chain(const std::vector<pl_layer_t> &L, int n, const s_bufs_t &b, cudaStream_t st) {
    for (int l = 0; l < n; l++) {
        cudaError_t e;
        if ((e = s_head(L, l, b, st)) || (e = s_tail(L[l], b.qkv, LS_CU_F32, b, st)))
            return e;
    }
    return cudaSuccess;
}

// the chain's four GEMVs alone (no small kernels between them: the GEMVs' streaming bound)
static cudaError_t s_gemvs(const std::vector<pl_layer_t> &L, int n, const s_bufs_t &b, cudaStream_t st) {
    for (int l = 0; l < n; l++) {
        cudaError_t e;
        if ((e = ls_cu_gemv(b.qkv, b.h, LS_CU_BF16, L[l].qkv, LS_CU_BF16, NULL, LS_CU_F32, 1, H, QKV, 0,
                            0, LS_CU_GEMV_PF, st)) ||
            (e = ls_cu_gemv(b.y, b.qkv, LS_CU_F32, L[l].o, LS_CU_BF16, NULL, LS_CU_F32, 1, H, H, 0, 0,
                            LS_CU_GEMV_PF, st)) ||
            (e = ls_cu_gemv(b.gu, b.h, LS_CU_BF16, L[l].gu, LS_CU_BF16, NULL, LS_CU_F32, 1, H, GU, 0, 0,
                            LS_CU_GEMV_PF, st)) ||
            (e = ls_cu_gemv(b.y, b.act, LS_CU_BF16, L[l].d, LS_CU_BF16, NULL, LS_CU_F32, 1, INTER, H, 0, 0,
                            LS_CU_GEMV_PF, st)))
            return e;
    }
    return cudaSuccess;
}

// the persistent kernel over n layers: one cooperative launch, a CTA an SM
template <int FORM, int PRE, int BAR, bool FOLD, bool SYNC = true>
static cudaError_t s_persist(const pl_layer_t *dl, int n, const s_bufs_t &b, cudaStream_t st,
                             unsigned long long *tr = NULL) {
    pl_args_t a{dl, n, {b.x[0], b.x[1]}, b.y, b.qkv, b.gu, b.act, b.bar, b.flags, tr};
    cudaError_t e = cudaMemsetAsync(b.flags, 0, PL_THREADS * sizeof(unsigned), st);
    if (e != cudaSuccess)
        return e;
    void *args[] = {&a};
    return cudaLaunchCooperativeKernel((const void *)k_persist<FORM, PRE, BAR, FOLD, SYNC>,
                                       dim3(ls_cu_props()->sms), dim3(PL_THREADS), args, 0, st);
}

// ---- the whole layer's comparison: caches, the production chain with RoPE and attention

struct s_attn_t {
    std::vector<bf16 *> kc, vc; // per layer, pages of (BS, KVH * HD)
    bf16 **dkc, **dvc;
    int32_t *table, *pos, *slot, *tok_seq;
    float *inv_freq, *apart;
    bf16 *aout;
    int max_blocks, C, page_of_pos; // the new token's page
};

// caches for C cached positions (random bf16 keys and values) on pages in shuffled order
static void s_attn_init(s_attn_t &at, int C, dev_rng_t &rng) {
    int nblk = (C + 1 + BS - 1) / BS;
    size_t page = (size_t)BS * KVH * HD;
    at.C = C, at.max_blocks = nblk;
    at.kc.resize(LAYERS), at.vc.resize(LAYERS);
    for (int l = 0; l < LAYERS; l++) {
        at.kc[l] = s_fill(nblk * page, 77 + 2 * l, -1.0f, 1.0f);
        at.vc[l] = s_fill(nblk * page, 78 + 2 * l, -1.0f, 1.0f);
    }
    DEV_CK(cudaMalloc(&at.dkc, LAYERS * sizeof(bf16 *)));
    DEV_CK(cudaMalloc(&at.dvc, LAYERS * sizeof(bf16 *)));
    DEV_CK(cudaMemcpy(at.dkc, at.kc.data(), LAYERS * sizeof(bf16 *), cudaMemcpyHostToDevice));
    DEV_CK(cudaMemcpy(at.dvc, at.vc.data(), LAYERS * sizeof(bf16 *), cudaMemcpyHostToDevice));
    std::vector<int32_t> t(nblk);
    for (int i = 0; i < nblk; i++)
        t[i] = i;
    for (int i = nblk - 1; i > 0; i--)
        std::swap(t[i], t[rng.next() % (i + 1)]);
    int32_t host[3] = {C, t[C / BS] * BS + C % BS, 0};
    at.page_of_pos = t[C / BS];
    DEV_CK(cudaMalloc(&at.table, nblk * sizeof(int32_t)));
    DEV_CK(cudaMemcpy(at.table, t.data(), nblk * sizeof(int32_t), cudaMemcpyHostToDevice));
    for (int32_t **p : {&at.pos, &at.slot, &at.tok_seq})
        DEV_CK(cudaMalloc(p, sizeof(int32_t)));
    DEV_CK(cudaMemcpy(at.pos, &host[0], 4, cudaMemcpyHostToDevice));
    DEV_CK(cudaMemcpy(at.slot, &host[1], 4, cudaMemcpyHostToDevice));
    DEV_CK(cudaMemcpy(at.tok_seq, &host[2], 4, cudaMemcpyHostToDevice));
    std::vector<float> inv(HD / 2);
    for (int i = 0; i < HD / 2; i++)
        inv[i] = (float)std::pow(500000.0, -2.0 * i / HD);
    DEV_CK(cudaMalloc(&at.inv_freq, HD / 2 * sizeof(float)));
    DEV_CK(cudaMemcpy(at.inv_freq, inv.data(), HD / 2 * sizeof(float), cudaMemcpyHostToDevice));
    DEV_CK(cudaMalloc(&at.apart, (size_t)QH * PL_SPLITS * (HD + 2) * sizeof(float)));
    DEV_CK(cudaMalloc(&at.aout, QH * HD * sizeof(bf16)));
}

static void s_attn_free(s_attn_t &at) {
    for (int l = 0; l < LAYERS; l++)
        cudaFree(at.kc[l]), cudaFree(at.vc[l]);
    for (void *p : {(void *)at.dkc, (void *)at.dvc, (void *)at.table, (void *)at.pos, (void *)at.slot,
                    (void *)at.tok_seq, (void *)at.inv_freq, (void *)at.apart, (void *)at.aout})
        cudaFree(p);
}

// the production RoPE with the KV store and attention (bf16 out) of layer l (rope false: the
// attention alone)
static cudaError_t s_rope_attn(const s_attn_t &at, int l, const s_bufs_t &b, cudaStream_t st, bool rope = true) {
    size_t page = (size_t)BS * KVH * HD;
    cudaError_t e = rope ? ls_cu_rope_kv_store(b.qkv, NULL, at.kc[l], at.vc[l], LS_CU_BF16, at.pos, at.slot,
                                               at.inv_freq, LS_CU_F32, 1, QH, KVH, HD, QKV, BS, page, st)
                         : cudaSuccess;
    return e ? e
             : ls_cu_attention(at.aout, LS_CU_BF16, b.qkv, at.kc[l], at.vc[l], LS_CU_BF16, at.tok_seq, at.pos,
                               at.table, at.max_blocks, 1, QH, KVH, HD, BS, QKV, page, st);
}

// the production chain of a whole layer: RMSNorm, q,k,v, RoPE with the KV store, attention
// (bf16 out), o, RMSNorm, gate_up, SiLU·mul, down — 9 kernels
static cudaError_t s_chain_full(const std::vector<pl_layer_t> &L, int n, const s_bufs_t &b,
                                const s_attn_t &at, cudaStream_t st) {
    for (int l = 0; l < n; l++) {
        cudaError_t e;
        if ((e = s_head(L, l, b, st)) || (e = s_rope_attn(at, l, b, st)) ||
            (e = s_tail(L[l], at.aout, LS_CU_BF16, b, st)))
            return e;
    }
    return cudaSuccess;
}

// the persistent whole layer; splits a kv head: one per 256 keys, at most PL_SPLITS
static cudaError_t s_persist_full(const pl_layer_t *dl, int n, const s_bufs_t &b, const s_attn_t &at,
                                  cudaStream_t st) {
    int N = at.C + 1, splits = std::min((int)PL_SPLITS, std::max(1, (N + 255) / 256));
    pl_full_t f{{dl, n, {b.x[0], b.x[1]}, b.y, b.qkv, b.gu, b.act, b.bar, b.flags, NULL},
                at.dkc, at.dvc, at.table, at.inv_freq, at.C, splits, at.apart, at.aout};
    cudaError_t e = cudaMemsetAsync(b.flags, 0, sizeof(unsigned), st);
    if (e != cudaSuccess)
        return e;
    void *args[] = {&f};
    return cudaLaunchCooperativeKernel((const void *)k_layer_full, dim3(ls_cu_props()->sms),
                                       dim3(PL_THREADS), args, PL_FULL_SMEM, st);
}

// the hybrid over n layers: layer 0's RMSNorm, q,k,v (and, ROPE, RoPE with the KV store) by
// the production kernels (x copied to x[1], where the tail's RMSNorm reads the residual), then
// a layer: RoPE with the KV store (unless the tail before did it), attention, the tail
template <bool ROPE, bool PG = false, bool PN = false, bool PB = false, bool PS = false>
static cudaError_t s_chain_hybrid(const pl_layer_t *dl, const std::vector<pl_layer_t> &L, int n,
                                  const s_bufs_t &b, const s_attn_t &at, cudaStream_t st) {
    size_t page = (size_t)BS * KVH * HD;
    cudaError_t e;
    if ((e = cudaMemsetAsync(b.flags, 0, sizeof(unsigned long long), st)) ||
        (e = cudaMemcpyAsync(b.x[1], b.x[0], H * sizeof(float), cudaMemcpyDeviceToDevice, st)) ||
        (e = s_head(L, 0, b, st)))
        return e;
    for (int l = 0; l < n; l++) {
        if ((e = s_rope_attn(at, l, b, st, !ROPE || l == 0)))
            return e;
        size_t row = (size_t)at.page_of_pos * page + (size_t)(at.C % BS) * KVH * HD;
        pl_rope_out_t ro{at.inv_freq, at.C, l + 1 < n ? at.kc[l + 1] + row : NULL,
                         l + 1 < n ? at.vc[l + 1] + row : NULL};
        pl_tail_t t{{dl, n, {b.x[0], b.x[1]}, b.y, b.qkv, b.gu, b.act, b.bar, b.flags, NULL}, l, 3u * l, at.aout, ro};
        cudaLaunchAttribute attr[2];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        attr[1].id = cudaLaunchAttributeCooperative;
        attr[1].val.cooperative = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(ls_cu_props()->sms);
        cfg.blockDim = dim3(PL_THREADS);
        cfg.stream = st;
        cfg.attrs = attr;
        cfg.numAttrs = 2;
        cfg.dynamicSmemBytes = PS ? INTER * 2 + (H + PL_PART) * sizeof(float) : 0;
        if (PS && (e = cudaFuncSetAttribute((const void *)k_persist_tail<ROPE, PG, PN, PB, PS>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)cfg.dynamicSmemBytes)))
            return e;
        if ((e = cudaLaunchKernelEx(&cfg, k_persist_tail<ROPE, PG, PN, PB, PS>, t)))
            return e;
    }
    return cudaSuccess;
}

// the hybrid with the production kernel (block.cu's ls_cu_decode_block) as the tail
static cudaError_t s_chain_block(const std::vector<pl_layer_t> &L, int n, const s_bufs_t &b,
                                 const s_attn_t &at, unsigned long long *sync, cudaStream_t st) {
    cudaError_t e;
    if ((e = s_head(L, 0, b, st)))
        return e;
    for (int l = 0; l < n; l++) {
        const pl_layer_t *nx = l + 1 < n ? &L[l + 1] : NULL;
        ls_cu_block_t k = {at.aout, L[l].o, NULL, L[l].g2, L[l].gu, NULL, L[l].d, NULL,
                           nx ? nx->g1 : NULL, nx ? nx->qkv : NULL, NULL, LS_CU_BF16, b.x[0], b.x[1], b.y,
                           b.qkv, b.act, sync, H, H, INTER, QKV, EPS};
        if ((e = s_rope_attn(at, l, b, st)) || (e = ls_cu_decode_block(&k, st)))
            return e;
    }
    return cudaSuccess;
}

int main(void) {
    cudaStream_t st;
    double bw = dev_begin("dev_layer", "one-token decode layers, the production chain against a persistent kernel", &st);
    int per_sm = 0;
    DEV_CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_persist<1, 2, 1, true>, PL_THREADS, 0));
    if (per_sm < 1) {
        printf("k_persist: no CTA fits an SM\n");
        return 1;
    }
    std::vector<pl_layer_t> L(LAYERS);
    for (int l = 0; l < LAYERS; l++) {
        uint64_t s = 1000 * (uint64_t)(l + 1);
        L[l].g1 = s_fill(H, s + 1, 0.5f, 1.5f);
        L[l].qkv = s_fill((size_t)QKV * H, s + 2, -0.03f, 0.03f);
        L[l].o = s_fill((size_t)H * H, s + 3, -0.03f, 0.03f);
        L[l].g2 = s_fill(H, s + 4, 0.5f, 1.5f);
        L[l].gu = s_fill((size_t)GU * H, s + 5, -0.03f, 0.03f);
        L[l].d = s_fill((size_t)H * INTER, s + 6, -0.016f, 0.016f);
    }
    pl_layer_t *dl;
    DEV_CK(cudaMalloc(&dl, LAYERS * sizeof *dl));
    DEV_CK(cudaMemcpy(dl, L.data(), LAYERS * sizeof *dl, cudaMemcpyHostToDevice));
    s_bufs_t b;
    for (float **p : {&b.x[0], &b.x[1], &b.y, &b.qkv, &b.gu})
        DEV_CK(cudaMalloc(p, (size_t)GU * sizeof(float)));
    DEV_CK(cudaMalloc(&b.h, H * sizeof(bf16)));
    DEV_CK(cudaMalloc(&b.act, INTER * sizeof(bf16)));
    DEV_CK(cudaMalloc(&b.bar, 2 * sizeof(unsigned)));
    DEV_CK(cudaMemset(b.bar, 0, 2 * sizeof(unsigned)));
    DEV_CK(cudaMalloc(&b.flags, PL_THREADS * sizeof(unsigned)));
    dev_rng_t rng{7};
    std::vector<float> x0;
    float *dx0 = dev_f32_fill(rng, H, 1.0f, x0);
    DEV_CK(cudaDeviceSynchronize());

    // one layer of each against the reference: x[0] + y after it
    std::vector<float> want = s_reference(L[0], x0);
    auto result = [&](const char *name, cudaError_t e) {
        DEV_CK(e);
        DEV_CK(cudaStreamSynchronize(st));
        std::vector<float> x(H), y(H);
        // the chain leaves x in x[0] (its second RMSNorm added o's y); the persistent kernel's
        // second RMSNorm wrote x + y to x[0] too
        DEV_CK(cudaMemcpy(x.data(), b.x[0], H * sizeof(float), cudaMemcpyDeviceToHost));
        DEV_CK(cudaMemcpy(y.data(), b.y, H * sizeof(float), cudaMemcpyDeviceToHost));
        for (int i = 0; i < H; i++)
            x[i] += y[i];
        dev_check("one layer, x + y", name, dev_nmse(x.data(), want.data(), H), 1e-5);
    };
    auto reset = [&] { DEV_CK(cudaMemcpy(b.x[0], dx0, H * sizeof(float), cudaMemcpyDeviceToDevice)); };
    // each version: its name, whether it is timed as a graph (else launch by launch), whether it
    // computes the chain (the "alone" bounds do not), and its launches over n layers
    struct version_t {
        const char *name;
        bool graph, checked;
        std::function<cudaError_t(int)> run;
    };
    const version_t vs[] = {
        {"chain", true, true, [&](int n) { return s_chain(L, n, b, st); }},
        {"chain's GEMVs alone", true, false, [&](int n) { return s_gemvs(L, n, b, st); }},
        {"rows", false, true, [&](int n) { return s_persist<0, 1, 0, false>(dl, n, b, st); }},
        {"flat", false, true, [&](int n) { return s_persist<1, 1, 0, false>(dl, n, b, st); }},
        {"flat flags", false, true, [&](int n) { return s_persist<1, 1, 1, false>(dl, n, b, st); }},
        {"flat flags pre2", false, true, [&](int n) { return s_persist<1, 2, 1, false>(dl, n, b, st); }},
        {"flat fold", false, true, [&](int n) { return s_persist<1, 1, 0, true>(dl, n, b, st); }},
        {"flat count", false, true, [&](int n) { return s_persist<1, 1, 2, false>(dl, n, b, st); }},
        {"flat count fold", false, true, [&](int n) { return s_persist<1, 1, 2, true>(dl, n, b, st); }},
        {"flat's GEMVs alone", false, false, [&](int n) { return s_persist<1, 0, 1, false, false>(dl, n, b, st); }},
    };
    for (const version_t &v : vs)
        if (v.checked) {
            reset();
            result(v.name, v.run(1));
        }

    double bytes = ((double)(QKV + H + GU) * H + (double)H * INTER) * 2;
    double floor_us = bytes / (bw * 1e3);
    printf("\n%d layers, µs a layer (the weights' floor %.1f at %.0f GB/s; %d SMs, a CTA of %d warps each)\n",
           LAYERS, floor_us, bw, ls_cu_props()->sms, PL_WARPS);
    // µs a layer of run over every layer, as a graph or launch by launch
    auto per = [&](bool graph, const std::function<cudaError_t(int)> &run) {
        return (graph ? dev_graph_us(st, [&] { return run(LAYERS); })
                      : dev_time_us(st, 1, [&](long) { return run(LAYERS); })) /
               LAYERS;
    };
    for (int round = 0; round < 2; round++)
        for (const version_t &v : vs) {
            double us = per(v.graph, v.run);
            printf("  %-26s %6.1f (%.3f x floor)\n", v.name, us, us / floor_us);
        }
    // where a layer's time goes: flat+pre, one traced launch
    {
        int G = ls_cu_props()->sms, P = 4 * LAYERS;
        unsigned long long *dtr;
        DEV_CK(cudaMalloc(&dtr, (size_t)P * G * 3 * sizeof *dtr));
        DEV_CK((s_persist<1, 1, 2, true>(dl, LAYERS, b, st, dtr)));
        DEV_CK(cudaStreamSynchronize(st));
        std::vector<unsigned long long> tr((size_t)P * G * 3);
        DEV_CK(cudaMemcpy(tr.data(), dtr, tr.size() * sizeof tr[0], cudaMemcpyDeviceToHost));
        auto at = [&](int p, int c, int k) { return (double)tr[((size_t)p * G + c) * 3 + k] * 1e-3; };
        auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
        const char *ph[] = {"qkv (norm before)", "o (q rounded before)", "gate_up (norm before)", "down (SiLU·mul before)"};
        printf("\nflat count fold traced, µs, medians over layers 1..%d: the phase's op (mean over CTAs), its GEMV from the "
               "op's end (first / mean / last CTA), the barrier from the last CTA's GEMV end to the next "
               "phase's first start\n", LAYERS - 2);
        for (int q = 0; q < 4; q++) {
            std::vector<double> op, g0, gm, g1, bar;
            for (int l = 1; l + 1 < LAYERS; l++) {
                int p = 4 * l + q;
                double o = 0, s1 = 1e30, e0 = 1e30, e1 = 0, em = 0, n0 = 1e30;
                for (int c = 0; c < G; c++) {
                    o += at(p, c, 1) - at(p, c, 0);
                    s1 = std::min(s1, at(p, c, 1));
                    e0 = std::min(e0, at(p, c, 2));
                    e1 = std::max(e1, at(p, c, 2));
                    em += at(p, c, 2);
                    n0 = std::min(n0, at(p + 1, c, 0));
                }
                op.push_back(o / G);
                g0.push_back(e0 - s1), gm.push_back(em / G - s1), g1.push_back(e1 - s1);
                bar.push_back(n0 - e1);
            }
            printf("  %-24s op %5.2f  GEMV %6.2f / %6.2f / %6.2f  barrier %5.2f\n", ph[q], med(op), med(g0),
                   med(gm), med(g1), med(bar));
        }
    }
    // the whole layer, RoPE and attention included, at 128, 4K and 16K cached positions
    DEV_CK(cudaFuncSetAttribute((const void *)k_layer_full, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)PL_FULL_SMEM));
    printf("\nthe whole layer (RoPE, the KV store and attention on 16-position pages too), µs a layer, two "
           "rounds; the floor: weights and the KV cache read\n");
    unsigned long long *sync;
    DEV_CK(cudaMalloc(&sync, sizeof *sync));
    DEV_CK(cudaMemset(sync, 0, sizeof *sync));
    for (int C : {128, 4096, 16384}) {
        s_attn_t at;
        s_attn_init(at, C, rng);
        DEV_CK(cudaDeviceSynchronize());
        std::vector<float> ref(H), got(H), y(H);
        auto out = [&](std::vector<float> &v) {
            DEV_CK(cudaStreamSynchronize(st));
            DEV_CK(cudaMemcpy(v.data(), b.x[0], H * sizeof(float), cudaMemcpyDeviceToHost));
            DEV_CK(cudaMemcpy(y.data(), b.y, H * sizeof(float), cudaMemcpyDeviceToHost));
            for (int i = 0; i < H; i++)
                v[i] += y[i];
        };
        // two layers of each against the chain's (the second reads the q,k,v and the cache row
        // the first made), then timed
        reset();
        DEV_CK(s_chain_full(L, 2, b, at, st));
        out(ref);
        const version_t ws[] = {
            {"chain", true, false, [&](int n) { return s_chain_full(L, n, b, at, st); }},
            {"persist", false, true, [&](int n) { return s_persist_full(dl, n, b, at, st); }},
            {"hybrid", true, true, [&](int n) { return s_chain_hybrid<false>(dl, L, n, b, at, st); }},
            {"hybrid+rope", true, true, [&](int n) { return s_chain_hybrid<true>(dl, L, n, b, at, st); }},
            {"block.cu", true, true, [&](int n) { return s_chain_block(L, n, b, at, sync, st); }},
            {"hybrid, block.cu's GEMV", true, true,
             [&](int n) { return s_chain_hybrid<false, true>(dl, L, n, b, at, st); }},
            {"hybrid, block.cu's RMSNorm", true, true,
             [&](int n) { return s_chain_hybrid<false, false, true>(dl, L, n, b, at, st); }},
            {"hybrid, block.cu's barrier", true, true,
             [&](int n) { return s_chain_hybrid<false, false, false, true>(dl, L, n, b, at, st); }},
            {"hybrid, block.cu's shared memory", true, true,
             [&](int n) { return s_chain_hybrid<false, false, false, false, true>(dl, L, n, b, at, st); }},
        };
        char what[64];
        snprintf(what, sizeof what, "two layers, %d cached", C);
        for (const version_t &v : ws)
            if (v.checked) {
                reset();
                DEV_CK(v.run(2));
                out(got);
                dev_check(what, v.name, dev_nmse(got.data(), ref.data(), H), 1e-4);
            }
        double fl = (bytes + (double)(C + 1) * KVH * HD * 2 * 2) / (bw * 1e3);
        printf("  %5d cached: floor %.1f\n", C, fl);
        for (int round = 0; round < 2; round++)
            for (const version_t &v : ws) {
                double us = per(v.graph, v.run);
                printf("  %5d cached: %-32s %6.1f (%.3f x)\n", C, v.name, us, us / fl);
            }
        s_attn_free(at);
    }
    return dev_end();
}
