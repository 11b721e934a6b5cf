// kv — the scheduler's picture of the workers' paged KV cache: block ids, reference counts,
// and the prefix cache (a radix tree over FULL blocks).
//
// The workers own the memory; the scheduler owns the decisions: which block holds which
// tokens of which request. A block is free (no user, no cached content), used (refs > 0), or
// cached-idle (refs == 0 but its content is in the tree: reusable by a later request, evicted
// LRU when free blocks run out).
//
// The tree has one root per key (the adapter id; "" for the base model), so KV built under one
// adapter is never matched by a request under another adapter or under the base model. A node
// is one full block: block_size tokens whose KV depends on every token before it, which is why
// a node's identity is (parent node, its tokens) and not its tokens alone.
//
// Invariant: a request holds a reference on every block of its matched/inserted path, so a
// node's refs are never above its parent's; a node with refs == 0 has a subtree with refs == 0,
// and evicting a subtree never takes KV from under a user.
//
// Lookups are by hash: a node by (parent, tokens), a root by its key, so finding a child or a
// root costs the same however many prompts share a parent or adapters have roots; unlinking a
// node from its siblings is constant time too (eviction).
#ifndef LS_SCHED_KV_H
#define LS_SCHED_KV_H

#include <stdint.h>

typedef struct kv kv_t;
typedef struct kv_node kv_node_t;

kv_t *kv_new(uint32_t n_blocks, uint32_t block_size);
void kv_destroy(kv_t **self_p);

uint32_t kv_block_size(const kv_t *self);
uint32_t kv_total(const kv_t *self);
// Blocks kv_alloc can still hand out: free ones plus cached-idle ones (evicted on demand).
uint32_t kv_available(const kv_t *self);
// Blocks with at least one user.
uint32_t kv_used(const kv_t *self);
// Blocks whose content is in the prefix tree (used or idle).
uint32_t kv_cached(const kv_t *self);
// References on one block (tests and invariant checks).
uint32_t kv_refs(const kv_t *self, uint32_t block);

// Take a block with refs = 1: a free one, else evict the least recently released idle cached
// block (with its idle subtree). -1 when every block is in use.
int kv_alloc(kv_t *self, uint32_t *block);
// Drop one reference; at zero the block becomes free, or idle-cached when its content is in the
// tree. Release a sequence's blocks last-to-first so its leaves are evicted before its root.
void kv_release(kv_t *self, uint32_t block);

// Longest cached prefix of tokens[0..n) under key, in whole blocks, never covering the last
// token (at least one token must be computed for the step to produce logits). Takes a
// reference on each matched block, writes their ids to blocks (capacity (n-1)/block_size) and
// the deepest matched node to *last (NULL when none). Returns the number of blocks matched.
uint32_t kv_match(kv_t *self, const char *key, const int32_t *tokens, uint32_t n, uint32_t *blocks,
                  kv_node_t **last);
// Publish a computed full block: tokens (block_size of them) whose KV is in `block`, following
// parent (NULL: the key's root). The caller holds a reference on block and on parent's block.
// Returns the new node, or NULL when that content is already cached under parent by another
// block (the caller's block then stays private, and so do the blocks after it).
kv_node_t *kv_insert(kv_t *self, const char *key, kv_node_t *parent, const int32_t *tokens, uint32_t block);
// Forget everything cached under key (an adapter was unloaded). No block under it may be in use.
void kv_drop_key(kv_t *self, const char *key);
// Forget every cached block (the workers restarted). No block may be in use.
void kv_reset(kv_t *self);

#endif
