// The scheduler test harness; see harness.h.
#include "harness.h"

#include <assert.h>
#include <stdio.h>

sched_config_t h_config(void) {
    return (sched_config_t){
        .tp_size = 1,
        .max_num_batched_tokens = 2048,
        .max_running_requests = 256,
        .chunked_prefill_size = 512,
        .max_skip_steps = 8,
        .default_max_new_tokens = 16,
        .eviction = LORA_EVICT_LRU,
        .step_timeout_ns = 1000000000ull,
        .load_timeout_ns = 5000000000ull,
        .max_waiting_requests = 4096,
        .max_tenant_waiting = 1024,
        .max_queued_tokens = 1u << 22,
    };
}

static void s_track(h_t *h, const ls_msg_t *m) {
    if (m->rid >= H_MAX_RID)
        return;
    h_req_t *r = &h->req[m->rid];
    if (m->type == LS_MSG_ERROR) {
        r->errors++;
        r->error_code = m->u.error.code;
        return;
    }
    if (m->type != LS_MSG_TOKEN_OUT)
        return;
    const ls_msg_token_out_t *t = &m->u.token_out;
    assert(!r->done);  // nothing after the final TokenOut
    for (size_t i = 0; i < t->token_ids.n; i++) {
        // Token k of the output is the one the fake worker makes at generated = k.
        r->bad_sequence |= t->token_ids.v[i] != h_token(h, m->rid, (uint32_t)r->tokens);
        r->last_token = t->token_ids.v[i];
        r->tokens++;
    }
    r->firsts += t->first;
    if (t->first)
        r->added_first = (int)t->added_tokens.n;
    r->finish = t->finish;
    r->done = t->finish != LS_FINISH_REASON_NONE;
    r->completion_tokens = t->completion_tokens;
    r->cached_tokens = t->cached_tokens;
}

static void s_emit(void *arg, const sched_dest_t *dest, const ls_msg_t *msg) {
    h_t *h = arg;
    char *buf;
    size_t len;
    int rc = ls_msg_encode(msg, &buf, &len);
    assert(rc == 0);
    (void)rc;
    size_t add = sizeof *dest + len;
    h->bytes = realloc(h->bytes, h->n_bytes + add);
    memcpy(h->bytes + h->n_bytes, dest, sizeof *dest);
    memcpy(h->bytes + h->n_bytes + sizeof *dest, buf, len);
    h->n_bytes += add;
    if (h->n_out == h->cap_out) {
        h->cap_out = h->cap_out ? 2 * h->cap_out : 256;
        h->out = realloc(h->out, h->cap_out * sizeof *h->out);
    }
    if (msg->type == LS_MSG_STEP_PLAN && ++h->outstanding > h->max_outstanding)
        h->max_outstanding = h->outstanding;
    h_out_t *o = &h->out[h->n_out++];
    o->dest = *dest;
    rc = ls_msg_decode(buf, len, &o->msg, NULL);
    assert(rc == 0);
    free(buf);
    s_track(h, &o->msg);
}

static void s_release(void *arg, void *reply) { ((h_t *)arg)->releases++; }

h_t *h_new(const sched_config_t *cfg) {
    h_t *h = calloc(1, sizeof *h);
    h->cfg = *cfg;
    h->fail_load_rank = -1;
    h->auto_steps = true;
    h->now = 1000000000ull;
    h->step_ns = 1000000;
    const sched_io_t io = {.emit = s_emit, .release = s_release, .arg = h};
    h->s = sched_new(cfg, &io);
    assert(h->s);
    return h;
}

void h_free(h_t *h) {
    sched_destroy(&h->s);
    for (size_t i = 0; i < h->n_out; i++)
        ls_msg_clear(&h->out[i].msg);
    free(h->out);
    free(h->bytes);
    free(h);
}

void h_info(h_t *h, uint32_t rank, uint32_t kv_blocks, uint32_t block_size, uint32_t max_context, uint32_t slots,
            uint32_t max_loaded) {
    assert(kv_blocks <= H_MAX_PAGES && slots <= H_MAX_SLOTS);
    memset(h->wpos, 0, sizeof h->wpos);
    memset(h->wsampled, 0, sizeof h->wsampled);
    // a worker that (re)starts has an empty pool
    h->wpages = kv_blocks;
    h->wblock = block_size;
    for (int p = 0; p < H_MAX_PAGES; p++)
        h->wslot_of[p] = -1;
    memset(h->woverwritten, 0, sizeof h->woverwritten);
    memset(h->wslot, 0, sizeof h->wslot);
    h->wseen = h->n_out;
    for (size_t i = 0; i < h->n_out; i++)
        if (h->out[i].msg.type == LS_MSG_STEP_PLAN && h->out[i].msg.u.step_plan.step > h->wvoid_step)
            h->wvoid_step = h->out[i].msg.u.step_plan.step;
    h->void_before = h->n_out;
    h->outstanding = 0;
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_WORKER_INFO);
    ls_msg_worker_info_t *w = &m.u.worker_info;
    w->rank = rank;
    w->tp_size = (uint32_t)h->cfg.tp_size;
    w->kv_blocks = kv_blocks;
    w->block_size = block_size;
    w->max_context = max_context;
    w->vocab_size = H_VOCAB;
    w->max_loras_per_batch = slots;
    w->max_loaded_loras = max_loaded;
    w->cpu_lora_bytes = h->cpu_bytes;
    w->lora_max_bytes = h->lora_max_bytes;
    w->eos_token_ids.v = malloc(sizeof(int32_t));
    w->eos_token_ids.v[0] = 2;
    w->eos_token_ids.n = 1;
    sched_on_worker_info(h->s, ++h->now, &m);
    ls_msg_clear(&m);
}

// The reply handle of a request or command: any non-NULL pointer, counted when released.
static void *s_reply(uint64_t rid) { return (void *)(uintptr_t)(rid + 1); }

void h_request(h_t *h, uint64_t rid, uint32_t n, int32_t base, const char *adapter, uint32_t max_new) {
    h_request_added(h, rid, n, base, adapter, max_new, 0);
}

void h_request_added(h_t *h, uint64_t rid, uint32_t n, int32_t base, const char *adapter, uint32_t max_new,
                     uint32_t n_added) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_TOKENIZED_REQ);
    m.rid = rid;
    ls_msg_tokenized_req_t *t = &m.u.tokenized_req;
    t->input_ids.v = malloc((n ? n : 1) * sizeof(int32_t));
    for (uint32_t i = 0; i < n; i++)
        t->input_ids.v[i] = base + (int32_t)i;
    t->input_ids.n = n;
    t->adapter_id = ls_msg_strdup(adapter);
    t->sampling.max_new_tokens = max_new;
    t->sampling.ignore_eos = false;
    t->added_tokens.v = calloc(n_added + 1, sizeof *t->added_tokens.v);
    for (uint32_t i = 0; i < n_added; i++) {
        char c[16];
        snprintf(c, sizeof c, "<t%u>", i);
        t->added_tokens.v[t->added_tokens.n++] = (ls_msg_added_token_t){.id = H_VOCAB + (int32_t)i,
                                                                         .content = ls_msg_strdup(c)};
    }
    sched_on_request(h->s, ++h->now, &m, s_reply(rid));
    ls_msg_clear(&m);
}

void h_abort(h_t *h, uint64_t rid) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ABORT);
    m.rid = rid;
    m.u.abort.finish = LS_FINISH_REASON_ABORT;
    sched_on_abort(h->s, ++h->now, &m);
    ls_msg_clear(&m);
}

void h_load(h_t *h, uint64_t rid, const char *id, bool pinned) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_LOAD_ADAPTER);
    m.rid = rid;
    m.u.load_adapter.name = ls_msg_strdup(id);
    m.u.load_adapter.adapter_id = ls_msg_strdup(id);
    m.u.load_adapter.path = ls_msg_strdup("/adapters/x");
    m.u.load_adapter.pinned = pinned;
    sched_on_load_adapter(h->s, ++h->now, &m, s_reply(rid));
    ls_msg_clear(&m);
}

void h_unload(h_t *h, uint64_t rid, const char *id) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_UNLOAD_ADAPTER);
    m.rid = rid;
    m.u.unload_adapter.adapter_id = ls_msg_strdup(id);
    sched_on_unload_adapter(h->s, ++h->now, &m, s_reply(rid));
    ls_msg_clear(&m);
}

static void s_answer_adapter(h_t *h, const h_out_t *o, int rank) {
    ls_msg_t a;
    if (o->msg.type == LS_MSG_LOAD_ADAPTER) {
        ls_msg_init(&a, LS_MSG_ADAPTER_LOADED);
        a.u.adapter_loaded.ok = rank != h->fail_load_rank;
        a.u.adapter_loaded.adapter_id = ls_msg_strdup(o->msg.u.load_adapter.adapter_id);
        a.u.adapter_loaded.rank = 8;
        if (h->bytes_of)
            a.u.adapter_loaded.bytes = h->bytes_of(o->msg.u.load_adapter.adapter_id);
        if (h->pages_of)
            a.u.adapter_loaded.pages = h->pages_of(o->msg.u.load_adapter.adapter_id);
        if (!a.u.adapter_loaded.ok) {
            a.u.adapter_loaded.code = LS_ERROR_CODE_BAD_REQUEST;
            a.u.adapter_loaded.reason = ls_msg_strdup("rank 128 above max_lora_rank 64");
        }
    } else {
        ls_msg_init(&a, LS_MSG_ADAPTER_UNLOADED);
        a.u.adapter_unloaded.ok = true;
        a.u.adapter_unloaded.adapter_id = ls_msg_strdup(o->msg.u.unload_adapter.adapter_id);
    }
    a.rid = o->msg.rid;
    sched_on_adapter_answer(h->s, ++h->now, rank, &a);
    ls_msg_clear(&a);
}

// The fake pool: slot w empties (its pages hold nothing any more).
static void s_wslot_clear(h_t *h, int w) {
    for (uint32_t p = 0; p < h->wpages; p++)
        if (h->wslot_of[p] == w)
            h->wslot_of[p] = -1;
    h->wslot[w][0] = 0;
}

// The fake pool's slot holding adapter id, or -1.
static int s_wslot_find(const h_t *h, const char *id) {
    for (int w = 0; w < H_MAX_SLOTS; w++)
        if (id && h->wslot[w][0] && !strcmp(h->wslot[w], id))
            return w;
    return -1;
}

// PrefetchAdapter as ls_lora_pool_assign takes it.
static void s_wprefetch(h_t *h, const ls_msg_prefetch_adapter_t *p) {
    uint32_t need = h->pages_of ? h->pages_of(p->adapter_id) : 0;
    bool ok = p->slot >= 0 && p->slot < H_MAX_SLOTS && p->pages.n >= need;
    for (size_t i = 0; ok && i < p->pages.n; i++) {
        ok = p->pages.v[i] < h->wpages;
        for (size_t k = 0; ok && k < i; k++)
            ok = p->pages.v[k] != p->pages.v[i];
    }
    if (!ok) {
        h->bad_prefetches++;
        return;
    }
    h->prefetches++;
    s_wslot_clear(h, p->slot);
    int old = s_wslot_find(h, p->adapter_id);
    if (old >= 0)
        s_wslot_clear(h, old);
    for (uint32_t i = 0; i < need; i++) {
        uint32_t page = p->pages.v[i];
        if (h->wslot_of[page] >= 0)
            s_wslot_clear(h, h->wslot_of[page]);
        h->wslot_of[page] = p->slot;
        h->woverwritten[page] = true;
    }
    snprintf(h->wslot[p->slot], sizeof h->wslot[p->slot], "%s", p->adapter_id);
}

// The adapter commands the workers got before the plan of step `step`, applied to the pool.
static void s_wcatch_up(h_t *h, uint64_t step) {
    for (; h->wseen < h->n_out; h->wseen++) {
        const ls_msg_t *m = &h->out[h->wseen].msg;
        if (m->type == LS_MSG_STEP_PLAN && m->u.step_plan.step >= step)
            break;
        if (m->type == LS_MSG_PREFETCH_ADAPTER)
            s_wprefetch(h, &m->u.prefetch_adapter);
        else if (m->type == LS_MSG_UNLOAD_ADAPTER && s_wslot_find(h, m->u.unload_adapter.adapter_id) >= 0)
            s_wslot_clear(h, s_wslot_find(h, m->u.unload_adapter.adapter_id));
    }
}

// Whether the fake pool has adapter id in the scheduler's slot (-1: the base model, always).
static bool s_win_slot(const h_t *h, const char *id, int32_t slot) {
    return slot < 0 || (slot < H_MAX_SLOTS && id && !strcmp(h->wslot[slot], id));
}

// A plan's effect on the fake pool: the KV its items read must be theirs still, the pages
// they write are KV from now on (an adapter there loses its slot), and then every item's
// slot must hold its adapter.
static void s_wstep(h_t *h, const ls_msg_step_plan_t *plan) {
    uint32_t bs = h->wblock ? h->wblock : 1;
    for (size_t i = 0; i < plan->items.n; i++) {
        const ls_msg_step_item_t *it = &plan->items.v[i];
        uint32_t read = (it->position + bs - 1) / bs, end = (it->position + (uint32_t)it->token_ids.n + bs - 1) / bs;
        for (uint32_t j = 0; j < read && j < it->block_table.n; j++)
            h->lost_kv += it->block_table.v[j] < h->wpages && h->woverwritten[it->block_table.v[j]];
        for (uint32_t j = it->position / bs; j < end && j < it->block_table.n; j++) {
            uint32_t page = it->block_table.v[j];
            if (page >= h->wpages)
                continue;
            if (h->wslot_of[page] >= 0)
                s_wslot_clear(h, h->wslot_of[page]);
            h->woverwritten[page] = false;
        }
    }
    for (size_t i = 0; i < plan->items.n; i++) {
        const ls_msg_step_item_t *it = &plan->items.v[i];
        bool ok = s_win_slot(h, it->adapter_id, it->adapter_slot);
        for (size_t k = 0; k < it->mix.n; k++)
            ok &= s_win_slot(h, it->mix.v[k].adapter_id, it->mix.v[k].slot);
        h->bad_slots += !ok;
    }
}

void h_answer_plan(h_t *h, const ls_msg_t *plan) {
    if (plan->u.step_plan.step > h->wvoid_step) {
        s_wcatch_up(h, plan->u.step_plan.step);
        s_wstep(h, &plan->u.step_plan);
    }
    ls_msg_t r;
    ls_msg_init(&r, LS_MSG_STEP_RESULT);
    r.rid = plan->rid;
    r.u.step_result.step = plan->u.step_plan.step;
    const ls_msg_step_items_t *items = &plan->u.step_plan.items;
    for (size_t i = 0; i < plan->u.step_plan.released.n; i++) {
        uint64_t rid = plan->u.step_plan.released.v[i];
        if (rid < H_MAX_RID)
            h->wpos[rid] = 0, h->wsampled[rid] = false;
    }
    r.u.step_result.items.v = calloc(items->n ? items->n : 1, sizeof(ls_msg_step_output_t));
    for (size_t i = 0; i < items->n; i++) {
        const ls_msg_step_item_t *it = &items->v[i];
        if (it->rid < H_MAX_RID) {
            bool restart = it->is_prefill && (it->position == 0 || it->context_ids.n);
            bool ok = restart || it->position == h->wpos[it->rid];
            h->follows += it->follows;
            if (it->follows)  // the token sampled last, which only this worker knows
                ok &= h->wsampled[it->rid] && it->token_ids.n == 1 && it->token_ids.v[0] == -1 && it->sample;
            else if (!it->is_prefill)  // the scheduler's copy of that token
                ok &= it->generated > 0 && it->token_ids.n == 1 &&
                      it->token_ids.v[0] == h_token(h, it->rid, it->generated - 1);
            h->bad_items += !ok;
            h->wpos[it->rid] = it->position + (uint32_t)it->token_ids.n;
        }
        if (it->sample) {
            ls_msg_step_output_t *o = &r.u.step_result.items.v[r.u.step_result.items.n++];
            o->rid = it->rid;
            o->token_id = h_token(h, o->rid, it->generated);
            if (it->rid < H_MAX_RID)
                h->wsampled[it->rid] = true;
        }
    }
    h->outstanding--;
    h->now += h->step_ns;
    sched_on_step_result(h->s, h->now, &r);
    ls_msg_clear(&r);
}

int h_pump(h_t *h, int max_steps) {
    int steps = 0;
    while (h->pumped < h->n_out) {
        // A shallow copy: answering emits more and may move h->out, not what its pointers hold.
        const h_out_t o = h->out[h->pumped++];
        if (o.dest.kind != SCHED_TO_WORKERS && o.dest.kind != SCHED_TO_WORKER)
            continue;
        int type = o.msg.type;
        if (type == LS_MSG_LOAD_ADAPTER || type == LS_MSG_UNLOAD_ADAPTER) {
            if (o.dest.kind == SCHED_TO_WORKER)
                s_answer_adapter(h, &o, o.dest.rank);
            else
                for (int r = 0; r < h->cfg.tp_size; r++)
                    s_answer_adapter(h, &o, r);
        } else if (type == LS_MSG_STEP_PLAN && h->pumped <= h->void_before) {
            continue;  // lost with the workers it went to
        } else if (type == LS_MSG_STEP_PLAN && h->auto_steps) {
            if (max_steps && steps == max_steps) {
                h->pumped--;  // left for the next pump
                break;
            }
            h_answer_plan(h, &o.msg);
            steps++;
        }
    }
    return steps;
}

const ls_msg_t *h_last(const h_t *h, int type, size_t from) {
    for (size_t i = h->n_out; i-- > from;)
        if (h->out[i].msg.type == type)
            return &h->out[i].msg;
    return NULL;
}

size_t h_count(const h_t *h, int type, size_t from) {
    size_t n = 0;
    for (size_t i = from; i < h->n_out; i++)
        n += h->out[i].msg.type == type;
    return n;
}
