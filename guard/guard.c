/* guard.c — the online degeneration detector: one state object per channel per attempt.
 *
 * Every detector is a byte-at-a-time state machine, and the heavier work (PCRE2 rules) is
 * scheduled at absolute byte offsets (every GUARD_RULE_STEP bytes), never at the edges of
 * the caller's chunks. That is the whole trick behind chunking invariance: the state after
 * n bytes is a function of those n bytes only, so feeding one byte at a time or the whole
 * text at once trips at the same byte with the same verdict. For speed each detector runs
 * over a whole piece of the text in a pass of its own (feed_piece), with the same result as
 * consulting them all, in the order below, byte after byte.
 *
 * Detectors, in the order they are consulted for each byte:
 *   leak     — a configured template token (`<|im_end|>`, a second `</think>`) ends here.
 *   rule:*   — an operator PCRE2 pattern matched (checked every GUARD_RULE_STEP bytes over
 *              a window of rule_max_match_bytes + GUARD_RULE_STEP, JIT, hard-partial).
 *   repeat   — the tail is periodic: some period p has repeated often enough. Candidate
 *              periods come from an 8-gram table (the distance to the previous occurrence
 *              of the last 8 bytes); a live candidate costs a compare per 16 bytes of a
 *              piece (one per byte of a short chunk).
 *   lines    — one line/sentence keeps coming back, and the text between its returns is
 *              itself made of returns (so "A x A y A z" with fresh x, y, z passes).
 *   novelty  — almost no new word trigrams over a window: a paraphrase loop.
 *   budget   — the channel ran past budget_bytes.
 * Cost: O(1) amortised per byte (a hash probe, ≤ GUARD_NCAND compares, a few counters);
 * tests/bench/guard_bench.c measures it. Memory: about 16.5 KiB per guard, up to 32 KiB as its
 * history grows to GUARD_BUF. */
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "guard/guard_int.h"

#define GUARD_BUF         (2 * GUARD_HISTORY) /* linear history, slid down by half when full */
#define GUARD_BUF_FIRST   1024 /* the history starts this small and doubles up to GUARD_BUF:
                                  most answers are short, and memory per stream counts */
/* The 8-gram table has 2^11 slots, 4 KiB. 2^12 costs 4 KiB more per guard for 139 bytes less
 * of loop shown to clients over the 1,800 loops of the recall corpus (22 loops, ≤ 19 bytes
 * each); the verdicts are the same. */
#define GUARD_GTAB_BITS   11
#define GUARD_NCAND       8
#define GUARD_SHORT       9 /* chunks shorter than this (a token) go byte after byte */
#define GUARD_RULE_STEP   64
#define GUARD_TTAB_BITS   10
#define GUARD_UNIT_MAX    256
#define GUARD_SEG_BUCKETS 1024
#define GUARD_SEG_WORDS   128 /* words of one segment the novelty detector reads */

/* A helper the per-byte loops call only now and then (a new period, a candidate at its
 * threshold, the end of a sentence) stays out of line: inlined into them (feed_short is
 * flattened) it took the registers those loops keep their state in, and they spilled it to
 * the stack on every byte. Out of line: 4.2 % fewer instructions on the bench's stamps,
 * 2.6 % on guard_bench's real text (cachegrind), verdicts unchanged. */
#define RARE_PATH __attribute__((noinline))

/* A live candidate period. Its run (the consecutive bytes ending now with s[i] == s[i -
 * period]) is not counted byte by byte: it is the bytes fed since `start`. */
typedef struct gcand {
    uint64_t start;    /* offset of the run's first byte */
    uint64_t ready_at; /* offset of the byte at which run + period reaches need */
    uint64_t breaks;   /* set as each feed starts (repeat_pass) or per byte (repeat_byte): the
                          first offset being fed that breaks the period, or the one past them */
    uint32_t period;
    uint32_t need;     /* periodic tail length (run + period) that trips */
    bool judged;       /* need already includes the unit's class and fence context */
} gcand;

typedef struct gseg {
    uint64_t hash;
    uint64_t start, end; /* absolute offsets of the segment's text */
    bool seen;           /* its hash was already in the window when it arrived */
    bool prose;
} gseg;

/* A trigram table entry, 4 bytes: memory per stream counts. Both fields are the low 16
 * bits of what they stand for; a wrong "seen" needs a 16-bit tag collision, 1 in 65,536. */
typedef struct gtri {
    uint16_t tag;
    uint16_t word; /* index of the word that completed it, mod 2^16 */
} gtri;

struct guard {
    const guard_params *p;
    lg_channel ch;
    uint64_t fed;
    bool finished;
    bool tripped;
    bool content_seen; /* a non-whitespace byte was fed (empty_answer) */

    /* History: buf[i] is the byte at absolute offset base + i. */
    unsigned char *buf;
    uint64_t base;
    size_t blen, bcap; /* bytes held, bytes allocated (GUARD_BUF_FIRST .. GUARD_BUF) */

    /* repeat */
    uint64_t gram;
    uint16_t *gtab; /* 8-gram hash -> low 16 bits of the offset + 1 of its last byte; a
                       stale or colliding entry is caught by the run measurement */
    gcand cand[GUARD_NCAND];
    unsigned ncand;

    /* Markdown code fences (``` or ~~~ at the head of a line, ≤ 3 spaces in). */
    unsigned fstate; /* 0 leading spaces, 1 in a fence run, 2 rest of line */
    unsigned fcol, frun;
    unsigned char fch, open_ch;
    unsigned open_len;
    bool in_fence;

    /* The current segment (line or sentence) and its words. */
    uint64_t seg_hash, seg_start;
    uint32_t seg_len, seg_alpha, seg_code, seg_words,
        seg_wide; /* non-space bytes, letters, code chars */
    unsigned char seg_lastc;
    bool seg_gap;
    unsigned char prev, prev2;
    struct {
        uint64_t hash;
        uint64_t start : 63, alpha : 1; /* 16 bytes a word, not 24: memory per stream */
    } sw[GUARD_SEG_WORDS];
    unsigned nsw;
    uint64_t w_hash, w_start;
    uint32_t w_len;
    bool w_alpha;      /* the word starts with a letter */
    uint32_t cp;       /* code point being decoded */
    unsigned cp_need;  /* continuation bytes still expected */
    uint64_t cp_start; /* offset of its first byte */

    /* lines */
    gseg *segs;
    unsigned seg_mask;
    unsigned char seg_count[GUARD_SEG_BUCKETS]; /* window segments per hash bucket */
    uint64_t nsegs;

    /* novelty */
    uint64_t wh[3], ws[3];
    unsigned char walpha; /* bit i: word i of the trigram starts with a letter */
    uint32_t nwords;
    gtri *ttab;
    uint64_t *tri_start; /* ring over the novelty window: first byte of each trigram */
    unsigned char *tri_novel;
    uint64_t ntri;
    unsigned novel; /* novel trigrams in the window */

    /* rules */
    pcre2_match_data *md;
    /* Per rule: no match can start before this offset (every earlier start already failed
     * before reaching the end of the text). Advanced by checks and by guard_suspect, which
     * is why it lives behind a pointer: the suspect query takes a const guard. */
    uint64_t *rule_from;

    unsigned char leak_last[32];  /* bitset: last bytes of leak tokens */
    unsigned char leak_first[32]; /* and first bytes */
    unsigned char leak_any[32];   /* both together: most bytes are in neither */
    unsigned char leak_bytes[4];  /* the bytes of leak_any when it has at most 4 (the */
    unsigned n_leak_bytes;        /* rest repeat the first), for a 16-byte scan; else 0 */
    size_t leak_maxlen;           /* 0: no leak tokens (none configured, or disabled) */
    uint64_t leak_start; /* offset + 1 of the last byte that can start a token */

    guard_verdict v;
    char unit[GUARD_UNIT_MAX + 1];
};

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) abort();
    return p;
}

guard *guard_new(const guard_params *p, lg_channel ch)
{
    guard *g = xcalloc(1, sizeof(*g));
    g->p = p;
    g->ch = ch;
    g->bcap = GUARD_BUF_FIRST;
    g->buf = malloc(g->bcap); /* only bytes already fed are ever read */
    if (!g->buf) abort();
    g->seg_hash = g->w_hash = 0xCBF29CE484222325ull;
    g->gtab = xcalloc((size_t)1 << GUARD_GTAB_BITS, sizeof(*g->gtab));
    /* Rings are sized to a power of two so that indexing is a mask, not a division. */
    for (g->seg_mask = 1; g->seg_mask < p->lines.window; g->seg_mask <<= 1)
        ;
    g->segs = xcalloc(g->seg_mask--, sizeof(*g->segs));
    g->ttab = xcalloc((size_t)1 << GUARD_TTAB_BITS, sizeof(*g->ttab));
    g->tri_start = xcalloc(p->novelty.window, sizeof(*g->tri_start));
    g->tri_novel = xcalloc(p->novelty.window, 1);
    if (p->n_rules) {
        size_t ovec = 1;
        for (size_t i = 0; i < p->n_rules; i++) {
            uint32_t n = 0;
            pcre2_pattern_info(p->rules[i].re, PCRE2_INFO_CAPTURECOUNT, &n);
            if (n + 1 > ovec) ovec = n + 1;
        }
        g->md = pcre2_match_data_create((uint32_t)ovec, NULL);
        if (!g->md) abort();
        g->rule_from = xcalloc(p->n_rules, sizeof(*g->rule_from));
    }
    for (size_t i = 0; i < p->n_leaks; i++) {
        unsigned char last = (unsigned char)p->leaks[i][p->leak_len[i] - 1];
        unsigned char first = (unsigned char)p->leaks[i][0];
        g->leak_last[last >> 3] |= (unsigned char)(1u << (last & 7));
        g->leak_first[first >> 3] |= (unsigned char)(1u << (first & 7));
        g->leak_any[last >> 3] |= (unsigned char)(1u << (last & 7));
        g->leak_any[first >> 3] |= (unsigned char)(1u << (first & 7));
        if (p->leak_len[i] > g->leak_maxlen) g->leak_maxlen = p->leak_len[i];
    }
    for (unsigned c = 0; c < 256 && g->n_leak_bytes <= 4; c++) {
        if (!(g->leak_any[c >> 3] & (1u << (c & 7)))) continue;
        if (g->n_leak_bytes < 4) g->leak_bytes[g->n_leak_bytes] = (unsigned char)c;
        g->n_leak_bytes++;
    }
    if (g->n_leak_bytes > 4) g->n_leak_bytes = 0;
    for (unsigned k = g->n_leak_bytes; k && k < 4; k++)
        g->leak_bytes[k] = g->leak_bytes[0];
    return g;
}

void guard_free(guard *g)
{
    if (!g) return;
    free(g->buf);
    free(g->gtab);
    free(g->segs);
    free(g->ttab);
    free(g->tri_start);
    free(g->tri_novel);
    pcre2_match_data_free(g->md);
    free(g->rule_from);
    free(g);
}

static inline unsigned char at(const guard *g, uint64_t off)
{
    return g->buf[off - g->base];
}

static bool is_cont(unsigned char c)
{
    return (c & 0xC0) == 0x80;
}

/* Copies history [start, end) into the verdict's unit, cut to GUARD_UNIT_MAX bytes on a
 * UTF-8 boundary. Bytes older than the history are skipped. */
static void set_unit(guard *g, uint64_t start, uint64_t end)
{
    if (start < g->base) start = g->base;
    size_t n = end > start ? (size_t)(end - start) : 0;
    if (n > GUARD_UNIT_MAX) {
        n = GUARD_UNIT_MAX;
        for (int k = 0; k < 3 && n > 0 && is_cont(at(g, start + n)); k++)
            n--;
    }
    if (n) memcpy(g->unit, g->buf + (start - g->base), n);
    g->unit[n] = 0;
    g->v.unit = g->unit;
    g->v.unit_len = n;
}

/* Records the verdict; `at_byte` is the number of bytes fed when decided. */
static void trip(guard *g, const char *detector, uint64_t loop_start, uint64_t at_byte,
                 unsigned repeats)
{
    g->tripped = true;
    g->v.detector = detector;
    g->v.channel = g->ch;
    g->v.loop_start = loop_start;
    g->v.at_byte = at_byte;
    g->v.repeats = repeats;
    if (!g->v.unit) {
        g->unit[0] = 0;
        g->v.unit = g->unit;
        g->v.unit_len = 0;
    }
}

/* ---- repeat ------------------------------------------------------------------------ */

/* Classifies the unit u[0..n) (any rotation gives the same answer). O(n); runs once per
 * candidate, when its tail first reaches the plain threshold. */
static guard_rclass classify(const unsigned char *u, size_t n, bool *codep)
{
    size_t letters = 0, hexletters = 0, digits = 0, spaces = 0, nl = 0, commas = 0, pipes = 0;
    size_t code = 0, loud = 0, wide = 0, words = 0, prose_end = 0;
    bool in_word = false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = u[i];
        bool wordc = false;
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') {
            letters++;
            if ((c | 0x20) <= 'f' || (c | 0x20) == 'x') hexletters++;
            wordc = true;
        } else if (c >= '0' && c <= '9') {
            digits++;
            wordc = true;
        } else if (c == ' ' || c == '\t' || c == '\r') {
            spaces++;
        } else if (c == '\n') {
            nl++;
            unsigned char b = u[(i + n - 1) % n];
            if (b == '.' || b == '!' || b == '?' || b == ':') prose_end++;
        } else if (c == ',') {
            commas++;
        } else if (c == '|') {
            pipes++;
        } else if (c == '!' || c == '?') {
            loud++;
        } else if (c >= 0xC0) {
            /* Box drawing and block elements (U+2500–U+259F: E2 94..96) are rules, and
             * so is U+FFFD (EF BF BD), the filler of decoded binary tables; everything
             * else outside ASCII counts as text. */
            unsigned char c1 = u[(i + 1) % n], c2 = u[(i + 2) % n];
            if (!(c == 0xE2 && c1 >= 0x94 && c1 <= 0x96) &&
                !(c == 0xEF && c1 == 0xBF && c2 == 0xBD))
                wide++;
        } else if (strchr("=(){}[]<>;_\\`&@", c)) {
            code++;
        } else if (c == '.' && ((u[(i + 1) % n] | 0x20) >= 'a' && (u[(i + 1) % n] | 0x20) <= 'z')) {
            code++; /* member access: "MachineState.START" */
        }
        if (wordc && !in_word && (c | 0x20) >= 'a' && (c | 0x20) <= 'z') words++;
        in_word = wordc;
    }
    *codep = code * 50 >= n; /* at least 2% code characters */
    if (pipes) return GR_TABLE;
    if (!letters && !wide) {
        if (digits) return GR_DATA;
        return loud ? GR_NORMAL : GR_RULE;
    }
    if (!wide && digits && letters == hexletters && letters <= digits) return GR_DATA;
    if (nl) {
        /* A line of prose ends with sentence punctuation and is mostly letters and
         * spaces; "The user is asking for the result of 2+2.\n" is, code is not. */
        size_t body = n - nl;
        bool prose = prose_end == nl && words >= 3 && (letters + spaces) * 10 >= body * 8;
        return prose || wide ? GR_NORMAL : GR_LINE;
    }
    if (*codep) return GR_CODE;
    if (!spaces && !wide && !loud) return GR_BLOB;
    if (commas && words <= 1 && n <= 24) return GR_ITEM;
    return GR_NORMAL;
}

/* The tail length a candidate must reach once its unit's class and the fence are known;
 * `end` is the offset just past the byte being judged. */
static uint32_t judge(const guard *g, const gcand *c, uint64_t end)
{
    const guard_params *p = g->p;
    const unsigned char *u = g->buf + (end - c->period - g->base);
    bool code;
    guard_rclass cls = classify(u, c->period, &code);
    /* The period table counts characters, not bytes: "。" is one character repeated. */
    uint32_t chars = 0;
    for (uint32_t i = 0; i < c->period; i++)
        chars += !is_cont(u[i]);
    double reps = guard_steps_repeats(p, chars ? chars : 1);
    uint32_t minb = p->repeat.min_bytes;
    /* A class's own thresholds hold up to its max_period (0: any period); past it, a
     * long block is judged as code, or as prose when it has no code characters. */
    if (p->repeat.cls[cls].max_period && chars > p->repeat.cls[cls].max_period)
        cls = code ? GR_CODE : GR_NORMAL;
    {
        if (p->repeat.cls[cls].min_repeats > reps) reps = p->repeat.cls[cls].min_repeats;
        if (p->repeat.cls[cls].min_bytes > minb) minb = p->repeat.cls[cls].min_bytes;
    }
    if (g->in_fence) {
        reps *= p->repeat.fence_factor;
        minb = (uint32_t)(minb * p->repeat.fence_factor);
    }
    return guard_need_for(c->period, reps, minb);
}

/* Trips "repeat" for a tail periodic in `period` that ends at `end`: reports the smallest
 * period that divides it and where the periodic stretch began (bounded by the history). */
static void repeat_trip(guard *g, uint32_t period, uint64_t end)
{
    const unsigned char *u = g->buf + (end - period - g->base);
    uint32_t q = period;
    for (uint32_t d = 1; d < period; d++) {
        if (period % d) continue;
        uint32_t i;
        for (i = d; i < period && u[i] == u[i - d]; i++)
            ;
        if (i == period) {
            q = d;
            break;
        }
    }
    uint64_t j = end - 1;
    while (j >= g->base + q && at(g, j) == at(g, j - q))
        j--;
    uint64_t loop_start = j + 1 - q;
    set_unit(g, loop_start, loop_start + q);
    trip(g, "repeat", loop_start, end, (unsigned)((end - loop_start) / q));
}

/* The offset at which candidate c, its run starting at c->start, reaches c->need. */
static inline uint64_t cand_ready_at(const gcand *c)
{
    uint64_t over = (uint64_t)c->need > (uint64_t)c->period + 1 ? c->need - c->period - 1 : 0;
    return c->start + over;
}

/* The first offset k in [from, to) with buf[k] != buf[k - period], or `to`. Every byte read
 * is in the history: from - period ≥ base, to ≤ the bytes held. */
static uint64_t period_break(const guard *g, uint32_t period, uint64_t from, uint64_t to)
{
    const unsigned char *s = g->buf + (from - g->base), *t = s - period;
    size_t n = (size_t)(to - from), i = 0;
#ifdef __SSE2__
    for (; i + 16 <= n; i += 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(s + i));
        __m128i y = _mm_loadu_si128((const __m128i *)(const void *)(t + i));
        unsigned m = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(x, y)) ^ 0xFFFF;
        if (m) return from + i + (unsigned)__builtin_ctz(m);
    }
    /* A last block under 16 bytes: the 16 bytes that end it, when both lie in the history,
     * with the bytes before it masked off. */
    size_t rest = n - i;
    if (rest && (size_t)(t + n - g->buf) >= 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(s + n - 16));
        __m128i y = _mm_loadu_si128((const __m128i *)(const void *)(t + n - 16));
        unsigned m = ((unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(x, y)) ^ 0xFFFF) >> (16 - rest);
        return m ? from + i + (unsigned)__builtin_ctz(m) : to;
    }
#endif
    while (i < n && s[i] == t[i])
        i++;
    return from + i;
}

/* The 8 bytes ending at pos also end at pos - d, inside the history (the caller compared
 * them): tracks period d, unless it is live already, when a slot is free or holds a
 * shorter run. The live candidates are those of the caller's list at pos. */
static void cand_add(guard *g, uint64_t pos, uint32_t d, uint64_t end)
{
    for (unsigned i = 0; i < g->ncand; i++)
        if (g->cand[i].period == d) return;
    /* Measure the run by walking back from those 8 bytes: O(run), and a run only starts
     * being tracked once, so this is amortised O(1). */
    uint64_t j = pos - 8;
    while (j >= g->base + d && at(g, j) == at(g, j - d))
        j--;
    unsigned slot = g->ncand;
    if (slot == GUARD_NCAND) { /* replace the shortest run, the latest start */
        slot = 0;
        for (unsigned i = 1; i < GUARD_NCAND; i++)
            if (g->cand[i].start > g->cand[slot].start) slot = i;
        if (g->cand[slot].start <= j + 1) return;
    } else {
        g->ncand++;
    }
    gcand *c = &g->cand[slot];
    c->start = j + 1;
    c->period = d;
    c->need = g->p->repeat.base_need[d];
    c->judged = false;
    c->ready_at = cand_ready_at(c);
    c->breaks = period_break(g, d, pos + 1, end);
}

/* At offset pos, the byte of a piece that ends at `end`: drops the candidates whose period
 * broke by now, tracks period d (0: none), judges (once) the candidates whose run reached
 * their threshold and trips when one still holds. Returns true on a trip; else *next is
 * the offset of the next candidate that will reach its threshold before its period breaks
 * (UINT64_MAX: none). RARE_PATH. */
RARE_PATH static bool cand_event(guard *g, uint64_t pos, uint32_t d, uint64_t end, uint64_t *next)
{
    unsigned n = 0;
    for (unsigned i = 0; i < g->ncand; i++) /* the list keeps its order */
        if (g->cand[i].breaks > pos) g->cand[n++] = g->cand[i];
    g->ncand = n;
    if (d) cand_add(g, pos, d, end);
    *next = UINT64_MAX;
    for (unsigned i = 0; i < g->ncand; i++) {
        gcand *c = &g->cand[i];
        if (pos >= c->ready_at && !c->judged) {
            c->judged = true;
            c->need = judge(g, c, pos + 1);
            c->ready_at = cand_ready_at(c);
        }
        if (pos >= c->ready_at) {
            repeat_trip(g, c->period, pos + 1);
            return true;
        }
        if (c->ready_at < c->breaks && c->ready_at < *next) *next = c->ready_at;
    }
    return false;
}

/* The 8 bytes of history ending at offset end (≥ base + 7) as the repeat detector's gram:
 * the byte at end lowest. */
static inline uint64_t gram_at(const guard *g, uint64_t end)
{
    uint64_t v;
    memcpy(&v, g->buf + (end - 7 - g->base), sizeof v);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

/* Records the 8-gram ending at offset pos and returns the period it shows that is not live
 * yet, or 0. Every 8-gram is recorded, but looked up only at every fourth offset: a new
 * period is noticed at most 3 bytes later (its run is measured exactly anyway), and the
 * unpredictable "seen before?" branch runs a quarter as often. The candidates' `breaks`
 * must be past pos for those still live. */
/* The 8-gram table slot of gram. */
static inline uint32_t gram_slot(uint64_t gram)
{
    return (uint32_t)((gram * 0x9E3779B97F4A7C15ull) >> (64 - GUARD_GTAB_BITS));
}

static inline uint32_t gram_period(guard *g, uint16_t *gtab, uint64_t gram, uint64_t pos)
{
    uint32_t h = gram_slot(gram);
    uint16_t last = gtab[h];
    gtab[h] = (uint16_t)(pos + 1);
    if ((pos & 3) != 0 || !last) return 0;
    /* A slot may hold another 8-gram, or an old one: only a real match is a period, and
     * comparing the 8 bytes is cheaper than cand_add finding out. */
    uint32_t d = (uint16_t)((uint16_t)(pos + 1) - last);
    if (!(d >= 1 && d <= g->p->repeat.max_period && pos >= d + g->base + 7 &&
          gram_at(g, pos - d) == gram))
        return 0;
    /* Most periods found are live already (a loop finds its own every 4 bytes). */
    for (unsigned k = 0; k < g->ncand; k++)
        if (g->cand[k].period == d && g->cand[k].breaks > pos) return 0;
    return d;
}

/* The repeat detector over a piece (see feed_piece). The live candidates are not advanced
 * byte by byte: where each one's period breaks in the piece is found first, 16 bytes at a
 * time, and the per-byte loop only records 8-grams, looks for new periods and stops where
 * something happens (cand_event). */
static size_t repeat_pass(guard *g, const unsigned char *s, size_t lim, uint64_t fed0)
{
    uint16_t *const gtab = g->gtab;
    const uint64_t end = fed0 + lim;
    uint64_t gram = g->gram, next = UINT64_MAX;
    for (unsigned k = 0; k < g->ncand; k++) {
        gcand *c = &g->cand[k];
        c->breaks = period_break(g, c->period, fed0, end);
        if (c->ready_at < c->breaks && c->ready_at < next) next = c->ready_at;
    }
    size_t i = 0;
    while (i < lim) {
        uint64_t pos = fed0 + i;
        /* Three bytes that are only recorded, then the one looked up: when no candidate
         * comes due among them, they need no test at all. */
        if ((pos & 3) == 1 && lim - i >= 4 && next > pos + 2) {
            gram = gram << 8 | s[i];
            gtab[gram_slot(gram)] = (uint16_t)(pos + 1);
            gram = gram << 8 | s[i + 1];
            gtab[gram_slot(gram)] = (uint16_t)(pos + 2);
            gram = gram << 8 | s[i + 2];
            gtab[gram_slot(gram)] = (uint16_t)(pos + 3);
            i += 3;
            pos += 3;
        }
        gram = gram << 8 | s[i];
        uint32_t d = gram_period(g, gtab, gram, pos);
        if ((d || pos >= next) && cand_event(g, pos, d, end, &next)) break;
        i++;
    }
    g->gram = gram;
    if (i == lim) { /* drop the candidates whose period broke in the piece */
        unsigned n = 0;
        for (unsigned k = 0; k < g->ncand; k++)
            if (g->cand[k].breaks == end) g->cand[n++] = g->cand[k];
        g->ncand = n;
    }
    return i;
}

/* The repeat detector for feed_short's byte b at offset pos (gram: the 8 bytes ending
 * there), with the result of repeat_pass over that one byte: for a byte or two a compare
 * per candidate costs less than finding where its period breaks. Returns true on a trip. */
static inline bool repeat_byte(guard *g, uint64_t gram, unsigned char b, uint64_t pos)
{
    const unsigned char *now = g->buf + (pos - g->base);
    bool due = false, died = false;
    for (unsigned k = 0; k < g->ncand; k++) {
        gcand *c = &g->cand[k];
        bool holds = now[-(ptrdiff_t)c->period] == b;
        c->breaks = holds ? pos + 1 : pos;
        died |= !holds;
        due |= holds && pos >= c->ready_at;
    }
    if (died) {
        unsigned n = 0;
        for (unsigned k = 0; k < g->ncand; k++)
            if (g->cand[k].breaks > pos) g->cand[n++] = g->cand[k];
        g->ncand = n;
    }
    uint32_t d = gram_period(g, g->gtab, gram, pos);
    uint64_t next;
    return (d || due) && cand_event(g, pos, d, pos + 1, &next);
}

/* ---- code fences ------------------------------------------------------------------- */

/* A run of ≥ 3 backticks or tildes at the head of a line opens a fence, or closes the
 * open one when it uses the same character and is at least as long. */
static void fence_run_end(guard *g)
{
    if (g->frun < 3) return;
    if (!g->in_fence) {
        g->in_fence = true;
        g->open_ch = g->fch;
        g->open_len = g->frun;
    } else if (g->fch == g->open_ch && g->frun >= g->open_len) {
        g->in_fence = false;
    }
}

static void fence_step(guard *g, unsigned char b)
{
    if (b == '\n') {
        if (g->fstate == 1) fence_run_end(g);
        g->fstate = 0;
        g->fcol = 0;
        return;
    }
    switch (g->fstate) {
    case 0:
        if (b == ' ' && g->fcol < 3) {
            g->fcol++;
        } else if (b == '`' || b == '~') {
            g->fstate = 1;
            g->fch = b;
            g->frun = 1;
        } else {
            g->fstate = 2;
        }
        break;
    case 1:
        if (b == g->fch) {
            g->frun++;
        } else {
            fence_run_end(g);
            g->fstate = 2;
        }
        break;
    default:
        break;
    }
}

/* Does byte b end a run of fence characters that opens or closes a fence? */
static bool fence_toggles(const guard *g, unsigned char b)
{
    if (g->fstate != 1 || b == g->fch || g->frun < 3) return false;
    return !g->in_fence || (g->fch == g->open_ch && g->frun >= g->open_len);
}

/* Follows code fences over s[0..n) and returns how many of those bytes the next piece
 * takes: all, or those before a byte (not the first) that opens or closes a fence. The
 * repeat detector thus reads one fence state for a whole piece. */
static size_t fence_pass(guard *g, const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (g->fstate == 2) { /* the rest of a line: nothing happens before its end */
            const unsigned char *nl = memchr(s + i, '\n', n - i);
            if (!nl) break;
            i = (size_t)(nl - s);
        }
        if (i > 0 && fence_toggles(g, s[i])) return i;
        fence_step(g, s[i]);
    }
    return n;
}

/* ---- segments: lines and sentences ------------------------------------------------- */

/* Byte classes for judging whether a segment is prose. */
enum { BC_LETTER = 1, BC_CODE = 2 };
#define BIT(c) (1ull << ((c)&63))
static inline unsigned char byte_class(unsigned char c)
{
    /* Code characters as two 64-bit masks: = ; < > and @ [ \ ] _ ` { | }. */
    static const uint64_t code[2] = {
        BIT(';') | BIT('<') | BIT('=') | BIT('>'),
        BIT('@') | BIT('[') | BIT('\\') | BIT(']') | BIT('_') | BIT('`') | BIT('{') | BIT('|') |
            BIT('}'),
    };
    if (((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || c >= 0x80) return BC_LETTER;
    return c < 0x80 && (code[c >> 6] >> (c & 63) & 1) ? BC_CODE : 0;
}
#undef BIT

static inline uint64_t fnv(uint64_t h, unsigned char c)
{
    return (h ^ c) * 0x100000001B3ull;
}

static inline uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    return x;
}

/* The lines detector, for a completed segment with a letter. The window keeps every such
 * segment, short ones too (they are what lies between the repeats); only a prose sentence
 * of min_segment_bytes can trigger, because code repeats lines on purpose. `now` is the
 * number of bytes fed when it is decided. Returns true on a trip. */
static bool lines_check(guard *g, uint64_t h, uint64_t start, uint64_t end, bool trigger,
                        bool prose, uint64_t now)
{
    const guard_params *p = g->p;
    unsigned w = p->lines.window, m = g->seg_mask;
    uint64_t first = g->nsegs > w - 1 ? g->nsegs - (w - 1) : 0;
    uint64_t occ[64];
    unsigned nocc = 0, need = p->lines.min_repeats - 1;
    /* Newest first, remembering the last min_repeats-1 earlier occurrences. The bucket
     * counts spare the O(window) scan for the segments seen for the first time (most). */
    if (g->seg_count[h & (GUARD_SEG_BUCKETS - 1)]) {
        for (uint64_t k = g->nsegs; k-- > first;) {
            if (g->segs[k & m].hash != h) continue;
            if (nocc < need && nocc < 64) occ[nocc] = k;
            nocc++;
        }
    }
    g->seg_count[h & (GUARD_SEG_BUCKETS - 1)]++;
    if (g->nsegs >= w - 1)
        g->seg_count[g->segs[(g->nsegs - (w - 1)) & m].hash & (GUARD_SEG_BUCKETS - 1)]--;
    gseg *s = &g->segs[g->nsegs & m];
    s->hash = h;
    s->start = start;
    s->end = end;
    s->seen = nocc > 0;
    s->prose = prose;
    g->nsegs++;
    if (!trigger || nocc < need) return false;
    /* The span from the oldest of those occurrences to now must be made of returns, and
     * of prose at least half: doctests repeat their error messages between code. */
    uint64_t from = occ[need - 1];
    unsigned seen = 0, prosy = 0, total = 0;
    for (uint64_t k = from; k < g->nsegs; k++) {
        total++;
        seen += g->segs[k & m].seen;
        prosy += g->segs[k & m].prose;
    }
    if ((double)seen < p->lines.min_repeat_ratio * total || prosy * 2 < total) return false;
    set_unit(g, start, end);
    trip(g, "lines", g->segs[from & m].start, now, nocc + 1);
    return true;
}

/* The novelty detector, for one word: is the trigram ending here new within
 * memory_words? Trips when fewer than min_ratio of the last `window` trigrams were. Words
 * outside prose only ever count as evidence of novelty (code and templated comments repeat
 * on purpose, but their fresh names still show the text is going somewhere), and a
 * trigram made only of numbers does not count at all (zero tables, version lists). `now`
 * is the number of bytes fed when it is decided. */
static bool novelty_word(guard *g, uint64_t h, uint64_t start, bool alpha, bool prose, uint64_t now)
{
    const guard_params *p = g->p;
    g->wh[0] = g->wh[1];
    g->wh[1] = g->wh[2];
    g->wh[2] = h;
    g->ws[0] = g->ws[1];
    g->ws[1] = g->ws[2];
    g->ws[2] = start;
    g->walpha = (unsigned char)((g->walpha << 1 | alpha) & 7);
    if (++g->nwords < 3 || !g->walpha) return false;

    uint64_t t = mix(g->wh[0] * 3 + mix(g->wh[1] * 5 + mix(g->wh[2])));
    gtri *e = &g->ttab[t >> (64 - GUARD_TTAB_BITS)];
    bool novel = !(e->tag == (uint16_t)t &&
                   (uint16_t)(g->nwords - e->word) <= p->novelty.memory_words);
    e->tag = (uint16_t)t;
    e->word = (uint16_t)g->nwords;
    if (!novel && !prose) return false;

    unsigned w = p->novelty.window, slot = (unsigned)(g->ntri % w);
    if (g->ntri >= w) g->novel -= g->tri_novel[slot];
    g->tri_novel[slot] = novel;
    g->tri_start[slot] = g->ws[0];
    g->novel += novel;
    g->ntri++;
    if (g->ntri < w || g->novel >= p->novelty.min_ratio * w) return false;
    uint64_t from = g->tri_start[g->ntri % w];
    set_unit(g, from, now);
    trip(g, "novelty", from, now, w - g->novel);
    return true;
}

/* A segment (line or sentence) [seg_start, end) is complete when `now` bytes have been
 * fed: hands it to the lines and novelty detectors. Returns true on a trip. RARE_PATH. */
RARE_PATH static bool seg_end(guard *g, uint64_t end, uint64_t now)
{
    const guard_params *p = g->p;
    uint32_t len = g->seg_len;
    /* Prose: no code characters, mostly letters, at least three words. Only a prose
     * sentence (ending in . ! ? or a CJK stop) can trigger the lines detector. */
    bool prose = len && !g->seg_code && g->seg_alpha * 100 >= len * 85 &&
                 (g->seg_words >= 3 || g->seg_wide >= 9);
    unsigned char e = g->seg_lastc;
    bool sentence = prose && (e == '.' || e == '!' || e == '?' || e == 0x82 || e == 0x81 ||
                              e == 0x9F || e == 0xA6);
    bool ok = g->seg_alpha > 0;
    uint64_t h = g->seg_hash, start = g->seg_start;
    unsigned nw = g->nsw;
    g->seg_hash = 0xCBF29CE484222325ull;
    g->seg_len = g->seg_alpha = g->seg_code = g->seg_words = g->seg_wide = 0;
    g->seg_gap = false;
    g->nsw = 0;
    if (p->lines.enabled && ok &&
        lines_check(g, h, start, end, sentence && len >= p->lines.min_segment_bytes, prose, now))
        return true;
    if (p->novelty.enabled)
        for (unsigned i = 0; i < nw; i++)
            if (novelty_word(g, g->sw[i].hash, g->sw[i].start, g->sw[i].alpha, prose, now))
                return true;
    return false;
}

/* A non-space byte joins the current segment (one space stands for each gap). */
static inline void seg_add(guard *g, unsigned char b, uint64_t pos)
{
    /* Branch-free on the gap: word boundaries are too frequent to predict. */
    uint64_t spaced = fnv(g->seg_hash, ' ');
    g->seg_hash = g->seg_gap ? spaced : g->seg_hash;
    g->seg_words += g->seg_gap;
    if (!g->seg_len) {
        g->seg_start = pos;
        g->seg_words = 1;
    }
    g->seg_gap = false;
    g->seg_lastc = b;
    g->seg_hash = fnv(g->seg_hash, b);
    g->seg_len++;
}

/* Per byte b at offset pos, for the lines and novelty detectors. Returns true on a trip. */
static bool lines_step(guard *g, unsigned char b, uint64_t pos)
{
    unsigned char p1 = g->prev, p2 = g->prev2;
    g->prev2 = p1;
    g->prev = b;
    if (b == '\n') return seg_end(g, pos, pos + 1);
    if (b == ' ' || b == '\t' || b == '\r') {
        if ((p1 == '.' || p1 == '!' || p1 == '?') && g->seg_len) return seg_end(g, pos, pos + 1);
        g->seg_gap = g->seg_len > 0;
        return false;
    }
    seg_add(g, b, pos);
    unsigned char bc = byte_class(b);
    g->seg_alpha += bc == BC_LETTER;
    g->seg_code += bc == BC_CODE;
    g->seg_wide += b >= 0x80;
    /* CJK sentence ends: 。 (E3 80 82), ！ (EF BC 81), ？ (EF BC 9F). */
    if ((p2 == 0xE3 && p1 == 0x80 && b == 0x82) ||
        (p2 == 0xEF && p1 == 0xBC && (b == 0x81 || b == 0x9F)))
        return seg_end(g, pos + 1, pos + 1);
    return false;
}

/* ---- words ------------------------------------------------------------------------- */

/* A word ended: it joins the current segment's word list (judged at the segment's end). */
static void word_end(guard *g)
{
    if (!g->w_len) return;
    if (g->nsw < GUARD_SEG_WORDS) {
        g->sw[g->nsw].hash = g->w_hash;
        g->sw[g->nsw].start = g->w_start;
        g->sw[g->nsw].alpha = g->w_alpha;
        g->nsw++;
    }
    g->w_len = 0;
    g->w_hash = 0xCBF29CE484222325ull;
}

static bool is_cjk(uint32_t cp)
{
    return (cp >= 0x2E80 && cp <= 0x2FFF) || (cp >= 0x3040 && cp <= 0x9FFF) ||
           (cp >= 0xAC00 && cp <= 0xD7AF) || (cp >= 0xF900 && cp <= 0xFAFF) ||
           (cp >= 0x20000 && cp <= 0x3FFFF);
}

static bool is_sep_cp(uint32_t cp)
{
    return (cp >= 0x2000 && cp <= 0x2BFF) || (cp >= 0x3000 && cp <= 0x303F) ||
           (cp >= 0xFF00 && cp <= 0xFF20) || cp == 0xA0;
}

static void word_add(guard *g, unsigned char c, uint64_t pos, bool letter)
{
    if (!g->w_len) {
        g->w_start = pos;
        g->w_alpha = letter;
    }
    g->w_len++;
    g->w_hash = fnv(g->w_hash, c >= 'A' && c <= 'Z' ? c | 0x20 : c);
}

/* Splits the stream into words: runs of ASCII letters, digits and '_', and of non-ASCII
 * letters; each CJK character is a word of its own. Must run before lines_step for the
 * same byte, so that a word is in its segment's list when the segment ends. b is the byte
 * at offset pos. */
static void words_step(guard *g, unsigned char b, uint64_t pos)
{
    if (b < 0x80) {
        g->cp_need = 0;
        bool alpha = ((b | 0x20) >= 'a' && (b | 0x20) <= 'z') || b == '_';
        if (alpha || (b >= '0' && b <= '9'))
            word_add(g, b, pos, alpha);
        else
            word_end(g);
        return;
    }
    if (b >= 0xC0) {
        g->cp_need = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : 1;
        g->cp = b & (b >= 0xF0 ? 0x07 : b >= 0xE0 ? 0x0F : 0x1F);
        g->cp_start = pos;
        return;
    }
    if (!g->cp_need) { /* a stray continuation byte: a separator */
        word_end(g);
        return;
    }
    g->cp = (g->cp << 6) | (b & 0x3F);
    if (--g->cp_need) return;
    if (is_sep_cp(g->cp)) {
        word_end(g);
        return;
    }
    bool cjk = is_cjk(g->cp);
    if (cjk) /* scripts without spaces: every character is a word */
        word_end(g);
    for (uint64_t o = g->cp_start; o <= pos; o++)
        word_add(g, at(g, o), g->cp_start, true);
    if (cjk) word_end(g);
}

/* ASCII letters (2) and digits (1); every other byte 0. */
static const unsigned char alnum_class[256] = {
    ['0' ... '9'] = 1, ['A' ... 'Z'] = 2, ['a' ... 'z'] = 2};

#ifdef __SSE2__
/* The bits set in a 16-bit mask. __builtin_popcount is a call into libgcc on baseline
 * x86-64 (no POPCNT instruction), once per 16 bytes of a letter run. */
static inline uint32_t popcount16(unsigned m)
{
    m = m - ((m >> 1) & 0x5555u);
    m = (m & 0x3333u) + ((m >> 2) & 0x3333u);
    m = (m + (m >> 4)) & 0x0F0Fu;
    return (m + (m >> 8)) & 0x1Fu;
}
#endif

#ifdef __SSE2__
/* The constants of alnum_masks, made once per call of alnum_span. */
typedef struct alnum_k {
    __m128i flip, low, a, zero, nlet, ndig;
} alnum_k;

/* The ASCII letters and digits among the 16 bytes at p (*in) and the letters (*lm), as
 * 16-bit masks. (x - lo) < span unsigned is a signed compare once both sides have the top
 * bit flipped. */
static inline void alnum_masks(const alnum_k *k, const unsigned char *p, unsigned *in,
                               unsigned *lm)
{
    __m128i x = _mm_loadu_si128((const __m128i *)(const void *)p);
    __m128i lx = _mm_sub_epi8(_mm_or_si128(x, k->low), k->a);
    __m128i let = _mm_cmplt_epi8(_mm_xor_si128(lx, k->flip), k->nlet);
    __m128i dig = _mm_cmplt_epi8(_mm_xor_si128(_mm_sub_epi8(x, k->zero), k->flip), k->ndig);
    *in = (unsigned)_mm_movemask_epi8(_mm_or_si128(let, dig));
    *lm = (unsigned)_mm_movemask_epi8(let);
}
#endif

/* The length of the run of ASCII letters and digits that starts s[0..n); adds the letters
 * among them to *letters. Sixteen bytes at a time where SSE2 exists (every x86-64); when
 * `before` bytes before s may be read (s lies in the guard's history), a last block shorter
 * than 16 is read as the 16 bytes that end it, with those before it shifted out. */
static size_t alnum_span(const unsigned char *s, size_t n, size_t before, uint32_t *letters)
{
    size_t i = 0;
#ifdef __SSE2__
    const alnum_k k = {_mm_set1_epi8((char)0x80), _mm_set1_epi8(0x20), _mm_set1_epi8('a'),
                       _mm_set1_epi8('0'),        _mm_set1_epi8((char)(26 ^ 0x80)),
                       _mm_set1_epi8((char)(10 ^ 0x80))};
    unsigned in, lm;
    for (; i + 16 <= n; i += 16) {
        alnum_masks(&k, s + i, &in, &lm);
        if (in != 0xFFFF) {
            unsigned e = (unsigned)__builtin_ctz(~in);
            *letters += popcount16(lm & ((1u << e) - 1));
            return i + e;
        }
        *letters += popcount16(lm);
    }
    size_t rest = n - i;
    if (rest && before + n >= 16) {
        alnum_masks(&k, s + n - 16, &in, &lm);
        unsigned full = (1u << rest) - 1;
        in = (in >> (16 - rest)) & full;
        lm = (lm >> (16 - rest)) & full;
        unsigned e = (unsigned)__builtin_ctz(~in); /* rest when the whole block is a run */
        *letters += popcount16(lm & ((1u << e) - 1));
        return i + e;
    }
#else
    (void)before;
#endif
    for (unsigned c; i < n && (c = alnum_class[s[i]]); i++)
        *letters += c >> 1;
    return i;
}

/* The most common bytes, a run of ASCII letters and digits from s[i] (offset fed0 + i) up
 * to lim: does exactly what words_step and lines_step do with each of them, with the two
 * hashes in registers. `before` bytes before s may be read (see alnum_span). Returns the
 * index past the run. */
static size_t alnum_run(guard *g, const unsigned char *s, size_t i, size_t lim, uint64_t fed0,
                        bool words, size_t before)
{
    uint64_t pos = fed0 + i;
    if (g->seg_gap) { /* one space stands for the gap */
        g->seg_hash = fnv(g->seg_hash, ' ');
        g->seg_words++;
        g->seg_gap = false;
    }
    if (!g->seg_len) {
        g->seg_start = pos;
        g->seg_words = 1;
    }
    if (words && !g->w_len) {
        g->w_start = pos;
        g->w_alpha = s[i] >= 'A';
    }
    uint64_t wh = g->w_hash, sh = g->seg_hash;
    uint32_t letters = 0;
    size_t j = i + alnum_span(s + i, lim - i, before + i, &letters);
    for (size_t k = i; k < j; k++) {
        wh = fnv(wh, s[k] | 0x20); /* lower case; digits have that bit already */
        sh = fnv(sh, s[k]);
    }
    uint32_t run = (uint32_t)(j - i);
    if (words) {
        g->cp_need = 0;
        g->w_hash = wh;
        g->w_len += run;
    }
    g->seg_hash = sh;
    g->seg_len += run;
    g->seg_alpha += letters;
    g->seg_lastc = s[j - 1];
    g->prev2 = run > 1 ? s[j - 2] : g->prev;
    g->prev = s[j - 1];
    return j;
}

/* Any other byte, at offset pos, for the words, lines and novelty detectors. Returns true
 * on a trip. */
static inline bool text_other(guard *g, unsigned char b, uint64_t pos, bool words)
{
    if (words) words_step(g, b, pos);
    return lines_step(g, b, pos);
}

/* The words, lines and novelty detectors over a piece (see feed_piece). It reads the piece
 * from the history, where feed_piece copied it. */
static size_t text_pass(guard *g, size_t lim, uint64_t fed0, bool words)
{
    const unsigned char *s = g->buf + (size_t)(fed0 - g->base);
    size_t before = (size_t)(s - g->buf), i = 0;
    while (i < lim) {
        if (alnum_class[s[i]]) {
            i = alnum_run(g, s, i, lim, fed0, words, before);
            continue;
        }
        if (text_other(g, s[i], fed0 + i, words)) return i;
        i++;
    }
    return lim;
}

/* ---- rules and leaks --------------------------------------------------------------- */

void guard_disable_leaks(guard *g)
{
    /* With no last-byte candidates leak_step never compares and leak_suspect is 0. */
    memset(g->leak_last, 0, sizeof g->leak_last);
    memset(g->leak_first, 0, sizeof g->leak_first);
    memset(g->leak_any, 0, sizeof g->leak_any);
    g->n_leak_bytes = 0;
    g->leak_maxlen = 0;
}

/* Matches rule i against history up to `to`, trying only starts from rule_from[i] on
 * (the subject itself begins up to rule_max_match_bytes + GUARD_RULE_STEP earlier, so
 * lookbehinds and \b see real context). Hard-partial unless `final`. Returns PCRE2's code;
 * on a complete or partial match [*ms, *me) is where it lies. Advances rule_from[i] past
 * every start that failed. Each byte is thus scanned about once, not once per check. */
static int rule_match(const guard *g, size_t i, uint64_t to, bool final, uint64_t *ms, uint64_t *me)
{
    const guard_params *p = g->p;
    uint64_t span = (uint64_t)p->rule_max_match_bytes + GUARD_RULE_STEP;
    uint64_t lo = to > span ? to - span : 0;
    if (lo < g->base) lo = g->base;
    uint64_t from = g->rule_from[i] > lo ? g->rule_from[i] : lo;
    const guard_rule *r = &p->rules[i];
    if (r->has_first) { /* skip to a byte that can start a match: most calls end here */
        while (from < to && !(r->first[at(g, from) >> 3] & (1u << (at(g, from) & 7))))
            from++;
        if (from >= to) {
            g->rule_from[i] = to;
            return PCRE2_ERROR_NOMATCH;
        }
    }
    if (from >= to && !final) return PCRE2_ERROR_NOMATCH;
    uint32_t opt = (final ? 0 : PCRE2_PARTIAL_HARD) | (lo ? PCRE2_NOTBOL : 0);
    int rc = pcre2_match(r->re, g->buf + (lo - g->base), (PCRE2_SIZE)(to - lo),
                         (PCRE2_SIZE)(from - lo), opt, g->md, NULL);
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(g->md);
    if (rc > 0 || rc == PCRE2_ERROR_PARTIAL) {
        *ms = lo + ov[0];
        *me = lo + ov[1];
        g->rule_from[i] = *ms;
    } else {
        g->rule_from[i] = to;
    }
    return rc;
}

/* The rules check at offset `to` (a multiple of GUARD_RULE_STEP, or the end of the text
 * when `final`). Trips on the first complete match, reported at `to`. Returns true on a
 * trip. */
static bool rules_run(guard *g, uint64_t to, bool final)
{
    const guard_params *p = g->p;
    for (size_t i = 0; i < p->n_rules; i++) {
        uint64_t ms, me;
        int rc = rule_match(g, i, to, final, &ms, &me);
        if (rc > 0 && me > ms) {
            set_unit(g, ms, me);
            trip(g, p->rules[i].detector, ms, to, 1);
            return true;
        }
    }
    return false;
}

/* Per byte b, when `now` bytes have been fed (b the last): does a leak token end here?
 * Returns true on a trip. */
static bool leak_step(guard *g, unsigned char b, uint64_t now)
{
    const guard_params *p = g->p;
    if (!(g->leak_any[b >> 3] & (1u << (b & 7)))) return false;
    g->leak_start = g->leak_first[b >> 3] & (1u << (b & 7)) ? now : g->leak_start;
    if (!(g->leak_last[b >> 3] & (1u << (b & 7)))) return false;
    for (size_t i = 0; i < p->n_leaks; i++) {
        size_t n = p->leak_len[i];
        if (now < n || now - n < g->base) continue;
        if (!memcmp(g->buf + (now - n - g->base), p->leaks[i], n)) {
            set_unit(g, now - n, now);
            trip(g, "leak", now - n, now, 1);
            return true;
        }
    }
    return false;
}

#ifdef __SSE2__
/* The bytes of x that equal one of the four leak bytes k[0..4), as a 16-bit mask. */
static inline unsigned leak_hits(const __m128i *k, __m128i x)
{
    __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, k[0]), _mm_cmpeq_epi8(x, k[1])),
                               _mm_or_si128(_mm_cmpeq_epi8(x, k[2]), _mm_cmpeq_epi8(x, k[3])));
    return (unsigned)_mm_movemask_epi8(hit);
}
#endif

/* The index of the first byte of s[0..n) that starts or ends a leak token, or n. s lies in
 * g's history, so a last block shorter than 16 bytes is read as the 16 bytes that end it,
 * with the history before it masked off: the pieces that get here are often 9-15 bytes. */
static size_t leak_scan(const guard *g, const unsigned char *s, size_t n)
{
    size_t i = 0;
#ifdef __SSE2__
    if (g->n_leak_bytes) {
        const __m128i k[4] = {_mm_set1_epi8((char)g->leak_bytes[0]),
                              _mm_set1_epi8((char)g->leak_bytes[1]),
                              _mm_set1_epi8((char)g->leak_bytes[2]),
                              _mm_set1_epi8((char)g->leak_bytes[3])};
        for (; i + 16 <= n; i += 16) {
            unsigned m = leak_hits(k, _mm_loadu_si128((const __m128i *)(const void *)(s + i)));
            if (m) return i + (unsigned)__builtin_ctz(m);
        }
        size_t rest = n - i;
        if (rest && (size_t)(s + n - g->buf) >= 16) {
            const unsigned char *end16 = s + n - 16;
            unsigned m = leak_hits(k, _mm_loadu_si128((const __m128i *)(const void *)end16));
            m >>= 16 - rest;
            return m ? i + (unsigned)__builtin_ctz(m) : n;
        }
    }
#endif
    while (i < n && !(g->leak_any[s[i] >> 3] & (1u << (s[i] & 7))))
        i++;
    return i;
}

/* The leak detector over a piece (see feed_piece): leak_step at the bytes leak_scan finds.
 * It reads the piece from the history, where feed_piece copied it. */
static size_t leak_pass(guard *g, uint64_t fed0, size_t lim)
{
    const unsigned char *s = g->buf + (size_t)(fed0 - g->base);
    size_t i = leak_scan(g, s, lim);
    while (i < lim) {
        if (leak_step(g, s[i], fed0 + i + 1)) return i;
        i++;
        i += leak_scan(g, s + i, lim - i);
    }
    return lim;
}

/* The rules over a piece (see feed_piece): they run at every multiple of GUARD_RULE_STEP
 * bytes fed. */
static size_t rules_pass(guard *g, size_t lim, uint64_t fed0)
{
    for (uint64_t to = (fed0 / GUARD_RULE_STEP + 1) * GUARD_RULE_STEP; to <= fed0 + lim;
         to += GUARD_RULE_STEP)
        if (rules_run(g, to, false)) return (size_t)(to - fed0 - 1);
    return lim;
}

/* ---- feeding ----------------------------------------------------------------------- */

/* Makes room for more bytes when the history is full: doubles a history below GUARD_BUF,
 * slides a full one down to its last GUARD_HISTORY bytes. Either way g->buf may move;
 * nothing keeps a pointer into it across a call. */
static void make_room(guard *g)
{
    if (g->bcap < GUARD_BUF) {
        unsigned char *grown = realloc(g->buf, g->bcap * 2);
        if (!grown) abort();
        g->buf = grown;
        g->bcap *= 2;
        return;
    }
    memmove(g->buf, g->buf + (GUARD_BUF - GUARD_HISTORY), GUARD_HISTORY);
    g->base += GUARD_BUF - GUARD_HISTORY;
    g->blen = GUARD_HISTORY;
}

/* Trips "budget" when the byte at offset pos is past the budget. */
static inline bool budget_byte(guard *g, uint64_t pos)
{
    uint64_t budget = g->p->budget_bytes;
    if (!budget || pos < budget) return false;
    set_unit(g, pos + 1, pos + 1);
    trip(g, "budget", budget, pos + 1, 0);
    return true;
}

/* Feeds a piece that fits the history as it is. Each detector runs over the piece in a pass
 * of its own, which keeps its state in registers, in the order they are consulted for one
 * byte. A pass takes bytes s[0..lim) that follow the fed0 bytes fed before the piece (and
 * are in the history already) and returns the index of the byte it trips at, or lim; a
 * trip at byte k bounds the later passes to the bytes before k, and a later trip
 * overwrites the verdict. The result is what feeding one byte at a time through every
 * detector in that order gives: the earliest byte that trips, and at that byte the first
 * detector. Returns true on a trip. */
static bool feed_piece(guard *g, const unsigned char *s, size_t n)
{
    const guard_params *p = g->p;
    const uint64_t fed0 = g->fed;
    memcpy(g->buf + g->blen, s, n);
    g->blen += n;
    size_t lim = n; /* bytes every later pass still judges; a trip at lim when lim < n */
    if (g->leak_maxlen) lim = leak_pass(g, fed0, lim);
    if (p->n_rules) lim = rules_pass(g, lim, fed0);
    if (p->repeat.enabled) lim = repeat_pass(g, s, lim, fed0);
    if (p->lines.enabled || p->novelty.enabled)
        lim = text_pass(g, lim, fed0, p->novelty.enabled);
    if (p->budget_bytes && p->budget_bytes - fed0 < lim) { /* the first byte past it */
        lim = (size_t)(p->budget_bytes - fed0);
        budget_byte(g, fed0 + lim);
    }
    if (lim == n) {
        g->fed = fed0 + n;
        return false;
    }
    g->fed = fed0 + lim + 1; /* the history ends where the verdict was taken */
    g->blen = (size_t)(g->fed - g->base);
    return true;
}

/* Feeds a short chunk (a token or so) byte after byte through every detector in the order
 * of feed_piece, with the same result: for a few bytes the passes' set-up and loop exits
 * cost more than they save (1-8 byte chunks of random length: guard_bench's token pass).
 * The history has room for the chunk. Returns true on a trip. flatten: the per-byte
 * helpers are shared with the passes, and only inlined here do they keep their state in
 * registers. */
__attribute__((flatten)) static bool feed_short(guard *g, const unsigned char *s, size_t n)
{
    const guard_params *p = g->p;
    const bool leak = g->leak_maxlen, rules = p->n_rules, rep = p->repeat.enabled;
    const bool words = p->novelty.enabled, text = p->lines.enabled || words;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = s[i];
        uint64_t pos = g->fed++;
        g->buf[g->blen++] = b;
        g->gram = g->gram << 8 | b;
        if (rep && (g->fstate != 2 || b == '\n')) fence_step(g, b); /* as fence_pass */
        if (leak && leak_step(g, b, pos + 1)) return true;
        if (rules && (pos + 1) % GUARD_RULE_STEP == 0 && rules_run(g, pos + 1, false)) return true;
        if (rep && repeat_byte(g, g->gram, b, pos)) return true;
        if (text) {
            if (alnum_class[b])
                alnum_run(g, s, i, i + 1, pos - i, words, 0);
            else if (text_other(g, b, pos, words))
                return true;
        }
        if (budget_byte(g, pos)) return true;
    }
    return false;
}

/* Feeds bytes in pieces that fit the history, so that it grows and slides at the same
 * offsets however the text is cut; returns true at the first byte that trips. */
static bool feed_bytes(guard *g, const unsigned char *s, size_t len)
{
    /* Once per call, not per byte: only guard_report_empty_answer reads it, and not once the
     * guard has tripped, so bytes after a trip in this call may count too. */
    for (size_t i = 0; !g->content_seen && i < len; i++) g->content_seen = s[i] > ' ';
    while (len) {
        if (g->blen == g->bcap) make_room(g);
        size_t n = g->bcap - g->blen < len ? g->bcap - g->blen : len;
        if (n < GUARD_SHORT) {
            if (feed_short(g, s, n)) return true;
        } else {
            if (g->p->repeat.enabled) n = fence_pass(g, s, n);
            if (feed_piece(g, s, n)) return true;
        }
        s += n;
        len -= n;
    }
    return false;
}

bool guard_feed(guard *g, const char *buf, size_t len)
{
    if (g->tripped || g->finished) return g->tripped;
    if (!g->p->enabled) {
        g->fed += len;
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
    if (g->p->n_rules && rules_run(g, g->fed, true)) return true;
    if (g->p->novelty.enabled) word_end(g);
    if ((g->p->lines.enabled || g->p->novelty.enabled) && g->seg_len && seg_end(g, g->fed, g->fed))
        return true;
    return false;
}

bool guard_report_empty_answer(guard *g, uint64_t reasoning_bytes)
{
    const guard_params *p = g->p;
    if (g->tripped) return true;
    if (!p->enabled || !p->empty_answer_min_reasoning || g->content_seen ||
        reasoning_bytes < p->empty_answer_min_reasoning)
        return false;
    set_unit(g, g->fed, g->fed);
    trip(g, "empty_answer", 0, g->fed, 0);
    return true;
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

/* ---- holdback ---------------------------------------------------------------------- */

/* Longest tail that is a proper prefix of a leak token. O(max length) byte checks, and a
 * compare per token only where a token could start. */
static size_t leak_suspect(const guard *g)
{
    const guard_params *p = g->p;
    size_t have = (size_t)(g->fed - g->base);
    /* No byte that starts a token among the last max length: nothing to hold. */
    if (!g->leak_maxlen || g->fed - g->leak_start >= g->leak_maxlen) return 0;
    /* Longest first; a tail can only match where it starts with a token's first byte. */
    for (size_t k = g->leak_maxlen - 1; k > 0; k--) {
        if (k > have) continue;
        const unsigned char *t = g->buf + (g->fed - k - g->base);
        if (!(g->leak_first[t[0] >> 3] & (1u << (t[0] & 7)))) continue;
        for (size_t i = 0; i < p->n_leaks; i++)
            if (p->leak_len[i] > k && !memcmp(t, p->leaks[i], k)) return k;
    }
    return 0;
}

/* Bytes from the start of a complete or partial rule match still in progress. Amortised
 * O(new bytes) per rule, plus one pcre2_match call per rule. */
static size_t rules_suspect(const guard *g)
{
    const guard_params *p = g->p;
    size_t best = 0;
    for (size_t i = 0; i < p->n_rules; i++) {
        uint64_t ms, me;
        int rc = rule_match(g, i, g->fed, false, &ms, &me);
        if ((rc > 0 || rc == PCRE2_ERROR_PARTIAL) && g->fed - ms > best)
            best = (size_t)(g->fed - ms);
    }
    return best;
}

size_t guard_suspect(const guard *g)
{
    const guard_params *p = g->p;
    uint64_t fed = g->fed;
    size_t s = 0;
    if (!p->enabled || fed == 0) return 0;
    if (g->tripped) {
        s = (size_t)(fed - g->v.loop_start);
    } else {
        for (unsigned i = 0; i < g->ncand; i++)
            if (fed - g->cand[i].start > s) s = (size_t)(fed - g->cand[i].start);
        size_t l = leak_suspect(g);
        if (l > s) s = l;
        if (p->n_rules) {
            size_t r = rules_suspect(g);
            if (r > s) s = r;
        }
    }
    /* An unfinished UTF-8 sequence at the end is held whole. */
    uint64_t keep = g->base;
    for (uint64_t o = fed; o-- > keep && fed - o <= 4;) {
        unsigned char c = at(g, o);
        if (is_cont(c)) continue;
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
    for (int k = 0; k < 3 && cut > g->base && cut < fed && is_cont(at(g, cut)); k++)
        cut--;
    if (fed - cut > p->holdback_max) {
        cut = fed - p->holdback_max;
        for (int k = 0; k < 3 && cut < fed && cut >= g->base && is_cont(at(g, cut)); k++)
            cut++;
    }
    return (size_t)(fed - cut);
}
