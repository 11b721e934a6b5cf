// ls_series — which adapters have metric series of their own. A series per adapter name would
// grow without bound (thousands of adapters, clients naming any string), so the set is capped:
// the base model always has its series, at most `max` adapters have one each, and the rest
// share one labelled "other". When a new adapter needs a series and every one is taken, the
// least recently used adapter gives its series up: the caller folds that series' data into
// "other" (so each family's sum over its series never goes back), and the index is the new
// adapter's. An adapter that leaves (unloaded) is folded the same way. An adapter named
// "other" is counted under "other". The policy is in docs/operations.md ("Metrics"); the cap's
// default is LS_DEFAULT_METRICS_MAX_ADAPTERS (ls_limits.h).
//
// Callers keep their data in arrays of ls_series_slots() entries indexed by the series; the
// order of calls decides everything (no clock), so a replayed actor keeps the same series.
#ifndef LS_SERIES_H
#define LS_SERIES_H

#define LS_SERIES_BASE 0   // the base model's series: label ""
#define LS_SERIES_OTHER 1  // the adapters without one of their own

typedef struct ls_series ls_series_t;

// max: adapters with a series of their own (>= 0). NULL when out of memory.
ls_series_t *ls_series_new(int max);
void ls_series_destroy(ls_series_t **p);

// Entries of the caller's arrays: the base's, "other"'s and max adapters'.
int ls_series_slots(const ls_series_t *s);

// The series of adapter `name` ("" or NULL: the base model), made its own if it has none, and
// marked most recently used. *fold is -1, or the index whose data the caller adds into
// LS_SERIES_OTHER and clears before using the returned index (the same one).
int ls_series_take(ls_series_t *s, const char *name, int *fold);

// Adapter `name` leaves: its index, whose data the caller folds into LS_SERIES_OTHER (the
// index is free again), or -1 when it had no series of its own.
int ls_series_drop(ls_series_t *s, const char *name);

// The adapter of a series: "" for the base, "other", the adapter's name, or NULL for an index
// no adapter holds.
const char *ls_series_name(const ls_series_t *s, int i);

#endif
