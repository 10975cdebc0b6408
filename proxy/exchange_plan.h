/* exchange_plan.h — the decisions of an attempt, as a pure function of the configuration
 * and what the exchange knows: which rung of the retry ladder, whether it continues the
 * clean prefix the client has or starts over, whether it runs guarded, and whether it must
 * prefer another replica. exchange.c's start_attempt acts on the plan; tests/unit/
 * test_exchange_plan.c pins it. */
#ifndef LG_EXCHANGE_PLAN_H
#define LG_EXCHANGE_PLAN_H

#include <stdbool.h>

#include "config/config.h"

/* What an attempt knows before it starts. */
typedef struct ex_plan_in {
    unsigned attempt;        /* 1 = the first */
    bool has_prefix;         /* the client has released text (reasoning or answer) */
    bool client_stream;      /* the client streams */
    int upstream_kind;       /* lg_upstream_kind of the replica chosen */
    bool api_can_continue;   /* the route can continue a prefix (lg_api.can_continue) */
    bool prompt_continuable; /* chat messages, or a string prompt */
    bool guard_on;           /* the exchange is guarded at all */
} ex_plan_in;

typedef struct ex_plan {
    const lg_sampling_step *step; /* the ladder's rung; NULL: the client's own sampling */
    bool cont;                    /* continue the client's clean prefix */
    bool restart;                 /* a whole response starts over (what was released goes) */
    bool guarded;                 /* the guard reads this attempt */
} ex_plan;

/* Rung k-2 of retry.ladder for attempt k > 1 (the last rung repeats). cont: a retry with
 * a prefix, on an upstream that continues (SGLang, vLLM), for a route and prompt that can,
 * when retry.mode is continue, or auto and the client streams (a whole response has shown
 * nothing yet, so it restarts cleanly). restart: a retry of a whole response that does not
 * continue. guarded: unless this is the last attempt and on_exhausted is pass_through. */
ex_plan ex_plan_attempt(const lg_config *cfg, const ex_plan_in *in);

/* True when attempt k (> 1) must prefer another replica than the last one's. */
bool ex_plan_elsewhere(const lg_config *cfg, unsigned attempt);

#endif
