/* series.c — see series.h. Each (model, route) has a ring of SERIES_MINUTES buckets indexed
 * by minute modulo the ring; a bucket whose minute is stale is cleared when reused and
 * skipped when read. */
#include "proxy/series.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "proxy/xalloc.h"

typedef struct bucket {
    uint64_t minute; /* epoch minute this bucket counts; 0: never used */
    uint64_t requests, errors, trips, recovered, failed, tokens_saved;
} bucket;

typedef struct key {
    char *model, *route;
    bucket b[SERIES_MINUTES];
    bucket total; /* since start: the loopguard_model_* counters */
} key;

struct series {
    pthread_mutex_t mu;
    key keys[SERIES_KEYS];
    size_t n;
};

series *series_new(void)
{
    series *s = lg_xcalloc(1, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    return s;
}

void series_free(series *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) {
        free(s->keys[i].model);
        free(s->keys[i].route);
    }
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* The key for (model, route), created while there is room; the last slot is the shared
 * ("(other)", "(any)") one. Caller holds s->mu. */
static key *find_key(series *s, const char *model, const char *route)
{
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->keys[i].model, model) && !strcmp(s->keys[i].route, route))
            return &s->keys[i];
    if (s->n == SERIES_KEYS) return &s->keys[SERIES_KEYS - 1];
    if (s->n == SERIES_KEYS - 1) model = "(other)", route = "(any)";
    key *k = &s->keys[s->n++];
    k->model = lg_xstrdup(model);
    k->route = lg_xstrdup(route);
    return k;
}

void series_add(series *s, const series_point *p, uint64_t now_s)
{
    uint64_t minute = now_s / 60;
    pthread_mutex_lock(&s->mu);
    key *k = find_key(s, p->model ? p->model : "(none)", p->route ? p->route : "(none)");
    bucket *b = &k->b[minute % SERIES_MINUTES];
    if (b->minute != minute) *b = (bucket){.minute = minute};
    for (bucket *c = b; c; c = c == b ? &k->total : NULL) {
        c->requests++;
        c->errors += p->status >= 500 || p->status == 0;
        c->trips += p->trips;
        c->recovered += p->outcome && !strcmp(p->outcome, "recovered");
        c->failed += p->outcome && !strcmp(p->outcome, "failed");
        c->tokens_saved += p->tokens_saved;
    }
    pthread_mutex_unlock(&s->mu);
}

/* Writes v as a Prometheus label value (backslash, quote and newline escaped). */
static void put_label(FILE *f, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            fprintf(f, "\\%c", *v);
        else if (*v == '\n')
            fputs("\\n", f);
        else
            fputc(*v, f);
    }
}

char *series_metrics_text(series *s)
{
    static const struct {
        const char *name, *type, *help;
        size_t off;
    } fam[] = {
        {"requests_total", "counter", "Guarded requests finished, by model and route.",
         offsetof(bucket, requests)},
        {"errors_total", "counter", "Guarded requests answered 5xx or not at all.",
         offsetof(bucket, errors)},
        {"trips_total", "counter", "Guard trips, by model and route.", offsetof(bucket, trips)},
        {"recovered_total", "counter", "Exchanges that tripped and recovered on a retry.",
         offsetof(bucket, recovered)},
        {"exhausted_total", "counter", "Exchanges that tripped on every attempt.",
         offsetof(bucket, failed)},
        {"tokens_saved_total", "counter",
         "max_tokens less the tokens generated, summed over the attempts that were cut.",
         offsetof(bucket, tokens_saved)},
    };
    char *buf = NULL;
    size_t len = 0;
    FILE *f = lg_xcheck(open_memstream(&buf, &len));
    pthread_mutex_lock(&s->mu);
    for (size_t m = 0; m < sizeof fam / sizeof *fam; m++) {
        fprintf(f, "# HELP loopguard_model_%s %s\n# TYPE loopguard_model_%s %s\n", fam[m].name,
                fam[m].help, fam[m].name, fam[m].type);
        for (size_t i = 0; i < s->n; i++) {
            fprintf(f, "loopguard_model_%s{model=\"", fam[m].name);
            put_label(f, s->keys[i].model);
            fputs("\",route=\"", f);
            put_label(f, s->keys[i].route);
            fprintf(f, "\"} %llu\n",
                    (unsigned long long)*(const uint64_t *)((const char *)&s->keys[i].total +
                                                            fam[m].off));
        }
    }
    pthread_mutex_unlock(&s->mu);
    fclose(f);
    return buf;
}

char *series_json(series *s, uint64_t now_s)
{
    uint64_t minute = now_s / 60;
    cJSON *root = lg_xcheck(cJSON_CreateObject()), *arr = lg_xcheck(cJSON_CreateArray());
    cJSON_AddNumberToObject(root, "minute_s", 60);
    cJSON_AddNumberToObject(root, "now", (double)now_s);
    cJSON_AddNumberToObject(root, "minutes", SERIES_MINUTES);
    cJSON_AddItemToObject(root, "series", arr);
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->n; i++) {
        key *k = &s->keys[i];
        cJSON *o = lg_xcheck(cJSON_CreateObject()), *pts = lg_xcheck(cJSON_CreateArray());
        cJSON_AddStringToObject(o, "model", k->model);
        cJSON_AddStringToObject(o, "route", k->route);
        for (uint64_t m = minute - (SERIES_MINUTES - 1); m <= minute; m++) {
            const bucket *b = &k->b[m % SERIES_MINUTES];
            if (b->minute != m || !b->requests) continue;
            cJSON *pt = lg_xcheck(cJSON_CreateObject());
            cJSON_AddNumberToObject(pt, "t", (double)(m * 60));
            cJSON_AddNumberToObject(pt, "requests", (double)b->requests);
            cJSON_AddNumberToObject(pt, "errors", (double)b->errors);
            cJSON_AddNumberToObject(pt, "trips", (double)b->trips);
            cJSON_AddNumberToObject(pt, "recovered", (double)b->recovered);
            cJSON_AddNumberToObject(pt, "failed", (double)b->failed);
            cJSON_AddNumberToObject(pt, "tokens_saved", (double)b->tokens_saved);
            cJSON_AddItemToArray(pts, pt);
        }
        cJSON_AddItemToObject(o, "points", pts);
        cJSON_AddItemToArray(arr, o);
    }
    pthread_mutex_unlock(&s->mu);
    char *out = lg_xcheck(cJSON_PrintUnformatted(root));
    cJSON_Delete(root);
    return out;
}
