/* accesslog.c — see accesslog.h. */
#include "proxy/accesslog.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "proxy/exchange_int.h"
#include "proxy/series.h"
#include "proxy/upstream.h"
#include "proxy/xalloc.h"

#define ACCESS_LINE_MAX 65536

int accesslog_open(const char *spec, incident_log **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!spec || !strcmp(spec, "off")) return 0;
    const char *path = strcmp(spec, "stderr") ? spec : "/dev/stderr";
    char why[400];
    *out = incident_log_open(path, 0, ACCESS_LINE_MAX, why, sizeof why);
    if (*out) return 0;
    snprintf(err, errlen, "log.access: %s", why);
    return -1;
}

static void add_string_or_null(cJSON *o, const char *k, const char *v)
{
    if (v)
        cJSON_AddStringToObject(o, k, v);
    else
        cJSON_AddNullToObject(o, k);
}

static void add_count_or_null(cJSON *o, const char *k, int64_t v)
{
    if (v >= 0)
        cJSON_AddNumberToObject(o, k, (double)v);
    else
        cJSON_AddNullToObject(o, k);
}

void accesslog_write(incident_log *log, const access_entry *e)
{
    if (!log) return;
    char ts[40];
    struct timespec now;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    size_t k = strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + k, sizeof ts - k, ".%03ldZ", now.tv_nsec / 1000000);
    cJSON *o = lg_xcheck(cJSON_CreateObject());
    cJSON_AddStringToObject(o, "ts", ts);
    add_string_or_null(o, "id", e->id);
    /* A relayed path's query may carry secrets: never logged. */
    char *route = e->route ? lg_xasprintf("%.*s", (int)strcspn(e->route, "?"), e->route) : NULL;
    add_string_or_null(o, "route", route);
    free(route);
    cJSON_AddNumberToObject(o, "status", e->status);
    add_string_or_null(o, "model", e->model);
    add_string_or_null(o, "upstream", e->upstream);
    cJSON_AddNumberToObject(o, "attempts", e->attempts);
    cJSON_AddNumberToObject(o, "trips", e->trips);
    add_count_or_null(o, "tokens", e->tokens);
    if (e->ttft_us >= 0)
        cJSON_AddNumberToObject(o, "ttft_ms", (double)e->ttft_us / 1000.0);
    else
        cJSON_AddNullToObject(o, "ttft_ms");
    cJSON_AddNumberToObject(o, "duration_ms", (double)e->duration_us / 1000.0);
    add_string_or_null(o, "outcome", e->outcome);
    char *line = lg_xcheck(cJSON_PrintUnformatted(o));
    cJSON_Delete(o);
    incident_log_submit(log, line);
}

/* What the loops of ex would have cost had they run to max_tokens: each cut attempt's
 * max_tokens less what it generated (0 when the request set no max_tokens). */
static uint64_t tokens_saved(const exchange *ex)
{
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(ex->req.root, "max_tokens");
    if (!cJSON_IsNumber(mt))
        mt = cJSON_GetObjectItemCaseSensitive(ex->req.root, "max_completion_tokens");
    if (!ex->rec.trips || !cJSON_IsNumber(mt) || mt->valuedouble <= 0) return 0;
    double cost = (double)ex->rec.trips * mt->valuedouble;
    return cost > (double)ex->rec.cut_tokens ? (uint64_t)cost - ex->rec.cut_tokens : 0;
}

void accesslog_exchange(const exchange *ex)
{
    const lg_req *base = &ex->base;
    int status = ex->cl.final_status ? ex->cl.final_status : ex->cl.queued ? 200 : 0;
    series_add(req_series(base),
               &(series_point){ex->req.model, ex->api->route, status, ex->rec.trips,
                               ex->rec.trips ? ex->rec.outcome : NULL, tokens_saved(ex)},
               (uint64_t)time(NULL));
    incident_log *alog = req_access(base);
    if (!alog) return;
    uint64_t start = ex->base.start_ns, now = lg_now_ns();
    accesslog_write(alog,
                    &(access_entry){
                        .route = ex->api->route,
                        .status = status,
                        .model = ex->req.model,
                        .upstream = ex->attempt ? pool_base(req_pool(base), ex->replica) : NULL,
                        .attempts = ex->attempt,
                        .trips = ex->rec.trips,
                        .tokens = ex->attempt ? (int64_t)ex->at.tokens : -1,
                        .ttft_us = ex->cl.first_out_ns > start
                                       ? (int64_t)(ex->cl.first_out_ns - start) / 1000
                                       : -1,
                        .duration_us = now > start ? (now - start) / 1000 : 0,
                        .id = ex->id,
                        .outcome = ex->rec.trips ? ex->rec.outcome : NULL,
                    });
}
