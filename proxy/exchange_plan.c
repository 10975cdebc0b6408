/* exchange_plan.c — an attempt's decisions (exchange_plan.h). */
#include "proxy/exchange_plan.h"

ex_plan ex_plan_attempt(const lg_config *cfg, const ex_plan_in *in)
{
    ex_plan p = {0};
    unsigned k = in->attempt;
    if (k > 1 && cfg->retry.n_ladder) {
        size_t i = k - 2 < cfg->retry.n_ladder ? k - 2 : cfg->retry.n_ladder - 1;
        p.step = &cfg->retry.ladder[i];
    }
    p.cont = k > 1 && in->has_prefix && in->upstream_kind != LG_UPSTREAM_OPENAI &&
             in->api_can_continue && in->prompt_continuable &&
             (cfg->retry.mode == LG_RETRY_CONTINUE ||
              (cfg->retry.mode == LG_RETRY_AUTO && in->client_stream));
    p.restart = k > 1 && !p.cont && !in->client_stream;
    p.guarded = in->guard_on && !(k > 1 && k == cfg->retry.max_attempts &&
                                  cfg->retry.on_exhausted == LG_EXHAUSTED_PASS_THROUGH);
    return p;
}

bool ex_plan_elsewhere(const lg_config *cfg, unsigned attempt)
{
    return attempt > 1 && cfg->retry.elsewhere == LG_ELSEWHERE_AUTO;
}
