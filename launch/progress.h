// progress — the launcher's console while the model and adapters load: from each actor's
// LoadProgress, a line like
//     worker-0: loading weights 1.2/16.1 GB (7%), 850 MB/s
// updated in place on a terminal (at most every PROGRESS_TTY_MS, a newline once done), and as
// lines of their own elsewhere (a log file, a pipe): the first, one per tenth more or every
// PROGRESS_PIPE_S seconds, and the last (100%). The rate is the bytes since the load's first
// message over the time since, on the launcher's clock. Pure: no sockets; the time comes in.
#ifndef LS_LAUNCH_PROGRESS_H
#define LS_LAUNCH_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define PROGRESS_TTY_MS 250
#define PROGRESS_PIPE_S 5

typedef struct progress progress_t;

// Lines go to out; tty: it is a terminal (lines updated in place). NULL when out of memory.
progress_t *progress_new(FILE *out, bool tty);
void progress_destroy(progress_t **p);

// One LoadProgress of actor (a name the launcher knows) at now_ns: what loads ("weights",
// "adapter NAME"; shown with anything but printable ASCII as '?', at most 64 characters), bytes
// done and in all (0: not known yet, a start). -1 for one out of range (done past total, or
// bytes done of an unknown total), which changes nothing. A load whose bytes go back starts
// over (its actor was restarted).
int progress_note(progress_t *p, const char *actor, const char *what, uint64_t done, uint64_t total, uint64_t now_ns);

// A line left open on the terminal ends here (a newline), so that what the caller prints next
// starts a line of its own; the load's next update starts a new one.
void progress_break(void *p);

#endif
