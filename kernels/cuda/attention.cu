/*  kernels/cuda/attention.cu — causal paged attention over the KV cache (prefill chunks
    on a cached prefix and decode alike). CPU reference: kernels/cpu/attention.c.

    Two plans. Decode-shaped (ls_cu_attention): every query token is an item of its own
    that walks its prefix — decodes, and the tokens of short chunks. Prefill chunks
    (ls_cu_attention_prefill, for the sequences ls_cu_attention_prefill_pick picks; the
    CUDA backend splits a step between the two) take query tiles instead, so
    that each K/V tile read serves 128 query rows: k_attention_prefill (FlashAttention-2's
    plan on mma.sync; bf16 caches, head_dim 64 and 128; q and p rounded to bf16 there) and,
    on sm_90 for head_dim 128, the same plan on warpgroup MMA (k_attention_prefill_wg),
    near the end of this file.

    Decode reads every K/V row of its context once for a few flops per byte: it is bound
    by memory bandwidth, so the kernels are built to keep many bytes in flight and to spend
    few instructions per key. Three kernels, one chosen per call by ls_cu_attention:

    tc (k_attention_tc, default for bf16 caches with head_dim 64 or 128 and block_size % 8
    == 0): scores and p.v on the tensor cores (mma.sync), still fp32-exact: q and p are
    split into three bf16 pieces (24 bits, as many as fp32 holds; see the kernel), K and V
    are bf16 already, so every product is exact and sums stay in fp32. Measured NMSE vs the
    CPU reference 1e-14 .. 2e-12 (the larger values where long contexts make the output a
    small difference of large sums), the same as the FFMA kernels. ~24 instructions per
    (key, kv head) against ~88 for v2: at 64 x 1024 it runs at 96% of copy bandwidth.
    v2 (k_attention_v2, f32/f16 caches and other head_dims, 16-byte rows): the same plan on
    FFMA: L lanes (8, 16 or 32; a lane holds at most two 16-byte chunks of a row) share a
    key, the warp takes 32/L keys per step; scores summed over the L lanes by shuffles.
    v1 (k_attention_v1, the first kernel): one CTA of 4 warps per (token, kv head),
    each warp walking keys one dependent load at a time. It remains for rows or cache
    pointers not 16-byte aligned (e.g. bf16 with head_dim % 8 != 0). The dev bench
    (kernels/cuda/dev/dev_attention.cu) runs all three on the same shapes.

    Common to tc and v2:
    - work item: (query token, kv head, pass of up to GC = 4 query heads of that kv head's
      GQA group): each K/V row read serves the pass's heads. A CTA of W warps (1..12) takes
      an item, or — when the items are too few to fill the GPU (long contexts, few
      sequences; sm_90) — a thread-block cluster of cs CTAs (2..8) takes it and each
      CTA a contiguous 1/cs of its pages;
    - a warp takes the CTA's steps (8 keys for tc, 32/L for v2) round-robin; each lane
      copies its chunks of the step's K and V rows with cp.async into the warp's ring in
      shared memory (tc 4 stages of 4 KB, v2 8 of up to 2 KB), 3 (7) steps ahead of the
      one it computes, with no barrier in the loop; block-table entries are read one step
      further ahead still;
    - online softmax in base 2 (q pre-scaled by scale*log2(e), p = ex2.approx(s - m)), one
      running max per head for the whole warp, so the rescale branch is warp-uniform;
    - partial states (m, l, acc) merge in fixed orders: a warp's lanes by xor butterflies,
      the warps of a CTA through shared memory in warp order, the CTAs of a cluster
      through distributed shared memory in rank order. Results are the same bits on every
      run, whatever the timing;
    - plan (s_launch): one wave holds 12 warps per SM (<= 168 registers, 16 KB of ring
      each). Many items: one CTA each, W = as many warps as keep the grid in one wave, but at
      least AT_MINW = 3 (then in several waves: one warp an item left a third of the slots
      empty), >= 4 steps each. Few items on a short context (each warp of one CTA at most
      AT_SHORT steps): one CTA each, two steps a warp. Few items on a longer one: cs and W
      chosen to hold the most warps with every cluster of the grid resident at once, as
      cudaOccupancyMaxActiveClusters counts them (a cluster sits in one GPC; on the H200
      measured here 16-CTA clusters of 12-warp CTAs do not all fit 8 at a time, and 4-CTA
      clusters for 32 items ran in two waves before this check), and no more CTAs than SMs
      (where two shared an SM, the time depended on what ran before). No scratch memory, no
      synchronization: launches can be captured in graphs.
      Launched with programmatic dependent launch (common.cuh ls_cu_launch_dep's attribute).

    Known limits: short decode contexts stay latency-bound (64 x 128 keys: 17 us on an
    H200, 48% of copy bandwidth, against 96% at 64 x 1024): each CTA has ~5 steps per
    warp behind a chain of dependent loads (positions -> block table -> K/V), not profiled
    yet. Long contexts with few sequences reach ~78% (clusters of <= 8 CTAs per (token, kv
    head) leave part of the GPU idle; a split over more CTAs would need a merge through
    memory). Tokens given to these kernels in a prefill (chunks the pick leaves here, or
    caches the prefill kernel does not take) re-read their whole
    prefix each (from L2 for tokens of one sequence), and tc uses 12 of the 16 MMA rows for
    one token's heads. tc only for bf16 caches (f16 pieces would lose bits to the f16
    exponent range) and head_dim 64/128 (register budget); groups not a multiple of 4 waste
    head slots of the last pass (group 1 uses 1 of 4), groups above 4 read K/V once per
    pass; block sizes that are not a power of two pay an integer division per step; on
    sm_80 there are no clusters, so a long context with few sequences runs on few SMs.
    The prefill kernel's own limits are at k_attention_prefill.
*/
#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include <cooperative_groups.h>

#include "common.cuh"
#include "wgmma.cuh"

namespace cg = cooperative_groups;

// -- v1 ------------------------------------------------------------------------------------

enum { ATT_WARPS = 4, ATT_GC = 8 }; // warps per block, query heads per pass

// Where every attention kernel writes its rows: fp32, or rounded to a 16-bit dtype (as
// ls_cu_convert rounds) when the o projection's matmul is all that reads them, so that it
// needs no conversion pass between attention and its GEMM.
struct s_out_t {
    void *p;
    int dt; // ls_cu_dtype_t: LS_CU_F32, LS_CU_BF16 or LS_CU_F16
};
__device__ __forceinline__ void s_out_put(s_out_t o, size_t i, float v) {
    if (o.dt == LS_CU_BF16)
        ((__nv_bfloat16 *)o.p)[i] = ls_from_f<__nv_bfloat16>(v);
    else if (o.dt == LS_CU_F16)
        ((__half *)o.p)[i] = ls_from_f<__half>(v);
    else
        ((float *)o.p)[i] = v;
}
// elements i (even) and i + 1
__device__ __forceinline__ void s_out_put2(s_out_t o, size_t i, float x, float y) {
    if (o.dt == LS_CU_BF16)
        *(uint32_t *)((__nv_bfloat16 *)o.p + i) = ls_pack2<__nv_bfloat16>(x, y);
    else if (o.dt == LS_CU_F16)
        *(uint32_t *)((__half *)o.p + i) = ls_pack2<__half>(x, y);
    else
        *(float2 *)((float *)o.p + i) = make_float2(x, y);
}

// out is (T, n_heads*head_dim), q is (T, row_stride),
// k_cache, v_cache are blocks of (block_size, n_kv_heads*head_dim), block_stride elements
// apart; E = elements per lane (head_dim <= 32E)
template <typename TC, int E>
__global__ void __launch_bounds__(ATT_WARPS * 32)
k_attention_v1(s_out_t out, const float *q, const TC *k_cache, const TC *v_cache,
            const int32_t *tok_seq, const int32_t *positions, const int32_t *block_tables,
            int max_blocks, int n_heads, int n_kv_heads, int head_dim, int block_size,
            size_t block_stride, int row_stride, float scale) {
    extern __shared__ float smem[]; // (ATT_WARPS, ATT_GC, head_dim + 2): acc, max, sum
    int t = blockIdx.x, kvh = blockIdx.y;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int group = n_heads / n_kv_heads;
    int n_keys = positions[t] + 1; // causal: KV indices 0..p
    const int32_t *table = block_tables + (size_t)tok_seq[t] * max_blocks;
    size_t kv_dim = (size_t)n_kv_heads * head_dim;
    size_t kv_off = (size_t)kvh * head_dim;
    int hs = head_dim + 2;

    for (int g0 = 0; g0 < group; g0 += ATT_GC) {
        int gn = min(ATT_GC, group - g0);
        float qr[ATT_GC][E], acc[ATT_GC][E], m[ATT_GC], l[ATT_GC];
#pragma unroll
        for (int g = 0; g < ATT_GC; g++) {
            const float *qh = q + (size_t)t * row_stride + (size_t)(kvh * group + g0 + g) * head_dim;
#pragma unroll
            for (int e = 0; e < E; e++) {
                int d = lane + 32 * e;
                qr[g][e] = (g < gn && d < head_dim) ? qh[d] : 0.0f;
                acc[g][e] = 0.0f;
            }
            m[g] = -INFINITY;
            l[g] = 0.0f;
        }
        for (int j = warp; j < n_keys; j += ATT_WARPS) {
            size_t row = (size_t)table[j / block_size] * block_stride +
                         (size_t)(j % block_size) * kv_dim + kv_off;
            const TC *kr = k_cache + row;
            const TC *vr = v_cache + row;
            float kv[E], vv[E];
#pragma unroll
            for (int e = 0; e < E; e++) {
                int d = lane + 32 * e;
                kv[e] = d < head_dim ? ls_to_f(kr[d]) : 0.0f;
                vv[e] = d < head_dim ? ls_to_f(vr[d]) : 0.0f;
            }
#pragma unroll
            for (int g = 0; g < ATT_GC; g++) {
                if (g >= gn)
                    break;
                float part = 0.0f;
#pragma unroll
                for (int e = 0; e < E; e++)
                    part += qr[g][e] * kv[e];
                float score = ls_warp_sum(part) * scale;
                if (score > m[g]) { // rescale what was summed under the old max
                    float c = expf(m[g] - score);
                    l[g] *= c;
#pragma unroll
                    for (int e = 0; e < E; e++)
                        acc[g][e] *= c;
                    m[g] = score;
                }
                float p = expf(score - m[g]);
                l[g] += p;
#pragma unroll
                for (int e = 0; e < E; e++)
                    acc[g][e] += p * vv[e];
            }
        }
#pragma unroll
        for (int g = 0; g < ATT_GC; g++) {
            if (g >= gn)
                break;
            float *s = smem + (size_t)(warp * ATT_GC + g) * hs;
#pragma unroll
            for (int e = 0; e < E; e++) {
                int d = lane + 32 * e;
                if (d < head_dim)
                    s[d] = acc[g][e];
            }
            if (lane == 0) {
                s[head_dim] = m[g];
                s[head_dim + 1] = l[g];
            }
        }
        __syncthreads();
        // merge the warps' partial softmax states; a warp that saw no key has max -inf
        // and contributes exp(-inf) = 0
        for (int idx = threadIdx.x; idx < gn * head_dim; idx += blockDim.x) {
            int g = idx / head_dim, d = idx % head_dim;
            float M = -INFINITY;
            for (int w = 0; w < ATT_WARPS; w++)
                M = fmaxf(M, smem[(size_t)(w * ATT_GC + g) * hs + head_dim]);
            float L = 0.0f, O = 0.0f;
            for (int w = 0; w < ATT_WARPS; w++) {
                const float *s = smem + (size_t)(w * ATT_GC + g) * hs;
                float c = s[head_dim] == -INFINITY ? 0.0f : expf(s[head_dim] - M);
                L += s[head_dim + 1] * c;
                O += s[d] * c;
            }
            s_out_put(out, (size_t)t * n_heads * head_dim + (size_t)(kvh * group + g0 + g) * head_dim + d,
                      O / L);
        }
        __syncthreads();
    }
}


// -- v2 ------------------------------------------------------------------------------------

enum {
    AT_NST = 8,     // stages of a warp's cp.async ring, one step of keys each
    AT_GC = 4,      // query heads per work item, at most
    AT_MAXW = 12,   // warps per SM in one wave (and per CTA, at most): 12 x 32 x 168 regs
    AT_MINSTEP = 4, // a warp gets at least this many steps of keys, else the CTA gets fewer
    AT_SHORT = 4,   // few items: one CTA an item if its warps then take at most this many steps
    AT_MINW = 3,    // warps a CTA at least, where its keys allow, however many items there are
};


// 2^x; relative error ~2^-22, exactly 0 for x = -inf
__device__ __forceinline__ float s_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// 16 bytes of cache elements widened to fp32 (exact)
__device__ __forceinline__ void s_widen(uint4 u, float o[8], const __nv_bfloat16 *) {
    uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) { // element 2i is the low half (little-endian)
        o[2 * i] = __uint_as_float(w[i] << 16);
        o[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}
__device__ __forceinline__ void s_widen(uint4 u, float o[8], const __half *) {
    const __half2 *h = reinterpret_cast<const __half2 *>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __half22float2(h[i]);
        o[2 * i] = f.x, o[2 * i + 1] = f.y;
    }
}
__device__ __forceinline__ void s_widen(uint4 u, float o[4], const float *) {
    o[0] = __uint_as_float(u.x), o[1] = __uint_as_float(u.y);
    o[2] = __uint_as_float(u.z), o[3] = __uint_as_float(u.w);
}


// The end of both kernels: W warp states (GC, head_dim) acc, then m (GC), l (GC), each at
// the start of its warp's ring (wst floats apart), merged in warp order into the CTA's
// state; a warp that saw no key has max -inf and weight 0. cs == 1: that is the output.
// Else the CTA's state goes after the rings, and the cluster's CTAs merge theirs in rank
// order over distributed shared memory, each CTA writing 1/cs of the output. Every thread
// of every CTA of the cluster calls this (it holds barriers).
template <int GC>
__device__ __forceinline__ void s_merge(s_out_t out, const uint4 *s_sm, int W, int wst, int t,
                                        int kvh, int group, int g0, int gn, int n_heads,
                                        int head_dim, int rank, int cs) {
    const int sd = GC * head_dim; // offset of m in a state
    const float *ws0 = (const float *)s_sm;
    float *cst = (float *)(s_sm + (size_t)W * wst / 4);
    const size_t orow = (size_t)t * n_heads * head_dim + (size_t)(kvh * group + g0) * head_dim;
    for (int idx = threadIdx.x; idx < gn * head_dim; idx += blockDim.x) {
        int g = idx / head_dim;
        float M = -INFINITY;
        for (int w = 0; w < W; w++)
            M = fmaxf(M, ws0[w * wst + sd + g]);
        float Ls = 0.0f, O = 0.0f;
        for (int w = 0; w < W; w++) {
            const float *s = ws0 + w * wst;
            float c = s[sd + g] == -INFINITY ? 0.0f : s_ex2(s[sd + g] - M);
            Ls += s[sd + GC + g] * c;
            O += s[idx] * c;
        }
        if (cs == 1) {
            s_out_put(out, orow + idx, O / Ls);
        } else {
            cst[idx] = O;
            if (idx % head_dim == 0)
                cst[sd + g] = M, cst[sd + GC + g] = Ls;
        }
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (cs > 1) {
        cg::cluster_group cl = cg::this_cluster();
        cl.sync(); // every CTA's state written
        for (int idx = rank * blockDim.x + threadIdx.x; idx < gn * head_dim;
             idx += cs * blockDim.x) {
            int g = idx / head_dim;
            float M = -INFINITY;
            for (int r = 0; r < cs; r++)
                M = fmaxf(M, cl.map_shared_rank(cst, r)[sd + g]);
            float Ls = 0.0f, O = 0.0f;
            for (int r = 0; r < cs; r++) {
                const float *s = cl.map_shared_rank(cst, r);
                float c = s[sd + g] == -INFINITY ? 0.0f : s_ex2(s[sd + g] - M);
                Ls += s[sd + GC + g] * c;
                O += s[idx] * c;
            }
            s_out_put(out, orow + idx, O / Ls);
        }
        cl.sync(); // no CTA leaves (its shared memory) while another still reads it
    }
#endif
}

// Starts a decode kernel's ring around its wait for the kernel before it (ls_dep_enter):
// before it, the steps whose last key lies before the first key this step writes for token
// t's sequence, which earlier steps wrote (ls_ring_open); after it, the rest of the first
// steps (ls_ring_fill). Warp warp of W takes steps of kps keys from k0 (warp, warp + W, ...),
// the CTA's keys ending at k1. That first key is t's position where t is the first token of
// its sequence in the launch — a decode always: a sequence's tokens are contiguous and a
// launch's run of them starts at a sequence (the backend's q_indptr and its runs between
// prefill sequences) — and otherwise 0: nothing early for a chunk's later tokens.
template <int NST, typename P, typename I>
__device__ __forceinline__ void s_ring_start(ls_ring_t<NST> &r, int nw, P page_of, I issue,
                                             const int32_t *tok_seq, const int32_t *positions,
                                             int t, int k0, int k1, int warp, int W, int kps) {
    const int own = t > 0 && tok_seq[t - 1] == tok_seq[t] ? 0 : positions[t];
    ls_ring_open(r, nw, page_of, issue,
                 [&](int i) { return min(k0 + (warp + i * W) * kps + kps - 1, k1 - 1) < own; });
    ls_dep_enter(); // s_launch: programmatic dependent launch
    ls_ring_fill(r, issue);
}

// out is (T, n_heads*head_dim), q is (T, row_stride), k_cache, v_cache are blocks of
// (block_size, n_kv_heads*head_dim), block_stride elements apart, with head_dim*sizeof(TC) %
// 16 == 0. Grid (T*n_pass*cs, n_kv_heads),
// clusters of (cs, 1, 1); blockDim W*32. L lanes per key, NC 16-byte chunks per lane and
// row (chunk c = li + L*k), GC query heads per pass. Dynamic shared memory: W rings of
// (AT_NST, 2, NC, 32) 16-byte chunks, then the CTA's merged state (GC, head_dim + 2).
template <typename TC, int L, int NC, int GC>
__global__ void __launch_bounds__(AT_MAXW * 32, 1)
k_attention_v2(s_out_t out, const float *q, const void *kc_, const void *vc_,
               const int32_t *tok_seq, const int32_t *positions, const int32_t *block_tables,
               int max_blocks, int n_heads, int n_kv_heads, int head_dim, int block_size,
               size_t block_stride, int bs_shift, int row_stride, float qscale, int n_pass, int cs) {
    constexpr int VE = 16 / (int)sizeof(TC), KPS = 32 / L, RING = AT_NST * 2 * NC * 32;
    extern __shared__ uint4 s_sm[];
    const TC *k_cache = (const TC *)kc_, *v_cache = (const TC *)vc_;
    const int W = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int grp = lane / L, li = lane % L; // key of the step, lane within the key
    const int rank = blockIdx.x % cs, item = blockIdx.x / cs;
    const int t = item / n_pass, g0 = item % n_pass * GC, kvh = blockIdx.y;
    const int group = n_heads / n_kv_heads, gn = min(GC, group - g0);
    const int nch = head_dim / VE; // 16-byte chunks per row
    const int n_keys = positions[t] + 1; // causal: KV indices 0..p
    const int32_t *table = block_tables + (size_t)tok_seq[t] * max_blocks;
    const size_t kv_dim = (size_t)n_kv_heads * head_dim, kv_off = (size_t)kvh * head_dim;
    // this CTA's keys k0..k1-1: whole pages, the token's pages split evenly over the cluster
    const int n_pages = (n_keys + block_size - 1) / block_size;
    const int pa = (int)((long long)rank * n_pages / cs);
    const int pb = (int)((long long)(rank + 1) * n_pages / cs);
    const int k0 = pa * block_size, k1 = min(pb * block_size, n_keys);
    const int n_steps = k1 > k0 ? (k1 - k0 + KPS - 1) / KPS : 0;
    const int nw = warp < n_steps ? (n_steps - warp + W - 1) / W : 0; // steps of this warp
    uint4 *ring = s_sm + (size_t)warp * RING;

    // key of this lane at the warp's step i (the CTA's last key past k1: its score is
    // masked, the copy stays inside the sequence)
    auto key_of = [&](int i) { return min(k0 + (warp + i * W) * KPS + grp, k1 - 1); };
    auto page_of = [&](int i) {
        int j = key_of(i);
        return __ldg(table + (bs_shift >= 0 ? j >> bs_shift : j / block_size));
    };
    // copies the lane's chunks of K and V of step i into stage i % AT_NST; one commit
    // group per step, empty past the warp's last step, so that the wait count is fixed
    auto issue = [&](int i, int page) {
        if (i < nw) {
            int j = key_of(i);
            int off = bs_shift >= 0 ? j & (block_size - 1) : j % block_size;
            size_t row = (size_t)page * block_stride + (size_t)off * kv_dim + kv_off;
            const char *kr = (const char *)(k_cache + row), *vr = (const char *)(v_cache + row);
            uint4 *st = ring + (i % AT_NST) * (2 * NC * 32);
#pragma unroll
            for (int k = 0; k < NC; k++) {
                int c = li + L * k, n = c < nch ? 16 : 0; // chunks past the row: zeros
                c = c < nch ? c : 0;
                ls_cp16(st + k * 32 + lane, kr + c * 16, n);
                ls_cp16(st + (NC + k) * 32 + lane, vr + c * 16, n);
            }
        }
        ls_cp_commit();
    };

    // the keys of the token's sequence before this step's first are read before the wait;
    // q and the step's own keys (written by the kernel before) after it
    ls_ring_t<AT_NST> rg;
    s_ring_start(rg, nw, page_of, issue, tok_seq, positions, t, k0, k1, warp, W, KPS);
    float qr[GC][NC][VE], acc[GC][NC][VE], m[GC], l[GC];
#pragma unroll
    for (int g = 0; g < GC; g++) {
        const float *qh =
            q + (size_t)t * row_stride + (size_t)(kvh * group + g0 + g) * head_dim;
#pragma unroll
        for (int k = 0; k < NC; k++) {
            int c = li + L * k;
#pragma unroll
            for (int v = 0; v < VE; v++) {
                qr[g][k][v] = g < gn && c < nch ? qh[c * VE + v] * qscale : 0.0f;
                acc[g][k][v] = 0.0f;
            }
        }
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }

    ls_ring_loop(rg, nw, page_of, issue, [&](int i) {
        const uint4 *st = ring + (i % AT_NST) * (2 * NC * 32);
        float s[GC];
#pragma unroll
        for (int g = 0; g < GC; g++)
            s[g] = 0.0f;
#pragma unroll
        for (int k = 0; k < NC; k++) {
            float kf[VE];
            s_widen(st[k * 32 + lane], kf, (const TC *)0);
#pragma unroll
            for (int g = 0; g < GC; g++)
#pragma unroll
                for (int v = 0; v < VE; v++)
                    s[g] = fmaf(qr[g][k][v], kf[v], s[g]);
        }
        bool valid = k0 + (warp + i * W) * KPS + grp < k1;
        float p[GC];
#pragma unroll
        for (int g = 0; g < GC; g++) {
#pragma unroll
            for (int o = 1; o < L; o <<= 1)
                s[g] += __shfl_xor_sync(0xffffffffu, s[g], o);
            s[g] = valid ? s[g] : -INFINITY;
            float mx = s[g]; // the step's max over the warp's keys: same in every lane
#pragma unroll
            for (int o = L; o < 32; o <<= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            if (mx > m[g]) { // rescale what was summed under the old max (warp-uniform)
                float c = s_ex2(m[g] - mx);
                l[g] *= c;
#pragma unroll
                for (int k = 0; k < NC; k++)
#pragma unroll
                    for (int v = 0; v < VE; v++)
                        acc[g][k][v] *= c;
                m[g] = mx;
            }
            p[g] = s_ex2(s[g] - m[g]);
            l[g] += p[g];
        }
#pragma unroll
        for (int k = 0; k < NC; k++) {
            float vf[VE];
            s_widen(st[(NC + k) * 32 + lane], vf, (const TC *)0);
#pragma unroll
            for (int g = 0; g < GC; g++)
#pragma unroll
                for (int v = 0; v < VE; v++)
                    acc[g][k][v] = fmaf(p[g], vf[v], acc[g][k][v]);
        }
    });

    // the warp's state: sum over its key groups (same max), into the start of its ring:
    // (GC, head_dim) acc, then m (GC), l (GC)
#pragma unroll
    for (int g = 0; g < GC; g++) {
#pragma unroll
        for (int o = L; o < 32; o <<= 1) {
            l[g] += __shfl_xor_sync(0xffffffffu, l[g], o);
#pragma unroll
            for (int k = 0; k < NC; k++)
#pragma unroll
                for (int v = 0; v < VE; v++)
                    acc[g][k][v] += __shfl_xor_sync(0xffffffffu, acc[g][k][v], o);
        }
    }
    const int sd = GC * head_dim; // offset of m in a state
    float *ws = (float *)ring;
    if (grp == 0) {
#pragma unroll
        for (int g = 0; g < GC; g++)
#pragma unroll
            for (int k = 0; k < NC; k++) {
                int c = li + L * k;
                if (c < nch)
#pragma unroll
                    for (int v = 0; v < VE; v++)
                        ws[g * head_dim + c * VE + v] = acc[g][k][v];
            }
    }
    if (lane == 0)
#pragma unroll
        for (int g = 0; g < GC; g++)
            ws[sd + g] = m[g], ws[sd + GC + g] = l[g];
    __syncthreads();
    s_merge<GC>(out, s_sm, W, RING * 4, t, kvh, group, g0, gn, n_heads, head_dim, rank, cs);
}

// -- tc: tensor cores, bf16 caches -----------------------------------------------------------

enum { TC_KEYS = 8, TC_NST = 4 }; // keys per step (one m16n8 tile), stages of a warp's ring

__device__ __forceinline__ void s_ldsm4(uint32_t r[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
__device__ __forceinline__ void s_ldsm4t(uint32_t r[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
// c += a (16x8) b (8x8)
__device__ __forceinline__ void s_mma1688(float c[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
}
__device__ __forceinline__ float s_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float s_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

// k_attention_tc: as k_attention_v2 (block_stride in elements), for bf16 caches with head_dim D (64 or 128) and
// block_size % 8 == 0, on the tensor cores (mma.sync, sm_80+) and still fp32-exact: an fp32
// x splits into three bf16 pieces x = x0 + x1 + x2 (each the rounding of what the ones
// before leave, every difference exact; 24 bits in all, as many as fp32 holds), and a bf16
// x bf16 product is exact in the fp32 accumulator. The 16 rows of the MMA's A are (piece,
// head): rows 0-3 piece 0 of the GC = 4 heads, 4-7 piece 1, 8-11 piece 2, 12-15 zero; so
// one MMA per 16 dims and 8 keys gives all three pieces' partial scores, which one shuffle
// adds up (rows h, h+8 sit in lane l, row h+4 in lane l^16), and p.v is the same with the
// pieces of p. A warp step is 8 keys (one n8 tile): QK^T in D/16 m16n8k16 MMAs (K from
// shared memory by ldmatrix), softmax on the accumulator fragment (lane l holds keys
// 2(l%4), +1 of head (l/4)%4; the row max over the lane quad), p.v in D/8 m16n8k8 MMAs (V
// by ldmatrix.trans). K/V tiles come through each warp's cp.async ring, rows swizzled
// (16-byte chunk c of row r at c ^ (r % 8)) so that ldmatrix reads hit 8 distinct bank
// groups. Grid, clusters, partial-state merges: as k_attention_v2.
template <int D>
__global__ void __launch_bounds__(AT_MAXW * 32, 1)
k_attention_tc(s_out_t out, const float *q, const void *kc_, const void *vc_,
               const int32_t *tok_seq, const int32_t *positions, const int32_t *block_tables,
               int max_blocks, int n_heads, int n_kv_heads, int head_dim, int block_size,
               size_t block_stride, int bs_shift, int row_stride, float qscale, int n_pass, int cs) {
    constexpr int GC = 4, RB = D * 2, NCK = D / 8, NJ = D / 32, KS = D / 16;
    constexpr int STAGE = 2 * TC_KEYS * RB; // bytes: 8 K rows, then 8 V rows
    constexpr int RING = TC_NST * STAGE;    // bytes per warp
    extern __shared__ uint4 s_sm[];
    const char *kc = (const char *)kc_, *vc = (const char *)vc_;
    const int W = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, qd = lane & 3, h = g & 3; // fragment row, column pair, head
    const int ri = lane & 7, mi = lane >> 3;            // ldmatrix: row, matrix
    const int rank = blockIdx.x % cs, item = blockIdx.x / cs;
    const int t = item / n_pass, g0 = item % n_pass * GC, kvh = blockIdx.y;
    const int group = n_heads / n_kv_heads, gn = min(GC, group - g0);
    const int n_keys = positions[t] + 1; // causal: KV indices 0..p
    const int32_t *table = block_tables + (size_t)tok_seq[t] * max_blocks;
    const size_t kv_bytes = (size_t)n_kv_heads * RB, head_off = (size_t)kvh * RB;
    const int n_pages = (n_keys + block_size - 1) / block_size;
    const int pa = (int)((long long)rank * n_pages / cs);
    const int pb = (int)((long long)(rank + 1) * n_pages / cs);
    const int k0 = pa * block_size, k1 = min(pb * block_size, n_keys);
    const int n_steps = k1 > k0 ? (k1 - k0 + TC_KEYS - 1) / TC_KEYS : 0;
    const int nw = warp < n_steps ? (n_steps - warp + W - 1) / W : 0; // steps of this warp
    char *ring = (char *)s_sm + (size_t)warp * RING;
    const unsigned ring_s = (unsigned)__cvta_generic_to_shared(ring);

    auto page_of = [&](int i) {
        int j = k0 + (warp + i * W) * TC_KEYS;
        return __ldg(table + (bs_shift >= 0 ? j >> bs_shift : j / block_size));
    };
    // step i's 8 K rows and 8 V rows into stage i % TC_NST: lane copies 16-byte chunks
    // lane + 32n (row r, chunk c); rows past k1 repeat the last key (same page: the step
    // starts page-aligned + 8k and block_size % 8 == 0); one commit group per step
    auto issue = [&](int i, int page) {
        if (i < nw) {
            int key0 = k0 + (warp + i * W) * TC_KEYS;
            int off0 = bs_shift >= 0 ? key0 & (block_size - 1) : key0 % block_size;
            int last = k1 - 1 - key0;
            size_t row0 = (size_t)page * block_stride * 2 + (size_t)off0 * kv_bytes + head_off;
            const char *kb = kc + row0, *vb = vc + row0;
            unsigned st = ring_s + (i % TC_NST) * STAGE;
#pragma unroll
            for (int n = 0; n < NCK / 4; n++) {
                int qq = lane + 32 * n, r = qq / NCK, c = qq % NCK;
                size_t so = (size_t)min(r, last) * kv_bytes + c * 16;
                unsigned d = st + r * RB + ((c ^ (r & 7)) << 4);
                ls_cp16(d, kb + so, 16);
                ls_cp16(d + TC_KEYS * RB, vb + so, 16);
            }
        }
        ls_cp_commit();
    };

    // as k_attention_v2: the sequence's earlier keys before the wait, q and its own keys after
    ls_ring_t<TC_NST> rg;
    s_ring_start(rg, nw, page_of, issue, tok_seq, positions, t, k0, k1, warp, W, TC_KEYS);
    // A fragments of q (scaled by scale*log2(e)), k-step s = dims 16s..16s+15: a0 (row g,
    // dims 2qd, +1), a1 (row g+8, same), a2 (row g, dims +8), a3 (row g+8, dims +8); row g
    // is piece 0 (g < 4) or 1 (g >= 4) of head h, row g+8 piece 2 (g < 4) or zero
    uint32_t qa[KS][4];
    {
        const float *qh = q + (size_t)t * row_stride + (size_t)(kvh * group + g0 + h) * D;
#pragma unroll
        for (int s = 0; s < KS; s++)
#pragma unroll
            for (int half = 0; half < 2; half++) {
                float x[2], pA[2], pB[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    x[e] = h < gn ? qh[16 * s + 8 * half + 2 * qd + e] * qscale : 0.0f;
                    float x0 = __bfloat162float(__float2bfloat16_rn(x[e]));
                    float r = x[e] - x0; // exact
                    float x1 = __bfloat162float(__float2bfloat16_rn(r));
                    float x2 = r - x1; // exact; rounded to bf16 by s_pack
                    pA[e] = g < 4 ? x0 : x1;
                    pB[e] = g < 4 ? x2 : 0.0f;
                }
                qa[s][2 * half] = ls_pack2<__nv_bfloat16>(pA[0], pA[1]);
                qa[s][2 * half + 1] = ls_pack2<__nv_bfloat16>(pB[0], pB[1]);
            }
    }
    float o[D / 8][4]; // p.v fragments: n-tile j = dims 8j..8j+7
#pragma unroll
    for (int j = 0; j < D / 8; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m = -INFINITY, l = 0.0f; // of head h, over this lane's keys (same in its quad)

    ls_ring_loop(rg, nw, page_of, issue, [&](int i) {
        const unsigned st = ring_s + (i % TC_NST) * STAGE;
        // scores: rows (piece, head) x 8 keys, two accumulators for two MMA chains
        float sa[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < NJ; j++) { // dims 32j..32j+31: chunks 4j..4j+3
            uint32_t kr[4];
            s_ldsm4(kr, st + ri * RB + (((4 * j + mi) ^ ri) << 4));
            ls_mma16816<__nv_bfloat16>(sa, qa[2 * j], kr[0], kr[1]);
            ls_mma16816<__nv_bfloat16>(sb, qa[2 * j + 1], kr[2], kr[3]);
        }
        // this lane: rows g (c0, c1) and g+8 (c2, c3) at keys 2qd, 2qd+1; lanes l and
        // l^16 hold the three pieces of one head between them (l^16's second row is 0),
        // and add them in the same order up to commutation: the same bits in both
        float u0 = (sa[0] + sb[0]) + (sa[2] + sb[2]), u1 = (sa[1] + sb[1]) + (sa[3] + sb[3]);
        float s0 = u0 + __shfl_xor_sync(0xffffffffu, u0, 16);
        float s1 = u1 + __shfl_xor_sync(0xffffffffu, u1, 16);
        int kk = k0 + (warp + i * W) * TC_KEYS + 2 * qd;
        s0 = kk < k1 ? s0 : -INFINITY;
        s1 = kk + 1 < k1 ? s1 : -INFINITY;
        float mx = fmaxf(s0, s1); // the step's max for head h (key 0 of a step is valid)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        float mn = fmaxf(m, mx);
        if (__any_sync(0xffffffffu, mn > m)) { // rescale what was summed under the old max
            float c = s_ex2(m - mn); // 1 where this head's max did not move
            l *= c;
#pragma unroll
            for (int j = 0; j < D / 8; j++)
                o[j][0] *= c, o[j][1] *= c, o[j][2] *= c, o[j][3] *= c;
        }
        m = mn;
        float p0 = s_ex2(s0 - m), p1 = s_ex2(s1 - m);
        l += p0 + p1;
        // p in three bf16 pieces; A of p.v: row g = piece 0 (g < 4) or 1, row g+8 =
        // piece 2 (g < 4) or zero, columns = keys 2qd, 2qd+1
        uint32_t b0 = ls_pack2<__nv_bfloat16>(p0, p1);
        float e0 = p0 - s_lo(b0), e1 = p1 - s_hi(b0);
        uint32_t b1 = ls_pack2<__nv_bfloat16>(e0, e1);
        e0 -= s_lo(b1), e1 -= s_hi(b1);
        uint32_t b2 = ls_pack2<__nv_bfloat16>(e0, e1);
        uint32_t a0 = g < 4 ? b0 : b1, a1 = g < 4 ? b2 : 0u;
#pragma unroll
        for (int j = 0; j < NJ; j++) { // n-tiles 4j..4j+3
            uint32_t vr[4];
            s_ldsm4t(vr, st + TC_KEYS * RB + ri * RB + (((4 * j + mi) ^ ri) << 4));
#pragma unroll
            for (int n = 0; n < 4; n++)
                s_mma1688(o[4 * j + n], a0, a1, vr[n]);
        }
    });

    // the warp's state, at the start of its ring: (GC, D) acc, then m (GC), l (GC). Head
    // h's row sums: pieces 0 + 2 here, piece 1 in lane^16, added as above
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    float *ws = (float *)ring;
#pragma unroll
    for (int j = 0; j < D / 8; j++) {
        float v0 = o[j][0] + o[j][2], v1 = o[j][1] + o[j][3];
        v0 += __shfl_xor_sync(0xffffffffu, v0, 16);
        v1 += __shfl_xor_sync(0xffffffffu, v1, 16);
        if (g < 4)
            ws[h * D + 8 * j + 2 * qd] = v0, ws[h * D + 8 * j + 2 * qd + 1] = v1;
    }
    if (g < 4 && qd == 0)
        ws[GC * D + h] = m, ws[GC * D + GC + h] = l;
    __syncthreads();
    s_merge<GC>(out, s_sm, W, RING / 4, t, kvh, group, g0, gn, n_heads, D, rank, cs);
}

// -- prefill: query tiles on the tensor cores -----------------------------------------------

// c[mt][j] and c[mt][j + 1] += a[mt] times the two n8 tiles of B that one ldmatrix.x4 loads
// from addr, for every m-tile mt (TRANS: .trans, for V, whose rows are B's rows)
template <bool TRANS, int MT, int N>
__device__ __forceinline__ void s_mma_b2(float (&c)[MT][N][4], int j, const uint32_t (&a)[MT][4],
                                         unsigned addr) {
    uint32_t b[4];
    if (TRANS)
        s_ldsm4t(b, addr);
    else
        s_ldsm4(b, addr);
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        ls_mma16816<__nv_bfloat16>(c[mt][j], a[mt], b[0], b[1]);
        ls_mma16816<__nv_bfloat16>(c[mt][j + 1], a[mt], b[2], b[3]);
    }
}

// The prefill kernels' view of the paged cache. s_pf_page: the block-table entry of key (the
// dependent read, issued a tile ahead); s_pf_row: the byte offset of key's row (kv head 0)
// in that page — a page's block_size rows of kv_bytes back to back at page * block_bytes (the
// page-major pool: one layer's K or V of a page, its other layers' between pages): the one
// place the cache's layout enters these kernels.
__device__ __forceinline__ int s_pf_page(const int32_t *table, int key, int block_size,
                                         int bs_shift) {
    return __ldg(table + (bs_shift >= 0 ? key >> bs_shift : key / block_size));
}
__device__ __forceinline__ long long s_pf_row(int page, int key, int block_size, int bs_shift,
                                              size_t kv_bytes, size_t block_bytes) {
    int off = bs_shift >= 0 ? key & (block_size - 1) : key % block_size;
    return (long long)page * (long long)block_bytes + (long long)off * (long long)kv_bytes;
}

// The key rows' ring of a prefill CTA's key loop (s_row's three rows: tiles j, j + 1 and
// j + 2). At the top of tile j, ahead() reads the block-table entry of this thread's key of
// tile j + 2 (the dependent read, used only after the tile's math); at its bottom, publish()
// writes that key's row offset into the ring (-1 past pmax) and turns the ring.
template <int BN> struct s_pf_ring_t {
    int ring1 = 1, ring2 = 2; // s_row rows of tiles j + 1 and j + 2
    int key2 = 0, page2 = 0;
    bool has2 = false;
    __device__ __forceinline__ void ahead(const int32_t *table, int j, int tid, int pmax,
                                          int block_size, int bs_shift) {
        key2 = (j + 2) * BN + tid;
        has2 = tid < BN && key2 <= pmax;
        page2 = has2 ? s_pf_page(table, key2, block_size, bs_shift) : 0;
    }
    __device__ __forceinline__ void publish(long long (*s_row)[BN], int tid, int block_size,
                                            int bs_shift, size_t kv_bytes, size_t block_bytes) {
        if (tid < BN)
            s_row[ring2][tid] =
                has2 ? s_pf_row(page2, key2, block_size, bs_shift, kv_bytes, block_bytes) : -1;
        ring1 = ring2;
        ring2 = ring2 == 2 ? 0 : ring2 + 1;
    }
};

// The query tile of a prefill CTA: blockIdx.z's sequence of seqs ((sequence, first token,
// tokens) each), its tile blockIdx.y of tq tokens counted from the end (the latest tokens,
// most keys, first); false for CTAs past a shorter sequence's tiles than the launch's longest.
struct s_pf_tile_t {
    int tok0, ntok, nrows; // first token row, tokens, query rows (tokens x group)
    const int32_t *table;  // the sequence's block table
};
__device__ __forceinline__ bool s_pf_tile(s_pf_tile_t &t, const int32_t *seqs,
                                          const int32_t *block_tables, int max_blocks, int tq,
                                          int group) {
    const int seq = seqs[3 * blockIdx.z], t_first = seqs[3 * blockIdx.z + 1];
    const int n_tok = seqs[3 * blockIdx.z + 2], n_tiles = (n_tok + tq - 1) / tq;
    if ((int)blockIdx.y >= n_tiles)
        return false;
    const int tile = n_tiles - 1 - (int)blockIdx.y;
    t.tok0 = t_first + tile * tq, t.ntok = min(tq, n_tok - tile * tq), t.nrows = t.ntok * group;
    t.table = block_tables + (size_t)seq * max_blocks;
    return true;
}

// A prefill CTA's start (NT threads, BM query rows of D): the tile's tokens' positions into
// s_pos (-1 past the sequence), the largest each warp read into s_whi[warp]; Q as bf16 of q *
// qscale, rows past nrows zero, the 4 values of float4 c4 of row r at q_sm + at(r, c4) (the
// kernel's swizzle). The caller syncs before reading them.
template <int D, int BM, int NT, int UNROLL, typename AT>
__device__ __forceinline__ void s_pf_begin(int *s_pos, int *s_whi, char *q_sm, const float *q,
                                           const int32_t *positions, const s_pf_tile_t &t,
                                           int group, int kvh, int row_stride, float qscale,
                                           AT at) {
    const int tid = threadIdx.x;
    {
        int p = tid < t.ntok ? positions[t.tok0 + tid] : -1;
        if (tid < BM)
            s_pos[tid] = p;
        p = __reduce_max_sync(0xffffffffu, p);
        if ((tid & 31) == 0)
            s_whi[tid >> 5] = p;
    }
    constexpr int F4 = D / 4; // float4s a row
#pragma unroll UNROLL
    for (int i = 0; i < BM * F4 / NT; i++) {
        int f = tid + i * NT, r = f / F4, c4 = f % F4;
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < t.nrows) {
            int tk = r / group, hd = kvh * group + r - tk * group;
            x = __ldg(reinterpret_cast<const float4 *>(
                          q + (size_t)(t.tok0 + tk) * row_stride + (size_t)hd * D) + c4);
        }
        uint2 u = {ls_pack2<__nv_bfloat16>(x.x * qscale, x.y * qscale),
                   ls_pack2<__nv_bfloat16>(x.z * qscale, x.w * qscale)};
        *reinterpret_cast<uint2 *>(q_sm + at(r, c4)) = u;
    }
}

// After s_pf_begin and a barrier: returns the tile's largest position (its last key; over
// the NW warps' s_whi). For the MT m-tiles of 16 rows from row0 that this lane's warp holds
// (this lane's rows 16 mt + g and + 8 of them, h = 0, 1): their positions rpos[mt][h] (pmax
// for rows past the tile: their q is zero, they are never written), and the warp's least
// (wlo) and largest (whi; -1: no row, the warp idles) position over its rows.
template <int NW, int MT>
__device__ __forceinline__ int s_pf_positions(const int *s_pos, const int *s_whi, int row0,
                                              int nrows, int group, int (&rpos)[MT][2],
                                              int &wlo, int &whi) {
    int pmax = 0;
#pragma unroll
    for (int w = 0; w < NW; w++)
        pmax = max(pmax, s_whi[w]);
    wlo = 0x7fffffff, whi = -1;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int r = row0 + 16 * mt + ((threadIdx.x & 31) >> 2) + 8 * h;
            int p = r < nrows ? s_pos[r / group] : -1;
            whi = max(whi, p);
            wlo = p >= 0 ? min(wlo, p) : wlo;
            rpos[mt][h] = p >= 0 ? p : pmax;
        }
    whi = __reduce_max_sync(0xffffffffu, whi);
    wlo = __reduce_min_sync(0xffffffffu, wlo);
    return pmax;
}

// rows[j][i]: s_pf_row of key j * BN + i of tiles 0 and 1 (-1 past pmax), by threads 0 .. BN - 1
template <int BN>
__device__ __forceinline__ void s_pf_rows_first(long long (*rows)[BN], int pmax,
                                                const int32_t *table, int block_size,
                                                int bs_shift, size_t kv_bytes,
                                                size_t block_bytes) {
    const int tid = threadIdx.x;
    if (tid < BN)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            int key = j * BN + tid;
            rows[j][tid] = key <= pmax ? s_pf_row(s_pf_page(table, key, block_size, bs_shift),
                                                  key, block_size, bs_shift, kv_bytes,
                                                  block_bytes)
                                       : -1;
        }
}

// A key tile's K and V rows (rows: their s_pf_row, -1: zero-filled) by cp.async into the
// stage at st: NT threads, each chunk c (16 bytes) of row r of K at st + at(r, c) (the
// kernel's swizzle), V's BN rows of 2 * D bytes after K's. Thread tid copies chunk tid % NCH
// of rows tid / NCH + (NT / NCH) * i.
template <int D, int BN, int NT, typename AT>
__device__ __forceinline__ void s_pf_issue(unsigned st, const long long *rows, const char *kc,
                                           const char *vc, AT at) {
    constexpr int NCH = D / 8, CPT = BN * NCH / NT; // chunks a row; a thread copies of K, of V
#pragma unroll
    for (int i = 0; i < CPT; i++) {
        int f = threadIdx.x + i * NT, r = f / NCH, c = f % NCH;
        long long row = rows[r];
        size_t so = (size_t)max(row, 0ll) + c * 16;
        unsigned d = st + at(r, c);
        int n = row >= 0 ? 16 : 0;
        ls_cp16(d, kc + so, n);
        ls_cp16(d + BN * 2 * D, vc + so, n);
    }
}

// Query row r of the tile (written only where r < nrows): O / l, l summed over the lane quad
// first (every lane calls), dims 8n + 2qd and + 1 from o2(n).
template <int D, typename OT>
__device__ __forceinline__ void s_pf_store(s_out_t out, float l, int r, const s_pf_tile_t &t,
                                           int group, int kvh, int n_heads, OT o2) {
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (r < t.nrows) {
        const float inv = 1.0f / l;
        const int tk = r / group, hd = kvh * group + r - tk * group;
        const size_t orow = (size_t)(t.tok0 + tk) * n_heads * D + (size_t)hd * D +
                            2 * (threadIdx.x & 3);
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            float2 v = o2(n);
            s_out_put2(out, orow + 8 * n, v.x * inv, v.y * inv);
        }
    }
}

// k_attention_prefill: FlashAttention-2's plan, for the sequences of a step with many query
// tokens (ls_cu_attention_prefill). A CTA of NW warps takes one query tile of one sequence
// and kv head: BM = 16*MT*NW rows, row r = (token r / group, query head r % group of the kv
// head) — the GQA group's heads side by side, so each K/V tile in shared memory serves all of
// them — TQ = BM / group tokens (rows past TQ*group stay idle). Warp w owns rows 16*MT*w ..
// +16*MT. The CTA walks keys 0 .. the tile's largest position in tiles of BN:
// - K/V rows through the block table into shared memory by cp.async, two stages (tile j + 1
//   copies while tile j computes), each key's row looked up (s_pf_row) two tiles ahead (the
//   block-table read in flight during a tile); rows swizzled (16-byte chunk c of row r at
//   c ^ (r % 8)), so that ldmatrix's 8 row addresses of one matrix hit 8 distinct bank groups;
//   keys past the tile's largest position are zero-filled (and masked);
// - S = Q·Kᵀ by mma.sync m16n8k16 (A: Q by ldmatrix from shared memory; B: K rows by
//   ldmatrix, the key-major rows being B's columns), online softmax on the S fragments in
//   fp32 (base 2: q pre-scaled by scale*log2(e); a row's max over its lane quad);
// - O += P·V by mma.sync with P's A fragments straight from the S registers (the m16n8 C
//   layout of key n-tiles 2k, 2k+1 is the m16k16 A layout of key step k), V by
//   ldmatrix.trans;
// - causal by positions: keys past a row's position masked (only in tiles reaching past the
//   smallest position of the warp's rows), tiles past the largest skipped by the warp; a
//   chunk's queries see the whole cached prefix before them. Keys are walked upward from 0,
//   so every row has a finite max after its first tile (key 0 is always visible).
// Precision, unlike the decode kernels (fp32-exact): q is rounded to bf16 once, after the
// scale (FlashAttention takes a bf16 q in the first place), and p to bf16 for P·V; the row
// sums add the rounded p, so that the output stays a convex combination of V rows; scores,
// sums and O in fp32. bf16's unit roundoff u = 2^-8 bounds the relative error of each p and
// of each element of q (test_gpu_ops states its tolerance from it).
// Known limits: one CTA per (query tile, kv head), no split over keys — a short prompt
// gives few CTAs (512 tokens of Llama-3-8B: 16 tiles x 8 kv heads for 132 SMs), and a short
// chunk on a long prefix is one CTA's walk over all its keys (H100: 78 us for 1 query on
// 2,048 cached tokens, 50 on the warpgroup kernel, against 12 on the decode-shaped one),
// which is why ls_cu_attention_prefill_pick leaves short chunks to that one (a split over
// keys with a merge through memory would let this kernel take them); tiles of a sequence
// launch latest (most keys) first, sequences one after another (blockIdx.z), the
// CTAs past a shorter sequence's tiles exit at once; Q is re-read from shared memory every
// key tile (registers are full: 249 at head_dim 128 on sm_90a, 253 on sm_80); bf16 caches only.
// seqs (n, 3): (sequence, first token, tokens) of the sequences this launch takes, grid
// (n_kv_heads, tiles of the longest, n), blockDim NW*32, dynamic shared memory: Q (BM rows),
// then two stages of K (BN rows) and V (BN rows), rows of 2*D bytes.
template <int D, int MT, int NW, int BN>
__global__ void __launch_bounds__(NW * 32)
k_attention_prefill(s_out_t out, const float *q, const void *kc_, const void *vc_,
                    const int32_t *seqs, const int32_t *positions,
                    const int32_t *block_tables, int max_blocks, int n_heads, int n_kv_heads,
                    int block_size, int bs_shift, size_t block_bytes, int row_stride,
                    float qscale) {
    constexpr int NT = NW * 32, BM = 16 * MT * NW, RB = 2 * D, NCH = D / 8;
    constexpr int STAGE = 2 * BN * RB;     // bytes: BN K rows, then BN V rows
    constexpr int CPT = BN * NCH / NT;     // chunks a thread copies per tile, of K and of V
    static_assert(BM <= NT && BN <= NT && BN % 16 == 0 && NT % NCH == 0 && CPT >= 1,
                  "tile shape");
    extern __shared__ uint4 s_sm[];
    __shared__ int s_pos[BM];          // the tile's tokens' positions (-1 past the sequence)
    __shared__ long long s_row[3][BN]; // s_pf_row of each key of tiles j .. j+2 (-1: past pmax)
    __shared__ int s_whi[NW];          // the largest position each warp read (-> the tile's)
    const char *kc = (const char *)kc_, *vc = (const char *)vc_;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, qd = lane & 3; // fragment row, column pair
    const int kvh = blockIdx.x, group = n_heads / n_kv_heads;
    s_pf_tile_t t;
    if (!s_pf_tile(t, seqs, block_tables, max_blocks, BM / group, group))
        return; // a shorter sequence than the launch's longest
    const size_t kv_bytes = (size_t)n_kv_heads * RB;
    kc += (size_t)kvh * RB, vc += (size_t)kvh * RB;
    char *q_sm = (char *)s_sm;
    const unsigned q_s = (unsigned)__cvta_generic_to_shared(q_sm), kv_s = q_s + BM * RB;
    // rows of 2 * D bytes, 16-byte chunk c of row r at c ^ (r % 8)
    s_pf_begin<D, BM, NT, 8>(s_pos, s_whi, q_sm, q, positions, t, group, kvh, row_stride, qscale,
                             [](int r, int c4) {
                                 return r * RB + (((c4 >> 1) ^ (r & 7)) << 4) + (c4 & 1) * 8;
                             });
    __syncthreads();
    // the tile's last key; this lane's rows' positions, the warp's least and largest
    int rpos[MT][2], wlo, whi;
    const int pmax =
        s_pf_positions<NW, MT>(s_pos, s_whi, warp * 16 * MT, t.nrows, group, rpos, wlo, whi);
    const int nkt = pmax / BN + 1;

    s_pf_rows_first<BN>(s_row, pmax, t.table, block_size, bs_shift, kv_bytes,
                        block_bytes);
    __syncthreads();

    // tile j's K and V rows into stage j % 2
    auto issue = [&](int j, int ring) {
        s_pf_issue<D, BN, NT>(kv_s + (j & 1) * STAGE, s_row[ring], kc, vc,
                              [](int r, int c) { return r * RB + ((c ^ (r & 7)) << 4); });
    };
    issue(0, 0);
    ls_cp_commit();

    float o[MT][D / 8][4], m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int j = 0; j < D / 8; j++)
            o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.0f;
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
    }
    // ldmatrix row addresses of this lane (the swizzle's row % 8 is lane % 8 in all three):
    // Q rows of m-tile 0 (matrices: rows 0-7, 8-15 at chunk 2k, then at 2k + 1); K rows
    // (keys 0-7 at chunks 2k, 2k + 1, then keys 8-15); V rows (keys 0-7, 8-15 at chunk 2n,
    // then at 2n + 1)
    const int sw = lane & 7;
    const unsigned q_row = q_s + (warp * 16 * MT + (lane & 15)) * RB;
    const int q_ch = lane >> 4;
    const int k_row = ((lane & 7) + ((lane >> 4) << 3)) * RB, k_ch = (lane >> 3) & 1;
    const int v_row = ((lane & 7) + (((lane >> 3) & 1) << 3)) * RB, v_ch = lane >> 4;

    s_pf_ring_t<BN> ring_rows;
    for (int j = 0; j < nkt; j++) {
        const int k0 = j * BN;
        ring_rows.ahead(t.table, j, tid, pmax, block_size, bs_shift);
        if (j + 1 < nkt)
            issue(j + 1, ring_rows.ring1);
        ls_cp_commit();
        ls_cp_wait<1>(); // tile j's copies (this thread's) have landed
        __syncthreads(); // ... and every thread's
        if (k0 <= whi) { // warp-uniform: the warp has a row that sees a key of this tile
            const unsigned kst = kv_s + (j & 1) * STAGE, vst = kst + BN * RB;
            float s[MT][BN / 8][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int n = 0; n < BN / 8; n++)
                    s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < D / 16; ks++) { // dims 16ks .. 16ks + 15
                uint32_t qa[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    s_ldsm4(qa[mt], q_row + 16 * mt * RB + (((2 * ks + q_ch) ^ sw) << 4));
#pragma unroll
                for (int np = 0; np < BN / 16; np++) // keys 16np .. 16np + 15
                    s_mma_b2<false>(s, 2 * np, qa,
                                    kst + 16 * np * RB + k_row + (((2 * ks + k_ch) ^ sw) << 4));
            }
            if (k0 + BN - 1 > wlo) // warp-uniform: a key of the tile is past a row's position
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int n = 0; n < BN / 8; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            if (k0 + 8 * n + 2 * qd + (e & 1) > rpos[mt][e >> 1])
                                s[mt][n][e] = -INFINITY;
            // online softmax: row g (h = 0: c0, c1) and row g + 8 (h = 1: c2, c3); the new
            // max mn is finite from the first tile on
            float mn[MT][2];
            bool moved = false;
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float mx = -INFINITY;
#pragma unroll
                    for (int n = 0; n < BN / 8; n++)
                        mx = fmaxf(mx, fmaxf(s[mt][n][2 * h], s[mt][n][2 * h + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    mn[mt][h] = fmaxf(m[mt][h], mx);
                    moved |= mn[mt][h] > m[mt][h];
                }
            if (__any_sync(0xffffffffu, moved)) // rescale what was summed under the old max
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const float c = s_ex2(m[mt][h] - mn[mt][h]); // 0 on the first tile
                        l[mt][h] *= c;
#pragma unroll
                        for (int n = 0; n < D / 8; n++)
                            o[mt][n][2 * h] *= c, o[mt][n][2 * h + 1] *= c;
                    }
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    m[mt][h] = mn[mt][h];
#pragma unroll
                    for (int n = 0; n < BN / 8; n++) {
                        s[mt][n][2 * h] = s_ex2(s[mt][n][2 * h] - mn[mt][h]);
                        s[mt][n][2 * h + 1] = s_ex2(s[mt][n][2 * h + 1] - mn[mt][h]);
                    }
                }
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) { // keys 16kk .. 16kk + 15
                uint32_t pa[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    pa[mt][0] = ls_pack2<__nv_bfloat16>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                    pa[mt][1] = ls_pack2<__nv_bfloat16>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                    pa[mt][2] = ls_pack2<__nv_bfloat16>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                    pa[mt][3] = ls_pack2<__nv_bfloat16>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
                    l[mt][0] += (s_lo(pa[mt][0]) + s_hi(pa[mt][0])) +
                                (s_lo(pa[mt][2]) + s_hi(pa[mt][2]));
                    l[mt][1] += (s_lo(pa[mt][1]) + s_hi(pa[mt][1])) +
                                (s_lo(pa[mt][3]) + s_hi(pa[mt][3]));
                }
#pragma unroll
                for (int dp = 0; dp < D / 16; dp++) // dims 16dp .. 16dp + 15
                    s_mma_b2<true>(o, 2 * dp, pa,
                                   vst + 16 * kk * RB + v_row + (((2 * dp + v_ch) ^ sw) << 4));
            }
        }
        ring_rows.publish(s_row, tid, block_size, bs_shift, kv_bytes, block_bytes);
        __syncthreads(); // stage j % 2 free for tile j + 2; tile j + 2's rows visible
    }
    ls_cp_wait<0>(); // only empty groups were left

#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            s_pf_store<D>(out, l[mt][h], warp * 16 * MT + 16 * mt + g + 8 * h, t, group, kvh,
                          n_heads,
                          [&](int n) { return make_float2(o[mt][n][2 * h], o[mt][n][2 * h + 1]); });
}

// -- prefill on warpgroup MMA (sm_90a) --------------------------------------------------------
//
// k_attention_prefill_wg: k_attention_prefill's plan (a CTA per (query tile of 128 rows, kv
// head), keys walked upward in tiles of BN through the block table by cp.async, two stages,
// online softmax in base 2 on the score registers, q and p rounded to bf16: the same bound)
// with Hopper's warpgroup MMA instead of mma.sync: 2 warpgroups of 4 warps, each owning 64
// rows (warp w of a warpgroup rows 16w .. 16w + 15 of its 64, the m16n8 fragment layout);
// - S = Q·Kᵀ: 8 wgmma m64nBNk16 a tile, A (Q) and B (K rows: keys are B's columns, dims its
//   K, "K-major") both from shared memory by descriptor;
// - O += P·V: BN/16 wgmma m64n128k16, A = P from the score registers as they stand (the
//   accumulator layout of key n-tiles 2k, 2k + 1 is the register-A layout of key step k), B
//   = V rows by descriptor, transposed (dims, its N, are contiguous: "MN-major");
// - shared tiles in the 128-byte swizzle wgmma reads: a tile of R rows x 128 dims is two
//   column blocks (dims 0-63, 64-127) of R rows of 128 bytes, 16-byte chunk c of row r at
//   c ^ (r % 8), atoms of 8 rows (1,024 bytes) at 1,024-byte alignment. Written by cp.async
//   and st.shared (the generic proxy), so every thread fences its writes to the async proxy
//   before the barrier that lets wgmma read them;
// - a warpgroup skips the tiles past its rows' largest position (the condition must be the
//   same for its 128 threads); masks on the tiles that reach past a warp's least position.
// No overlap of the softmax with the MMAs inside a warpgroup (both wait on their group):
// the other warpgroup, and at BN = 64 the SM's second CTA, fill the tensor cores then
// (FlashAttention-3's producer warp and ping-pong of the warpgroups are not done).
// MINB: CTAs an SM (2 caps registers at 128). Head_dim 128, bf16 caches. Production:
// BN = 64, MINB = 2 (s_pf_wg_ok: where the sm_90a build runs); dev_prefill times BN = 128.
// Only the sm_90a build holds wgmma: the sm_80 build of the kernel traps (never launched).

template <int BN, int MINB>
__global__ void __launch_bounds__(256, MINB)
k_attention_prefill_wg(s_out_t out, const float *q, const void *kc_, const void *vc_,
                       const int32_t *seqs, const int32_t *positions,
                       const int32_t *block_tables, int max_blocks, int n_heads, int n_kv_heads,
                       int block_size, int bs_shift, size_t block_bytes, int row_stride,
                       float qscale) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int D = 128, NT = 256, BM = 128, RB = 2 * D, HB = RB / 2; // HB: half a row
    constexpr int STAGE = 2 * BN * RB; // bytes: BN K rows, then BN V rows
    constexpr int NS = BN / 2;         // score registers a thread (m64 x BN over 128 threads)
    static_assert(BN == 64 || BN == 128, "tile shape");
    extern __shared__ uint4 s_sm[];
    __shared__ int s_pos[BM];          // the tile's tokens' positions (-1 past the sequence)
    __shared__ long long s_row[3][BN]; // s_pf_row of each key of tiles j .. j+2 (-1: past pmax)
    __shared__ int s_whi[8];           // the largest position each warp read (-> the tile's)
    __shared__ int s_rhi[8];           // the largest position of each warp's rows
    const char *kc = (const char *)kc_, *vc = (const char *)vc_;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
    const int g = lane >> 2, qd = lane & 3;
    const int kvh = blockIdx.x, group = n_heads / n_kv_heads;
    s_pf_tile_t t;
    if (!s_pf_tile(t, seqs, block_tables, max_blocks, BM / group, group))
        return;
    const size_t kv_bytes = (size_t)n_kv_heads * RB;
    kc += (size_t)kvh * RB, vc += (size_t)kvh * RB;
    // the tiles at the first 1,024-byte boundary of the dynamic shared memory
    const unsigned sm0 = (unsigned)__cvta_generic_to_shared(s_sm);
    const unsigned q_s = (sm0 + 1023u) & ~1023u, kv_s = q_s + BM * RB;
    char *q_sm = (char *)s_sm + (q_s - sm0);
    // 128-byte swizzle: chunk c of row r in column block c / 8, at (c % 8) ^ (r % 8) there
    s_pf_begin<D, BM, NT, 4>(s_pos, s_whi, q_sm, q, positions, t, group, kvh, row_stride, qscale,
                             [](int r, int c4) {
                                 int c = c4 >> 1;
                                 return (c >> 3) * (BM * HB) + r * HB +
                                        (((c & 7) ^ (r & 7)) << 4) + (c4 & 1) * 8;
                             });
    __syncthreads();
    // the tile's last key; this lane's rows' positions (rows g, g + 8 of the warp's 16), the
    // warp's least and largest
    const int row0 = 64 * wg + 16 * (warp & 3);
    int rpos[1][2], wlo, whi;
    const int pmax = s_pf_positions<8, 1>(s_pos, s_whi, row0, t.nrows, group, rpos, wlo, whi);
    const int nkt = pmax / BN + 1;
    if (lane == 0)
        s_rhi[warp] = whi;

    s_pf_rows_first<BN>(s_row, pmax, t.table, block_size, bs_shift, kv_bytes,
                        block_bytes);
    __syncthreads();
    // the warpgroup's largest row position: uniform over its 128 threads
    const int gwhi =
        max(max(s_rhi[4 * wg], s_rhi[4 * wg + 1]), max(s_rhi[4 * wg + 2], s_rhi[4 * wg + 3]));

    // tile j's K and V rows into stage j % 2, in the 128-byte swizzle
    auto issue = [&](int j, int ring) {
        s_pf_issue<D, BN, NT>(kv_s + (j & 1) * STAGE, s_row[ring], kc, vc, [](int r, int c) {
            return (c >> 3) * (BN * HB) + r * HB + (((c & 7) ^ (r & 7)) << 4);
        });
    };
    issue(0, 0);
    ls_cp_commit();

    float o[64], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 64; i++)
        o[i] = 0.0f;
    const unsigned qw_s = q_s + 64 * wg * HB; // the warpgroup's 64 rows of Q
    s_pf_ring_t<BN> ring_rows;
    for (int j = 0; j < nkt; j++) {
        const int k0 = j * BN;
        ring_rows.ahead(t.table, j, tid, pmax, block_size, bs_shift);
        if (j + 1 < nkt)
            issue(j + 1, ring_rows.ring1);
        ls_cp_commit();
        ls_cp_wait<1>();
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); // (and Q's stores)
        __syncthreads();
        if (k0 <= gwhi) {
            const unsigned kst = kv_s + (j & 1) * STAGE, vst = kst + BN * RB;
            float s[NS];
            ls_wg_fence();
#pragma unroll
            for (int ks = 0; ks < D / 16; ks++) { // dims 16ks .. 16ks + 15
                uint64_t da = ls_wg_desc(qw_s + (ks >> 2) * (BM * HB) + (ks & 3) * 32, 16, 1024);
                uint64_t db = ls_wg_desc(kst + (ks >> 2) * (BN * HB) + (ks & 3) * 32, 16, 1024);
                if constexpr (BN == 64)
                    ls_wg_ss<64>(s, da, db, ks);
                else
                    ls_wg_ss<128>(s, da, db, ks);
            }
            ls_wg_commit();
            ls_wg_wait0();
            ls_wg_keep(s);
            // s[4n + e]: row g + 8 (e >> 1) of the warp's, key k0 + 8n + 2qd + (e & 1)
            if (k0 + BN - 1 > wlo)
#pragma unroll
                for (int n = 0; n < BN / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (k0 + 8 * n + 2 * qd + (e & 1) > rpos[0][e >> 1])
                            s[4 * n + e] = -INFINITY;
            float mn[2];
            bool moved = false;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float mx = -INFINITY;
#pragma unroll
                for (int n = 0; n < BN / 8; n++)
                    mx = fmaxf(mx, fmaxf(s[4 * n + 2 * h], s[4 * n + 2 * h + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                mn[h] = fmaxf(m[h], mx);
                moved |= mn[h] > m[h];
            }
            if (__any_sync(0xffffffffu, moved))
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const float c = s_ex2(m[h] - mn[h]); // 0 on the first tile
                    l[h] *= c;
#pragma unroll
                    for (int n = 0; n < D / 8; n++)
                        o[4 * n + 2 * h] *= c, o[4 * n + 2 * h + 1] *= c;
                }
            uint32_t pa[BN / 16][4];
#pragma unroll
            for (int h = 0; h < 2; h++)
                m[h] = mn[h];
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) { // keys 16kk .. 16kk + 15
#pragma unroll
                for (int i = 0; i < 4; i++) // s[8kk + 2i], s[8kk + 2i + 1]: row g + 8 (i & 1)
                    pa[kk][i] = ls_pack2<__nv_bfloat16>(s_ex2(s[8 * kk + 2 * i] - mn[i & 1]),
                                       s_ex2(s[8 * kk + 2 * i + 1] - mn[i & 1]));
                l[0] += (s_lo(pa[kk][0]) + s_hi(pa[kk][0])) + (s_lo(pa[kk][2]) + s_hi(pa[kk][2]));
                l[1] += (s_lo(pa[kk][1]) + s_hi(pa[kk][1])) + (s_lo(pa[kk][3]) + s_hi(pa[kk][3]));
            }
            ls_wg_keep(o);
            ls_wg_fence();
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) // V rows 16kk .. 16kk + 15: two 8-key atoms
                ls_wg_rs128(o, pa[kk], ls_wg_desc(vst + kk * 16 * HB, BN * HB, 1024));
            ls_wg_commit();
            ls_wg_wait0();
            ls_wg_keep(o);
        }
        ring_rows.publish(s_row, tid, block_size, bs_shift, kv_bytes, block_bytes);
        __syncthreads(); // stage j % 2 free for tile j + 2; tile j + 2's rows visible
    }
    ls_cp_wait<0>();

#pragma unroll
    for (int h = 0; h < 2; h++)
        s_pf_store<D>(out, l[h], row0 + g + 8 * h, t, group, kvh, n_heads,
                      [&](int n) { return make_float2(o[4 * n + 2 * h], o[4 * n + 2 * h + 1]); });
#else
    __trap();
#endif
}

// -- launchers -----------------------------------------------------------------------------

static int s_last_w = 0, s_last_cs = 0;
// warps per CTA and CTAs per cluster of the last v2/tc launch (0, 0 after a v1 launch)
extern "C" void ls_cu_attention_last_plan(int *warps, int *cluster) {
    *warps = s_last_w, *cluster = s_last_cs;
}

template <typename TC, int E>
static cudaError_t s_launch_v1(s_out_t out, const float *q, const void *k_cache,
                               const void *v_cache, const int32_t *tok_seq,
                               const int32_t *positions, const int32_t *block_tables,
                               int max_blocks, int T, int n_heads, int n_kv_heads,
                               int head_dim, int block_size, size_t block_stride, int row_stride,
                               cudaStream_t stream) {
    dim3 grid(T, n_kv_heads);
    size_t smem = (size_t)ATT_WARPS * ATT_GC * (head_dim + 2) * sizeof(float);
    float scale = 1.0f / sqrtf((float)head_dim); // as the reference forms it
    k_attention_v1<TC, E><<<grid, ATT_WARPS * 32, smem, stream>>>(
        out, q, (const TC *)k_cache, (const TC *)v_cache, tok_seq, positions, block_tables,
        max_blocks, n_heads, n_kv_heads, head_dim, block_size, block_stride, row_stride, scale);
    return cudaGetLastError();
}

// the arguments of ls_cu_attention
typedef struct {
    s_out_t out;
    const float *q;
    const void *k_cache, *v_cache;
    const int32_t *tok_seq, *positions, *block_tables;
    int max_blocks, T, n_heads, n_kv_heads, head_dim, block_size;
    size_t block_stride;
    int row_stride;
    cudaStream_t stream;
} s_args_t;

// k_attention_v2 and k_attention_tc share this signature
typedef void (*s_kern_t)(s_out_t, const float *, const void *, const void *, const int32_t *,
                         const int32_t *, const int32_t *, int, int, int, int, int, size_t, int,
                         int, float, int, int);

// per kernel and device: set up once; act[cs][W] = 1 + how many clusters of cs CTAs of W
// warps run at once (0: not asked yet)
typedef struct {
    int ready, bin;
    short act[9][AT_MAXW + 1];
} s_kinfo_t;

static int s_active(s_kern_t kern, s_kinfo_t *ki, int cs, int W, size_t smem) {
    if (!ki->act[cs][W]) {
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = cs, attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(cs);
        cfg.blockDim = dim3(W * 32);
        cfg.dynamicSmemBytes = smem;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        int n = 0;
        if (cudaOccupancyMaxActiveClusters(&n, (const void *)kern, &cfg) != cudaSuccess)
            n = 0;
        cudaGetLastError(); // a refusal only means: does not fit
        ki->act[cs][W] = (short)(1 + (n < 30000 ? n : 30000));
    }
    return ki->act[cs][W] - 1;
}

// Plans and launches kern: `ring` bytes of shared memory per warp, kps keys per warp step,
// gc query heads per item. Items = (token, kv head, pass of gc heads). Many items (>= 90%
// of a wave of 12-warp CTAs): one CTA each, with as many warps as keep the grid in one wave
// (12 per SM) but at least AT_MINW (several waves then), at least AT_MINSTEP steps per warp.
// Few items (sm_90) on a short context: one CTA each, two steps a warp (AT_SHORT). Few items
// on a longer one: the keys of an item split over a cluster of cs CTAs (2..8, the portable
// sizes: 9..16 measured no faster in the step, kernels/cuda/dev/README.md "clusters past
// 8"), cs and W chosen to hold the most warps with every cluster of the grid resident at
// once, as the occupancy query counts them (clusters sit inside one GPC: how many fit
// depends on the GPCs' SM counts), and no more CTAs than SMs; ties go to the larger cluster
// (more SMs). No memory, no synchronization: capturable. plan, or NULL: {cs, W} to launch instead of the planned ones (the dev bench
// compares plans).
static cudaError_t s_launch(s_kern_t kern, s_kinfo_t *ki, size_t ring, int kps, int gc,
                            const s_args_t *a, const int *plan) {
    size_t state = (size_t)(gc * a->head_dim + 2 * gc) * 4;
    int smem = ls_cu_props()->smem_optin;
    if (!ki->ready) { // up to 12 warps' rings: past the 48 KB a launch gets by default
        size_t most = AT_MAXW * ring + (AT_GC * 256 + 2 * AT_GC) * 4; // any head_dim
        cudaFuncAttributes fa;
        cudaError_t e = cudaFuncSetAttribute((const void *)kern,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)(most < (size_t)smem ? most : smem));
        if (e == cudaSuccess)
            e = cudaFuncGetAttributes(&fa, (const void *)kern);
        if (e != cudaSuccess)
            return e;
        ki->bin = fa.binaryVersion; // the code that runs: the sm_80 one has no cluster merge
        ki->ready = 1;
    }
    int group = a->n_heads / a->n_kv_heads, n_pass = (group + gc - 1) / gc;
    long sms = ls_cu_props()->sms, items = (long)a->T * a->n_kv_heads * n_pass,
         slots = (long)AT_MAXW * sms;
    long wcap = ((long)smem - (long)state) / (long)ring; // sm_80: 9 warps
    wcap = wcap < AT_MAXW ? wcap : AT_MAXW;
    // warps a CTA of a 1/cs share of the keys can use (>= AT_MINSTEP steps each)
    auto keys_of = [&](int cs) { return (long)((a->max_blocks + cs - 1) / cs) * a->block_size; };
    auto wmax = [&](int cs) {
        long w = keys_of(cs) / kps / AT_MINSTEP;
        return (int)(w < 1 ? 1 : w < wcap ? w : wcap);
    };
    // as many warps as a wave holds, but at least AT_MINW: with about as many items as warp
    // slots, one warp an item leaves a third of the slots empty in a single wave, where three
    // or more fill several waves to their tails (dev_attention "tc plans", H100: 128 x 4096
    // keys 824 us on one warp a CTA, 714-719 on 3 to 12)
    int cs = 1, W;
    {
        long w = slots / items;
        w = w < AT_MINW ? AT_MINW : w;
        W = (int)(w < wmax(1) ? w : wmax(1));
    }
    // a short context among few items: one CTA an item, two steps a warp, when that leaves
    // each warp at most AT_SHORT steps; a cluster's launch and merge cost more than the steps
    // its CTAs save (dev_attention "tc plans", H100: 1 x 128 keys 5.5 us on 8 warps against
    // 11.1 in a cluster of 7 one-warp CTAs)
    bool few = ki->bin >= 90 && items * AT_MAXW * 10 < slots * 9;
    long steps = keys_of(1) / kps, ws = steps / 2;
    ws = ws < 1 ? 1 : ws < wcap ? ws : wcap;
    if (few && (steps + ws - 1) / ws <= AT_SHORT)
        W = (int)ws;
    else if (few) {
        long best = items * W;
        // Clusters of at most sms / items CTAs, no more CTAs than SMs: where SMs must take
        // two, how the CTAs land depends on what the SMs ran just before. Llama-3-8B at
        // batch 4 (32 items, 1K keys, H100) in clusters of 7 CTAs of 5 warps took 15.4 us
        // when launched as q,k,v's GEMV drained and 24.8 on an idle GPU (in the step with 4
        // adapters, where RoPE waits for the LoRA's expand); with 3 CTAs of 11 warps that
        // step takes 6.14-6.18 ms against 6.49-6.54 (at 16K keys 8.96-9.02 against
        // 9.69-9.71), the base step -1.6% to +1.2% (kernels/cuda/dev/README.md "Decode
        // attention").
        for (int c = 2; c <= 8; c++) {
            if (items * c > sms || keys_of(c) < (long)kps * AT_MINSTEP)
                break;
            for (int w = wmax(c); w >= 1; w--) {
                if (items * c * w > slots)
                    continue;
                if (s_active(kern, ki, c, w, w * ring + state) >= items) {
                    if (items * c * w >= best)
                        best = items * c * w, cs = c, W = w;
                    break;
                }
            }
        }
    }
    if (plan)
        cs = plan[0], W = plan[1];
    int bs_shift = -1;
    if ((a->block_size & (a->block_size - 1)) == 0)
        for (bs_shift = 0; (1 << bs_shift) < a->block_size; bs_shift++)
            ;
    float qscale = 1.0f / sqrtf((float)a->head_dim) * 1.44269504088896341f; // scale*log2(e)
    s_last_w = W, s_last_cs = cs;
    // programmatic dependent launch on sm_90+ (the kernels start with ls_dep_enter); no
    // cluster attribute at all for single CTAs (sm_80)
    return ls_cu_launch_dep_cs(kern, dim3((unsigned)(a->T * n_pass * cs), a->n_kv_heads),
                               dim3(W * 32), (size_t)(W * ring + state), a->stream, cs, a->out,
                               a->q, a->k_cache, a->v_cache, a->tok_seq, a->positions,
                               a->block_tables, a->max_blocks, a->n_heads, a->n_kv_heads,
                               a->head_dim, a->block_size, a->block_stride, bs_shift,
                               a->row_stride, qscale, n_pass, cs);
}

// one s_kinfo_t per kernel and device
template <typename TC, int L, int NC, int GC> static cudaError_t s_run_v2(const s_args_t *a) {
    static s_kinfo_t ki[LS_CU_MAX_DEVICES];
    return s_launch(k_attention_v2<TC, L, NC, GC>, &ki[ls_cu_device()],
                    (size_t)AT_NST * 2 * NC * 32 * 16, 32 / L, GC, a, NULL);
}
template <int D> static cudaError_t s_run_tc(const s_args_t *a, const int *plan = NULL) {
    static s_kinfo_t ki[LS_CU_MAX_DEVICES];
    return s_launch(k_attention_tc<D>, &ki[ls_cu_device()],
                    (size_t)TC_NST * 2 * TC_KEYS * D * 2, TC_KEYS, 4, a, plan);
}

cudaError_t ls_cu_attention(void *out, ls_cu_dtype_t out_dt, const float *q, const void *k_cache,
                            const void *v_cache, ls_cu_dtype_t cache_dt,
                            const int32_t *tok_seq, const int32_t *positions,
                            const int32_t *block_tables, int max_blocks, int T, int n_heads,
                            int n_kv_heads, int head_dim, int block_size, int row_stride,
                            size_t block_stride, cudaStream_t stream) {
    assert(n_kv_heads > 0 && n_heads % n_kv_heads == 0 && row_stride >= n_heads * head_dim);
    assert(head_dim > 0 && head_dim <= 256);
    if (T == 0)
        return cudaSuccess;
    assert(out_dt == LS_CU_F32 || out_dt == LS_CU_BF16 || out_dt == LS_CU_F16);
    s_args_t a = {{out, (int)out_dt}, q, k_cache,    v_cache,  tok_seq,    positions,
                  block_tables, max_blocks, T, n_heads, n_kv_heads, head_dim,
                  block_size, block_stride, row_stride, stream};
    int esz = cache_dt == LS_CU_F32 ? 4 : 2, row_bytes = head_dim * esz;
    int aligned = row_bytes % 16 == 0 && (uintptr_t)k_cache % 16 == 0 &&
                  (uintptr_t)v_cache % 16 == 0;
    if (aligned && cache_dt == LS_CU_BF16 && block_size % 8 == 0 &&
        (head_dim == 64 || head_dim == 128) && ls_cu_props()->cc >= 8) {
        cudaError_t e = head_dim == 64 ? s_run_tc<64>(&a) : s_run_tc<128>(&a);
        return e;
    }
    if (aligned) {
        int nch = row_bytes / 16; // 16-byte chunks per row: L lanes x NC chunks cover them
        int L = nch <= 16 ? 8 : nch <= 32 ? 16 : 32, NC = nch <= 8 ? 1 : 2;
        int group = n_heads / n_kv_heads, GC = group >= 3 ? 4 : group;
#define LS_ATT_V2_G(LL, NN)                                                                   \
    if (GC == 1)                                                                              \
        return s_run_v2<TC, LL, NN, 1>(&a);                                                   \
    else if (GC == 2)                                                                         \
        return s_run_v2<TC, LL, NN, 2>(&a);                                                   \
    else                                                                                      \
        return s_run_v2<TC, LL, NN, 4>(&a)
        LS_CU_DISPATCH(cache_dt, TC,
            if (L == 8 && NC == 1) LS_ATT_V2_G(8, 1);
            else if (L == 8) LS_ATT_V2_G(8, 2);
            else if (L == 16) LS_ATT_V2_G(16, 2);
            else LS_ATT_V2_G(32, 2));
#undef LS_ATT_V2_G
        return cudaErrorInvalidValue;
    }
    s_last_w = 0, s_last_cs = 0;
#define LS_ATT_E(E)                                                                           \
    LS_CU_DISPATCH(cache_dt, TC,                                                              \
        return s_launch_v1<TC, E>(a.out, q, k_cache, v_cache, tok_seq, positions, block_tables,\
                                  max_blocks, T, n_heads, n_kv_heads, head_dim, block_size,   \
                                  block_stride, row_stride, stream))
    if (head_dim <= 64) {
        LS_ATT_E(2);
    } else if (head_dim <= 128) {
        LS_ATT_E(4);
    } else {
        LS_ATT_E(8);
    }
#undef LS_ATT_E
    return cudaErrorInvalidValue;
}

// the arguments of ls_cu_attention_prefill
typedef struct {
    s_out_t out;
    const float *q;
    const void *k_cache, *v_cache;
    const int32_t *seqs;
    int n_seqs, max_q;
    const int32_t *positions, *block_tables;
    int max_blocks, n_heads, n_kv_heads, head_dim, block_size, row_stride;
    size_t block_stride;
    cudaStream_t stream;
} s_pf_args_t;

// Production tiles of k_attention_prefill (sm_80 .. sm_89, and head_dim 64 everywhere): 128
// query rows (4 warps of 32 rows), keys in tiles of 64 (head_dim 64) or 32 (128: 249
// registers; 64 keys take 255 and spill). On sm_90, head_dim 128: k_attention_prefill_wg<64,
// 2> (H100: 1.25-1.39 x k_attention_prefill's speed on prompts of 512 .. 8K tokens;
// kernels/cuda/dev/README.md).
enum { PF_MT = 2, PF_NW = 4, PF_BM = 16 * PF_MT * PF_NW };

// k_attention_prefill and k_attention_prefill_wg share this signature
typedef void (*s_pf_kern_t)(s_out_t, const float *, const void *, const void *, const int32_t *,
                            const int32_t *, const int32_t *, int, int, int, int, int, size_t,
                            int, float);

// One launch of a prefill kernel of bm query rows a CTA, nt threads and smem bytes of dynamic
// shared memory for head_dim d; ready[device]: its shared memory set up there (on the first
// launch: past the 48 KB a launch gets by default).
static cudaError_t s_pf_launch(s_pf_kern_t kern, int *ready, int bm, int nt, size_t smem, int d,
                               const s_pf_args_t *a) {
    int dev = ls_cu_device();
    if (!ready[dev]) {
        cudaError_t e = cudaFuncSetAttribute((const void *)kern,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem);
        if (e != cudaSuccess)
            return e;
        ready[dev] = 1;
    }
    int group = a->n_heads / a->n_kv_heads, tq = bm / group;
    assert(a->head_dim == d && tq >= 1 && a->n_seqs <= 65535 &&
           (a->max_q + tq - 1) / tq <= 65535);
    int bs_shift = -1;
    if ((a->block_size & (a->block_size - 1)) == 0)
        for (bs_shift = 0; (1 << bs_shift) < a->block_size; bs_shift++)
            ;
    float qscale = 1.0f / sqrtf((float)d) * 1.44269504088896341f; // scale*log2(e)
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim =
        dim3((unsigned)a->n_kv_heads, (unsigned)((a->max_q + tq - 1) / tq), (unsigned)a->n_seqs);
    cfg.blockDim = dim3((unsigned)nt);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = a->stream;
    return cudaLaunchKernelEx(&cfg, kern, a->out, a->q, a->k_cache, a->v_cache, a->seqs,
                              a->positions, a->block_tables, a->max_blocks, a->n_heads,
                              a->n_kv_heads, a->block_size, bs_shift, a->block_stride * 2,
                              a->row_stride, qscale);
}

// One launch of k_attention_prefill<D, MT, NW, BN>: Q (BM rows), then 2 stages of K and V.
template <int D, int MT, int NW, int BN> static cudaError_t s_run_prefill(const s_pf_args_t *a) {
    constexpr int BM = 16 * MT * NW;
    static int ready[LS_CU_MAX_DEVICES];
    return s_pf_launch(k_attention_prefill<D, MT, NW, BN>, ready, BM, NW * 32,
                       (size_t)(BM + 4 * BN) * 2 * D, D, a);
}

// One launch of k_attention_prefill_wg<BN, MINB>: 1,024 bytes to align the tiles at, Q (128
// rows), then 2 stages of K and V.
template <int BN, int MINB> static cudaError_t s_run_prefill_wg(const s_pf_args_t *a) {
    static int ready[LS_CU_MAX_DEVICES];
    return s_pf_launch(k_attention_prefill_wg<BN, MINB>, ready, 128, 256,
                       1024 + (size_t)(128 + 4 * BN) * 2 * 128, 128, a);
}

// Whether k_attention_prefill_wg runs here: the code loaded for this device is the sm_90a
// build (compute capability 9.0), as the decode kernels' cluster merge decides by the binary
// that runs; other cards load the sm_80 build (or its PTX), where the kernel traps.
static int s_pf_wg_ok() {
    static int ok[LS_CU_MAX_DEVICES]; // 1 + the answer (0: not asked yet)
    int &o = ok[ls_cu_device()];
    if (!o) {
        cudaFuncAttributes fa;
        o = 1 + (cudaFuncGetAttributes(&fa, (const void *)k_attention_prefill_wg<64, 2>) ==
                     cudaSuccess &&
                 fa.binaryVersion == 90);
        cudaGetLastError(); // a refusal only means: not here
    }
    return o - 1;
}

ls_cu_prefill_kernel_t ls_cu_attention_prefill_which(int head_dim) {
    return head_dim == 128 && s_pf_wg_ok() ? LS_CU_PREFILL_WGMMA : LS_CU_PREFILL_MMA;
}

int ls_cu_attention_prefill_ok(const void *out, const float *q, const void *k_cache,
                               const void *v_cache, ls_cu_dtype_t cache_dt, int n_heads,
                               int n_kv_heads, int head_dim, int row_stride) {
    return ls_cu_props()->cc >= 8 && cache_dt == LS_CU_BF16 &&
           (head_dim == 64 || head_dim == 128) && n_heads / n_kv_heads <= PF_BM &&
           row_stride % 4 == 0 && (uintptr_t)q % 16 == 0 && (uintptr_t)out % 8 == 0 &&
           (uintptr_t)k_cache % 16 == 0 && (uintptr_t)v_cache % 16 == 0;
}

cudaError_t ls_cu_attention_prefill_kernel(void *out, ls_cu_dtype_t out_dt, const float *q,
                                           const void *k_cache,
                                           const void *v_cache, ls_cu_dtype_t cache_dt,
                                           const int32_t *seqs, int n_seqs, int max_q,
                                           const int32_t *positions,
                                           const int32_t *block_tables, int max_blocks,
                                           int n_heads, int n_kv_heads, int head_dim,
                                           int block_size, int row_stride, size_t block_stride,
                                           ls_cu_prefill_kernel_t which, cudaStream_t stream) {
    assert(n_kv_heads > 0 && n_heads % n_kv_heads == 0 && row_stride >= n_heads * head_dim);
    // pages 16-byte aligned, as the rows cp.async copies
    assert(block_stride % 8 == 0 && block_stride >= (size_t)block_size * n_kv_heads * head_dim);
    assert(ls_cu_attention_prefill_ok(out, q, k_cache, v_cache, cache_dt, n_heads, n_kv_heads,
                                      head_dim, row_stride));
    if (which == LS_CU_PREFILL_WGMMA && ls_cu_attention_prefill_which(head_dim) != which)
        return cudaErrorNotSupported;
    if (n_seqs == 0 || max_q == 0)
        return cudaSuccess;
    assert(out_dt == LS_CU_F32 || out_dt == LS_CU_BF16 || out_dt == LS_CU_F16);
    s_pf_args_t a = {{out, (int)out_dt}, q, k_cache,    v_cache,  seqs,       n_seqs,
                     max_q,      positions, block_tables, max_blocks, n_heads, n_kv_heads,
                     head_dim,   block_size, row_stride, block_stride, stream};
    if (which == LS_CU_PREFILL_WGMMA)
        return s_run_prefill_wg<64, 2>(&a);
    return head_dim == 64 ? s_run_prefill<64, PF_MT, PF_NW, 64>(&a)
                          : s_run_prefill<128, PF_MT, PF_NW, 32>(&a);
}

cudaError_t ls_cu_attention_prefill(void *out, ls_cu_dtype_t out_dt, const float *q,
                                    const void *k_cache,
                                    const void *v_cache, ls_cu_dtype_t cache_dt,
                                    const int32_t *seqs, int n_seqs, int max_q,
                                    const int32_t *positions, const int32_t *block_tables,
                                    int max_blocks, int n_heads, int n_kv_heads, int head_dim,
                                    int block_size, int row_stride, size_t block_stride,
                                    cudaStream_t stream) {
    return ls_cu_attention_prefill_kernel(out, out_dt, q, k_cache, v_cache, cache_dt, seqs, n_seqs,
                                          max_q, positions, block_tables, max_blocks, n_heads,
                                          n_kv_heads, head_dim, block_size, row_stride,
                                          block_stride, ls_cu_attention_prefill_which(head_dim),
                                          stream);
}

// qsort's order for (context, tokens, sequence) triples: longest context first
static int s_ctx_desc(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a < b) - (a > b);
}

// the pick's cost of one key of the prefill kernel which's longest walk, in decode-shaped pairs
static int64_t s_pf_key_pairs(ls_cu_prefill_kernel_t which) {
    return which == LS_CU_PREFILL_WGMMA ? LS_CU_PREFILL_KEY_PAIRS_WGMMA
                                        : LS_CU_PREFILL_KEY_PAIRS_MMA;
}

int ls_cu_attention_prefill_pick(const int32_t *q_indptr, const int32_t *ctx_lens, int n_seqs,
                                 ls_cu_prefill_kernel_t which, int32_t *seqs) {
    // the candidates as (context, tokens, sequence), longest context first
    int m = 0;
    for (int s = 0; s < n_seqs; s++) {
        int n = q_indptr[s + 1] - q_indptr[s];
        if (n >= LS_CU_PREFILL_MIN_Q)
            seqs[3 * m] = ctx_lens[s], seqs[3 * m + 1] = n, seqs[3 * m + 2] = s, m++;
    }
    if (m == 0)
        return 0;
    qsort(seqs, (size_t)m, 3 * sizeof *seqs, s_ctx_desc);
    // cost in pairs of the decode-shaped kernel: those of the candidates left to it, plus
    // the kernel's key cost per key of the longest context the prefill kernel takes
    int64_t key = s_pf_key_pairs(which);
    int64_t above = 0, total = 0; // pairs of the candidates of longer contexts; of all
    for (int i = 0; i < m; i++) {
        int64_t c = seqs[3 * i], n = seqs[3 * i + 1];
        total += n * c - n * (n - 1) / 2; // causal pairs of queries at c - n .. c - 1
    }
    int64_t best = total, limit = 0; // limit: the longest context taken (0: none)
    for (int i = 0; i < m; i++) {
        int64_t c = seqs[3 * i], n = seqs[3 * i + 1];
        if ((i == 0 || seqs[3 * i - 3] != c) && above + key * c < best)
            best = above + key * c, limit = c;
        above += n * c - n * (n - 1) / 2;
    }
    int k = 0;
    for (int s = 0; s < n_seqs; s++) {
        int t0 = q_indptr[s], n = q_indptr[s + 1] - t0;
        if (n >= LS_CU_PREFILL_MIN_Q && ctx_lens[s] <= limit)
            seqs[3 * k] = s, seqs[3 * k + 1] = t0, seqs[3 * k + 2] = n, k++;
    }
    return k;
}
