/*  kernels/cuda/wgmma.cuh — Hopper's warpgroup MMA (wgmma, sm_90a) as the kernels use it:
    shared-memory descriptors of 128-byte-swizzled tiles, the fence / commit / wait of a
    warpgroup's asynchronous MMAs, and m64nNk16 bf16 -> fp32 with both operands in shared
    memory (N = 8 .. 128) or A in registers (N = 128); and m64nNk32 E4M3 -> fp32 with both
    operands in shared memory, K-major (FP8 has no other; dev_fp8's GEMM).

    Tiles: R rows of 128 bytes (64 bf16, 128 E4M3), 16-byte chunk c of row r at (c ^ (r %
    8)) * 16, atoms of 8 rows (1,024 bytes) at 1,024-byte alignment, which is what cp.async
    or st.shared write when they put chunk c of row r there. A K-major operand (the K of the
    MMA contiguous in a row) steps one MMA's k (16 bf16, 32 E4M3) by 32 bytes of its start
    address; its atoms of 8 rows are sbo = 1,024 bytes apart. Writes by cp.async and
    st.shared go through the generic proxy: each writer fences them to the async proxy
    (`fence.proxy.async.shared::cta`) before the barrier after which wgmma reads them.

    Accumulator layout of m64nN (fp32, N/2 registers a thread of the warpgroup's 128): warp
    w (of 4) holds rows 16w .. 16w + 15, lane (g = lane / 4, c = lane % 4) register 4n + e
    at row 16w + g + 8 (e >> 1), column 8n + 2c + (e & 1).

    Only the sm_90a build holds wgmma (`__CUDA_ARCH_FEAT_SM90_ALL`); kernels built for other
    targets leave their bodies empty there and are never launched on them.
*/
#ifndef LS_CU_WGMMA_CUH
#define LS_CU_WGMMA_CUH

#include <stdint.h>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// descriptor of a 128-byte-swizzled tile in shared memory at addr: lbo and sbo in bytes
// (PTX ISA, "Matrix Descriptor Format"; K-major operands ignore lbo)
__device__ __forceinline__ uint64_t ls_wg_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    return (uint64_t)((addr & 0x3ffff) >> 4) | (uint64_t)((lbo & 0x3ffff) >> 4) << 16 |
           (uint64_t)((sbo & 0x3ffff) >> 4) << 32 | (uint64_t)1 << 62;
}
__device__ __forceinline__ void ls_wg_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void ls_wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void ls_wg_wait0() {
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// the accumulators as the compiler must see them: written where the wait is, not before
template <int R> __device__ __forceinline__ void ls_wg_keep(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}

// the accumulators' register names (LS_WG_Rn: n of them) and operands (LS_WG_Dn: d[0 .. n-1])
#define LS_WG_R4 "%0, %1, %2, %3"
#define LS_WG_R8 LS_WG_R4 ", %4, %5, %6, %7"
#define LS_WG_R16 LS_WG_R8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define LS_WG_R32 LS_WG_R16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, " \
                            "%28, %29, %30, %31"
#define LS_WG_R64 LS_WG_R32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, " \
                            "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "   \
                            "%56, %57, %58, %59, %60, %61, %62, %63"
#define LS_WG_D4 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
#define LS_WG_D8 LS_WG_D4, "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define LS_WG_D16 \
    LS_WG_D8, "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
        "+f"(d[14]), "+f"(d[15])
#define LS_WG_D32 \
    LS_WG_D16, "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), \
        "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),        \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define LS_WG_D64 \
    LS_WG_D32, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), \
        "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),        \
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),        \
        "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),        \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]),        \
        "+f"(d[62]), "+f"(d[63])
// one MMA with both operands by descriptor, K-major: d = (acc ? d : 0) + a b; m64nNk16 bf16
// (its two transpose flags 0), or with F8 m64nNk32 E4M3 (no transpose flags)
#define LS_WG_SS(N, R, D, IA, IB, IACC)                                                           \
    if constexpr (F8)                                                                             \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IACC ", 0;\n"                          \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 {" R "}, %" #IA    \
                     ", %" #IB ", p, 1, 1;\n}\n"                                                   \
                     : D                                                                          \
                     : "l"(a), "l"(b), "r"(acc));                                                 \
    else                                                                                          \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IACC ", 0;\n"                          \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 {" R "}, %" #IA    \
                     ", %" #IB ", p, 1, 1, 0, 0;\n}\n"                                             \
                     : D                                                                          \
                     : "l"(a), "l"(b), "r"(acc))

// d (m64 x N, fp32) = or += a (m64 x k, 32 bytes of each row) b (k x N), both by descriptor:
// k16 of bf16, or with F8 k32 of E4M3
template <int N, bool F8 = false>
__device__ __forceinline__ void ls_wg_ss(float (&d)[N / 2], uint64_t a, uint64_t b, int acc) {
    static_assert(N == 8 || N == 16 || N == 32 || N == 64 || N == 128, "wgmma width");
    if constexpr (N == 8) {
        LS_WG_SS(8, LS_WG_R4, LS_WG_D4, 4, 5, 6);
    } else if constexpr (N == 16) {
        LS_WG_SS(16, LS_WG_R8, LS_WG_D8, 8, 9, 10);
    } else if constexpr (N == 32) {
        LS_WG_SS(32, LS_WG_R16, LS_WG_D16, 16, 17, 18);
    } else if constexpr (N == 64) {
        LS_WG_SS(64, LS_WG_R32, LS_WG_D32, 32, 33, 34);
    } else {
        LS_WG_SS(128, LS_WG_R64, LS_WG_D64, 64, 65, 66);
    }
}
// d (m64 x 128) += a (m64 x k16, bf16, the register-A fragment) b (k16 x 128, bf16, by
// descriptor, transposed: its N contiguous, "MN-major")
__device__ __forceinline__ void ls_wg_rs128(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" LS_WG_R64 "}, "
                 "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : LS_WG_D64
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
#endif

#endif
