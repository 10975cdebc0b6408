/* incident.h — the incident log: one JSON Lines record per guarded exchange that tripped,
 * appended to a file by a writer thread so that no worker ever waits on the disk, plus an
 * in-memory ring of the most recent records for /loopguard/incidents.
 *
 * Workers hand over finished records (incident_log_submit); the writer thread batches them
 * into the file. The queue between them is bounded: when the disk cannot keep up, records
 * are dropped and counted rather than letting memory grow or a worker block. A file that
 * cannot be written (full disk, removed directory, permissions) is counted as write errors
 * and retried with a back-off; SIGHUP/logrotate is served by incident_log_reopen. */
#ifndef LG_INCIDENT_H
#define LG_INCIDENT_H

#include <stddef.h>
#include <stdint.h>

typedef struct incident_log incident_log;

/* Opens (creates, appends to) `path` and starts the writer thread. `path` NULL: no file and
 * no thread; records are only kept for /loopguard/incidents. `recent` is how many records
 * incident_log_recent_json returns (0: none kept); `max_record_bytes` caps one record
 * (see incident_log_submit). Returns NULL with a message in err when the file cannot be
 * opened or the thread cannot start. */
incident_log *incident_log_open(const char *path, unsigned recent, size_t max_record_bytes,
                                char *err, size_t errlen);

/* Takes ownership of `line`: malloc'd JSON text of one record (an object), no newline.
 * Never blocks on disk: the mutex is held only to push onto the bounded queue and the
 * recent ring; when the queue is full the record is dropped from the file (counted in
 * `dropped`) but still shown in the recent ring. A record longer than max_record_bytes
 * has its longest strings cut to a common length (the record gains `"truncated": true`;
 * counted in `truncated`); an oversized record that is not a JSON object or cannot be cut
 * to fit is dropped and counted. Records within the limit are not parsed. Thread-safe;
 * no-op when l is NULL (line is freed). */
void incident_log_submit(incident_log *l, char *line);

/* Asks the writer to close and reopen the file (SIGHUP after logrotate has renamed it).
 * Returns at once. Call from a normal thread context, not from a signal handler. */
void incident_log_reopen(incident_log *l);

/* Blocks until every record submitted before the call has been written or has failed.
 * For tests and orderly shutdown; never call it from a worker's event loop. */
void incident_log_flush(incident_log *l);

/* A malloc'd JSON array of the recent records, oldest first ("[]" when none). The copy is
 * made outside the lock, so a large ring does not stall submitters. Thread-safe. */
char *incident_log_recent_json(incident_log *l);

typedef struct incident_stats {
    uint64_t submitted;    /* records handed to incident_log_submit */
    uint64_t written;      /* records fully appended to the file */
    uint64_t dropped;      /* not written: queue full, oversized, or not a JSON object */
    uint64_t write_errors; /* not written: the file could not be opened or written */
    uint64_t reopens;      /* reopen requests served (whether or not the open succeeded) */
    uint64_t truncated;    /* records cut down to max_record_bytes (and then kept) */
} incident_stats;

/* A snapshot of the counters (each read atomically; they may be mutually a moment apart). */
void incident_log_stats(incident_log *l, incident_stats *out);

/* Writes everything still queued, stops the thread, closes the file and frees the log.
 * No-op on NULL. */
void incident_log_close(incident_log *l);

#endif
