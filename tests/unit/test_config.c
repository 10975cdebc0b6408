/* test_config.c — unit tests for config/config.c: built-in defaults, the precedence of
 * file < LOOPGUARD_* environment < flags, strict validation with errors that name the full
 * key path, per-model rules, and that config/loopguard.example.json (run from the repo
 * root) is a complete config at the defaults. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "config/config.h"
#include "guard/guard_int.h" /* to compare guard settings with the guard's defaults */

#define EXAMPLE "config/loopguard.example.json"

/* Writes text to a fresh temporary file; returns its malloc'd path. */
static char *write_temp(const char *text)
{
    char *path = strdup("/tmp/lg_test_config_XXXXXX");
    assert_non_null(path);
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    size_t len = strlen(text);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    assert_int_equal(close(fd), 0);
    return path;
}

/* The guard settings object that reproduces `p` (every key), for the message that tells
 * how to update the example. */
static cJSON *guard_settings_json(const guard_params *p)
{
    cJSON *o = cJSON_CreateObject(), *r = cJSON_CreateObject(), *steps = cJSON_CreateArray(),
          *cls = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "enabled", p->enabled);
    cJSON_AddBoolToObject(r, "enabled", p->repeat.enabled);
    cJSON_AddNumberToObject(r, "min_bytes", p->repeat.min_bytes);
    cJSON_AddNumberToObject(r, "max_period", p->repeat.max_period);
    for (size_t i = 0; i < p->repeat.n_steps; i++) {
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateNumber(p->repeat.steps[i].max_period));
        cJSON_AddItemToArray(pair, cJSON_CreateNumber(p->repeat.steps[i].repeats));
        cJSON_AddItemToArray(steps, pair);
    }
    cJSON_AddItemToObject(r, "repeats_by_period", steps);
    cJSON_AddNumberToObject(r, "fence_factor", p->repeat.fence_factor);
    for (int c = 1; c < GR_COUNT; c++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "min_bytes", p->repeat.cls[c].min_bytes);
        cJSON_AddNumberToObject(x, "min_repeats", p->repeat.cls[c].min_repeats);
        cJSON_AddNumberToObject(x, "max_period", p->repeat.cls[c].max_period);
        cJSON_AddItemToObject(cls, guard_rclass_name((guard_rclass)c), x);
    }
    cJSON_AddItemToObject(r, "classes", cls);
    cJSON_AddItemToObject(o, "repeat", r);
    cJSON *l = cJSON_AddObjectToObject(o, "lines");
    cJSON_AddBoolToObject(l, "enabled", p->lines.enabled);
    cJSON_AddNumberToObject(l, "min_repeats", p->lines.min_repeats);
    cJSON_AddNumberToObject(l, "window", p->lines.window);
    cJSON_AddNumberToObject(l, "min_segment_bytes", p->lines.min_segment_bytes);
    cJSON_AddNumberToObject(l, "min_repeat_ratio", p->lines.min_repeat_ratio);
    cJSON_AddNumberToObject(l, "min_run", p->lines.min_run);
    cJSON_AddNumberToObject(l, "template_run", p->lines.template_run);
    cJSON_AddNumberToObject(l, "template_bytes", p->lines.template_bytes);
    cJSON_AddNumberToObject(l, "template_share", p->lines.template_share);
    cJSON_AddNumberToObject(l, "count_run", p->lines.count_run);
    cJSON_AddNumberToObject(l, "block_copies", p->lines.block_copies);
    cJSON_AddNumberToObject(l, "block_lines", p->lines.block_lines);
    cJSON_AddNumberToObject(l, "art_run", p->lines.art_run);
    cJSON *n = cJSON_AddObjectToObject(o, "novelty");
    cJSON_AddBoolToObject(n, "enabled", p->novelty.enabled);
    cJSON_AddNumberToObject(n, "window", p->novelty.window);
    cJSON_AddNumberToObject(n, "min_ratio", p->novelty.min_ratio);
    cJSON_AddNumberToObject(n, "memory_words", p->novelty.memory_words);
    cJSON_AddNumberToObject(n, "min_seen", p->novelty.min_seen);
    cJSON_AddBoolToObject(n, "mask_numbers", p->novelty.mask_numbers);
    cJSON_AddNumberToObject(n, "max_new_words", p->novelty.max_new_words);
    cJSON *cy = cJSON_AddObjectToObject(o, "cycle");
    cJSON_AddBoolToObject(cy, "enabled", p->cycle.enabled);
    cJSON_AddNumberToObject(cy, "window", p->cycle.window);
    cJSON_AddNumberToObject(cy, "copies", p->cycle.copies);
    cJSON_AddNumberToObject(cy, "min_segments", p->cycle.min_segments);
    cJSON_AddNumberToObject(cy, "min_bytes", p->cycle.min_bytes);
    cJSON_AddArrayToObject(o, "rules");
    cJSON_AddNumberToObject(o, "rule_max_match_bytes", p->rule_max_match_bytes);
    cJSON *lk = cJSON_AddArrayToObject(o, "leak_tokens");
    for (size_t i = 0; i < p->n_leaks; i++)
        cJSON_AddItemToArray(lk, cJSON_CreateString(p->leaks[i]));
    cJSON_AddNumberToObject(o, "budget_bytes", (double)p->budget_bytes);
    cJSON_AddNumberToObject(o, "empty_answer_min_reasoning_bytes",
                            (double)p->empty_answer_min_reasoning);
    cJSON_AddNumberToObject(o, "holdback_max_bytes", (double)p->holdback_max);
    return o;
}

/* Every value config.h documents as the built-in default. */
static void assert_defaults(const lg_config *c)
{
    assert_string_equal(c->listen_host, "127.0.0.1");
    assert_int_equal(c->listen_port, 8000);
    assert_int_equal(c->n_upstreams, 1);
    assert_string_equal(c->upstreams[0], "http://127.0.0.1:30000");
    assert_int_equal(c->upstream_kind, LG_UPSTREAM_AUTO);
    assert_int_equal(c->workers, 0);
    assert_int_equal(c->worker_scheduling, LG_SCHED_BATCH);
    assert_int_equal(c->max_connections, 16384);
    assert_int_equal(c->rlimit_nofile, 65536);
    assert_int_equal(c->max_body_bytes, 32u << 20);
    assert_int_equal(c->max_header_bytes, 16u << 10);
    assert_int_equal(c->client_timeout_s, 60);
    assert_int_equal(c->shutdown_grace_ms, 10000);
    assert_int_equal(c->timeouts.connect_ms, 5000);
    assert_int_equal(c->timeouts.first_byte_ms, 120000);
    assert_int_equal(c->timeouts.idle_ms, 60000);
    assert_int_equal(c->reasoning.output, LG_REASONING_CONTENT);
    assert_true(c->reasoning.allow_client_choice);
    assert_int_equal(c->reasoning.history, LG_HISTORY_REWRITE);
    assert_true(c->guard.enabled);
    assert_false(c->guard.allow_client_off);
    for (int ch = 0; ch < LG_CH_COUNT; ch++)
        assert_non_null(c->guard.channel[ch]);
    assert_int_equal(c->guard.holdback_max_bytes, 16384);
    assert_int_equal(c->guard.keepalive_ms, 5000);
    assert_int_equal(c->n_models, 0);
    assert_int_equal(c->retry.max_attempts, 3);
    assert_int_equal(c->retry.mode, LG_RETRY_AUTO);
    assert_int_equal(c->retry.on_exhausted, LG_EXHAUSTED_CONTENT_FILTER);
    assert_int_equal(c->retry.elsewhere, LG_ELSEWHERE_AUTO);
    assert_int_equal(c->retry.n_ladder, 2);
    const lg_sampling_step *s = c->retry.ladder;
    assert_true(s[0].temperature_add == 0.2);
    assert_true(s[0].has_presence_penalty && s[0].presence_penalty == 1.0);
    assert_false(s[0].has_frequency_penalty);
    assert_false(s[0].has_repetition_penalty);
    assert_true(s[0].new_seed);
    assert_true(s[1].temperature_add == 0.4);
    assert_true(s[1].has_presence_penalty && s[1].presence_penalty == 1.5);
    assert_true(s[1].has_repetition_penalty && s[1].repetition_penalty == 1.1);
    assert_false(s[1].has_frequency_penalty);
    assert_true(s[1].new_seed);
    assert_null(c->incidents.path);
    assert_int_equal(c->incidents.capture, LG_CAPTURE_EXCERPT);
    assert_int_equal(c->incidents.max_record_bytes, 65536);
    assert_int_equal(c->incidents.recent, 100);
    assert_null(c->admin.listen);
    assert_null(c->admin.token);
    assert_int_equal(c->n_api_keys, 0);
    assert_string_equal(c->health.path, "/health");
    assert_int_equal(c->health.interval_ms, 5000);
    assert_int_equal(c->health.unhealthy_after, 2);
    assert_int_equal(c->health.healthy_after, 2);
    assert_true(c->eject.trip_ratio == 3.0);
    assert_true(c->eject.min_trip_rate == 0.5);
    assert_int_equal(c->eject.min_requests, 10);
    assert_int_equal(c->eject.window_s, 60);
    assert_int_equal(c->eject.backoff_ms, 30000);
}

static void test_defaults(void **state)
{
    (void)state;
    char err[256];
    lg_config *c = config_new_defaults();
    assert_defaults(c);
    assert_int_equal(config_validate(c, err, sizeof err), 0);
    config_free(c);
    config_free(NULL);
}

/* The example file sets every key to its default: loading it changes nothing, the guard's
 * channel settings included (compared byte for byte with guard_params_new). */
static void test_example_file_is_complete_and_default(void **state)
{
    (void)state;
    char err[256] = "";
    lg_config *c = config_new_defaults();
    int rc = config_load_file(c, EXAMPLE, err, sizeof err);
    if (rc) fail_msg("%s", err);
    assert_defaults(c);
    for (int ch = 0; ch < LG_CH_COUNT; ch++) {
        guard_params *d = guard_params_new((lg_channel)ch);
        assert_int_equal(c->guard.channel[ch]->n_rules, 0);
        if (memcmp(d, c->guard.channel[ch], sizeof *d) != 0) {
            cJSON *want = guard_settings_json(d);
            char *text = cJSON_PrintUnformatted(want);
            print_error("%s: guard.%s differs from the guard's defaults (guard_params_new); "
                        "the defaults are: %s\n",
                        EXAMPLE, guard_channel_name((lg_channel)ch), text);
            free(text);
            cJSON_Delete(want);
            fail();
        }
        guard_params_free(d);
    }
    assert_int_equal(config_validate(c, err, sizeof err), 0);
    config_free(c);
}

static void test_run_config_loads(void **state)
{
    (void)state;
    char err[256] = "";
    lg_config *c = config_new_defaults();
    if (config_load_file(c, "config/loopguard.json", err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(config_validate(c, err, sizeof err), 0);
    assert_int_equal(c->listen_port, 8000);
    assert_string_equal(c->upstreams[0], "http://127.0.0.1:30000");
    config_free(c);
}

static void test_file_overrides(void **state)
{
    (void)state;
    char err[256] = "";
    char *path = write_temp("{\"listen\": \"0.0.0.0:9000\",\n"
                            " \"upstream\": [\"http://a:1/\", \"https://b:2/base//\"],\n"
                            " \"upstream_kind\": \"sglang\", \"workers\": 4,\n"
                            " \"worker_scheduling\": \"normal\",\n"
                            " \"max_body_bytes\": 1048576,\n"
                            " \"timeouts\": {\"idle_ms\": 1500},\n"
                            " \"reasoning\": {\"output\": \"inline\", \"history\": \"drop\"},\n"
                            " \"guard\": {\"enabled\": false, \"allow_client_off\": true},\n"
                            " \"retry\": {\"max_attempts\": 5, \"mode\": \"continue\",\n"
                            "   \"on_exhausted\": \"pass_through\", \"elsewhere\": \"never\",\n"
                            "   \"ladder\": [{\"frequency_penalty\": -0.5}]},\n"
                            " \"incidents\": {\"path\": \"/tmp/x.jsonl\", \"capture\": \"none\"},\n"
                            " \"admin\": {\"listen\": \"[::1]:9001\", \"token\": \"s3cret\"},\n"
                            " \"api_keys\": [\"k1\", \"k2\"],\n"
                            " \"eject\": {\"trip_ratio\": 5, \"min_trip_rate\": 0.25}}\n");
    lg_config *c = config_new_defaults();
    if (config_load_file(c, path, err, sizeof err)) fail_msg("%s", err);
    assert_string_equal(c->listen_host, "0.0.0.0");
    assert_int_equal(c->listen_port, 9000);
    assert_int_equal(c->n_upstreams, 2);
    assert_string_equal(c->upstreams[0], "http://a:1");
    assert_string_equal(c->upstreams[1], "https://b:2/base");
    assert_int_equal(c->upstream_kind, LG_UPSTREAM_SGLANG);
    assert_int_equal(c->workers, 4);
    assert_int_equal(c->worker_scheduling, LG_SCHED_NORMAL);
    assert_int_equal(c->max_body_bytes, 1048576);
    assert_int_equal(c->timeouts.idle_ms, 1500);
    assert_int_equal(c->timeouts.connect_ms, 5000); /* untouched sibling keeps its default */
    assert_int_equal(c->reasoning.output, LG_REASONING_INLINE);
    assert_int_equal(c->reasoning.history, LG_HISTORY_DROP);
    assert_true(c->reasoning.allow_client_choice);
    assert_false(c->guard.enabled);
    assert_true(c->guard.allow_client_off);
    assert_int_equal(c->retry.max_attempts, 5);
    assert_int_equal(c->retry.mode, LG_RETRY_CONTINUE);
    assert_int_equal(c->retry.on_exhausted, LG_EXHAUSTED_PASS_THROUGH);
    assert_int_equal(c->retry.elsewhere, LG_ELSEWHERE_NEVER);
    assert_int_equal(c->retry.n_ladder, 1); /* arrays replace, not merge */
    assert_true(c->retry.ladder[0].temperature_add == 0.0);
    assert_true(c->retry.ladder[0].has_frequency_penalty);
    assert_true(c->retry.ladder[0].frequency_penalty == -0.5);
    assert_false(c->retry.ladder[0].has_presence_penalty);
    assert_false(c->retry.ladder[0].new_seed);
    assert_string_equal(c->incidents.path, "/tmp/x.jsonl");
    assert_int_equal(c->incidents.capture, LG_CAPTURE_NONE);
    assert_string_equal(c->admin.listen, "[::1]:9001");
    assert_string_equal(c->admin.token, "s3cret");
    assert_int_equal(c->n_api_keys, 2);
    assert_string_equal(c->api_keys[1], "k2");
    assert_true(c->eject.trip_ratio == 5.0);
    assert_true(c->eject.min_trip_rate == 0.25);
    assert_int_equal(config_validate(c, err, sizeof err), 0);

    /* A second source merges over the first; null clears a nullable string. */
    assert_int_equal(config_load_string(c,
                                        "{\"incidents\": {\"path\": null}, \"upstream\": "
                                        "\"http://c:3\", \"api_keys\": []}",
                                        err, sizeof err),
                     0);
    assert_null(c->incidents.path);
    assert_int_equal(c->incidents.capture, LG_CAPTURE_NONE);
    assert_int_equal(c->n_upstreams, 1);
    assert_string_equal(c->upstreams[0], "http://c:3");
    assert_int_equal(c->n_api_keys, 0);
    config_free(c);
    unlink(path);
    free(path);
}

static void test_precedence_env_and_flags(void **state)
{
    (void)state;
    char err[256] = "";
    lg_config *c = config_new_defaults();
    assert_int_equal(config_load_string(c,
                                        "{\"listen\": \"127.0.0.1:7000\", \"retry\": "
                                        "{\"max_attempts\": 2}, \"upstream_kind\": \"vllm\"}",
                                        err, sizeof err),
                     0);
    char *env[] = {
        "PATH=/usr/bin",
        "LOOPGUARD_RETRY__MAX_ATTEMPTS=4",
        "LOOPGUARD_LISTEN=127.0.0.1:7001",
        "LOOPGUARD_UPSTREAM=http://h1:1,http://h2:2/",
        "LOOPGUARD_ADMIN__TOKEN=12345", /* a string key keeps digits as text */
        "LOOPGUARD_GUARD__ENABLED=false",
        "LOOPGUARD_API_KEYS=a,b,c",
        "LOOPGUARD_REASONING__OUTPUT=hide", /* not JSON: taken as a string */
        NULL,
    };
    if (config_apply_env(c, env, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(c->retry.max_attempts, 4);
    assert_int_equal(c->listen_port, 7001);
    assert_int_equal(c->n_upstreams, 2);
    assert_string_equal(c->upstreams[1], "http://h2:2");
    assert_string_equal(c->admin.token, "12345");
    assert_false(c->guard.enabled);
    assert_int_equal(c->n_api_keys, 3);
    assert_string_equal(c->api_keys[2], "c");
    assert_int_equal(c->reasoning.output, LG_REASONING_HIDE);
    assert_int_equal(c->upstream_kind, LG_UPSTREAM_VLLM); /* from the file, env silent */

    assert_int_equal(config_set_listen(c, "localhost:7002", err, sizeof err), 0);
    assert_int_equal(config_set_upstream(c, "http://flag:9/", err, sizeof err), 0);
    assert_int_equal(config_set_upstream_kind(c, "openai", err, sizeof err), 0);
    assert_string_equal(c->listen_host, "localhost");
    assert_int_equal(c->listen_port, 7002);
    assert_int_equal(c->n_upstreams, 1);
    assert_string_equal(c->upstreams[0], "http://flag:9");
    assert_int_equal(c->upstream_kind, LG_UPSTREAM_OPENAI);

    assert_int_equal(config_set_listen(c, "nohost", err, sizeof err), -1);
    assert_non_null(strstr(err, "--listen"));
    assert_int_equal(config_set_upstream(c, "ftp://x", err, sizeof err), -1);
    assert_non_null(strstr(err, "--upstream"));
    assert_int_equal(config_set_upstream_kind(c, "tgi", err, sizeof err), -1);
    assert_non_null(strstr(err, "--upstream-kind"));
    assert_int_equal(c->upstream_kind, LG_UPSTREAM_OPENAI); /* failed setters change nothing */
    config_free(c);
}

static void test_env_errors_name_variable_and_key(void **state)
{
    (void)state;
    static const struct {
        const char *var, *want;
    } cases[] = {
        {"LOOPGUARD_RETRY__MAX_ATEMPTS=4",
         "LOOPGUARD_RETRY__MAX_ATEMPTS: retry.max_atempts: unknown key"},
        {"LOOPGUARD_TIMEOUTS__IDLE_MS=soon",
         "LOOPGUARD_TIMEOUTS__IDLE_MS: timeouts.idle_ms: expected a non-negative integer"},
        {"LOOPGUARD_RETRY__MAX_ATTEMPTS=0", "retry.max_attempts: must be between 1 and 10"},
        {"LOOPGUARD_UPSTREAM=http://ok:1,gopher://x", "upstream[1]: expected an http://"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[256] = "";
        char *env[] = {(char *)cases[i].var, NULL};
        lg_config *c = config_new_defaults();
        assert_int_equal(config_apply_env(c, env, err, sizeof err), -1);
        if (!strstr(err, cases[i].want)) fail_msg("%s: got \"%s\"", cases[i].var, err);
        config_free(c);
    }
}

/* Each bad config must fail with a message that contains `want` (the key path first). */
static void test_errors_name_the_key(void **state)
{
    (void)state;
    static const struct {
        const char *json, *want;
    } cases[] = {
        {"{\"retry\": {\"max_atempts\": 3}}", "retry.max_atempts: unknown key"},
        {"{\"timeouts\": {\"idle_ms\": -1}}", "timeouts.idle_ms: expected a non-negative integer"},
        {"{\"timeouts\": {\"idle_ms\": \"60s\"}}", "timeouts.idle_ms: expected a non-negative"},
        {"{\"timeouts\": {\"idle_ms\": 1.5}}", "timeouts.idle_ms: expected a non-negative integer"},
        {"{\"timeouts\": 5}", "timeouts: expected an object"},
        {"{\"timeouts.idle_ms\": 5}", "timeouts.idle_ms: unknown key"},
        {"{\"bogus\": 1}", "bogus: unknown key"},
        {"{\"listen\": 8000}", "listen: expected \"HOST:PORT\""},
        {"{\"listen\": \"localhost\"}", "listen: expected \"HOST:PORT\""},
        {"{\"listen\": \"h:70000\"}", "listen: port must be 0..65535"},
        {"{\"listen\": \"::1:80\"}", "listen: IPv6 addresses need brackets"},
        {"{\"upstream\": []}", "upstream: needs at least one URL"},
        {"{\"upstream\": [\"http://a\", 3]}", "upstream[1]: expected a URL string"},
        {"{\"upstream\": \"localhost:30000\"}", "upstream: expected an http:// or https:// URL"},
        {"{\"upstream\": \"http://u:p@h\"}", "upstream: credentials in the URL"},
        {"{\"upstream\": \"http://h/?x=1\"}", "upstream: URL must not contain"},
        {"{\"upstream_kind\": \"tgi\"}",
         "upstream_kind: expected one of auto, sglang, vllm, openai"},
        {"{\"workers\": 5000}", "workers: must be between 0 and 1024 (got 5000)"},
        {"{\"worker_scheduling\": \"fifo\"}", "worker_scheduling: expected one of batch, normal"},
        {"{\"max_connections\": 0}", "max_connections: must be between 1"},
        {"{\"reasoning\": {\"output\": \"think\"}}", "reasoning.output: expected one of"},
        {"{\"reasoning\": {\"allow_client_choice\": 1}}",
         "reasoning.allow_client_choice: expected true or false"},
        {"{\"guard\": {\"enabled\": \"yes\"}}", "guard.enabled: expected true or false"},
        {"{\"guard\": {\"content\": 3}}", "guard.content: expected an object"},
        {"{\"guard\": {\"content\": {\"no_such_setting\": 1}}}", "guard.content.no_such_setting"},
        {"{\"guard\": {\"speech\": {}}}", "guard.speech: unknown key"},
        {"{\"models\": {}}", "models: expected an array"},
        {"{\"models\": [3]}", "models[0]: expected an object"},
        {"{\"models\": [{\"guard_enabled\": true}]}", "models[0].pattern: required"},
        {"{\"models\": [{\"pattern\": \"a\"}, {\"pattern\": \"(unclosed\"}]}",
         "models[1].pattern: invalid regular expression"},
        {"{\"models\": [{\"pattern\": \"a\", \"guard_enabled\": \"no\"}]}",
         "models[0].guard_enabled: expected true or false"},
        {"{\"models\": [{\"pattern\": \"a\", \"colour\": 1}]}", "models[0].colour: unknown key"},
        {"{\"models\": [{\"pattern\": \"a\", \"guard\": {\"audio\": {}}}]}",
         "models[0].guard.audio: unknown key"},
        {"{\"models\": [{\"pattern\": \"a\", \"guard\": {\"content\": {\"zz\": 1}}}]}",
         "models[0].guard.content.zz"},
        {"{\"retry\": {\"max_attempts\": 11}}", "retry.max_attempts: must be between 1 and 10"},
        {"{\"retry\": {\"mode\": \"again\"}}",
         "retry.mode: expected one of auto, restart, continue"},
        {"{\"retry\": {\"on_exhausted\": \"panic\"}}", "retry.on_exhausted: expected one of"},
        {"{\"retry\": {\"elsewhere\": \"always\"}}",
         "retry.elsewhere: expected one of auto, never"},
        {"{\"retry\": {\"ladder\": []}}", "retry.ladder: needs at least one step"},
        {"{\"retry\": {\"ladder\": [{}, {\"presence_penalty\": 3}]}}",
         "retry.ladder[1].presence_penalty: must be between -2 and 2 (got 3)"},
        {"{\"retry\": {\"ladder\": [{\"temperature\": 1}]}}",
         "retry.ladder[0].temperature: unknown"},
        {"{\"retry\": {\"ladder\": [{\"new_seed\": 1}]}}",
         "retry.ladder[0].new_seed: expected true or false"},
        {"{\"incidents\": {\"path\": \"\"}}", "incidents.path: must not be empty"},
        {"{\"incidents\": {\"path\": 5}}", "incidents.path: expected a string or null"},
        {"{\"incidents\": {\"capture\": \"some\"}}", "incidents.capture: expected one of"},
        {"{\"incidents\": {\"max_record_bytes\": 10}}", "incidents.max_record_bytes: must be"},
        {"{\"admin\": {\"listen\": \"nope\"}}", "admin.listen: expected \"HOST:PORT\""},
        {"{\"admin\": {\"token\": \"\"}}", "admin.token: must not be empty"},
        {"{\"api_keys\": \"k\"}", "api_keys: expected an array of strings"},
        {"{\"api_keys\": [\"k\", \"\"]}", "api_keys[1]: expected a non-empty string"},
        {"{\"health\": {\"path\": \"health\"}}", "health.path: expected a path starting with '/'"},
        {"{\"health\": {\"path\": null}}", "health.path: expected a string"},
        {"{\"health\": {\"unhealthy_after\": 0}}", "health.unhealthy_after: must be between 1"},
        {"{\"eject\": {\"min_trip_rate\": 1.5}}", "eject.min_trip_rate: must be between 0 and 1"},
        {"{\"eject\": {\"trip_ratio\": \"3\"}}", "eject.trip_ratio: expected a number"},
        {"{\"retry\": {\"mode\": \"auto\", \"mode\": \"restart\"}}", "retry.mode: duplicate key"},
        {"[1, 2]", "expected a JSON object at the top level"},
        {"{\"listen\": \"a:1\",\n \"workers\": 2,,}", "invalid JSON at line 2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[256] = "";
        lg_config *c = config_new_defaults();
        int rc = config_load_string(c, cases[i].json, err, sizeof err);
        if (rc != -1) fail_msg("accepted: %s", cases[i].json);
        if (!strstr(err, cases[i].want))
            fail_msg("%s: want \"%s\", got \"%s\"", cases[i].json, cases[i].want, err);
        config_free(c); /* a failed load leaves a config that can still be freed */
    }
}

static void test_file_errors_name_the_file(void **state)
{
    (void)state;
    char err[256] = "";
    lg_config *c = config_new_defaults();
    assert_int_equal(config_load_file(c, "/nonexistent/lg.json", err, sizeof err), -1);
    assert_non_null(strstr(err, "/nonexistent/lg.json: cannot open"));
    char *path = write_temp("{\"retry\": {\"max_atempts\": 3}}");
    assert_int_equal(config_load_file(c, path, err, sizeof err), -1);
    char want[300];
    snprintf(want, sizeof want,
             "%s: retry.max_atempts: unknown key (did you mean retry.max_attempts?)", path);
    assert_string_equal(err, want);
    config_free(c);
    unlink(path);
    free(path);
}

/* One load reports every bad key, one per line, each with the closest key when there is
 * one; the environment likewise, each line naming its variable. */
static void test_every_error_at_once(void **state)
{
    (void)state;
    char err[1024] = "";
    lg_config *c = config_new_defaults();
    assert_int_equal(
        config_load_string(c,
                           "{\"upstrem\": \"http://x:1\", \"retry\": {\"max_atempts\": 3, "
                           "\"mode\": \"sideways\"}, \"timeouts\": {\"idle_ms\": \"soon\"}, "
                           "\"bogus\": 1, \"workers\": 2}",
                           err, sizeof err),
        -1);
    assert_string_equal(err, "upstrem: unknown key (did you mean upstream?)\n"
                             "bogus: unknown key\n"
                             "timeouts.idle_ms: expected a non-negative integer\n"
                             "retry.max_atempts: unknown key (did you mean retry.max_attempts?)\n"
                             "retry.mode: expected one of auto, restart, continue");
    assert_int_equal(c->workers, 2); /* the good keys around the bad ones still applied */

    char *env[] = {
        "LOOPGUARD_UPSTREM=http://a:1",
        "LOOPGUARD_GUARD__CONTENT={\"lines\": {",
        "LOOPGUARD_RETRY_MAX_ATTEMPTS=3",
        "LOOPGUARD_BIN=/somewhere/loopguard",
        "LOOPGUARD_WORKERS=3",
        NULL,
    };
    assert_int_equal(config_apply_env(c, env, err, sizeof err), -1);
    assert_string_equal(
        err, "LOOPGUARD_BIN: no such setting (every LOOPGUARD_* variable is read as a key path)\n"
             "LOOPGUARD_GUARD__CONTENT: guard.content: invalid JSON at character 12 of the value\n"
             "LOOPGUARD_RETRY_MAX_ATTEMPTS: no such setting (did you mean "
             "LOOPGUARD_RETRY__MAX_ATTEMPTS?)\n"
             "LOOPGUARD_UPSTREM: no such setting (did you mean LOOPGUARD_UPSTREAM?)");
    assert_int_equal(c->workers, 3);

    /* A small buffer gets the same text, truncated. */
    char small[40];
    char *one[] = {"LOOPGUARD_UPSTREM=x", "LOOPGUARD_BIN=y", NULL};
    assert_int_equal(config_apply_env(c, one, small, sizeof small), -1);
    assert_string_equal(small, "LOOPGUARD_BIN: no such setting (every L");
    config_free(c);
}

static void test_validate(void **state)
{
    (void)state;
    char err[256] = "";
    lg_config *c = config_new_defaults();
    assert_int_equal(
        config_load_string(c, "{\"upstream\": [\"http://a:1\", \"http://a:1/\"]}", err, sizeof err),
        0);
    assert_int_equal(config_validate(c, err, sizeof err), -1);
    assert_non_null(strstr(err, "upstream: \"http://a:1\" is listed twice"));
    assert_int_equal(config_load_string(c,
                                        "{\"upstream\": \"http://a:1\", \"listen\": \"h:5\", "
                                        "\"admin\": {\"listen\": \"h:5\"}}",
                                        err, sizeof err),
                     0);
    assert_int_equal(config_validate(c, err, sizeof err), -1);
    assert_non_null(strstr(err, "admin.listen: must differ from listen"));
    assert_int_equal(config_load_string(c, "{\"admin\": {\"listen\": \"h:6\"}}", err, sizeof err),
                     0);
    assert_int_equal(config_validate(c, err, sizeof err), 0);
    config_free(c);
}

static const char *const models_json =
    "{\"models\": [{\"pattern\": \"(?i)qwen3\\\\.6\", \"think_opened\": true,"
    "               \"guard\": {\"content\": {}}},"
    "              {\"pattern\": \"^llama\", \"guard_enabled\": false},"
    "              {\"pattern\": \"qwen\"}]}";

static void test_model_rules(void **state)
{
    (void)state;
    char err[256] = "";
    lg_config *c = config_new_defaults();
    if (config_load_string(c, models_json, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(c->n_models, 3);
    const lg_model_rule *r = config_model_rule(c, "/root/models/Qwen3.6-27B");
    assert_ptr_equal(r, &c->models[0]); /* first match wins over "qwen" */
    assert_int_equal(r->think_opened, 1);
    assert_int_equal(r->guard_enabled, -1);
    assert_ptr_not_equal(config_guard_params(c, r, LG_CH_CONTENT), c->guard.channel[LG_CH_CONTENT]);
    assert_ptr_equal(config_guard_params(c, r, LG_CH_REASONING), c->guard.channel[LG_CH_REASONING]);
    r = config_model_rule(c, "llama-3-8b");
    assert_ptr_equal(r, &c->models[1]);
    assert_int_equal(r->guard_enabled, 0);
    assert_int_equal(r->think_opened, -1);
    assert_ptr_equal(config_model_rule(c, "qwen2.5"), &c->models[2]);
    assert_null(config_model_rule(c, "my-llama")); /* ^llama is anchored */
    assert_null(config_model_rule(c, NULL));
    assert_ptr_equal(config_guard_params(c, NULL, LG_CH_TOOL_ARGS),
                     c->guard.channel[LG_CH_TOOL_ARGS]);
    /* Replacing the list frees the old rules (checked by ASan/valgrind). */
    assert_int_equal(config_load_string(c, "{\"models\": []}", err, sizeof err), 0);
    assert_int_equal(c->n_models, 0);
    assert_null(config_model_rule(c, "qwen"));
    config_free(c);
}

static void *match_many(void *arg)
{
    const lg_config *c = arg;
    for (int i = 0; i < 20000; i++) {
        const lg_model_rule *r = config_model_rule(c, i & 1 ? "Qwen3.6-27B" : "llama-x");
        if (r != &c->models[i & 1 ? 0 : 1]) return (void *)1;
    }
    return NULL;
}

/* Workers look rules up concurrently on a shared read-only config. */
static void test_model_rule_threads(void **state)
{
    (void)state;
    char err[256] = "";
    pthread_t t[4];
    lg_config *c = config_new_defaults();
    assert_int_equal(config_load_string(c, models_json, err, sizeof err), 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, match_many, c), 0);
    for (int i = 0; i < 4; i++) {
        void *res;
        assert_int_equal(pthread_join(t[i], &res), 0);
        assert_null(res);
    }
    config_free(c);
}

/* Channel settings reach the guard's own parser: from the file, from the environment
 * (nested paths), and per model on top of the global channel settings. */
static void test_guard_channel_settings(void **state)
{
    (void)state;
    char err[256] = "";
    lg_config *c = config_new_defaults();
    assert_true(guard_params_enabled(c->guard.channel[LG_CH_CONTENT]));
    if (config_load_string(c,
                           "{\"guard\": {\"content\": {\"enabled\": false}},"
                           " \"models\": [{\"pattern\": \"^a$\", \"guard\": {\"content\": {}}},"
                           "              {\"pattern\": \"^b$\", \"guard\": {\"content\": "
                           "{\"enabled\": true}}}]}",
                           err, sizeof err))
        fail_msg("%s", err);
    assert_false(guard_params_enabled(c->guard.channel[LG_CH_CONTENT]));
    assert_true(guard_params_enabled(c->guard.channel[LG_CH_REASONING]));
    const lg_model_rule *a = config_model_rule(c, "a"), *b = config_model_rule(c, "b");
    assert_false(guard_params_enabled(config_guard_params(c, a, LG_CH_CONTENT))); /* inherited */
    assert_true(guard_params_enabled(config_guard_params(c, b, LG_CH_CONTENT)));

    char *env[] = {"LOOPGUARD_GUARD__REASONING__ENABLED=false", NULL};
    if (config_apply_env(c, env, err, sizeof err)) fail_msg("%s", err);
    assert_false(guard_params_enabled(c->guard.channel[LG_CH_REASONING]));
    char *bad[] = {"LOOPGUARD_GUARD__TOOL_ARGS__NO_SUCH_SETTING=1", NULL};
    assert_int_equal(config_apply_env(c, bad, err, sizeof err), -1);
    if (!strstr(err, "guard.tool_args.no_such_setting")) fail_msg("got \"%s\"", err);
    config_free(c);
}

static void test_enum_names(void **state)
{
    (void)state;
    lg_reasoning_output o;
    assert_int_equal(config_reasoning_output_parse("reasoning", &o), 0);
    assert_int_equal(o, LG_REASONING_FIELD);
    assert_string_equal(config_reasoning_output_name(LG_REASONING_INLINE), "inline");
    assert_int_equal(config_reasoning_output_parse("Reasoning", &o), -1);
    assert_string_equal(config_upstream_kind_name(LG_UPSTREAM_VLLM), "vllm");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_example_file_is_complete_and_default),
        cmocka_unit_test(test_run_config_loads),
        cmocka_unit_test(test_file_overrides),
        cmocka_unit_test(test_precedence_env_and_flags),
        cmocka_unit_test(test_env_errors_name_variable_and_key),
        cmocka_unit_test(test_errors_name_the_key),
        cmocka_unit_test(test_file_errors_name_the_file),
        cmocka_unit_test(test_every_error_at_once),
        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_model_rules),
        cmocka_unit_test(test_model_rule_threads),
        cmocka_unit_test(test_guard_channel_settings),
        cmocka_unit_test(test_enum_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
