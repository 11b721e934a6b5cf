/*  engine/lora_pool.c — see lora_pool.h.

    The host tier is an arena of equal host pages made once (host_alloc: pinned on CUDA). An
    image is a list of host pages holding one packed stream of bytes: the contents of its
    device pages in order, each page only as far as its units fill it. A load copies each
    page's stretch of the stream into the page the scheduler gave (buffer_upload_async),
    then the slot's page table. Host pages make every image fit wherever they are free (no
    fragmentation), and a host page of about 1/64 of the largest image keeps the rounding
    loss small for small adapters.

    The layout of an image: for each group it targets (in group order) and layer, the A units
    (rows: slice k, rank row j, piece q; the embedding's: chunk c, piece q) then the B units
    (chunk c, piece q). A unit that only holds zeros (a slice or module the adapter does not
    target, rows past a module's smaller rank, chunks past every module's rank) is not stored:
    its table entries point at the pool's zero region. The units go to device pages first fit,
    largest first (ties by their order above, so every rank lays out the same adapter the
    same way given the same shapes); `place` keeps each unit's page and offset, indexed as
    the table is but only up to the adapter's rank, and the table is built from it and the
    pages the scheduler gives.

    Entries (adapters in the tier) sit in an array whose indices stay stable, so slots can
    refer to them; an open-addressing hash maps ids to entries, since a worker looks up
    every item of every step and may hold thousands of adapters.

    Host pages go back only after every upload in flight (one of them may read them).
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
#define S_ZERO UINT64_MAX      // a unit that is not stored: its entries read the zero region

// One matrix of a group as the page table holds it: A rows of `len` elements, or chunks
// (8 rank columns) of `len` rows; in np pieces of `piece` elements (rows) or rows (chunks).
typedef struct {
    bool chunks;
    int len;
    int np, piece;
} s_mat_t;

struct ls_lora_image {
    int rank;              // the slot rank: the adapter's largest module rank
    unsigned targets;      // the adapter's targets (ls_adapter_info_t.target_mask)
    float scaling;         // the slot scaling: the common one, or 1 when folded into B
    unsigned groups;       // bit g: the image holds group g
    size_t place_at[LS_LORA_GROUP_COUNT];  // index of group g's first unit in place
    size_t n_place;
    uint64_t *place;       // (n_place) each unit's device page << 32 | byte offset, or S_ZERO
    int n_pages;           // device pages the units fill
    size_t *page_at;       // (n_pages + 1) where each page's contents start in the stream
    size_t n;              // stream bytes
    size_t bytes;          // host tier bytes (whole host pages)
    atomic_bool broken;    // a block could not be written (out of memory while building)
    ls_lora_tokens_image_t *tokens;  // its trainable token rows (own buffers, not pages), NULL: none
    int n_hpages;
    int32_t hpages[];      // (n_hpages) host pages, in stream order
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
    unsigned groups;                        // groups with an enabled target
    int n_slots;                            // max_loras_per_batch + 1
    ls_lora_group_shape_t shape[LS_LORA_GROUP_COUNT];
    ls_page_arena_t arena;
    size_t page_bytes;
    ls_dtype_t storage;                     // the arena's storage dtype
    size_t esize;                           // its bytes per element
    // the page tables: per slot, per enabled group and layer, A's entries then B's
    s_mat_t mat[LS_LORA_GROUP_COUNT][2];
    size_t tab_at[LS_LORA_GROUP_COUNT];     // group g's layer 0 in a slot's table
    size_t tab_stride;                      // entries per slot
    ls_buffer_t *tab;                       // (n_slots, tab_stride) device pointers, 2 F32 each
    uint64_t *tab_host;                     // (n_slots, tab_stride) host_alloc: each slot's copy
    ls_buffer_t *zero;                      // zeros, as long as the largest unit
    ls_event_t **events;                    // (n_slots) end of each slot's last load
    int32_t *owner;                         // (arena pages) slot whose adapter lies there, or -1
    int32_t *mark;                          // (arena pages) assign's duplicate check, all 0 between
    // the host tier's arena: image_new/image_destroy may run on another thread
    char *arena_h;
    size_t hpage;
    int n_hpages;
    pthread_mutex_t lock;                   // guards free_hpages / n_free
    int32_t *free_hpages;                   // (n_hpages) a stack
    int n_free;
    ls_host_span_t *spans;                  // upload scratch: the host pages of one device page
    int max_span;
    size_t max_image_bytes;                 // the largest adapter's host bytes
    int max_image_pages;                    // and its device pages
    // entries
    s_entry_t *entries;                     // (cap_entries)
    int cap_entries, n_live;
    int *hash;                              // (hash_cap) entry index, -1 empty, -2 deleted
    int hash_cap, hash_used;                // used: live + deleted
    int *slot_entry;                        // (n_slots) the entry each slot holds, -1: empty
    int32_t **slot_pages;                   // (n_slots) the pages each slot's adapter lies on
    int *slot_n_pages;
    int32_t *ranks;                         // (n_slots)
    int32_t *group_ranks;                   // (LS_LORA_GROUP_COUNT, n_slots)
    float *scalings;                        // (n_slots)
    unsigned *targets;                      // (n_slots) targets of the adapter in each slot
    ls_lora_tokens_t *tokens;               // the slots' trainable token rows, NULL: none
    ls_lora_pool_stats_t stats;
};

// L_g: the layers group g has, one for the global groups (embedding, lm_head).
static int s_layers(const ls_lora_pool_t *self, int g) {
    return g >= LS_LORA_GROUP_EMBED ? 1 : self->cfg.num_hidden_layers;
}

static unsigned s_group_mask(int g) {
    unsigned m = 0;
    for (int k = 0; k < s_group_def[g].n; k++)
        m |= 1u << s_group_def[g].t[k];
    return m;
}

static int s_chunks_of(int r) {
    return (r + 7) / 8;
}

// Table entries of matrix m of group g before pieces, for slots of rank r (r_max: the table)
static int s_mat_n(const ls_lora_pool_t *self, int g, int m, int r) {
    return self->mat[g][m].chunks ? s_chunks_of(r) : self->shape[g].n_slices * r;
}

// Entries of one layer of group g in a slot's table.
static size_t s_tab_layer(const ls_lora_pool_t *self, int g) {
    int r = self->pc.max_lora_rank;
    return (size_t)s_mat_n(self, g, 0, r) * self->mat[g][0].np +
           (size_t)s_mat_n(self, g, 1, r) * self->mat[g][1].np;
}

// Units of one layer of group g in an image of rank r (place entries).
static size_t s_img_layer(const ls_lora_pool_t *self, int g, int r) {
    return (size_t)s_mat_n(self, g, 0, r) * self->mat[g][0].np +
           (size_t)s_mat_n(self, g, 1, r) * self->mat[g][1].np;
}

// Elements (chunks: rows) of piece q of matrix mt.
static int s_piece_len(const s_mat_t *mt, int q) {
    int at = q * mt->piece;
    return mt->len - at < mt->piece ? mt->len - at : mt->piece;
}

// Bytes of a unit of piece q of matrix mt: whole 16-byte runs.
static size_t s_unit_bytes(const ls_lora_pool_t *self, const s_mat_t *mt, int q) {
    size_t n = (size_t)s_piece_len(mt, q) * (mt->chunks ? 8 : 1) * self->esize;
    return (n + 15) & ~(size_t)15;
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

// -- the layout of an image -------------------------------------------------------------------

// The module ranks an image is laid out for: mr[l * LS_TARGET_ALL + t], 0 where the adapter
// does not target t (the global targets in layer 0).
typedef struct {
    int rank;        // the largest
    unsigned groups; // groups with a module of rank > 0
    int *mr;
} s_ranks_t;

static int s_mr(const s_ranks_t *rk, int l, ls_target_t t) {
    return rk->mr[(size_t)l * LS_TARGET_ALL + t];
}

// Whether unit (matrix m, entry i, any piece) of layer l of group g holds anything: an A row
// of a slice whose module reaches that rank row, a chunk some module of the group reaches.
static bool s_unit_live(const ls_lora_pool_t *self, const s_ranks_t *rk, int g, int l, int m, int i) {
    const s_mat_t *mt = &self->mat[g][m];
    if (!mt->chunks) {  // row i = k * r + j
        int k = i / rk->rank, j = i % rk->rank;
        return s_mr(rk, l, s_group_def[g].t[k]) > j;
    }
    for (int k = 0; k < s_group_def[g].n; k++)
        if (s_mr(rk, l, s_group_def[g].t[k]) > 8 * i)
            return true;
    return false;
}

typedef struct {
    size_t at;     // index in place
    size_t bytes;
} s_unit_t;

static int s_unit_cmp(const void *a, const void *b) {
    const s_unit_t *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at;
}

// Lays an image of rk out: img->place_at, n_place, place, n_pages, page_at and n. -1 when out
// of memory.
static int s_layout(const ls_lora_pool_t *self, const s_ranks_t *rk, ls_lora_image_t *img) {
    size_t n = 0;
    for (int g = 0; g < LS_LORA_GROUP_COUNT; g++) {
        img->place_at[g] = n;
        if (rk->groups & (1u << g))
            n += (size_t)s_layers(self, g) * s_img_layer(self, g, rk->rank);
    }
    img->n_place = n;
    img->place = malloc((n ? n : 1) * sizeof *img->place);
    s_unit_t *u = malloc((n ? n : 1) * sizeof *u);
    size_t *room = malloc((n + 1) * sizeof *room);  // free bytes of each page opened
    if (!img->place || !u || !room) {
        free(u);
        free(room);
        return -1;
    }
    size_t nu = 0;
    for (int g = 0; g < LS_LORA_GROUP_COUNT; g++) {
        if (!(rk->groups & (1u << g)))
            continue;
        size_t at = img->place_at[g];
        for (int l = 0; l < s_layers(self, g); l++)
            for (int m = 0; m < 2; m++) {
                const s_mat_t *mt = &self->mat[g][m];
                for (int i = 0; i < s_mat_n(self, g, m, rk->rank); i++) {
                    bool live = s_unit_live(self, rk, g, l, m, i);
                    for (int q = 0; q < mt->np; q++, at++) {
                        img->place[at] = S_ZERO;
                        if (live)
                            u[nu++] = (s_unit_t){at, s_unit_bytes(self, mt, q)};
                    }
                }
            }
    }
    qsort(u, nu, sizeof *u, s_unit_cmp);
    int pages = 0;
    for (size_t i = 0; i < nu; i++) {
        int p = 0;
        while (p < pages && room[p] < u[i].bytes)
            p++;
        if (p == pages)
            room[pages++] = self->page_bytes;
        img->place[u[i].at] = (uint64_t)p << 32 | (self->page_bytes - room[p]);
        room[p] -= u[i].bytes;
    }
    img->n_pages = pages;
    img->page_at = malloc(((size_t)pages + 1) * sizeof *img->page_at);
    if (img->page_at) {
        img->page_at[0] = 0;
        for (int p = 0; p < pages; p++)
            img->page_at[p + 1] = img->page_at[p] + self->page_bytes - room[p];
        img->n = img->page_at[pages];
    }
    free(u);
    free(room);
    return img->page_at ? 0 : -1;
}

static void s_image_free(ls_lora_image_t *img) {
    ls_lora_tokens_image_destroy(&img->tokens);
    free(img->place);
    free(img->page_at);
    free(img);
}

// -- the host arena ---------------------------------------------------------------------------

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
    return self->max_image_bytes;
}

void ls_lora_pool_image_destroy(ls_lora_pool_t *self, ls_lora_image_t **image_p) {
    if (!image_p || !*image_p)
        return;
    ls_lora_image_t *img = *image_p;
    pthread_mutex_lock(&self->lock);
    for (int i = 0; i < img->n_hpages; i++)
        self->free_hpages[self->n_free++] = img->hpages[i];
    pthread_mutex_unlock(&self->lock);
    s_image_free(img);
    *image_p = NULL;
}

size_t ls_lora_image_bytes(const ls_lora_image_t *image) {
    return image ? image->bytes : 0;
}

int ls_lora_image_rank(const ls_lora_image_t *image) {
    return image ? image->rank : 0;
}

int ls_lora_image_pages(const ls_lora_image_t *image) {
    return image ? image->n_pages : 0;
}

// Writes bytes into an image's stream at `at`, across host pages.
static void s_put(ls_lora_pool_t *self, ls_lora_image_t *img, size_t at, const void *src, size_t bytes) {
    size_t page = self->hpage;
    while (bytes) {
        size_t in = at % page, n = page - in < bytes ? page - in : bytes;
        memcpy(self->arena_h + (size_t)img->hpages[at / page] * page + in, src, n);
        src = (const char *)src + n;
        at += n;
        bytes -= n;
    }
}

// Narrows n fp32 values to the pool's storage dtype (rounding to nearest even, as a
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

// The stream position of unit `at` of img.
static size_t s_unit_pos(const ls_lora_image_t *img, size_t at) {
    uint64_t p = img->place[at];
    return img->page_at[p >> 32] + (size_t)(p & 0xffffffffu);
}

// The values of B chunk c, rows [o0, o0 + n) of layer l of group g (n * 8 fp32 into v): the
// slices' rows of the rank's shard, columns past a module's rank and rows past the shard's
// (lm_head's up to vocab_max) zero, each module's scaling folded in unless uniform.
static void s_chunk_values(const ls_lora_pool_t *self, const ls_adapter_t *adapter, int g, int l, int c,
                           int o0, int n, bool uniform, float *v) {
    const ls_lora_group_shape_t *s = &self->shape[g];
    for (int o = o0, k = 0; o < o0 + n; o++) {
        while (k + 1 < s->n_slices && o >= s->slice_offsets[k + 1])
            k++;
        ls_target_t t = s_group_def[g].t[k];
        const ls_lora_weights_t *lw = s_weights(adapter, l, t);
        const s_window_t *win = &self->win[t];
        int ol = o - s->slice_offsets[k];
        float fold = uniform ? 1.0f : lw->scaling;
        for (int e = 0; e < 8; e++) {
            int j = 8 * c + e;
            v[(size_t)(o - o0) * 8 + e] =
                ol < win->n_out && j < lw->rank ? lw->B[(size_t)(win->out0 + ol) * lw->rank + j] * fold : 0.0f;
        }
    }
}

// The embedding's A as chunk c, vocabulary rows [o0, o0 + n): A (rank, vocab) transposed.
static void s_embed_values(const ls_lora_pool_t *self, const ls_adapter_t *adapter, int c, int o0, int n,
                           float *v) {
    const ls_lora_weights_t *lw = s_weights(adapter, 0, LS_TARGET_EMBED);
    const s_window_t *win = &self->win[LS_TARGET_EMBED];
    int in_all, out_all;
    ls_model_config_target_dims(&self->cfg, LS_TARGET_EMBED, &in_all, &out_all);
    for (int o = 0; o < n; o++)
        for (int e = 0; e < 8; e++) {
            int j = 8 * c + e;
            v[(size_t)o * 8 + e] = j < lw->rank ? lw->A[(size_t)j * in_all + win->in0 + o0 + o] : 0.0f;
        }
}

// The (group, layer) blocks of an image, built on several threads (each block has its own
// places in the stream).
typedef struct {
    ls_lora_pool_t *pool;
    ls_lora_image_t *img;
    const ls_adapter_t *adapter;
    s_ranks_t rk;
    bool uniform;
    int groups[LS_LORA_GROUP_COUNT], n_groups;
    size_t scratch;  // fp32 values of a unit's scratch
} s_build_t;

// Writes layer l of group g's stored units.
static void s_image_layer(s_build_t *b, int g, int l, float *v, void *out) {
    ls_lora_pool_t *self = b->pool;
    ls_lora_image_t *img = b->img;
    int r = img->rank;
    size_t at = img->place_at[g] + (size_t)l * s_img_layer(self, g, r);
    for (int m = 0; m < 2; m++) {
        const s_mat_t *mt = &self->mat[g][m];
        for (int i = 0; i < s_mat_n(self, g, m, r); i++)
            for (int q = 0; q < mt->np; q++, at++) {
                if (img->place[at] == S_ZERO)
                    continue;
                int e0 = q * mt->piece, n = s_piece_len(mt, q);
                size_t cnt = (size_t)n * (mt->chunks ? 8 : 1);
                if (!mt->chunks) {  // A row j of slice k: columns in0 + e0 .. of A (rank, in_all)
                    ls_target_t t = s_group_def[g].t[i / r];
                    const ls_lora_weights_t *lw = s_weights(b->adapter, l, t);
                    int in_all, out_all;
                    ls_model_config_target_dims(&self->cfg, t, &in_all, &out_all);
                    memcpy(v, lw->A + (size_t)(i % r) * in_all + self->win[t].in0 + e0, cnt * sizeof(float));
                } else if (m == 0)
                    s_embed_values(self, b->adapter, i, e0, n, v);
                else
                    s_chunk_values(self, b->adapter, g, l, i, e0, n, b->uniform, v);
                s_store(self, out, v, cnt);
                s_put(self, img, s_unit_pos(img, at), out, cnt * self->esize);
            }
    }
}

// Block i: layer i % L of the i / L-th group (a global group has its layer 0 only).
static void s_build_block(void *arg, size_t i) {
    s_build_t *b = arg;
    int L = b->pool->cfg.num_hidden_layers, g = b->groups[i / (size_t)L], l = (int)(i % (size_t)L);
    if (l >= s_layers(b->pool, g))
        return;
    float *v = malloc(b->scratch * (sizeof(float) + b->pool->esize));
    if (!v) {  // out of memory on a helper thread: the image is marked broken
        atomic_store(&b->img->broken, true);
        return;
    }
    s_image_layer(b, g, l, v, v + b->scratch);
    free(v);
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

// The groups of a target mask.
static unsigned s_groups_of(unsigned targets) {
    unsigned groups = 0;
    for (int g = 0; g < LS_LORA_GROUP_COUNT; g++)
        groups |= targets & s_group_mask(g) ? 1u << g : 0;
    return groups;
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
    int L = self->cfg.num_hidden_layers;
    s_build_t b = {.pool = self, .adapter = adapter, .uniform = true};
    b.rk = (s_ranks_t){.rank = info.max_rank, .groups = s_groups_of(info.target_mask),
                       .mr = calloc((size_t)L * LS_TARGET_ALL, sizeof(int))};
    ls_lora_image_t *img = calloc(1, sizeof *img);
    if (!b.rk.mr || !img) {
        free(b.rk.mr);
        free(img);
        ls_lora_tokens_image_destroy(&tokens);
        ls_err_set(err, errlen, "LoRA pool: out of memory");
        return NULL;
    }
    img->tokens = tokens;
    bool first = true;
    float scaling = 0.0f;
    for (int l = 0; l < L; l++)
        for (int t = 0; t < LS_TARGET_ALL; t++) {
            if (t >= LS_TARGET_COUNT && l > 0)
                break;  // the global targets: once
            const ls_lora_weights_t *w = s_weights(adapter, l, t);
            b.rk.mr[(size_t)l * LS_TARGET_ALL + t] = w->rank;
            if (w->rank == 0)
                continue;
            if (first)
                scaling = w->scaling;
            b.uniform &= first || w->scaling == scaling;
            first = false;
        }
    if (b.rk.rank == 0)
        b.rk.groups = 0;
    if (s_layout(self, &b.rk, img) != 0) {
        free(b.rk.mr);
        s_image_free(img);
        ls_err_set(err, errlen, "LoRA pool: out of memory");
        return NULL;
    }
    size_t need = (img->n + self->hpage - 1) / self->hpage;
    ls_lora_image_t *grown = realloc(img, sizeof *img + need * sizeof img->hpages[0]);
    if (!grown) {
        free(b.rk.mr);
        s_image_free(img);
        ls_err_set(err, errlen, "LoRA pool: out of memory");
        return NULL;
    }
    img = grown;
    pthread_mutex_lock(&self->lock);
    bool fits = (size_t)self->n_free >= need;
    size_t free_bytes = (size_t)self->n_free * self->hpage;
    for (size_t i = 0; fits && i < need; i++)
        img->hpages[i] = self->free_hpages[--self->n_free];
    pthread_mutex_unlock(&self->lock);
    if (!fits) {
        free(b.rk.mr);
        s_image_free(img);
        if (full)
            *full = true;
        ls_err_set(err, errlen,
                   "LoRA pool: the host tier is full: the adapter needs %.1f MB, %.1f MB of %.1f MB are free",
                   (double)(need * self->hpage) / 1e6, (double)free_bytes / 1e6,
                   (double)((size_t)self->n_hpages * self->hpage) / 1e6);
        return NULL;
    }
    img->n_hpages = (int)need;
    img->bytes = need * self->hpage;
    img->rank = info.max_rank;
    img->targets = info.target_mask;
    img->scaling = b.uniform ? scaling : 1.0f;
    img->groups = b.rk.groups;
    atomic_init(&img->broken, false);
    b.img = img;
    for (int g = 0; g < LS_LORA_GROUP_COUNT; g++) {
        if (!(img->groups & (1u << g)))
            continue;
        b.groups[b.n_groups++] = g;
        for (int m = 0; m < 2; m++) {
            size_t n = (size_t)self->mat[g][m].piece * (self->mat[g][m].chunks ? 8 : 1);
            b.scratch = n > b.scratch ? n : b.scratch;
        }
    }
    ls_par_for((size_t)b.n_groups * L, 0, s_build_block, &b);
    free(b.rk.mr);
    if (atomic_load(&img->broken)) {
        ls_lora_pool_image_destroy(self, &img);
        ls_err_set(err, errlen, "LoRA pool: out of memory building an adapter's image");
        return NULL;
    }
    return img;
}

// -- the pool ---------------------------------------------------------------------------------

// Matrix shapes and pieces for pages of the pool's size.
static void s_mats_init(ls_lora_pool_t *self) {
    size_t per_page = self->page_bytes / self->esize;  // elements
    for (int g = 0; g < LS_LORA_GROUP_COUNT; g++) {
        const ls_lora_group_shape_t *s = &self->shape[g];
        s_mat_t *a = &self->mat[g][0], *b = &self->mat[g][1];
        *a = (s_mat_t){.chunks = g == LS_LORA_GROUP_EMBED, .len = s->in};
        *b = (s_mat_t){.chunks = true, .len = s->slice_offsets[s->n_slices]};
        for (int m = 0; m < 2; m++) {
            s_mat_t *mt = &self->mat[g][m];
            // a piece of a row: whole 8-element runs (16-byte aligned); of a chunk: rows
            size_t most = mt->chunks ? per_page / 8 : per_page / 8 * 8;
            mt->piece = (size_t)mt->len <= most ? mt->len : (int)most;
            if (mt->piece < 1)
                mt->piece = 1;
            mt->np = (mt->len + mt->piece - 1) / mt->piece;
        }
    }
}

// The image of an adapter of rank max_lora_rank on every enabled target: its host bytes
// (whole host pages) and its device pages. -1 when out of memory.
static int s_max_image(ls_lora_pool_t *self) {
    int L = self->cfg.num_hidden_layers;
    s_ranks_t rk = {.rank = self->pc.max_lora_rank, .groups = self->groups,
                    .mr = malloc((size_t)L * LS_TARGET_ALL * sizeof(int))};
    ls_lora_image_t *img = calloc(1, sizeof *img);
    int rc = -1;
    if (rk.mr && img) {
        for (int i = 0; i < L * LS_TARGET_ALL; i++)
            rk.mr[i] = self->enabled & (1u << (i % LS_TARGET_ALL)) ? rk.rank : 0;
        rc = s_layout(self, &rk, img);
        self->max_image_bytes = rc == 0 ? (img->n + self->hpage - 1) / self->hpage * self->hpage : 0;
        self->max_image_pages = rc == 0 ? img->n_pages : 0;
    }
    free(rk.mr);
    if (img)
        s_image_free(img);
    return rc;
}

// Writes slot w's host table: every entry at the zero region, then the image's units on
// pages (NULL image: an empty slot).
static void s_table_fill(ls_lora_pool_t *self, int w, const ls_lora_image_t *img, const int32_t *pages) {
    uint64_t *tab = self->tab_host + (size_t)w * self->tab_stride;
    uint64_t zero = (uint64_t)(uintptr_t)self->zero->data;
    uint64_t base = (uint64_t)(uintptr_t)self->arena.buf->data;
    for (size_t i = 0; i < self->tab_stride; i++)
        tab[i] = zero;
    for (int g = 0; img && g < LS_LORA_GROUP_COUNT; g++) {
        if (!(img->groups & (1u << g)))
            continue;
        int r = img->rank, r_max = self->pc.max_lora_rank;
        size_t at = img->place_at[g];
        for (int l = 0; l < s_layers(self, g); l++) {
            size_t t0 = self->tab_at[g] + (size_t)l * s_tab_layer(self, g);
            for (int m = 0; m < 2; m++) {
                const s_mat_t *mt = &self->mat[g][m];
                if (m == 1)
                    t0 += (size_t)s_mat_n(self, g, 0, r_max) * self->mat[g][0].np;
                for (int i = 0; i < s_mat_n(self, g, m, r); i++) {
                    // the table's entry of image entry i: row k*r + j is k*r_max + j
                    size_t ti = mt->chunks ? (size_t)i : (size_t)(i / r) * r_max + (size_t)(i % r);
                    for (int q = 0; q < mt->np; q++, at++) {
                        uint64_t p = img->place[at];
                        if (p != S_ZERO)
                            tab[t0 + ti * mt->np + q] =
                                base + ((uint64_t)pages[p >> 32] * self->arena.page_n * self->esize +
                                        (p & 0xffffffffu));
                    }
                }
            }
        }
    }
}

// Starts the upload of slot w's host table; records ev after it (NULL: none). -1 when the copy
// cannot be queued.
static int s_table_upload(ls_lora_pool_t *self, int w, ls_event_t *ev) {
    size_t n = 2 * self->tab_stride;  // F32 elements
    ls_host_span_t span = {self->tab_host + (size_t)w * self->tab_stride, self->tab_stride * sizeof(uint64_t)};
    return self->be->buffer_upload_async(self->be, ls_view(self->tab, (size_t)w * n), n, n, &span, 1, n, 1, 1, ev);
}

// A pool's settings, shapes and page tables' layout (no memory but the struct): the part
// ls_lora_pool_max_pages needs too. NULL + err on bad settings.
static ls_lora_pool_t *s_pool_shape(const ls_model_config_t *cfg, const ls_lora_pool_config_t *pc,
                                    size_t page_bytes, ls_dtype_t storage, char *err, size_t errlen) {
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
    size_t esize = ls_dtype_size(storage);
    if (page_bytes % 16 || page_bytes < 8 * esize) {  // a piece: 8 elements of a row, a row of a chunk
        ls_err_set(err, errlen, "LoRA pool: pages of %zu bytes: need a multiple of 16 bytes of at least 8 elements",
                   page_bytes);
        return NULL;
    }
    ls_lora_pool_t *self = calloc(1, sizeof *self);
    if (!self) {
        ls_err_set(err, errlen, "LoRA pool: out of memory");
        return NULL;
    }
    pthread_mutex_init(&self->lock, NULL);
    self->cfg = *cfg;
    self->pc = *pc;
    self->enabled = mask;
    self->storage = storage;
    self->esize = esize;
    self->page_bytes = page_bytes;
    self->hpage = S_PAGE_MIN;
    for (int t = 0; t < LS_TARGET_ALL; t++) {
        s_window_t *w = &self->win[t];
        ls_tp_target_window(cfg, &shard, (ls_target_t)t, &w->out0, &w->n_out, &w->in0, &w->n_in);
    }
    for (int g = 0; g < LS_LORA_GROUP_COUNT; g++) {
        ls_lora_group_shape_t *s = &self->shape[g];
        s->n_slices = s_group_def[g].n;
        for (int k = 0; k < s->n_slices; k++) {
            const s_window_t *w = &self->win[s_group_def[g].t[k]];
            s->in = w->n_in;
            s->slice_offsets[k + 1] = s->slice_offsets[k] + w->n_out;
        }
        if (g == LS_LORA_GROUP_LM_HEAD)  // the rank's logits rows are vocab_max wide
            s->slice_offsets[1] = shard.vocab_max;
        self->groups |= mask & s_group_mask(g) ? 1u << g : 0;
    }
    s_mats_init(self);
    for (int g = 0; g < LS_LORA_GROUP_COUNT; g++) {
        self->tab_at[g] = self->tab_stride;
        if (self->groups & (1u << g))
            self->tab_stride += (size_t)s_layers(self, g) * s_tab_layer(self, g);
    }
    return self;
}

int ls_lora_pool_max_pages(const ls_model_config_t *cfg, const ls_lora_pool_config_t *pc, size_t page_bytes,
                           ls_dtype_t storage, char *err, size_t errlen) {
    ls_lora_pool_t *self = s_pool_shape(cfg, pc, page_bytes, storage, err, errlen);
    if (!self)
        return -1;
    int rc = s_max_image(self);
    if (rc != 0)
        ls_err_set(err, errlen, "LoRA pool: out of memory");
    rc = rc == 0 ? self->max_image_pages : -1;
    ls_lora_pool_destroy(&self);
    return rc;
}

ls_lora_pool_t *ls_lora_pool_new(ls_backend_t *be, const ls_model_config_t *cfg,
                                 const ls_lora_pool_config_t *pc, const ls_page_arena_t *arena,
                                 char *err, size_t errlen) {
    if (!arena->buf || arena->n_pages < 1 || (size_t)arena->n_pages * arena->page_n > arena->buf->n) {
        ls_err_set(err, errlen, "LoRA pool: the page arena holds no page (%d pages of %zu elements)",
                   arena->n_pages, arena->page_n);
        return NULL;
    }
    ls_dtype_t storage = arena->buf->storage;
    ls_lora_pool_t *self = s_pool_shape(cfg, pc, arena->page_n * ls_dtype_size(storage), storage, err, errlen);
    if (!self)
        return NULL;
    self->be = be;
    self->arena = *arena;
    size_t zero_n = 0;
    for (int g = 0; g < LS_LORA_GROUP_COUNT; g++)
        for (int m = 0; m < 2; m++)
            if (self->groups & (1u << g)) {
                size_t n = s_unit_bytes(self, &self->mat[g][m], 0) / self->esize;
                zero_n = n > zero_n ? n : zero_n;
            }
    self->n_slots = pc->max_loras_per_batch + 1;
    int n_slots = self->n_slots;
    self->slot_entry = calloc((size_t)n_slots, sizeof *self->slot_entry);
    self->slot_pages = calloc((size_t)n_slots, sizeof *self->slot_pages);
    self->slot_n_pages = calloc((size_t)n_slots, sizeof *self->slot_n_pages);
    self->ranks = calloc((size_t)n_slots, sizeof *self->ranks);
    self->group_ranks = calloc((size_t)LS_LORA_GROUP_COUNT * n_slots, sizeof *self->group_ranks);
    self->scalings = calloc((size_t)n_slots, sizeof *self->scalings);
    self->targets = calloc((size_t)n_slots, sizeof *self->targets);
    self->events = calloc((size_t)n_slots, sizeof *self->events);
    self->owner = malloc((size_t)arena->n_pages * sizeof *self->owner);
    self->mark = calloc((size_t)arena->n_pages, sizeof *self->mark);
    self->tab_host = be->host_alloc(be, (size_t)n_slots * (self->tab_stride ? self->tab_stride : 1) * sizeof(uint64_t));
    self->tab = be->buffer_new(be, LS_DTYPE_F32, 2 * (size_t)n_slots * (self->tab_stride ? self->tab_stride : 1));
    self->zero = be->buffer_new(be, self->storage, zero_n ? zero_n : 1);
    bool ok = self->slot_entry && self->slot_pages && self->slot_n_pages && self->ranks && self->group_ranks && self->scalings &&
              self->targets && self->events && self->owner && self->mark && self->tab_host && self->tab &&
              self->zero && s_hash_rebuild(self) == 0;
    for (int w = 0; ok && w < n_slots; w++)
        ok = (self->events[w] = be->event_new(be)) != NULL;
    for (int w = 0; ok && w < n_slots; w++)
        self->slot_entry[w] = -1;
    for (int p = 0; ok && p < arena->n_pages; p++)
        self->owner[p] = -1;
    if (ok) {
        be->buffer_zero(be, ls_view(self->zero, 0), self->zero->n);
        for (int w = 0; w < n_slots; w++)
            s_table_fill(self, w, NULL, NULL);
        // one upload of every slot's table (they lie back to back), done before an assign
        // rewrites a slot's host copy
        size_t n = 2 * (size_t)n_slots * self->tab_stride;
        ls_host_span_t span = {self->tab_host, (size_t)n_slots * self->tab_stride * sizeof(uint64_t)};
        ok = be->buffer_upload_async(be, ls_view(self->tab, 0), n, n, &span, 1, n, 1, 1, self->events[0]) == 0 &&
             be->event_sync(be, self->events[0]) == 0;
    }
    if (!ok) {
        ls_lora_pool_destroy(&self);
        ls_err_set(err, errlen, "LoRA pool: out of memory for the page tables of %d slots of rank %d",
                   pc->max_loras_per_batch, pc->max_lora_rank);
        return NULL;
    }
    // The host arena: pages of about 1/64 of the largest image, a power of two in [64 KiB, 2 MiB].
    if (s_max_image(self) != 0) {
        ls_lora_pool_destroy(&self);
        ls_err_set(err, errlen, "LoRA pool: out of memory");
        return NULL;
    }
    while (self->hpage < S_PAGE_MAX && self->hpage * 64 < self->max_image_bytes)
        self->hpage *= 2;
    s_max_image(self);  // whole pages of the size chosen
    size_t host = pc->host_bytes ? pc->host_bytes : ls_lora_pool_host_bytes_default(cfg, pc);
    size_t n_hpages = host / self->hpage;
    if (n_hpages < self->max_image_bytes / self->hpage || n_hpages > INT32_MAX) {
        if (n_hpages > INT32_MAX)
            ls_err_set(err, errlen, "LoRA pool: a host tier of %zu bytes is too large (pages of %zu bytes)",
                       host, self->hpage);
        else
            ls_err_set(err, errlen,
                       "LoRA pool: a host tier of %zu bytes cannot hold one adapter of rank %d on every "
                       "enabled target (%zu bytes)", host, pc->max_lora_rank, self->max_image_bytes);
        ls_lora_pool_destroy(&self);
        return NULL;
    }
    if (pc->extra_vocab_size > 0 &&
        !(self->tokens = ls_lora_tokens_new(be, cfg, n_slots, pc->extra_vocab_size, err, errlen))) {
        ls_lora_pool_destroy(&self);
        return NULL;
    }
    self->n_hpages = (int)n_hpages;
    self->arena_h = be->host_alloc(be, n_hpages * self->hpage);
    self->free_hpages = malloc(n_hpages * sizeof *self->free_hpages);
    // a device page's stretch of the stream spans at most this many host pieces
    self->max_span = (int)((self->page_bytes + self->hpage - 1) / self->hpage) + 1;
    self->spans = malloc((size_t)self->max_span * sizeof *self->spans);
    if (!self->arena_h || !self->free_hpages || !self->spans) {
        ls_err_set(err, errlen, "LoRA pool: out of %s host memory for a host tier of %.1f MB",
                   be->name, (double)(n_hpages * self->hpage) / 1e6);
        ls_lora_pool_destroy(&self);
        return NULL;
    }
    for (int i = 0; i < self->n_hpages; i++)  // popped from the end: page 0 first
        self->free_hpages[i] = self->n_hpages - 1 - i;
    self->n_free = self->n_hpages;
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
    ls_backend_t *be = self->be;  // NULL: a pool of shapes only (s_pool_shape)
    if (self->tab)
        be->buffer_free(be, self->tab);
    if (self->zero)
        be->buffer_free(be, self->zero);
    if (self->tab_host)
        be->host_free(be, self->tab_host);
    ls_lora_tokens_destroy(&self->tokens);
    if (self->arena_h)
        be->host_free(be, self->arena_h);
    free(self->free_hpages);
    free(self->spans);
    free(self->entries);
    free(self->hash);
    free(self->slot_entry);
    for (int w = 0; self->slot_pages && w < self->n_slots; w++)
        free(self->slot_pages[w]);
    free(self->slot_pages);
    free(self->slot_n_pages);
    free(self->ranks);
    free(self->group_ranks);
    free(self->scalings);
    free(self->targets);
    free(self->owner);
    free(self->mark);
    for (int w = 0; self->events && w < self->n_slots; w++)
        if (self->events[w])
            be->event_free(be, self->events[w]);
    free(self->events);
    pthread_mutex_destroy(&self->lock);
    free(self);
    *self_p = NULL;
}

bool ls_lora_pool_contains(const ls_lora_pool_t *self, const char *id) {
    return id && s_find(self, id) >= 0;
}

int ls_lora_pool_image_info(const ls_lora_pool_t *self, const char *id, int *rank, size_t *bytes,
                            int *pages) {
    int e = id ? s_find(self, id) : -1;
    if (e < 0)
        return -1;
    *rank = self->entries[e].img->rank;
    *bytes = self->entries[e].img->bytes;
    *pages = self->entries[e].img->n_pages;
    return 0;
}

int ls_lora_pool_slot_of(const ls_lora_pool_t *self, const char *id) {
    int e = id ? s_find(self, id) : -1;
    return e >= 0 ? self->entries[e].slot : -1;
}

// What the forward reads of slot w: the adapter's rank, scaling and targets, and per group
// its rank where it targets some target of the group, else 0 (its table points untargeted
// rows at the zero region, which the forward then does not read)
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

// Empties slot w: its adapter (if any) leaves it, its pages are no longer its own, and the
// ops queued next wait for its last load (which may still write those pages). The device
// table keeps the old entries until the slot is assigned again: no step reads a slot of rank 0.
static void s_slot_free(ls_lora_pool_t *self, int w) {
    int e = self->slot_entry[w];
    if (e >= 0)
        self->entries[e].slot = -1;
    self->be->event_wait(self->be, self->events[w]);
    for (int i = 0; i < self->slot_n_pages[w]; i++)
        if (self->owner[self->slot_pages[w][i]] == w)
            self->owner[self->slot_pages[w][i]] = -1;
    free(self->slot_pages[w]);
    self->slot_pages[w] = NULL;
    self->slot_n_pages[w] = 0;
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

// The host pieces of the image's stream bytes [off, off + n) into self->spans; their count.
static int s_spans(ls_lora_pool_t *self, const ls_lora_image_t *img, size_t off, size_t n) {
    int k = 0;
    while (n) {
        size_t in = off % self->hpage, take = self->hpage - in < n ? self->hpage - in : n;
        assert(k < self->max_span);
        self->spans[k++] = (ls_host_span_t){self->arena_h + (size_t)img->hpages[off / self->hpage] * self->hpage + in,
                                            take};
        off += take;
        n -= take;
    }
    return k;
}

// Starts the load of entry e's image into slot w on pages: each device page's contents from
// the stream, then the slot's table, on the upload stream; the slot's event recorded after
// the last. -1 when a copy could not be queued.
static int s_upload(ls_lora_pool_t *self, int w, const s_entry_t *e, const int32_t *pages) {
    ls_backend_t *be = self->be;
    const ls_lora_image_t *img = e->img;
    for (int p = 0; p < img->n_pages; p++) {
        size_t bytes = img->page_at[p + 1] - img->page_at[p], n = bytes / self->esize;
        int k = s_spans(self, img, img->page_at[p], bytes);
        if (be->buffer_upload_async(be, ls_view(self->arena.buf, (size_t)pages[p] * self->arena.page_n), n, n,
                                    self->spans, k, n, 1, 1, NULL) != 0)
            return -1;
    }
    be->event_sync(be, self->events[w]);  // the slot's previous table upload read tab_host
    s_table_fill(self, w, img, pages);
    if (s_table_upload(self, w, self->events[w]) != 0)
        return -1;
    if (self->tokens && ls_lora_tokens_load(self->tokens, w, img->tokens) != 0)
        return -1;
    self->stats.upload_bytes += img->n;
    return 0;
}

// Whether pages (n of them) are a valid list for an adapter of `need` pages: enough of them,
// inside the arena, none twice.
static bool s_pages_ok(ls_lora_pool_t *self, const int32_t *pages, int n, int need, char *err, size_t errlen) {
    if (n < need) {
        ls_err_set(err, errlen, "LoRA pool: the adapter takes %d pages, %d given", need, n);
        return false;
    }
    bool ok = true;
    int i = 0;
    for (; ok && i < n; i++) {
        ok = pages[i] >= 0 && pages[i] < self->arena.n_pages && !self->mark[pages[i]];
        if (ok)
            self->mark[pages[i]] = 1;
    }
    if (!ok)
        ls_err_set(err, errlen, "LoRA pool: page %d is %s", pages[i - 1],
                   pages[i - 1] < 0 || pages[i - 1] >= self->arena.n_pages ? "outside the arena" : "named twice");
    for (int k = 0; k < i - (ok ? 0 : 1); k++)
        self->mark[pages[k]] = 0;
    return ok;
}

int ls_lora_pool_assign(ls_lora_pool_t *self, const char *id, int slot, const int32_t *pages,
                        int n_pages, char *err, size_t errlen) {
    int e = s_find(self, id);
    if (e < 0) {
        ls_err_set(err, errlen, "LoRA pool: adapter \"%s\" is not loaded", id);
        return -1;
    }
    if (slot <= LS_LORA_SLOT_BASE || slot >= self->n_slots) {
        ls_err_set(err, errlen, "LoRA pool: slot %d is not an adapter slot (1..%d)", slot, self->n_slots - 1);
        return -1;
    }
    s_entry_t *entry = &self->entries[e];
    int need = entry->img->n_pages;
    if (!s_pages_ok(self, pages, n_pages, need, err, errlen))
        return -1;
    if (entry->slot == slot && self->slot_n_pages[slot] == need &&
        !memcmp(self->slot_pages[slot], pages, (size_t)need * sizeof *pages)) {
        self->stats.hits++;
        return 0;
    }
    int32_t *copy = malloc(((size_t)need ? (size_t)need : 1) * sizeof *copy);
    if (!copy) {
        ls_err_set(err, errlen, "LoRA pool: out of memory");
        return -1;
    }
    memcpy(copy, pages, (size_t)need * sizeof *pages);
    if (self->slot_entry[slot] >= 0)
        self->stats.slot_evictions++;
    s_slot_free(self, slot);
    if (entry->slot >= 0)  // moving: its old slot becomes free
        s_slot_free(self, entry->slot);
    ls_lora_pool_claim(self, copy, need);  // adapters whose pages these were lose them
    if (s_upload(self, slot, entry, copy) != 0) {
        free(copy);
        ls_err_set(err, errlen, "LoRA pool: starting the upload of adapter \"%s\" into slot %d failed on the %s backend",
                   entry->id, slot, self->be->name);
        return -1;
    }
    self->slot_entry[slot] = e;
    self->slot_pages[slot] = copy;
    self->slot_n_pages[slot] = need;
    for (int i = 0; i < need; i++)
        self->owner[copy[i]] = slot;
    s_slot_set(self, slot, entry->img->rank, entry->img->scaling, entry->img->targets);
    entry->slot = slot;
    self->stats.cold_loads++;
    return 0;
}

void ls_lora_pool_claim(ls_lora_pool_t *self, const int32_t *pages, int n) {
    for (int i = 0; i < n; i++)
        if (pages[i] >= 0 && pages[i] < self->arena.n_pages && self->owner[pages[i]] >= 0)
            s_slot_free(self, self->owner[pages[i]]);
}

void ls_lora_pool_slot_clear(ls_lora_pool_t *self, int slot) {
    assert(slot > LS_LORA_SLOT_BASE && slot < self->n_slots);
    s_slot_free(self, slot);
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

ls_dtype_t ls_lora_pool_dtype(const ls_lora_pool_t *self) {
    return self->storage;
}

ls_page_arena_t ls_lora_pool_arena(const ls_lora_pool_t *self) {
    return self->arena;
}

int ls_lora_pool_image_max_pages(const ls_lora_pool_t *self) {
    return self->max_image_pages;
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
    return (self->groups & (1u << g)) != 0;
}

ls_lora_group_shape_t ls_lora_pool_group_shape(const ls_lora_pool_t *self,
                                               ls_lora_group_t g) {
    assert(g >= 0 && g < LS_LORA_GROUP_COUNT);
    return self->shape[g];
}

void ls_lora_pool_mats(const ls_lora_pool_t *self, int layer, ls_lora_group_t g, ls_lora_mat_t *a,
                       ls_lora_mat_t *b) {
    assert(ls_lora_pool_has_group(self, g) && layer >= 0 && layer < s_layers(self, g));
    size_t at = self->tab_at[g] + (size_t)layer * s_tab_layer(self, g);
    const s_mat_t *ma = &self->mat[g][0], *mb = &self->mat[g][1];
    *a = (ls_lora_mat_t){ls_view(self->tab, 2 * at), self->tab_stride, ma->np, ma->piece, self->storage};
    at += (size_t)s_mat_n(self, g, 0, self->pc.max_lora_rank) * ma->np;
    *b = (ls_lora_mat_t){ls_view(self->tab, 2 * at), self->tab_stride, mb->np, mb->piece, self->storage};
}

ls_lora_pool_stats_t ls_lora_pool_stats(const ls_lora_pool_t *self) {
    ls_lora_pool_stats_t st = self->stats;
    ls_lora_pool_t *me = (ls_lora_pool_t *)self;  // the lock only
    pthread_mutex_lock(&me->lock);
    st.host_used = (size_t)(self->n_hpages - self->n_free) * self->hpage;
    pthread_mutex_unlock(&me->lock);
    st.host_total = (size_t)self->n_hpages * self->hpage;
    st.host_adapters = self->n_live;
    return st;
}
