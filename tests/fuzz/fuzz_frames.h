/*  fuzz_frames.h — the targets that send an actor ZeroMQ messages (actor_inbound, actor_*) take
    the frames from their input the same way: split at each "\xff\xfe". Include it after
    defining _GNU_SOURCE (memmem).
*/
#ifndef LS_FUZZ_FRAMES_H
#define LS_FUZZ_FRAMES_H

#include <czmq.h>
#include <stdint.h>
#include <string.h>

//  Splits [p, end) at each "\xff\xfe" and appends the pieces to zm as frames (at most 8).
static inline void fuzz_frames_add(zmsg_t *zm, const uint8_t *p, const uint8_t *end) {
    for (int frames = 0; frames < 8; frames++) {
        const uint8_t *sep = memmem(p, (size_t)(end - p), "\xff\xfe", 2);
        const uint8_t *stop = sep ? sep : end;
        zmsg_addmem(zm, p, (size_t)(stop - p));
        if (!sep)
            break;
        p = sep + 2;
    }
}

#endif
