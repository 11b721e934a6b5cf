/*  kernels/cuda/dev/dev_lora.cuh — the LoRA problems of the dev bench (dev_shrink.cu,
    dev_expand.cu, dev_fused.cu): Llama-3-8B's four stacked groups at decode, bf16 pools, and
    the CPU reference's view of the same values. Include after ../lora.cu.

    A problem is T requests of one token over the group's shape:
      distinct  every request its own adapter of rank 16 (slots of rank 16): one-position tiles
                (LS_CU_LORA_ONE), as a decode step over many tenants;
      shared    8 requests per adapter of rank 16: full tiles of LS_CU_LORA_TILE positions;
      zipf      requests drawn from a Zipf(1) popularity over 64 adapters of ranks 8, 16, 32,
                64 (by index) in slots of rank 64: tiles of 1 to 8 positions and mixed ranks,
                as the decode tokens of a serving step beside a prompt chunk;
      eight     8 adapters of rank 16, T / 8 requests each: bench_base_cuda's 8-adapter step
                (not in dev_lora_each's loop; dev_silu_lora.cu).
    T is DEV_T unless dev_lora_init is given another.
    The pools hold DEV_SETS sets of adapters (slot 0 is the base model, rank 0); launch i
    uses set i % DEV_SETS, so that the weights of consecutive launches come from memory.
    The production kernels and the CPU reference read them through page tables
    (ls_lora_pages_t, docs/memory.md): A's rows where they lie in the pool, B in chunks of 8
    rank columns (a chunk-major copy); the versions kept here read the pools themselves.
*/
#ifndef LS_DEV_LORA_CUH
#define LS_DEV_LORA_CUH

#include <cstring>

#include "dev_common.cuh"

extern "C" {
#include "ops.h"
}

enum { DEV_SETS = 6, DEV_T = 64, DEV_R = 16 };
typedef enum { DEV_DISTINCT, DEV_SHARED, DEV_ZIPF, DEV_EIGHT } dev_mix_t;
static const char *dev_mix_names[4] = {"distinct", "shared", "zipf", "eight"};

struct dev_group_t {
    const char *name;
    int in, n_slices, outs[3];
};
static const dev_group_t dev_groups[4] = {{"qkv", 4096, 3, {4096, 1024, 1024}},
                                          {"o", 4096, 1, {4096, 0, 0}},
                                          {"gate_up", 4096, 2, {14336, 14336, 0}},
                                          {"down", 14336, 1, {4096, 0, 0}}};

struct dev_lora_t {
    dev_group_t g;
    dev_mix_t mix;
    bool distinct; // one-position tiles
    int T, r, r_max, n_ad, n_slots, out_total, n_tiles; // r: the largest rank
    std::vector<int> ad_rank, ad_tokens; // per adapter of a set
    int32_t offs[4];
    // device
    __nv_bfloat16 *a, *b;              // pools, n_slots slots
    __nv_bfloat16 *bc;                 // b in chunks: (n_slots, r_max/8, out_total, 8)
    const void **ta, **tb;             // page tables of a's rows, bc's chunks
    ls_lora_pages_t pa, pb;            // as the production launchers take them
    float *x, *tmp, *y;                // tmp: LS_CU_LORA_PARTS arrays of part_stride floats
    size_t part_stride;
    ls_cu_lora_tile_t *tiles[DEV_SETS];
    // host: set 0's adapters (slots 0..n_ad) in fp32, the inputs, and the batch over them
    std::vector<float> ha, hb, hx, hy0;
    std::vector<float> hbc;                // hb in chunks
    std::vector<const void *> hta, htb;    // their page tables, for the CPU reference
    ls_lora_pages_t hpa, hpb;
    std::vector<int32_t> seg_indptr, weight_indices, ranks;
    std::vector<float> scalings;
    ls_lora_batch_t batch;
    unsigned flags; // LS_CU_LORA_ONE for distinct
};

static size_t dev_a_slot(const dev_lora_t &p) { return (size_t)p.g.n_slices * p.r_max * p.g.in; }
static size_t dev_b_slot(const dev_lora_t &p) { return (size_t)p.out_total * p.r_max; }

static void dev_lora_init(dev_lora_t &p, const dev_group_t &g, dev_mix_t mix, uint64_t seed, int T = DEV_T) {
    dev_rng_t rng = {seed};
    p.g = g, p.mix = mix, p.distinct = mix == DEV_DISTINCT, p.T = T;
    // the adapters of a set: their ranks and how many of the T requests each has
    if (mix == DEV_ZIPF) {
        std::vector<int> count(64, 0);
        double h = 0;
        for (int i = 1; i <= 64; i++)
            h += 1.0 / i;
        for (int t = 0; t < p.T; t++) {
            double u = (double)(rng.next() >> 11) / 9007199254740992.0 * h, c = 0;
            int i = 0;
            while (i < 63 && (c += 1.0 / (i + 1)) < u)
                i++;
            count[i]++;
        }
        for (int i = 0; i < 64; i++)
            if (count[i])
                p.ad_tokens.push_back(count[i]), p.ad_rank.push_back(8 << (i % 4));
        p.r_max = 64;
    } else {
        int n = mix == DEV_DISTINCT ? p.T : mix == DEV_EIGHT ? 8 : p.T / LS_CU_LORA_TILE;
        p.ad_tokens.assign(n, p.T / n), p.ad_rank.assign(n, DEV_R);
        p.r_max = DEV_R;
    }
    p.n_ad = (int)p.ad_rank.size();
    p.r = *std::max_element(p.ad_rank.begin(), p.ad_rank.end());
    p.n_slots = 1 + DEV_SETS * p.n_ad;
    p.offs[0] = 0;
    for (int k = 0; k < g.n_slices; k++)
        p.offs[k + 1] = p.offs[k] + g.outs[k];
    p.out_total = p.offs[g.n_slices];
    p.flags = p.distinct ? LS_CU_LORA_ONE : 0;
    // set 0 on the host (slot 0 zero), copied to every set's slots on the device
    size_t as = dev_a_slot(p), bs = dev_b_slot(p), na = (size_t)(1 + p.n_ad) * as, nb = (size_t)(1 + p.n_ad) * bs;
    std::vector<float> ha1, hb1;
    __nv_bfloat16 *a1 = dev_bf16_fill(rng, na, 0.05f, ha1), *b1 = dev_bf16_fill(rng, nb, 0.05f, hb1);
    std::fill(ha1.begin(), ha1.begin() + as, 0.0f);
    std::fill(hb1.begin(), hb1.begin() + bs, 0.0f);
    p.ha = ha1, p.hb = hb1;
    DEV_CK(cudaMalloc(&p.a, (size_t)p.n_slots * as * 2));
    DEV_CK(cudaMalloc(&p.b, (size_t)p.n_slots * bs * 2));
    DEV_CK(cudaMemset(p.a, 0, as * 2));
    DEV_CK(cudaMemset(p.b, 0, bs * 2));
    for (int s = 0; s < DEV_SETS; s++) {
        DEV_CK(cudaMemcpy(p.a + (1 + (size_t)s * p.n_ad) * as, a1 + as, (size_t)p.n_ad * as * 2,
                          cudaMemcpyDeviceToDevice));
        DEV_CK(cudaMemcpy(p.b + (1 + (size_t)s * p.n_ad) * bs, b1 + bs, (size_t)p.n_ad * bs * 2,
                          cudaMemcpyDeviceToDevice));
    }
    cudaFree(a1), cudaFree(b1);
    // B in chunks (set 0 on the host, every set's on the device) and the page tables
    int nc = (p.r_max + 7) / 8, ld = g.n_slices * p.r_max;
    size_t cs = (size_t)nc * p.out_total * 8;  // a slot's chunks
    p.hbc.assign((size_t)(1 + p.n_ad) * cs, 0.0f);
    for (int w = 0; w <= p.n_ad; w++)
        for (int o = 0; o < p.out_total; o++)
            for (int j = 0; j < p.r_max; j++)
                p.hbc[w * cs + ((size_t)(j / 8) * p.out_total + o) * 8 + j % 8] = p.hb[w * bs + (size_t)o * p.r_max + j];
    std::vector<__nv_bfloat16> hbc16(p.hbc.size());
    for (size_t e = 0; e < hbc16.size(); e++)
        hbc16[e] = __float2bfloat16(p.hbc[e]);
    DEV_CK(cudaMalloc(&p.bc, (size_t)p.n_slots * cs * 2));
    DEV_CK(cudaMemset(p.bc, 0, cs * 2));
    for (int s = 0; s < DEV_SETS; s++)
        DEV_CK(cudaMemcpy(p.bc + (1 + (size_t)s * p.n_ad) * cs, hbc16.data() + cs, (size_t)p.n_ad * cs * 2,
                          cudaMemcpyHostToDevice));
    std::vector<const void *> ta, tb;
    for (int w = 0; w < p.n_slots; w++) {
        for (int i = 0; i < ld; i++)
            ta.push_back(p.a + ((size_t)w * ld + i) * g.in);
        for (int c = 0; c < nc; c++)
            tb.push_back(p.bc + (size_t)w * cs + (size_t)c * p.out_total * 8);
    }
    for (int w = 0; w <= p.n_ad; w++) {
        for (int i = 0; i < ld; i++)
            p.hta.push_back(p.ha.data() + ((size_t)w * ld + i) * g.in);
        for (int c = 0; c < nc; c++)
            p.htb.push_back(p.hbc.data() + (size_t)w * cs + (size_t)c * p.out_total * 8);
    }
    DEV_CK(cudaMalloc(&p.ta, ta.size() * sizeof(void *)));
    DEV_CK(cudaMalloc(&p.tb, tb.size() * sizeof(void *)));
    DEV_CK(cudaMemcpy(p.ta, ta.data(), ta.size() * sizeof(void *), cudaMemcpyHostToDevice));
    DEV_CK(cudaMemcpy(p.tb, tb.data(), tb.size() * sizeof(void *), cudaMemcpyHostToDevice));
    p.pa = {p.ta, (size_t)ld, 1, g.in}, p.pb = {p.tb, (size_t)nc, 1, p.out_total};
    p.hpa = {p.hta.data(), (size_t)ld, 1, g.in}, p.hpb = {p.htb.data(), (size_t)nc, 1, p.out_total};
    p.x = dev_f32_fill(rng, (size_t)p.T * g.in, 1.0f, p.hx);
    p.y = dev_f32_fill(rng, (size_t)p.T * p.out_total, 1.0f, p.hy0);
    p.part_stride = (size_t)p.T * g.n_slices * p.r_max;
    DEV_CK(cudaMalloc(&p.tmp, LS_CU_LORA_PARTS * p.part_stride * 4));
    std::vector<float> sc(p.n_slots, 0.5f);
    sc[0] = 0.0f;
    // tiles: adapter i of set s is slot 1 + s*n_ad + i, its requests consecutive rows
    p.seg_indptr.assign(p.n_ad + 1, 0);
    for (int i = 0; i < p.n_ad; i++)
        p.seg_indptr[i + 1] = p.seg_indptr[i] + p.ad_tokens[i];
    for (int s = 0; s < DEV_SETS; s++) {
        std::vector<ls_cu_lora_tile_t> t;
        for (int i = 0; i < p.n_ad; i++)
            for (int p0 = p.seg_indptr[i]; p0 < p.seg_indptr[i + 1]; p0 += LS_CU_LORA_TILE)
                t.push_back({p0, std::min(LS_CU_LORA_TILE, p.seg_indptr[i + 1] - p0), 1 + s * p.n_ad + i,
                             p.ad_rank[i], sc[1 + s * p.n_ad + i]});
        p.n_tiles = (int)t.size();
        DEV_CK(cudaMalloc(&p.tiles[s], t.size() * sizeof t[0]));
        DEV_CK(cudaMemcpy(p.tiles[s], t.data(), t.size() * sizeof t[0], cudaMemcpyHostToDevice));
    }
    // the CPU reference's batch: set 0, one segment per adapter
    p.weight_indices.assign(p.n_ad, 0);
    p.ranks.assign(1 + p.n_ad, 0);
    for (int i = 0; i < p.n_ad; i++)
        p.weight_indices[i] = 1 + i, p.ranks[1 + i] = p.ad_rank[i];
    p.scalings.assign(sc.begin(), sc.begin() + 1 + p.n_ad);
    p.batch = {p.n_ad, 1 + p.n_ad, p.seg_indptr.data(), p.weight_indices.data(), NULL, p.ranks.data(),
               p.scalings.data()};
}

static void dev_lora_free(dev_lora_t &p) {
    cudaFree(p.a), cudaFree(p.b), cudaFree(p.bc), cudaFree(p.ta), cudaFree(p.tb), cudaFree(p.x), cudaFree(p.tmp),
        cudaFree(p.y);
    for (int s = 0; s < DEV_SETS; s++)
        cudaFree(p.tiles[s]);
}

// The CPU reference's tmp (T, n_slices*r_max; columns past the rank 0) and y (y0 + delta)
static void dev_lora_reference(const dev_lora_t &p, std::vector<float> &tmp, std::vector<float> &y) {
    tmp.assign(p.part_stride, 0.0f);
    y = p.hy0;
    ls_lora_shrink(tmp.data(), p.hx.data(), p.hpa, &p.batch, p.g.in, p.g.n_slices, p.r_max);
    ls_lora_expand(y.data(), tmp.data(), p.hpb, &p.batch, p.offs, p.g.n_slices, p.r_max);
}

// Bytes the shrink must move: the used A rows, x, tmp written; the expand: the used B
// columns, tmp read, y read and written
static double dev_rank_tokens(const dev_lora_t &p, bool per_token) {
    double n = 0;
    for (int i = 0; i < p.n_ad; i++)
        n += (double)p.ad_rank[i] * (per_token ? p.ad_tokens[i] : 1);
    return n;
}
static double dev_tmp_bytes(const dev_lora_t &p) { return dev_rank_tokens(p, true) * p.g.n_slices * 4; }
static double dev_shrink_bytes(const dev_lora_t &p) {
    return dev_rank_tokens(p, false) * p.g.n_slices * p.g.in * 2 + (double)p.T * p.g.in * 4 + dev_tmp_bytes(p);
}
static double dev_expand_bytes(const dev_lora_t &p) {
    return dev_rank_tokens(p, false) * p.out_total * 2 + dev_tmp_bytes(p) + (double)p.T * p.out_total * 8;
}

// Runs fn(problem, its name) over the groups (the one argv names, or all) and both mixes,
// pools seeded by seed + the group's index
template <typename F> static void dev_lora_each(int argc, char **argv, uint64_t seed, F fn) {
    for (int gi = 0; gi < 4; gi++) {
        if (argc > 1 && strcmp(argv[1], dev_groups[gi].name))
            continue;
        for (int mix = DEV_DISTINCT; mix <= DEV_ZIPF; mix++) {
            dev_lora_t p;
            dev_lora_init(p, dev_groups[gi], (dev_mix_t)mix, seed + gi);
            char name[64];
            snprintf(name, sizeof name, "%s %s", p.g.name, dev_mix_names[mix]);
            printf("%s (%d adapters, %d tiles):\n", name, p.n_ad, p.n_tiles);
            fn(p, name);
            dev_lora_free(p);
        }
    }
}

// NMSE of the delta a launch (run(), on y = y0) adds to y against the reference's (y0 would
// hide a wrong delta)
template <typename F> static double dev_lora_delta_nmse(const dev_lora_t &p, const std::vector<float> &want_y, F run) {
    size_t n = p.hy0.size();
    std::vector<float> got(n), got_d(n), want_d(n);
    DEV_CK(cudaMemcpy(p.y, p.hy0.data(), n * 4, cudaMemcpyHostToDevice));
    DEV_CK(run());
    DEV_CK(cudaMemcpy(got.data(), p.y, n * 4, cudaMemcpyDeviceToHost));
    for (size_t e = 0; e < n; e++)
        got_d[e] = got[e] - p.hy0[e], want_d[e] = want_y[e] - p.hy0[e];
    return dev_nmse(got_d.data(), want_d.data(), n);
}

// One version's line of the timing table
static void dev_lora_row(const char *version, double us, double bytes, double bw, const char *note) {
    printf("    %-10s %8.1f us %7.0f GB/s %5.1f%% copy%s\n", version, us, bytes / us / 1e3, 100.0 * bytes / us / 1e3 / bw,
           note);
}

#endif
