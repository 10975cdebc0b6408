/* test_fake.c — the fake upstream's pure parts: JSON string writing, tokenisation, plans
 * and the max_tokens cap, scenario matching, and the exact bytes of each dialect's
 * chunks. The end-to-end suites trust these shapes, so they are pinned here byte for
 * byte (the SGLang first chunk is the one quoted in the field report). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "../fake/fake_buf.c"
#include "../fake/fake_dialect.c"
#include "../fake/fake_record.c"
#include "../fake/fake_scenario.c"

/* ---- helpers ---- */

static fake_scenario *parse(const char *json)
{
    char err[256];
    fake_scenario *sc = fake_scenario_parse(json, strlen(json), err, sizeof err);
    if (!sc) fail_msg("scenario did not parse: %s", err);
    return sc;
}

/* Runs the plan of response 0 and joins its tokens with '|' (channel letter first:
 * R reasoning, C content, H tool header, A tool args). */
static char *plan_string(fake_scenario *sc, fake_rmode mode, long cap, long *total, bool *cut)
{
    fake_plan pl;
    assert_int_equal(fake_plan_init(&pl, &sc->resp[0], mode, cap, false), 0);
    fbuf b = {0};
    fake_token t;
    long n = 0;
    while (fake_plan_next(&pl, &t)) {
        static const char ch[] = "RCHA";
        fbuf_put(&b, &ch[t.ch], 1);
        fbuf_put(&b, t.p, t.n);
        fbuf_put(&b, "|", 1);
        n++;
    }
    assert_int_equal(n, pl.total);
    if (total) *total = pl.total;
    if (cut) *cut = pl.cut;
    fake_plan_free(&pl);
    return b.p ? b.p : strdup("");
}

/* ---- JSON strings ---- */

static void test_json_escaping(void **state)
{
    (void)state;
    fbuf b = {0};
    fbuf_json_str(&b, "a\"b\\c\n\t\x01 é", strlen("a\"b\\c\n\t\x01 é"), false);
    assert_string_equal(b.p, "\"a\\\"b\\\\c\\n\\t\\u0001 é\"");
    fbuf_reset(&b);
    fbuf_json_str(&b, "é😀", strlen("é😀"), true);
    assert_string_equal(b.p, "\"\\u00e9\\ud83d\\ude00\"");
    fbuf_reset(&b);
    fbuf_json_str(&b,
                  "\xff"
                  "a\xe2\x82",
                  4, false);
    assert_string_equal(b.p, "\"\xEF\xBF\xBD"
                             "a\xEF\xBF\xBD\xEF\xBF\xBD\"");
    fbuf_reset(&b);
    fbuf_json_str(&b, NULL, 0, false);
    assert_string_equal(b.p, "null");
    fbuf_free(&b);
    fbuf_free(NULL);
}

/* The per-token number writers write what printf's %ld, %zx and %llu would. */
static void test_numbers_as_printf(void **state)
{
    (void)state;
    static const long longs[] = {0, 7, -7, 99, 100, -1000, 1234567890123L, LONG_MAX, LONG_MIN};
    static const size_t sizes[] = {0, 9, 10, 0xff, 0x1000, SIZE_MAX};
    /* around the 8-digit pieces, inner zeros, a stamp's fourteen digits, the widest */
    static const uint64_t u64s[] = {0, 9, 100, 99999999, 100000000, 12345678901234ULL, UINT64_MAX};
    char want[32], got[32];
    fbuf b = {0};
    for (size_t i = 0; i < sizeof longs / sizeof longs[0]; i++) {
        fbuf_reset(&b);
        fbuf_put_long(&b, longs[i]);
        snprintf(want, sizeof want, "%ld", longs[i]);
        assert_string_equal(b.p, want);
    }
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        fbuf_reset(&b);
        fbuf_put_hex(&b, sizes[i]);
        snprintf(want, sizeof want, "%zx", sizes[i]);
        assert_string_equal(b.p, want);
    }
    for (size_t i = 0; i < sizeof u64s / sizeof u64s[0]; i++) {
        size_t n = fake_dec_u64(got, u64s[i]);
        got[n] = '\0';
        snprintf(want, sizeof want, "%llu", (unsigned long long)u64s[i]);
        assert_string_equal(got, want);
    }
    fbuf_free(&b);
}

/* ---- tokenisation and plans ---- */

static void test_words_keep_whitespace_with_the_word(void **state)
{
    (void)state;
    fake_scenario *sc =
        parse("{\"responses\":[{\"reasoning\":[\"You can use the \","
              "{\"repeat\":\"lambda \",\"times\":3}],\"content\":\"\\n\\nok fine\"}]}");
    char *s = plan_string(sc, FAKE_R_SEPARATE, 0, NULL, NULL);
    assert_string_equal(s, "RYou |Rcan |Ruse |Rthe |Rlambda |Rlambda |Rlambda |C\n\n|Cok |Cfine|");
    free(s);
    fake_scenario_unref(sc);
}

static void test_chars_and_bytes_never_split_utf8(void **state)
{
    (void)state;
    fake_scenario *sc = parse("{\"responses\":[{\"content\":\"aé€\",\"tokens\":\"chars\"}]}");
    char *s = plan_string(sc, FAKE_R_SEPARATE, 0, NULL, NULL);
    assert_string_equal(s, "Ca|Cé|C€|");
    free(s);
    fake_scenario_unref(sc);
    sc = parse("{\"responses\":[{\"content\":\"abé€x\",\"tokens\":{\"bytes\":3}}]}");
    s = plan_string(sc, FAKE_R_SEPARATE, 0, NULL, NULL);
    /* "ab" + first byte of é would split é: the token runs to the end of é. */
    assert_string_equal(s, "Cabé|C€|Cx|");
    free(s);
    fake_scenario_unref(sc);
}

static void test_cap_cuts_and_counts(void **state)
{
    (void)state;
    long total;
    bool cut;
    fake_scenario *sc = parse("{\"responses\":[{\"reasoning\":[{\"repeat\":\"x \",\"times\":-1}],"
                              "\"content\":\"never\"}]}");
    char *s = plan_string(sc, FAKE_R_SEPARATE, 5, &total, &cut);
    assert_string_equal(s, "Rx |Rx |Rx |Rx |Rx |");
    assert_int_equal(total, 5);
    assert_true(cut);
    free(s);
    /* No cap in the request: the documented default of 4096. */
    s = plan_string(sc, FAKE_R_SEPARATE, 0, &total, &cut);
    assert_int_equal(total, 4096);
    free(s);
    fake_scenario_unref(sc);

    sc = parse("{\"responses\":[{\"reasoning\":\"a b\",\"content\":\"c d\"}]}");
    s = plan_string(sc, FAKE_R_SEPARATE, 3, &total, &cut);
    assert_string_equal(s, "Ra |Rb|Cc |");
    assert_true(cut);
    free(s);
    s = plan_string(sc, FAKE_R_SEPARATE, 4, &total, &cut);
    assert_false(cut);
    free(s);
    fake_scenario_unref(sc);
}

static void test_inline_tags(void **state)
{
    (void)state;
    fake_scenario *sc = parse("{\"responses\":[{\"reasoning\":\"hm \",\"content\":\"ok\"}]}");
    char *s = plan_string(sc, FAKE_R_INLINE, 0, NULL, NULL);
    assert_string_equal(s, "C<think>|Chm |C</think>|Cok|");
    free(s);
    s = plan_string(sc, FAKE_R_INLINE_NO_OPEN, 0, NULL, NULL);
    assert_string_equal(s, "Chm |C</think>|Cok|");
    free(s);
    s = plan_string(sc, FAKE_R_DROP, 0, NULL, NULL);
    assert_string_equal(s, "Cok|");
    free(s);
    fake_scenario_unref(sc);
    sc = parse("{\"responses\":[{\"reasoning\":\"hm \",\"content\":\"ok\",\"open_tag\":false,"
               "\"close_tag\":[\"</th\",\"ink>\"]}]}");
    s = plan_string(sc, FAKE_R_INLINE, 0, NULL, NULL);
    assert_string_equal(s, "Chm |C</th|Cink>|Cok|");
    free(s);
    fake_scenario_unref(sc);
}

static void test_tools_stamps_and_varied(void **state)
{
    (void)state;
    fake_scenario *sc = parse("{\"responses\":[{\"content\":\"c\",\"tool_calls\":[{\"name\":\"f\","
                              "\"arguments\":\"{\\\"a\\\": 1}\"}]}]}");
    char *s = plan_string(sc, FAKE_R_SEPARATE, 0, NULL, NULL);
    assert_string_equal(s, "Cc|Hf|A{\"a\": |A1}|");
    free(s);
    fake_scenario_unref(sc);

    sc = parse("{\"responses\":[{\"content\":[{\"stamp_tokens\":3},{\"varied\":50}]}]}");
    s = plan_string(sc, FAKE_R_SEPARATE, 0, NULL, NULL);
    /* Three stamps w<ns> with increasing clocks, then 50 words that do not repeat as a
     * block: the varied text must not look like a loop. */
    unsigned long long a, b, c;
    assert_int_equal(sscanf(s, "Cw%llu |Cw%llu |Cw%llu |", &a, &b, &c), 3);
    assert_true(a <= b && b <= c && a > 0);
    char *rest = strstr(s, "|C") + 2;
    rest = strstr(rest, "|C") + 2;
    rest = strstr(rest, "|C") + 2;
    assert_non_null(strchr(rest, '.'));
    char probe[64];
    snprintf(probe, sizeof probe, "%.20s", rest);
    assert_ptr_equal(strstr(rest, probe), rest); /* the opening 20 bytes occur once */
    assert_null(strstr(rest + 1, probe));
    free(s);
    fake_scenario_unref(sc);
}

/* ---- matching ---- */

static cJSON *body(const char *json)
{
    cJSON *j = cJSON_Parse(json);
    assert_non_null(j);
    return j;
}

static void test_match_sampling_and_continue(void **state)
{
    (void)state;
    fake_scenario *sc = parse(
        "{\"responses\":[{\"match\":{\"fields\":{\"temperature\":0.6,\"presence_penalty\":null},"
        "\"continue\":false},\"content\":\"loop\"},{\"content\":\"clean\"}]}");
    cJSON *seed =
        body("{\"temperature\":0.6,\"messages\":[{\"role\":\"user\",\"content\":\"p\"}]}");
    cJSON *hot = body("{\"temperature\":0.8,\"messages\":[]}");
    cJSON *pp = body("{\"temperature\":0.6,\"presence_penalty\":1.0,\"messages\":[]}");
    cJSON *ppnull = body("{\"temperature\":0.6,\"presence_penalty\":null,\"messages\":[]}");
    cJSON *cont = body("{\"temperature\":0.6,\"continue_final_message\":true,\"messages\":"
                       "[{\"role\":\"user\",\"content\":\"p\"},{\"role\":\"assistant\","
                       "\"content\":\"You can\"}]}");
    assert_int_equal(fake_scenario_match(sc, "/v1/chat/completions", NULL, seed), 0);
    assert_int_equal(fake_scenario_match(sc, "/v1/chat/completions", NULL, hot), 1);
    assert_int_equal(fake_scenario_match(sc, "/v1/chat/completions", NULL, pp), 1);
    assert_int_equal(fake_scenario_match(sc, "/v1/chat/completions", NULL, ppnull), 0);
    assert_int_equal(fake_scenario_match(sc, "/v1/chat/completions", NULL, cont), 1);
    assert_true(fake_is_continuation(cont));
    assert_false(fake_is_continuation(seed));
    cJSON_Delete(seed);
    cJSON_Delete(hot);
    cJSON_Delete(pp);
    cJSON_Delete(ppnull);
    cJSON_Delete(cont);
    fake_scenario_unref(sc);
}

static void test_match_nth_prompt_path_header(void **state)
{
    (void)state;
    fake_scenario *sc = parse(
        "{\"responses\":[{\"match\":{\"prompt_contains\":\"2+2\",\"nth\":2},\"content\":\"a\"},"
        "{\"match\":{\"path\":\"/v1/"
        "completions\",\"fields\":{\"stream_options.include_usage\":true}},"
        "\"content\":\"b\"},{\"match\":{\"header\":{\"X-Test\":\"y\"}},\"content\":\"c\"}]}");
    cJSON *q = body("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                    "\"text\":\"What is 2+2?\"}]}]}");
    cJSON *c = body("{\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true}}");
    cJSON *h = body("{\"x-test\":\"y\"}");
    assert_int_equal(fake_scenario_match(sc, "/v1/chat/completions", NULL, q), -1);
    assert_int_equal(fake_scenario_match(sc, "/v1/chat/completions", NULL, q), 0);
    assert_int_equal(fake_scenario_match(sc, "/v1/chat/completions", NULL, q), -1);
    fake_scenario_reset_counters(sc);
    fake_scenario_match(sc, "/v1/chat/completions", NULL, q);
    assert_int_equal(fake_scenario_match(sc, "/v1/chat/completions", NULL, q), 0);
    assert_int_equal(fake_scenario_match(sc, "/v1/completions", NULL, c), 1);
    assert_int_equal(fake_scenario_match(sc, "/v1/chat/completions", NULL, c), -1);
    assert_int_equal(fake_scenario_match(sc, "/v1/chat/completions", h, c), 2);
    cJSON_Delete(q);
    cJSON_Delete(c);
    cJSON_Delete(h);
    fake_scenario_unref(sc);
}

static void test_parse_errors_name_the_problem(void **state)
{
    (void)state;
    char err[256];
    const char *bad[][2] = {
        {"[]", "not a JSON object"},
        {"{}", "\"responses\""},
        {"{\"responses\":[{\"fault\":{\"kind\":\"meltdown\"}}]}", "meltdown"},
        {"{\"responses\":[{\"content\":[{\"bogus\":1}]}]}", "bogus"},
        {"{\"responses\":[{\"tokens\":\"syllables\"}]}", "syllables"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        assert_null(fake_scenario_parse(bad[i][0], strlen(bad[i][0]), err, sizeof err));
        assert_non_null(strstr(err, bad[i][1]));
    }
}

/* ---- dialect bytes ---- */

/* One chunk; rendered again with the head cached, as the generator renders it, it must
 * not change by a byte. */
static char *chunk(fake_dialect d, fake_endpoint ep, const fake_delta *dl)
{
    fake_ctx c = {.d = d, .ep = ep, .id = "ID", .model = "M", .created = 7};
    fbuf b = {0}, head = {0}, cached = {0};
    fake_render_chunk(&b, &c, dl);
    fake_render_chunk_head(&head, &c);
    c.head = head.p, c.head_len = head.len;
    fake_render_chunk(&cached, &c, dl);
    assert_string_equal(cached.p, b.p);
    fbuf_free(&head);
    fbuf_free(&cached);
    return b.p;
}

static fake_delta delta(void)
{
    return (fake_delta){.tool = -1, .matched_stop = "151645", .stop_reason = "null"};
}

#define HEAD "{\"id\":\"ID\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"M\","

static void test_sglang_shapes(void **state)
{
    (void)state;
    fake_delta d = delta();
    d.role = true;
    char *s = chunk(FAKE_D_SGLANG, FAKE_EP_CHAT, &d);
    /* Verbatim from the field report. */
    assert_string_equal(s, HEAD "\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null,"
                                "\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
                                "\"finish_reason\":null,\"matched_stop\":null}]}");
    free(s);
    d = delta();
    d.reasoning = "x", d.rn = 1;
    s = chunk(FAKE_D_SGLANG, FAKE_EP_CHAT, &d);
    assert_non_null(strstr(s, "\"delta\":{\"reasoning_content\":\"x\"},"));
    free(s);
    d = delta();
    d.content = "y", d.cn = 1;
    s = chunk(FAKE_D_SGLANG, FAKE_EP_CHAT, &d);
    assert_non_null(strstr(s, "\"delta\":{\"reasoning_content\":null,\"content\":\"y\"},"));
    free(s);
    d = delta();
    d.finish = "stop";
    s = chunk(FAKE_D_SGLANG, FAKE_EP_CHAT, &d);
    assert_non_null(strstr(s, "\"finish_reason\":\"stop\",\"matched_stop\":151645}]}"));
    free(s);
    d = delta();
    d.content = "y", d.cn = 1;
    s = chunk(FAKE_D_SGLANG_PYDANTIC, FAKE_EP_CHAT, &d);
    assert_string_equal(s, HEAD "\"choices\":[{\"index\":0,\"delta\":{\"role\":null,\"content\":"
                                "\"y\",\"reasoning_content\":null,\"tool_calls\":null},"
                                "\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}],"
                                "\"usage\":null}");
    free(s);
    d = delta();
    d.role = true;
    s = chunk(FAKE_D_SGLANG_OLD, FAKE_EP_CHAT, &d);
    assert_non_null(strstr(s, "\"finish_reason\":\"\","));
    free(s);
}

static void test_vllm_openai_shapes(void **state)
{
    (void)state;
    fake_delta d = delta();
    d.reasoning = "r", d.rn = 1, d.content = "c", d.cn = 1;
    d.finish = "stop";
    char *s = chunk(FAKE_D_VLLM, FAKE_EP_CHAT, &d);
    assert_string_equal(s, HEAD "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"c\","
                                "\"reasoning\":\"r\"},\"logprobs\":null,\"finish_reason\":\"stop\","
                                "\"stop_reason\":null}]}");
    free(s);
    s = chunk(FAKE_D_VLLM_OLD, FAKE_EP_CHAT, &d);
    assert_non_null(strstr(s, "{\"content\":\"c\",\"reasoning_content\":\"r\"}"));
    free(s);
    s = chunk(FAKE_D_VLLM_BOTH, FAKE_EP_CHAT, &d);
    assert_non_null(
        strstr(s, "{\"content\":\"c\",\"reasoning\":\"r\",\"reasoning_content\":\"r\"}"));
    free(s);
    d = delta();
    d.tool = 0, d.tool_id = "call_1", d.tool_name = "f";
    s = chunk(FAKE_D_VLLM, FAKE_EP_CHAT, &d);
    assert_non_null(strstr(s, "\"delta\":{\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
                              "\"index\":0,\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]}"));
    free(s);
    d = delta();
    d.finish = "stop";
    s = chunk(FAKE_D_OPENAI, FAKE_EP_CHAT, &d);
    assert_string_equal(s, HEAD "\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,"
                                "\"finish_reason\":\"stop\"}]}");
    free(s);
    assert_true(fake_dialect_separate_finish(FAKE_D_SGLANG, FAKE_EP_CHAT));
    assert_false(fake_dialect_separate_finish(FAKE_D_VLLM, FAKE_EP_CHAT));
    assert_false(fake_dialect_separate_finish(FAKE_D_SGLANG, FAKE_EP_COMPLETION));
}

static void test_errors_usage_and_completions(void **state)
{
    (void)state;
    fbuf b = {0};
    fake_render_error_event(&b, FAKE_D_SGLANG, "boom é", "InternalServerError", 500);
    assert_string_equal(b.p, "{\"error\": {\"object\": \"error\", \"message\": \"boom \\u00e9\", "
                             "\"type\": \"InternalServerError\", \"param\": null, \"code\": 500}}");
    fbuf_reset(&b);
    fake_render_error_event(&b, FAKE_D_VLLM, "boom", "T", 500);
    assert_string_equal(b.p,
                        "{\"error\": {\"message\": \"boom\", \"type\": \"T\", \"param\": null, "
                        "\"code\": 500}}");
    fbuf_reset(&b);
    fake_render_error_body(&b, FAKE_D_SGLANG, "m", "T", 503);
    assert_string_equal(b.p,
                        "{\"object\":\"error\",\"message\":\"m\",\"type\":\"T\",\"param\":null,"
                        "\"code\":503}");
    fbuf_reset(&b);
    fake_ctx c = {.d = FAKE_D_SGLANG, .ep = FAKE_EP_CHAT, .id = "ID", .model = "M", .created = 7};
    fake_usage u = {10, 5, 2};
    fake_render_usage_chunk(&b, &c, &u);
    assert_string_equal(b.p, HEAD "\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"total_tokens\":"
                                  "15,\"completion_tokens\":5,\"prompt_tokens_details\":null,"
                                  "\"reasoning_tokens\":2}}");
    fbuf_reset(&b);
    c.d = FAKE_D_OPENAI;
    fake_render_usage_chunk(&b, &c, &u);
    assert_non_null(
        strstr(b.p, "{\"prompt_tokens\":10,\"completion_tokens\":5,\"total_tokens\":15}"));
    fbuf_free(&b);

    fake_delta d = delta();
    d.content = "t", d.cn = 1;
    char *s = chunk(FAKE_D_VLLM, FAKE_EP_COMPLETION, &d);
    assert_string_equal(s, "{\"id\":\"ID\",\"object\":\"text_completion\",\"created\":7,\"model\":"
                           "\"M\",\"choices\":[{\"index\":0,\"text\":\"t\",\"logprobs\":null,"
                           "\"finish_reason\":null,\"stop_reason\":null}],\"usage\":null}");
    free(s);
}

static void test_records_ring(void **state)
{
    (void)state;
    fake_records rs;
    fake_records_init(&rs, 2);
    fbuf b = {0}, out = {0};
    for (int i = 0; i < 3; i++) {
        assert_true(fake_records_begin(&rs, &b, "abort", 1.5));
        fake_records_commit(&rs, &b);
    }
    fake_records_dump(&rs, &out);
    /* The oldest was dropped; seq keeps counting. */
    assert_string_equal(out.p, "[{\"seq\":2,\"kind\":\"abort\",\"at_ms\":1.500},\n"
                               "{\"seq\":3,\"kind\":\"abort\",\"at_ms\":1.500}]");
    fake_records_clear(&rs);
    fbuf_reset(&out);
    fake_records_dump(&rs, &out);
    assert_string_equal(out.p, "[]");
    fake_records_free(&rs);
    fake_records_init(&rs, 0);
    assert_false(fake_records_begin(&rs, &b, "abort", 0));
    fake_records_free(&rs);
    fbuf_free(&b);
    fbuf_free(&out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_escaping),
        cmocka_unit_test(test_numbers_as_printf),
        cmocka_unit_test(test_words_keep_whitespace_with_the_word),
        cmocka_unit_test(test_chars_and_bytes_never_split_utf8),
        cmocka_unit_test(test_cap_cuts_and_counts),
        cmocka_unit_test(test_inline_tags),
        cmocka_unit_test(test_tools_stamps_and_varied),
        cmocka_unit_test(test_match_sampling_and_continue),
        cmocka_unit_test(test_match_nth_prompt_path_header),
        cmocka_unit_test(test_parse_errors_name_the_problem),
        cmocka_unit_test(test_sglang_shapes),
        cmocka_unit_test(test_vllm_openai_shapes),
        cmocka_unit_test(test_errors_usage_and_completions),
        cmocka_unit_test(test_records_ring),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
