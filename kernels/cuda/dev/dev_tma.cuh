/*  kernels/cuda/dev/dev_tma.cuh — the tensor memory accelerator (TMA, sm_90) as the dev
    bench's GEMMs use it: mbarriers in shared memory (init, arrive, arrive with the bytes a
    stage expects, wait on a phase), a 2-D tile copy global -> shared completing on an
    mbarrier, and the tensor map of a row-major matrix in boxes that land in wgmma.cuh's
    128-byte swizzle (a box 128 bytes wide).
*/
#ifndef LS_DEV_TMA_CUH
#define LS_DEV_TMA_CUH

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

// an mbarrier completing when count threads have arrived (and the bytes expected landed)
__device__ __forceinline__ void dev_mb_init(unsigned mb, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(mb), "r"(count) : "memory");
}
// after every thread's inits: visible to the async proxy (TMA) and the other threads
__device__ __forceinline__ void dev_mb_fence_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void dev_mb_arrive(unsigned mb) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(mb) : "memory");
}
// arrives and adds bytes to what the phase waits for
__device__ __forceinline__ void dev_mb_expect(unsigned mb, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(mb), "r"(bytes) : "memory");
}
// until the phase of the given parity has completed
__device__ __forceinline__ void dev_mb_wait(unsigned mb, unsigned parity) {
    unsigned done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(mb), "r"(parity)
                     : "memory");
}
// the box at (k0, r0) of the tensor map into dst, its bytes counted on mb
__device__ __forceinline__ void dev_tma_2d(unsigned dst, const CUtensorMap *map, int k0, int r0, unsigned mb) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
                 "[%4];\n" ::"r"(dst),
                 "l"(map), "r"(k0), "r"(r0), "r"(mb)
                 : "memory");
}

// A 2-D tensor map of rows of `in` elements of esize bytes (rows of them), boxes of 128 bytes
// x box rows in the 128-byte swizzle; rows past the last read as zeros
static inline cudaError_t dev_tmap(CUtensorMap *m, const void *p, CUtensorMapDataType dt, int esize, int in,
                                   int rows, int box) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode;
    if (!encode) {
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode, 12000, cudaEnableDefault,
                                             &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            return cudaErrorNotSupported;
    }
    cuuint64_t dims[2] = {(cuuint64_t)in, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)in * esize};
    cuuint32_t boxd[2] = {(cuuint32_t)(128 / esize), (cuuint32_t)box}, es[2] = {1, 1};
    return encode(m, dt, 2, const_cast<void *>(p), dims, strides, boxd, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) ==
                   CUDA_SUCCESS
               ? cudaSuccess
               : cudaErrorInvalidValue;
}

#endif
