/*  tests/kernels/lora_pages.h — dense LoRA pools laid out in pages for the tests of the LoRA
    ops, which read adapters through the page table (ls_lora_pages_t, kernels/lora_batch.h).

    The engine's pool lays an adapter's rows and chunks out in the pages the scheduler gives
    (engine/lora_pool.c); here a slot's units go to an arena in shuffled order with gaps of
    NaN between them, so an op that reads a row or chunk from the wrong place, reads past a
    piece or takes rows as contiguous reads NaN. Entries that hold no unit (rows at or past
    a slot's rank, slots of rank 0) are NULL in the table: an op that reads one faults.
*/
#ifndef LS_TESTS_LORA_PAGES_H
#define LS_TESTS_LORA_PAGES_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "lora_batch.h"
#include "test_util.h"

typedef struct {
    size_t n;      // arena elements
    float *arena;  // (n) the units' values, NaN elsewhere
    size_t *off;   // (n_slots * stride) element offset of each entry's piece; SIZE_MAX: none
    size_t stride; // entries per slot
    int np, piece;
} tp_pages_t;

typedef struct {
    size_t entry, n;  // table entry, elements
    const float *src; // its n values
} tp_unit_t;

// Places units (count n) in the arena in shuffled order, each 8-element aligned (16 bytes
// for any dtype of 2 or 4 bytes) after a gap of 0, 8 or 16 NaN elements.
static inline void tp_place(tp_pages_t *p, t_rng_t *r, tp_unit_t *u, int n) {
    int32_t *order = (int32_t *)t_alloc(sizeof(int32_t) * (n ? n : 1));
    for (int i = 0; i < n; i++)
        order[i] = i;
    t_shuffle(r, order, n);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        at += 8 * (size_t)t_rng_int(r, 3);
        p->off[u[order[i]].entry] = at;
        at += (u[order[i]].n + 7) / 8 * 8;
    }
    p->n = at + 8;
    p->arena = (float *)t_alloc(sizeof(float) * p->n);
    for (size_t i = 0; i < p->n; i++)
        p->arena[i] = NAN;
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < u[i].n; k++)
            p->arena[p->off[u[i].entry] + k] = u[i].src[k];
    free(order);
}

static inline void tp_init(tp_pages_t *p, int n_slots, size_t stride, int np, int piece) {
    memset(p, 0, sizeof *p);
    p->stride = stride;
    p->np = np;
    p->piece = piece;
    p->off = (size_t *)t_alloc(sizeof(size_t) * n_slots * stride);
    for (size_t i = 0; i < (size_t)n_slots * stride; i++)
        p->off[i] = SIZE_MAX;
}

// A of the dense a (n_slots, n_slices*r_max, len): rows j < ranks[w] of each slice, in pieces
// of `piece` elements (piece >= len: whole rows).
static inline void tp_rows(tp_pages_t *p, t_rng_t *r, const float *a, int n_slots, int n_slices,
                           int r_max, int len, int piece, const int32_t *ranks) {
    int np = (len + piece - 1) / piece, n = 0;
    size_t rows = (size_t)n_slices * r_max;
    tp_init(p, n_slots, rows * np, np, piece);
    tp_unit_t *u = (tp_unit_t *)t_alloc(sizeof(tp_unit_t) * (n_slots * rows * np + 1));
    for (int w = 0; w < n_slots; w++)
        for (int k = 0; k < n_slices; k++)
            for (int j = 0; j < ranks[w]; j++)
                for (int q = 0; q < np; q++) {
                    size_t i = (size_t)k * r_max + j, e0 = (size_t)q * piece;
                    size_t len_q = len - e0 < (size_t)piece ? len - e0 : (size_t)piece;
                    u[n++] = (tp_unit_t){(size_t)w * p->stride + i * np + q, len_q,
                                         a + ((size_t)w * rows + i) * len + e0};
                }
    tp_place(p, r, u, n);
    free(u);
}

// B of the dense b (n_slots, out, r_max), row o of slot w at b + (w*out + o)*r_max: the chunks
// covering ranks[w], NaN in their columns at or past the rank, in pieces of `piece` rows.
// col_stride / row_stride generalise the layout: element (w, o, j) at b[w*slot_stride +
// o*row_stride + j*col_stride] (the embedding's A passes its (r_max, vocab) layout this way).
static inline void tp_chunks_strided(tp_pages_t *p, t_rng_t *r, const float *b, int n_slots, int out,
                                     int r_max, int piece, const int32_t *ranks, size_t slot_stride,
                                     size_t row_stride, size_t col_stride) {
    int np = (out + piece - 1) / piece, nc = (r_max + 7) / 8, n = 0;
    tp_init(p, n_slots, (size_t)nc * np, np, piece);
    tp_unit_t *u = (tp_unit_t *)t_alloc(sizeof(tp_unit_t) * ((size_t)n_slots * nc * np + 1));
    float **bufs = (float **)t_alloc(sizeof(float *) * ((size_t)n_slots * nc * np + 1));
    for (int w = 0; w < n_slots; w++)
        for (int c = 0; 8 * c < ranks[w]; c++)
            for (int q = 0; q < np; q++) {
                int o0 = q * piece, rows = out - o0 < piece ? out - o0 : piece;
                float *buf = (float *)t_alloc(sizeof(float) * 8 * rows);
                for (int o = 0; o < rows; o++)
                    for (int e = 0; e < 8; e++) {
                        int j = 8 * c + e;
                        buf[o * 8 + e] = j < ranks[w] ? b[w * slot_stride + (size_t)(o0 + o) * row_stride +
                                                          (size_t)j * col_stride]
                                                      : NAN;
                    }
                bufs[n] = buf;
                u[n] = (tp_unit_t){(size_t)w * p->stride + (size_t)c * np + q, (size_t)8 * rows, buf};
                n++;
            }
    tp_place(p, r, u, n);
    for (int i = 0; i < n; i++)
        free(bufs[i]);
    free(bufs), free(u);
}

static inline void tp_chunks(tp_pages_t *p, t_rng_t *r, const float *b, int n_slots, int out, int r_max,
                             int piece, const int32_t *ranks) {
    tp_chunks_strided(p, r, b, n_slots, out, r_max, piece, ranks, (size_t)out * r_max, (size_t)r_max, 1);
}

// The table for an arena at base (elements of esize bytes): tab (n_slots * stride).
static inline void tp_table(const tp_pages_t *p, int n_slots, const void *base, size_t esize,
                            const void **tab) {
    for (size_t i = 0; i < (size_t)n_slots * p->stride; i++)
        tab[i] = p->off[i] == SIZE_MAX ? NULL : (const char *)base + p->off[i] * esize;
}

static inline ls_lora_pages_t tp_view(const tp_pages_t *p, const void *const *tab) {
    return (ls_lora_pages_t){tab, p->stride, p->np, p->piece};
}

#ifdef LS_BACKEND_H
// The pages on a backend: the arena uploaded into *arena (a new buffer of dtype, the values
// rounded as an upload rounds them), the table of its pointers into *tab (a new F32 buffer,
// two elements an entry: backend.h); the ls_lora_mat_t the backend's LoRA ops take. Aborts
// on failure.
static inline ls_lora_mat_t tp_backend(const tp_pages_t *p, ls_backend_t *be, int n_slots, ls_dtype_t dtype,
                                       ls_buffer_t **arena, ls_buffer_t **tab) {
    size_t n = (size_t)n_slots * p->stride;
    *arena = be->buffer_new(be, dtype, p->n);
    *tab = be->buffer_new(be, LS_DTYPE_F32, 2 * (n ? n : 1));
    const void **t = (const void **)t_alloc(sizeof(void *) * (n ? n : 1));
    if (!*arena || !*tab || be->buffer_upload(be, ls_view(*arena, 0), p->arena, LS_DTYPE_F32, p->n) != 0)
        abort();
    tp_table(p, n_slots, (*arena)->data, ls_dtype_size((*arena)->storage), t);
    if (be->buffer_upload(be, ls_view(*tab, 0), t, LS_DTYPE_F32, 2 * n) != 0)
        abort();
    free(t);
    return (ls_lora_mat_t){ls_view(*tab, 0), p->stride, p->np, p->piece, (*arena)->storage};
}
#endif

static inline void tp_free(tp_pages_t *p) {
    free(p->arena), free(p->off);
    memset(p, 0, sizeof *p);
}

#endif
