// ls_curve — CURVE security (libzmq's own) for the actors' tcp sockets.
//
// The launcher makes one keypair per actor, one for itself and one for clients (the SDK) in
// RUN_DIR/keys (mode 0700): public/<name>.pub (zcert format, public key only) and
// secret/<name>.key (mode 0600, both keys). An actor gets the directory's path
// (--curve-dir), never a key on its command line. On tcp endpoints every ROUTER is a CURVE
// server that accepts only the clients whose public key is in public/ (a ZAP handler, czmq's
// zauth), and every DEALER is a CURVE client that knows its server's public key: a peer
// without a key of the graph cannot even finish the handshake. ipc endpoints stay as they
// are; their directory's mode (0700) keeps other users out.
#ifndef LS_CURVE_H
#define LS_CURVE_H

#include <czmq.h>
#include <stddef.h>

typedef struct ls_curve ls_curve_t;

// Loads DIR/secret/<name>.key and starts the authenticator over DIR/public. NULL + err when
// the directory or the key is missing, or readable by other users.
ls_curve_t *ls_curve_new(const char *dir, const char *name, char *err, size_t errlen);
void ls_curve_destroy(ls_curve_t **self_p);
// Before bind: a CURVE server with this actor's key.
void ls_curve_server(ls_curve_t *self, zsock_t *sock);
// Before connect: a CURVE client of `peer` (its DIR/public/<peer>.pub). -1 + err without it.
int ls_curve_client(ls_curve_t *self, zsock_t *sock, const char *peer, char *err, size_t errlen);

// The launcher: a fresh keypair for each name in DIR (made 0700, keys 0600). 0, or -1 + err.
int ls_curve_make(const char *dir, const char *const *names, int n, char *err, size_t errlen);
// The endpoint is tcp:// (the sockets CURVE applies to).
int ls_curve_wanted(const char *endpoint);

#endif
