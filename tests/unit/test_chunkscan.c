/* test_chunkscan.c — the fast scanner agrees with the full dialect parser whenever it
 * accepts a chunk, accepts the common shapes, and refuses what it must leave to dl_parse. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/chunkscan.h"

/* A chunk that frames its content, for priming a state: every chunk below is scanned once
 * with a fresh state and once with a state whose frame came from this one. */
static const char *const primer =
    "{\"id\":\"ab\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\","
    "\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null,\"content\":\"Hi\"},"
    "\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}]}";

static void assert_same_delta(const dl_delta *a, const dl_delta *b)
{
    assert_int_equal(a->kind, b->kind);
    assert_int_equal(a->n_choices, b->n_choices);
    assert_int_equal(a->finish_reason != NULL, b->finish_reason != NULL);
    if (a->finish_reason) assert_string_equal(a->finish_reason, b->finish_reason);
    assert_int_equal(a->role != NULL, b->role != NULL);
    assert_int_equal(a->reasoning_keys, b->reasoning_keys);
    assert_int_equal(a->reasoning_len, b->reasoning_len);
    assert_int_equal(a->content_len, b->content_len);
    if (a->reasoning_len) assert_memory_equal(a->reasoning, b->reasoning, a->reasoning_len);
    if (a->content_len) assert_memory_equal(a->content, b->content, a->content_len);
}

/* id, model and created: only a walk reports them (see chunkscan.h). */
static void assert_same_meta(const dl_delta *a, const dl_delta *b)
{
    assert_int_equal(a->id != NULL, b->id != NULL);
    if (a->id) assert_string_equal(a->id, b->id);
    assert_int_equal(a->model != NULL, b->model != NULL);
    if (a->model) assert_string_equal(a->model, b->model);
    assert_int_equal(a->has_created, b->has_created);
    if (a->has_created) assert_true(a->created == b->created);
}

static unsigned resumed_walks; /* chunks read after a lead of their own bytes (agrees) */
static unsigned vouched;       /* chunks the primed state's chunkscan_frames took (agrees) */

/* Returns whether chunkscan accepted `json`; when it did, asserts that every field the
 * exchange reads equals dl_parse's view of the same bytes. A state framed by `primer`
 * must give the same answer as the fresh one, and so must a state whose lead (the bytes
 * before "choices") is json's own, with its frame dropped: id, model and created too. */
static bool agrees(const char *json)
{
    chunkscan_state fresh = CHUNKSCAN_INIT, primed = CHUNKSCAN_INIT, self = CHUNKSCAN_INIT;
    dl_delta fast, full, framed, again;
    bool ok = chunkscan(json, strlen(json), &fresh, &fast);
    dl_parse(json, strlen(json), &full);
    if (ok) {
        assert_int_equal(full.kind, DL_CHUNK);
        assert_int_equal(full.choice_index, 0);
        assert_null(fast.usage); /* a usage object comes only without choices */
        if (full.n_choices) assert_null(full.usage);
        assert_int_equal(full.n_tools, 0);
        assert_same_delta(&fast, &full);
        assert_same_meta(&fast, &full);
    }
    assert_true(chunkscan(primer, strlen(primer), &primed, &framed));
    assert_int_equal(primed.field, 1);
    /* What chunkscan_frames takes holds no CR or LF, and it reads it as chunkscan would. */
    bool frames = chunkscan_frames(json, strlen(json), &primed, &framed);
    if (frames) assert_null(strpbrk(json, "\r\n"));
    vouched += frames;
    assert_int_equal(frames || chunkscan(json, strlen(json), &primed, &framed), ok);
    if (ok) assert_same_delta(&framed, &fast);
    if (ok) {
        assert_true(chunkscan(json, strlen(json), &self, &again));
        self.field = 0;
        resumed_walks += self.lead.len > 0;
        assert_true(chunkscan(json, strlen(json), &self, &again));
        assert_same_delta(&again, &fast);
        assert_same_meta(&again, &fast);
    }
    dl_delta_clear(&full);
    chunkscan_free(&fresh);
    chunkscan_free(&primed);
    chunkscan_free(&self);
    return ok;
}

static void test_accepts_common_shapes(void **state)
{
    (void)state;
    /* SGLang recent: first chunk, reasoning delta, content delta */
    assert_true(agrees(
        "{\"id\":\"ab\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\","
        "\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null,\"role\":\"assistant\","
        "\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}]}"));
    assert_true(
        agrees("{\"id\":\"ab\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\","
               "\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"lambda \"},"
               "\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}]}"));
    /* SGLang pydantic era: every key present */
    assert_true(agrees(
        "{\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\","
        "\"choices\":[{\"index\":0,\"delta\":{\"role\":null,\"content\":\"Hi \\\"there\\\"\\n\","
        "\"reasoning_content\":null,\"tool_calls\":null},\"logprobs\":null,"
        "\"finish_reason\":null,\"matched_stop\":null}],\"usage\":null}"));
    /* vLLM >= 0.17 */
    assert_true(agrees("{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,"
                       "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":"
                       "\"\\u00e9\\ud83d\\ude00\"},"
                       "\"logprobs\":null,\"finish_reason\":null}]}"));
}

/* The last chunks of every stream: finish_reason (with or without text) and usage. */
static void test_accepts_the_ends_of_a_stream(void **state)
{
    (void)state;
    /* SGLang's last chunk, then its usage chunk */
    assert_true(
        agrees("{\"id\":\"ab\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\","
               "\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null},\"logprobs\":null,"
               "\"finish_reason\":\"length\",\"matched_stop\":null}]}"));
    assert_true(
        agrees("{\"id\":\"ab\",\"object\":\"chat.completion.chunk\",\"created\":1,"
               "\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,"
               "\"total_tokens\":69,\"completion_tokens\":60,\"prompt_tokens_details\":null}}"));
    /* SGLang <= 0.4: the reason on the last text, sometimes ""; an escaped reason */
    assert_true(agrees("{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"end\"},"
                       "\"finish_reason\":\"stop\"}]}"));
    assert_true(agrees("{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},"
                       "\"finish_reason\":\"\"}]}"));
    assert_true(agrees("{\"choices\":[{\"index\":0,\"delta\":{},"
                       "\"finish_reason\":\"tool\\u005fcalls\"}]}"));
    assert_true(agrees("{\"choices\":[],\"usage\":null}"));
    /* The stream's identity, whatever its form: escaped, empty, not a string, negative */
    assert_true(
        agrees("{\"id\":\"a\\u00e9\",\"model\":\"\",\"created\":-12,\"choices\":[{\"index\":0,"
               "\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}"));
    assert_true(agrees("{\"id\":7,\"model\":null,\"created\":\"1\",\"choices\":[]}"));
    assert_true(agrees("{\"id\":{\"a\":[1]},\"model\":\"m\",\"created\":999999999999999,"
                       "\"choices\":[]}"));
    assert_true(agrees("{\"choices\":[]}"));

    /* A text with a reason is no frame: the next chunk with the same bytes around its text
     * must not be read as if it had none (or as if it had this one). */
    const char *last = "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"end\"},"
                       "\"finish_reason\":\"stop\"}]}";
    chunkscan_state st = CHUNKSCAN_INIT;
    dl_delta d;
    assert_true(chunkscan(last, strlen(last), &st, &d));
    assert_string_equal(d.finish_reason, "stop");
    assert_int_equal(st.field, 0);
    chunkscan_free(&st);
}

/* Two escaped strings in one chunk, the second much longer than the first: both decoded
 * texts must still be readable (the scratch buffer may not move between them; ASan run). */
static void test_two_escaped_texts(void **state)
{
    (void)state;
    char json[512], content[200];
    memset(content, 'c', 150);
    strcpy(content + 150, "\\n\\u00e9");
    snprintf(json, sizeof json,
             "{\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"r\\tr\","
             "\"content\":\"%s\"}}]}",
             content);
    assert_true(agrees(json));
}

static void test_refuses_what_needs_the_full_parser(void **state)
{
    (void)state;
    const char *refuse[] = {
        "{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],"
        "\"usage\":{\"prompt_tokens\":1}}",
        "{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":7}]}",
        "{\"choices\":[{\"index\":0,\"delta\":{},"
        "\"finish_reason\":\"a_reason_of_thirty_two_characters\"}]}",
        "{\"choices\":[],\"usage\":7}",
        "{\"usage\":{\"prompt_tokens\":1}}",
        "{\"object\":\"text_completion\",\"choices\":[],\"usage\":{\"prompt_tokens\":1}}",
        "{\"error\":{\"message\":\"x\"}}",
        "{\"created\":1.5,\"choices\":[]}",
        "{\"created\":1e3,\"choices\":[]}",
        "{\"created\":1234567890123456,\"choices\":[]}",
        "{\"id\":\"a\",\"id\":\"b\",\"choices\":[]}",
        "{\"choices\":[{\"index\":1,\"delta\":{\"content\":\"a\"}}]}",
        "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}},{\"index\":1,\"delta\":{}}]}",
        "{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0}]}}]}",
        "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\",\"content\":\"b\"}}]}",
        "{\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"a\",\"reasoning_content\":\"b\"}}]}",
        "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\\u0000b\"}}]}",
        "{\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"a\"}]}",
        "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]} trailing",
        "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}],\"n\":01}",
        "[DONE]",
        "",
    };
    for (size_t i = 0; i < sizeof refuse / sizeof *refuse; i++)
        assert_false(agrees(refuse[i]));
}

/* The word-at-a-time string scan: a control byte, an escape or a byte next to one of its
 * limits at every position of texts around the 16-byte steps. */
static void test_every_position_in_a_text(void **state)
{
    (void)state;
    static const struct {
        const char *put;
        bool accepted;
    } cases[] = {
        {"\x01", false}, {"\x1f", false},   {"\t", false},      {" ", true},
        {"!", true},     {"\x7f", true},    {"\xc3\xa9", true}, {"\\n", true},
        {"\\\"", true},  {"\\u00e9", true}, {"[", true},        {"\\\\", true},
    };
    char json[256];
    char text[64];
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (size_t len = 0; len <= 40; len++)
            for (size_t at = 0; at <= len; at++) {
                memset(text, 'a', len);
                text[len] = '\0';
                size_t n = strlen(cases[c].put);
                memmove(text + at + n, text + at, len - at + 1);
                memcpy(text + at, cases[c].put, n);
                snprintf(json, sizeof json,
                         "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s\"}}]}", text);
                bool ok = agrees(json);
                if (ok != cases[c].accepted)
                    fail_msg("case %zu len %zu at %zu: %s", c, len, at, json);
            }
}

/* Chunks that share the primer's bytes around its text, or almost: the framed reading must
 * equal the walk, whatever lies between. */
static void test_framed_chunks(void **state)
{
    (void)state;
    static const char *const middles[] = {
        "\"there\"",
        "\"\"",
        "\"a\\\"b\"",
        "\"\\u00e9\\n\"",
        "\"a\\\"",
        "\"a\",\"role\":\"x\"",
        "\"a\",\"content\":\"b\"",
        "\"a\",\"reasoning\":\"b\"",
        "null",
        "\"\\u0000\"",
        "\"a\x01\"",
        "\"a\"  ",
        " \"a\"",
        "\"a\nb\"",
        "\"a\rb\"",
        "\"a\"\n",
        "\"",
        "\"a",
        "7",
    };
    const char *at = strstr(primer, "\"Hi\"");
    size_t head = (size_t)(at - primer), tail = strlen(at + 4);
    char json[512];
    size_t framed_ok = 0;
    for (size_t i = 0; i < sizeof middles / sizeof *middles; i++) {
        snprintf(json, sizeof json, "%.*s%s%s", (int)head, primer, middles[i], at + 4);
        assert_int_equal(strlen(json), head + strlen(middles[i]) + tail);
        framed_ok += agrees(json);
    }
    assert_true(framed_ok >= 4);
    assert_true(vouched >= 4);
}

/* A frame holding a CR or an LF (JSON whitespace) vouches for nothing, though it frames. */
static void test_frame_with_line_breaks(void **state)
{
    (void)state;
    static const char *const heads[] = {
        "{\"id\":\"ab\",\n\"choices\":[{\"index\":0,\"delta\":{\"content\":\"",
        "{\"id\":\"ab\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"",
    };
    static const char *const tails[] = {"\"}}]}", "\"}}]}\r"};
    for (size_t i = 0; i < sizeof heads / sizeof *heads; i++) {
        chunkscan_state st = CHUNKSCAN_INIT;
        char c[256];
        dl_delta d;
        snprintf(c, sizeof c, "%sHi%s", heads[i], tails[i]);
        assert_true(chunkscan(c, strlen(c), &st, &d));
        snprintf(c, sizeof c, "%sthere%s", heads[i], tails[i]);
        assert_false(chunkscan_frames(c, strlen(c), &st, &d));
        assert_true(chunkscan(c, strlen(c), &st, &d));
        assert_true(st.in_frame);
        chunkscan_free(&st);
    }
    /* A stream whose own bytes (where its head differs from the offered frame's) hold an
     * LF shares no frame: it makes one of its own, which vouches for nothing. */
    chunkscan_state a = CHUNKSCAN_INIT, b = CHUNKSCAN_INIT;
    char c[256];
    dl_delta d;
    snprintf(c, sizeof c, "%sHi%s", "{\"id\":\"abc\",\"choices\":[{\"delta\":{\"content\":\"",
             tails[0]);
    assert_true(chunkscan(c, strlen(c), &a, &d));
    snprintf(c, sizeof c, "%sthere%s", "{\"id\":\"abc\",\"choices\":[{\"delta\":{\"content\":\"",
             tails[0]);
    assert_true(chunkscan_frames(c, strlen(c), &a, &d));
    snprintf(c, sizeof c, "%sHi%s", "{\"id\":\"ab\",\n\"choices\":[{\"delta\":{\"content\":\"",
             tails[0]);
    assert_true(chunkscan(c, strlen(c), &b, &d));
    assert_ptr_not_equal(b.shared, a.shared);
    snprintf(c, sizeof c, "%sthere%s", "{\"id\":\"ab\",\n\"choices\":[{\"delta\":{\"content\":\"",
             tails[0]);
    assert_false(chunkscan_frames(c, strlen(c), &b, &d));
    chunkscan_free(&a);
    chunkscan_free(&b);
}

/* Random byte edits of accepted chunks: whatever the scanner still accepts, it agrees. */
static void test_mutations_agree(void **state)
{
    (void)state;
    const char *base = "{\"id\":\"ab\",\"object\":\"chat.completion.chunk\",\"created\":12,"
                       "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\\ty\","
                       "\"reasoning_content\":null},\"logprobs\":null,\"finish_reason\":null}]}";
    const char alphabet[] = "{}[]\",:\\0123nulltrue \"abc\\u00e9";
    char buf[512];
    unsigned seed = 12345;
    size_t accepted = 0;
    for (int iter = 0; iter < 20000; iter++) {
        strcpy(buf, iter % 2 ? base : primer); /* the primer's edits test its frame */
        size_t n = strlen(buf);
        for (int k = 0; k < 1 + iter % 3; k++) {
            seed = seed * 1103515245u + 12345u;
            buf[(seed >> 8) % n] = alphabet[(seed >> 20) % (sizeof alphabet - 1)];
        }
        accepted += agrees(buf);
    }
    assert_true(accepted > 0);
    assert_true(resumed_walks > 0);
}

/* An SGLang stream's chunk: its id and created time, and its content. */
static void stream_chunk(char *out, size_t n, const char *id, long created, const char *text)
{
    snprintf(out, n,
             "{\"id\":\"%s\",\"object\":\"chat.completion.chunk\",\"created\":%ld,"
             "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null,"
             "\"content\":\"%s\"},\"logprobs\":null,\"finish_reason\":null,"
             "\"matched_stop\":null}]}",
             id, created, text);
}

/* Reads json with st and with a fresh state; both accept it with the same text. Returns
 * whether st read it framed. */
static bool framed_alike(chunkscan_state *st, const char *json)
{
    chunkscan_state fresh = CHUNKSCAN_INIT;
    dl_delta a, b;
    assert_true(chunkscan(json, strlen(json), st, &a));
    bool was_framed = st->in_frame && !a.id;
    assert_true(chunkscan(json, strlen(json), &fresh, &b));
    assert_same_delta(&a, &b);
    chunkscan_free(&fresh);
    return was_framed;
}

/* The streams of a thread share one frame and keep only their first differing bytes (id,
 * created); a chunk of another stream is walked, not framed, by a state whose own bytes
 * differ from it; the frame outlives the state that made it. */
static void test_frames_shared_by_streams(void **state)
{
    (void)state;
    char c[512];
    chunkscan_state a = CHUNKSCAN_INIT, b = CHUNKSCAN_INIT, d = CHUNKSCAN_INIT;
    stream_chunk(c, sizeof c, "0123456789abcdef0123456789abcdef", 1796569629, "Hi");
    assert_false(framed_alike(&a, c)); /* the walk that makes a's frame */
    stream_chunk(c, sizeof c, "0123456789abcdef0123456789abcdef", 1796569629, "there");
    assert_true(framed_alike(&a, c));
    assert_int_equal(a.own, 0); /* the offered frame was a's own */

    stream_chunk(c, sizeof c, "fedcba9876543210fedcba9876543210", 1796569629, "Yo");
    assert_false(framed_alike(&b, c));
    assert_ptr_equal(b.shared, a.shared);
    assert_int_equal(b.own, 39); /* {"id":" and the id */
    stream_chunk(c, sizeof c, "fedcba9876543210fedcba9876543210", 1796569629, "x\\ny");
    assert_true(framed_alike(&b, c));
    /* a's chunk is not b's: b's own bytes differ from it */
    stream_chunk(c, sizeof c, "0123456789abcdef0123456789abcdef", 1796569629, "there");
    assert_false(framed_alike(&b, c));
    assert_true(framed_alike(&a, c));
    stream_chunk(c, sizeof c, "fedcba9876543210fedcba9876543210", 1796569629, "Yo");
    assert_false(framed_alike(&b, c)); /* the walk above made b's frame a's own bytes */
    assert_true(framed_alike(&b, c));

    /* The maker gone, b reads on. */
    chunkscan_free(&a);
    stream_chunk(c, sizeof c, "fedcba9876543210fedcba9876543210", 1796569629, "on");
    assert_true(framed_alike(&b, c));

    /* Another created time too: past CHUNKSCAN_OWN_MAX, a frame of its own, which a stream
     * of the same second then shares. */
    chunkscan_state g = CHUNKSCAN_INIT, h = CHUNKSCAN_INIT;
    stream_chunk(c, sizeof c, "00112233445566778899aabbccddeeff", 1796569631, "Hi");
    assert_false(framed_alike(&g, c));
    assert_ptr_not_equal(g.shared, b.shared);
    assert_int_equal(g.own, 0);
    stream_chunk(c, sizeof c, "ffeeddccbbaa99887766554433221100", 1796569631, "Hi");
    assert_false(framed_alike(&h, c));
    assert_ptr_equal(h.shared, g.shared);
    assert_int_equal(h.own, 39);
    stream_chunk(c, sizeof c, "ffeeddccbbaa99887766554433221100", 1796569631, "yes");
    assert_true(framed_alike(&h, c));
    chunkscan_free(&g);
    chunkscan_free(&h);

    /* A model, a key that differs, or a head of another length: frames of their own. */
    chunkscan_state e = CHUNKSCAN_INIT, f = CHUNKSCAN_INIT;
    stream_chunk(c, sizeof c, "0123456789abcdef0123456789abcdef", 1796569629, "Hi");
    assert_false(framed_alike(&e, c)); /* the frame to differ from, offered */
#define SHAPE(model, key)                                                                          \
    "{\"id\":\"0123456789abcdef0123456789abcdef\",\"object\":\"chat.completion.chunk\","           \
    "\"created\":1796569629,\"model\":\"" model "\",\"choices\":[{\"index\":0,\"delta\":{\"" key   \
    "\":null,\"content\":\"Hi\"},\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}]" \
    "}"
    snprintf(c, sizeof c, "%s", SHAPE("n", "reasoning_content"));
    assert_false(framed_alike(&f, c));
    assert_ptr_not_equal(f.shared, e.shared);
    assert_int_equal(f.own, 0);
    assert_true(framed_alike(&f, c));
    chunkscan_free(&f);
    f = (chunkscan_state)CHUNKSCAN_INIT;
    snprintf(c, sizeof c, "%s", SHAPE("m", "reasoning_contenx"));
#undef SHAPE
    assert_false(framed_alike(&f, c));
    assert_ptr_not_equal(f.shared, e.shared);
    assert_int_equal(f.own, 0);
    assert_true(framed_alike(&f, c));
    stream_chunk(c, sizeof c, "0123", 1796569629, "Hi");
    assert_false(framed_alike(&d, c));
    assert_ptr_not_equal(d.shared, f.shared);
    assert_int_equal(d.own, 0);
    assert_true(framed_alike(&d, c));
    chunkscan_free(&d);
    chunkscan_free(&e);
    chunkscan_free(&f);
    chunkscan_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accepts_common_shapes),
        cmocka_unit_test(test_accepts_the_ends_of_a_stream),
        cmocka_unit_test(test_refuses_what_needs_the_full_parser),
        cmocka_unit_test(test_two_escaped_texts),
        cmocka_unit_test(test_every_position_in_a_text),
        cmocka_unit_test(test_framed_chunks),
        cmocka_unit_test(test_mutations_agree),
        cmocka_unit_test(test_frames_shared_by_streams),
        cmocka_unit_test(test_frame_with_line_breaks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
