/*  tests/kernels/test_lora.c — segmented LoRA shrink/expand against the formula in double.

    Layouts: all tokens on one adapter, every segment a distinct adapter (decode shape),
    skewed segment lengths, base-model rows (slot 0, rank 0) interleaved, padding rows past
    the last segment, and a permutation that groups scattered rows by adapter. Ranks 8, 16,
    32, 64 live side by side in one pool of r_max 64, with 1, 2 and 3 slices of unequal
    output sizes (qkv with GQA).

    The adapters are read through the page table (lora_pages.h): rows and chunks in
    shuffled places between NaN, whole and in pieces (A rows cut in 3 pieces, B chunks in
    pieces of 24 rows, so pieces straddle the slices).

    The "untouched" half of the contract is checked bit for bit: tmp and y start as NaN
    wherever the contract says the kernels neither read nor write (tmp columns j >= rank,
    rows of rank-0 slots, padding rows), tmp columns j >= rank stay NaN while expand still
    produces finite sums, and NaN rows of y stay NaN. Bound: NMSE <= 1e-10.
    ls_lora_fused (the fused decode op's reference) must give the very bits of shrink +
    expand on every layout.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "lora_pages.h"
#include "ops.h"
#include "test_util.h"

#define N_SLOTS 6
#define R_MAX 64
#define MAX_SEGS 64

// slot 0 is the base model; two slots share rank 16 with different scalings
static const int32_t s_ranks[N_SLOTS] = {0, 8, 16, 32, 64, 16};
static const float s_scalings[N_SLOTS] = {0.0f, 2.0f, 0.5f, 1.0f, 0.25f, 1.5f};

typedef struct {
    const char *name;
    int n_segs;
    int seg_len[MAX_SEGS];
    int slot[MAX_SEGS];
    int padding;     // rows after the last segment that no segment covers
    int permute;     // 0: none; 1: rows scattered one by one; 2: each segment's rows kept
                     // together but the segments in shuffled order (runs, as sequences)
} s_layout_t;

// Row of segment position p
static int s_row(const int32_t *perm, int p) {
    return perm ? perm[p] : p;
}

// a_piece, b_piece: elements of an A piece and rows of a B piece (0: whole rows and chunks)
static void s_run(const s_layout_t *lay, int n_slices, const int32_t *slice_offsets,
                  int in, int a_piece, int b_piece, uint64_t seed) {
    t_rng_t r = {seed};
    int32_t seg_indptr[MAX_SEGS + 1] = {0}, weight_indices[MAX_SEGS];
    for (int s = 0; s < lay->n_segs; s++) {
        seg_indptr[s + 1] = seg_indptr[s] + lay->seg_len[s];
        weight_indices[s] = lay->slot[s];
    }
    int n_cov = seg_indptr[lay->n_segs], T = n_cov + lay->padding;
    int ld = n_slices * R_MAX, out_total = slice_offsets[n_slices];
    int32_t *perm = NULL;
    if (lay->permute == 1) { // the first n_cov of a shuffled row list are covered
        perm = t_alloc(sizeof(int32_t) * T);
        for (int i = 0; i < T; i++)
            perm[i] = i;
        t_shuffle(&r, perm, T);
    } else if (lay->permute == 2) { // segments laid out in shuffled order, rows together
        int32_t order[MAX_SEGS];
        perm = t_alloc(sizeof(int32_t) * T);
        for (int s = 0; s < lay->n_segs; s++)
            order[s] = s;
        t_shuffle(&r, order, lay->n_segs);
        for (int i = 0, row = 0; i < lay->n_segs; i++) {
            int s = order[i];
            for (int p = seg_indptr[s]; p < seg_indptr[s + 1]; p++)
                perm[p] = row++;
        }
    }
    ls_lora_batch_t batch = {.n_segs = lay->n_segs, .n_slots = N_SLOTS,
                             .seg_indptr = seg_indptr, .weight_indices = weight_indices,
                             .permutation = perm, .lora_ranks = s_ranks,
                             .scalings = s_scalings};

    size_t a_n = (size_t)N_SLOTS * ld * in, b_n = (size_t)N_SLOTS * out_total * R_MAX;
    float *x = t_alloc(sizeof(float) * T * in), *a = t_alloc(sizeof(float) * a_n);
    float *b = t_alloc(sizeof(float) * b_n), *tmp = t_alloc(sizeof(float) * T * ld);
    float *y = t_alloc(sizeof(float) * T * out_total);
    float *y0 = t_alloc(sizeof(float) * T * out_total);
    double *ref_tmp = t_alloc(sizeof(double) * R_MAX);
    double *ref_y = t_alloc(sizeof(double) * out_total);
    t_fill(&r, x, (size_t)T * in, -1, 1);
    t_fill(&r, a, a_n, -0.1f, 0.1f);
    t_fill(&r, b, b_n, -0.1f, 0.1f);
    // small base outputs, so that the NMSE of y measures the LoRA delta
    t_fill(&r, y0, (size_t)T * out_total, -0.01f, 0.01f);
    // rows with work hold base outputs; every other y row and all of tmp start NaN
    int *live = calloc((size_t)T, sizeof(int)); // rank of each row's slot, 0 if none
    for (int s = 0; s < lay->n_segs; s++)
        for (int p = seg_indptr[s]; p < seg_indptr[s + 1]; p++)
            live[s_row(perm, p)] = s_ranks[lay->slot[s]];
    for (int t = 0; t < T; t++)
        for (int o = 0; o < out_total; o++)
            y[t * out_total + o] = live[t] ? y0[t * out_total + o] : NAN;
    for (size_t i = 0; i < (size_t)T * ld; i++)
        tmp[i] = NAN;

    // the fused op starts from the same y and tmp
    size_t y_bytes = sizeof(float) * T * out_total, tmp_bytes = sizeof(float) * T * ld;
    float *yf = t_alloc(y_bytes), *tmpf = t_alloc(tmp_bytes);
    memcpy(yf, y, y_bytes);
    memcpy(tmpf, tmp, tmp_bytes);

    tp_pages_t pa, pb;
    tp_rows(&pa, &r, a, N_SLOTS, n_slices, R_MAX, in, a_piece ? a_piece : in, s_ranks);
    tp_chunks(&pb, &r, b, N_SLOTS, out_total, R_MAX, b_piece ? b_piece : out_total, s_ranks);
    const void **ta = t_alloc(sizeof(void *) * N_SLOTS * pa.stride);
    const void **tb = t_alloc(sizeof(void *) * N_SLOTS * pb.stride);
    tp_table(&pa, N_SLOTS, pa.arena, sizeof(float), ta);
    tp_table(&pb, N_SLOTS, pb.arena, sizeof(float), tb);
    ls_lora_pages_t va = tp_view(&pa, ta), vb = tp_view(&pb, tb);
    ls_lora_shrink(tmp, x, va, &batch, in, n_slices, R_MAX);
    ls_lora_expand(y, tmp, vb, &batch, slice_offsets, n_slices, R_MAX);
    // ls_lora_fused is defined as shrink then expand: the same bits, NaN poison included
    ls_lora_fused(yf, tmpf, x, va, vb, &batch, slice_offsets, in, n_slices, R_MAX);
    assert_memory_equal(yf, y, y_bytes);
    assert_memory_equal(tmpf, tmp, tmp_bytes);
    free(yf), free(tmpf), free(ta), free(tb);
    tp_free(&pa), tp_free(&pb);

    double worst_tmp = 0.0, worst_y = 0.0;
    for (int s = 0; s < lay->n_segs; s++) {
        int w = lay->slot[s], rank = s_ranks[w];
        if (rank == 0)
            continue;
        const float *aw = a + (size_t)w * ld * in, *bw = b + (size_t)w * out_total * R_MAX;
        for (int p = seg_indptr[s]; p < seg_indptr[s + 1]; p++) {
            int t = s_row(perm, p);
            for (int k = 0; k < n_slices; k++) {
                const float *tk = tmp + (size_t)t * ld + k * R_MAX;
                for (int j = 0; j < rank; j++) {
                    double acc = 0.0;
                    for (int i = 0; i < in; i++)
                        acc += (double)x[t * in + i] * aw[(size_t)(k * R_MAX + j) * in + i];
                    ref_tmp[j] = acc;
                }
                for (int j = rank; j < R_MAX; j++)
                    assert_true(isnan(tk[j])); // untouched
                double e = t_nmse(tk, ref_tmp, rank);
                worst_tmp = e > worst_tmp ? e : worst_tmp;
                // expand from the kernel's own tmp, so the two checks are independent
                for (int o = slice_offsets[k]; o < slice_offsets[k + 1]; o++) {
                    double acc = 0.0;
                    for (int j = 0; j < rank; j++)
                        acc += (double)tk[j] * bw[(size_t)o * R_MAX + j];
                    ref_y[o] = y0[t * out_total + o] + s_scalings[w] * acc;
                }
            }
            double e = t_nmse(y + (size_t)t * out_total, ref_y, out_total);
            worst_y = e > worst_y ? e : worst_y;
        }
    }
    for (int t = 0; t < T; t++) {
        if (live[t])
            continue;
        for (int o = 0; o < out_total; o++)
            assert_true(isnan(y[t * out_total + o]));
        for (int j = 0; j < ld; j++)
            assert_true(isnan(tmp[t * ld + j]));
    }
    print_message("    %-14s slices=%d T=%d pieces %d/%d nmse tmp=%.1e y=%.1e\n", lay->name, n_slices,
                  T, a_piece, b_piece, worst_tmp, worst_y);
    assert_true(worst_tmp <= 1e-10 && worst_y <= 1e-10);
    free(x), free(a), free(b), free(tmp), free(y), free(y0), free(ref_tmp), free(ref_y);
    free(live), free(perm);
}

static const s_layout_t s_layouts[] = {
    {"one adapter", 1, {37}, {4}, 0, 0},
    {"all distinct", 5, {1, 1, 1, 1, 1}, {1, 2, 3, 4, 5}, 0, 0},
    {"skewed", 4, {1, 50, 2, 9}, {3, 1, 5, 2}, 0, 0},
    {"base rows", 6, {3, 4, 1, 5, 2, 2}, {0, 2, 0, 4, 1, 0}, 5, 0},
    {"permuted", 5, {6, 1, 9, 4, 3}, {3, 0, 1, 4, 2}, 4, 1},
    {"permuted runs", 5, {6, 1, 9, 4, 3}, {3, 0, 1, 4, 2}, 2, 2},
};

// (in, slice_offsets) per slice count: o/down, gate_up, qkv with GQA (q 96, k 32, v 32)
static void s_run_all(int n_slices, const int32_t *slice_offsets, int in) {
    for (size_t i = 0; i < sizeof s_layouts / sizeof s_layouts[0]; i++) {
        s_run(&s_layouts[i], n_slices, slice_offsets, in, 0, 0, 100 + i);
        s_run(&s_layouts[i], n_slices, slice_offsets, in, (in / 3 + 7) / 8 * 8, 24, 200 + i);
    }
}

static void test_lora_one_slice(void **state) {
    const int32_t off[] = {0, 80};
    s_run_all(1, off, 120);
}

static void test_lora_gate_up(void **state) {
    const int32_t off[] = {0, 72, 144};
    s_run_all(2, off, 96);
}

static void test_lora_qkv(void **state) {
    const int32_t off[] = {0, 96, 128, 160};
    s_run_all(3, off, 96);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lora_one_slice),
        cmocka_unit_test(test_lora_gate_up),
        cmocka_unit_test(test_lora_qkv),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
