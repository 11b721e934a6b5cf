/*  bench/kernel_trace.h — a timeline of every kernel the GPU ran (CUPTI activity records:
    start, end, stream; kernels inside CUDA graphs included), for the benchmarks' --trace.
    ncu (tests/gpu/profile.sh) times kernels one at a time; this shows how they overlap,
    which is what the side queue (LoRA beside the GEMMs) is about.

    kt_start(path) before the first kernel to trace; kt_mark(label): the kernels launched
    from now on carry label (those before it, finished by then, are written with the old
    one). Rows of the CSV file: label,stream,start_ns,end_ns,"name". kt_stop() flushes and
    closes. All return 0, or -1 when CUPTI is unavailable or failed.
*/
#ifndef LS_KERNEL_TRACE_H
#define LS_KERNEL_TRACE_H

int kt_start(const char *csv_path);
int kt_mark(const char *label);
int kt_stop(void);

#endif
