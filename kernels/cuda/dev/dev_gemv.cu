/*  kernels/cuda/dev/dev_gemv.cu — the decode GEMM of a few tokens (kernels/cuda/gemv.cu,
    production up to LS_CU_GEMV_MAX_T tokens) against cuBLAS, and its versions.

    At batch 1 a decode layer is four GEMMs streaming 436 MB of weights with small kernels
    of ours between them (attention, RMSNorm, RoPE, SiLU·mul) during which HBM idles.
    cuBLAS's kernels neither wait nor trigger programmatically, so each starts only once the
    kernel before it has ended, and its ramp and tail (and o's and down's split-K reduction
    kernel) come on top of its bytes. Ours (gemv.cu's header has the kernel) is launched
    with programmatic dependent launch and asks L2 for its rows' first bytes before it waits.

    Versions: `gemv` (production: 1 row a warp at one token, 2 at two to four, LS_CU_GEMV_PF
    bytes a GEMM asked of L2); `gemv_nopf` (the same rows a warp, no prefetch); `gemv_r4`,
    `gemv_r2`, `gemv_r1` (4, 2 or 1 rows a warp at every T, with the prefetch).

    Checked against a CPU reference (fp32 sums of the bf16 products, NMSE), then timed two
    ways: the GEMM alone (back to back, weight sets rotating past L2), and a chain of 32
    layers of the four projections, each after a "gap" kernel of ours that spins one block
    for the time the small kernels take before it at batch 1 (H100 step timeline: o after
    attention + conversion + RoPE/KV store ~9 µs, gate_up and qkv after an RMSNorm ~3.5,
    down after SiLU·mul ~2), as one CUDA graph; µs a layer.

    Usage: dev_gemv. Exit 1 if a version fails its check.
*/
#include <cstring>

#include "../gemv.cu"

#include "dev_blas.cuh"
#include "dev_common.cuh"

enum { LAYERS = 32, N_G = 4 };
static const struct {
    const char *name;
    int in, out;
    double gap_us; // the small kernels before it at batch 1
} s_g[N_G] = {{"o", 4096, 4096, 9}, {"gate_up", 4096, 28672, 3.5}, {"down", 14336, 4096, 2},
              {"qkv", 4096, 6144, 3.5}};

// the production kernel with R rows a warp and pf bytes a row asked of L2 before the wait
template <int R>
static cudaError_t s_gemv(float *y, const __nv_bfloat16 *x, const __nv_bfloat16 *w, int T, int in, int out,
                          int pf, cudaStream_t st) {
    typedef __nv_bfloat16 B;
    dim3 grid((unsigned)((out + GV_WARPS * R - 1) / (GV_WARPS * R))), block(GV_WARPS * 32);
    const void *nb = NULL;
    switch (T) {
    case 1: return ls_cu_launch_dep(k_gemv<1, R, B, B>, grid, block, 0, st, y, x, w, nb, LS_CU_F32, T, in, out, 0, pf);
    case 2: return ls_cu_launch_dep(k_gemv<2, R, B, B>, grid, block, 0, st, y, x, w, nb, LS_CU_F32, T, in, out, 0, pf);
    case 3:
    case 4: return ls_cu_launch_dep(k_gemv<4, R, B, B>, grid, block, 0, st, y, x, w, nb, LS_CU_F32, T, in, out, 0, pf);
    default: return ls_cu_launch_dep(k_gemv<8, R, B, B>, grid, block, 0, st, y, x, w, nb, LS_CU_F32, T, in, out, 0, pf);
    }
}

// the small kernels before a GEMM: one block spinning for ns, enrolled as ours are
__global__ void k_gap(long ns) {
    ls_dep_enter();
    long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    while (t - t0 < ns);
}

enum { V_BLAS, V_GEMV, V_NOPF, V_R4, V_R2, V_R1, N_V };
static const char *s_names[N_V] = {"cuBLAS", "gemv", "gemv_nopf", "gemv_r4", "gemv_r2", "gemv_r1"};
static cublasHandle_t s_h;
static long s_pf_total = LS_CU_GEMV_PF; // bytes asked of L2 a GEMM, over its rows

static cudaError_t s_run(int v, float *y, const __nv_bfloat16 *x, const __nv_bfloat16 *w, int T, int in, int out,
                         cudaStream_t st) {
    // production: the GEMV where ls_cu_gemv_ok, else cuBLAS (as the CUDA backend's matmul)
    if (v == V_GEMV && ls_cu_gemv_ok(T, in, x, LS_CU_BF16, w, LS_CU_BF16))
        return ls_cu_gemv(y, x, LS_CU_BF16, w, LS_CU_BF16, NULL, LS_CU_F32, T, in, out, 0, 0, st);
    if (v == V_GEMV || v == V_BLAS) {
        float one = 1.0f, zero = 0.0f;
        BL_CK(cublasGemmEx(s_h, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, &one, w, CUDA_R_16BF, in, x, CUDA_R_16BF,
                           in, &zero, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return cudaGetLastError();
    }
    // production's rows a warp (1 at one token, else 2) without the prefetch; or R rows a
    // warp at every T, with production's prefetch amount (s_pf_total: the sweep)
    long pf = v == V_NOPF ? 0 : std::min((long)in * 2, s_pf_total / out) / 128 * 128;
    return v == V_NOPF ? (T == 1 ? s_gemv<1>(y, x, w, T, in, out, 0, st) : s_gemv<2>(y, x, w, T, in, out, 0, st))
           : v == V_R4 ? s_gemv<4>(y, x, w, T, in, out, (int)pf, st)
           : v == V_R2 ? s_gemv<2>(y, x, w, T, in, out, (int)pf, st)
                       : s_gemv<1>(y, x, w, T, in, out, (int)pf, st);
}

// µs a layer of 32 layers of [gap, GEMM] x 4 in one graph (gaps: none when !gaps)
static double s_chain(int v, __nv_bfloat16 *(&w)[LAYERS][N_G], float *y, const __nv_bfloat16 *x, int T, bool gaps,
                      cudaStream_t st) {
    double us = dev_graph_us(st, [&] {
        cudaError_t e = cudaSuccess;
        for (int l = 0; l < LAYERS && e == cudaSuccess; l++)
            for (int k = 0; k < N_G && e == cudaSuccess; k++) {
                if (gaps)
                    e = ls_cu_launch_dep(k_gap, dim3(1), dim3(32), 0, st, (long)(s_g[k].gap_us * 1e3));
                if (e == cudaSuccess)
                    e = s_run(v, y, x, w[l][k], T, s_g[k].in, s_g[k].out, st);
            }
        return e;
    });
    if (us < 0) {
        fprintf(stderr, "dev_gemv: %s's chain at T=%d did not run\n", s_names[v], T);
        exit(2);
    }
    return us / LAYERS;
}

int main() {
    cudaStream_t st;
    double bw = dev_begin("dev_gemv", "Llama-3-8B's projections, bf16, T = 1..8", &st);
    BL_CK(cublasCreate(&s_h));
    BL_CK(cublasSetStream(s_h, st));
    void *ws;
    DEV_CK(cudaMalloc(&ws, 32 << 20));
    BL_CK(cublasSetWorkspace(s_h, ws, 32 << 20));
    dev_rng_t rng = {11};
    std::vector<float> hx, hw;
    __nv_bfloat16 *x = dev_bf16_fill(rng, (size_t)8 * 14336, 1.0f, hx);
    float *y;
    DEV_CK(cudaMalloc(&y, (size_t)8 * 28672 * 4));

    // validation on a small shape with rows past the last warp's and every T
    {
        int in = 1024, out = 200;
        __nv_bfloat16 *w = dev_bf16_fill(rng, (size_t)in * out, 0.1f, hw);
        for (int T : {1, 2, 3, 4, 5, 8})
            for (int v = 0; v < N_V; v++) {
                DEV_CK(cudaMemset(y, 0xff, (size_t)T * out * 4));
                DEV_CK(s_run(v, y, x, w, T, in, out, st));
                std::vector<float> got((size_t)T * out), want(got.size());
                DEV_CK(cudaMemcpy(got.data(), y, got.size() * 4, cudaMemcpyDeviceToHost));
                for (int t = 0; t < T; t++)
                    for (int o = 0; o < out; o++) {
                        double s = 0;
                        for (int k = 0; k < in; k++)
                            s += (double)hx[(size_t)t * in + k] * hw[(size_t)o * in + k];
                        want[(size_t)t * out + o] = (float)s;
                    }
                char what[32];
                snprintf(what, sizeof what, "1024x200 T=%d", T);
                dev_check(what, s_names[v], dev_nmse(got.data(), want.data(), got.size()), 1e-10);
            }
        cudaFree(w);
    }

    // the weights: 32 layers' worth, so a chain reads them from memory
    static __nv_bfloat16 *w[LAYERS][N_G];
    for (int l = 0; l < LAYERS; l++)
        for (int k = 0; k < N_G; k++) {
            size_t n = (size_t)s_g[k].in * s_g[k].out;
            DEV_CK(cudaMalloc(&w[l][k], n * 2));
            DEV_CK(cudaMemset(w[l][k], 0x3c, n * 2)); // 0x3c3c: a finite bf16
        }
    printf("\nalone, µs (%% of copy bandwidth), 32 sets rotating\n%-8s %3s", "GEMM", "T");
    for (int v = 0; v < N_V; v++)
        printf(" | %9s %6s", s_names[v], "%copy");
    printf("\n");
    for (int k = 0; k < N_G; k++)
        for (int T : {1, 2, 4, 8}) {
            double bytes = (double)s_g[k].in * s_g[k].out * 2;
            printf("%-8s %3d", s_g[k].name, T);
            for (int v = 0; v < N_V; v++) {
                double us = dev_time_us(st, 32, [&](long i) {
                    return s_run(v, y, x, w[i % LAYERS][k], T, s_g[k].in, s_g[k].out, st);
                });
                printf(" | %9.1f %5.1f%%", us, 100 * bytes / us / 1e3 / bw);
            }
            printf("\n");
        }
    double floor_us = 0;
    for (int k = 0; k < N_G; k++)
        floor_us += (double)s_g[k].in * s_g[k].out * 2 / bw / 1e3;
    printf("\nchain of 32 layers, µs a layer (the weights' floor %.1f; gaps %.1f + %.1f + %.1f + %.1f)\n", floor_us,
           s_g[0].gap_us, s_g[1].gap_us, s_g[2].gap_us, s_g[3].gap_us);
    for (int T : {1, 2, 4, 8}) {
        printf("T=%d:", T);
        for (int v = 0; v < N_V; v++)
            printf("  %s %.1f alone, %.1f with gaps", s_names[v], s_chain(v, w, y, x, T, false, st),
                   s_chain(v, w, y, x, T, true, st));
        printf("\n");
    }
    printf("the prefetch, bytes a GEMM asks of L2 (gemv_r1, T=1, with gaps):");
    for (long mb : {2, 4, 8, 16, 32}) {
        s_pf_total = mb << 20;
        printf("  %ld MB %.1f", mb, s_chain(V_R1, w, y, x, 1, true, st));
    }
    printf("\n");
    return dev_end();
}
