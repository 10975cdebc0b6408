/* test_jsontree.c — jt_parse against cJSON_ParseWithLength: for every text it takes, the
 * same tree (types, keys, strings, numbers bit for bit, valueint, member order, prev
 * links); the texts outside its strict form declined; random documents both ways. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proxy/jsontree.h"
#include "proxy/xalloc.h"

/* Whether two sibling lists (and everything below them) are alike. */
static void same_tree(const cJSON *a, const cJSON *b)
{
    assert_int_equal(a->type, b->type);
    if (a->string || b->string) {
        assert_non_null(a->string);
        assert_non_null(b->string);
        assert_string_equal(a->string, b->string);
    }
    if (a->valuestring || b->valuestring) {
        assert_non_null(a->valuestring);
        assert_non_null(b->valuestring);
        assert_string_equal(a->valuestring, b->valuestring);
    }
    assert_int_equal(a->valueint, b->valueint);
    assert_memory_equal(&a->valuedouble, &b->valuedouble, sizeof a->valuedouble);
    const cJSON *x = a->child, *y = b->child, *px = NULL;
    assert_true(!x == !y);
    if (x) assert_ptr_equal(x->prev, cJSON_GetArrayItem(a, cJSON_GetArraySize(a) - 1));
    for (; x || y; px = x, x = x->next, y = y->next) {
        assert_true(x && y);
        if (px) assert_ptr_equal(x->prev, px);
        same_tree(x, y);
    }
}

/* s is taken and gives cJSON's tree. */
static void taken(const char *s)
{
    size_t n = strlen(s);
    cJSON *a = jt_parse(s, n), *b = cJSON_ParseWithLength(s, n);
    if (!a) fail_msg("declined: %s", s);
    assert_non_null(b);
    assert_null(a->next);
    assert_null(a->prev);
    same_tree(a, b);
    lg_xfree(a);
    cJSON_Delete(b);
}

static void declined(const char *s, size_t n)
{
    if (jt_parse(s, n)) fail_msg("taken: %.*s", (int)n, s);
}

static void test_taken(void **state)
{
    (void)state;
    static const char *const texts[] = {
        "{}",
        "[]",
        " \t\r\n{ \"a\" : [ 1 , 2 ] , \"b\" : { } }\n ",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true,"
        "\"max_tokens\":2}",
        "\"\"",
        "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"",
        "\"caf\\u00e9 \\u00E9 \\u20ac \\ud83d\\ude00 \\u007f \\u0001\"",
        "\"raw caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"",
        "[\"0123456789abcdef\\\"0123456789\",\"01234567\\\\\",\"0123456\\n\"]",
        "[0,-0,1,-1,0.5,-0.5,1e2,1E+2,1e-7,2.5E-3,123456789,2147483647,2147483648,-2147483648,"
        "-2147483649,1e308,1e999,-1e999,4.9e-324,123456789012345678901234567890]",
        "[true,false,null,[true],{\"t\":false}]",
        /* runs of backslashes before quotes, odd and even, with '[', '{' and ',' inside */
        "[\"x\\\\\\\",[{\",\"y\\\\\\\\\",[1,2],\"\\\\\",{\"\\\\\\\\\\\\\\\"\\\\\":[]}]",
        "[[],{},[[]],{\"a\":{}},\"[{,\\\",]}\",\"\\\\\"]",
        "{\"a\":1,\"a\":2,\"\":3,\"a\\u0062\":4}",
        "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
        "{\"messages\":[{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"x\"}]},"
        "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"r\"}],\"n\":3,"
        "\"stream_options\":{\"include_usage\":true},\"temperature\":0.7}",
        "0",
        "-12.5e3",
        "null",
    };
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
        taken(texts[i]);
}

static void test_declined(void **state)
{
    (void)state;
    static const char *const texts[] = {
        "",
        "   ",
        "{} x",
        "{}{}",
        "[1,]",
        "{\"a\":1,}",
        "01",
        "1.",
        ".5",
        "+1",
        "-",
        "1e",
        "tru",
        "nul",
        "[1 2]",
        "{1:2}",
        "{\"a\" 1}",
        "\"abc",
        "\"a\x01\"",
        "\"\\x\"",
        "\"\\u0000\"",
        "\"\\ud800\"",
        "\"\\udc00x\"",
        "\"\\ud800\\u0041\"",
        "\"\\u12\"",
        "\"\\uzzzz\"",
        "\xef\xbb\xbf{}",
        "\v{}",
        "[1]\x01",
        "{\"a\":1",
        "[",
    };
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
        declined(texts[i], strlen(texts[i]));
    /* JT_MAX_DEPTH levels taken, one more declined; a number of 63 bytes taken, of 64
     * declined; a NUL inside a string declined */
    char deep[2 * JT_MAX_DEPTH + 8];
    for (int levels = JT_MAX_DEPTH; levels <= JT_MAX_DEPTH + 1; levels++) {
        char *p = deep;
        for (int i = 0; i < levels; i++)
            *p++ = '[';
        for (int i = 0; i < levels; i++)
            *p++ = ']';
        *p = '\0';
        if (levels == JT_MAX_DEPTH)
            taken(deep);
        else
            declined(deep, (size_t)(p - deep));
    }
    char num[70];
    memset(num, '1', 64);
    num[64] = '\0';
    declined(num, 64);
    taken(num + 1); /* 63 bytes */
    declined("[\"a\0b\"]", 7);
}

/* A random JSON value of at most `depth` levels, appended to b. */
static void gen(char *b, size_t *len, size_t cap, unsigned depth)
{
    static const char *const atoms[] = {"0",
                                        "-0",
                                        "1",
                                        "-7",
                                        "3.25",
                                        "1e3",
                                        "-2.5E-2",
                                        "1e400",
                                        "true",
                                        "false",
                                        "null",
                                        "\"\"",
                                        "\"abc\"",
                                        "\"\\u00e9\\n\"",
                                        "\"\\ud83d\\ude00\"",
                                        "\"a long string past eight bytes\\t\"",
                                        "99999999999",
                                        "\"caf\xc3\xa9\"",
                                        "\"a,[{\\\"}],\\\\\"",
                                        "[]",
                                        "{}"};
    size_t room = cap - *len;
    if (room < 64) {
        *len += (size_t)snprintf(b + *len, room, "0");
        return;
    }
    int k = rand() % 10;
    if (depth == 0 || k < 5) {
        *len += (size_t)snprintf(b + *len, room, "%s",
                                 atoms[rand() % (int)(sizeof atoms / sizeof *atoms)]);
        return;
    }
    bool object = k < 8;
    b[(*len)++] = object ? '{' : '[';
    int n = rand() % 5;
    for (int i = 0; i < n && cap - *len > 96; i++) {
        if (i) b[(*len)++] = ',';
        if (rand() % 4 == 0) b[(*len)++] = ' ';
        if (object) *len += (size_t)snprintf(b + *len, cap - *len, "\"k%d\":", rand() % 4);
        gen(b, len, cap, depth - 1);
        if (rand() % 4 == 0) b[(*len)++] = '\n';
    }
    b[(*len)++] = object ? '}' : ']';
    b[*len] = '\0';
}

static void test_random(void **state)
{
    (void)state;
    srand(28);
    static char b[8192];
    for (int i = 0; i < 3000; i++) {
        size_t len = 0;
        gen(b, &len, sizeof b - 8, 6);
        b[len] = '\0';
        taken(b);
    }
}

int main(void)
{
    cJSON_InitHooks(&(cJSON_Hooks){.malloc_fn = lg_xmalloc, .free_fn = lg_xfree});
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_taken),
        cmocka_unit_test(test_declined),
        cmocka_unit_test(test_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
