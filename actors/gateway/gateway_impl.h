// gateway_impl — what the gateway's rooms share: its state (the flags, the open calls, the
// readiness, its own metrics), the call a request becomes, and the functions one room calls in
// another. main.c holds the flags, start-up and shutdown, the calls, the routes and the
// dispatch; gen.c the generation calls; admin.c models and adapters, health, /tokenize and
// /detokenize, /metrics. Only these files include this.
#ifndef LS_GATEWAY_IMPL_H
#define LS_GATEWAY_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api.h"
#include "http.h"
#include "ls_actor.h"
#include "ls_series.h"

#define GW_TOKENIZER "tokenizer"

typedef enum {
    GW_CALL_GEN,
    GW_CALL_MODELS,
    GW_CALL_LOAD,
    GW_CALL_UNLOAD,
    GW_CALL_HEALTH,
    GW_CALL_METRICS,
    GW_CALL_TOKENIZE,
} gw_call_kind_t;

// A request while upstream works on it (main.c keeps them in a list, and by upstream rid).
typedef struct gw_call {
    gw_call_kind_t kind;
    gw_req_t *req;
    int sglang;       // adapter admin: answer in SGLang's shape
    uint64_t *rids;   // upstream request ids: one per GenerateReq, or one per actor asked for metrics
    size_t nrids;
    size_t nopen;     // answers still awaited (generation: completions not finished)
    ls_timer_t *timer;
    char label[256];  // the model, for the log line and the metrics; a generation's tenant
    size_t tenant_held;  // completions counted against the tenant's share while the call lives
    // generation
    gw_gen_t gen;
    gw_choice_t *choices;
    int *prompt_open;  // per prompt: completions not finished
    char *sent;        // per choice: its first chunk went out
    char id[48];
    long created;
    int streaming;
    uint64_t start_ns;
    // metrics
    ls_msg_t *metrics;
    size_t nmetrics;
    // tokenize: the TokenizeReq, sent once the model it names is known to exist
    ls_msg_t tokenize;
    struct gw_call *prev, *next;
} gw_call_t;

typedef struct {
    uint64_t requests, prompt_tokens, completion_tokens;
} gw_model_stat_t;

typedef struct {
    // flags
    char *host, *api_key, *api_key_file, *served_model_name, *model_path;
    int port, max_connections, max_header_bytes, max_body_bytes, idle_timeout_ms, request_timeout_ms;
    int max_request_completions, max_tenant_completions, metrics_max_adapters, max_lora_tensor_mb;
    // state
    ls_actor_t *self;
    gw_http_t *http;
    char base[256];  // the base model's name
    uint64_t next_rid;
    zhashx_t *by_rid;  // upstream rid -> gw_call_t
    zhashx_t *tenants; // tenant (model name) -> completions in flight, as a pointer-sized count
    gw_call_t *calls;
    int ncalls_gen;
    // readiness (/health): the launcher's last word on the graph (PeerStatus)
    int graph_ready;
    char graph_why[200];
    char id_prefix[12];
    char *model_info;    // GET /get_model_info's answer, from config.json read at start-up
    long unix_start;     // Unix time at start-up (recorded), for OpenAI's `created`
    uint64_t mono_start; // the event clock then
    // metrics
    uint64_t status_counts[600];
    ls_series_t *series;     // which models have series of their own (ls_series.h)
    gw_model_stat_t *models;  // per series
} gw_state_t;

extern gw_state_t gw_state;

// main.c
long gw_unix_time(void);    // Unix seconds now, on the event clock (replays agree)
double gw_unix_now(void);   // the same to the millisecond
gw_call_t *gw_call_new(gw_call_kind_t kind, gw_req_t *req);  // NULL when memory is out
uint64_t gw_call_rid(gw_call_t *c);  // a new upstream rid by which c's answers find it; 0: out of memory
size_t gw_tenant_add(const char *tenant, ptrdiff_t d);
gw_call_t *gw_call_of(const ls_in_t *in);
void gw_call_free(gw_call_t *c);
void gw_respond_json(gw_req_t *req, int status, const char *json);
void gw_respond_error(gw_req_t *req, int status, const char *message, const char *param, const char *code);
int gw_status_of(uint32_t code);
void gw_lower(char *out, size_t cap, const char *s);

// gen.c
void gw_gen_start(gw_req_t *req, gw_api_t api);
void gw_abort_open(gw_call_t *c, const char *why);
void gw_gen_fail(gw_call_t *c, int status, const char *message, const char *param, const char *code);
int gw_on_text_out(ls_actor_t *a, ls_in_t *in, void *state);

// admin.c
gw_model_stat_t *gw_model_stat(const char *name);
void gw_respond_outcome_unknown(gw_call_t *c, const char *why);
void gw_models_start(gw_req_t *req);
void gw_adapter_start(gw_req_t *req, gw_call_kind_t kind, int sglang);
void gw_health_start(gw_req_t *req);
void gw_live_start(gw_req_t *req);
void gw_tokenize_start(gw_req_t *req, bool detokenize);
void gw_metrics_start(gw_req_t *req);
int gw_on_adapter_list(ls_actor_t *a, ls_in_t *in, void *state);
int gw_on_adapter_loaded(ls_actor_t *a, ls_in_t *in, void *state);
int gw_on_adapter_unloaded(ls_actor_t *a, ls_in_t *in, void *state);
int gw_on_peer_status(ls_actor_t *a, ls_in_t *in, void *state);
int gw_on_heartbeat(ls_actor_t *a, ls_in_t *in, void *state);
int gw_on_tokenize_resp(ls_actor_t *a, ls_in_t *in, void *state);
int gw_on_metrics(ls_actor_t *a, ls_in_t *in, void *state);
int gw_on_error(ls_actor_t *a, ls_in_t *in, void *state);

#endif
