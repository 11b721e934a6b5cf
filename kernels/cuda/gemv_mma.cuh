/*  kernels/cuda/gemv_mma.cuh — the decode GEMM's weight stream on the tensor cores, one
    skeleton for two weight formats: the 16-bit GEMV of 3–16 tokens (gemv.cu k_gemv_mma,
    mma.sync m16n8k16) and the FP8 decode GEMM (fp8.cu k_fp8_gemm_tc, m16n8k32 E4M3).

    A block owns 16 weight rows (mma's a) and up to 8 · NN tokens (b: NN tiles of 8). A sum
    over K may walk K in any order, so lane (g, q) takes the 16 consecutive bytes of chunk 4k
    + q of rows g and g + 8 and of token g's x, and two mmas take their words as the
    fragment's two k halves; rows and tokens see the same permutation. The weights are not
    loaded in that layout, though: 4 lanes a row would read 64 bytes of each of 8 rows an
    instruction, and HBM streams such reads at ~85% of the rate it streams a row's 512 bytes
    an instruction (bf16, the four GEMMs of a Llama-3-8B layer alone 175 against 152 µs at
    one token, H100). So lane l reads 16-byte chunk l of a row, 16 rows a segment of 512
    bytes a row (the CUDA-core GEMV's pattern), the warp writes them to its 8 KB of shared
    memory (chunk c of row r at c ^ ls_gm_swz(r): both the row-wise stores and the fragment
    reads take 4 wavefronts, the fewest) and reads its fragments back. A block's GM_WARPS
    warps each own a quarter of K's segments (the last the rest and a partial one, zeros past
    the row); their sums meet in shared memory, added in warp order (deterministic). Each
    segment's x fragments are loaded before its weights are stored, so their L1/L2 latency
    overlaps the stores; the next segment's weights are asked for after the mmas. The block's
    first segment is loaded before the programmatic wait (the weights are written by no
    kernel of a step), which hides more of the small kernels before it than a prefetch to L2
    does (bf16: the chain with gaps at four tokens 163.8 µs a layer, 170.8 with the segment
    loaded after the wait and its lines asked of L2 before; kernels/cuda/dev/README.md; FP8:
    96 against 105 µs a layer at one token, the weights straight into fragments, 8 warps a
    block, nothing before the wait, README.md "FP8 decode GEMM"). The kernels have launch
    bounds of one block an SM, which leave ptxas the registers to keep a segment's 16 loads
    and x's fragments in flight (sm_90a: 16-bit 140–226 registers, three or two blocks an SM;
    FP8 173 and 215, two).
*/
#ifndef LS_GEMV_MMA_CUH
#define LS_GEMV_MMA_CUH

#include "common.cuh"

// a block's warps; its rows (an m16 tile); 16-byte chunks of a row a segment (512 bytes); the
// tokens of a tile (the mma's n8: a block takes one or two, NN)
enum { GM_WARPS = 4, GM_ROWS = 16, GM_CHUNKS = 32, GM_TOKENS = 8 };

__device__ __forceinline__ int ls_gm_swz(int r) { return ((r & 1) << 2) | ((r >> 1) & 3); }

// The KS warps' c fragments of 16 rows from o0 and 8 · NN tokens meet in part and are added
// in warp order; put(v, o, t) for each (row, token), by the block's threads (past out and T
// too: put skips them)
template <int NN, int KS, typename P>
__device__ __forceinline__ void ls_gm_reduce(float (&part)[KS][NN * 4][32],
                                             const float (&c)[NN][4], int o0, int warp,
                                             int lane, P put) {
#pragma unroll
    for (int j = 0; j < NN; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            part[warp][j * 4 + e][lane] = c[j][e];
    __syncthreads();
    // c[j][e] of lane l: row (l / 4) + 8 (e / 2), token 8j + 2 (l % 4) + e % 2
    for (int i = threadIdx.x; i < NN * 128; i += KS * 32) {
        int l = i & 31, e = (i >> 5) & 3, j = i >> 7;
        float v = part[0][i >> 5][l];
#pragma unroll
        for (int k = 1; k < KS; k++)
            v = __fadd_rn(v, part[k][i >> 5][l]);
        put(v, o0 + (l >> 2) + (e >> 1) * 8, 8 * j + 2 * (l & 3) + (e & 1));
    }
}

// The stream of a kernel of GM_WARPS warps: w (out rows of nch 16-byte chunks), the block's
// rows blockIdx.x · 16, then gridDim.x · 16 further, ... (the next group's first segment asked
// for after the last mmas of this one). Its first segment is loaded before the wait: up to
// 32 KB a block, ~13 MB for the blocks an H100 holds at once, whatever the kernel before it.
// The format's op:
//   uint4 x(int j, int ci, bool ok): the 16 bytes of chunk ci of token 8j + g's x (g: the
//     lane's lane / 4) as b fragment words, zeros where !ok (past the row);
//   void mma(float (&c)[4], const uint32_t (&a0)[4], const uint32_t (&a1)[4], uint4 x):
//     c += the chunk's two mmas (a0 with x's words x, y; a1 with z, w);
//   void put(float v, int o, int t): row o and token t's sum (skips o >= out, t past T).
template <int NN, typename Op>
__device__ __forceinline__ void ls_gm_stream(const uint4 *w, int nch, int out, const Op &op) {
    __shared__ uint4 stage[GM_WARPS][GM_ROWS][32];
    __shared__ float part[GM_WARPS][NN * 4][32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    int nseg = (nch + GM_CHUNKS - 1) / GM_CHUNKS, per = nseg / GM_WARPS, s0 = warp * per;
    int s1 = warp == GM_WARPS - 1 ? nseg : s0 + per;
    const uint4 *wl = w + lane;
    uint4(*st)[32] = stage[warp];
    uint4 wv[GM_ROWS];
    auto load = [&](int o0, int s) { // segment s of rows o0.. (past out: the last)
        bool ok = s * GM_CHUNKS + lane < nch;
#pragma unroll
        for (int r = 0; r < GM_ROWS; r++)
            wv[r] = ok ? ls_ld_stream(wl + (size_t)min(o0 + r, out - 1) * nch + s * GM_CHUNKS)
                       : make_uint4(0, 0, 0, 0);
    };
    int o0 = blockIdx.x * GM_ROWS;
    if (s0 < s1)
        load(o0, s0);
    ls_dep_enter();
    for (; o0 < out; o0 += gridDim.x * GM_ROWS) {
        float c[NN][4] = {};
        for (int s = s0; s < s1; s++) {
            uint4 xv[8][NN];
#pragma unroll
            for (int k = 0; k < 8; k++)
#pragma unroll
                for (int j = 0; j < NN; j++) {
                    int ci = s * GM_CHUNKS + 4 * k + q;
                    xv[k][j] = op.x(j, ci, ci < nch);
                }
#pragma unroll
            for (int r = 0; r < GM_ROWS; r++)
                st[r][lane ^ ls_gm_swz(r)] = wv[r];
            __syncwarp();
#pragma unroll
            for (int k = 0; k < 8; k++) {
                int ch = (4 * k + q) ^ ls_gm_swz(g); // rows g and g + 8 share a swizzle
                uint4 wa = st[g][ch], wb = st[g + 8][ch];
                uint32_t a0[4] = {wa.x, wb.x, wa.y, wb.y}, a1[4] = {wa.z, wb.z, wa.w, wb.w};
#pragma unroll
                for (int j = 0; j < NN; j++)
                    op.mma(c[j], a0, a1, xv[k][j]);
            }
            __syncwarp(); // st is the next segment's
            if (s + 1 < s1)
                load(o0, s + 1);
            else if (o0 + (int)gridDim.x * GM_ROWS < out)
                load(o0 + gridDim.x * GM_ROWS, s0);
        }
        ls_gm_reduce<NN, GM_WARPS>(part, c, o0, warp, lane,
                                   [&](float v, int o, int t) { op.put(v, o, t); });
        __syncthreads(); // part is the next rows'
    }
}

#endif
