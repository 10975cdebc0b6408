/* test_incident.c — unit tests for proxy/incident.c: records land in order, logrotate
 * (rename + reopen), an unwritable or full file is counted and never stalls, a stalled disk
 * never blocks submitters, concurrent submitters lose nothing, close flushes, oversized
 * records are cut, torn lines are repaired and the recent ring keeps the newest. The .c
 * is included to reach its queue capacity. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "../../proxy/incident.c"

#include <pthread.h>
#include <sys/stat.h>

/* A fresh empty directory under /tmp; malloc'd path. */
static char *temp_dir(void)
{
    char *d = strdup("/tmp/lg_test_incident_XXXXXX");
    assert_non_null(d);
    assert_non_null(mkdtemp(d));
    return d;
}

static char *path_in(const char *dir, const char *name)
{
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    assert_non_null(p);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

/* A log on dir/inc.jsonl in a fresh temporary dir (both paths malloc'd for rm_dir). */
static incident_log *open_in_temp(char **dir, char **path, unsigned recent, size_t max)
{
    char err[256] = "";
    *dir = temp_dir();
    *path = path_in(*dir, "inc.jsonl");
    incident_log *l = incident_log_open(*path, recent, max, err, sizeof err);
    if (!l) fail_msg("%s", err);
    return l;
}

static char *record(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *record(const char *fmt, ...)
{
    va_list ap;
    char *s;
    va_start(ap, fmt);
    assert_true(vasprintf(&s, fmt, ap) >= 0);
    va_end(ap);
    return s;
}

/* The whole file as a string ("" when missing). */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t len = 0;
    if (!f) return strdup("");
    FILE *m = open_memstream(&buf, &len);
    assert_non_null(m);
    int c;
    while ((c = fgetc(f)) != EOF)
        fputc(c, m);
    fclose(m);
    fclose(f);
    return buf;
}

static size_t count_lines(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

static void rm_dir(char *dir, char **files, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unlink(files[i]);
        free(files[i]);
    }
    rmdir(dir);
    free(dir);
}

static void test_records_land_in_order(void **state)
{
    (void)state;
    char *dir, *path;
    incident_log *l = open_in_temp(&dir, &path, 10, 65536);
    for (int i = 0; i < 200; i++)
        incident_log_submit(l, record("{\"id\":%d}", i));
    incident_log_flush(l);
    incident_stats st;
    incident_log_stats(l, &st);
    assert_int_equal(st.submitted, 200);
    assert_int_equal(st.written, 200);
    assert_int_equal(st.dropped + st.write_errors, 0);
    char *text = slurp(path);
    char *want = NULL;
    size_t wlen = 0;
    FILE *m = open_memstream(&want, &wlen);
    for (int i = 0; i < 200; i++)
        fprintf(m, "{\"id\":%d}\n", i);
    fclose(m);
    assert_string_equal(text, want);
    free(text);
    free(want);
    incident_log_close(l);
    rm_dir(dir, (char *[]){path}, 1);
}

static void test_reopen_after_rename(void **state)
{
    (void)state;
    char *dir, *path;
    incident_log *l = open_in_temp(&dir, &path, 0, 65536);
    char *old = path_in(dir, "inc.jsonl.1");
    incident_log_submit(l, record("{\"id\":\"before\"}"));
    incident_log_flush(l);
    assert_int_equal(rename(path, old), 0); /* logrotate */
    incident_log_reopen(l);
    incident_log_submit(l, record("{\"id\":\"after\"}"));
    incident_log_flush(l);
    char *a = slurp(old), *b = slurp(path);
    assert_string_equal(a, "{\"id\":\"before\"}\n");
    assert_string_equal(b, "{\"id\":\"after\"}\n");
    free(a);
    free(b);
    incident_stats st;
    incident_log_stats(l, &st);
    assert_int_equal(st.reopens, 1);
    assert_int_equal(st.written, 2);
    incident_log_close(l);
    rm_dir(dir, (char *[]){path, old}, 2);
}

static void test_unopenable_path_fails_open(void **state)
{
    (void)state;
    char err[256] = "";
    assert_null(incident_log_open("/nonexistent-dir/x/inc.jsonl", 10, 65536, err, sizeof err));
    assert_non_null(strstr(err, "/nonexistent-dir/x/inc.jsonl"));
}

/* /dev/full: every write fails with ENOSPC; counted, and flush still returns. */
static void test_full_disk_counted(void **state)
{
    (void)state;
    char err[256] = "";
    incident_log *l = incident_log_open("/dev/full", 5, 65536, err, sizeof err);
    assert_non_null(l);
    for (int i = 0; i < 20; i++)
        incident_log_submit(l, record("{\"id\":%d}", i));
    incident_log_flush(l);
    incident_stats st;
    incident_log_stats(l, &st);
    assert_int_equal(st.submitted, 20);
    assert_int_equal(st.written, 0);
    assert_int_equal(st.write_errors, 20);
    char *recent = incident_log_recent_json(l); /* still shown */
    assert_string_equal(recent, "[{\"id\":15},{\"id\":16},{\"id\":17},{\"id\":18},{\"id\":19}]");
    free(recent);
    incident_log_close(l);
}

/* The directory disappears: the reopen fails, records are counted as write errors; once it
 * is back the writer recovers on its own after the back-off. */
static void test_unwritable_then_recovers(void **state)
{
    (void)state;
    char *dir, *path;
    incident_log *l = open_in_temp(&dir, &path, 0, 65536);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(dir), 0);
    incident_log_reopen(l);
    for (int i = 0; i < 3; i++)
        incident_log_submit(l, record("{\"lost\":%d}", i));
    incident_log_flush(l);
    incident_stats st;
    incident_log_stats(l, &st);
    assert_int_equal(st.write_errors, 3);
    assert_int_equal(st.written, 0);

    assert_int_equal(mkdir(dir, 0700), 0);
    usleep((REOPEN_BACKOFF_MS + 200) * 1000);
    incident_log_submit(l, record("{\"kept\":1}"));
    incident_log_flush(l);
    incident_log_stats(l, &st);
    assert_int_equal(st.written, 1);
    char *text = slurp(path);
    assert_string_equal(text, "{\"kept\":1}\n");
    free(text);
    incident_log_close(l);
    rm_dir(dir, (char *[]){path}, 1);
}

typedef struct submitter {
    incident_log *l;
    int id, n;
} submitter;

static void *submit_many(void *arg)
{
    submitter *s = arg;
    for (int i = 0; i < s->n; i++)
        incident_log_submit(s->l, record("{\"t\":%d,\"i\":%d}", s->id, i));
    return NULL;
}

/* 8 threads submit at once; fewer records than the queue holds, so none may be dropped
 * even if the writer never got the CPU: every one must land, each thread's in order. */
static void test_concurrent_submitters_lose_nothing(void **state)
{
    (void)state;
    enum { THREADS = 8, PER = QUEUE_MAX_RECORDS / THREADS };
    char *dir, *path;
    incident_log *l = open_in_temp(&dir, &path, 50, 65536);
    pthread_t t[THREADS];
    submitter s[THREADS];
    for (int i = 0; i < THREADS; i++) {
        s[i] = (submitter){l, i, PER};
        assert_int_equal(pthread_create(&t[i], NULL, submit_many, &s[i]), 0);
    }
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    incident_log_close(l); /* close flushes */

    char *text = slurp(path);
    assert_int_equal(count_lines(text), THREADS * PER);
    int next[THREADS] = {0};
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        int tid, i;
        assert_int_equal(sscanf(line, "{\"t\":%d,\"i\":%d}", &tid, &i), 2);
        assert_true(tid >= 0 && tid < THREADS);
        assert_int_equal(i, next[tid]);
        next[tid]++;
    }
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(next[i], PER);
    free(text);
    rm_dir(dir, (char *[]){path}, 1);
}

/* A FIFO nobody reads stands for a disk that hangs: the writer blocks in write(2), yet
 * submitters return at once; past the queue's capacity records are dropped and counted.
 * Draining the FIFO lets the writer finish, and close() then returns. */
typedef struct drain {
    const char *path;
    size_t bytes;
} drain;

static void *drain_fifo(void *arg)
{
    drain *d = arg;
    char buf[65536];
    int fd = open(d->path, O_RDONLY);
    ssize_t n;
    while (fd >= 0 && (n = read(fd, buf, sizeof buf)) > 0)
        d->bytes += (size_t)n;
    if (fd >= 0) close(fd);
    return NULL;
}

static void test_stalled_disk_never_blocks_submitters(void **state)
{
    (void)state;
    char err[256] = "";
    char *dir = temp_dir(), *path = path_in(dir, "fifo");
    assert_int_equal(mkfifo(path, 0600), 0);
    incident_log *l = incident_log_open(path, 0, 1 << 20, err, sizeof err);
    assert_non_null(l);
    /* 1 KiB records: the pipe (64 KiB by default, at most 1 MiB) soon fills; the queue then
     * fills to its record cap and the rest must be dropped. */
    size_t big = 1024, total = 3 * QUEUE_MAX_RECORDS, pipe_max = (1 << 20) / big;
    char *pad = malloc(big);
    memset(pad, 'x', big - 1);
    pad[big - 1] = '\0';
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t i = 0; i < total; i++)
        incident_log_submit(l, record("{\"i\":%zu,\"pad\":\"%s\"}", i, pad));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    assert_true(secs < 30.0); /* nothing waited for the reader (there was none); generous
                                 for valgrind */
    incident_stats st;
    incident_log_stats(l, &st);
    assert_int_equal(st.submitted, total);
    /* Besides what the pipe took, the queue holds at most QUEUE_MAX_RECORDS and the writer
     * one more queue's worth in the batch it is stuck on. */
    assert_true(st.dropped >= total - 2 * QUEUE_MAX_RECORDS - pipe_max);
    assert_true(st.written <= pipe_max);

    drain d = {path, 0};
    pthread_t reader;
    assert_int_equal(pthread_create(&reader, NULL, drain_fifo, &d), 0);
    incident_log_close(l);
    assert_int_equal(pthread_join(reader, NULL), 0);
    /* Everything queued went through; everything else was counted as dropped. */
    size_t per = strlen("{\"i\":,\"pad\":\"\"}\n") + big - 1;
    assert_true(d.bytes >= (total - st.dropped) * per);
    free(pad);
    rm_dir(dir, (char *[]){path}, 1);
}

static void test_close_flushes(void **state)
{
    (void)state;
    char *dir, *path;
    incident_log *l = open_in_temp(&dir, &path, 0, 65536);
    for (int i = 0; i < 500; i++)
        incident_log_submit(l, record("{\"id\":%d}", i));
    incident_log_close(l);
    char *text = slurp(path);
    assert_int_equal(count_lines(text), 500);
    assert_non_null(strstr(text, "{\"id\":499}\n"));
    free(text);
    incident_log_close(NULL);
    rm_dir(dir, (char *[]){path}, 1);
}

static void test_oversized_records_are_cut(void **state)
{
    (void)state;
    char *dir, *path;
    incident_log *l = open_in_temp(&dir, &path, 10, 1024);
    /* 3000 bytes of 2-byte "é" in the excerpt, a shorter prompt, small fields. */
    char *ex = malloc(3001), *prompt = malloc(1501);
    for (int i = 0; i < 3000; i += 2)
        memcpy(ex + i, "\xc3\xa9", 2);
    ex[3000] = '\0';
    memset(prompt, 'p', 1500);
    prompt[1500] = '\0';
    incident_log_submit(l,
                        record("{\"id\":\"r1\",\"outcome\":\"recovered\",\"attempts\":[{\"unit\":"
                               "\"lambda \"}],\"excerpt\":\"%s\",\"prompt\":\"%s\"}",
                               ex, prompt));
    incident_log_submit(l, record("not json %s", ex));  /* dropped */
    incident_log_submit(l, record("{\"short\":true}")); /* untouched */
    incident_log_flush(l);
    incident_stats st;
    incident_log_stats(l, &st);
    assert_int_equal(st.truncated, 1);
    assert_int_equal(st.dropped, 1);
    assert_int_equal(st.written, 2);

    char *text = slurp(path);
    char *nl = strchr(text, '\n');
    assert_non_null(nl);
    *nl = '\0';
    assert_true(strlen(text) <= 1024);
    cJSON *j = cJSON_Parse(text);
    assert_non_null(j);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "truncated")));
    assert_string_equal(cJSON_GetObjectItem(j, "id")->valuestring, "r1");
    assert_string_equal(cJSON_GetObjectItem(j, "outcome")->valuestring, "recovered");
    const char *cut = cJSON_GetObjectItem(j, "excerpt")->valuestring;
    size_t clen = strlen(cut), mlen = strlen(TRUNCATE_MARK);
    assert_true(clen > mlen && strcmp(cut + clen - mlen, TRUNCATE_MARK) == 0);
    assert_true((clen - mlen) % 2 == 0); /* whole "é"s only */
    assert_memory_equal(cut, ex, clen - mlen);
    assert_true(clen > 300); /* both long strings keep a beginning, neither vanishes */
    const char *pr = cJSON_GetObjectItem(j, "prompt")->valuestring;
    assert_true(strlen(pr) > 300 && strlen(pr) < 1500);
    cJSON_Delete(j);
    assert_string_equal(nl + 1, "{\"short\":true}\n");
    free(text);
    free(ex);
    free(prompt);
    incident_log_close(l);
    rm_dir(dir, (char *[]){path}, 1);
}

/* A file left ending mid-line (disk full, crash) gets a newline before the next record. */
static void test_torn_line_repaired(void **state)
{
    (void)state;
    char err[256] = "";
    char *dir = temp_dir(), *path = path_in(dir, "inc.jsonl");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"ok\":1}\n{\"torn\":", f);
    fclose(f);
    incident_log *l = incident_log_open(path, 0, 65536, err, sizeof err);
    assert_non_null(l);
    incident_log_submit(l, record("{\"id\":1}"));
    incident_log_submit(l, record("{\"id\":2}"));
    incident_log_close(l);
    char *text = slurp(path);
    assert_string_equal(text, "{\"ok\":1}\n{\"torn\":\n{\"id\":1}\n{\"id\":2}\n");
    free(text);
    rm_dir(dir, (char *[]){path}, 1);
}

static void test_recent_ring_without_file(void **state)
{
    (void)state;
    char err[256] = "";
    incident_log *l = incident_log_open(NULL, 3, 65536, err, sizeof err);
    assert_non_null(l);
    char *s = incident_log_recent_json(l);
    assert_string_equal(s, "[]");
    free(s);
    for (int i = 0; i < 5; i++)
        incident_log_submit(l, record("{\"id\":%d}", i));
    s = incident_log_recent_json(l);
    assert_string_equal(s, "[{\"id\":2},{\"id\":3},{\"id\":4}]");
    free(s);
    incident_log_flush(l);  /* no file: returns at once */
    incident_log_reopen(l); /* no-op */
    incident_stats st;
    incident_log_stats(l, &st);
    assert_int_equal(st.submitted, 5);
    assert_int_equal(st.written, 0);
    incident_log_close(l);

    l = incident_log_open(NULL, 0, 65536, err, sizeof err); /* no ring at all */
    incident_log_submit(l, record("{\"id\":0}"));
    s = incident_log_recent_json(l);
    assert_string_equal(s, "[]");
    free(s);
    incident_log_close(l);
    incident_log_submit(NULL, record("{}")); /* freed, no crash */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_records_land_in_order),
        cmocka_unit_test(test_reopen_after_rename),
        cmocka_unit_test(test_unopenable_path_fails_open),
        cmocka_unit_test(test_full_disk_counted),
        cmocka_unit_test(test_unwritable_then_recovers),
        cmocka_unit_test(test_concurrent_submitters_lose_nothing),
        cmocka_unit_test(test_stalled_disk_never_blocks_submitters),
        cmocka_unit_test(test_close_flushes),
        cmocka_unit_test(test_oversized_records_are_cut),
        cmocka_unit_test(test_torn_line_repaired),
        cmocka_unit_test(test_recent_ring_without_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
