// ls_curve — CURVE keys and sockets (see ls_curve.h).
#include "ls_curve.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct ls_curve {
    char *dir;
    zcert_t *cert;  // this actor's keypair
    zactor_t *auth; // the ZAP handler: clients' public keys must be in DIR/public
};

// A directory or file only its owner (this user) may read.
static int s_private(const char *path, int want_dir, char *err, size_t errlen) {
    struct stat st;
    if (stat(path, &st) < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (want_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s is not a %s", path, want_dir ? "directory" : "regular file");
        return -1;
    }
    if ((st.st_mode & 077) || st.st_uid != geteuid()) {
        snprintf(err, errlen, "%s is open to other users (mode %03o): keys must be the owner's alone (0%s)", path,
                 st.st_mode & 0777, want_dir ? "700" : "600");
        return -1;
    }
    return 0;
}

int ls_curve_wanted(const char *endpoint) { return endpoint && strncmp(endpoint, "tcp://", 6) == 0; }

ls_curve_t *ls_curve_new(const char *dir, const char *name, char *err, size_t errlen) {
    if (!zsys_has_curve()) {
        snprintf(err, errlen, "this libzmq has no CURVE support");
        return NULL;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/secret/%s.key", dir, name);
    if (s_private(dir, 1, err, errlen) < 0 || s_private(path, 0, err, errlen) < 0)
        return NULL;
    ls_curve_t *self = calloc(1, sizeof *self);
    if (!self || !(self->dir = strdup(dir)) || !(self->cert = zcert_load(path))) {
        snprintf(err, errlen, "cannot read the key %s", path);
        ls_curve_destroy(&self);
        return NULL;
    }
    snprintf(path, sizeof path, "%s/public", dir);
    if (!(self->auth = zactor_new(zauth, NULL)) || zstr_sendx(self->auth, "CURVE", path, NULL) < 0 ||
        zsock_wait(self->auth) < 0) {
        snprintf(err, errlen, "cannot start the CURVE authenticator over %s", path);
        ls_curve_destroy(&self);
        return NULL;
    }
    return self;
}

void ls_curve_destroy(ls_curve_t **self_p) {
    if (!self_p || !*self_p)
        return;
    ls_curve_t *self = *self_p;
    zactor_destroy(&self->auth);
    zcert_destroy(&self->cert);
    free(self->dir);
    free(self);
    *self_p = NULL;
}

void ls_curve_server(ls_curve_t *self, zsock_t *sock) {
    zcert_apply(self->cert, sock);
    zsock_set_curve_server(sock, 1);
    zsock_set_zap_domain(sock, "loraserve");
}

int ls_curve_client(ls_curve_t *self, zsock_t *sock, const char *peer, char *err, size_t errlen) {
    char path[4096];
    snprintf(path, sizeof path, "%s/public/%s.pub", self->dir, peer);
    zcert_t *server = zcert_load(path);
    if (!server) {
        snprintf(err, errlen, "no public key for %s (%s)", peer, path);
        return -1;
    }
    zcert_apply(self->cert, sock);
    zsock_set_curve_serverkey(sock, zcert_public_txt(server));
    zcert_destroy(&server);
    return 0;
}

static int s_mkdir_private(const char *path, char *err, size_t errlen) {
    if (mkdir(path, 0700) < 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
        return -1;
    }
    if (chmod(path, 0700) < 0) {
        snprintf(err, errlen, "cannot make %s private: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

int ls_curve_make(const char *dir, const char *const *names, int n, char *err, size_t errlen) {
    char pub[4096], sec[4096];
    snprintf(pub, sizeof pub, "%s/public", dir);
    snprintf(sec, sizeof sec, "%s/secret", dir);
    if (s_mkdir_private(dir, err, errlen) < 0 || s_mkdir_private(pub, err, errlen) < 0 ||
        s_mkdir_private(sec, err, errlen) < 0)
        return -1;
    // The secret files are created 0600 from the start, never readable by others for a moment.
    mode_t old = umask(077);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        zcert_t *cert = zcert_new();
        snprintf(pub, sizeof pub, "%s/public/%s.pub", dir, names[i]);
        snprintf(sec, sizeof sec, "%s/secret/%s.key", dir, names[i]);
        unlink(sec);  // a key left by an earlier run is replaced, never reused
        if (!cert || zcert_save_public(cert, pub) < 0 || zcert_save_secret(cert, sec) < 0 || chmod(sec, 0600) < 0) {
            snprintf(err, errlen, "cannot write the keys of %s in %s: %s", names[i], dir, strerror(errno));
            rc = -1;
        }
        zcert_destroy(&cert);
    }
    umask(old);
    return rc;
}
