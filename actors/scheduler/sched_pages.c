// sched_pages — the scheduler core's pages of the workers' GPU pool (sched_impl.h,
// docs/memory.md): one allocator, the KV block allocator (kv.h), hands out pages to the KV
// cache and to the adapters in GPU slots alike. An adapter in a slot holds pages_need of them
// (a reference each, outside the prefix tree) until it leaves its slot.
//
// Who gives way, in order, when a page is wanted: a free page; an idle cached prefix block
// (kv_alloc evicts those itself, LRU); an idle adapter's pages, the slot policy's victim (its
// slot unlocked: not pinned, in no running request, not kept for the step being planned); and
// only for a running request's next block, preemption of the newest running request
// (sched_reserve). A running request's blocks are never taken from it, and a pinned
// adapter's pages are never taken.
#include <assert.h>
#include <string.h>

#include "ls_log.h"
#include "sched_impl.h"

static bool s_kept(lora_adapter_t *const *keep, int nkeep, const lora_adapter_t *ad) {
    for (int k = 0; k < nkeep; k++)
        if (keep[k] == ad)
            return true;
    return false;
}

uint32_t sched_pages_evictable(const sched_t *s, lora_adapter_t *const *keep, int nkeep) {
    uint32_t n = 0;
    for (int i = 0; i < lora_slots(s->lora); i++) {
        const lora_adapter_t *ad = lora_slot_adapter(s->lora, i);
        if (ad && !ad->pinned && ad->running == 0 && !s_kept(keep, nkeep, ad))
            n += ad->n_pages;
    }
    return n;
}

uint32_t sched_pages_adapters(const sched_t *s, uint32_t *resident) {
    uint32_t n = 0;
    *resident = 0;
    for (int i = 0; i < lora_slots(s->lora); i++) {
        const lora_adapter_t *ad = lora_slot_adapter(s->lora, i);
        n += ad ? ad->n_pages : 0;
        *resident += ad != NULL;
    }
    return n;
}

void sched_slot_vacate(sched_t *s, lora_adapter_t *ad) {
    while (ad->n_pages > 0)
        kv_release(s->kv, ad->pages[--ad->n_pages]);
    lora_slot_clear(s->lora, ad);
}

void sched_slots_vacate_all(sched_t *s) {
    for (int i = 0; i < lora_count(s->lora); i++)
        sched_slot_vacate(s, lora_at(s->lora, i));
}

int sched_page_take(sched_t *s, lora_adapter_t *const *keep, int nkeep, uint32_t *page) {
    if (kv_alloc(s->kv, page) == 0)
        return 0;
    // Idle adapters give their pages up only when that yields one: an adapter of no pages
    // keeps its slot.
    while (sched_pages_evictable(s, keep, nkeep) > 0) {
        lora_adapter_t *victim = lora_slot_adapter(s->lora, lora_slot_victim(s->lora, keep, nkeep));
        ls_debug(0, "pages ran out: adapter %s leaves GPU slot %d (%u pages)", victim->name, victim->slot,
                 victim->n_pages);
        s->stats.adapter_page_evictions += victim->n_pages > 0;
        sched_slot_vacate(s, victim);
        if (kv_alloc(s->kv, page) == 0)
            return 0;
    }
    return -1;
}

int sched_slot_fill(sched_t *s, lora_adapter_t *ad, int slot, lora_adapter_t *const *keep, int nkeep, bool ahead) {
    assert(ad->slot < 0 && ad->n_pages == 0);
    lora_adapter_t *occupant = lora_slot_adapter(s->lora, slot);
    uint32_t need = ad->pages_need, avail = kv_available(s->kv);
    // Ahead of its step an adapter takes only free pages (and its slot's), and leaves one per
    // running request: the next plan's decodes would otherwise take them back from it.
    if (ahead ? avail + (occupant ? occupant->n_pages : 0) < need + s->running.n
              : avail + sched_pages_evictable(s, keep, nkeep) < need)
        return -1;
    if (occupant)
        sched_slot_vacate(s, occupant);
    ad->pages = sched_alloc(ad->pages, need * sizeof *ad->pages);
    while (ad->n_pages < need) {
        int rc = sched_page_take(s, keep, nkeep, &ad->pages[ad->n_pages]);
        assert(rc == 0);  // counted above
        (void)rc;
        ad->n_pages++;
    }
    lora_slot_assign(s->lora, ad, slot, s->step + 1);
    s->stats.adapter_cold_loads++;
    s->stats.adapter_prefetches += ahead;
    // Before the plan that names the slot: the workers copy it in while the step in flight runs.
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_PREFETCH_ADAPTER);
    m.u.prefetch_adapter.adapter_id = sched_strdup(ad->id);
    m.u.prefetch_adapter.slot = slot;
    m.u.prefetch_adapter.name = sched_strdup(ad->name);
    m.u.prefetch_adapter.pages.v = sched_memdup(ad->pages, need * sizeof *ad->pages);
    m.u.prefetch_adapter.pages.n = need;
    sched_emit(s, SCHED_TO_WORKERS, 0, NULL, &m);
    ls_msg_clear(&m);
    return 0;
}
