/*  kernels/cuda/sampling.cu — ls_sampling_sample on the GPU: penalties, temperature,
    log-softmax, top-n logprobs, greedy, top-k / top-p / min-p truncation and the seeded
    exponential-race draw. CPU reference and the full specification: kernels/cpu/sampling.c
    and kernels/ops.h.

    Launches per call:
    1. stats, a block per (row, chunk) — a row cut into chunks so that a batch of one row
       still runs on every SM (ls_cu_sample_chunks): copy the chunk (a grammar mask turns
       the disallowed tokens' logits into -inf as they are copied: one coalesced word read
       per 32 tokens), the penalties of the row's ids in the chunk (repetition once per
       distinct token through atomicExch on a zeroed mark row, frequency/presence through
       atomic counts; the mark row is left zeroed), temperature, the chunk's argmax (ties
       to the lower id) and its sum of exp(l - its max) in double.
    2. finish, a block per (row, chunk): the row's argmax and log-sum-exp from the chunks'
       (the reference's double sum of exp(l - max), each chunk's sum scaled by exp(its max -
       the row's max): the same terms up to rounding), the chunk's logprob row, and the
       greedy result.
    3. only when rows ask for logprobs, a block of 1024 threads per row: the top-n list by
       repeated block arg-max over "strictly after the previous pick" in (logprob desc, id
       asc) order.
    4. only for rows with top-k or top-p: a CUB segmented radix sort of (logprob, id),
       descending and stable, so ties come out by id ascending exactly as the reference's
       qsort comparator orders them (CUB treats -0.0 and +0.0 as equal, as C's == does).
    5. draw, a block of 1024 threads per row: keep = top-k, then the top-p prefix found by
       a block-wide double prefix scan (same sums as the reference's sequential loop up to
       rounding of the order), the
       min-p bound against a host-computed logf(min_p), then the race
       key = lp - log(-log(u)) with u = ls_rng_uniform(seed, step, id), arg-max with ties
       to the lower id.
    Tokens, logprobs and top-n lists match the reference except where float math functions
    (expf/logf, 1 ulp apart from glibc) flip a near-tie of race keys or of a truncation
    boundary; tests/gpu counts those.

    Known limits: the sort is a full segmented radix sort of each truncated
    row (a radix select of the top-k / top-p prefix is the fast path), and the scratch is
    (n_rows, V) arrays several times over; the top-n and draw passes still take one block
    a row (one SM for a batch of one).
*/
#include <assert.h>
#include <limits.h>
#include <math.h>

#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>

#include "common.cuh"

enum { SMP_THREADS = 1024, SMP_STATS_THREADS = 512 };

// Chunks a row is cut into for the stats and finish passes: about four blocks an SM over the
// whole batch (a batch-1 step's row over the whole device, not one SM), chunks of at least
// 2,048 tokens, at most LS_CU_SAMPLE_MAX_CHUNKS.
int ls_cu_sample_chunks(int n_rows, int V) {
    static int n_sm; // one device per process (backend_cuda.h)
    if (!n_sm) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
            n_sm = 1;
    }
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

// 1. A block per (row, chunk): the chunk copied (the mask applied), the penalties of the
// row's ids that fall in it, temperature, and the chunk's (max, first id of it) and sum of
// exp(l - max) in double into part.
__global__ void __launch_bounds__(SMP_STATS_THREADS) k_sample_stats(ls_cu_sample_args_t a, int C) {
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
__global__ void __launch_bounds__(SMP_STATS_THREADS) k_sample_finish(ls_cu_sample_args_t a, int C) {
    __shared__ float s_lse;
    __shared__ ls_vid_t s_best;
    int row = blockIdx.x, c = blockIdx.y, tid = threadIdx.x, V = a.V, v0, v1;
    s_chunk(V, c, C, &v0, &v1);
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

__global__ void __launch_bounds__(SMP_THREADS) k_sample_draw(ls_cu_sample_args_t a) {
    typedef cub::BlockScan<double, SMP_THREADS> scan_t;
    __shared__ typename scan_t::TempStorage scan_tmp;
    __shared__ double dscr[32];
    __shared__ ls_vid_t vscr[32];
    __shared__ int iscr[32];
    int row = blockIdx.x, tid = threadIdx.x, bd = blockDim.x, V = a.V;
    const ls_cu_sample_params_t sp = a.params[row];
    if (sp.temperature <= 0.0f)
        return;
    size_t base = (size_t)row * V;
    const float *l = a.lp + base;
    int argmax = a.tokens[row]; // written by finish
    float lpmax = l[argmax];

    // 5. truncation: the first `keep` tokens of the sorted row survive (0: no truncation)
    int keep = 0;
    const float *sk = a.sorted_lp + base;
    const int32_t *si = a.sorted_id + base;
    int use_k = sp.top_k > 0 && sp.top_k < V, use_p = sp.top_p < 1.0f;
    if (use_k || use_p) {
        keep = use_k ? sp.top_k : V;
        if (use_p) {
            double l0 = sk[0];
            double total = 0.0;
            for (int i = tid; i < keep; i += bd)
                total += exp((double)sk[i] - l0);
            total = ls_block_sum(total, dscr);
            double target = (double)sp.top_p * total;
            // smallest i with (sum of the first i) >= target, else keep (as the loop of
            // the reference ends); i = 0 when target <= 0
            int found = keep;
            if (!(0.0 < target))
                found = 0;
            else {
                double running = 0.0;
                for (int b0 = 0; b0 < keep; b0 += bd) {
                    int i = b0 + tid;
                    double e = i < keep ? exp((double)sk[i] - l0) : 0.0, incl, chunk;
                    __syncthreads();
                    scan_t(scan_tmp).InclusiveSum(e, incl, chunk);
                    int cand = (i < keep && running + incl >= target) ? i + 1 : INT_MAX;
                    cand = s_block_min(cand, iscr);
                    if (cand != INT_MAX) {
                        found = cand;
                        break;
                    }
                    running += chunk;
                }
            }
            keep = found > 0 ? found : 1; // the top token always survives
        }
    }

    // 6. the race over the survivors
    float min_l = sp.min_p > 0.0f ? __fadd_rn(lpmax, sp.log_min_p) : -INFINITY;
    int n = keep ? keep : V;
    ls_vid_t best = {-INFINITY, INT_MAX};
    for (int i = tid; i < n; i += bd) {
        int v = keep ? si[i] : i;
        float lv = keep ? sk[i] : l[i];
        if (lv < min_l || lv == -INFINITY)
            continue;
        float e = -logf(s_rng_uniform(sp.seed, sp.step, (uint64_t)v));
        ls_vid_t c = {__fsub_rn(lv, logf(e)), v};
        best = ls_vid_best(best, c);
    }
    best = ls_block_vid_best(best, vscr);
    if (tid == 0) {
        int chosen = best.id == INT_MAX ? argmax : best.id;
        a.tokens[row] = chosen;
        a.logprobs[row] = l[chosen];
    }
}

__global__ void k_iota_rows(int32_t *iota, size_t n, int V) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        iota[i] = (int32_t)(i % V);
}

cudaError_t ls_cu_iota_rows(int32_t *iota, int n_rows, int V, cudaStream_t stream) {
    size_t n = (size_t)n_rows * V;
    if (n == 0)
        return cudaSuccess;
    k_iota_rows<<<ls_cu_blocks(n, 256), 256, 0, stream>>>(iota, n, V);
    LS_CU_CHECK_LAUNCH();
}

size_t ls_cu_sample_sort_temp_bytes(int n_rows, int V, int n_sort_rows) {
    size_t bytes = 0;
    if (n_sort_rows == 0)
        return 0;
    cudaError_t e = cub::DeviceSegmentedRadixSort::SortPairsDescending(
        (void *)NULL, bytes, (const float *)NULL, (float *)NULL, (const int32_t *)NULL,
        (int32_t *)NULL, n_rows * V, n_sort_rows, (const int32_t *)NULL,
        (const int32_t *)NULL, 0, 32, (cudaStream_t)0);
    return e == cudaSuccess ? bytes : (size_t)-1;
}

cudaError_t ls_cu_sample(const ls_cu_sample_args_t *a, cudaStream_t stream) {
    assert((size_t)a->n_rows * a->V < INT_MAX);
    if (a->n_rows == 0)
        return cudaSuccess;
    int C = ls_cu_sample_chunks(a->n_rows, a->V);
    dim3 grid((unsigned)a->n_rows, (unsigned)C);
    k_sample_stats<<<grid, SMP_STATS_THREADS, 0, stream>>>(*a, C);
    k_sample_finish<<<grid, SMP_STATS_THREADS, 0, stream>>>(*a, C);
    if (a->top_ids)
        k_sample_top<<<a->n_rows, SMP_THREADS, 0, stream>>>(*a);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return e;
    if (a->n_sort_rows > 0) {
        size_t bytes = a->sort_temp_bytes;
        e = cub::DeviceSegmentedRadixSort::SortPairsDescending(
            a->sort_temp, bytes, a->lp, a->sorted_lp, a->iota, a->sorted_id,
            a->n_rows * a->V, a->n_sort_rows, a->sort_begin, a->sort_end, 0, 32, stream);
        if (e != cudaSuccess)
            return e;
    }
    k_sample_draw<<<a->n_rows, SMP_THREADS, 0, stream>>>(*a);
    LS_CU_CHECK_LAUNCH();
}
