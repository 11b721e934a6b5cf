// test_prom — the Prometheus text format (0.0.4) parsed as a Prometheus client parses it, for the
// tests that scrape /metrics: families and their TYPE lines, samples with their labels and
// escapes. A page that breaks the format fails the test (cmocka) with the line: a second TYPE
// line, a TYPE line after its samples, a family split (its samples not together), a label
// twice, a bad escape or value. tp_check_histograms adds the histogram invariants.
#ifndef LS_TEST_PROM_H
#define LS_TEST_PROM_H

#include <stdbool.h>

#define TP_MAX_LABELS 4

typedef struct {
    char name[128];
    char label[TP_MAX_LABELS][2][1024];  // name, value (unescaped)
    int nlabels;
    double value;
} tp_sample_t;

typedef struct tp_page tp_page_t;

tp_page_t *tp_page_new(void);
void tp_page_destroy(tp_page_t **p);

// Parses text into p (what p held before is dropped); fails the test where the format breaks.
void tp_parse(tp_page_t *p, const char *text);

int tp_count(const tp_page_t *p);
const tp_sample_t *tp_sample(const tp_page_t *p, int i);
// The family's TYPE ("" when it has none), or NULL when the page has no such family.
const char *tp_type(const tp_page_t *p, const char *family);
// A sample's label value; fails the test when it has no such label.
const char *tp_label(const tp_sample_t *s, const char *name);
// The value of a label when the sample has it, else NULL.
const char *tp_label_or_null(const tp_sample_t *s, const char *name);
// The one sample of a gauge family; fails unless the family is a gauge with exactly one.
const tp_sample_t *tp_only(const tp_page_t *p, const char *name);

// Every histogram family: each series (its labels but le) has buckets with le ascending and
// counts that never go down, a +Inf bucket equal to its _count, a _sum that is not negative
// (and positive with a count), and nothing else. Fails the test otherwise.
void tp_check_histograms(const tp_page_t *p);

// The _count and _sum of the series of histogram `family` whose label `label` is `value`; false
// when the page has no such series.
bool tp_histogram(const tp_page_t *p, const char *family, const char *label, const char *value, double *count,
                  double *sum);

#endif
