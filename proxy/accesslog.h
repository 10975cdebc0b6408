/* accesslog.h — the optional access log (`log.access`: off | stderr | a file path): one
 * JSON line per request, at its end, with route, status, model, upstream, attempts, trips,
 * tokens, time to the first byte sent, duration and the request id.
 *
 * The lines go through an incident_log of their own (incident.h): a writer thread appends
 * them, so a worker never waits on the disk; a full queue drops lines (never blocks);
 * SIGHUP reopens the file. "stderr" is the file /dev/stderr. */
#ifndef LG_ACCESSLOG_H
#define LG_ACCESSLOG_H

#include <stdint.h>

#include "proxy/incident.h"

struct exchange;

typedef struct access_entry {
    const char *route;    /* the API route, or the relayed path (no query) */
    int status;           /* the status sent; 0 when the client left before one was */
    const char *model;    /* NULL: not a model request */
    const char *upstream; /* base URL of the last attempt's replica, NULL when none */
    unsigned attempts, trips;
    int64_t tokens;       /* of the attempt that answered; -1: not counted */
    int64_t ttft_us;      /* request start to the first byte of a stream; -1: none */
    uint64_t duration_us; /* request start to now */
    const char *id;       /* loopguard's request id (incidents carry the same), or NULL */
    const char *outcome;  /* of an exchange that tripped, else NULL */
} access_entry;

/* Opens the log `spec` names: NULL or "off" gives NULL (and 0), "stderr" /dev/stderr, else a
 * file appended to. Returns 0, or -1 with err. */
int accesslog_open(const char *spec, incident_log **out, char *err, size_t errlen);

/* Submits one line. No-op when log is NULL. Thread-safe, never blocks on the disk. */
void accesslog_write(incident_log *log, const access_entry *e);

/* Records a finished guarded exchange (what it knows at its destroy): its access log line,
 * and its counts in the status page's per-minute series (series.h). */
void accesslog_exchange(const struct exchange *ex);

#endif
