// bench_tokenizer: encode and decode throughput of the tokenizer library on the committed
// corpus (tools/tokenizer-refs/corpus.jsonl, English, CJK, emoji, code, numbers, specials),
// for each reference vocabulary. Prints MB/s of UTF-8 text; not a test.
//
//   bench_tokenizer [seconds per measurement, default 1]
//
// "encode" is the corpus line by line, as requests arrive, with the word cache warm (as in a
// running server); "cold" is one pass with an empty cache, every word merged from scratch. "decode" is the full decode of each line's ids;
// "stream" feeds the same ids one by one through ls_detok_t.
#include <time.h>

#include "text_refs.h"
#include "bench_util.h"

typedef struct {
    json_t **lines;
    size_t n, bytes;
} s_corpus_t;

static size_t s_encode_pass(ls_tokenizer_t *t, const s_corpus_t *c, ls_token_ids_t *ids) {
    char err[256];
    size_t tokens = 0;
    for (size_t i = 0; i < c->n; i++) {
        size_t n;
        const char *x = refs_str(c->lines[i], NULL, &n);
        ids->n = 0;
        if (ls_tokenizer_encode(t, x, n, 0, ids, err, sizeof err) < 0) {
            fprintf(stderr, "bench_tokenizer: %s\n", err);
            exit(1);
        }
        tokens += ids->n;
    }
    return tokens;
}

static void s_bench(const char *vocab, const s_corpus_t *c, double secs) {
    char err[512];
    double t0 = bench_now();
    ls_tokenizer_t *t = refs_load(vocab, err, sizeof err);
    if (!t) {
        fprintf(stderr, "bench_tokenizer: %s\n", err);
        exit(1);
    }
    double load = bench_now() - t0;
    ls_token_ids_t ids = {0};
    size_t tokens = s_encode_pass(t, c, &ids);
    size_t passes = 0;
    t0 = bench_now();
    do {
        s_encode_pass(t, c, &ids);
        passes++;
    } while (bench_now() - t0 < secs);
    double warm = (bench_now() - t0) / (double)passes;
    // Cold: a fresh tokenizer (empty word cache) in a process that has already run, so the
    // figure is the merge work and not first-touch page faults.
    ls_tokenizer_destroy(&t);
    t = refs_load(vocab, err, sizeof err);
    t0 = bench_now();
    s_encode_pass(t, c, &ids);
    double cold = bench_now() - t0;

    // Every line's ids once, for the decoders.
    ls_token_ids_t *per = calloc(c->n, sizeof *per);
    for (size_t i = 0; i < c->n; i++) {
        size_t n;
        const char *x = refs_str(c->lines[i], NULL, &n);
        ls_tokenizer_encode(t, x, n, 0, &per[i], err, sizeof err);
    }
    size_t out_bytes = 0, dpasses = 0;
    t0 = bench_now();
    do {
        out_bytes = 0;
        for (size_t i = 0; i < c->n; i++) {
            size_t len;
            free(ls_tokenizer_decode(t, per[i].ids, per[i].n, 0, &len, err, sizeof err));
            out_bytes += len;
        }
        dpasses++;
    } while (bench_now() - t0 < secs);
    double dec = (bench_now() - t0) / (double)dpasses;
    size_t spasses = 0;
    t0 = bench_now();
    do {
        for (size_t i = 0; i < c->n; i++) {
            ls_detok_t *d = ls_detok_new(t, 0, NULL, NULL, 0);
            const char *p;
            size_t k;
            for (size_t j = 0; j < per[i].n; j++)
                ls_detok_push(d, per[i].ids[j], &p, &k);
            ls_detok_finish(d, &p, &k);
            ls_detok_destroy(&d);
        }
        spasses++;
    } while (bench_now() - t0 < secs);
    double stream = (bench_now() - t0) / (double)spasses;
    double mb = (double)c->bytes / 1e6;
    printf("%-7s load %6.0f ms | encode %6.1f MB/s (cold %5.1f) %5.2f M tok/s | decode %6.1f MB/s | "
           "stream %5.2f M tok/s | %.2f bytes/token\n",
           vocab, load * 1e3, mb / warm, mb / cold, (double)tokens / warm / 1e6, (double)out_bytes / 1e6 / dec,
           (double)tokens / stream / 1e6, (double)c->bytes / (double)tokens);
    for (size_t i = 0; i < c->n; i++)
        ls_token_ids_free(&per[i]);
    free(per);
    ls_token_ids_free(&ids);
    ls_tokenizer_destroy(&t);
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 1.0;
    s_corpus_t c = {0};
    c.lines = refs_jsonl("corpus.jsonl", &c.n);
    if (!c.lines) {
        fprintf(stderr, "bench_tokenizer: cannot read %s/corpus.jsonl\n", LS_REFS_DIR);
        return 1;
    }
    for (size_t i = 0; i < c.n; i++)
        c.bytes += json_string_length(c.lines[i]);
    printf("corpus: %zu lines, %.1f KB; each figure is the mean of passes over %.1f s\n", c.n,
           (double)c.bytes / 1e3, secs);
    const char *vocabs[] = {"qwen3", "llama3", "llama2"};
    for (int i = 0; i < 3; i++)
        s_bench(vocabs[i], &c, secs);
    refs_jsonl_free(c.lines);
    return 0;
}
