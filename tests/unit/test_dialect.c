/* test_dialect.c — every upstream dialect (shapes as SGLang and vLLM write them, see
 * tests/fake/README.md) read into the same view; errors, usage, [DONE], garbage;
 * missing/null/"" equivalence; built chunks parsed back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "proxy/dialect.h"

#define HEAD                                                                                       \
    "{\"id\":\"0123456789abcdef0123456789abcdef\",\"object\":\"chat.completion.chunk\","           \
    "\"created\":1764042665,\"model\":\"/root/models/Qwen3.6-27B\","

static dl_delta parse(const char *s)
{
    dl_delta d;
    assert_int_equal(dl_parse(s, strlen(s), &d), 0);
    return d;
}

static void assert_text(const char *got, size_t len, const char *want)
{
    if (!want) {
        assert_null(got);
        assert_int_equal(len, 0);
        return;
    }
    assert_non_null(got);
    assert_int_equal(len, strlen(want));
    assert_memory_equal(got, want, len);
}

static void test_sglang_recent(void **state)
{
    (void)state;
    dl_delta d = parse(HEAD "\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null,"
                            "\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
                            "\"finish_reason\":null,\"matched_stop\":null}]}");
    assert_int_equal(d.kind, DL_CHUNK);
    assert_true(d.chat);
    assert_string_equal(d.role, "assistant");
    assert_string_equal(d.id, "0123456789abcdef0123456789abcdef");
    assert_string_equal(d.model, "/root/models/Qwen3.6-27B");
    assert_true(d.has_created);
    assert_int_equal(d.created, 1764042665);
    assert_int_equal(d.n_choices, 1);
    assert_text(d.content, d.content_len, NULL);
    assert_text(d.reasoning, d.reasoning_len, NULL);
    assert_null(d.finish_reason);
    assert_null(d.usage);
    dl_delta_clear(&d);
    dl_delta_clear(&d); /* twice is fine */

    d = parse(HEAD "\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"You \"},"
                   "\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}]}");
    assert_text(d.reasoning, d.reasoning_len, "You ");
    assert_int_equal(d.reasoning_keys, DL_KEY_REASONING_CONTENT);
    assert_null(d.role);
    dl_delta_clear(&d);

    d = parse(HEAD "\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null,"
                   "\"content\":\"def \"},\"logprobs\":null,\"finish_reason\":null,"
                   "\"matched_stop\":null}]}");
    assert_text(d.content, d.content_len, "def ");
    assert_text(d.reasoning, d.reasoning_len, NULL);
    assert_int_equal(d.reasoning_keys, 0);
    dl_delta_clear(&d);

    d = parse(HEAD "\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null},"
                   "\"logprobs\":null,\"finish_reason\":\"stop\",\"matched_stop\":151645}]}");
    assert_string_equal(d.finish_reason, "stop");
    assert_text(d.content, d.content_len, NULL);
    dl_delta_clear(&d);

    d = parse(HEAD "\"choices\":[],\"usage\":{\"prompt_tokens\":30,\"total_tokens\":290,"
                   "\"completion_tokens\":260,\"prompt_tokens_details\":null,"
                   "\"reasoning_tokens\":260}}");
    assert_int_equal(d.kind, DL_CHUNK);
    assert_int_equal(d.n_choices, 0);
    assert_null(d.choice);
    assert_non_null(d.usage);
    assert_int_equal(cJSON_GetObjectItem(d.usage, "completion_tokens")->valueint, 260);
    dl_delta_clear(&d);
}

static void test_sglang_pydantic_and_old(void **state)
{
    (void)state;
    dl_delta d = parse(HEAD "\"choices\":[{\"index\":0,\"delta\":{\"role\":null,\"content\":\"x\","
                            "\"reasoning_content\":null,\"tool_calls\":null},\"logprobs\":null,"
                            "\"finish_reason\":null,\"matched_stop\":null}],\"usage\":null}");
    assert_int_equal(d.kind, DL_CHUNK);
    assert_null(d.role);
    assert_text(d.content, d.content_len, "x");
    assert_null(d.usage);
    assert_int_equal(d.n_tools, 0);
    dl_delta_clear(&d);

    /* <= 0.4: "" instead of null on the first chunk, finish on the last content chunk */
    d = parse(HEAD "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null,"
                   "\"reasoning_content\":null,\"tool_calls\":null},\"logprobs\":null,"
                   "\"finish_reason\":\"\",\"matched_stop\":null}],\"usage\":null}");
    assert_null(d.finish_reason);
    dl_delta_clear(&d);
    d = parse(HEAD "\"choices\":[{\"index\":0,\"delta\":{\"role\":null,\"content\":\"end.\","
                   "\"reasoning_content\":null,\"tool_calls\":null},\"logprobs\":null,"
                   "\"finish_reason\":\"stop\",\"matched_stop\":151645}],\"usage\":null}");
    assert_string_equal(d.finish_reason, "stop");
    assert_text(d.content, d.content_len, "end.");
    dl_delta_clear(&d);
}

static void test_vllm(void **state)
{
    (void)state;
    dl_delta d =
        parse("{\"id\":\"chatcmpl-0123\",\"object\":\"chat.completion.chunk\",\"created\":1,"
              "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"hmm\"},"
              "\"logprobs\":null,\"finish_reason\":null}]}");
    assert_text(d.reasoning, d.reasoning_len, "hmm");
    assert_int_equal(d.reasoning_keys, DL_KEY_REASONING);
    dl_delta_clear(&d);

    d = parse("{\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"a\",\"reasoning\":"
              "\"a\"}}]}");
    assert_text(d.reasoning, d.reasoning_len, "a"); /* counted once */
    assert_int_equal(d.reasoning_keys, DL_KEY_REASONING | DL_KEY_REASONING_CONTENT);
    assert_null(d.own_text);
    dl_delta_clear(&d);

    d = parse("{\"choices\":[{\"delta\":{\"reasoning_content\":\"a\",\"reasoning\":\"b\"}}]}");
    assert_text(d.reasoning, d.reasoning_len, "ab");
    dl_delta_clear(&d);

    /* one delta with reasoning and content (merge boundary) */
    d = parse(
        "{\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"done.\",\"content\":\"Hi\"}}]}");
    assert_text(d.reasoning, d.reasoning_len, "done.");
    assert_text(d.content, d.content_len, "Hi");
    dl_delta_clear(&d);

    d = parse(
        "{\"id\":\"chatcmpl-0123\",\"object\":\"chat.completion.chunk\",\"created\":1,"
        "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"!\"},\"logprobs\":null,"
        "\"finish_reason\":\"stop\",\"stop_reason\":\"END\"}]}");
    assert_string_equal(d.finish_reason, "stop");
    assert_text(d.content, d.content_len, "!");
    assert_string_equal(cJSON_GetObjectItem(d.choice, "stop_reason")->valuestring, "END");
    dl_delta_clear(&d);

    d = parse("{\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\","
              "\"choices\":[{\"index\":2,\"delta\":{\"content\":\"c\"}}]}");
    assert_int_equal(d.choice_index, 2);
    dl_delta_clear(&d);
}

static void test_errors(void **state)
{
    (void)state;
    dl_delta d = parse("{\"error\": {\"object\": \"error\", \"message\": \"boom\", \"type\": "
                       "\"InternalServerError\", \"param\": null, \"code\": 500}}");
    assert_int_equal(d.kind, DL_ERROR);
    assert_string_equal(d.error_message, "boom");
    assert_string_equal(d.error_type, "InternalServerError");
    assert_int_equal(d.error_code, 500);
    dl_delta_clear(&d);

    d = parse("{\"object\":\"error\",\"message\":\"bad\",\"type\":\"BadRequestError\","
              "\"param\":null,\"code\":400}");
    assert_int_equal(d.kind, DL_ERROR);
    assert_string_equal(d.error_message, "bad");
    assert_int_equal(d.error_code, 400);
    dl_delta_clear(&d);

    d = parse("{\"error\":{\"message\":\"m\",\"code\":\"503\"}}");
    assert_int_equal(d.error_code, 503);
    assert_null(d.error_type);
    dl_delta_clear(&d);

    d = parse("{\"error\":{\"code\":\"rate_limit\"}}");
    assert_int_equal(d.kind, DL_ERROR);
    assert_string_equal(d.error_message, "");
    assert_int_equal(d.error_code, 0);
    dl_delta_clear(&d);

    d = parse("{\"error\":\"plain\"}");
    assert_int_equal(d.kind, DL_ERROR);
    assert_string_equal(d.error_message, "plain");
    dl_delta_clear(&d);
}

static void test_done_and_other(void **state)
{
    (void)state;
    const char *done[] = {"[DONE]", " [DONE]\r\n"};
    for (size_t i = 0; i < 2; i++) {
        dl_delta d = parse(done[i]);
        assert_int_equal(d.kind, DL_DONE);
        assert_null(d.root);
        dl_delta_clear(&d);
    }
    const char *other[] = {"",        "not json", "[1,2]",           "{\"foo\":1}", "{\"choices\":",
                           "\"str\"", "[DONE] x", "{\"choices\":{}}"};
    for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++) {
        dl_delta d = parse(other[i]);
        assert_int_equal(d.kind, DL_OTHER);
        assert_null(d.root);
        dl_delta_clear(&d);
    }
    /* not NUL-terminated input is fine */
    dl_delta d;
    assert_int_equal(dl_parse("[DONE]xyz", 6, &d), 0);
    assert_int_equal(d.kind, DL_DONE);
}

static void test_completions_and_tools(void **state)
{
    (void)state;
    dl_delta d = parse("{\"id\":\"c\",\"object\":\"text_completion\",\"created\":5,\"model\":\"m\","
                       "\"choices\":[{\"index\":0,\"text\":\"Once\",\"logprobs\":null,"
                       "\"finish_reason\":null,\"matched_stop\":null}]}");
    assert_int_equal(d.kind, DL_CHUNK);
    assert_false(d.chat);
    assert_text(d.content, d.content_len, "Once");
    dl_delta_clear(&d);

    d = parse("{\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}]}");
    assert_false(d.chat);
    assert_text(d.content, d.content_len, NULL);
    assert_string_equal(d.finish_reason, "length");
    dl_delta_clear(&d);

    d = parse(HEAD "\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null,\"tool_calls\":"
                   "[{\"index\":1,\"id\":\"call_ab\",\"type\":\"function\",\"function\":{\"name\":"
                   "\"get\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}");
    assert_int_equal(d.n_tools, 1);
    assert_int_equal(d.tools[0].index, 1);
    assert_string_equal(d.tools[0].id, "call_ab");
    assert_string_equal(d.tools[0].name, "get");
    assert_null(d.tools[0].args);
    dl_delta_clear(&d);

    d = parse("{\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":\"{\\\"a\"}},"
              "{\"function\":{\"arguments\":\"1\"}}]}}]}");
    assert_int_equal(d.n_tools, 2);
    assert_int_equal(d.tools[0].index, 0); /* position when index is absent */
    assert_int_equal(d.tools[1].index, 1);
    assert_text(d.tools[0].args, d.tools[0].args_len, "{\"a");
    assert_null(d.tools[0].id);
    dl_delta_clear(&d);
}

/* Missing, null and "" read the same for every text and finish field. */
static void test_missing_null_empty(void **state)
{
    (void)state;
    const char *variants[] = {
        "{\"choices\":[{\"index\":0,\"delta\":{}}]}",
        "{\"choices\":[{\"index\":0,\"delta\":{\"role\":null,\"content\":null,"
        "\"reasoning_content\":null,\"reasoning\":null,\"tool_calls\":null},"
        "\"finish_reason\":null}],\"usage\":null}",
        "{\"choices\":[{\"index\":0,\"delta\":{\"role\":\"\",\"content\":\"\","
        "\"reasoning_content\":\"\",\"reasoning\":\"\",\"tool_calls\":[]},"
        "\"finish_reason\":\"\"}]}",
    };
    for (size_t i = 0; i < 3; i++) {
        dl_delta d = parse(variants[i]);
        assert_int_equal(d.kind, DL_CHUNK);
        assert_null(d.role);
        assert_null(d.content);
        assert_null(d.reasoning);
        assert_int_equal(d.reasoning_keys, 0);
        assert_int_equal(d.n_tools, 0);
        assert_null(d.finish_reason);
        assert_null(d.usage);
        dl_delta_clear(&d);
    }
}

static void test_build_chunk(void **state)
{
    (void)state;
    dl_delta t = parse(HEAD "\"system_fingerprint\":\"fp\",\"choices\":[{\"index\":0,\"delta\":{"
                            "\"reasoning_content\":\"old\",\"content\":\"old\",\"tool_calls\":[{"
                            "\"index\":0,\"function\":{\"arguments\":\"{}\"}}]},\"logprobs\":null,"
                            "\"finish_reason\":\"stop\",\"matched_stop\":151645}]}");
    for (int mode = 0; mode < 4; mode++) {
        char *s = dl_build_chunk(&t, "R", 1, "C", 1, mode, false, NULL);
        dl_delta d = parse(s);
        assert_int_equal(d.kind, DL_CHUNK);
        assert_string_equal(d.id, t.id);
        assert_string_equal(d.model, t.model);
        assert_int_equal(d.created, t.created);
        assert_string_equal(cJSON_GetObjectItem(d.root, "system_fingerprint")->valuestring, "fp");
        assert_text(d.content, d.content_len, "C");
        assert_text(d.reasoning, d.reasoning_len, mode < 2 ? "R" : NULL);
        assert_int_equal(d.reasoning_keys, mode == 0   ? DL_KEY_REASONING_CONTENT
                                           : mode == 1 ? DL_KEY_REASONING
                                                       : 0);
        assert_int_equal(d.n_tools, 0);
        assert_null(d.finish_reason);
        assert_true(cJSON_IsNull(cJSON_GetObjectItem(d.choice, "matched_stop")));
        assert_true(cJSON_IsNull(cJSON_GetObjectItem(d.choice, "finish_reason")));
        dl_delta_clear(&d);
        free(s);
    }
    char *s = dl_build_chunk(&t, NULL, 0, NULL, 0, 0, true, "content_filter");
    dl_delta d = parse(s);
    assert_string_equal(d.finish_reason, "content_filter");
    assert_int_equal(d.n_tools, 1);
    assert_null(d.content);
    assert_null(d.reasoning);
    assert_null(cJSON_GetObjectItem(cJSON_GetObjectItem(d.choice, "delta"), "content"));
    dl_delta_clear(&d);
    free(s);
    dl_delta_clear(&t);

    /* a template without finish_reason key gets none; "" content is kept as "" */
    t = parse("{\"id\":\"i\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}");
    s = dl_build_chunk(&t, NULL, 0, "", 0, 0, true, NULL);
    assert_string_equal(s,
                        "{\"id\":\"i\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"}}]}");
    free(s);
    dl_delta_clear(&t);

    /* usage-only template: a choice is created */
    t = parse(
        "{\"id\":\"u\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"a\":1}}");
    s = dl_build_chunk(&t, NULL, 0, "tail", 4, 0, true, NULL);
    d = parse(s);
    assert_int_equal(d.n_choices, 1);
    assert_text(d.content, d.content_len, "tail");
    assert_non_null(d.usage);
    dl_delta_clear(&d);
    free(s);
    dl_delta_clear(&t);

    /* completions keep "text" */
    t = parse("{\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"a\","
              "\"finish_reason\":null,\"stop_reason\":null}]}");
    s = dl_build_chunk(&t, "ignored", 7, NULL, 0, 0, true, "length");
    d = parse(s);
    assert_false(d.chat);
    assert_string_equal(cJSON_GetObjectItem(d.choice, "text")->valuestring, "");
    assert_string_equal(d.finish_reason, "length");
    assert_null(d.reasoning);
    dl_delta_clear(&d);
    free(s);
    dl_delta_clear(&t);

    /* repeated keys (cJSON keeps every copy): the rebuilt chunk carries one text only */
    t = parse("{\"choices\":[{\"delta\":0,\"delta\":{\"content\":\"stale\"}}]}");
    s = dl_build_chunk(&t, NULL, 0, "new", 3, 0, true, NULL);
    assert_null(strstr(s, "stale"));
    free(s);
    dl_delta_clear(&t);

    dl_delta none = {0};
    assert_null(dl_build_chunk(&none, NULL, 0, "x", 1, 0, true, NULL));
}

static void test_build_synthetic_and_error(void **state)
{
    (void)state;
    char *s = dl_build_synthetic(true, "id1", "m", 42, "think", 5, "say", 3, 0, NULL);
    dl_delta d = parse(s);
    assert_int_equal(d.kind, DL_CHUNK);
    assert_true(d.chat);
    assert_string_equal(d.id, "id1");
    assert_string_equal(d.model, "m");
    assert_int_equal(d.created, 42);
    assert_text(d.reasoning, d.reasoning_len, "think");
    assert_text(d.content, d.content_len, "say");
    assert_null(d.finish_reason);
    assert_string_equal(cJSON_GetObjectItem(d.root, "object")->valuestring,
                        "chat.completion.chunk");
    dl_delta_clear(&d);
    free(s);

    s = dl_build_synthetic(false, NULL, NULL, 7, NULL, 0, "t", 1, 0, "stop");
    d = parse(s);
    assert_false(d.chat);
    assert_null(d.id);
    assert_text(d.content, d.content_len, "t");
    assert_string_equal(d.finish_reason, "stop");
    dl_delta_clear(&d);
    free(s);

    s = dl_error_json("loop \"detected\"", "loopguard_error", NULL, 500);
    d = parse(s);
    assert_int_equal(d.kind, DL_ERROR);
    assert_string_equal(d.error_message, "loop \"detected\"");
    assert_string_equal(d.error_type, "loopguard_error");
    assert_int_equal(d.error_code, 500);
    dl_delta_clear(&d);
    free(s);

    s = dl_error_json("m", NULL, "upstream_timeout", 504);
    assert_string_equal(s, "{\"error\":{\"message\":\"m\",\"type\":\"server_error\",\"param\":null,"
                           "\"code\":\"upstream_timeout\"}}");
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sglang_recent),
        cmocka_unit_test(test_sglang_pydantic_and_old),
        cmocka_unit_test(test_vllm),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_done_and_other),
        cmocka_unit_test(test_completions_and_tools),
        cmocka_unit_test(test_missing_null_empty),
        cmocka_unit_test(test_build_chunk),
        cmocka_unit_test(test_build_synthetic_and_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
