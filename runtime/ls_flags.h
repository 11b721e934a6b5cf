// ls_flags — configuration from command-line flags, declared as a table.
//
//   static ls_flag_t flags[] = {
//       LS_FLAG_INT("max-running-requests", &cfg.max_running, "256", "requests decoded at once"),
//       LS_FLAG_END,
//   };
//
// Accepted forms: `--name value`, `--name=value`, `--flag` for booleans, and for lists
// `--name a b c` (values up to the next `--…`) or the flag repeated. Every flag has a default
// (applied before parsing) and a help line; `--help` prints them all.
#ifndef LS_FLAGS_H
#define LS_FLAGS_H

#include <stddef.h>

typedef enum { LS_FLAG_KIND_INT, LS_FLAG_KIND_DOUBLE, LS_FLAG_KIND_STR, LS_FLAG_KIND_BOOL,
               LS_FLAG_KIND_LIST } ls_flag_kind_t;

// A list flag's values: owned strings.
typedef struct {
    char **v;
    size_t n;
} ls_strlist_t;

typedef struct {
    const char *name;   // without the leading "--"; NULL ends a table
    ls_flag_kind_t kind;
    void *ptr;          // int *, double *, char ** (owned), int * (bool), ls_strlist_t *
    const char *def;    // default as text; NULL means unset (string NULL, empty list)
    const char *help;
} ls_flag_t;

#define LS_FLAG_INT(n, p, d, h) {(n), LS_FLAG_KIND_INT, (p), (d), (h)}
#define LS_FLAG_DOUBLE(n, p, d, h) {(n), LS_FLAG_KIND_DOUBLE, (p), (d), (h)}
#define LS_FLAG_STR(n, p, d, h) {(n), LS_FLAG_KIND_STR, (p), (d), (h)}
#define LS_FLAG_BOOL(n, p, h) {(n), LS_FLAG_KIND_BOOL, (p), "0", (h)}
#define LS_FLAG_LIST(n, p, h) {(n), LS_FLAG_KIND_LIST, (p), NULL, (h)}
#define LS_FLAG_END {NULL, 0, NULL, NULL, NULL}

// Apply defaults, then parse argv[1..] against the tables (NULL-terminated array of tables,
// so the runtime's common flags and an actor's own flags parse in one pass). Returns 0, 1 when
// --help was printed (caller exits 0), or -1 with a message in err for a bad or unknown flag.
int ls_flags_parse(ls_flag_t *const *tables, int argc, char **argv, char *err, size_t errlen);
// Print every flag of the tables with its default and help.
void ls_flags_usage(ls_flag_t *const *tables, const char *prog, const char *about);
// Free the strings and lists the parser allocated.
void ls_flags_free(ls_flag_t *const *tables);

#endif
