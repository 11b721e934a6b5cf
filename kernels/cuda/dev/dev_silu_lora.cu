/*  kernels/cuda/dev/dev_silu_lora.cu — gate_up's LoRA and SiLU·mul (lp = silu(g) · u of
    gate_up + its LoRA) as production runs it past 128 tokens against the delta path it
    replaces and the form it replaced, validated against the CPU reference (ls_lora_shrink,
    ls_lora_expand, ls_silu_mul_forward), then timed (dev_common.cuh's method) on
    Llama-3-8B's gate_up with 8 adapters of rank 16 (dev_lora.cuh's "eight" mix) at 128 and
    256 tokens.

    Versions (each the whole op: shrink, then the rest):
      delta   the path at 128 tokens and fewer: ls_cu_lora_apply writing the delta (T x
              2·inter fp32), then ls_cu_silu_mul adding it
      fused   production past 128 tokens: ls_cu_lora_silu_shrink, then ls_cu_lora_silu_mul
              (the deltas through shared memory, a float4 of gate and up at a time)
      frag    the first form of ls_cu_lora_silu_mul, lost: each lane's mma fragment written
              straight out (four scattered values with their own addresses and checks), a
              grid of two waves. In a decode step it lost at batch 64-256 (README.md,
              "gate_up's LoRA in SiLU·mul").
    fused and frag must give delta's bits (they compute the same sums in the same order),
    which is checked too. Reference rows: the shrink alone and SiLU·mul of the same rows
    without LoRA. Timed alone, not beside a GEMM: the delta path's expand runs beside the GEMM
    in a step, so its row here is not its cost there.

    Usage: dev_silu_lora. Exit 1 if a version fails its check.
*/
#include "../lora.cu"

#include "dev_lora.cuh"

// -- frag: the first form -------------------------------------------------------------------
enum { FR_WARPS = 4, FR_MINB = 3, FR_SLOTS = 2 };

__device__ __forceinline__ void s_fr_put(__nv_bfloat16 *lp, size_t i, float g, float u) {
    lp[i] = __float2bfloat16_rn(ls_silu_mul(g, u));
}

template <int NH>
__device__ __forceinline__ void s_fr_run(__nv_bfloat16 *lp, const float *gate_up, const float *tmp, int n_parts,
                                         size_t part_stride, const ls_lora_pages_t &b, const ls_cu_lora_tile_t &tile,
                                         int c0, int c1, int inter, int r_max) {
    constexpr int U = FR_SLOTS / NH, PASS = U * FR_WARPS * 16;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    float s = tile.scale;
    size_t ld = 2 * (size_t)inter;
    s_e4_lane_t<NH> ln;
    s_e4_lane(ln, b, tile, c);
    uint4 gb0[U][NH], gb8[U][NH], ub0[U][NH], ub8[U][NH];
    auto load_b = [&](int o, int u) {
        s_e4_load_b(gb0[u], gb8[u], ln, o, g, o < c1);
        s_e4_load_b(ub0[u], ub8[u], ln, inter + o, g, o < c1);
    };
    int gb = c0 + warp * 16;
#pragma unroll
    for (int u = 0; u < U; u++)
        load_b(gb + u * FR_WARPS * 16, u);
    int wr[2];
    s_e4_rows(wr, NULL, tile, c);
    uint32_t tg[NH][2][2][3], tu[NH][2][2][3];
    const float *tr = tmp + (size_t)(tile.p0 + min(g, tile.n - 1)) * 2 * r_max;
    s_e4_tmp(tg, tr, g < tile.n, ln, c, n_parts, part_stride);
    s_e4_tmp(tu, tr + r_max, g < tile.n, ln, c, n_parts, part_stride);
    float gv[U][4], uv[U][4];
    auto load_y = [&](int o, int u) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            bool ok = o < c1 && wr[e & 1] >= 0;
            const float *p = gate_up + (size_t)max(wr[e & 1], 0) * ld + o + g + (e >> 1) * 8;
            gv[u][e] = ok ? p[0] : 0.0f;
            uv[u][e] = ok ? p[inter] : 0.0f;
        }
    };
#pragma unroll
    for (int u = 0; u < U; u++)
        load_y(gb + u * FR_WARPS * 16, u);
    for (; gb < c1; gb += PASS) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            int o = gb + u * FR_WARPS * 16;
            float dg[4], du[4];
            s_e4_mma(dg, gb0[u], gb8[u], ln, tg);
            s_e4_mma(du, ub0[u], ub8[u], ln, tu);
            if (gb + PASS < c1)
                load_b(o + PASS, u);
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (o < c1 && wr[e & 1] >= 0)
                    s_fr_put(lp, (size_t)wr[e & 1] * inter + o + g + (e >> 1) * 8,
                             __fadd_rn(gv[u][e], __fadd_rn(0.0f, __fmul_rn(s, dg[e]))),
                             __fadd_rn(uv[u][e], __fadd_rn(0.0f, __fmul_rn(s, du[e]))));
            if (gb + PASS < c1)
                load_y(o + PASS, u);
        }
    }
}

// every row on a tile (no base-model rows in these problems)
__global__ void __launch_bounds__(FR_WARPS * 32, FR_MINB)
k_dev_silu_frag(__nv_bfloat16 *lp, const float *gate_up, const float *tmp, ls_lora_pages_t b,
                const ls_cu_lora_tile_t *tiles, const __grid_constant__ s_slice_offs_t so,
                const __grid_constant__ s_e3_blocks_t sb, int inter, int r_max, int n_parts, size_t part_stride) {
    int t, k, c0, c1;
    s_e3_block(sb, so, 1, 16, t, k, c0, c1);
    ls_cu_lora_tile_t tile = tiles[t];
    if (tile.rank <= 32)
        s_fr_run<1>(lp, gate_up, tmp, n_parts, part_stride, b, tile, c0, c1, inter, r_max);
    else
        s_fr_run<2>(lp, gate_up, tmp, n_parts, part_stride, b, tile, c0, c1, inter, r_max);
}

// -- the versions ----------------------------------------------------------------------------
struct s_io_t {
    float *gu[DEV_SETS], *delta, *out;
    __nv_bfloat16 *lp;
};

static cudaError_t s_shrink(const dev_lora_t &p, long i, cudaStream_t st) {
    return ls_cu_lora_silu_shrink(p.tmp, p.part_stride, p.x, LS_CU_F32, p.pa, p.tiles[i % DEV_SETS], p.n_tiles,
                                  p.r, NULL, p.g.in, p.r_max, p.flags, st);
}

// version v on set i % DEV_SETS: lp, and out where given (fp32, the check's)
static cudaError_t s_run(const dev_lora_t &p, const s_io_t &io, int v, long i, float *out, cudaStream_t st) {
    const ls_cu_lora_tile_t *tiles = p.tiles[i % DEV_SETS];
    const float *gu = io.gu[i % DEV_SETS];
    int inter = p.g.outs[0], T = p.T;
    cudaError_t e;
    switch (v) {
    case 0: // delta
        e = ls_cu_lora_apply(io.delta, p.tmp, p.part_stride, p.x, LS_CU_F32, p.pa, LS_CU_BF16, p.pb, LS_CU_BF16,
                             tiles, p.n_tiles, p.r, NULL, p.offs, p.g.in, 2, p.r_max, p.flags, st);
        return e != cudaSuccess ? e : ls_cu_silu_mul(out, io.lp, LS_CU_BF16, NULL, gu, io.delta, T, inter, st);
    case 1: // fused
        e = s_shrink(p, i, st);
        return e != cudaSuccess ? e
                                : ls_cu_lora_silu_mul(out, io.lp, LS_CU_BF16, gu, p.tmp, p.part_stride, p.pb, tiles,
                                                      p.n_tiles, p.r, NULL, NULL, 0, T, p.g.in, inter, p.r_max, st);
    case 2: { // frag (lp only; the check reads lp)
        e = s_shrink(p, i, st);
        if (e != cudaSuccess)
            return e;
        int offs[2] = {0, inter};
        s_slice_offs_t so = s_slice_offs(offs, 1);
        s_e3_blocks_t sb = s_e3_split(so, 1, p.n_tiles, 2L * FR_MINB * ls_cu_props()->sms, FR_WARPS * 16 * FR_SLOTS);
        int n_parts = s_shrink_tc_parts(p.n_tiles, p.r, p.g.in, 2);
        k_dev_silu_frag<<<p.n_tiles * sb.first[1], FR_WARPS * 32, 0, st>>>(io.lp, gu, p.tmp, p.pb, tiles, so, sb,
                                                                          inter, p.r_max, n_parts, p.part_stride);
        return cudaGetLastError();
    }
    case 3: // the shrink alone
        return s_shrink(p, i, st);
    default: // SiLU·mul alone, no LoRA
        return ls_cu_silu_mul(out, io.lp, LS_CU_BF16, NULL, gu, NULL, T, inter, st);
    }
}

int main(void) {
    static const char *names[] = {"delta", "fused", "frag", "shrink", "silu_mul"};
    cudaStream_t st;
    double bw = dev_begin("dev_silu_lora", "gate_up's LoRA with SiLU·mul, 8 adapters of rank 16, bf16 pools", &st);
    for (int T : {128, 256}) {
        dev_lora_t p;
        dev_lora_init(p, dev_groups[2], DEV_EIGHT, 3000, T);
        int inter = p.g.outs[0];
        size_t n = (size_t)T * inter, ng = 2 * n;
        char name[64];
        snprintf(name, sizeof name, "gate_up eight T=%d", T);
        printf("%s (%d adapters, %d tiles):\n", name, p.n_ad, p.n_tiles);
        // gate_up (the GEMM's output) in every set; set 0's on the host for the reference
        s_io_t io;
        dev_rng_t r = {77};
        std::vector<float> hgu, h;
        for (int s = 0; s < DEV_SETS; s++)
            io.gu[s] = dev_f32_fill(r, ng, 3.0f, s ? h : hgu);
        DEV_CK(cudaMalloc(&io.delta, ng * 4));
        DEV_CK(cudaMalloc(&io.out, n * 4));
        DEV_CK(cudaMalloc(&io.lp, n * 2));
        // the reference: gate_up + the LoRA's delta (set 0), then SiLU·mul
        std::vector<float> tmp(p.part_stride, 0.0f), gd = hgu, want(n);
        ls_lora_shrink(tmp.data(), p.hx.data(), p.hpa, &p.batch, p.g.in, 2, p.r_max);
        ls_lora_expand(gd.data(), tmp.data(), p.hpb, &p.batch, p.offs, 2, p.r_max);
        ls_silu_mul_forward(want.data(), gd.data(), NULL, T, inter);
        std::vector<__nv_bfloat16> lp_delta(n), lp_v(n);
        std::vector<float> got(n);
        for (int v = 0; v < 3; v++) {
            DEV_CK(cudaMemset(io.lp, 0xff, n * 2));
            DEV_CK(cudaMemset(io.out, 0xff, n * 4));
            DEV_CK(s_run(p, io, v, 0, v == 2 ? NULL : io.out, st));
            DEV_CK(cudaStreamSynchronize(st));
            DEV_CK(cudaMemcpy(lp_v.data(), io.lp, n * 2, cudaMemcpyDeviceToHost));
            if (v == 2) // frag writes lp alone: its values widened
                for (size_t e = 0; e < n; e++)
                    got[e] = __bfloat162float(lp_v[e]);
            else
                DEV_CK(cudaMemcpy(got.data(), io.out, n * 4, cudaMemcpyDeviceToHost));
            std::vector<float> want_v = want;
            if (v == 2) // against the reference rounded as lp is
                for (size_t e = 0; e < n; e++)
                    want_v[e] = __bfloat162float(__float2bfloat16_rn(want[e]));
            dev_check(name, names[v], dev_nmse(got.data(), want_v.data(), n), v == 2 ? 1e-5 : 1e-10);
            if (v == 0)
                lp_delta = lp_v;
            else {
                size_t differ = 0;
                for (size_t e = 0; e < n; e++)
                    differ += memcmp(&lp_v[e], &lp_delta[e], 2) != 0;
                printf("  %-28s %-10s %zu of %zu lp values differ from delta's %s\n", name, names[v], differ, n,
                       differ ? "FAIL" : "ok");
                dev_failures += differ != 0;
            }
        }
        // what any version must move: gate_up read, lp written, A and B of the adapters, x
        double bytes = (double)ng * 4 + (double)n * 2 + dev_shrink_bytes(p) + dev_rank_tokens(p, false) * ng / T * 2;
        for (int v = 0; v < 5; v++) {
            double us = dev_time_us(st, 50, [&](long i) { return s_run(p, io, v, i, NULL, st); });
            dev_lora_row(names[v], us, bytes, bw, v >= 3 ? "  (part of the op; GB/s of the op's bytes)" : "");
        }
        for (int s = 0; s < DEV_SETS; s++)
            cudaFree(io.gu[s]);
        cudaFree(io.delta), cudaFree(io.out), cudaFree(io.lp);
        dev_lora_free(p);
    }
    return dev_end();
}
