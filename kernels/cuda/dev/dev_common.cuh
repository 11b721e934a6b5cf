/*  kernels/cuda/dev/dev_common.cuh — what every file of the dev bench shares: error checks,
    a seeded generator, the card's copy bandwidth, timing and the comparison with the CPU
    reference.

    A dev file includes one production kernel file (../lora.cu, ../attention.cu) into its own
    translation unit, so it launches the production kernels and launchers directly, beside the
    versions kept here only; it links the CPU references (kernels/cpu) and not the CUDA
    kernels' library, whose symbols the included file defines once more.

    Method (all files): validate every version against the CPU reference first (a version
    that fails prints FAIL and the program exits 1 at the end), then time it. Pools rotate
    over enough sets to exceed L2, so weights come from memory as they do in a decode step;
    a timing is the median of 7 runs of `iters` back-to-back launches, in µs per launch;
    GB/s counts the least bytes any version must move; %copy is that against a
    device-to-device copy measured in the same run (bytes read + written).
*/
#ifndef LS_DEV_COMMON_CUH
#define LS_DEV_COMMON_CUH

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define DEV_CK(x)                                                                                  \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

// splitmix64: the same values on every run and machine
struct dev_rng_t {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    float uniform(float lo, float hi) { return lo + (hi - lo) * (float)(next() >> 40) / 16777216.0f; }
};

// n bf16 values in [-scale, scale) on the device, and their fp32 values on the host (the
// CPU reference computes on exactly what the kernels read)
static __nv_bfloat16 *dev_bf16_fill(dev_rng_t &r, size_t n, float scale, std::vector<float> &host) {
    std::vector<__nv_bfloat16> h(n);
    host.resize(n);
    for (size_t i = 0; i < n; i++) {
        h[i] = __float2bfloat16(r.uniform(-scale, scale));
        host[i] = __bfloat162float(h[i]);
    }
    __nv_bfloat16 *d;
    DEV_CK(cudaMalloc(&d, n * sizeof *d));
    DEV_CK(cudaMemcpy(d, h.data(), n * sizeof *d, cudaMemcpyHostToDevice));
    return d;
}

static float *dev_f32_fill(dev_rng_t &r, size_t n, float scale, std::vector<float> &host) {
    host.resize(n);
    for (size_t i = 0; i < n; i++)
        host[i] = r.uniform(-scale, scale);
    float *d;
    DEV_CK(cudaMalloc(&d, n * sizeof *d));
    DEV_CK(cudaMemcpy(d, host.data(), n * sizeof *d, cudaMemcpyHostToDevice));
    return d;
}

// Device-to-device copy bandwidth, GB/s of bytes read + written (2 GiB buffers' halves)
static double dev_copy_bandwidth(cudaStream_t st) {
    size_t n = (size_t)1 << 30;
    void *a, *b;
    DEV_CK(cudaMalloc(&a, n));
    DEV_CK(cudaMalloc(&b, n));
    DEV_CK(cudaMemsetAsync(a, 1, n, st));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    DEV_CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st));
    cudaEventRecord(e0, st);
    for (int i = 0; i < 5; i++)
        DEV_CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st));
    cudaEventRecord(e1, st);
    DEV_CK(cudaEventSynchronize(e1));
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(a), cudaFree(b);
    return 2.0 * n * 5 / (ms * 1e-3) / 1e9;
}

// Kernel K's dynamic shared memory limit raised to smem (past the 48 KB a launch gets by
// default), once per kernel; on failure the error, cleared from the runtime's last error
template <auto K> static cudaError_t dev_smem_attr(size_t smem) {
    static bool set;
    cudaError_t e = set ? cudaSuccess : cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        (void)cudaGetLastError();
    set = e == cudaSuccess;
    return e;
}

// µs per launch: median of 7 runs of `iters` calls of launch(i) (i counts up from 0 across
// the warm-up and all runs, to rotate over the caller's sets)
template <typename F> static double dev_time_us(cudaStream_t st, int iters, F launch) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    long i = 0;
    for (int w = 0; w < 3; w++)
        DEV_CK(launch(i++));
    std::vector<double> runs;
    for (int k = 0; k < 7; k++) {
        cudaEventRecord(e0, st);
        for (int it = 0; it < iters; it++)
            DEV_CK(launch(i++));
        cudaEventRecord(e1, st);
        DEV_CK(cudaEventSynchronize(e1));
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        runs.push_back(ms * 1e3 / iters);
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    std::sort(runs.begin(), runs.end());
    return runs[3];
}

// µs a replay of a CUDA graph of what issue() enqueues on st (dev_time_us's median of one
// replay a run, after a warm-up replay); -1 when issue, the capture, the instantiation or the
// warm-up fails (a launch configuration the device refuses), the error cleared.
template <typename F> static double dev_graph_us(cudaStream_t st, F issue) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    DEV_CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    cudaError_t e = issue();
    cudaError_t e2 = cudaStreamEndCapture(st, &g);
    double us = -1;
    if (e == cudaSuccess && e2 == cudaSuccess && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess) {
        if (cudaGraphLaunch(ge, st) == cudaSuccess && cudaStreamSynchronize(st) == cudaSuccess)
            us = dev_time_us(st, 1, [&](long) { return cudaGraphLaunch(ge, st); });
        cudaGraphExecDestroy(ge);
    }
    cudaGetLastError();
    if (g)
        cudaGraphDestroy(g);
    return us;
}

// Normalized mean squared error of got against want over n values
static double dev_nmse(const float *got, const float *want, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        num += d * d, den += (double)want[i] * want[i];
    }
    return den > 0 ? num / den : num;
}

// A program's start: its stream, the card's name and copy bandwidth printed with `what`
static double dev_begin(const char *prog, const char *what, cudaStream_t *st) {
    DEV_CK(cudaStreamCreate(st));
    double bw = dev_copy_bandwidth(*st);
    cudaDeviceProp prop;
    DEV_CK(cudaGetDeviceProperties(&prop, 0));
    printf("%s on %s: copy bandwidth %.0f GB/s; %s\n", prog, prop.name, bw, what);
    return bw;
}

static int dev_failures = 0;

// A program's end: exit status 1 when a version failed its check
static int dev_end(void) {
    printf("%s\n", dev_failures ? "FAILED" : "all versions match the CPU reference");
    return dev_failures ? 1 : 0;
}

// One validation line; a version whose NMSE exceeds tol (or is not a number) fails
static void dev_check(const char *what, const char *version, double nmse, double tol) {
    bool ok = nmse <= tol;
    dev_failures += !ok;
    printf("  %-28s %-10s nmse %9.2e (tol %.0e) %s\n", what, version, nmse, tol, ok ? "ok" : "FAIL");
}

#endif
