/*  kernels/cuda/dev/dev_prefill.cu — prefill attention: the query-tiled kernel
    (k_attention_prefill) in several tile shapes against the decode-shaped path that took
    prefills before it (ls_cu_attention: every query token walks its own prefix), validated
    against the CPU reference (ls_attention_forward), then timed.

    Llama-3-8B attention: H=32 query heads on KV=8 kv heads, D=128, bf16 cache in 16-token
    blocks (shuffled), a page holding one layer's block of K and of V, one layer (a prompt's 32 layers are 32 times these). Flops counted:
    QKᵀ and PV of every causal (query, key) pair, 4 x H x D per pair (what the base-path
    benchmark counts); TFLOP/s against that.

    Sections:
    - validation: two chunks on cached prefixes (300 + 200, 0 + 333) and a decode in one
      launch, and a group-8 head_dim-64 case; the prefill kernel must write exactly the rows
      of its sequences (the others stay NaN), within the bf16 bound of test_gpu_ops (NMSE <=
      2e-5); the decode-shaped path within 1e-10;
    - prompts of 512, 2K, 8K tokens alone (positions 0..P-1, keys 0..p each): µs and TFLOP/s
      per tile shape and for the old path, and the old path's time over the production
      shape's;
    - crossover: a chunk of n = 1 .. 128 queries on a 2,048-token cached prefix, µs of both
      paths, and which one the backend's ls_cu_attention_prefill_pick takes;
    - steps of several sequences (chunks on like prefixes, short prompts, a short chunk on a
      long context beside a longer chunk): µs with every sequence on the old path, with
      every one it may take (>= LS_CU_PREFILL_MIN_Q tokens) on the prefill kernel, and as the
      pick splits them (production; the old path's rows first, one launch each).

    Tile shapes (D, MT m-tiles of 16 rows a warp, NW warps, BN keys a tile; production:
    attention.cu's PF_* and ls_cu_attention_prefill):
      128/2/4/32  production for head_dim 128 (128 query rows, 247 registers)
      128/2/4/64  64 keys a tile: 255 registers and spills (ptxas, sm_90a)
      128/1/4/64  64 query rows a CTA
      128/1/8/64  128 query rows over 8 warps of 16 (one CTA an SM)
      64/2/4/64   production for head_dim 64
      64/1/4/64
    and k_prefill_wg (below: warpgroup MMA, sm_90a; 128 query rows, head_dim 128), keys a tile:
      wgmma/64    64 keys, 2 CTAs an SM (registers capped at 128: 84 bytes spilled)
      wgmma/128   128 keys, 1 CTA an SM (207 registers)

    Usage: dev_prefill [VERSION ...]: the production shape and the versions named (default:
    every version). Exit 1 if a version fails its check.
*/
#include "../attention.cu"

#include "dev_common.cuh"

#include <cstring>

extern "C" {
#include "ops.h"
}

// -- the wgmma versions (sm_90a) -------------------------------------------------------------
//
// k_prefill_wg: the production kernel's plan (a CTA per (query tile of 128 rows, kv head),
// keys walked upward in tiles of BN through the block table by cp.async, two stages, online
// softmax in base 2 on the score registers, q and p rounded to bf16) with Hopper's warpgroup
// MMA instead of mma.sync: 2 warpgroups of 4 warps, each owning 64 rows (warp w of a
// warpgroup rows 16w .. 16w + 15 of its 64, the m16n8 fragment layout);
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
// the other warpgroup, and at BN = 64 the SM's second CTA, fill the tensor cores then.
// MINB: CTAs an SM (2 caps registers at 128). Head_dim 128, bf16 caches.

// descriptor of a 128-byte-swizzled tile in shared memory at addr: lbo and sbo in bytes
// (PTX ISA, "Matrix Descriptor Format"; K-major operands ignore lbo)
__device__ __forceinline__ uint64_t s_wg_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    return (uint64_t)((addr & 0x3ffff) >> 4) | (uint64_t)((lbo & 0x3ffff) >> 4) << 16 |
           (uint64_t)((sbo & 0x3ffff) >> 4) << 32 | (uint64_t)1 << 62;
}
__device__ __forceinline__ void s_wg_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void s_wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void s_wg_wait0() {
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// the accumulators as the compiler must see them: written where the wait is, not before
template <int R> __device__ __forceinline__ void s_wg_keep(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}
// d (m64 x N, fp32) = or += a (m64 x k16, bf16) b (k16 x N, bf16); ss: both by descriptor,
// rs: a in registers, b transposed. The accumulators' operands: S_WG_D32 for N = 64,
// S_WG_D32 and S_WG_D64 for N = 128, their registers named by S_WG_R32 and S_WG_R64.
#define S_WG_R32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define S_WG_R64 S_WG_R32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, " \
                 "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define S_WG_D32 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), \
    "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), \
    "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), \
    "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), \
    "+f"(d[30]), "+f"(d[31])
#define S_WG_D64 \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), \
    "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), \
    "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), \
    "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), \
    "+f"(d[62]), "+f"(d[63])
__device__ __forceinline__ void s_wg_ss64(float (&d)[32], uint64_t a, uint64_t b, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" S_WG_R32 "}, "
                 "%32, %33, p, 1, 1, 0, 0;\n}\n"
                 : S_WG_D32
                 : "l"(a), "l"(b), "r"(acc));
}
__device__ __forceinline__ void s_wg_ss128(float (&d)[64], uint64_t a, uint64_t b, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" S_WG_R64 "}, "
                 "%64, %65, p, 1, 1, 0, 0;\n}\n"
                 : S_WG_D32, S_WG_D64
                 : "l"(a), "l"(b), "r"(acc));
}
__device__ __forceinline__ void s_wg_rs128(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" S_WG_R64 "}, "
                 "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : S_WG_D32, S_WG_D64
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

template <int BN, int MINB>
__global__ void __launch_bounds__(256, MINB)
k_prefill_wg(float *out, const float *q, const void *kc_, const void *vc_, const int32_t *seqs,
             const int32_t *positions, const int32_t *block_tables, int max_blocks, int n_heads,
             int n_kv_heads, int block_size, int bs_shift, int block_rows, int row_stride,
             float qscale) {
    constexpr int D = 128, NT = 256, BM = 128, RB = 2 * D, NCH = D / 8, HB = RB / 2; // HB: half a row
    constexpr int STAGE = 2 * BN * RB; // bytes: BN K rows, then BN V rows
    constexpr int CPT = BN * NCH / NT; // chunks a thread copies per tile, of K and of V
    constexpr int NS = BN / 2;         // score registers a thread (m64 x BN over 128 threads)
    static_assert(BN == 64 || BN == 128, "tile shape");
    extern __shared__ uint4 s_sm[];
    __shared__ int s_pos[BM];     // the tile's tokens' positions (-1 past the sequence)
    __shared__ int s_slot[3][BN]; // cache slot of each key of tiles j .. j+2 (-1: past pmax)
    __shared__ int s_whi[8];      // the largest position each warp read (-> the tile's)
    __shared__ int s_rhi[8];      // the largest position of each warp's rows
    const char *kc = (const char *)kc_, *vc = (const char *)vc_;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
    const int g = lane >> 2, qd = lane & 3;
    const int kvh = blockIdx.x, group = n_heads / n_kv_heads, tq = BM / group;
    const int seq = seqs[3 * blockIdx.z], t_first = seqs[3 * blockIdx.z + 1];
    const int n_tok = seqs[3 * blockIdx.z + 2], n_tiles = (n_tok + tq - 1) / tq;
    if ((int)blockIdx.y >= n_tiles)
        return;
    const int tile = n_tiles - 1 - (int)blockIdx.y; // the latest tokens (most keys) first
    const int tok0 = t_first + tile * tq, ntok = min(tq, n_tok - tile * tq);
    const int nrows = ntok * group;
    const int32_t *table = block_tables + (size_t)seq * max_blocks;
    const size_t kv_bytes = (size_t)n_kv_heads * RB;
    kc += (size_t)kvh * RB, vc += (size_t)kvh * RB;
    // the tiles at the first 1,024-byte boundary of the dynamic shared memory
    const unsigned sm0 = (unsigned)__cvta_generic_to_shared(s_sm);
    const unsigned q_s = (sm0 + 1023u) & ~1023u, kv_s = q_s + BM * RB;
    char *q_sm = (char *)s_sm + (q_s - sm0);

    {
        int p = tid < ntok ? positions[tok0 + tid] : -1;
        if (tid < BM)
            s_pos[tid] = p;
        p = __reduce_max_sync(0xffffffffu, p);
        if (lane == 0)
            s_whi[warp] = p;
    }
    // Q (BM, D) as bf16 of q * qscale, rows past nrows zero, swizzled
    {
        constexpr int F4 = D / 4; // float4s a row
#pragma unroll 4
        for (int i = 0; i < BM * F4 / NT; i++) {
            int f = tid + i * NT, r = f / F4, c4 = f % F4, c = c4 >> 1;
            float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r < nrows) {
                int tk = r / group, hd = kvh * group + r - tk * group;
                x = __ldg(reinterpret_cast<const float4 *>(
                              q + (size_t)(tok0 + tk) * row_stride + (size_t)hd * D) + c4);
            }
            uint2 u = {s_pack(x.x * qscale, x.y * qscale), s_pack(x.z * qscale, x.w * qscale)};
            *reinterpret_cast<uint2 *>(q_sm + (c >> 3) * (BM * HB) + r * HB +
                                       (((c & 7) ^ (r & 7)) << 4) + (c4 & 1) * 8) = u;
        }
    }
    __syncthreads();
    int pmax = 0; // the tile's largest position: its last key
#pragma unroll
    for (int w = 0; w < 8; w++)
        pmax = max(pmax, s_whi[w]);
    const int nkt = pmax / BN + 1;
    // this lane's rows (h: row g or g + 8 of the warp's 16): their positions, pmax for rows
    // past the tile; the warp's least and largest position over its rows
    const int row0 = 64 * wg + 16 * (warp & 3);
    int rpos[2], wlo = 0x7fffffff, whi = -1;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int r = row0 + g + 8 * h;
        int p = r < nrows ? s_pos[r / group] : -1;
        whi = max(whi, p);
        wlo = p >= 0 ? min(wlo, p) : wlo;
        rpos[h] = p >= 0 ? p : pmax;
    }
    whi = __reduce_max_sync(0xffffffffu, whi);
    wlo = __reduce_min_sync(0xffffffffu, wlo);
    if (lane == 0)
        s_rhi[warp] = whi;

    auto page_of = [&](int key) {
        return __ldg(table + (bs_shift >= 0 ? key >> bs_shift : key / block_size));
    };
    auto slot_in = [&](int page, int key) { // the key's row in the cache, blocks block_rows apart
        int off = bs_shift >= 0 ? key & (block_size - 1) : key % block_size;
        return page * block_rows + off;
    };
    if (tid < BN)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            int key = j * BN + tid;
            s_slot[j][tid] = key <= pmax ? slot_in(page_of(key), key) : -1;
        }
    __syncthreads();
    // the warpgroup's largest row position: uniform over its 128 threads
    const int gwhi =
        max(max(s_rhi[4 * wg], s_rhi[4 * wg + 1]), max(s_rhi[4 * wg + 2], s_rhi[4 * wg + 3]));

    // tile j's K and V rows into stage j % 2, swizzled; keys past pmax zero-filled
    auto issue = [&](int j, int ring) {
        const unsigned st = kv_s + (j & 1) * STAGE;
#pragma unroll
        for (int i = 0; i < CPT; i++) {
            int f = tid + i * NT, r = f / NCH, c = f % NCH;
            int slot = s_slot[ring][r];
            size_t so = (size_t)max(slot, 0) * kv_bytes + c * 16;
            unsigned d = st + (c >> 3) * (BN * HB) + r * HB + (((c & 7) ^ (r & 7)) << 4);
            int n = slot >= 0 ? 16 : 0;
            s_cp16(d, kc + so, n);
            s_cp16(d + BN * RB, vc + so, n);
        }
    };
    issue(0, 0);
    s_cp_commit();

    float o[64], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 64; i++)
        o[i] = 0.0f;
    const unsigned qw_s = q_s + 64 * wg * HB; // the warpgroup's 64 rows of Q
    int ring1 = 1, ring2 = 2;
    for (int j = 0; j < nkt; j++) {
        const int k0 = j * BN;
        const int key2 = k0 + 2 * BN + tid;
        const bool has2 = tid < BN && key2 <= pmax;
        int page2 = has2 ? page_of(key2) : 0;
        if (j + 1 < nkt)
            issue(j + 1, ring1);
        s_cp_commit();
        s_cp_wait<1>();
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); // (and Q's stores)
        __syncthreads();
        if (k0 <= gwhi) {
            const unsigned kst = kv_s + (j & 1) * STAGE, vst = kst + BN * RB;
            float s[NS];
            s_wg_fence();
#pragma unroll
            for (int ks = 0; ks < D / 16; ks++) { // dims 16ks .. 16ks + 15
                uint64_t da = s_wg_desc(qw_s + (ks >> 2) * (BM * HB) + (ks & 3) * 32, 16, 1024);
                uint64_t db = s_wg_desc(kst + (ks >> 2) * (BN * HB) + (ks & 3) * 32, 16, 1024);
                if constexpr (BN == 64)
                    s_wg_ss64(s, da, db, ks);
                else
                    s_wg_ss128(s, da, db, ks);
            }
            s_wg_commit();
            s_wg_wait0();
            s_wg_keep(s);
            // s[4n + e]: row g + 8 (e >> 1) of the warp's, key k0 + 8n + 2qd + (e & 1)
            if (k0 + BN - 1 > wlo)
#pragma unroll
                for (int n = 0; n < BN / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (k0 + 8 * n + 2 * qd + (e & 1) > rpos[e >> 1])
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
                    pa[kk][i] = s_pack(s_ex2(s[8 * kk + 2 * i] - mn[i & 1]),
                                       s_ex2(s[8 * kk + 2 * i + 1] - mn[i & 1]));
                l[0] += (s_lo(pa[kk][0]) + s_hi(pa[kk][0])) + (s_lo(pa[kk][2]) + s_hi(pa[kk][2]));
                l[1] += (s_lo(pa[kk][1]) + s_hi(pa[kk][1])) + (s_lo(pa[kk][3]) + s_hi(pa[kk][3]));
            }
            s_wg_keep(o);
            s_wg_fence();
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) // V rows 16kk .. 16kk + 15: two 8-key atoms
                s_wg_rs128(o, pa[kk], s_wg_desc(vst + kk * 16 * HB, BN * HB, 1024));
            s_wg_commit();
            s_wg_wait0();
            s_wg_keep(o);
        }
        if (tid < BN)
            s_slot[ring2][tid] = has2 ? slot_in(page2, key2) : -1;
        ring1 = ring2;
        ring2 = ring2 == 2 ? 0 : ring2 + 1;
        __syncthreads(); // stage j % 2 free for tile j + 2; tile j + 2's slots visible
    }
    s_cp_wait<0>();

#pragma unroll
    for (int h = 0; h < 2; h++) {
        float lt = l[h];
        lt += __shfl_xor_sync(0xffffffffu, lt, 1);
        lt += __shfl_xor_sync(0xffffffffu, lt, 2);
        const int r = row0 + g + 8 * h;
        if (r < nrows) {
            const float inv = 1.0f / lt;
            const int tk = r / group, hd = kvh * group + r - tk * group;
            float *orow = out + (size_t)(tok0 + tk) * n_heads * D + (size_t)hd * D + 2 * qd;
#pragma unroll
            for (int n = 0; n < D / 8; n++)
                *reinterpret_cast<float2 *>(orow + 8 * n) =
                    make_float2(o[4 * n + 2 * h] * inv, o[4 * n + 2 * h + 1] * inv);
        }
    }
}

// One launch of k_prefill_wg<BN, MINB> (head_dim 128), as s_run_prefill launches the production
// kernel
template <int BN, int MINB> static cudaError_t s_run_wg(const s_pf_args_t *a) {
    constexpr int BM = 128;
    const size_t smem = 1024 + (size_t)(BM + 4 * BN) * 2 * 128; // alignment, Q, 2 stages of K, V
    static int ready = 0;
    if (!ready) {
        cudaError_t e = cudaFuncSetAttribute((const void *)k_prefill_wg<BN, MINB>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess)
            return e;
        ready = 1;
    }
    int group = a->n_heads / a->n_kv_heads, tq = BM / group;
    assert(a->head_dim == 128 && tq >= 1);
    int bs_shift = -1;
    if ((a->block_size & (a->block_size - 1)) == 0)
        for (bs_shift = 0; (1 << bs_shift) < a->block_size; bs_shift++)
            ;
    float qscale = 1.0f / sqrtf(128.0f) * 1.44269504088896341f;
    dim3 grid((unsigned)a->n_kv_heads, (unsigned)((a->max_q + tq - 1) / tq), (unsigned)a->n_seqs);
    k_prefill_wg<BN, MINB><<<grid, 256, smem, a->stream>>>(
        a->out, a->q, a->k_cache, a->v_cache, a->seqs, a->positions, a->block_tables, a->max_blocks,
        a->n_heads, a->n_kv_heads, a->block_size, bs_shift, (int)(a->block_stride / ((size_t)a->n_kv_heads * 128)),
        a->row_stride, qscale);
    return cudaGetLastError();
}

// the cache in pages as the KV cache holds it (docs/memory.md), one layer: a page is a block
// of K then one of V, PAGE elements (a block of D = 64's smaller kv_dim leaves the rest unread)
enum { H = 32, KV = 8, D = 128, BS = 16, PAGES = 4352, ROW = (H + 2 * KV) * D, MAXP = 8192,
       PAGE = 2 * BS * KV * D };

typedef cudaError_t (*pf_run_t)(const s_pf_args_t *);
struct version_t {
    const char *name;
    int d;
    pf_run_t run;
};
static const version_t s_versions[] = {
    {"128/2/4/32", 128, s_run_prefill<128, 2, 4, 32>}, {"128/2/4/64", 128, s_run_prefill<128, 2, 4, 64>},
    {"128/1/4/64", 128, s_run_prefill<128, 1, 4, 64>}, {"128/1/8/64", 128, s_run_prefill<128, 1, 8, 64>},
    {"64/2/4/64", 64, s_run_prefill<64, 2, 4, 64>},    {"64/1/4/64", 64, s_run_prefill<64, 1, 4, 64>},
    {"wgmma/64", 128, s_run_wg<64, 2>},                {"wgmma/128", 128, s_run_wg<128, 1>},
};
enum { NV = sizeof s_versions / sizeof s_versions[0] };
static bool s_on[NV]; // the versions this run validates and times (0, production: always)

// a problem on the device: S sequences of nc[s] cached + nn[s] new tokens, the tokens' rows
// packed in order, pages from the pool in shuffled order; pf: every sequence the prefill
// kernel may take (>= LS_CU_PREFILL_MIN_Q tokens), pick: those the backend gives it
struct problem_t {
    int S, T, mb, max_q, n_pf, n_pick, pick_max_q, h, kv, d, row;
    std::vector<int32_t> tok, pos, table, qind, lens, pf, pick, slots;
    int32_t *d_tok, *d_pos, *d_table, *d_pf, *d_pick;
};

static problem_t s_problem(const std::vector<int> &nc, const std::vector<int> &nn, const std::vector<int32_t> &perm,
                           int h, int kv, int d) {
    problem_t p = {};
    p.S = (int)nc.size(), p.h = h, p.kv = kv, p.d = d, p.row = (h + 2 * kv) * d;
    for (int s = 0; s < p.S; s++)
        p.mb = std::max(p.mb, (nc[s] + nn[s] + BS - 1) / BS);
    p.qind.push_back(0);
    for (int s = 0; s < p.S; s++) {
        for (int j = 0; j < p.mb; j++)
            p.table.push_back(perm[(size_t)s * p.mb + j]);
        int t0 = (int)p.tok.size();
        for (int j = nc[s]; j < nc[s] + nn[s]; j++)
            p.tok.push_back(s), p.pos.push_back(j), p.slots.push_back(-1);
        p.qind.push_back((int)p.tok.size());
        p.lens.push_back(nc[s] + nn[s]);
        if (nn[s] >= LS_CU_PREFILL_MIN_Q) {
            p.pf.insert(p.pf.end(), {s, t0, nn[s]});
            p.max_q = std::max(p.max_q, nn[s]), p.n_pf++;
        }
    }
    p.T = (int)p.tok.size();
    p.pick.resize(p.pf.size());
    p.n_pick = p.n_pf ? ls_cu_attention_prefill_pick(p.qind.data(), p.lens.data(), p.S, p.pick.data()) : 0;
    p.pick.resize((size_t)p.n_pick * 3);
    for (int k = 0; k < p.n_pick; k++)
        p.pick_max_q = std::max(p.pick_max_q, p.pick[3 * k + 2]);
    if ((size_t)p.S * p.mb > perm.size()) {
        fprintf(stderr, "problem past the page pool\n");
        exit(2);
    }
    auto up = [](const std::vector<int32_t> &v) {
        int32_t *dp;
        DEV_CK(cudaMalloc(&dp, std::max<size_t>(v.size(), 1) * 4));
        DEV_CK(cudaMemcpy(dp, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
        return dp;
    };
    p.d_tok = up(p.tok), p.d_pos = up(p.pos), p.d_table = up(p.table), p.d_pf = up(p.pf), p.d_pick = up(p.pick);
    return p;
}

static void s_free(problem_t &p) {
    cudaFree(p.d_tok), cudaFree(p.d_pos), cudaFree(p.d_table), cudaFree(p.d_pf), cudaFree(p.d_pick);
}

static s_pf_args_t s_pf_args(const problem_t &p, float *out, const float *q, const void *kc, const void *vc,
                             cudaStream_t st) {
    return s_pf_args_t{out,     q,         kc,        vc,   p.d_pf, p.n_pf, p.max_q,  p.d_pos,
                       p.d_table, p.mb, p.h, p.kv, p.d, BS, p.row, PAGE, st};
}

static cudaError_t s_old(const problem_t &p, float *out, const float *q, const void *kc, const void *vc,
                         cudaStream_t st) {
    return ls_cu_attention(out, q, kc, vc, LS_CU_BF16, p.d_tok, p.d_pos, p.d_table, p.mb, p.T, p.h, p.kv, p.d, BS,
                           p.row, PAGE, st);
}

// causal (query, key) pairs of the problem's prefill sequences x 4 x H x D
static double s_flops(const problem_t &p) {
    double pairs = 0;
    for (int k = 0; k < p.n_pf; k++)
        for (int t = p.pf[3 * k + 1]; t < p.pf[3 * k + 1] + p.pf[3 * k + 2]; t++)
            pairs += p.pos[t] + 1;
    return pairs * 4.0 * p.h * p.d;
}

// validates every version of head size p.d (and the old path) on p against the CPU reference
static void s_validate(const char *what, const problem_t &p, float *out, const float *q, const void *kc,
                       const void *vc, const std::vector<float> &hq, const std::vector<float> &hpages,
                       cudaStream_t st) {
    ls_attn_meta_t meta = {p.S, p.T, p.mb, 0, p.qind.data(), p.lens.data(), p.pos.data(), p.slots.data(),
                           p.table.data()};
    for (int s = 0; s < p.S; s++)
        meta.max_ctx_len = std::max(meta.max_ctx_len, p.lens[s]);
    size_t od = (size_t)p.h * p.d, no = (size_t)p.T * od;
    std::vector<float> want(no), got(no), poison(no, NAN);
    const float *hk = hpages.data(), *hv = hk + (size_t)BS * p.kv * p.d;
    ls_attention_forward(want.data(), hq.data(), hk, hv, &meta, p.h, p.kv, p.d, BS, p.row, PAGE);
    std::vector<char> in_pf(p.T, 0);
    for (int k = 0; k < p.n_pf; k++)
        for (int t = p.pf[3 * k + 1]; t < p.pf[3 * k + 1] + p.pf[3 * k + 2]; t++)
            in_pf[t] = 1;
    DEV_CK(s_old(p, out, q, kc, vc, st));
    DEV_CK(cudaMemcpy(got.data(), out, no * 4, cudaMemcpyDeviceToHost));
    dev_check(what, "old", dev_nmse(got.data(), want.data(), no), 1e-10);
    for (int v = 0; v < NV; v++) {
        if (s_versions[v].d != p.d || !s_on[v])
            continue;
        DEV_CK(cudaMemcpy(out, poison.data(), no * 4, cudaMemcpyHostToDevice));
        s_pf_args_t a = s_pf_args(p, out, q, kc, vc, st);
        DEV_CK(s_versions[v].run(&a));
        DEV_CK(cudaMemcpy(got.data(), out, no * 4, cudaMemcpyDeviceToHost));
        // the prefill rows against the reference; the other rows must be untouched (NaN)
        std::vector<float> g2, w2;
        long stray = 0;
        for (int t = 0; t < p.T; t++)
            for (size_t i = 0; i < od; i++) {
                float x = got[t * od + i];
                if (in_pf[t])
                    g2.push_back(x), w2.push_back(want[t * od + i]);
                else
                    stray += !std::isnan(x);
            }
        double nmse = dev_nmse(g2.data(), w2.data(), g2.size());
        dev_check(what, s_versions[v].name, stray ? NAN : nmse, 2e-5);
        if (stray)
            printf("    %ld values written outside the prefill rows\n", stray);
    }
}

int main(int argc, char **argv) {
    cudaStream_t st;
    for (int v = 0; v < NV; v++) {
        s_on[v] = v == 0 || argc < 2;
        for (int i = 1; i < argc; i++)
            s_on[v] |= !strcmp(argv[i], s_versions[v].name);
    }
    s_props();
    dev_begin("dev_prefill", "H=32 KV=8 D=128, bf16 cache, 16-token pages", &st);
    dev_rng_t rng = {7};
    std::vector<float> hpages, hq;
    __nv_bfloat16 *kc = dev_bf16_fill(rng, (size_t)PAGES * PAGE, 1.0f, hpages), *vc = kc + BS * KV * D;
    float *q = dev_f32_fill(rng, (size_t)MAXP * ROW, 1.0f, hq), *out;
    DEV_CK(cudaMalloc(&out, (size_t)MAXP * H * D * 4));
    std::vector<int32_t> perm(PAGES);
    for (int i = 0; i < PAGES; i++)
        perm[i] = i;
    for (int i = PAGES - 1; i > 0; i--) // page tables are never contiguous
        std::swap(perm[i], perm[rng.next() % (i + 1)]);

    {
        problem_t p = s_problem({300, 0, 700}, {200, 333, 1}, perm, H, KV, D);
        s_validate("chunks 300+200, 0+333, dec", p, out, q, kc, vc, hq, hpages, st);
        s_free(p);
        // head_dim 64, group 8: the same pages read as blocks of (16, 2 x 64), V after K
        problem_t p64 = s_problem({100, 0, 37}, {150, 64, 16}, perm, 16, 2, 64);
        s_validate("D=64 group 8, 3 chunks", p64, out, q, kc, kc + BS * 2 * 64, hq, hpages, st);
        s_free(p64);
    }

    printf("\nprompts alone (one layer; x32 for a prompt's attention):\n");
    printf("%-7s %9s", "prompt", "old us");
    for (int v = 0; v < NV; v++)
        if (s_versions[v].d == D && s_on[v])
            printf(" %11s", s_versions[v].name);
    printf(" | %8s %8s %6s\n", "old TF/s", "prod TF/s", "old/pr");
    for (int P : {512, 2048, 8192}) {
        problem_t p = s_problem({0}, {P}, perm, H, KV, D);
        double fl = s_flops(p), uo, up = 0;
        uo = dev_time_us(st, P >= 8192 ? 1 : 5, [&](long) { return s_old(p, out, q, kc, vc, st); });
        printf("%-7d %9.1f", P, uo);
        for (int v = 0; v < NV; v++) {
            if (s_versions[v].d != D || !s_on[v])
                continue;
            s_pf_args_t a = s_pf_args(p, out, q, kc, vc, st);
            double u = dev_time_us(st, 20, [&](long) { return s_versions[v].run(&a); });
            if (v == 0)
                up = u;
            printf(" %5.1f %5.0f", u, fl / u / 1e6);
        }
        printf(" | %8.1f %8.1f %6.1f\n", fl / uo / 1e6, fl / up / 1e6, uo / up);
        s_free(p);
    }
    printf("  (per version: us, TFLOP/s)\n");

    printf("\ncrossover: n queries on 2,048 cached tokens (one sequence), us:\n%-5s %9s %9s\n", "n", "old",
           s_versions[0].name);
    for (int n : {1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 112, 128}) {
        problem_t p = s_problem({2048}, {n}, perm, H, KV, D);
        // the prefill kernel takes any n given the sequence; the backend's threshold aside
        p.pf = {0, 0, n}, p.n_pf = 1, p.max_q = n;
        DEV_CK(cudaFree(p.d_pf));
        DEV_CK(cudaMalloc(&p.d_pf, 12));
        DEV_CK(cudaMemcpy(p.d_pf, p.pf.data(), 12, cudaMemcpyHostToDevice));
        double uo = dev_time_us(st, 20, [&](long) { return s_old(p, out, q, kc, vc, st); });
        s_pf_args_t a = s_pf_args(p, out, q, kc, vc, st);
        double un = dev_time_us(st, 20, [&](long) { return s_versions[0].run(&a); });
        printf("%-5d %9.1f %9.1f%s\n", n, uo, un, p.n_pick ? "  (prefill kernel in production)" : "");
        s_free(p);
    }

    // production: the old path on the rows before the first picked sequence (the cases put
    // the ones the pick leaves first), the prefill kernel on the picked ones
    printf("\nsteps of several sequences, us (old: all on the old path; prefill: all it may take on\n"
           "the prefill kernel; production: as the pick splits them):\n%-28s %9s %9s %10s  %s\n", "step", "old",
           "prefill", "production", "picked");
    struct step_t {
        const char *name;
        std::vector<int> nc, nn;
    };
    const step_t steps[] = {
        {"2 x 32 on 2048", std::vector<int>(2, 2048), std::vector<int>(2, 32)},
        {"4 x 32 on 2048", std::vector<int>(4, 2048), std::vector<int>(4, 32)},
        {"8 x 16 on 2048", std::vector<int>(8, 2048), std::vector<int>(8, 16)},
        {"8 x 32 on 2048", std::vector<int>(8, 2048), std::vector<int>(8, 32)},
        {"8 x 64 on 2048", std::vector<int>(8, 2048), std::vector<int>(8, 64)},
        {"32 x 64 on 2048", std::vector<int>(32, 2048), std::vector<int>(32, 64)},
        {"prompt of 150", {0}, {150}},
        {"prompt of 256", {0}, {256}},
        {"16 prompts of 100", std::vector<int>(16, 0), std::vector<int>(16, 100)},
        {"16 on 8192, 200 on 4096", {8192, 4096}, {16, 200}},
    };
    for (const step_t &c : steps) {
        problem_t p = s_problem(c.nc, c.nn, perm, H, KV, D);
        int t_old = p.n_pick ? p.pick[1] : p.T; // the old path's rows: 0 .. t_old - 1
        for (int k = 0; k < p.n_pick; k++)
            if (p.pick[3 * k + 1] != (k ? p.pick[3 * k - 2] + p.pick[3 * k - 1] : t_old) ||
                (k == p.n_pick - 1 && p.pick[3 * k + 1] + p.pick[3 * k + 2] != p.T)) {
                fprintf(stderr, "%s: the picked sequences are not the last rows\n", c.name);
                exit(2);
            }
        s_pf_args_t all = s_pf_args(p, out, q, kc, vc, st), pick = all;
        pick.seqs = p.d_pick, pick.n_seqs = p.n_pick, pick.max_q = p.pick_max_q;
        double uo = dev_time_us(st, 10, [&](long) { return s_old(p, out, q, kc, vc, st); });
        double ua = dev_time_us(st, 10, [&](long) { return s_versions[0].run(&all); });
        double up = dev_time_us(st, 10, [&](long) {
            cudaError_t e = t_old ? ls_cu_attention(out, q, kc, vc, LS_CU_BF16, p.d_tok, p.d_pos, p.d_table, p.mb,
                                                    t_old, p.h, p.kv, p.d, BS, p.row, PAGE, st)
                                  : cudaSuccess;
            return e != cudaSuccess || !p.n_pick ? e : s_versions[0].run(&pick);
        });
        printf("%-28s %9.1f %9.1f %10.1f  %d of %d\n", c.name, uo, ua, up, p.n_pick, p.S);
        s_free(p);
    }
    cudaFree(kc), cudaFree(q), cudaFree(out);
    return dev_end();
}
