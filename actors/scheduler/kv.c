// kv — block manager and prefix cache; see kv.h for the model and its invariant.
#include "kv.h"

#include <assert.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "ls_hash.h"

struct kv_node {
    kv_node_t *parent, *child;        // a node's children: a list through sibling / prev_sibling
    kv_node_t *sibling, *prev_sibling; // (the roots: the same, from kv.roots)
    kv_node_t *lru_prev, *lru_next;  // idle list membership (refs of its block == 0)
    kv_node_t *hnext;  // the next node of its slot in the lookup table
    uint64_t hash;     // of (parent, tokens), or of the key for a root
    bool idle;
    uint32_t block;   // UINT32_MAX for a root
    int32_t *tokens;  // block_size tokens; NULL for a root
    char *key;        // roots only: the adapter id ("" for the base model)
};

typedef struct {
    uint32_t refs;
    kv_node_t *node;  // its place in the tree, or NULL for a private block
} kv_block_t;

struct kv {
    uint32_t n_blocks, block_size;
    kv_block_t *blocks;
    uint32_t *free;  // stack of free block ids
    uint32_t n_free;
    uint32_t n_used, n_cached;
    kv_node_t *lru_head, *lru_tail;  // idle cached nodes, least recently released first
    uint32_t n_idle;
    kv_node_t *roots;  // linked through sibling
    // Every node by its hash: a root by its key, a block by (parent, tokens), so that finding
    // a child or a root does not walk a list as wide as the cached prompts or the adapters.
    // Chained, a power of two of slots, doubled past one node a slot. The seed is random per
    // table so that crafted prompts cannot pile into one chain; nothing iterates the table,
    // so which slot a node lands in changes no decision.
    kv_node_t **table;
    size_t n_slots, n_indexed;
    uint64_t seed;
};

enum { S_SLOTS_MIN = 64 };

kv_t *kv_new(uint32_t n_blocks, uint32_t block_size) {
    assert(block_size > 0);
    kv_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->n_blocks = n_blocks;
    self->block_size = block_size;
    self->blocks = calloc(n_blocks ? n_blocks : 1, sizeof *self->blocks);
    self->free = malloc((n_blocks ? n_blocks : 1) * sizeof *self->free);
    self->table = calloc(S_SLOTS_MIN, sizeof *self->table);
    self->n_slots = S_SLOTS_MIN;
    if (getrandom(&self->seed, sizeof self->seed, GRND_NONBLOCK) != sizeof self->seed)
        self->seed = (uint64_t)(uintptr_t)self; // no entropy yet: still not the prompts' choice
    if (!self->blocks || !self->free || !self->table) {
        kv_destroy(&self);
        return NULL;
    }
    // Stack order hands out block 0 first: plans read naturally in logs and tests.
    for (uint32_t i = 0; i < n_blocks; i++)
        self->free[i] = n_blocks - 1 - i;
    self->n_free = n_blocks;
    return self;
}

static void s_node_free_tree(kv_node_t *node) {
    while (node) {
        kv_node_t *next = node->sibling;
        s_node_free_tree(node->child);
        free(node->tokens);
        free(node->key);
        free(node);
        node = next;
    }
}

void kv_destroy(kv_t **self_p) {
    kv_t *self = *self_p;
    if (!self)
        return;
    s_node_free_tree(self->roots);
    free(self->table);
    free(self->blocks);
    free(self->free);
    free(self);
    *self_p = NULL;
}

uint32_t kv_block_size(const kv_t *self) { return self->block_size; }
uint32_t kv_total(const kv_t *self) { return self->n_blocks; }
uint32_t kv_available(const kv_t *self) { return self->n_free + self->n_idle; }
uint32_t kv_used(const kv_t *self) { return self->n_used; }
uint32_t kv_cached(const kv_t *self) { return self->n_cached; }
uint32_t kv_refs(const kv_t *self, uint32_t block) { return block < self->n_blocks ? self->blocks[block].refs : 0; }

// -- the children lists --------------------------------------------------------------------

static void s_link(kv_node_t **head, kv_node_t *node) {
    node->prev_sibling = NULL;
    node->sibling = *head;
    if (*head)
        (*head)->prev_sibling = node;
    *head = node;
}

static void s_unlink(kv_node_t **head, kv_node_t *node) {
    if (node->prev_sibling)
        node->prev_sibling->sibling = node->sibling;
    else
        *head = node->sibling;
    if (node->sibling)
        node->sibling->prev_sibling = node->prev_sibling;
    node->sibling = node->prev_sibling = NULL;
}

// -- the lookup table ------------------------------------------------------------------------

static uint64_t s_hash_block(const kv_t *self, const kv_node_t *parent, const int32_t *tokens) {
    uint64_t h = ls_hash_mix64(self->seed ^ (uint64_t)(uintptr_t)parent);
    for (uint32_t i = 0; i < self->block_size; i++)
        h = ls_hash_mix64(h ^ (uint32_t)tokens[i]);
    return h;
}

static uint64_t s_hash_key(const kv_t *self, const char *key) {
    return ls_hash_mix64(ls_hash_fnv1a(LS_HASH_FNV_BASIS ^ ~self->seed, key, strlen(key)));
}

// Twice the slots; without the memory, the chains just grow (lookups stay right)
static void s_index_grow(kv_t *self) {
    size_t n = 2 * self->n_slots;
    kv_node_t **t = calloc(n, sizeof *t);
    if (!t)
        return;
    for (size_t i = 0; i < self->n_slots; i++)
        for (kv_node_t *node = self->table[i], *next; node; node = next) {
            next = node->hnext;
            node->hnext = t[node->hash & (n - 1)];
            t[node->hash & (n - 1)] = node;
        }
    free(self->table);
    self->table = t;
    self->n_slots = n;
}

static void s_index_add(kv_t *self, kv_node_t *node) {
    if (self->n_indexed >= self->n_slots)
        s_index_grow(self);
    kv_node_t **slot = &self->table[node->hash & (self->n_slots - 1)];
    node->hnext = *slot;
    *slot = node;
    self->n_indexed++;
}

static void s_index_remove(kv_t *self, kv_node_t *node) {
    kv_node_t **p = &self->table[node->hash & (self->n_slots - 1)];
    while (*p != node)
        p = &(*p)->hnext;
    *p = node->hnext;
    self->n_indexed--;
}

// -- the idle list ---------------------------------------------------------------------------

static void s_lru_unlink(kv_t *self, kv_node_t *node) {
    assert(node->idle);
    if (node->lru_prev)
        node->lru_prev->lru_next = node->lru_next;
    else
        self->lru_head = node->lru_next;
    if (node->lru_next)
        node->lru_next->lru_prev = node->lru_prev;
    else
        self->lru_tail = node->lru_prev;
    node->lru_prev = node->lru_next = NULL;
    node->idle = false;
    self->n_idle--;
}

static void s_lru_append(kv_t *self, kv_node_t *node) {
    assert(!node->idle);
    node->lru_prev = self->lru_tail;
    node->lru_next = NULL;
    if (self->lru_tail)
        self->lru_tail->lru_next = node;
    else
        self->lru_head = node;
    self->lru_tail = node;
    node->idle = true;
    self->n_idle++;
}

static void s_ref(kv_t *self, uint32_t block) {
    kv_block_t *b = &self->blocks[block];
    if (b->refs++ == 0) {
        self->n_used++;
        if (b->node)
            s_lru_unlink(self, b->node);
    }
}

static void s_evict_subtree(kv_t *self, kv_node_t *node);

// Remove node's subtrees (idle) from the tree, their blocks back to the free stack.
static void s_evict_children(kv_t *self, kv_node_t *node) {
    while (node->child) {
        kv_node_t *c = node->child;
        s_unlink(&node->child, c);
        s_evict_subtree(self, c);
    }
}

// Remove an idle subtree, unlinked from its parent, from the tree and give its blocks back to
// the free stack.
static void s_evict_subtree(kv_t *self, kv_node_t *node) {
    s_evict_children(self, node);
    assert(node->idle && self->blocks[node->block].refs == 0);
    s_lru_unlink(self, node);
    s_index_remove(self, node);
    self->blocks[node->block].node = NULL;
    self->free[self->n_free++] = node->block;
    self->n_cached--;
    free(node->tokens);
    free(node);
}

int kv_alloc(kv_t *self, uint32_t *block) {
    if (self->n_free == 0) {
        if (!self->lru_head)
            return -1;
        kv_node_t *victim = self->lru_head;
        s_unlink(&victim->parent->child, victim);
        s_evict_subtree(self, victim);
    }
    *block = self->free[--self->n_free];
    s_ref(self, *block);
    return 0;
}

void kv_release(kv_t *self, uint32_t block) {
    assert(block < self->n_blocks && self->blocks[block].refs > 0);
    kv_block_t *b = &self->blocks[block];
    if (--b->refs > 0)
        return;
    self->n_used--;
    if (b->node)
        s_lru_append(self, b->node);
    else
        self->free[self->n_free++] = block;
}

static kv_node_t *s_root(kv_t *self, const char *key, bool create) {
    uint64_t h = s_hash_key(self, key);
    for (kv_node_t *r = self->table[h & (self->n_slots - 1)]; r; r = r->hnext)
        if (r->hash == h && r->key && strcmp(r->key, key) == 0)
            return r;
    if (!create)
        return NULL;
    kv_node_t *r = calloc(1, sizeof *r);
    if (!r || !(r->key = strdup(key))) {
        free(r);
        return NULL;
    }
    r->block = UINT32_MAX;
    r->hash = h;
    s_link(&self->roots, r);
    s_index_add(self, r);
    return r;
}

// parent's child holding tokens, whose hash is h (s_hash_block), or NULL
static kv_node_t *s_find_child(const kv_t *self, const kv_node_t *parent, const int32_t *tokens,
                               uint64_t h) {
    for (kv_node_t *c = self->table[h & (self->n_slots - 1)]; c; c = c->hnext)
        if (c->hash == h && c->parent == parent &&
            memcmp(c->tokens, tokens, self->block_size * sizeof *tokens) == 0)
            return c;
    return NULL;
}

uint32_t kv_match(kv_t *self, const char *key, const int32_t *tokens, uint32_t n, uint32_t *blocks,
                  kv_node_t **last) {
    *last = NULL;
    kv_node_t *node = n > 0 ? s_root(self, key, false) : NULL;
    uint32_t max = n > 0 ? (n - 1) / self->block_size : 0, got = 0;
    while (node && got < max) {
        const int32_t *t = tokens + (size_t)got * self->block_size;
        node = s_find_child(self, node, t, s_hash_block(self, node, t));
        if (!node)
            break;
        s_ref(self, node->block);
        blocks[got++] = node->block;
        *last = node;
    }
    return got;
}

kv_node_t *kv_insert(kv_t *self, const char *key, kv_node_t *parent, const int32_t *tokens, uint32_t block) {
    assert(block < self->n_blocks && self->blocks[block].refs > 0 && !self->blocks[block].node);
    if (!parent)
        parent = s_root(self, key, true);
    if (!parent)
        return NULL;
    uint64_t h = s_hash_block(self, parent, tokens);
    if (s_find_child(self, parent, tokens, h))
        return NULL;
    kv_node_t *node = calloc(1, sizeof *node);
    int32_t *copy = malloc(self->block_size * sizeof *copy);
    if (!node || !copy) {
        free(node);
        free(copy);
        return NULL;
    }
    memcpy(copy, tokens, self->block_size * sizeof *copy);
    node->tokens = copy;
    node->block = block;
    node->parent = parent;
    node->hash = h;
    s_link(&parent->child, node);
    s_index_add(self, node);
    self->blocks[block].node = node;
    self->n_cached++;
    return node;
}

static void s_drop_root(kv_t *self, kv_node_t *root) {
    s_evict_children(self, root);
    s_unlink(&self->roots, root);
    s_index_remove(self, root);
    free(root->key);
    free(root);
}

void kv_drop_key(kv_t *self, const char *key) {
    kv_node_t *root = s_root(self, key, false);
    if (root)
        s_drop_root(self, root);
}

void kv_reset(kv_t *self) {
    assert(self->n_used == 0);
    while (self->roots)
        s_drop_root(self, self->roots);
}
