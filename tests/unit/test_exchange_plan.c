/* test_exchange_plan.c — an attempt's decisions (proxy/exchange_plan.h): the rung of the
 * retry ladder per attempt, continue against restart per retry mode, client side, upstream
 * and route, the unguarded last attempt of pass_through, and retrying elsewhere. Table-driven
 * over the default configuration and small changes to it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>

#include "config/config.h"
#include "proxy/exchange_plan.h"

static lg_config *with(const char *json)
{
    lg_config *cfg = config_new_defaults();
    char err[256] = "";
    if (json && config_load_string(cfg, json, err, sizeof err) != 0) fail_msg("config: %s", err);
    return cfg;
}

/* A retry with a prefix, of a chat on SGLang: the base every case changes one thing of. */
static ex_plan_in retry(unsigned k, bool stream)
{
    return (ex_plan_in){.attempt = k,
                        .has_prefix = true,
                        .client_stream = stream,
                        .upstream_kind = LG_UPSTREAM_SGLANG,
                        .api_can_continue = true,
                        .prompt_continuable = true,
                        .guard_on = true};
}

/* The ladder: none on the first attempt, rung k-2 on attempt k, the last rung repeating. */
static void test_ladder(void **state)
{
    (void)state;
    lg_config *cfg = with("{\"retry\":{\"max_attempts\":6}}");
    ex_plan_in in = retry(1, true);
    assert_null(ex_plan_attempt(cfg, &in).step);
    const size_t want[] = {0, 0, 1, 1, 1, 1}; /* by k - 1: k = 2 takes rung 0, k = 3 rung 1, ... */
    for (unsigned k = 2; k <= 6; k++) {
        in = retry(k, true);
        assert_ptr_equal(ex_plan_attempt(cfg, &in).step, &cfg->retry.ladder[want[k - 1]]);
    }
    assert_true(cfg->retry.ladder[1].temperature_add > cfg->retry.ladder[0].temperature_add);
    config_free(cfg);
}

typedef struct contcase {
    const char *config; /* retry settings, or NULL for the defaults (mode auto) */
    ex_plan_in in;
    bool cont, restart;
    const char *why;
} contcase;

static void test_continue_or_restart(void **state)
{
    (void)state;
    ex_plan_in openai = retry(2, true), noprefix = retry(2, true), noroute = retry(2, true),
               noprompt = retry(2, true), first = retry(1, false);
    openai.upstream_kind = LG_UPSTREAM_OPENAI;
    noprefix.has_prefix = false;
    noroute.api_can_continue = false;
    noprompt.prompt_continuable = false;
    const contcase cases[] = {
        {NULL, retry(2, true), true, false, "auto, streaming: continue what the client has"},
        {NULL, retry(2, false), false, true, "auto, whole: restart, the client saw nothing"},
        {"{\"retry\":{\"mode\":\"continue\"}}", retry(2, false), true, false, "continue, whole"},
        {"{\"retry\":{\"mode\":\"restart\"}}", retry(2, true), false, false,
         "restart, streaming: starts over, the client keeps what it has"},
        {"{\"retry\":{\"mode\":\"restart\"}}", retry(2, false), false, true, "restart, whole"},
        {NULL, openai, false, false, "a generic OpenAI upstream cannot continue"},
        {NULL, noprefix, false, false, "nothing released: nothing to continue"},
        {NULL, noroute, false, false, "a route that cannot continue (messages, responses)"},
        {NULL, noprompt, false, false, "a completions prompt that is not a string"},
        {NULL, first, false, false, "the first attempt neither continues nor restarts"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lg_config *cfg = with(cases[i].config);
        ex_plan p = ex_plan_attempt(cfg, &cases[i].in);
        if (p.cont != cases[i].cont || p.restart != cases[i].restart)
            fail_msg("case %zu (%s): cont %d restart %d", i, cases[i].why, p.cont, p.restart);
        config_free(cfg);
    }
}

/* pass_through: the last attempt runs unguarded; otherwise every attempt is guarded when the
 * exchange is. */
static void test_guarded(void **state)
{
    (void)state;
    lg_config *cfg = with("{\"retry\":{\"on_exhausted\":\"pass_through\"}}");
    for (unsigned k = 1; k <= 3; k++) {
        ex_plan_in in = retry(k, true);
        assert_int_equal(ex_plan_attempt(cfg, &in).guarded, k < 3);
        in.guard_on = false;
        assert_false(ex_plan_attempt(cfg, &in).guarded);
    }
    config_free(cfg);
    cfg = with(NULL);
    ex_plan_in last = retry(3, true);
    assert_true(ex_plan_attempt(cfg, &last).guarded);
    config_free(cfg);
}

static void test_elsewhere(void **state)
{
    (void)state;
    lg_config *cfg = with(NULL);
    assert_false(ex_plan_elsewhere(cfg, 1));
    assert_true(ex_plan_elsewhere(cfg, 2));
    config_free(cfg);
    cfg = with("{\"retry\":{\"elsewhere\":\"never\"}}");
    assert_false(ex_plan_elsewhere(cfg, 2));
    config_free(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ladder),
        cmocka_unit_test(test_continue_or_restart),
        cmocka_unit_test(test_guarded),
        cmocka_unit_test(test_elsewhere),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
