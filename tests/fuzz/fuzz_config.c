/* fuzz_config.c — libFuzzer target for the configuration loader.
 *
 * Input: the text of a config file plus an environment. The JSON is the input up to its
 * first NUL byte (a NUL-terminated copy, as config_load_file hands over a file's text);
 * every line of the whole input (a line ends at a newline or a NUL) that starts with
 * LOOPGUARD_ is also an environment variable, so `{"upstream": "http://h:1"}\0LOOPGUARD_WORKERS=2`
 * drives both. Each input runs main()'s order: defaults, then the file, then the
 * environment, then validation, stopping at the first failure.
 *
 * Properties (abort on violation):
 *  - a failing step leaves a NUL-terminated, non-empty message that names the JSON problem
 *    ("invalid JSON at line L, column C", "expected a JSON object at the top level") or a
 *    key ("retry.max_atempts: unknown key"); an environment failure names the variable;
 *  - loading is repeatable and the environment's order does not matter: a second run over
 *    fresh defaults with the variables reversed fails at the same step with the same text;
 *  - with a small error buffer a failing run fails at the same step and the message is
 *    the full one truncated (the contract says "truncated to errlen", never an overrun);
 *  - a config that validates has guard settings for every channel, with or without a
 *    matching model rule.
 * Leaks and memory errors are left to ASan/UBSan (libFuzzer checks leaks per input). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"

#define ERR_BIG   512 /* what main() uses: room for any key path */
#define ERR_SMALL 24  /* forces truncation of nearly every message */
#define MAX_VARS  32  /* more variables find nothing new and slow every input */

typedef enum { STEP_NONE, STEP_FILE, STEP_ENV, STEP_VALIDATE } step;

/* Where a run stopped and what it said (err is meaningful only when failed != STEP_NONE). */
typedef struct outcome {
    step failed;
    char err[ERR_BIG];
} outcome;

/* True when msg reads "<key>: <problem>" (the key may be empty only if the input's was),
 * or fills the whole buffer: a key path of ~500 bytes leaves no room for the problem, and
 * the contract allows truncation. */
static bool names_key(const char *msg)
{
    const char *sep = strstr(msg, ": ");
    return (sep && sep[2] != '\0') || strlen(msg) == ERR_BIG - 1;
}

/* Checks the message a failed step left in o->err (errlen bytes were offered). */
static void check_message(const outcome *o, size_t errlen)
{
    if (!memchr(o->err, '\0', errlen) || o->err[0] == '\0') abort();
    if (errlen < ERR_BIG) return; /* a truncated message may have lost its key */
    switch (o->failed) {
    case STEP_FILE:
        if (strncmp(o->err, "invalid JSON at line ", 21) != 0 &&
            strcmp(o->err, "expected a JSON object at the top level") != 0 && !names_key(o->err))
            abort();
        break;
    case STEP_ENV:
        if (strncmp(o->err, "LOOPGUARD_", 10) != 0 || !names_key(o->err)) abort();
        break;
    case STEP_VALIDATE:
        if (!names_key(o->err)) abort();
        break;
    case STEP_NONE:
        abort();
    }
}

/* Every channel has settings whichever model is asked for (rule or global ones). */
static void check_queries(const lg_config *cfg)
{
    static const char *const models[] = {"", "gpt-4o", "Qwen/Qwen3-8B", NULL};
    for (size_t i = 0; i < cfg->n_upstreams; i++)
        if (!cfg->upstreams[i] || !cfg->upstreams[i][0]) abort();
    for (const char *const *m = models; *m; m++) {
        const lg_model_rule *rule = config_model_rule(cfg, *m);
        for (int ch = 0; ch < LG_CH_COUNT; ch++)
            if (!config_guard_params(cfg, rule, (lg_channel)ch)) abort();
    }
}

/* Runs defaults < file < environment, then validation, into *o; errors get errlen bytes. */
static void run(const char *json, char *const *envp, size_t errlen, outcome *o)
{
    lg_config *cfg = config_new_defaults();
    memset(o->err, 'X', sizeof o->err); /* a step that fails without a message shows */
    o->failed = STEP_NONE;
    if (config_load_string(cfg, json, o->err, errlen) < 0)
        o->failed = STEP_FILE;
    else if (config_apply_env(cfg, envp, o->err, errlen) < 0)
        o->failed = STEP_ENV;
    else if (config_validate(cfg, o->err, errlen) < 0)
        o->failed = STEP_VALIDATE;
    else
        check_queries(cfg);
    if (o->failed != STEP_NONE) check_message(o, errlen);
    config_free(cfg);
}

/* Collects the LOOPGUARD_ lines of the input into vars (malloc'd copies; a line ends at a
 * newline or a NUL), after one unrelated variable the loader must ignore. Returns the
 * count; vars[count] is NULL. */
static size_t env_from_input(const uint8_t *data, size_t size, char **vars)
{
    size_t n = 0;
    vars[n++] = strdup("HOME=/root");
    for (size_t at = 0; at < size && n < MAX_VARS;) {
        size_t len = 0;
        while (at + len < size && data[at + len] != '\n' && data[at + len] != '\0')
            len++;
        if (len >= 10 && !memcmp(data + at, "LOOPGUARD_", 10))
            vars[n++] = strndup((const char *)data + at, len);
        at += len + 1;
    }
    for (size_t i = 0; i < n; i++)
        if (!vars[i]) abort();
    vars[n] = NULL;
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *json = malloc(size + 1);
    char *vars[MAX_VARS + 1], *reversed[MAX_VARS + 1];
    if (!json) abort();
    memcpy(json, data, size);
    json[size] = '\0';
    size_t n = env_from_input(data, size, vars);
    for (size_t i = 0; i < n; i++)
        reversed[i] = vars[n - 1 - i];
    reversed[n] = NULL;

    static outcome first, again, small;
    run(json, vars, ERR_BIG, &first);
    run(json, reversed, ERR_BIG, &again);
    if (again.failed != first.failed) abort();
    if (first.failed != STEP_NONE && strcmp(first.err, again.err) != 0) abort();

    /* Only a failure writes a message; a run that succeeds costs ~2 ms under ASan (the
     * defaults compile the guard's regexes), so it is not repeated a third time. */
    if (first.failed != STEP_NONE) {
        run(json, vars, ERR_SMALL, &small);
        if (small.failed != first.failed) abort();
        size_t want = strnlen(first.err, ERR_SMALL - 1);
        if (strlen(small.err) != want || memcmp(small.err, first.err, want) != 0) abort();
    }

    for (size_t i = 0; i < n; i++)
        free(vars[i]);
    free(json);
    return 0;
}
