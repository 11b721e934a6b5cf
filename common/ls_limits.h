// ls_limits — the limits and defaults that more than one process applies, declared once.
#ifndef LS_LIMITS_H
#define LS_LIMITS_H

#define LS_LIMITS_STR_(x) #x
#define LS_LIMITS_STR(x) LS_LIMITS_STR_(x)  // a limit as the string a flag's default is

// Adapter slots (distinct adapters in one step) when --max-loras-per-batch is not given: the
// worker and the registry take the flag, the launcher passes it to both (bench_serve_engine,
// the scheduler and worker in one process, takes it too).
#define LS_DEFAULT_MAX_LORAS_PER_BATCH 8

// The largest pool a worker reports (WorkerInfo) and a scheduler takes: pages of the GPU pool
// (the scheduler's page table holds 20 bytes a page, so 16 Mi pages are 320 MB), tokens a KV
// block, and adapter slots a step. The scheduler ignores a report beyond them, as it would any
// malformed one; the worker refuses such flags and takes at most LS_MAX_KV_BLOCKS pages from
// --kv-cache-mb.
#define LS_MAX_KV_BLOCKS (1u << 24)
#define LS_MAX_BLOCK_SIZE 4096u
#define LS_MAX_LORAS_PER_BATCH 4096u

// A step's bounds when --max-running-requests / --max-num-batched-tokens are not given: the
// scheduler plans within them and the workers refuse a bigger plan (the launcher passes both
// flags to both).
#define LS_DEFAULT_MAX_RUNNING_REQUESTS 256
#define LS_DEFAULT_MAX_NUM_BATCHED_TOKENS 2048

// The scheduler's step policy when its flags are not given; bench_serve_engine, which runs the
// scheduler's core with the engine in one process, applies the same.
#define LS_DEFAULT_CHUNKED_PREFILL_SIZE 512  // prompt tokens of one request in one step
#define LS_DEFAULT_MAX_SKIP_STEPS 8          // steps a waiting request may be passed over
#define LS_DEFAULT_MAX_NEW_TOKENS 128        // when a request gives no max_new_tokens

// Adapters with latency series of their own at /metrics when --metrics-max-adapters is not
// given (common/ls_series.h has the policy): the tokenizer measures, the gateway counts requests
// by model, both with this cap; the launcher passes the flag to both. Expands to a flag of
// ls_flags.h.
#define LS_DEFAULT_METRICS_MAX_ADAPTERS 32
#define LS_METRICS_MAX_ADAPTERS_FLAG(var)                                                          \
    LS_FLAG_INT("metrics-max-adapters", (var), LS_LIMITS_STR(LS_DEFAULT_METRICS_MAX_ADAPTERS),     \
                "adapters with /metrics series of their own (the least recently used beyond it count as \"other\")")

// A load from tensors (/v1/load_lora_adapter with lora_tensors: adapter_model.safetensors sent
// in the request) carries at most this many MiB of safetensors when --max-lora-tensor-mb is not
// given. The gateway refuses a larger one before anything goes upstream and sizes the load
// routes' HTTP body limit from it; the registry refuses it again (the SDK reaches it without
// the gateway). The launcher passes the flag to both. 128 MiB holds a rank-16 adapter of every
// projection of an 8B model (84 MB). Expands to a flag of ls_flags.h.
#define LS_DEFAULT_MAX_LORA_TENSOR_MB 128
#define LS_MAX_LORA_TENSOR_MB_CAP 1024  // the flag's largest value: the gateway holds it in memory, in base64
#define LS_MAX_LORA_TENSOR_MB_FLAG(var)                                                            \
    LS_FLAG_INT("max-lora-tensor-mb", (var), LS_LIMITS_STR(LS_DEFAULT_MAX_LORA_TENSOR_MB),         \
                "largest adapter_model.safetensors a load from tensors may send, in MiB")

// The peer that schedules, for the actors that send it requests or adapter commands (tokenizer,
// registry, detokenizer, worker): "scheduler" in a one-group graph; with --dp-size N the
// launcher passes --scheduler=dispatcher to the front actors and --scheduler=scheduler-G to
// group G's workers (docs/architecture.md). Expands to a flag of ls_flags.h.
#define LS_SCHEDULER_FLAG(var) \
    LS_FLAG_STR("scheduler", (var), "scheduler", "the peer that schedules (dispatcher with --dp-size > 1)")

// The most adapters one request may mix (docs/lora-mixing.md): the gateway and the SDK refuse a
// longer mix, the tokenizer and the scheduler again, and the engine runs a step's LoRA in at
// most this many passes (one per component of its longest mix).
#define LS_LORA_MIX_MAX 8

// The most adapters that may be pinned among `slots` adapter slots: one slot always stays for
// unpinned adapters. The registry refuses a pin past it (against its --max-loras-per-batch);
// the scheduler, which alone keeps pinned adapters in their slots, refuses it again against
// the slots the workers reported. The workers' pools know nothing of pinning.
static inline int ls_pinned_max(int slots) {
    return slots - 1;
}

#endif
