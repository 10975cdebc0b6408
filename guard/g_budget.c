/* g_budget.c — budgets: a channel that ran past budget_bytes (reasoning that never ends),
 * and the cross-channel "empty answer" (reasoning, then no content at all).
 *
 * Neither reads the text itself: the budget is one compare per piece, the empty answer is
 * decided once, by the exchange, when the generation ends. */
#include "guard/guard_int.h"

/* Trips "budget" at the first byte past budget_bytes, if the piece holds it. */
static size_t budget_pass(guard *g, size_t lim, uint64_t fed0)
{
    uint64_t budget = g->p->budget_bytes;
    if (budget - fed0 >= lim) return lim;
    uint64_t pos = budget; /* offset of the first byte past the budget */
    guard_set_unit(g, pos + 1, pos + 1);
    guard_trip(g, "budget", budget, pos + 1, 0);
    return (size_t)(budget - fed0);
}

bool guard_report_empty_answer(guard *g, uint64_t reasoning_bytes)
{
    const guard_params *p = g->p;
    if (g->tripped) return true;
    if (!p->enabled || !p->empty_answer_min_reasoning || g->content_seen ||
        reasoning_bytes < p->empty_answer_min_reasoning)
        return false;
    guard_set_unit(g, g->fed, g->fed);
    guard_trip(g, "empty_answer", 0, g->fed, 0);
    return true;
}

static bool budget_on(const guard_params *p)
{
    return p->budget_bytes > 0;
}

const guard_detector guard_det_budget = {
    .name = "budget",
    .on = budget_on,
    .pass = budget_pass,
};
