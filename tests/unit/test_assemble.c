/* test_assemble.c — a released stream assembled into the whole response: equal in
 * meaning (cJSON_Compare on the full object) to what the upstream returns whole, for each
 * reasoning output mode, tool calls, text completions and a finish override. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "proxy/assemble.h"

#define H "{\"id\":\"abc\",\"object\":\"chat.completion.chunk\",\"created\":100,\"model\":\"q\","

/* An SGLang (recent) stream: reasoning, content, final chunk, usage chunk, [DONE]. */
static const char *const sglang_stream[] = {
    H "\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null,\"role\":\"assistant\","
      "\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}]}",
    H "\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"Think \"},\"logprobs\":null,"
      "\"finish_reason\":null,\"matched_stop\":null}]}",
    H "\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hard.\"},\"logprobs\":null,"
      "\"finish_reason\":null,\"matched_stop\":null}]}",
    H "\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null,\"content\":\"2+2 \"},"
      "\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}]}",
    H "\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null,\"content\":\"is 4.\"},"
      "\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}]}",
    H "\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null},\"logprobs\":null,"
      "\"finish_reason\":\"stop\",\"matched_stop\":151645}]}",
    H "\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"total_tokens\":9,\"completion_tokens\":4,"
      "\"prompt_tokens_details\":null,\"reasoning_tokens\":2}}",
    "[DONE]",
};

/* Feeds a stream the way the exchange does when nothing is held back. */
static lg_assembler *assemble(const char *const *ev, size_t n, bool chat)
{
    lg_assembler *a = asm_new(chat);
    for (size_t i = 0; i < n; i++) {
        dl_delta d;
        dl_parse(ev[i], strlen(ev[i]), &d);
        asm_meta(a, &d);
        if (d.reasoning) asm_text(a, LG_CH_REASONING, d.reasoning, d.reasoning_len);
        if (d.content) asm_text(a, LG_CH_CONTENT, d.content, d.content_len);
        dl_delta_clear(&d);
    }
    return a;
}

static void assert_json_equal(const char *got, const char *want)
{
    cJSON *g = cJSON_Parse(got), *w = cJSON_Parse(want);
    assert_non_null(g);
    assert_non_null(w);
    if (!cJSON_Compare(g, w, 1)) fail_msg("got  %s\nwant %s", got, want);
    cJSON_Delete(g);
    cJSON_Delete(w);
}

#define WHOLE_HEAD "{\"id\":\"abc\",\"object\":\"chat.completion\",\"created\":100,\"model\":\"q\","
#define USAGE                                                                                      \
    "\"usage\":{\"prompt_tokens\":5,\"total_tokens\":9,\"completion_tokens\":4,"                   \
    "\"prompt_tokens_details\":null,\"reasoning_tokens\":2}}"

static void test_sglang_modes(void **state)
{
    (void)state;
    lg_assembler *a = assemble(sglang_stream, sizeof(sglang_stream) / sizeof(*sglang_stream), true);
    assert_int_equal(asm_text_len(a, LG_CH_REASONING), 11);
    assert_int_equal(asm_text_len(a, LG_CH_CONTENT), 9);
    const char *want[4] = {
        WHOLE_HEAD "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":"
                   "\"2+2 is 4.\",\"reasoning_content\":\"Think hard.\"},\"logprobs\":null,"
                   "\"finish_reason\":\"stop\",\"matched_stop\":151645}]," USAGE,
        WHOLE_HEAD "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":"
                   "\"2+2 is 4.\",\"reasoning\":\"Think hard.\"},\"logprobs\":null,"
                   "\"finish_reason\":\"stop\",\"matched_stop\":151645}]," USAGE,
        WHOLE_HEAD "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":"
                   "\"<think>Think hard.</think>\\n\\n2+2 is 4.\"},\"logprobs\":null,"
                   "\"finish_reason\":\"stop\",\"matched_stop\":151645}]," USAGE,
        WHOLE_HEAD "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":"
                   "\"2+2 is 4.\"},\"logprobs\":null,"
                   "\"finish_reason\":\"stop\",\"matched_stop\":151645}]," USAGE,
    };
    for (int mode = 0; mode < 4; mode++) {
        char *s = asm_render(a, mode);
        assert_json_equal(s, want[mode]);
        free(s);
    }
    asm_set_finish(a, "content_filter");
    char *s = asm_render(a, 3);
    cJSON *j = cJSON_Parse(s);
    cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    assert_string_equal(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "content_filter");
    cJSON_Delete(j);
    free(s);
    asm_free(a);
    asm_free(NULL);
}

/* vLLM with tool calls: content null, arguments joined by index, stop_reason kept,
 * system_fingerprint kept. */
static void test_vllm_tools(void **state)
{
    (void)state;
    static const char *const ev[] = {
        "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"m\","
        "\"system_fingerprint\":\"fp1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":"
        "\"assistant\","
        "\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}",
        "{\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"need "
        "tools\"}}]}",
        "{\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,"
        "\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"\"}}]"
        "}}]}",
        "{\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,"
        "\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{"
        "\\\"a\"}}]}}]}",
        "{\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,"
        "\"function\":{\"arguments\":\"\\\":1}\"}}]}}]}",
        "{\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,"
        "\"function\":{\"arguments\":\"{}\"}}]},\"finish_reason\":\"tool_calls\",\"stop_reason\":"
        "null}]}",
        "{\"id\":\"chatcmpl-1\",\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"total_tokens\":3,"
        "\"completion_tokens\":2}}",
    };
    lg_assembler *a = assemble(ev, sizeof(ev) / sizeof(*ev), true);
    char *s = asm_render(a, 1);
    assert_json_equal(
        s, "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":7,\"model\":\"m\","
           "\"system_fingerprint\":\"fp1\",\"choices\":[{\"index\":0,\"message\":{\"role\":"
           "\"assistant\",\"content\":null,\"reasoning\":\"need tools\",\"tool_calls\":["
           "{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
           "\"{\\\"a\\\":1}\"}},{\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":"
           "\"g\",\"arguments\":\"{}\"}}]},\"logprobs\":null,\"finish_reason\":\"tool_calls\"}],"
           "\"usage\":{\"prompt_tokens\":1,\"total_tokens\":3,\"completion_tokens\":2}}");
    free(s);
    asm_free(a);
}

/* Tool arguments released separately (guarded channel): asm_meta takes ids/names only. */
static void test_external_args(void **state)
{
    (void)state;
    lg_assembler *a = asm_new(true);
    asm_tool_args_external(a, true);
    const char *ev = "{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":"
                     "\"c\",\"function\":{\"name\":\"f\",\"arguments\":\"IGNORED\"}}]}}]}";
    dl_delta d;
    dl_parse(ev, strlen(ev), &d);
    asm_meta(a, &d);
    dl_delta_clear(&d);
    asm_tool_args(a, 0, "{\"x\"", 4);
    asm_text(a, LG_CH_TOOL_ARGS, ":2}", 3);
    asm_text(a, LG_CH_CONTENT, "ok", 2);
    char *s = asm_render(a, 0);
    assert_json_equal(s, "{\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":{"
                         "\"role\":\"assistant\",\"content\":\"ok\",\"tool_calls\":[{\"id\":\"c\","
                         "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
                         "\"{\\\"x\\\":2}\"}}]},\"logprobs\":null,\"finish_reason\":null}]}");
    free(s);
    asm_free(a);
}

static void test_completions(void **state)
{
    (void)state;
    static const char *const ev[] = {
        "{\"id\":\"cmpl-9\",\"object\":\"text_completion\",\"created\":3,\"model\":\"m\","
        "\"choices\":"
        "[{\"index\":0,\"text\":\"Once \",\"logprobs\":null,\"finish_reason\":null,\"stop_reason\":"
        "null}]}",
        "{\"id\":\"cmpl-9\",\"object\":\"text_completion\",\"created\":3,\"model\":\"m\","
        "\"choices\":"
        "[{\"index\":0,\"text\":\"upon\",\"logprobs\":null,\"finish_reason\":\"length\","
        "\"stop_reason\":null}]}",
        "{\"id\":\"cmpl-9\",\"object\":\"text_completion\",\"created\":3,\"model\":\"m\","
        "\"choices\":"
        "[],\"usage\":{\"prompt_tokens\":2,\"total_tokens\":4,\"completion_tokens\":2}}",
    };
    lg_assembler *a = assemble(ev, 3, false);
    char *s = asm_render(a, 0);
    assert_json_equal(s,
                      "{\"id\":\"cmpl-9\",\"object\":\"text_completion\",\"created\":3,\"model\":"
                      "\"m\",\"choices\":[{\"index\":0,\"text\":\"Once upon\",\"logprobs\":null,"
                      "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":2,"
                      "\"total_tokens\":4,\"completion_tokens\":2}}");
    free(s);
    asm_free(a);
}

/* Only choice 0 feeds the message; an empty response still renders content "". */
static void test_other_choice_and_empty(void **state)
{
    (void)state;
    lg_assembler *a = asm_new(true);
    const char *ev = "{\"id\":\"x\",\"choices\":[{\"index\":1,\"delta\":{},\"finish_reason\":"
                     "\"length\",\"matched_stop\":3}]}";
    dl_delta d;
    dl_parse(ev, strlen(ev), &d);
    asm_meta(a, &d);
    dl_delta_clear(&d);
    char *s = asm_render(a, 0);
    assert_json_equal(s, "{\"id\":\"x\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,"
                         "\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
                         "\"finish_reason\":null}]}");
    free(s);
    asm_free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sglang_modes),           cmocka_unit_test(test_vllm_tools),
        cmocka_unit_test(test_external_args),          cmocka_unit_test(test_completions),
        cmocka_unit_test(test_other_choice_and_empty),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
