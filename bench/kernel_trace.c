/*  bench/kernel_trace.c — see kernel_trace.h. */
#include "kernel_trace.h"

#include <cupti_activity.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { KT_BUF = 8 << 20 };

static FILE *s_out;
static char s_label[128]; // the label of the kernels launched since the last kt_mark

static void CUPTIAPI s_buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    // CUPTI wants 8-byte aligned buffers
    *buf = aligned_alloc(8, KT_BUF);
    *size = *buf ? KT_BUF : 0;
    *max_records = 0;
}

static void CUPTIAPI s_buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf,
                                        size_t size, size_t valid) {
    CUpti_Activity *rec = NULL;
    while (s_out && cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
            continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        // names hold commas (template arguments): quoted, quotes doubled
        fprintf(s_out, "%s,%u,%llu,%llu,\"", s_label, k->streamId,
                (unsigned long long)k->start, (unsigned long long)k->end);
        for (const char *p = k->name; p && *p; p++) {
            if (*p == '"')
                fputc('"', s_out);
            fputc(*p, s_out);
        }
        fputs("\"\n", s_out);
    }
    free(buf);
}

int kt_start(const char *csv_path) {
    if (!(s_out = fopen(csv_path, "w")))
        return -1;
    fputs("label,stream,start_ns,end_ns,name\n", s_out);
    if (cuptiActivityRegisterCallbacks(s_buffer_requested, s_buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fclose(s_out);
        s_out = NULL;
        return -1;
    }
    return 0;
}

int kt_mark(const char *label) {
    if (!s_out)
        return -1;
    int rc = cuptiActivityFlushAll(1) == CUPTI_SUCCESS ? 0 : -1;
    // the records delivered by the flush above carried the previous one; a copy, so the
    // caller's string need not outlive the call
    snprintf(s_label, sizeof s_label, "%s", label);
    return rc;
}

int kt_stop(void) {
    if (!s_out)
        return -1;
    int rc = cuptiActivityFlushAll(1) == CUPTI_SUCCESS ? 0 : -1;
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    fclose(s_out);
    s_out = NULL;
    return rc;
}
