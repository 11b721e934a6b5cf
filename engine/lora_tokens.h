/*  engine/lora_tokens.h — the adapters' own rows of the embedding and lm_head (PEFT's
    trainable tokens, formats/peft.h), slot by slot beside the LoRA slot pool.

    An adapter with trainable tokens brings, for a few token ids, rows that replace the base
    model's rows of those ids: in the embedding (the token's input vector) and in lm_head
    (the token's logit), for its own requests only. The pool (lora_pool.h) owns one of these
    when --lora-extra-vocab-size is above 0, and calls it where an adapter's image is built,
    put in a slot or dropped; the forward reads it to lay out a step (engine/model.c).

    Layout on the backend, in the slots' dtype (the base model's), capacity C rows a slot:
      embed (n_slots * C, hidden)   the embedding rows of slot w at rows w*C ..
      head  (n_slots * C, hidden)   the lm_head rows, likewise
      head_ids (n_slots * C)        F32: the vocabulary id of each lm_head row (ids below
                                    2^24 are exact in fp32; backend buffers hold no integers)

    Added vocabulary (formats/peft.h): an adapter's added ids, vocab_size and up, are rows
    like any other, so the embedding takes them from the slot and lm_head's rows give their
    logits. With a pool of rows, the logits rows are vocab_size + C wide (ls_model_forward):
    column vocab_size + k is added id vocab_size + k of whichever adapter defines it, -inf for
    the rows of every sequence whose adapter does not.
    A slot's rows are written on the backend's upload stream when its adapter is put there
    (buffer_upload_async: ordered after the ops queued before, overlapping the running
    step), from a pinned staging area of the slot's own; the host keeps each slot's ids, so
    a step's layout (which token row takes which row, which logit row recomputes which ids)
    is made on the host and travels with the step's metadata (ls_step_t.token_rows,
    head_tiles). Under tensor parallelism every rank holds the rows whole: the embedding's
    replace whole rows after the embedding's all-reduce, and lm_head's are recomputed on
    rank 0 after the logits are gathered.

    Host images (the adapter's rows in the slots' dtype) are plain memory held beside the
    pool's host tier, outside its budget: at most 2·C rows an adapter.
*/
#ifndef LS_LORA_TOKENS_H
#define LS_LORA_TOKENS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "model_config.h"
#include "peft.h"

typedef struct ls_lora_tokens ls_lora_tokens_t;
typedef struct ls_lora_tokens_image ls_lora_tokens_image_t;

// Rows for n_slots slots of capacity rows each (>= 1) on be, in cfg->torch_dtype. NULL + err
// on allocation failure or a vocabulary (vocab_size + capacity ids) too large for fp32 ids.
ls_lora_tokens_t *ls_lora_tokens_new(ls_backend_t *be, const ls_model_config_t *cfg, int n_slots,
                                     int capacity, char *err, size_t errlen);
// Waits for the loads in flight and frees everything; idempotent, clears the pointer.
void ls_lora_tokens_destroy(ls_lora_tokens_t **self_p);

// The adapter's rows as a slot holds them, built on any thread: 0 with *image NULL when the
// adapter has none; -1 + err when it has some and self is NULL (no rows are held) or holds
// fewer a slot than it needs, or out of memory.
int ls_lora_tokens_image_new(const ls_lora_tokens_t *self, const ls_adapter_t *adapter,
                             ls_lora_tokens_image_t **image, char *err, size_t errlen);
// Idempotent, clears the pointer.
void ls_lora_tokens_image_destroy(ls_lora_tokens_image_t **image_p);
// Host bytes of an image (0 for NULL).
size_t ls_lora_tokens_image_bytes(const ls_lora_tokens_image_t *image);

// Starts loading image (NULL: none) into slot; the host tables change at once. -1 when an
// upload could not be queued (the slot then holds none).
int ls_lora_tokens_load(ls_lora_tokens_t *self, int slot, const ls_lora_tokens_image_t *image);
// The backend's next ops wait for the loads into the slots of the segments of lora[0 ..
// n_passes); the host waits for none.
void ls_lora_tokens_step_wait(const ls_lora_tokens_t *self, const ls_lora_batch_t *lora,
                              int n_passes);
// The host waits for every load in flight; -1 on a device fault.
int ls_lora_tokens_wait(ls_lora_tokens_t *self);

// Whether slot holds rows of the embedding or lm_head.
bool ls_lora_tokens_slot_has(const ls_lora_tokens_t *self, int slot);
// The row of the embedding rows buffer that slot's adapter has for token id, or -1.
int32_t ls_lora_tokens_embed_row(const ls_lora_tokens_t *self, int slot, int32_t id);
// slot's lm_head rows: their count, and in *first the first one's row of the head buffer.
int ls_lora_tokens_head_rows(const ls_lora_tokens_t *self, int slot, int32_t *first);
// C: the rows a slot holds, and the columns past vocab_size of the logits rows.
int ls_lora_tokens_capacity(const ls_lora_tokens_t *self);
// The buffers: embed (n_slots*C, hidden), head (n_slots*C, hidden), head_ids (n_slots*C).
void ls_lora_tokens_views(const ls_lora_tokens_t *self, ls_view_t *embed, ls_view_t *head,
                          ls_view_t *head_ids);

#endif
