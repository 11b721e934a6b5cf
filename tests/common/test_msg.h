// test_msg — a test speaking loraserve messages on a raw czmq socket, as a client or a fake
// actor would: one encoded body per ZeroMQ message (docs/messages.md).
#ifndef LS_TEST_MSG_H
#define LS_TEST_MSG_H

#include <czmq.h>

#include "ls_msg.h"

// Encodes m and sends it on a DEALER. 0, or -1 when it cannot be encoded or sent.
int tm_send(zsock_t *s, const ls_msg_t *m);
// Receives the next message on a DEALER into m. 0, or -1 on timeout (the socket's rcvtimeo)
// or an undecodable body.
int tm_recv(zsock_t *s, ls_msg_t *m);

#endif
