/* g_count.c — the counting detector: numbers that count up with the same text between them
 * ("column7, column8, column9, ", "21. 22. 23. 24."), the loop of a model that enumerates
 * until it runs out of tokens. Verbatim repeats are the repeat detector's; here every unit
 * differs in its number.
 *
 * g_text.c hands over each number as it ends (a digit followed by a byte that is neither a
 * letter nor a digit; the digits of "column7" count). A number continues the count when it
 * is 1 to 3 above the last one (rows of a grid skip a few: "28.\n31.") and the text since
 * the last number is the same as before it, whitespace folded to one space and at most
 * GAP_MAX bytes. count_run numbers in a row trip, unless the prompt holds a number at least
 * as large as the one reached ("count from 1 to 100"). A numbered list passes: its items
 * are the text between the numbers, and they differ.
 *
 * Cost: O(digits) per number, and O(gap) for a number 1 to STEP_MAX above the last, reading
 * the history; memory: four offsets and a count. */
#include <string.h>

#include "guard/guard_int.h"

#define GAP_MAX    24 /* bytes of text between two numbers of a count */
#define DIGITS_MAX 9  /* longer numbers are no count (ids, hashes) */
#define STEP_MAX   3

static inline bool is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

/* Are the DIGITS_MAX + 1 bytes of history before `end` all digits (a number too long to
 * count: an id, a timestamp)? Eight of them at once: a digit is 0x30-0x39, the one byte
 * value whose high nibble stays 3 with 6 added. */
static inline bool too_long(const guard *g, uint64_t end)
{
    _Static_assert(DIGITS_MAX + 1 == 10, "eight bytes and two");
    if (end - g->base < DIGITS_MAX + 1) return false;
    const unsigned char *p = g->buf + (end - g->base) - 10;
    uint64_t v;
    memcpy(&v, p + 2, 8);
    const uint64_t hi = 0xF0F0F0F0F0F0F0F0ull, three = 0x3030303030303030ull;
    return (v & hi) == three && ((v + 0x0606060606060606ull) & hi) == three && is_digit(p[0]) &&
           is_digit(p[1]);
}

/* The text [s, e) of a gap, whitespace folded, hashed. */
static uint64_t gap_hash(const guard *g, uint64_t s, uint64_t e)
{
    uint64_t h = 0xCBF29CE484222325ull;
    bool space = false;
    for (uint64_t o = s; o < e; o++) {
        unsigned char c = guard_at(g, o);
        bool ws = c == ' ' || c == '\n' || c == '\t' || c == '\r';
        if (ws && space) continue;
        space = ws;
        h = (h ^ (ws ? ' ' : c)) * 0x100000001B3ull;
    }
    return h;
}

/* guard_count_number for a number that is not too long. RARE_PATH: its registers are saved
 * only for the numbers it reads. */
RARE_PATH static bool count_number(guard *g, uint64_t end, uint64_t now)
{
    uint64_t start = end;
    while (start > g->base && end - start <= DIGITS_MAX && is_digit(guard_at(g, start - 1)))
        start--;
    uint64_t gap_from = g->cnt_last_end;
    g->cnt_last_end = end;
    if (end - start > DIGITS_MAX || start == g->base) { /* too long, or history cut it */
        g->cnt_run = 0;
        g->cnt_gap = 0;
        return false;
    }
    uint64_t v = 0;
    for (uint64_t o = start; o < end; o++)
        v = v * 10 + (guard_at(g, o) - '0');
    /* The text since the last number, whitespace folded, must be the text before it: a gap
     * too long, or older than the history, is none, which no count continues. The gaps are
     * kept as offsets (cnt_gap) and hashed only for a number 1 to STEP_MAX above the last
     * (most numbers are not): both lie in the last 2 * (GAP_MAX + DIGITS_MAX) bytes, which
     * the history always holds. */
    bool gap = start - gap_from <= GAP_MAX && gap_from >= g->base;
    uint64_t last = g->cnt_gap, last_from = last >> 8, last_len = (last & 0xFF) - 1;
    bool counts =
        gap && last && v > g->cnt_value && v - g->cnt_value <= STEP_MAX && last_from >= g->base;
    if (counts) {
        uint64_t h = gap_hash(g, gap_from, start);
        counts = h && h == gap_hash(g, last_from, last_from + last_len);
    }
    g->cnt_run = counts ? g->cnt_run + 1 : 0;
    if (!counts) g->cnt_from = start;
    g->cnt_gap = gap ? gap_from << 8 | (start - gap_from + 1) : 0;
    g->cnt_value = (uint32_t)v; /* at most DIGITS_MAX digits */
    if (g->cnt_run < g->p->lines.count_run || g->prompt_number >= v) return false;
    guard_set_unit(g, gap_from, end);
    guard_trip(g, "count", g->cnt_from, now, g->cnt_run + 1);
    return true;
}

/* Most numbers of a stream of ids or timestamps are too long to count: they end here,
 * without count_number's set-up (six registers saved and restored, half of its cost for
 * such a number). */
bool guard_count_number(guard *g, uint64_t end, uint64_t now)
{
    if (too_long(g, end)) { /* as count_number's walk would find, without the walk */
        g->cnt_last_end = end;
        g->cnt_run = 0;
        g->cnt_gap = 0;
        return false;
    }
    return count_number(g, end, now);
}
