/*  engine/lora_pool.c — see lora_pool.h.

    The host tier is an arena of equal pages made once (host_alloc: pinned on CUDA). An image
    is a list of pages holding one packed stream of elements in the slots' storage dtype: for
    each group the adapter targets, in group order, A as (L, n_slices, r, in) then B as
    (L, out_total, r), r the adapter's rank and in/out the rank's shard. A slot load hands the
    backend each region as the page pieces it spans (buffer_upload_async), which pads it to
    r_max on the device; groups the adapter does not target are zero-filled there. Pages
    make every image fit wherever pages are free (no fragmentation), and a page size of
    about 1/64 of the largest image keeps the rounding loss small for small adapters.

    Entries (adapters in the tier) sit in an array whose indices stay stable, so slots can
    refer to them; an open-addressing hash maps ids to entries, since a worker looks up
    every item of every step and may hold thousands of adapters.

    Pages go back only after every upload in flight (one of them may read them).
*/
#include "lora_pool.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ls_err.h"
#include "ls_par.h"

// Which targets each group stacks, as slices in this order.
static const struct {
    int n;
    ls_target_t t[LS_LORA_MAX_SLICES];
} s_group_def[LS_LORA_GROUP_COUNT] = {
    [LS_LORA_GROUP_QKV] = {3, {LS_TARGET_Q, LS_TARGET_K, LS_TARGET_V}},
    [LS_LORA_GROUP_O] = {1, {LS_TARGET_O}},
    [LS_LORA_GROUP_GATE_UP] = {2, {LS_TARGET_GATE, LS_TARGET_UP}},
    [LS_LORA_GROUP_DOWN] = {1, {LS_TARGET_DOWN}},
    [LS_LORA_GROUP_EMBED] = {1, {LS_TARGET_EMBED}},
    [LS_LORA_GROUP_LM_HEAD] = {1, {LS_TARGET_LM_HEAD}},
};

#define S_LAYER_TARGETS ((1u << LS_TARGET_COUNT) - 1)  // the default: the seven of a layer
#define S_ALL_TARGETS ((1u << LS_TARGET_ALL) - 1)
#define S_PAGE_MIN ((size_t)64 << 10)
#define S_PAGE_MAX ((size_t)2 << 20)
#define S_DEFAULT_ADAPTERS 64  // the default tier: this many adapters of max_lora_rank

struct ls_lora_image {
    int rank;              // the slot rank: the adapter's largest module rank
    unsigned targets;      // the adapter's targets (ls_adapter_info_t.target_mask)
    float scaling;         // the slot scaling: the common one, or 1 when folded into B
    unsigned groups;       // bit g: the image holds group g
    size_t a_off[LS_LORA_GROUP_COUNT], b_off[LS_LORA_GROUP_COUNT];  // element offsets
    size_t n;              // elements
    size_t bytes;          // whole pages
    atomic_bool broken;    // a block could not be written (out of memory while building)
    ls_lora_tokens_image_t *tokens;  // its trainable token rows, NULL: none
    int n_pages;
    int32_t pages[];       // (n_pages) arena pages, in stream order
};

typedef struct {
    char *id;              // NULL: free entry
    ls_lora_image_t *img;
    int slot;              // -1 when not resident
} s_entry_t;

// The part of a target's (out, in) weight the pool's shard holds (ls_tp_target_window).
typedef struct {
    int out0, n_out, in0, n_in;
} s_window_t;

struct ls_lora_pool {
    ls_backend_t *be;
    ls_model_config_t cfg;
    ls_lora_pool_config_t pc;
    s_window_t win[LS_TARGET_ALL];
    unsigned enabled;                       // target mask
    int n_slots;                            // max_loras_per_batch + 1
    ls_lora_group_shape_t shape[LS_LORA_GROUP_COUNT];
    ls_buffer_t *a[LS_LORA_GROUP_COUNT];    // (L_g, n_slots, n_slices*r_max, in), NULL: off
    ls_buffer_t *b[LS_LORA_GROUP_COUNT];    // (L_g, n_slots, out_total, r_max)
    ls_dtype_t storage;                     // the slots' storage dtype (the backend's)
    size_t esize;                           // its bytes per element
    ls_event_t **events;                    // (n_slots) end of each slot's last load
    // the host tier's arena: image_new/image_destroy may run on another thread
    char *arena;
    size_t page;
    int n_pages;
    pthread_mutex_t lock;                   // guards free_pages / n_free
    int32_t *free_pages;                    // (n_pages) a stack
    int n_free;
    ls_host_span_t *spans;                  // upload scratch: the pages of one region
    int max_image_pages;
    // entries
    s_entry_t *entries;                     // (cap_entries)
    int cap_entries, n_live;
    int *hash;                              // (hash_cap) entry index, -1 empty, -2 deleted
    int hash_cap, hash_used;                // used: live + deleted
    int *slot_entry;                        // (n_slots) the entry each slot holds, -1: empty
    int32_t *ranks;                         // (n_slots)
    int32_t *group_ranks;                   // (LS_LORA_GROUP_COUNT, n_slots)
    float *scalings;                        // (n_slots)
    unsigned *targets;                      // (n_slots) targets of the adapter in each slot
    ls_lora_tokens_t *tokens;               // the slots' trainable token rows, NULL: none
    ls_lora_pool_stats_t stats;
};

static size_t s_a_slot_n(const ls_lora_pool_t *self, int g) {
    const ls_lora_group_shape_t *s = &self->shape[g];
    return (size_t)s->n_slices * self->pc.max_lora_rank * s->in;
}

static size_t s_b_slot_n(const ls_lora_pool_t *self, int g) {
    const ls_lora_group_shape_t *s = &self->shape[g];
    return (size_t)s->slice_offsets[s->n_slices] * self->pc.max_lora_rank;
}

// L_g: the layers group g has, one for the global groups (embedding, lm_head).
static int s_layers(const ls_lora_pool_t *self, int g) {
    return g >= LS_LORA_GROUP_EMBED ? 1 : self->cfg.num_hidden_layers;
}

// Output rows of group g the pool's shard holds (the image's B rows per layer): out_total,
// but for lm_head under tensor parallelism the rank's vocabulary rows of its vocab_max
// (rows past them stay zero in the slots).
static int s_out_rows(const ls_lora_pool_t *self, int g) {
    int n = 0;
    for (int k = 0; k < s_group_def[g].n; k++)
        n += self->win[s_group_def[g].t[k]].n_out;
    return n;
}

static unsigned s_group_mask(int g) {
    unsigned m = 0;
    for (int k = 0; k < s_group_def[g].n; k++)
        m |= 1u << s_group_def[g].t[k];
    return m;
}

// Element counts of group g's regions in an image of rank r.
static size_t s_img_a_n(const ls_lora_pool_t *self, int g, int r) {
    const ls_lora_group_shape_t *s = &self->shape[g];
    return (size_t)s_layers(self, g) * s->n_slices * r * s->in;
}

static size_t s_img_b_n(const ls_lora_pool_t *self, int g, int r) {
    return (size_t)s_layers(self, g) * s_out_rows(self, g) * r;
}

// Elements of an image of rank r holding the groups in mask.
static size_t s_img_n(const ls_lora_pool_t *self, unsigned groups, int r) {
    size_t n = 0;
    for (int g = 0; g < LS_LORA_GROUP_COUNT; g++)
        if (groups & (1u << g))
            n += s_img_a_n(self, g, r) + s_img_b_n(self, g, r);
    return n;
}

static unsigned s_enabled_groups(const ls_lora_pool_t *self) {
    unsigned m = 0;
    for (int g = 0; g < LS_LORA_GROUP_COUNT; g++)
        m |= self->a[g] ? 1u << g : 0;
    return m;
}

static size_t s_pages_for(const ls_lora_pool_t *self, size_t elements) {
    return (elements * self->esize + self->page - 1) / self->page;
}

// -- ids -> entries -----------------------------------------------------------------------

static size_t s_hash_of(const char *id) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (; *id; id++)
        h = (h ^ (unsigned char)*id) * 1099511628211ull;
    return (size_t)h;
}

static int s_find(const ls_lora_pool_t *self, const char *id) {
    size_t mask = (size_t)self->hash_cap - 1;
    for (size_t i = s_hash_of(id) & mask;; i = (i + 1) & mask) {
        int e = self->hash[i];
        if (e == -1)
            return -1;
        if (e >= 0 && strcmp(self->entries[e].id, id) == 0)
            return e;
    }
}

static void s_hash_put(ls_lora_pool_t *self, int e) {
    size_t mask = (size_t)self->hash_cap - 1;
    size_t i = s_hash_of(self->entries[e].id) & mask;
    while (self->hash[i] >= 0)
        i = (i + 1) & mask;
    self->hash_used += self->hash[i] == -1;
    self->hash[i] = e;
}

// Rebuilds the table with room for twice the live entries plus one; -1 when out of memory.
static int s_hash_rebuild(ls_lora_pool_t *self) {
    int cap = 16;
    while (cap < 4 * (self->n_live + 1))
        cap *= 2;
    int *h = malloc((size_t)cap * sizeof *h);
    if (!h)
        return -1;
    free(self->hash);
    self->hash = h;
    self->hash_cap = cap;
    self->hash_used = 0;
    for (int i = 0; i < cap; i++)
        h[i] = -1;
    for (int e = 0; e < self->cap_entries; e++)
        if (self->entries[e].id)
            s_hash_put(self, e);
    return 0;
}

static void s_hash_del(ls_lora_pool_t *self, int e) {
    size_t mask = (size_t)self->hash_cap - 1;
    for (size_t i = s_hash_of(self->entries[e].id) & mask; self->hash[i] != -1; i = (i + 1) & mask)
        if (self->hash[i] == e) {
            self->hash[i] = -2;
            return;
        }
}

// -- the arena ------------------------------------------------------------------------------

size_t ls_lora_pool_host_bytes_default(const ls_model_config_t *cfg, const ls_lora_pool_config_t *pc) {
    unsigned mask = pc->target_mask ? pc->target_mask : S_LAYER_TARGETS;
    int in, out;
    size_t per_rank = 0;  // elements per unit of rank, whole model (unsharded: the larger case)
    for (int t = 0; t < LS_TARGET_ALL; t++)
        if (mask & (1u << t)) {
            ls_model_config_target_dims(cfg, (ls_target_t)t, &in, &out);
            per_rank += ((size_t)in + (size_t)out) *
                        (t < LS_TARGET_COUNT ? (size_t)cfg->num_hidden_layers : 1);
        }
    size_t want = (size_t)S_DEFAULT_ADAPTERS * per_rank * (size_t)pc->max_lora_rank *
                  ls_dtype_size(cfg->torch_dtype);
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    size_t cap = pages > 0 && psize > 0 ? (size_t)pages * (size_t)psize / 4 : want;
    return want < cap ? want : cap;
}

size_t ls_lora_pool_image_max_bytes(const ls_lora_pool_t *self) {
    return (size_t)self->max_image_pages * self->page;
}

void ls_lora_pool_image_destroy(ls_lora_pool_t *self, ls_lora_image_t **image_p) {
    if (!image_p || !*image_p)
        return;
    ls_lora_image_t *img = *image_p;
    pthread_mutex_lock(&self->lock);
    for (int i = 0; i < img->n_pages; i++)
        self->free_pages[self->n_free++] = img->pages[i];
    pthread_mutex_unlock(&self->lock);
    ls_lora_tokens_image_destroy(&img->tokens);
    free(img);
    *image_p = NULL;
}

size_t ls_lora_image_bytes(const ls_lora_image_t *image) {
    return image ? image->bytes : 0;
}

int ls_lora_image_rank(const ls_lora_image_t *image) {
    return image ? image->rank : 0;
}

// Writes bytes into an image's stream at its cursor, across pages.
typedef struct {
    ls_lora_pool_t *pool;
    ls_lora_image_t *img;
    size_t at;  // bytes written
} s_writer_t;

static void s_put(s_writer_t *w, const void *src, size_t bytes) {
    size_t page = w->pool->page;
    while (bytes) {
        size_t in = w->at % page, n = page - in < bytes ? page - in : bytes;
        memcpy(w->pool->arena + (size_t)w->img->pages[w->at / page] * page + in, src, n);
        src = (const char *)src + n;
        w->at += n;
        bytes -= n;
    }
}

// Narrows n fp32 values to the slots' storage dtype (rounding to nearest even, as a
// device-side conversion would) into dst.
static void s_store(const ls_lora_pool_t *self, void *dst, const float *src, size_t n) {
    ls_dtype_t dt = self->storage;
    if (dt == LS_DTYPE_F32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    uint16_t *h = dst;
    for (size_t i = 0; i < n; i++)
        h[i] = dt == LS_DTYPE_BF16 ? ls_bf16_from_f32(src[i]) : ls_f16_from_f32(src[i]);
}

// The adapter's weights of target t (in layer l for a per-layer target).
static const ls_lora_weights_t *s_weights(const ls_adapter_t *adapter, int l, ls_target_t t) {
    return t < LS_TARGET_COUNT ? ls_adapter_layer_target(adapter, l, t)
                               : ls_adapter_global_target(adapter, t);
}

// Writes layer l of group g of adapter into its places in the stream (A (n_slices, r, in) at
// the group's A region, B (out_total, r) at its B region), with zero rows / columns for
// modules of smaller rank and untouched targets. row: scratch of max(in, r) fp32 values;
// out: as many storage elements.
static void s_image_layer(ls_lora_pool_t *self, ls_lora_image_t *img, const ls_adapter_t *adapter, int g, int l,
                          bool uniform, float *row, void *out) {
    const ls_lora_group_shape_t *s = &self->shape[g];
    int r = img->rank;
    s_writer_t w = {.pool = self, .img = img,
                    .at = (img->a_off[g] + (size_t)l * s->n_slices * r * s->in) * self->esize};
    for (int k = 0; k < s->n_slices; k++) {
        ls_target_t t = s_group_def[g].t[k];
        const ls_lora_weights_t *lw = s_weights(adapter, l, t);
        const s_window_t *win = &self->win[t];
        int in_all, out_all;
        ls_model_config_target_dims(&self->cfg, t, &in_all, &out_all);
        for (int j = 0; j < r; j++) {
            if (j < lw->rank)  // A (rank, in_all): columns in0 .. in0 + in - 1
                s_store(self, out, lw->A + (size_t)j * in_all + win->in0, (size_t)s->in);
            else
                memset(out, 0, (size_t)s->in * self->esize);
            s_put(&w, out, (size_t)s->in * self->esize);
        }
    }
    w.at = (img->b_off[g] + (size_t)l * s_out_rows(self, g) * r) * self->esize;
    for (int k = 0; k < s->n_slices; k++) {
        ls_target_t t = s_group_def[g].t[k];
        const ls_lora_weights_t *lw = s_weights(adapter, l, t);
        const s_window_t *win = &self->win[t];
        float fold = uniform ? 1.0f : lw->scaling;
        for (int o = 0; o < win->n_out; o++) {  // B (out_all, rank): rows out0 ..
            for (int j = 0; j < r; j++)
                row[j] = j < lw->rank ? lw->B[(size_t)(win->out0 + o) * lw->rank + j] * fold : 0.0f;
            s_store(self, out, row, (size_t)r);
            s_put(&w, out, (size_t)r * self->esize);
        }
    }
}

// The (group, layer) blocks of an image, built on several threads (each block has its own
// places in the stream).
typedef struct {
    ls_lora_pool_t *pool;
    ls_lora_image_t *img;
    const ls_adapter_t *adapter;
    bool uniform;
    int groups[LS_LORA_GROUP_COUNT], n_groups;
    size_t scratch;  // fp32 values of a row's scratch
} s_build_t;

// Block i: layer i % L of the i / L-th group (a global group has its layer 0 only).
static void s_build_block(void *arg, size_t i) {
    s_build_t *b = arg;
    int L = b->pool->cfg.num_hidden_layers, g = b->groups[i / (size_t)L], l = (int)(i % (size_t)L);
    if (l >= s_layers(b->pool, g))
        return;
    float *row = malloc(b->scratch * (sizeof(float) + b->pool->esize));
    if (!row) {  // out of memory on a helper thread: the image is marked broken
        atomic_store(&b->img->broken, true);
        return;
    }
    s_image_layer(b->pool, b->img, b->adapter, g, l, b->uniform, row, row + b->scratch);
    free(row);
}

// Names the targets in mask, "q_proj, v_proj", into buf.
static const char *s_target_list(unsigned mask, char *buf, size_t len) {
    size_t n = 0;
    buf[0] = '\0';
    for (int t = 0; t < LS_TARGET_ALL && n < len; t++)
        if (mask & (1u << t))
            n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? ", " : "",
                                  ls_target_name((ls_target_t)t));
    return buf;
}

ls_lora_image_t *ls_lora_pool_image_new(ls_lora_pool_t *self, const ls_adapter_t *adapter,
                                        bool *full, char *err, size_t errlen) {
    if (full)
        *full = false;
    ls_adapter_info_t info = ls_adapter_info(adapter);
    if (info.max_rank > self->pc.max_lora_rank) {
        ls_err_set(err, errlen, "LoRA pool: the adapter has rank %d, above max_lora_rank %d",
                   info.max_rank, self->pc.max_lora_rank);
        return NULL;
    }
    if (info.target_mask & ~self->enabled) {
        char names[128];
        ls_err_set(err, errlen,
                   "LoRA pool: the adapter targets %s, which lora_target_modules does not enable",
                   s_target_list(info.target_mask & ~self->enabled, names, sizeof names));
        return NULL;
    }
    ls_lora_tokens_image_t *tokens;
    if (ls_lora_tokens_image_new(self->tokens, adapter, &tokens, err, errlen) != 0)
        return NULL;
    bool uniform = true, first = true;
    float scaling = 0.0f;
    for (int l = 0; l < self->cfg.num_hidden_layers; l++)
        for (int t = 0; t < LS_TARGET_ALL; t++) {
            if (t >= LS_TARGET_COUNT && l > 0)
                break;  // the global targets: once
            const ls_lora_weights_t *w = s_weights(adapter, l, t);
            if (w->rank == 0)
                continue;
            if (first)
                scaling = w->scaling;
            uniform &= first || w->scaling == scaling;
            first = false;
        }
    unsigned groups = 0;
    for (int g = 0; g < LS_LORA_GROUP_COUNT; g++)
        for (int k = 0; k < s_group_def[g].n; k++)
            groups |= info.target_mask & (1u << s_group_def[g].t[k]) ? 1u << g : 0;
    int r = info.max_rank;
    size_t n = s_img_n(self, groups, r), need = s_pages_for(self, n);
    ls_lora_image_t *img = calloc(1, sizeof *img + need * sizeof img->pages[0]);
    if (!img) {
        ls_lora_tokens_image_destroy(&tokens);
        ls_err_set(err, errlen, "LoRA pool: out of memory");
        return NULL;
    }
    img->tokens = tokens;
    pthread_mutex_lock(&self->lock);
    bool fits = (size_t)self->n_free >= need;
    size_t free_bytes = (size_t)self->n_free * self->page;
    for (size_t i = 0; fits && i < need; i++)
        img->pages[i] = self->free_pages[--self->n_free];
    pthread_mutex_unlock(&self->lock);
    if (!fits) {
        ls_lora_tokens_image_destroy(&img->tokens);
        free(img);
        if (full)
            *full = true;
        ls_err_set(err, errlen,
                   "LoRA pool: the host tier is full: the adapter needs %.1f MB, %.1f MB of %.1f MB are free",
                   (double)(need * self->page) / 1e6, (double)free_bytes / 1e6,
                   (double)((size_t)self->n_pages * self->page) / 1e6);
        return NULL;
    }
    img->n_pages = (int)need;
    img->bytes = need * self->page;
    img->rank = r;
    img->targets = info.target_mask;
    img->scaling = uniform ? scaling : 1.0f;
    img->groups = groups;
    img->n = n;
    atomic_init(&img->broken, false);
    s_build_t b = {.pool = self, .img = img, .adapter = adapter, .uniform = uniform, .scratch = (size_t)r};
    size_t at = 0;
    for (int g = 0; g < LS_LORA_GROUP_COUNT; g++) {
        if (!(groups & (1u << g)))
            continue;
        img->a_off[g] = at;
        img->b_off[g] = at + s_img_a_n(self, g, r);
        at = img->b_off[g] + s_img_b_n(self, g, r);
        b.groups[b.n_groups++] = g;
        b.scratch = (size_t)self->shape[g].in > b.scratch ? (size_t)self->shape[g].in : b.scratch;
    }
    assert(at == n);
    ls_par_for((size_t)b.n_groups * self->cfg.num_hidden_layers, 0, s_build_block, &b);
    if (atomic_load(&img->broken)) {
        ls_lora_pool_image_destroy(self, &img);
        ls_err_set(err, errlen, "LoRA pool: out of memory building an adapter's image");
        return NULL;
    }
    return img;
}

// -- the pool -------------------------------------------------------------------------------

ls_lora_pool_t *ls_lora_pool_new(ls_backend_t *be, const ls_model_config_t *cfg,
                                 const ls_lora_pool_config_t *pc, char *err, size_t errlen) {
    unsigned mask = pc->target_mask ? pc->target_mask : S_LAYER_TARGETS;
    ls_tp_shard_t shard;
    if (ls_model_config_shard(cfg, pc->tp_size > 1 ? pc->tp_rank : 0,
                              pc->tp_size > 1 ? pc->tp_size : 1, &shard, err, errlen) != 0)
        return NULL;
    if (pc->max_loras_per_batch < 1 || pc->max_lora_rank < 1 || (mask & ~S_ALL_TARGETS)) {
        ls_err_set(err, errlen,
                   "LoRA pool: need max_loras_per_batch >= 1 (got %d), max_lora_rank >= 1 "
                   "(got %d) and target bits within the nine targets (got 0x%x)",
                   pc->max_loras_per_batch, pc->max_lora_rank, pc->target_mask);
        return NULL;
    }
    ls_lora_pool_t *self = calloc(1, sizeof *self);
    if (!self) {
        ls_err_set(err, errlen, "LoRA pool: out of memory");
        return NULL;
    }
    pthread_mutex_init(&self->lock, NULL);
    self->be = be;
    self->cfg = *cfg;
    self->pc = *pc;
    self->enabled = mask;
    for (int t = 0; t < LS_TARGET_ALL; t++) {
        s_window_t *w = &self->win[t];
        ls_tp_target_window(cfg, &shard, (ls_target_t)t, &w->out0, &w->n_out, &w->in0, &w->n_in);
    }
    self->n_slots = pc->max_loras_per_batch + 1;
    int n_slots = self->n_slots;
    self->slot_entry = calloc((size_t)n_slots, sizeof *self->slot_entry);
    self->ranks = calloc((size_t)n_slots, sizeof *self->ranks);
    self->group_ranks = calloc((size_t)LS_LORA_GROUP_COUNT * n_slots,
                               sizeof *self->group_ranks);
    self->scalings = calloc((size_t)n_slots, sizeof *self->scalings);
    self->targets = calloc((size_t)n_slots, sizeof *self->targets);
    self->events = calloc((size_t)n_slots, sizeof *self->events);
    bool ok = self->slot_entry && self->ranks && self->group_ranks && self->scalings &&
              self->targets && self->events && s_hash_rebuild(self) == 0;
    for (int w = 0; ok && w < n_slots; w++)
        ok = (self->events[w] = be->event_new(be)) != NULL;
    for (int w = 0; ok && w < n_slots; w++)
        self->slot_entry[w] = -1;

    for (int g = 0; ok && g < LS_LORA_GROUP_COUNT; g++) {
        ls_lora_group_shape_t *s = &self->shape[g];
        s->n_slices = s_group_def[g].n;
        for (int k = 0; k < s->n_slices; k++) {
            const s_window_t *w = &self->win[s_group_def[g].t[k]];
            s->in = w->n_in;
            s->slice_offsets[k + 1] = s->slice_offsets[k] + w->n_out;
        }
        if (g == LS_LORA_GROUP_LM_HEAD)  // the rank's logits rows are vocab_max wide
            s->slice_offsets[1] = shard.vocab_max;
        if (!(mask & s_group_mask(g)))
            continue;
        size_t an = s_a_slot_n(self, g), bn = s_b_slot_n(self, g);
        // Slots hold adapters in the base model's dtype (bf16 for a bf16 model, as PEFT runs
        // them with it): on a GPU the decode step reads every slot's A and B, so half the
        // bytes is half the time. The CPU backend stores f32 whatever is asked.
        size_t L = (size_t)s_layers(self, g);
        self->a[g] = be->buffer_new(be, cfg->torch_dtype, L * n_slots * an);
        self->b[g] = be->buffer_new(be, cfg->torch_dtype, L * n_slots * bn);
        ok = self->a[g] && self->b[g];
        if (ok) {
            self->storage = self->a[g]->storage;
            self->esize = ls_dtype_size(self->storage);
            // zero, so that slot 0 and never-filled slots hold finite values a kernel
            // that ignores the rank-0 rule would still read harmlessly
            be->buffer_zero(be, ls_view(self->a[g], 0), self->a[g]->n);
            be->buffer_zero(be, ls_view(self->b[g], 0), self->b[g]->n);
        }
    }
    if (!ok) {
        ls_lora_pool_destroy(&self);
        ls_err_set(err, errlen, "LoRA pool: out of memory for %d slots of rank %d",
                   pc->max_loras_per_batch, pc->max_lora_rank);
        return NULL;
    }
    // The arena: pages of about 1/64 of the largest image, a power of two in [64 KiB, 2 MiB].
    size_t max_bytes = s_img_n(self, s_enabled_groups(self), pc->max_lora_rank) * self->esize;
    self->page = S_PAGE_MIN;
    while (self->page < S_PAGE_MAX && self->page * 64 < max_bytes)
        self->page *= 2;
    self->max_image_pages = (int)s_pages_for(self, max_bytes / self->esize);
    size_t host = pc->host_bytes ? pc->host_bytes : ls_lora_pool_host_bytes_default(cfg, pc);
    size_t n_pages = host / self->page;
    if (n_pages < (size_t)self->max_image_pages || n_pages > INT32_MAX) {
        if (n_pages > INT32_MAX)
            ls_err_set(err, errlen, "LoRA pool: a host tier of %zu bytes is too large (pages of %zu bytes)",
                       host, self->page);
        else
            ls_err_set(err, errlen,
                       "LoRA pool: a host tier of %zu bytes cannot hold one adapter of rank %d on every "
                       "enabled target (%zu bytes)", host, pc->max_lora_rank, ls_lora_pool_image_max_bytes(self));
        ls_lora_pool_destroy(&self);
        return NULL;
    }
    if (pc->extra_vocab_size > 0 &&
        !(self->tokens = ls_lora_tokens_new(be, cfg, n_slots, pc->extra_vocab_size, err, errlen))) {
        ls_lora_pool_destroy(&self);
        return NULL;
    }
    self->n_pages = (int)n_pages;
    self->arena = be->host_alloc(be, n_pages * self->page);
    self->free_pages = malloc(n_pages * sizeof *self->free_pages);
    self->spans = malloc(((size_t)self->max_image_pages + 2) * sizeof *self->spans);
    if (!self->arena || !self->free_pages || !self->spans) {
        ls_err_set(err, errlen, "LoRA pool: out of %s host memory for a host tier of %.1f MB",
                   be->name, (double)(n_pages * self->page) / 1e6);
        ls_lora_pool_destroy(&self);
        return NULL;
    }
    for (int i = 0; i < self->n_pages; i++)  // popped from the end: page 0 first
        self->free_pages[i] = self->n_pages - 1 - i;
    self->n_free = self->n_pages;
    return self;
}

int ls_lora_pool_wait(ls_lora_pool_t *self) {
    int rc = 0;
    for (int w = 0; self->events && w < self->n_slots; w++)
        if (self->events[w] && self->be->event_sync(self->be, self->events[w]) != 0)
            rc = -1;
    if (self->tokens && ls_lora_tokens_wait(self->tokens) != 0)
        rc = -1;
    return rc;
}

// Frees entry e's id and image; an upload in flight may still read the image.
static void s_entry_clear(ls_lora_pool_t *self, s_entry_t *e) {
    if (e->img) {
        ls_lora_pool_wait(self);
        ls_lora_pool_image_destroy(self, &e->img);
    }
    free(e->id);
    *e = (s_entry_t){.slot = -1};
}

void ls_lora_pool_destroy(ls_lora_pool_t **self_p) {
    if (!self_p || !*self_p)
        return;
    ls_lora_pool_t *self = *self_p;
    ls_lora_pool_wait(self);
    for (int i = 0; self->entries && i < self->cap_entries; i++)
        s_entry_clear(self, &self->entries[i]);
    for (int g = 0; g < LS_LORA_GROUP_COUNT; g++) {
        if (self->a[g])
            self->be->buffer_free(self->be, self->a[g]);
        if (self->b[g])
            self->be->buffer_free(self->be, self->b[g]);
    }
    ls_lora_tokens_destroy(&self->tokens);
    if (self->arena)
        self->be->host_free(self->be, self->arena);
    free(self->free_pages);
    free(self->spans);
    free(self->entries);
    free(self->hash);
    free(self->slot_entry);
    free(self->ranks);
    free(self->group_ranks);
    free(self->scalings);
    free(self->targets);
    for (int w = 0; self->events && w < self->n_slots; w++)
        if (self->events[w])
            self->be->event_free(self->be, self->events[w]);
    free(self->events);
    pthread_mutex_destroy(&self->lock);
    free(self);
    *self_p = NULL;
}

bool ls_lora_pool_contains(const ls_lora_pool_t *self, const char *id) {
    return id && s_find(self, id) >= 0;
}

int ls_lora_pool_image_info(const ls_lora_pool_t *self, const char *id, int *rank, size_t *bytes) {
    int e = id ? s_find(self, id) : -1;
    if (e < 0)
        return -1;
    *rank = self->entries[e].img->rank;
    *bytes = self->entries[e].img->bytes;
    return 0;
}

int ls_lora_pool_slot_of(const ls_lora_pool_t *self, const char *id) {
    int e = id ? s_find(self, id) : -1;
    return e >= 0 ? self->entries[e].slot : -1;
}

// What the forward reads of slot w: the adapter's rank, scaling and targets, and per group
// its rank where it targets some target of the group, else 0
static void s_slot_set(ls_lora_pool_t *self, int w, int32_t rank, float scaling,
                       unsigned targets) {
    self->ranks[w] = rank;
    self->scalings[w] = scaling;
    self->targets[w] = targets;
    for (int g = 0; g < LS_LORA_GROUP_COUNT; g++) {
        bool hit = false;
        for (int i = 0; i < s_group_def[g].n; i++)
            hit |= targets >> s_group_def[g].t[i] & 1;
        self->group_ranks[(size_t)g * self->n_slots + w] = hit ? rank : 0;
    }
}

static void s_slot_free(ls_lora_pool_t *self, int w) {
    int e = self->slot_entry[w];
    if (e >= 0)
        self->entries[e].slot = -1;
    self->slot_entry[w] = -1;
    s_slot_set(self, w, 0, 0.0f, 0);
    if (self->tokens)
        ls_lora_tokens_load(self->tokens, w, NULL);
}

// Drops entry e from the host tier and its slot.
static void s_entry_drop(ls_lora_pool_t *self, int e) {
    if (self->entries[e].slot >= 0)
        s_slot_free(self, self->entries[e].slot);
    s_hash_del(self, e);
    self->n_live--;
    s_entry_clear(self, &self->entries[e]);
}

int ls_lora_pool_add(ls_lora_pool_t *self, const char *id, ls_lora_image_t **image, char *err, size_t errlen) {
    assert(image && *image);
    if (!id || !*id) {
        ls_err_set(err, errlen, "LoRA pool: empty adapter id");
        return -1;
    }
    if (s_find(self, id) >= 0) {
        ls_err_set(err, errlen, "LoRA pool: adapter \"%s\" is already loaded", id);
        return -1;
    }
    int free_e = -1;
    for (int i = 0; i < self->cap_entries && free_e < 0; i++)
        if (!self->entries[i].id)
            free_e = i;
    char *copy = strdup(id);
    if (free_e < 0 && copy) {
        int cap = self->cap_entries ? 2 * self->cap_entries : 16;
        s_entry_t *grown = realloc(self->entries, (size_t)cap * sizeof *grown);
        if (grown) {
            for (int i = self->cap_entries; i < cap; i++)
                grown[i] = (s_entry_t){.slot = -1};
            free_e = self->cap_entries;
            self->entries = grown;
            self->cap_entries = cap;
        }
    }
    if (!copy || free_e < 0 ||
        (4 * (self->hash_used + 1) > self->hash_cap && s_hash_rebuild(self) < 0)) {
        free(copy);
        ls_err_set(err, errlen, "LoRA pool: out of memory adding adapter \"%s\"", id);
        return -1;
    }
    self->entries[free_e] = (s_entry_t){.id = copy, .img = *image, .slot = -1};
    *image = NULL;
    self->n_live++;
    s_hash_put(self, free_e);
    return 0;
}

int ls_lora_pool_add_adapter(ls_lora_pool_t *self, const char *id, ls_adapter_t **adapter, char *err,
                             size_t errlen) {
    assert(adapter && *adapter);
    ls_lora_image_t *img = ls_lora_pool_image_new(self, *adapter, NULL, err, errlen);
    if (!img)
        return -1;
    if (ls_lora_pool_add(self, id, &img, err, errlen) != 0) {
        ls_lora_pool_image_destroy(self, &img);
        return -1;
    }
    ls_adapter_destroy(adapter);
    return 0;
}

int ls_lora_pool_remove(ls_lora_pool_t *self, const char *id, char *err, size_t errlen) {
    int e = id ? s_find(self, id) : -1;
    if (e < 0) {
        ls_err_set(err, errlen, "LoRA pool: adapter \"%s\" is not loaded", id ? id : "");
        return -1;
    }
    s_entry_drop(self, e);
    return 0;
}

void ls_lora_pool_clear(ls_lora_pool_t *self) {
    ls_lora_pool_wait(self);  // no upload may still read an image being freed
    for (int e = 0; e < self->cap_entries; e++)
        if (self->entries[e].id)
            s_entry_drop(self, e);
}

// The page pieces of the image's bytes [off, off + n) into self->spans; their count.
static int s_spans(ls_lora_pool_t *self, const ls_lora_image_t *img, size_t off, size_t n) {
    int k = 0;
    while (n) {
        size_t in = off % self->page, take = self->page - in < n ? self->page - in : n;
        self->spans[k++] = (ls_host_span_t){self->arena + (size_t)img->pages[off / self->page] * self->page + in, take};
        off += take;
        n -= take;
    }
    return k;
}

// Starts the load of entry e's image into slot w: per enabled group, A and B sent as the
// page pieces they span and padded to r_max by the backend (groups the adapter does not
// target zero-filled), on the upload stream; the slot's event recorded after the last.
// -1 when a copy could not be queued.
static int s_upload(ls_lora_pool_t *self, int w, const s_entry_t *e) {
    ls_backend_t *be = self->be;
    const ls_lora_image_t *img = e->img;
    int last = -1, r = img->rank, r_max = self->pc.max_lora_rank;
    for (int g = 0; g < LS_LORA_GROUP_COUNT; g++)
        last = self->a[g] ? g : last;
    for (int g = 0; g <= last; g++) {
        if (!self->a[g])
            continue;
        const ls_lora_group_shape_t *s = &self->shape[g];
        size_t an = s_a_slot_n(self, g), bn = s_b_slot_n(self, g), es = self->esize;
        size_t L = (size_t)s_layers(self, g);
        bool has = img->groups & (1u << g);
        int na = has ? s_spans(self, img, img->a_off[g] * es, s_img_a_n(self, g, r) * es) : 0;
        if (be->buffer_upload_async(be, ls_view(self->a[g], (size_t)w * an), self->n_slots * an,
                                    (size_t)r_max * s->in, self->spans, na,
                                    has ? (size_t)r * s->in : 0, (size_t)s->n_slices, L,
                                    NULL) != 0)
            return -1;
        int nb = has ? s_spans(self, img, img->b_off[g] * es, s_img_b_n(self, g, r) * es) : 0;
        if (be->buffer_upload_async(be, ls_view(self->b[g], (size_t)w * bn), self->n_slots * bn,
                                    (size_t)r_max, self->spans, nb, has ? (size_t)r : 0,
                                    (size_t)s_out_rows(self, g), L,
                                    g == last ? self->events[w] : NULL) != 0)
            return -1;
    }
    self->stats.upload_bytes += img->n * self->esize;
    return 0;
}

// Starts loading entry e into slot w, evicting whatever w held. -1 + err when the upload fails (w is
// then left empty).
static int s_slot_load(ls_lora_pool_t *self, int w, int e, char *err, size_t errlen) {
    s_entry_t *entry = &self->entries[e];
    if (self->slot_entry[w] >= 0) {
        s_slot_free(self, w);
        self->stats.slot_evictions++;
    }
    if (entry->slot >= 0)  // moving: its old slot becomes free
        s_slot_free(self, entry->slot);
    if (s_upload(self, w, entry) != 0 ||
        (self->tokens && ls_lora_tokens_load(self->tokens, w, entry->img->tokens) != 0)) {
        ls_err_set(err, errlen, "LoRA pool: starting the upload of adapter \"%s\" into slot %d failed on the %s backend",
                   entry->id, w, self->be->name);
        return -1;
    }
    self->slot_entry[w] = e;
    s_slot_set(self, w, entry->img->rank, entry->img->scaling, entry->img->targets);
    entry->slot = w;
    self->stats.cold_loads++;
    return 0;
}

int ls_lora_pool_assign(ls_lora_pool_t *self, const char *id, int slot, char *err, size_t errlen) {
    int e = s_find(self, id);
    if (e < 0) {
        ls_err_set(err, errlen, "LoRA pool: adapter \"%s\" is not loaded", id);
        return -1;
    }
    if (slot <= LS_LORA_SLOT_BASE || slot >= self->n_slots) {
        ls_err_set(err, errlen, "LoRA pool: slot %d is not an adapter slot (1..%d)", slot, self->n_slots - 1);
        return -1;
    }
    if (self->entries[e].slot == slot) {
        self->stats.hits++;
        return 0;
    }
    return s_slot_load(self, slot, e, err, errlen);
}

void ls_lora_pool_step_wait(const ls_lora_pool_t *self, const ls_lora_batch_t *lora,
                            int n_passes) {
    for (int k = 0; k < n_passes; k++)
        for (int i = 0; i < lora[k].n_segs; i++)
            self->be->event_wait(self->be, self->events[lora[k].weight_indices[i]]);
    if (self->tokens)
        ls_lora_tokens_step_wait(self->tokens, lora, n_passes);
}

int ls_lora_pool_n_slots(const ls_lora_pool_t *self) {
    return self->n_slots;
}

int ls_lora_pool_r_max(const ls_lora_pool_t *self) {
    return self->pc.max_lora_rank;
}

const int32_t *ls_lora_pool_slot_ranks(const ls_lora_pool_t *self) {
    return self->ranks;
}

const int32_t *ls_lora_pool_group_ranks(const ls_lora_pool_t *self, ls_lora_group_t g) {
    assert(g >= 0 && g < LS_LORA_GROUP_COUNT);
    return self->group_ranks + (size_t)g * self->n_slots;
}

const float *ls_lora_pool_slot_scalings(const ls_lora_pool_t *self) {
    return self->scalings;
}

const unsigned *ls_lora_pool_slot_targets(const ls_lora_pool_t *self) {
    return self->targets;
}

const ls_lora_tokens_t *ls_lora_pool_tokens(const ls_lora_pool_t *self) {
    return self->tokens;
}

bool ls_lora_pool_has_group(const ls_lora_pool_t *self, ls_lora_group_t g) {
    assert(g >= 0 && g < LS_LORA_GROUP_COUNT);
    return self->a[g] != NULL;
}

ls_lora_group_shape_t ls_lora_pool_group_shape(const ls_lora_pool_t *self,
                                               ls_lora_group_t g) {
    assert(g >= 0 && g < LS_LORA_GROUP_COUNT);
    return self->shape[g];
}

void ls_lora_pool_group_views(const ls_lora_pool_t *self, int layer, ls_lora_group_t g,
                              ls_view_t *a, ls_view_t *b) {
    assert(ls_lora_pool_has_group(self, g) && layer >= 0 && layer < s_layers(self, g));
    *a = ls_view(self->a[g], (size_t)layer * self->n_slots * s_a_slot_n(self, g));
    *b = ls_view(self->b[g], (size_t)layer * self->n_slots * s_b_slot_n(self, g));
}

ls_lora_pool_stats_t ls_lora_pool_stats(const ls_lora_pool_t *self) {
    ls_lora_pool_stats_t st = self->stats;
    ls_lora_pool_t *me = (ls_lora_pool_t *)self;  // the lock only
    pthread_mutex_lock(&me->lock);
    st.host_used = (size_t)(self->n_pages - self->n_free) * self->page;
    pthread_mutex_unlock(&me->lock);
    st.host_total = (size_t)self->n_pages * self->page;
    st.host_adapters = self->n_live;
    return st;
}
