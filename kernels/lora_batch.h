/*  kernels/lora_batch.h — how one forward step's tokens map onto LoRA adapter slots.

    The host-side twin of SGLang's LoRABatchInfo. The scheduler builds one per step; every
    LoRA-targeted linear layer of that step reads the same description, so a device backend
    copies it to the device once per step (ls_backend_t.step_begin) and reuses it for every
    layer and target.

    Tokens are described in "segment order": position p in [seg_indptr[s], seg_indptr[s+1])
    belongs to segment s, whose adapter lives in pool slot weight_indices[s]. Position p is
    the activation row `permutation[p]` when a permutation is given (tokens grouped by
    adapter without moving the activations), else row p. Rows that no segment covers
    (padding, e.g. for a captured CUDA graph) are never read nor written by the LoRA ops.

    Slot ranks and scalings are per slot, not per segment: several segments may share a
    slot. A slot of rank 0 (slot 0 by convention: the base model) does no work at all. A
    segment may carry a weight that multiplies its slot's scaling (seg_weights): a mix of
    adapters (docs/lora-mixing.md) is one segment per component, each in its own pass (one
    batch per pass, engine/model.c), since a batch covers each row at most once.
*/
#ifndef LS_LORA_BATCH_H
#define LS_LORA_BATCH_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int n_segs;                    // number of segments
    int n_slots;                   // slots in the pool (length of lora_ranks, scalings)
    const int32_t *seg_indptr;     // (n_segs+1) segment boundaries in segment order, [0] = 0
    const int32_t *weight_indices; // (n_segs) pool slot of each segment, in [0, n_slots)
    const int32_t *permutation;    // (seg_indptr[n_segs]) segment position -> row, or NULL
    const int32_t *lora_ranks;     // (n_slots) rank of the adapter in each slot, 0..r_max
    const float *scalings;         // (n_slots) lora_alpha/r (or /sqrt(r) with rslora)
    const float *seg_weights;      // (n_segs) each segment's factor on its slot's scaling,
                                   // or NULL: 1 for every segment
} ls_lora_batch_t;

// One LoRA matrix of every pool slot, through the page table: where the slots' A rows or B
// chunks lie (docs/memory.md). Entry (slot w, i, piece q) is tab[w * stride + i * np + q],
// a pointer to elements of the slot's storage dtype:
// - rows (an A): entry i is row i of the slot's A — rank row j of slice k is i = k*r_max + j
//   — of `len` elements (the op's `in`, or the vocabulary ...), in np pieces of `piece`
//   elements (the last one shorter): element e of row i is tab[.., i, e / piece][e % piece];
// - chunks (a B, and the embedding's A): entry i is chunk i, rank columns 8i .. 8i+7, an
//   (out, 8) array in np pieces of `piece` rows: element (o, j) is
//   tab[.., j / 8, o / piece][(o % piece) * 8 + j % 8].
// Only the rows j < rank of a slot and the chunks covering them are read, and in those
// chunks the columns at or past the rank may hold anything (NaN too: the ops mask them).
// Every piece starts 16-byte aligned. np == 1 (whole rows, whole chunks) is the case the
// tuned GPU kernels take; pieces come with pages smaller than a row.
typedef struct {
    const void *const *tab;
    size_t stride; // entries per slot
    int np;        // pieces per row / chunk
    int piece;     // elements (rows) or rows (chunks) per piece
} ls_lora_pages_t;

#endif
