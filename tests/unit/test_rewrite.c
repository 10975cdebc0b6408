/* test_rewrite.c — request validation (each error names its field) and the upstream body
 * for each option: forced stream + usage, rid for SGLang only, sampling steps, seeds,
 * continuation per upstream kind, reasoning history, max_tokens, unknown fields kept. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/rewrite.h"

static void expect_error(const char *body, bool chat, const char *param)
{
    rw_request r;
    rw_error e = {0};
    assert_int_equal(rw_parse(body, strlen(body), chat, &r, &e), -1);
    assert_int_equal(e.status, 400);
    assert_non_null(e.message);
    if (param)
        assert_string_equal(e.param, param);
    else
        assert_null(e.param);
    assert_null(r.root);
}

static void test_validation_errors(void **state)
{
    (void)state;
    expect_error("", true, NULL);
    expect_error("{\"messages\":[", true, NULL);
    expect_error("[1]", true, NULL);
    expect_error("{}", true, "messages");
    expect_error("{\"messages\":null}", true, "messages");
    expect_error("{\"messages\":{}}", true, "messages");
    expect_error("{\"messages\":[\"hi\"]}", true, "messages");
    expect_error("{\"messages\":[],\"stream\":\"yes\"}", true, "stream");
    expect_error("{\"messages\":[],\"stream\":1}", true, "stream");
    expect_error("{\"messages\":[],\"stream_options\":true}", true, "stream_options");
    expect_error("{\"messages\":[],\"n\":0}", true, "n");
    expect_error("{\"messages\":[],\"n\":1.5}", true, "n");
    expect_error("{\"messages\":[],\"temperature\":\"hot\"}", true, "temperature");
    expect_error("{\"messages\":[]}", false, "prompt");
    expect_error("{\"prompt\":null}", false, "prompt");
}

static rw_request parse_ok(const char *body, bool chat)
{
    rw_request r;
    rw_error e = {0};
    assert_int_equal(rw_parse(body, strlen(body), chat, &r, &e), 0);
    assert_non_null(r.root);
    return r;
}

/* The body must be UTF-8 (RFC 3629), wherever a sequence falls against the eight-byte ASCII
 * steps: each bad one is refused and each good one taken, 0 to 16 ASCII bytes in. */
static void test_utf8(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "\xff", "\xc3(", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82", "\x80"};
    static const char *const good[] = {"\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
                                       "\xf4\x8f\xbf\xbf"};
    char body[128];
    for (int k = 0; k <= 16; k++) {
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
            snprintf(body, sizeof body, "{\"prompt\":\"%.*s%s and then some ASCII\"}", k,
                     "abcdefghijklmnopq", bad[i]);
            rw_request r;
            rw_error e = {0};
            assert_int_equal(rw_parse(body, strlen(body), false, &r, &e), -1);
            assert_string_equal(e.message, "The request body is not valid UTF-8.");
        }
        for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
            snprintf(body, sizeof body, "{\"prompt\":\"%.*s%s and then some ASCII\"}", k,
                     "abcdefghijklmnopq", good[i]);
            rw_request r = parse_ok(body, false);
            rw_request_clear(&r);
        }
    }
}

static void test_parse_fields(void **state)
{
    (void)state;
    rw_request r =
        parse_ok("{\"model\":\"q\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                 "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"n\":2,"
                 "\"temperature\":0.6,\"chat_template_kwargs\":{\"enable_thinking\":false}}",
                 true);
    assert_true(r.chat);
    assert_true(r.client_stream);
    assert_true(r.client_usage);
    assert_string_equal(r.model, "q");
    assert_int_equal(r.n, 2);
    assert_true(r.has_temperature);
    assert_true(r.temperature > 0.59 && r.temperature < 0.61);
    assert_int_equal(r.enable_thinking, 0);
    rw_request_clear(&r);
    rw_request_clear(&r);

    /* include_usage without stream means nothing; stream null is false */
    r = parse_ok("{\"messages\":[],\"stream\":null,\"stream_options\":{\"include_usage\":true}}",
                 true);
    assert_false(r.client_stream);
    assert_false(r.client_usage);
    assert_int_equal(r.n, 1);
    assert_false(r.has_temperature);
    assert_null(r.model);
    assert_int_equal(r.enable_thinking, -1);
    rw_request_clear(&r);

    r = parse_ok("{\"prompt\":\"Once\"}", false);
    assert_false(r.chat);
    assert_true(r.prompt_is_string);
    rw_request_clear(&r);
    r = parse_ok("{\"prompt\":[\"a\",\"b\"]}", false);
    assert_false(r.prompt_is_string);
    rw_request_clear(&r);
}

/* Builds and parses the upstream body. */
static cJSON *build(const rw_request *r, const rw_opts *o)
{
    rw_error e = {0};
    char *s = rw_build_upstream(r, o, &e);
    assert_non_null(s);
    cJSON *j = cJSON_Parse(s);
    assert_non_null(j);
    free(s);
    return j;
}

static const cJSON *at(const cJSON *j, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(j, key);
}

static void test_stream_usage_rid_unknown(void **state)
{
    (void)state;
    rw_request r = parse_ok("{\"model\":\"q\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                            "\"stream_options\":{\"continuous_usage_stats\":false},\"top_k\":20,"
                            "\"weird\":{\"nested\":[1,2]}}",
                            true);
    rw_opts o = {.upstream_kind = LG_UPSTREAM_SGLANG, .rid = "0123456789abcdef0123456789abcdef"};
    cJSON *j = build(&r, &o);
    assert_true(cJSON_IsTrue(at(j, "stream")));
    assert_true(cJSON_IsTrue(at(at(j, "stream_options"), "include_usage")));
    assert_true(cJSON_IsFalse(at(at(j, "stream_options"), "continuous_usage_stats")));
    assert_string_equal(at(j, "rid")->valuestring, o.rid);
    assert_int_equal(at(j, "top_k")->valueint, 20);
    assert_true(cJSON_Compare(at(j, "weird"), at(r.root, "weird"), 1));
    assert_null(at(j, "temperature")); /* no step: the client's sampling */
    assert_null(at(j, "seed"));
    cJSON_Delete(j);

    int kinds[] = {LG_UPSTREAM_VLLM, LG_UPSTREAM_OPENAI};
    for (int k = 0; k < 2; k++) {
        o.upstream_kind = kinds[k];
        j = build(&r, &o);
        assert_null(at(j, "rid"));
        assert_true(cJSON_IsTrue(at(at(j, "stream_options"), "include_usage")));
        cJSON_Delete(j);
    }
    /* the parsed request itself is untouched */
    assert_null(at(r.root, "stream"));
    assert_null(at(at(r.root, "stream_options"), "include_usage"));
    rw_request_clear(&r);
}

static void test_sampling_steps(void **state)
{
    (void)state;
    rw_request r =
        parse_ok("{\"messages\":[],\"temperature\":0.6,\"top_p\":0.95,\"top_k\":20}", true);
    lg_sampling_step st = {.temperature_add = 0.2,
                           .has_presence_penalty = true,
                           .presence_penalty = 1.5,
                           .has_repetition_penalty = true,
                           .repetition_penalty = 1.1,
                           .new_seed = true};
    rw_opts o = {.upstream_kind = LG_UPSTREAM_SGLANG, .step = &st, .seed = 4000000000u};
    rw_error e;
    char *s = rw_build_upstream(&r, &o, &e);
    assert_non_null(strstr(s, "\"temperature\":0.8,")); /* rounded, not 0.7999999... */
    free(s);
    cJSON *j = build(&r, &o);
    assert_true(at(j, "presence_penalty")->valuedouble == 1.5);
    assert_true(at(j, "repetition_penalty")->valuedouble == 1.1);
    assert_true(at(j, "seed")->valuedouble == 4000000000.0);
    assert_null(at(j, "frequency_penalty"));
    assert_true(at(j, "top_p")->valuedouble == 0.95);
    cJSON_Delete(j);

    o.upstream_kind = LG_UPSTREAM_OPENAI; /* never repetition_penalty */
    j = build(&r, &o);
    assert_null(at(j, "repetition_penalty"));
    assert_non_null(at(j, "presence_penalty"));
    cJSON_Delete(j);

    cJSON *rec = rw_sampling_json(&r, &o);
    assert_true(at(rec, "temperature")->valuedouble == 0.8);
    assert_true(at(rec, "top_p")->valuedouble == 0.95);
    assert_int_equal(at(rec, "top_k")->valueint, 20);
    assert_true(at(rec, "presence_penalty")->valuedouble == 1.5);
    assert_null(at(rec, "repetition_penalty"));
    assert_null(at(rec, "frequency_penalty"));
    assert_non_null(at(rec, "seed"));
    cJSON_Delete(rec);
    o.step = NULL;
    rec = rw_sampling_json(&r, &o);
    assert_int_equal(cJSON_GetArraySize(rec), 3);
    cJSON_Delete(rec);
    rw_request_clear(&r);

    /* base 1.0 when the client set no temperature; clamped at 2 */
    r = parse_ok("{\"messages\":[]}", true);
    lg_sampling_step st2 = {
        .temperature_add = 0.4, .has_frequency_penalty = true, .frequency_penalty = 0.5};
    o.step = &st2;
    j = build(&r, &o);
    assert_true(at(j, "temperature")->valuedouble == 1.4);
    assert_true(at(j, "frequency_penalty")->valuedouble == 0.5);
    assert_null(at(j, "seed"));
    cJSON_Delete(j);
    rw_request_clear(&r);
    r = parse_ok("{\"messages\":[],\"temperature\":1.9}", true);
    j = build(&r, &o);
    assert_true(at(j, "temperature")->valuedouble == 2.0);
    cJSON_Delete(j);
    rw_request_clear(&r);
}

static const cJSON *last_message(const cJSON *j)
{
    const cJSON *m = at(j, "messages");
    return cJSON_GetArrayItem(m, cJSON_GetArraySize(m) - 1);
}

static void test_continuation(void **state)
{
    (void)state;
    rw_request r = parse_ok("{\"messages\":[{\"role\":\"user\",\"content\":\"prime?\"}]}", true);
    const char *prefix = "Let me think</think>\n\ndef is_prime";
    rw_opts o = {.upstream_kind = LG_UPSTREAM_SGLANG,
                 .continue_text = prefix,
                 .continue_len = strlen(prefix),
                 .max_tokens = 100};
    cJSON *j = build(&r, &o);
    assert_int_equal(cJSON_GetArraySize(at(j, "messages")), 2);
    assert_string_equal(at(last_message(j), "role")->valuestring, "assistant");
    assert_string_equal(at(last_message(j), "content")->valuestring, prefix);
    assert_true(cJSON_IsTrue(at(j, "continue_final_message")));
    assert_null(at(j, "add_generation_prompt"));
    assert_int_equal(at(j, "max_tokens")->valueint, 100);
    cJSON_Delete(j);

    o.upstream_kind = LG_UPSTREAM_VLLM;
    o.continue_len = 12; /* only part of the text */
    j = build(&r, &o);
    assert_string_equal(at(last_message(j), "content")->valuestring, "Let me think");
    assert_true(cJSON_IsFalse(at(j, "add_generation_prompt")));
    cJSON_Delete(j);

    o.upstream_kind = LG_UPSTREAM_OPENAI;
    rw_error e = {0};
    assert_null(rw_build_upstream(&r, &o, &e));
    assert_non_null(e.message);
    assert_int_not_equal(e.status, 400);
    rw_request_clear(&r);

    /* the client is itself continuing an assistant message: the prefix extends it */
    r = parse_ok("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
                 "\"content\":\"Sure: \"}],\"continue_final_message\":true,"
                 "\"max_completion_tokens\":50}",
                 true);
    o.upstream_kind = LG_UPSTREAM_VLLM;
    o.continue_text = "one two";
    o.continue_len = 7;
    j = build(&r, &o);
    assert_int_equal(cJSON_GetArraySize(at(j, "messages")), 2);
    assert_string_equal(at(last_message(j), "content")->valuestring, "Sure: one two");
    assert_int_equal(at(j, "max_completion_tokens")->valueint, 100);
    assert_null(at(j, "max_tokens"));
    cJSON_Delete(j);
    rw_request_clear(&r);

    /* completions: appended to a string prompt; impossible for a list prompt */
    r = parse_ok("{\"prompt\":\"Once upon\",\"max_tokens\":9}", false);
    o.continue_text = " a time";
    o.continue_len = 7;
    o.max_tokens = 0;
    j = build(&r, &o);
    assert_string_equal(at(j, "prompt")->valuestring, "Once upon a time");
    assert_int_equal(at(j, "max_tokens")->valueint, 9);
    assert_null(at(j, "continue_final_message"));
    cJSON_Delete(j);
    rw_request_clear(&r);
    r = parse_ok("{\"prompt\":[\"a\"]}", false);
    assert_null(rw_build_upstream(&r, &o, &e));
    rw_request_clear(&r);
}

static void test_history(void **state)
{
    (void)state;
    rw_request r = parse_ok(
        "{\"messages\":[{\"role\":\"user\",\"content\":\"a\",\"reasoning_content\":\"not mine\"},"
        "{\"role\":\"assistant\",\"content\":\"b\",\"reasoning_content\":\"r1\"},"
        "{\"role\":\"assistant\",\"content\":\"c\",\"reasoning\":\"r2\"},"
        "{\"role\":\"assistant\",\"content\":\"d\",\"reasoning_content\":\"\",\"reasoning\":\"r3\"}"
        ","
        "{\"role\":\"user\",\"content\":\"e\"}]}",
        true);
    struct {
        int kind, history;
        const char *key;   /* where the reasoning must be */
        const char *other; /* where it must not be */
    } cases[] = {
        {LG_UPSTREAM_VLLM, LG_HISTORY_REWRITE, "reasoning", "reasoning_content"},
        {LG_UPSTREAM_SGLANG, LG_HISTORY_REWRITE, "reasoning_content", "reasoning"},
    };
    const char *want[] = {"r1", "r2", "r3"};
    for (size_t k = 0; k < 2; k++) {
        rw_opts o = {.upstream_kind = cases[k].kind, .history = cases[k].history};
        cJSON *j = build(&r, &o);
        const cJSON *msgs = at(j, "messages");
        for (int i = 1; i <= 3; i++) {
            const cJSON *m = cJSON_GetArrayItem(msgs, i);
            assert_string_equal(at(m, cases[k].key)->valuestring, want[i - 1]);
            assert_null(at(m, cases[k].other));
        }
        /* a user message's fields are not touched */
        assert_string_equal(at(cJSON_GetArrayItem(msgs, 0), "reasoning_content")->valuestring,
                            "not mine");
        cJSON_Delete(j);
    }
    rw_opts o = {.upstream_kind = LG_UPSTREAM_SGLANG, .history = LG_HISTORY_DROP};
    cJSON *j = build(&r, &o);
    for (int i = 1; i <= 3; i++) {
        const cJSON *m = cJSON_GetArrayItem(at(j, "messages"), i);
        assert_null(at(m, "reasoning_content"));
        assert_null(at(m, "reasoning"));
        assert_non_null(at(m, "content"));
    }
    cJSON_Delete(j);
    rw_request_clear(&r);
    /* a repeated key leaves no stale copy behind */
    r = parse_ok("{\"messages\":[{\"role\":\"assistant\",\"content\":\"x\",\"reasoning\":\"a\","
                 "\"reasoning\":\"b\"}]}",
                 true);
    j = build(&r, &(rw_opts){.upstream_kind = LG_UPSTREAM_SGLANG});
    assert_int_equal(cJSON_GetArraySize(cJSON_GetArrayItem(at(j, "messages"), 0)), 3);
    assert_string_equal(
        at(cJSON_GetArrayItem(at(j, "messages"), 0), "reasoning_content")->valuestring, "a");
    cJSON_Delete(j);
    rw_request_clear(&r);
    r = parse_ok("{\"messages\":[{\"role\":\"assistant\",\"content\":\"x\",\"reasoning_content\":"
                 "\"y\"}]}",
                 true);
    int keeps[][2] = {{LG_UPSTREAM_SGLANG, LG_HISTORY_KEEP},
                      {LG_UPSTREAM_OPENAI, LG_HISTORY_REWRITE}};
    for (int k = 0; k < 2; k++) {
        rw_opts ko = {.upstream_kind = keeps[k][0], .history = keeps[k][1]};
        j = build(&r, &ko);
        assert_true(cJSON_Compare(at(j, "messages"), at(r.root, "messages"), 1));
        cJSON_Delete(j);
    }
    rw_request_clear(&r);
}

/* Attempts are built on overlays of the request, never on the request itself: after a
 * retry body that rewrites the history, continues the last message and sets sampling, the
 * parsed request prints as before, and the same options give the same body again. */
static void test_request_pristine(void **state)
{
    (void)state;
    rw_request r =
        parse_ok("{\"model\":\"q\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"},"
                 "{\"role\":\"assistant\",\"reasoning_content\":\"r\",\"content\":\"y\"},"
                 "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"z\"}]}],"
                 "\"stream_options\":{\"continuous_usage_stats\":true},\"temperature\":0.5}",
                 true);
    char *before = cJSON_PrintUnformatted(r.root);
    lg_sampling_step st = {
        .temperature_add = 0.3, .has_presence_penalty = true, .presence_penalty = 1.0};
    rw_opts o = {.upstream_kind = LG_UPSTREAM_VLLM,
                 .history = LG_HISTORY_REWRITE,
                 .step = &st,
                 .continue_text = "so far",
                 .continue_len = 6};
    rw_error e = {0};
    char *first = rw_build_upstream(&r, &o, &e);
    char *again = rw_build_upstream(&r, &o, &e);
    assert_non_null(first);
    assert_string_equal(first, again);
    char *after = cJSON_PrintUnformatted(r.root);
    assert_string_equal(before, after);
    cJSON *j = cJSON_Parse(first);
    const cJSON *msgs = at(j, "messages");
    assert_int_equal(cJSON_GetArraySize(msgs), 4);
    assert_string_equal(at(cJSON_GetArrayItem(msgs, 1), "reasoning")->valuestring, "r");
    assert_null(at(cJSON_GetArrayItem(msgs, 1), "reasoning_content"));
    assert_string_equal(at(cJSON_GetArrayItem(msgs, 3), "content")->valuestring, "so far");
    assert_true(cJSON_IsTrue(at(at(j, "stream_options"), "include_usage")));
    assert_true(at(j, "temperature")->valuedouble == 0.8);
    cJSON_Delete(j);
    free(first);
    free(again);
    free(after);
    free(before);
    rw_request_clear(&r);
}

/* The first attempt's body spliced from the client's (rw_opts.raw) against the tree's print
 * of the same request: the same JSON value, members in the same order; `marker` (client
 * whitespace that only a splice keeps) tells that the splice was taken, NULL that the
 * request needed the tree (then the bytes are the print's). */
static void splice_matches_tree(const char *body, bool chat, rw_opts o, const char *marker)
{
    rw_request r = parse_ok(body, chat);
    rw_error e = {0};
    char *tree = rw_build_upstream(&r, &o, &e);
    o.raw = body;
    o.raw_len = strlen(body);
    char *spliced = rw_build_upstream(&r, &o, &e);
    assert_non_null(tree);
    assert_non_null(spliced);
    cJSON *a = cJSON_Parse(tree), *b = cJSON_Parse(spliced);
    assert_non_null(b);
    assert_true(cJSON_Compare(a, b, true));
    for (const cJSON *x = a->child, *y = b->child; x || y; x = x->next, y = y->next) {
        assert_true(x && y);
        assert_string_equal(x->string, y->string);
    }
    if (marker)
        assert_non_null(strstr(spliced, marker));
    else
        assert_string_equal(spliced, tree);
    cJSON_Delete(a);
    cJSON_Delete(b);
    free(tree);
    free(spliced);
    rw_request_clear(&r);
}

static void test_splice(void **state)
{
    (void)state;
    const char *rid = "0123456789abcdef0123456789abcdef";
    rw_opts sg = {.upstream_kind = LG_UPSTREAM_SGLANG, .rid = rid};
    rw_opts vl = {.upstream_kind = LG_UPSTREAM_VLLM};
    /* whitespace, escapes, the members the attempt sets in the middle, a client rid */
    const char *pretty =
        "\n{ \"model\" : \"m\",\n  \"stream\": false, \"rid\": \"mine\",\n"
        "  \"messages\": [ {\"role\": \"user\", \"content\": \"caf\\u00e9\\n\\\"q\\\"\"} ],\n"
        "  \"temperature\": 0.7, \"top_k\": 20, \"seed\": -5, \"stop\": [\"a\", null],\n"
        "  \"logit_bias\": {\"50256\": -100}, \"x\": [true, false, 1.5e-3] }\n";
    splice_matches_tree(pretty, true, sg, "[ {");
    splice_matches_tree(pretty, true, vl, "[ {"); /* the client's rid stays where it was */
    /* a long string (past 16 bytes: read eight at a time) with escapes at several offsets */
    splice_matches_tree("{\"messages\":[ {\"role\":\"user\",\"content\":\"a long prompt past "
                        "sixteen bytes \\\"quoted\\\" and \\\\ a backslash, \\\"}],\\\" then "
                        "more text past eight-byte words\\n\"} ],\"model\":\"m\"}",
                        true, sg, "[ {");
    /* stream_options: absent, null or only include_usage: spliced; other members: the tree */
    splice_matches_tree("{\"messages\":[ ],\"stream_options\":{\"include_usage\":false}}", true, sg,
                        "[ ]");
    splice_matches_tree("{\"messages\":[ ],\"stream_options\":null}", true, sg, "[ ]");
    splice_matches_tree("{\"messages\":[],\"stream_options\":{\"include_usage\":false,"
                        "\"continuous_usage_stats\":true}}",
                        true, sg, NULL);
    /* numbers cJSON would print as another value or type: the tree */
    splice_matches_tree("{\"messages\":[],\"max_tokens\":100.0}", true, sg, NULL);
    splice_matches_tree("{\"messages\":[],\"max_tokens\":1e2}", true, sg, NULL);
    splice_matches_tree("{\"messages\":[],\"seed\":12345678901}", true, sg, NULL);
    splice_matches_tree("{\"messages\":[{\"role\":\"user\",\"content\":[1,2.0]}]}", true, sg, NULL);
    splice_matches_tree("{\"messages\":[ ],\"seed\":123456789,\"temperature\":-0.25}", true, sg,
                        "[ ]");
    /* an escaped key is compared unescaped: the tree */
    splice_matches_tree("{\"messages\":[],\"str\\u0065am\":true}", true, sg, NULL);
    /* a history to rewrite, a retry step, a continuation: the tree */
    const char *hist = "{\"messages\":[ {\"role\":\"assistant\",\"content\":\"b\","
                       "\"reasoning_content\":\"r\"} ]}";
    splice_matches_tree(hist, true, sg, NULL);
    rw_opts keep = sg;
    keep.history = LG_HISTORY_KEEP;
    splice_matches_tree(hist, true, keep, "[ {");
    lg_sampling_step step = {.temperature_add = 0.2};
    rw_opts stepped = sg;
    stepped.step = &step;
    splice_matches_tree(pretty, true, stepped, NULL);
    rw_opts odd = sg; /* a rid that would need escaping */
    odd.rid = "q\"x";
    splice_matches_tree(pretty, true, odd, NULL);
    /* the escape test reads eight bytes at a time, then the tail: a byte to escape in a
     * word and in the tail, and bytes that are not (at and past 0x80, space, 0x7f) */
    static const char *const to_escape[] = {"0123456789ab\\def", "01234567\x1f", "0123456\"",
                                            "\x01"};
    for (size_t i = 0; i < sizeof to_escape / sizeof *to_escape; i++) {
        odd.rid = to_escape[i];
        splice_matches_tree(pretty, true, odd, NULL);
    }
    odd.rid = "caf\xc3\xa9 \x7f\xff!#0123456789";
    splice_matches_tree(pretty, true, odd, "[ {");
    /* text completions: the prompt stays in place */
    splice_matches_tree("{ \"prompt\": \"Once\", \"max_tokens\": 8, \"stream\": true }", false, sg,
                        "\"prompt\":\"Once\"");
    splice_matches_tree("{\"prompt\":[ 1, 2, 3 ],\"rid\":\"x\"}", false, vl, "[ 1, 2, 3 ]");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_validation_errors),
        cmocka_unit_test(test_parse_fields),
        cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_stream_usage_rid_unknown),
        cmocka_unit_test(test_sampling_steps),
        cmocka_unit_test(test_continuation),
        cmocka_unit_test(test_history),
        cmocka_unit_test(test_request_pristine),
        cmocka_unit_test(test_splice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
