/*  kernels/cpu/rope.c — rotary position embedding, HF Llama convention.

    The inverse frequency table follows transformers' modeling_rope_utils:
    _compute_default_rope_parameters, _compute_linear_scaling_rope_parameters (inv_freq /
    factor) and _compute_llama3_parameters (Llama 3.1 wavelength-banded scaling: high
    frequencies kept, low frequencies divided by factor, a smooth blend in between).
*/
#include <assert.h>
#include <math.h>

#include "ops.h"

// inv_freq is (head_dim/2)
void ls_rope_inv_freq_init(float *inv_freq, int head_dim, const ls_rope_config_t *cfg) {
    assert(head_dim > 0 && head_dim % 2 == 0 && cfg->theta > 0);
    double low_wavelen = cfg->original_max_position / cfg->low_freq_factor;
    double high_wavelen = cfg->original_max_position / cfg->high_freq_factor;
    for (int i = 0; i < head_dim / 2; i++) {
        double f = 1.0 / pow(cfg->theta, (double)(2 * i) / head_dim);
        if (cfg->type == LS_ROPE_LINEAR)
            f /= cfg->factor;
        else if (cfg->type == LS_ROPE_LLAMA3) {
            double wavelen = 2.0 * M_PI / f;
            if (wavelen > low_wavelen)
                f /= cfg->factor;
            else if (wavelen >= high_wavelen) { // medium band: blend the two
                double smooth = (cfg->original_max_position / wavelen - cfg->low_freq_factor) /
                                (cfg->high_freq_factor - cfg->low_freq_factor);
                f = (1.0 - smooth) * f / cfg->factor + smooth * f;
            }
        }
        inv_freq[i] = (float)f;
    }
}

// x is (T, row_stride) holding (n_heads, head_dim) per row, positions is (T),
// inv_freq is (head_dim/2)
void ls_rope_forward(float *x, const float *x2, const int32_t *positions,
                     const float *inv_freq, int T, int n_heads, int head_dim,
                     int row_stride) {
    assert(head_dim % 2 == 0 && row_stride >= n_heads * head_dim);
    int half = head_dim / 2;
    for (int t = 0; t < T; t++) {
        float pos = (float)positions[t];
        for (int i = 0; i < half; i++) {
            float angle = pos * inv_freq[i]; // fp32 product, as HF forms it
            float c = cosf(angle), s = sinf(angle);
            for (int h = 0; h < n_heads; h++) {
                size_t o = (size_t)t * row_stride + (size_t)h * head_dim;
                float *xh = x + o;
                float a = xh[i], b = xh[i + half];
                if (x2) {
                    a += x2[o + i];
                    b += x2[o + i + half];
                }
                xh[i] = a * c - b * s;
                xh[i + half] = b * c + a * s;
            }
        }
    }
}
