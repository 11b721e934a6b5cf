/*  kernels/cuda/dev/dev_prefill.cu — prefill attention: the query-tiled kernels (production,
    and k_attention_prefill / k_attention_prefill_wg in other tile shapes) against the
    decode-shaped path that took prefills before them (ls_cu_attention: every query token walks its own prefix), validated
    against the CPU reference (ls_attention_forward), then timed.

    Llama-3-8B attention: H=32 query heads on KV=8 kv heads, D=128, bf16 cache in 16-token
    blocks (shuffled), a page holding one layer's block of K and of V, one layer (a prompt's 32 layers are 32 times these). Flops counted:
    QKᵀ and PV of every causal (query, key) pair, 4 x H x D per pair (what the base-path
    benchmark counts); TFLOP/s against that.

    Sections:
    - validation: two chunks on cached prefixes (300 + 200, 0 + 333) and a decode in one
      launch, and a group-8 head_dim-64 case; the prefill kernel must write exactly the rows
      of its sequences (the others stay NaN), within the bf16 bound of test_gpu_ops (NMSE <=
      2e-5); the decode-shaped path within 1e-10;
    - prompts of 512, 2K, 8K tokens alone (positions 0..P-1, keys 0..p each): µs and TFLOP/s
      per version and for the old path, and the old path's time over production's;
    - crossover: a chunk of n = 1 .. 128 queries on a 2,048-token cached prefix, µs of both
      paths, and which one the backend's ls_cu_attention_prefill_pick takes (with the
      constants of the kernel production runs here, named in the heading);
    - steps of several sequences (chunks on like prefixes, short prompts, a short chunk on a
      long context beside a longer chunk): µs with every sequence on the old path, with
      every one it may take (>= LS_CU_PREFILL_MIN_Q tokens) on the prefill kernel, and as the
      pick splits them (production; the old path's rows first, one launch each).

    Versions: production (ls_cu_attention_prefill: on sm_90 k_attention_prefill_wg<64, 2>
    for head_dim 128, 64 keys a tile, 2 CTAs an SM; k_attention_prefill 64/2/4/64 for 64),
    and k_attention_prefill's tile shapes (D, MT m-tiles of 16 rows a warp, NW warps, BN keys
    a tile):
      128/2/4/32  production on sm_80 .. sm_89 for head_dim 128 (128 query rows, 249 registers)
      128/2/4/64  64 keys a tile: 255 registers and spills (ptxas, sm_90a)
      128/1/4/64  64 query rows a CTA
      128/1/8/64  128 query rows over 8 warps of 16 (one CTA an SM)
      64/1/4/64
    and k_attention_prefill_wg with 128 keys a tile, 1 CTA an SM (207 registers):
      wgmma/128

    Usage: dev_prefill [VERSION ...]: production and the versions named (default:
    every version). Exit 1 if a version fails its check.
*/
#include "../attention.cu"

#include "dev_common.cuh"

#include <cstring>

extern "C" {
#include "ops.h"
}

// production: ls_cu_attention_prefill as the backend calls it (on sm_90: wgmma/64 for head_dim
// 128, 64/2/4/64 for 64)
static cudaError_t s_run_production(const s_pf_args_t *a) {
    return ls_cu_attention_prefill(a->out.p, (ls_cu_dtype_t)a->out.dt, a->q, a->k_cache, a->v_cache, LS_CU_BF16, a->seqs,
                                   a->n_seqs, a->max_q, a->positions, a->block_tables,
                                   a->max_blocks, a->n_heads, a->n_kv_heads, a->head_dim,
                                   a->block_size, a->row_stride, a->block_stride, a->stream);
}

// the cache in pages as the KV cache holds it (docs/memory.md), one layer: a page is a block
// of K then one of V, PAGE elements (a block of D = 64's smaller kv_dim leaves the rest unread)
enum { H = 32, KV = 8, D = 128, BS = 16, PAGES = 4352, ROW = (H + 2 * KV) * D, MAXP = 8192,
       PAGE = 2 * BS * KV * D };

typedef cudaError_t (*pf_run_t)(const s_pf_args_t *);
struct version_t {
    const char *name;
    int d; // head_dim (0: any)
    pf_run_t run;
};
static const version_t s_versions[] = {
    {"production", 0, s_run_production},                {"128/2/4/32", 128, s_run_prefill<128, 2, 4, 32>},
    {"128/2/4/64", 128, s_run_prefill<128, 2, 4, 64>}, {"128/1/4/64", 128, s_run_prefill<128, 1, 4, 64>},
    {"128/1/8/64", 128, s_run_prefill<128, 1, 8, 64>}, {"64/1/4/64", 64, s_run_prefill<64, 1, 4, 64>},
    {"wgmma/128", 128, s_run_prefill_wg<128, 1>},
};
enum { NV = sizeof s_versions / sizeof s_versions[0] };
static bool s_on[NV]; // the versions this run validates and times (0, production: always)

// a problem on the device: S sequences of nc[s] cached + nn[s] new tokens, the tokens' rows
// packed in order, pages from the pool in shuffled order; pf: every sequence the prefill
// kernel may take (>= LS_CU_PREFILL_MIN_Q tokens), pick: those the backend gives it
struct problem_t {
    int S, T, mb, max_q, n_pf, n_pick, pick_max_q, h, kv, d, row;
    std::vector<int32_t> tok, pos, table, qind, lens, pf, pick, slots;
    int32_t *d_tok, *d_pos, *d_table, *d_pf, *d_pick;
};

static problem_t s_problem(const std::vector<int> &nc, const std::vector<int> &nn, const std::vector<int32_t> &perm,
                           int h, int kv, int d) {
    problem_t p = {};
    p.S = (int)nc.size(), p.h = h, p.kv = kv, p.d = d, p.row = (h + 2 * kv) * d;
    for (int s = 0; s < p.S; s++)
        p.mb = std::max(p.mb, (nc[s] + nn[s] + BS - 1) / BS);
    p.qind.push_back(0);
    for (int s = 0; s < p.S; s++) {
        for (int j = 0; j < p.mb; j++)
            p.table.push_back(perm[(size_t)s * p.mb + j]);
        int t0 = (int)p.tok.size();
        for (int j = nc[s]; j < nc[s] + nn[s]; j++)
            p.tok.push_back(s), p.pos.push_back(j), p.slots.push_back(-1);
        p.qind.push_back((int)p.tok.size());
        p.lens.push_back(nc[s] + nn[s]);
        if (nn[s] >= LS_CU_PREFILL_MIN_Q) {
            p.pf.insert(p.pf.end(), {s, t0, nn[s]});
            p.max_q = std::max(p.max_q, nn[s]), p.n_pf++;
        }
    }
    p.T = (int)p.tok.size();
    p.pick.resize(p.pf.size());
    p.n_pick = p.n_pf ? ls_cu_attention_prefill_pick(p.qind.data(), p.lens.data(), p.S,
                                                     ls_cu_attention_prefill_which(d), p.pick.data())
                      : 0;
    p.pick.resize((size_t)p.n_pick * 3);
    for (int k = 0; k < p.n_pick; k++)
        p.pick_max_q = std::max(p.pick_max_q, p.pick[3 * k + 2]);
    if ((size_t)p.S * p.mb > perm.size()) {
        fprintf(stderr, "problem past the page pool\n");
        exit(2);
    }
    auto up = [](const std::vector<int32_t> &v) {
        int32_t *dp;
        DEV_CK(cudaMalloc(&dp, std::max<size_t>(v.size(), 1) * 4));
        DEV_CK(cudaMemcpy(dp, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
        return dp;
    };
    p.d_tok = up(p.tok), p.d_pos = up(p.pos), p.d_table = up(p.table), p.d_pf = up(p.pf), p.d_pick = up(p.pick);
    return p;
}

static void s_free(problem_t &p) {
    cudaFree(p.d_tok), cudaFree(p.d_pos), cudaFree(p.d_table), cudaFree(p.d_pf), cudaFree(p.d_pick);
}

static s_pf_args_t s_pf_args(const problem_t &p, float *out, const float *q, const void *kc, const void *vc,
                             cudaStream_t st) {
    return s_pf_args_t{{out, LS_CU_F32}, q,         kc,        vc,   p.d_pf, p.n_pf, p.max_q,  p.d_pos,
                       p.d_table, p.mb, p.h, p.kv, p.d, BS, p.row, PAGE, st};
}

static cudaError_t s_old(const problem_t &p, float *out, const float *q, const void *kc, const void *vc,
                         cudaStream_t st) {
    return ls_cu_attention(out, LS_CU_F32, q, kc, vc, LS_CU_BF16, p.d_tok, p.d_pos, p.d_table, p.mb, p.T, p.h, p.kv, p.d, BS,
                           p.row, PAGE, st);
}

// causal (query, key) pairs of the problem's prefill sequences x 4 x H x D
static double s_flops(const problem_t &p) {
    double pairs = 0;
    for (int k = 0; k < p.n_pf; k++)
        for (int t = p.pf[3 * k + 1]; t < p.pf[3 * k + 1] + p.pf[3 * k + 2]; t++)
            pairs += p.pos[t] + 1;
    return pairs * 4.0 * p.h * p.d;
}

// validates every version of head size p.d (and the old path) on p against the CPU reference
static void s_validate(const char *what, const problem_t &p, float *out, const float *q, const void *kc,
                       const void *vc, const std::vector<float> &hq, const std::vector<float> &hpages,
                       cudaStream_t st) {
    ls_attn_meta_t meta = {p.S, p.T, p.mb, 0, p.qind.data(), p.lens.data(), p.pos.data(), p.slots.data(),
                           p.table.data()};
    for (int s = 0; s < p.S; s++)
        meta.max_ctx_len = std::max(meta.max_ctx_len, p.lens[s]);
    size_t od = (size_t)p.h * p.d, no = (size_t)p.T * od;
    std::vector<float> want(no), got(no), poison(no, NAN);
    const float *hk = hpages.data(), *hv = hk + (size_t)BS * p.kv * p.d;
    ls_attention_forward(want.data(), hq.data(), hk, hv, &meta, p.h, p.kv, p.d, BS, p.row, PAGE);
    std::vector<char> in_pf(p.T, 0);
    for (int k = 0; k < p.n_pf; k++)
        for (int t = p.pf[3 * k + 1]; t < p.pf[3 * k + 1] + p.pf[3 * k + 2]; t++)
            in_pf[t] = 1;
    DEV_CK(s_old(p, out, q, kc, vc, st));
    DEV_CK(cudaMemcpy(got.data(), out, no * 4, cudaMemcpyDeviceToHost));
    dev_check(what, "old", dev_nmse(got.data(), want.data(), no), 1e-10);
    for (int v = 0; v < NV; v++) {
        if ((s_versions[v].d && s_versions[v].d != p.d) || !s_on[v])
            continue;
        DEV_CK(cudaMemcpy(out, poison.data(), no * 4, cudaMemcpyHostToDevice));
        s_pf_args_t a = s_pf_args(p, out, q, kc, vc, st);
        DEV_CK(s_versions[v].run(&a));
        DEV_CK(cudaMemcpy(got.data(), out, no * 4, cudaMemcpyDeviceToHost));
        // the prefill rows against the reference; the other rows must be untouched (NaN)
        std::vector<float> g2, w2;
        long stray = 0;
        for (int t = 0; t < p.T; t++)
            for (size_t i = 0; i < od; i++) {
                float x = got[t * od + i];
                if (in_pf[t])
                    g2.push_back(x), w2.push_back(want[t * od + i]);
                else
                    stray += !std::isnan(x);
            }
        double nmse = dev_nmse(g2.data(), w2.data(), g2.size());
        dev_check(what, s_versions[v].name, stray ? NAN : nmse, 2e-5);
        if (stray)
            printf("    %ld values written outside the prefill rows\n", stray);
    }
}

int main(int argc, char **argv) {
    cudaStream_t st;
    for (int v = 0; v < NV; v++) {
        s_on[v] = v == 0 || argc < 2;
        for (int i = 1; i < argc; i++)
            s_on[v] |= !strcmp(argv[i], s_versions[v].name);
    }
    dev_begin("dev_prefill", "H=32 KV=8 D=128, bf16 cache, 16-token pages", &st);
    dev_rng_t rng = {7};
    std::vector<float> hpages, hq;
    __nv_bfloat16 *kc = dev_bf16_fill(rng, (size_t)PAGES * PAGE, 1.0f, hpages), *vc = kc + BS * KV * D;
    float *q = dev_f32_fill(rng, (size_t)MAXP * ROW, 1.0f, hq), *out;
    DEV_CK(cudaMalloc(&out, (size_t)MAXP * H * D * 4));
    std::vector<int32_t> perm(PAGES);
    for (int i = 0; i < PAGES; i++)
        perm[i] = i;
    for (int i = PAGES - 1; i > 0; i--) // page tables are never contiguous
        std::swap(perm[i], perm[rng.next() % (i + 1)]);

    {
        problem_t p = s_problem({300, 0, 700}, {200, 333, 1}, perm, H, KV, D);
        s_validate("chunks 300+200, 0+333, dec", p, out, q, kc, vc, hq, hpages, st);
        s_free(p);
        // head_dim 64, group 8: the same pages read as blocks of (16, 2 x 64), V after K
        problem_t p64 = s_problem({100, 0, 37}, {150, 64, 16}, perm, 16, 2, 64);
        s_validate("D=64 group 8, 3 chunks", p64, out, q, kc, kc + BS * 2 * 64, hq, hpages, st);
        s_free(p64);
    }

    printf("\nprompts alone (one layer; x32 for a prompt's attention):\n");
    printf("%-7s %9s", "prompt", "old us");
    for (int v = 0; v < NV; v++)
        if ((!s_versions[v].d || s_versions[v].d == D) && s_on[v])
            printf(" %11s", s_versions[v].name);
    printf(" | %8s %8s %6s\n", "old TF/s", "prod TF/s", "old/pr");
    for (int P : {512, 2048, 8192}) {
        problem_t p = s_problem({0}, {P}, perm, H, KV, D);
        double fl = s_flops(p), uo, up = 0;
        uo = dev_time_us(st, P >= 8192 ? 1 : 5, [&](long) { return s_old(p, out, q, kc, vc, st); });
        printf("%-7d %9.1f", P, uo);
        for (int v = 0; v < NV; v++) {
            if ((s_versions[v].d && s_versions[v].d != D) || !s_on[v])
                continue;
            s_pf_args_t a = s_pf_args(p, out, q, kc, vc, st);
            double u = dev_time_us(st, 20, [&](long) { return s_versions[v].run(&a); });
            if (v == 0)
                up = u;
            printf(" %5.1f %5.0f", u, fl / u / 1e6);
        }
        printf(" | %8.1f %8.1f %6.1f\n", fl / uo / 1e6, fl / up / 1e6, uo / up);
        s_free(p);
    }
    printf("  (per version: us, TFLOP/s)\n");

    // the kernel production runs for D here, whose constants the pick uses
    ls_cu_prefill_kernel_t pk = ls_cu_attention_prefill_which(D);
    printf("\ncrossover: n queries on 2,048 cached tokens (one sequence), us; production: %s, the pick's\n"
           "key cost %d pairs:\n%-5s %9s %9s\n",
           pk == LS_CU_PREFILL_WGMMA ? "wgmma/64" : "mma.sync 128/2/4/32", (int)s_pf_key_pairs(pk), "n", "old",
           s_versions[0].name);
    for (int n : {1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 112, 128}) {
        problem_t p = s_problem({2048}, {n}, perm, H, KV, D);
        // the prefill kernel takes any n given the sequence; the backend's threshold aside
        p.pf = {0, 0, n}, p.n_pf = 1, p.max_q = n;
        DEV_CK(cudaFree(p.d_pf));
        DEV_CK(cudaMalloc(&p.d_pf, 12));
        DEV_CK(cudaMemcpy(p.d_pf, p.pf.data(), 12, cudaMemcpyHostToDevice));
        double uo = dev_time_us(st, 20, [&](long) { return s_old(p, out, q, kc, vc, st); });
        s_pf_args_t a = s_pf_args(p, out, q, kc, vc, st);
        double un = dev_time_us(st, 20, [&](long) { return s_versions[0].run(&a); });
        printf("%-5d %9.1f %9.1f%s\n", n, uo, un, p.n_pick ? "  (picked: prefill kernel in production)" : "");
        s_free(p);
    }

    // production: the old path on the rows before the first picked sequence (the cases put
    // the ones the pick leaves first), the prefill kernel on the picked ones
    printf("\nsteps of several sequences, us (old: all on the old path; prefill: all it may take on\n"
           "the prefill kernel; production: as the pick splits them):\n%-28s %9s %9s %10s  %s\n", "step", "old",
           "prefill", "production", "picked");
    struct step_t {
        const char *name;
        std::vector<int> nc, nn;
    };
    const step_t steps[] = {
        {"2 x 32 on 2048", std::vector<int>(2, 2048), std::vector<int>(2, 32)},
        {"4 x 32 on 2048", std::vector<int>(4, 2048), std::vector<int>(4, 32)},
        {"8 x 16 on 2048", std::vector<int>(8, 2048), std::vector<int>(8, 16)},
        {"8 x 32 on 2048", std::vector<int>(8, 2048), std::vector<int>(8, 32)},
        {"8 x 64 on 2048", std::vector<int>(8, 2048), std::vector<int>(8, 64)},
        {"32 x 64 on 2048", std::vector<int>(32, 2048), std::vector<int>(32, 64)},
        {"prompt of 150", {0}, {150}},
        {"prompt of 256", {0}, {256}},
        {"16 prompts of 100", std::vector<int>(16, 0), std::vector<int>(16, 100)},
        {"16 on 8192, 200 on 4096", {8192, 4096}, {16, 200}},
    };
    for (const step_t &c : steps) {
        problem_t p = s_problem(c.nc, c.nn, perm, H, KV, D);
        int t_old = p.n_pick ? p.pick[1] : p.T; // the old path's rows: 0 .. t_old - 1
        for (int k = 0; k < p.n_pick; k++)
            if (p.pick[3 * k + 1] != (k ? p.pick[3 * k - 2] + p.pick[3 * k - 1] : t_old) ||
                (k == p.n_pick - 1 && p.pick[3 * k + 1] + p.pick[3 * k + 2] != p.T)) {
                fprintf(stderr, "%s: the picked sequences are not the last rows\n", c.name);
                exit(2);
            }
        s_pf_args_t all = s_pf_args(p, out, q, kc, vc, st), pick = all;
        pick.seqs = p.d_pick, pick.n_seqs = p.n_pick, pick.max_q = p.pick_max_q;
        double uo = dev_time_us(st, 10, [&](long) { return s_old(p, out, q, kc, vc, st); });
        double ua = dev_time_us(st, 10, [&](long) { return s_versions[0].run(&all); });
        double up = dev_time_us(st, 10, [&](long) {
            cudaError_t e = t_old ? ls_cu_attention(out, LS_CU_F32, q, kc, vc, LS_CU_BF16, p.d_tok, p.d_pos, p.d_table, p.mb,
                                                    t_old, p.h, p.kv, p.d, BS, p.row, PAGE, st)
                                  : cudaSuccess;
            return e != cudaSuccess || !p.n_pick ? e : s_versions[0].run(&pick);
        });
        printf("%-28s %9.1f %9.1f %10.1f  %d of %d\n", c.name, uo, ua, up, p.n_pick, p.S);
        s_free(p);
    }
    cudaFree(kc), cudaFree(q), cudaFree(out);
    return dev_end();
}
