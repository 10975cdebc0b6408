/* admin.c — see admin.h. Every answer is computed on the calling worker from state that
 * is safe to read across threads (per-worker metrics read with relaxed atomics, the
 * incident ring under its own lock, the pool's atomics). */
#include "proxy/admin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "proxy/http.h"
#include "proxy/httphead.h"
#include "proxy/series.h"
#include "proxy/status_page.h"
#include "proxy/upstream.h"
#include "proxy/xalloc.h"

/* With admin.token, its bearer (compared in constant time). Without one, the endpoints are
 * open only when clients need no key either: with api_keys set they would otherwise hand
 * every user's prompts (incidents) to anyone. */
static bool admin_authorized(const lg_config *cfg, struct MHD_Connection *conn)
{
    if (!cfg->admin.token) return cfg->n_api_keys == 0;
    const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    return auth && strncasecmp(auth, "Bearer ", 7) == 0 &&
           hh_secret_equal(auth + 7, cfg->admin.token);
}

/* Gauges that live outside the per-worker counters, in Prometheus text. */
static char *extra_metrics(lg_server *srv)
{
    incident_stats st = {0};
    char *buf = NULL;
    size_t len = 0;
    FILE *f = lg_xcheck(open_memstream(&buf, &len));
    if (srv->incidents) incident_log_stats(srv->incidents, &st);
    fprintf(f,
            "# HELP loopguard_incidents_total Incident records by fate.\n"
            "# TYPE loopguard_incidents_total counter\n"
            "loopguard_incidents_total{fate=\"submitted\"} %llu\n"
            "loopguard_incidents_total{fate=\"written\"} %llu\n"
            "loopguard_incidents_total{fate=\"dropped\"} %llu\n"
            "loopguard_incidents_total{fate=\"write_error\"} %llu\n"
            "loopguard_incidents_total{fate=\"truncated\"} %llu\n"
            "# HELP loopguard_incident_reopens_total Incident log reopens (SIGHUP).\n"
            "# TYPE loopguard_incident_reopens_total counter\n"
            "loopguard_incident_reopens_total %llu\n",
            (unsigned long long)st.submitted, (unsigned long long)st.written,
            (unsigned long long)st.dropped, (unsigned long long)st.write_errors,
            (unsigned long long)st.truncated, (unsigned long long)st.reopens);
    fprintf(f,
            "# HELP loopguard_workers Worker threads.\n# TYPE loopguard_workers gauge\n"
            "loopguard_workers %zu\n",
            srv->n_workers);
    fputs("# HELP loopguard_worker_connections Client connections each worker holds.\n"
          "# TYPE loopguard_worker_connections gauge\n",
          f);
    for (size_t i = 0; i < srv->n_workers; i++)
        fprintf(f, "loopguard_worker_connections{worker=\"%zu\"} %u\n", i,
                atomic_load_explicit(&srv->workers[i]->clients, memory_order_relaxed));
    char *pool = pool_metrics_text(srv->pool);
    fputs(pool, f);
    free(pool);
    char *models = series_metrics_text(srv->series);
    fputs(models, f);
    free(models);
    fclose(f);
    return buf;
}

/* The status page: static HTML (status_page.h) that only talks to this listener. */
static enum MHD_Result status_page(struct MHD_Connection *conn)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        strlen(lg_status_page_html), (void *)lg_status_page_html, MHD_RESPMEM_PERSISTENT);
    if (!resp) lg_oom(0);
    MHD_add_response_header(resp, "Content-Type", "text/html; charset=utf-8");
    MHD_add_response_header(resp, "Content-Security-Policy",
                            "default-src 'none'; script-src 'unsafe-inline'; "
                            "style-src 'unsafe-inline'; connect-src 'self'; img-src data:; "
                            "frame-ancestors 'none'");
    MHD_add_response_header(resp, "Cache-Control", "no-store");
    enum MHD_Result rc = MHD_queue_response(conn, 200, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* Answers one admin request; returns the status it answered with (for the count). */
static int admin_answer(lg_worker *w, struct MHD_Connection *conn, const char *url,
                        const char *method, enum MHD_Result *rc)
{
    lg_server *srv = w->srv;
    char *body = NULL;
    int status = 200;

    /* Health stays open: probes and load balancers rarely carry a token. So does the status
     * page, which holds no data: it asks for the token and sends it on every fetch. */
    bool health = strcmp(url, "/loopguard/health") == 0;
    bool page = strcmp(url, "/loopguard/") == 0 || strcmp(url, "/loopguard") == 0;
    if (!health && !page && !admin_authorized(srv->cfg, conn)) {
        *rc = http_respond_error(conn, 401,
                                 srv->cfg->admin.token
                                     ? "admin token required"
                                     : "admin endpoints are closed: api_keys is set and "
                                       "admin.token is not",
                                 "authentication_error", "invalid_admin_token");
        return 401;
    }
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        *rc = http_respond_error(conn, 405, "admin endpoints answer GET only",
                                 "invalid_request_error", "method_not_allowed");
        return 405;
    }
    if (health) {
        bool draining = atomic_load(&srv->draining);
        status = draining ? 503 : 200;
        *rc = http_respond_json(conn, status,
                                draining ? "{\"status\":\"draining\"}" : "{\"status\":\"ok\"}");
    } else if (strcmp(url, "/loopguard/metrics") == 0) {
        /* The workers' counters and the admin listener's (its own answers). */
        size_t n = srv->n_workers + (srv->admin != NULL);
        lg_metrics **ms = lg_xcalloc(n, sizeof *ms);
        for (size_t i = 0; i < srv->n_workers; i++)
            ms[i] = srv->workers[i]->metrics;
        if (srv->admin) ms[srv->n_workers] = srv->admin->metrics;
        char *extra = extra_metrics(srv);
        body = metrics_render(ms, n, pool_names(srv->pool), pool_size(srv->pool), extra);
        free(extra);
        free(ms);
        *rc = http_respond_text(conn, 200, "text/plain; version=0.0.4; charset=utf-8", body);
    } else if (strcmp(url, "/loopguard/incidents") == 0) {
        body = srv->incidents ? incident_log_recent_json(srv->incidents) : lg_xstrdup("[]");
        *rc = http_respond_json(conn, 200, body);
    } else if (strcmp(url, "/loopguard/upstreams") == 0) {
        body = pool_json(srv->pool);
        *rc = http_respond_json(conn, 200, body);
    } else if (strcmp(url, "/loopguard/series") == 0) {
        body = series_json(srv->series, (uint64_t)time(NULL));
        *rc = http_respond_json(conn, 200, body);
    } else if (page) {
        *rc = status_page(conn);
    } else {
        status = 404;
        *rc = http_respond_error(conn, 404, "no such loopguard endpoint", "invalid_request_error",
                                 "not_found");
    }
    free(body);
    return status;
}

enum MHD_Result admin_handle(lg_worker *w, struct MHD_Connection *conn, const char *url,
                             const char *method)
{
    enum MHD_Result rc;
    metrics_request(w->metrics, LG_EP_ADMIN, admin_answer(w, conn, url, method, &rc));
    return rc;
}
