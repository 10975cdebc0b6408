/* upstream.h — the set of inference replicas loopguard sends generations to.
 *
 * One pool per process, shared by all workers through atomics only (no locks on the hot
 * path). It knows each replica's kind (SGLang, vLLM, generic OpenAI; probed once at start
 * when configured as auto), its outstanding requests (least-outstanding balancing with a
 * random tie-break), its health (active checks by a background thread, passive ones from
 * connect errors and 5xx) and its degeneration record (the share of generations that tripped
 * the guard over a sliding window), from which outlier replicas are ejected for a back-off. */
#ifndef LG_UPSTREAM_H
#define LG_UPSTREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

typedef struct lg_pool lg_pool;

/* Builds the pool from cfg->upstreams. For upstream_kind auto, probes each replica once
 * (GET /get_model_info -> SGLang, GET /version -> vLLM, else generic; a replica that does
 * not answer is probed again by the health checker). Never NULL. */
lg_pool *pool_new(const lg_config *cfg);

/* Starts the background health checker (no-op when cfg->health.interval_ms is 0). */
int pool_start(lg_pool *p);

size_t pool_size(const lg_pool *p);
const char *pool_base(const lg_pool *p, size_t i);
/* Replica i's base URL + path, malloc'd (the caller frees it); never NULL. */
char *pool_url(const lg_pool *p, size_t i, const char *path);
lg_upstream_kind pool_kind(const lg_pool *p, size_t i);
const char *const *pool_names(const lg_pool *p);

/* Picks a replica for a new attempt: healthy and not ejected, least outstanding requests,
 * random tie-break; `avoid` (or SIZE_MAX) is skipped when another eligible one exists.
 * Never fails: with nothing eligible it falls back to the least-bad replica. Increments
 * the replica's outstanding count; pair with pool_release. Thread-safe. */
size_t pool_acquire(lg_pool *p, size_t avoid);
void pool_release(lg_pool *p, size_t i);

/* Passive health: a transport error or 5xx (ok=false) or a good response (ok=true). */
void pool_report_health(lg_pool *p, size_t i, bool ok);
/* Degeneration record: one finished guarded generation on replica i, tripped or not.
 * Returns true when this report ejected the replica. */
bool pool_report_generation(lg_pool *p, size_t i, bool tripped);

/* JSON array describing each replica's state (for /loopguard/upstreams); malloc'd. */
char *pool_json(lg_pool *p);
/* Prometheus text for the per-replica state the pool owns (healthy, ejected, ejections,
 * requests); malloc'd. */
char *pool_metrics_text(lg_pool *p);
/* Stops the health checker and frees. No-op on NULL. */
void pool_free(lg_pool *p);

/* Hook for ejection incidents: called (from any thread) when a replica is ejected or
 * returns. Set once before pool_start. */
typedef void (*pool_event_fn)(void *ud, size_t replica, const char *event, const char *json);
void pool_set_event_hook(lg_pool *p, pool_event_fn fn, void *ud);

#endif
