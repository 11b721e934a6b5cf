/*  kernels/cuda/sampling.cu — ls_sampling_sample on the GPU: penalties, temperature,
    log-softmax, top-n logprobs, greedy, top-k / top-p / min-p truncation and the seeded
    exponential-race draw. CPU reference and the full specification: kernels/cpu/sampling.c
    and kernels/ops.h.

    Every kernel here starts with ls_dep_enter() and is launched with ls_cu_launch_dep
    (common.cuh), as the elementwise ones.

    Launches per call; every pass but the top-n list takes a block per (row, chunk), a row
    cut into chunks so that a batch of one row still runs on every SM (ls_cu_sample_chunks):
    1. stats: copy the chunk (a grammar mask turns the disallowed tokens' logits into -inf
       as they are copied: one coalesced word read per 32 tokens), the penalties of the
       row's ids in the chunk (repetition once per distinct token through atomicExch on a
       zeroed mark row, frequency/presence through atomic counts; the mark row is left
       zeroed), temperature, the chunk's argmax (ties to the lower id) and its sum of
       exp(l - its max) in double.
    2. finish: the row's argmax and log-sum-exp from the chunks' (the reference's double sum
       of exp(l - max), each chunk's sum scaled by exp(its max - the row's max): the same
       terms up to rounding), the chunk's logprob row, and the greedy result.
    3. only when rows ask for logprobs, a block of 1024 threads per row: the top-n list by
       repeated block arg-max over "strictly after the previous pick" in (logprob desc, id
       asc) order.
    4. only for rows with top-k or top-p: the truncation boundary by radix select, 4 passes
       (7 when a row has both). The draw is a race, which needs the SET of survivors, not
       their order: every token whose (logprob, id) comes at or before a boundary element
       in (logprob desc, id asc) order. Each logprob maps to a 32-bit order key (s_order_key:
       larger for a larger value, -0.0 and +0.0 one key as C's == and the reference's
       comparator have them), and each pass histograms the next 8-bit digit of the keys
       under the prefix chosen so far: counts for top-k, fixed-point masses for top-p;
       the next pass's blocks pick the bucket where the running count (mass), highest
       first, reaches what is left to reach. After the 4th digit the boundary is a key and
       j: of the tokens with that key, the j lowest ids survive. Top-k and top-p together,
       as the reference: a select by count gives the top-k set's mass (total), then a
       select by mass for top_p * total over the row (whose crossing comes at or before the
       top-k boundary, so the same as within the top-k set; its first pick reuses the first
       select's first histogram).
       Masses are integers, round(exp(lp - lpmax) * 2^b) with b = min(46, 63 -
       ceil(log2 V)) (a row's sum stays below 2^63), summed with integer atomics: the same
       sums in any order, so the same boundary on every run. The target is ceil(top_p *
       total) (at least 1: the top token always survives). The reference sums the masses
       in double, sequentially; the boundaries differ only where the target lies within
       the rounding of a prefix sum (V * 2^-(b+1) of the top token's mass, or double
       rounding) — tests/gpu counts such flips.
    5. draw, for the rows that sample: the race key = lp - log(-log(u)) with u =
       ls_rng_uniform(seed, step, id) over the chunk's survivors (the boundary above, the
       min-p bound against a host-computed logf(min_p)), the chunk's best (ties to the lower
       id), and the last of the row's chunks to finish takes the row's best of them.
    Tokens, logprobs and top-n lists match the reference except where float math functions
    (expf/logf, 1 ulp apart from glibc) flip a near-tie of race keys, or the fixed point a
    top-p boundary; tests/gpu counts those.

    Known limits: the select's passes read the whole row each (7 reads of it with both
    top-k and top-p); the top-n pass still takes one block a row (one SM for a batch of
    one), n reads of the row.
*/
#include <assert.h>
#include <limits.h>
#include <math.h>

#include <cub/block/block_scan.cuh>

#include "common.cuh"

enum { SMP_THREADS = 1024, SMP_STATS_THREADS = 512 };

// Chunks a row is cut into for the stats and finish passes: about four blocks an SM over the
// whole batch (a batch-1 step's row over the whole device, not one SM), chunks of at least
// 2,048 tokens, at most LS_CU_SAMPLE_MAX_CHUNKS.
int ls_cu_sample_chunks(int n_rows, int V) {
    int n_sm = ls_cu_props()->sms;
    int c = (4 * n_sm + n_rows - 1) / (n_rows > 0 ? n_rows : 1), by_len = V / 2048;
    c = c < by_len ? c : by_len;
    c = c < LS_CU_SAMPLE_MAX_CHUNKS ? c : LS_CU_SAMPLE_MAX_CHUNKS;
    return c > 1 ? c : 1;
}

__device__ __forceinline__ uint64_t s_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// ls_rng_u64 / ls_rng_uniform of kernels/cpu/sampling.c, bit for bit
__device__ __forceinline__ float s_rng_uniform(uint64_t seed, uint64_t step, uint64_t idx) {
    uint64_t r = s_mix64(s_mix64(s_mix64(seed) ^ step) + 0x9e3779b97f4a7c15ull * (idx + 1));
    return ((float)(r >> 41) + 0.5f) * 0x1p-23f;
}

__device__ int s_block_min(int v, int *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : INT_MAX;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// A row's chunk [v0, v1) of C chunks (ls_cu_sample_chunks)
__device__ __forceinline__ void s_chunk(int V, int c, int C, int *v0, int *v1) {
    int len = (V + C - 1) / C;
    *v0 = min(V, c * len);
    *v1 = min(V, *v0 + len);
}

typedef unsigned long long u64;

enum {
    SEL_BINS = 256,  // 8-bit digits
    SEL_DIGITS = 4,  // of the 32-bit order key: a select's passes
    SEL_SLOTS = 7,   // passes 0-3: the first select; 4-6: the second's (its pass 0 is the first's)
};

// Where a row's select stands before a pass: the key's leading digits chosen so far
// (prefix), what is left to reach inside that bucket (rem: a count for top-k, a mass for
// top-p) and the mass of everything ranked before the bucket (above).
struct s_sel_t {
    u64 rem, above;
    uint32_t prefix;
};

// The select's scratch (ls_cu_sample_select_bytes), per row: each pass's histogram (mass,
// cnt: SEL_SLOTS x SEL_BINS), the state each pass starts from (st: SEL_SLOTS), a select's
// last pass's counts per chunk (tie: C x SEL_BINS: the draw splits the boundary's ties by
// id with them) and the draw's count of finished chunks (done).
struct s_sel_mem_t {
    u64 *mass;
    s_sel_t *st;
    uint32_t *cnt, *tie, *done;
};

// The offsets of s_sel_mem_t's arrays (mass, st, cnt, tie, done) in the scratch; returns its
// size.
__host__ __device__ static size_t s_sel_offsets(int n_rows, int C, size_t o[5]) {
    size_t r = (size_t)n_rows, h = r * SEL_SLOTS * SEL_BINS;
    o[0] = 0;
    o[1] = o[0] + h * sizeof(u64);
    o[2] = o[1] + (r * SEL_SLOTS * sizeof(s_sel_t) + 7) / 8 * 8;
    o[3] = o[2] + h * sizeof(uint32_t);
    o[4] = o[3] + r * C * SEL_BINS * sizeof(uint32_t);
    return o[4] + r * sizeof(uint32_t);
}

__device__ static s_sel_mem_t s_sel_mem(const ls_cu_sample_args_t &a, int C) {
    size_t o[5];
    s_sel_offsets(a.n_rows, C, o);
    char *p = (char *)a.select;
    s_sel_mem_t m = {(u64 *)(p + o[0]), (s_sel_t *)(p + o[1]), (uint32_t *)(p + o[2]),
                     (uint32_t *)(p + o[3]), (uint32_t *)(p + o[4])};
    return m;
}

// Whether a row's draw is truncated, by top-k (*use_k) and/or top-p (*use_p), as the
// reference's s_truncate decides it.
__device__ __forceinline__ bool s_truncates(const ls_cu_sample_params_t &sp, int V, bool *use_k,
                                            bool *use_p) {
    *use_k = sp.top_k > 0 && sp.top_k < V;
    *use_p = sp.top_p < 1.0f;
    return sp.temperature > 0.0f && (*use_k || *use_p);
}

// 1. A block per (row, chunk): the chunk copied (the mask applied), the penalties of the
// row's ids that fall in it, temperature, and the chunk's (max, first id of it) and sum of
// exp(l - max) in double into part.
__global__ void __launch_bounds__(SMP_STATS_THREADS) k_sample_stats(ls_cu_sample_args_t a, int C) {
    ls_dep_enter();
    __shared__ double dscr[32];
    __shared__ ls_vid_t vscr[32];
    int row = blockIdx.x, c = blockIdx.y, tid = threadIdx.x, bd = blockDim.x, V = a.V, v0, v1;
    s_chunk(V, c, C, &v0, &v1);
    const ls_cu_sample_params_t sp = a.params[row];
    size_t base = (size_t)row * V;
    float *l = a.lp + base;
    int32_t *mark = a.mark + base;
    const uint32_t *mask = a.mask_index && a.mask_index[row] >= 0
                               ? a.masks + (size_t)a.mask_index[row] * (size_t)((V + 31) / 32)
                               : NULL;
    for (int v = v0 + tid; v < v1; v += bd)
        l[v] = mask && !((mask[v >> 5] >> (v & 31)) & 1u) ? -INFINITY : a.logits[base + v];
    const int32_t *prompt = NULL, *output = NULL;
    int n_prompt = 0, n_output = 0;
    if (a.prompt_indptr) {
        prompt = a.prompt_ids + a.prompt_indptr[row];
        n_prompt = a.prompt_indptr[row + 1] - a.prompt_indptr[row];
    }
    if (a.output_indptr) {
        output = a.output_ids + a.output_indptr[row];
        n_output = a.output_indptr[row + 1] - a.output_indptr[row];
    }
    __syncthreads();

    // penalties, each on the ids in this chunk (only this block touches their l and mark)
    if (sp.repetition_penalty != 1.0f) {
        float rp = sp.repetition_penalty;
        for (int i = tid; i < n_prompt + n_output; i += bd) {
            int v = i < n_prompt ? prompt[i] : output[i - n_prompt];
            if (v >= v0 && v < v1 && atomicExch(&mark[v], 1) == 0) { // first in prompt ∪ output
                float x = l[v];
                l[v] = x > 0 ? __fdiv_rn(x, rp) : __fmul_rn(x, rp);
            }
        }
        __syncthreads();
        for (int i = tid; i < n_prompt + n_output; i += bd) {
            int v = i < n_prompt ? prompt[i] : output[i - n_prompt];
            if (v >= v0 && v < v1)
                mark[v] = 0;
        }
        __syncthreads();
    }
    if (sp.frequency_penalty != 0.0f || sp.presence_penalty != 0.0f) {
        for (int i = tid; i < n_output; i += bd)
            if (output[i] >= v0 && output[i] < v1)
                atomicAdd(&mark[output[i]], 1);
        __syncthreads();
        for (int i = tid; i < n_output; i += bd) {
            int v = output[i];
            if (v < v0 || v >= v1)
                continue;
            int k = atomicExch(&mark[v], 0); // one occurrence applies it, and unmarks
            if (k)
                l[v] = __fsub_rn(l[v], __fadd_rn(__fmul_rn(sp.frequency_penalty, (float)k),
                                                 sp.presence_penalty));
        }
        __syncthreads();
    }

    // temperature, the chunk's argmax and its exp sum against its own max
    int greedy = sp.temperature <= 0.0f;
    ls_vid_t best = {-INFINITY, INT_MAX};
    for (int v = v0 + tid; v < v1; v += bd) {
        float x = l[v];
        if (!greedy) {
            x = __fdiv_rn(x, sp.temperature);
            l[v] = x;
        }
        ls_vid_t cand = {x, v};
        best = ls_vid_best(best, cand);
    }
    best = ls_block_vid_best(best, vscr);
    double sum = 0.0;
    if (best.v != -INFINITY)  // else every term is exp(-inf - -inf): left to the finish
        for (int v = v0 + tid; v < v1; v += bd)
            sum += exp((double)l[v] - (double)best.v);
    sum = ls_block_sum(sum, dscr);
    if (tid == 0)
        a.part[(size_t)row * C + c] = (ls_cu_sample_part_t){best.v, best.id, sum};
}

// 2. A block per (row, chunk): the row's argmax and log-sum-exp from its chunks' parts — the
// reference's sum of exp(l - max) over the row, as each chunk's sum times exp(its max - the
// row's max) — the chunk's logprobs l - lse, and (chunk 0) the greedy token and its logprob.
// On a row that samples, the select's histograms and the draw's count zeroed for this call.
__global__ void __launch_bounds__(SMP_STATS_THREADS) k_sample_finish(ls_cu_sample_args_t a, int C) {
    ls_dep_enter();
    __shared__ float s_lse;
    __shared__ ls_vid_t s_best;
    int row = blockIdx.x, c = blockIdx.y, tid = threadIdx.x, V = a.V, v0, v1;
    s_chunk(V, c, C, &v0, &v1);
    const ls_cu_sample_params_t sp = a.params[row];
    bool use_k, use_p;
    if (sp.temperature > 0.0f) {
        s_sel_mem_t m = s_sel_mem(a, C);
        if (c == 0 && tid == 0)
            m.done[row] = 0;
        size_t n = SEL_SLOTS * SEL_BINS, at = (size_t)row * n;
        if (s_truncates(sp, V, &use_k, &use_p))
            for (size_t i = (size_t)c * blockDim.x + tid; i < n; i += (size_t)C * blockDim.x)
                m.mass[at + i] = 0, m.cnt[at + i] = 0;
    }
    const ls_cu_sample_part_t *part = a.part + (size_t)row * C;
    if (tid < 32) {
        ls_vid_t best = {-INFINITY, INT_MAX};
        for (int k = tid; k < C; k += 32) {
            ls_vid_t cand = {part[k].max, part[k].id};
            best = ls_vid_best(best, cand);
        }
        best = ls_warp_vid_best(best);
        double sum = 0.0;
        for (int k = tid; k < C; k += 32)
            if (part[k].max != -INFINITY)
                sum += part[k].sum * exp((double)part[k].max - (double)best.v);
        sum = ls_warp_sum(sum);
        if (best.v == -INFINITY)  // all masked: the reference's exp(-inf - -inf) terms
            sum = NAN;
        if (tid == 0) {
            s_best = best;
            s_lse = __fadd_rn(best.v, (float)log(sum));
        }
    }
    __syncthreads();
    float lse = s_lse;
    float *l = a.lp + (size_t)row * V;
    for (int v = v0 + tid; v < v1; v += blockDim.x)
        l[v] = __fsub_rn(l[v], lse);
    if (c == 0 && tid == 0) { // the greedy result (and the argmax the draw falls back on)
        a.tokens[row] = s_best.id == INT_MAX ? 0 : s_best.id;
        a.logprobs[row] = __fsub_rn(s_best.v, lse);
    }
}

// 3. Rows that ask for top-n logprobs: repeated block arg-max over the finished row, each
// pick strictly after the previous one in (logprob desc, id asc) order.
__global__ void __launch_bounds__(SMP_THREADS) k_sample_top(ls_cu_sample_args_t a) {
    ls_dep_enter();
    __shared__ ls_vid_t vscr[32];
    int row = blockIdx.x, tid = threadIdx.x, bd = blockDim.x, V = a.V;
    int n = a.params[row].n_logprobs;
    const float *l = a.lp + (size_t)row * V;
    ls_vid_t prev = {INFINITY, -1};
    for (int k = 0; k < n; k++) {
        ls_vid_t b = {-INFINITY, INT_MAX};
        for (int v = tid; v < V; v += bd) {
            ls_vid_t cand = {l[v], v};
            if (k == 0 || ls_vid_before(prev, cand))
                b = ls_vid_best(b, cand);
        }
        b = ls_block_vid_best(b, vscr);
        if (b.id == INT_MAX)
            break;
        if (tid == 0) {
            a.top_ids[(size_t)row * a.max_top_n + k] = b.id;
            a.top_lps[(size_t)row * a.max_top_n + k] = b.v;
        }
        prev = b;
    }
}

// -- truncation: the radix select of the top-k / top-p boundary (launch 4) --------------------

// The order key of a logprob: larger for a larger value, one key for -0.0 and +0.0.
__device__ __forceinline__ uint32_t s_order_key(float x) {
    uint32_t b = __float_as_uint(x);
    b = b == 0x80000000u ? 0u : b;
    return b & 0x80000000u ? ~b : b | 0x80000000u;
}

// Bits of the masses' fixed point: V masses of at most 2^bits sum below 2^63, and at most
// 46, so that a mass splits into two halves below 2^23 that a warp sums in 32 bits.
__device__ static int s_mass_bits(int V) {
    int lg = 0;
    while (lg < 31 && (1 << lg) < V)
        lg++;
    return 63 - lg < 46 ? 63 - lg : 46;
}

// A logprob's mass in the fixed point: round(exp(lp - lpmax) * scale), scale = 2^bits.
__device__ __forceinline__ u64 s_mass(float lp, float lpmax, double scale) {
    double e = exp((double)lp - (double)lpmax);
    return e > 0.0 ? __double2ull_rn(e * scale) : 0ull;
}

// Adds one element of mass w to bin b of the block's histogram (b < 0: nothing), the lanes of
// a warp with the same bin summed first: a pass puts most of a row into a few bins, where
// one shared atomic a lane would serialize. Every lane of the warp calls it.
__device__ __forceinline__ void s_hist_add(uint32_t *cnt, u64 *mass, int b, u64 w) {
    unsigned act = __ballot_sync(0xffffffffu, b >= 0);
    if (b < 0)
        return;
    unsigned peers = __match_any_sync(act, b);
    unsigned hi = __reduce_add_sync(peers, (unsigned)(w >> 23)),
             lo = __reduce_add_sync(peers, (unsigned)w & 0x7fffffu);
    if ((int)(threadIdx.x & 31) == __ffs(peers) - 1) {
        atomicAdd(&cnt[b], (uint32_t)__popc(peers));
        u64 s = ((u64)hi << 23) + lo;
        if (s)
            atomicAdd(&mass[b], s);
    }
}

// Moves st into the bucket of a histogram (cnt, mass: the SEL_BINS bins of the elements under
// st's prefix) where the running count (by_mass: mass), highest bin first, reaches st.rem;
// *n and *w get that bin's count and mass. One warp; every lane returns the same. Integers
// only: every block that picks from the same histogram picks the same bucket.
__device__ s_sel_t s_pick(const uint32_t *cnt, const u64 *mass, s_sel_t st, bool by_mass,
                          u64 *n, u64 *w) {
    int lane = threadIdx.x & 31, hi = SEL_BINS - 1 - 8 * lane; // this lane's bins: hi .. hi-7
    u64 sc = 0, sm = 0;
    for (int i = 0; i < 8; i++)
        sc += cnt[hi - i], sm += mass[hi - i];
    u64 ic = sc, im = sm; // inclusive sums over the lanes, highest bins first
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        u64 c = __shfl_up_sync(0xffffffffu, ic, o), m = __shfl_up_sync(0xffffffffu, im, o);
        if (lane >= o)
            ic += c, im += m;
    }
    unsigned hit = __ballot_sync(0xffffffffu, (by_mass ? im : ic) >= st.rem);
    // none: a row short of what it should hold (NaN logprobs): the lowest bin, no harm
    int src = hit ? __ffs(hit) - 1 : 31, d = 0;
    u64 ac = ic - sc, am = im - sm, bn = 0, bm = 0;
    if (lane == src)
        for (int i = 0; i < 8; i++) {
            d = hi - i;
            bn = cnt[d], bm = mass[d];
            if ((by_mass ? am + bm : ac + bn) >= st.rem)
                break;
            ac += bn, am += bm;
        }
    d = __shfl_sync(0xffffffffu, d, src);
    ac = __shfl_sync(0xffffffffu, ac, src);
    am = __shfl_sync(0xffffffffu, am, src);
    *n = __shfl_sync(0xffffffffu, bn, src);
    *w = __shfl_sync(0xffffffffu, bm, src);
    st.prefix = st.prefix << 8 | (uint32_t)d;
    st.rem -= by_mass ? am : ac;
    st.above += am;
    return st;
}

// The top-p target in the fixed point: ceil(top_p * total), at least 1 (the top token always
// survives) and at most total.
__device__ __forceinline__ u64 s_target(float top_p, u64 total) {
    double t = ceil((double)top_p * (double)total);
    return !(t >= 1.0) ? 1ull : t >= (double)total ? total : (u64)t;
}

// Row row's pass (slot) t: its index among the rows' slots (its state in m.st), and its
// histogram's counts and masses
__device__ __forceinline__ size_t s_slot(int row, int t) { return (size_t)row * SEL_SLOTS + t; }
__device__ __forceinline__ uint32_t *s_hc(const s_sel_mem_t &m, int row, int t) {
    return m.cnt + s_slot(row, t) * SEL_BINS;
}
__device__ __forceinline__ u64 *s_hm(const s_sel_mem_t &m, int row, int t) {
    return m.mass + s_slot(row, t) * SEL_BINS;
}

// A select's end, from the state its last pass started from (slot t): the boundary's key
// (its prefix) and in rem how many of the elements of that key survive, the lowest ids
// (a count; by_mass: ceil(what is left of the mass / each one's mass)); *w is the mass of
// one. One warp.
__device__ s_sel_t s_sel_end(const s_sel_mem_t &m, int row, int t, bool by_mass, u64 *w) {
    u64 n, bw;
    s_sel_t st = s_pick(s_hc(m, row, t), s_hm(m, row, t), m.st[s_slot(row, t)],
                        by_mass, &n, &bw);
    *w = n ? bw / n : 0; // the elements of one key have one mass
    if (by_mass)
        st.rem = *w ? (st.rem + *w - 1) / *w : n;
    return st;
}

// The state pass t (1 .. SEL_SLOTS-1) of a row starts from: the pick on the histogram of the
// pass before it. The first select (passes 0-3) goes by count under top-k, else by mass,
// toward ceil(top_p * the row's mass); the second (4-6, rows with both) by mass toward
// ceil(top_p * the top-k set's mass), its first pick on pass 0's histogram (all of the row,
// as its own pass 0 would be). One warp.
__device__ s_sel_t s_sel_state(const s_sel_mem_t &m, int row, int t,
                               const ls_cu_sample_params_t &sp, bool use_k) {
    u64 n, w;
    if (t != 1 && t != SEL_DIGITS)
        return s_pick(s_hc(m, row, t - 1), s_hm(m, row, t - 1), m.st[s_slot(row, t - 1)],
                      t > SEL_DIGITS || !use_k, &n, &w);
    s_sel_t st = {0, 0, 0};
    if (t == SEL_DIGITS) { // the top-k set's mass: everything above the boundary, and its j ties
        s_sel_t k = s_sel_end(m, row, SEL_DIGITS - 1, false, &w);
        st.rem = s_target(sp.top_p, k.above + k.rem * w);
    } else if (use_k) {
        st.rem = (u64)sp.top_k;
    } else {
        const u64 *hm = s_hm(m, row, 0);
        u64 total = 0;
        for (int b = threadIdx.x & 31; b < SEL_BINS; b += 32)
            total += hm[b];
        st.rem = s_target(sp.top_p, ls_warp_sum(total));
    }
    return s_pick(s_hc(m, row, 0), s_hm(m, row, 0), st, t == SEL_DIGITS || !use_k, &n, &w);
}

// 4. A block per (row, chunk), pass t of the select (rows with top-k or top-p; passes 4-6
// only rows with both): the state from the pass before (s_sel_state; the chunk-0 block
// stores it for the next pass), then the histogram of the next digit of the order key over
// the chunk's elements under the state's prefix — counts, and masses where top-p needs them
// — added into the row's with integer atomics. A select's last pass also keeps the chunk's
// own counts.
__global__ void __launch_bounds__(SMP_STATS_THREADS) k_sample_select(ls_cu_sample_args_t a, int C,
                                                                     int t) {
    ls_dep_enter();
    __shared__ uint32_t hc[SEL_BINS];
    __shared__ u64 hm[SEL_BINS];
    __shared__ s_sel_t s_st;
    int row = blockIdx.x, c = blockIdx.y, tid = threadIdx.x, bd = blockDim.x, V = a.V, v0, v1;
    const ls_cu_sample_params_t sp = a.params[row];
    bool use_k, use_p;
    if (!s_truncates(sp, V, &use_k, &use_p) || (t >= SEL_DIGITS && !(use_k && use_p)))
        return;
    s_sel_mem_t m = s_sel_mem(a, C);
    if (tid < 32) {
        s_sel_t st = {0, 0, 0};
        if (t > 0)
            st = s_sel_state(m, row, t, sp, use_k);
        if (tid == 0) {
            s_st = st;
            if (c == 0)
                m.st[s_slot(row, t)] = st;
        }
    }
    for (int b = tid; b < SEL_BINS; b += bd)
        hc[b] = 0, hm[b] = 0;
    __syncthreads();
    const s_sel_t st = s_st;
    int p = t < SEL_DIGITS ? t : t - (SEL_DIGITS - 1), lo = 8 * (SEL_DIGITS - 1 - p);
    const float *l = a.lp + (size_t)row * V;
    float lpmax = l[a.tokens[row]]; // the argmax, from finish
    double scale = ldexp(1.0, s_mass_bits(V));
    s_chunk(V, c, C, &v0, &v1);
    for (int b0 = v0; b0 < v1; b0 += bd) { // the same trips for every thread (s_hist_add)
        int v = b0 + tid, bin = -1;
        u64 w = 0;
        if (v < v1) {
            float x = l[v];
            uint32_t k = s_order_key(x);
            if (p == 0 || k >> (lo + 8) == st.prefix) {
                bin = (int)(k >> lo & (SEL_BINS - 1));
                if (use_p)
                    w = s_mass(x, lpmax, scale);
            }
        }
        s_hist_add(hc, hm, bin, w);
    }
    __syncthreads();
    uint32_t *gc = s_hc(m, row, t);
    u64 *gm = s_hm(m, row, t);
    for (int b = tid; b < SEL_BINS; b += bd) {
        if (hc[b])
            atomicAdd(&gc[b], hc[b]);
        if (hm[b])
            atomicAdd(&gm[b], hm[b]);
        if (p == SEL_DIGITS - 1)
            m.tie[((size_t)row * C + c) * SEL_BINS + b] = hc[b];
    }
}

// 5. A block per (row, chunk) of the rows that sample: the race key = lp - log(-log(u)), u =
// ls_rng_uniform(seed, step, id), over the chunk's survivors — at or before the select's
// boundary, at or above the min-p bound —, the chunk's best (ties to the lower id) into
// part, and the last of the row's chunks to finish takes the best of the row's (an
// order-free reduction: the same token whichever block is last).
__global__ void __launch_bounds__(SMP_STATS_THREADS) k_sample_draw(ls_cu_sample_args_t a, int C) {
    ls_dep_enter();
    typedef cub::BlockScan<int, SMP_STATS_THREADS> scan_t;
    __shared__ typename scan_t::TempStorage scan_tmp;
    __shared__ ls_vid_t vscr[32];
    __shared__ uint32_t s_key;
    __shared__ u64 s_need, s_here;
    __shared__ int s_lim, s_last;
    int row = blockIdx.x, c = blockIdx.y, tid = threadIdx.x, bd = blockDim.x, V = a.V, v0, v1;
    const ls_cu_sample_params_t sp = a.params[row];
    if (sp.temperature <= 0.0f)
        return;
    s_chunk(V, c, C, &v0, &v1);
    const float *l = a.lp + (size_t)row * V;
    int argmax = a.tokens[row]; // from finish; the last block overwrites it after every read
    float lpmax = l[argmax];
    s_sel_mem_t m = s_sel_mem(a, C);
    bool use_k, use_p, trunc = s_truncates(sp, V, &use_k, &use_p);

    // the boundary: keys above key survive, and of key the need lowest ids of this chunk
    // (the row's j lowest, less those in the chunks before it)
    uint32_t key = 0;
    int lim = INT_MAX;
    if (trunc) {
        if (tid < 32) {
            u64 w, before = 0;
            s_sel_t e = s_sel_end(m, row, use_k && use_p ? SEL_SLOTS - 1 : SEL_DIGITS - 1,
                                  use_p, &w);
            int d = (int)(e.prefix & (SEL_BINS - 1));
            for (int k = tid; k < c; k += 32)
                before += m.tie[((size_t)row * C + k) * SEL_BINS + d];
            before = ls_warp_sum(before);
            if (tid == 0) {
                s_key = e.prefix;
                s_need = e.rem > before ? e.rem - before : 0;
                s_here = m.tie[((size_t)row * C + c) * SEL_BINS + d];
                s_lim = INT_MAX;
            }
        }
        __syncthreads();
        key = s_key;
        u64 need = s_need;
        if (need == 0)
            lim = -1;
        else if (need < s_here) { // the need-th id of key in the chunk
            int seen = 0;
            for (int b0 = v0; b0 < v1 && seen < (int)need; b0 += bd) {
                int v = b0 + tid, f = v < v1 && s_order_key(l[v]) == key, before_me, n;
                scan_t(scan_tmp).ExclusiveSum(f, before_me, n);
                if (f && seen + before_me + 1 == (int)need)
                    s_lim = v;
                seen += n;
                __syncthreads(); // scan_tmp again
            }
            __syncthreads();
            lim = s_lim;
        }
    }

    float min_l = sp.min_p > 0.0f ? __fadd_rn(lpmax, sp.log_min_p) : -INFINITY;
    ls_vid_t best = {-INFINITY, INT_MAX};
    for (int v = v0 + tid; v < v1; v += bd) {
        float lv = l[v];
        if (lv < min_l || lv == -INFINITY)
            continue;
        if (trunc) {
            uint32_t k = s_order_key(lv);
            if (k < key || (k == key && v > lim))
                continue;
        }
        float e = -logf(s_rng_uniform(sp.seed, sp.step, (uint64_t)v));
        ls_vid_t cand = {__fsub_rn(lv, logf(e)), v};
        best = ls_vid_best(best, cand);
    }
    best = ls_block_vid_best(best, vscr);
    ls_cu_sample_part_t *part = a.part + (size_t)row * C;
    if (tid == 0) {
        part[c].max = best.v;
        part[c].id = best.id;
        __threadfence(); // the part before the count that lets the last block read it
        s_last = atomicAdd(&m.done[row], 1u) == (unsigned)C - 1;
    }
    __syncthreads();
    if (!s_last || tid >= 32)
        return;
    ls_vid_t b = {-INFINITY, INT_MAX};
    for (int k = tid; k < C; k += 32) {
        ls_vid_t cand = {__ldcg(&part[k].max), __ldcg(&part[k].id)};
        b = ls_vid_best(b, cand);
    }
    b = ls_warp_vid_best(b);
    if (tid == 0) {
        int chosen = b.id == INT_MAX ? argmax : b.id;
        a.tokens[row] = chosen;
        a.logprobs[row] = l[chosen];
    }
}

size_t ls_cu_sample_select_bytes(int n_rows, int V) {
    size_t o[5];
    return s_sel_offsets(n_rows, ls_cu_sample_chunks(n_rows, V), o);
}

cudaError_t ls_cu_sample(const ls_cu_sample_args_t *a, cudaStream_t stream) {
    assert((size_t)a->n_rows * a->V < INT_MAX);
    if (a->n_rows == 0)
        return cudaSuccess;
    int C = ls_cu_sample_chunks(a->n_rows, a->V);
    dim3 grid((unsigned)a->n_rows, (unsigned)C);
    ls_cu_launch_dep(k_sample_stats, grid, dim3(SMP_STATS_THREADS), 0, stream, *a, C);
    ls_cu_launch_dep(k_sample_finish, grid, dim3(SMP_STATS_THREADS), 0, stream, *a, C);
    if (a->top_ids)
        ls_cu_launch_dep(k_sample_top, dim3(a->n_rows), dim3(SMP_THREADS), 0, stream, *a);
    int passes = a->n_top_k_and_p ? SEL_SLOTS : a->n_truncated ? SEL_DIGITS : 0;
    for (int t = 0; t < passes; t++)
        ls_cu_launch_dep(k_sample_select, grid, dim3(SMP_STATS_THREADS), 0, stream, *a, C, t);
    if (a->n_sampled)
        ls_cu_launch_dep(k_sample_draw, grid, dim3(SMP_STATS_THREADS), 0, stream, *a, C);
    LS_CU_CHECK_LAUNCH();
}
