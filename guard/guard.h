/* guard.h — the online degeneration detector.
 *
 * A guard reads the text deltas of one channel of one generation attempt (reasoning,
 * content or tool-call arguments) and decides, as early as it can, whether the text has
 * fallen into a loop. It is pure C: no I/O, no threads, no globals. One guard object per
 * channel per attempt; guard_params are immutable after construction and may be shared by
 * any number of guards on any threads.
 *
 * The verdict does not depend on how the text was chunked: feeding a text one byte at a
 * time or all at once trips at the same byte with the same verdict. */
#ifndef LG_GUARD_H
#define LG_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cJSON cJSON;

typedef enum {
    LG_CH_REASONING = 0,
    LG_CH_CONTENT,
    LG_CH_TOOL_ARGS,
    LG_CH_COUNT,
} lg_channel;

/* Opaque thresholds for one channel (detector settings, PCRE2 rules, budgets). */
typedef struct guard_params guard_params;

/* What a tripped guard reports. Strings are owned by the guard (valid until guard_free). */
typedef struct guard_verdict {
    const char *detector; /* "repeat", "lines", "novelty", "rule:<name>", "budget",
                             "empty_answer", "leak" */
    lg_channel channel;
    uint64_t loop_start; /* byte offset (in this channel) where the loop began */
    uint64_t at_byte;    /* bytes fed when the guard decided */
    const char *unit;    /* the repeating unit (or matched text), NUL-terminated, ≤ 256 B */
    size_t unit_len;
    unsigned repeats; /* how many times the unit was seen */
} guard_verdict;

/* Defaults for `ch`, chosen from measurements (see README). Never NULL (aborts on OOM). */
guard_params *guard_params_new(lg_channel ch);
/* Deep copy; never NULL. */
guard_params *guard_params_clone(const guard_params *p);
/* Applies a JSON object of guard settings over `p` (keys documented in
 * config/loopguard.example.json). Returns 0, or -1 with err naming the key; `prefix` is
 * prepended to key names in messages ("guard.reasoning"). Compiles PCRE2 rules. */
int guard_params_apply_json(guard_params *p, const cJSON *obj, const char *prefix, char *err,
                            size_t errlen);
bool guard_params_enabled(const guard_params *p);
/* No-op on NULL. */
void guard_params_free(guard_params *p);

/* A new guard for one channel; `p` must outlive it. Never NULL (aborts on OOM). */
typedef struct guard guard;
guard *guard_new(const guard_params *p, lg_channel ch);

/* Feeds `len` bytes. Returns true when the guard is (now or already) tripped; after a
 * trip further input is ignored. Amortised O(len). */
bool guard_feed(guard *g, const char *buf, size_t len);

/* Prefetches the lines of g that every fed token reads, for a guard_feed soon after (the
 * worker calls it before the read the token comes from: lg_xfer.warm). Reads nothing. */
void guard_warm(const guard *g);

/* End of the generation for this channel: flushes pending checks (e.g. a UTF-8 tail).
 * Returns true when tripped. */
bool guard_finish(guard *g);

/* Cross-channel signal: the generation finished with `reasoning_bytes` of reasoning and no
 * answer. Trips `content_guard` with detector "empty_answer" when the params enable it and
 * reasoning_bytes is at least their minimum. Returns true when tripped. */
bool guard_report_empty_answer(guard *content_guard, uint64_t reasoning_bytes);

/* Gives the guard the request's prompt: the text that asked for this generation. Repetition
 * the prompt asks for ("repeat it 50 times", "a 10x10 grid", "20 rows") or that copies
 * material the prompt holds (a table to reformat, a file to rewrite) earns slack bounded by
 * what the prompt holds; without a prompt every unit is judged strictly. The guard copies
 * what it keeps (the last GUARD_PROMPT_MAX bytes, 32 KiB): the caller's text may go away
 * after the call. Call before the first feed; calls append (with a newline between).
 * O(len). */
void guard_set_prompt(guard *g, const char *text, size_t len);

/* The same from a request or record object: the text of "instruction", "prompt" (a string
 * or an array of strings), "system" and "instructions", "input", and the "content" of every
 * message of "messages" (a string, or the "text" of each content part), in that order.
 * Other keys are ignored; NULL or a non-object adds nothing. */
void guard_set_prompt_json(guard *g, const cJSON *obj);

/* Turns the leak detector off for this guard: in a text completion the client owns the
 * template, so template tokens in the text are not a leak. Call before the first feed. */
void guard_disable_leaks(guard *g);

bool guard_tripped(const guard *g);
/* Valid when guard_tripped(); NULL otherwise. */
const guard_verdict *guard_get_verdict(const guard *g);

/* Number of trailing bytes (of those fed) that could still become part of a loop and
 * should be held back from the client. Always ≤ bytes fed, never splits a UTF-8 sequence,
 * and never more than the params' holdback cap. */
size_t guard_suspect(const guard *g);

uint64_t guard_bytes(const guard *g);
/* The params and channel g was made (or last reset) for. */
const guard_params *guard_params_of(const guard *g);
lg_channel guard_channel(const guard *g);

/* Returns g to the state guard_new(p, ch) makes, keeping memory it can reuse (itself, its
 * 8-gram table, its history, its prompt buffer up to 4 KiB): given the same calls, a reset
 * guard returns, trips, reports and holds back exactly as a new one would. p may be other
 * params than g's; g's old params must still be valid during the call. The old verdict's
 * strings die with the call. For a caller that keeps guards for reuse (a worker's spares). */
void guard_reset(guard *g, const guard_params *p, lg_channel ch);

/* No-op on NULL. */
void guard_free(guard *g);

/* The text detectors' tables (about 11 KiB a guard: the lines window, the novelty and cycle
 * rings, the template's and the block's state), kept between the answers of one thread's
 * guards. A guard makes them when its answer first needs them (most answers do, at the
 * latest when they end) and, with a store, gives them to the store when it is reset and
 * takes them from there zeroed instead of allocating new ones; a guard holds them only
 * while its answer has them, so a spare or a young stream costs no more memory. A store
 * holds at most GUARD_STORE_SETS of each table and belongs to one thread, as its guards do.
 * Without a store (NULL) a guard allocates and frees its own. */
typedef struct guard_store guard_store;
#define GUARD_STORE_SETS 16
guard_store *guard_store_new(void);
/* Frees s and the tables it holds; no-op on NULL. Guards that used it may still be freed
 * after it (guard_free gives nothing back), not fed or reset. */
void guard_store_free(guard_store *s);
/* g takes and gives back its tables through s from now on, across resets (NULL: none). */
void guard_use_store(guard *g, guard_store *s);

const char *guard_channel_name(lg_channel ch);

#endif
