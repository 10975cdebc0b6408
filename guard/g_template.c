/* g_template.c — the template detector: lines that follow one template and differ in one
 * slot ("AI in NLP for Finance", "AI in NLP for Retail", ... for a hundred items), going on
 * long after the answer stopped saying anything new. Verbatim returns are the lines
 * detector's; here no two lines need be equal.
 *
 * Each completed line (g_text.c hands them over) is compared with the lines 1 to TPL_LAGS
 * before it, all without their list marker ("12. ", "- ", "* ") and indentation. Blank
 * lines neither extend nor break a run. A line follows the line P before when the two
 * differ and share one of two templates:
 *   - text: their common prefix plus common suffix holds at least template_bytes and
 *     template_share of the longer line, the slot (what is left of the new line) holds no
 *     digit, and the line is text (is_text). template_run such lines in a row trip at
 *     period 1; at periods 2-3, where a line of each cycle may be free (below), 1.5 ×
 *     template_run of them: a table of contents cycling three phrasings had 16-23, a
 *     request format told forty times over two lines (one of them code) has more.
 *   - token: the frame around the slot (prefix and suffix cut back to whole words) holds
 *     template_bytes, and the slots are one word of at most TOKEN_MAX bytes, no space, no
 *     digit ("npm install @types/X@latest -D", "\\renewcommand{\\X}{}", "What is the most
 *     X type of snow?" every other line). Such lines follow in any list of names, so only
 *     those whose slot is old count (see follows): template_run of them in one run trip,
 *     or a quarter of a run of 2 × template_run lines (a name growing by new words between
 *     recombinations). Code and changelogs name a new thing on every line (the machine
 *     files' longest such runs hold under a tenth of old slots); a loop recombines and
 *     recycles.
 * Digits in the slot are numbered data ("Check if n is 17", a table's "4.5-Ounce",
 * coordinates), which answers list on purpose. A period P above 1 counts only lines that
 * neither follow nor equal the line just before: a list on one template follows at every
 * period, and is judged at period 1. At such a period a line equal to the one P before
 * neither extends nor breaks the run, and one line of each cycle may be free (a position
 * diagram after each "% Third layout of rooks"): only P lines in a row that do not follow
 * end it. A run trips unless the prompt asks for or holds that many copies
 * (guard_prompt_slack of the line).
 *
 * The same file judges identifier items: names listed on one line between commas
 * (guard_template_item, at the end of the file).
 *
 * Legitimate lists share templates too ("- 1 cup of X"), which is why the run is long and
 * the template must be most of the line. Measured on the AlpacaEval answers (tests/corpus):
 * counting every token slot, not only old ones, tripped on 20 of the 2,247 machine files
 * (imports, includes, prototypes); 16 text templates at periods 2 and 3 tripped on a
 * table of contents cycling three phrasings. Cost: O(line) up to TPL_LAGS times once per
 * line (most pairs told apart by their first and last 8 bytes), plus a search of RECENT
 * bytes for a token slot, and O(item) at a comma after a letter; memory: 432 bytes,
 * allocated at the first line or item. */
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "guard/guard_int.h"

/* The first byte of [a, b) that is no blank (space or tab), or b. 16 bytes at a time: code
 * is indented by 4 to 16 bytes, and a body shorter than 16 bytes is read as the 16 bytes
 * that end it (those before a count as blanks) when the history has them; no loop whose
 * exit, the first byte of the text, would follow the indentation. */
static inline const unsigned char *skip_blanks(const guard *g, const unsigned char *a,
                                               const unsigned char *b)
{
#ifdef __SSE2__
    const __m128i sp = _mm_set1_epi8(' '), tab = _mm_set1_epi8('\t');
    for (; b - a >= 16; a += 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)(const void *)a);
        unsigned text = ~(unsigned)_mm_movemask_epi8(
                            _mm_or_si128(_mm_cmpeq_epi8(x, sp), _mm_cmpeq_epi8(x, tab))) &
                        0xFFFF;
        if (text) return a + __builtin_ctz(text);
    }
    if (a < b && b - g->buf >= 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(b - 16));
        unsigned text = ~(unsigned)_mm_movemask_epi8(
                            _mm_or_si128(_mm_cmpeq_epi8(x, sp), _mm_cmpeq_epi8(x, tab))) &
                        (0xFFFFu << (16 - (b - a))) & 0xFFFF;
        return text ? b - 16 + __builtin_ctz(text) : b;
    }
#endif
    while (a < b && (*a == ' ' || *a == '\t'))
        a++;
    return a;
}

void guard_line_body(const guard *g, uint64_t *s, uint64_t *e)
{
    const unsigned char *x = g->buf + (*s - g->base), *b = g->buf + (*e - g->base);
    const unsigned char *a = skip_blanks(g, x, b);
    /* A list marker: a bullet, or digits and '.' or ')'. */
    static const unsigned char mark[256] = {
        ['-'] = 1, ['*'] = 1, ['+'] = 1, ['0' ... '9'] = 2, [0xE2] = 3};
    unsigned char c = a < b ? *a : 0;
    if (__builtin_expect(mark[c], 0)) {
        if (mark[c] == 1) {
            a++;
        } else if (mark[c] == 2) {
            const unsigned char *d = a;
            while (d < b && *d >= '0' && *d <= '9')
                d++;
            if (d < b && (*d == '.' || *d == ')')) a = d + 1;
        } else if (b - a >= 3 && a[1] == 0x80 && a[2] == 0xA2) { /* • */
            a += 3;
        }
        while (a < b && (*a == ' ' || *a == '\t'))
            a++;
    }
    while (b > a && (b[-1] == ' ' || b[-1] == '\r'))
        b--;
    *e = *s + (uint64_t)(b - x);
    *s += (uint64_t)(a - x);
}

#define TPL_LAGS  3    /* periods of one to three lines */
#define TPL_RING  4    /* the last lines kept: a power of two, at least TPL_LAGS */
#define TOKEN_MAX 48   /* bytes of a token slot */
#define RECENT    2048 /* bytes before a line where its slot is looked for */
#define ITEM_MAX  96   /* bytes of an identifier item */
#define ITEM_BITS 1024 /* the set of a line's pieces */

struct gtemplate {
    uint64_t s[TPL_RING], e[TPL_RING];       /* the last bodies; line k at k % TPL_RING */
    uint64_t head[TPL_RING], tail[TPL_RING]; /* their first and last 8 bytes (see ends) */
    uint64_t n;                              /* lines held since the last break */
    unsigned text;                           /* lines in a row that follow by the text template */
    uint64_t text_from;                      /* the first line of that run */
    unsigned run[TPL_LAGS + 1];              /* per period: lines in a row that follow */
    unsigned old[TPL_LAGS + 1];              /* per period: those of them with an old token slot */
    uint64_t from[TPL_LAGS + 1];             /* per period: the first line of the run */
    unsigned miss[TPL_LAGS + 1];             /* per period: lines in a row that did not follow */
    unsigned texts[TPL_LAGS + 1]; /* per period above 1: text-template lines in the run */
    unsigned busy;                /* not 0: a run goes on (text or run[P] not 0) */
    /* Identifier items of the current line (guard_template_item): the line, where the
     * next item begins, the previous item's first piece (0: none), the run of items
     * sharing it and those of them made of old pieces, where the run began, and the
     * pieces the line's items had (a bit per hash). */
    uint64_t item_line, item_from, item_head, item_run_from;
    unsigned item_run, item_old;
    bool item_used;
    uint64_t pieces[ITEM_BITS / 64];
};

/* Byte classes: a slot's bytes (scan) and those of words (is_word: letters, digits, '_'
 * and every byte of a non-ASCII character). S_CODE: a code character (scan). */
enum { S_DIGIT = 1, S_SPACE = 2, S_LETTER = 4, S_UNDERSCORE = 8, S_CODE = 16 };
static const unsigned char slot_cls[256] = {
    ['0' ... '9'] = S_DIGIT,  [' '] = S_SPACE,          ['\t'] = S_SPACE,
    ['A' ... 'Z'] = S_LETTER, ['a' ... 'z'] = S_LETTER, [0x80 ... 0xFF] = S_LETTER,
    ['_'] = S_UNDERSCORE,
};
static const char code_chars[] = "=;<>@[\\]_`{|}";

static inline bool is_word(unsigned char c)
{
    return slot_cls[c] & (S_DIGIT | S_LETTER | S_UNDERSCORE);
}

#ifdef __SSE2__
/* The bytes of x from lo to lo + n (unsigned), as 0xFF bytes. */
static inline __m128i in_range(__m128i x, char lo, char n)
{
    __m128i d = _mm_sub_epi8(x, _mm_set1_epi8(lo));
    return _mm_cmpeq_epi8(_mm_min_epu8(d, _mm_set1_epi8(n)), d);
}

static inline unsigned mask16(__m128i x)
{
    return (unsigned)_mm_movemask_epi8(x);
}

/* The next 16 bytes of [*c, end) into *x and the mask of those in it into *valid: the 16 at
 * *c, or fewer than 16 left, the 16 that end at end (the history has them before). *c
 * moves past them. False when none are left, or when fewer than 16 are and the history
 * does not hold 16 before end: the caller takes those one by one. */
static inline bool next16(const guard *g, const unsigned char **c, const unsigned char *end,
                          __m128i *x, unsigned *valid)
{
    if (end - *c >= 16) {
        *x = _mm_loadu_si128((const __m128i *)(const void *)*c);
        *valid = 0xFFFF;
        *c += 16;
        return true;
    }
    if (*c == end || end - g->buf < 16) return false;
    *x = _mm_loadu_si128((const __m128i *)(const void *)(end - 16));
    *valid = (0xFFFFu << (16 - (end - *c))) & 0xFFFF;
    *c = end;
    return true;
}

/* The ASCII letters and the bytes of non-ASCII characters of x. */
static inline unsigned letters16(__m128i x)
{
    return mask16(in_range(_mm_or_si128(x, _mm_set1_epi8(0x20)), 'a', 25)) | mask16(x);
}

/* The bits set in a 16-bit mask (no -mpopcnt: __builtin_popcount is a call). */
static inline unsigned pop16(unsigned m)
{
    m -= (m >> 1) & 0x5555u;
    m = (m & 0x3333u) + ((m >> 2) & 0x3333u);
    m = (m + (m >> 4)) & 0x0F0Fu;
    return (m + (m >> 8)) & 0x1Fu;
}
#endif

/* What history [s, e) holds: S_DIGIT, S_SPACE (a space or tab), S_LETTER (ASCII, or any
 * byte of a non-ASCII character); with `text`, also S_CODE (one of code_chars), and
 * its letters and spaces into *letters and *gaps. 16 bytes at a time. */
static inline unsigned scan(const guard *g, uint64_t s, uint64_t e, bool text, uint64_t *letters,
                            uint64_t *gaps)
{
    unsigned h = 0;
    const unsigned char *c = g->buf + (s - g->base), *end = c + (e - s);
#ifdef __SSE2__
    __m128i x;
    unsigned v;
    while (next16(g, &c, end, &x, &v)) {
        const unsigned letter = letters16(x) & v,
                       space = mask16(_mm_cmpeq_epi8(x, _mm_set1_epi8(' '))) & v,
                       tab = mask16(_mm_cmpeq_epi8(x, _mm_set1_epi8('\t'))) & v;
        h |= ((mask16(in_range(x, '0', 9)) & v) != 0) * S_DIGIT | ((space | tab) != 0) * S_SPACE |
             (letter != 0) * S_LETTER;
        if (text) {
            /* ; < = > (3B-3E), @ (40), [ \ ] (5B-5D), _ ` (5F-60), { | } (7B-7D) */
            const __m128i code = _mm_or_si128(
                _mm_or_si128(in_range(x, 0x3B, 3), _mm_cmpeq_epi8(x, _mm_set1_epi8(0x40))),
                _mm_or_si128(_mm_or_si128(in_range(x, 0x5B, 2), in_range(x, 0x5F, 1)),
                             in_range(x, 0x7B, 2)));
            h |= ((mask16(code) & v) != 0) * S_CODE;
            *letters += pop16(letter);
            *gaps += pop16(space);
        }
    }
#endif
    for (; c < end; c++) {
        h |= slot_cls[*c] & (S_DIGIT | S_SPACE | S_LETTER);
        if (text) {
            h |= *c && strchr(code_chars, *c) ? S_CODE : 0;
            *letters += (slot_cls[*c] & S_LETTER) != 0;
            *gaps += *c == ' ';
        }
    }
    return h;
}

/* What history [s, e) holds (see scan). */
static unsigned holds(const guard *g, uint64_t s, uint64_t e)
{
    return scan(g, s, e, false, NULL, NULL);
}

/* Text: three words at least, letters at least half the body, and no code character.
 * Code and data declare lines on one template by design (imports, tables of constants,
 * dict entries): 25 of the 2,247 machine files tripped when code lines counted for the
 * text template. */
static bool is_text(const guard *g, uint64_t s, uint64_t e)
{
    uint64_t letters = 0, gaps = 0;
    return !(scan(g, s, e, true, &letters, &gaps) & S_CODE) && gaps >= 2 && letters * 2 >= e - s;
}

/* Is history [s, e) found in the RECENT bytes before `before` (`word`: as a whole word, not
 * inside another: "red" is not in "hundred")? */
static bool recent(const guard *g, uint64_t s, uint64_t e, uint64_t before, bool word)
{
    uint64_t from = before > g->base + RECENT ? before - RECENT : g->base;
    const unsigned char *h = g->buf + (from - g->base), *end = g->buf + (before - g->base),
                        *n = g->buf + (s - g->base), *m;
    size_t len = (size_t)(e - s);
    for (; (m = memmem(h, (size_t)(end - h), n, len)) != NULL; h = m + 1)
        if (!word || ((m == g->buf || !is_word(m[-1])) && (m + len >= end || !is_word(m[len]))))
            return true;
    return false;
}

/* How many of their first n bytes x and y share. 8 bytes at a time; in the first pair of
 * words that differ, the first byte that does is the lowest of their XOR's nonzero bytes
 * (little-endian, as the block detector's digit search assumes). */
static uint64_t common_prefix(const unsigned char *x, const unsigned char *y, uint64_t n)
{
    uint64_t k = 0, u, v;
    for (; k + 8 <= n; k += 8) {
        memcpy(&u, x + k, 8);
        memcpy(&v, y + k, 8);
        if (u != v) return k + (unsigned)__builtin_ctzll(u ^ v) / 8;
    }
    while (k < n && x[k] == y[k])
        k++;
    return k;
}

/* How many of their last n bytes the texts ending at xe and ye share: common_prefix
 * backwards (the last byte of a word is its highest). */
static uint64_t common_suffix(const unsigned char *xe, const unsigned char *ye, uint64_t n)
{
    uint64_t k = 0, u, v;
    for (; k + 8 <= n; k += 8) {
        memcpy(&u, xe - k - 8, 8);
        memcpy(&v, ye - k - 8, 8);
        if (u != v) return k + (unsigned)__builtin_clzll(u ^ v) / 8;
    }
    while (k < n && *(xe - k - 1) == *(ye - k - 1))
        k++;
    return k;
}

enum { T_NONE, T_TEXT, T_TOKEN, T_OLD }; /* how a line follows another */

/* How the body [b, be) follows [a, ae): T_TEXT by the text template (asked when `text`),
 * T_TOKEN by the token template, T_OLD by the token template with an old slot; *equal:
 * the two are the same line. `copy`: the first line of b's copy of the cycle. A slot is
 * old when b only grew a name by text written in the RECENT bytes
 * ("cftsubsubsubsecfont" after "cftsubsubsecfont"), or, in a text line, when its word
 * was written before the copy (the adjective of a pair of questions, cycled again), or,
 * in a code line, when it is one character (a letter counting through the alphabet). The
 * next name of a list of imports is new: a program declares one name per line on
 * purpose. */
static unsigned follows(const guard *g, uint64_t a, uint64_t ae, uint64_t b, uint64_t be,
                        bool first, uint64_t copy, bool *equal)
{
    const guard_params *p = g->p;
    const unsigned char *x = g->buf + (a - g->base), *y = g->buf + (b - g->base);
    uint64_t la = ae - a, lb = be - b, n = la < lb ? la : lb;
    *equal = false;
    uint64_t pre = common_prefix(x, y, n);
    if (pre == la && la == lb) {
        *equal = true;
        return T_NONE;
    }
    if (n < p->lines.template_bytes) return T_NONE; /* prefix + suffix <= the shorter line */
    uint64_t suf = common_suffix(x + la, y + lb, n - pre);
    uint64_t frame = pre + suf, longer = la > lb ? la : lb;
    if (frame < p->lines.template_bytes) return T_NONE;
    /* The text template is asked first at period 1, last at the others (a line that is both
     * counts there by its slot). */
    const unsigned text = (double)frame >= p->lines.template_share * (double)longer &&
                                  !(holds(g, b + pre, be - suf) & S_DIGIT) && is_text(g, b, be)
                              ? T_TEXT
                              : T_NONE;
    if (first && text) return T_TEXT;
    if (longer - frame > TOKEN_MAX) return text; /* widening only makes the slot longer */
    /* b grew a name, nothing replaced (its slot [gs, ge)), by text written in the RECENT
     * bytes: asked last, where the slot is a token's. */
    const bool grew = (frame == la || frame == lb) && frame < lb;
    const uint64_t gs = b + pre, ge = be - suf;
    /* The token template: the slot widened to whole words ("cftsubsecfont", not "ubsec"). */
    while (pre && is_word(x[pre - 1]) &&
           ((pre < la && is_word(x[pre])) || (pre < lb && is_word(y[pre]))))
        pre--;
    while (suf && is_word(x[la - suf]) &&
           ((suf < la && is_word(x[la - suf - 1])) || (suf < lb && is_word(y[lb - suf - 1]))))
        suf--;
    if (pre + suf < p->lines.template_bytes || la - pre - suf > TOKEN_MAX ||
        lb - pre - suf > TOKEN_MAX)
        return text;
    unsigned ha = holds(g, a + pre, ae - suf), hb = holds(g, b + pre, be - suf);
    if ((ha | hb) & (S_DIGIT | S_SPACE) || !((ha | hb) & S_LETTER)) return text;
    uint64_t slot = lb - pre - suf;
    bool old = (grew && recent(g, gs, ge, b, false)) ||
               (is_text(g, b, be) ? !slot || recent(g, b + pre, be - suf, copy, true) : slot <= 1);
    return old ? T_OLD : T_TOKEN;
}

/* Does the run of period P trip: template_run old slots, or a quarter of a run twice as
 * long (a name that grows by new words between recombinations)? */
static bool old_run(const struct gtemplate *t, unsigned P, unsigned template_run)
{
    return t->old[P] >= template_run ||
           (t->run[P] >= 2 * template_run && 4 * t->old[P] >= t->run[P]) ||
           2 * t->texts[P] >= 3 * template_run;
}

/* The first and last 8 bytes of the body [s, e), or (shorter) its bytes twice, as numbers
 * (the first byte lowest). A frame of template_bytes (16 or more) leaves one of them equal,
 * so most pairs of lines are told apart by these two compares, without calling follows. */
static inline void ends(const guard *g, uint64_t s, uint64_t e, uint64_t *head, uint64_t *tail)
{
    const unsigned char *x = g->buf + (s - g->base);
    const size_t n = (size_t)(e - s);
    uint64_t h = 0, t;
    if (n >= 8) {
        memcpy(&h, x, 8);
        memcpy(&t, x + n - 8, 8);
    } else if (e - g->base >= 8) { /* the 8 bytes that end it, the bytes before shifted out */
        memcpy(&h, x + n - 8, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        h = __builtin_bswap64(h);
#endif
        h = n ? h >> 8 * (8 - n) : 0;
        t = h;
    } else {
        for (size_t i = 0; i < n; i++)
            h |= (uint64_t)x[i] << 8 * i;
        t = h;
    }
    *head = h;
    *tail = t;
}

/* guard_template_line for a line [start, end), the t->n-th, already in the ring, that may
 * follow one of the TPL_LAGS lines before it, or while a run goes on (t->busy). RARE_PATH. */
RARE_PATH static bool template_judge(guard *g, struct gtemplate *t, uint64_t start, uint64_t end,
                                     uint64_t now)
{
    const guard_params *p = g->p;
    const uint64_t head = t->head[t->n % TPL_RING], tail = t->tail[t->n % TPL_RING];
    /* Lines whose heads and tails both differ share no frame of 16 bytes (the template's
     * bytes are a parameter: below 16 every pair is compared). */
    const bool filter = p->lines.template_bytes >= 16;
    bool tied = false; /* the line follows or equals the one before */
    unsigned olds = 0; /* old slots in the runs, all periods */
    /* A line shorter than a template follows none (most lines of code): every run ends. */
    unsigned lags = end - start < p->lines.template_bytes ? 0 : TPL_LAGS;
    if (!lags) {
        t->text = 0;
        memset(t->run, 0, sizeof(t->run));
        memset(t->old, 0, sizeof(t->old));
        memset(t->miss, 0, sizeof(t->miss));
        memset(t->texts, 0, sizeof(t->texts));
    }
    for (unsigned P = 1; P <= lags && P <= t->n; P++) {
        const unsigned k = (unsigned)((t->n - P) % TPL_RING);
        /* The first line of this copy: the line P - 1 before this one. */
        uint64_t a = t->s[k], copy = P == 1 ? start : t->s[(t->n - P + 1) % TPL_RING];
        bool equal = false, apart = filter && head != t->head[k] && tail != t->tail[k];
        unsigned f = a >= g->base && !tied && !apart
                         ? follows(g, a, t->e[k], start, end, P == 1, copy, &equal)
                         : T_NONE;
        if (P == 1) {
            tied = f || equal;
            if (f == T_TEXT && !t->text) t->text_from = a;
            t->text = f == T_TEXT ? t->text + 1 : 0;
        }
        if (f && !t->run[P]) t->from[P] = a;
        if (P > 1 && !f) {
            /* A cycle of P lines may keep one line fixed (equal: no change) or free. */
            if (!equal && ++t->miss[P] >= P) t->run[P] = t->old[P] = t->texts[P] = t->miss[P] = 0;
        } else {
            t->miss[P] = 0;
            t->run[P] = f ? t->run[P] + 1 : 0;
            t->old[P] = f ? t->old[P] + (f == T_OLD) : 0;
            t->texts[P] = f && P > 1 ? t->texts[P] + (f == T_TEXT) : 0;
        }
        olds |= t->old[P] | t->texts[P];
    }
    t->busy = t->text | t->run[1] | t->run[2] | t->run[3];
    t->n++;
    /* The text run (period 1), then the runs of old token slots. */
    uint64_t from = t->text_from;
    unsigned copies = t->text + 1, P;
    if (t->text < p->lines.template_run) {
        if (!olds) return false;
        for (P = 1; P <= TPL_LAGS && !old_run(t, P, p->lines.template_run); P++)
            ;
        if (P > TPL_LAGS) return false;
        from = t->from[P];
        copies = t->run[P] / P + 1;
    }
    uint32_t slack = guard_prompt_slack(g, g->buf + (start - g->base), (size_t)(end - start));
    if (copies <= slack) return false;
    guard_set_unit(g, start, end);
    guard_trip(g, "template", from, now, copies);
    return true;
}

/* guard_template_line at the first line of a guard, or at a line longer than the history
 * (no template: a break). COLD_PATH. */
COLD_PATH static bool template_break(guard *g, uint64_t start, uint64_t end, uint64_t now)
{
    if (!g->tpl) g->tpl = guard_table(g, GT_TPL, sizeof(*g->tpl));
    if (start >= g->base) return guard_template_line(g, start, end, now);
    memset(g->tpl, 0, sizeof(*g->tpl));
    return false;
}

bool guard_template_line(guard *g, uint64_t start, uint64_t end, uint64_t now)
{
    const guard_params *p = g->p;
    struct gtemplate *t = g->tpl;
    if (!t || start < g->base) return template_break(g, start, end, now);
    if (start == end) return false;
    /* The line goes into the ring (slot t->n, the line TPL_LAGS + 1 before: no period reads
     * it), then t->n moves on. */
    const unsigned k = (unsigned)t->n % TPL_RING;
    uint64_t head, tail;
    ends(g, start, end, &head, &tail);
    t->s[k] = start;
    t->e[k] = end;
    t->head[k] = head;
    t->tail[k] = tail;
    /* No run going on, and a line shorter than a template or whose head and tail both
     * differ from those of each of the TPL_LAGS lines before it (then it shares no frame of
     * template_bytes, 16 or more, with any): nothing follows, and nothing changes but the
     * ring (each period's count of lines that did not follow only matters inside a run: a
     * line that follows sets it to 0). Most lines. In arithmetic, not branches: which
     * compare tells a line apart is anybody's guess. Before the first TPL_LAGS lines the
     * ring holds zeros or older lines: a line that matches them is judged, which costs
     * time only. */
    const uint64_t *h = t->head, *e = t->tail;
    const unsigned k1 = (k - 1) % TPL_RING, k2 = (k - 2) % TPL_RING, k3 = (k - 3) % TPL_RING;
    const unsigned tied = (head == h[k1]) | (head == h[k2]) | (head == h[k3]) | (tail == e[k1]) |
                          (tail == e[k2]) | (tail == e[k3]) | (p->lines.template_bytes < 16);
    if (t->busy || (end - start >= p->lines.template_bytes && tied))
        return template_judge(g, t, start, end, now);
    t->n++;
    return false;
}

/* May [a, b) be a name of two pieces: are its first 16 bytes (all, when fewer) letters,
 * digits, '_' or '-', with a '_' or '-' among them when they are all? Most items are not
 * (prose, arguments), told without the byte loop, whose exit follows the text. */
static inline bool may_be_name(const guard *g, const unsigned char *a, const unsigned char *b)
{
#ifdef __SSE2__
    unsigned valid; /* the bytes of [a, b) among the 16 read */
    const unsigned char *at;
    if (b - a >= 16) {
        at = a;
        valid = 0xFFFF;
    } else if (b - g->buf >= 16) {
        at = b - 16;
        valid = (0xFFFFu << (16 - (b - a))) & 0xFFFF;
    } else {
        return true;
    }
    const __m128i x = _mm_loadu_si128((const __m128i *)(const void *)at);
    const __m128i f = _mm_sub_epi8(_mm_or_si128(x, _mm_set1_epi8(0x20)), _mm_set1_epi8('a'));
    const __m128i d = _mm_sub_epi8(x, _mm_set1_epi8('0'));
    const __m128i letter = _mm_cmpeq_epi8(_mm_min_epu8(f, _mm_set1_epi8(25)), f);
    const __m128i digit = _mm_cmpeq_epi8(_mm_min_epu8(d, _mm_set1_epi8(9)), d);
    const __m128i joint =
        _mm_or_si128(_mm_cmpeq_epi8(x, _mm_set1_epi8('_')), _mm_cmpeq_epi8(x, _mm_set1_epi8('-')));
    unsigned ok = (unsigned)_mm_movemask_epi8(_mm_or_si128(_mm_or_si128(letter, digit), joint));
    unsigned joints = (unsigned)_mm_movemask_epi8(joint) & valid;
    if ((ok & valid) != valid) return false;
    return joints || b - a > 16;
#else
    (void)g;
    (void)a;
    (void)b;
    return true;
#endif
}

/* Identifier items: a line that lists names separated by commas, each name of two pieces
 * or more joined by '_' or '-' ("ARCHIVING_ON_NET, ARCHIVING_ON_NET_WITH_ARCHIVING, ..."),
 * names that share their first piece with the one before. Such a list is a loop when its
 * names are made only of pieces the line already had: template_run of them in one run
 * trip. A list of constants names new things ("WS_EX_LEFT, WS_EX_TOPMOST"); quoted items
 * are strings, not names, and are no items. Cost: O(item) at each comma. */
bool guard_template_item(guard *g, uint64_t line_start, uint64_t end, uint64_t now)
{
    const guard_params *p = g->p;
    if (!g->tpl) g->tpl = guard_table(g, GT_TPL, sizeof(*g->tpl));
    struct gtemplate *t = g->tpl;
    if (t->item_line != line_start + 1) { /* a new line: a new list */
        if (t->item_used) memset(t->pieces, 0, sizeof(t->pieces));
        t->item_line = line_start + 1;
        t->item_from = line_start;
        t->item_head = 0;
        t->item_run = t->item_old = 0;
        t->item_used = false;
    }
    uint64_t s = t->item_from, e = end;
    t->item_from = end + 1;
    if (s < g->base) s = e; /* longer than the history: no name */
    const unsigned char *is = g->buf + (s - g->base), *ie = g->buf + (e - g->base);
    s += (uint64_t)(skip_blanks(g, is, ie) - is);
    unsigned char c = s < e ? guard_at(g, s) : 0;
    bool name = e - s <= ITEM_MAX && (((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || c == '_') &&
                may_be_name(g, g->buf + (s - g->base), ie);
    /* The hashes of the pieces between '_' and '-'. */
    uint64_t h = 0xCBF29CE484222325ull, hs[ITEM_MAX / 2 + 1];
    unsigned n = 0;
    for (uint64_t o = s; name && o <= e; o++) {
        c = o < e ? guard_at(g, o) : '_';
        if (c == '_' || c == '-') {
            if (h != 0xCBF29CE484222325ull) hs[n++] = h;
            h = 0xCBF29CE484222325ull;
        } else if (is_word(c) && c < 0x80) {
            h = (h ^ c) * 0x100000001B3ull;
        } else {
            name = false;
        }
    }
    if (!name || n < 2) {
        t->item_head = 0;
        t->item_run = t->item_old = 0;
        return false;
    }
    uint64_t head = hs[0] | 1; /* never 0, "none" */
    bool old = true;
    for (unsigned k = 0; k < n; k++) {
        unsigned bit = (unsigned)(hs[k] >> 32) % ITEM_BITS;
        old &= (t->pieces[bit / 64] >> (bit % 64)) & 1;
        t->pieces[bit / 64] |= 1ull << (bit % 64);
    }
    t->item_used = true;
    bool same = head == t->item_head;
    if (!same) t->item_run_from = s;
    t->item_head = head;
    t->item_run = same ? t->item_run + 1 : 0;
    t->item_old = same ? t->item_old + old : 0;
    if (t->item_old < p->lines.template_run) return false;
    if (t->item_old + 1 <= guard_prompt_slack(g, g->buf + (s - g->base), (size_t)(e - s)))
        return false;
    guard_set_unit(g, s, e);
    guard_trip(g, "template", t->item_run_from, now, t->item_old + 1);
    return true;
}
