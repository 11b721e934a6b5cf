// prompt — the tokenizer actor's pure request logic: the model's text side (tokenizer, chat
// template, context length, EOS ids), a GenerateReq validated and turned into prompt ids, the
// TokenizedReq of each of its completions, and non-streamed TextOuts collected into one.
// No sockets, no clock: tests/frontdoor drives it directly.
#ifndef LS_TOK_PROMPT_H
#define LS_TOK_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "ls_msg.h"
#include "tokenizer.h"

typedef struct tmodel tmodel_t;

// Loads dir/tokenizer.json, dir/config.json (max_position_embeddings, eos_token_id),
// dir/generation_config.json (more EOS ids, optional) and the chat template (text/chat_template.h:
// chat_template_file when not NULL, else dir's chat_template.jinja or tokenizer_config.json; it
// is optional: without a usable one, chat requests are refused with the reason). NULL + err
// when the tokenizer, the config or an explicit chat_template_file cannot be used.
tmodel_t *tmodel_load(const char *dir, const char *chat_template_file, char *err, size_t errlen);
void tmodel_destroy(tmodel_t **self_p);
uint32_t tmodel_context(const tmodel_t *self);
// The model's tokenizer, for use on the thread that owns self.
ls_tokenizer_t *tmodel_tokenizer(const tmodel_t *self);

// An adapter's added tokens (AdapterAcquired.added_tokens, docs/adapters.md) over the model's
// tokenizer: ids vocab_size, vocab_size + 1, ... NULL + err (BAD_REQUEST: ids out of order,
// a token the tokenizer has already, invalid text) or out of memory.
ls_tok_added_t *tmodel_added_new(tmodel_t *self, const ls_msg_added_tokens_t *toks, char *err, size_t errlen);

// Validates g and builds its prompt ids into *ids (appended; the caller frees), with its
// adapter's added tokens (NULL: none). ids_open: input_ids past the vocabulary pass (a request
// naming an adapter, whose added tokens are not known yet: built again once they are). now_s is
// the wall clock a chat template's strftime_now reads. Returns 0, or the ErrorCode that refuses
// it (BAD_REQUEST, TOO_LARGE) with one sentence in err (a chat template's error among them).
uint32_t tmodel_prompt(tmodel_t *self, const ls_msg_generate_req_t *g, const ls_tok_added_t *added,
                       bool ids_open, int64_t now_s, ls_token_ids_t *ids, char *err, size_t errlen);

// Answers a TokenizeReq into *out (zeroed here; the caller clears it as a TokenizeResp's body):
// the ids of its text or rendered chat (their vocabulary strings with return_token_strs), or
// the text of its ids (detokenize), and the context length. now_s as for tmodel_prompt. Returns
// 0, or the ErrorCode that refuses it (BAD_REQUEST: an id outside the vocabulary, invalid
// UTF-8, a chat template's error) with one sentence in err.
// added: the adapter's added tokens (q->adapter's), or NULL.
uint32_t tmodel_tokenize(tmodel_t *self, const ls_msg_tokenize_req_t *q, const ls_tok_added_t *added, int64_t now_s,
                        ls_msg_tokenize_resp_t *out, char *err, size_t errlen);

// The number of completions g asks for (sampling.n, 0 meaning 1).
uint32_t tmodel_n(const ls_msg_generate_req_t *g);

// Fills *out (initialised here) with the TokenizedReq of completion `index` of g: its own
// seed (seed + index) when g has one, n = 1, the stop set = the request's stop ids plus the
// model's EOS ids (unless ignore_eos). adapter_id NULL for the base model; added: its added
// tokens (copied into the request), or NULL. 0, or -1 out of memory.
int tmodel_request(const tmodel_t *self, const ls_msg_generate_req_t *g, const ls_token_ids_t *ids, uint32_t index,
                   const char *adapter_id, const ls_msg_added_tokens_t *added, uint64_t arrival_ms,
                   uint64_t deadline_ms, ls_msg_t *out);

// Collects a non-streamed completion: every TextOut piece appended, then the final one sent.
typedef struct {
    char *text;
    size_t len, cap;
    ls_i32s_t ids, top_ids;
    ls_f32s_t logprobs, top_logprobs;
    ls_texts_t token_texts, top_texts;  // copies; dropped (ids named by number) if a piece lacked them
    size_t ids_cap, lp_cap, tid_cap, tlp_cap, tt_cap, tpt_cap;
    bool texts_partial;
} tcollect_t;

// Appends piece's text, token ids, logprobs, top alternatives and their texts. 0, or -1 out of memory.
int tcollect_add(tcollect_t *c, const ls_msg_text_out_t *piece);
// Moves everything collected into *final (replacing its text and arrays) and empties c.
void tcollect_take(tcollect_t *c, ls_msg_text_out_t *final);
void tcollect_free(tcollect_t *c);

#endif
