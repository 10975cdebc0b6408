/* g_repeat.c — the repeat detector: the tail of the text is periodic, some period p has
 * repeated often enough for its class of unit.
 *
 * Candidate periods come from an 8-gram table (the distance to the previous occurrence of
 * the last 8 bytes, recorded and looked up at anchors: g_short.h, guard_gram_anchor); up to
 * GUARD_NCAND live candidates each cost a compare per 16 bytes of a piece (one per byte of a
 * token, g_short.h). When a candidate's periodic tail first reaches the plain threshold of
 * its period (the period table, base_need), its unit is classified (prose, separator,
 * digits, list item, line, table, blob, code) and the threshold raised to its class's;
 * inside a Markdown code fence every threshold is multiplied by fence_factor. Cost: O(1)
 * amortised per byte; memory: the 2 KiB 8-gram table and the candidates. */
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "guard/g_short.h"

/* Classifies the unit u[0..n) (any rotation gives the same answer) of a channel's text
 * (`reasoning`: the reasoning channel). O(n); runs once per candidate, when its tail first
 * reaches the plain threshold. */
static guard_rclass classify(const unsigned char *u, size_t n, bool reasoning, bool *codep)
{
    size_t letters = 0, hexletters = 0, digits = 0, spaces = 0, nl = 0, commas = 0, pipes = 0;
    size_t code = 0, loud = 0, wide = 0, words = 0, prose_end = 0, latex = 0, quotes = 0;
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
        } else if (c == ' ' || c == '\t' || c == '\r' || (c == 0xC2 && u[(i + 1) % n] == 0xA0)) {
            spaces++; /* the no-break space U+00A0 (C2 A0) pads as a space does */
        } else if (c == '\n') {
            nl++;
            unsigned char b = u[(i + n - 1) % n];
            if (b == '.' || b == '!' || b == '?' || b == ':' || b == '\n') prose_end++;
        } else if (c == ',') {
            commas++;
        } else if (c == '|') {
            pipes++;
        } else if (c == '!' || c == '?') {
            loud++;
        } else if (c == '"' || c == '\'') {
            quotes++;
        } else if (c >= 0xC0) {
            /* Box drawing and block elements (U+2500–U+259F: E2 94..96) are rules, and
             * so are U+FFFD (EF BF BD), the filler of decoded binary tables, and the blank
             * Braille pattern U+2800 (E2 A0 80), the canvas of Braille art; everything
             * else outside ASCII counts as text. */
            unsigned char c1 = u[(i + 1) % n], c2 = u[(i + 2) % n];
            if (!(c == 0xE2 && c1 >= 0x94 && c1 <= 0x96) &&
                !(c == 0xEF && c1 == 0xBF && c2 == 0xBD) &&
                !(c == 0xE2 && c1 == 0xA0 && c2 == 0x80))
                wide++;
        } else if (strchr("=(){}[]<>;_\\`&@", c)) {
            code++;
            latex += c == '\\';
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
        /* Blank lines, "!!!" and '"""' are no separators: nobody pads with them. */
        if (loud || quotes || nl == n) return GR_NORMAL;
        /* Whole lines of it are art: ASCII art, a rule drawn line after line, a blank
         * Braille row. Code punctuation alone is code; spaces, dashes, dots and box
         * drawing are rules. */
        if (nl) return GR_ART;
        if (*codep) return GR_CODE;
        return GR_RULE;
    }
    if (!wide && digits && letters == hexletters && letters <= digits) return GR_DATA;
    if (nl) {
        /* A line of prose ends with sentence punctuation and is mostly letters and
         * spaces; "The user is asking for the result of 2+2.\n" is, code is not. */
        size_t body = n - nl;
        bool prose = prose_end == nl && words >= 3 && (letters + spaces) * 10 >= body * 8;
        if (prose) return GR_NORMAL;
        /* A line of words that is no sentence (a list item, a lyric, a valediction) and is
         * not indented like code is text: a chat answer repeats it far less on purpose than
         * code repeats a line. In
         * reasoning a line of three words is text even with a formula in it ("Wait, so
         * 2+3 = \boxed{5}"). */
        size_t indent = 0, at = 0;
        while (u[at] != '\n') /* the line after the unit's first newline: indented is code */
            at++;
        while (indent < n && u[(at + 1 + indent) % n] == ' ')
            indent++;
        bool text = words >= 1 && indent < 2 &&
                    (letters + spaces + digits + wide) * 10 >= body * 6 &&
                    (code <= 1 || (reasoning && words >= 3 && latex));
        return text || wide ? GR_TEXT : GR_LINE;
    }
    if (*codep) return GR_CODE;
    if (!spaces && !wide && !loud) return GR_BLOB;
    if (commas && words <= 1 && n <= 24) return GR_ITEM;
    return GR_NORMAL;
}

static size_t nl_count(const unsigned char *u, size_t n)
{
    size_t k = 0;
    for (const unsigned char *e = u + n; (u = memchr(u, '\n', (size_t)(e - u))); u++)
        k++;
    return k;
}

/* The tail length a candidate must reach once its unit's class and the fence are known;
 * `end` is the offset just past the byte being judged. */
COLD_PATH static uint32_t judge(const guard *g, const gcand *c, uint64_t end)
{
    const guard_params *p = g->p;
    const unsigned char *u = g->buf + (end - c->period - g->base);
    bool code;
    guard_rclass cls = classify(u, c->period, g->ch == LG_CH_REASONING, &code);
    /* The period table counts characters, not bytes: "。" is one character repeated. */
    uint32_t chars = 0;
    for (uint32_t i = 0; i < c->period; i++)
        chars += !guard_is_cont(u[i]);
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
    /* A rule's length counts characters: "═" and the blank Braille cell are 3 bytes. */
    if (cls == GR_RULE && chars) minb = (uint32_t)((uint64_t)minb * c->period / chars);
    /* Inside a fence code repeats more; a unit that is itself a fence line ("```") is not
     * inside one, it toggles it. A block of two lines or more gets no more copies there
     * than outside: code repeats a line on purpose, a whole block verbatim seldom. */
    if (g->in_fence && !memmem(u, c->period, "``", 2) && nl_count(u, c->period) < 2) {
        reps *= p->repeat.fence_factor;
        minb = (uint32_t)(minb * p->repeat.fence_factor);
    }
    /* What the prompt asks for or holds may repeat that many copies (g_prompt.c). */
    uint32_t slack = guard_prompt_slack(g, u, c->period);
    if (slack + 1.0 > reps) reps = slack + 1.0;
    return guard_need_for(c->period, reps, minb);
}

/* Trips "repeat" for a tail periodic in `period` that ends at `end`: reports the smallest
 * period that divides it and where the periodic stretch began (bounded by the history). */
COLD_PATH static void repeat_trip(guard *g, uint32_t period, uint64_t end)
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
    while (j >= g->base + q && guard_at(g, j) == guard_at(g, j - q))
        j--;
    uint64_t loop_start = j + 1 - q;
    guard_set_unit(g, loop_start, loop_start + q);
    guard_trip(g, "repeat", loop_start, end, (unsigned)((end - loop_start) / q));
}

/* The offset at which candidate c, its run starting at c->start, reaches a periodic tail of
 * `need` bytes. */
static inline uint64_t cand_ready_at(const gcand *c, uint32_t need)
{
    uint64_t over = (uint64_t)need > (uint64_t)c->period + 1 ? need - c->period - 1 : 0;
    return c->start + over;
}

/* The first offset k in [from, to) with buf[k] != buf[k - period], or `to`. Every byte read
 * is in the history: from - period ≥ base, to ≤ the bytes held. */
static inline __attribute__((always_inline)) uint64_t period_break(const guard *g, uint32_t period,
                                                                   uint64_t from, uint64_t to)
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

/* The last offset j ≤ from, walking back, with buf[j] != buf[j - d], or base + d - 1 when
 * the period holds back to the history's start. 8 bytes a round: most runs end within the
 * first 8 (a new period is mostly two lines that share their indentation or a word), and
 * one test of 8 bytes is one branch where a loop's exit byte after byte is mispredicted
 * about once a call. */
static uint64_t run_back(const guard *g, uint32_t d, uint64_t from)
{
    const uint64_t lo = g->base + d; /* the lowest j with buf[j - d] in the history */
    uint64_t j = from;
    for (; j >= lo + 7; j -= 8) {
        uint64_t a, b;
        memcpy(&a, g->buf + (j - 7 - g->base), sizeof a);
        memcpy(&b, g->buf + (j - 7 - d - g->base), sizeof b);
        if (a == b) continue;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        return j - (unsigned)__builtin_clzll(a ^ b) / 8; /* byte j is the highest */
#else
        return j - (unsigned)__builtin_ctzll(a ^ b) / 8;
#endif
    }
    while (j >= lo && guard_at(g, j) == guard_at(g, j - d))
        j--;
    return j;
}

/* The 8 bytes ending at pos also end at pos - d, inside the history (the caller compared
 * them): tracks period d when a slot is free or holds a shorter run, unless the period breaks
 * in the piece (which ends at `end`) before it could trip. The caller's list holds the
 * candidates live at pos, none of period d (guard_gram_period found d is no live
 * candidate's, and guard_repeat_event dropped the others first). */
static void cand_add(guard *g, uint64_t pos, uint32_t d, uint64_t end)
{
    /* Measure the run by walking back from those 8 bytes: O(run), and a run only starts
     * being tracked once, so this is amortised O(1). */
    gcand nc = {.start = run_back(g, d, pos - 8) + 1, .period = d};
    unsigned slot = g->ncand;
    if (slot == GUARD_NCAND) { /* replace the shortest run, the latest start */
        slot = 0;
        for (unsigned i = 1; i < GUARD_NCAND; i++)
            if (g->cand[i].start > g->cand[slot].start) slot = i;
        if (g->cand[slot].start <= nc.start) return;
    }
    nc.ready_at = cand_ready_at(&nc, g->p->repeat.base_need[d]);
    nc.breaks = period_break(g, d, pos + 1, end);
    /* A run that ends in the piece short of its threshold (ready_at, which judging only
     * raises) could never trip: tracked, it would only be dropped at the piece's end, and
     * with many paced streams its slot's line was a cache miss (a stamp's shared prefix
     * with the one before is such a run at most events). A later anchor of the run finds it
     * again, and so again not worth tracking. */
    if (nc.breaks < end && nc.ready_at >= nc.breaks) return;
    if (slot == g->ncand) g->ncand++;
    g->cand[slot] = nc;
}

/* guard_repeat_event (contract in g_short.h, whose step for one byte calls it too). */
RARE_PATH bool guard_repeat_event(guard *g, uint64_t pos, uint32_t d, uint64_t end, uint64_t *next)
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
            c->ready_at = cand_ready_at(c, judge(g, c, pos + 1));
        }
        if (pos >= c->ready_at) {
            repeat_trip(g, c->period, pos + 1);
            return true;
        }
        if (c->ready_at < c->breaks && c->ready_at < *next) *next = c->ready_at;
    }
    return false;
}

/* The repeat detector over a run of bytes s[0..lim) at offset fed0 with one fence state
 * (see repeat_pass). The live candidates are not advanced byte by byte: where each one's
 * period breaks in the piece is found first, 16 bytes at a time, and the per-byte loop only
 * finds the anchors, looks their 8-grams up and stops where something happens
 * (guard_repeat_event). */
static size_t repeat_run(guard *g, const unsigned char *s, size_t lim, uint64_t fed0)
{
    uint16_t *const gtab = g->gtab;
    const uint64_t end = fed0 + lim;
    uint64_t gram = g->gram, next = UINT64_MAX;
    for (unsigned k = 0; k < g->ncand; k++) {
        gcand *c = &g->cand[k];
        c->breaks = period_break(g, c->period, fed0, end);
        if (c->ready_at < c->breaks && c->ready_at < next) next = c->ready_at;
    }
    uint32_t amin = g->anchor_min, ablock = g->anchor_block;
    size_t i = 0;
    while (i < lim) {
        uint64_t pos = fed0 + i;
        uint32_t d = 0;
        /* The rest of the block (within the piece) when no candidate comes due in it: its
         * bytes need no test but their rank's, and the block's start none
         * (guard_gram_anchor). A token's bytes go this way too. */
        size_t len = GUARD_ANCHOR_BLOCK - (pos & (GUARD_ANCHOR_BLOCK - 1));
        if (len > lim - i) len = lim - i;
        if (next >= pos + len) {
            if ((pos & (GUARD_ANCHOR_BLOCK - 1)) == 0) {
                amin = ablock;
                ablock = UINT32_MAX;
            }
            /* One pointer, not an index and an offset. */
            const unsigned char *p = s + i, *const e = p + len;
            for (; p < e; p++) {
                gram = gram << 8 | *p;
                const uint64_t hash = guard_gram_hash(gram);
                const uint32_t r = guard_gram_rank(hash);
                ablock = r < ablock ? r : ablock;
                if (r <= amin) {
                    amin = r;
                    if ((d = guard_gram_period(g, gtab, gram, hash, fed0 + (size_t)(p - s)))) break;
                }
            }
            const size_t k = (size_t)(p - (s + i));
            i += k;
            if (!d) continue;
            pos += k; /* a new period: the rest of the block byte after byte */
        } else {
            gram = gram << 8 | s[i];
            const uint64_t hash = guard_gram_hash(gram);
            if (guard_gram_anchor(&amin, &ablock, hash, pos))
                d = guard_gram_period(g, gtab, gram, hash, pos);
            if (!d && pos < next) {
                i++;
                continue;
            }
        }
        if (guard_repeat_event(g, pos, d, end, &next)) break;
        i++;
    }
    g->anchor_min = amin;
    g->anchor_block = ablock;
    g->gram = gram;
    if (i == lim) { /* drop the candidates whose period broke in the piece */
        unsigned n = 0;
        for (unsigned k = 0; k < g->ncand; k++)
            if (g->cand[k].breaks == end) g->cand[n++] = g->cand[k];
        g->ncand = n;
    }
    return i;
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

/* guard_fence_step, inline in fence_pass: most lines' first bytes go through it. */
static inline void fence_step(guard *g, unsigned char b)
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

void guard_fence_step(guard *g, unsigned char b)
{
    fence_step(g, b);
}

/* Does byte b end a run of fence characters that opens or closes a fence? */
static bool fence_toggles(const guard *g, unsigned char b)
{
    if (g->fstate != 1 || b == g->fch || g->frun < 3) return false;
    return !g->in_fence || (g->fch == g->open_ch && g->frun >= g->open_len);
}

/* The first '\n' in s[0..n), or NULL: memchr, but a span of at most 32 bytes (a token's
 * rest of a line) is read without a byte past it. glibc's memchr reads 32 bytes at a time,
 * and past a piece's end in the history they are a line no byte was written to yet: with
 * many paced streams, a cache miss every fourth piece. */
static inline const unsigned char *find_newline(const unsigned char *s, size_t n)
{
    if (n > 32) return memchr(s, '\n', n);
#ifdef __SSE2__
    if (n >= 16) { /* the first 16 bytes and the last 16, which overlap */
        const __m128i nl = _mm_set1_epi8('\n');
        unsigned a = (unsigned)_mm_movemask_epi8(
            _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(const void *)s), nl));
        if (a) return s + __builtin_ctz(a);
        unsigned b = (unsigned)_mm_movemask_epi8(
            _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(const void *)(s + n - 16)), nl));
        return b ? s + n - 16 + __builtin_ctz(b) : NULL;
    }
#endif
    for (size_t i = 0; i < n; i++)
        if (s[i] == '\n') return s + i;
    return NULL;
}

/* Follows code fences over s[0..n) and returns how many of those bytes the next run takes:
 * all, or those before a byte (not the first) that opens or closes a fence. The repeat
 * detector thus reads one fence state for a whole run. */
static size_t fence_pass(guard *g, const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (g->fstate == 2) { /* the rest of a line: nothing happens before its end */
            const unsigned char *nl = find_newline(s + i, n - i);
            if (!nl) break;
            i = (size_t)(nl - s);
        }
        if (i > 0 && fence_toggles(g, s[i])) return i;
        fence_step(g, s[i]);
    }
    return n;
}

/* The repeat detector's pass (guard_detector), over a piece of GUARD_SHORT bytes or more
 * (a shorter one goes through guard_repeat_step): in runs between the bytes that open or
 * close a code fence, so that each run is judged with one fence state. */
static size_t repeat_pass(guard *g, size_t lim, uint64_t fed0)
{
    const unsigned char *s = g->buf + (size_t)(fed0 - g->base);
    for (size_t i = 0; i < lim;) {
        size_t n = fence_pass(g, s + i, lim - i);
        size_t k = repeat_run(g, s + i, n, fed0 + i);
        if (k < n) return i + k;
        i += n;
    }
    return lim;
}

/* ---- the detector ------------------------------------------------------------------ */

static void repeat_init(guard *g)
{
    g->gtab = guard_xcalloc((size_t)1 << GUARD_GTAB_BITS, sizeof(*g->gtab));
}

static void repeat_release(guard *g)
{
    free(g->gtab);
}

/* The table of a reset guard, zeroed. A text still whole in the history and shorter than
 * the table wrote at most the slots of its own 8-grams (those at its anchors; the gram starts
 * at 0, as here), so clearing those is zeroing it: a 2-token answer clears a dozen slots of
 * 1,024. */
static void repeat_reset(guard *g, const guard *old)
{
    g->gtab = old->gtab;
    const size_t held = (size_t)(old->fed - old->base);
    if (old->base != 0 || held > ((size_t)1 << GUARD_GTAB_BITS) / 4) {
        memset(g->gtab, 0, ((size_t)1 << GUARD_GTAB_BITS) * sizeof(*g->gtab));
        return;
    }
    uint64_t gram = 0;
    for (size_t i = 0; i < held; i++) {
        gram = gram << 8 | old->buf[i];
        g->gtab[guard_gram_slot(guard_gram_hash(gram))] = 0;
    }
}

/* The bytes from the start of the longest live candidate's run: a loop's second copy is
 * held from the moment its period is seen. */
static size_t repeat_suspect(const guard *g)
{
    size_t s = 0;
    for (unsigned i = 0; i < g->ncand; i++)
        if (g->fed - g->cand[i].start > s) s = (size_t)(g->fed - g->cand[i].start);
    return s;
}

static bool repeat_on(const guard_params *p)
{
    return p->repeat.enabled;
}

const guard_detector guard_det_repeat = {
    .name = "repeat",
    .on = repeat_on,
    .init = repeat_init,
    .release = repeat_release,
    .reset = repeat_reset,
    .pass = repeat_pass,
    .suspect = repeat_suspect,
};
