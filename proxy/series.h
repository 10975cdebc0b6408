/* series.h — what the status page plots: per (model, route), per minute, over the last
 * SERIES_MINUTES minutes, the requests, trips, outcomes of exchanges that tripped, and the
 * tokens loops would have cost had they run to max_tokens ("tokens saved").
 *
 * Fed once per finished guarded exchange (accesslog_exchange), read by GET
 * /loopguard/series. One mutex, taken once per exchange, never per token. Memory is
 * bounded: at most SERIES_KEYS (model, route) pairs; later pairs count under model
 * "(other)". */
#ifndef LG_SERIES_H
#define LG_SERIES_H

#include <stdint.h>

#define SERIES_MINUTES 30
#define SERIES_KEYS    64

typedef struct series series;

series *series_new(void);
void series_free(series *s);

typedef struct series_point {
    const char *model; /* NULL: "(none)" */
    const char *route;
    int status;
    unsigned trips;
    const char *outcome; /* of an exchange that tripped, else NULL */
    uint64_t tokens_saved;
} series_point;

/* Counts one finished exchange in the minute of `now_s` (wall clock). Thread-safe. */
void series_add(series *s, const series_point *p, uint64_t now_s);

/* The since-start totals per (model, route) as Prometheus text: loopguard_model_
 * {requests,errors,trips,recovered,exhausted,tokens_saved}_total{model,route}. malloc'd. */
char *series_metrics_text(series *s);

/* {"minute_s":60,"now":T,"minutes":N,"series":[{"model","route","points":[{"t":epoch_s,
 * "requests","errors","trips","recovered","failed","tokens_saved"},...]},...]}: points
 * oldest first, minutes without traffic left out. malloc'd. Thread-safe. */
char *series_json(series *s, uint64_t now_s);

#endif
