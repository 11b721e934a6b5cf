/*  engine/lora_pool.c — see lora_pool.h.

    The CPU tier is a fixed array of max_loaded_loras entries (a NULL id marks a free one),
    so entry indices stay stable and slots can refer to them. Lookups are linear scans:
    a prepare looks up each distinct id of the batch once (repeats hit the short list of the
    batch's distinct entries first), which stays cheap for the few thousand adapters a
    worker holds; a hash would be the next step past that.

    Time is a tick counter bumped by every add and prepare: LRU compares the tick of last
    use, FIFO the tick of loading (into the slot, or into the CPU tier).

    The CPU tier stores each adapter as its slot image: for every enabled group, A then B,
    each (L, slot block) in the slots' storage dtype with the r_max padding, the folded
    scalings and the rank's shard already applied, in host_alloc (pinned) memory. A slot load
    is then one strided copy per group and A/B (8 with all targets; the slot's block of
    layer l sits l * n_slots blocks into the buffer) on the backend's upload stream, and the
    slot's event records its end. The forward waits on the events of the slots its step
    reads (ls_lora_pool_step_wait), nothing else, so a load into another slot overlaps it.
    Host copies are freed only after every upload in flight (one of them may read it).

    Known limit: the slot image holds the whole r_max-padded A and B blocks (zeros past the
    adapter's rank included), so an adapter of rank r costs r_max/r times its own bytes in
    host memory and on the bus; a 3-D copy could send only the used rows and columns.
*/
#include "lora_pool.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ls_err.h"

// Which targets each group stacks, as slices in this order.
static const struct {
    int n;
    ls_target_t t[LS_LORA_MAX_SLICES];
} s_group_def[LS_LORA_GROUP_COUNT] = {
    [LS_LORA_GROUP_QKV] = {3, {LS_TARGET_Q, LS_TARGET_K, LS_TARGET_V}},
    [LS_LORA_GROUP_O] = {1, {LS_TARGET_O}},
    [LS_LORA_GROUP_GATE_UP] = {2, {LS_TARGET_GATE, LS_TARGET_UP}},
    [LS_LORA_GROUP_DOWN] = {1, {LS_TARGET_DOWN}},
};

#define S_ALL_TARGETS ((1u << LS_TARGET_COUNT) - 1)

typedef struct {
    char *id;              // NULL: free entry
    void *host;            // slot image (host_n elements of the slots' storage dtype)
    bool pinned;
    int rank;              // the slot rank: the adapter's largest module rank
    float scaling;         // the slot scaling: the common one, or 1 when folded into B
    int slot;              // -1 when not resident
    uint64_t added, used;  // ticks
} s_entry_t;

typedef struct {
    int entry;             // -1: free
    uint64_t loaded, used; // ticks
} s_slot_t;

// The part of a target's (out, in) weight the pool's shard holds (ls_tp_target_window).
typedef struct {
    int out0, n_out, in0, n_in;
} s_window_t;

struct ls_lora_pool {
    ls_backend_t *be;
    ls_model_config_t cfg;
    ls_lora_pool_config_t pc;
    s_window_t win[LS_TARGET_COUNT];
    unsigned enabled;                       // target mask
    int n_slots;                            // max_loras_per_batch + 1
    ls_lora_group_shape_t shape[LS_LORA_GROUP_COUNT];
    ls_buffer_t *a[LS_LORA_GROUP_COUNT];    // (L, n_slots, n_slices*r_max, in), NULL: off
    ls_buffer_t *b[LS_LORA_GROUP_COUNT];    // (L, n_slots, out_total, r_max)
    size_t host_a[LS_LORA_GROUP_COUNT];     // element offsets of A (L, a block) and
    size_t host_b[LS_LORA_GROUP_COUNT];     // B (L, b block) in a slot image
    size_t host_n;                          // elements of a slot image
    ls_dtype_t storage;                     // the slots' storage dtype (the backend's)
    size_t esize;                           // its bytes per element
    ls_event_t **events;                    // (n_slots) end of each slot's last load
    s_entry_t *entries;                     // (max_loaded_loras)
    s_slot_t *slots;                        // (n_slots)
    int32_t *ranks;                         // (n_slots)
    float *scalings;                        // (n_slots)
    int *cur;                               // entries of the batch last prepared
    int n_cur;
    int *next;                              // scratch for the batch being prepared
    float *stage_a, *stage_b;               // one slot of the largest group's A and B
    uint64_t tick;
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

static unsigned s_group_mask(int g) {
    unsigned m = 0;
    for (int k = 0; k < s_group_def[g].n; k++)
        m |= 1u << s_group_def[g].t[k];
    return m;
}

static bool s_in(const int *list, int n, int x) {
    for (int i = 0; i < n; i++)
        if (list[i] == x)
            return true;
    return false;
}

ls_lora_pool_t *ls_lora_pool_new(ls_backend_t *be, const ls_model_config_t *cfg,
                                 const ls_lora_pool_config_t *pc, char *err, size_t errlen) {
    unsigned mask = pc->target_mask ? pc->target_mask : S_ALL_TARGETS;
    ls_tp_shard_t shard;
    if (ls_model_config_shard(cfg, pc->tp_size > 1 ? pc->tp_rank : 0,
                              pc->tp_size > 1 ? pc->tp_size : 1, &shard, err, errlen) != 0)
        return NULL;
    if (pc->max_loras_per_batch < 1 || pc->max_lora_rank < 1 ||
        pc->max_loaded_loras < pc->max_loras_per_batch || (mask & ~S_ALL_TARGETS)) {
        ls_err_set(err, errlen,
                   "LoRA pool: need max_loras_per_batch >= 1 (got %d), max_lora_rank >= 1 "
                   "(got %d), max_loaded_loras >= max_loras_per_batch (got %d) and target "
                   "bits within the seven targets (got 0x%x)",
                   pc->max_loras_per_batch, pc->max_lora_rank, pc->max_loaded_loras,
                   pc->target_mask);
        return NULL;
    }
    ls_lora_pool_t *self = calloc(1, sizeof *self);
    if (!self) {
        ls_err_set(err, errlen, "LoRA pool: out of memory");
        return NULL;
    }
    self->be = be;
    self->cfg = *cfg;
    self->pc = *pc;
    self->enabled = mask;
    for (int t = 0; t < LS_TARGET_COUNT; t++) {
        s_window_t *w = &self->win[t];
        ls_tp_target_window(cfg, &shard, (ls_target_t)t, &w->out0, &w->n_out, &w->in0, &w->n_in);
    }
    self->n_slots = pc->max_loras_per_batch + 1;
    int n_slots = self->n_slots, L = cfg->num_hidden_layers;
    self->entries = calloc((size_t)pc->max_loaded_loras, sizeof *self->entries);
    self->slots = calloc((size_t)n_slots, sizeof *self->slots);
    self->ranks = calloc((size_t)n_slots, sizeof *self->ranks);
    self->scalings = calloc((size_t)n_slots, sizeof *self->scalings);
    self->cur = calloc((size_t)n_slots, sizeof *self->cur);
    self->next = calloc((size_t)n_slots, sizeof *self->next);
    self->events = calloc((size_t)n_slots, sizeof *self->events);
    bool ok = self->entries && self->slots && self->ranks && self->scalings && self->cur &&
              self->next && self->events;
    for (int w = 0; ok && w < n_slots; w++)
        ok = (self->events[w] = be->event_new(be)) != NULL;
    for (int i = 0; ok && i < pc->max_loaded_loras; i++)
        self->entries[i].slot = -1;
    for (int w = 0; ok && w < n_slots; w++)
        self->slots[w].entry = -1;

    size_t stage_a = 0, stage_b = 0;
    for (int g = 0; ok && g < LS_LORA_GROUP_COUNT; g++) {
        ls_lora_group_shape_t *s = &self->shape[g];
        s->n_slices = s_group_def[g].n;
        for (int k = 0; k < s->n_slices; k++) {
            const s_window_t *w = &self->win[s_group_def[g].t[k]];
            s->in = w->n_in;
            s->slice_offsets[k + 1] = s->slice_offsets[k] + w->n_out;
        }
        if (!(mask & s_group_mask(g)))
            continue;
        size_t an = s_a_slot_n(self, g), bn = s_b_slot_n(self, g);
        stage_a = an > stage_a ? an : stage_a;
        stage_b = bn > stage_b ? bn : stage_b;
        // Slots hold adapters in the base model's dtype (bf16 for a bf16 model, as PEFT runs
        // them with it): on a GPU the decode step reads every slot's A and B, so half the
        // bytes is half the time. The CPU backend stores f32 whatever is asked.
        self->a[g] = be->buffer_new(be, cfg->torch_dtype, (size_t)L * n_slots * an);
        self->b[g] = be->buffer_new(be, cfg->torch_dtype, (size_t)L * n_slots * bn);
        ok = self->a[g] && self->b[g];
        if (ok) {
            self->storage = self->a[g]->storage;
            self->esize = ls_dtype_size(self->storage);
            self->host_a[g] = self->host_n;
            self->host_b[g] = self->host_a[g] + (size_t)L * an;
            self->host_n = self->host_b[g] + (size_t)L * bn;
            // zero, so that slot 0 and never-filled slots hold finite values a kernel
            // that ignores the rank-0 rule would still read harmlessly
            be->buffer_zero(be, ls_view(self->a[g], 0), self->a[g]->n);
            be->buffer_zero(be, ls_view(self->b[g], 0), self->b[g]->n);
        }
    }
    if (ok) {
        self->stage_a = malloc(stage_a * sizeof(float));
        self->stage_b = malloc(stage_b * sizeof(float));
        ok = self->stage_a && self->stage_b;
    }
    if (!ok) {
        ls_lora_pool_destroy(&self);
        ls_err_set(err, errlen, "LoRA pool: out of memory for %d slots of rank %d",
                   pc->max_loras_per_batch, pc->max_lora_rank);
    }
    return self;
}

int ls_lora_pool_wait(ls_lora_pool_t *self) {
    int rc = 0;
    for (int w = 0; self->events && w < self->n_slots; w++)
        if (self->events[w] && self->be->event_sync(self->be, self->events[w]) != 0)
            rc = -1;
    return rc;
}

// Frees entry e's id and host copy; an upload in flight may still read the copy.
static void s_entry_clear(ls_lora_pool_t *self, s_entry_t *e) {
    if (e->host) {
        ls_lora_pool_wait(self);
        self->be->host_free(self->be, e->host);
    }
    free(e->id);
    *e = (s_entry_t){.slot = -1};
}

void ls_lora_pool_destroy(ls_lora_pool_t **self_p) {
    if (!self_p || !*self_p)
        return;
    ls_lora_pool_t *self = *self_p;
    ls_lora_pool_wait(self);
    for (int i = 0; self->entries && i < self->pc.max_loaded_loras; i++)
        s_entry_clear(self, &self->entries[i]);
    for (int g = 0; g < LS_LORA_GROUP_COUNT; g++) {
        if (self->a[g])
            self->be->buffer_free(self->be, self->a[g]);
        if (self->b[g])
            self->be->buffer_free(self->be, self->b[g]);
    }
    free(self->entries);
    free(self->slots);
    free(self->ranks);
    free(self->scalings);
    free(self->cur);
    free(self->next);
    for (int w = 0; self->events && w < self->n_slots; w++)
        if (self->events[w])
            self->be->event_free(self->be, self->events[w]);
    free(self->events);
    free(self->stage_a);
    free(self->stage_b);
    free(self);
    *self_p = NULL;
}

static int s_find(const ls_lora_pool_t *self, const char *id) {
    for (int i = 0; i < self->pc.max_loaded_loras; i++)
        if (self->entries[i].id && strcmp(self->entries[i].id, id) == 0)
            return i;
    return -1;
}

bool ls_lora_pool_contains(const ls_lora_pool_t *self, const char *id) {
    return id && s_find(self, id) >= 0;
}

int ls_lora_pool_slot_of(const ls_lora_pool_t *self, const char *id) {
    int e = id ? s_find(self, id) : -1;
    return e >= 0 ? self->entries[e].slot : -1;
}

static void s_slot_free(ls_lora_pool_t *self, int w) {
    int e = self->slots[w].entry;
    if (e >= 0)
        self->entries[e].slot = -1;
    self->slots[w].entry = -1;
    self->ranks[w] = 0;
    self->scalings[w] = 0.0f;
}

// Drops entry e from the CPU tier (and its slot) and from the batch last prepared.
static void s_entry_drop(ls_lora_pool_t *self, int e) {
    if (self->entries[e].slot >= 0)
        s_slot_free(self, self->entries[e].slot);
    for (int i = 0; i < self->n_cur; i++)
        if (self->cur[i] == e)
            self->cur[i--] = self->cur[--self->n_cur];
    s_entry_clear(self, &self->entries[e]);
}

// Names the targets in mask, "q_proj, v_proj", into buf.
static const char *s_target_list(unsigned mask, char *buf, size_t len) {
    size_t n = 0;
    buf[0] = '\0';
    for (int t = 0; t < LS_TARGET_COUNT && n < len; t++)
        if (mask & (1u << t))
            n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? ", " : "",
                                  ls_target_name((ls_target_t)t));
    return buf;
}

// Narrows n fp32 values to the slots' storage dtype (rounding to nearest even, as a
// device-side conversion would).
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

// Writes the slot image of adapter (see the top of this file) into host, layer by layer and
// group by group, through the fp32 staging blocks (zero padding, folded scalings and the
// rank's shard are made there).
static void s_image(ls_lora_pool_t *self, char *host, const ls_adapter_t *adapter,
                    bool uniform) {
    int r_max = self->pc.max_lora_rank, L = self->cfg.num_hidden_layers;
    for (int l = 0; l < L; l++) {
        for (int g = 0; g < LS_LORA_GROUP_COUNT; g++) {
            if (!self->a[g])
                continue;
            const ls_lora_group_shape_t *s = &self->shape[g];
            size_t an = s_a_slot_n(self, g), bn = s_b_slot_n(self, g);
            memset(self->stage_a, 0, an * sizeof(float));
            memset(self->stage_b, 0, bn * sizeof(float));
            for (int k = 0; k < s->n_slices; k++) {
                ls_target_t t = s_group_def[g].t[k];
                const ls_lora_weights_t *lw = ls_adapter_layer_target(adapter, l, t);
                const s_window_t *win = &self->win[t];
                int r = lw->rank, off = s->slice_offsets[k], in_all, out_all;
                if (r == 0)
                    continue;
                ls_model_config_target_dims(&self->cfg, t, &in_all, &out_all);
                // A (r, in_all), columns in0.. -> rows k*r_max .. k*r_max + r - 1
                for (int j = 0; j < r; j++)
                    memcpy(self->stage_a + ((size_t)k * r_max + j) * s->in,
                           lw->A + (size_t)j * in_all + win->in0, (size_t)s->in * sizeof(float));
                // B (out_all, r), rows out0.. -> rows off.., columns 0..r-1 of (out_total, r_max)
                float fold = uniform ? 1.0f : lw->scaling;
                for (int o = 0; o < win->n_out; o++)
                    for (int j = 0; j < r; j++)
                        self->stage_b[(size_t)(off + o) * r_max + j] =
                            lw->B[(size_t)(win->out0 + o) * r + j] * fold;
            }
            s_store(self, host + (self->host_a[g] + (size_t)l * an) * self->esize,
                    self->stage_a, an);
            s_store(self, host + (self->host_b[g] + (size_t)l * bn) * self->esize,
                    self->stage_b, bn);
        }
    }
}

// A CPU-tier victim: not pinned, not in the batch last prepared; LRU: least recently
// used, FIFO: first added. -1 when every entry is protected.
static int s_cpu_victim(const ls_lora_pool_t *self) {
    int best = -1;
    uint64_t best_key = 0;
    for (int i = 0; i < self->pc.max_loaded_loras; i++) {
        const s_entry_t *e = &self->entries[i];
        if (!e->id || e->pinned || s_in(self->cur, self->n_cur, i))
            continue;
        uint64_t key = self->pc.eviction == LS_LORA_EVICT_LRU ? e->used : e->added;
        if (best < 0 || key < best_key) {
            best = i;
            best_key = key;
        }
    }
    return best;
}

int ls_lora_pool_add(ls_lora_pool_t *self, const char *id, ls_adapter_t **adapter,
                     bool pinned, char *evicted, size_t evicted_len, char *err,
                     size_t errlen) {
    assert(adapter && *adapter);
    if (evicted && evicted_len)
        evicted[0] = '\0';
    if (!id || !*id) {
        ls_err_set(err, errlen, "LoRA pool: empty adapter id");
        return -1;
    }
    if (s_find(self, id) >= 0) {
        ls_err_set(err, errlen, "LoRA pool: adapter \"%s\" is already loaded", id);
        return -1;
    }
    ls_adapter_info_t info = ls_adapter_info(*adapter);
    if (info.max_rank > self->pc.max_lora_rank) {
        ls_err_set(err, errlen, "LoRA pool: adapter \"%s\" has rank %d, above max_lora_rank %d",
                   id, info.max_rank, self->pc.max_lora_rank);
        return -1;
    }
    if (info.target_mask & ~self->enabled) {
        char names[128];
        ls_err_set(err, errlen,
                   "LoRA pool: adapter \"%s\" targets %s, which lora_target_modules does not "
                   "enable", id, s_target_list(info.target_mask & ~self->enabled, names,
                                               sizeof names));
        return -1;
    }
    int n_pinned = 0, free_e = -1;
    for (int i = 0; i < self->pc.max_loaded_loras; i++) {
        n_pinned += self->entries[i].id && self->entries[i].pinned;
        if (!self->entries[i].id && free_e < 0)
            free_e = i;
    }
    if (pinned && n_pinned >= self->pc.max_loras_per_batch - 1) {
        ls_err_set(err, errlen,
                   "LoRA pool: cannot pin adapter \"%s\": at most %d adapters can be pinned "
                   "(max_loras_per_batch - 1, so that one slot stays for unpinned ones)",
                   id, self->pc.max_loras_per_batch - 1);
        return -1;
    }
    bool uniform = true, first = true;
    float scaling = 0.0f;
    for (int l = 0; l < self->cfg.num_hidden_layers; l++)
        for (int t = 0; t < LS_TARGET_COUNT; t++) {
            const ls_lora_weights_t *w = ls_adapter_layer_target(*adapter, l, t);
            if (w->rank == 0)
                continue;
            if (first)
                scaling = w->scaling;
            uniform &= first || w->scaling == scaling;
            first = false;
        }
    // the slot image first: a failed allocation leaves the tier as it was
    char *copy = strdup(id);
    void *host = self->be->host_alloc(self->be, self->host_n * self->esize);
    if (!copy || !host) {
        free(copy);
        if (host)
            self->be->host_free(self->be, host);
        ls_err_set(err, errlen, "LoRA pool: out of %s host memory for adapter \"%s\" (%.1f MB)",
                   self->be->name, id, (double)(self->host_n * self->esize) / 1e6);
        return -1;
    }
    s_image(self, host, *adapter, uniform);
    if (free_e < 0) {
        free_e = s_cpu_victim(self);
        if (free_e < 0) {
            ls_err_set(err, errlen,
                       "LoRA pool: cannot load adapter \"%s\": the CPU tier holds "
                       "max_loaded_loras (%d) adapters and each is pinned or in the current "
                       "batch", id, self->pc.max_loaded_loras);
            free(copy);
            self->be->host_free(self->be, host);
            return -1;
        }
        if (evicted && evicted_len)
            snprintf(evicted, evicted_len, "%s", self->entries[free_e].id);
        s_entry_drop(self, free_e);
        self->stats.cpu_evictions++;
    }
    self->entries[free_e] = (s_entry_t){.id = copy, .host = host, .pinned = pinned,
                                        .rank = info.max_rank,
                                        .scaling = uniform ? scaling : 1.0f, .slot = -1};
    self->entries[free_e].added = self->entries[free_e].used = ++self->tick;
    // the slot image is all the pool needs from now on
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

// A slot for a missing adapter of the batch being prepared (entries next[0..n_next)): a
// free one, else the LRU/FIFO victim among slots whose adapter is neither pinned nor in the
// batch. -1 when none.
static int s_slot_pick(const ls_lora_pool_t *self, int n_next) {
    int best = -1;
    uint64_t best_key = 0;
    for (int w = 1; w < self->n_slots; w++) {
        const s_slot_t *s = &self->slots[w];
        if (s->entry < 0)
            return w;
        if (self->entries[s->entry].pinned || s_in(self->next, n_next, s->entry))
            continue;
        uint64_t key = self->pc.eviction == LS_LORA_EVICT_LRU ? s->used : s->loaded;
        if (best < 0 || key < best_key) {
            best = w;
            best_key = key;
        }
    }
    return best;
}

// Starts the load of entry e's slot image into slot w: one strided copy per group and A/B
// on the backend's upload stream, the slot's event recorded after the last. -1 when a copy
// could not be queued.
static int s_upload(ls_lora_pool_t *self, int w, const s_entry_t *e) {
    ls_backend_t *be = self->be;
    const char *host = e->host;
    int last = -1, L = self->cfg.num_hidden_layers;
    for (int g = 0; g < LS_LORA_GROUP_COUNT; g++)
        last = self->a[g] ? g : last;
    for (int g = 0; g <= last; g++) {
        if (!self->a[g])
            continue;
        size_t an = s_a_slot_n(self, g), bn = s_b_slot_n(self, g);
        if (be->buffer_upload_async(be, ls_view(self->a[g], (size_t)w * an), self->n_slots * an,
                                    host + self->host_a[g] * self->esize, an, (size_t)L,
                                    NULL) != 0 ||
            be->buffer_upload_async(be, ls_view(self->b[g], (size_t)w * bn), self->n_slots * bn,
                                    host + self->host_b[g] * self->esize, bn, (size_t)L,
                                    g == last ? self->events[w] : NULL) != 0)
            return -1;
    }
    return 0;
}

// Starts loading entry e into slot w, evicting whatever w held. -1 + err when the upload fails (w is
// then left empty).
static int s_slot_load(ls_lora_pool_t *self, int w, int e, uint64_t tick, char *err, size_t errlen) {
    s_entry_t *entry = &self->entries[e];
    if (self->slots[w].entry >= 0) {
        s_slot_free(self, w);
        self->stats.slot_evictions++;
    }
    if (entry->slot >= 0)  // moving: its old slot becomes free
        s_slot_free(self, entry->slot);
    if (s_upload(self, w, entry) != 0) {
        ls_err_set(err, errlen, "LoRA pool: starting the upload of adapter \"%s\" into slot %d failed on the %s backend",
                   entry->id, w, self->be->name);
        return -1;
    }
    self->slots[w] = (s_slot_t){.entry = e, .loaded = tick};
    self->ranks[w] = entry->rank;
    self->scalings[w] = entry->scaling;
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
    uint64_t tick = ++self->tick;
    if (self->entries[e].slot == slot) {
        self->stats.hits++;
    } else {
        int held = self->slots[slot].entry;
        if (held >= 0 && self->entries[held].pinned) {
            ls_err_set(err, errlen, "LoRA pool: slot %d holds pinned adapter \"%s\"", slot,
                       self->entries[held].id);
            return -1;
        }
        if (s_slot_load(self, slot, e, tick, err, errlen) != 0)
            return -1;
    }
    self->entries[e].used = tick;
    self->slots[slot].used = tick;
    return 0;
}

int ls_lora_pool_prepare(ls_lora_pool_t *self, const char *const *ids, int n,
                         int32_t *slots, char *err, size_t errlen) {
    int max = self->pc.max_loras_per_batch, n_next = 0;
    // pass 1: entry of each id into slots[i] (-1: base), distinct entries into next
    for (int i = 0; i < n; i++) {
        slots[i] = -1;
        if (!ids[i] || !*ids[i])
            continue;
        for (int j = 0; j < n_next && slots[i] < 0; j++)
            if (strcmp(self->entries[self->next[j]].id, ids[i]) == 0)
                slots[i] = self->next[j];
        if (slots[i] >= 0)
            continue;
        int e = s_find(self, ids[i]);
        if (e < 0) {
            ls_err_set(err, errlen, "LoRA pool: adapter \"%s\" is not loaded", ids[i]);
            return -1;
        }
        if (n_next == max) {
            ls_err_set(err, errlen,
                       "LoRA pool: the batch uses more than max_loras_per_batch (%d) distinct "
                       "adapters", max);
            return -1;
        }
        self->next[n_next++] = e;
        slots[i] = e;
    }
    // pass 2: enough slots free or evictable for the missing ones?
    int missing = 0, available = 0, held = 0;
    for (int j = 0; j < n_next; j++)
        missing += self->entries[self->next[j]].slot < 0;
    for (int w = 1; w < self->n_slots; w++) {
        int e = self->slots[w].entry;
        if (e < 0 || (!self->entries[e].pinned && !s_in(self->next, n_next, e)))
            available++;
        else if (self->entries[e].pinned && !s_in(self->next, n_next, e))
            held++;
    }
    if (missing > available) {
        ls_err_set(err, errlen,
                   "LoRA pool: the batch needs %d more adapter slots but only %d can be freed "
                   "(%d slots, %d held by pinned adapters outside the batch)",
                   missing, available, max, held);
        return -1;
    }
    // pass 3: load the missing ones, stamp the batch's use
    uint64_t tick = ++self->tick;
    for (int j = 0; j < n_next; j++) {
        s_entry_t *e = &self->entries[self->next[j]];
        if (e->slot >= 0) {
            self->stats.hits++;
        } else {
            int w = s_slot_pick(self, n_next);
            assert(w > 0); // pass 2 counted it
            if (s_slot_load(self, w, self->next[j], tick, err, errlen) != 0)
                return -1;
        }
        e->used = tick;
        self->slots[e->slot].used = tick;
    }
    for (int i = 0; i < n; i++)
        slots[i] = slots[i] < 0 ? LS_LORA_SLOT_BASE : self->entries[slots[i]].slot;
    memcpy(self->cur, self->next, (size_t)n_next * sizeof *self->cur);
    self->n_cur = n_next;
    return 0;
}

void ls_lora_pool_step_wait(const ls_lora_pool_t *self, const ls_lora_batch_t *lora) {
    for (int i = 0; lora && i < lora->n_segs; i++)
        self->be->event_wait(self->be, self->events[lora->weight_indices[i]]);
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

const float *ls_lora_pool_slot_scalings(const ls_lora_pool_t *self) {
    return self->scalings;
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
    assert(ls_lora_pool_has_group(self, g) && layer >= 0 &&
           layer < self->cfg.num_hidden_layers);
    *a = ls_view(self->a[g], (size_t)layer * self->n_slots * s_a_slot_n(self, g));
    *b = ls_view(self->b[g], (size_t)layer * self->n_slots * s_b_slot_n(self, g));
}

ls_lora_pool_stats_t ls_lora_pool_stats(const ls_lora_pool_t *self) {
    return self->stats;
}
