/*  kernels/cuda/dev/dev_fp8.cu — the FP8 (W8A8) projection at decode: y = (xq · wᵀ) ·
    x_scale[t] · w_scale[o], E4M3 codes in, fp32 out. Every version validated against the CPU
    reference (ls_matmul_fp8_forward), then timed (dev_common.cuh's method) on Llama-3-8B's
    four projections at T = 1 .. 64 tokens.

    Bytes counted: the weights, in x out (x and y are < 1% of them up to T = 64). Each shape
    rotates over enough weight sets to exceed L2 (>= 256 MB), so the weights come from
    memory as in a decode step.

    Versions:
      lt      engine/fp8_gemm.cu on cuBLASLt alone (ls_fp8_gemm_allow(outer 1, small 0,
              tc 0)): the FP8 GEMM, then ls_cu_fp8_scale where it applies no scales itself
              (production past LS_FP8_TC_T tokens);
      small   ls_cu_fp8_gemm_small, a warp per 4 rows on CUDA cores, scales and bias in its
              epilogue (production up to LS_FP8_SMALL_T where tc does not run: sm_80);
      r2, r8  the same kernel with 2 and 8 rows a warp (8: at most 4 tokens a pass);
      tc      ls_cu_fp8_gemm_tc: mma.sync m16n8k32 E4M3 tensor cores, 16 rows a block, K
              split over its 8 warps, up to 64 tokens a pass (in % 64 == 0; production up to
              LS_FP8_TC_T on sm_89+).

    Then a layer's four projections summed per T, lt against small and tc, and the largest T
    up to which each wins over lt at every T: the values LS_FP8_SMALL_T and LS_FP8_TC_T
    (engine/fp8_gemm.h) should take.

    Usage: dev_fp8. Exit 1 if a version fails its check.
*/
#include "../fp8.cu"

#include "dev_common.cuh"

#include "fp8_gemm.h"

extern "C" {
#include "ops.h"
#include "safetensors.h" // ls_e4m3_to_f32
}

enum { TMAX = 64, N_T = 7, N_V = 5, N_SHAPES = 4 };
static const int s_ts[N_T] = {1, 2, 4, 8, 16, 32, 64};
static const char *s_names[N_V] = {"lt", "small", "r2", "r8", "tc"};
static const struct {
    const char *name;
    int in, out;
} s_shapes[N_SHAPES] = {{"qkv", 4096, 6144}, {"o", 4096, 4096}, {"gate_up", 4096, 28672}, {"down", 14336, 4096}};

// One problem: the weights' sets (codes and row scales), x's codes and scales (TMAX rows), y
struct s_prob_t {
    int in, out, sets;
    uint8_t *w, *xq; // sets x (out, in); (TMAX, in)
    float *ws, *xs, *y;
    std::vector<float> want; // (TMAX, out): the CPU reference on set 0
};

// The kernel with R rows a warp, as many tokens a pass as fit (at most 8, R · NT <= 32)
template <int R>
static cudaError_t s_rows(float *y, const uint8_t *xq, const float *xs, const uint8_t *w, const float *ws, int T,
                          int in, int out, cudaStream_t st) {
    constexpr int NT = 32 / R < S_SMALL_NT ? 32 / R : S_SMALL_NT;
    int rows = S_SMALL_WARPS * R;
    dim3 grid((unsigned)((out + rows - 1) / rows), (unsigned)((T + NT - 1) / NT));
    k_fp8_gemm_small<NT, R, float>
        <<<grid, S_SMALL_WARPS * 32, 0, st>>>(y, xq, xs, w, ws, (const float *)NULL, T, in, out);
    return cudaGetLastError();
}

static ls_fp8_gemm_t *s_lt;
static void *s_ws;
enum { S_WS = 32 << 20 };

static cudaError_t s_run(const s_prob_t &p, int v, int T, long i, cudaStream_t st) {
    int set = (int)(i % p.sets);
    const uint8_t *w = p.w + (size_t)set * p.out * p.in;
    const float *ws = p.ws + (size_t)set * p.out;
    switch (v) {
    case 0:
        return ls_fp8_gemm_run(s_lt, p.y, p.xq, p.xs, w, ws, NULL, -1, T, p.in, p.out, 0, s_ws, S_WS, st) == 0
                   ? cudaSuccess
                   : cudaErrorUnknown;
    case 1: return ls_cu_fp8_gemm_small(p.y, p.xq, p.xs, w, ws, NULL, LS_CU_F32, T, p.in, p.out, st);
    case 2: return s_rows<2>(p.y, p.xq, p.xs, w, ws, T, p.in, p.out, st);
    case 3: return s_rows<8>(p.y, p.xq, p.xs, w, ws, T, p.in, p.out, st);
    default: return ls_cu_fp8_gemm_tc(p.y, p.xq, p.xs, w, ws, NULL, LS_CU_F32, T, p.in, p.out, st);
    }
}

// E4M3 codes of uniform values in [-a, a), rows x cols, quantized per row as production does
static void s_codes(dev_rng_t &r, int rows, int cols, float a, std::vector<uint8_t> &q, std::vector<float> &s) {
    std::vector<float> v((size_t)rows * cols);
    for (auto &e : v)
        e = r.uniform(-a, a);
    q.resize(v.size());
    s.resize(rows);
    ls_fp8_quantize_rows(q.data(), s.data(), v.data(), rows, cols);
}

static s_prob_t s_prob_new(dev_rng_t &r, int in, int out, size_t min_bytes) {
    s_prob_t p;
    p.in = in, p.out = out;
    size_t wb = (size_t)in * out;
    p.sets = (int)std::max<size_t>(1, (min_bytes + wb - 1) / wb);
    DEV_CK(cudaMalloc(&p.w, wb * p.sets));
    DEV_CK(cudaMalloc(&p.ws, (size_t)out * p.sets * 4));
    DEV_CK(cudaMalloc(&p.xq, (size_t)TMAX * in));
    DEV_CK(cudaMalloc(&p.xs, TMAX * 4));
    DEV_CK(cudaMalloc(&p.y, (size_t)TMAX * out * 4));
    std::vector<uint8_t> q, xq;
    std::vector<float> s, xs;
    std::vector<float> w0, x0;
    s_codes(r, TMAX, in, 1.0f, xq, xs);
    DEV_CK(cudaMemcpy(p.xq, xq.data(), xq.size(), cudaMemcpyHostToDevice));
    DEV_CK(cudaMemcpy(p.xs, xs.data(), TMAX * 4, cudaMemcpyHostToDevice));
    s_codes(r, out, in, 0.1f, q, s);
    DEV_CK(cudaMemcpy(p.w, q.data(), wb, cudaMemcpyHostToDevice));
    DEV_CK(cudaMemcpy(p.ws, s.data(), (size_t)out * 4, cudaMemcpyHostToDevice));
    // the other sets are set 0's bytes at other addresses: enough for L2, and no host
    // quantization of another 256 MB
    for (int k = 1; k < p.sets; k++) {
        DEV_CK(cudaMemcpy(p.w + k * wb, p.w, wb, cudaMemcpyDeviceToDevice));
        DEV_CK(cudaMemcpy(p.ws + (size_t)k * out, p.ws, (size_t)out * 4, cudaMemcpyDeviceToDevice));
    }
    // the reference: set 0 against all TMAX rows (the first T rows at each T)
    w0.resize(wb), x0.resize(xq.size());
    for (size_t e = 0; e < wb; e++)
        w0[e] = ls_e4m3_to_f32(q[e]);
    for (size_t e = 0; e < xq.size(); e++)
        x0[e] = ls_e4m3_to_f32(xq[e]);
    p.want.resize((size_t)TMAX * out);
    ls_matmul_fp8_forward(p.want.data(), x0.data(), xs.data(), NULL, w0.data(), s.data(), NULL, TMAX, in, out);
    return p;
}

static void s_prob_free(s_prob_t &p) {
    cudaFree(p.w), cudaFree(p.ws), cudaFree(p.xq), cudaFree(p.xs), cudaFree(p.y);
}

// The versions from v0 on, on set 0 at T tokens, against the reference's first T rows
static void s_validate(const s_prob_t &p, const char *name, int T, int v0, cudaStream_t st) {
    std::vector<float> got((size_t)T * p.out);
    for (int v = v0; v < N_V; v++) {
        DEV_CK(cudaMemset(p.y, 0xff, (size_t)TMAX * p.out * 4)); // NaN: a row not written fails
        DEV_CK(s_run(p, v, T, 0, st));
        DEV_CK(cudaMemcpy(got.data(), p.y, got.size() * 4, cudaMemcpyDeviceToHost));
        char what[64];
        snprintf(what, sizeof what, "%s T=%d", name, T);
        // lt: Hopper's FP8 tensor cores sum with ~14 bits (test_gpu_ops matmul_fp8); the
        // CUDA-core versions sum the same exact products in fp32, in another order; tc sums
        // 64 products on the tensor cores, the rest in fp32 (its NMSE tells how many bits
        // the tensor cores keep)
        dev_check(what, s_names[v], dev_nmse(got.data(), p.want.data(), got.size()),
                  v == 0 || v == 4 ? 1e-6 : 1e-10);
    }
}

int main() {
    cudaStream_t st;
    double bw = dev_begin("dev_fp8", "E4M3 x E4M3 -> fp32, per-token and per-row scales", &st);
    char err[256];
    if (!(s_lt = ls_fp8_gemm_new(err, sizeof err))) {
        fprintf(stderr, "dev_fp8: %s\n", err);
        return 2;
    }
    ls_fp8_gemm_allow(s_lt, 1, 0, 0);
    DEV_CK(cudaMalloc(&s_ws, S_WS));
    dev_rng_t rng = {7};

    // the tails first: rows past out (out % 16 != 0, and a warp's last rows), token passes
    // with lanes past T; not lt, whose y rows cuBLASLt wants 16-byte aligned
    {
        s_prob_t p = s_prob_new(rng, 192, 37, 0);
        for (int T : {1, 3, 5, 7, 9, 13, 37, 64})
            s_validate(p, "192x37", T, 1, st);
        s_prob_free(p);
    }

    double layer[N_T][N_V] = {};
    for (int k = 0; k < N_SHAPES; k++) {
        int in = s_shapes[k].in, out = s_shapes[k].out;
        s_prob_t p = s_prob_new(rng, in, out, (size_t)256 << 20);
        double bytes = (double)in * out;
        printf("\n%s (in %d, out %d): %.1f MB of weights, %d sets\n", s_shapes[k].name, in, out, bytes / 1e6, p.sets);
        for (int T : s_ts)
            s_validate(p, s_shapes[k].name, T, 0, st);
        printf("%-4s", "T");
        for (int v = 0; v < N_V; v++)
            printf(" | %7s %6s %6s", s_names[v], "GB/s", "%copy");
        printf(" | lt/small\n");
        for (int j = 0; j < N_T; j++) {
            int T = s_ts[j];
            double us[N_V];
            for (int v = 0; v < N_V; v++) {
                us[v] = dev_time_us(st, 50, [&](long i) { return s_run(p, v, T, i, st); });
                layer[j][v] += us[v];
            }
            printf("%-4d", T);
            for (int v = 0; v < N_V; v++)
                printf(" | %7.1f %6.0f %5.1f%%", us[v], bytes / us[v] / 1e3, 100.0 * bytes / us[v] / 1e3 / bw);
            printf(" | %6.2f\n", us[0] / us[1]);
        }
        s_prob_free(p);
    }

    // a layer's four projections: where small and tc stop winning over lt
    printf("\nA layer's four projections (us):\n%-4s", "T");
    for (int v = 0; v < N_V; v++)
        printf(" %8s", s_names[v]);
    printf("  lt/small  lt/tc\n");
    int upto[N_V] = {};
    bool wins[N_V];
    for (int v = 0; v < N_V; v++)
        wins[v] = true;
    for (int j = 0; j < N_T; j++) {
        printf("%-4d", s_ts[j]);
        for (int v = 0; v < N_V; v++)
            printf(" %8.1f", layer[j][v]);
        printf("  %8.2f %6.2f\n", layer[j][0] / layer[j][1], layer[j][0] / layer[j][4]);
        for (int v = 1; v < N_V; v++) {
            wins[v] = wins[v] && layer[j][v] < layer[j][0];
            if (wins[v])
                upto[v] = s_ts[j];
        }
    }
    printf("small wins at every T up to %d (LS_FP8_SMALL_T is %d), tc up to %d (LS_FP8_TC_T is %d); between "
           "measured Ts, a crossover lies between that T and the next\n",
           upto[1], LS_FP8_SMALL_T, upto[4], LS_FP8_TC_T);
    ls_fp8_gemm_destroy(&s_lt);
    cudaFree(s_ws);
    return dev_end();
}
