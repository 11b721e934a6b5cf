// grammar_mask — token masks of DFA states over a vocabulary trie, cached; see grammar.h.
//
// The trie holds every token's bytes; a mask is one depth-first walk of it beside the DFA, a
// subtree abandoned as soon as the DFA dies, so the cost follows the tokens that can still
// follow (all of them inside a JSON string, a handful between two keys) rather than the
// vocabulary times the token length. Masks live in one LRU across grammars, bounded by bytes;
// a grammar keeps a pointer per state to its entry, which the LRU clears when it evicts one.
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

typedef struct {
    int32_t child;  // first child, -1 none
    int32_t next;   // next sibling, -1 none
    int32_t tok0;   // tokens ending here: tok_ids[tok0 .. tok0+ntok)
    int32_t ntok;
    uint8_t byte;
} s_tnode_t;

struct s_mask_entry {
    struct s_mask_entry *prev, *next;  // LRU, most recent first
    ls_grammar_t *g;
    int state;
    uint32_t bits[];
};

struct ls_token_masker {
    int32_t V;
    int words;
    s_tnode_t *nodes;
    int32_t n_nodes;
    int32_t *tok_ids;  // grouped by trie node
    size_t cache_cap, cache_bytes;
    struct s_mask_entry *head, *tail;
    uint64_t hits, misses;
    // walk scratch: (node, state) pairs
    int32_t *stack;
    size_t stack_cap;
};

// Children of a node stay sorted by byte only for readability of dumps; lookups are linear
// in the (at most 256) children.
static int32_t s_child(ls_token_masker_t *m, int32_t node, uint8_t b, int create) {
    int32_t *at = &m->nodes[node].child;
    while (*at >= 0 && m->nodes[*at].byte < b)
        at = &m->nodes[*at].next;
    if (*at >= 0 && m->nodes[*at].byte == b)
        return *at;
    if (!create)
        return -1;
    int32_t k = m->n_nodes++;
    m->nodes[k] = (s_tnode_t){.child = -1, .next = *at, .tok0 = 0, .ntok = 0, .byte = b};
    *at = k;
    return k;
}

ls_token_masker_t *ls_token_masker_new(int32_t V, const char *const *tokens, const uint32_t *lens,
                                       size_t cache_bytes) {
    ls_token_masker_t *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->V = V;
    m->words = (V + 31) / 32;
    m->cache_cap = cache_bytes;
    size_t total = 1;
    for (int32_t v = 0; v < V; v++)
        total += lens[v];
    int32_t *node_of = malloc((size_t)(V ? V : 1) * sizeof *node_of);
    int32_t *count = NULL;
    m->nodes = malloc(total * sizeof *m->nodes);
    m->tok_ids = malloc((size_t)(V ? V : 1) * sizeof *m->tok_ids);
    if (!node_of || !m->nodes || !m->tok_ids) {
        free(node_of);
        ls_token_masker_destroy(&m);
        return NULL;
    }
    m->nodes[0] = (s_tnode_t){.child = -1, .next = -1};
    m->n_nodes = 1;
    for (int32_t v = 0; v < V; v++) {
        int32_t node = lens[v] ? 0 : -1;
        for (uint32_t i = 0; i < lens[v]; i++)
            node = s_child(m, node, (uint8_t)tokens[v][i], 1);
        node_of[v] = node;
        if (node > 0)
            m->nodes[node].ntok++;
    }
    // tokens grouped by node: counts to offsets, then fill
    if (!(count = calloc((size_t)m->n_nodes, sizeof *count))) {
        free(node_of);
        ls_token_masker_destroy(&m);
        return NULL;
    }
    int32_t off = 0;
    for (int32_t k = 0; k < m->n_nodes; k++) {
        m->nodes[k].tok0 = off;
        off += m->nodes[k].ntok;
    }
    for (int32_t v = 0; v < V; v++)
        if (node_of[v] > 0)
            m->tok_ids[m->nodes[node_of[v]].tok0 + count[node_of[v]]++] = v;
    free(count);
    free(node_of);
    return m;
}

static void s_unlink(ls_token_masker_t *m, struct s_mask_entry *e) {
    if (e->prev)
        e->prev->next = e->next;
    else
        m->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        m->tail = e->prev;
    e->prev = e->next = NULL;
}

static void s_push_front(ls_token_masker_t *m, struct s_mask_entry *e) {
    e->prev = NULL;
    e->next = m->head;
    if (m->head)
        m->head->prev = e;
    m->head = e;
    if (!m->tail)
        m->tail = e;
}

static size_t s_entry_bytes(const ls_token_masker_t *m) {
    return sizeof(struct s_mask_entry) + (size_t)m->words * sizeof(uint32_t);
}

static void s_evict(ls_token_masker_t *m, struct s_mask_entry *e) {
    s_unlink(m, e);
    e->g->masks[e->state] = NULL;
    m->cache_bytes -= s_entry_bytes(m);
    free(e);
}

void ls_token_masker_destroy(ls_token_masker_t **self_p) {
    ls_token_masker_t *m = *self_p;
    if (!m)
        return;
    while (m->head)
        s_evict(m, m->head);
    free(m->nodes);
    free(m->tok_ids);
    free(m->stack);
    free(m);
    *self_p = NULL;
}

int ls_token_masker_words(const ls_token_masker_t *self) {
    return self->words;
}

// Pushes (node, state) on the walk's stack; -1 out of memory.
static int s_push(ls_token_masker_t *m, size_t *sp, int32_t node, int state) {
    if (*sp + 2 > m->stack_cap) {
        size_t cap = m->stack_cap ? m->stack_cap * 2 : 1024;
        int32_t *s = realloc(m->stack, cap * sizeof *s);
        if (!s)
            return -1;
        m->stack = s;
        m->stack_cap = cap;
    }
    m->stack[(*sp)++] = node;
    m->stack[(*sp)++] = state;
    return 0;
}

// Walks the trie beside the DFA from state, setting the bits of every token whose bytes keep
// the DFA alive. -1 on out of memory.
static int s_walk(ls_token_masker_t *m, const ls_grammar_t *g, int state, uint32_t *bits) {
    size_t sp = 0;
    for (int32_t c = m->nodes[0].child; c >= 0; c = m->nodes[c].next)
        if (s_push(m, &sp, c, state) < 0)
            return -1;
    while (sp > 0) {
        int st = m->stack[--sp];
        int32_t node = m->stack[--sp];
        const s_tnode_t *n = &m->nodes[node];
        int to = g->trans[(size_t)st * g->n_cls + g->cls[n->byte]];
        if (to < 0)
            continue;
        for (int32_t i = 0; i < n->ntok; i++) {
            int32_t v = m->tok_ids[n->tok0 + i];
            bits[v >> 5] |= 1u << (v & 31);
        }
        for (int32_t k = n->child; k >= 0; k = m->nodes[k].next)
            if (s_push(m, &sp, k, to) < 0)
                return -1;
    }
    return 0;
}

const uint32_t *ls_token_masker_mask(ls_token_masker_t *self, ls_grammar_t *g, int state) {
    if (state < 0 || state >= g->n_states)
        return NULL;
    if (!g->masks && !(g->masks = calloc((size_t)g->n_states, sizeof *g->masks)))
        return NULL;
    struct s_mask_entry *e = g->masks[state];
    if (e) {
        self->hits++;
        s_unlink(self, e);
        s_push_front(self, e);
        return e->bits;
    }
    self->misses++;
    size_t bytes = s_entry_bytes(self);
    // the newest mask is kept even over the bound, so the caller's pointer stays valid
    while (self->tail && self->cache_bytes + bytes > self->cache_cap)
        s_evict(self, self->tail);
    if (!(e = calloc(1, bytes)))
        return NULL;
    if (s_walk(self, g, state, e->bits) < 0) {
        free(e);
        return NULL;
    }
    e->g = g;
    e->state = state;
    g->masks[state] = e;
    self->cache_bytes += bytes;
    s_push_front(self, e);
    return e->bits;
}

void ls_token_masker_detach(ls_token_masker_t *self, ls_grammar_t *g) {
    if (!g->masks)
        return;
    for (int s = 0; s < g->n_states; s++)
        if (g->masks[s])
            s_evict(self, g->masks[s]);
}

size_t ls_token_masker_bytes(const ls_token_masker_t *self) {
    return self->cache_bytes;
}

uint64_t ls_token_masker_misses(const ls_token_masker_t *self) {
    return self->misses;
}

uint64_t ls_token_masker_hits(const ls_token_masker_t *self) {
    return self->hits;
}
