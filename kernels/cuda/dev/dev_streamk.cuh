/*  kernels/cuda/dev/dev_streamk.cuh — the stream-K split of the dev bench's decode GEMMs on
    warpgroup MMA (dev_gemv's k_gemm_wg, dev_fp8's wg and ws forms): U units (RT row tiles x
    KC k-blocks, tile-major) over G CTAs, CTA i taking units [i U / G, (i + 1) U / G), so that
    every CTA moves the same bytes. A tile a CTA holds whole is stored from its registers; a
    piece of a tile goes to the workspace (2 slots a CTA: 0 its first piece, 1 its last), and
    the tile's last CTA to arrive (a counter a tile, zero between launches) sums the pieces in
    CTA order — the same bits whichever CTA arrives last, for a given grid — stores the tile
    and zeroes its counter. The sums are a warpgroup's m64 x N accumulators (wgmma.cuh's
    layout), MT m64 tiles a row tile, NR = N / 2 registers each; only the warpgroup's 128
    threads (0-127) take part.
*/
#ifndef LS_DEV_STREAMK_CUH
#define LS_DEV_STREAMK_CUH

// A CTA's share of the units: KC units a row tile, U in all over G CTAs, this one's [u0, u1)
struct dev_sk_t {
    int KC, U, G, cta, u0, u1;
};
__device__ __forceinline__ dev_sk_t dev_sk_split(int KC, int RT) {
    dev_sk_t s;
    s.KC = KC, s.U = RT * KC, s.G = gridDim.x, s.cta = blockIdx.x;
    s.u0 = (int)((long)s.cta * s.U / s.G), s.u1 = (int)((long)(s.cta + 1) * s.U / s.G);
    return s;
}
// the CTA whose units include unit u
__device__ __forceinline__ int dev_sk_cta_of(const dev_sk_t &s, int u) {
    return (int)(((long)(u + 1) * s.G - 1) / s.U);
}
// the warpgroup's own barrier (named barrier 1): a producer warp beside it is not in it
__device__ __forceinline__ void dev_sk_sync() {
    asm volatile("bar.sync 1, 128;\n" ::: "memory");
}
template <int MT, int NR> __device__ __forceinline__ void dev_sk_zero(float (&a)[MT][NR]) {
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int i = 0; i < NR; i++)
            a[m][i] = 0.0f;
}
// Tile t's sums e (or this CTA's piece of it, units [seg0, seg1)) out: store(o, tt, v) for
// each of the thread's sums (o the output row, tt the token), or the piece to the workspace
// and, by the tile's last CTA, the pieces' sum stored. last: a shared int.
template <int MT, int NR, typename F>
__device__ __forceinline__ void dev_sk_flush(float (&e)[MT][NR], const dev_sk_t &s, int t, int seg0, int seg1,
                                             float *ws, int *cnt, int &last, F store) {
    constexpr int PIECE = MT * NR * 128; // floats of a piece in the workspace
    const int tid = threadIdx.x, warp = tid >> 5, g = (tid & 31) >> 2, c = tid & 3;
    const int tu0 = t * s.KC, tu1 = tu0 + s.KC;
    if (seg0 != tu0 || seg1 != tu1) {
        float *mine = ws + ((size_t)s.cta * 2 + (seg0 == s.u0 ? 0 : 1)) * PIECE + tid;
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int i = 0; i < NR; i++)
                __stcg(mine + (m * NR + i) * 128, e[m][i]);
        __threadfence();
        dev_sk_sync();
        const int c0 = dev_sk_cta_of(s, tu0), c1 = dev_sk_cta_of(s, tu1 - 1);
        if (tid == 0)
            last = atomicAdd(cnt + t, 1) == c1 - c0;
        dev_sk_sync();
        if (!last)
            return;
        __threadfence();
        // the pieces in CTA order: the same sums whichever CTA arrives last
        dev_sk_zero(e);
        for (int k = c0; k <= c1; k++) {
            const int k0 = (int)((long)k * s.U / s.G);
            const float *p = ws + ((size_t)k * 2 + (k0 >= tu0 ? 0 : 1)) * PIECE + tid;
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int i = 0; i < NR; i++)
                    e[m][i] += __ldcg(p + (m * NR + i) * 128);
        }
        if (tid == 0)
            cnt[t] = 0;
    }
    // wgmma.cuh's accumulator layout: rows 16 warp + g (+ 8), tokens 8 n + 2 c (+ 1)
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int i = 0; i < NR; i++)
            store(t * 64 * MT + 64 * m + 16 * warp + g + 8 * ((i & 3) >> 1), 8 * (i >> 2) + 2 * c + (i & 1),
                  e[m][i]);
}

#endif
