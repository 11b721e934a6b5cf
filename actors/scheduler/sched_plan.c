// sched_plan — the scheduler core's step plan (sched_impl.h): admission order (tenants take
// turns, aged and preempted requests first), the running requests' decodes and prompt chunks,
// the waiting ones admitted within the token budget, the KV blocks and the slot constraint,
// slots filled (with their pages) and prefetched for the requests next in line, and the
// StepPlan sent. The policy is docs/scheduling.md's; sched.c holds the requests, their KV and
// the events.
#include "sched_impl.h"

#include <assert.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv.h"

static bool s_first_class(const sched_t *s, const req_t *r) {
    return r->preempted || r->skipped > (uint32_t)s->cfg.max_skip_steps;
}

// Admission order class: 0 preempted or aged past the bound, 1 residency hit (base model or
// adapter in a slot), 2 the rest.
static int s_class(const sched_t *s, const req_t *r) {
    if (s_first_class(s, r))
        return 0;
    for (uint32_t i = 0; i < r->n_ads; i++)
        if (r->ads[i]->slot < 0)
            return 2;
    return 1;
}

// Class 0 first, FIFO; then by turn (tenants take turns), then class, then FIFO.
static const sched_t *s_sort_ctx;  // qsort has no context argument; single-threaded use only
static int s_order_cmp(const void *a, const void *b) {
    const req_t *x = *(req_t *const *)a, *y = *(req_t *const *)b;
    int cx = s_class(s_sort_ctx, x), cy = s_class(s_sort_ctx, y);
    if ((cx == 0) != (cy == 0))
        return cx - cy;
    if (cx != 0 && x->turn != y->turn)
        return x->turn < y->turn ? -1 : 1;
    if (cx != cy)
        return cx - cy;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

// The waiting requests in admission order (caller frees). A request's turn is its tenant's
// running requests plus the tenant's requests waiting ahead of it: the tenant with the fewest
// running goes next, so a flood from one tenant queues behind every other tenant's next request.
static req_t **s_waiting_order(sched_t *s, size_t *n) {
    for (int i = 0; i < lora_count(s->lora); i++)
        lora_at(s->lora, i)->turn_seen = 0;
    uint32_t base_seen = 0;
    req_t **v = sched_alloc(NULL, (s->waiting.n ? s->waiting.n : 1) * sizeof *v);
    size_t k = 0;
    for (req_t *r = s->waiting.head; r; r = r->next) {
        uint32_t *seen = r->ad ? &r->ad->turn_seen : &base_seen;
        r->turn = sched_tenant_running(s, r->ad) + (*seen)++;
        v[k++] = r;
    }
    s_sort_ctx = s;
    qsort(v, k, sizeof *v, s_order_cmp);
    s_sort_ctx = NULL;
    *n = k;
    return v;
}

// Pinned adapters hold a slot and its pages for good: give one to any that has none (after a
// load or a worker restart; idle adapters give way), and reload pinned adapters the workers
// lost.
static void s_pin_upkeep(sched_t *s, uint64_t now) {
    for (int i = 0; i < lora_count(s->lora); i++) {
        lora_adapter_t *ad = lora_at(s->lora, i);
        if (!ad->pinned || ad->unloading || !ad->confirmed)
            continue;
        if (!ad->resident)
            sched_adapter_ensure_resident(s, ad, now);
        else if (ad->slot < 0) {
            int slot = lora_slot_pick(s->lora, NULL, 0, NULL, 0);
            if (slot >= 0)
                sched_slot_fill(s, ad, slot, NULL, 0, false);
        }
    }
}

// The sampling parameters a worker needs: the effective stop set (masked until min_new_tokens),
// the effective max_new_tokens and a seed always set; stop strings stay here. The grammar text
// goes with a request's first chunk only (grammar_kind on every step): the worker keeps the
// request's automaton state from then on, across preemptions too, until the rid is released.
static void s_plan_sampling(const req_t *r, ls_msg_sampling_params_t *sp) {
    *sp = r->sampling;
    sp->stop.v = NULL;
    sp->stop.n = 0;
    sp->grammar = (ls_text_t){0};
    if (!r->chunked && r->sampling.grammar.s)
        sp->grammar = ls_msg_textdup(r->sampling.grammar.s, r->sampling.grammar.len);
    sp->stop_token_ids.v = sched_memdup(r->stop, r->n_stop * sizeof *r->stop);
    sp->stop_token_ids.n = r->n_stop;
    sp->seed = r->seed;
    sp->has_seed = true;
    sp->max_new_tokens = r->max_new;
    sp->min_new_tokens = r->min_new;
}

// r's next chunk: from where the steps in flight leave it. A decode after a step in flight
// that samples r runs that step's token, which only the workers know yet (follows).
static void s_plan_add(sched_t *s, ls_msg_step_items_t *items, req_t *r, uint32_t chunk) {
    ls_msg_step_item_t *it = &items->v[items->n++];
    memset(it, 0, sizeof *it);
    uint32_t len = sched_plan_len(r), at = sched_plan_computed(r);
    it->rid = r->rid;
    it->adapter_slot = r->ad && !r->mixed ? r->ad->slot : -1;
    it->adapter_id = r->ad && !r->mixed ? sched_strdup(r->ad->id) : NULL;
    if (r->mixed) {
        it->mix.v = sched_alloc(NULL, r->n_ads * sizeof *it->mix.v);
        for (uint32_t i = 0; i < r->n_ads; i++)
            it->mix.v[i] = (ls_msg_mix_part_t){.name = sched_strdup(r->ads[i]->name), .weight = r->weights[i],
                                               .adapter_id = sched_strdup(r->ads[i]->id), .slot = r->ads[i]->slot};
        it->mix.n = r->n_ads;
    }
    it->follows = r->ahead_out > 0;
    if (it->follows) {
        assert(chunk == 1 && at + 1 == len);
        it->token_ids.v = sched_memdup(&(int32_t){-1}, sizeof(int32_t));
    } else
        it->token_ids.v = sched_memdup(r->tokens + at, chunk * sizeof *r->tokens);
    it->token_ids.n = chunk;
    it->position = at;
    it->block_table.v = sched_memdup(r->blocks, r->n_blocks * sizeof *r->blocks);
    it->block_table.n = r->n_blocks;
    s_plan_sampling(r, &it->sampling);
    it->generated = r->n_out + r->ahead_out;
    it->is_prefill = !(it->generated > 0 && at + 1 == len);
    it->sample = at + chunk == len;
    if (!r->chunked && at > 0) {
        // A prefix hit: the worker runs only the rest, but its penalties need all the tokens.
        it->context_ids.v = sched_memdup(r->tokens, at * sizeof *r->tokens);
        it->context_ids.n = at;
    }
    r->chunked = true;
    r->in_plan = true;
    r->admitted = true;
    r->ahead += chunk;
    r->ahead_out += it->sample;
    flight_t *f = &s->flight[s->n_flight];
    sched_grow_array((void **)&f->v, &f->cap, f->n + 1, sizeof *f->v);
    f->v[f->n++] = (planned_t){.rid = r->rid, .chunk = chunk, .sample = it->sample};
}

// Whether r may go in the plan being built at all: a step in flight may end it (its last
// token by max_new_tokens or the context), and then r has nothing left to run.
static bool s_plan_has_more(const sched_t *s, const req_t *r) {
    return r->n_out + r->ahead_out < r->max_new && sched_plan_len(r) < s->max_context;
}

// Running requests, oldest first: decodes (one token each) when `decodes`, else the rest of
// their prompts (chunks). Preemption takes the newest not yet planned, so it never takes an
// older request's place for a newer one; with a step in flight nothing is preempted (its
// requests' blocks are in use), and a request whose blocks are short waits for the next plan.
static void s_plan_running(sched_t *s, ls_msg_step_items_t *items, uint32_t *budget, bool decodes) {
    uint32_t bs = kv_block_size(s->kv);
    bool may_preempt = s->n_flight == 0;
    for (req_t *r = s->running.head, *next; r && *budget > 0; r = next) {
        next = r->next;
        uint32_t at = sched_plan_computed(r), left = sched_plan_len(r) - at;
        if (r->in_plan || (left == 1) != decodes || !s_plan_has_more(s, r))
            continue;
        uint32_t chunk = sched_min_u32(sched_min_u32(left, (uint32_t)s->cfg.chunked_prefill_size), *budget);
        if (sched_reserve(s, r, at + chunk, false) < 0) {
            // Short of blocks: a prompt chunk shrinks to what fits. When nothing fits (always
            // the case for a decode), preempt until one token fits; failing that, r was the
            // newest unplanned request and preempted itself, so every newer one is planned.
            if (r->n_blocks * bs == at) {
                if (!may_preempt)
                    continue;
                if (sched_reserve(s, r, at + 1, true) < 0)
                    break;
            }
            chunk = sched_min_u32(chunk, r->n_blocks * bs - at);
        }
        next = r->next;  // preemption removed requests from the tail
        s_plan_add(s, items, r, chunk);
        *budget -= chunk;
    }
}

// The slots r's adapters would take (slot[k] for r->ads[k]; -1: it has one already), or -1
// when they do not all fit; nothing is assigned here. A mix's components are kept out of each
// other's way (keep), and each pick leaves out the slots promised to those before it.
static int s_slots_pick(sched_t *s, const req_t *r, int *slot) {
    for (uint32_t k = 0; k < r->n_ads; k++) {
        slot[k] = -1;
        if (r->ads[k]->slot < 0 && (slot[k] = lora_slot_pick(s->lora, r->ads, (int)r->n_ads, slot, (int)k)) < 0)
            return -1;
    }
    return 0;
}

// Waiting requests in admission order, within the budget, the running cap, the slot
// constraint and the pages (its adapters' and its KV blocks'); then age those that were
// passed over. Short of slots a request is passed over; short of pages admission stops, as
// admitting later requests instead would starve it.
static void s_plan_admit(sched_t *s, ls_msg_step_items_t *items, uint32_t *budget, uint64_t now) {
    size_t n;
    req_t **order = s_waiting_order(s, &n);
    uint32_t bs = kv_block_size(s->kv);
    bool gate = false;       // an aged request waits for a slot: no later request may take one
    size_t passed_by = 0;    // 1 + the last place in the order admitted that holds an unpinned slot
    for (size_t i = 0; i < n; i++) {
        req_t *r = order[i];
        if (s->running.n >= (uint32_t)s->cfg.max_running_requests || *budget == 0)
            break;
        // every adapter it uses (a mix's components) resident, then in a slot
        bool resident = true, competes = false;
        for (uint32_t k = 0; k < r->n_ads; k++) {
            lora_adapter_t *ad = r->ads[k];
            if (!ad->resident) {
                sched_adapter_ensure_resident(s, ad, now);
                resident = false;
            }
            competes |= !(ad->pinned && ad->slot >= 0);
        }
        if (!resident || (gate && competes))
            continue;
        int slot[LS_LORA_MIX_MAX];
        if (s_slots_pick(s, r, slot) < 0) {
            // Not blocking: the requests behind it whose adapters fit still go.
            gate |= s_first_class(s, r);
            continue;
        }
        // Its cached prefix first (referenced, so the pages taken next leave it alone), then
        // its adapters' pages, then the blocks of its first chunk.
        uint32_t len = sched_seq_len(r);
        sched_blocks_cap(r, len / bs + 1);
        uint32_t hit = kv_match(s->kv, sched_key(r), r->tokens, len, r->blocks, &r->cache_node);
        r->n_blocks = r->n_published = hit;
        r->computed = hit * bs;
        uint32_t chunk = sched_min_u32(sched_min_u32(len - r->computed, (uint32_t)s->cfg.chunked_prefill_size), *budget);
        bool placed = true;
        for (uint32_t k = 0; k < r->n_ads && placed; k++)
            placed = slot[k] < 0 || sched_slot_fill(s, r->ads[k], slot[k], r->ads, (int)r->n_ads, false) == 0;
        if (!placed || sched_reserve(s, r, r->computed + chunk, false) < 0) {
            sched_free_blocks(s, r);
            if (s->running.n == 0) {
                // Nothing runs, so only the pinned adapters hold pages: it never fits (the
                // pinned ones changed since it came, or its blocks were counted without them).
                order[i] = NULL;
                sched_req_finish(s, r, NULL, LS_FINISH_REASON_ERROR,
                                 "its KV blocks and adapters do not fit the GPU pool beside the pinned adapters");
                continue;
            }
            break;  // the pool is full: admitting later requests instead would starve this one
        }
        for (uint32_t k = 0; k < r->n_ads; k++)
            s->stats.adapter_residency_hits += slot[k] < 0;
        s->stats.prefix_hit_tokens += r->computed;
        if (!r->admitted)
            r->cached_tokens = r->computed;
        sched_list_remove(r);
        sched_list_push_back(&s->running, r);
        sched_tenant_run(s, r, 1);
        r->preempted = false;
        if (r->skipped > s->stats.max_skipped)
            s->stats.max_skipped = r->skipped;
        r->skipped = 0;
        if (competes)
            passed_by = i + 1;
        s_plan_add(s, items, r, chunk);
        *budget -= chunk;
    }
    // Those still waiting ahead of a slot user admitted after them were passed over. One whose
    // adapter is still loading is not: the scheduler is not choosing against it.
    for (size_t i = 0; i < passed_by; i++) {
        req_t *r = order[i];
        if (!r)
            continue;  // failed above
        bool resident = true;
        for (uint32_t k = 0; k < r->n_ads; k++)
            resident &= r->ads[k]->resident;
        if (r->list == &s->waiting && resident)
            r->skipped++;
    }
    free(order);
}

// While the step runs, fill free or idle slots with the adapters of the requests next in line,
// on free pages only (sched_slot_fill ahead).
static void s_prefetch(sched_t *s) {
    int slots = lora_slots(s->lora);
    if (slots == 0)
        return;
    size_t n;
    req_t **order = s_waiting_order(s, &n);
    lora_adapter_t **keep = sched_alloc(NULL, (size_t)slots * sizeof *keep);
    int nkeep = 0;
    bool full = false;
    for (size_t i = 0; i < n && nkeep < slots && !full; i++)
        for (uint32_t c = 0; c < order[i]->n_ads && nkeep < slots && !full; c++) {
            lora_adapter_t *ad = order[i]->ads[c];
            if (!ad->resident)
                continue;
            bool kept = false;
            for (int k = 0; k < nkeep && !kept; k++)
                kept = keep[k] == ad;
            if (kept)
                continue;
            if (ad->slot < 0) {
                int slot = lora_slot_pick(s->lora, keep, nkeep, NULL, 0);
                if (slot < 0 || sched_slot_fill(s, ad, slot, keep, nkeep, true) < 0) {
                    full = true;
                    break;
                }
            }
            keep[nkeep++] = ad;
        }
    free(keep);
    free(order);
}

// After a worker restart the CPU tier is refilled with what it held, so the first requests
// for those adapters find them there (one try each; a request reloads on its own otherwise).
static void s_restore_upkeep(sched_t *s, uint64_t now) {
    for (int i = 0; i < lora_count(s->lora); i++) {
        lora_adapter_t *ad = lora_at(s->lora, i);
        if (!ad->restore)
            continue;
        ad->restore = false;
        if (ad->confirmed && !ad->unloading)
            sched_adapter_ensure_resident(s, ad, now);
    }
}

// With a step in flight nothing is preempted, so a request whose blocks are full waits for a
// plan that may preempt: plan ahead only when every running request with more to run can take
// its next token's block (idle adapters' pages included), else wait for the step in flight
// and plan then.
static bool s_ahead_fits(const sched_t *s) {
    uint32_t bs = kv_block_size(s->kv), need = 0;
    for (const req_t *r = s->running.head; r; r = r->next)
        need += s_plan_has_more(s, r) && r->n_blocks * bs == sched_plan_computed(r);
    return need <= kv_available(s->kv) + sched_pages_evictable(s, NULL, 0);
}

// One plan: built, sent and recorded in flight; false when there was nothing to run.
static bool s_plan_one(sched_t *s, uint64_t now) {
    if (s->n_flight > 0 && !s_ahead_fits(s))
        return false;
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_STEP_PLAN);
    ls_msg_step_items_t *items = &m.u.step_plan.items;
    items->v = sched_alloc(NULL, (s->running.n + s->waiting.n + 1) * sizeof *items->v);
    flight_t *f = &s->flight[s->n_flight];
    f->n = 0;
    uint32_t budget = (uint32_t)s->cfg.max_num_batched_tokens;
    s_plan_running(s, items, &budget, true);
    s_plan_running(s, items, &budget, false);
    s_plan_admit(s, items, &budget, now);
    for (req_t *r = s->running.head; r; r = r->next)
        r->in_plan = false;
    if (items->n == 0) {
        ls_msg_clear(&m);
        return false;
    }
    m.rid = m.u.step_plan.step = ++s->step;
    m.u.step_plan.released.v = s->released;
    m.u.step_plan.released.n = s->n_released;
    s->released = NULL;
    s->n_released = s->cap_released = 0;
    for (size_t i = 0; i < items->n; i++) {
        lora_adapter_t *ad = lora_find(s->lora, items->v[i].adapter_id);
        if (ad)
            lora_slot_touch(s->lora, ad, s->step);
        for (size_t k = 0; k < items->v[i].mix.n; k++)
            if ((ad = lora_find(s->lora, items->v[i].mix.v[k].adapter_id)))
                lora_slot_touch(s->lora, ad, s->step);
    }
    sched_emit(s, SCHED_TO_WORKERS, 0, NULL, &m);
    ls_msg_clear(&m);
    f->step = s->step;
    f->sent_at = now;
    s->n_flight++;
    s->stats.steps++;
    return true;
}

void sched_schedule(sched_t *s, uint64_t now) {
    if (!s->ready || s->n_flight >= s->max_flight)
        return;
    s_restore_upkeep(s, now);
    s_pin_upkeep(s, now);
    bool sent = false;
    while (s->n_flight < s->max_flight && s_plan_one(s, now))
        sent = true;
    if (sent)
        s_prefetch(s);
}
