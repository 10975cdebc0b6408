/* test_jsonget.c — loopguard's cJSON_GetObjectItemCaseSensitive (proxy/jsonget.c) gives
 * the shared library's answer: the same member, or NULL, for every object and name. The
 * library's own definition is reached past the program's with dlsym(RTLD_NEXT). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <dlfcn.h>

typedef cJSON *(*lookup_fn)(const cJSON *const, const char *const);

static void same_as_the_library(void **state)
{
    (void)state;
    lookup_fn lib = (lookup_fn)dlsym(RTLD_NEXT, "cJSON_GetObjectItemCaseSensitive");
    assert_non_null(lib);
    assert_true(lib != cJSON_GetObjectItemCaseSensitive); /* the program's is another */
    static const char *const texts[] = {
        "{}",
        "[]",
        "[1, {\"a\": 1}]",
        "{\"model\":\"m\",\"messages\":[],\"stream\":true,\"max_tokens\":2}",
        "{\"stream\":1,\"stream_options\":{},\"s\":2,\"\":3,\"stream\":4}",
        "{\"a\":1,\"A\":2,\"ab\":3,\"a\\u0000b\":4,\"\\u00e9t\\u00e9\":5}",
        "\"text\"",
        "7",
    };
    static const char *const names[] = {
        "model", "messages", "stream", "stream_options",    "max_tokens",  "s", "", "a", "A",
        "ab",    "abc",      "b",      "\xc3\xa9t\xc3\xa9", "temperature",
    };
    for (size_t t = 0; t < sizeof texts / sizeof *texts; t++) {
        cJSON *root = cJSON_Parse(texts[t]);
        assert_non_null(root);
        const cJSON *objs[] = {root, root->child, NULL};
        for (size_t o = 0; o < sizeof objs / sizeof *objs; o++) {
            for (size_t n = 0; n < sizeof names / sizeof *names; n++) {
                if (cJSON_GetObjectItemCaseSensitive(objs[o], names[n]) != lib(objs[o], names[n]))
                    fail_msg("%s, object %zu, \"%s\": another member", texts[t], o, names[n]);
            }
            assert_null(cJSON_GetObjectItemCaseSensitive(objs[o], NULL));
        }
        cJSON_Delete(root);
    }
}

/* A member made by the program without a name (an array's element moved into an object
 * by hand) ends the search in both. */
static void a_nameless_member_ends_the_search(void **state)
{
    (void)state;
    lookup_fn lib = (lookup_fn)dlsym(RTLD_NEXT, "cJSON_GetObjectItemCaseSensitive");
    assert_non_null(lib);
    cJSON *obj = cJSON_CreateObject();
    cJSON_AddNumberToObject(obj, "a", 1);
    cJSON_AddItemToArray(obj, cJSON_CreateNumber(2)); /* no name */
    cJSON_AddNumberToObject(obj, "b", 3);
    assert_non_null(cJSON_GetObjectItemCaseSensitive(obj, "a"));
    assert_null(cJSON_GetObjectItemCaseSensitive(obj, "b"));
    assert_ptr_equal(cJSON_GetObjectItemCaseSensitive(obj, "b"), lib(obj, "b"));
    cJSON_Delete(obj);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(same_as_the_library),
        cmocka_unit_test(a_nameless_member_ends_the_search),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
