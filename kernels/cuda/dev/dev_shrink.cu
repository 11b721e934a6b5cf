/*  kernels/cuda/dev/dev_shrink.cu — the LoRA shrink's versions side by side: tmp = x · Aᵀ per
    tile, validated against the CPU reference (ls_lora_shrink), then timed (dev_common.cuh's
    method) on Llama-3-8B's four groups at decode (dev_lora.cuh's problems).

    Versions:
      v1        k_lora_shrink: one element per lane (production: unaligned rows only)
      v2        k_lora_shrink2, 4 chunks of 16-byte loads in flight per lane (production:
                16-bit or fp32 pools other than bf16 at rank <= 64)
      v2-u8     the same with 8 chunks in flight: no faster, more registers
      tc        k_lora_shrink_tc, K split over clusters summed on chip (production:
                ls_cu_lora_shrink on bf16 pools)
      tc-parts  k_lora_shrink_tc, K split over blocks into LS_CU_LORA_PARTS arrays that the
                expand sums (production: the decode op's multi-position tiles)
      v3        k_lora_shrink3, one-position tiles only (production: the decode op over
                distinct adapters)

    Usage: dev_shrink [GROUP]   (qkv, o, gate_up, down; all by default). Exit 1 if a version
    fails its check.
*/
#include "../lora.cu"

#include "dev_lora.cuh"

#include <cstring>

struct s_version_t {
    const char *name;
    bool parts;       // leaves K parts in tmp (the expand sums them)
    bool one_only;    // one-position tiles only
};
static const s_version_t s_versions[] = {{"v1", false, false},      {"v2", false, false},
                                         {"v2-u8", false, false},   {"tc", false, false},
                                         {"tc-parts", true, false}, {"v3", true, true}};

static cudaError_t s_run(const dev_lora_t &p, int v, long i, int *parts, cudaStream_t st) {
    const ls_cu_lora_tile_t *tiles = p.tiles[i % DEV_SETS];
    int in = p.g.in, ns = p.g.n_slices, r = p.r, rm = p.r_max, nt = p.n_tiles;
    *parts = 1;
    switch (v) {
    case 0: {
        dim3 grid(nt, ns, (r + SH_JB - 1) / SH_JB);
        k_lora_shrink<__nv_bfloat16, float><<<grid, SH_WARPS * 32, 0, st>>>(p.tmp, p.x, p.pa, tiles, NULL, in, ns, rm);
        return cudaGetLastError();
    }
    case 1: return s_shrink2<S2_U>(p.tmp, p.x, LS_CU_F32, p.pa, LS_CU_BF16, tiles, nt, r, NULL, in, ns, rm, p.flags, st);
    case 2: return s_shrink2<8>(p.tmp, p.x, LS_CU_F32, p.pa, LS_CU_BF16, tiles, nt, r, NULL, in, ns, rm, p.flags, st);
    case 3: return s_shrink_tc(p.tmp, 0, NULL, p.x, LS_CU_F32, p.pa, tiles, nt, r, NULL, in, ns, rm, p.flags, st);
    case 4: return s_shrink_tc(p.tmp, p.part_stride, parts, p.x, LS_CU_F32, p.pa, tiles, nt, r, NULL, in, ns, rm, p.flags, st);
    default:
        return s_shrink3(p.tmp, p.part_stride, parts, p.x, LS_CU_F32, p.pa, LS_CU_BF16, tiles, nt, r, NULL, in, ns, rm,
                         p.flags, st);
    }
}

int main(int argc, char **argv) {
    cudaStream_t st;
    double bw = dev_begin("dev_shrink", "T=64, rank 16, bf16 pools", &st);
    dev_lora_each(argc, argv, 1000, [&](const dev_lora_t &p, const char *name) {
        std::vector<float> want_tmp, want_y, got(p.part_stride), part(p.part_stride);
        dev_lora_reference(p, want_tmp, want_y);
        double bytes = dev_shrink_bytes(p);
        for (int v = 0; v < (int)(sizeof s_versions / sizeof *s_versions); v++) {
            if (s_versions[v].one_only && !p.distinct)
                continue;
            // columns at or past a tile's rank are never written: zeros, as the reference's
            DEV_CK(cudaMemset(p.tmp, 0, LS_CU_LORA_PARTS * p.part_stride * 4));
            int parts = 1;
            DEV_CK(s_run(p, v, 0, &parts, st));
            DEV_CK(cudaStreamSynchronize(st));
            std::fill(got.begin(), got.end(), 0.0f);
            for (int k = 0; k < parts; k++) {
                DEV_CK(cudaMemcpy(part.data(), p.tmp + k * p.part_stride, p.part_stride * 4, cudaMemcpyDeviceToHost));
                for (size_t e = 0; e < p.part_stride; e++)
                    got[e] += part[e];
            }
            // fp32 sums in another order (tc: fp32 x as three exact bf16 parts)
            dev_check(name, s_versions[v].name, dev_nmse(got.data(), want_tmp.data(), p.part_stride), 1e-10);
            double us = dev_time_us(st, 50, [&](long i) { return s_run(p, v, i, &parts, st); });
            dev_lora_row(s_versions[v].name, us, bytes, bw, s_versions[v].parts ? " (parts left to the expand)" : "");
        }
    });
    return dev_end();
}
