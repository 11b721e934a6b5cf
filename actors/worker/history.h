// history — the tokens each running request has seen, for the sampling penalties.
//
// Repetition penalty looks at prompt and output tokens, frequency and presence penalties at
// output tokens only (ls_sampling_sample's semantics, kernels/ops.h). The worker records prompt chunks as it prefills them and
// each token it samples; the scheduler says when a request is over (StepPlan.released).
#ifndef LS_HISTORY_H
#define LS_HISTORY_H

#include <stddef.h>
#include <stdint.h>

#include "model.h" // ls_sampling_batch_t, as ls_model_sample takes it

typedef struct ls_history ls_history_t;

ls_history_t *ls_history_new(void);
void ls_history_destroy(ls_history_t **self_p);

// Request ids start at 1: rid 0 is recorded nowhere, and dropping it does nothing.
void ls_history_add_prompt(ls_history_t *self, uint64_t rid, const int32_t *ids, size_t n);
// Forgets the prompt tokens of rid (its outputs stay): a request starting over (first chunk
// after a preemption) sends its whole context again.
void ls_history_clear_prompt(ls_history_t *self, uint64_t rid);
void ls_history_add_output(ls_history_t *self, uint64_t rid, int32_t id);
void ls_history_drop(ls_history_t *self, uint64_t rid);
// The last token recorded as rid's output: 0, or -1 when it has none.
int ls_history_last_output(const ls_history_t *self, uint64_t rid, int32_t *id);
size_t ls_history_size(const ls_history_t *self);

// Fills batch's prompt/output CSR arrays for the rows' requests (rids is (n_rows)); free them
// with ls_history_batch_free.
void ls_history_batch(const ls_history_t *self, const uint64_t *rids, int n_rows, ls_sampling_batch_t *batch);
void ls_history_batch_free(ls_sampling_batch_t *batch);

#endif
