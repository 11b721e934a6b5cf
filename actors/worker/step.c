// step — runs one StepPlan on the worker's engine; see step.h.
#include "step.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "ls_actor.h"
#include "lora_pool.h"

int wstep_memory_new(ls_model_t *model, int pages, int block_size, const ls_lora_pool_config_t *pc,
                     ls_kv_cache_t **kv, ls_lora_pool_t **pool, char *err, size_t errlen) {
    if (!(*kv = ls_kv_cache_new(model, pages, block_size, err, errlen)))
        return -1;
    ls_page_arena_t arena = ls_kv_cache_arena(*kv);
    if (!(*pool = ls_lora_pool_new(ls_model_backend(model), ls_model_config(model), pc, &arena, err, errlen))) {
        ls_kv_cache_destroy(kv);
        return -1;
    }
    return 0;
}

int wstep_prefetch(const wstep_engine_t *e, const ls_msg_prefetch_adapter_t *p, char *err, size_t errlen) {
    if (!p->adapter_id || p->slot < 0 || p->slot + 1 >= ls_lora_pool_n_slots(e->pool)) {
        snprintf(err, errlen, "PrefetchAdapter for slot %d of %d%s", p->slot, ls_lora_pool_n_slots(e->pool) - 1,
                 p->adapter_id ? "" : " names no adapter");
        return -1;
    }
    int32_t *pages = malloc((p->pages.n ? p->pages.n : 1) * sizeof *pages);
    if (!pages) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    // ids past INT32_MAX become negative: refused as outside the arena
    for (size_t i = 0; i < p->pages.n; i++)
        pages[i] = (int32_t)p->pages.v[i];
    int rc = ls_lora_pool_assign(e->pool, p->adapter_id, p->slot + 1, pages, (int)p->pages.n, err, errlen);
    free(pages);
    return rc;
}

// The engine slot of the scheduler's slot (-1 or no id: none, the base model's slot), which
// must hold adapter id: the scheduler put it there with PrefetchAdapter before this plan. -1 +
// err when it does not (that PrefetchAdapter failed, or the slot lost it since).
static int s_engine_slot(const wstep_engine_t *e, const char *id, int32_t slot, int *engine_slot, char *err,
                         size_t errlen) {
    if (slot < 0 || !id || !*id) {
        *engine_slot = LS_LORA_SLOT_BASE;
        return 0;
    }
    *engine_slot = slot + 1;
    if (ls_lora_pool_slot_of(e->pool, id) == *engine_slot)
        return 0;
    snprintf(err, errlen, "adapter %s is not in GPU slot %d (the scheduler places adapters with PrefetchAdapter)", id,
             slot);
    return -1;
}

// seq's LoRA fields for the item's adapter, or each component of its mix (parts:
// LS_LORA_MIX_MAX of them), each in the slot the plan names. -1 + err as s_engine_slot, or for a mix of
// more than LS_LORA_MIX_MAX.
static int s_seq_lora(const wstep_engine_t *e, const ls_msg_step_item_t *it, ls_model_seq_t *seq,
                      ls_model_lora_part_t *parts, char *err, size_t errlen) {
    if (!it->mix.n)
        return s_engine_slot(e, it->adapter_id, it->adapter_slot, &seq->lora_slot, err, errlen);
    if (it->mix.n > LS_LORA_MIX_MAX) {
        snprintf(err, errlen, "rid %llu: a mix of %zu adapters (at most %d)", (unsigned long long)it->rid,
                 it->mix.n, LS_LORA_MIX_MAX);
        return -1;
    }
    for (size_t k = 0; k < it->mix.n; k++) {
        parts[k].weight = it->mix.v[k].weight;
        if (s_engine_slot(e, it->mix.v[k].adapter_id, it->mix.v[k].slot, &parts[k].slot, err, errlen) < 0)
            return -1;
    }
    seq->lora_slot = LS_LORA_SLOT_BASE;
    seq->mix = parts;
    seq->n_mix = (int)it->mix.n;
    return 0;
}

static ls_sampling_params_t s_params(const ls_msg_sampling_params_t *sp, uint32_t generated) {
    // The message's zero means "off"; the kernels' off values differ for some fields.
    return (ls_sampling_params_t){
        .temperature = sp->temperature,
        .top_k = sp->top_k,
        .top_p = sp->top_p > 0 ? sp->top_p : 1.0f,
        .min_p = sp->min_p,
        .repetition_penalty = sp->repetition_penalty > 0 ? sp->repetition_penalty : 1.0f,
        .frequency_penalty = sp->frequency_penalty,
        .presence_penalty = sp->presence_penalty,
        .seed = sp->seed,
        .step = generated,
        .n_logprobs = (int)sp->top_logprobs,
    };
}

void wstep_worker_info(const wstep_engine_t *e, int tp_size, const int32_t *eos, int n_eos, int max_loaded,
                       const char *model, ls_msg_t *m) {
    const ls_model_config_t *cfg = ls_model_config(e->model);
    ls_msg_init(m, LS_MSG_WORKER_INFO);
    ls_msg_worker_info_t *wi = &m->u.worker_info;
    wi->rank = (uint32_t)e->rank;
    wi->tp_size = (uint32_t)tp_size;
    wi->kv_blocks = (uint32_t)ls_kv_cache_num_blocks(e->kv);
    wi->block_size = (uint32_t)ls_kv_cache_block_size(e->kv);
    wi->max_context = (uint32_t)cfg->max_position_embeddings;
    wi->vocab_size = (uint32_t)cfg->vocab_size;
    wi->eos_token_ids.v = malloc(sizeof(int32_t) * (size_t)(n_eos ? n_eos : 1));
    memcpy(wi->eos_token_ids.v, eos, sizeof(int32_t) * (size_t)n_eos);
    wi->eos_token_ids.n = (size_t)n_eos;
    wi->max_loras_per_batch = (uint32_t)(ls_lora_pool_n_slots(e->pool) - 1);
    wi->max_lora_rank = (uint32_t)ls_lora_pool_r_max(e->pool);
    wi->max_loaded_loras = (uint32_t)max_loaded;
    wi->cpu_lora_bytes = ls_lora_pool_stats(e->pool).host_total;
    wi->lora_max_bytes = ls_lora_pool_image_max_bytes(e->pool);
    wi->model = ls_msg_strdup(model);
    wi->backend = ls_msg_strdup(e->backend);
}

void wstep_fail(const ls_msg_step_plan_t *plan, ls_msg_t *result) {
    ls_msg_clear(result);
    ls_msg_init(result, LS_MSG_STEP_RESULT);
    result->u.step_result.step = plan->step;
    result->u.step_result.items.v = calloc(plan->items.n + 1, sizeof(ls_msg_step_output_t));
    for (size_t i = 0; i < plan->items.n; i++)
        if (plan->items.v[i].sample) {
            ls_msg_step_output_t *o = &result->u.step_result.items.v[result->u.step_result.items.n++];
            o->rid = plan->items.v[i].rid;
            o->token_id = -1;
            o->finish = LS_FINISH_REASON_ERROR;
        }
}

int wstep_check(const wstep_engine_t *e, const ls_msg_step_plan_t *plan, char *err, size_t errlen) {
    const ls_model_config_t *cfg = ls_model_config(e->model);
    const uint64_t ctx = (uint64_t)cfg->max_position_embeddings, vocab = (uint64_t)cfg->vocab_size;
    const uint64_t bs = (uint64_t)ls_kv_cache_block_size(e->kv);
    if (e->max_items && plan->items.n > e->max_items) {
        snprintf(err, errlen, "the plan has %zu requests; this worker takes at most %u (--max-running-requests)",
                 plan->items.n, e->max_items);
        return -1;
    }
    uint64_t tokens = 0;
    for (size_t i = 0; i < plan->items.n; i++) {
        const ls_msg_step_item_t *it = &plan->items.v[i];
        tokens += it->token_ids.n;
        const char *bad = it->rid == 0                                      ? "has request id 0, which names no request"
                          : (uint64_t)it->position + it->token_ids.n > ctx ? "runs past the model's context"
                          : it->block_table.n > (ctx + bs - 1) / bs        ? "has more blocks than the context needs"
                          : it->context_ids.n > ctx                        ? "has more context ids than the context holds"
                          : it->sampling.stop_token_ids.n > vocab          ? "has more stop ids than the vocabulary"
                          : it->sampling.top_logprobs > vocab              ? "asks for more alternatives than the vocabulary"
                          : it->follows && (it->token_ids.n != 1 || !it->sample) ? "follows a sampled token but is no one-token decode"
                                                                           : NULL;
        if (bad) {
            snprintf(err, errlen, "item %zu (rid %llu) %s (position %u, %zu tokens, %zu blocks; context %llu)", i,
                     (unsigned long long)it->rid, bad, it->position, it->token_ids.n, it->block_table.n,
                     (unsigned long long)ctx);
            return -1;
        }
    }
    if (e->max_tokens && tokens > e->max_tokens) {
        snprintf(err, errlen, "the plan has %llu tokens; this worker takes at most %u (--max-num-batched-tokens)",
                 (unsigned long long)tokens, e->max_tokens);
        return -1;
    }
    return 0;
}

int wstep_run(const wstep_engine_t *e, const ls_msg_step_plan_t *plan, ls_msg_t *result, int *n_sampled, char *err,
              size_t errlen) {
    ls_msg_init(result, LS_MSG_STEP_RESULT);
    result->u.step_result.step = plan->step;
    *n_sampled = 0;
    if (wstep_check(e, plan, err, errlen) < 0)
        return -1;
    for (size_t i = 0; i < plan->released.n; i++) {
        ls_history_drop(e->history, plan->released.v[i]);
        if (e->constrain)
            wcon_drop(e->constrain, plan->released.v[i]);
    }
    size_t n = plan->items.n;
    if (n == 0)
        return 0;
    ls_model_seq_t *seqs = calloc(n, sizeof *seqs);
    ls_model_lora_part_t (*parts)[LS_LORA_MIX_MAX] = calloc(n, sizeof *parts);
    int32_t **tables = calloc(n, sizeof *tables);
    // items that run but whose sampled row fails alone: a grammar that could not be taken, a
    // decode following a token this worker never sampled
    bool *bad = calloc(n, sizeof *bad);
    int32_t *follow_ids = calloc(n, sizeof *follow_ids);
    int n_rows = 0;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const ls_msg_step_item_t *it = &plan->items.v[i];
        if (s_seq_lora(e, it, &seqs[i], parts[i], err, errlen) < 0) {
            rc = -1;
            break;
        }
        tables[i] = malloc(sizeof(int32_t) * (it->block_table.n + 1));
        for (size_t b = 0; b < it->block_table.n; b++)
            tables[i][b] = (int32_t)it->block_table.v[b];
        seqs[i].token_ids = it->token_ids.v;
        if (it->follows) {
            // Overlap scheduling: the plan left before the token it runs was sampled here.
            if (ls_history_last_output(e->history, it->rid, &follow_ids[i]) < 0) {
                fprintf(stderr, "worker: rid %llu: a decode follows a token this worker never sampled\n",
                        (unsigned long long)it->rid);
                bad[i] = true;
            }
            seqs[i].token_ids = &follow_ids[i];
        }
        seqs[i].n_tokens = (int)it->token_ids.n;
        seqs[i].start_pos = (int)it->position;
        seqs[i].block_table = tables[i];
        seqs[i].n_blocks = (int)it->block_table.n;
        seqs[i].want_logits = it->sample;
        n_rows += it->sample;
        // A first chunk (position 0, or a prefix hit bringing context_ids) starts the prompt
        // history over; decodes run a token already recorded as output.
        if (it->context_ids.n || (it->is_prefill && it->position == 0))
            ls_history_clear_prompt(e->history, it->rid);
        ls_history_add_prompt(e->history, it->rid, it->context_ids.v, it->context_ids.n);
        if (it->is_prefill)
            ls_history_add_prompt(e->history, it->rid, it->token_ids.v, it->token_ids.n);
        if (e->rank == 0 && it->sampling.grammar_kind) {
            char why[512] = "no grammar support on this worker";
            if (!e->constrain || wcon_begin(e->constrain, it, why, sizeof why) < 0) {
                fprintf(stderr, "worker: rid %llu: %s\n", (unsigned long long)it->rid, why);
                bad[i] = true;
            }
        }
    }
    uint64_t t0 = e->times ? ls_mono_ns() : 0;
    bool run = rc == 0;
    if (run && ls_model_forward(e->model, e->kv, e->pool, seqs, (int)n, err, errlen) != n_rows)
        rc = -1;
    if (e->times)
        e->times->forward_ns += ls_mono_ns() - t0;
    // not run here: the other ranks of the group, in ls_model_forward's agreement, fail the
    // step with this one (a forward that ran and failed has agreed already)
    if (!run)
        ls_model_agree(e->model, false, NULL, 0);

    ls_msg_t *m = result;
    // Tensor parallel: the logits, and so the sampling, are rank 0's alone.
    if (rc == 0 && n_rows > 0 && e->rank == 0) {
        // Sampling inputs, row by row in plan order.
        ls_sampling_params_t *params = calloc((size_t)n_rows, sizeof *params);
        ls_sampling_batch_t batch = {.n_rows = n_rows, .params = params};
        int max_top = 0;
        for (size_t i = 0; i < n; i++)
            if (plan->items.v[i].sample && (int)plan->items.v[i].sampling.top_logprobs > max_top)
                max_top = (int)plan->items.v[i].sampling.top_logprobs;
        batch.max_top_n = max_top;
        uint64_t *rids = calloc((size_t)n_rows, sizeof *rids);
        const ls_msg_step_item_t **row_items = calloc((size_t)n_rows, sizeof *row_items);
        bool *row_bad = calloc((size_t)n_rows, sizeof *row_bad);
        for (size_t i = 0, r = 0; i < n; i++) {
            const ls_msg_step_item_t *it = &plan->items.v[i];
            if (!it->sample)
                continue;
            row_items[r] = it;
            row_bad[r] = bad[i];
            params[r] = s_params(&it->sampling, it->generated);
            // Before min_new_tokens the stop set (EOS included) cannot be sampled at all.
            if (it->generated < it->sampling.min_new_tokens &&
                ls_model_ban_tokens(e->model, (int)r, it->sampling.stop_token_ids.v,
                                    (int)it->sampling.stop_token_ids.n) < 0) {
                snprintf(err, errlen, "masking stop tokens failed on the %s backend", e->backend);
                rc = -1;
            }
            rids[r++] = it->rid;
        }
        ls_history_batch(e->history, rids, n_rows, &batch);
        uint64_t t1 = e->times ? ls_mono_ns() : 0;
        if (rc == 0 && e->constrain &&
            wcon_masks(e->constrain, row_items, n_rows, &batch.mask_index, &batch.masks, err, errlen) < 0)
            rc = -1;
        uint64_t t2 = e->times ? ls_mono_ns() : 0;
        int32_t *tokens = calloc((size_t)n_rows, sizeof *tokens);
        float *logprobs = calloc((size_t)n_rows, sizeof *logprobs);
        int32_t *top_ids = max_top ? calloc((size_t)n_rows * max_top, sizeof *top_ids) : NULL;
        float *top_lps = max_top ? calloc((size_t)n_rows * max_top, sizeof *top_lps) : NULL;
        if (rc == 0 && ls_model_sample(e->model, &batch, tokens, logprobs, top_ids, top_lps) < 0) {
            snprintf(err, errlen, "sampling failed on the %s backend", e->backend);
            rc = -1;
        }
        if (e->times) {
            e->times->masks_ns += t2 - t1;
            e->times->sample_ns += ls_mono_ns() - t2;
        }
        if (rc == 0) {
            m->u.step_result.items.v = calloc((size_t)n_rows, sizeof(ls_msg_step_output_t));
            m->u.step_result.items.n = (size_t)n_rows;
            for (int r = 0; r < n_rows; r++) {
                ls_msg_step_output_t *o = &m->u.step_result.items.v[r];
                const ls_sampling_params_t *p = &params[r];
                o->rid = rids[r];
                o->token_id = tokens[r];
                o->logprob = logprobs[r];
                // A row whose logits were not finite cannot be trusted: say so, don't emit it.
                o->finish = isfinite(logprobs[r]) ? LS_FINISH_REASON_NONE : LS_FINISH_REASON_ERROR;
                // A constrained row whose grammar was lost, or whose token left it, fails alone.
                if (row_bad[r] || (e->constrain && wcon_advance(e->constrain, row_items[r], tokens[r]) < 0))
                    o->finish = LS_FINISH_REASON_ERROR;
                if (p->n_logprobs > 0) {
                    o->top_ids.v = malloc(sizeof(int32_t) * (size_t)p->n_logprobs);
                    o->top_logprobs.v = malloc(sizeof(float) * (size_t)p->n_logprobs);
                    memcpy(o->top_ids.v, top_ids + (size_t)r * max_top, sizeof(int32_t) * (size_t)p->n_logprobs);
                    memcpy(o->top_logprobs.v, top_lps + (size_t)r * max_top, sizeof(float) * (size_t)p->n_logprobs);
                    o->top_ids.n = o->top_logprobs.n = (size_t)p->n_logprobs;
                }
                ls_history_add_output(e->history, rids[r], tokens[r]);
            }
        }
        free(params);
        free(rids);
        free(row_items);
        free(row_bad);
        free(tokens);
        free(logprobs);
        free(top_ids);
        free(top_lps);
        ls_history_batch_free(&batch);
    }
    for (size_t i = 0; i < n; i++)
        free(tables[i]);
    free(tables);
    free(seqs);
    free(parts);
    free(bad);
    free(follow_ids);
    if (rc < 0)
        return -1;
    *n_sampled = n_rows;
    return 0;
}
