/* g_block.c — the block detector: a block of two or more lines that keeps coming back, its
 * copies equal apart from a counter ("\begin{scope}[xshift=9cm] ... [xshift=18cm] ...",
 * "7. The Maltese Falcon (1941)\n8. The Big Sleep (1946)\n9. ..."), an ingredient or
 * playlist cycle, a drawing redrawn. The repeat detector sees verbatim blocks too, but only
 * as bytes: a counter breaks its period, and its classes ask a block of code lines for as
 * many copies as one line. Here the unit is a cycle of lines and the threshold counts lines.
 *
 * Each completed line (g_text.c hands them over) is reduced to its skeleton: the body
 * without indentation and list marker (guard_line_body), every run of digits one '0'. Blank
 * lines are skipped (a blank line between blocks is part of neither), and digits inside a
 * name ("sha256") are no number. Two lines match when their skeletons are equal, and one
 * line at most "moved" in the last P lines, or several by one step ("Question 7:" and
 * "Answer 7:"): a counter may move, a row of data may not (a
 * monthly calculation, a table of figures, ABC notes keep their skeleton and change their
 * numbers: that is content). A line also moves when it keeps the other's frame (first and
 * last ENDS bytes) and a name in it grew or shrank by text written just before ("lemma
 * a_b_c (x) {" after "lemma a_b (x) {"): a block re-emitted under recombined names. A name
 * replaced by a new one is a new variant, which code declares on purpose. For every P of 2 to
 * CYCLE_MAX_PERIOD lines, run[P] counts the lines in a row that match the line P before; a
 * run starts only at a line whose key (its first and last 8 bytes, digits aside) is that
 * line's too, so the skeleton is read only where a run may go on or start.
 * A cycle trips when its copies (run / P + 1) reach block_copies and its lines block_lines,
 * P being the smallest period of the block (two equal lines are a one-line loop: the lines
 * and repeat detectors judge those). A cycle whose characters are less than a quarter letters (a
 * drawing, a grid, section titles between rules) needs CYCLE_ART_COPIES: a tall house
 * repeats its wall rows on purpose, and a document its decorated headings. One
 * line periods are left out on purpose: a table's rows share their skeleton.
 *
 * The same file judges art lines (no ASCII letter or digit) by their texture: art_run
 * lines in a row whose texture (the line with runs of one byte collapsed, cut to its
 * shortest period) is the same while the lines themselves keep changing trip "art": a
 * drawing that grows rows of one pattern for ever.
 *
 * Measured on the AlpacaEval answers (tests/corpus): 4 copies and 12 lines caught 37 of
 * the labelled loops with no false trip; 8 lines tripped on an ABC tune written out four
 * times. Cost: per line its key (O(1)) and its compare with the last CYCLE_MAX_PERIOD
 * lines' keys (one vector compare); a compare per period only with a run or whose line
 * shares the key (most lines: none), of the two lines' bytes (O(line)), and their
 * skeletons read (O(line)) only where the bytes cannot tell; art lines a second pass;
 * memory: about 1 KiB (a ring of CYCLE_RING lines), allocated at the first line with a
 * body. */
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "guard/guard_int.h"

#define CYCLE_MAX_PERIOD 15
#define CYCLE_RING       16 /* a power of two above CYCLE_MAX_PERIOD */
#define CYCLE_NUMS       4  /* numbers of a line kept for the one-differs rule */
#define CYCLE_ART_COPIES 8
#define ART_MAX          256  /* bytes of a collapsed art line */
#define ENDS             8    /* bytes of each end that make a line's frame */
#define RECENT           2048 /* bytes before a line where a grown name's parts are looked for */
#define GROWN            UINT32_MAX /* the step of a line whose name grew */
#define PERIODS          0xFFFCu    /* bits 2 to CYCLE_MAX_PERIOD: the periods looked at */

typedef struct cline {
    uint64_t skel;            /* hash of the skeleton; 0: not read yet (read_line) */
    uint64_t start;           /* offset of the line's body */
    uint64_t ends;            /* its first and last ENDS bytes (lines of 2 * ENDS or more) */
    uint16_t num[CYCLE_NUMS]; /* the first numbers, mod 2^16 */
    uint32_t rest;            /* hash of the numbers past the first CYCLE_NUMS */
    uint16_t len;             /* at most the history's length */
} cline;

struct gblock {
    cline ring[CYCLE_RING];
    uint64_t n; /* lines seen since the last reset */
    uint16_t run[CYCLE_MAX_PERIOD + 1];
    uint64_t from[CYCLE_MAX_PERIOD + 1];  /* where each run's first copy began */
    uint16_t moved[CYCLE_MAX_PERIOD + 1]; /* bit k: the line k back changed a number */
    uint32_t step[CYCLE_MAX_PERIOD + 1];  /* how much the last moved line's number went up */
    uint16_t runs;                        /* bit P: run[P] is not 0 */
    /* The lines' keys (line_key, low 16 bits), each twice: line m's at (-m) % CYCLE_RING
     * and CYCLE_RING further, so that the CYCLE_RING keys from line n's are the lines n,
     * n - 1, ... n - CYCLE_RING + 1 in this order (key_matches). */
    uint16_t keys[2 * CYCLE_RING];
    /* The art run: its texture, the last line's hash, its length and first line. */
    uint64_t art_tex, art_raw, art_from;
    unsigned art_run;
};

/* Line a has line b's frame: is what a puts in the middle old text, found in the RECENT
 * bytes before b (a name recombined from names already written, "x_sort_alg" after "x" and
 * "y_sort_alg")? New text in the frame is a new variant ("translateCatchSwitch" after
 * "translateCleanupPad"): code declares those on purpose. */
static bool recombined(const guard *g, const cline *a, const cline *b)
{
    if (b->start < g->base + 1) return false;
    uint64_t pre = 0, suf = 0, la = a->len, lb = b->len, n = la < lb ? la : lb;
    while (pre < n && guard_at(g, a->start + pre) == guard_at(g, b->start + pre))
        pre++;
    while (suf < n - pre &&
           guard_at(g, a->start + la - 1 - suf) == guard_at(g, b->start + lb - 1 - suf))
        suf++;
    /* One of the two middles is empty: a name grew or shrank, none was replaced. */
    if (pre + suf < lb && pre + suf < la) return false;
    size_t mid = (size_t)(la - pre - suf);
    if (!mid) return true;
    uint64_t from = b->start > g->base + RECENT ? b->start - RECENT : g->base;
    const unsigned char *m = g->buf + (a->start + pre - g->base);
    return mid >= 3 && memmem(g->buf + (from - g->base), (size_t)(b->start - from), m, mid) != NULL;
}

/* How lines a and b compare: 0 equal; 1 one skeleton with one number different (*step: by
 * how much it went up, mod 2^16), or (when `grown` is asked) one frame (the same first and
 * last ENDS bytes) around a grown or shrunk name (*step: GROWN); 2 else. */
static unsigned lines_compare(const guard *g, const cline *a, const cline *b, bool grown,
                              uint32_t *step)
{
    *step = GROWN;
    if (a->skel != b->skel) return grown && a->ends == b->ends && recombined(g, a, b) ? 1 : 2;
    unsigned diff = a->rest != b->rest;
    for (unsigned k = 0; k < CYCLE_NUMS; k++)
        if (a->num[k] != b->num[k]) {
            diff++;
            *step = (uint16_t)(a->num[k] - b->num[k]);
        }
    return diff < 2 ? diff : 2;
}

/* Byte classes for read_line and bytes_compare. */
enum { B_DIGIT = 1, B_NAME = 2, B_LETTER = 4, B_CONT = 8 };
static const unsigned char byte_cls[256] = {
    ['0' ... '9'] = B_DIGIT,
    ['A' ... 'Z'] = B_NAME | B_LETTER,
    ['a' ... 'z'] = B_NAME | B_LETTER,
    ['_'] = B_NAME,
    [0x80 ... 0xBF] = B_CONT,
    /* A lead byte above U+2FFF is one letter; U+2000-U+2FFF (lead E2) are symbols: box
     * drawing, arrows, Braille. */
    [0xC3 ... 0xE1] = B_LETTER,
    [0xE3 ... 0xFF] = B_LETTER,
};

/* Ends the number v of a line being read: one '0' in the skeleton, its value kept. */
static uint64_t end_number(cline *l, uint64_t h, uint32_t v, unsigned *nn, uint32_t *rest)
{
    if (*nn < CYCLE_NUMS)
        l->num[*nn] = (uint16_t)v;
    else
        *rest = (*rest ^ v) * 0x01000193u;
    (*nn)++;
    return (h ^ '0') * 0x100000001B3ull;
}

/* The 8 bytes at p as a number, the first byte lowest. */
static inline uint64_t load_le(const unsigned char *p)
{
    uint64_t x;
    memcpy(&x, p, sizeof x);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    x = __builtin_bswap64(x);
#endif
    return x;
}

/* The ASCII digits of x (see load_le) as the high bit of their bytes: exact up to the first
 * digit, whose bit is the lowest set (SWAR: a byte of x ^ '0'*8 below 10; a later byte may
 * show a borrow). */
static inline uint64_t digit_bits(uint64_t x)
{
    const uint64_t ones = 0x0101010101010101ull;
    uint64_t y = x ^ (ones * '0');
    return (y - ones * 10) & ~y & (ones * 0x80);
}

#ifndef __SSE2__
/* The ASCII letters and digits of x (see load_le) as the high bit of their bytes, exact
 * (each byte's high bit cleared first, so that no carry crosses bytes); line_key's
 * fallback where SSE2 is not. */
static inline uint64_t alnum_bits(uint64_t x)
{
    const uint64_t ones = 0x0101010101010101ull, high = ones * 0x80, low = ~high;
    uint64_t v = x & low, f = (x | ones * 0x20) & low; /* f: letters folded to lower case */
    uint64_t digit = (v + ones * (0x80 - '0')) & ~(v + ones * (0x7F - '9'));
    uint64_t letter = (f + ones * (0x80 - 'a')) & ~(f + ones * (0x7F - 'z'));
    return (digit | letter) & ~x & high;
}
#endif

/* The bytes [p, be), fewer than 8, as a number (see load_le; 0 above them): the 8 bytes
 * that end at be shifted down when the history (from lo) has them. */
static inline uint64_t load_tail(const unsigned char *p, const unsigned char *be,
                                 const unsigned char *lo)
{
    if (be - lo >= 8) return load_le(be - 8) >> 8 * (8 - (be - p));
    uint64_t x = 0;
    for (unsigned i = 0; p + i < be; i++)
        x |= (uint64_t)p[i] << 8 * i;
    return x;
}

static inline uint64_t hash_word(uint64_t h, uint64_t w)
{
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    return h ^ h >> 32;
}

/* Reads the body [s, e) into a cline: the skeleton hash and the numbers. The skeleton is
 * cut at its numbers into pieces, each hashed 8 bytes at a time from its own first byte,
 * then its length (so that lines with one skeleton hash alike, whatever their numbers'
 * lengths). One loop takes the body 8 bytes at a time: those without a digit (most) are
 * hashed at once. */
static void read_line(const guard *g, cline *l)
{
    const uint64_t s = l->start, e = s + l->len;
    const unsigned char *s0 = g->buf + (s - g->base), *be = s0 + (e - s);
    const unsigned char *piece = s0, *p = s0; /* p: the piece's next 8 bytes */
    uint64_t h = 0xCBF29CE484222325ull;
    uint32_t rest = 0x811C9DC5u;
    unsigned nn = 0;
    memset(l->num, 0, sizeof(l->num)); /* the numbers a line lacks are 0 */
    for (;;) {
        /* 8 bytes without a digit (most of a line) are hashed as they are, 16 at a time
         * first. */
        while (be - p >= 16 && !(digit_bits(load_le(p)) | digit_bits(load_le(p + 8)))) {
            h = hash_word(hash_word(h, load_le(p)), load_le(p + 8));
            p += 16;
        }
        while (be - p >= 8 && !digit_bits(load_le(p))) {
            h = hash_word(h, load_le(p));
            p += 8;
        }
        if (p >= be) break;
        const bool tail = be - p < 8;
        uint64_t x = tail ? load_tail(p, be, g->buf) : load_le(p), m = digit_bits(x);
        /* The first number starting in these 8 bytes, after any digits of a name
         * ("sha256", "EDITION_2023": part of the skeleton, for code declares one name per
         * variant on purpose; a digit after a digit is in the same run). */
        const unsigned char *d = NULL, *r = p;
        uint32_t v = 0;
        while (m) {
            d = p + __builtin_ctzll(m) / 8;
            for (r = d, v = 0; r < be && *r >= '0' && *r <= '9'; r++)
                v = v * 10 + (uint32_t)(*r - '0');
            if (d == s0 || !(byte_cls[d[-1]] & (B_NAME | B_DIGIT))) break;
            d = NULL;
            /* Digits after the name's, hidden as 0xFF bytes (no digit, and no borrow that
             * would show one after them). */
            m = r - p >= 8 ? 0 : digit_bits(x | ((1ull << 8 * (r - p)) - 1));
        }
        if (!d) {
            h = hash_word(h, x);
            if (tail) break;
            p += 8;
            continue;
        }
        if (d > p) h = hash_word(h, x & ((1ull << 8 * (d - p)) - 1));
        h = end_number(l, hash_word(h, (uint64_t)(d - piece)), v, &nn, &rest);
        piece = p = r;
    }
    h = hash_word(h, (uint64_t)(be - piece));
    l->skel = h ? h : 1; /* never 0, "not read" */
    l->rest = rest;
    l->ends = 0;
    if (e - s >= 2 * ENDS) { /* the first and last 8 bytes, mixed */
        uint64_t x, y;
        memcpy(&x, g->buf + (s - g->base), sizeof x);
        memcpy(&y, be - ENDS, sizeof y);
        x = (x ^ (y * 0x9E3779B97F4A7C15ull)) * 0xFF51AFD7ED558CCDull;
        l->ends = (x ^ x >> 29) | 1;
    }
}

/* The line k back from the newest (k < CYCLE_RING), read (read_line) if it was not yet:
 * NULL when its bytes left the history. */
static const cline *line_back(const guard *g, struct gblock *c, unsigned k)
{
    cline *o = &c->ring[(c->n - 1 - k) % CYCLE_RING];
    if (!o->skel) {
        if (o->start < g->base) return NULL;
        read_line(g, o);
    }
    return o;
}

/* How lines a and b (both in the history) compare, told from their bytes where that is
 * quick: 0 the same bytes; 2 skeletons that differ (the first byte where they differ, or
 * where one ends, is a digit in neither, so it is no number's: see read_line) and, when
 * `grown` is asked, other first or last ENDS bytes; 3 else (lines_compare tells). */
static unsigned bytes_compare(const guard *g, const cline *a, const cline *b, bool grown)
{
    const unsigned char *x = g->buf + (a->start - g->base), *y = g->buf + (b->start - g->base);
    const size_t la = a->len, lb = b->len, n = la < lb ? la : lb;
    size_t k = 0;
    uint64_t u = 0;
    for (; k + 8 <= n && !(u = load_le(x + k) ^ load_le(y + k)); k += 8)
        ;
    if (!u && k < n) u = load_tail(x + k, x + n, g->buf) ^ load_tail(y + k, y + n, g->buf);
    k = u ? k + (unsigned)__builtin_ctzll(u) / 8 : n;
    if (k == n && la == lb) return 0;
    if ((k < la && (byte_cls[x[k]] & B_DIGIT)) || (k < lb && (byte_cls[y[k]] & B_DIGIT))) return 3;
    if (!grown || lb < 2 * ENDS) return 2;
    return load_le(x) == load_le(y) && load_le(x + la - ENDS) == load_le(y + lb - ENDS) ? 3 : 2;
}

/* Is the block of the last P lines made of a shorter period? */
static bool has_shorter_period(const guard *g, struct gblock *c, unsigned P)
{
    for (unsigned d = 1; d < P; d++) {
        if (P % d) continue;
        unsigned k = 0;
        for (; k + d < P; k++) {
            const cline *a = line_back(g, c, k), *b = line_back(g, c, k + d);
            if (!a || !b || a->skel != b->skel) break;
        }
        if (k + d == P) return true;
    }
    return false;
}

/* Are the characters of history [s, e) less than a quarter letters? Asked of a cycle about
 * to trip only. */
static bool few_letters(const guard *g, uint64_t s, uint64_t e)
{
    uint64_t letters = 0, chars = 0;
    for (uint64_t o = s; o < e; o++) {
        unsigned t = byte_cls[guard_at(g, o)];
        letters += (t >> 2) & 1;
        chars += !(t & B_CONT);
    }
    return letters * 4 < chars;
}

/* The texture of an art line [s, e) (no ASCII letter or digit): the line with each run of
 * one byte collapsed to that byte, cut to its shortest period (".::...::..::" is ".:"),
 * hashed into *tex. False for a line that is no art, or longer than ART_MAX collapsed. */
static bool art_texture(const guard *g, uint64_t s, uint64_t e, uint64_t *tex)
{
    unsigned char t[ART_MAX];
    uint16_t border[ART_MAX];
    size_t n = 0;
    for (uint64_t o = s; o < e; o++) {
        unsigned char c = guard_at(g, o);
        if (((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || (c >= '0' && c <= '9')) return false;
        if (n && t[n - 1] == c) continue;
        if (n == ART_MAX) return false;
        t[n++] = c;
    }
    /* The shortest period is n minus the longest proper border (KMP's failure function). */
    border[0] = 0;
    for (size_t i = 1, k = 0; i < n; i++) {
        while (k && t[i] != t[k])
            k = border[k - 1];
        k += t[i] == t[k];
        border[i] = (uint16_t)k;
    }
    size_t period = n ? n - border[n - 1] : 0;
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < period; i++)
        h = (h ^ t[i]) * 0x100000001B3ull;
    *tex = h;
    return n > 0;
}

/* The art run: art lines in a row with one texture, each (but repeats) different from the
 * line before: a drawing that keeps growing rows of the same dots. A drawing's rows differ
 * in texture; a tall wall repeats the same row, which the repeat detector judges. For a line
 * with no ASCII letter or digit in its first 8 bytes (most lines have one: no art, told by
 * the caller without this call, and without art_texture's loop, whose exit, at the first
 * letter, follows the text). RARE_PATH. */
RARE_PATH static bool art_line(guard *g, uint64_t start, uint64_t end, uint64_t now)
{
    struct gblock *c = g->blk;
    uint64_t tex, raw = 0xCBF29CE484222325ull;
    if (!art_texture(g, start, end, &tex)) {
        c->art_run = 0;
        c->art_tex = 0;
        return false;
    }
    for (uint64_t o = start; o < end; o++)
        raw = (raw ^ guard_at(g, o)) * 0x100000001B3ull;
    if (tex != c->art_tex) {
        c->art_run = 0;
        c->art_from = start;
    } else if (raw != c->art_raw) {
        c->art_run++;
    }
    c->art_tex = tex;
    c->art_raw = raw;
    if (c->art_run < g->p->lines.art_run ||
        c->art_run < guard_prompt_slack(g, g->buf + (start - g->base), (size_t)(end - start)))
        return false;
    guard_set_unit(g, start, end);
    guard_trip(g, "art", c->art_from, now, c->art_run + 1);
    return true;
}

/* The key of a body from its first and last 8 bytes (a body under 8 bytes: its bytes and
 * 0; see load_le), each digit a 0 byte, mixed. Lines with one skeleton and numbers of the
 * same lengths share it; a number that grew a digit in the last or first 8 bytes moves it.
 * Most lines' keys match none of the last CYCLE_MAX_PERIOD lines', and their skeletons are
 * not read (read_line). *art: the first 8 bytes hold no ASCII letter or digit. */
static inline uint64_t line_key(uint64_t head, uint64_t tail, bool *art)
{
#ifdef __SSE2__
    /* Both ends in one vector, head in the low half: its digits and letters by range. */
    const __m128i v = _mm_set_epi64x((long long)tail, (long long)head);
    const __m128i d = _mm_sub_epi8(v, _mm_set1_epi8('0')),
                  f = _mm_sub_epi8(_mm_or_si128(v, _mm_set1_epi8(0x20)), _mm_set1_epi8('a'));
    const __m128i digit = _mm_cmpeq_epi8(_mm_min_epu8(d, _mm_set1_epi8(9)), d),
                  letter = _mm_cmpeq_epi8(_mm_min_epu8(f, _mm_set1_epi8(25)), f);
    *art = !(_mm_movemask_epi8(_mm_or_si128(digit, letter)) & 0xFF);
    const __m128i w = _mm_andnot_si128(digit, v);
    head = (uint64_t)_mm_cvtsi128_si64(w);
    tail = (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(w, w));
#else
    const uint64_t ones = 0x0101010101010101ull, high = ones * 0x80;
    *art = !alnum_bits(head);
    /* A byte y of v ^ '0' * ones is a digit when y < 10: each byte's high bit set first, so
     * that no borrow crosses bytes (exact, unlike digit_bits). */
    uint64_t y = head ^ (ones * '0'), z = tail ^ (ones * '0');
    uint64_t dh = ~((y | high) - ones * 10) & ~y & high, dt = ~((z | high) - ones * 10) & ~z & high;
    head &= ~((dh >> 7) * 0xFF);
    tail &= ~((dt >> 7) * 0xFF);
#endif
    uint64_t k = (head ^ (tail * 0x9E3779B97F4A7C15ull)) * 0xFF51AFD7ED558CCDull;
    return k ^ k >> 29;
}

/* The periods P (bit P, 0 < P < CYCLE_RING) whose line, P lines before line n, has the key
 * `key` (bit 0: the slot line n's key goes to, not written yet: read before, so that the
 * vector load does not wait for that store). */
static inline uint32_t key_matches(const struct gblock *c, uint64_t n, uint16_t key)
{
    const uint16_t *k = c->keys + (-n) % CYCLE_RING;
#ifdef __SSE2__
    const __m128i kv = _mm_set1_epi16((short)key);
    __m128i lo = _mm_cmpeq_epi16(_mm_loadu_si128((const __m128i *)(const void *)k), kv),
            hi = _mm_cmpeq_epi16(_mm_loadu_si128((const __m128i *)(const void *)(k + 8)), kv);
    return (uint32_t)_mm_movemask_epi8(_mm_packs_epi16(lo, hi));
#else
    uint32_t periods = 0;
    for (unsigned P = 0; P < CYCLE_RING; P++)
        periods |= (uint32_t)(k[P] == key) << P;
    return periods;
#endif
}

static bool block_judge(guard *g, struct gblock *c, cline *l, uint64_t n, uint32_t todo,
                        uint64_t now);

/* The block step of the line [start, end) (1 to UINT16_MAX bytes in the history) of key
 * `key` (line_key): the periods it may go on or start. */
static inline bool block_step(guard *g, struct gblock *c, uint64_t start, uint64_t end,
                              uint16_t key, uint64_t now)
{
    cline *l = &c->ring[c->n % CYCLE_RING];
    l->start = start;
    l->len = (uint16_t)(end - start);
    l->skel = 0;
    uint64_t n = c->n++;
    /* The periods to look at: those with a run, and those whose line has l's key (of the
     * lines since the last break); at every other P the run is 0 and stays so. Most lines:
     * none. */
    uint32_t todo = c->runs | key_matches(c, n, key);
    c->keys[(-n) % CYCLE_RING] = c->keys[(-n) % CYCLE_RING + CYCLE_RING] = key;
    todo &= n >= CYCLE_MAX_PERIOD ? PERIODS : PERIODS & ((2u << n) - 1);
    if (!todo) return false;
    return block_judge(g, c, l, n, todo, now);
}

/* guard_block_line for a line that may be art (see art_line), then its block step.
 * RARE_PATH. */
RARE_PATH static bool art_block(guard *g, uint64_t start, uint64_t end, uint16_t key, uint64_t now)
{
    if (art_line(g, start, end, now)) return true;
    if (!g->p->lines.block_copies) return false;
    return block_step(g, g->blk, start, end, key, now);
}

/* guard_block_line at the first line of a guard, or at a line longer than the history
 * (a break). COLD_PATH. */
COLD_PATH static bool block_break(guard *g, uint64_t start, uint64_t end, uint64_t now)
{
    /* Made at the first line (memory per stream counts: a text without a newline needs
     * none). */
    if (!g->blk) g->blk = guard_table(g, GT_BLK, sizeof(*g->blk));
    if (start >= g->base && end - start <= UINT16_MAX) return guard_block_line(g, start, end, now);
    struct gblock *c = g->blk;
    c->n = 0;
    memset(c->run, 0, sizeof(c->run));
    memset(c->moved, 0, sizeof(c->moved));
    c->runs = 0;
    return false;
}

bool guard_block_line(guard *g, uint64_t start, uint64_t end, uint64_t now)
{
    const guard_params *p = g->p;
    struct gblock *c = g->blk;
    if (!c || start < g->base || end - start > UINT16_MAX) return block_break(g, start, end, now);
    if (start == end) return false;
    const unsigned char *x = g->buf + (start - g->base);
    const size_t len = (size_t)(end - start);
    uint64_t head, tail = 0;
    if (len >= 8) {
        head = load_le(x);
        tail = load_le(x + len - 8);
    } else {
        head = load_tail(x, x + len, g->buf);
    }
    bool art;
    const uint16_t key = (uint16_t)line_key(head, tail, &art);
    if (p->lines.art_run && art) return art_block(g, start, end, key, now);
    c->art_run = 0;
    c->art_tex = 0;
    if (!p->lines.block_copies) return false;
    return block_step(g, c, start, end, key, now);
}

/* guard_block_line for a line l, the n-th, whose runs at the periods `todo` (bits) may go
 * on or start: those with a run, and those whose line has l's key. RARE_PATH. */
RARE_PATH static bool block_judge(guard *g, struct gblock *c, cline *l, uint64_t n, uint32_t todo,
                                  uint64_t now)
{
    const guard_params *p = g->p;
    uint64_t longest = 0; /* lines of the longest run */
    for (; todo; todo &= todo - 1) {
        unsigned P = (unsigned)__builtin_ctz(todo);
        /* One line may move per copy (a counter), not one per line. A grown name is looked
         * for (memmem, the costly part) only inside a run with no line moved yet: code
         * repeats lines' frames all the time, and a run starts on equal lines anyway. */
        uint16_t kept = (uint16_t)((c->moved[P] << 1) & ((1u << P) - 1));
        bool grown = c->run[P] && !kept && l->len >= 2 * ENDS; /* l->ends is not 0 */
        const cline *o = &c->ring[(n - P) % CYCLE_RING];
        uint32_t step = GROWN;
        /* Most pairs are told by their bytes, neither skeleton read (see bytes_compare). */
        unsigned cmp = o->start >= g->base ? bytes_compare(g, l, o, grown) : 3;
        if (cmp == 3) {
            if (!l->skel) read_line(g, l);
            if (!(o = line_back(g, c, P))) {
                c->run[P] = 0;
                c->runs = (uint16_t)(c->runs & ~(1u << P));
                continue;
            }
            cmp = lines_compare(g, l, o, grown, &step);
        }
        uint16_t moved = (uint16_t)(kept | (cmp == 1));
        /* More lines of a copy may move when they count up together ("Question 7:" and
         * "Answer 7:"): one counter, not a row of data. */
        bool m = cmp < 2 && (!(moved & (moved - 1)) || (step != GROWN && step == c->step[P]));
        if (cmp == 1) c->step[P] = step;
        if (m && !c->run[P]) c->from[P] = o->start;
        c->run[P] = m ? (uint16_t)(c->run[P] < UINT16_MAX ? c->run[P] + 1 : c->run[P]) : 0;
        c->moved[P] = m ? moved : 0;
        c->runs = (uint16_t)(m ? c->runs | 1u << P : c->runs & ~(1u << P));
        if (m && c->run[P] + P > longest) longest = c->run[P] + P;
    }
    if (longest < p->lines.block_lines) return false;
    for (unsigned P = 2; P <= CYCLE_MAX_PERIOD && P <= n; P++) {
        uint64_t lines = (uint64_t)c->run[P] + P;
        if (!c->run[P] || lines < p->lines.block_lines ||
            lines < (uint64_t)p->lines.block_copies * P)
            continue;
        const cline *first = &c->ring[(n - P + 1) % CYCLE_RING];
        uint64_t from = first->start, to = l->start + l->len;
        if (from < g->base) continue;
        if (lines < (uint64_t)CYCLE_ART_COPIES * P && few_letters(g, from, to)) continue;
        if (has_shorter_period(g, c, P)) continue;
        /* The block the prompt asks for or holds may come back that many times. */
        unsigned copies = (unsigned)(lines / P);
        if (copies <= guard_prompt_slack(g, g->buf + (from - g->base), (size_t)(to - from)))
            continue;
        guard_set_unit(g, from, to);
        guard_trip(g, "block", c->from[P], now, copies);
        return true;
    }
    return false;
}
