// Prometheus text exposition, read back: the server's /metrics before and after a run, so the
// report can give what the counters moved by (adapter loads and the like).
#ifndef BS_PROM_H
#define BS_PROM_H

#include <stdbool.h>
#include <stddef.h>

typedef struct bs_prom_t bs_prom_t;

// Every sample line of text: the series (name and labels, as written) and its value. Comments,
// blank lines and lines that are not samples are skipped. NULL when out of memory.
bs_prom_t *bs_prom_parse(const char *text, size_t n);
void bs_prom_destroy(bs_prom_t **pp);

size_t bs_prom_size(const bs_prom_t *p);
const char *bs_prom_series(const bs_prom_t *p, size_t i);  // e.g. loraserve_adapter_cold_loads{actor="scheduler"}
double bs_prom_value(const bs_prom_t *p, size_t i);
// Whether the series' metric was declared a gauge ("# TYPE NAME gauge"): a level, not a count.
bool bs_prom_is_gauge(const bs_prom_t *p, const char *series);
// The value of a series, 0 when present, -1 when not.
int bs_prom_get(const bs_prom_t *p, const char *series, double *value);
// The length of the metric name at the start of a series (before its labels).
size_t bs_prom_name_len(const char *series);

#endif
