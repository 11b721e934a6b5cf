// grammar_cache — compiled grammars by source, so each distinct regex or schema is compiled once
// per process (the tokenizer validates with it, the worker decodes with it). Entries in use are
// held by a count; the least recently used free one goes when the cache is full. With a token
// masker, an entry's masks leave the masker's cache with it.
#ifndef LS_GRAMMAR_CACHE_H
#define LS_GRAMMAR_CACHE_H

#include "grammar.h"

typedef struct ls_grammar_cache ls_grammar_cache_t;

// At most max grammars kept (more while held). masker may be NULL; it must outlive the cache.
ls_grammar_cache_t *ls_grammar_cache_new(int max, ls_token_masker_t *masker);
void ls_grammar_cache_destroy(ls_grammar_cache_t **self_p);
// The grammar of (kind, src), compiled on a miss, held until ls_grammar_cache_release. NULL + err
// when the source does not compile (compile errors are not cached: a bad source costs its
// compile each time, bounded by grammar.h's limits).
ls_grammar_t *ls_grammar_cache_get(ls_grammar_cache_t *self, ls_grammar_src_t kind, const char *src, size_t len,
                                   char *err, size_t errlen);
void ls_grammar_cache_release(ls_grammar_cache_t *self, ls_grammar_t *g);

#endif
