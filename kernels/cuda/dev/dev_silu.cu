/*  kernels/cuda/dev/dev_silu.cu — SiLU·mul's cost in its math: production's IEEE-rounded
    steps against faster intrinsics, on gate_up's decode shapes (Llama-3-8B, inter 14,336).

    Under ncu (SM clock held near 1.45 GHz) SiLU·mul reads as issue-bound (H100, 256 tokens:
    14.2 µs, 66% of DRAM bandwidth, ~200 warp instructions a float4 of output, most of them
    expf and the IEEE division), and gate_up's LoRA made inside it (lora.cu, "SiLU·mul with
    gate_up's LoRA") pays for them too. This bench says how much faster the op runs on cheaper
    math at serving clocks and how far its values move from the CPU reference's, to decide
    whether ls_silu_mul's steps should change (README.md: they stay).

    Versions (production's k_silu_mul4 and launch with its math F swapped; out fp32 and lp
    bf16 of gate_up (T, 2·inter) fp32, + delta where timed so):
      prod     ls_cu_silu_mul, production: g / (1 + expf(-g)) · u, each step rounded to nearest
               (__fdiv_rn, expf's ≤ 2 ulp);
      fastdiv  expf, then __fdividef (g times the approximate reciprocal, ≤ 2 ulp);
      fast     __expf (ex2.approx of -g·log2 e) and __fdividef.
    Each is checked against the CPU reference (ls_silu_mul_forward) with the GPU tests'
    tolerance for this op (1e-5 absolute; test_gpu_ops "silu_mul"), and its largest error
    against a double-precision SiLU·mul is printed in units of the result's last place; then
    timed (dev_common.cuh's method) with lp alone, as the decode step writes it, without and
    with the delta.

    Usage: dev_silu. Exit 1 if a version fails its check.
*/
#include "../elementwise.cu"

#include "dev_common.cuh"

#include <cstring>

extern "C" {
#include "ops.h"
}

enum { INTER = 14336, SETS = 4 };

// the versions' math, as k_silu_mul4's F (production's kernel, its own math ls_silu_mul_f)
struct s_fastdiv_f {
    __device__ float operator()(float g, float u) const {
        return __fmul_rn(__fdividef(g, __fadd_rn(1.0f, expf(-g))), u);
    }
};
struct s_fast_f {
    __device__ float operator()(float g, float u) const {
        return __fmul_rn(__fdividef(g, __fadd_rn(1.0f, __expf(-g))), u);
    }
};

static cudaError_t s_run(int v, float *out, __nv_bfloat16 *lp, const float *gu, const float *delta, int T,
                         cudaStream_t st) {
    if (v == 0)
        return ls_cu_silu_mul(out, lp, LS_CU_BF16, NULL, gu, delta, T, INTER, st);
    unsigned blocks = ls_cu_blocks((size_t)T * INTER / 4, 256);
    return v == 1 ? ls_cu_launch_dep(k_silu_mul4<__nv_bfloat16, s_fastdiv_f>, dim3(blocks), dim3(256), 0, st, out,
                                     lp, gu, delta, T, INTER)
                  : ls_cu_launch_dep(k_silu_mul4<__nv_bfloat16, s_fast_f>, dim3(blocks), dim3(256), 0, st, out, lp,
                                     gu, delta, T, INTER);
}

// |a - b| in units of the last place of b's magnitude (fp32)
static double s_ulps(double a, double b) {
    double m = std::fabs(b) < 1e-30 ? 1e-30 : std::fabs(b);
    return std::fabs(a - b) / std::ldexp(1.0, std::ilogb(m) - 23);
}

int main(void) {
    static const char *names[] = {"prod", "fastdiv", "fast"};
    enum { NV = 3 };
    cudaStream_t st;
    char what[64];
    snprintf(what, sizeof what, "SiLU·mul of gate_up (T, 2 x %d) fp32", (int)INTER);
    double bw = dev_begin("dev_silu", what, &st);
    dev_rng_t r = {42};

    // the check: values in [-8, 8) for g (SiLU's curved part and both tails) and u
    {
        int T = 64;
        size_t n = (size_t)T * INTER, ng = 2 * n;
        std::vector<float> hg;
        float *gu = dev_f32_fill(r, ng, 8.0f, hg), *out;
        DEV_CK(cudaMalloc(&out, n * sizeof(float)));
        std::vector<float> ref(n), got(n);
        ls_silu_mul_forward(ref.data(), hg.data(), NULL, T, INTER);
        for (int v = 0; v < NV; v++) {
            DEV_CK(cudaMemset(out, 0xff, n * sizeof(float)));
            DEV_CK(s_run(v, out, NULL, gu, NULL, T, st));
            DEV_CK(cudaStreamSynchronize(st));
            DEV_CK(cudaMemcpy(got.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost));
            double max_abs = 0, max_ulp = 0;
            size_t differ = 0;
            for (size_t i = 0; i < n; i++) {
                size_t t = i / INTER, c = i % INTER;
                double g = hg[t * 2 * INTER + c], u = hg[t * 2 * INTER + INTER + c];
                double exact = g / (1.0 + std::exp(-g)) * u;
                max_abs = std::max(max_abs, (double)std::fabs(got[i] - ref[i]));
                max_ulp = std::max(max_ulp, s_ulps(got[i], exact));
                differ += std::memcmp(&got[i], &ref[i], sizeof(float)) != 0;
            }
            bool ok = max_abs <= 1e-5 && std::isfinite(max_abs);
            dev_failures += !ok;
            printf("%-8s against the CPU: max |diff| %.3g (tolerance 1e-5), %zu of %zu values differ; against "
                   "double: max %.2f ulp  %s\n",
                   names[v], max_abs, differ, n, max_ulp, ok ? "PASS" : "FAIL");
        }
        cudaFree(gu), cudaFree(out);
    }

    // the timing: SETS sets of gate_up and delta (past L2), lp bf16 as the decode step writes it;
    // a first timing thrown away (the clocks ramp up from idle: the table's first point read
    // 8.15 us, 3.86 on a rerun in the same call, without it)
    bool warm = false;
    printf("\n%-8s %5s %7s %12s %12s\n", "version", "T", "delta", "us", "GB/s");
    for (int T : {64, 128, 256}) {
        size_t n = (size_t)T * INTER, ng = 2 * n;
        std::vector<float> h;
        float *gu[SETS], *dl[SETS];
        __nv_bfloat16 *lp[SETS];
        for (int s = 0; s < SETS; s++) {
            gu[s] = dev_f32_fill(r, ng, 4.0f, h);
            dl[s] = dev_f32_fill(r, ng, 0.1f, h);
            DEV_CK(cudaMalloc(&lp[s], n * sizeof(__nv_bfloat16)));
        }
        if (!warm) {
            dev_time_us(st, 20, [&](long i) { return s_run(0, NULL, lp[i % SETS], gu[i % SETS], NULL, T, st); });
            warm = true;
        }
        for (int with_delta = 0; with_delta < 2; with_delta++)
            for (int v = 0; v < NV; v++) {
                double us = dev_time_us(st, 20, [&](long i) {
                    int s = (int)(i % SETS);
                    return s_run(v, NULL, lp[s], gu[s], with_delta ? dl[s] : NULL, T, st);
                });
                double bytes = (double)ng * 4 * (1 + with_delta) + (double)n * 2;
                printf("%-8s %5d %7s %12.2f %12.0f\n", names[v], T, with_delta ? "yes" : "no", us,
                       bytes / (us * 1e-6) / 1e9);
            }
        for (int s = 0; s < SETS; s++)
            cudaFree(gu[s]), cudaFree(dl[s]), cudaFree(lp[s]);
    }
    cudaStreamDestroy(st);
    return dev_end();
}
