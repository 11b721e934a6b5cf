/*  msg_seeds — write a small fuzz seed corpus: a few encoded random messages of every
    type, one per file, into the directory given (created if needed).
*/
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "ls_msg.h"

int
main (int argc, char **argv)
{
    if (argc != 2) {
        fprintf (stderr, "usage: msg_seeds DIR\n");
        return 2;
    }
    if (mkdir (argv [1], 0755) && errno != EEXIST) {
        perror (argv [1]);
        return 1;
    }
    for (int type = 1; type <= LS_MSG_TYPE_MAX; type++) {
        for (uint64_t seed = 0; seed < 3 && ls_msg_type_name (type); seed++) {
            ls_msg_t m;
            //  seed 0 is the all-zero message; the others fill every field
            if (seed)
                ls_msg_fill_random (&m, type, seed);
            else
                ls_msg_init (&m, type);
            char *buf, path [4096];
            size_t len;
            snprintf (path, sizeof path, "%s/seed-%s-%llu", argv [1], ls_msg_type_name (type),
                      (unsigned long long) seed);
            FILE *file = fopen (path, "wb");
            if (!file || ls_msg_encode (&m, &buf, &len) || fwrite (buf, 1, len, file) != len) {
                perror (path);
                return 1;
            }
            fclose (file);
            free (buf);
            ls_msg_clear (&m);
        }
    }
    return 0;
}
