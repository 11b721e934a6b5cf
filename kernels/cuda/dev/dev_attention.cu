/*  kernels/cuda/dev/dev_attention.cu — decode attention's three kernels side by side on the
    same shapes: validated against the CPU reference (ls_attention_forward), then timed.

    Llama-3-8B attention at decode: H=32 query heads on KV=8 kv heads, D=128, bf16 cache in
    16-token pages; S sequences of ctx cached tokens each, one query per sequence at position
    ctx-1. Bytes counted: the K/V rows, S x ctx x KV x D x 2 (K, V) x 2 B, each read once (q and
    out are < 1% of that). The pages come from a pool of 4096 (K and V: 268 MB) filled with
    random bf16 in [-1, 1]; each shape rotates over as many disjoint, shuffled page sets as
    the pool holds (up to 8), so that even the 33.5 MB of 64 x 128 is read from memory rather
    than from L2. Plain launches back to back (dev_common.cuh's method), and for tc also one
    CUDA graph of 100 launches (what a decode step replays).

    Versions (ls_cu_attention picks one by the cache and the shape; attention.cu says how):
      v1  k_attention_v1: one CTA per (token, kv head), a dependent load per key (production:
          rows or caches not 16-byte aligned);
      v2  k_attention_v2: FFMA, L lanes per key, cp.async ring (production: f32/f16 caches,
          other head sizes);
      tc  k_attention_tc: tensor cores, q and p split into three bf16 pieces (production: bf16
          caches with head_dim 64 or 128).

    Then tc's plans at small batches (1 and 8 sequences of 128, 256 and 1,024 cached
    tokens), at short contexts among many (32 and 64 of 128, 64 of 256) and at long ones
    (64 and 128 of 4,096, 1 of 4,096, 1, 2 and 4 of 16,384, where the KV cache is most of the step): every
    (warps a CTA in 1, 2, 3, 4, 6, 8, 12; CTAs a cluster in 1, 2, 4, 8, 16), each in a graph
    of 100 launches beside the plan s_launch picks, and checked against that plan's output.

    Each version is also checked with every sequence's newest key written by the kernel before
    it after a spin (k_late_rows), as the step's KV store does: the keys before it are read
    before the kernel's wait on that kernel, the newest only after it.

    Usage: dev_attention. Exit 1 if a version fails its check.
*/
#include "../attention.cu"

#include "dev_common.cuh"

#include <cstring>

extern "C" {
#include "ops.h"
}

enum { H = 32, KV = 8, D = 128, BS = 16, PAGES = 32768, NSEQ = 128, ROW = (H + 2 * KV) * D };
static const char *s_names[3] = {"v1", "v2", "tc"};

// The kernel before attention, writing the step's newest keys: lets its dependents start,
// spins for `spin` clocks, then copies n rows of `len` elements from rows (K rows, then V
// rows) into both caches at off[i]
__global__ void k_late_rows(__nv_bfloat16 *kc, __nv_bfloat16 *vc, const __nv_bfloat16 *rows,
                            const long *off, int n, int len, long long spin) {
    ls_dep_launch();
    for (long long t0 = clock64(); clock64() - t0 < spin;)
        ;
    for (int i = 0; i < n; i++)
        for (int e = threadIdx.x; e < len; e += blockDim.x) {
            kc[off[i] + e] = rows[(size_t)i * len + e];
            vc[off[i] + e] = rows[(size_t)(n + i) * len + e];
        }
}

static cudaError_t s_run(int v, const s_args_t *a) {
    if (v == 0)
        return s_launch_v1<__nv_bfloat16, 4>(a->out, a->q, a->k_cache, a->v_cache, a->tok_seq, a->positions,
                                            a->block_tables, a->max_blocks, a->T, a->n_heads, a->n_kv_heads,
                                            a->head_dim, a->block_size, a->block_stride, a->row_stride,
                                            a->stream);
    if (v == 1)
        return s_run_v2<__nv_bfloat16, 8, 2, 4>(a); // 16 chunks of 16 bytes a row: L = 8, NC = 2
    return s_run_tc<D>(a);
}

// µs a launch of tc in a graph of 100 launches over args(0 .. 99), with plan ({cs, W}; NULL:
// the planned one); -1 where the plan does not launch (clusters that cannot all be resident)
template <typename F> static double s_graph_us(cudaStream_t st, F args, const int *plan) {
    double us = dev_graph_us(st, [&] {
        cudaError_t e = cudaSuccess;
        for (int it = 0; it < 100 && e == cudaSuccess; it++) {
            s_args_t a = args(it);
            e = s_run_tc<D>(&a, plan);
        }
        return e;
    });
    return us < 0 ? -1 : us / 100;
}

int main() {
    cudaStream_t st;
    double bw = dev_begin("dev_attention", "H=32 KV=8 D=128, bf16 cache, 16-token pages", &st);
    dev_rng_t rng = {42};
    size_t nel = (size_t)PAGES * BS * KV * D; // elements of each cache
    std::vector<float> hk, hv, hq;
    __nv_bfloat16 *kc = dev_bf16_fill(rng, nel, 1.0f, hk), *vc = dev_bf16_fill(rng, nel, 1.0f, hv);
    float *q = dev_f32_fill(rng, (size_t)NSEQ * ROW, 1.0f, hq), *out;
    int32_t *tok, *pos, *tab;
    DEV_CK(cudaMalloc(&out, (size_t)NSEQ * H * D * 4));
    DEV_CK(cudaMalloc(&tok, NSEQ * 4));
    DEV_CK(cudaMalloc(&pos, NSEQ * 4));
    DEV_CK(cudaMalloc(&tab, PAGES * 4));
    std::vector<int32_t> perm(PAGES), hs(NSEQ), hp(NSEQ);
    for (int i = 0; i < PAGES; i++)
        perm[i] = i;
    for (int i = PAGES - 1; i > 0; i--) // page tables are never contiguous
        std::swap(perm[i], perm[rng.next() % (i + 1)]);
    DEV_CK(cudaMemcpy(tab, perm.data(), PAGES * 4, cudaMemcpyHostToDevice));

    // validation: 8 sequences of 37 .. 1,500 cached tokens, one query each, against the CPU
    // reference on the same (bf16) values; fp32-exact products, so only the order differs
    {
        enum { S = 8 };
        int ctx[S] = {37, 128, 129, 300, 640, 1000, 1024, 1500}, mb = 0;
        for (int s = 0; s < S; s++)
            mb = std::max(mb, (ctx[s] + BS - 1) / BS);
        std::vector<int32_t> table((size_t)S * mb), qind(S + 1), lens(S), slots(S, -1);
        for (int s = 0; s < S; s++) {
            hs[s] = s, hp[s] = ctx[s] - 1, qind[s + 1] = s + 1, lens[s] = ctx[s];
            for (int j = 0; j < mb; j++)
                table[(size_t)s * mb + j] = perm[s * mb + j];
        }
        int32_t *dtab;
        DEV_CK(cudaMalloc(&dtab, table.size() * 4));
        DEV_CK(cudaMemcpy(dtab, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
        DEV_CK(cudaMemcpy(tok, hs.data(), S * 4, cudaMemcpyHostToDevice));
        DEV_CK(cudaMemcpy(pos, hp.data(), S * 4, cudaMemcpyHostToDevice));
        ls_attn_meta_t meta = {S, S, mb, ctx[S - 1], qind.data(), lens.data(), hp.data(), slots.data(), table.data()};
        std::vector<float> want((size_t)S * H * D), got(want.size());
        ls_attention_forward(want.data(), hq.data(), hk.data(), hv.data(), &meta, H, KV, D, BS, ROW,
                             (size_t)BS * KV * D);
        s_args_t a = {{out, LS_CU_F32}, q, kc, vc, tok, pos, dtab, mb, S, H, KV, D, BS, (size_t)BS * KV * D, ROW, st};
        for (int v = 0; v < 3; v++) {
            DEV_CK(s_run(v, &a));
            DEV_CK(cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost));
            dev_check("decode, 8 contexts", s_names[v], dev_nmse(got.data(), want.data(), got.size()), 1e-10);
        }
        // the same with each sequence's newest key written by the kernel before, late: its
        // rows hold garbage until k_late_rows, which frees its dependents at once and spins
        // first, copies them in (as RoPE's KV store does in a step); the kernels read the
        // keys before it early, that key only after their wait
        std::vector<long> hoff(S);
        for (int s = 0; s < S; s++) {
            int j = ctx[s] - 1;
            hoff[s] = ((long)table[(size_t)s * mb + j / BS] * BS + j % BS) * KV * D;
        }
        long *doff;
        __nv_bfloat16 *rows;
        DEV_CK(cudaMalloc(&doff, S * sizeof(long)));
        DEV_CK(cudaMalloc(&rows, (size_t)2 * S * KV * D * 2));
        DEV_CK(cudaMemcpy(doff, hoff.data(), S * sizeof(long), cudaMemcpyHostToDevice));
        for (int s = 0; s < S; s++) {
            DEV_CK(cudaMemcpy(rows + (size_t)s * KV * D, kc + hoff[s], KV * D * 2, cudaMemcpyDeviceToDevice));
            DEV_CK(cudaMemcpy(rows + (size_t)(S + s) * KV * D, vc + hoff[s], KV * D * 2, cudaMemcpyDeviceToDevice));
        }
        for (int v = 0; v < 3; v++) {
            for (int s = 0; s < S; s++) { // bf16 0x4747: ~5e4
                DEV_CK(cudaMemset(kc + hoff[s], 0x47, KV * D * 2));
                DEV_CK(cudaMemset(vc + hoff[s], 0x47, KV * D * 2));
            }
            k_late_rows<<<1, 256, 0, st>>>(kc, vc, rows, doff, S, KV * D, 200000);
            DEV_CK(s_run(v, &a));
            DEV_CK(cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost));
            dev_check("newest keys written late", s_names[v], dev_nmse(got.data(), want.data(), got.size()), 1e-10);
        }
        cudaFree(rows);
        cudaFree(doff);
        cudaFree(dtab);
    }

    // S sequences of ctx cached tokens, one query each at position ctx-1; the launch
    // arguments of the j-th call: set j's table is (S, pages) at tab + j*need, disjoint pages
    // in no order, as many sets as the pool holds (up to 8)
    auto shape = [&](int S, int ctx) {
        int pp = ctx / BS, need = S * pp, sets = PAGES / need > 8 ? 8 : PAGES / need;
        for (int s = 0; s < S; s++)
            hs[s] = s, hp[s] = ctx - 1;
        DEV_CK(cudaMemcpy(tok, hs.data(), S * 4, cudaMemcpyHostToDevice));
        DEV_CK(cudaMemcpy(pos, hp.data(), S * 4, cudaMemcpyHostToDevice));
        return [=](long j) {
            return s_args_t{{out, LS_CU_F32}, q, kc, vc, tok, pos, tab + (size_t)(j % sets) * need, pp, S, H, KV, D, BS,
                            (size_t)BS * KV * D, ROW, st};
        };
    };
    static const int shapes[4][2] = {{64, 128}, {64, 1024}, {4, 8192}, {1, 32768}};
    printf("%-12s %8s %6s | %7s %6s | %7s %6s %6s %5s | %8s %6s %6s\n", "S x ctx", "v1 us", "GB/s", "v2 us",
           "GB/s", "tc us", "GB/s", "%copy", "W,cs", "graph us", "GB/s", "%copy");
    for (int k = 0; k < 4; k++) {
        int S = shapes[k][0], ctx = shapes[k][1];
        double bytes = (double)S * ctx * KV * D * 2 * 2, us[3];
        auto args = shape(S, ctx);
        for (int v = 0; v < 3; v++)
            us[v] = dev_time_us(st, v == 0 && ctx >= 8192 ? 3 : 50, [&](long j) {
                s_args_t a = args(j);
                return s_run(v, &a);
            });
        int w = s_last_w, cs = s_last_cs;
        double gus = s_graph_us(st, args, NULL);
        if (gus < 0) {
            fprintf(stderr, "dev_attention: tc in a graph failed at %d x %d\n", S, ctx);
            return 2;
        }
        char sh[32], wc[16];
        snprintf(sh, sizeof sh, "%d x %d", S, ctx);
        snprintf(wc, sizeof wc, "%d,%d", w, cs);
        printf("%-12s %8.1f %6.0f | %7.1f %6.0f | %7.1f %6.0f %5.1f%% %5s | %8.1f %6.0f %5.1f%%\n", sh, us[0],
               bytes / us[0] / 1e3, us[1], bytes / us[1] / 1e3, us[2], bytes / us[2] / 1e3,
               100.0 * bytes / us[2] / 1e3 / bw, wc, gus, bytes / gus / 1e3, 100.0 * bytes / gus / 1e3 / bw);
    }
    // tc's plans at the decode shapes of small batches: each (W, cs) in a graph of 100
    // launches against the planned one, whose output it must match (only the merge order
    // differs); "-" where the plan does not launch (clusters that cannot all be resident)
    static const int small[][2] = {{1, 128},   {8, 128},   {1, 256},    {8, 256},
                                   {1, 1024},  {8, 1024},  {32, 128},   {64, 128},
                                   {64, 256},  {64, 4096}, {128, 4096}, {1, 4096},
                                   {1, 16384}, {2, 16384}, {4, 16384}};
    static const int cands[] = {1, 2, 4, 6, 8, 12, 14, 16}, wcands[] = {1, 2, 3, 4, 6, 8, 12};
    // the planner stays within the portable 8; the sweep goes past it
    DEV_CK(cudaFuncSetAttribute((const void *)k_attention_tc<D>,
                                cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    std::vector<float> ref((size_t)NSEQ * H * D), alt(ref.size());
    printf("\ntc plans, graph us (planned first; rows W = warps a CTA, columns cs = CTAs a cluster)\n");
    for (const auto &sh : small) {
        int S = sh[0], ctx = sh[1];
        auto args = shape(S, ctx);
        s_args_t a0 = args(0);
        DEV_CK(s_run_tc<D>(&a0));
        DEV_CK(cudaMemcpy(ref.data(), out, (size_t)S * H * D * 4, cudaMemcpyDeviceToHost));
        int pw = s_last_w, pcs = s_last_cs;
        printf("%d x %d: planned W=%d cs=%d %.1f us\n%6s", S, ctx, pw, pcs, s_graph_us(st, args, NULL), "W\\cs");
        for (int c : cands)
            printf(" %7d", c);
        printf("\n");
        for (int w : wcands) {
            printf("%6d", w);
            for (int c : cands) {
                int plan[2] = {c, w};
                double us = s_graph_us(st, args, plan);
                if (us < 0) {
                    printf(" %7s", "-");
                    continue;
                }
                s_args_t a = args(0);
                DEV_CK(s_run_tc<D>(&a, plan));
                DEV_CK(cudaMemcpy(alt.data(), out, (size_t)S * H * D * 4, cudaMemcpyDeviceToHost));
                char name[64];
                snprintf(name, sizeof name, "%d x %d W=%d cs=%d", S, ctx, w, c);
                // two plans add the keys' fp32 terms in other orders, and a warp's running
                // sum over more keys rounds more: 1e-10 up to 2,048 keys a warp, in
                // proportion past that (one warp over 16,384: 5.7e-10 against the planned)
                double nmse = dev_nmse(alt.data(), ref.data(), (size_t)S * H * D);
                double keys = (double)ctx / (w * c), tol = 1e-10 * std::max(1.0, keys / 2048);
                if (nmse > tol) // only failures print: the table is the output
                    dev_check(name, "tc plan", nmse, tol);
                printf(" %7.1f", us);
            }
            printf("\n");
        }
    }
    cudaFree(kc), cudaFree(vc), cudaFree(q), cudaFree(out), cudaFree(tok), cudaFree(pos), cudaFree(tab);
    return dev_end();
}
