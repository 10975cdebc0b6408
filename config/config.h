/* config.h — loopguard's configuration: the in-memory shape, built-in defaults, loading
 * from a JSON file, LOOPGUARD_* environment variables and command-line flags, and
 * validation.
 *
 * Precedence: built-in defaults < config file < LOOPGUARD_* environment < flags.
 * An unknown or mistyped key is an error that names the key ("retry.max_atempts: unknown
 * key"). A loaded lg_config is immutable and shared read-only by every worker thread;
 * it is freed once, by main(), after the workers have stopped. */
#ifndef LG_CONFIG_H
#define LG_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "guard/guard.h"

typedef enum {
    LG_UPSTREAM_AUTO = 0, /* probe once at start: /get_model_info, then /version */
    LG_UPSTREAM_SGLANG,
    LG_UPSTREAM_VLLM,
    LG_UPSTREAM_OPENAI, /* generic: never sent SGLang/vLLM-only fields */
} lg_upstream_kind;

typedef enum {
    LG_REASONING_CONTENT = 0, /* delta.reasoning_content (default) */
    LG_REASONING_FIELD,       /* delta.reasoning */
    LG_REASONING_INLINE,      /* <think>…</think> at the head of content */
    LG_REASONING_HIDE,        /* dropped */
} lg_reasoning_output;

typedef enum {
    LG_HISTORY_REWRITE = 0, /* move the client's reasoning field to the upstream's */
    LG_HISTORY_KEEP,        /* forward as the client sent it */
    LG_HISTORY_DROP,        /* remove reasoning from assistant messages */
} lg_reasoning_history;

/* How the kernel schedules the worker threads (worker.c, set_scheduling). */
typedef enum {
    LG_SCHED_BATCH = 0, /* SCHED_BATCH: a wake-up does not preempt the task running (default) */
    LG_SCHED_NORMAL,    /* SCHED_OTHER, as the process started */
} lg_worker_scheduling;

typedef enum { LG_RETRY_AUTO = 0, LG_RETRY_RESTART, LG_RETRY_CONTINUE } lg_retry_mode;

typedef enum {
    LG_EXHAUSTED_CONTENT_FILTER = 0, /* end with finish_reason "content_filter" + [DONE] */
    LG_EXHAUSTED_PASS_THROUGH,       /* let the last attempt run unguarded */
    LG_EXHAUSTED_ERROR,              /* end with an OpenAI error (event) */
} lg_exhausted_action;

typedef enum {
    LG_CAPTURE_EXCERPT = 0, /* first and last bytes of the prompt */
    LG_CAPTURE_FULL,
    LG_CAPTURE_NONE,
} lg_capture;

typedef enum { LG_ELSEWHERE_AUTO = 0, LG_ELSEWHERE_NEVER } lg_retry_elsewhere;

/* One rung of the retry ladder: what attempt k+1 changes relative to the client's
 * original sampling. A field whose has_* flag is false is left as the client sent it. */
typedef struct lg_sampling_step {
    double temperature_add; /* added to the client's temperature (default 1.0 if unset) */
    bool has_presence_penalty;
    double presence_penalty;
    bool has_frequency_penalty;
    double frequency_penalty;
    bool has_repetition_penalty; /* only sent to SGLang and vLLM upstreams */
    double repetition_penalty;
    bool new_seed; /* set a fresh random seed */
} lg_sampling_step;

/* Per-model overrides, first match wins; `pattern` is a PCRE2 regex on the request's
 * `model` field. Fields left unset (-1 / NULL) inherit the global value. */
typedef struct lg_model_rule {
    char *pattern;
    void *re;          /* pcre2_code *, compiled at load */
    int guard_enabled; /* -1 unset, 0 off, 1 on */
    int think_opened;  /* -1 unset; 1: the chat template opens <think> in the prompt */
    guard_params *guard[LG_CH_COUNT]; /* NULL: inherit */
} lg_model_rule;

typedef struct lg_config {
    /* listen: "HOST:PORT"; port 0 picks a free one (printed at start). */
    char *listen_host;
    int listen_port;

    /* upstream: one base URL or a list; no trailing slash. */
    char **upstreams;
    size_t n_upstreams;
    lg_upstream_kind upstream_kind;

    int workers;                /* 0 = number of cores */
    unsigned max_connections;   /* per process; libmicrohttpd's default is FD_SETSIZE-4 */
    unsigned rlimit_nofile;     /* raised at start (soft up to hard) */
    size_t max_body_bytes;      /* request body limit, 413 past it (32 MiB) */
    size_t max_header_bytes;    /* per-connection header memory (libmicrohttpd pool) */
    unsigned client_timeout_s;  /* idle client connection timeout (slowloris) */
    unsigned shutdown_grace_ms; /* SIGTERM: drain streams this long, then end them */
    lg_worker_scheduling worker_scheduling; /* the workers' kernel policy (worker.c) */

    struct {
        unsigned connect_ms;
        unsigned first_byte_ms;
        unsigned idle_ms; /* between two upstream events */
    } timeouts;

    struct {
        lg_reasoning_output output;
        bool allow_client_choice; /* honour X-Loopguard-Reasoning */
        lg_reasoning_history history;
    } reasoning;

    struct {
        bool enabled;
        bool allow_client_off; /* honour X-Loopguard: off */
        guard_params *channel[LG_CH_COUNT];
        size_t holdback_max_bytes; /* past this the held tail is released regardless */
        unsigned keepalive_ms;     /* SSE comment while holding back this long */
    } guard;

    lg_model_rule *models;
    size_t n_models;

    struct {
        unsigned max_attempts; /* including the first */
        lg_retry_mode mode;
        lg_exhausted_action on_exhausted;
        lg_retry_elsewhere elsewhere;
        lg_sampling_step *ladder; /* ladder[0] applies to attempt 2, ... last repeats */
        size_t n_ladder;
    } retry;

    struct {
        char *path; /* NULL: no file, /loopguard/incidents only */
        lg_capture capture;
        size_t max_record_bytes;
        unsigned recent; /* how many /loopguard/incidents keeps */
    } incidents;

    struct {
        char *listen; /* NULL: admin endpoints on the main listener */
        char *token;  /* NULL: no bearer token required */
    } admin;

    char **api_keys; /* inbound keys clients must present; NULL/0: open */
    size_t n_api_keys;

    /* What one client may cost before a request reaches a route (proxy/edge.c); 0 turns
     * a time or count limit off. */
    struct {
        unsigned header_timeout_ms; /* the request head must be complete within this */
        unsigned body_timeout_ms;   /* the body gets this long, plus 1 s per body_min_rate bytes */
        unsigned body_min_rate;     /* bytes per second */
        unsigned max_conns_per_ip;  /* open connections per client address (IPv6: per /64) */
        size_t max_json_nodes;      /* values in a guarded request's JSON body */
        unsigned max_json_depth;    /* nesting of that body */
    } limits;

    /* Extra routes the relay may forward besides the built-in allow-list (edge.h): exact
     * paths, or prefixes ending with '*' ("*" opens every path). */
    struct {
        char **allow;
        size_t n_allow;
    } passthrough;

    struct {
        char *path;
        unsigned interval_ms;
        unsigned unhealthy_after; /* consecutive failures */
        unsigned healthy_after;   /* consecutive successes */
    } health;

    struct {
        double trip_ratio;     /* eject when trip rate > ratio × others' rate */
        double min_trip_rate;  /* ... and above this absolute rate */
        unsigned min_requests; /* minimum sample in the window */
        unsigned window_s;
        unsigned backoff_ms;
    } eject;

    struct {
        char *access; /* NULL or "off": no access log; "stderr"; else a file path */
    } log;
} lg_config;

/* Returns a config holding the built-in defaults; never NULL (aborts on OOM). */
lg_config *config_new_defaults(void);

/* Applies the JSON file at `path` over `cfg`. Returns 0, or -1 with a message naming the
 * file and the key in `err` (NUL-terminated, truncated to errlen). */
int config_load_file(lg_config *cfg, const char *path, char *err, size_t errlen);

/* Applies the JSON text `json` (as if it were a file's content) over `cfg`. */
int config_load_string(lg_config *cfg, const char *json, char *err, size_t errlen);

/* Applies LOOPGUARD_* variables from `envp` (NULL-terminated "K=V" strings): the key path
 * upper-cased with '.' -> '__', e.g. LOOPGUARD_RETRY__MAX_ATTEMPTS=5,
 * LOOPGUARD_UPSTREAM=http://h:30000 (comma-separated list allowed), values parsed as JSON
 * when they parse, else as strings. Returns 0 or -1 with err. */
int config_apply_env(lg_config *cfg, char *const *envp, char *err, size_t errlen);

/* Setters for the command-line flags. Each returns 0 or -1 with err. */
int config_set_listen(lg_config *cfg, const char *hostport, char *err, size_t errlen);
int config_set_upstream(lg_config *cfg, const char *url, char *err, size_t errlen);
int config_set_upstream_kind(lg_config *cfg, const char *kind, char *err, size_t errlen);

/* Splits a "HOST:PORT" or "[V6]:PORT" the way listen and admin.listen are read: *host is
 * malloc'd (the caller frees it), *port 0..65535. Returns 0 or -1 with err. */
int config_split_hostport(const char *hostport, char **host, int *port, char *err, size_t errlen);

/* Cross-field checks after everything is applied (e.g. at least one upstream).
 * Returns 0 or -1 with err. */
int config_validate(const lg_config *cfg, char *err, size_t errlen);

/* The model rule whose pattern matches `model` (may be NULL), or NULL. Thread-safe. */
const lg_model_rule *config_model_rule(const lg_config *cfg, const char *model);

/* Guard params for `ch` under `rule` (rule may be NULL): the rule's own or the global. */
const guard_params *config_guard_params(const lg_config *cfg, const lg_model_rule *rule,
                                        lg_channel ch);

const char *config_reasoning_output_name(lg_reasoning_output o);
int config_reasoning_output_parse(const char *s, lg_reasoning_output *out);
const char *config_upstream_kind_name(lg_upstream_kind k);

/* No-op on NULL. */
void config_free(lg_config *cfg);

#endif
