/*  kernels/cuda/dev/dev_gemm.cu — the decode step's bf16 GEMMs: does cuBLAS's default pick
    leave time on the table?

    engine/backend_cuda.cu runs every bf16 projection as cublasGemmEx(CUBLAS_GEMM_DEFAULT),
    fp32 out. At batch 1 on an H100 the o projection takes 13.6 µs + a 1.7-µs split-K
    reduction for 33.5 MB (~73% of copy bandwidth) and qkv 21.5 µs for 50.3 MB (~78%), where
    gate_up and down reach ~94% (kernels/cuda/dev/README.md, "L2 prefetch"). This program
    times, for Llama-3-8B's four projections at T tokens, the default against every algorithm
    cuBLASLt's heuristic offers for the same problem (up to 32, with the same 32 MiB
    workspace), each over enough weight copies to exceed L2, and checks each algorithm's
    output against the default's (fp32 sums in another order: relative max|Δ| ≤ 1e-3 of the
    largest |y|, else FAIL).

    Printed per (projection, T): the default's µs and % of copy bandwidth, the best
    algorithm's µs, its index in the heuristic's list and whether it splits K, the
    heuristic's first algorithm and its first without split-K, and the sum over a layer's
    four projections.

    Usage: dev_gemm [--t T ...]   (default: 1 8 32 64 128). Exit 1 if an algorithm fails.

    dev_gemm --out [--t T ...]   (default: 512 2048 8192): the default GEMM of each projection
    at prompt sizes with fp32 output (production) against bf16 output, µs and TFLOP/s, and the
    layer's four summed: what writing 16-bit GEMM outputs would buy a prompt's step.
*/
#include <cublasLt.h>
#include <cstring>

#include "dev_blas.cuh"
#include "dev_common.cuh"

enum { N_G = 4, MAX_ALGOS = 32, WS = 32 << 20 };
static const struct {
    const char *name;
    int in, out;
} s_g[N_G] = {{"qkv", 4096, 6144}, {"o", 4096, 4096}, {"gate_up", 4096, 28672}, {"down", 14336, 4096}};

// --out: fp32 against bf16 output of the default GEMM at each T (weights over L2, one set: at
// prompt sizes the GEMMs are bound by the tensor cores, not by reading W)
static int s_outs(cublasHandle_t h, cudaStream_t st, const std::vector<int> &ts) {
    dev_rng_t r{13};
    std::vector<float> hx, hw;
    int t_max = *std::max_element(ts.begin(), ts.end());
    __nv_bfloat16 *x = dev_bf16_fill(r, (size_t)t_max * 14336, 1.0f, hx);
    __nv_bfloat16 *w = dev_bf16_fill(r, (size_t)4096 * 28672, 0.05f, hw);
    void *y;
    DEV_CK(cudaMalloc(&y, (size_t)t_max * 28672 * 4));
    printf("%-8s %5s %10s %8s %10s %8s %6s\n", "GEMM", "T", "fp32 out", "TFLOP/s", "bf16 out", "TFLOP/s",
           "ratio");
    for (int T : ts) {
        double sum[2] = {0, 0};
        for (int g = 0; g < N_G; g++) {
            int in = s_g[g].in, out = s_g[g].out;
            double us[2];
            for (int o = 0; o < 2; o++) {
                float one = 1.0f, zero = 0.0f;
                us[o] = dev_time_us(st, 20, [&](long) {
                    return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, &one, w, CUDA_R_16BF, in, x,
                                        CUDA_R_16BF, in, &zero, y, o ? CUDA_R_16BF : CUDA_R_32F, out,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS
                               ? cudaSuccess
                               : cudaErrorUnknown;
                });
                sum[o] += us[o];
            }
            double tf = 2.0 * T * in * out / 1e6;
            printf("%-8s %5d %10.1f %8.0f %10.1f %8.0f %6.3f\n", s_g[g].name, T, us[0], tf / us[0], us[1],
                   tf / us[1], us[1] / us[0]);
        }
        printf("T=%d: a layer's four %.1f -> %.1f us (32 layers: %.2f -> %.2f ms)\n", T, sum[0], sum[1],
               sum[0] * 32e-3, sum[1] * 32e-3);
    }
    cudaFree(x), cudaFree(w), cudaFree(y);
    return 0;
}

int main(int argc, char **argv) {
    std::vector<int> ts;
    bool outs = false;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--t") && i + 1 < argc)
            ts.push_back(atoi(argv[++i]));
        else if (!strcmp(argv[i], "--out"))
            outs = true;
    if (ts.empty())
        ts = outs ? std::vector<int>{512, 2048, 8192} : std::vector<int>{1, 8, 32, 64, 128};
    cudaStream_t st;
    double bw = dev_begin("dev_gemm", "Llama-3-8B's projections, bf16 weights, fp32 out", &st);
    cublasHandle_t h;
    cublasLtHandle_t lt;
    BL_CK(cublasCreate(&h));
    BL_CK(cublasSetStream(h, st));
    BL_CK(cublasLtCreate(&lt));
    void *ws;
    DEV_CK(cudaMalloc(&ws, WS));
    BL_CK(cublasSetWorkspace(h, ws, WS));
    if (outs)
        return s_outs(h, st, ts);
    dev_rng_t r{11};
    std::vector<float> hx;
    int t_max = *std::max_element(ts.begin(), ts.end());
    __nv_bfloat16 *x = dev_bf16_fill(r, (size_t)t_max * 14336, 1.0f, hx);
    float *y, *y0;
    DEV_CK(cudaMalloc(&y, (size_t)t_max * 28672 * 4));
    DEV_CK(cudaMalloc(&y0, (size_t)t_max * 28672 * 4));
    int fail = 0;
    std::vector<double> sum_def(ts.size()), sum_best(ts.size());
    printf("%-8s %4s %9s %6s %9s %6s %5s %6s  %s\n", "GEMM", "T", "default", "%copy", "best", "%copy",
           "index", "algos", "best's tile / split-K");
    for (int g = 0; g < N_G; g++) {
        size_t n = (size_t)s_g[g].in * s_g[g].out;
        int sets = (int)(512e6 / (n * 2.0)) + 2; // > L2 several times over
        std::vector<__nv_bfloat16 *> w(sets);
        std::vector<float> hw;
        for (int k = 0; k < sets; k++)
            w[k] = dev_bf16_fill(r, n, 0.05f, hw);
        for (size_t ti = 0; ti < ts.size(); ti++) {
            int T = ts[ti], in = s_g[g].in, out = s_g[g].out;
            float one = 1.0f, zero = 0.0f;
            double t_def = dev_time_us(st, 50, [&](long i) {
                return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, &one, w[i % sets], CUDA_R_16BF, in,
                                    x, CUDA_R_16BF, in, &zero, y0, CUDA_R_32F, out, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS
                           ? cudaSuccess
                           : cudaErrorUnknown;
            });
            // the reference: the default on w[0]
            std::vector<float> ref((size_t)T * out), got(ref.size());
            BL_CK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, &one, w[0], CUDA_R_16BF, in, x,
                               CUDA_R_16BF, in, &zero, y0, CUDA_R_32F, out, CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
            DEV_CK(cudaMemcpy(ref.data(), y0, ref.size() * 4, cudaMemcpyDeviceToHost));
            double mag = 0;
            for (float v : ref)
                mag = std::max(mag, (double)fabsf(v));
            // the same problem to cuBLASLt: D (out, T) = Wᵀ (out, in) · X (in, T)
            cublasLtMatmulDesc_t desc;
            cublasLtMatrixLayout_t la, lb, ld;
            cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
            BL_CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
            BL_CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
            BL_CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
            BL_CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, in, out, in));
            BL_CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, in, T, in));
            BL_CK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, out, T, out));
            cublasLtMatmulPreference_t pref;
            BL_CK(cublasLtMatmulPreferenceCreate(&pref));
            uint64_t wsb = WS;
            BL_CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                                       sizeof wsb));
            cublasLtMatmulHeuristicResult_t res[MAX_ALGOS];
            int n_res = 0;
            BL_CK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, MAX_ALGOS, res, &n_res));
            double best = 1e30, first_nosplit = -1, t0 = -1;
            int best_i = -1, nosplit_i = -1;
            for (int k = 0; k < n_res; k++) {
                if (res[k].state != CUBLAS_STATUS_SUCCESS)
                    continue;
                auto run = [&](long i) {
                    return cublasLtMatmul(lt, desc, &one, w[i % sets], la, x, lb, &zero, y, ld, y, ld,
                                          &res[k].algo, ws, WS, st) == CUBLAS_STATUS_SUCCESS
                               ? cudaSuccess
                               : cudaErrorUnknown;
                };
                DEV_CK(run(0));
                DEV_CK(cudaStreamSynchronize(st));
                DEV_CK(cudaMemcpy(got.data(), y, got.size() * 4, cudaMemcpyDeviceToHost));
                double d = 0;
                for (size_t i = 0; i < ref.size(); i++)
                    d = std::max(d, (double)fabsf(ref[i] - got[i]));
                if (d > 1e-3 * std::max(mag, 1e-30)) {
                    printf("FAIL %s T=%d algo %d: max|Δ| %.3e of %.3e\n", s_g[g].name, T, k, d, mag);
                    fail = 1;
                    continue;
                }
                double t = dev_time_us(st, 50, run);
                if (t < best)
                    best = t, best_i = k;
                int sk = 0;
                size_t szk;
                cublasLtMatmulAlgoConfigGetAttribute(&res[k].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof sk,
                                                     &szk);
                if (k == 0)
                    t0 = t;
                if (nosplit_i < 0 && sk <= 1)
                    nosplit_i = k, first_nosplit = t;
            }
            int split = 0, tile = 0;
            if (best_i >= 0) {
                size_t sz;
                cublasLtMatmulAlgoConfigGetAttribute(&res[best_i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split,
                                                     sizeof split, &sz);
                cublasLtMatmulAlgoConfigGetAttribute(&res[best_i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                                     sizeof tile, &sz);
            }
            double bytes = (double)n * 2;
            printf("%-8s %4d %9.1f %5.0f%% %9.1f %5.0f%% %5d %6d  tile %d, split-K %d; heuristic's #0 %.1f, "
                   "its first without split-K #%d %.1f\n", s_g[g].name, T, t_def,
                   100 * bytes / (t_def * 1e-6) / 1e9 / bw, best, 100 * bytes / (best * 1e-6) / 1e9 / bw, best_i,
                   n_res, tile, split, t0, nosplit_i, first_nosplit);
            sum_def[ti] += t_def;
            sum_best[ti] += best < 1e29 ? best : t_def;
            cublasLtMatmulPreferenceDestroy(pref);
            cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
            cublasLtMatmulDescDestroy(desc);
        }
        for (auto p : w)
            cudaFree(p);
    }
    printf("\na layer's four projections (µs): ");
    for (size_t ti = 0; ti < ts.size(); ti++)
        printf(" T=%d %.1f -> %.1f;", ts[ti], sum_def[ti], sum_best[ti]);
    printf("\n");
    return fail;
}
