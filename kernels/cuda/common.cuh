/*  kernels/cuda/common.cuh — shared device helpers of the CUDA kernels: storage dtype
    conversions, vector loads, warp and block reductions, the dtype dispatch.

    Arithmetic that the CPU references do in fp32 without fusing is written with the _rn
    intrinsics where nvcc would otherwise contract a*b+c into an fma (the x86 reference is
    built without FMA), so that the elementwise ops agree bit for bit where the math
    functions (expf, sincosf, logf) do.
*/
#ifndef LS_CUDA_COMMON_CUH
#define LS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ops_cuda.h"

__device__ __forceinline__ float ls_to_f(float v) { return v; }
__device__ __forceinline__ float ls_to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ls_to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float ls_to_f(__nv_fp8_e4m3 v) { return float(v); }

template <typename T> __device__ __forceinline__ T ls_from_f(float v);
template <> __device__ __forceinline__ float ls_from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 ls_from_f<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half ls_from_f<__half>(float v) {
    return __float2half_rn(v);
}

// 8 consecutive elements widened to fp32. p must be 16-byte aligned.
__device__ __forceinline__ void ls_load8(const float *p, float o[8]) {
    float4 a = __ldg(reinterpret_cast<const float4 *>(p));
    float4 b = __ldg(reinterpret_cast<const float4 *>(p) + 1);
    o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w;
    o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
}
__device__ __forceinline__ void ls_load8(const __nv_bfloat16 *p, float o[8]) {
    uint4 u = __ldg(reinterpret_cast<const uint4 *>(p));
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __bfloat1622float2(h[i]);
        o[2 * i] = f.x, o[2 * i + 1] = f.y;
    }
}
__device__ __forceinline__ void ls_load8(const __half *p, float o[8]) {
    uint4 u = __ldg(reinterpret_cast<const uint4 *>(p));
    const __half2 *h = reinterpret_cast<const __half2 *>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __half22float2(h[i]);
        o[2 * i] = f.x, o[2 * i + 1] = f.y;
    }
}

// bias[o] of a bias in bias_dt (F32, BF16 or F16)
__device__ __forceinline__ float ls_bias_at(const void *bias, ls_cu_dtype_t bias_dt, int o) {
    return bias_dt == LS_CU_F32    ? ((const float *)bias)[o]
           : bias_dt == LS_CU_BF16 ? ls_to_f(((const __nv_bfloat16 *)bias)[o])
                                   : ls_to_f(((const __half *)bias)[o]);
}

// Programmatic dependent launch (sm_90): a kernel launched with the attribute may start
// while the one before it drains; ls_dep_wait() waits for that kernel to complete with its
// memory visible, ls_dep_launch() lets the next one start early. Without the launch
// attribute (or before sm_90) both are no-ops.
__device__ __forceinline__ void ls_dep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void ls_dep_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks L2 for the first pf bytes (a multiple of 128) of each of the n rows of w (in elements
// of TW a row) from o0 (rows past out: the last), thread tid of nt taking a 128-byte line at a
// time: what a GEMM of a few tokens does before its ls_dep_wait, so that HBM streams its
// weights while the kernel before it runs (the weights are written by no kernel of a step)
template <typename TW>
__device__ __forceinline__ void ls_prefetch_rows(const TW *w, int in, int out, int o0, int n,
                                                 int pf, int tid, int nt) {
    for (int i = tid; i < n * (pf >> 7); i += nt) {
        int o = min(o0 + i % n, out - 1);
        const char *a = reinterpret_cast<const char *>(w + (size_t)o * in) + (size_t)(i / n) * 128;
        asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(a));
    }
}

// The bytes of each row a GEMM asks of L2 before its wait (ls_prefetch_rows' pf): pf_all
// over its out rows, at most a whole row of in elements of elem bytes, in 128-byte lines
static inline long ls_prefetch_row_bytes(long pf_all, int in, size_t elem, int out) {
    long row = (long)in * (long)elem;
    return (row < pf_all / out ? row : pf_all / out) / 128 * 128;
}

// Entry i (a row or chunk, piece included: i * np + q) of slot w's LoRA page table
// (ls_lora_pages_t), through the read-only path
template <typename T>
__device__ __forceinline__ const T *ls_lora_entry(const ls_lora_pages_t &p, int w, size_t i) {
    return reinterpret_cast<const T *>(
        __ldg(reinterpret_cast<const unsigned long long *>(p.tab) + (size_t)w * p.stride + i));
}

// 16 bytes of a stream read once (decode GEMMs' weights): past L1, not kept there, where
// the tokens' activations stay
__device__ __forceinline__ uint4 ls_ld_stream(const uint4 *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// 16 bytes global -> shared, asynchronous; n = 0 fills the 16 bytes with zeros instead
__device__ __forceinline__ void ls_cp16(unsigned dst, const void *src, int n) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(n)
                 : "memory");
}
__device__ __forceinline__ void ls_cp16(void *dst, const void *src, int n) {
    ls_cp16((unsigned)__cvta_generic_to_shared(dst), src, n);
}
__device__ __forceinline__ void ls_cp_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// waits until at most N of this thread's committed groups are still in flight
template <int N> __device__ __forceinline__ void ls_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// A warp's cp.async ring over its nw steps (of keys, of weights), NST stages deep: the first
// NST page reads (block-table entries; or none: page_of returns 0) in flight at once, each
// step's copies issued NST - 1 steps before its use, step(i) once step i's group has landed.
// page_of(i) reads step i's page; issue(i, page) copies step i into stage i % NST and commits
// one group (empty past the last step), so that the wait count is fixed. Leaves the ring
// idle (the kernels reuse it after).
//
// In three parts, so that a kernel on programmatic dependent launch can start its ring before
// it waits for the kernel before it: ls_ring_open reads the first pages and issues the leading
// steps for which early(i) holds (what they copy no earlier kernel of the step writes: the
// block tables are step metadata, the keys before the step's own written by earlier steps);
// ls_ring_fill issues the rest of the first NST - 1 steps, after the wait; ls_ring_loop runs
// the steps.
template <int NST> struct ls_ring_t {
    int pg[NST]; // pages of the first NST steps
    int issued;  // steps ls_ring_open issued
};
template <int NST, typename P, typename I, typename E>
__device__ __forceinline__ void ls_ring_open(ls_ring_t<NST> &r, int nw, P page_of, I issue,
                                             E early) {
#pragma unroll
    for (int i = 0; i < NST; i++)
        r.pg[i] = i < nw ? page_of(i) : 0;
    r.issued = 0;
#pragma unroll
    for (int i = 0; i < NST - 1; i++)
        if (r.issued == i && (i >= nw || early(i))) // in order: stop at the first that waits
            issue(i, r.pg[i]), r.issued = i + 1;
}
template <int NST, typename I>
__device__ __forceinline__ void ls_ring_fill(ls_ring_t<NST> &r, I issue) {
#pragma unroll
    for (int i = 0; i < NST - 1; i++)
        if (i >= r.issued)
            issue(i, r.pg[i]);
}
template <int NST, typename P, typename I, typename S>
__device__ __forceinline__ void ls_ring_loop(ls_ring_t<NST> &r, int nw, P page_of, I issue,
                                             S step) {
    int pnext = r.pg[NST - 1];
    for (int i = 0; i < nw; i++) {
        issue(i + NST - 1, pnext);
        pnext = i + NST < nw ? page_of(i + NST) : 0;
        ls_cp_wait<NST - 1>();
        step(i);
    }
    ls_cp_wait<0>(); // only empty groups were left
    __syncwarp();
}
// the three at once, nothing before a wait
template <int NST, typename P, typename I, typename S>
__device__ __forceinline__ void ls_ring_run(int nw, P page_of, I issue, S step) {
    ls_ring_t<NST> r;
    ls_ring_open(r, nw, page_of, issue, [](int) { return false; });
    ls_ring_fill(r, issue);
    ls_ring_loop(r, nw, page_of, issue, step);
}

// c += a (16x16, rows) · b (16x8, columns) on the tensor cores (mma.sync, sm_80+): products
// of TW (bf16 or f16), fp32 sums. Fragments as the PTX ISA lays out m16n8k16: lane (g, q) =
// (lane / 4, lane % 4) holds a's rows g and g + 8 and b's column g at the k pairs 2q and
// 2q + 8, and c's rows g and g + 8 at the columns 2q, 2q + 1.
template <typename TW>
__device__ __forceinline__ void ls_mma16816(float c[4], const uint32_t a[4], uint32_t b0,
                                            uint32_t b1);
template <>
__device__ __forceinline__ void ls_mma16816<__nv_bfloat16>(float c[4], const uint32_t a[4],
                                                           uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void ls_mma16816<__half>(float c[4], const uint32_t a[4], uint32_t b0,
                                                    uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// two fp32 rounded to TW (nearest even), packed: lo in the low half
template <typename TW> __device__ __forceinline__ uint32_t ls_pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t ls_pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
template <> __device__ __forceinline__ uint32_t ls_pack2<__half>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// a + b lane by lane, each sum rounded to nearest (the CPU reference's unfused adds)
__device__ __forceinline__ float4 ls_add4(float4 a, float4 b) {
    return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z),
                       __fadd_rn(a.w, b.w));
}

// silu(g) · u, each step rounded as the CPU reference's: g / (1 + e^-g), then times u
__device__ __forceinline__ float ls_silu_mul(float g, float u) {
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

// ls_silu_mul as a type (F of ls_silu_mul_put4; kernels/cuda/dev/dev_silu.cu times others)
struct ls_silu_mul_f {
    __device__ float operator()(float g, float u) const { return ls_silu_mul(g, u); }
};

// out[i .. i+3] (float4; where out) and lp[i .. i+3] (where lp) = F of gate g and up u, lane
// by lane: SiLU·mul's four columns a thread (k_silu_mul4, k_lora_silu_mul)
template <typename TL, typename F = ls_silu_mul_f>
__device__ __forceinline__ void ls_silu_mul_put4(float *out, TL *lp, size_t i, float4 g, float4 u) {
    float o[4] = {F()(g.x, u.x), F()(g.y, u.y), F()(g.z, u.z), F()(g.w, u.w)};
    if (out)
        *(float4 *)(out + i) = make_float4(o[0], o[1], o[2], o[3]);
    if (lp)
#pragma unroll
        for (int e = 0; e < 4; e++)
            lp[i + e] = ls_from_f<TL>(o[e]);
}

template <typename T> __device__ __forceinline__ T ls_warp_sum(T v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// scratch holds 32 T. Contains __syncthreads: call from all threads.
template <typename T> __device__ T ls_block_sum(T v, T *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = ls_warp_sum(v);
    __syncthreads(); // scratch may still be read by a previous call
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : T(0);
    return ls_warp_sum(v);
}

// Max over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// scratch holds 32 floats. Contains __syncthreads: call from all threads.
__device__ __forceinline__ float ls_block_max(float v, float *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads(); // scratch may still be read by a previous call
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// FP8 rows (kernels/ops.h ls_fp8_quantize_rows): the scale of a row whose largest magnitude
// is amax, and a value's E4M3 code under scale s. The CPU reference's steps — IEEE
// divisions (__fdiv_rn), cvt.rn.satfinite (nearest even, saturating at ±448, NaN kept) —
// so codes and scales agree with it bit for bit. Every kernel that quantizes a row (the
// quantizing pass, and rmsnorm and silu_mul writing their output's codes) goes through
// these.
__device__ __forceinline__ float ls_fp8_row_scale(float amax) {
    return amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
}
__device__ __forceinline__ uint8_t ls_fp8_code(float v, float s) {
    return (uint8_t)__nv_cvt_float_to_fp8(__fdiv_rn(v, s), __NV_SATFINITE, __NV_E4M3);
}

// A row quantized by a block that holds it in registers (the register kernels: RMSNorm,
// SiLU·mul and the quantizing pass, one block a row): thread i's v[4k + e] is column
// (k · blockDim.x + i) · 4 + e, EPT values a thread, blockDim.x a multiple of 32; amax the
// largest |v| of the thread's. Writes the row's scale to *qs (thread 0) and its codes to q
// (the row's, 4-byte aligned), from the registers: the row is not read back.
template <int EPT>
__device__ __forceinline__ void ls_fp8_row_codes(uint8_t *q, float *qs, const float (&v)[EPT],
                                                 float amax, float *scratch) {
    static_assert(EPT % 4 == 0, "float4 groups");
    float s = ls_fp8_row_scale(ls_block_max(amax, scratch));
    if (threadIdx.x == 0)
        *qs = s;
#pragma unroll
    for (int k = 0; k < EPT / 4; k++)
        *(uchar4 *)(q + (k * blockDim.x + threadIdx.x) * 4) =
            make_uchar4(ls_fp8_code(v[4 * k], s), ls_fp8_code(v[4 * k + 1], s),
                        ls_fp8_code(v[4 * k + 2], s), ls_fp8_code(v[4 * k + 3], s));
}

// The values a thread holds when a block of at most 1,024 threads keeps a row of cols in
// registers as ls_fp8_row_codes lays them out: the fewest of 4, 8, 16 that fit, with whole
// warps (up to 16,384 columns; more would spill at 1,024 threads' 64 registers); 0 when none
// does (the caller's loop kernel then). LS_CU_EPT_DISPATCH runs its statement with E the
// constant.
static inline int ls_cu_row_ept(int cols) {
    for (int e = 4; e <= 16; e *= 2)
        if (cols % (32 * e) == 0 && cols / e <= 1024)
            return e;
    return 0;
}
#define LS_CU_EPT_DISPATCH(ept, E, ...)                                                       \
    switch (ept) {                                                                            \
    case 4: {                                                                                 \
        constexpr int E = 4;                                                                  \
        __VA_ARGS__;                                                                          \
    } break;                                                                                  \
    case 8: {                                                                                 \
        constexpr int E = 8;                                                                  \
        __VA_ARGS__;                                                                          \
    } break;                                                                                  \
    case 16: {                                                                                \
        constexpr int E = 16;                                                                 \
        __VA_ARGS__;                                                                          \
    } break;                                                                                  \
    default:                                                                                  \
        return cudaErrorInvalidValue;                                                         \
    }

// (value, id) pairs ordered by value descending, then id ascending: "a before b".
struct ls_vid_t {
    float v;
    int id;
};
__device__ __forceinline__ bool ls_vid_before(ls_vid_t a, ls_vid_t b) {
    return a.v > b.v || (a.v == b.v && a.id < b.id);
}
__device__ __forceinline__ ls_vid_t ls_vid_best(ls_vid_t a, ls_vid_t b) {
    return ls_vid_before(b, a) ? b : a;
}
__device__ __forceinline__ ls_vid_t ls_warp_vid_best(ls_vid_t a) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        ls_vid_t b;
        b.v = __shfl_xor_sync(0xffffffffu, a.v, o);
        b.id = __shfl_xor_sync(0xffffffffu, a.id, o);
        a = ls_vid_best(a, b);
    }
    return a;
}
// The first pair of the block in that order; scratch holds 32 pairs. Every thread gets it.
__device__ __forceinline__ ls_vid_t ls_block_vid_best(ls_vid_t a, ls_vid_t *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    a = ls_warp_vid_best(a);
    __syncthreads();
    if (lane == 0)
        scratch[warp] = a;
    __syncthreads();
    ls_vid_t none = {-INFINITY, 0x7fffffff};
    a = lane < nw ? scratch[lane] : none;
    return ls_warp_vid_best(a);
}

#define LS_CU_CHECK_LAUNCH() return cudaGetLastError()

// Runs BODY with T bound to the storage type of dtype dt.
#define LS_CU_DISPATCH(dt, T, ...)                                                            \
    switch (dt) {                                                                             \
    case LS_CU_F32: {                                                                         \
        typedef float T;                                                                      \
        __VA_ARGS__;                                                                          \
    } break;                                                                                  \
    case LS_CU_F16: {                                                                         \
        typedef __half T;                                                                     \
        __VA_ARGS__;                                                                          \
    } break;                                                                                  \
    case LS_CU_BF16: {                                                                        \
        typedef __nv_bfloat16 T;                                                              \
        __VA_ARGS__;                                                                          \
    } break;                                                                                  \
    default:                                                                                  \
        return cudaErrorInvalidValue;                                                         \
    }

// A process may drive several devices (a worker one; the tensor-parallel tests one a rank
// thread), so what a launcher sets up once — a kernel's shared memory limit
// (cudaFuncSetAttribute holds for the current device only), occupancy, properties — it
// keeps per device, indexed by ls_cu_device() (the current device, < LS_CU_MAX_DEVICES).
enum { LS_CU_MAX_DEVICES = 64 };
int ls_cu_device(void);

// The current device's properties the launchers plan with, read once per device: SMs,
// compute capability (major), the opt-in shared memory of a block, and the peak memory
// bytes an SM must take each of its clocks for HBM to stream at its rate (the memory's
// rated bandwidth over SMs × SM clock; 0 where the device does not say).
typedef struct {
    int sms, cc, smem_optin;
    double mem_bytes_per_sm_clock;
} ls_cu_props_t;
const ls_cu_props_t *ls_cu_props(void);

// ls_cu_launch_dep_cs's attributes into attr: programmatic dependent launch where pdl (on
// sm_90+), clusters of cs CTAs along x where cs > 1; returns their count
static inline int ls_cu_launch_attrs(cudaLaunchAttribute (&attr)[2], bool pdl, int cs) {
    int n = 0;
    if (pdl && ls_cu_props()->cc >= 9) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cs > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = (unsigned)cs, attr[n].val.clusterDim.y = 1;
        attr[n++].val.clusterDim.z = 1;
    }
    return n;
}

// Launches kern over (grid, block) with programmatic dependent launch on sm_90+: it may be
// scheduled while the kernel before it in the stream drains, so the launch's latency hides
// under that kernel's tail. Only for kernels that call ls_dep_wait() before they read or
// write anything an earlier kernel of the step writes or reads (and ls_dep_launch() so the
// next such kernel may start in turn). cs > 1: in thread-block clusters of cs CTAs along x
// (sm_90+; grid.x a multiple of cs).
template <typename... P, typename... A>
static inline cudaError_t ls_cu_launch_dep_cs(void (*kern)(P...), dim3 grid, dim3 block,
                                              size_t smem, cudaStream_t stream, int cs,
                                              A... args) {
    cudaLaunchAttribute attr[2];
    int n = ls_cu_launch_attrs(attr, true, cs);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kern, ((P)args)...);
}
template <typename... P, typename... A>
static inline cudaError_t ls_cu_launch_dep(void (*kern)(P...), dim3 grid, dim3 block,
                                           size_t smem, cudaStream_t stream, A... args) {
    return ls_cu_launch_dep_cs(kern, grid, block, smem, stream, 1, args...);
}

// The first thing an enrolled kernel does (ls_cu_launch_dep): wait for the kernel before
// it, then let the one after it be scheduled.
__device__ __forceinline__ void ls_dep_enter() {
    ls_dep_wait();
    ls_dep_launch();
}

static inline unsigned ls_cu_blocks(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b > 65535u * 16u ? 65535u * 16u : (b ? b : 1)); // grid-stride beyond
}

#endif
