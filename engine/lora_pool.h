/*  engine/lora_pool.h — the LoRA adapter memory of one worker: a host tier, and adapters in
    pages of the GPU pool that the KV cache shares (docs/memory.md).

    S-LoRA's unified paging, on an ls_backend_t, with a host tier sized in bytes:

    - the host tier (the "CPU tier") holds adapters keyed by an adapter id string (the
      registry's uuid), each as its image: the contents of the pages it takes on the device,
      in the pool's dtype, with the folded scalings and the rank's shard applied, only the
      adapter's own rank (B up to a multiple of 8) and only what it targets. So an adapter of
      rank 8 costs a quarter of one of rank 32 and one of q,v only a fraction of one of all
      seven, here and on the device. Images live in one arena of host_alloc memory (pinned on
      CUDA) made once, in host pages: building an image takes them, dropping it gives them
      back, and no allocation, pinning or freeing of host memory happens while serving. The
      pool never evicts from this tier by itself: the caller (the scheduler, through the
      worker) decides what leaves it, and an image that does not fit is refused;
    - on the device, an adapter lies in pages of the page arena (ls_page_arena_t: the KV
      cache's pages, one pool for both) that the caller names when it assigns the adapter to
      a slot. A slot is a handle — a rank, a scaling and a page table, no weight memory —
      and there are max_loras_per_batch of them, plus slot 0 (LS_LORA_SLOT_BASE), the
      base-model sentinel: rank 0, so the LoRA kernels do no work for its tokens. The pool
      chooses no slot, no page and no victim: the scheduler decides which adapter goes in
      which slot on which pages and which one leaves (actors/scheduler/lora.h), and
      ls_lora_pool_assign places an adapter as told, replacing what the slot held. Engine
      tests and benchmarks, which run no scheduler, place their batches with the scheduler's
      own policy code (tests/engine/slot_plan.h). Pinning is the scheduler's too.

    An image is a set of units, each a contiguous run that starts 16-byte aligned and never
    straddles a page (docs/memory.md): per layer and stacked group the adapter targets, its A
    rows (rank rows of `in` elements) and its B chunks (rank columns 8c .. 8c+7 of every
    output row, an (out_total, 8) array); a row or chunk larger than a page is cut into
    pieces. The embedding's A is held as chunks of vocabulary rows (its shrink gathers one).
    The units are laid out in as few pages as first fit, largest first, allows
    (ls_lora_image_pages), once, when the image is built. What the adapter does not touch (a
    slice or module it does not target, the rows past a smaller module's rank) takes no page:
    its entries point at a zeroed region the pool keeps beside the arena, which adds exactly 0.

    The page table (ls_lora_pool_mats, ls_lora_mat_t in backend.h) holds, per slot, layer and
    group, a device pointer per A row piece and per B chunk piece, for ranks up to
    max_lora_rank; the pool writes a slot's table on the host when it assigns an adapter and
    copies it to the device after the adapter's pages. The kernels read adapters only
    through it.

    Images are built off the caller's loop: ls_lora_pool_image_new may run on any thread
    (the worker's job thread) while the loop uses the pool; only it and image_destroy touch
    the arena's free list, under a lock.

    Loads are asynchronous (backend.h, buffer_upload_async): assign starts them on the
    backend's upload stream and returns; each slot has an event marking the end of its last
    load. ls_model_forward makes its step wait (on the device, ls_lora_pool_step_wait) for
    the slots the step reads only, so a load into another slot (PrefetchAdapter) overlaps the
    running step; a load starts after the work queued before it, so it never overwrites a
    page a queued step still reads or writes. A slot that loses its adapter (reassigned,
    removed, its pages given to another slot or written as KV: ls_lora_pool_claim) makes the
    ops queued after that wait for its last load, so its pages can be reused at once.

    The embedding and lm_head are two more groups of one "layer", vocabulary-sized, so they
    exist only when lora_target_modules names embed_tokens / lm_head (the default, 0, is the
    seven per-layer targets); the forward runs them only for the slots whose adapter
    targets them (ls_lora_pool_slot_targets). Under tensor parallelism every rank holds the
    whole embedding LoRA (its delta is added after the embedding's all-reduce) and its
    vocabulary rows of lm_head's B (rows past them up to vocab_max are zero).

    Ranks and scalings. A slot's rank is the adapter's largest module rank; modules of
    smaller rank (rank_pattern) and targets of a group the adapter does not touch read zero
    A rows and zero B columns, which add exactly 0. Scaling is one float per slot (the
    kernels' contract), but PEFT's is per module (alpha_pattern, rank_pattern, rslora): when
    every module of the adapter has the same scaling, the slot carries it and B is stored as
    it is; otherwise each module's scaling is folded into its B in the image (one fp32
    rounding of the product) and the slot's scaling is 1.

    Tensor parallelism (tp_size > 1): the images hold rank tp_rank's shards, matching the
    base model's (ls_tp_target_window, S-LoRA / sgl-jax): column-parallel targets (q, k, v,
    gate, up) keep A whole and their rows of B; row-parallel ones (o, down) keep their
    columns of A and B whole. A rank's LoRA output is then exactly its share of the target's
    output: whole columns of a column-parallel one, a partial sum of a row-parallel one that
    the all-reduce after it completes, so LoRA adds no collective. Every rank loads the
    same adapter files and cuts its own shard into its images (whose page counts may differ
    by rank: the scheduler gives each adapter the largest).

    Adapters must have been loaded (ls_adapter_load) against the same model config and a
    max_lora_rank no larger than the pool's. Apart from image_new/image_destroy, the pool is
    single-threaded: the worker's loop owns it.
*/
#ifndef LS_LORA_POOL_H
#define LS_LORA_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "lora_tokens.h"
#include "model_config.h"
#include "peft.h"

// The stacked target groups, in the order of one decoder layer.
typedef enum {
    LS_LORA_GROUP_QKV = 0,
    LS_LORA_GROUP_O,
    LS_LORA_GROUP_GATE_UP,
    LS_LORA_GROUP_DOWN,
    LS_LORA_GROUP_EMBED,    // the model's embedding: one "layer", A (r, vocab) held as chunks
    LS_LORA_GROUP_LM_HEAD,  // lm_head: one "layer", B (vocab_max, r)
    LS_LORA_GROUP_COUNT,
} ls_lora_group_t;

// Slot of the base model: rank 0, no LoRA work.
#define LS_LORA_SLOT_BASE 0

typedef struct {
    int max_loras_per_batch;  // adapter slots (handles) besides the base sentinel, >= 1
    int max_lora_rank;        // the largest rank a slot takes, >= 1
    size_t host_bytes;        // host tier capacity (0: ls_lora_pool_host_bytes_default)
    unsigned target_mask;     // bits (1u << ls_target_t) of lora_target_modules; 0: the seven
                              // per-layer ones (embed_tokens and lm_head only when named)
    int tp_rank, tp_size;     // the shard the images hold; tp_size 0 or 1: whole adapters
    int extra_vocab_size;     // rows of the embedding and of lm_head a slot holds for its
                              // adapter's trainable tokens (lora_tokens.h); 0: none, and
                              // adapters with trainable tokens are refused
} ls_lora_pool_config_t;

// The pages adapters are placed in: n_pages pages of page_n elements of buf, page p at
// element p * page_n. The worker's is the KV cache's (ls_kv_cache_arena, engine/model.h), so
// one pool of pages serves KV and adapters and the scheduler says which page holds what.
// Adapters take buf's storage dtype; a page must be a multiple of 16 bytes.
typedef struct {
    ls_buffer_t *buf;
    size_t page_n;
    int n_pages;
} ls_page_arena_t;

typedef struct {
    uint64_t hits;            // assigns of an adapter to the slot and pages it is already on
    uint64_t cold_loads;      // adapters uploaded from the host tier into pages
    uint64_t slot_evictions;  // slots taken from another adapter
    uint64_t upload_bytes;    // image bytes sent to pages
    size_t host_used, host_total;  // host tier bytes (whole pages) taken and available
    int host_adapters;        // adapters in the host tier
} ls_lora_pool_stats_t;

// The layout of one group, for the forward (the rank's shard: its input columns of o and
// down, its output rows of the others).
typedef struct {
    int n_slices;
    int in;                                   // input width of the group
    int32_t slice_offsets[LS_LORA_MAX_SLICES + 1];  // (n_slices+1), last = out_total
} ls_lora_group_shape_t;

typedef struct ls_lora_pool ls_lora_pool_t;

// Makes the page tables of every slot (pointing at zeros) and the host tier's arena, for
// adapters placed in arena's pages (which must outlive the pool). NULL + err on bad settings
// (including a model that does not split over tp_size ranks, a host tier that cannot hold
// one adapter of max_lora_rank, pages not a multiple of 16 bytes or smaller than 8 elements)
// or allocation failure.
ls_lora_pool_t *ls_lora_pool_new(ls_backend_t *be, const ls_model_config_t *cfg,
                                 const ls_lora_pool_config_t *pc, const ls_page_arena_t *arena,
                                 char *err, size_t errlen);
// Frees the tables and the host tier; idempotent, clears the pointer.
void ls_lora_pool_destroy(ls_lora_pool_t **self_p);

// Pages of page_bytes (in the storage dtype) that the largest adapter of pc (rank
// max_lora_rank on every enabled target) takes: for sizing an arena. -1 + err on bad
// settings, as ls_lora_pool_new's.
int ls_lora_pool_max_pages(const ls_model_config_t *cfg, const ls_lora_pool_config_t *pc, size_t page_bytes,
                           ls_dtype_t storage, char *err, size_t errlen);

// The host tier a config gets when it asks for none (host_bytes 0): room for 64 adapters of
// max_lora_rank on every enabled target, at most a quarter of the machine's memory.
size_t ls_lora_pool_host_bytes_default(const ls_model_config_t *cfg, const ls_lora_pool_config_t *pc);
// Bytes of the host image of an adapter of rank max_lora_rank on every enabled target, whole
// host pages: the most one adapter can take.
size_t ls_lora_pool_image_max_bytes(const ls_lora_pool_t *self);

// An adapter's image in the host tier, not yet added (owned by the caller).
typedef struct ls_lora_image ls_lora_image_t;

// Builds adapter's image in the host tier; any thread. NULL + err: a rank above
// max_lora_rank, a target outside lora_target_modules, more trainable token rows than
// extra_vocab_size, or not enough free bytes in the tier (then *full, when full is given, is
// set; the message says how many it needs and has).
ls_lora_image_t *ls_lora_pool_image_new(ls_lora_pool_t *self, const ls_adapter_t *adapter,
                                        bool *full, char *err, size_t errlen);
// Gives an image's host pages back; any thread, for an image not added. Idempotent.
void ls_lora_pool_image_destroy(ls_lora_pool_t *self, ls_lora_image_t **image_p);
// Host bytes the image takes (whole host pages).
size_t ls_lora_image_bytes(const ls_lora_image_t *image);
int ls_lora_image_rank(const ls_lora_image_t *image);
// Arena pages the adapter takes on the device.
int ls_lora_image_pages(const ls_lora_image_t *image);

// Adds an image to the host tier under id (copied); the pool takes it and clears *image.
// Refused, with *image left to the caller: an empty or duplicate id.
int ls_lora_pool_add(ls_lora_pool_t *self, const char *id, ls_lora_image_t **image, char *err, size_t errlen);
// image_new then add, and the adapter destroyed (*adapter cleared) on success: for callers
// that build on the loop (tests, benchmarks).
int ls_lora_pool_add_adapter(ls_lora_pool_t *self, const char *id, ls_adapter_t **adapter, char *err,
                             size_t errlen);
// Drops the adapter from the host tier and its slot (unload). The caller (the registry) has
// waited until no request uses it. -1 + err for an unknown id.
int ls_lora_pool_remove(ls_lora_pool_t *self, const char *id, char *err, size_t errlen);
bool ls_lora_pool_contains(const ls_lora_pool_t *self, const char *id);
// Drops every adapter from both: the scheduler that placed them is gone, and its restart
// places them again.
void ls_lora_pool_clear(ls_lora_pool_t *self);
// The rank, host bytes and arena pages of adapter id's image; -1 when it is not in the tier.
int ls_lora_pool_image_info(const ls_lora_pool_t *self, const char *id, int *rank, size_t *bytes,
                            int *pages);

// Puts adapter id into slot (1 .. n_slots-1) on pages (n_pages of them, at least its image's:
// the first ones are used, the rest left alone), evicting what the slot held, as the
// scheduler decided (through the worker's PrefetchAdapter). The adapter
// already in that slot on those pages is a hit; one in another slot moves (its old slot is
// left empty); a slot whose adapter lies on one of these pages loses it (the scheduler took
// its pages back). Refused: an id not in the host tier, a slot out of range, too few pages, a
// page outside the arena or named twice. The load is started, not finished (it runs while
// the current step does). -1 + err also when the upload cannot be started (the slot is then
// empty).
int ls_lora_pool_assign(ls_lora_pool_t *self, const char *id, int slot, const int32_t *pages,
                        int n_pages, char *err, size_t errlen);
// The caller writes pages (n of them; ids outside the arena are ignored) from now on as
// something else — a step's KV blocks: a slot whose adapter lies on one of them loses it
// (the scheduler took the pages back), and the ops queued next wait for its last load.
void ls_lora_pool_claim(ls_lora_pool_t *self, const int32_t *pages, int n);
// Empties slot (1 .. n_slots-1), as claim does; an empty slot stays empty.
void ls_lora_pool_slot_clear(ls_lora_pool_t *self, int slot);

// The backend's next ops wait (on the device) for the loads into the slots of the segments
// of lora[0 .. n_passes) (a step's LoRA passes); loads into other slots go on.
void ls_lora_pool_step_wait(const ls_lora_pool_t *self, const ls_lora_batch_t *lora,
                            int n_passes);
// The host waits for every load in flight; -1 on a device fault.
int ls_lora_pool_wait(ls_lora_pool_t *self);

// Slot holding id, or -1 when it is not resident (or unknown).
int ls_lora_pool_slot_of(const ls_lora_pool_t *self, const char *id);

int ls_lora_pool_n_slots(const ls_lora_pool_t *self);  // max_loras_per_batch + 1
int ls_lora_pool_r_max(const ls_lora_pool_t *self);
// The dtype the adapters are stored in (the page arena's: ls_lora_mat_t.dtype of every group)
ls_dtype_t ls_lora_pool_dtype(const ls_lora_pool_t *self);
// The arena the pool places adapters in.
ls_page_arena_t ls_lora_pool_arena(const ls_lora_pool_t *self);
// Pages of the arena the largest adapter takes (ls_lora_pool_max_pages of the pool's).
int ls_lora_pool_image_max_pages(const ls_lora_pool_t *self);
// Per slot, for ls_lora_batch_t: ranks (n_slots) and scalings (n_slots); slot 0 and empty
// slots have rank 0. Valid until the next assign/remove/claim.
const int32_t *ls_lora_pool_slot_ranks(const ls_lora_pool_t *self);
const float *ls_lora_pool_slot_scalings(const ls_lora_pool_t *self);
// Per slot (n_slots), for the ops of group g: the slot's rank where its adapter targets some
// target of g, 0 where it targets none (its slot holds zeros there, which the forward then
// does not read). Valid until the next assign/remove/claim.
const int32_t *ls_lora_pool_group_ranks(const ls_lora_pool_t *self, ls_lora_group_t g);
// Per slot (n_slots): the targets (bits 1u << ls_target_t) of the adapter it holds, 0 when
// empty. Valid until the next assign/remove/claim.
const unsigned *ls_lora_pool_slot_targets(const ls_lora_pool_t *self);

// The slots' trainable token rows (lora_tokens.h); NULL when extra_vocab_size is 0.
const ls_lora_tokens_t *ls_lora_pool_tokens(const ls_lora_pool_t *self);

// Whether the pool holds group g (some target of it is enabled).
bool ls_lora_pool_has_group(const ls_lora_pool_t *self, ls_lora_group_t g);
ls_lora_group_shape_t ls_lora_pool_group_shape(const ls_lora_pool_t *self, ls_lora_group_t g);
// The page table of layer's A and B of group g, which the pool must hold (layer 0 of the
// embedding and lm_head groups): A rows of `in` elements (the embedding's: chunks of its
// vocabulary rows), B chunks of out_total rows.
void ls_lora_pool_mats(const ls_lora_pool_t *self, int layer, ls_lora_group_t g, ls_lora_mat_t *a,
                       ls_lora_mat_t *b);

ls_lora_pool_stats_t ls_lora_pool_stats(const ls_lora_pool_t *self);

#endif
