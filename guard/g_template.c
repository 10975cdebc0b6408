/* g_template.c — the template detector: lines that follow one template and differ in one
 * slot ("AI in NLP for Finance", "AI in NLP for Retail", ... for a hundred items), going on
 * long after the answer stopped saying anything new. Verbatim returns are the lines
 * detector's; here no two lines need be equal.
 *
 * Each completed line (g_text.c hands them over) is compared with the previous one, both
 * without their list marker ("12. ", "- ", "* ") and indentation: they share a template
 * when their common prefix plus common suffix holds at least template_bytes and
 * template_share of the longer line, they differ, and the slot (what is left of the new
 * line) holds no digit. Digits in the slot are numbered data ("Check if n is 17", a
 * table's "4.5-Ounce", coordinates), which answers list on purpose. A run of
 * template_run such lines in a row trips, unless the prompt asks for or holds that many
 * (guard_prompt_slack of the line). Blank lines neither extend nor break a run.
 *
 * Legitimate lists share templates too ("- 1 cup of X"), which is why the run is long and
 * the template must be most of the line. Cost: O(line) once per line, over bytes still in
 * the history; memory: three offsets and a count. */
#include "guard/guard_int.h"

void guard_line_body(const guard *g, uint64_t *s, uint64_t *e)
{
    uint64_t a = *s, b = *e;
    while (a < b && (guard_at(g, a) == ' ' || guard_at(g, a) == '\t'))
        a++;
    unsigned char c = a < b ? guard_at(g, a) : 0;
    if (c == '-' || c == '*' || c == '+') {
        a++;
    } else if (c >= '0' && c <= '9') {
        uint64_t d = a;
        while (d < b && guard_at(g, d) >= '0' && guard_at(g, d) <= '9')
            d++;
        if (d < b && (guard_at(g, d) == '.' || guard_at(g, d) == ')')) a = d + 1;
    } else if (b - a >= 3 && c == 0xE2 && guard_at(g, a + 1) == 0x80 &&
               guard_at(g, a + 2) == 0xA2) { /* • */
        a += 3;
    }
    while (a < b && (guard_at(g, a) == ' ' || guard_at(g, a) == '\t'))
        a++;
    while (b > a && (guard_at(g, b - 1) == ' ' || guard_at(g, b - 1) == '\r'))
        b--;
    *s = a;
    *e = b;
}

/* Do the bodies [a, ae) and [b, be) share a template, the slot of b holding no digit? */
static bool same_template(const guard *g, uint64_t a, uint64_t ae, uint64_t b, uint64_t be)
{
    const guard_params *p = g->p;
    uint64_t la = ae - a, lb = be - b, n = la < lb ? la : lb, pre = 0, suf = 0;
    if (n < p->lines.template_bytes) return false; /* prefix + suffix <= the shorter line */
    while (pre < n && guard_at(g, a + pre) == guard_at(g, b + pre))
        pre++;
    if (pre == la && la == lb) return false; /* the same line: the lines detector's */
    while (suf < n - pre && guard_at(g, ae - 1 - suf) == guard_at(g, be - 1 - suf))
        suf++;
    uint64_t longer = la > lb ? la : lb;
    if (pre + suf < p->lines.template_bytes ||
        (double)(pre + suf) < p->lines.template_share * (double)longer)
        return false;
    for (uint64_t o = b + pre; o < be - suf; o++)
        if (guard_at(g, o) >= '0' && guard_at(g, o) <= '9') return false;
    return true;
}

/* Text: three words at least, letters at least half the body, and no code character
 * (= ; < > @ [ \\ ] _ ` { | }). Code and data declare lines on one template by design
 * (imports, tables of constants, dict entries): 25 of the 2,247 machine files tripped when
 * code lines counted. Asked only of a line that follows the template. */
static bool is_text(const guard *g, uint64_t s, uint64_t e)
{
    static const unsigned char code[128] = {
        ['='] = 1, [';'] = 1, ['<'] = 1, ['>'] = 1, ['@'] = 1, ['['] = 1, ['\\'] = 1,
        [']'] = 1, ['_'] = 1, ['`'] = 1, ['{'] = 1, ['|'] = 1, ['}'] = 1};
    uint64_t letters = 0, gaps = 0;
    for (uint64_t o = s; o < e; o++) {
        unsigned char c = guard_at(g, o);
        if (c < 0x80 && code[c]) return false;
        letters += ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || c >= 0x80;
        gaps += c == ' ';
    }
    return gaps >= 2 && letters * 2 >= e - s;
}

bool guard_template_line(guard *g, uint64_t start, uint64_t end, uint64_t now)
{
    const guard_params *p = g->p;
    if (start < g->base) { /* longer than the history: no template */
        g->tpl_run = 0;
        g->tpl_valid = false;
        return false;
    }
    if (start == end) return false;
    bool follows = g->tpl_valid && g->tpl_start >= g->base &&
                   same_template(g, g->tpl_start, g->tpl_end, start, end) && is_text(g, start, end);
    g->tpl_run = follows ? g->tpl_run + 1 : 0;
    if (!follows) g->tpl_from = start;
    g->tpl_start = start;
    g->tpl_end = end;
    g->tpl_valid = true;
    if (g->tpl_run < p->lines.template_run) return false;
    uint32_t slack = guard_prompt_slack(g, g->buf + (start - g->base), (size_t)(end - start));
    if (g->tpl_run + 1 <= slack) return false;
    guard_set_unit(g, start, end);
    guard_trip(g, "template", g->tpl_from, now, g->tpl_run + 1);
    return true;
}
