// history — see history.h. Requests are few (at most the scheduler's running limit) and
// looked up once per step each, so an open-addressing table keyed by rid suffices.
#include "history.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t *v;
    size_t n, cap;
} s_ids_t;

typedef struct {
    uint64_t rid;  // 0: empty slot (rids start at 1)
    int tomb;      // deleted: keeps probe chains intact
    s_ids_t prompt, output;
} s_entry_t;

struct ls_history {
    s_entry_t *slots;
    size_t cap, used, live;
};

static void s_push(s_ids_t *ids, const int32_t *v, size_t n) {
    if (!n)
        return;  // v and ids->v may both be NULL: nothing to copy
    if (ids->n + n > ids->cap) {
        size_t cap = ids->cap ? ids->cap : 64;
        while (cap < ids->n + n)
            cap *= 2;
        ids->v = realloc(ids->v, cap * sizeof *ids->v);
        ids->cap = cap;
    }
    memcpy(ids->v + ids->n, v, n * sizeof *v);
    ids->n += n;
}

static size_t s_hash(uint64_t rid, size_t cap) {
    rid ^= rid >> 33;
    rid *= 0xff51afd7ed558ccdull;
    rid ^= rid >> 33;
    return (size_t)rid & (cap - 1);
}

// rid's entry, or NULL. An empty slot ends the probe before it could be taken for rid 0.
static s_entry_t *s_find(const ls_history_t *self, uint64_t rid) {
    for (size_t i = s_hash(rid, self->cap), k = 0; k < self->cap; i = (i + 1) & (self->cap - 1), k++) {
        s_entry_t *e = &self->slots[i];
        if (!e->rid && !e->tomb)
            return NULL;
        if (e->rid == rid && !e->tomb)
            return e;
    }
    return NULL;
}

static void s_grow(ls_history_t *self);

static s_entry_t *s_get(ls_history_t *self, uint64_t rid) {
    s_entry_t *e = s_find(self, rid);
    if (e)
        return e;
    if ((self->used + 1) * 2 > self->cap)
        s_grow(self);
    size_t i = s_hash(rid, self->cap);
    while (self->slots[i].rid && !self->slots[i].tomb)
        i = (i + 1) & (self->cap - 1);
    e = &self->slots[i];
    if (!e->tomb)
        self->used++;
    *e = (s_entry_t){.rid = rid};
    self->live++;
    return e;
}

static void s_grow(ls_history_t *self) {
    s_entry_t *old = self->slots;
    size_t old_cap = self->cap;
    self->cap = old_cap ? old_cap * 2 : 64;
    while (self->live * 4 > self->cap)
        self->cap *= 2;
    self->slots = calloc(self->cap, sizeof *self->slots);
    self->used = self->live = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].rid && !old[i].tomb) {
            s_entry_t *e = s_get(self, old[i].rid);
            e->prompt = old[i].prompt;
            e->output = old[i].output;
        }
    free(old);
}

ls_history_t *ls_history_new(void) {
    ls_history_t *self = calloc(1, sizeof *self);
    if (self)
        s_grow(self);
    return self;
}

void ls_history_destroy(ls_history_t **self_p) {
    if (!self_p || !*self_p)
        return;
    ls_history_t *self = *self_p;
    for (size_t i = 0; i < self->cap; i++)
        if (self->slots[i].rid && !self->slots[i].tomb) {
            free(self->slots[i].prompt.v);
            free(self->slots[i].output.v);
        }
    free(self->slots);
    free(self);
    *self_p = NULL;
}

// rid 0 marks an empty slot, so it is no request: whatever names it is ignored (an entry under
// it would be taken for empty, its memory lost; a drop of it would count a live entry less).
void ls_history_add_prompt(ls_history_t *self, uint64_t rid, const int32_t *ids, size_t n) {
    if (rid)
        s_push(&s_get(self, rid)->prompt, ids, n);
}

void ls_history_clear_prompt(ls_history_t *self, uint64_t rid) {
    s_entry_t *e = s_find(self, rid);
    if (e)
        e->prompt.n = 0;
}

void ls_history_add_output(ls_history_t *self, uint64_t rid, int32_t id) {
    if (rid)
        s_push(&s_get(self, rid)->output, &id, 1);
}

int ls_history_last_output(const ls_history_t *self, uint64_t rid, int32_t *id) {
    const s_entry_t *e = rid ? s_find(self, rid) : NULL;
    if (!e || !e->output.n)
        return -1;
    *id = e->output.v[e->output.n - 1];
    return 0;
}

void ls_history_drop(ls_history_t *self, uint64_t rid) {
    s_entry_t *e = s_find(self, rid);
    if (!e)
        return;
    free(e->prompt.v);
    free(e->output.v);
    *e = (s_entry_t){.rid = rid, .tomb = 1};
    self->live--;
}

size_t ls_history_size(const ls_history_t *self) { return self->live; }

// One CSR array (indptr (n_rows+1), ids) over the rows' prompt or output lists.
static void s_csr(const ls_history_t *self, const uint64_t *rids, int n_rows, int output, const int32_t **indptr_out,
                  const int32_t **ids_out) {
    int32_t *indptr = malloc(sizeof(int32_t) * (size_t)(n_rows + 1));
    size_t total = 0;
    for (int r = 0; r < n_rows; r++) {
        const s_entry_t *e = s_find(self, rids[r]);
        indptr[r] = (int32_t)total;
        total += e ? (output ? e->output.n : e->prompt.n) : 0;
    }
    indptr[n_rows] = (int32_t)total;
    int32_t *ids = malloc(sizeof(int32_t) * (total + 1));
    for (int r = 0; r < n_rows; r++) {
        const s_entry_t *e = s_find(self, rids[r]);
        const s_ids_t *list = e ? (output ? &e->output : &e->prompt) : NULL;
        if (list && list->n)
            memcpy(ids + indptr[r], list->v, list->n * sizeof(int32_t));
    }
    *indptr_out = indptr;
    *ids_out = ids;
}

void ls_history_batch(const ls_history_t *self, const uint64_t *rids, int n_rows, ls_sampling_batch_t *batch) {
    s_csr(self, rids, n_rows, 0, &batch->prompt_indptr, &batch->prompt_ids);
    s_csr(self, rids, n_rows, 1, &batch->output_indptr, &batch->output_ids);
}

void ls_history_batch_free(ls_sampling_batch_t *batch) {
    free((void *)batch->prompt_indptr);
    free((void *)batch->prompt_ids);
    free((void *)batch->output_indptr);
    free((void *)batch->output_ids);
    batch->prompt_indptr = batch->prompt_ids = batch->output_indptr = batch->output_ids = NULL;
}
