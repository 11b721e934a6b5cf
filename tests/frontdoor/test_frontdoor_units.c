// The front door's pure logic on the demo model, built from the actors' own sources:
//   prompt_*    — GenerateReq validation, raw and chat prompts equal eval.json's ids, the context
//                 limit, TokenizedReq per completion (seed + index, stop set = request's + EOS)
//   collect     — non-streamed pieces collected into one TextOut
//   stream_*    — the detokenizer's per-request state: streamed text equals the full decode,
//                 stop strings (cut, matched_stop, Abort STOP, later TokenOuts dropped), ids
//                 outside the vocabulary, skip_special_tokens
//   added_tokens — an adapter's added tokens in prompts, input_ids, TokenizedReq and decoding
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "prompt.h"
#include "stream.h"

// A text field from a literal (a test never frees it).
#define TXT(lit) ((ls_text_t){(char *)(lit), sizeof(lit) - 1})

static tmodel_t *s_model;

static ls_msg_generate_req_t s_req(void) { return (ls_msg_generate_req_t){0}; }

static uint32_t s_prompt(const ls_msg_generate_req_t *g, ls_token_ids_t *ids, char *err) {
    ids->n = 0;
    return tmodel_prompt(s_model, g, NULL, false, 0, ids, err, 512);
}

static void test_prompt_sources(void **unused) {
    static const int32_t raw[] = {0, 277, 29, 329, 470, 471, 331, 488, 202, 279, 29};
    static const int32_t chat[] = {2,   305, 202, 291, 301, 270, 307, 300, 17, 3,   202, 2,   306, 202, 277,
                                   29,  329, 470, 471, 331, 488, 202, 279, 29, 3,   202, 2,   292, 202};
    ls_token_ids_t ids = {0};
    char err[512];
    ls_msg_generate_req_t g = s_req();
    g.text = TXT("input: 5 leaf road 1 red\noutput:");
    assert_int_equal(s_prompt(&g, &ids, err), 0);  // raw: BOS added
    assert_int_equal(ids.n, sizeof raw / sizeof *raw);
    assert_memory_equal(ids.ids, raw, sizeof raw);
    g = s_req();
    g.chat = true;
    g.messages = "[{\"role\": \"user\", \"content\": \"input: 5 leaf road 1 red\\noutput:\"}]";
    assert_int_equal(s_prompt(&g, &ids, err), 0);  // ChatML with the default system prompt
    assert_int_equal(ids.n, sizeof chat / sizeof *chat);
    assert_memory_equal(ids.ids, chat, sizeof chat);
    g.messages = "[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"input: 5 leaf road 1 red\"}, "
                 "{\"type\": \"text\", \"text\": \"output:\"}]}]";
    assert_int_equal(s_prompt(&g, &ids, err), 0);  // text parts joined by "\n", as vLLM
    assert_memory_equal(ids.ids, chat, sizeof chat);
    g = s_req();
    int32_t given[] = {0, 277, 29};
    g.input_ids = (ls_i32s_t){given, 3};
    assert_int_equal(s_prompt(&g, &ids, err), 0);
    assert_int_equal(ids.n, 3);
    assert_memory_equal(ids.ids, given, sizeof given);
    ls_token_ids_free(&ids);
}

static void test_prompt_refusals(void **unused) {
    ls_token_ids_t ids = {0};
    char err[512];
    int32_t given[] = {0, 277, 29}, bad[] = {0, 100000};
    const struct {
        ls_msg_generate_req_t g;
        uint32_t code;
        const char *says;
    } cases[] = {
        {{.text = {NULL, 0}}, LS_ERROR_CODE_BAD_REQUEST, "no prompt"},
        {{.text = TXT("x"), .input_ids = {given, 3}}, LS_ERROR_CODE_BAD_REQUEST, "not both"},
        {{.chat = true, .messages = "[{\"role\": \"user\""}, LS_ERROR_CODE_BAD_REQUEST, "JSON array"},
        {{.chat = true, .messages = "[]"}, LS_ERROR_CODE_BAD_REQUEST, "non-empty"},
        {{.chat = true, .messages = "[{\"content\": \"hi\"}]"}, LS_ERROR_CODE_BAD_REQUEST, "role"},
        {{.chat = true, .messages = "[{\"role\": \"user\", \"content\": 5}]"}, LS_ERROR_CODE_BAD_REQUEST, "content"},
        {{.chat = true, .messages = "[{\"role\": \"user\", \"content\": \"a\"}]", .text = TXT("x")},
         LS_ERROR_CODE_BAD_REQUEST, "neither"},
        {{.messages = "[]", .text = TXT("x")}, LS_ERROR_CODE_BAD_REQUEST, "need chat"},
        {{.input_ids = {bad, 2}}, LS_ERROR_CODE_BAD_REQUEST, "outside the vocabulary"},
        {{.text = TXT("x"), .sampling = {.n = LS_MSG_MAX_N + 1}}, LS_ERROR_CODE_BAD_REQUEST, "completions"},
        {{.text = TXT("cup"), .sampling = {.max_new_tokens = 255}}, LS_ERROR_CODE_TOO_LARGE,
         "maximum context length is 256 tokens. However, you requested"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        err[0] = 0;
        uint32_t code = s_prompt(&cases[i].g, &ids, err);
        if (code != cases[i].code || !strstr(err, cases[i].says))
            fail_msg("case %zu: code %u, \"%s\"; expected %u, \"%s\"", i, code, err, cases[i].code, cases[i].says);
    }
    // 300 words are more than the 256-token context
    char text[4096] = "input:";
    for (int i = 0; i < 300; i++)
        strcat(text, " cup");
    ls_msg_generate_req_t g = s_req();
    g.text = (ls_text_t){text, strlen(text)};
    assert_int_equal(s_prompt(&g, &ids, err), LS_ERROR_CODE_TOO_LARGE);
    assert_non_null(strstr(err, "maximum context length is 256 tokens. However, your prompt has"));
    g.text = TXT("cup");
    assert_int_equal(s_prompt(&g, &ids, err), 0);
    g.sampling.max_new_tokens = 256 - (uint32_t)ids.n;  // fits exactly
    assert_int_equal(s_prompt(&g, &ids, err), 0);
    g.sampling.max_new_tokens++;
    assert_int_equal(s_prompt(&g, &ids, err), LS_ERROR_CODE_TOO_LARGE);
    ls_token_ids_free(&ids);
}

static void test_prompt_request(void **unused) {
    ls_token_ids_t ids = {0};
    char err[512];
    ls_text_t stops[] = {TXT("road")};
    int32_t stop_ids[] = {42};
    ls_msg_generate_req_t g = s_req();
    g.text = TXT("cup");
    g.adapter = "reverse";
    g.sampling = (ls_msg_sampling_params_t){.n = 3, .seed = 7, .has_seed = true, .stop = {stops, 1},
                                            .stop_token_ids = {stop_ids, 1}, .temperature = 0.5f};
    assert_int_equal(s_prompt(&g, &ids, err), 0);
    assert_int_equal(tmodel_n(&g), 3);
    for (uint32_t i = 0; i < 3; i++) {
        ls_msg_t m;
        assert_int_equal(tmodel_request(s_model, &g, &ids, i, "uuid-1", NULL, 100, 600, &m), 0);
        const ls_msg_tokenized_req_t *t = &m.u.tokenized_req;
        assert_int_equal(m.type, LS_MSG_TOKENIZED_REQ);
        assert_int_equal(t->input_ids.n, ids.n);
        assert_int_equal(t->sampling.seed, 7 + i);
        assert_int_equal(t->sampling.n, 1);
        assert_true(t->sampling.temperature == 0.5f);
        assert_string_equal(t->sampling.stop.v[0].s, "road");
        assert_string_equal(t->adapter_id, "uuid-1");
        assert_string_equal(t->adapter_name, "reverse");
        assert_int_equal(t->arrival_ms, 100);
        assert_int_equal(t->deadline_ms, 600);
        // the request's stop id, then the demo's EOS ids 1 and 3
        assert_int_equal(t->stop_token_ids.n, 3);
        assert_int_equal(t->stop_token_ids.v[0], 42);
        assert_int_equal(t->stop_token_ids.v[1], 1);
        assert_int_equal(t->stop_token_ids.v[2], 3);
        ls_msg_clear(&m);
    }
    g.sampling.ignore_eos = true;
    g.sampling.has_seed = false;
    g.adapter = NULL;
    ls_msg_t m;
    assert_int_equal(tmodel_request(s_model, &g, &ids, 1, NULL, NULL, 0, 0, &m), 0);
    assert_int_equal(m.u.tokenized_req.stop_token_ids.n, 1);  // no EOS with ignore_eos
    assert_false(m.u.tokenized_req.sampling.has_seed);        // the scheduler derives one per rid
    assert_null(m.u.tokenized_req.adapter_id);
    ls_msg_clear(&m);
    ls_token_ids_free(&ids);
}

static void test_collect(void **unused) {
    tcollect_t c = {0};
    int32_t a[] = {5, 6}, b[] = {7};
    float la[] = {-0.5f, -1.0f}, lb[] = {-2.0f};
    ls_msg_text_out_t p1 = {.text = {"h\0", 2}, .token_ids = {a, 2}, .logprobs = {la, 2}};
    assert_int_equal(tcollect_add(&c, &p1), 0);
    ls_msg_t fin;
    ls_msg_init(&fin, LS_MSG_TEXT_OUT);
    fin.u.text_out.text = ls_msg_textdup("llo", 3);
    fin.u.text_out.token_ids.v = malloc(sizeof b);
    memcpy(fin.u.text_out.token_ids.v, b, sizeof b);
    fin.u.text_out.token_ids.n = 1;
    fin.u.text_out.logprobs.v = malloc(sizeof lb);
    memcpy(fin.u.text_out.logprobs.v, lb, sizeof lb);
    fin.u.text_out.logprobs.n = 1;
    fin.u.text_out.finish = LS_FINISH_REASON_STOP;
    assert_int_equal(tcollect_add(&c, &fin.u.text_out), 0);
    tcollect_take(&c, &fin.u.text_out);
    assert_int_equal(fin.u.text_out.text.len, 5);  // a NUL inside is kept
    assert_memory_equal(fin.u.text_out.text.s, "h\0llo", 6);
    assert_int_equal(fin.u.text_out.token_ids.n, 3);
    assert_int_equal(fin.u.text_out.token_ids.v[2], 7);
    assert_int_equal(fin.u.text_out.logprobs.n, 3);
    assert_true(fin.u.text_out.logprobs.v[1] == -1.0f);
    assert_int_equal(fin.u.text_out.finish, LS_FINISH_REASON_STOP);
    ls_msg_clear(&fin);
    tcollect_free(&c);
}

// ---------------------------------------------------------------------------------------------
// the detokenizer's stream

typedef struct {
    ls_msg_t msgs[64];
    const char *peers[64];
    int n;
} sent_t;

static void s_host_send(void *host, const char *peer, const ls_msg_t *msg) {
    sent_t *s = host;
    assert_true(s->n < 64);
    char *buf;
    size_t len;
    assert_int_equal(ls_msg_encode(msg, &buf, &len), 0);  // a deep copy
    assert_int_equal(ls_msg_decode(buf, len, &s->msgs[s->n], NULL), 0);
    free(buf);
    s->peers[s->n++] = peer;
}

static void s_sent_clear(sent_t *s) {
    for (int i = 0; i < s->n; i++)
        ls_msg_clear(&s->msgs[i]);
    s->n = 0;
}

static void s_token_out(dstream_t *d, uint64_t rid, const int32_t *ids, size_t n, bool first, uint32_t finish,
                        ls_text_t *stops, size_t nstops, bool skip) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_TOKEN_OUT);
    m.rid = rid;
    ls_msg_token_out_t *t = &m.u.token_out;
    t->token_ids = (ls_i32s_t){(int32_t *)ids, n};
    float lps[8] = {-0.1f, -0.2f, -0.3f, -0.4f, -0.5f, -0.6f, -0.7f, -0.8f};
    t->logprobs = (ls_f32s_t){lps, n};
    t->first = first;
    t->finish = finish;
    t->sampling.stop = (ls_texts_t){stops, nstops};
    t->sampling.skip_special_tokens = skip;
    t->prompt_tokens = 11;
    t->completion_tokens = 3;
    dstream_on_token_out(d, &m);
}

static void test_stream_text(void **unused) {
    sent_t sent = {0};
    dstream_t *d = dstream_new(tmodel_tokenizer(s_model), &(dstream_host_t){&sent, s_host_send});
    // " 5 leaf road 1 red" + <|end_of_text|>, in three TokenOuts
    const int32_t a[] = {329, 470}, b[] = {471}, c[] = {331, 488, 1};
    s_token_out(d, 9, a, 2, true, 0, NULL, 0, true);
    s_token_out(d, 9, b, 1, false, 0, NULL, 0, true);
    s_token_out(d, 9, c, 3, false, LS_FINISH_REASON_STOP, NULL, 0, true);
    assert_int_equal(sent.n, 3);
    char text[256] = "";
    for (int i = 0; i < 3; i++) {
        assert_string_equal(sent.peers[i], "tokenizer");
        assert_int_equal(sent.msgs[i].rid, 9);
        strcat(text, sent.msgs[i].u.text_out.text.s);
    }
    assert_string_equal(text, " 5 leaf road 1 red");  // skip_special_tokens drops the EOS
    assert_int_equal(sent.msgs[2].u.text_out.finish, LS_FINISH_REASON_STOP);
    assert_int_equal(sent.msgs[2].u.text_out.token_ids.n, 3);
    assert_int_equal(sent.msgs[2].u.text_out.logprobs.n, 3);
    assert_int_equal(dstream_stats(d)->active, 0);
    s_sent_clear(&sent);
    // without skip_special_tokens the EOS is text
    s_token_out(d, 10, c, 3, true, LS_FINISH_REASON_STOP, NULL, 0, false);
    assert_string_equal(sent.msgs[0].u.text_out.text.s, " 1 red<|end_of_text|>");
    s_sent_clear(&sent);
    dstream_destroy(&d);
}

static void test_stream_stop(void **unused) {
    sent_t sent = {0};
    dstream_t *d = dstream_new(tmodel_tokenizer(s_model), &(dstream_host_t){&sent, s_host_send});
    ls_text_t stops[] = {TXT("road 1"), TXT("zzz")};
    const int32_t a[] = {329, 470}, b[] = {471}, c[] = {331, 488};
    s_token_out(d, 5, a, 2, true, 0, stops, 2, true);
    s_token_out(d, 5, b, 1, false, 0, stops, 2, true);  // " road" may start "road 1": held
    assert_int_equal(sent.n, 2);
    assert_string_equal(sent.msgs[0].u.text_out.text.s, " 5 leaf");
    assert_string_equal(sent.msgs[1].u.text_out.text.s, " ");
    s_token_out(d, 5, c, 2, false, 0, stops, 2, true);  // " 1" completes it
    assert_int_equal(sent.n, 4);
    // the Abort STOP to the scheduler, then the final piece: nothing (the stop is cut)
    assert_string_equal(sent.peers[2], "scheduler");
    assert_int_equal(sent.msgs[2].type, LS_MSG_ABORT);
    assert_int_equal(sent.msgs[2].u.abort.finish, LS_FINISH_REASON_STOP);
    const ls_msg_text_out_t *fin = &sent.msgs[3].u.text_out;
    assert_string_equal(fin->text.s, "");
    assert_int_equal(fin->finish, LS_FINISH_REASON_STOP);
    assert_string_equal(fin->matched_stop.s, "road 1");
    assert_int_equal(fin->token_ids.n, 1);  // up to the token that completed the match
    assert_int_equal(fin->completion_tokens, 2);
    // the scheduler's later TokenOuts for it are dropped
    s_token_out(d, 5, c, 2, false, LS_FINISH_REASON_STOP, NULL, 0, true);
    assert_int_equal(sent.n, 4);
    assert_int_equal(dstream_stats(d)->dropped, 1);
    assert_int_equal(dstream_stats(d)->stop_matches, 1);
    s_sent_clear(&sent);
    // a stop string in the scheduler's last TokenOut: no Abort
    s_token_out(d, 6, c, 2, true, LS_FINISH_REASON_LENGTH, stops + 1, 1, true);
    s_token_out(d, 7, a, 2, true, LS_FINISH_REASON_LENGTH, (ls_text_t[]){TXT("leaf")}, 1, true);
    assert_int_equal(sent.n, 2);
    assert_int_equal(sent.msgs[0].u.text_out.finish, LS_FINISH_REASON_LENGTH);
    assert_string_equal(sent.msgs[0].u.text_out.text.s, " 1 red");
    assert_int_equal(sent.msgs[1].u.text_out.finish, LS_FINISH_REASON_STOP);
    assert_string_equal(sent.msgs[1].u.text_out.text.s, " 5 ");
    s_sent_clear(&sent);
    dstream_destroy(&d);
}

// Text is bytes with a length: a token whose text is a NUL byte (ByteLevel "Ā" is byte 0x00)
// reaches the TextOut whole, and a stop string around a NUL matches and is reported whole.
static void test_stream_nul(void **unused) {
    sent_t sent = {0};
    dstream_t *d = dstream_new(tmodel_tokenizer(s_model), &(dstream_host_t){&sent, s_host_send});
    const int32_t ids[] = {68, 192, 69};  // "a", NUL, "b"
    s_token_out(d, 1, ids, 3, true, LS_FINISH_REASON_LENGTH, NULL, 0, true);
    assert_int_equal(sent.n, 1);
    assert_int_equal(sent.msgs[0].u.text_out.text.len, 3);
    assert_memory_equal(sent.msgs[0].u.text_out.text.s, "a\0b", 3);
    s_sent_clear(&sent);
    ls_text_t stops[] = {TXT("\0b")};
    s_token_out(d, 2, ids, 3, true, 0, stops, 1, true);
    assert_int_equal(sent.n, 2);  // the Abort STOP, then the final piece
    const ls_msg_text_out_t *fin = &sent.msgs[1].u.text_out;
    assert_int_equal(fin->finish, LS_FINISH_REASON_STOP);
    assert_int_equal(fin->text.len, 1);
    assert_string_equal(fin->text.s, "a");
    assert_int_equal(fin->matched_stop.len, 2);
    assert_memory_equal(fin->matched_stop.s, "\0b", 2);
    s_sent_clear(&sent);
    dstream_destroy(&d);
}

static void test_stream_errors(void **unused) {
    sent_t sent = {0};
    dstream_t *d = dstream_new(tmodel_tokenizer(s_model), &(dstream_host_t){&sent, s_host_send});
    const int32_t bad[] = {329, 99999};
    s_token_out(d, 3, bad, 2, true, 0, NULL, 0, true);
    assert_int_equal(sent.n, 2);
    assert_int_equal(sent.msgs[0].type, LS_MSG_ABORT);
    assert_int_equal(sent.msgs[1].u.text_out.finish, LS_FINISH_REASON_ERROR);
    assert_int_equal(sent.msgs[1].u.text_out.error_code, LS_ERROR_CODE_INTERNAL);
    s_sent_clear(&sent);
    // the scheduler's ERROR ending, with no tokens at all, and a TokenOut for no request
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_TOKEN_OUT);
    m.rid = 4;
    m.u.token_out.first = true;
    m.u.token_out.finish = LS_FINISH_REASON_ERROR;
    m.u.token_out.error = ls_msg_strdup("the worker failed");
    dstream_on_token_out(d, &m);
    ls_msg_clear(&m);
    s_token_out(d, 77, bad, 1, false, 0, NULL, 0, true);
    assert_int_equal(sent.n, 1);
    assert_int_equal(sent.msgs[0].u.text_out.error_code, LS_ERROR_CODE_UNAVAILABLE);
    assert_string_equal(sent.msgs[0].u.text_out.error, "the worker failed");
    s_sent_clear(&sent);
    // shutdown ends what is left
    s_token_out(d, 8, bad, 1, true, 0, NULL, 0, true);
    dstream_shutdown(d);
    assert_int_equal(sent.n, 2);
    assert_int_equal(sent.msgs[1].u.text_out.error_code, LS_ERROR_CODE_SHUTTING_DOWN);
    s_sent_clear(&sent);
    dstream_destroy(&d);
}

// An adapter's added tokens (docs/adapters.md, "Added vocabulary") on the demo model (vocab
// 824): the prompt's text splits on them, input_ids may hold them only with them, each
// TokenizedReq carries them, and the detokenizer decodes the ids with the first TokenOut's
// list (skip_special_tokens and stop strings as for the base's own); a bad list is refused.
static void test_added_tokens(void **unused) {
    ls_msg_added_token_t toks[] = {{.id = 824, .content = " LEAF2"}, {.id = 825, .content = "<road2>", .special = true}};
    ls_msg_added_tokens_t list = {toks, 2};
    char err[512];
    ls_tok_added_t *a = tmodel_added_new(s_model, &list, err, sizeof err);
    assert_non_null(a);
    ls_msg_generate_req_t g = s_req();
    g.text = TXT("input: 5 LEAF2 <road2> 1");
    ls_token_ids_t ids = {0}, base = {0};
    assert_int_equal(tmodel_prompt(s_model, &g, a, false, 0, &ids, err, sizeof err), 0);
    assert_int_equal(s_prompt(&g, &base, err), 0);
    static const int32_t want[] = {0, 277, 29, 329, 824, 224, 825, 331};
    assert_int_equal(ids.n, sizeof want / sizeof *want);
    assert_memory_equal(ids.ids, want, sizeof want);
    for (size_t i = 0; i < base.n; i++)
        assert_true(base.ids[i] < 824);  // the base reads the same text as plain text
    int32_t given[] = {0, 824, 825};
    g = s_req();
    g.input_ids = (ls_i32s_t){given, 3};
    assert_int_equal(tmodel_prompt(s_model, &g, a, false, 0, &ids, err, sizeof err), 0);
    assert_int_equal(s_prompt(&g, &base, err), LS_ERROR_CODE_BAD_REQUEST);
    assert_non_null(strstr(err, "input_ids[1] = 824 is outside the vocabulary"));
    assert_int_equal(tmodel_prompt(s_model, &g, NULL, true, 0, &ids, err, sizeof err), 0);  // open: checked later
    given[2] = 826;
    assert_int_equal(tmodel_prompt(s_model, &g, a, false, 0, &ids, err, sizeof err), LS_ERROR_CODE_BAD_REQUEST);
    assert_non_null(strstr(err, "and the adapter's added tokens (824..825)"));
    ls_msg_t m;
    g.input_ids.n = 2;
    g.adapter = "vocab";
    ls_token_ids_t two = {given, 2, 2};
    assert_int_equal(tmodel_request(s_model, &g, &two, 0, "uuid-v", &list, 0, 0, &m), 0);
    assert_int_equal(m.u.tokenized_req.added_tokens.n, 2);
    assert_string_equal(m.u.tokenized_req.added_tokens.v[1].content, "<road2>");
    assert_true(m.u.tokenized_req.added_tokens.v[1].special);
    ls_msg_clear(&m);
    ls_token_ids_free(&ids);
    ls_token_ids_free(&base);
    ls_tok_added_destroy(&a);
    // refused: ids not from vocab_size on, a token the tokenizer has
    toks[0].id = 823;
    assert_null(tmodel_added_new(s_model, &list, err, sizeof err));
    assert_non_null(strstr(err, "has id 823 where 824 is due"));
    toks[0] = (ls_msg_added_token_t){.id = 824, .content = "<|im_start|>"};
    assert_null(tmodel_added_new(s_model, &list, err, sizeof err));
    assert_non_null(strstr(err, "is the tokenizer's own token 2"));
    toks[0] = (ls_msg_added_token_t){.id = 824, .content = " LEAF2"};

    // the detokenizer: the list comes with the first TokenOut
    sent_t sent = {0};
    dstream_t *d = dstream_new(tmodel_tokenizer(s_model), &(dstream_host_t){&sent, s_host_send});
    const int32_t out[] = {329, 824, 825, 331};
    for (int skip = 0; skip < 2; skip++) {
        ls_msg_init(&m, LS_MSG_TOKEN_OUT);
        m.rid = 20 + (uint64_t)skip;
        m.u.token_out.token_ids = (ls_i32s_t){(int32_t *)out, 4};
        m.u.token_out.first = true;
        m.u.token_out.finish = LS_FINISH_REASON_LENGTH;
        m.u.token_out.sampling.skip_special_tokens = skip;
        m.u.token_out.added_tokens = list;
        dstream_on_token_out(d, &m);
        assert_int_equal(sent.n, 1);
        assert_string_equal(sent.msgs[0].u.text_out.text.s, skip ? " 5 LEAF2 1" : " 5 LEAF2<road2> 1");
        s_sent_clear(&sent);
    }
    // a stop string made of an added token's text
    ls_text_t stops[] = {TXT("F2<ro")};
    ls_msg_init(&m, LS_MSG_TOKEN_OUT);
    m.rid = 22;
    m.u.token_out.token_ids = (ls_i32s_t){(int32_t *)out, 4};
    m.u.token_out.first = true;
    m.u.token_out.sampling.stop = (ls_texts_t){stops, 1};
    m.u.token_out.added_tokens = list;
    dstream_on_token_out(d, &m);
    assert_int_equal(sent.n, 2);  // an Abort STOP to the scheduler, and the text
    assert_string_equal(sent.peers[0], "scheduler");
    assert_string_equal(sent.msgs[1].u.text_out.text.s, " 5 LEA");
    assert_string_equal(sent.msgs[1].u.text_out.matched_stop.s, "F2<ro");
    s_sent_clear(&sent);
    // without the list, the added ids are outside the vocabulary; a bad list fails the request
    s_token_out(d, 23, out, 4, true, 0, NULL, 0, true);
    assert_int_equal(sent.msgs[sent.n - 1].u.text_out.finish, LS_FINISH_REASON_ERROR);
    s_sent_clear(&sent);
    toks[1].id = 900;
    ls_msg_init(&m, LS_MSG_TOKEN_OUT);
    m.rid = 24;
    m.u.token_out.token_ids = (ls_i32s_t){(int32_t *)out, 1};
    m.u.token_out.first = true;
    m.u.token_out.added_tokens = list;
    dstream_on_token_out(d, &m);
    assert_int_equal(sent.msgs[sent.n - 1].u.text_out.finish, LS_FINISH_REASON_ERROR);
    assert_non_null(strstr(sent.msgs[sent.n - 1].u.text_out.error, "out of order"));
    s_sent_clear(&sent);
    dstream_destroy(&d);
}

int main(void) {
    char err[512];
    if (!(s_model = tmodel_load(LS_DEMO_DIR, NULL, err, sizeof err))) {
        fprintf(stderr, "demo model: %s\n", err);
        return 1;
    }
    assert_int_equal(tmodel_context(s_model), 256);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prompt_sources), cmocka_unit_test(test_prompt_refusals),
        cmocka_unit_test(test_prompt_request), cmocka_unit_test(test_collect),
        cmocka_unit_test(test_stream_text),    cmocka_unit_test(test_stream_stop),
        cmocka_unit_test(test_stream_nul),     cmocka_unit_test(test_stream_errors),
        cmocka_unit_test(test_added_tokens),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tmodel_destroy(&s_model);
    return rc;
}
