/*  kernels/cuda/launch.cu — the current device (common.cuh ls_cu_device) and its properties
    the launchers plan with (ls_cu_props), read once per device.
*/
#include <assert.h>

#include "common.cuh"

int ls_cu_device(void) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        cudaGetLastError(); // no device yet: the first, as a launch would take
        dev = 0;
    }
    assert(dev >= 0 && dev < LS_CU_MAX_DEVICES);
    return dev;
}

const ls_cu_props_t *ls_cu_props(void) {
    static ls_cu_props_t props[LS_CU_MAX_DEVICES];
    int dev = ls_cu_device();
    ls_cu_props_t &p = props[dev];
    if (!p.sms) {
        int sms = 0;
        cudaDeviceGetAttribute(&p.cc, cudaDevAttrComputeCapabilityMajor, dev);
        cudaDeviceGetAttribute(&p.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        int mem_khz = 0, bus_bits = 0, sm_khz = 0;
        cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, dev);
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev);
        cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, dev);
        cudaGetLastError(); // an attribute the device lacks reads 0, not the next launch's error
        if (sms > 0 && sm_khz > 0) // double data rate: two transfers a memory clock
            p.mem_bytes_per_sm_clock = 2.0 * mem_khz * (bus_bits / 8.0) / ((double)sms * sm_khz);
        p.sms = sms > 0 ? sms : 1; // last: the others are set once it is
    }
    return &p;
}
