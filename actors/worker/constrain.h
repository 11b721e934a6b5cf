// constrain — structured output on the worker: each constrained request's automaton state,
// and the batch's token masks for ls_model_sample (docs/structured-output.md).
//
// A request's grammar (SamplingParams.grammar_kind, the text with its first chunk) is compiled
// once per distinct source (grammar_cache.h) and walked with every token the request samples.
// Before sampling, its row gets the mask of its state (computed once per state, then cached),
// plus its stop ids (EOS) where the state accepts: so the output is always a prefix of a match,
// and a match once it ends with EOS. A state that accepts and goes nowhere leaves EOS alone.
// The vocabulary's bytes come from the model directory's tokenizer.json, read on first use.
#ifndef LS_WORKER_CONSTRAIN_H
#define LS_WORKER_CONSTRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "ls_msg.h"

typedef struct wcon wcon_t;

// model_dir: where tokenizer.json is (read when the first constrained request comes). vocab:
// the model's vocab_size, the ids a grammar may allow (those the tokenizer spells); V: the
// model's logit rows' length (ls_model_logits_width), past vocab by the adapters' added
// vocabulary: its ids are never allowed under a grammar (docs/structured-output.md). NULL on
// out of memory.
wcon_t *wcon_new(const char *model_dir, int32_t vocab, int32_t V);
void wcon_destroy(wcon_t **self_p);

// Takes a step item's grammar: a constrained request seen for the first time gets its
// automaton (from the item's grammar text); one already known keeps its state (a preempted
// request's first chunk comes again). 0, or -1 + err (the grammar does not compile, the
// tokenizer cannot be read, or the state of a request already generating is unknown).
int wcon_begin(wcon_t *self, const ls_msg_step_item_t *it, char *err, size_t errlen);
// Forgets rid (StepPlan.released).
void wcon_drop(wcon_t *self, uint64_t rid);
// The masks of n rows (items (n): the sampled items, in row order) for ls_sampling_batch_t:
// *mask_index (n) and *masks, owned by self until the next call; *mask_index NULL when no row
// is constrained. -1 + err on out of memory.
int wcon_masks(wcon_t *self, const ls_msg_step_item_t *const *items, int n, const int32_t **mask_index,
               const uint32_t **masks, char *err, size_t errlen);
// Walks rid's automaton over the sampled token. -1 when the token leaves the grammar (it
// cannot, with the masks applied, unless a backend ignored them): the row then fails.
int wcon_advance(wcon_t *self, const ls_msg_step_item_t *it, int32_t token);
// Masks found cached and masks computed, since the start.
void wcon_mask_counts(const wcon_t *self, uint64_t *hits, uint64_t *misses);

#endif
