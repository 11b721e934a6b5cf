// kv — block manager and prefix cache; see kv.h for the model and its invariant.
#include "kv.h"

#include <assert.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct kv_node {
    kv_node_t *parent, *child, *sibling;
    kv_node_t *lru_prev, *lru_next;  // idle list membership (refs of its block == 0)
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
};

kv_t *kv_new(uint32_t n_blocks, uint32_t block_size) {
    assert(block_size > 0);
    kv_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->n_blocks = n_blocks;
    self->block_size = block_size;
    self->blocks = calloc(n_blocks ? n_blocks : 1, sizeof *self->blocks);
    self->free = malloc((n_blocks ? n_blocks : 1) * sizeof *self->free);
    if (!self->blocks || !self->free) {
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

// Remove an idle subtree from the tree and give its blocks back to the free stack.
static void s_evict_subtree(kv_t *self, kv_node_t *node) {
    while (node->child) {
        kv_node_t *c = node->child;
        node->child = c->sibling;
        c->sibling = NULL;
        s_evict_subtree(self, c);
    }
    assert(node->idle && self->blocks[node->block].refs == 0);
    s_lru_unlink(self, node);
    self->blocks[node->block].node = NULL;
    self->free[self->n_free++] = node->block;
    self->n_cached--;
    free(node->tokens);
    free(node);
}

static void s_unlink_child(kv_node_t *node) {
    kv_node_t **p = &node->parent->child;
    while (*p != node)
        p = &(*p)->sibling;
    *p = node->sibling;
    node->sibling = NULL;
}

int kv_alloc(kv_t *self, uint32_t *block) {
    if (self->n_free == 0) {
        if (!self->lru_head)
            return -1;
        kv_node_t *victim = self->lru_head;
        s_unlink_child(victim);
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
    for (kv_node_t *r = self->roots; r; r = r->sibling)
        if (strcmp(r->key, key) == 0)
            return r;
    if (!create)
        return NULL;
    kv_node_t *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->key = strdup(key);
    r->block = UINT32_MAX;
    r->sibling = self->roots;
    self->roots = r;
    return r;
}

static kv_node_t *s_find_child(const kv_t *self, const kv_node_t *parent, const int32_t *tokens) {
    for (kv_node_t *c = parent->child; c; c = c->sibling)
        if (memcmp(c->tokens, tokens, self->block_size * sizeof *tokens) == 0)
            return c;
    return NULL;
}

uint32_t kv_match(kv_t *self, const char *key, const int32_t *tokens, uint32_t n, uint32_t *blocks,
                  kv_node_t **last) {
    *last = NULL;
    kv_node_t *node = n > 0 ? s_root(self, key, false) : NULL;
    uint32_t max = n > 0 ? (n - 1) / self->block_size : 0, got = 0;
    while (node && got < max) {
        node = s_find_child(self, node, tokens + (size_t)got * self->block_size);
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
    if (!parent || s_find_child(self, parent, tokens))
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
    node->sibling = parent->child;
    parent->child = node;
    self->blocks[block].node = node;
    self->n_cached++;
    return node;
}

static void s_drop_root(kv_t *self, kv_node_t *root) {
    while (root->child) {
        kv_node_t *c = root->child;
        root->child = c->sibling;
        c->sibling = NULL;
        s_evict_subtree(self, c);
    }
    kv_node_t **p = &self->roots;
    while (*p != root)
        p = &(*p)->sibling;
    *p = root->sibling;
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
