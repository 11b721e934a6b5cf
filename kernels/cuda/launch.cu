/*  kernels/cuda/launch.cu — the device's properties the launchers plan with (common.cuh
    ls_cu_props), read once per process.
*/
#include "common.cuh"

const ls_cu_props_t *ls_cu_props(void) {
    static ls_cu_props_t p; // one device per process (backend_cuda.h)
    if (!p.sms) {
        int dev = 0, sms = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&p.cc, cudaDevAttrComputeCapabilityMajor, dev);
        cudaDeviceGetAttribute(&p.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        cudaGetLastError(); // an attribute the device lacks reads 0, not the next launch's error
        p.sms = sms > 0 ? sms : 1; // last: the others are set once it is
    }
    return &p;
}
