// ls_file: the one opener of model and adapter files, and the loaders that go through it.
//   names     — absolute names and "..", "." or empty components are refused
//   links     — a link as the file or as a directory on the way is refused, even one that
//               stays inside; the loaders (config.json, tokenizer.json, safetensors) refuse too
//   kinds     — FIFOs (at once: main's alarm fails a blocked open), devices and directories
//   sizes     — each kind's limit, checked on sparse files before anything is read
//   normal    — a regular file inside a subdirectory reads back exactly
#include "fixtures.h"

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "test_util.h"

#include "chat_template.h"
#include "ls_file.h"
#include "model_config.h"
#include "safetensors.h"
#include "tokenizer.h"

static char errbuf[1024];

// Expects ls_file_read(dir, name) to fail with errno want_errno and a message holding frag.
static void s_refused(const char *dir, const char *name, ls_file_kind_t kind, int want_errno,
                      const char *frag)
{
    size_t len;
    errno = 0;
    char *text = ls_file_read(dir, name, kind, &len, errbuf, sizeof errbuf);
    if (text)
        fail_msg("%s/%s was read", dir, name);
    assert_int_equal(errno, want_errno);
    assert_contains(errbuf, frag);
}

static void s_sparse(const char *dir, const char *name, uint64_t size)
{
    char p[4096];
    int fd = open(fx_path(p, sizeof p, dir, name), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    close(fd);
}

static void test_names(void **state)
{
    (void)state;
    char *dir = fx_tmpdir();
    fx_write_str(dir, "x.json", "{}");
    s_refused(dir, "/etc/passwd", LS_FILE_JSON, EINVAL, "not a relative file name");
    s_refused(dir, "", LS_FILE_JSON, EINVAL, "not a relative file name");
    s_refused(dir, "../x.json", LS_FILE_JSON, EINVAL, "\"..\" components are not allowed");
    s_refused(dir, "./x.json", LS_FILE_JSON, EINVAL, "\"..\" components are not allowed");
    s_refused(dir, "a//x.json", LS_FILE_JSON, EINVAL, "\"..\" components are not allowed");
    s_refused(dir, "missing.json", LS_FILE_JSON, ENOENT, "missing.json: cannot open");
    s_refused("/nonexistent/dir", "x.json", LS_FILE_JSON, ENOENT, "/nonexistent/dir/x.json");
    fx_rmdir(&dir);
}

static void test_links(void **state)
{
    (void)state;
    char p[4096], q[4096];
    char *dir = fx_tmpdir(), *outside = fx_tmpdir();
    fx_write_str(outside, "config.json", "{}");
    fx_write_str(dir, "real.json", "{}");
    assert_int_equal(symlink(fx_path(q, sizeof q, outside, "config.json"),
                             fx_path(p, sizeof p, dir, "out.json")), 0);
    assert_int_equal(symlink("real.json", fx_path(p, sizeof p, dir, "in.json")), 0);
    assert_int_equal(symlink(outside, fx_path(p, sizeof p, dir, "sub")), 0);
    s_refused(dir, "out.json", LS_FILE_JSON, ELOOP, "\"out.json\" is a symbolic link");
    s_refused(dir, "in.json", LS_FILE_JSON, ELOOP, "\"in.json\" is a symbolic link");
    s_refused(dir, "sub/config.json", LS_FILE_JSON, ELOOP, "\"sub\" is a symbolic link");
    // The loaders: a model directory whose config.json, tokenizer.json, tokenizer_config.json
    // or model.safetensors is a link out of it does not load.
    const char *names[] = {"config.json", "tokenizer.json", "tokenizer_config.json",
                           "model.safetensors"};
    for (int i = 0; i < 4; i++)
        assert_int_equal(symlink(fx_path(q, sizeof q, outside, "config.json"),
                                 fx_path(p, sizeof p, dir, names[i])), 0);
    ls_model_config_t cfg;
    assert_int_equal(ls_model_config_load(dir, &cfg, errbuf, sizeof errbuf), -1);
    assert_contains(errbuf, "\"config.json\" is a symbolic link");
    assert_null(ls_tokenizer_load(fx_path(p, sizeof p, dir, "tokenizer.json"), errbuf, sizeof errbuf));
    assert_contains(errbuf, "\"tokenizer.json\" is a symbolic link");
    assert_null(ls_chat_template_load(dir, NULL, errbuf, sizeof errbuf));
    assert_contains(errbuf, "\"tokenizer_config.json\" is a symbolic link");
    assert_null(ls_st_open(dir, errbuf, sizeof errbuf));
    assert_contains(errbuf, "\"model.safetensors\" is a symbolic link");
    fx_rmdir(&dir);
    fx_rmdir(&outside);
}

static void test_kinds(void **state)
{
    (void)state;
    char p[4096];
    char *dir = fx_tmpdir();
    assert_int_equal(mkfifo(fx_path(p, sizeof p, dir, "fifo.json"), 0644), 0);
    s_refused(dir, "fifo.json", LS_FILE_JSON, EINVAL, "fifo.json: is a FIFO; only regular files are read");
    s_refused("/dev", "null", LS_FILE_JSON, EINVAL, "/dev/null: is a character device");
    s_refused("/dev", "zero", LS_FILE_SAFETENSORS, EINVAL, "/dev/zero: is a character device");
    s_refused("/", "tmp", LS_FILE_JSON, EINVAL, "is a directory");
    // The safetensors reader takes a path: a FIFO there is refused the same way.
    assert_null(ls_st_open(p, errbuf, sizeof errbuf));
    assert_contains(errbuf, "is a FIFO");
    fx_rmdir(&dir);
}

static void test_sizes(void **state)
{
    (void)state;
    char p[4096];
    char *dir = fx_tmpdir();
    const ls_file_kind_t kinds[] = {LS_FILE_JSON, LS_FILE_TOKENIZER, LS_FILE_SAFETENSORS};
    for (int i = 0; i < 3; i++) {
        uint64_t limit = ls_file_limit(kinds[i]);
        uint64_t size;
        s_sparse(dir, "at", limit);
        int fd = ls_file_open(dir, "at", kinds[i], &size, errbuf, sizeof errbuf);
        assert_true(fd >= 0);
        assert_true(size == limit);
        close(fd);
        s_sparse(dir, "over", limit + 1);
        assert_int_equal(ls_file_open(dir, "over", kinds[i], &size, errbuf, sizeof errbuf), -1);
        assert_int_equal(errno, EFBIG);
        assert_contains(errbuf, "-byte limit for this file");
    }
    // Through the loaders: a 1 TB sparse tokenizer.json or model.safetensors is refused at once.
    s_sparse(dir, "tokenizer.json", (uint64_t)1 << 40);
    assert_null(ls_tokenizer_load(fx_path(p, sizeof p, dir, "tokenizer.json"), errbuf, sizeof errbuf));
    assert_contains(errbuf, "larger than the 67108864-byte limit");
    s_sparse(dir, "model.safetensors", (uint64_t)1 << 40);
    assert_null(ls_st_open(dir, errbuf, sizeof errbuf));
    assert_contains(errbuf, "model.safetensors: 1099511627776 bytes, larger than");
    fx_rmdir(&dir);
}

static void test_normal(void **state)
{
    (void)state;
    char p[4096];
    char *dir = fx_tmpdir();
    assert_int_equal(mkdir(fx_path(p, sizeof p, dir, "sub"), 0755), 0);
    static const char body[] = "{\"a\": \"b\\u0000c\"}\n\0tail";
    assert_int_equal(fx_write(dir, "sub/x.json", body, sizeof body), 0);
    size_t len;
    char *text = ls_file_read(dir, "sub/x.json", LS_FILE_JSON, &len, errbuf, sizeof errbuf);
    assert_non_null(text);
    assert_int_equal(len, sizeof body);
    assert_memory_equal(text, body, sizeof body);
    assert_int_equal(text[len], 0);
    free(text);
    text = ls_file_read_path(fx_path(p, sizeof p, dir, "sub/x.json"), LS_FILE_JSON, &len, errbuf,
                             sizeof errbuf);
    assert_non_null(text);
    assert_int_equal(len, sizeof body);
    free(text);
    fx_rmdir(&dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names), cmocka_unit_test(test_links), cmocka_unit_test(test_kinds),
        cmocka_unit_test(test_sizes), cmocka_unit_test(test_normal),
    };
    alarm(60);  // a blocked open is a failure, not a stuck CI job
    return cmocka_run_group_tests(tests, NULL, NULL);
}
