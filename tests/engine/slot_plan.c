// slot_plan — see slot_plan.h.
#include "slot_plan.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "ls_err.h"

struct slot_plan {
    ls_lora_pool_t *pool;
    lora_t *lora;
    uint64_t step;           // the clock lora_slot_assign and lora_slot_touch read
    lora_adapter_t **batch;  // (slots) the distinct adapters of the batch being mapped
};

slot_plan_t *slot_plan_new(ls_lora_pool_t *pool, lora_evict_t policy) {
    slot_plan_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    int slots = ls_lora_pool_n_slots(pool) - 1;
    self->pool = pool;
    self->lora = lora_new(slots, policy);
    self->batch = calloc((size_t)slots, sizeof *self->batch);
    if (!self->lora || !self->batch)
        slot_plan_destroy(&self);
    return self;
}

void slot_plan_destroy(slot_plan_t **self_p) {
    if (!self_p || !*self_p)
        return;
    slot_plan_t *self = *self_p;
    lora_destroy(&self->lora);
    free(self->batch);
    free(self);
    *self_p = NULL;
}

static bool s_base(const char *id) {
    return !id || !*id;
}

int slot_plan_pages(const ls_model_t *model, int block_size, const ls_lora_pool_config_t *pc, char *err,
                    size_t errlen) {
    // the page's storage dtype: the KV cache's, as the backend stores it
    ls_kv_cache_t *probe = ls_kv_cache_new(model, 1, block_size, err, errlen);
    if (!probe)
        return -1;
    ls_page_arena_t a = ls_kv_cache_arena(probe);
    size_t page = a.page_n * ls_dtype_size(a.buf->storage);
    ls_dtype_t storage = a.buf->storage;
    ls_kv_cache_destroy(&probe);
    int per = ls_lora_pool_max_pages(ls_model_config(model), pc, page, storage, err, errlen);
    return per < 0 ? -1 : per * pc->max_loras_per_batch;
}

ls_kv_cache_t *slot_plan_arena_new(const ls_model_t *model, int block_size, const ls_lora_pool_config_t *pc,
                                   char *err, size_t errlen) {
    int n = slot_plan_pages(model, block_size, pc, err, errlen);
    return n < 0 ? NULL : ls_kv_cache_new(model, n > 0 ? n : 1, block_size, err, errlen);
}

int slot_plan_assign(ls_lora_pool_t *pool, const char *id, int slot, char *err, size_t errlen) {
    int rank, need;
    size_t bytes;
    if (ls_lora_pool_image_info(pool, id, &rank, &bytes, &need) != 0) {
        ls_err_set(err, errlen, "slot plan: adapter \"%s\" is not in the pool", id);
        return -1;
    }
    int per = ls_lora_pool_image_max_pages(pool), top = ls_lora_pool_arena(pool).n_pages;
    int first = top - slot * per;
    if (slot < 1 || first < 0) {
        ls_err_set(err, errlen, "slot plan: the arena's %d pages have no share of %d for slot %d", top, per, slot);
        return -1;
    }
    int32_t *pages = malloc(((size_t)need + 1) * sizeof *pages);
    if (!pages) {
        ls_err_set(err, errlen, "slot plan: out of memory");
        return -1;
    }
    for (int i = 0; i < need; i++)
        pages[i] = first + i;
    int rc = ls_lora_pool_assign(pool, id, slot, pages, need, err, errlen);
    free(pages);
    return rc;
}

int slot_plan_map(slot_plan_t *self, const char *const *ids, int n, int32_t *slots, char *err, size_t errlen) {
    int max = lora_slots(self->lora), nb = 0;
    // the batch's distinct adapters, every refusal before a slot changes
    for (int i = 0; i < n; i++) {
        if (s_base(ids[i]))
            continue;
        if (!ls_lora_pool_contains(self->pool, ids[i])) {
            ls_err_set(err, errlen, "slot plan: adapter \"%s\" is not in the pool", ids[i]);
            return -1;
        }
        lora_adapter_t *ad = lora_find(self->lora, ids[i]);
        if (!ad && !(ad = lora_add(self->lora, ids[i], NULL, NULL, false))) {
            ls_err_set(err, errlen, "slot plan: out of memory");
            return -1;
        }
        bool seen = false;
        for (int j = 0; j < nb && !seen; j++)
            seen = self->batch[j] == ad;
        if (seen)
            continue;
        if (nb == max) {
            ls_err_set(err, errlen, "slot plan: the batch has more distinct adapters than the %d slots", max);
            return -1;
        }
        self->batch[nb++] = ad;
    }
    uint64_t now = ++self->step;
    for (int j = 0; j < nb; j++) {
        lora_adapter_t *ad = self->batch[j];
        if (ad->slot < 0) {
            // nothing is pinned and the batch is kept, so at most nb - 1 slots are off limits
            int slot = lora_slot_pick(self->lora, self->batch, nb, NULL, 0);
            assert(slot >= 0);
            lora_slot_assign(self->lora, ad, slot, now);
        }
        lora_slot_touch(self->lora, ad, now);
        if (slot_plan_assign(self->pool, ad->id, ad->slot + 1, err, errlen) != 0)
            return -1;
    }
    for (int i = 0; i < n; i++)
        slots[i] = s_base(ids[i]) ? LS_LORA_SLOT_BASE : lora_find(self->lora, ids[i])->slot + 1;
    return 0;
}

int slot_plan_map_once(ls_lora_pool_t *pool, const char *const *ids, int n, int32_t *slots, char *err,
                       size_t errlen) {
    slot_plan_t *plan = slot_plan_new(pool, LORA_EVICT_LRU);
    if (!plan) {
        ls_err_set(err, errlen, "slot plan: out of memory");
        return -1;
    }
    int rc = slot_plan_map(plan, ids, n, slots, err, errlen);
    slot_plan_destroy(&plan);
    return rc;
}
