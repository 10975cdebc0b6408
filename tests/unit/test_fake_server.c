/* test_fake_server.c — the fake upstream binary over real sockets: what the end-to-end
 * suites rely on. Starts $FAKE_BIN (default build/fake_upstream) with a scenario, speaks
 * raw HTTP/1.1 to it and checks the recorded truth: a client that hangs up stops the
 * generation within a few pace ticks, /abort_request ends a stream by rid, faults look
 * like what the README promises, keep-alive and chunked request bodies work, pacing is
 * honoured, kinds expose the right endpoints, and SIGTERM exits cleanly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char scenario[] =
    "{\"pace_ms\":5,\"responses\":["
    "{\"match\":{\"prompt_contains\":\"loop\"},\"reasoning\":[{\"repeat\":\"lambda "
    "\",\"times\":-1}]},"
    "{\"match\":{\"prompt_contains\":\"reset\"},\"content\":\"a b c d e\",\"pace_ms\":0,"
    "\"fault\":{\"kind\":\"reset\",\"at_token\":2}},"
    "{\"match\":{\"prompt_contains\":\"trunc\"},\"content\":\"a b c d e\",\"pace_ms\":0,"
    "\"fault\":{\"kind\":\"truncated_chunked\",\"at_token\":3}},"
    "{\"match\":{\"prompt_contains\":\"paced\"},\"content\":[{\"repeat\":\"w \",\"times\":20}],"
    "\"pace_ms\":10},"
    "{\"content\":\"fine thanks\",\"pace_ms\":0}]}";

typedef struct fake {
    pid_t pid;
    int port;
} fake;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Starts the fake with extra arguments; the scenario file is written first. */
static fake start_fake(const char *kind)
{
    const char *bin = getenv("FAKE_BIN");
    if (!bin || !*bin) bin = "build/fake_upstream";
    char path[] = "/tmp/test_fake_server_XXXXXX";
    int sfd = mkstemp(path);
    assert_true(sfd >= 0);
    assert_int_equal(write(sfd, scenario, sizeof scenario - 1), (ssize_t)(sizeof scenario - 1));
    close(sfd);
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    fake f = {0};
    f.pid = fork();
    assert_true(f.pid >= 0);
    if (f.pid == 0) {
        dup2(pipefd[1], 1);
        close(pipefd[0]);
        execl(bin, bin, "--listen", "127.0.0.1:0", "--kind", kind, "--scenario", path, NULL);
        _exit(127);
    }
    close(pipefd[1]);
    char line[128] = {0};
    size_t n = 0;
    while (n < sizeof line - 1 && read(pipefd[0], line + n, 1) == 1 && line[n] != '\n')
        n++;
    close(pipefd[0]);
    unlink(path);
    if (sscanf(line, "listening on 127.0.0.1:%d", &f.port) != 1)
        fail_msg("fake did not start (%s): got \"%s\"", bin, line);
    return f;
}

static void stop_fake(fake *f)
{
    int st;
    kill(f->pid, SIGTERM);
    assert_int_equal(waitpid(f->pid, &st, 0), f->pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

static int dial(const fake *f)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)f->port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static void send_all(int fd, const char *s, size_t n)
{
    while (n) {
        ssize_t k = write(fd, s, n);
        assert_true(k > 0);
        s += k, n -= (size_t)k;
    }
}

static void post(int fd, const char *path, const char *body)
{
    char head[256];
    int n = snprintf(head, sizeof head,
                     "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     path, strlen(body));
    send_all(fd, head, (size_t)n);
    send_all(fd, body, strlen(body));
}

/* Reads until the connection closes, an error, or `until` appears. Returns the bytes
 * (NUL-terminated, caller frees); *err gets errno of a failed read (0 on EOF/found). */
static char *read_until(int fd, const char *until, int *err)
{
    size_t cap = 1 << 16, len = 0;
    char *b = malloc(cap);
    *err = 0;
    for (;;) {
        if (len + 4096 > cap) b = realloc(b, cap *= 2);
        ssize_t k = read(fd, b + len, cap - len - 1);
        if (k <= 0) {
            if (k < 0) *err = errno;
            break;
        }
        len += (size_t)k;
        b[len] = '\0';
        if (until && strstr(b, until)) break;
    }
    b[len] = '\0';
    return b;
}

/* One request on a fresh connection; returns the whole response (connection: close). */
static char *request(const fake *f, const char *method, const char *path, const char *body);

/* The records of the given kind right now. */
static cJSON *records_now(const fake *f, const char *kind)
{
    char *r = request(f, "GET", "/_fake/records", NULL);
    cJSON *all = cJSON_Parse(strstr(r, "\r\n\r\n") + 4);
    free(r);
    assert_non_null(all);
    cJSON *out = cJSON_CreateArray(), *it;
    cJSON_ArrayForEach(it, all)
    {
        if (!strcmp(cJSON_GetObjectItem(it, "kind")->valuestring, kind))
            cJSON_AddItemToArray(out, cJSON_Duplicate(it, 1));
    }
    cJSON_Delete(all);
    return out;
}

static char *request(const fake *f, const char *method, const char *path, const char *body)
{
    int fd = dial(f);
    char head[256];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, body ? strlen(body) : 0);
    send_all(fd, head, (size_t)n);
    if (body) send_all(fd, body, strlen(body));
    int err;
    char *r = read_until(fd, NULL, &err);
    close(fd);
    return r;
}

/* The records of the given kind, as a cJSON array the caller deletes. */
static cJSON *records(const fake *f, const char *kind)
{
    /* A generation is recorded when the fake sees its end: under a loaded machine (CI,
     * sanitizers) that can trail the client by a moment, so wait up to 5 s for one. */
    for (int tries = 0; tries < 100; tries++) {
        cJSON *r = records_now(f, kind);
        if (cJSON_GetArraySize(r) > 0 || strcmp(kind, "generation")) return r;
        cJSON_Delete(r);
        usleep(50 * 1000);
    }
    return records_now(f, kind);
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

#define STREAM(prompt, extra)                                                                      \
    "{\"model\":\"m\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"" prompt      \
    "\"}]" extra "}"

static void test_client_gone_stops_generation(void **state)
{
    (void)state;
    fake f = start_fake("sglang");
    int fd = dial(&f);
    post(fd, "/v1/chat/completions", STREAM("loop", ",\"rid\":\"gone-1\""));
    int err;
    char *r = read_until(fd, "\"lambda \"", &err);
    free(r);
    r = read_until(fd, "\"lambda \"", &err); /* at least two tokens seen */
    free(r);
    close(fd);
    cJSON *gens = records(&f, "generation");
    assert_int_equal(cJSON_GetArraySize(gens), 1);
    cJSON *g = cJSON_GetArrayItem(gens, 0);
    assert_string_equal(cJSON_GetObjectItem(g, "rid")->valuestring, "gone-1");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(g, "client_gone")));
    assert_string_equal(cJSON_GetObjectItem(g, "ended")->valuestring, "client_gone");
    /* 5 ms a token: the hang-up is seen within a few ticks (a loaded machine may add a
     * few), far from the 4096 cap. */
    int sent = cJSON_GetObjectItem(g, "tokens_sent")->valueint;
    assert_in_range(sent, 2, 60);
    assert_int_equal(cJSON_GetObjectItem(g, "tokens_planned")->valueint, 4096);
    cJSON_Delete(gens);
    stop_fake(&f);
}

static void test_abort_by_rid(void **state)
{
    (void)state;
    fake f = start_fake("sglang");
    int fd = dial(&f);
    post(fd, "/v1/chat/completions", STREAM("loop", ",\"rid\":\"ab-1\""));
    int err;
    free(read_until(fd, "lambda", &err));
    char *a = request(&f, "POST", "/abort_request", "{\"rid\":\"ab-1\"}");
    assert_non_null(strstr(a, "HTTP/1.1 200 OK"));
    free(a);
    double t0 = now_ms();
    char *r = read_until(fd, "data: [DONE]\n\n\r\n0\r\n\r\n", &err);
    assert_true(now_ms() - t0 < 2000); /* at once, but a loaded machine gets slack */
    assert_non_null(strstr(r, "\"finish_reason\":\"abort\""));
    assert_non_null(strstr(r, "\"id\":\"ab-1\""));
    free(r);
    close(fd);
    cJSON *ab = records(&f, "abort");
    assert_int_equal(cJSON_GetArraySize(ab), 1);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetArrayItem(ab, 0), "found")));
    cJSON_Delete(ab);
    cJSON *gens = records(&f, "generation");
    cJSON *g = cJSON_GetArrayItem(gens, 0);
    assert_string_equal(cJSON_GetObjectItem(g, "ended")->valuestring, "aborted");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(g, "aborted")));
    cJSON_Delete(gens);
    stop_fake(&f);
}

static void test_reset_and_truncated(void **state)
{
    (void)state;
    fake f = start_fake("sglang");
    int fd = dial(&f);
    post(fd, "/v1/chat/completions", STREAM("reset", ""));
    int err;
    char *r = read_until(fd, NULL, &err);
    assert_int_equal(err, ECONNRESET);
    /* Role chunk and two tokens, no end. */
    assert_int_equal(count(r, "data: "), 3);
    assert_null(strstr(r, "[DONE]"));
    free(r);
    close(fd);

    fd = dial(&f);
    post(fd, "/v1/chat/completions", STREAM("trunc", ""));
    r = read_until(fd, NULL, &err);
    assert_int_equal(err, 0); /* an orderly close ... */
    assert_int_equal(count(r, "data: "), 5);
    assert_non_null(strstr(r, "\r\n40\r\ndata: {\"i")); /* ... inside a chunk */
    assert_null(strstr(r, "0\r\n\r\n"));
    free(r);
    close(fd);
    cJSON *gens = records(&f, "generation");
    assert_int_equal(cJSON_GetArraySize(gens), 2);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(gens, 0), "ended")->valuestring,
                        "fault");
    cJSON_Delete(gens);
    stop_fake(&f);
}

static void test_keepalive_chunked_body_and_pacing(void **state)
{
    (void)state;
    fake f = start_fake("sglang");
    int fd = dial(&f);
    static const char chunked[] = "POST /_fake/echo?x=1 HTTP/1.1\r\nHost: x\r\n"
                                  "Transfer-Encoding: chunked\r\nX-Key: Secret\r\n\r\n"
                                  "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n";
    send_all(fd, chunked, sizeof chunked - 1);
    int err;
    char *r = read_until(fd, "}", &err);
    assert_non_null(strstr(r, "\"body\":\"hello world\""));
    assert_non_null(strstr(r, "\"x-key\":\"Secret\""));
    assert_non_null(strstr(r, "\"query\":\"x=1\""));
    free(r);
    /* Same connection: a paced stream of 20 tokens at 10 ms. */
    double t0 = now_ms();
    post(fd, "/v1/chat/completions", STREAM("paced", ""));
    r = read_until(fd, "data: [DONE]\n\n\r\n0\r\n\r\n", &err);
    double ms = now_ms() - t0;
    assert_int_equal(count(r, "\"content\":\"w \""), 20);
    assert_true(ms >= 190 && ms < 3000); /* never faster than the pace; slack for load */
    free(r);
    close(fd);
    stop_fake(&f);
}

static void test_kinds_and_not_found(void **state)
{
    (void)state;
    fake f = start_fake("vllm");
    char *r = request(&f, "GET", "/get_model_info", NULL);
    assert_non_null(strstr(r, "HTTP/1.1 404 "));
    assert_non_null(strstr(r, "{\"error\":{\"message\":"));
    free(r);
    r = request(&f, "GET", "/version", NULL);
    assert_non_null(strstr(r, "{\"version\":\"0.17.0\"}"));
    free(r);
    r = request(&f, "POST", "/v1/chat/completions", STREAM("hi", ",\"request_id\":\"q1\""));
    assert_non_null(strstr(r, "\"id\":\"chatcmpl-q1\""));
    assert_non_null(strstr(r, "\"finish_reason\":\"stop\",\"stop_reason\":null"));
    free(r);
    stop_fake(&f);
    f = start_fake("openai");
    r = request(&f, "GET", "/metrics", NULL);
    assert_non_null(strstr(r, "HTTP/1.1 404 "));
    free(r);
    r = request(&f, "POST", "/v1/chat/completions",
                "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    assert_non_null(strstr(r, "\"object\":\"chat.completion\""));
    assert_non_null(strstr(r, "\"content\":\"fine thanks\""));
    free(r);
    stop_fake(&f);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_client_gone_stops_generation),
        cmocka_unit_test(test_abort_by_rid),
        cmocka_unit_test(test_reset_and_truncated),
        cmocka_unit_test(test_keepalive_chunked_body_and_pacing),
        cmocka_unit_test(test_kinds_and_not_found),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
