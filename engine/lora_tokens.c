/*  engine/lora_tokens.c — see lora_tokens.h.

    A slot's load copies the image into the slot's pinned staging area and queues up to three
    asynchronous uploads from it (embedding rows, lm_head rows, lm_head ids), the slot's event
    recorded after the last. The staging area is rewritten only after that event: a slot
    loaded again before its previous load finished waits for it on the host (rare: the
    scheduler does not move adapters between slots faster than steps run).
*/
#include "lora_tokens.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "ls_err.h"

struct ls_lora_tokens_image {
    int n[2];             // rows of the embedding ([0]) and lm_head ([1])
    int32_t *ids[2];      // (n[m]) their vocabulary ids
    float *head_ids;      // (n[1]) lm_head's ids as the head_ids buffer holds them
    void *rows[2];        // (n[m], hidden) in the slots' storage dtype
    size_t bytes;
};

// Slot w's embedding ids, sorted for lookup, with the row of each.
typedef struct {
    int32_t id, row;
} s_entry_t;

struct ls_lora_tokens {
    ls_backend_t *be;
    int n_slots, cap, hidden, vocab;
    ls_buffer_t *embed, *head, *head_ids;
    ls_dtype_t storage;   // the rows' storage dtype (the backend's choice)
    size_t esize;
    ls_event_t **events;  // (n_slots) end of each slot's last load
    char *stage;          // host_alloc: n_slots areas of stage_slot bytes
    size_t stage_slot;
    int *n_embed, *n_head;  // (n_slots) rows each slot holds
    s_entry_t *entries;     // (n_slots * cap) slot w's embedding ids at w*cap, sorted by id
};

static size_t s_align16(size_t n) {
    return (n + 15) & ~(size_t)15;
}

ls_lora_tokens_t *ls_lora_tokens_new(ls_backend_t *be, const ls_model_config_t *cfg, int n_slots,
                                     int capacity, char *err, size_t errlen) {
    assert(n_slots >= 1 && capacity >= 1);
    if ((int64_t)cfg->vocab_size + capacity > (1 << 24)) {
        ls_err_set(err, errlen, "trainable tokens: a vocabulary of %d ids and %d added is above "
                   "the 2^24 that fp32 holds exactly", cfg->vocab_size, capacity);
        return NULL;
    }
    ls_lora_tokens_t *self = calloc(1, sizeof *self);
    if (!self) {
        ls_err_set(err, errlen, "trainable tokens: out of memory");
        return NULL;
    }
    self->be = be;
    self->n_slots = n_slots;
    self->cap = capacity;
    self->hidden = cfg->hidden_size;
    self->vocab = cfg->vocab_size;
    size_t rows = (size_t)n_slots * capacity, H = (size_t)cfg->hidden_size;
    self->embed = be->buffer_new(be, cfg->torch_dtype, rows * H);
    self->head = be->buffer_new(be, cfg->torch_dtype, rows * H);
    self->head_ids = be->buffer_new(be, LS_DTYPE_F32, rows);
    self->events = calloc((size_t)n_slots, sizeof *self->events);
    self->n_embed = calloc((size_t)n_slots, sizeof *self->n_embed);
    self->n_head = calloc((size_t)n_slots, sizeof *self->n_head);
    self->entries = calloc(rows, sizeof *self->entries);
    bool ok = self->embed && self->head && self->head_ids && self->events && self->n_embed &&
              self->n_head && self->entries;
    for (int w = 0; ok && w < n_slots; w++)
        ok = (self->events[w] = be->event_new(be)) != NULL;
    if (ok) {
        self->storage = self->embed->storage;
        self->esize = ls_dtype_size(self->storage);
        self->stage_slot = 2 * s_align16((size_t)capacity * H * self->esize) +
                           (size_t)capacity * sizeof(float);
        ok = (self->stage = be->host_alloc(be, (size_t)n_slots * self->stage_slot)) != NULL;
    }
    if (!ok) {
        ls_lora_tokens_destroy(&self);
        ls_err_set(err, errlen, "trainable tokens: out of %s memory for %d slots of %d rows",
                   be->name, n_slots, capacity);
        return NULL;
    }
    // never read before a load writes them, but finite and deterministic all the same
    be->buffer_zero(be, ls_view(self->embed, 0), rows * H);
    be->buffer_zero(be, ls_view(self->head, 0), rows * H);
    be->buffer_zero(be, ls_view(self->head_ids, 0), rows);
    return self;
}

void ls_lora_tokens_destroy(ls_lora_tokens_t **self_p) {
    if (!self_p || !*self_p)
        return;
    ls_lora_tokens_t *self = *self_p;
    ls_backend_t *be = self->be;
    ls_lora_tokens_wait(self);
    ls_buffer_t *bufs[] = {self->embed, self->head, self->head_ids};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i])
            be->buffer_free(be, bufs[i]);
    for (int w = 0; self->events && w < self->n_slots; w++)
        if (self->events[w])
            be->event_free(be, self->events[w]);
    if (self->stage)
        be->host_free(be, self->stage);
    free(self->events);
    free(self->n_embed);
    free(self->n_head);
    free(self->entries);
    free(self);
    *self_p = NULL;
}

int ls_lora_tokens_image_new(const ls_lora_tokens_t *self, const ls_adapter_t *adapter,
                             ls_lora_tokens_image_t **image, char *err, size_t errlen) {
    *image = NULL;
    const ls_token_rows_t *tr[2] = {ls_adapter_token_rows(adapter, LS_TARGET_EMBED),
                                    ls_adapter_token_rows(adapter, LS_TARGET_LM_HEAD)};
    int most = tr[0]->n > tr[1]->n ? tr[0]->n : tr[1]->n;
    if (most == 0)
        return 0;
    if (!self || most > self->cap) {
        ls_err_set(err, errlen, "the adapter replaces %d rows of the embedding or lm_head "
                   "(trainable tokens), above the %d a slot holds (--lora-extra-vocab-size)",
                   most, self ? self->cap : 0);
        return -1;
    }
    for (int m = 0; m < 2; m++)  // added ids past the logits' width (peft.c keeps them within)
        for (int k = 0; k < tr[m]->n; k++)
            if (tr[m]->ids[k] < 0 || (int64_t)tr[m]->ids[k] >= (int64_t)self->vocab + self->cap) {
                ls_err_set(err, errlen, "the adapter's token id %d is past the %d + %d ids the "
                           "workers hold (--lora-extra-vocab-size)", (int)tr[m]->ids[k],
                           self->vocab, self->cap);
                return -1;
            }
    size_t H = (size_t)self->hidden, n0 = (size_t)tr[0]->n, n1 = (size_t)tr[1]->n;
    size_t rows_bytes = s_align16((n0 + n1) * H * self->esize);
    size_t bytes = s_align16(sizeof(ls_lora_tokens_image_t)) + rows_bytes +
                   (n0 + n1) * sizeof(int32_t) + n1 * sizeof(float);
    ls_lora_tokens_image_t *img = calloc(1, bytes);
    if (!img) {
        ls_err_set(err, errlen, "trainable tokens: out of memory");
        return -1;
    }
    char *p = (char *)img + s_align16(sizeof *img);
    img->bytes = bytes;
    img->rows[0] = p;
    img->rows[1] = p + n0 * H * self->esize;
    img->ids[0] = (int32_t *)(p + rows_bytes);
    img->ids[1] = img->ids[0] + n0;
    img->head_ids = (float *)(img->ids[1] + n1);
    for (int m = 0; m < 2; m++) {
        img->n[m] = tr[m]->n;
        if (tr[m]->n == 0) // a module without rows has no arrays (NULL)
            continue;
        ls_f32_narrow(img->rows[m], self->storage, tr[m]->rows, (size_t)tr[m]->n * H);
        memcpy(img->ids[m], tr[m]->ids, (size_t)tr[m]->n * sizeof(int32_t));
    }
    for (size_t k = 0; k < n1; k++)
        img->head_ids[k] = (float)tr[1]->ids[k];
    *image = img;
    return 0;
}

void ls_lora_tokens_image_destroy(ls_lora_tokens_image_t **image_p) {
    if (!image_p)
        return;
    free(*image_p);
    *image_p = NULL;
}

size_t ls_lora_tokens_image_bytes(const ls_lora_tokens_image_t *image) {
    return image ? image->bytes : 0;
}

static int s_cmp_entry(const void *a, const void *b) {
    int32_t x = ((const s_entry_t *)a)->id, y = ((const s_entry_t *)b)->id;
    return (x > y) - (x < y);
}

int ls_lora_tokens_load(ls_lora_tokens_t *self, int slot, const ls_lora_tokens_image_t *image) {
    assert(slot >= 0 && slot < self->n_slots);
    ls_backend_t *be = self->be;
    self->n_embed[slot] = self->n_head[slot] = 0;
    if (!image)
        return 0;
    if (be->event_sync(be, self->events[slot]) != 0)  // the staging area's last load
        return -1;
    size_t H = (size_t)self->hidden, base = (size_t)slot * self->cap;
    const struct {
        ls_buffer_t *buf;
        size_t off, n, esize;
        const void *src;
    } parts[] = {
        {self->embed, base * H, (size_t)image->n[0] * H, self->esize, image->rows[0]},
        {self->head, base * H, (size_t)image->n[1] * H, self->esize, image->rows[1]},
        {self->head_ids, base, (size_t)image->n[1], sizeof(float), image->head_ids},
    };
    int last = -1;
    for (int k = 0; k < 3; k++)
        last = parts[k].n ? k : last;
    char *stage = self->stage + (size_t)slot * self->stage_slot;
    size_t at = 0;
    for (int k = 0; k <= last; k++) {
        if (!parts[k].n)
            continue;
        ls_host_span_t span = {stage + at, parts[k].n * parts[k].esize};
        memcpy(stage + at, parts[k].src, span.bytes);
        if (be->buffer_upload_async(be, ls_view(parts[k].buf, parts[k].off), parts[k].n,
                                    parts[k].n, &span, 1, parts[k].n, 1, 1,
                                    k == last ? self->events[slot] : NULL) != 0)
            return -1;
        at = s_align16(at + span.bytes);
    }
    s_entry_t *e = self->entries + base;
    for (int k = 0; k < image->n[0]; k++)
        e[k] = (s_entry_t){image->ids[0][k], (int32_t)(base + (size_t)k)};
    qsort(e, (size_t)image->n[0], sizeof *e, s_cmp_entry);
    self->n_embed[slot] = image->n[0];
    self->n_head[slot] = image->n[1];
    return 0;
}

void ls_lora_tokens_step_wait(const ls_lora_tokens_t *self, const ls_lora_batch_t *lora,
                              int n_passes) {
    for (int k = 0; k < n_passes; k++)
        for (int i = 0; i < lora[k].n_segs; i++)
            self->be->event_wait(self->be, self->events[lora[k].weight_indices[i]]);
}

int ls_lora_tokens_wait(ls_lora_tokens_t *self) {
    int rc = 0;
    for (int w = 0; self->events && w < self->n_slots; w++)
        if (self->events[w] && self->be->event_sync(self->be, self->events[w]) != 0)
            rc = -1;
    return rc;
}

bool ls_lora_tokens_slot_has(const ls_lora_tokens_t *self, int slot) {
    return self->n_embed[slot] > 0 || self->n_head[slot] > 0;
}

int32_t ls_lora_tokens_embed_row(const ls_lora_tokens_t *self, int slot, int32_t id) {
    const s_entry_t *e = self->entries + (size_t)slot * self->cap;
    int lo = 0, hi = self->n_embed[slot];
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (e[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < self->n_embed[slot] && e[lo].id == id ? e[lo].row : -1;
}

int ls_lora_tokens_head_rows(const ls_lora_tokens_t *self, int slot, int32_t *first) {
    *first = (int32_t)((size_t)slot * self->cap);
    return self->n_head[slot];
}

int ls_lora_tokens_capacity(const ls_lora_tokens_t *self) {
    return self->cap;
}

void ls_lora_tokens_views(const ls_lora_tokens_t *self, ls_view_t *embed, ls_view_t *head,
                          ls_view_t *head_ids) {
    *embed = ls_view(self->embed, 0);
    *head = ls_view(self->head, 0);
    *head_ids = ls_view(self->head_ids, 0);
}
