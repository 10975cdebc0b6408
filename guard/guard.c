/* guard.c — the online degeneration detector: one state object per channel per attempt.
 *
 * This file owns what every detector shares: the history of the bytes fed, the feeding loop,
 * the verdict and the holdback. The detectors themselves live in files of their own behind
 * the guard_detector interface (guard_int.h) and are consulted in the order of the table
 * below:
 *   leak     — a configured template token (`<|im_end|>`, a second `</think>`) ends here
 *              (g_leak.c).
 *   rule:*   — an operator PCRE2 pattern matched (g_rules.c).
 *   repeat   — the tail is periodic: some period p has repeated often enough for its class
 *              of unit (g_repeat.c).
 *   lines    — one line/sentence keeps coming back, and the text between its returns is
 *              itself made of returns (g_lines.c);
 *   template — many lines in a row on one template, differing in one slot (g_template.c);
 *   novelty  — almost no new word trigrams over a window: a paraphrase loop (g_novelty.c);
 *              the three read the words, lines and segments g_text.c cuts the text into.
 *   budget   — the channel ran past budget_bytes; and the empty answer (g_budget.c).
 *
 * Every detector is a byte-at-a-time state machine, and the heavier work (PCRE2 rules) is
 * scheduled at absolute byte offsets, never at the edges of the caller's chunks. That is the
 * whole trick behind chunking invariance: the state after n bytes is a function of those n
 * bytes only, so feeding one byte at a time or the whole text at once trips at the same byte
 * with the same verdict. For speed each detector runs over a whole piece of the text in a
 * pass of its own (feed_piece), with the same result as consulting them all, in table order,
 * byte after byte; a token, where a pass per detector costs more than its work, goes
 * through their steps for one byte in one loop (feed_short, g_short.h).
 *
 * Cost: O(1) amortised per byte (a hash, a table probe at about one byte in 22, ≤
 * GUARD_NCAND compares, a few counters); tests/bench/guard_bench.c measures it. Memory: a
 * guard starts at about 4 KiB (itself, the first KiB of history and the 8-gram table); the
 * segment window and the trigram tables come with the first segment that ends, the word list
 * grows with the words of a segment, and the history grows with the text up to GUARD_BUF
 * (16 KiB). guard_bench reports the bytes per guard: after 60 tokens of a paced stream, and
 * after an answer of 2,000 bytes. */
#include <stdlib.h>
#include <string.h>

#include "guard/g_short.h"

/* The detectors in the order they are consulted for each byte. */
enum { D_LEAK, D_RULES, D_REPEAT, D_TEXT, D_BUDGET, NDET };
static const guard_detector *const detectors[NDET] = {
    [D_LEAK] = &guard_det_leak, [D_RULES] = &guard_det_rules,   [D_REPEAT] = &guard_det_repeat,
    [D_TEXT] = &guard_det_text, [D_BUDGET] = &guard_det_budget,
};
_Static_assert(NDET <= 8 * sizeof(unsigned), "guard.on has a bit for every detector");
/* The detectors with a suspect hook: guard_suspect has a call site for each. */
#define SUSPECTS (1u << D_LEAK | 1u << D_RULES | 1u << D_REPEAT)

void *guard_xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) abort();
    return p;
}

/* Turns on the detectors p configures, in table order: each takes over its part of `old`
 * (a copy of the guard being reset, NULL for a new one) when it was on there and can, or is
 * set up anew; what old's other detectors hold is released. */
static void setup_detectors(guard *g, guard *old)
{
    unsigned kept = 0;
    for (size_t k = 0; k < NDET; k++) {
        const guard_detector *d = detectors[k];
        if (d->on && !d->on(g->p)) continue;
        if (!d->suspect != !(SUSPECTS & 1u << k)) abort(); /* SUSPECTS is out of date */
        g->on |= 1u << k;
        if (old && d->reset && (old->on & 1u << k)) {
            d->reset(g, old);
            kept |= 1u << k;
        } else if (d->init) {
            d->init(g);
        }
    }
    for (size_t k = 0; old && k < NDET; k++)
        if ((old->on & ~kept & 1u << k) && detectors[k]->release) detectors[k]->release(old);
}

guard *guard_new(const guard_params *p, lg_channel ch)
{
    /* On a cache line's boundary (struct guard's alignment): the fields every token reads
     * (guard_int.h) are then 3 lines, where malloc's 16-byte alignment would make them 4
     * three times in four. */
    guard *g = aligned_alloc(64, (sizeof(*g) + 63) & ~(size_t)63);
    if (!g) abort();
    memset(g, 0, sizeof(*g));
    g->p = p;
    g->ch = ch;
    g->bcap = GUARD_BUF_FIRST;
    g->buf = malloc(g->bcap); /* only bytes already fed are ever read */
    if (!g->buf) abort();
    setup_detectors(g, NULL);
    return g;
}

/* The prompt buffer a reset guard keeps up to this size: a spare guard's prompt stays small. */
#define GUARD_KEEP_MAX 4096

void guard_reset(guard *g, const guard_params *p, lg_channel ch)
{
    guard old = *g;
    memset(g, 0, sizeof(*g));
    g->p = p;
    g->ch = ch;
    /* The history is kept whatever its size: a guard reused for answer after answer (a
     * worker's spares) would otherwise grow it anew in each (make_room), through the
     * allocator and a copy of what it holds. A spare holds at most GUARD_BUF.
     * A history of another capacity grows and slides at the same offsets (make_room): it
     * slides only once full at GUARD_BUF, whatever size it started from. */
    g->buf = old.buf;
    g->bcap = old.bcap;
    if (old.prompt_cap <= GUARD_KEEP_MAX) {
        g->prompt = old.prompt;
        g->prompt_cap = old.prompt_cap;
        g->prompt_of = old.prompt_of;
    } else {
        guard_prompt_release(&old);
    }
    g->unit = old.unit;
    g->store = old.store;
    setup_detectors(g, &old);
}

void guard_use_store(guard *g, guard_store *s)
{
    g->store = s;
}

void guard_free(guard *g)
{
    if (!g) return;
    g->store = NULL; /* it may be gone (guard_store_free) */
    for (unsigned k = 0; k < NDET; k++)
        if ((g->on & 1u << k) && detectors[k]->release) detectors[k]->release(g);
    guard_prompt_release(g);
    free(g->unit);
    free(g->buf);
    free(g);
}

/* The verdict's unit buffer, allocated with the trip: most guards never trip. */
static char *unit_buf(guard *g)
{
    if (!g->unit) g->unit = guard_xcalloc(1, GUARD_UNIT_MAX + 1);
    return g->unit;
}

void guard_set_unit(guard *g, uint64_t start, uint64_t end)
{
    unit_buf(g);
    if (start < g->base) start = g->base;
    size_t n = end > start ? (size_t)(end - start) : 0;
    if (n > GUARD_UNIT_MAX) {
        n = GUARD_UNIT_MAX;
        for (int k = 0; k < 3 && n > 0 && guard_is_cont(guard_at(g, start + n)); k++)
            n--;
    }
    if (n) memcpy(g->unit, g->buf + (start - g->base), n);
    g->unit[n] = 0;
    g->v.unit = g->unit;
    g->v.unit_len = n;
}

void guard_trip(guard *g, const char *detector, uint64_t loop_start, uint64_t at_byte,
                unsigned repeats)
{
    g->tripped = true;
    g->v.detector = detector;
    g->v.channel = g->ch;
    g->v.loop_start = loop_start;
    g->v.at_byte = at_byte;
    g->v.repeats = repeats;
    if (!g->v.unit) {
        unit_buf(g)[0] = 0;
        g->v.unit = g->unit;
        g->v.unit_len = 0;
    }
}

/* ---- feeding ----------------------------------------------------------------------- */

/* Makes room for more bytes when the history is full: doubles a history below GUARD_BUF
 * (an answer of n bytes holds at most 2 n), slides a full one down to its last
 * GUARD_HISTORY bytes. Either way g->buf may move; nothing keeps a pointer into it across a
 * call. Growing by half (1.5 n at most) took six reallocations to an 8 KiB answer, which
 * copied 21 KiB: with many saturated streams, whose guards are mostly new ones, a sixth of
 * the cache lines the guard touched per event; doubling takes three and copies 7 KiB
 * (tests/bench/HISTORY.md, gbyte). A paced answer of the bench (960 bytes) never grows it. */
static void make_room(guard *g)
{
    if (g->bcap < GUARD_BUF) {
        size_t cap = g->bcap * 2 < GUARD_BUF ? g->bcap * 2 : GUARD_BUF;
        unsigned char *grown = realloc(g->buf, cap);
        if (!grown) abort();
        g->buf = grown;
        g->bcap = (uint32_t)cap;
        return;
    }
    memmove(g->buf, g->buf + (GUARD_BUF - GUARD_HISTORY), GUARD_HISTORY);
    g->base += GUARD_BUF - GUARD_HISTORY;
}

/* Feeds a piece of GUARD_SHORT bytes or more that fits the history as it is. Each detector
 * runs over the piece in a pass of its own, which keeps its state in registers, in table
 * order. A pass takes the bytes
 * [fed0, fed0 + lim) (copied into the history first) and returns the index of the byte it
 * trips at, or lim; a trip at byte k bounds the later passes to the bytes before k, and a
 * later trip overwrites the verdict. The result is what feeding one byte at a time through
 * every detector in that order gives: the earliest byte that trips, and at that byte the
 * first detector. Returns true on a trip. */
static bool feed_piece(guard *g, const unsigned char *s, size_t n)
{
    const uint64_t fed0 = g->fed;
    memcpy(g->buf + (fed0 - g->base), s, n);
    size_t lim = n; /* bytes every later pass still judges; a trip at lim when lim < n */
    /* One call site per detector, not one in a loop: each site then always calls the same
     * detector, which the branch predictor learns, where one site calling each detector in
     * turn missed its target at almost every call, a few times per token. Which are on is
     * g->on, on a line every piece reads; the detectors are the program's table: a list of
     * them in the guard was two lines of its own, two cache misses a piece with many paced
     * streams. */
    const unsigned on = g->on;
#define PASS(k)                                                                                    \
    if (on & 1u << (k)) lim = detectors[k]->pass(g, lim, fed0)
    PASS(D_LEAK);
    PASS(D_RULES);
    PASS(D_REPEAT);
    PASS(D_TEXT);
    PASS(D_BUDGET);
#undef PASS
    _Static_assert(NDET == 5, "feed_piece has a call site for each detector");
    if (lim == n) {
        g->fed = fed0 + n;
        return false;
    }
    g->fed = fed0 + lim + 1; /* the history ends where the verdict was taken */
    return true;
}

/* The bytes s[0..n) of a short piece (offset fed0 on, copied to h) byte after byte through
 * the steps of the detectors on, in table order, up to the byte the rules run at (rules_at,
 * n: none); returns the index of the byte that trips, or n. Inlined into feed_short with
 * leak, repeat, text and words as constants for the usual set, whose bytes then pay no test
 * for them. */
__attribute__((always_inline)) static inline size_t short_loop(guard *g, const unsigned char *s,
                                                               size_t n, uint64_t fed0,
                                                               size_t rules_at, bool leak,
                                                               bool repeat, bool text, bool words)
{
    unsigned char *h = g->buf + (fed0 - g->base);
    uint64_t gram = g->gram; /* in a register: no step reads it */
    size_t i = 0;
    for (; i < n; i++) {
        const unsigned char b = s[i];
        const uint64_t pos = fed0 + i;
        h[i] = b;
        if (leak && guard_leak_step(g, b, pos + 1)) break;
        if (i == rules_at && detectors[D_RULES]->pass(g, i + 1, fed0) == i) break;
        if (repeat) {
            gram = gram << 8 | b;
            if (guard_repeat_step(g, gram, h + i, pos)) break;
        }
        if (text) {
            unsigned cls = guard_alnum_class[b];
            if (cls)
                guard_text_alnum(g, b, cls, pos, words);
            else if (guard_text_other(g, b, pos, words))
                break;
        }
    }
    g->gram = gram;
    return i;
}

/* Feeds a piece shorter than GUARD_SHORT (a token or so) that fits the history: byte after
 * byte through the step of every detector that is on, in table order (g_short.h), which
 * gives what feed_piece's passes give; the rules and the budget, which act at one offset
 * each, through their passes at that one (the budget's is the piece's last byte then).
 * Returns true on a trip. */
static bool feed_short(guard *g, const unsigned char *s, size_t n)
{
    _Static_assert(NDET == 5, "feed_short has a step for every detector");
    const guard_params *p = g->p;
    const unsigned on = g->on;
    const uint64_t fed0 = g->fed;
    /* The usual set: leak, repeat and text with words, no rules, no budget (a content
     * channel as configured by default). One test per piece for it. */
    const unsigned usual = 1u << D_LEAK | 1u << D_REPEAT | 1u << D_TEXT;
    if ((on & (usual | 1u << D_RULES | 1u << D_BUDGET)) == usual && !g->leaks_off &&
        guard_text_words(p)) {
        size_t i = short_loop(g, s, n, fed0, n, true, true, true, true);
        g->fed = fed0 + i + (i < n); /* on a trip the history ends where the verdict was taken */
        return i < n;
    }
    const bool leak = (on & 1u << D_LEAK) && !g->leaks_off, repeat = on & 1u << D_REPEAT;
    const bool text = on & 1u << D_TEXT, words = guard_text_words(p);
    /* The byte at which the rules run (a multiple of GUARD_RULE_STEP fed), and the one at
     * which the budget trips, where the piece then ends; n: none in this piece. */
    size_t rules_at = n, budget_at = n;
    if (on & 1u << D_RULES) rules_at = (size_t)(GUARD_RULE_STEP - 1 - fed0 % GUARD_RULE_STEP);
    if ((on & 1u << D_BUDGET) && p->budget_bytes - fed0 < n)
        budget_at = (size_t)(p->budget_bytes - fed0);
    size_t m = budget_at < n ? budget_at + 1 : n;
    size_t i = short_loop(g, s, m, fed0, rules_at, leak, repeat, text, words);
    if (i == m && budget_at < n && detectors[D_BUDGET]->pass(g, m, fed0) == budget_at)
        i = budget_at;
    g->fed = fed0 + i + (i < n); /* on a trip the history ends where the verdict was taken */
    return i < n;
}

/* Feeds bytes in pieces that fit the history, so that it grows and slides at the same
 * offsets however the text is cut; returns true at the first byte that trips. */
static bool feed_bytes(guard *g, const unsigned char *s, size_t len)
{
    /* Once per call, not per byte: only guard_report_empty_answer reads it, and not once the
     * guard has tripped, so bytes after a trip in this call may count too. */
    for (size_t i = 0; !g->content_seen && i < len; i++)
        g->content_seen = s[i] > ' ';
    while (len) {
        if (g->fed - g->base == g->bcap) make_room(g);
        size_t room = g->bcap - (size_t)(g->fed - g->base);
        size_t n = room < len ? room : len;
        if (n < GUARD_SHORT ? feed_short(g, s, n) : feed_piece(g, s, n)) return true;
        s += n;
        len -= n;
    }
    return false;
}

void guard_warm(const guard *g)
{
    for (int i = 0; i < GUARD_HOT_LINES; i++)
        __builtin_prefetch((const char *)g + 64 * i, 1);
}

bool guard_feed(guard *g, const char *buf, size_t len)
{
    if (g->tripped || g->finished) return g->tripped;
    if (!g->p->enabled) {
        g->fed += len;
        g->base = g->fed; /* the history holds none of them */
        return false;
    }
    return feed_bytes(g, (const unsigned char *)buf, len);
}

bool guard_finish(guard *g)
{
    if (g->tripped || g->finished || !g->p->enabled) {
        g->finished = true;
        return g->tripped;
    }
    g->finished = true;
    for (unsigned k = 0; k < NDET; k++)
        if ((g->on & 1u << k) && detectors[k]->finish && detectors[k]->finish(g)) return true;
    return false;
}

bool guard_tripped(const guard *g)
{
    return g->tripped;
}

const guard_verdict *guard_get_verdict(const guard *g)
{
    return g->tripped ? &g->v : NULL;
}

uint64_t guard_bytes(const guard *g)
{
    return g->fed;
}

const guard_params *guard_params_of(const guard *g)
{
    return g->p;
}

lg_channel guard_channel(const guard *g)
{
    return g->ch;
}

/* ---- holdback ---------------------------------------------------------------------- */

/* The holdback of s trailing bytes moved onto character boundaries: an unfinished UTF-8
 * sequence at the end held whole, the release point on a character boundary, within the
 * cap. Out of line: most calls return before it (guard_suspect). */
RARE_PATH static size_t suspect_bounds(const guard *g, size_t s)
{
    uint64_t fed = g->fed, keep = g->base;
    for (uint64_t o = fed; o-- > keep && fed - o <= 4;) {
        unsigned char c = guard_at(g, o);
        if (guard_is_cont(c)) continue;
        if (c >= 0xC0) {
            size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
            if (fed - o < len && fed - o > s) s = (size_t)(fed - o);
        }
        break;
    }
    if (s > fed - g->base) s = (size_t)(fed - g->base);
    /* The release point must sit on a character boundary: move it back onto one (hold
     * more), unless that breaks the cap, then forward (hold less). */
    uint64_t cut = fed - s;
    for (int k = 0; k < 3 && cut > g->base && cut < fed && guard_is_cont(guard_at(g, cut)); k++)
        cut--;
    if (fed - cut > g->p->holdback_max) {
        cut = fed - g->p->holdback_max;
        for (int k = 0; k < 3 && cut < fed && cut >= g->base && guard_is_cont(guard_at(g, cut));
             k++)
            cut++;
    }
    return (size_t)(fed - cut);
}

size_t guard_suspect(const guard *g)
{
    uint64_t fed = g->fed;
    size_t s = 0;
    if (!g->p->enabled || fed == 0) return 0;
    if (g->tripped) return suspect_bounds(g, (size_t)(fed - g->v.loop_start));
        /* One call site per hook, as in feed_piece. */
#define SUSPECT(k)                                                                                 \
    if (g->on & 1u << (k)) {                                                                       \
        size_t d = detectors[k]->suspect(g);                                                       \
        if (d > s) s = d;                                                                          \
    }
    SUSPECT(D_LEAK);
    SUSPECT(D_RULES);
    SUSPECT(D_REPEAT);
#undef SUSPECT
    _Static_assert(SUSPECTS == (1u << D_LEAK | 1u << D_RULES | 1u << D_REPEAT),
                   "guard_suspect has a call site for each hook");
    /* An ASCII byte last, and nothing suspect or a release point on a character boundary
     * within the history and the cap, the common answers: no character to keep whole, no
     * boundary to move (what suspect_bounds would find). */
    if (guard_at(g, fed - 1) < 0x80 && (!s || (s <= g->p->holdback_max && s <= fed - g->base &&
                                               !guard_is_cont(guard_at(g, fed - s)))))
        return s;
    return suspect_bounds(g, s);
}
