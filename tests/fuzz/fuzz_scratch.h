/*  fuzz_scratch.h — a private scratch directory for the fuzz targets whose input is a file
    (safetensors, adapter_config.json): tmpfs when there is one, removed at exit.
*/
#ifndef LS_FUZZ_SCRATCH_H
#define LS_FUZZ_SCRATCH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char s_scratch [64];

static void
s_scratch_remove (void)
{
    char cmd [128];
    snprintf (cmd, sizeof cmd, "rm -rf '%s'", s_scratch);
    if (s_scratch [0] && system (cmd) != 0)
        fprintf (stderr, "fuzz: could not remove %s\n", s_scratch);
}

//  The directory, created on first use.
static const char *
s_scratch_dir (void)
{
    if (!s_scratch [0]) {
        snprintf (s_scratch, sizeof s_scratch, "%s/ls-fuzz-XXXXXX",
                  access ("/dev/shm", W_OK) == 0? "/dev/shm": "/tmp");
        if (!mkdtemp (s_scratch))
            abort ();
        atexit (s_scratch_remove);
    }
    return s_scratch;
}

//  Writes data to scratch/name; the path into path (cap bytes).
static void
s_scratch_write (const char *name, const void *data, size_t size, char *path, size_t cap)
{
    snprintf (path, cap, "%s/%s", s_scratch_dir (), name);
    FILE *f = fopen (path, "wb");
    if (!f || (size && fwrite (data, 1, size, f) != size) || fclose (f) != 0)
        abort ();
}

#endif
