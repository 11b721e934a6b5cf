/*  tests/kernels/test_sampling.c — penalties, temperature, truncation, seeded draws and
    logprobs of ls_sampling_sample, against hand-computed values and double references.

    Statistical checks use fixed seeds, so they are deterministic: the empirical
    distribution over 20000 seeds (and over 20000 steps of one seed) must match
    softmax(l / T) with chi-square below the p = 0.001 critical value for its degrees of
    freedom and total variation below 0.02.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "ops.h"
#include "test_util.h"

#define N_DRAWS 20000

static ls_sampling_params_t s_params(float temperature, uint64_t seed, uint64_t step) {
    return (ls_sampling_params_t){.temperature = temperature, .top_p = 1.0f,
                                  .repetition_penalty = 1.0f, .seed = seed, .step = step};
}

// One row without token history; returns the token, *lp its logprob if lp != NULL.
static int s_sample1(const float *logits, int V, const ls_sampling_params_t *sp, float *lp) {
    ls_sampling_batch_t batch = {.n_rows = 1, .params = sp};
    int32_t tok;
    assert_int_equal(ls_sampling_sample(&tok, lp, NULL, NULL, logits, &batch, V), 0);
    return tok;
}

// out (V) = log_softmax(l (V) / T), in double
static void s_log_softmax(double *out, const float *l, int V, double T) {
    double max = -INFINITY, sum = 0.0;
    for (int v = 0; v < V; v++)
        max = l[v] / T > max ? l[v] / T : max;
    for (int v = 0; v < V; v++)
        sum += exp(l[v] / T - max);
    for (int v = 0; v < V; v++)
        out[v] = l[v] / T - max - log(sum);
}

static void test_greedy(void **state) {
    enum { V = 1000 };
    t_rng_t r = {21};
    float l[V], lp;
    double ref[V];
    for (int trial = 0; trial < 20; trial++) {
        t_fill(&r, l, V, -10, 10);
        int best = 0;
        for (int v = 1; v < V; v++)
            best = l[v] > l[best] ? v : best;
        ls_sampling_params_t sp = s_params(0.0f, trial, 0);
        sp.top_k = 5, sp.top_p = 0.5f, sp.min_p = 0.1f; // truncation never hides the argmax
        assert_int_equal(s_sample1(l, V, &sp, &lp), best);
        s_log_softmax(ref, l, V, 1.0); // greedy logprobs are those of T = 1
        assert_true(fabs(lp - ref[best]) <= 1e-5);
    }
    l[3] = l[7] = 100.0f; // ties go to the lower id
    ls_sampling_params_t sp = s_params(0.0f, 0, 0);
    assert_int_equal(s_sample1(l, V, &sp, NULL), 3);
}

// same (seed, step) -> same token; other seeds / steps -> other tokens often
static void test_seeded_draws(void **state) {
    enum { V = 64 };
    float l[V] = {0}; // uniform: any token is as likely
    int seen_seed[V] = {0}, seen_step[V] = {0}, n_seed = 0, n_step = 0;
    for (int i = 0; i < 40; i++) {
        ls_sampling_params_t a = s_params(1.0f, 1000 + i, 5), b = s_params(1.0f, 77, i);
        int ta = s_sample1(l, V, &a, NULL), tb = s_sample1(l, V, &b, NULL);
        assert_int_equal(ta, s_sample1(l, V, &a, NULL));
        assert_int_equal(tb, s_sample1(l, V, &b, NULL));
        n_seed += !seen_seed[ta]++;
        n_step += !seen_step[tb]++;
    }
    // 40 uniform draws over 64 tokens hit ~30 distinct ones; 15 is far in the tail
    assert_true(n_seed >= 15 && n_step >= 15);
    assert_true(ls_rng_u64(1, 0, 0) != ls_rng_u64(0, 1, 0));
    assert_true(ls_rng_u64(0, 1, 0) != ls_rng_u64(0, 0, 1));
}

// chi-square and TV of counts (V) over n draws against probabilities p (V)
static void s_assert_fits(const int *counts, const double *p, int V, int n, double chi2_max) {
    double chi2 = 0.0, tv = 0.0;
    for (int v = 0; v < V; v++) {
        double e = p[v] * n;
        if (e > 0)
            chi2 += (counts[v] - e) * (counts[v] - e) / e;
        else
            assert_int_equal(counts[v], 0);
        tv += fabs(counts[v] / (double)n - p[v]) / 2;
    }
    print_message("    chi2=%.2f (max %.1f) tv=%.4f\n", chi2, chi2_max, tv);
    assert_true(chi2 <= chi2_max && tv <= 0.02);
}

static void test_distribution(void **state) {
    enum { V = 8 };
    const float l[V] = {1.0f, 0.5f, 2.0f, -1.0f, 0.0f, 1.5f, -0.5f, 0.8f};
    const float T = 0.7f;
    double lp[V], p[V];
    int by_seed[V] = {0}, by_step[V] = {0};
    s_log_softmax(lp, l, V, T);
    for (int v = 0; v < V; v++)
        p[v] = exp(lp[v]);
    for (int i = 0; i < N_DRAWS; i++) {
        ls_sampling_params_t a = s_params(T, i, 0), b = s_params(T, 12345, i);
        by_seed[s_sample1(l, V, &a, NULL)]++;
        by_step[s_sample1(l, V, &b, NULL)]++;
    }
    s_assert_fits(by_seed, p, V, N_DRAWS, 24.32); // df 7, p = 0.001
    s_assert_fits(by_step, p, V, N_DRAWS, 24.32);
}

// Truncation: over many draws only allowed tokens appear, and they appear with their
// renormalized probabilities. allowed is worked out here in double from the definitions.
static void s_check_truncation(const float *l, int V, ls_sampling_params_t sp,
                               const int *allowed, int df_chi2_max_x10) {
    double lp[V], p[V], mass = 0.0;
    int counts[V];
    memset(counts, 0, sizeof counts);
    s_log_softmax(lp, l, V, sp.temperature);
    for (int v = 0; v < V; v++)
        mass += allowed[v] ? exp(lp[v]) : 0.0;
    for (int v = 0; v < V; v++)
        p[v] = allowed[v] ? exp(lp[v]) / mass : 0.0;
    for (int i = 0; i < N_DRAWS; i++) {
        sp.seed = 5000 + i;
        int tok = s_sample1(l, V, &sp, NULL);
        assert_true(allowed[tok]);
        counts[tok]++;
    }
    s_assert_fits(counts, p, V, N_DRAWS, df_chi2_max_x10 / 10.0);
}

static void test_truncation(void **state) {
    enum { V = 10 };
    // distinct logits; ranks by value: 2, 5, 0, 7, 1, 4, 9, 6, 3, 8
    const float l[V] = {1.0f, 0.5f, 2.0f, -1.0f, 0.4f, 1.5f, -0.5f, 0.8f, -2.0f, 0.1f};
    ls_sampling_params_t sp = s_params(1.0f, 0, 3);

    sp.top_k = 3; // the three largest
    int k3[V] = {[2] = 1, [5] = 1, [0] = 1};
    s_check_truncation(l, V, sp, k3, 138); // df 2

    // top-p 0.6: p(2) = .333, p(5) = .202 -> .535 < .6, so token 0 (.123) crosses it
    sp.top_k = 0, sp.top_p = 0.6f;
    s_check_truncation(l, V, sp, k3, 138);

    // top-p after top-k renormalizes: the top 4 become {.439, .267, .162, .132}, so 0.70
    // is crossed by the 2nd (.439 + .267 = .706) -> tokens 2, 5 only
    sp.top_k = 4, sp.top_p = 0.70f;
    int k2[V] = {[2] = 1, [5] = 1};
    s_check_truncation(l, V, sp, k2, 108); // df 1

    // min-p 0.3: keep l >= 2 + log 0.3 = 0.796 -> tokens 2, 5, 0, 7
    sp.top_k = 0, sp.top_p = 1.0f, sp.min_p = 0.3f;
    int m4[V] = {[2] = 1, [5] = 1, [0] = 1, [7] = 1};
    s_check_truncation(l, V, sp, m4, 163); // df 3

    // all three, temperature 2: top-k 6 -> {2,5,0,7,1,4}; top-p 0.9 over those at T = 2
    // keeps all six (the 6th starts at .87); min-p 0.6 keeps l/2 >= 1 + log 0.6, i.e.
    // l >= 0.978: {2,5,0}
    sp.temperature = 2.0f, sp.top_k = 6, sp.top_p = 0.9f, sp.min_p = 0.6f;
    s_check_truncation(l, V, sp, k3, 138);
}

// Penalties worked by hand. logits {2, 1.5, -1, 3, 0.5, -0.5}, prompt {1, 2, 2}, output
// {2, 3, 3, 3}; repetition 1.5 on {1, 2, 3} once each: 1.5 -> 1.0, -1 -> -1.5, 3 -> 2.0;
// frequency 0.5 and presence 0.25 on output counts {2: 1, 3: 3}: -1.5 - 0.5 - 0.25 =
// -2.25, 2.0 - 1.5 - 0.25 = 0.25; temperature 2 after all that:
// processed = {1.0, 0.5, -1.125, 0.125, 0.25, -0.25}.
static void test_penalties_and_logprobs(void **state) {
    enum { V = 6 };
    const float logits[V] = {2.0f, 1.5f, -1.0f, 3.0f, 0.5f, -0.5f};
    const float processed[V] = {1.0f, 0.5f, -1.125f, 0.125f, 0.25f, -0.25f};
    const int32_t prompt[] = {1, 2, 2}, output[] = {2, 3, 3, 3};
    const int32_t prompt_indptr[] = {0, 3}, output_indptr[] = {0, 4};
    ls_sampling_params_t sp = s_params(2.0f, 9, 0);
    sp.repetition_penalty = 1.5f, sp.frequency_penalty = 0.5f, sp.presence_penalty = 0.25f;
    sp.n_logprobs = V;
    ls_sampling_batch_t batch = {.n_rows = 1, .max_top_n = V, .params = &sp,
                                 .prompt_indptr = prompt_indptr, .prompt_ids = prompt,
                                 .output_indptr = output_indptr, .output_ids = output};
    int32_t tok, top_ids[V];
    float lp, top_lp[V];
    double ref[V], total = 0.0;
    assert_int_equal(ls_sampling_sample(&tok, &lp, top_ids, top_lp, logits, &batch, V), 0);
    s_log_softmax(ref, processed, V, 1.0);
    // the top-n list is the whole vocabulary here: sorted, exact, summing to 1
    const int32_t order[V] = {0, 1, 4, 3, 5, 2};
    for (int i = 0; i < V; i++) {
        assert_int_equal(top_ids[i], order[i]);
        assert_true(fabs(top_lp[i] - ref[order[i]]) <= 1e-6);
        total += exp(top_lp[i]);
    }
    assert_true(fabs(total - 1.0) <= 1e-6);
    assert_true(fabs(lp - ref[tok]) <= 1e-6);

    // the same row without history: only the temperature acts
    ls_sampling_batch_t bare = {.n_rows = 1, .max_top_n = V, .params = &sp};
    assert_int_equal(ls_sampling_sample(&tok, &lp, top_ids, top_lp, logits, &bare, V), 0);
    s_log_softmax(ref, logits, V, 2.0);
    assert_int_equal(top_ids[0], 3);
    assert_true(fabs(top_lp[0] - ref[3]) <= 1e-6);
}

// A batch of rows with different parameters gives what each row gives alone; top-n
// entries past a row's n_logprobs are left untouched.
static void test_batch_rows_independent(void **state) {
    enum { V = 300, R = 4, TOPN = 5 };
    t_rng_t r = {22};
    float logits[R * V], lps[R], top_lp[R * TOPN];
    int32_t toks[R], top_ids[R * TOPN];
    ls_sampling_params_t sp[R] = {s_params(0.0f, 1, 0), s_params(1.0f, 2, 7),
                                  s_params(0.5f, 3, 1), s_params(1.3f, 4, 2)};
    sp[1].top_k = 20, sp[2].top_p = 0.8f, sp[3].min_p = 0.05f;
    sp[0].n_logprobs = 5, sp[1].n_logprobs = 2;
    t_fill(&r, logits, R * V, -5, 5);
    for (int i = 0; i < R * TOPN; i++)
        top_ids[i] = -7;
    ls_sampling_batch_t batch = {.n_rows = R, .max_top_n = TOPN, .params = sp};
    assert_int_equal(ls_sampling_sample(toks, lps, top_ids, top_lp, logits, &batch, V), 0);
    for (int i = 0; i < R; i++) {
        float lp;
        assert_int_equal(toks[i], s_sample1(logits + i * V, V, &sp[i], &lp));
        assert_true(lps[i] == lp);
        for (int j = sp[i].n_logprobs; j < TOPN; j++)
            assert_int_equal(top_ids[i * TOPN + j], -7);
    }
    assert_true(top_ids[0] == toks[0]); // greedy row: the top entry is the chosen token
}

// A grammar mask (ops.h step 0): greedy and seeded rows pick allowed tokens only, and the
// logprob is normalized over the allowed tokens; an unmasked row beside it is unaffected.
static void test_mask(void **state) {
    (void)state;
    enum { V = 70 };
    float logits[2 * V];
    for (int v = 0; v < V; v++)
        logits[v] = logits[V + v] = (float)(v % 7) - (v == 5 ? -10.0f : 0.0f);  // 5 is the best
    uint32_t mask[3] = {0};
    for (int v = 40; v < 70; v += 3)
        mask[v >> 5] |= 1u << (v & 31);
    for (int seeded = 0; seeded < 2; seeded++) {
        ls_sampling_params_t sp[2] = {s_params(seeded ? 1.0f : 0.0f, 7, 3), s_params(seeded ? 1.0f : 0.0f, 7, 3)};
        int32_t index[2] = {0, -1}, tok[2];
        float lp[2];
        ls_sampling_batch_t b = {.n_rows = 2, .params = sp, .mask_index = index, .masks = mask};
        for (int trial = 0; trial < 50; trial++) {
            sp[0].step = sp[1].step = (uint64_t)trial;
            assert_int_equal(ls_sampling_sample(tok, lp, NULL, NULL, logits, &b, V), 0);
            assert_true(tok[0] >= 40 && (tok[0] - 40) % 3 == 0);
            ls_sampling_batch_t bare = {.n_rows = 1, .params = &sp[1]};
            int32_t alone;
            assert_int_equal(ls_sampling_sample(&alone, NULL, NULL, NULL, logits + V, &bare, V), 0);
            assert_int_equal(tok[1], alone);
            if (!seeded)
                assert_int_equal(tok[1], 5);
            // the logprob over the allowed tokens only
            double sum = 0;
            for (int v = 40; v < 70; v += 3)
                sum += exp(logits[v] - logits[tok[0]]);
            assert_float_equal(lp[0], -log(sum), 1e-5);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_seeded_draws),
        cmocka_unit_test(test_distribution),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_penalties_and_logprobs),
        cmocka_unit_test(test_batch_rows_independent),
        cmocka_unit_test(test_mask),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
