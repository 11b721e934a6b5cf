/*  kernels/cuda/dev/dev_expand.cu — the LoRA expand's versions side by side: y += scaling ·
    tmp · Bᵀ per tile, validated against the CPU reference (ls_lora_expand, on the reference
    shrink's tmp), then timed (dev_common.cuh's method) on Llama-3-8B's four groups at decode
    (dev_lora.cuh's problems).

    Versions:
      v1     k_lora_expand: a thread per output column (production: r_max outside
             {8, 16, 32, 64} or unaligned pools)
      v2     k_lora_expand2: L lanes per column, E2_UT columns per lane group in flight (8 for
             one-position tiles) (production: 16-bit/fp32 pools where v3/v4/tc do not apply)
      v2-u8  the same with 8 columns in flight on multi-position tiles: slower there (the
             registers go to the tile's sums)
      v3     k_lora_expand3, one-position tiles (production: the decode op over distinct
             adapters)
      v4     k_lora_expand4, tensor cores over each tile's own rank, tiles of any length
             (production: the decode op's launches that are not all one-position tiles)
      tc     k_lora_expand_tc, tensor cores over long tiles (production: prefill segments,
             and the short tiles of a step beside a prompt chunk unless all are one position)
      step   ls_cu_lora_expand with LS_CU_LORA_ACC, as a step that is not decode-shaped (a
             prompt chunk beside the decodes) runs its short tiles: the version it picks

    Usage: dev_expand [GROUP]   (qkv, o, gate_up, down; all by default). Exit 1 if a version
    fails its check.
*/
#include "../lora.cu"

#include "dev_lora.cuh"

#include <cstring>

struct s_version_t {
    const char *name;
    int only; // 0: every problem; 1: one-position tiles only; 2: multi-position tiles only
};
static const s_version_t s_versions[] = {{"v1", 0}, {"v2", 0}, {"v2-u8", 2}, {"v3", 1},
                                         {"v4", 0}, {"tc", 0},   {"step", 0}};

template <int L>
static cudaError_t s_run_l(const dev_lora_t &p, int v, long i, const s_slice_offs_t &so, cudaStream_t st) {
    const ls_cu_lora_tile_t *tiles = p.tiles[i % DEV_SETS];
    int ns = p.g.n_slices, rm = p.r_max, nt = p.n_tiles;
    size_t smem = (size_t)TT * ns * rm * sizeof(float);
    if (v == 1 || v == 2) {
        int u = p.distinct || v == 2 ? 8 : E2_UT, ob = E2_WARPS * (32 / L) * u;
        s_launch_t l;
        s_launch_init(l, dim3(nt, (p.out_total + ob - 1) / ob), E2_WARPS * 32, smem, st, p.flags);
        auto k = p.distinct ? k_lora_expand2<__nv_bfloat16, L, 8, true, 1>
                 : v == 2   ? k_lora_expand2<__nv_bfloat16, L, 8, true, TT>
                            : k_lora_expand2<__nv_bfloat16, L, E2_UT, true, TT>;
        return cudaLaunchKernelEx(&l.cfg, k, p.y, (const float *)p.tmp, p.pb, tiles, (const int32_t *)NULL, so, ns,
                                  rm, 1, (size_t)0);
    }
    if (v == 3)
        return s_expand3<__nv_bfloat16, L, true>(p.y, p.tmp, 1, 0, p.pb, tiles, nt, NULL, so, ns, rm,
                                                 p.flags, st);
    return cudaErrorInvalidValue;
}

static cudaError_t s_run(const dev_lora_t &p, int v, long i, cudaStream_t st) {
    const ls_cu_lora_tile_t *tiles = p.tiles[i % DEV_SETS];
    int ns = p.g.n_slices, rm = p.r_max, nt = p.n_tiles;
    s_slice_offs_t so = s_slice_offs(p.offs, ns);
    switch (v) {
    case 0: {
        dim3 grid(nt, (p.out_total + EX_THREADS - 1) / EX_THREADS);
        k_lora_expand<__nv_bfloat16><<<grid, EX_THREADS, (size_t)TT * ns * rm * 4, st>>>(
            p.y, p.tmp, p.pb, tiles, NULL, so, ns, rm);
        return cudaGetLastError();
    }
    case 4:
        return s_expand4<true>(p.y, p.tmp, 1, 0, p.pb, tiles, nt, NULL, so, ns, rm, p.flags, st);
    case 5: return s_expand_tc(p.y, p.tmp, p.pb, tiles, nt, NULL, so, ns, rm, st);
    case 6:
        return ls_cu_lora_expand(p.y, p.tmp, p.pb, LS_CU_BF16, tiles, nt, p.r, NULL, p.offs, ns, rm,
                                 p.flags | LS_CU_LORA_ACC, st);
    default:
        switch (s_expand_lanes(p.r, rm)) {
        case 1: return s_run_l<1>(p, v, i, so, st);
        case 2: return s_run_l<2>(p, v, i, so, st);
        case 4: return s_run_l<4>(p, v, i, so, st);
        default: return s_run_l<8>(p, v, i, so, st);
        }
    }
}

int main(int argc, char **argv) {
    cudaStream_t st;
    double bw = dev_begin("dev_expand", "T=64, rank 16, bf16 pools", &st);
    dev_lora_each(argc, argv, 2000, [&](const dev_lora_t &p, const char *name) {
        std::vector<float> want_tmp, want_y;
        dev_lora_reference(p, want_tmp, want_y);
        DEV_CK(cudaMemcpy(p.tmp, want_tmp.data(), p.part_stride * 4, cudaMemcpyHostToDevice));
        double bytes = dev_expand_bytes(p);
        for (int v = 0; v < (int)(sizeof s_versions / sizeof *s_versions); v++) {
            if ((s_versions[v].only == 1 && !p.distinct) || (s_versions[v].only == 2 && p.distinct))
                continue;
            dev_check(name, s_versions[v].name, dev_lora_delta_nmse(p, want_y, [&] { return s_run(p, v, 0, st); }),
                      1e-10);
            double us = dev_time_us(st, 50, [&](long i) { return s_run(p, v, i, st); });
            dev_lora_row(s_versions[v].name, us, bytes, bw, "");
        }
    });
    return dev_end();
}
