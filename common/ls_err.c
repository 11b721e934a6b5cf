// ls_err — see ls_err.h.
#include "ls_err.h"

#include <stdarg.h>
#include <stdio.h>

void ls_err_set(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}
