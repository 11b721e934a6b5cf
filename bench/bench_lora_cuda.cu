/*  bench/bench_lora_cuda.cu — the segmented LoRA kernels (kernels/cuda/lora.cu) at
    Llama-3-8B shapes, against cuBLAS, with the card's copy bandwidth measured in the same run.

    Shapes (hidden 4096, MLP 14336, 8 KV heads of 128): the four stacked groups of a layer,
      qkv 4096 -> 4096+1024+1024 (3 slices), o 4096 -> 4096, gate_up 4096 -> 2x14336,
      down 14336 -> 4096;
    bf16 A/B pools (n_slots, n_slices*r, in) / (n_slots, out_total, r), fp32 activations (our
    kernels; cuBLAS gets x in bf16, which only helps it), one token per request (decode). Our
    kernels read the adapters through page tables as the server's pool lays them out
    (docs/memory.md): A's rows where they lie, B in chunks of 8 rank columns (a chunk-major
    copy of the pool), one table entry per row and chunk.

    Adapter mixes over a batch of T requests:
      Identical  every request on one adapter;
      Uniform    ceil(sqrt(T)) adapters, requests round-robin;
      Skewed     requests drawn from a Zipf(1.5) popularity over T adapters (fixed seed);
      Distinct   every request its own adapter.

    Implementations (the kernel versions that lost are compared in kernels/cuda/dev):
      ours       ls_cu_lora_apply, the backend's decode op: a shrink with K split over
                 blocks, then the expand summing the parts: shrink v3 and expand v3 for
                 one-position tiles (Distinct), expand v4 for multi-position ones on bf16
                 pools, else the tensor-core shrink and expand v2
      loop       one cublasGemmEx per adapter group: shrink (x_seg . A^T, bf16 out) then one
                 expand per slice (y_seg += tmp . B^T, fp32 accumulate)
      no-pdl     ours without programmatic dependent launch (LS_CU_LORA_NO_PDL, as beside
                 a GEMM; whole step only)
      grouped    cublasGemmGroupedBatchedEx: one call for all shrinks, one for all expands
                 (CUDA 13.0 refuses bf16 x bf16 -> fp32 C there, status 15, so its y is a
                 bf16 copy: half the y bytes of the others, counted as for the others)

    Bytes counted (the least any implementation must move): each used adapter's A and B once,
    x once (bf16: every implementation takes it so, ours as the engine gives it), tmp written
    and read (fp32), y read and written (fp32). GB/s = bytes/time;
    "%bw" = that over the device-to-device copy bandwidth measured first (bytes read +
    written over the time of a 2 GiB cudaMemcpyAsync).

    Single op: plain launches, pools rotated over enough sets to exceed L2 (>= 256 MB),
    median of timed batches of repetitions. Whole decode step: 32 layers x 4 groups (all
    seven targets) captured in one CUDA graph, replayed, median of replays.

    Read ceiling: a read-only kernel moving each op's byte count, alone and as the whole
    step's chain of 128 dependent kernels in a graph (LS_READ_BPS, LS_READ_ONESHOT: its
    blocks per SM, one round per block), to tell the step's shape from our kernels' cost.

    Usage: bench_lora_cuda [--quick | --green | --serve [CSV] | --op GROUP | --step [CSV]]
    Not a ctest; needs a GPU.
    --green: only the green-context section (SM partitions for the LoRA beside a GEMM);
    --serve [CSV]: only the serving shape (make_serve_batch) at 1 to 2,000 adapters, per group;
    with CSV, every kernel's start and end (labelled "n=N GROUP") for a per-kernel summary;
    --op GROUP: only 8 runs of one group's decode op (r=16, T=64, Distinct), for ncu.
    --step [CSV]: only the whole step at r=16, T=64, Distinct and the read chain; with CSV,
    each graph then replayed 9 times more under CUPTI (tracing on from the start, so the
    times printed include its overhead): every kernel's start and end to CSV, labelled by
    the row's name, for `tests/gpu/timeline.py --ops`.
*/
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common.cuh" // ls_dep_launch / ls_dep_wait, as the kernels use them
#include "ops_cuda.h"
extern "C" {
#include "kernel_trace.h"
}

#define CK(x)                                                                                 \
    do {                                                                                      \
        cudaError_t e_ = (x);                                                                 \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)
#define CB(x)                                                                                 \
    do {                                                                                      \
        cublasStatus_t s_ = (x);                                                              \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                    \
            fprintf(stderr, "%s:%d: %s: cublas status %d\n", __FILE__, __LINE__, #x, (int)s_); \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

struct group_t {
    const char *name;
    int in, n_slices, outs[3];
    int out_total() const {
        int s = 0;
        for (int k = 0; k < n_slices; k++)
            s += outs[k];
        return s;
    }
};
static const group_t G[4] = {{"qkv", 4096, 3, {4096, 1024, 1024}},
                             {"o", 4096, 1, {4096, 0, 0}},
                             {"gate_up", 4096, 2, {14336, 14336, 0}},
                             {"down", 14336, 1, {4096, 0, 0}}};
static const char *MIX[4] = {"Identical", "Uniform", "Skewed", "Distinct"};

static cudaStream_t g_st;
static cublasHandle_t g_blas;
static double g_bw; // measured copy bandwidth, GB/s
static bool g_trace; // --step CSV: the decode step's graphs replayed under CUPTI (kernel_trace.h)

__global__ void k_fill_bf16(__nv_bfloat16 *p, size_t n, uint32_t seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u ^ seed;
        x ^= x >> 15, x *= 0x2c1b3c6du, x ^= x >> 12, x *= 0x297a2d39u, x ^= x >> 15;
        p[i] = __float2bfloat16(((float)(x >> 8) * (1.0f / 8388608.0f) - 1.0f) * scale);
    }
}
__global__ void k_fill_f32(float *p, size_t n, uint32_t seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u ^ seed;
        x ^= x >> 15, x *= 0x2c1b3c6du, x ^= x >> 12, x *= 0x297a2d39u, x ^= x >> 15;
        p[i] = ((float)(x >> 8) * (1.0f / 8388608.0f) - 1.0f) * scale;
    }
}
__global__ void k_to_bf16(__nv_bfloat16 *d, const float *s, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        d[i] = __float2bfloat16(s[i]);
}

static void *dmalloc(size_t bytes) {
    void *p;
    CK(cudaMalloc(&p, bytes ? bytes : 16));
    return p;
}
static void fill_bf16(void *p, size_t n, uint32_t seed, float scale) {
    k_fill_bf16<<<1024, 256, 0, g_st>>>((__nv_bfloat16 *)p, n, seed, scale);
    CK(cudaGetLastError());
}
static void fill_f32(void *p, size_t n, uint32_t seed, float scale) {
    k_fill_f32<<<1024, 256, 0, g_st>>>((float *)p, n, seed, scale);
    CK(cudaGetLastError());
}

// --- batches -------------------------------------------------------------------------------

struct batch_t {
    int T;
    std::vector<int> seg_len;  // segment s uses slot s + 1
    std::vector<int> seg_rank; // its adapter's rank (empty: every segment the launch's r)
};

static batch_t make_batch(int mix, int T) {
    batch_t b{T, {}, {}};
    if (mix == 0) {
        b.seg_len.push_back(T);
    } else if (mix == 1) {
        int n = (int)ceil(sqrt((double)T));
        for (int a = 0; a < n; a++)
            b.seg_len.push_back(T / n + (a < T % n));
    } else if (mix == 2) {
        std::vector<double> cdf(T);
        double s = 0;
        for (int a = 0; a < T; a++)
            cdf[a] = (s += pow(a + 1.0, -1.5));
        std::vector<int> cnt(T, 0);
        uint64_t x = 12345;
        for (int i = 0; i < T; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            double u = (double)(x >> 11) * 0x1.0p-53 * s;
            cnt[std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin()]++;
        }
        for (int a = 0; a < T; a++)
            if (cnt[a])
                b.seg_len.push_back(cnt[a]);
    } else {
        b.seg_len.assign(T, 1);
    }
    return b;
}

// The serving shape (bench_serve_engine's, serve.sh's matrix): T requests whose adapters are
// drawn from a Zipf(1) popularity over n adapters, adapter i of rank 8, 16, 32, 64 by i % 4
// (loraserve-make-adapters --ranks 8,16,32,64), in slots of rank 64 (--max-lora-rank 64);
// segments are the distinct adapters, each split into tiles of LS_CU_LORA_TILE positions.
static batch_t make_serve_batch(int n, int T) {
    static const int ranks[4] = {8, 16, 32, 64};
    std::vector<double> cdf(n);
    double s = 0;
    for (int a = 0; a < n; a++)
        cdf[a] = (s += 1.0 / (a + 1));
    std::vector<int> cnt(n, 0);
    uint64_t x = 777;
    for (int i = 0; i < T; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        double u = (double)(x >> 11) * 0x1.0p-53 * s;
        cnt[std::min((int)(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin()), n - 1)]++;
    }
    batch_t b{T, {}, {}};
    for (int a = 0; a < n; a++)
        if (cnt[a]) {
            b.seg_len.push_back(cnt[a]);
            b.seg_rank.push_back(ranks[a % 4]);
        }
    return b;
}

// --- one group's data ------------------------------------------------------------------------

struct gdata_t {
    const group_t *g;
    int r, n_sets, n_slots; // r: the slots' rank (r_max)
    int max_rank;           // the largest rank of a tile
    size_t a_set, b_set; // elements of one set (all slots)
    __nv_bfloat16 *a, *b; // n_sets sets
    float *x, *tmp, *y;
    size_t tmp_stride; // floats between the parts of ls_cu_lora_apply's scratch
    bool one;          // every tile one position (LS_CU_LORA_ONE, as the backend sets it)
    __nv_bfloat16 *xb, *tmpb, *yb;
    __nv_bfloat16 *bc;      // b in chunks: (n_sets * n_slots, r/8, out_total, 8)
    const void **ta, **tb;  // page tables (n_sets, n_slots, n_slices*r) and (n_sets, n_slots, r/8)
    ls_cu_lora_tile_t *tiles;
    int n_tiles;
    int32_t off[4];
    // grouped GEMM pointer arrays (device), per set
    const void **gA, **gB, **gC, **eA, **eB, **eC;
};

static size_t adapter_bytes(const group_t &g, int r) {
    return ((size_t)g.n_slices * r * g.in + (size_t)g.out_total() * r) * 2;
}

// segment s's rank: its adapter's in a serving batch, else the launch's r
static int seg_rank(const batch_t &b, size_t s, int r) {
    return b.seg_rank.empty() ? r : b.seg_rank[s];
}

static double op_bytes(const group_t &g, int r, const batch_t &b) {
    double ab = 0;
    for (size_t s = 0; s < b.seg_len.size(); s++)
        ab += adapter_bytes(g, seg_rank(b, s, r));
    return ab + (double)b.T * g.in * 2 + 2.0 * b.T * g.n_slices * r * 4 + 2.0 * b.T * g.out_total() * 4;
}

// dst (n, r/8, rows, 8) = src (n, rows, r) chunk-major
__global__ void k_chunk_major(__nv_bfloat16 *dst, const __nv_bfloat16 *src, size_t n, int rows, int r) {
    size_t total = n * rows * r;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t w = i / ((size_t)rows * r);
        int o = (int)(i / r % rows), j = (int)(i % r);
        dst[((w * (r / 8) + j / 8) * rows + o) * 8 + j % 8] = src[i];
    }
}

// The page tables of set `set`: a's rows, bc's chunks
static ls_lora_pages_t pages_a(const gdata_t &d, int set) {
    size_t per = (size_t)d.g->n_slices * d.r;
    return {d.ta + (size_t)set * d.n_slots * per, per, 1, d.g->in};
}
static ls_lora_pages_t pages_b(const gdata_t &d, int set) {
    size_t per = (size_t)d.r / 8;
    return {d.tb + (size_t)set * d.n_slots * per, per, 1, d.g->out_total()};
}

static void gdata_init(gdata_t &d, const group_t &g, int r, const batch_t &b, int n_sets) {
    memset(&d, 0, sizeof d);
    d.g = &g;
    d.r = r;
    d.n_sets = n_sets;
    d.n_slots = (int)b.seg_len.size() + 1;
    int ns = g.n_slices, ot = g.out_total(), T = b.T;
    d.a_set = (size_t)d.n_slots * ns * r * g.in;
    d.b_set = (size_t)d.n_slots * ot * r;
    d.a = (__nv_bfloat16 *)dmalloc(d.a_set * n_sets * 2);
    d.b = (__nv_bfloat16 *)dmalloc(d.b_set * n_sets * 2);
    fill_bf16(d.a, d.a_set * n_sets, 1, 1.0f / sqrtf((float)g.in));
    fill_bf16(d.b, d.b_set * n_sets, 2, 0.3f);
    d.x = (float *)dmalloc((size_t)T * g.in * 4);
    d.xb = (__nv_bfloat16 *)dmalloc((size_t)T * g.in * 2);
    fill_f32(d.x, (size_t)T * g.in, 3, 1.0f);
    k_to_bf16<<<1024, 256, 0, g_st>>>(d.xb, d.x, (size_t)T * g.in);
    d.tmp_stride = (size_t)T * ns * r;
    d.tmp = (float *)dmalloc(d.tmp_stride * LS_CU_LORA_PARTS * 4);
    d.tmpb = (__nv_bfloat16 *)dmalloc((size_t)T * ns * r * 2);
    d.y = (float *)dmalloc((size_t)T * ot * 4);
    fill_f32(d.y, (size_t)T * ot, 4, 1.0f);
    d.yb = (__nv_bfloat16 *)dmalloc((size_t)T * ot * 2);
    fill_bf16(d.yb, (size_t)T * ot, 5, 1.0f);
    std::vector<ls_cu_lora_tile_t> tiles;
    int p = 0;
    for (size_t s = 0; s < b.seg_len.size(); s++) {
        for (int q = 0; q < b.seg_len[s]; q += LS_CU_LORA_TILE)
            tiles.push_back({p + q, std::min(LS_CU_LORA_TILE, b.seg_len[s] - q), (int)s + 1, seg_rank(b, s, r), 0.5f});
        p += b.seg_len[s];
    }
    d.n_tiles = (int)tiles.size();
    for (const ls_cu_lora_tile_t &t : tiles)
        d.max_rank = std::max(d.max_rank, t.rank);
    d.one = std::all_of(tiles.begin(), tiles.end(), [](const ls_cu_lora_tile_t &t) { return t.n == 1; });
    d.tiles = (ls_cu_lora_tile_t *)dmalloc(tiles.size() * sizeof tiles[0]);
    CK(cudaMemcpy(d.tiles, tiles.data(), tiles.size() * sizeof tiles[0],
                  cudaMemcpyHostToDevice));
    d.off[0] = 0;
    for (int k = 0; k < ns; k++)
        d.off[k + 1] = d.off[k] + g.outs[k];
    // grouped GEMM pointers: shrink one problem per segment, expand one per (segment, slice)
    int S = (int)b.seg_len.size();
    std::vector<const void *> hA, hB, hC, ha, hb, hc;
    for (int set = 0; set < n_sets; set++) {
        int p0 = 0;
        for (int s = 0; s < S; s++) {
            const __nv_bfloat16 *A = d.a + set * d.a_set + (size_t)(s + 1) * ns * r * g.in;
            const __nv_bfloat16 *B = d.b + set * d.b_set + (size_t)(s + 1) * ot * r;
            hA.push_back(A);
            hB.push_back(d.xb + (size_t)p0 * g.in);
            hC.push_back(d.tmpb + (size_t)p0 * ns * r);
            for (int k = 0; k < ns; k++) {
                ha.push_back(B + (size_t)d.off[k] * r);
                hb.push_back(d.tmpb + (size_t)p0 * ns * r + k * r);
                hc.push_back(d.yb + (size_t)p0 * ot + d.off[k]); // bf16 y: see run_grouped
            }
            p0 += b.seg_len[s];
        }
    }
    auto up = [](std::vector<const void *> &v) {
        const void **p = (const void **)dmalloc(v.size() * sizeof(void *));
        CK(cudaMemcpy(p, v.data(), v.size() * sizeof(void *), cudaMemcpyHostToDevice));
        return p;
    };
    d.gA = up(hA), d.gB = up(hB), d.gC = up(hC), d.eA = up(ha), d.eB = up(hb), d.eC = up(hc);
    // ours: B chunk-major, and the page tables of every set
    d.bc = (__nv_bfloat16 *)dmalloc(d.b_set * n_sets * 2);
    k_chunk_major<<<1024, 256, 0, g_st>>>(d.bc, d.b, (size_t)n_sets * d.n_slots, ot, r);
    std::vector<const void *> rows, chunks;
    for (int set = 0; set < n_sets; set++)
        for (int w = 0; w < d.n_slots; w++) {
            for (int i = 0; i < ns * r; i++)
                rows.push_back(d.a + set * d.a_set + ((size_t)w * ns * r + i) * g.in);
            for (int c = 0; c < r / 8; c++)
                chunks.push_back(d.bc + set * d.b_set + ((size_t)w * (r / 8) + c) * ot * 8);
        }
    d.ta = up(rows), d.tb = up(chunks);
    CK(cudaStreamSynchronize(g_st));
}

static void gdata_free(gdata_t &d) {
    void *ps[] = {d.a, d.b, d.x, d.xb, d.tmp, d.tmpb, d.y, d.yb, d.tiles,
                  d.gA, d.gB, d.gC, d.eA, d.eB, d.eC, d.bc, d.ta, d.tb};
    for (void *p : ps)
        cudaFree(p);
}

// --- implementations -------------------------------------------------------------------------

enum { I_OURS, I_LOOP, I_GROUPED, I_NOPDL, I_COUNT };
static const char *IMPL[I_COUNT] = {"ours", "loop", "grouped", "no-pdl"};
static int g_grouped_ok = 1;

static void run_ours(const gdata_t &d, int set, int impl) {
    const group_t &g = *d.g;
    int ns = g.n_slices, r = d.r;
    unsigned flags = LS_CU_LORA_ACC | (d.one ? LS_CU_LORA_ONE : 0) | (impl == I_NOPDL ? LS_CU_LORA_NO_PDL : 0);
    // x in bf16, as the engine gives the LoRA the projection's 16-bit input (engine/model.c)
    CK(ls_cu_lora_apply(d.y, d.tmp, d.tmp_stride, d.xb, LS_CU_BF16, pages_a(d, set), LS_CU_BF16, pages_b(d, set),
                        LS_CU_BF16, d.tiles, d.n_tiles, d.max_rank, NULL, d.off, g.in, ns, r, flags,
                        g_st));
}

static void run_loop(const gdata_t &d, const batch_t &b, int set) {
    const group_t &g = *d.g;
    int ns = g.n_slices, r = d.r, ot = g.out_total();
    float one = 1.0f, zero = 0.0f, half = 0.5f;
    int p0 = 0;
    for (size_t s = 0; s < b.seg_len.size(); s++) {
        int n = b.seg_len[s];
        const __nv_bfloat16 *A = d.a + set * d.a_set + (s + 1) * (size_t)ns * r * g.in;
        const __nv_bfloat16 *B = d.b + set * d.b_set + (s + 1) * (size_t)ot * r;
        CB(cublasGemmEx(g_blas, CUBLAS_OP_T, CUBLAS_OP_N, ns * r, n, g.in, &one, A,
                        CUDA_R_16BF, g.in, d.xb + (size_t)p0 * g.in, CUDA_R_16BF, g.in, &zero,
                        d.tmpb + (size_t)p0 * ns * r, CUDA_R_16BF, ns * r, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT));
        for (int k = 0; k < ns; k++)
            CB(cublasGemmEx(g_blas, CUBLAS_OP_T, CUBLAS_OP_N, g.outs[k], n, r, &half,
                            B + (size_t)d.off[k] * r, CUDA_R_16BF, r,
                            d.tmpb + (size_t)p0 * ns * r + k * r, CUDA_R_16BF, ns * r, &one,
                            d.y + (size_t)p0 * ot + d.off[k], CUDA_R_32F, ot,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        p0 += n;
    }
}

static void run_grouped(const gdata_t &d, const batch_t &b, int set) {
    const group_t &g = *d.g;
    int ns = g.n_slices, r = d.r, ot = g.out_total(), S = (int)b.seg_len.size();
    std::vector<cublasOperation_t> ta(S * ns, CUBLAS_OP_T), tb(S * ns, CUBLAS_OP_N);
    std::vector<int> m, n, k, lda, ldb, ldc, gs;
    std::vector<float> al, be;
    for (int s = 0; s < S; s++) {
        m.push_back(ns * r), n.push_back(b.seg_len[s]), k.push_back(g.in);
        lda.push_back(g.in), ldb.push_back(g.in), ldc.push_back(ns * r), gs.push_back(1);
        al.push_back(1.0f), be.push_back(0.0f);
    }
    cublasStatus_t st = cublasGemmGroupedBatchedEx(
        g_blas, ta.data(), tb.data(), m.data(), n.data(), k.data(), al.data(),
        d.gA + (size_t)set * S, CUDA_R_16BF, lda.data(), d.gB + (size_t)set * S, CUDA_R_16BF,
        ldb.data(), be.data(), (void *const *)(d.gC + (size_t)set * S), CUDA_R_16BF,
        ldc.data(), S, gs.data(), CUBLAS_COMPUTE_32F);
    if (st != CUBLAS_STATUS_SUCCESS) {
        if (g_grouped_ok)
            printf("cublasGemmGroupedBatchedEx (bf16 x bf16 -> bf16): status %d: not timed\n",
                   (int)st);
        g_grouped_ok = 0;
        return;
    }
    m.clear(), n.clear(), k.clear(), lda.clear(), ldb.clear(), ldc.clear(), gs.clear();
    al.clear(), be.clear();
    for (int s = 0; s < S; s++)
        for (int q = 0; q < ns; q++) {
            m.push_back(g.outs[q]), n.push_back(b.seg_len[s]), k.push_back(r);
            lda.push_back(r), ldb.push_back(ns * r), ldc.push_back(ot), gs.push_back(1);
            al.push_back(0.5f), be.push_back(1.0f);
        }
    st = cublasGemmGroupedBatchedEx(
        g_blas, ta.data(), tb.data(), m.data(), n.data(), k.data(), al.data(),
        d.eA + (size_t)set * S * ns, CUDA_R_16BF, lda.data(), d.eB + (size_t)set * S * ns,
        CUDA_R_16BF, ldb.data(), be.data(), (void *const *)(d.eC + (size_t)set * S * ns),
        CUDA_R_16BF, ldc.data(), S * ns, gs.data(), CUBLAS_COMPUTE_32F);
    if (st != CUBLAS_STATUS_SUCCESS) {
        if (g_grouped_ok)
            printf("cublasGemmGroupedBatchedEx (bf16 x bf16 -> bf16): status %d: not timed\n",
                   (int)st);
        g_grouped_ok = 0;
    }
}

static void run_impl(const gdata_t &d, const batch_t &b, int set, int impl) {
    if (impl != I_LOOP && impl != I_GROUPED)
        run_ours(d, set, impl);
    else if (impl == I_LOOP)
        run_loop(d, b, set);
    else
        run_grouped(d, b, set);
}

// --- timing ----------------------------------------------------------------------------------

template <typename F> static double time_us(F f, int min_reps = 5, double budget_ms = 30) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    f(0);
    f(1);
    CK(cudaStreamSynchronize(g_st));
    CK(cudaEventRecord(e0, g_st));
    f(2);
    CK(cudaEventRecord(e1, g_st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    int reps = (int)std::max((double)min_reps, std::min(200.0, budget_ms / 7 / std::max(ms, 1e-3f)));
    std::vector<double> t;
    for (int batch = 0; batch < 7; batch++) {
        CK(cudaEventRecord(e0, g_st));
        for (int i = 0; i < reps; i++)
            f(i + 3);
        CK(cudaEventRecord(e1, g_st));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(1e3 * ms / reps);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

static void measure_bw() {
    size_t n = (size_t)2 << 30;
    void *a = dmalloc(n), *b = dmalloc(n);
    CK(cudaMemsetAsync(a, 1, n, g_st));
    double us = time_us([&](int) { CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, g_st)); },
                        5, 200);
    g_bw = 2.0 * n / us / 1e3;
    printf("device-to-device copy: 2 GiB in %.1f us: %.0f GB/s (read + write)\n", us, g_bw);
    cudaFree(a);
    cudaFree(b);
}

static void print_row(const char *what, const char *mix, int r, int T, int segs, int impl,
                      double us, double bytes) {
    printf("%-8s %-9s r=%-2d T=%-3d segs=%-3d %-7s %10.1f us %8.1f MB %7.0f GB/s %5.1f%%\n",
           what, mix, r, T, segs, IMPL[impl], us, bytes / 1e6, bytes / us / 1e3,
           100.0 * bytes / us / 1e3 / g_bw);
}

struct summary_t {
    double op_ours, step_ours, step_grouped, step_us,
        step_mb, read_step, read_mb;
};
static summary_t g_sum;

static void single_op(int gi, int r, int T, int mix, bool all_impls) {
    const group_t &g = G[gi];
    batch_t b = make_batch(mix, T);
    size_t set_bytes = (size_t)(b.seg_len.size() + 1) * adapter_bytes(g, r);
    int n_sets = (int)std::min((size_t)16, std::max((size_t)1, ((size_t)256 << 20) / set_bytes + 1));
    gdata_t d;
    gdata_init(d, g, r, b, n_sets);
    double bytes = op_bytes(g, r, b);
    for (int impl = 0; impl < I_COUNT; impl++) {
        if ((!all_impls && (impl == I_LOOP || impl == I_GROUPED)) || impl == I_NOPDL)
            continue;
        if (impl == I_GROUPED && !g_grouped_ok)
            continue;
        double us = time_us([&](int i) { run_impl(d, b, i % n_sets, impl); });
        if (impl == I_GROUPED && !g_grouped_ok)
            continue;
        print_row(g.name, MIX[mix], r, T, (int)b.seg_len.size(), impl, us, bytes);
        if (gi == 0 && r == 16 && T == 64 && mix == 3) {
            if (impl == I_OURS)
                g_sum.op_ours = us;
        }
    }
    gdata_free(d);
}

// Our result against cuBLAS grouped (fp32 reference of bf16 products) on the decode shape.
static void cross_check() {
    batch_t b = make_batch(3, 64);
    gdata_t d;
    gdata_init(d, G[0], 16, b, 1);
    size_t ny = (size_t)64 * G[0].out_total();
    std::vector<float> y0(ny), y1(ny), y2(ny);
    // g_st does not synchronize with the legacy stream: wait for it around every copy
    CK(cudaStreamSynchronize(g_st));
    CK(cudaMemcpy(y0.data(), d.y, ny * 4, cudaMemcpyDeviceToHost));
    run_ours(d, 0, I_OURS);
    CK(cudaStreamSynchronize(g_st));
    CK(cudaMemcpy(y1.data(), d.y, ny * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(d.y, y0.data(), ny * 4, cudaMemcpyHostToDevice));
    run_loop(d, b, 0);
    CK(cudaStreamSynchronize(g_st));
    CK(cudaMemcpy(y2.data(), d.y, ny * 4, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (size_t i = 0; i < ny; i++) {
        double a = y1[i] - y0[i], c = y2[i] - y0[i];
        num += (a - c) * (a - c), den += c * c;
    }
    printf("cross-check qkv r=16 T=64 Distinct: ours vs cuBLAS loop (x, tmp in bf16 there): "
           "relative L2 of the LoRA delta %.2e\n", sqrt(num / den));
    gdata_free(d);
}

// --step CSV: a few replays of a step's graph, each kernel's start and end recorded under label
static void trace_graph(cudaGraphExec_t exec, const char *label) {
    CK(cudaStreamSynchronize(g_st));
    kt_mark(label);
    for (int i = 0; i < 9; i++)
        CK(cudaGraphLaunch(exec, g_st));
    CK(cudaStreamSynchronize(g_st));
    kt_mark("");
}

// One decode step's LoRA work: 32 layers x 4 groups, in a CUDA graph.
static void whole_step(int r, int T, int mix) {
    const int L = 32;
    batch_t b = make_batch(mix, T);
    gdata_t d[4];
    for (int gi = 0; gi < 4; gi++)
        gdata_init(d[gi], G[gi], r, b, L); // a set per layer
    double bytes = 0;
    for (int gi = 0; gi < 4; gi++)
        bytes += L * op_bytes(G[gi], r, b);
    int S = (int)b.seg_len.size();
    for (int impl = 0; impl < I_COUNT; impl++) {
        if ((impl == I_LOOP && S > 16) || (impl == I_GROUPED && !g_grouped_ok))
            continue;
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CK(cudaStreamBeginCapture(g_st, cudaStreamCaptureModeThreadLocal));
        for (int l = 0; l < L; l++)
            for (int gi = 0; gi < 4; gi++)
                run_impl(d[gi], b, l, impl);
        cudaError_t ce = cudaStreamEndCapture(g_st, &graph);
        if (ce != cudaSuccess || (!g_grouped_ok && impl == I_GROUPED) ||
            cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
            printf("step     %-9s r=%-2d T=%-3d %-7s: not capturable in a graph (%s)\n",
                   MIX[mix], r, T, IMPL[impl], cudaGetErrorString(ce));
            cudaGetLastError();
            if (ce == cudaSuccess)
                cudaGraphDestroy(graph);
            g_grouped_ok = impl == I_GROUPED ? 1 : g_grouped_ok;
            continue;
        }
        double us = time_us([&](int) { CK(cudaGraphLaunch(exec, g_st)); }, 3, 60);
        print_row("step", MIX[mix], r, T, S, impl, us, bytes);
        if (g_trace)
            trace_graph(exec, IMPL[impl]);
        if (r == 16 && T == 64 && mix == 3) {
            g_sum.step_us = us, g_sum.step_mb = bytes / 1e6;
            if (impl == I_OURS)
                g_sum.step_ours = us;
            if (impl == I_GROUPED)
                g_sum.step_grouped = us;
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
    }
    for (int gi = 0; gi < 4; gi++)
        gdata_free(d[gi]);
}

// --- read ceiling ------------------------------------------------------------------------------
// What a kernel that only reads reaches with the LoRA ops' byte counts (A, B, x, tmp, y as
// op_bytes counts them, all as reads): one kernel per op of as many blocks as fit, 16-byte
// loads 8 deep per thread, the first round issued before the programmatic-launch wait as
// ours issue their weights. Alone (regions rotated past L2) and as the whole step's chain of
// 128 dependent kernels in one graph. Not a bound in the strict sense (the LoRA op also has
// its shrink -> expand dependency inside, and writes y), but what the step's shape leaves
// when every op streams as well as a pure read does.
__global__ void __launch_bounds__(256) k_read(const uint4 *p, size_t n, unsigned *sink) {
    size_t stride = (size_t)gridDim.x * blockDim.x, i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    unsigned acc = 0;
    for (bool first = true; i < n; i += 8 * stride, first = false) {
        uint4 v[8];
#pragma unroll
        for (int u = 0; u < 8; u++)
            v[u] = i + u * stride < n ? __ldcs(p + i + u * stride) : make_uint4(0, 0, 0, 0);
        if (first) {
            ls_dep_launch();
            ls_dep_wait();
        }
#pragma unroll
        for (int u = 0; u < 8; u++)
            acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (acc == 0x9e3779b9u) // practically never; keeps the loads
        *sink = acc;
}

static void launch_read(const void *p, size_t bytes, unsigned *sink, int grid, bool oneshot) {
    if (oneshot)
        grid = (int)((bytes + 256 * 8 * 16 - 1) / (256 * 8 * 16));
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = dim3(grid), cfg.blockDim = dim3(256), cfg.stream = g_st;
    cfg.attrs = &attr, cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, k_read, (const uint4 *)p, bytes / 16, sink));
}

static void read_ceiling() {
    printf("\n=== read ceiling: a read-only kernel per op, the decode shape's bytes (r=16, T=64, "
           "Distinct)\n");
    int bps = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, k_read, 256, 0));
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    // LS_READ_BPS caps the blocks per SM (each then loops longer); LS_READ_ONESHOT=1 gives
    // every block one round of loads (a grid of n / 32 KB blocks, as the v2 expand's)
    const char *cap = getenv("LS_READ_BPS"), *one = getenv("LS_READ_ONESHOT");
    if (cap && atoi(cap) > 0)
        bps = std::min(bps, atoi(cap));
    int grid = std::max(bps, 1) * sms;
    bool oneshot = one && atoi(one) == 1;
    // ob: each op's bytes; at[gi]: where op gi's region starts in a layer's, at[4] = a layer
    batch_t b = make_batch(3, 64);
    size_t ob[4], at[5] = {0};
    for (int gi = 0; gi < 4; gi++) {
        ob[gi] = ((size_t)op_bytes(G[gi], 16, b) + 255) / 256 * 256;
        at[gi + 1] = at[gi] + ob[gi];
    }
    const size_t layer = at[4];
    const int L = 32;
    char *buf = (char *)dmalloc(layer * L);
    CK(cudaMemsetAsync(buf, 1, layer * L, g_st));
    unsigned *sink = (unsigned *)dmalloc(16);
    double step_mb = 0;
    for (int gi = 0; gi < 4; gi++) {
        // rotate over the layers' regions of this op: 32 x its size is past L2
        double us = time_us([&](int i) { launch_read(buf + (i % L) * layer + at[gi], ob[gi], sink, grid, oneshot); });
        printf("read     %-8s alone     %8.1f us %8.1f MB %7.0f GB/s %5.1f%%\n", G[gi].name, us,
               ob[gi] / 1e6, ob[gi] / us / 1e3, 100.0 * ob[gi] / us / 1e3 / g_bw);
        step_mb += L * ob[gi] / 1e6;
    }
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(g_st, cudaStreamCaptureModeThreadLocal));
    for (int l = 0; l < L; l++)
        for (int gi = 0; gi < 4; gi++)
            launch_read(buf + l * layer + at[gi], ob[gi], sink, grid, oneshot);
    CK(cudaStreamEndCapture(g_st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    double us = time_us([&](int) { CK(cudaGraphLaunch(exec, g_st)); }, 3, 60);
    if (g_trace)
        trace_graph(exec, "read");
    printf("read     step     chain %8.1f us %8.1f MB %7.0f GB/s %5.1f%%  (128 dependent reads, one "
           "graph, %d blocks each)\n", us, step_mb, step_mb / us * 1e3, 1e5 * step_mb / us / g_bw,
           grid);
    g_sum.read_step = us, g_sum.read_mb = step_mb;
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaFree(buf);
    cudaFree(sink);
}

// --- SM partitions (green contexts) for the decode LoRA beside a GEMM ----------------------------
// The engine runs each decode LoRA on a side stream beside the base GEMM, with cuBLAS asked to
// target fewer SMs (cublasSetSmCountTarget) and the side stream at the lowest priority. That
// is a hint to cuBLAS, not a partition. Here the GEMM's stream and the LoRA's stream belong to
// two green contexts that split the SMs: each runs only on its own. Timed at the decode shape
// (T=64, rank 16, 8 adapters of 8 rows each: the engine's 8-distinct step), per group: GEMM
// alone (all SMs), GEMM alone on the big partition, LoRA alone on the small one, both at once
// on the partitions, and both at once the engine's way.

static bool green_pair(int n_small, cudaStream_t *big, cudaStream_t *small, int *sm_big,
                       int *sm_small) {
    CUdevice dev;
    CUdevResource all, part[1], rest;
    CUdevResourceDesc d_small, d_big;
    CUgreenCtx g_small, g_big;
    unsigned n = 1;
    CUstream s_small, s_big;
    if (cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM) != CUDA_SUCCESS ||
        cuDevSmResourceSplitByCount(part, &n, &all, &rest, 0, (unsigned)n_small) != CUDA_SUCCESS ||
        n != 1 || cuDevResourceGenerateDesc(&d_small, part, 1) != CUDA_SUCCESS ||
        cuDevResourceGenerateDesc(&d_big, &rest, 1) != CUDA_SUCCESS ||
        cuGreenCtxCreate(&g_small, d_small, dev, CU_GREEN_CTX_DEFAULT_STREAM) != CUDA_SUCCESS ||
        cuGreenCtxCreate(&g_big, d_big, dev, CU_GREEN_CTX_DEFAULT_STREAM) != CUDA_SUCCESS ||
        cuGreenCtxStreamCreate(&s_small, g_small, CU_STREAM_NON_BLOCKING, 0) != CUDA_SUCCESS ||
        cuGreenCtxStreamCreate(&s_big, g_big, CU_STREAM_NON_BLOCKING, 0) != CUDA_SUCCESS)
        return false;
    *small = (cudaStream_t)s_small, *big = (cudaStream_t)s_big;
    *sm_small = (int)part[0].sm.smCount, *sm_big = (int)rest.sm.smCount;
    return true;
}

static void green_section() {
    int n_sm = 0;
    CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    int lo, hi;
    CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    cudaStream_t lowp;
    CK(cudaStreamCreateWithPriority(&lowp, cudaStreamNonBlocking, lo));
    cudaEvent_t fork, j1, j2;
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&j1, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&j2, cudaEventDisableTiming));
    printf("\n=== green contexts: the decode LoRA (Uniform-8, r=16, T=64) beside its GEMM on split SMs\n");
    printf("%-8s %5s %9s %9s %9s %9s %9s %12s\n", "group", "small", "gemm all", "gemm big",
           "lora sml", "both grn", "both eng", "eng leaves");
    for (int n_small : {16, 32, 48, 66}) {
        cudaStream_t big, small;
        int sb = 0, ss = 0;
        if (!green_pair(n_small, &big, &small, &sb, &ss)) {
            printf("green contexts with %d SMs: not available\n", n_small);
            cudaGetLastError();
            continue;
        }
        for (int gi : {0, 1, 2, 3}) {
            const group_t &g = G[gi];
            int ot = g.out_total(), r = 16, T = 64;
            size_t wn = (size_t)ot * g.in;
            int n_sets = (int)std::min((size_t)8, ((size_t)256 << 20) / (wn * 2) + 1);
            __nv_bfloat16 *w = (__nv_bfloat16 *)dmalloc(wn * 2 * n_sets);
            fill_bf16(w, wn * n_sets, 9, 1.0f / sqrtf((float)g.in));
            batch_t b = make_batch(1, T);
            gdata_t d;
            gdata_init(d, g, r, b, n_sets);
            float *yg = (float *)dmalloc((size_t)T * ot * 4);
            float one = 1.0f, zero = 0.0f;
            auto gemm = [&](int set, cudaStream_t st, int sms) {
                CB(cublasSetStream(g_blas, st));
                CB(cublasSetSmCountTarget(g_blas, sms));
                CB(cublasGemmEx(g_blas, CUBLAS_OP_T, CUBLAS_OP_N, ot, T, g.in, &one, w + set * wn,
                                CUDA_R_16BF, g.in, d.xb, CUDA_R_16BF, g.in, &zero, yg, CUDA_R_32F,
                                ot, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            };
            auto lora = [&](int set, cudaStream_t st) { // the backend's decode op, beside
                CK(ls_cu_lora_apply(d.y, d.tmp, d.tmp_stride, d.xb, LS_CU_BF16, pages_a(d, set), LS_CU_BF16,
                                    pages_b(d, set), LS_CU_BF16, d.tiles, d.n_tiles, r, NULL, d.off,
                                    g.in, g.n_slices, r, LS_CU_LORA_NO_PDL, st));
            };
            // fork from g_st, the two pieces on s1 / s2, join back on g_st
            auto both = [&](int set, cudaStream_t s1, cudaStream_t s2, int sms) {
                CK(cudaEventRecord(fork, g_st));
                CK(cudaStreamWaitEvent(s1, fork, 0));
                CK(cudaStreamWaitEvent(s2, fork, 0));
                gemm(set, s1, sms);
                lora(set, s2);
                CK(cudaEventRecord(j1, s1));
                CK(cudaEventRecord(j2, s2));
                CK(cudaStreamWaitEvent(g_st, j1, 0));
                CK(cudaStreamWaitEvent(g_st, j2, 0));
            };
            auto on = [&](cudaStream_t s, auto f) { // f on s, ordered inside g_st's timing
                return [&, s, f](int i) {
                    CK(cudaEventRecord(fork, g_st));
                    CK(cudaStreamWaitEvent(s, fork, 0));
                    f(i % n_sets, s);
                    CK(cudaEventRecord(j1, s));
                    CK(cudaStreamWaitEvent(g_st, j1, 0));
                };
            };
            double t_all = time_us(on(g_st, [&](int set, cudaStream_t s) { gemm(set, s, 0); }));
            double t_big = time_us(on(big, [&](int set, cudaStream_t s) { gemm(set, s, 0); }));
            double t_lora = time_us(on(small, [&](int set, cudaStream_t s) { lora(set, s); }));
            double t_green = time_us([&](int i) { both(i % n_sets, big, small, 0); });
            double t_eng = time_us([&](int i) { both(i % n_sets, g_st, lowp, n_sm - n_small); });
            printf("%-8s %2d/%-3d %9.1f %9.1f %9.1f %9.1f %9.1f %9d SMs\n", g.name, ss, sb, t_all,
                   t_big, t_lora, t_green, t_eng, n_small);
            CB(cublasSetSmCountTarget(g_blas, 0));
            CB(cublasSetStream(g_blas, g_st));
            CK(cudaStreamSynchronize(g_st));
            cudaFree(w);
            cudaFree(yg);
            gdata_free(d);
        }
    }
    printf("(us per op; \"both\": from the fork to the join of GEMM and LoRA; \"eng\": the engine's way, "
           "cuBLAS SM count target with the LoRA on a lowest-priority stream)\n");
}

// --- the serving shape ---------------------------------------------------------------------------
// The decode op at the serving benchmark's shape (make_serve_batch: 128 requests, Zipf(1) over
// n adapters of ranks 8-64 in rank-64 slots), per group, against a read-only kernel moving the
// same bytes (launch_read), pools rotated past L2; and the layer's qkvo and all-seven sums.
static void serve_section(const std::vector<int> &ns) {
    printf("\n=== serving shape: 128 requests, Zipf(1) over n adapters, ranks 8/16/32/64 by index, "
           "rank-64 slots\n");
    int bps = 0, sms = 0, dev = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, k_read, 256, 0));
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    unsigned *sink = (unsigned *)dmalloc(16);
    for (int n : ns) {
        batch_t b = make_serve_batch(n, 128);
        double t_ours[4], t_read[4];
        for (int gi = 0; gi < 4; gi++) {
            const group_t &g = G[gi];
            double set_b = (double)(b.seg_len.size() + 1) * adapter_bytes(g, 64);
            int n_sets = (int)std::min(8.0, std::max(2.0, 512e6 / set_b + 1));
            gdata_t d;
            gdata_init(d, g, 64, b, n_sets);
            double bytes = op_bytes(g, 64, b);
            if (g_trace) {
                char label[64];
                snprintf(label, sizeof label, "n=%d %s", n, g.name);
                CK(cudaStreamSynchronize(g_st));
                kt_mark(label);
            }
            t_ours[gi] = time_us([&](int i) { run_ours(d, i % n_sets, I_OURS); });
            if (g_trace) {
                CK(cudaStreamSynchronize(g_st));
                kt_mark("");
            }
            size_t rb = ((size_t)bytes + 255) / 256 * 256;
            char *buf = (char *)dmalloc(rb * 8);
            CK(cudaMemsetAsync(buf, 1, rb * 8, g_st));
            t_read[gi] = time_us([&](int i) { launch_read(buf + (i % 8) * rb, rb, sink, bps * sms, false); });
            printf("serve n=%-5d %-8s segs=%-3d tiles=%-3d %8.1f us (read %6.1f us) %7.1f MB %5.1f%% of bw\n",
                   n, g.name, (int)b.seg_len.size(), d.n_tiles, t_ours[gi], t_read[gi], bytes / 1e6,
                   100.0 * bytes / t_ours[gi] / 1e3 / g_bw);
            cudaFree(buf);
            gdata_free(d);
        }
        printf("serve n=%-5d layer: qkvo %.1f us (read %.1f), all seven %.1f us (read %.1f); x32 layers: "
               "qkvo %.2f ms, all %.2f ms\n", n, t_ours[0] + t_ours[1], t_read[0] + t_read[1],
               t_ours[0] + t_ours[1] + t_ours[2] + t_ours[3], t_read[0] + t_read[1] + t_read[2] + t_read[3],
               32e-3 * (t_ours[0] + t_ours[1]), 32e-3 * (t_ours[0] + t_ours[1] + t_ours[2] + t_ours[3]));
    }
    cudaFree(sink);
}

int main(int argc, char **argv) {
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("bench_lora_cuda: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
           prop.l2CacheSize >> 20);
    CK(cudaStreamCreateWithFlags(&g_st, cudaStreamNonBlocking));
    CB(cublasCreate(&g_blas));
    CB(cublasSetStream(g_blas, g_st));
    measure_bw();
    if (argc > 2 && !strcmp(argv[1], "--op")) { // one op a few times, for a profiler
        for (int gi = 0; gi < 4; gi++)
            if (!strcmp(argv[2], G[gi].name)) {
                batch_t b = make_batch(3, 64);
                gdata_t d;
                gdata_init(d, G[gi], 16, b, 4);
                for (int i = 0; i < 8; i++)
                    run_ours(d, i % 4, I_OURS);
                CK(cudaStreamSynchronize(g_st));
                gdata_free(d);
                return 0;
            }
        fprintf(stderr, "bench_lora_cuda: --op qkv|o|gate_up|down\n");
        return 2;
    }
    if (argc > 1 && !strcmp(argv[1], "--step")) { // the decode step (and its timeline)
        if (argc > 2 && kt_start(argv[2]) != 0) {
            fprintf(stderr, "bench_lora_cuda: --step %s: CUPTI tracing could not start\n", argv[2]);
            return 2;
        }
        g_trace = argc > 2;
        whole_step(16, 64, 3);
        read_ceiling();
        if (g_trace)
            kt_stop();
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--serve")) {
        if (argc > 2 && kt_start(argv[2]) != 0) {
            fprintf(stderr, "bench_lora_cuda: --serve %s: CUPTI tracing could not start\n", argv[2]);
            return 2;
        }
        g_trace = argc > 2;
        serve_section({1, 8, 100, 1000, 2000});
        if (g_trace)
            kt_stop();
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--green")) {
        green_section();
        return 0;
    }
    cross_check();

    printf("\n=== single op, qkv group (4096 -> 6144, 3 slices), plain launches\n");
    const int ranks[4] = {8, 16, 32, 64}, Ts[4] = {1, 16, 64, 256};
    for (int ri = 0; ri < 4; ri++)
        for (int ti = 0; ti < 4; ti++)
            for (int mix = 0; mix < 4; mix++) {
                if (quick && (ranks[ri] != 16 || Ts[ti] != 64))
                    continue;
                if (Ts[ti] == 1 && mix > 0)
                    continue; // one request: every mix is Identical
                single_op(0, ranks[ri], Ts[ti], mix, true);
            }
    printf("\n=== single op, every group, decode shape (r=16, T=64, Distinct)\n");
    for (int gi = 1; gi < 4; gi++)
        single_op(gi, 16, 64, 3, false);

    printf("\n=== whole decode step's LoRA: 32 layers x 7 targets (4 stacked groups), one "
           "CUDA graph\n");
    for (int ri = 0; ri < 4; ri++)
        for (int mix = 0; mix < 4; mix++) {
            if (quick && ranks[ri] != 16)
                continue;
            whole_step(ranks[ri], 64, mix);
        }
    if (!quick)
        for (int T : {1, 16, 256})
            whole_step(16, T, 3);

    read_ceiling();

    printf("\n=== summary: decode shape (r=16, T=64, Distinct), copy bandwidth %.0f GB/s\n",
           g_bw);
    double qb = op_bytes(G[0], 16, make_batch(3, 64));
    printf("qkv op        ours %.1f us (%.1f%% of bw)\n", g_sum.op_ours, 100 * qb / g_sum.op_ours / 1e3 / g_bw);
    printf("whole step    ours %.1f us (%.1f%% of bw)   grouped %.1f us (%.1f%%), %.0f MB\n", g_sum.step_ours,
           1e5 * g_sum.step_mb / g_sum.step_ours / g_bw, g_sum.step_grouped,
           g_sum.step_grouped > 0 ? 1e5 * g_sum.step_mb / g_sum.step_grouped / g_bw : 0.0, g_sum.step_mb);
    printf("whole step    read-only chain of the same bytes %.1f us (%.1f%% of bw): ours takes "
           "%.2fx its time\n", g_sum.read_step, 1e5 * g_sum.read_mb / g_sum.read_step / g_bw,
           g_sum.step_ours / g_sum.read_step);
    return 0;
}
