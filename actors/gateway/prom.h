// prom — the parts of /metrics built from the other actors' Metrics answers: each actor's
// counters as loraserve_<name>{actor="…"}, and the model-server protocol of Kubernetes' inference
// gateway (Gateway API Inference Extension): the vllm:* series its endpoint picker scrapes to
// route by queue, KV cache and LoRA affinity, derived from the schedulers' answers. Pure
// functions over messages; main.c asks the actors, adds the gateway's own series and answers.
#ifndef GW_PROM_H
#define GW_PROM_H

#include <stddef.h>

#include "http.h"
#include "ls_msg.h"

// A label value with the text format's escapes (\\, \", \n).
void gw_prom_label(gw_buf_t *b, const char *v);

// loraserve_actor_up{actor} for every answer, then every counter of every answer, each name's
// samples together (the text format wants a family's lines in one group) under one TYPE line.
void gw_prom_actors(gw_buf_t *b, const ls_msg_t *answers, size_t n);

// The latency histograms of the answers (the tokenizer's, per adapter: docs/operations.md,
// "Metrics"), each family twice: loraserve_<name>{adapter} and vLLM's vllm:<name>{model_name},
// so that dashboards made for vLLM read them. The base model's series is labelled `base` (the
// served model name). A series given twice (a family and label in two answers) is shown once,
// the first; a malformed one (bounds not ascending, counts not one more than the bounds) not at
// all.
void gw_prom_histograms(gw_buf_t *b, const ls_msg_t *answers, size_t n, const char *base);

// The endpoint picker's series (docs/api.md, "Kubernetes inference gateway") from the answers
// of the schedulers, the actors that report running_requests: counts and blocks add up over
// them. Nothing when no scheduler answered: the picker keeps its last values rather than read a
// made-up idle replica. now_s is the Unix time of the answer, the value of
// vllm:lora_requests_info (the picker takes the series with the latest one).
void gw_prom_epp(gw_buf_t *b, const ls_msg_t *answers, size_t n, double now_s);

#endif
