/*  kernels/cuda/dev/dev_prefetch.cu — can the weights of a decode step's next GEMM stream
    into L2 while the small kernels before it run?

    A decode step at batch 1 spends ~35 µs a layer (H100) in kernels that move almost no
    bytes (attention over a short context, RMSNorm, RoPE, the KV store, SiLU·mul, conversions,
    split-K reductions) between four GEMMs that stream the layer's 436 MB of weights; HBM idles
    through them. This program builds that chain — 32 layers of Llama-3-8B's four projections
    (bf16, cuBLAS as engine/backend_cuda.cu calls it, fp32 out), each GEMM after a "gap"
    kernel that spins one block for the time the small kernels take there — as one CUDA graph,
    and times it with and without a prefetch node beside each gap: a kernel on a second stream,
    forked where the gap starts and joined before the GEMM, that asks L2 for the first bytes
    the GEMM will read (cp.async.bulk.prefetch.L2, sm_90).

    Patterns (which bytes of w (out, in) row-major count as "first"):
      rows   the first rows whole (the matrix's first bytes), 64 KB bulk prefetches
      cols   the first in-columns of every row, one bulk prefetch a row
      lines  the same bytes, one prefetch.global.L2::evict_last a 128-byte line
    Amounts: "gap", what HBM moves in the gap at 0.9 × copy bandwidth, capped at `cap` MB;
    "cap", `cap` MB whatever the gap.

    Printed per T (tokens), for each GEMM alone (32 layers of [gap, GEMM]) and for the whole
    layer: µs a layer without gaps (the GEMMs alone), with gaps, the floor of the weights'
    bytes, and with each prefetch; "hidden" = the share of the gaps' time the prefetch takes
    back. The prefetch changes no result: the last GEMM's output is checked equal with and
    without it, bit for bit. Gaps are spin kernels of one block, so this is the best case:
    the engine's own step did not gain (kernels/cuda/dev/README.md, "L2 prefetch").

    Usage: dev_prefetch [--t T] (default: 1, 8 and 64).
*/
#include <cstring>

#include "dev_blas.cuh"
#include "dev_common.cuh"

enum { LAYERS = 32, N_G = 4 };
// in the step's order: o after attention, gate_up after a norm, down after SiLU·mul, qkv
// after a norm
static const struct {
    const char *name;
    int in, out;
} s_g[N_G] = {{"o", 4096, 4096}, {"gate_up", 4096, 28672}, {"down", 14336, 4096}, {"qkv", 4096, 6144}};

__global__ void k_spin(long ns) {
    long t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (;;) {
        long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 >= ns)
            break;
    }
}

// Each thread asks for one piece: rows pattern, `piece` contiguous bytes from p + i·piece;
// cols pattern, row i's first `piece` bytes (row stride `ld` bytes).
__global__ void k_prefetch(const char *p, long n, long piece, long ld) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const char *a = p + (ld ? i * ld : i * piece);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"((unsigned)piece) : "memory");
    }
}

struct s_chain_t {
    __nv_bfloat16 *w[LAYERS][N_G], *x;
    float *y;
};

// Each thread asks for one 128-byte line at a time: row i / piece lines
__global__ void k_prefetch_lines(const char *p, long rows, long lines, long ld) {
    long n = rows * lines;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const char *a = p + (i / lines) * ld + (i % lines) * 128;
        asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(a) : "memory");
    }
}

static int s_groups = 0xf; // which GEMMs the chain holds (bit g: s_g[g])

// One pass of the chain on st (and side for prefetches): pattern 0 none, 1 rows, 2 cols,
// 3 cols by lines
static void s_issue(cublasHandle_t h, const s_chain_t &c, int T, const double *gap_us, int pattern,
                    double bw, double fill, double cap_mb, cudaStream_t st, cudaStream_t side,
                    cudaEvent_t *ev) {
    float one = 1.0f, zero = 0.0f;
    int e = 0;
    for (int l = 0; l < LAYERS; l++)
        for (int g = 0; g < N_G; g++) {
            if (!(s_groups >> g & 1))
                continue;
            const char *w = (const char *)c.w[l][g];
            long bytes = (long)s_g[g].in * s_g[g].out * 2;
            if (pattern && gap_us[g] > 0) {
                // fill 0: the cap alone, whatever the gap
                double want = fill > 0 ? std::min(gap_us[g] * 1e-6 * bw * 1e9 * fill, cap_mb * 1e6) : cap_mb * 1e6;
                want = std::min(want, (double)bytes);
                DEV_CK(cudaEventRecord(ev[e], st));
                DEV_CK(cudaStreamWaitEvent(side, ev[e], 0));
                if (pattern == 1) {
                    long piece = 64 << 10, n = (long)(want / piece);
                    if (n > 0)
                        k_prefetch<<<(unsigned)((n + 127) / 128), 128, 0, side>>>(w, n, piece, 0);
                } else if (pattern == 2) {
                    long ld = (long)s_g[g].in * 2;
                    long piece = (long)(want / s_g[g].out) / 128 * 128;
                    if (piece > 0)
                        k_prefetch<<<(unsigned)((s_g[g].out + 127) / 128), 128, 0, side>>>(w, s_g[g].out, piece, ld);
                } else {
                    long ld = (long)s_g[g].in * 2, lines = (long)(want / s_g[g].out) / 128;
                    if (lines > 0)
                        k_prefetch_lines<<<264, 256, 0, side>>>(w, s_g[g].out, lines, ld);
                }
                DEV_CK(cudaGetLastError());
                DEV_CK(cudaEventRecord(ev[e + 1], side));
            }
            if (gap_us[g] > 0)
                k_spin<<<1, 32, 0, st>>>((long)(gap_us[g] * 1e3));
            if (pattern && gap_us[g] > 0) {
                DEV_CK(cudaStreamWaitEvent(st, ev[e + 1], 0));
                e += 2;
            }
            BL_CK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s_g[g].out, T, s_g[g].in, &one, w,
                               CUDA_R_16BF, s_g[g].in, c.x, CUDA_R_16BF, s_g[g].in, &zero, c.y,
                               CUDA_R_32F, s_g[g].out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
}

// µs per layer of the chain captured as one graph (dev_graph_us)
static double s_time(cublasHandle_t h, const s_chain_t &c, int T, const double *gap_us, int pattern,
                     double bw, double fill, double cap_mb, cudaStream_t st, cudaStream_t side,
                     cudaEvent_t *ev) {
    double us = dev_graph_us(st, [&] {
        s_issue(h, c, T, gap_us, pattern, bw, fill, cap_mb, st, side, ev);
        return cudaGetLastError();
    });
    if (us < 0) {
        fprintf(stderr, "dev_prefetch: the chain at T=%d did not run\n", T);
        exit(2);
    }
    return us / LAYERS;
}

int main(int argc, char **argv) {
    std::vector<int> ts = {1, 8, 64};
    for (int i = 1; i + 1 < argc; i += 2)
        if (!strcmp(argv[i], "--t"))
            ts = {atoi(argv[i + 1])};
    cudaStream_t st, side;
    double bw = dev_begin("dev_prefetch", "32 layers of Llama-3-8B's projections, bf16, cuBLAS", &st);
    DEV_CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    cublasHandle_t h;
    BL_CK(cublasCreate(&h));
    BL_CK(cublasSetStream(h, st));
    void *ws;
    DEV_CK(cudaMalloc(&ws, 32 << 20));
    BL_CK(cublasSetWorkspace(h, ws, 32 << 20));
    s_chain_t c;
    dev_rng_t r{7};
    std::vector<float> hx;
    for (int l = 0; l < LAYERS; l++)
        for (int g = 0; g < N_G; g++) {
            size_t n = (size_t)s_g[g].in * s_g[g].out;
            DEV_CK(cudaMalloc(&c.w[l][g], n * 2));
            DEV_CK(cudaMemset(c.w[l][g], 0x3c, n * 2)); // 0x3c3c: a finite bf16 (0.0115)
        }
    c.x = dev_bf16_fill(r, (size_t)64 * 14336, 1.0f, hx);
    DEV_CK(cudaMalloc(&c.y, (size_t)64 * 28672 * 4));
    std::vector<cudaEvent_t> ev(2 * LAYERS * N_G);
    for (auto &e : ev)
        DEV_CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));

    // the gaps before o, gate_up, down, qkv (µs), as a batch-1 / batch-64 step shows them
    // (bench_decode_cuda --trace, H100): attention + conversion + RoPE + KV store; a split-K
    // reduction + RMSNorm; SiLU·mul; a reduction + RMSNorm
    const double gaps1[N_G] = {21, 7, 2.5, 7}, gaps64[N_G] = {33, 7, 5, 7}, none[N_G] = {0, 0, 0, 0};
    const double caps[] = {8, 16, 24, 40}, fills[] = {0.9, 0};
    int fail = 0;
    const char *pn[4] = {"none", "rows", "cols", "lines"};
    for (int T : ts) {
        const double *gaps = T < 64 ? gaps1 : gaps64;
        printf("\nT=%d (µs a layer; hidden = the share of the gap the prefetch takes back)\n", T);
        printf("%-8s %6s %6s %8s %8s  %s\n", "GEMMs", "gap", "alone", "gapped", "floor", "pattern/amount/cap: µs hidden");
        for (int gm = 0; gm <= N_G; gm++) {
            s_groups = gm < N_G ? 1 << gm : 0xf;
            double gsum = 0, wbytes = 0;
            for (int g = 0; g < N_G; g++)
                if (s_groups >> g & 1)
                    gsum += gaps[g], wbytes += (double)s_g[g].in * s_g[g].out * 2;
            double bare = s_time(h, c, T, none, 0, bw, 0, 0, st, side, ev.data());
            double gapped = s_time(h, c, T, gaps, 0, bw, 0, 0, st, side, ev.data());
            printf("%-8s %6.1f %6.1f %8.1f %8.1f ", gm < N_G ? s_g[gm].name : "all", gsum, bare, gapped,
                   wbytes / bw / 1e3);
            for (int p = 1; p <= 3; p++)
                for (double fill : fills)
                    for (double cap : caps) {
                        double t = s_time(h, c, T, gaps, p, bw, fill, cap, st, side, ev.data());
                        printf(" %s/%s/%.0f %.1f %.0f%%", pn[p], fill > 0 ? "gap" : "cap", cap, t,
                               100.0 * (gapped - t) / gsum);
                    }
            printf("\n");
        }
        s_groups = 0xf;
        // the prefetch changes no result: y of the last GEMM (qkv) equal with and without it
        std::vector<float> y0((size_t)T * 6144), y1(y0.size());
        s_time(h, c, T, gaps, 0, bw, 0, 0, st, side, ev.data());
        DEV_CK(cudaMemcpy(y0.data(), c.y, y0.size() * 4, cudaMemcpyDeviceToHost));
        s_time(h, c, T, gaps, 2, bw, 0.9, 24, st, side, ev.data());
        DEV_CK(cudaMemcpy(y1.data(), c.y, y1.size() * 4, cudaMemcpyDeviceToHost));
        if (memcmp(y0.data(), y1.data(), y0.size() * 4)) {
            printf("FAIL: T=%d output differs with the prefetch\n", T);
            fail = 1;
        }
    }
    return fail;
}
