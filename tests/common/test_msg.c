// test_msg — see test_msg.h.
#include "test_msg.h"

int tm_send(zsock_t *s, const ls_msg_t *m) {
    char *buf;
    size_t len;
    if (ls_msg_encode(m, &buf, &len) < 0)
        return -1;
    int rc = zsock_send(s, "b", buf, len);
    free(buf);
    return rc;
}

int tm_recv(zsock_t *s, ls_msg_t *m) {
    zframe_t *f = zframe_recv(s);
    if (!f)
        return -1;
    int rc = ls_msg_decode(zframe_data(f), zframe_size(f), m, NULL);
    zframe_destroy(&f);
    return rc;
}
