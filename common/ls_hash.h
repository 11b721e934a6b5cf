// ls_hash — FNV-1a over bytes, for keys that need no more than a good spread (prefix
// affinity, derived ids): the same value on every run and machine, so replay decides alike;
// and splitmix64's finalizer, to spread a hash or a counter over all 64 bits.
#ifndef LS_HASH_H
#define LS_HASH_H

#include <stddef.h>
#include <stdint.h>

#define LS_HASH_FNV_BASIS 0xcbf29ce484222325ull

// h extended by the n bytes at p (start from LS_HASH_FNV_BASIS)
static inline uint64_t ls_hash_fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

// splitmix64's finalizer: a bijection of the 64-bit values with full avalanche
static inline uint64_t ls_hash_mix64(uint64_t h) {
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

#endif
