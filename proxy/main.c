/* main.c — loopguard's entry point.
 *
 * The main thread parses the configuration (defaults < file < LOOPGUARD_* environment <
 * flags), raises the file-descriptor limit, probes the upstreams, starts one worker per core
 * on one listening socket they share (listener.h), and then only handles signals:
 * SIGTERM/SIGINT stop accepting and let streams finish up to shutdown_grace_ms before they
 * are ended well-formed; SIGHUP reopens the incident log (logrotate). `loopguard scan` runs
 * the guard over files instead (see scan.c). */
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <microhttpd.h>

#include "config/config.h"
#include "proxy/accesslog.h"
#include "proxy/incident.h"
#include "proxy/scan.h"
#include "proxy/series.h"
#include "proxy/upstream.h"
#include "proxy/worker.h"
#include "proxy/xalloc.h"

#include <cJSON.h>

extern char **environ;

/* Replica state changes: ejections and returns become incident records of their own
 * kind; health flips are logged. Called from worker or health-checker threads. */
static void on_pool_event(void *ud, size_t replica, const char *event, const char *json)
{
    lg_server *srv = ud;
    const char *base = pool_base(srv->pool, replica);
    fprintf(stderr, "loopguard: upstream %s %s\n", base, event);
    if (strcmp(event, "ejected") != 0 && strcmp(event, "returned") != 0) return;
    char ts[40];
    struct timespec now;
    struct tm tm;
    static atomic_uint seq;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    size_t k = strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + k, sizeof ts - k, ".%03ldZ", now.tv_nsec / 1000000);
    char *line = lg_xasprintf("{\"ts\":\"%s\",\"id\":\"up-%lx-%u\",\"kind\":\"upstream\","
                              "\"event\":\"%s\",\"upstream\":\"%s\",\"detail\":%s}",
                              ts, (unsigned long)now.tv_sec, atomic_fetch_add(&seq, 1), event, base,
                              json ? json : "null");
    incident_log_submit(srv->incidents, line);
}

#define LOOPGUARD_VERSION "0.1.0"

static void usage(FILE *f)
{
    fprintf(f, "usage: loopguard [--config FILE] [--listen HOST:PORT] [--upstream URL[,URL...]]\n"
               "                 [--upstream-kind auto|sglang|vllm|openai]\n"
               "       loopguard --check-config FILE\n"
               "       loopguard scan [--config FILE] [--channel content|reasoning|tool_args]\n"
               "                      [--max-bytes N] [--records] FILE...\n"
               "       loopguard --version | --help\n"
               "Configuration: defaults < FILE < LOOPGUARD_* environment variables < flags;\n"
               "every key is in loopguard(1). Admin endpoints and the status page: /loopguard/.\n");
}

static void version(void)
{
    curl_version_info_data *cv = curl_version_info(CURLVERSION_NOW);
    printf("loopguard %s (libmicrohttpd %s, libcurl %s, cJSON %s)\n", LOOPGUARD_VERSION,
           MHD_get_version(), cv->version, cJSON_Version());
}

/* Prints each line of a failed step's message; returns whether the step failed. */
static bool report(int rc, const char *err)
{
    if (rc == 0) return false;
    for (const char *l = err; *l;) {
        size_t n = strcspn(l, "\n");
        fprintf(stderr, "loopguard: %.*s\n", (int)n, l);
        l += n + (l[n] != '\0');
    }
    return true;
}

/* Applies argv over the defaults. Returns the config, or NULL after printing every
 * problem found (all of the file's, the environment's and the flags' at once). */
static lg_config *load_config(int argc, char **argv, bool *check_only)
{
    char err[16384];
    const char *file = NULL, *listen = NULL, *upstream = NULL, *kind = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **slot = strcmp(a, "--config") == 0          ? &file
                            : strcmp(a, "--check-config") == 0  ? &file
                            : strcmp(a, "--listen") == 0        ? &listen
                            : strcmp(a, "--upstream") == 0      ? &upstream
                            : strcmp(a, "--upstream-kind") == 0 ? &kind
                                                                : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        }
        if (strcmp(a, "--version") == 0) {
            version();
            exit(0);
        }
        if (!slot || i + 1 >= argc) {
            fprintf(stderr, "loopguard: %s: %s\n", a, slot ? "missing value" : "unknown flag");
            usage(stderr);
            return NULL;
        }
        if (strcmp(a, "--check-config") == 0) *check_only = true;
        *slot = argv[++i];
    }
    lg_config *cfg = config_new_defaults();
    bool bad = file && report(config_load_file(cfg, file, err, sizeof err), err);
    bad |= report(config_apply_env(cfg, environ, err, sizeof err), err);
    bad |= listen && report(config_set_listen(cfg, listen, err, sizeof err), err);
    bad |= upstream && report(config_set_upstream(cfg, upstream, err, sizeof err), err);
    bad |= kind && report(config_set_upstream_kind(cfg, kind, err, sizeof err), err);
    /* Cross-key checks only on a config whose keys all loaded: else they judge a mix. */
    if (!bad) bad = report(config_validate(cfg, err, sizeof err), err);
    if (bad) {
        config_free(cfg);
        return NULL;
    }
    return cfg;
}

/* Free memory glibc keeps at the top of a heap before it gives it back to the kernel, and the
 * size from which a block is mapped on its own instead of taken from a heap. glibc's defaults
 * (128 KiB, then thresholds that move with the blocks freed) suit a program that frees for
 * good; a proxy frees and allocates the same buffers for every request, and a stream's
 * output queue holds a whole burst (up to EX_OUT_HIGH, 256 KiB, and a read more). With the
 * defaults the memory went back to the kernel and came straight back: at 100 saturated
 * streams 5-10 page faults per 1,000 events (nearly all in the output queue's growth) and
 * MADV_DONTNEED calls, 10-14 % of loopguard's CPU per event (alternating runs on make
 * bench's 2-core host, guard on and off); at paced load it made no difference. Setting
 * either value also stops glibc from moving them. The cost: up to MALLOC_TRIM_KEEP of freed
 * memory stays with each worker's heap after a burst (at 1,000 saturated streams RSS was
 * 160 MB, not 147). */
#define MALLOC_TRIM_KEEP (64u << 20)
#define MALLOC_MMAP_FROM (1u << 20)

/* Keeps freed memory for reuse (see above). An allocator that does not take the settings
 * (the sanitizers' refuse them) keeps its own policy, which is only slower. */
static void keep_freed_memory(void)
{
    (void)mallopt(M_TRIM_THRESHOLD, (int)MALLOC_TRIM_KEEP);
    (void)mallopt(M_MMAP_THRESHOLD, (int)MALLOC_MMAP_FROM);
}

/* Raises RLIMIT_NOFILE towards `want` (soft up to hard; as root, hard too). */
static void raise_nofile(unsigned want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    if (rl.rlim_cur >= want) return;
    struct rlimit nr = {want, rl.rlim_max > want ? rl.rlim_max : want};
    if (setrlimit(RLIMIT_NOFILE, &nr) != 0) {
        nr.rlim_cur = rl.rlim_max;
        nr.rlim_max = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &nr) != 0) perror("loopguard: setrlimit");
    }
}

static bool all_joined(lg_server *srv, bool *joined)
{
    bool all = true;
    for (size_t i = 0; i < srv->n_workers; i++) {
        if (!joined[i] && pthread_tryjoin_np(srv->workers[i]->thread, NULL) == 0) joined[i] = true;
        all &= joined[i];
    }
    return all;
}

/* Starts the worker of the separate admin listener (admin.listen). Returns 0 or -1. */
static int start_admin(lg_server *srv, char *err, size_t errlen)
{
    char *host;
    int port;
    if (config_split_hostport(srv->cfg->admin.listen, &host, &port, err, errlen) != 0) return -1;
    srv->admin_listener = listener_open(host, port, err, errlen);
    free(host);
    if (!srv->admin_listener) return -1;
    srv->admin = worker_new(srv, (int)srv->n_workers, srv->admin_listener, NULL, 1, err, errlen);
    if (!srv->admin) return -1;
    srv->admin->admin_only = true;
    if (worker_start(srv->admin) != 0) {
        snprintf(err, errlen, "cannot start the admin listener");
        worker_free(srv->admin);
        srv->admin = NULL;
        return -1;
    }
    fprintf(stderr, "loopguard: admin endpoints on %s\n", srv->cfg->admin.listen);
    return 0;
}

/* Signal loop: returns when every worker has stopped. */
static void serve_signals(lg_server *srv, const sigset_t *set)
{
    bool *joined = lg_xcalloc(srv->n_workers, sizeof *joined);
    uint64_t deadline = 0;
    for (;;) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        int sig = sigtimedwait(set, NULL, &ts);
        if (sig == SIGHUP) {
            if (srv->incidents) incident_log_reopen(srv->incidents);
            if (srv->access) incident_log_reopen(srv->access);
        } else if (sig == SIGTERM || sig == SIGINT) {
            if (atomic_load(&srv->draining)) {
                atomic_store(&srv->stopping, true); /* a second signal: stop now */
            } else {
                atomic_store(&srv->draining, true);
                deadline = lg_now_ns() + (uint64_t)srv->cfg->shutdown_grace_ms * 1000000ull;
                fprintf(stderr, "loopguard: draining (up to %u ms)\n", srv->cfg->shutdown_grace_ms);
            }
            for (size_t i = 0; i < srv->n_workers; i++)
                worker_wake(srv->workers[i]);
        }
        if (deadline && !atomic_load(&srv->stopping) && lg_now_ns() > deadline) {
            atomic_store(&srv->stopping, true);
            for (size_t i = 0; i < srv->n_workers; i++)
                worker_wake(srv->workers[i]);
        }
        if (atomic_load(&srv->draining) && all_joined(srv, joined)) break;
    }
    free(joined);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "scan") == 0) return scan_main(argc - 1, argv + 1);

    bool check_only = false;
    char err[512];
    lg_config *cfg = load_config(argc, argv, &check_only);
    if (!cfg) return 2;
    if (check_only) {
        printf("config OK\n");
        config_free(cfg);
        return 0;
    }

    /* Signals are taken synchronously by the main thread; workers inherit the mask. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    raise_nofile(cfg->rlimit_nofile);
    keep_freed_memory();
    /* The libraries allocate through the one OOM policy too (xalloc.h): their results are
     * never NULL for want of memory. */
    cJSON_InitHooks(&(cJSON_Hooks){.malloc_fn = lg_xmalloc, .free_fn = lg_xfree});
    if (curl_global_init_mem(CURL_GLOBAL_DEFAULT, lg_xmalloc, lg_xfree, lg_xrealloc, lg_xstrdup,
                             lg_xcalloc) != CURLE_OK) {
        fprintf(stderr, "loopguard: curl_global_init failed\n");
        return 1;
    }
    lg_server srv = {.cfg = cfg, .started_ns = lg_now_ns()};
    long cores = sysconf(_SC_NPROCESSORS_ONLN); /* -1 when unknown */
    srv.n_workers = cfg->workers > 0 ? (size_t)cfg->workers : cores > 0 ? (size_t)cores : 1;
    srv.incidents = incident_log_open(cfg->incidents.path, cfg->incidents.recent,
                                      cfg->incidents.max_record_bytes, err, sizeof err);
    if (!srv.incidents) {
        fprintf(stderr, "loopguard: %s\n", err);
        return 1;
    }
    if (accesslog_open(cfg->log.access, &srv.access, err, sizeof err) != 0) {
        fprintf(stderr, "loopguard: %s\n", err);
        incident_log_close(srv.incidents);
        return 1;
    }
    srv.pool = pool_new(cfg);
    srv.series = series_new();
    /* Before any thread that could report an event starts. */
    pool_set_event_hook(srv.pool, on_pool_event, &srv);
    srv.workers = lg_xcalloc(srv.n_workers, sizeof *srv.workers);

    int rc = 1;
    size_t started = 0;
    /* One listening socket that every worker accepts on (listener.h). */
    srv.listener = listener_open(cfg->listen_host, cfg->listen_port, err, sizeof err);
    if (!srv.listener) goto out;
    srv.port = srv.listener->port;
    for (size_t i = 0; i < srv.n_workers; i++) {
        srv.workers[i] = worker_new(&srv, (int)i, srv.listener, i ? srv.workers[i - 1] : NULL,
                                    WORKER_SHARDS, err, sizeof err);
        if (!srv.workers[i]) goto out;
    }
    if (cfg->admin.listen && start_admin(&srv, err, sizeof err) != 0) goto out;
    for (size_t i = 0; i < srv.n_workers; i++, started++)
        if (worker_start(srv.workers[i]) != 0) {
            snprintf(err, sizeof err, "cannot start worker threads: %s", strerror(errno));
            goto out;
        }
    if (pool_start(srv.pool) != 0) {
        snprintf(err, sizeof err, "cannot start the health checker");
        goto out;
    }
    fprintf(stderr, "loopguard: %zu workers, upstream %s (%s)\n", srv.n_workers,
            pool_base(srv.pool, 0), config_upstream_kind_name(pool_kind(srv.pool, 0)));
    bool v6 = strchr(cfg->listen_host, ':') != NULL; /* RFC 3986 §3.2.2: "[::1]:8000" */
    printf("listening on %s%s%s:%d\n", v6 ? "[" : "", cfg->listen_host, v6 ? "]" : "", srv.port);
    fflush(stdout);
    serve_signals(&srv, &set);
    rc = 0;
out:
    if (rc != 0) {
        fprintf(stderr, "loopguard: %s\n", err);
        atomic_store(&srv.draining, true);
        atomic_store(&srv.stopping, true);
        for (size_t i = 0; i < started; i++)
            worker_wake(srv.workers[i]);
        for (size_t i = 0; i < started; i++)
            worker_join(srv.workers[i]);
    }
    if (srv.admin) {
        atomic_store(&srv.stopping, true);
        worker_wake(srv.admin);
        worker_join(srv.admin);
        worker_free(srv.admin);
    }
    for (size_t i = 0; i < srv.n_workers; i++)
        worker_free(srv.workers[i]);
    free(srv.workers);
    listener_free(srv.listener);
    listener_free(srv.admin_listener);
    pool_free(srv.pool);
    series_free(srv.series);
    incident_log_close(srv.incidents);
    incident_log_close(srv.access);
    curl_global_cleanup();
    config_free(cfg);
    return rc;
}
