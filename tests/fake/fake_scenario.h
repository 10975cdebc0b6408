/* fake_scenario.h — the fake upstream's script: what to generate for which request.
 *
 * A scenario is parsed once from JSON (file, or POST /_fake/scenario) into responses whose
 * text is described lazily as segments ("lambda " x 1000 costs one string, not 7 KB). A
 * generation walks a fake_plan over one response: a token iterator across the reasoning,
 * content and tool-call channels that applies the tokenisation mode and the max_tokens
 * cap. Format and semantics: tests/fake/README.md.
 *
 * Scenarios are reference counted because a running generation keeps the script it started
 * with while a test replaces the scenario under it. Single-threaded: no atomics. */
#ifndef FAKE_SCENARIO_H
#define FAKE_SCENARIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cJSON cJSON;

typedef enum { FAKE_TOK_WORDS, FAKE_TOK_CHARS, FAKE_TOK_BYTES } fake_tok_mode;

typedef enum {
    FAKE_SEG_TEXT,
    FAKE_SEG_REPEAT,
    FAKE_SEG_TOKENS,
    FAKE_SEG_STAMP,
    FAKE_SEG_VARIED
} fake_seg_kind;

typedef struct fake_seg {
    fake_seg_kind kind;
    const char *text; /* TEXT, REPEAT unit (borrowed from the scenario's JSON) */
    size_t len;
    long times;         /* REPEAT, STAMP, VARIED count; -1 forever */
    const cJSON *toks;  /* TOKENS: array of strings */
    unsigned long seed; /* VARIED */
    long ntok;          /* tokens in text (TEXT) or in one unit (REPEAT) */
} fake_seg;

typedef struct fake_segs {
    fake_seg *v;
    size_t n;
} fake_segs;

typedef enum {
    FAKE_FAULT_NONE,
    FAKE_FAULT_RESET,
    FAKE_FAULT_STALL,
    FAKE_FAULT_GARBAGE,
    FAKE_FAULT_ERROR_EVENT,
    FAKE_FAULT_HTTP_STATUS,
    FAKE_FAULT_NOT_SSE,
    FAKE_FAULT_TRUNCATED_CHUNKED,
    FAKE_FAULT_CLOSE_BEFORE_HEADERS,
    FAKE_FAULT_SLOW_START,
} fake_fault_kind;

typedef struct fake_fault {
    fake_fault_kind kind;
    long at_token;       /* tokens sent before it strikes (0: right after the headers) */
    int status;          /* http_status / error_event code, default 500 */
    long ms;             /* stall (-1: forever) and slow_start duration */
    const char *message; /* NULL: default text */
    const char *type;    /* NULL: "InternalServerError" */
} fake_fault;

typedef struct fake_tool {
    const char *name;
    const char *id; /* NULL: generated */
    fake_segs args;
} fake_tool;

typedef struct fake_resp {
    const cJSON *match; /* NULL: always fits */
    fake_segs reasoning, content;
    fake_tool *tools;
    size_t ntools;
    fake_tok_mode tok_mode;
    long tok_bytes;
    const char *finish_reason; /* NULL: "stop" / "tool_calls" */
    const cJSON *stop_reason;  /* vLLM stop_reason; NULL: null */
    const cJSON *matched_stop; /* SGLang matched_stop for "stop"; NULL: 151645 */
    long pace_us;              /* pace_us, or pace_ms * 1000; -1: inherit */
    long first_byte_ms;        /* -1: inherit */
    long prompt_tokens;        /* -1: estimate */
    bool merge_boundary;
    bool stream_forever;
    bool open_tag;                 /* inline: send the opening tag */
    fake_segs open_seg, close_seg; /* inline tag tokens */
    fake_fault fault;
    long nth_seen; /* requests that fitted every other criterion */
} fake_resp;

typedef struct fake_scenario {
    int refs;
    cJSON *root;         /* owns every borrowed string above */
    const char *dialect; /* NULL: from the command line */
    const char *model;   /* NULL: from the command line */
    long pace_us;        /* -1: unset */
    long first_byte_ms;  /* -1: unset */
    fake_resp *resp;
    size_t nresp;
} fake_scenario;

/* Parses a scenario. Returns a scenario with one reference, or NULL with a message naming
 * the problem in err. The JSON text is copied (parsed); the caller keeps json. */
fake_scenario *fake_scenario_parse(const char *json, size_t len, char *err, size_t errlen);
/* Reads and parses FILE; NULL with err set on failure. */
fake_scenario *fake_scenario_load(const char *path, char *err, size_t errlen);
fake_scenario *fake_scenario_ref(fake_scenario *sc);
/* Drops a reference; frees at zero. NULL is a no-op. */
void fake_scenario_unref(fake_scenario *sc);
/* Resets every response's nth counter. */
void fake_scenario_reset_counters(fake_scenario *sc);

/* Returns the index of the first response that fits the request, or -1. headers is an
 * object of lower-case header names (may be NULL); body may be NULL. Advances the nth
 * counters of the entries whose other criteria held, as documented. */
int fake_scenario_match(fake_scenario *sc, const char *path, const cJSON *headers,
                        const cJSON *body);

/* True when the request body asks to continue the final assistant message. */
bool fake_is_continuation(const cJSON *body);
/* Deterministic prompt size estimate: 4 per message plus the words of every content. */
long fake_prompt_tokens(const cJSON *body);

/* ---- plans: the token stream of one generation ---- */

typedef enum {
    FAKE_CH_REASONING,
    FAKE_CH_CONTENT,
    FAKE_CH_TOOL_HEAD, /* one token per call: the function name */
    FAKE_CH_TOOL_ARGS,
} fake_channel;

typedef struct fake_part {
    fake_channel ch;
    int tool;              /* tool index for TOOL_* */
    const fake_segs *segs; /* NULL for TOOL_HEAD */
    long ntok;             /* tokens this part sends after the cap (LONG_MAX: forever) */
} fake_part;

typedef struct fake_token {
    fake_channel ch;
    int tool;
    const char *p; /* valid until the next fake_plan_next */
    size_t n;
    bool last_of_part;
    bool reasoning; /* part of the response's reasoning (whatever channel carries it) */
} fake_token;

typedef struct fake_plan {
    const fake_resp *r;
    fake_part *parts;
    size_t nparts;
    long total;       /* tokens planned after the cap; LONG_MAX forever */
    long raw_total;   /* tokens before the cap; LONG_MAX forever */
    bool cut;         /* the cap shortened the plan: finish "length" */
    bool stamp;       /* content tokens become w<ns> stamps */
    long reasoning_n; /* reasoning tokens planned (any channel they are sent on) */
    /* cursor */
    size_t part, seg;
    long left, rep, idx;
    size_t off;
    uint64_t rng;
    char tmp[64];
} fake_plan;

/* Where reasoning goes: its own channel; inline in the content between the tags (inline
 * dialect, text completions); inline without the opening tag (/generate); nowhere (plain
 * OpenAI, which has no reasoning field). */
typedef enum { FAKE_R_SEPARATE, FAKE_R_INLINE, FAKE_R_INLINE_NO_OPEN, FAKE_R_DROP } fake_rmode;

/* Builds the plan of response r. cap: max tokens (<= 0: 4096; ignored by stream_forever).
 * stamp: content tokens become w<ns> stamps. Returns 0, or -1 on out-of-memory; the plan
 * borrows r (the caller holds a scenario reference). fake_plan_free releases it. */
int fake_plan_init(fake_plan *pl, const fake_resp *r, fake_rmode rmode, long cap, bool stamp);
/* Next token, or false when the plan is exhausted. */
bool fake_plan_next(fake_plan *pl, fake_token *t);
void fake_plan_free(fake_plan *pl);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t fake_now_ns(void);

#endif
