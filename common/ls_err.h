// ls_err — the project's one way to report an error: a sentence into the caller's buffer.
// Engine functions take (char *err, size_t errlen) and fill it on failure; err may be NULL.
#ifndef LS_ERR_H
#define LS_ERR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

void ls_err_set(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#ifdef __cplusplus
}
#endif

#endif
