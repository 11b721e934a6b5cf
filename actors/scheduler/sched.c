// sched — the scheduler's decision core; the policy and its invariants are in
// docs/scheduling.md, the interface in sched.h. This file holds the requests, their KV and the
// events; the step plan is sched_plan.c's, the adapters sched_adapters.c's (sched_impl.h).
//
// One step is in flight at a time: a plan is built only when the previous step's result is
// in, so between plans nothing the workers read (block tables, slots) can change under them.
// That is also why freeing an aborted request's blocks at once is safe even while a step that
// contains it runs: nobody can be given those blocks before that step is over.
#include "sched_impl.h"

#include <assert.h>
#include <czmq.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv.h"
#include "ls_hash.h"
#include "ls_log.h"
#include "ls_limits.h"

// ---------------------------------------------------------------------------------------------
// small helpers

// Out of memory is fatal here, as in Redis: a scheduler that cannot hold its own state cannot
// answer its requests correctly, and a crash is answered by the launcher's supervision.
void *sched_alloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        ls_error(0, "scheduler out of memory (%zu bytes)", n);
        abort();
    }
    return q;
}

void sched_grow_array(void **v, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap)
        return;
    size_t cap2 = *cap ? *cap : 8;
    while (cap2 < need)
        cap2 *= 2;
    *v = sched_alloc(*v, cap2 * elem);
    *cap = cap2;
}

char *sched_strdup(const char *s) {
    return s ? strcpy(sched_alloc(NULL, strlen(s) + 1), s) : NULL;
}

void *sched_memdup(const void *p, size_t n) { return n ? memcpy(sched_alloc(NULL, n), p, n) : NULL; }


// A request without a seed gets one derived from its rid (splitmix64), so replay samples alike.
static uint64_t s_seed_of(uint64_t rid) {
    return ls_hash_mix64(rid + 0x9e3779b97f4a7c15ull);
}

static void s_rid_key(uint64_t rid, char key[24]) { snprintf(key, 24, "%" PRIu64, rid); }

void sched_emit(sched_t *s, sched_dest_kind_t kind, int rank, void *reply, const ls_msg_t *msg) {
    const sched_dest_t dest = {.kind = kind, .rank = rank, .reply = reply};
    s->io.emit(s->io.arg, &dest, msg);
}

// Emits a request's output and clears *msg, or (while a step's result is handled) keeps it,
// taking *msg over, until s_flush_deferred.
static void s_emit_output(sched_t *s, void *reply, ls_msg_t *msg) {
    if (!s->deferring) {
        sched_emit(s, SCHED_TO_OUTPUT, 0, reply, msg);
        ls_msg_clear(msg);
        return;
    }
    if (s->n_deferred == s->cap_deferred) {
        s->cap_deferred = s->cap_deferred ? 2 * s->cap_deferred : 64;
        s->deferred = sched_alloc(s->deferred, s->cap_deferred * sizeof *s->deferred);
    }
    s->deferred[s->n_deferred].dest = (sched_dest_t){.kind = SCHED_TO_OUTPUT, .reply = reply};
    s->deferred[s->n_deferred++].msg = *msg;
    ls_msg_init(msg, msg->type);  // the copy owns the contents now
}

void sched_reply_release(sched_t *s, void **reply) {
    if (*reply && s->io.release) {
        if (s->deferring) {  // after the outputs that still name it
            if (s->n_deferred_releases == s->cap_deferred_releases) {
                s->cap_deferred_releases = s->cap_deferred_releases ? 2 * s->cap_deferred_releases : 64;
                s->deferred_releases =
                    sched_alloc(s->deferred_releases, s->cap_deferred_releases * sizeof *s->deferred_releases);
            }
            s->deferred_releases[s->n_deferred_releases++] = *reply;
        } else
            s->io.release(s->io.arg, *reply);
    }
    *reply = NULL;
}

static void s_flush_deferred(sched_t *s) {
    s->deferring = false;
    for (size_t i = 0; i < s->n_deferred; i++) {
        s->io.emit(s->io.arg, &s->deferred[i].dest, &s->deferred[i].msg);
        ls_msg_clear(&s->deferred[i].msg);
    }
    for (size_t i = 0; i < s->n_deferred_releases; i++)
        s->io.release(s->io.arg, s->deferred_releases[i]);
    s->n_deferred = s->n_deferred_releases = 0;
}

static void s_error_reply(sched_t *s, void *reply, uint64_t rid, uint32_t code, uint32_t ref_type,
                          const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static void s_error_reply(sched_t *s, void *reply, uint64_t rid, uint32_t code, uint32_t ref_type,
                          const char *fmt, ...) {
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    ls_warn(rid, "refused: %s", text);
    s->stats.requests_overloaded += code == LS_ERROR_CODE_OVERLOADED;
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ERROR);
    m.rid = rid;
    m.u.error.code = code;
    m.u.error.message = sched_strdup(text);
    m.u.error.ref_type = ref_type;
    sched_emit(s, SCHED_TO_REPLY, 0, reply, &m);
    ls_msg_clear(&m);
}

// Deep copy of sampling parameters (the arrays are owned by each copy).
// For the detokenizer's first TokenOut: everything but the grammar, which it has no use for.
static void s_sampling_copy(ls_msg_sampling_params_t *dst, const ls_msg_sampling_params_t *src) {
    *dst = *src;
    dst->grammar = (ls_text_t){0};
    dst->stop_token_ids.v = sched_memdup(src->stop_token_ids.v, src->stop_token_ids.n * sizeof(int32_t));
    dst->stop.v = sched_memdup(src->stop.v, src->stop.n * sizeof *src->stop.v);
    for (size_t i = 0; i < src->stop.n; i++)  // text: len bytes and the NUL after them
        dst->stop.v[i].s = src->stop.v[i].s ? sched_memdup(src->stop.v[i].s, src->stop.v[i].len + 1) : NULL;
}

static void s_sampling_free(ls_msg_sampling_params_t *sp) {
    free(sp->stop_token_ids.v);
    for (size_t i = 0; i < sp->stop.n; i++)
        free(sp->stop.v[i].s);
    free(sp->stop.v);
    free(sp->grammar.s);
    memset(sp, 0, sizeof *sp);
}

// ---------------------------------------------------------------------------------------------
// request lists

void sched_list_remove(req_t *r) {
    req_list_t *l = r->list;
    if (r->prev)
        r->prev->next = r->next;
    else
        l->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        l->tail = r->prev;
    r->prev = r->next = NULL;
    r->list = NULL;
    l->n--;
    l->tokens -= r->listed_tokens;
}


static void s_list_joined(req_list_t *l, req_t *r) {
    r->list = l;
    r->listed_tokens = sched_seq_len(r);
    l->tokens += r->listed_tokens;
    l->n++;
}

void sched_list_push_back(req_list_t *l, req_t *r) {
    r->prev = l->tail;
    r->next = NULL;
    if (l->tail)
        l->tail->next = r;
    else
        l->head = r;
    l->tail = r;
    s_list_joined(l, r);
}

static void s_list_push_front(req_list_t *l, req_t *r) {
    r->next = l->head;
    r->prev = NULL;
    if (l->head)
        l->head->prev = r;
    else
        l->tail = r;
    l->head = r;
    s_list_joined(l, r);
}


// A request's tenant is its adapter, the base model being one more (ad NULL): the queue bound
// per tenant and the fair share count by it (docs/scheduling.md, "Admission and fair share").
uint32_t sched_tenant_running(const sched_t *s, const lora_adapter_t *ad) {
    return ad ? ad->running : s->base_running;
}

static uint32_t s_tenant_waiting(const sched_t *s, const lora_adapter_t *ad) {
    return ad ? ad->refs - ad->running : s->base_refs - s->base_running;
}

// r joins (d = 1) or leaves (d = -1) the running list.
void sched_tenant_run(sched_t *s, const req_t *r, int d) {
    for (uint32_t i = 0; i < r->n_ads; i++)
        r->ads[i]->running += (uint32_t)d;
    if (!r->ad)
        s->base_running += (uint32_t)d;
}

// ---------------------------------------------------------------------------------------------
// outputs

// One TokenOut: the token of `o` (none when NULL), with `finish`.
static void s_emit_out(sched_t *s, req_t *r, const ls_msg_step_output_t *o, uint32_t finish, const char *error) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_TOKEN_OUT);
    m.rid = r->rid;
    ls_msg_token_out_t *t = &m.u.token_out;
    if (o) {
        t->token_ids.v = sched_memdup(&o->token_id, sizeof o->token_id);
        t->token_ids.n = 1;
        if (r->sampling.logprobs) {
            t->logprobs.v = sched_memdup(&o->logprob, sizeof o->logprob);
            t->logprobs.n = 1;
        }
        if (r->sampling.top_logprobs) {
            size_t n = o->top_ids.n < o->top_logprobs.n ? o->top_ids.n : o->top_logprobs.n;
            t->top_ids.v = sched_memdup(o->top_ids.v, n * sizeof(int32_t));
            t->top_logprobs.v = sched_memdup(o->top_logprobs.v, n * sizeof(float));
            t->top_ids.n = t->top_logprobs.n = n;
        }
    }
    t->finish = finish;
    if (!r->sent_first) {
        t->first = true;
        s_sampling_copy(&t->sampling, &r->sampling);
        t->added_tokens = r->added;  // moved: needed once
        r->added = (ls_msg_added_tokens_t){0};
        r->sent_first = true;
    }
    t->prompt_tokens = r->n_prompt;
    t->completion_tokens = r->n_out;
    t->cached_tokens = r->cached_tokens;
    t->error = sched_strdup(error);
    s_emit_output(s, r->reply, &m);
}

// ---------------------------------------------------------------------------------------------
// KV of one request

void sched_free_blocks(sched_t *s, req_t *r) {
    while (r->n_blocks > 0)
        kv_release(s->kv, r->blocks[--r->n_blocks]);  // last to first: leaves go idle first
    r->computed = r->n_published = 0;
    r->ahead = r->ahead_out = 0;  // the steps in flight for it run on blocks it no longer has
    r->chunked = false;
    r->cache_node = NULL;
    r->cache_done = false;
}

// Publish r's computed full blocks in the prefix tree so later requests can share them.
static void s_publish(sched_t *s, req_t *r) {
    uint32_t bs = kv_block_size(s->kv);
    while (!r->cache_done && r->n_published < r->computed / bs) {
        kv_node_t *node = kv_insert(s->kv, sched_key(r), r->cache_node, r->tokens + (size_t)r->n_published * bs,
                                    r->blocks[r->n_published]);
        if (!node) {
            r->cache_done = true;
            break;
        }
        r->cache_node = node;
        r->n_published++;
    }
}

static void s_preempt(sched_t *s, req_t *r) {
    ls_info(r->rid, "preempted: KV blocks ran out (%u tokens will be recomputed)", sched_seq_len(r));
    sched_free_blocks(s, r);
    sched_list_remove(r);
    sched_tenant_run(s, r, -1);
    r->preempted = true;
    s_list_push_front(&s->waiting, r);
    s->stats.preemptions++;
}

void sched_blocks_cap(req_t *r, uint32_t need) {
    size_t cap = r->cap_blocks;
    sched_grow_array((void **)&r->blocks, &cap, need, sizeof *r->blocks);
    r->cap_blocks = (uint32_t)cap;
}

// Give r blocks for its first `tokens` tokens (it keeps those it got on failure): free ones,
// idle cached ones, idle adapters' pages (not r's own adapters', which it is about to run).
// When none are left and may_preempt, preempt the newest running request not in the plan
// being built; r itself is one, so with may_preempt -1 means r was preempted.
int sched_reserve(sched_t *s, req_t *r, uint32_t tokens, bool may_preempt) {
    uint32_t bs = kv_block_size(s->kv);
    uint32_t need = (tokens + bs - 1) / bs;
    sched_blocks_cap(r, need);
    while (r->n_blocks < need) {
        uint32_t b;
        if (sched_page_take(s, r->ads, (int)r->n_ads, &b) == 0) {
            r->blocks[r->n_blocks++] = b;
            continue;
        }
        if (!may_preempt)
            return -1;
        req_t *victim = s->running.tail;
        while (victim && victim->in_plan)
            victim = victim->prev;
        assert(victim);  // r itself is running and not yet planned
        s_preempt(s, victim);
        if (victim == r)
            return -1;
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// retiring requests

// Forget r: its table entry, its reply handle and its memory (its blocks are already free).
static void s_req_free(sched_t *s, req_t *r) {
    char key[24];
    s_rid_key(r->rid, key);
    zhashx_delete(s->reqs, key);
    sched_reply_release(s, &r->reply);
    s_sampling_free(&r->sampling);
    for (size_t i = 0; i < r->added.n; i++)
        free(r->added.v[i].content);
    free(r->added.v);
    free(r->stop);
    free(r->tokens);
    free(r->blocks);
    free(r->mix_key);
    free(r);
}

static void s_retire(sched_t *s, req_t *r, uint32_t finish) {
    switch (finish) {
    case LS_FINISH_REASON_ABORT: s->stats.requests_aborted++; break;
    case LS_FINISH_REASON_ERROR: s->stats.requests_failed++; break;
    default: s->stats.requests_finished++; break;
    }
    sched_free_blocks(s, r);
    if (r->list == &s->running)
        sched_tenant_run(s, r, -1);
    sched_list_remove(r);
    if (r->admitted) {
        sched_grow_array((void **)&s->released, &s->cap_released, s->n_released + 1, sizeof *s->released);
        s->released[s->n_released++] = r->rid;
    }
    lora_adapter_t *ads[LS_LORA_MIX_MAX];
    uint32_t n = r->n_ads;
    memcpy(ads, r->ads, n * sizeof *ads);
    s_req_free(s, r);
    for (uint32_t i = 0; i < n; i++) {
        ads[i]->refs--;
        sched_adapter_unload_maybe(s, ads[i]);
    }
    if (n == 0)
        s->base_refs--;
}

void sched_req_finish(sched_t *s, req_t *r, const ls_msg_step_output_t *o, uint32_t finish, const char *error) {
    s_emit_out(s, r, o, finish, error);
    s_retire(s, r, finish);
}

// ---------------------------------------------------------------------------------------------
// the workers as a group

// The workers restarted (fail = false: requests are recomputed) or are gone (fail = true: every
// request is answered with an error). Either way their KV cache, CPU tier and slots are empty.
static op_t *s_first_sent_op(const sched_t *s) {
    op_t *op = s->ops;
    while (op && op->deadline == 0)
        op = op->next;
    return op;
}

static void s_group_reset(sched_t *s, bool fail, const char *why) {
    s->n_flight = 0;
    // Nothing is resident any more; clear that first so the requests ended below start no
    // unload towards the lost workers.
    for (int i = 0; i < lora_count(s->lora); i++) {
        lora_adapter_t *ad = lora_at(s->lora, i);
        ad->restore = ad->resident && !fail;
        ad->resident = false;
    }
    sched_slots_vacate_all(s);
    lora_slots_reset(s->lora, lora_slots(s->lora));
    if (fail) {
        while (s->running.head)
            sched_req_finish(s, s->running.head, NULL, LS_FINISH_REASON_ERROR, why);
        while (s->waiting.head)
            sched_req_finish(s, s->waiting.head, NULL, LS_FINISH_REASON_ERROR, why);
    } else
        while (s->running.tail)
            s_preempt(s, s->running.tail);  // newest first, so the oldest ends up first in line
    kv_reset(s->kv);
    // The commands in flight are lost with the workers that had them. Completing one can end
    // another (an unload waiting for a load), so look again from the head each time.
    for (op_t *op; (op = s_first_sent_op(s));) {
        lora_adapter_t *ad = lora_find(s->lora, op->adapter_id);
        op->answered = (1u << s->cfg.tp_size) - 1;
        if (op->kind == OP_RELOAD || op->kind == OP_EVICT) {
            // Nobody asked: a request that still needs the adapter reloads it.
            if (ad && op->kind == OP_RELOAD)
                ad->loading = false;
            sched_op_free(s, op);
            if (ad)
                sched_adapter_unload_maybe(s, ad);
            continue;
        }
        // An unload is done (the workers lost the adapter); a load failed.
        op->ok = op->kind == OP_UNLOAD ? op->answered : 0;
        op->code = LS_ERROR_CODE_UNAVAILABLE;
        free(op->reason);
        op->reason = sched_strdup(why);
        sched_op_complete(s, op);
    }
    if (fail) {
        s->ready = false;
        s->down = true;
        s->have_caps = 0;
    }
}

static void s_refuse(sched_t *s, ls_msg_t *msg, void *reply, uint32_t code, const char *why);
static void s_replay_pending(sched_t *s);

static void s_start_serving(sched_t *s, uint64_t now) {
    worker_caps_t c = s->caps[0];
    for (int r = 1; r < s->cfg.tp_size; r++) {
        const worker_caps_t *w = &s->caps[r];
        if (w->block_size != c.block_size) {
            ls_error(0, "worker %d has block_size %u, worker 0 has %u: not serving", r, w->block_size, c.block_size);
            return;
        }
        c.kv_blocks = sched_min_u32(c.kv_blocks, w->kv_blocks);
        c.max_context = sched_min_u32(c.max_context, w->max_context);
        c.slots = sched_min_u32(c.slots, w->slots);
        // 0 is "no count limit": the limit of the group is the smallest one set
        c.max_loaded = !c.max_loaded ? w->max_loaded : !w->max_loaded ? c.max_loaded : sched_min_u32(c.max_loaded, w->max_loaded);
        c.cpu_bytes = c.cpu_bytes < w->cpu_bytes ? c.cpu_bytes : w->cpu_bytes;
        c.lora_max_bytes = c.lora_max_bytes > w->lora_max_bytes ? c.lora_max_bytes : w->lora_max_bytes;
        c.vocab = sched_min_u32(c.vocab, w->vocab);
    }
    kv_t *kv = kv_new(c.kv_blocks, c.block_size);
    if (s->kv)
        sched_slots_vacate_all(s);  // their pages are in the table replaced here
    if (!kv || lora_slots_reset(s->lora, (int)c.slots) < 0) {
        ls_error(0, "cannot size the KV table for %u blocks", c.kv_blocks);
        kv_destroy(&kv);
        return;
    }
    kv_destroy(&s->kv);
    s->kv = kv;
    s->max_context = c.max_context;
    s->max_loaded = c.max_loaded;
    s->cpu_bytes = c.cpu_bytes;
    s->lora_max_bytes = c.lora_max_bytes;
    s->vocab = c.vocab;
    s->ready = true;
    s->down = false;
    ls_info(0, "serving: %d worker(s), %u pages (KV blocks of %u tokens, and adapters), context %u, %u adapter slots, CPU tier %.1f MB "
               "(at most %u adapters; 0: no count limit)",
            s->cfg.tp_size, c.kv_blocks, c.block_size, c.max_context, c.slots, (double)c.cpu_bytes / 1e6, c.max_loaded);
    s_replay_pending(s);
}

// ---------------------------------------------------------------------------------------------
// events

static void s_pend(sched_t *s, uint64_t now, ls_msg_t *msg, void *reply) {
    pending_t *p = sched_alloc(NULL, sizeof *p);
    memcpy(&p->msg, msg, sizeof *msg);
    ls_msg_init(msg, (ls_msg_type_t)msg->type);
    p->reply = reply;
    p->now = now;
    p->next = NULL;
    s->n_pending++;
    if (s->pending_tail)
        s->pending_tail->next = p;
    else
        s->pending = p;
    s->pending_tail = p;
}

// The workers are not ready yet: keep the command for later (true), or they failed and it is
// refused (true). False: go ahead.
static bool s_held(sched_t *s, uint64_t now, ls_msg_t *msg, void *reply) {
    if (s->ready)
        return false;
    if (s->down)
        s_refuse(s, msg, reply, LS_ERROR_CODE_UNAVAILABLE, "the workers are down");
    else if (s->n_pending >= s->cfg.max_waiting_requests)
        s_refuse(s, msg, reply, LS_ERROR_CODE_OVERLOADED,
                 "the workers are not ready and --max-waiting-requests commands already wait for them");
    else
        s_pend(s, now, msg, reply);
    return true;
}

static void s_stop_add(req_t *r, int32_t id) {
    for (size_t i = 0; i < r->n_stop; i++)
        if (r->stop[i] == id)
            return;
    r->stop = sched_alloc(r->stop, (r->n_stop + 1) * sizeof *r->stop);
    r->stop[r->n_stop++] = id;
}

static void s_gauges(sched_t *s) {
    s->stats.waiting = s->waiting.n;
    s->stats.running = s->running.n;
    uint32_t in_slots;
    s->stats.kv_blocks_adapters = sched_pages_adapters(s, &in_slots);
    s->stats.adapter_gpu_resident = in_slots;
    s->stats.kv_blocks_used = s->kv ? kv_used(s->kv) - s->stats.kv_blocks_adapters : 0;
    s->stats.kv_blocks_total = s->kv ? kv_total(s->kv) : 0;
    s->stats.kv_blocks_cached = s->kv ? kv_cached(s->kv) : 0;
    s->stats.kv_block_size = s->kv ? kv_block_size(s->kv) : 0;
    s->stats.lora_slots = (uint64_t)lora_slots(s->lora);
    uint64_t refs = 0, resident = 0;
    for (int i = 0; i < lora_count(s->lora); i++) {
        refs += lora_at(s->lora, i)->refs;
        resident += lora_at(s->lora, i)->resident;
    }
    s->stats.adapter_refs = refs;
    s->stats.adapter_cpu_resident = resident;
    uint64_t reserved, waiting = 0;
    lora_cpu_bytes(s->lora, s->lora_max_bytes, &s->stats.adapter_cpu_bytes_used, &reserved);
    s->stats.adapter_cpu_bytes_total = s->cpu_bytes;
    for (const op_t *op = s->ops; op; op = op->next)
        waiting += op->queued_at != 0;
    s->stats.adapter_loads_waiting = waiting;
}

// Every event ends here: plan the next step if none is in flight, refresh the gauges.
static void s_after(sched_t *s, uint64_t now) {
    sched_loads_send_queued(s);
    sched_schedule(s, now);
    s_flush_deferred(s);
    s_gauges(s);
}

// A mix's components into ads (their adapters, NULL where unknown). 0, or -1 with why: a
// broken rule (ls_msg_mix_check), an adapter as well, an id twice, an adapter not loaded or
// being unloaded (*code NOT_FOUND), more components than slots.
static int s_mix_find(const sched_t *s, const ls_msg_tokenized_req_t *tr, lora_adapter_t **ads, uint32_t *code,
                      char *why, size_t whylen) {
    *code = LS_ERROR_CODE_BAD_REQUEST;
    if (ls_msg_mix_check(&tr->mix, true, why, whylen) < 0)
        return -1;
    if (tr->adapter_id && *tr->adapter_id) {
        snprintf(why, whylen, "an adapter and a mix of adapters: give one");
        return -1;
    }
    if (tr->mix.n > (size_t)lora_slots(s->lora)) {
        snprintf(why, whylen, "a mix of %zu adapters needs as many GPU slots at once; the workers have %d "
                 "(--max-loras-per-batch)", tr->mix.n, lora_slots(s->lora));
        return -1;
    }
    for (size_t i = 0; i < tr->mix.n; i++) {
        const ls_msg_mix_part_t *p = &tr->mix.v[i];
        lora_adapter_t *ad = ads[i] = lora_find(s->lora, p->adapter_id);
        for (size_t j = 0; j < i; j++)
            if (ads[j] == ad && ad) {
                snprintf(why, whylen, "adapters '%.64s' and '%.64s' of the mix are the same adapter",
                         tr->mix.v[j].name, p->name);
                return -1;
            }
        if (!ad || !ad->confirmed || ad->unloading) {
            *code = LS_ERROR_CODE_NOT_FOUND;
            snprintf(why, whylen, "adapter %.64s (%.64s) of the mix is not loaded%s", p->name, p->adapter_id,
                     ad && ad->unloading ? ": it is being unloaded" : "");
            return -1;
        }
    }
    return 0;
}

// GPU pool pages a request's adapters (ad, or the mix's n_mix) take, and the pinned adapters'
// besides, which they always hold: what its KV blocks cannot have.
static uint64_t s_fixed_pages(const sched_t *s, const lora_adapter_t *ad, lora_adapter_t *const *mix, size_t n_mix) {
    uint64_t n = 0;
    for (int i = 0; i < lora_count(s->lora); i++) {
        const lora_adapter_t *a = lora_at(s->lora, i);
        bool uses = a == ad;
        for (size_t k = 0; k < n_mix && !uses; k++)
            uses = mix[k] == a;
        if (uses || (a->pinned && a->confirmed))
            n += a->pages_need;
    }
    return n;
}

// 0, or -1 after telling the asker why the request is refused.
static int s_request_check(sched_t *s, const ls_msg_t *msg, void *reply, const lora_adapter_t *ad, uint32_t max_new) {
    const ls_msg_tokenized_req_t *tr = &msg->u.tokenized_req;
    const uint64_t rid = msg->rid;
    const uint32_t ref = LS_MSG_TOKENIZED_REQ;
    char key[24], mix_why[320];
    lora_adapter_t *mix_ads[LS_LORA_MIX_MAX];
    uint32_t mix_code;
    s_rid_key(rid, key);
    uint64_t n_prompt = tr->input_ids.n, bs = kv_block_size(s->kv);
    uint64_t need_blocks = (n_prompt + max_new - 1 + bs - 1) / bs;
    // A token the model does not have would fail the whole step it runs in, for every request
    // batched with it: refuse it here, alone. A request of one adapter may have its added ids
    // (docs/adapters.md), which the tokenizer checked against its added tokens.
    uint64_t vocab = s->vocab + (tr->mix.n || !tr->adapter_id || !*tr->adapter_id ? 0 : tr->added_tokens.n);
    size_t bad_at = n_prompt;
    for (size_t i = 0; i < n_prompt && bad_at == n_prompt; i++)
        if (tr->input_ids.v[i] < 0 || (uint64_t)tr->input_ids.v[i] >= vocab)
            bad_at = i;
    if (rid == 0)  // the workers' per-request state knows no request 0
        s_error_reply(s, reply, rid, LS_ERROR_CODE_BAD_REQUEST, ref, "request id 0 names no request");
    else if (n_prompt == 0)
        s_error_reply(s, reply, rid, LS_ERROR_CODE_BAD_REQUEST, ref, "the prompt is empty");
    else if (bad_at < n_prompt)
        s_error_reply(s, reply, rid, LS_ERROR_CODE_BAD_REQUEST, ref,
                      "token id %d at position %zu is outside the model's vocabulary of %u%s", tr->input_ids.v[bad_at],
                      bad_at, s->vocab, vocab > s->vocab ? " and its adapter's added tokens" : "");
    else if (tr->sampling.n > 1)
        s_error_reply(s, reply, rid, LS_ERROR_CODE_BAD_REQUEST, ref,
                      "n = %u: the tokenizer expands n > 1 into separate requests", tr->sampling.n);
    else if (zhashx_lookup(s->reqs, key))
        s_error_reply(s, reply, rid, LS_ERROR_CODE_BAD_REQUEST, ref, "request id %" PRIu64 " is already in use", rid);
    else if (tr->mix.n && s_mix_find(s, tr, mix_ads, &mix_code, mix_why, sizeof mix_why) < 0)
        s_error_reply(s, reply, rid, mix_code, ref, "%s", mix_why);
    else if (tr->adapter_id && *tr->adapter_id && (!ad || !ad->confirmed || ad->unloading))
        s_error_reply(s, reply, rid, LS_ERROR_CODE_NOT_FOUND, ref, "adapter %s (%s) is not loaded%s",
                      tr->adapter_name ? tr->adapter_name : "?", tr->adapter_id,
                      ad && ad->unloading ? ": it is being unloaded" : "");
    else if (n_prompt + max_new > s->max_context)
        s_error_reply(s, reply, rid, LS_ERROR_CODE_TOO_LARGE, ref,
                      "prompt of %" PRIu64 " tokens plus max_new_tokens %u exceeds the model's context of %u tokens",
                      n_prompt, max_new, s->max_context);
    else if (need_blocks > kv_total(s->kv))
        s_error_reply(s, reply, rid, LS_ERROR_CODE_TOO_LARGE, ref,
                      "prompt of %" PRIu64 " tokens plus max_new_tokens %u needs %" PRIu64
                      " KV blocks; the whole cache has %u",
                      n_prompt, max_new, need_blocks, kv_total(s->kv));
    else if (need_blocks + s_fixed_pages(s, ad, mix_ads, tr->mix.n) > kv_total(s->kv))
        s_error_reply(s, reply, rid, LS_ERROR_CODE_TOO_LARGE, ref,
                      "prompt of %" PRIu64 " tokens plus max_new_tokens %u needs %" PRIu64
                      " KV blocks, and its adapters and the pinned ones %" PRIu64 " pages; the GPU pool has %u",
                      n_prompt, max_new, need_blocks, s_fixed_pages(s, ad, mix_ads, tr->mix.n), kv_total(s->kv));
    else if (n_prompt > s->cfg.max_queued_tokens)
        s_error_reply(s, reply, rid, LS_ERROR_CODE_TOO_LARGE, ref,
                      "prompt of %" PRIu64 " tokens is longer than the whole queue may hold (--max-queued-tokens %" PRIu64 ")",
                      n_prompt, s->cfg.max_queued_tokens);
    else if (tr->deadline_ms && tr->deadline_ms <= tr->arrival_ms)
        s_error_reply(s, reply, rid, LS_ERROR_CODE_TIMEOUT, ref, "the deadline passed before scheduling");
    else if (s->waiting.n >= s->cfg.max_waiting_requests)
        s_error_reply(s, reply, rid, LS_ERROR_CODE_OVERLOADED, ref,
                      "the scheduler's queue is full: %u requests waiting (--max-waiting-requests)", s->waiting.n);
    else if (s_tenant_waiting(s, ad) >= s->cfg.max_tenant_waiting)
        s_error_reply(s, reply, rid, LS_ERROR_CODE_OVERLOADED, ref,
                      "%s%s has %u requests waiting, its share of the queue (--max-tenant-waiting)",
                      ad ? "adapter " : "the base model", ad ? ad->name : "", s_tenant_waiting(s, ad));
    else if (s->waiting.tokens + n_prompt > s->cfg.max_queued_tokens)
        s_error_reply(s, reply, rid, LS_ERROR_CODE_OVERLOADED, ref,
                      "the scheduler's queue holds %" PRIu64 " tokens; %" PRIu64 " more exceed --max-queued-tokens",
                      s->waiting.tokens, n_prompt);
    else
        return 0;
    s->stats.requests_refused++;
    return -1;
}

static void s_request(sched_t *s, uint64_t now, ls_msg_t *msg, void *reply) {
    ls_msg_tokenized_req_t *tr = &msg->u.tokenized_req;
    uint64_t rid = msg->rid;
    // a mix's tenant is its first component (checked with the rest in s_request_check)
    const char *first = tr->mix.n ? tr->mix.v[0].adapter_id : tr->adapter_id;
    lora_adapter_t *ad = first && *first ? lora_find(s->lora, first) : NULL;
    uint64_t n_prompt = tr->input_ids.n;
    uint32_t max_new = tr->sampling.max_new_tokens;
    if (max_new == 0) {
        // The server's default never makes a request too large: it is cut to the context.
        max_new = (uint32_t)s->cfg.default_max_new_tokens;
        if (n_prompt < s->max_context && n_prompt + max_new > s->max_context)
            max_new = s->max_context - (uint32_t)n_prompt;
    }
    if (s_request_check(s, msg, reply, ad, max_new) < 0) {
        sched_reply_release(s, &reply);
        return;
    }
    req_t *r = sched_alloc(NULL, sizeof *r);
    memset(r, 0, sizeof *r);
    r->rid = rid;
    r->seq = ++s->next_seq;
    r->reply = reply;
    r->ad = ad;
    r->mixed = tr->mix.n > 0;
    if (r->mixed) {
        // the key: "mix", then " id*weight" per component in order, the weight in hex (exact)
        size_t len = 0, cap = 4;
        for (size_t i = 0; i < tr->mix.n; i++) {
            r->ads[i] = lora_find(s->lora, tr->mix.v[i].adapter_id);  // found: checked
            r->weights[i] = tr->mix.v[i].weight;
            cap += strlen(r->ads[i]->id) + 32;
        }
        r->mix_key = sched_alloc(NULL, cap);
        len += (size_t)snprintf(r->mix_key, cap, "mix");
        for (size_t i = 0; i < tr->mix.n; i++)
            len += (size_t)snprintf(r->mix_key + len, cap - len, " %s*%a", r->ads[i]->id, (double)r->weights[i]);
        r->n_ads = (uint32_t)tr->mix.n;
    } else if (ad) {
        r->ads[0] = ad;
        r->n_ads = 1;
    }
    r->sampling = tr->sampling;  // moved: the message no longer owns its arrays
    memset(&tr->sampling, 0, sizeof tr->sampling);
    r->added = tr->added_tokens;
    tr->added_tokens = (ls_msg_added_tokens_t){0};
    r->seed = r->sampling.has_seed ? r->sampling.seed : s_seed_of(rid);
    r->n_prompt = (uint32_t)n_prompt;  // below max_context, checked
    r->cap_tokens = r->n_prompt + max_new;
    r->tokens = sched_alloc(NULL, (size_t)r->cap_tokens * sizeof *r->tokens);
    memcpy(r->tokens, tr->input_ids.v, (size_t)n_prompt * sizeof *r->tokens);
    r->max_new = max_new;
    r->min_new = r->sampling.min_new_tokens;
    if (!r->sampling.ignore_eos) {
        for (size_t i = 0; i < s->n_eos; i++)
            s_stop_add(r, s->eos[i]);
        for (size_t i = 0; i < tr->stop_token_ids.n; i++)
            s_stop_add(r, tr->stop_token_ids.v[i]);
        for (size_t i = 0; i < r->sampling.stop_token_ids.n; i++)
            s_stop_add(r, r->sampling.stop_token_ids.v[i]);
    }
    // The deadline is the tokenizer's, on its clock: carry over the time it had left, so the
    // two clocks need not agree.
    if (tr->deadline_ms)
        r->deadline = now + (tr->deadline_ms - tr->arrival_ms) * 1000000ull;
    char key[24];
    s_rid_key(rid, key);
    zhashx_insert(s->reqs, key, r);
    sched_list_push_back(&s->waiting, r);
    for (uint32_t i = 0; i < r->n_ads; i++) {
        r->ads[i]->refs++;
        r->ads[i]->used_at = ++s->clock;
        sched_adapter_ensure_resident(s, r->ads[i], now);
    }
    if (!ad)
        s->base_refs++;
    ls_debug(rid, "queued: %u prompt tokens, max_new_tokens %u, adapter %s%s", r->n_prompt, max_new,
             ad ? ad->name : "-", r->mixed ? " (first of a mix)" : "");
}

static void s_abort(sched_t *s, const ls_msg_t *msg) {
    char key[24];
    s_rid_key(msg->rid, key);
    req_t *r = zhashx_lookup(s->reqs, key);
    if (!r) {
        ls_debug(msg->rid, "Abort for a request that is not here (finished already?)");
        return;
    }
    uint32_t finish = msg->u.abort.finish == LS_FINISH_REASON_STOP ? LS_FINISH_REASON_STOP : LS_FINISH_REASON_ABORT;
    ls_info(msg->rid, "aborted (%s): %s", ls_finish_reason_name(finish), msg->u.abort.reason ? msg->u.abort.reason : "");
    sched_req_finish(s, r, NULL, finish, NULL);
}

static void s_refuse(sched_t *s, ls_msg_t *msg, void *reply, uint32_t code, const char *why) {
    switch (msg->type) {
    case LS_MSG_TOKENIZED_REQ:
        s_error_reply(s, reply, msg->rid, code, msg->type, "%s", why);
        s->stats.requests_refused++;
        break;
    case LS_MSG_LOAD_ADAPTER:
        sched_answer_loaded(s, reply, msg->rid, msg->u.load_adapter.name, msg->u.load_adapter.adapter_id, false, 0, 0,
                            code, why);
        break;
    case LS_MSG_UNLOAD_ADAPTER:
        sched_answer_unloaded(s, reply, msg->rid, msg->u.unload_adapter.name, msg->u.unload_adapter.adapter_id, false, code,
                          why);
        break;
    default:
        break;  // an Abort needs no answer
    }
    sched_reply_release(s, &reply);
}

static void s_dispatch(sched_t *s, uint64_t now, ls_msg_t *msg, void *reply) {
    switch (msg->type) {
    case LS_MSG_TOKENIZED_REQ: s_request(s, now, msg, reply); break;
    case LS_MSG_ABORT: s_abort(s, msg); break;
    case LS_MSG_LOAD_ADAPTER: sched_adapter_load(s, msg, reply); break;
    case LS_MSG_UNLOAD_ADAPTER: sched_adapter_unload(s, msg, reply); break;
    default: assert(!"only the commands s_held keeps are replayed");
    }
}

static void s_replay_pending(sched_t *s) {
    uint64_t now = s->now;
    pending_t *p = s->pending;
    s->pending = s->pending_tail = NULL;
    s->n_pending = 0;
    while (p) {
        pending_t *next = p->next;
        s->now = p->now;  // as if it had been handled when it arrived
        s_dispatch(s, p->now, &p->msg, p->reply);
        ls_msg_clear(&p->msg);
        free(p);
        p = next;
    }
    s->now = now;
}

// One sampled token for r: append it, check the stop conditions, send it on.
static void s_take_token(sched_t *s, req_t *r, const ls_msg_step_output_t *o) {
    if (o->finish == LS_FINISH_REASON_ERROR) {
        sched_req_finish(s, r, NULL, LS_FINISH_REASON_ERROR, "the worker could not produce a token");
        return;
    }
    assert(sched_seq_len(r) < r->cap_tokens);  // a request at max_new_tokens has finished
    r->tokens[r->n_prompt + r->n_out++] = o->token_id;
    s->stats.tokens_generated++;
    uint32_t finish = LS_FINISH_REASON_NONE;
    bool stop = false;
    for (size_t i = 0; i < r->n_stop && !stop; i++)
        stop = r->stop[i] == o->token_id;
    // EOS and stop ids count only after min_new_tokens (the workers mask them until then).
    if (stop && r->n_out > r->min_new)
        finish = LS_FINISH_REASON_STOP;
    else if (r->n_out >= r->max_new || sched_seq_len(r) >= s->max_context)
        finish = LS_FINISH_REASON_LENGTH;
    if (finish != LS_FINISH_REASON_NONE)
        sched_req_finish(s, r, o, finish, NULL);
    else
        s_emit_out(s, r, o, finish, NULL);
}

// ---------------------------------------------------------------------------------------------
// public

sched_t *sched_new(const sched_config_t *cfg, const sched_io_t *io) {
    assert(cfg->tp_size >= 1 && cfg->tp_size <= SCHED_MAX_RANKS && io->emit);
    assert(cfg->max_num_batched_tokens > 0 && cfg->chunked_prefill_size > 0 && cfg->max_running_requests > 0);
    assert(cfg->max_waiting_requests > 0 && cfg->max_tenant_waiting > 0 && cfg->max_queued_tokens > 0);
    sched_t *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->cfg = *cfg;
    s->io = *io;
    s->max_flight = cfg->overlap && cfg->tp_size == 1 ? 2 : 1;
    s->lora = lora_new(0, cfg->eviction);
    s->reqs = zhashx_new();
    if (!s->lora || !s->reqs) {
        sched_destroy(&s);
        return NULL;
    }
    return s;
}

void sched_destroy(sched_t **self_p) {
    sched_t *s = *self_p;
    if (!s)
        return;
    // Free without answering or telling anyone: sched_shutdown is where answers go out.
    req_list_t *lists[] = {&s->waiting, &s->running};
    for (int l = 0; l < 2; l++)
        while (lists[l]->head) {
            req_t *r = lists[l]->head;
            sched_list_remove(r);
            s_req_free(s, r);
        }
    while (s->ops)
        sched_op_free(s, s->ops);
    free(s->deferred);  // emptied by every event that fills it
    free(s->deferred_releases);
    while (s->pending) {
        pending_t *next = s->pending->next;
        ls_msg_clear(&s->pending->msg);
        free(s->pending);
        s->pending = next;
    }
    kv_destroy(&s->kv);
    lora_destroy(&s->lora);
    zhashx_destroy(&s->reqs);
    free(s->eos);
    for (int i = 0; i < SCHED_MAX_FLIGHT; i++)
        free(s->flight[i].v);
    free(s->released);
    free(s);
    *self_p = NULL;
}

void sched_on_request(sched_t *s, uint64_t now, ls_msg_t *msg, void *reply) {
    s->now = now;
    if (!s_held(s, now, msg, reply))
        s_request(s, now, msg, reply);
    s_after(s, now);
}

void sched_on_abort(sched_t *s, uint64_t now, ls_msg_t *msg) {
    s->now = now;
    if (!s_held(s, now, msg, NULL))
        s_abort(s, msg);
    s_after(s, now);
}

void sched_on_load_adapter(sched_t *s, uint64_t now, ls_msg_t *msg, void *reply) {
    s->now = now;
    if (!s_held(s, now, msg, reply))
        sched_adapter_load(s, msg, reply);
    s_after(s, now);
}

void sched_on_unload_adapter(sched_t *s, uint64_t now, ls_msg_t *msg, void *reply) {
    s->now = now;
    if (!s_held(s, now, msg, reply))
        sched_adapter_unload(s, msg, reply);
    s_after(s, now);
}

void sched_on_worker_info(sched_t *s, uint64_t now, const ls_msg_t *msg) {
    s->now = now;
    const ls_msg_worker_info_t *w = &msg->u.worker_info;
    if (w->rank >= (uint32_t)s->cfg.tp_size || w->kv_blocks == 0 || w->block_size == 0 || w->max_context == 0 ||
        w->vocab_size == 0) {
        ls_warn(0, "ignoring WorkerInfo from rank %u: rank outside the group of %d, or no KV blocks/context/vocabulary",
                w->rank, s->cfg.tp_size);
        return;
    }
    if (w->kv_blocks > LS_MAX_KV_BLOCKS || w->block_size > LS_MAX_BLOCK_SIZE ||
        w->max_loras_per_batch > LS_MAX_LORAS_PER_BATCH) {
        ls_warn(0, "ignoring WorkerInfo from rank %u: %u KV blocks of %u tokens and %u adapter slots, beyond the %u, %u "
                   "and %u a scheduler holds", w->rank, w->kv_blocks, w->block_size, w->max_loras_per_batch,
                LS_MAX_KV_BLOCKS, LS_MAX_BLOCK_SIZE, LS_MAX_LORAS_PER_BATCH);
        return;
    }
    if (s->ready) {
        // A worker that reports again has restarted (or changed): its KV cache and adapters are
        // gone. Recompute the running requests rather than fail them.
        ls_warn(0, "worker %u reported again: treating it as a restart; running requests are recomputed", w->rank);
        s_group_reset(s, false, "a worker restarted");
    }
    s->caps[w->rank] = (worker_caps_t){.kv_blocks = w->kv_blocks, .block_size = w->block_size,
                                       .max_context = w->max_context, .slots = w->max_loras_per_batch,
                                       .vocab = w->vocab_size,
                                       .max_loaded = w->max_loaded_loras, .cpu_bytes = w->cpu_lora_bytes,
                                       .lora_max_bytes = w->lora_max_bytes};
    if (w->rank == 0) {
        free(s->eos);
        s->eos = sched_memdup(w->eos_token_ids.v, w->eos_token_ids.n * sizeof(int32_t));
        s->n_eos = w->eos_token_ids.n;
    }
    s->have_caps |= 1u << w->rank;
    if (s->have_caps == (1u << s->cfg.tp_size) - 1)
        s_start_serving(s, now);
    s_after(s, now);
}

void sched_on_worker_down(sched_t *s, uint64_t now, const char *why) {
    s->now = now;
    if (s->ready) {
        ls_warn(0, "%s: running requests are recomputed once every worker has reported again", why);
        s_group_reset(s, false, why);
    }
    // Not ready, not down: new work waits (s_held) until every worker's WorkerInfo is in.
    s->ready = false;
    s->have_caps = 0;
    s_after(s, now);
}

void sched_abort_all(sched_t *s, uint64_t now, const char *why) {
    s->now = now;
    while (s->running.head)
        sched_req_finish(s, s->running.head, NULL, LS_FINISH_REASON_ABORT, why);
    while (s->waiting.head)
        sched_req_finish(s, s->waiting.head, NULL, LS_FINISH_REASON_ABORT, why);
    s_after(s, now);
}

// The oldest step in flight answers by then, or the workers are gone (there is one).
static uint64_t s_step_deadline(const sched_t *s) { return s->flight[0].sent_at + s->cfg.step_timeout_ns; }

void sched_on_step_result(sched_t *s, uint64_t now, const ls_msg_t *msg) {
    s->now = now;
    const ls_msg_step_result_t *sr = &msg->u.step_result;
    // Results come in plan order: only the oldest step in flight can answer.
    if (s->n_flight == 0 || sr->step != s->flight[0].step) {
        ls_warn(0, "ignoring StepResult for step %" PRIu64 " (%s)", sr->step,
                s->n_flight ? "it is not the oldest step in flight" : "no step is in flight");
        return;
    }
    flight_t f = s->flight[0];
    memmove(&s->flight[0], &s->flight[1], sizeof s->flight - sizeof s->flight[0]);
    s->flight[--s->n_flight] = (flight_t){.v = f.v, .cap = f.cap};  // its array, for reuse
    s->deferring = true;  // the outputs go after the next plan (s_after)
    // Where a step's time goes: the workers' own time (forward and sampling) and the rest of
    // the round trip (messages both ways, the workers' handling of them, and with overlap
    // scheduling the step before it, which the plan waited behind).
    s->stats.step_roundtrip_us += (now - f.sent_at) / 1000;
    s->stats.step_worker_us += sr->elapsed_us;
    size_t k = 0;
    for (size_t i = 0; i < f.n; i++) {
        const planned_t *p = &f.v[i];
        const ls_msg_step_output_t *o = NULL;
        if (p->sample)
            o = k < sr->items.n ? &sr->items.v[k++] : NULL;
        char key[24];
        s_rid_key(p->rid, key);
        req_t *r = zhashx_lookup(s->reqs, key);
        if (!r || r->list != &s->running || r->ahead < p->chunk)
            continue;  // ended, or preempted and planned again, while the step ran: dropped
        r->computed += p->chunk;
        r->ahead -= p->chunk;
        r->ahead_out -= p->sample;
        s_publish(s, r);
        if (!p->sample)
            continue;
        if (!o || o->rid != r->rid)
            sched_req_finish(s, r, NULL, LS_FINISH_REASON_ERROR, "the worker's result does not match its plan");
        else
            s_take_token(s, r, o);
    }
    if (k != sr->items.n)
        ls_warn(0, "StepResult %" PRIu64 " has %zu outputs, the plan sampled %zu", sr->step, sr->items.n, k);
    s_after(s, now);
}

void sched_on_adapter_answer(sched_t *s, uint64_t now, int rank, const ls_msg_t *msg) {
    s->now = now;
    if (msg->type == LS_MSG_ADAPTER_LOADED) {
        const ls_msg_adapter_loaded_t *a = &msg->u.adapter_loaded;
        sched_op_answer(s, rank, msg->rid, a->ok, a->rank, a->bytes, a->pages, a->code, a->reason, a->adapter_id);
    } else if (msg->type == LS_MSG_ADAPTER_UNLOADED) {
        const ls_msg_adapter_unloaded_t *a = &msg->u.adapter_unloaded;
        sched_op_answer(s, rank, msg->rid, a->ok, 0, 0, 0, a->code, a->reason, NULL);
    }
    s_after(s, now);
}

void sched_on_tick(sched_t *s, uint64_t now) {
    s->now = now;
    if (s->n_flight && now >= s_step_deadline(s)) {
        char why[200];
        snprintf(why, sizeof why, "no result for step %" PRIu64 " within %" PRIu64 " ms: the workers are down",
                 s->flight[0].step, s->cfg.step_timeout_ns / 1000000);
        ls_error(0, "%s", why);
        s->stats.step_timeouts++;
        s_group_reset(s, true, why);
    }
    // Completing one command can end another: look again from the head each time.
    for (op_t *op = s->ops; op;) {
        uint64_t due = op->queued_at ? op->queued_at + s->cfg.load_timeout_ns : op->deadline;
        if (due == 0 || now < due) {
            op = op->next;
            continue;
        }
        uint32_t all = (1u << s->cfg.tp_size) - 1;
        char why[200];
        if (op->queued_at)
            snprintf(why, sizeof why, "no room in the CPU tier within %" PRIu64 " ms: every adapter there stayed pinned or in use",
                     s->cfg.load_timeout_ns / 1000000);
        else
            snprintf(why, sizeof why, "worker(s) did not answer %s within %" PRIu64 " ms",
                     op->kind == OP_LOAD || op->kind == OP_RELOAD ? "the load" : "the unload",
                     s->cfg.load_timeout_ns / 1000000);
        if (!op->reason) {
            op->code = LS_ERROR_CODE_TIMEOUT;
            op->reason = sched_strdup(why);
        }
        op->answered = all;
        sched_op_complete(s, op);
        op = s->ops;
    }
    req_list_t *lists[] = {&s->waiting, &s->running};
    for (int l = 0; l < 2; l++)
        for (req_t *r = lists[l]->head, *next; r; r = next) {
            next = r->next;
            if (r->deadline && now >= r->deadline) {
                ls_info(r->rid, "deadline passed: aborted");
                sched_req_finish(s, r, NULL, LS_FINISH_REASON_ABORT, NULL);
            }
        }
    s_after(s, now);
}

void sched_shutdown(sched_t *s, uint64_t now) {
    s->now = now;
    const char *why = "the scheduler is shutting down";
    while (s->running.head)
        sched_req_finish(s, s->running.head, NULL, LS_FINISH_REASON_ERROR, why);
    while (s->waiting.head)
        sched_req_finish(s, s->waiting.head, NULL, LS_FINISH_REASON_ERROR, why);
    while (s->ops) {
        op_t *op = s->ops;
        if (op->kind == OP_LOAD)
            sched_answer_loaded(s, op->reply, op->asker_rid, op->name, op->adapter_id, false, 0, 0,
                            LS_ERROR_CODE_SHUTTING_DOWN, why);
        else if (op->kind == OP_UNLOAD)
            sched_answer_unloaded(s, op->reply, op->asker_rid, op->name, op->adapter_id, false,
                              LS_ERROR_CODE_SHUTTING_DOWN, why);
        sched_op_free(s, op);
    }
    while (s->pending) {
        pending_t *p = s->pending;
        s->pending = p->next;
        s_refuse(s, &p->msg, p->reply, LS_ERROR_CODE_SHUTTING_DOWN, why);
        ls_msg_clear(&p->msg);
        free(p);
    }
    s->pending_tail = NULL;
    s->n_pending = 0;
    s->ready = false;
    s->n_flight = 0;
    s->down = true;
    s_gauges(s);
}

uint64_t sched_next_wake(const sched_t *s) {
    uint64_t t = s->n_flight ? s_step_deadline(s) : UINT64_MAX;
    for (const op_t *op = s->ops; op; op = op->next) {
        uint64_t due = op->queued_at ? op->queued_at + s->cfg.load_timeout_ns : op->deadline;
        if (due && due < t)
            t = due;
    }
    const req_list_t *lists[] = {&s->waiting, &s->running};
    for (int l = 0; l < 2; l++)
        for (const req_t *r = lists[l]->head; r; r = r->next)
            if (r->deadline && r->deadline < t)
                t = r->deadline;
    return t == UINT64_MAX ? 0 : t;
}

const sched_stats_t *sched_stats(const sched_t *s) { return &s->stats; }
