// lora — adapter table and GPU slot table; see lora.h.
#include "lora.h"

#include <assert.h>
#include <czmq.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    lora_adapter_t *ad;  // NULL: empty
    uint64_t used_at;    // LRU: last step that used it
    uint64_t filled_at;  // FIFO: when its adapter was put there
} lora_slot_t;

struct lora {
    lora_evict_t policy;
    int n_slots;
    lora_slot_t *slots;
    lora_adapter_t **v;  // insertion order
    int n, cap;
    zhashx_t *by_id;  // id -> adapter (lookup only; never iterated, so order stays ours)
};

lora_t *lora_new(int slots, lora_evict_t policy) {
    assert(slots >= 0);
    lora_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->policy = policy;
    self->n_slots = slots;
    self->slots = calloc(slots > 0 ? (size_t)slots : 1, sizeof *self->slots);
    self->by_id = zhashx_new();
    if (!self->slots || !self->by_id) {
        lora_destroy(&self);
        return NULL;
    }
    return self;
}

static void s_adapter_free(lora_adapter_t *ad) {
    free(ad->id);
    free(ad->name);
    free(ad->path);
    free(ad->pages);
    free(ad);
}

void lora_destroy(lora_t **self_p) {
    lora_t *self = *self_p;
    if (!self)
        return;
    for (int i = 0; i < self->n; i++)
        s_adapter_free(self->v[i]);
    free(self->v);
    free(self->slots);
    zhashx_destroy(&self->by_id);
    free(self);
    *self_p = NULL;
}

int lora_slots(const lora_t *self) { return self->n_slots; }

int lora_slots_reset(lora_t *self, int slots) {
    assert(slots >= 0);
    lora_slot_t *v = calloc(slots > 0 ? (size_t)slots : 1, sizeof *v);
    if (!v)
        return -1;
    for (int i = 0; i < self->n; i++) {
        assert(self->v[i]->n_pages == 0);  // given back first
        self->v[i]->slot = -1;
    }
    free(self->slots);
    self->slots = v;
    self->n_slots = slots;
    return 0;
}
lora_adapter_t *lora_find(const lora_t *self, const char *id) { return id ? zhashx_lookup(self->by_id, id) : NULL; }
int lora_count(const lora_t *self) { return self->n; }
lora_adapter_t *lora_at(const lora_t *self, int i) { return i >= 0 && i < self->n ? self->v[i] : NULL; }

lora_adapter_t *lora_add(lora_t *self, const char *id, const char *name, const char *path, bool pinned) {
    assert(id && !lora_find(self, id));
    if (self->n == self->cap) {
        int cap = self->cap ? 2 * self->cap : 16;
        lora_adapter_t **v = realloc(self->v, (size_t)cap * sizeof *v);
        if (!v)
            return NULL;
        self->v = v;
        self->cap = cap;
    }
    lora_adapter_t *ad = calloc(1, sizeof *ad);
    if (!ad)
        return NULL;
    ad->id = strdup(id);
    ad->name = strdup(name ? name : id);
    ad->path = path ? strdup(path) : NULL;
    ad->pinned = pinned;
    ad->slot = -1;
    if (!ad->id || !ad->name || (path && !ad->path) || zhashx_insert(self->by_id, ad->id, ad) != 0) {
        s_adapter_free(ad);
        return NULL;
    }
    self->v[self->n++] = ad;
    return ad;
}

void lora_remove(lora_t *self, lora_adapter_t **ad_p) {
    lora_adapter_t *ad = *ad_p;
    if (!ad)
        return;
    assert(ad->n_pages == 0);
    lora_slot_clear(self, ad);
    zhashx_delete(self->by_id, ad->id);
    for (int i = 0; i < self->n; i++)
        if (self->v[i] == ad) {
            memmove(&self->v[i], &self->v[i + 1], (size_t)(self->n - i - 1) * sizeof *self->v);
            self->n--;
            break;
        }
    s_adapter_free(ad);
    *ad_p = NULL;
}

int lora_cpu_count(const lora_t *self) {
    int n = 0;
    for (int i = 0; i < self->n; i++)
        n += self->v[i]->resident || (self->v[i]->loading && !self->v[i]->queued);
    return n;
}

void lora_cpu_bytes(const lora_t *self, uint64_t unknown, uint64_t *used, uint64_t *reserved) {
    *used = *reserved = 0;
    for (int i = 0; i < self->n; i++) {
        const lora_adapter_t *ad = self->v[i];
        if (ad->resident)
            *used += ad->bytes;
        else if (ad->loading && !ad->queued)
            *reserved += ad->bytes ? ad->bytes : unknown;
    }
}

lora_adapter_t *lora_cpu_victim(const lora_t *self) {
    lora_adapter_t *best = NULL;
    for (int i = 0; i < self->n; i++) {
        lora_adapter_t *ad = self->v[i];
        if (!ad->resident || ad->loading || ad->pinned || ad->refs > 0)
            continue;
        if (!best || ad->used_at < best->used_at)
            best = ad;
    }
    return best;
}

int lora_pinned_count(const lora_t *self) {
    int n = 0;
    for (int i = 0; i < self->n; i++)
        n += self->v[i]->pinned;
    return n;
}

// The first empty slot when empty_ok, else the policy's victim among the unlocked occupied
// ones whose adapter is not kept; never one of taken. -1 when none.
static int s_slot_choose(const lora_t *self, lora_adapter_t *const *keep, int nkeep, const int *taken, int ntaken,
                         bool empty_ok) {
    int best = -1;
    for (int s = 0; s < self->n_slots; s++) {
        const lora_slot_t *sl = &self->slots[s];
        bool promised = false;
        for (int k = 0; k < ntaken && !promised; k++)
            promised = taken[k] == s;
        if (promised)
            continue;
        if (!sl->ad) {
            if (empty_ok)
                return s;
            continue;
        }
        if (sl->ad->pinned || sl->ad->running > 0)
            continue;
        bool kept = false;
        for (int k = 0; k < nkeep && !kept; k++)
            kept = keep[k] == sl->ad;
        if (kept)
            continue;
        if (best < 0)
            best = s;
        else if (self->policy == LORA_EVICT_LRU ? sl->used_at < self->slots[best].used_at
                                                : sl->filled_at < self->slots[best].filled_at)
            best = s;
    }
    return best;
}

int lora_slot_pick(const lora_t *self, lora_adapter_t *const *keep, int nkeep, const int *taken, int ntaken) {
    return s_slot_choose(self, keep, nkeep, taken, ntaken, true);
}

int lora_slot_victim(const lora_t *self, lora_adapter_t *const *keep, int nkeep) {
    return s_slot_choose(self, keep, nkeep, NULL, 0, false);
}

void lora_slot_assign(lora_t *self, lora_adapter_t *ad, int slot, uint64_t now) {
    assert(slot >= 0 && slot < self->n_slots && ad->slot < 0);
    lora_slot_t *sl = &self->slots[slot];
    assert(!sl->ad || sl->ad->n_pages == 0);  // an occupant's pages go back first
    if (sl->ad)
        sl->ad->slot = -1;
    sl->ad = ad;
    sl->used_at = sl->filled_at = now;
    ad->slot = slot;
}

void lora_slot_touch(lora_t *self, const lora_adapter_t *ad, uint64_t now) {
    if (ad->slot >= 0)
        self->slots[ad->slot].used_at = now;
}

void lora_slot_clear(lora_t *self, lora_adapter_t *ad) {
    if (ad->slot < 0)
        return;
    self->slots[ad->slot].ad = NULL;
    ad->slot = -1;
}

lora_adapter_t *lora_slot_adapter(const lora_t *self, int slot) {
    return slot >= 0 && slot < self->n_slots ? self->slots[slot].ad : NULL;
}
