/* g_count.c — the counting detector: numbers that count up with the same text between them
 * ("column7, column8, column9, ", "21. 22. 23. 24."), the loop of a model that enumerates
 * until it runs out of tokens. Verbatim repeats are the repeat detector's; here every unit
 * differs in its number.
 *
 * g_text.c hands over each number as it ends (a digit followed by a byte that is neither a
 * letter nor a digit; the digits of "column7" count). A number continues the count when it
 * is 1 to 3 above the last one (rows of a grid skip a few: "28.\n31.") and the text since
 * the last number is the same as before it (any whitespace byte for any other), at most
 * GAP_MAX bytes. count_run numbers in a row trip, unless the prompt holds a number at least
 * as large as the one reached ("count from 1 to 100"). A numbered list passes: its items
 * are the text between the numbers, and they differ.
 *
 * Cost: O(digits + gap) per number, reading the history; memory: four offsets and a count. */
#include "guard/guard_int.h"

#define GAP_MAX    24 /* bytes of text between two numbers of a count */
#define DIGITS_MAX 9  /* longer numbers are no count (ids, hashes) */
#define STEP_MAX   3

static inline bool is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static inline bool is_space(unsigned char c)
{
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

bool guard_count_number(guard *g, uint64_t end, uint64_t now)
{
    uint64_t start = end;
    while (start > g->base && end - start <= DIGITS_MAX && is_digit(guard_at(g, start - 1)))
        start--;
    uint64_t gap_from = g->cnt_last_end;
    g->cnt_last_end = end;
    if (end - start > DIGITS_MAX || start == g->base) { /* too long, or history cut it */
        g->cnt_run = 0;
        g->cnt_gap_len = 0;
        return false;
    }
    uint64_t v = 0;
    for (uint64_t o = start; o < end; o++)
        v = v * 10 + (guard_at(g, o) - '0');
    /* The text since the last number must equal the text before it, byte for byte with
     * any whitespace byte standing for any other (rows: "28.\n31." against "27. 28."). A
     * gap too long, or older than the history, is no gap (length 0, which no count
     * continues). Compared directly: most fail on the length or the first byte. */
    uint64_t len = start - gap_from <= GAP_MAX && gap_from >= g->base ? start - gap_from : 0;
    bool same = len && len == g->cnt_gap_len && g->cnt_gap_from >= g->base;
    for (uint64_t k = 0; same && k < len; k++) {
        unsigned char x = guard_at(g, g->cnt_gap_from + k), y = guard_at(g, gap_from + k);
        same = x == y || (is_space(x) && is_space(y));
    }
    bool counts = same && v > g->cnt_value && v - g->cnt_value <= STEP_MAX;
    g->cnt_run = counts ? g->cnt_run + 1 : 0;
    if (!counts) g->cnt_from = start;
    g->cnt_gap_from = gap_from;
    g->cnt_gap_len = len;
    g->cnt_value = v;
    if (g->cnt_run < g->p->lines.count_run || g->prompt_number >= v) return false;
    guard_set_unit(g, gap_from, end);
    guard_trip(g, "count", g->cnt_from, now, g->cnt_run + 1);
    return true;
}
