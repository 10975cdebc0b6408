/* test_guard.c — the guard: the seed's loops are caught within 40 words, the known
 * false-positive traps (tables, `None,` lists, asserts, rules, zero arrays, shared-prefix
 * lists, ASCII art) pass, verdicts do not depend on chunking (property test over random
 * splits), UTF-8 split anywhere is fine, holdback never splits a character and keeps a
 * loop's second copy away from the client, and the JSON settings name bad keys. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guard/guard.h"

/* ---- helpers ----------------------------------------------------------------------- */

typedef struct text {
    char *s;
    size_t n, cap;
} text;

static void tput(text *t, const char *s, size_t n)
{
    if (t->n + n + 1 > t->cap) {
        t->cap = (t->n + n + 1) * 2;
        t->s = realloc(t->s, t->cap);
        assert_non_null(t->s);
    }
    memcpy(t->s + t->n, s, n);
    t->n += n;
    t->s[t->n] = 0;
}

static void tcat(text *t, const char *s)
{
    tput(t, s, strlen(s));
}

static void trep(text *t, const char *s, int times)
{
    for (int i = 0; i < times; i++)
        tcat(t, s);
}

/* A verdict copied out of a guard, for comparisons after guard_free. */
typedef struct result {
    bool tripped;
    char detector[64];
    uint64_t loop_start, at_byte;
    char unit[260];
    size_t unit_len;
    unsigned repeats;
    size_t suspect;
} result;

static result snapshot(const guard *g)
{
    result r;
    memset(&r, 0, sizeof(r));
    const guard_verdict *v = guard_get_verdict(g);
    r.tripped = guard_tripped(g);
    r.suspect = guard_suspect(g);
    if (v) {
        snprintf(r.detector, sizeof(r.detector), "%s", v->detector);
        r.loop_start = v->loop_start;
        r.at_byte = v->at_byte;
        r.unit_len = v->unit_len;
        memcpy(r.unit, v->unit, v->unit_len);
        r.repeats = v->repeats;
    }
    return r;
}

static void assert_same(const result *a, const result *b)
{
    assert_int_equal(a->tripped, b->tripped);
    assert_string_equal(a->detector, b->detector);
    assert_int_equal(a->loop_start, b->loop_start);
    assert_int_equal(a->at_byte, b->at_byte);
    assert_int_equal(a->unit_len, b->unit_len);
    assert_memory_equal(a->unit, b->unit, a->unit_len);
    assert_int_equal(a->repeats, b->repeats);
    assert_int_equal(a->suspect, b->suspect);
}

/* Runs `s` through a guard whole, then finishes it. */
static result run_whole(const guard_params *p, lg_channel ch, const char *s, size_t n, bool finish)
{
    guard *g = guard_new(p, ch);
    guard_feed(g, s, n);
    if (finish) guard_finish(g);
    result r = snapshot(g);
    guard_free(g);
    return r;
}

static result scan_text(lg_channel ch, const char *s)
{
    guard_params *p = guard_params_new(ch);
    result r = run_whole(p, ch, s, strlen(s), true);
    guard_params_free(p);
    return r;
}

static unsigned long long rng_state = 0x243F6A8885A308D3ull;
static unsigned rnd(unsigned n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (unsigned)(rng_state % n);
}

/* Feeds `s` in random chunks (sizes 1..maxchunk), checking that guard_feed reports the
 * trip in the chunk that holds at_byte, and returns the result. */
static result run_split(const guard_params *p, lg_channel ch, const char *s, size_t n,
                        unsigned maxchunk, bool finish)
{
    guard *g = guard_new(p, ch);
    size_t off = 0;
    while (off < n) {
        size_t k = 1 + rnd(maxchunk);
        if (k > n - off) k = n - off;
        bool t = guard_feed(g, s + off, k);
        off += k;
        if (t) {
            const guard_verdict *v = guard_get_verdict(g);
            assert_non_null(v);
            assert_true(v->at_byte <= off);
            assert_true(v->at_byte > off - k);
            break;
        }
    }
    if (finish) guard_finish(g);
    result r = snapshot(g);
    guard_free(g);
    return r;
}

static size_t count_words(const char *s, size_t n)
{
    size_t w = 0;
    bool in = false;
    for (size_t i = 0; i < n; i++) {
        bool sp = s[i] == ' ' || s[i] == '\n' || s[i] == '\t';
        if (!sp && !in) w++;
        in = !sp;
    }
    return w;
}

/* ---- the seed's loops -------------------------------------------------------------- */

static void check_seed(lg_channel ch, const char *prefix, const char *unit, size_t max_words)
{
    text t = {0};
    tcat(&t, prefix);
    trep(&t, unit, 200);
    result r = scan_text(ch, t.s);
    assert_true(r.tripped);
    assert_string_equal(r.detector, "repeat");
    size_t words = count_words(t.s, r.at_byte);
    assert_true(words <= max_words);
    /* The loop begins where the unit begins, give or take a rotation: the prefix may end
     * like the unit does ("Okay.\n" and "...2+2.\n"). */
    assert_true(r.loop_start + strlen(unit) > strlen(prefix));
    assert_true(r.loop_start <= strlen(prefix) + strlen(unit));
    free(t.s);
}

static void test_seed_cases(void **state)
{
    (void)state;
    for (int ch = 0; ch < 2; ch++) {
        check_seed((lg_channel)ch, "You can use the ", "lambda ", 40);
        check_seed((lg_channel)ch, "", "The user is asking for the result of 2+2. ", 40);
        check_seed((lg_channel)ch, "Okay.\n", "The user is asking for the result of 2+2.\n", 40);
        check_seed((lg_channel)ch, "Here a bit of code to check prime numbers:\n", "prime ", 40);
    }
}

/* ---- false-positive traps ---------------------------------------------------------- */

static void assert_clean(const char *what, const char *s)
{
    for (int ch = 0; ch < LG_CH_COUNT; ch++) {
        result r = scan_text((lg_channel)ch, s);
        if (r.tripped)
            fail_msg("%s tripped %s on channel %d at %llu, unit '%s'", what, r.detector, ch,
                     (unsigned long long)r.at_byte, r.unit);
    }
}

/* Each trap bare and inside a code fence. */
static void assert_clean_both(const char *what, const char *s)
{
    text t = {0};
    assert_clean(what, s);
    tcat(&t, "Here it is:\n\n```\n");
    tcat(&t, s);
    tcat(&t, "```\n\nThat is all.\n");
    assert_clean(what, t.s);
    free(t.s);
}

/* The look-alikes a chat answer legitimately holds, at the sizes answers hold them: a
 * short list of None, a few asserts, separators, a small zero table, numbered lists whose
 * items share a prefix, ASCII art, a song with a chorus, a blank sudoku grid, a table padded
 * with spaces, emphasis. (At machine-file sizes, with nothing in the prompt asking for them,
 * a hundred identical lines are a loop: see test_prompt_slack.) */
static void test_traps(void **state)
{
    (void)state;
    text t = {0};

    tcat(&t, "values = [\n");
    trep(&t, "    None,\n", 10);
    tcat(&t, "]\n");
    assert_clean_both("None, lines", t.s);

    t.n = 0;
    tcat(&t, "values = [");
    trep(&t, "None, ", 6);
    tcat(&t, "None]\n");
    assert_clean_both("None, inline", t.s);

    t.n = 0;
    tcat(&t, "def test_f():\n");
    trep(&t, "    assert f(1) == 1\n", 8);
    assert_clean_both("asserts", t.s);

    t.n = 0;
    for (int i = 0; i < 6; i++) {
        char title[32];
        trep(&t, "-", 120);
        snprintf(title, sizeof(title), "\nSection %d\n", i + 1);
        tcat(&t, title);
        trep(&t, "=", 79);
        tcat(&t, "\n");
        trep(&t, "\xe2\x94\x80", 100); /* ─ */
        tcat(&t, "\n");
        trep(&t, "*", 70);
        tcat(&t, "\n");
    }
    assert_clean_both("rules", t.s);

    /* A diagram spaced with no-break spaces (U+00A0), as a page rendered to text has it
     * (valgrind's README.solaris): padding, as spaces are. */
    t.n = 0;
    for (int i = 0; i < 4; i++) {
        tcat(&t, "door client thread");
        trep(&t, "\xc2\xa0", 24);
        tcat(&t, "kernel");
        trep(&t, "\xc2\xa0", 30 + i);
        tcat(&t, "door server thread\n");
    }
    assert_clean_both("no-break space padding", t.s);

    t.n = 0;
    tcat(&t, "static const unsigned char table[64] = {\n");
    for (int i = 0; i < 4; i++)
        tcat(&t, "    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,\n");
    tcat(&t, "};\nstatic const uint8_t blob[] = {");
    trep(&t, "0x00, ", 24);
    tcat(&t, "};\n");
    assert_clean_both("zero arrays", t.s);

    t.n = 0;
    static const char *const items[] = {"alpha", "beta", "gamma", "delta", "epsilon",
                                        "zeta",  "eta",  "theta", "iota",  "kappa"};
    for (int i = 0; i < 30; i++) {
        char line[160];
        snprintf(line, sizeof(line), "%d. Add support for the %s option in the %s parser.\n", i + 1,
                 items[i % 10], items[(i * i / 3 + 3) % 10]);
        tcat(&t, line);
    }
    for (int i = 0; i < 20; i++) {
        char line[160];
        snprintf(line, sizeof(line), "- Step %d: install the %s package.\n", i + 1,
                 items[(i * 3) % 10]);
        tcat(&t, line);
    }
    assert_clean_both("shared-prefix lists", t.s);

    t.n = 0;
    for (int i = 0; i < 4; i++)
        tcat(&t, "+--------+--------+--------+\n|  cell  |  cell  |  cell  |\n");
    tcat(&t, "+--------+--------+--------+\n");
    for (int i = 0; i < 2; i++)
        tcat(&t, "  /\\_/\\    /\\_/\\    /\\_/\\    /\\_/\\    /\\_/\\\n"
                 " ( o.o )  ( o.o )  ( o.o )  ( o.o )  ( o.o )\n"
                 "  > ^ <    > ^ <    > ^ <    > ^ <    > ^ <\n");
    assert_clean_both("ASCII art", t.s);

    /* A drawing with a stretch of identical lines (a tower's wall, 10 rows): art lines
     * need 12 copies. */
    t.n = 0;
    tcat(&t, "Here is a tower:\n     /\\\n    /  \\\n");
    trep(&t, "   *    *\n", 10);
    tcat(&t, "   ******\n");
    assert_clean_both("tower with ten wall rows", t.s);

    /* A song: the chorus comes back after each verse, and sings its line three times. */
    t.n = 0;
    static const char *const verses[] = {
        "Morning light on the harbour wall\nGulls are calling, the tide is low\n"
        "Nets are mended, the boats are small\nOut past the breakwater we go\n",
        "Evening comes with a copper sky\nLanterns swinging along the quay\n"
        "Hands are weary, the hold is dry\nStill we are singing out to sea\n",
        "Winter storms on the northern shore\nRopes are frozen and sails are torn\n"
        "We will sail as we sailed before\nBack to the harbour where we were born\n"};
    for (int i = 0; i < 3; i++) {
        tcat(&t, "[Verse]\n");
        tcat(&t, verses[i]);
        tcat(&t, "\n[Chorus]\nHeave away, haul away home\nHeave away, haul away home\n"
                 "The sea is wide and the night is long\nHeave away, haul away home\n\n");
    }
    assert_clean_both("song with a chorus", t.s);

    /* A blank sudoku grid and a table padded with spaces. */
    t.n = 0;
    for (int r = 0; r < 9; r++) {
        if (r % 3 == 0) tcat(&t, "+-------+-------+-------+\n");
        tcat(&t, "|       |       |       |\n");
    }
    tcat(&t, "+-------+-------+-------+\n\n");
    tcat(&t, "| Name                 | Role                 | Since |\n");
    tcat(&t, "|----------------------|----------------------|-------|\n");
    static const char *const names[] = {"Ada", "Grace", "Edsger", "Barbara", "Ken", "Dennis"};
    for (int i = 0; i < 6; i++) {
        char row[128];
        snprintf(row, sizeof(row), "| %-20s | %-20s | %5d |\n", names[i], items[i], 1950 + 7 * i);
        tcat(&t, row);
    }
    assert_clean_both("sudoku grid and padded table", t.s);

    /* Tool arguments may ask for identical JSON elements. */
    t.n = 0;
    tcat(&t, "{\"cells\": [");
    trep(&t, "{\"x\": 0}, ", 60);
    tcat(&t, "{\"x\": 0}]}");
    assert_false(scan_text(LG_CH_TOOL_ARGS, t.s).tripped);

    t.n = 0;
    tcat(&t, "Wow!!! That is great!!!!!! Really?!?! Yes... hahahaha, ok.\n");
    tcat(&t, "The the the end. Zzzzzzz. Hmm, hmm, hmm.\n");
    assert_clean_both("emphasis", t.s);
    free(t.s);
}

/* ---- the loops real models make ----------------------------------------------------- */

/* Shapes of loops from public bug reports and degenerate answers, written here: `prefix`
 * then `unit` `times` times on `ch`. Each must trip no later than `max_after` bytes after
 * the unit's first copy (the loop's start), and not before that copy. */
static const struct loop_case {
    const char *what;
    lg_channel ch;
    const char *prefix, *unit;
    int times;
    size_t max_after;
} loop_cases[] = {
    {"reasoning Wait/boxed two-line cycle", LG_CH_REASONING, "Okay, let me solve it.\n",
     "Wait, maybe I should double-check: 2 + 3 = 5, so the answer is $\\boxed{5}$.\n"
     "So the final answer is $\\boxed{5}$.\n",
     40, 1500},
    {"reasoning Wait/json line pair", LG_CH_REASONING, "Let me build the call.\n",
     "Wait, the format should be:\njson{\"name\": \"get_weather\", \"arguments\": {\"city\": "
     "\"Paris\"}}\n",
     40, 1500},
    {"56 exclamation marks", LG_CH_CONTENT, "The answer is", "!", 56, 40},
    {"Thank you. five times", LG_CH_CONTENT, "I hope this helps.\n\n", "Thank you.\n\n", 5, 60},
    {"token run without spaces", LG_CH_CONTENT, "The group is known as ", "ISIS-", 300, 600},
    {"the, 29 times", LG_CH_CONTENT, "Here are the words: ", "the, ", 29, 120},
    {"code block seven times", LG_CH_CONTENT, "```swift\n",
     "func greet(name: String) -> String {\n    let greeting = \"Hello, \" + name + \"!\"\n"
     "    return greeting\n}\nprint(greet(name: \"World\"))\n",
     7, 600},
    {"DNA", LG_CH_CONTENT, "sequence = \"", "ATCG", 1000, 600},
    {"9r+: six hundred times", LG_CH_CONTENT, "Output: ", "9r+:", 600, 600},
    {"(1/2) * for kilobytes", LG_CH_CONTENT, "The product is ", "(1/2) * ", 400, 400},
    {"1..9 cycling", LG_CH_CONTENT, "Counting: ", "1, 2, 3, 4, 5, 6, 7, 8, 9, ", 60, 400},
    {"rotating valedictions", LG_CH_CONTENT, "Some closings:\n\n",
     "Affectionately,\n\nRespectfully,\n\nLoyally,\n\n", 20, 200},
    {"markdown fence line 82 times", LG_CH_CONTENT, "Here is the code:\n", "```\n", 82, 300},
    {"three-line ingredient cycle", LG_CH_CONTENT, "Ingredients:\n",
     "- 1 cup of flour\n- 2 eggs\n- 1/2 cup of sugar\n", 40, 200},
    {"ASCII face 203 times", LG_CH_CONTENT, "Here is a face:\n", "( '.' )\n", 203, 300},
    {"an art line of underscores", LG_CH_CONTENT, "Here is a box:\n", "  ______\n", 30, 150},
    {"an art line of dots and dashes", LG_CH_CONTENT, "Pattern:\n", ".-.-..-.-.\n", 25, 150},
    {"numbered list of one item", LG_CH_CONTENT, "Rhymes:\n", "1. instruct\n", 20, 200},
};

static void test_loop_shapes(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(loop_cases) / sizeof(loop_cases[0]); i++) {
        const struct loop_case *c = &loop_cases[i];
        text t = {0};
        tcat(&t, c->prefix);
        trep(&t, c->unit, c->times);
        result r = scan_text(c->ch, t.s);
        size_t first_copy = strlen(c->prefix) + strlen(c->unit);
        if (!r.tripped) fail_msg("%s: did not trip", c->what);
        if (r.at_byte < first_copy) fail_msg("%s: tripped before the loop", c->what);
        if (r.at_byte - first_copy > c->max_after)
            fail_msg("%s: tripped %zu bytes into the loop, more than %zu", c->what,
                     (size_t)(r.at_byte - first_copy), c->max_after);
        free(t.s);
    }
}

/* ---- prompt-aware slack -------------------------------------------------------------- */

static result scan_prompted(lg_channel ch, const char *prompt, const char *s)
{
    guard_params *p = guard_params_new(ch);
    guard *g = guard_new(p, ch);
    guard_set_prompt(g, prompt, strlen(prompt));
    guard_feed(g, s, strlen(s));
    guard_finish(g);
    result r = snapshot(g);
    guard_free(g);
    guard_params_free(p);
    return r;
}

/* Repetition the prompt asks for or holds passes up to what the prompt holds; the same
 * text without a prompt, or beyond the asked count, trips. */
static void test_prompt_slack(void **state)
{
    (void)state;
    text t = {0};

    /* asked for: "repeat … 50 times" */
    trep(&t, "I will not talk in class.\n", 50);
    assert_true(scan_text(LG_CH_CONTENT, t.s).tripped);
    assert_false(
        scan_prompted(LG_CH_CONTENT, "Write 'I will not talk in class.' 50 times.", t.s).tripped);
    trep(&t, "I will not talk in class.\n", 30); /* 80: past what was asked */
    assert_true(
        scan_prompted(LG_CH_CONTENT, "Write 'I will not talk in class.' 50 times.", t.s).tripped);

    /* asked for: a 40x10 grid of zeros (a 10x10 one passes anyway: a blank grid) */
    t.n = 0;
    trep(&t, "0 0 0 0 0 0 0 0 0 0\n", 10);
    assert_false(scan_text(LG_CH_CONTENT, t.s).tripped);
    trep(&t, "0 0 0 0 0 0 0 0 0 0\n", 30);
    assert_true(scan_text(LG_CH_CONTENT, t.s).tripped);
    assert_false(scan_prompted(LG_CH_CONTENT, "Print a 40x10 grid of zeros.", t.s).tripped);
    assert_false(scan_prompted(LG_CH_CONTENT, "Print forty by ten zeros", t.s).tripped);

    /* asked for: 80 rows of a table; a list of a hundred None */
    t.n = 0;
    tcat(&t, "| option | enabled | default |\n| --- | --- | --- |\n");
    trep(&t, "| yes | no | yes |\n", 80);
    assert_true(scan_text(LG_CH_CONTENT, t.s).tripped);
    assert_false(
        scan_prompted(LG_CH_CONTENT, "Make a table with 80 rows of yes/no/yes.", t.s).tripped);
    t.n = 0;
    tcat(&t, "values = [\n");
    trep(&t, "    None,\n", 100);
    tcat(&t, "]\n");
    assert_true(scan_text(LG_CH_CONTENT, t.s).tripped);
    assert_false(
        scan_prompted(LG_CH_CONTENT, "A Python list of 100 None, one per line", t.s).tripped);

    /* held: the prompt's own table, reformatted */
    t.n = 0;
    text pr = {0};
    tcat(&pr, "Turn this into a Markdown table:\n");
    trep(&pr, "cell,cell,cell\n", 40);
    trep(&t, "| cell | cell | cell |\n", 40);
    assert_true(scan_text(LG_CH_CONTENT, t.s).tripped);
    pr.n = 0;
    tcat(&pr, "Reformat, keep the rows:\n");
    trep(&pr, "| cell | cell | cell |\n", 40);
    assert_false(scan_prompted(LG_CH_CONTENT, pr.s, t.s).tripped);

    /* held: the prompt's product, recommended again in several sizes, then a closing
     * sentence of the answer's own (novelty asks about the trigrams of the whole line, its
     * numbers aside, and judges what follows the copy afresh) */
    static const char product[] =
        "Zeroll Zerolon Hardcoat Anodized Commercial Ice Cream Scoop with Unique Liquid Filled "
        "Heat Conductive Handle Easy Release Made in USA";
    static const char *const sizes[] = {"1.5", "2.5", "2.0", "2.25", "5.0",  "4.25", "3.5",
                                        "4.5", "3.0", "2.0", "1.5",  "2.25", "5.0",  "4.25",
                                        "3.5", "4.5", "3.0", "2.0",  "1.5",  "2.25"};
    pr.n = 0;
    tcat(&pr, "What other Amazon products might interest someone who visited the given "
              "product?\n\n");
    tcat(&pr, product);
    tcat(&pr, ", 1.5-Ounce, Black");
    t.n = 0;
    tcat(&t, "You may be interested in the following products based on your purchase "
             "history:\n\n");
    for (int i = 0; i < 20; i++) {
        char num[16];
        snprintf(num, sizeof(num), "%d. ", i + 1);
        tcat(&t, num);
        tcat(&t, product);
        tcat(&t, ", ");
        tcat(&t, sizes[i]);
        tcat(&t, "-Ounce, Black\n");
    }
    tcat(&t, "I hope this list of suggestions will be helpful and that you will find something "
             "that interests you.\n");
    result r = scan_text(LG_CH_CONTENT, t.s);
    assert_true(r.tripped);
    assert_string_equal(r.detector, "novelty");
    assert_false(scan_prompted(LG_CH_CONTENT, pr.s, t.s).tripped);

    /* A prompt that asks for nothing gives nothing: the seed loop still trips. */
    t.n = 0;
    tcat(&t, "You can use the ");
    trep(&t, "lambda ", 200);
    assert_true(
        scan_prompted(LG_CH_CONTENT, "How do I sort a list in Python? Give 3 ways.", t.s).tripped);

    /* A request object: messages' text is the prompt. */
    cJSON *req = cJSON_Parse("{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":"
                             "\"Be brief.\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                             "\"text\":\"Repeat 'ok' 100 times\"}]}]}");
    guard_params *p = guard_params_new(LG_CH_CONTENT);
    guard *g = guard_new(p, LG_CH_CONTENT);
    guard_set_prompt_json(g, req);
    t.n = 0;
    trep(&t, "ok ", 100);
    assert_false(guard_feed(g, t.s, t.n));
    guard_free(g);
    guard_params_free(p);
    cJSON_Delete(req);
    free(pr.s);
    free(t.s);
}

/* ---- other loops are caught, fences raise thresholds rather than disabling -------- */

static void assert_trips(const char *what, lg_channel ch, const char *s, const char *detector)
{
    result r = scan_text(ch, s);
    if (!r.tripped) fail_msg("%s did not trip", what);
    if (detector && strcmp(r.detector, detector))
        fail_msg("%s tripped %s, expected %s", what, r.detector, detector);
}

/* prefix + unit x times must trip `detector` (any detector when NULL). */
static void assert_loop(const char *what, lg_channel ch, const char *prefix, const char *unit,
                        int times, const char *detector)
{
    text t = {0};
    tcat(&t, prefix);
    trep(&t, unit, times);
    assert_trips(what, ch, t.s, detector);
    free(t.s);
}

/* The verdict on `s` is the same fed whole and in random chunks of 1-8 and 1-64 bytes. */
static void assert_chunking_invariant(const char *s)
{
    guard_params *p = guard_params_new(LG_CH_CONTENT);
    size_t n = strlen(s);
    result whole = run_whole(p, LG_CH_CONTENT, s, n, true);
    for (unsigned maxchunk = 8; maxchunk <= 64; maxchunk *= 8) {
        result split = run_split(p, LG_CH_CONTENT, s, n, maxchunk, true);
        assert_same(&whole, &split);
    }
    guard_params_free(p);
}

/* ---- counting ------------------------------------------------------------------------ */

/* Numbers from `from`, `step` apart, `n` of them, each written `head` number `tail`, a
 * newline after every `per_line`; with `prompt` when not NULL. */
static const struct count_case {
    const char *what;
    const char *head, *tail;
    int from, step, n, per_line;
    const char *prompt;
    bool loop;
} count_cases[] = {
    {"columns counted to the limit", "field", ", ", 1, 1, 80, 0, NULL, true},
    {"a numbered grid that keeps going", "", ". ", 11, 1, 200, 8, NULL, true},
    {"a count the prompt asks for", "", " ", 1, 1, 100, 0, "Count from 1 to 100, please.", false},
    {"twenty numbers", "item", ", ", 1, 1, 20, 0, NULL, false},
    {"even numbers only far apart", "", ", ", 0, 10, 60, 0, NULL, false},
};

static void count_text(text *t, const struct count_case *c)
{
    tcat(t, "Here it is:\n");
    for (int i = 0; i < c->n; i++) {
        char num[16];
        snprintf(num, sizeof(num), "%d", c->from + i * c->step);
        tcat(t, c->head);
        tcat(t, num);
        tcat(t, c->tail);
        if (c->per_line && i % c->per_line == c->per_line - 1) tcat(t, "\n");
    }
}

static void test_count(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(count_cases) / sizeof(count_cases[0]); i++) {
        const struct count_case *c = &count_cases[i];
        text t = {0};
        count_text(&t, c);
        result r = c->prompt ? scan_prompted(LG_CH_CONTENT, c->prompt, t.s)
                             : scan_text(LG_CH_CONTENT, t.s);
        if (c->loop && (!r.tripped || strcmp(r.detector, "count")))
            fail_msg("%s: expected a count trip, got %s", c->what, r.tripped ? r.detector : "none");
        if (!c->loop && r.tripped) fail_msg("%s tripped %s", c->what, r.detector);
        assert_chunking_invariant(t.s);
        result ta = scan_text(LG_CH_TOOL_ARGS, t.s); /* counting is off in tool arguments */
        if (ta.tripped && !strcmp(ta.detector, "count"))
            fail_msg("%s: count in tool_args", c->what);
        free(t.s);
    }
    /* A numbered list counts too, but its items differ: no count. */
    text t = {0};
    static const char *const items[] = {"apples", "pears", "plums", "figs", "dates", "limes"};
    for (int i = 0; i < 60; i++) {
        char line[96];
        snprintf(line, sizeof(line), "%d. Buy %s for the market stall number %s\n", i + 1,
                 items[i % 6], items[(i / 6) % 6]);
        tcat(&t, line);
    }
    result r = scan_text(LG_CH_CONTENT, t.s);
    if (r.tripped && !strcmp(r.detector, "count")) fail_msg("numbered list tripped count");
    free(t.s);
}

/* ---- blocks of lines and art textures ------------------------------------------------ */

/* Expects `s` to trip `detector` within `max_after` bytes past `loop_at` (the start of the
 * loop's second copy), or not to trip at all (detector NULL); tool arguments never trip the
 * line detectors, and the verdict does not depend on chunking. */
static void expect_shape(const char *what, const char *s, const char *detector, size_t loop_at,
                         size_t max_after)
{
    result r = scan_text(LG_CH_CONTENT, s);
    if (!detector) {
        if (r.tripped) fail_msg("%s tripped %s: '%s'", what, r.detector, r.unit);
    } else {
        if (!r.tripped) fail_msg("%s: did not trip", what);
        if (strcmp(r.detector, detector))
            fail_msg("%s: tripped %s, expected %s", what, r.detector, detector);
        if (r.at_byte < loop_at || r.at_byte - loop_at > max_after)
            fail_msg("%s: tripped at %zu, loop at %zu", what, (size_t)r.at_byte, loop_at);
    }
    result ta = scan_text(LG_CH_TOOL_ARGS, s);
    if (ta.tripped && (!strcmp(ta.detector, "block") || !strcmp(ta.detector, "art")))
        fail_msg("%s: %s in tool_args", what, ta.detector);
    assert_chunking_invariant(s);
}

static void test_blocks(void **state)
{
    (void)state;
    text t = {0};
    char line[160];
    size_t at = 0;

    /* A drawing block re-emitted with its offset counting up. */
    tcat(&t, "Here are the panels:\n\n");
    for (int i = 0; i < 12; i++) {
        if (i == 1) at = t.n;
        snprintf(line, sizeof(line), "\\panel[offset=%dmm]{\n  \\frame (0,0) to (6,6);\n", 7 * i);
        tcat(&t, line);
        tcat(&t, "  \\shade (0,0) box (6,6);\n}\n\n");
    }
    expect_shape("panel block with a counter", t.s, "block", at, 600);

    /* Two items alternating, one of them with a year that keeps changing. */
    t.n = 0;
    tcat(&t, "Classic trains of the screen:\n1. The Iron Road (1931)\n2. Night Mail (1936)\n");
    for (int i = 3; i < 24; i++) {
        if (i == 5) at = t.n;
        if (i % 2)
            snprintf(line, sizeof(line), "%d. The Silver Coach (%d)\n", i, 1930 + i % 7);
        else
            snprintf(line, sizeof(line), "%d. The Last Station (1938)\n", i);
        tcat(&t, line);
    }
    expect_shape("two items alternating", t.s, "block", at, 400);

    /* A question and its answer asked again, both lines counting up together. */
    t.n = 0;
    tcat(&t, "A short quiz:\n\n");
    for (int i = 1; i < 16; i++) {
        if (i == 2) at = t.n;
        snprintf(line, sizeof(line),
                 "Question %d: which planet is the red one?\nAnswer %d: Mars.\n\n", i, i);
        tcat(&t, line);
    }
    expect_shape("a question and answer counting up", t.s, "block", at, 400);

    /* A proof block re-emitted under names recombined from the earlier ones. */
    t.n = 0;
    static const char *const names[] = {
        "merge_ok",           "merge_ok_sorted",          "merge_ok_sorted_total",
        "merge_ok_total",     "merge_ok_total_sorted",    "merge_ok_total_sorted_ok",
        "merge_ok_sorted_ok", "merge_ok_sorted_ok_total", "merge_ok_ok",
        "merge_ok_ok_sorted"};
    tcat(&t, "Here is the proof:\n\n");
    for (int i = 0; i < 10; i++) {
        if (i == 1) at = t.n;
        snprintf(line, sizeof(line), "theorem %s (xs: list) {\n", names[i]);
        tcat(&t, line);
        tcat(&t, "  sorted (merge xs) = merge xs\n  length (merge xs) = length xs\n}\n\n");
    }
    expect_shape("a block under recombined names", t.s, "block", at, 900);

    /* Two rows of numbers cycling inside a fence. */
    t.n = 0;
    tcat(&t, "```\n4 8 15 16 23 42 4 8 15 16 23 42 4 8 15 16 23 42\n");
    at = t.n;
    trep(&t, "9 7 5 3 1 2 4 6 8 10 12 14 16 18 20 22 24\n3 1 4 1 5 9 2 6 5 3 5 8 9 7 9 3 2 3 8\n",
         8);
    tcat(&t, "```\n");
    expect_shape("a digit cycle in a fence", t.s, "repeat", at, 600);

    /* A drawing that keeps growing rows of one dotted pattern. */
    t.n = 0;
    tcat(&t, "A field at night:\n```\n");
    for (int i = 0; i < 40; i++) {
        if (i == 1) at = t.n;
        for (int k = 0; k < 3 + (i * 7) % 5 + i / 6; k++)
            tcat(&t, k % 2 ? ".::" : ".::..");
        tcat(&t, "\n");
    }
    tcat(&t, "```\n");
    expect_shape("rows of one texture", t.s, "art", at, 900);

    /* Look-alikes. A short tune written out four times (a song's repeats). */
    t.n = 0;
    tcat(&t, "X:1\nT:Morning\nK:D\n");
    trep(&t, "A2 | d2 fd A2 | B2 cB A2 | d2 fd A2 |\nB2 cB A2 | G2 FE D2 | E4 z2 |\n", 4);
    expect_shape("a tune four times", t.s, NULL, 0, 0);

    /* One calculation per month: the same skeleton, new numbers on every line. */
    t.n = 0;
    double saved = 0, price = 9000;
    for (int m = 1; m <= 14; m++) {
        saved += 750;
        price *= 0.98;
        snprintf(line, sizeof(line), "Month %d:\n- saved = %.0f, price = %.0f\n- gap = %.0f\n", m,
                 saved, price, price - saved);
        tcat(&t, line);
    }
    expect_shape("a monthly calculation", t.s, NULL, 0, 0);

    /* Declarations of one function per variant, the variant a number inside the name, and
     * stubs with a new name each: code declares them on purpose. */
    t.n = 0;
    static const char *const bits[] = {"1", "224", "256", "384", "512", "3_256", "3_512"};
    for (int i = 0; i < 7; i++) {
        snprintf(line, sizeof(line), "int\nkdf_hmac_sha%s (size_t len, const uint8_t *key,\n",
                 bits[i]);
        tcat(&t, line);
        tcat(&t, "\t\tsize_t rounds, uint8_t *out);\n\n");
    }
    static const char *const ops[] = {"CatchPad",  "CleanupPad", "Resume", "Fence",
                                      "AtomicRMW", "VAArg",      "Freeze", "Landing"};
    for (int i = 0; i < 8; i++) {
        snprintf(line, sizeof(line), "  bool lower%s(const Op &op, Builder &b) {\n", ops[i]);
        tcat(&t, line);
        tcat(&t, "    return false;\n  }\n");
    }
    expect_shape("declarations per variant", t.s, NULL, 0, 0);

    /* A pyramid of twenty rows. */
    t.n = 0;
    for (int i = 0; i < 20; i++) {
        for (int k = 0; k < 20 - i; k++)
            tcat(&t, " ");
        for (int k = 0; k < 2 * i + 1; k++)
            tcat(&t, "*");
        tcat(&t, "\n");
    }
    expect_shape("a pyramid", t.s, NULL, 0, 0);
    free(t.s);
}

/* A count in a product name ("18 Color") asks for no copies of a row that mentions it;
 * numbered one-word items. */
static void test_prompt_count_word(void **state)
{
    (void)state;
    text t = {0};
    tcat(&t, "| Item | Similar |\n| --- | --- |\n");
    trep(&t, "| Brand Fineliner Pens for Journaling and Drawing, 18 Color | |\n", 16);
    result r = scan_prompted(LG_CH_CONTENT,
                             "Compare this item with similar products in a table.\nItem: Brand "
                             "Fineliner Pens for Journaling and Drawing, 18 Color",
                             t.s);
    assert_true(r.tripped);
    /* An answer key repeats one word per numbered item; one numbered word in a row is a loop. */
    t.n = 0;
    tcat(&t, "Answers:\n\n");
    for (int i = 1; i <= 16; i++) {
        char item[48];
        snprintf(item, sizeof(item), "%d. %s\n\n\n", i, (i * 7) % 5 < 3 ? "True" : "False");
        tcat(&t, item);
    }
    assert_false(scan_text(LG_CH_CONTENT, t.s).tripped);
    t.n = 0;
    tcat(&t, "Rhymes:\n\n");
    for (int i = 1; i <= 8; i++) {
        char item[48];
        snprintf(item, sizeof(item), "%d. conduct\n", i);
        tcat(&t, item);
    }
    assert_true(scan_text(LG_CH_CONTENT, t.s).tripped);
    /* "a list of 30 None" still allows 30 of them. */
    t.n = 0;
    trep(&t, "None, ", 30);
    assert_false(scan_prompted(LG_CH_CONTENT, "Give me a list of 30 None", t.s).tripped);
    free(t.s);
}

/* ---- templated lines ------------------------------------------------------------------ */

/* Lines `head` slot `tail`, `times` lines after a short opening. The slot counts up from 1
 * when the first slot is a digit; otherwise it is slots[i % 8], followed from the ninth line
 * on by slots[i / 8 % 8], so that no two lines are equal (verbatim returns are the other
 * detectors'). Loops must trip the template detector; look-alikes must not trip at all. */
static const struct template_case {
    const char *what;
    const char *head, *tail;
    const char *slots[8];
    int times;
    bool loop;
} template_cases[] = {
    {"topic list past its end",
     "- Machine learning applied to robotics for ",
     "\n",
     {"farming", "mining", "shipping", "banking", "retail", "schools", "hospitals", "ports"},
     40,
     true},
    {"the same template for sixteen items",
     "- Machine learning applied to robotics for ",
     "\n",
     {"farming", "mining", "shipping", "banking", "retail", "schools", "hospitals", "ports"},
     16,
     false},
    {"a short recipe list",
     "* 2 tablespoons of chopped ",
     "\n",
     {"basil", "mint", "dill", "chives", "sage", "thyme", "parsley", "oregano"},
     12,
     false},
    {"numbered data in the slot",
     "The value of the counter after step ",
     " is checked again.\n",
     {"11", "12", "13", "14", "15", "16", "17", "18"},
     40,
     false},
    {"code lines on one template",
     "    config_",
     " = load_setting(\"default\")\n",
     {"alpha", "beta", "gamma", "delta", "eta", "theta", "iota", "kappa"},
     40,
     false},
    {"a shared opening, most of the line new",
     "- The committee reviewed ",
     "\n",
     {"the budget for the new harbour wall and its repairs",
      "complaints about noise from the night ferry service",
      "a proposal to plant oaks along the river promenade",
      "how the school buses could avoid the market square",
      "whether the old cinema should become a library",
      "plans for a cycling lane between the two bridges",
      "the cost of heating the swimming pool in winter",
      "letters from farmers worried about the drought"},
     20,
     false},
};

static void template_text(text *t, const struct template_case *c)
{
    tcat(t, "Here is the list you asked for:\n\n");
    for (int i = 0; i < c->times; i++) {
        char num[16];
        snprintf(num, sizeof(num), "%d", i + 1);
        tcat(t, c->head);
        bool numbered = c->slots[0][0] >= '0' && c->slots[0][0] <= '9';
        tcat(t, numbered ? num : c->slots[i % 8]);
        if (!numbered && i >= 8) {
            tcat(t, " ");
            tcat(t, c->slots[i / 8 % 8]);
        }
        tcat(t, c->tail);
    }
}

static void test_template(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(template_cases) / sizeof(template_cases[0]); i++) {
        const struct template_case *c = &template_cases[i];
        text t = {0};
        template_text(&t, c);
        assert_chunking_invariant(t.s);
        if (c->loop)
            assert_trips(c->what, LG_CH_CONTENT, t.s, "template");
        else
            assert_clean_both(c->what, t.s);
        free(t.s);
    }
    /* The same loop passes when the prompt asks for that many lines, and never trips in
     * tool arguments (JSON arrays of objects are templated by design). */
    text t = {0};
    template_text(&t, &template_cases[0]);
    assert_false(scan_prompted(LG_CH_CONTENT, "Write 60 lines about robots at work.", t.s).tripped);
    assert_false(scan_text(LG_CH_TOOL_ARGS, t.s).tripped);
    free(t.s);
}

/* Token slots: one word in a frame of 16 bytes or more changes from line to line (period
 * 1 to 3), and the word is old: a name grown from pieces already written, a word the
 * answer used before the copy, one letter counting through the alphabet. A list of new
 * names, code or text, is a program or a changelog, and passes. */
static void test_template_slots(void **state)
{
    (void)state;
    static const char *adj[8] = {"gentle", "stormy", "freezing", "heavy",
                                 "sudden", "silent", "bitter",   "golden"};
    text t = {0};
    char line[256];
    /* A style name that keeps growing by a piece it already has. */
    tcat(&t, "Add these to the preamble:\n\n");
    for (int i = 0; i < 18; i++) {
        char name[96] = "toc";
        for (int k = 0; k <= i; k++)
            strcat(name, "in");
        strcat(name, "part");
        snprintf(line, sizeof(line), "\\setcounterstyle{\\%s}{}\n", name);
        tcat(&t, line);
    }
    assert_chunking_invariant(t.s);
    assert_trips("a name growing by its own pieces", LG_CH_CONTENT, t.s, "template");
    /* Pairs of questions on one adjective, the adjectives cycled again in a new order each
     * round (period 2; a round in the same order would be a cycle of lines). */
    t.n = 0;
    tcat(&t, "Questions to start a talk about the rain:\n\n");
    for (int i = 0; i < 32; i++) {
        const char *a = adj[(i % 8 * (2 * (i / 8) + 1) + i / 8) % 8];
        snprintf(line, sizeof(line), "%d. \"Which is the most %s kind of rain?\"\n", 2 * i + 1, a);
        tcat(&t, line);
        snprintf(line, sizeof(line), "%d. \"Should the city plan ahead for %s rain?\"\n", 2 * i + 2,
                 a);
        tcat(&t, line);
    }
    assert_trips("question pairs cycling their adjectives", LG_CH_CONTENT, t.s, "template");
    /* A package name growing by a word per line, every third word one it already has:
     * fewer than template_run old slots, but a third of a run of 33 lines. */
    static const char *fresh[34] = {"moss", "fern", "reed", "oak",  "elm",  "yew",  "ash",
                                    "fir",  "ivy",  "bay",  "box",  "gum",  "fig",  "lime",
                                    "pear", "plum", "rue",  "rye",  "oat",  "pea",  "bean",
                                    "kale", "leek", "mint", "sage", "dill", "balm", "flax",
                                    "hemp", "jute", "reel", "cork", "teak", "palm"};
    t.n = 0;
    tcat(&t, "Install the type packages:\n\n");
    char pkg[200] = "kit";
    for (int i = 0; i < 34; i++) {
        strcat(pkg, "-");
        strcat(pkg, i % 3 == 2 ? "kit" : fresh[i]);
        snprintf(line, sizeof(line), "yarn add -D @t/%s@next\n", pkg);
        tcat(&t, line);
    }
    assert_trips("a name growing, a third of its words old", LG_CH_CONTENT, t.s, "template");
    /* A cycle of two lines, one near fixed (one character changes now and then), the other
     * recycling ordinal words section after section. */
    static const char *nth[8] = {"First", "Second", "Third",   "Fourth",
                                 "Fifth", "Sixth",  "Seventh", "Eighth"};
    static const char *piece[5] = {"rooks", "knights", "bishops", "queens", "kings"};
    t.n = 0;
    tcat(&t, "\\begin{board}\n");
    for (int i = 0; i < 40; i++) {
        snprintf(line, sizeof(line),
                 "%% %s layout of %s\n[rnbqkbnr/pppppppp/8/8/PPPPPPPP/RNBQKBNR %c]\n", nth[i % 8],
                 piece[i / 8], i % 3 ? 'b' : 'w');
        tcat(&t, line);
        if (i % 8 == 7) tcat(&t, "\n");
    }
    assert_trips("an ordinal cycle beside a near-fixed line", LG_CH_CONTENT, t.s, "template");
    /* One letter counting through the alphabet in a line of code. */
    t.n = 0;
    tcat(&t, "symbols = {\n");
    for (int i = 0; i < 52; i++) {
        snprintf(line, sizeof(line), "    glyph_table.code('%c'): '#',\n",
                 i < 26 ? 'A' + i : 'a' + i - 26);
        tcat(&t, line);
    }
    assert_trips("a letter counting in a code line", LG_CH_CONTENT, t.s, "template");
    /* Look-alikes: includes of new headers, and a changelog moving new files (period 2). */
    static const char *mod[32] = {
        "alpha",  "beacon", "cinder",  "delta",   "ember",  "falcon", "garnet", "harbor",
        "indigo", "jasper", "kestrel", "lumen",   "marble", "nectar", "onyx",   "pepper",
        "quartz", "raven",  "saffron", "tundra",  "umber",  "velvet", "willow", "xenon",
        "yarrow", "zephyr", "acorn",   "bramble", "cobalt", "dune",   "fennel", "gossamer"};
    t.n = 0;
    for (int i = 0; i < 40; i++) {
        snprintf(line, sizeof(line), "#include \"workshop/plugins/%s%s_hook.h\"\n", mod[i % 32],
                 i < 32 ? "" : "_extra");
        tcat(&t, line);
    }
    assert_clean_both("includes of new headers", t.s);
    t.n = 0;
    tcat(&t, "2024-03-01  A. Maintainer\n\n");
    for (int i = 0; i < 32; i++) {
        snprintf(line, sizeof(line), "\t* %s.c: Moved to...\n\t* %s.cc: ...here.\n", mod[i],
                 mod[i]);
        tcat(&t, line);
    }
    assert_clean_both("a changelog moving new files", t.s);
    /* One line of names recombining the pieces the line already has, and one naming a new
     * thing with each. */
    t.n = 0;
    tcat(&t, "Matching names: ");
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < 12; i++) {
            const char *store = round ? "_STORE" : "";
            snprintf(line, sizeof(line), "MODE_ON_%s%s, MODE_ON_%s%s_WITH_CACHE, ", mod[i], store,
                     mod[i], store);
            tcat(&t, line);
        }
    assert_chunking_invariant(t.s);
    assert_trips("names recombining their pieces", LG_CH_CONTENT, t.s, "template");
    t.n = 0;
    tcat(&t, "enum widget_align { ");
    for (int i = 0; i < 32; i++) {
        snprintf(line, sizeof(line), "WIDGET_ALIGN_%s, ", mod[i]);
        tcat(&t, line);
    }
    tcat(&t, "};\n");
    assert_clean_both("constants naming new things", t.s);
    /* A format spec on one text template, every other line a free one, forty times; and a
     * list of questions on one template, each with its answer, twenty times (passes; were
     * the towns named in earlier answers, their slots would be old and 17 would trip). */
    t.n = 0;
    tcat(&t, "Formats I may need:\n\n");
    for (int i = 0; i < 40; i++) {
        snprintf(line, sizeof(line),
                 "When the remote archive service asks me for the %s %s settings:\n"
                 "<%s/%s>: {the %s part}\n\n",
                 mod[i % 32], mod[(i + 7) % 32], mod[i % 32], mod[(i * 5) % 32], mod[(i + 3) % 32]);
        tcat(&t, line);
    }
    assert_trips("a format spec on one template, a free line between", LG_CH_CONTENT, t.s,
                 "template");
    t.n = 0;
    for (int i = 0; i < 20; i++) {
        snprintf(line, sizeof(line),
                 "Which river runs through the old town of %s Hollow?\nThe %s, since %s.\n", mod[i],
                 fresh[i], fresh[(i + 4) % 34]);
        tcat(&t, line);
    }
    assert_clean_both("twenty questions on one template, each answered", t.s);
    /* Flash cards: a new term on one template, a fixed line between. */
    t.n = 0;
    for (int i = 0; i < 40; i++) {
        snprintf(line, sizeof(line), "Card for the term: %s%s\nDefinition: to be written.\n",
                 mod[i % 32], i < 32 ? "" : "wood");
        tcat(&t, line);
    }
    assert_clean_both("flash cards of new terms", t.s);
    free(t.s);
}

static void test_loops(void **state)
{
    (void)state;
    text t = {0};
    assert_loop("!!!!", LG_CH_CONTENT, "Sure!", "!", 200, "repeat");
    assert_loop("?!", LG_CH_CONTENT, "", "?!", 200, "repeat");
    assert_loop("。。。", LG_CH_REASONING, "好的", "\xe3\x80\x82", 200, "repeat");
    assert_loop("newlines", LG_CH_CONTENT, "", "\n", 5000, "repeat");
    assert_loop("no-break spaces", LG_CH_CONTENT, "Sure:", "\xc2\xa0", 3000, "repeat");
    assert_loop("lambda in a fence", LG_CH_CONTENT, "```python\n", "lambda ", 300, "repeat");
    assert_loop("code line in a fence", LG_CH_CONTENT, "```python\n", "    print(x)\n", 800,
                "repeat");

    /* Fences raise the bar: the same lines trip later inside one. */
    t.n = 0;
    trep(&t, "    print(x)\n", 800);
    result bare = scan_text(LG_CH_CONTENT, t.s);
    t.n = 0;
    tcat(&t, "```\n");
    trep(&t, "    print(x)\n", 800);
    result fenced = scan_text(LG_CH_CONTENT, t.s);
    assert_true(bare.tripped && fenced.tripped);
    assert_true(fenced.at_byte - 4 > bare.at_byte);

    /* A sentence coming back with other returning sentences between: lines. */
    t.n = 0;
    static const char *const s3[] = {"The user wants the sum of two and two.",
                                     "Let me compute it step by step.",
                                     "I should double check the arithmetic here."};
    tcat(&t, "Okay. ");
    for (int i = 0; i < 30; i++) {
        tcat(&t, s3[(i * 7 + i / 3) % 3]);
        tcat(&t, " ");
    }
    assert_trips("rotating sentences", LG_CH_REASONING, t.s, NULL);
    free(t.s);
}

/* ---- prose-like loops: sentence cycles and paraphrase --------------------------------- */

/* Appends `fmt` with each '#' replaced by n. */
static void tnum(text *t, const char *fmt, int n)
{
    char num[16];
    snprintf(num, sizeof(num), "%d", n);
    for (const char *c = fmt; *c; c++)
        if (*c == '#')
            tcat(t, num);
        else
            tput(t, c, 1);
}

/* `prefix`, then the sentences of `cycle` said `rounds` times, '#' counting the rounds (so a
 * loop whose only change is a step or chapter number). A loop (`detector` set) must trip no
 * later than `max_after` bytes after the first round ends; the rest must stay clean on every
 * channel. */
static const struct prose_case {
    const char *what;
    lg_channel ch;
    const char *prefix;
    const char *cycle[5];
    int rounds;
    const char *detector;
    size_t max_after;
} prose_cases[] = {
    {"reasoning Wait/Alternatively/Let me cycle with a step number",
     LG_CH_REASONING,
     "Okay, the question asks how many pairs five cards make.\n\n",
     {"Step #: wait, let me count the pairs again. ",
      "Alternatively, I could write out every pair and count them one at a time. ",
      "Let me check the formula once more: five times four, over two, gives ten.\n",
      "$\\boxed{10}$\n\n"},
     30,
     "cycle",
     700},
    {"reasoning sentences around a JSON fragment",
     LG_CH_REASONING,
     "The user wants the weather in Paris, so I need the tool.\n",
     {"Attempt #. Wait, I have to give the call in the exact format the tool expects.\n",
      "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n",
      "Let me make sure the city name is spelled out in full before I send it.\n"},
     30,
     "cycle",
     700},
    {"chapters that come round with new numbers",
     LG_CH_CONTENT,
     "Here is the story.\n\n",
     {"Chapter #\n\n", "The heroes met at the old lighthouse at dawn to plan the rescue.\n\n",
      "Their leader spread a map on the table and pointed at the harbour.\n\n",
      "By nightfall the thieves were caught and the city was safe again.\n\n"},
     12,
     "cycle",
     700},
    {"a counter stepping through two sentences",
     LG_CH_CONTENT,
     "Here is the procedure:\n\n",
     {"#. Check whether n is equal to #. ", "If it is, return false.\n"},
     27,
     NULL,
     0},
};

/* A song: three verses, a chorus after each and the chorus once more to close. */
static const char *const song_verses[] = {
    "I walked along the river when the morning light was new\nThe boats were leaving harbour "
    "and the sky was turning blue\n",
    "The market filled with voices and the bakers sang along\nI carried every rumour like the "
    "chorus of a song\n",
    "And when the evening gathered all the lanterns on the quay\nI found the road was turning "
    "and it turned me back to sea\n",
};
static const char *const song_chorus =
    "\nSo sing it loud, sing it slow\nEvery tide will come and go\nHold the rope and "
    "mind the line\nThe river keeps its time\n\n";

/* Thirty tiny stories, of which the storyteller retells ten (4-13 again as 20-29). */
static const char *const tiny_stories[] = {
    "The clock stopped. She smiled anyway.",
    "A letter arrived, forty years too late.",
    "He planted a seed and waited for spring.",
    "The last lamp went out. Stars took over.",
    "Two strangers shared an umbrella and a lifetime.",
    "The robot learned to hum off key.",
    "Snow fell on the empty stadium all night.",
    "She found her name carved in the oak.",
    "The ferry left without its only passenger.",
    "A kite escaped and crossed the border.",
    "The baker burned the bread and invented toast.",
    "Grandfather's radio finally caught "
    "the signal.",
    "The cat returned with a stranger's key.",
    "Rain wrote poems on the "
    "window.",
    "The map ended where the sea began.",
    "A violin waited ten years in the attic.",
    "The lighthouse keeper counted ships, not days.",
    "He lost the race but found the path.",
    "An old song played and the room went quiet.",
};

static void test_prose_loops(void **state)
{
    (void)state;
    text t = {0};
    for (size_t i = 0; i < sizeof(prose_cases) / sizeof(prose_cases[0]); i++) {
        const struct prose_case *c = &prose_cases[i];
        t.n = 0;
        tcat(&t, c->prefix);
        size_t first_round = 0;
        for (int r = 1; r <= c->rounds; r++) {
            for (int k = 0; k < 5 && c->cycle[k]; k++)
                tnum(&t, c->cycle[k], r);
            if (r == 1) first_round = t.n;
        }
        if (!c->detector) {
            assert_clean(c->what, t.s);
            continue;
        }
        assert_chunking_invariant(t.s);
        result r = scan_text(c->ch, t.s);
        if (!r.tripped) fail_msg("%s: did not trip", c->what);
        if (strcmp(r.detector, c->detector))
            fail_msg("%s: tripped %s, expected %s", c->what, r.detector, c->detector);
        if (r.at_byte < first_round) fail_msg("%s: tripped in the first round", c->what);
        if (r.at_byte - first_round > c->max_after)
            fail_msg("%s: tripped %zu bytes after the first round, more than %zu", c->what,
                     (size_t)(r.at_byte - first_round), c->max_after);
    }

    /* A chorus after each verse and once more at the end is a song, not a loop. */
    t.n = 0;
    tcat(&t, "Here is a song about the harbour.\n\n");
    for (int v = 0; v < 3; v++) {
        tcat(&t, song_verses[v]);
        tcat(&t, song_chorus);
    }
    tcat(&t, song_chorus);
    assert_clean("a song with its chorus", t.s);

    /* Ten of thirty items told again, in order, is a careless list, not a loop: the retold
     * run never comes round to itself. */
    t.n = 0;
    tcat(&t, "Here are thirty stories of under ten words:\n\n");
    size_t ns = sizeof(tiny_stories) / sizeof(tiny_stories[0]);
    for (int i = 0; i < 30; i++) {
        size_t k = i >= 19 && i < 29 ? (size_t)(i - 16) : (size_t)i % ns;
        if (i >= 29) k = ns - 1;
        tnum(&t, "#. ", i + 1);
        tcat(&t, tiny_stories[k]);
        tcat(&t, "\n");
    }
    assert_clean("ten retold items", t.s);

    /* One product in fourteen colours (fewer than the template detector's run): the
     * template recurs, but every item brings a word of its own, which a loop does not
     * (novelty.max_new_words). */
    static const char *const colours[] = {"red",      "blue",     "green",     "black",   "white",
                                          "silver",   "copper",   "yellow",    "orange",  "purple",
                                          "teal",     "ivory",    "navy",      "olive",   "maroon",
                                          "charcoal", "lavender", "turquoise", "crimson", "amber"};
    t.n = 0;
    tcat(&t, "You might also like these kettles:\n\n");
    for (int i = 0; i < 14; i++) {
        tcat(&t, "- The Harbourline stainless steel whistling kettle with a cool grip handle in ");
        tcat(&t, colours[i]);
        tcat(&t, ", suitable for every kind of hob\n");
    }
    assert_clean("one product in fourteen colours", t.s);

    /* Sentences rotating among a few paraphrases, in no fixed order: novelty. */
    static const char *const subj[] = {"The angle between the two points",
                                       "The distance between the two points",
                                       "The arc between the two points"};
    static const char *const verb[] = {"is equal to the difference between",
                                       "can be found from the difference between"};
    static const char *const obj[] = {"the two altitudes of the moon.",
                                      "the two angles, measured in degrees.",
                                      "zero degrees and ninety degrees."};
    t.n = 0;
    tcat(&t, "We can now find how far north the next point lies.\n\n");
    size_t start = t.n;
    for (unsigned i = 0; i < 60; i++) {
        unsigned x = i * 7 + i / 5;
        tcat(&t, subj[x % 3]);
        tcat(&t, " ");
        tcat(&t, verb[(x / 3) % 2]);
        tcat(&t, " ");
        tcat(&t, obj[(x / 2) % 3]);
        tcat(&t, i % 4 == 3 ? "\n\n" : " ");
    }
    assert_chunking_invariant(t.s);
    result r = scan_text(LG_CH_CONTENT, t.s);
    assert_true(r.tripped);
    if (r.at_byte - start > 1500)
        fail_msg("paraphrase: tripped %zu bytes in", (size_t)(r.at_byte - start));
    free(t.s);
}

/* Two step sentences taking turns with new numbers each round, no number counting, a grid
 * of digits after each (a puzzle solved cell by cell that never converges): the cycle
 * detector, numbers aside. One sentence with its number changing is a list: clean. */
static void test_masked_cycle(void **state)
{
    (void)state;
    static const int rows[] = {4, 7, 2, 9, 1, 6, 3, 8, 5, 2, 7, 4, 9, 1, 6, 8};
    static const int cols[] = {3, 8, 6, 1, 9, 2, 7, 4, 5, 8, 2, 6, 3, 9, 1, 7};
    static const int vals[] = {6, 2, 9, 4, 7, 1, 8, 3, 5, 9, 4, 1, 7, 2, 8, 6};
    text t = {0};
    tcat(&t, "Let us fill the puzzle one square at a time.\n\n");
    size_t first = 0;
    for (int i = 0; i < 16; i++) {
        char line[160];
        snprintf(line, sizeof(line),
                 i % 2 ? "- Next, the square at row %d, column %d must hold a %d.\n"
                       : "- So the square at row %d, column %d can only take the digit %d.\n",
                 rows[i], cols[i], vals[i]);
        tcat(&t, line);
        tcat(&t,
             "| 5 | 3 | 0 | 0 | 7 | 0 |\n| 6 | 0 | 0 | 1 | 9 | 5 |\n| 0 | 9 | 8 | 0 | 0 | 0 |\n");
        if (i == 1) first = t.n;
    }
    assert_chunking_invariant(t.s);
    result r = scan_text(LG_CH_CONTENT, t.s);
    if (!r.tripped || strcmp(r.detector, "cycle")) fail_msg("puzzle steps: no cycle trip");
    if (r.at_byte - first > 1500)
        fail_msg("puzzle steps: tripped %zu bytes in", (size_t)(r.at_byte - first));

    /* One sentence, its number changing in no order: a product in several sizes. */
    t.n = 0;
    tcat(&t, "Other sizes of the same pan:\n\n");
    for (int i = 0; i < 16; i++) {
        char line[160];
        snprintf(line, sizeof(line),
                 "- The Riverside cast iron frying pan with a long handle, %d inches across.\n",
                 rows[i] + 6);
        tcat(&t, line);
    }
    assert_clean("one pan in several sizes", t.s);
    free(t.s);
}

/* A few list items drawn again and again, in no fixed order: the cycle detector's mixed
 * replay. A summary that names every earlier item once more, and a numbered list the prompt
 * asks for that reuses its items, are content. */
static void test_mixed_cycle(void **state)
{
    (void)state;
    static const char *const books[] = {
        "* Harbour Lights and Long Shadows, 1921-1934 by Ann R. Whitcombe\n",
        "* The Salt Roads: Trade on the Northern Coast by Peter J. Alder\n",
        "* Lanterns Over the Quay, 1900-1915 by Ruth M. Kessling\n",
        "* A Short History of Tides by Samuel T. Orme\n",
        "* Fishermen and Their Towns by Clara B. Hensley\n",
        "* Ships That Never Sailed by Thomas E. Gault\n",
        "* The Cartographer's Daughter by Lena V. Marsh\n",
        "* Winter on the Estuary, 1947-1952 by Owen D. Pryce\n",
    };
    static const int order[] = {0, 2, 1, 0, 2, 3, 0, 1, 2, 0, 3, 1, 2, 0, 1, 3, 2, 0, 1, 2};
    text t = {0};
    tcat(&t, "If you liked that novel, you may enjoy these:\n\n");
    for (int i = 0; i < 8; i++)
        tcat(&t, books[i]);
    size_t first = t.n;
    for (int i = 0; i < 20; i++)
        tcat(&t, books[order[i]]);
    assert_chunking_invariant(t.s);
    result r = scan_text(LG_CH_CONTENT, t.s);
    if (!r.tripped || strcmp(r.detector, "cycle")) fail_msg("drawn titles: no cycle trip");
    if (r.at_byte - first > 1200)
        fail_msg("drawn titles: tripped %zu bytes in", (size_t)(r.at_byte - first));

    /* Points grouped by review, then the summary names each of them once more. */
    static const char *const points[] = {
        "* The pacing keeps the tension high\n", "* The lead actor is convincing\n",
        "* The music fits every scene\n",        "* The ending feels rushed\n",
        "* The dialogue sounds natural\n",       "* The camera work is inventive\n",
        "* The middle act drags a little\n",     "* The villain lacks a motive\n",
    };
    static const int groups[4][4] = {{0, 1, 3, 6}, {2, 4, 7, 0}, {5, 1, 3, 2}, {6, 4, 5, 7}};
    t.n = 0;
    tcat(&t, "Here are the points of each review.\n\n");
    for (int gi = 0; gi < 4; gi++) {
        char head[40];
        snprintf(head, sizeof(head), "Review %d:\n\n", gi + 1);
        tcat(&t, head);
        for (int k = 0; k < 4; k++)
            tcat(&t, points[groups[gi][k]]);
        tcat(&t, "\n");
    }
    tcat(&t, "In summary, the positive points are:\n\n");
    for (int k = 0; k < 8; k++)
        if (k != 3 && k != 6 && k != 7) tcat(&t, points[k]);
    tcat(&t, "\nand the negative points are:\n\n");
    tcat(&t, points[3]);
    tcat(&t, points[6]);
    tcat(&t, points[7]);
    assert_clean("a summary of the reviews", t.s);

    /* Thirty-one numbered stories asked for by the prompt, twenty of them retelling the
     * first ten, in shuffled order: within what was asked. The same text unasked is a
     * loop. */
    static const char *const tales[] = {
        "A fox sells umbrellas in the rain.", "The moon borrows a ladder.",
        "A snail wins the marathon at last.", "Two clocks argue about noon.",
        "The river forgets its way home.",    "A crow opens a bakery.",
        "The mountain takes a nap.",          "A whale learns to whistle.",
        "The scarecrow adopts a sparrow.",    "A lighthouse falls in love with a ship.",
        "The last train waits for a cat.",
    };
    static const int told[] = {0, 1, 2, 3, 4,  5, 6, 7, 8, 9, 3, 7, 0, 5, 9, 2,
                               6, 1, 8, 4, 10, 6, 2, 9, 0, 4, 8, 1, 5, 7, 3};
    t.n = 0;
    for (int i = 0; i < 31; i++) {
        char num[16];
        snprintf(num, sizeof(num), "%d. ", i + 1);
        tcat(&t, num);
        tcat(&t, tales[told[i]]);
        tcat(&t, "\n");
    }
    r = scan_prompted(LG_CH_CONTENT, "Write 40 short stories of under ten words each.", t.s);
    if (r.tripped) fail_msg("asked stories tripped %s, unit '%s'", r.detector, r.unit);
    assert_trips("stories unasked", LG_CH_CONTENT, t.s, "cycle");
    free(t.s);
}

/* A passage of long sentences said again word for word, then one of them a third time:
 * the cycle detector. An essay that repeats its long thesis sentence in three paragraphs,
 * other sentences around it each time, is content. */
static void test_third_sentence(void **state)
{
    (void)state;
    static const char *const passage =
        "4. Harbour maintenance planning: Harbour maintenance planning covers the survey, "
        "the budget and the schedule of every repair the harbour needs. This relies on "
        "inspection records and tide tables to decide which quay wall is repaired first each "
        "season. Good maintenance planning keeps the harbour open all year, because a repair "
        "that is planned early never has to close a berth during the busy summer months.\n\n";
    static const char *const thesis =
        "A harbour that plans its maintenance early spends less on emergency repairs than one "
        "that waits for the walls to fail. ";
    text t = {0};
    tcat(&t, "Harbour engineering\n\nHarbour engineering keeps ships and people safe.\n\n");
    tcat(&t, passage);
    tcat(&t, "Harbour design\n\nHarbour design shapes the breakwaters and the quays. Engineers "
             "model the waves before they pour any concrete.\n\n");
    size_t loop = t.n;
    tcat(&t, passage);
    tcat(&t, "Harbour maintenance planning\n\nHarbour maintenance planning decides the order "
             "of the repairs. This relies on inspection records and tide tables to decide "
             "which quay wall is repaired first each season. Harbour");
    assert_chunking_invariant(t.s);
    result r = scan_text(LG_CH_CONTENT, t.s);
    if (!r.tripped || strcmp(r.detector, "cycle")) fail_msg("third sentence: no cycle trip");
    if (r.at_byte - loop > 1000)
        fail_msg("third sentence: tripped %zu bytes in", (size_t)(r.at_byte - loop));

    t.n = 0;
    tcat(&t, "Why harbours should plan ahead\n\n");
    tcat(&t, thesis);
    tcat(&t, "Storms do the most damage to walls that were already weak. Inspections find "
             "those walls before the winter comes.\n\n");
    tcat(&t, "Budgets tell the same story. ");
    tcat(&t, thesis);
    tcat(&t, "A planned repair can wait for calm weather and cheaper materials.\n\n");
    tcat(&t, "In short, the records of twenty ports agree. ");
    tcat(&t, thesis);
    tcat(&t, "That is why every port authority should keep a repair calendar.\n");
    assert_clean("a thesis said in three paragraphs", t.s);
    free(t.s);
}

/* A block of lines with a refrain that comes round with a line or two changed each time:
 * the cycle detector's fuzzy replay. A questionnaire repeating its answer options under
 * new questions, and a song whose verses change, are content. */
static void test_fuzzy_cycle(void **state)
{
    (void)state;
    static const char *const calls[] = {"Listen! The bells ring out over the valley!",
                                        "Listen! The drums roll along the river!",
                                        "Listen! The horns call from the hill!"};
    static const char *const deeds[] = {"I shall carry the lantern to the gate!",
                                        "I shall bar the door against the storm!",
                                        "I shall wake the miller and his sons!"};
    /* Each block changes a line or two of the one before: no block comes back whole. */
    static const int call_of[] = {0, 1, 2, 0, 1, 2}, deed_of[] = {0, 0, 0, 1, 1, 1};
    text t = {0};
    tcat(&t, "The watchman speaks to the sleeping town.\n\n");
    size_t loop = 0;
    for (int r = 0; r < 6; r++) {
        if (r == 1) loop = t.n;
        tcat(&t, calls[call_of[r]]);
        tcat(&t, "\n\nWhere are you, brave keeper?\n\nHave no fear, I stand right here!\n\n");
        tcat(&t, deeds[deed_of[r]]);
        tcat(&t, "\n\nSo it shall be!\n\nSo it is told!\n\nSo it shall be done!\n\n");
    }
    assert_chunking_invariant(t.s);
    result r = scan_text(LG_CH_CONTENT, t.s);
    if (!r.tripped || strcmp(r.detector, "cycle")) fail_msg("refrain blocks: no cycle trip");
    if (r.at_byte - loop > 1200)
        fail_msg("refrain blocks: tripped %zu bytes in", (size_t)(r.at_byte - loop));

    static const char *const topics[] = {"data frames", "plotting",     "regular expressions",
                                         "packages",    "closures",     "vectorised loops",
                                         "factors",     "date handling"};
    t.n = 0;
    tcat(&t, "Please answer each question.\n\n");
    for (int q = 0; q < 8; q++) {
        char line[200];
        snprintf(line, sizeof(line),
                 "%d. How confident are you when you work with %s in your daily analysis "
                 "scripts and reports?\n",
                 q + 1, topics[q]);
        tcat(&t, line);
        tcat(&t, "* Very confident\n* Confident\n* Somewhat unsure\n* Very unsure\n");
    }
    assert_clean("a questionnaire with the same options", t.s);
    free(t.s);
}

/* ---- chunking invariance ----------------------------------------------------------- */

/* A pseudo-random text: prose words, code, UTF-8, sometimes a loop of some kind. */
static void random_text(text *t, unsigned kind)
{
    static const char *const words[] = {"the",
                                        "model",
                                        "prime",
                                        "number",
                                        "lambda",
                                        "def",
                                        "return",
                                        "None,",
                                        "好的",
                                        "计算",
                                        "\xf0\x9f\x98\x80",
                                        "|",
                                        "---",
                                        "0,",
                                        "x",
                                        "!",
                                        "<|im_",
                                        "end|>",
                                        "```",
                                        "\n",
                                        "\n\n",
                                        "。",
                                        "==",
                                        "(1)"};
    size_t nw = sizeof(words) / sizeof(words[0]);
    /* One text in sixteen is long enough (~20-40 KB) to slide the guard's history. */
    unsigned n = kind % 16 == 5 ? 5000 + rnd(5000) : 50 + rnd(400);
    for (unsigned i = 0; i < n; i++) {
        unsigned w = rnd((unsigned)nw);
        if (n > 1000 && w >= 16 && w <= 17) w = rnd(16); /* no leak in the long ones */
        tcat(t, words[w]);
        if (n > 1000) { /* and more varied words, so that they run long */
            char num[16];
            snprintf(num, sizeof(num), "%u", rnd(100000));
            tcat(t, num);
        }
        if (rnd(3)) tcat(t, " ");
    }
    if (kind % 4 == 1) {
        const char *u = words[rnd((unsigned)nw)];
        trep(t, u, 20 + (int)rnd(200));
    } else if (kind % 4 == 2) {
        char unit[64];
        size_t k = 1 + rnd(40);
        for (size_t i = 0; i < k; i++)
            unit[i] = rnd(4) ? (char)('a' + rnd(26)) : " .,\n"[rnd(4)];
        unit[k] = 0;
        trep(t, unit, 5 + (int)rnd(100));
    } else if (kind % 4 == 3) {
        for (unsigned i = 0; i < 64; i++) /* raw bytes, invalid UTF-8 included */
            tput(t, (const char[]){(char)rnd(256)}, 1);
    }
    trep(t, "tail words here ", (int)rnd(5));
}

static void test_chunking_invariance(void **state)
{
    (void)state;
    guard_params *p[LG_CH_COUNT];
    cJSON *rules = cJSON_Parse("{\"rules\":[{\"name\":\"ai\",\"pattern\":\"As an AI\\\\b\","
                               "\"action\":\"trip\"},{\"name\":\"x\",\"pattern\":\"x x x x\"}]}");
    char err[256];
    for (int ch = 0; ch < LG_CH_COUNT; ch++) {
        p[ch] = guard_params_new((lg_channel)ch);
        assert_int_equal(guard_params_apply_json(p[ch], rules, "guard.x", err, sizeof(err)), 0);
    }
    cJSON_Delete(rules);
    unsigned trips = 0;
    for (unsigned k = 0; k < 400; k++) {
        text t = {0};
        random_text(&t, k);
        if (k % 9 == 0) tcat(&t, "As an AI language model");
        lg_channel ch = (lg_channel)(k % LG_CH_COUNT);
        bool finish = k % 2;
        result whole = run_whole(p[ch], ch, t.s, t.n, finish);
        result bytes = run_split(p[ch], ch, t.s, t.n, 1, finish);
        assert_same(&whole, &bytes);
        for (int s = 0; s < 4; s++) {
            result split = run_split(p[ch], ch, t.s, t.n, 1 + rnd(64), finish);
            assert_same(&whole, &split);
        }
        trips += whole.tripped;
        free(t.s);
    }
    /* The generator must exercise both outcomes. */
    assert_true(trips > 50);
    assert_true(trips < 380);
    for (int ch = 0; ch < LG_CH_COUNT; ch++)
        guard_params_free(p[ch]);
}

/* Feeds `s` to g in chunks from a generator seeded with `seed`, after `prompt` (NULL: none),
 * recording what each call returns and the holdback after it; then finishes it and asks
 * for an empty answer after 5,000 bytes of reasoning. */
typedef struct trace {
    unsigned n;
    size_t out[4096];
} trace;

static result run_traced(guard *g, const char *prompt, bool leaks_off, const char *s, size_t n,
                         unsigned long long seed, trace *tr)
{
    if (prompt) guard_set_prompt(g, prompt, strlen(prompt));
    if (leaks_off) guard_disable_leaks(g);
    unsigned long long saved = rng_state;
    rng_state = seed;
    tr->n = 0;
    const unsigned maxchunk = seed % 3 == 0 ? 1 : seed % 3 == 1 ? 8 : 64;
    for (size_t off = 0; off < n;) {
        size_t k = 1 + rnd(maxchunk);
        if (k > n - off) k = n - off;
        size_t r = guard_feed(g, s + off, k) ? 1 : 0;
        if (tr->n + 2 <= 4096) {
            tr->out[tr->n++] = r;
            tr->out[tr->n++] = guard_suspect(g);
        }
        off += k;
    }
    rng_state = saved;
    if (tr->n < 4096) tr->out[tr->n++] = guard_finish(g);
    if (tr->n < 4096) tr->out[tr->n++] = guard_report_empty_answer(g, 5000);
    return snapshot(g);
}

/* guard_reset's contract: a guard reset after any use behaves byte for byte as a new one
 * given the same calls (feeds and their chunking, prompt, leaks off, finish), whatever it
 * read before, tripped or not, under other params or another channel, with a history that
 * slid or a text short enough that the 8-gram table is cleared slot by slot; from the 150th
 * text on with a store, whose tables (some made for another channel's window) it takes. */
static void test_reset(void **state)
{
    (void)state;
    guard_params *p[LG_CH_COUNT], *ruled = guard_params_new(LG_CH_CONTENT);
    guard_params *ruled2 = guard_params_new(LG_CH_CONTENT); /* more rules, capture groups */
    cJSON *rules = cJSON_Parse("{\"rules\":[{\"name\":\"x\",\"pattern\":\"x x x\"}]}");
    cJSON *rules2 = cJSON_Parse("{\"rules\":[{\"name\":\"x\",\"pattern\":\"x x x\"},"
                                "{\"name\":\"y\",\"pattern\":\"(p)rime ?(n)umber\"}]}");
    char err[256];
    assert_int_equal(guard_params_apply_json(ruled, rules, "guard.x", err, sizeof(err)), 0);
    assert_int_equal(guard_params_apply_json(ruled2, rules2, "guard.x", err, sizeof(err)), 0);
    cJSON_Delete(rules);
    cJSON_Delete(rules2);
    for (int ch = 0; ch < LG_CH_COUNT; ch++)
        p[ch] = guard_params_new((lg_channel)ch);
    static trace fresh_tr, reset_tr;
    guard *used = guard_new(ruled, LG_CH_CONTENT);
    guard_store *store = guard_store_new();
    unsigned trips = 0;
    for (unsigned k = 0; k < 300; k++) {
        if (k == 150) guard_use_store(used, store);
        text before = {0}, t = {0};
        random_text(&before, k * 7 + 3);
        random_text(&t, k);
        if (k % 5 == 0) t.n = t.n > 12 ? 12 : t.n, t.s[t.n] = 0; /* a 2-token answer */
        if (k % 5 < 2) before.n = before.n > 20 ? 20 : before.n; /* the table cleared by slot */
        lg_channel ch = (lg_channel)(k % LG_CH_COUNT);
        /* rules after rules (the same, others), after none, before none */
        const guard_params *gp = k % 4 == 1                 ? ruled
                                 : k % 8 == 2               ? ruled
                                 : k % 8 == 6 || k % 8 == 7 ? ruled2
                                                            : p[ch];
        const char *prompt = k % 3 == 0 ? "Repeat the word lambda 20 times." : NULL;
        bool leaks_off = k % 6 == 2;
        /* The used guard, which read the last text, reads another with a prompt. */
        guard_set_prompt(used, before.s, before.n);
        guard_feed(used, before.s, before.n);
        guard_finish(used);
        guard_reset(used, gp, ch);
        guard *fresh = guard_new(gp, ch);
        unsigned long long seed = 0x9E3779B97F4A7C15ull * (k + 1);
        result a = run_traced(fresh, prompt, leaks_off, t.s, t.n, seed, &fresh_tr);
        result b = run_traced(used, prompt, leaks_off, t.s, t.n, seed, &reset_tr);
        assert_same(&a, &b);
        assert_int_equal(fresh_tr.n, reset_tr.n);
        assert_memory_equal(fresh_tr.out, reset_tr.out, fresh_tr.n * sizeof(fresh_tr.out[0]));
        assert_int_equal(guard_bytes(fresh), guard_bytes(used));
        trips += a.tripped;
        guard_free(fresh);
        free(before.s);
        free(t.s);
    }
    assert_true(trips > 30);
    assert_true(trips < 270);
    guard_free(used);
    guard_store_free(store);
    guard_params_free(ruled);
    guard_params_free(ruled2);
    for (int ch = 0; ch < LG_CH_COUNT; ch++)
        guard_params_free(p[ch]);
}

/* The guard reads a chunk detector by detector; a repeat inside a fence that closes later
 * in the same chunk must still be judged with the fence open, as byte by byte. (The text
 * stays under 1 KiB, the guard's first history, so that it is one piece.) */
static void test_fence_closing_in_the_chunk(void **state)
{
    (void)state;
    static const char unit[] = "lambda ";
    const size_t len = sizeof(unit) - 1;
    text t = {0};
    trep(&t, unit, 300);
    result bare = scan_text(LG_CH_CONTENT, t.s);
    assert_true(bare.tripped);
    /* Inside the fence: a little past where the bare unit trips, short of the fenced bar. */
    t.n = 0;
    tcat(&t, "```\n");
    trep(&t, unit, (int)(bare.at_byte / len) + 2);
    tcat(&t, "\n```\n");
    size_t closed = t.n;
    trep(&t, unit, 300);
    assert_true(bare.at_byte < 1024 / 2 - 12);
    guard_params *p = guard_params_new(LG_CH_CONTENT);
    result whole = run_whole(p, LG_CH_CONTENT, t.s, t.n, true);
    result bytes = run_split(p, LG_CH_CONTENT, t.s, t.n, 1, true);
    assert_same(&whole, &bytes);
    assert_true(whole.tripped);
    assert_true(whole.at_byte > closed);
    guard_params_free(p);
    free(t.s);
}

/* ---- holdback ---------------------------------------------------------------------- */

static bool utf8_cont(unsigned char c)
{
    return (c & 0xC0) == 0x80;
}

static void test_suspect(void **state)
{
    (void)state;
    guard_params *p = guard_params_new(LG_CH_CONTENT);

    /* Clean prose: nothing held at word ends. */
    const char *prose = "Here is a short answer. Two plus two equals four, as expected. ";
    guard *g = guard_new(p, LG_CH_CONTENT);
    guard_feed(g, prose, strlen(prose));
    assert_int_equal(guard_suspect(g), 0);
    guard_free(g);

    /* A loop: byte by byte, the client never gets past the first copy plus the bytes the
     * detector may need to see the period: the 8-gram table is looked up at anchors only
     * (g_short.h, guard_gram_anchor), and the unit's lowest-ranked 8-gram is one in every
     * copy once two blocks of 16 offsets hold only the loop's grams (7 + 31 bytes into it),
     * so its second such copy comes at most a unit and 37 bytes past the first copy. */
    text t = {0};
    tcat(&t, "You can use the ");
    trep(&t, "lambda ", 40);
    g = guard_new(p, LG_CH_CONTENT);
    size_t max_release = 0;
    for (size_t i = 0; i < t.n && !guard_tripped(g); i++) {
        guard_feed(g, t.s + i, 1);
        size_t rel = (size_t)guard_bytes(g) - guard_suspect(g);
        if (rel > max_release) max_release = rel;
    }
    assert_true(guard_tripped(g));
    assert_true(max_release <= strlen("You can use the lambda ") + strlen("lambda ") + 37);
    assert_int_equal(guard_bytes(g) - guard_suspect(g), guard_get_verdict(g)->loop_start);
    guard_free(g);

    /* UTF-8 split anywhere: the release point is always on a character boundary, and
     * the cap holds. */
    t.n = 0;
    for (int i = 0; i < 200; i++)
        tcat(&t, i % 3 ? "好的，我们计算 " : "\xf0\x9f\x98\x80 caf\xc3\xa9 ");
    trep(&t, "计算。", 60);
    cJSON *o = cJSON_Parse("{\"holdback_max_bytes\": 10}");
    char err[128];
    assert_int_equal(guard_params_apply_json(p, o, "guard.content", err, sizeof(err)), 0);
    cJSON_Delete(o);
    g = guard_new(p, LG_CH_CONTENT);
    for (size_t i = 0; i < t.n && !guard_tripped(g); i++) {
        guard_feed(g, t.s + i, 1);
        size_t s = guard_suspect(g), fed = (size_t)guard_bytes(g);
        assert_true(s <= 10);
        if (s < fed) assert_false(utf8_cont((unsigned char)t.s[fed - s]));
        if (s == 0 && i + 1 < t.n) /* nothing held: the fed text ends on a boundary */
            assert_false(utf8_cont((unsigned char)t.s[fed]));
    }
    guard_free(g);
    free(t.s);
    guard_params_free(p);
}

/* ---- leaks, rules, budgets, empty answers ------------------------------------------ */

static void test_leak(void **state)
{
    (void)state;
    guard_params *p = guard_params_new(LG_CH_CONTENT);
    const char *s = "The answer is 4.<|im_end|>more";
    for (size_t cut = 1; cut < strlen(s); cut++) {
        guard *g = guard_new(p, LG_CH_CONTENT);
        guard_feed(g, s, cut);
        if (cut >= 16 && cut < 26) /* a prefix of the token is held back */
            assert_int_equal(guard_suspect(g), cut - 16);
        guard_feed(g, s + cut, strlen(s) - cut);
        const guard_verdict *v = guard_get_verdict(g);
        assert_non_null(v);
        assert_string_equal(v->detector, "leak");
        assert_int_equal(v->loop_start, 16);
        assert_int_equal(v->at_byte, 26);
        assert_string_equal(v->unit, "<|im_end|>");
        guard_free(g);
    }
    result r = scan_text(LG_CH_CONTENT, "Answer.</think> and again");
    assert_string_equal(r.detector, "leak");
    guard_params_free(p);
}

static void test_rules(void **state)
{
    (void)state;
    guard_params *p = guard_params_new(LG_CH_CONTENT);
    char err[256];
    cJSON *o = cJSON_Parse("{\"rules\":[{\"name\":\"ai\",\"pattern\":\"(?i)as an ai language "
                           "model\",\"action\":\"trip\"}]}");
    assert_int_equal(guard_params_apply_json(p, o, "guard.content", err, sizeof(err)), 0);
    cJSON_Delete(o);
    text t = {0};
    trep(&t, "Some preamble text that goes on. ", 3); /* 99 bytes: straddles offset 64 */
    size_t at = t.n;
    tcat(&t, "As an AI language model, I cannot. ");
    trep(&t, "Filler words to pass the next check. ", 4);
    for (size_t cut = 1; cut < t.n; cut += 7) {
        guard *g = guard_new(p, LG_CH_CONTENT);
        guard_feed(g, t.s, cut);
        if (cut > at + 3 && cut < at + 23 && !guard_tripped(g))
            assert_true(guard_suspect(g) >= cut - at); /* partial match held */
        guard_feed(g, t.s + cut, t.n - cut);
        const guard_verdict *v = guard_get_verdict(g);
        assert_non_null(v);
        assert_string_equal(v->detector, "rule:ai");
        assert_int_equal(v->loop_start, at);
        assert_int_equal(v->at_byte, 128); /* the first check at a multiple of 64 after */
        assert_string_equal(v->unit, "As an AI language model");
        guard_free(g);
    }
    /* At the end of the text, a match after the last check is still found. */
    result r = run_whole(p, LG_CH_CONTENT, "as an AI language model", 23, true);
    assert_string_equal(r.detector, "rule:ai");
    free(t.s);
    guard_params_free(p);
}

static void test_budget_and_empty(void **state)
{
    (void)state;
    guard_params *rp = guard_params_new(LG_CH_REASONING);
    char err[128];
    cJSON *o = cJSON_Parse("{\"budget_bytes\": 1000}");
    assert_int_equal(guard_params_apply_json(rp, o, "guard.reasoning", err, sizeof(err)), 0);
    cJSON_Delete(o);
    text t = {0};
    for (int i = 0; i < 100; i++) {
        char s[64];
        snprintf(s, sizeof(s), "Thought number %d is different. ", i * 7919 % 1000);
        tcat(&t, s);
    }
    result r = run_whole(rp, LG_CH_REASONING, t.s, t.n, false);
    assert_string_equal(r.detector, "budget");
    assert_int_equal(r.at_byte, 1001);
    r = run_split(rp, LG_CH_REASONING, t.s, t.n, 8, false); /* token-sized chunks */
    assert_string_equal(r.detector, "budget");
    assert_int_equal(r.at_byte, 1001);
    free(t.s);

    guard_params *cp = guard_params_new(LG_CH_CONTENT);
    guard *g = guard_new(cp, LG_CH_CONTENT);
    assert_false(guard_report_empty_answer(g, 0));
    assert_true(guard_report_empty_answer(g, 500));
    assert_string_equal(guard_get_verdict(g)->detector, "empty_answer");
    guard_free(g);
    g = guard_new(cp, LG_CH_CONTENT);
    guard_feed(g, " \n", 2);
    assert_true(guard_report_empty_answer(g, 500)); /* whitespace is no answer */
    guard_free(g);
    g = guard_new(cp, LG_CH_CONTENT);
    guard_feed(g, "4", 1);
    assert_false(guard_report_empty_answer(g, 500));
    guard_free(g);
    guard_params_free(rp);
    guard_params_free(cp);
}

/* ---- settings ---------------------------------------------------------------------- */

static void expect_error(const char *json, const char *msg)
{
    guard_params *p = guard_params_new(LG_CH_CONTENT);
    char err[256] = "";
    cJSON *o = cJSON_Parse(json);
    assert_non_null(o);
    assert_int_equal(guard_params_apply_json(p, o, "guard.content", err, sizeof(err)), -1);
    if (!strstr(err, msg)) fail_msg("error '%s' does not contain '%s'", err, msg);
    cJSON_Delete(o);
    /* A failed apply leaves the defaults in place: "lambda" still trips. */
    text t = {0};
    trep(&t, "lambda ", 100);
    result r = run_whole(p, LG_CH_CONTENT, t.s, t.n, true);
    assert_string_equal(r.detector, "repeat");
    free(t.s);
    guard_params_free(p);
}

static void test_settings(void **state)
{
    (void)state;
    expect_error("{\"repet\": {}}", "guard.content.repet: unknown key");
    expect_error("{\"repeat\": {\"enabled\": false, \"min_byte\": 3}}",
                 "guard.content.repeat.min_byte: unknown key");
    expect_error("{\"repeat\": {\"classes\": {\"rule\": {\"min_repeat\": 3}}}}",
                 "guard.content.repeat.classes.rule.min_repeat: unknown key");
    expect_error("{\"repeat\": {\"classes\": {\"prose\": {}}}}",
                 "guard.content.repeat.classes.prose: unknown key");
    expect_error("{\"lines\": {\"min_repeats\": \"4\"}}", "guard.content.lines.min_repeats");
    expect_error("{\"novelty\": {\"min_ratio\": 2}}", "guard.content.novelty.min_ratio");
    expect_error("{\"repeat\": {\"repeats_by_period\": [[4, 10], [2, 5]]}}",
                 "guard.content.repeat.repeats_by_period");
    expect_error("{\"rules\": [{\"name\": \"r\", \"pattern\": \"(\"}]}",
                 "guard.content.rules[0].pattern");
    expect_error("{\"rules\": [{\"name\": \"r\", \"pattern\": \"a*\"}]}",
                 "guard.content.rules[0].pattern");
    expect_error("{\"rules\": [{\"name\": \"r\", \"pattern\": \"a\", \"action\": \"log\"}]}",
                 "guard.content.rules[0].action");
    expect_error("{\"leak_tokens\": [\"\"]}", "guard.content.leak_tokens");
    expect_error("{\"enabled\": 1}", "guard.content.enabled");

    /* Settings take effect: a custom period table, the repeat detector off, leaks off. */
    guard_params *p = guard_params_new(LG_CH_CONTENT);
    char err[256];
    cJSON *o = cJSON_Parse("{\"repeat\": {\"repeats_by_period\": [[8, 50], [2048, 3]]},"
                           "\"leak_tokens\": [], \"lines\": {\"enabled\": false}}");
    assert_int_equal(guard_params_apply_json(p, o, "guard.content", err, sizeof(err)), 0);
    cJSON_Delete(o);
    text t = {0};
    trep(&t, "lambda ", 100);
    result r = run_whole(p, LG_CH_CONTENT, t.s, t.n, true);
    assert_string_equal(r.detector, "repeat");
    assert_int_equal(r.at_byte, 350);
    r = run_whole(p, LG_CH_CONTENT, "x<|im_end|>", 11, true);
    assert_false(r.tripped);
    guard_params *c = guard_params_clone(p);
    o = cJSON_Parse("{\"repeat\": {\"enabled\": false}, \"novelty\": {\"enabled\": false}}");
    assert_int_equal(guard_params_apply_json(c, o, "guard.content", err, sizeof(err)), 0);
    cJSON_Delete(o);
    r = run_whole(c, LG_CH_CONTENT, t.s, t.n, true);
    assert_false(r.tripped);
    o = cJSON_Parse("{\"enabled\": false}");
    assert_true(guard_params_enabled(p));
    assert_int_equal(guard_params_apply_json(p, o, "guard.content", err, sizeof(err)), 0);
    assert_false(guard_params_enabled(p));
    cJSON_Delete(o);
    r = run_whole(p, LG_CH_CONTENT, t.s, t.n, true);
    assert_false(r.tripped);
    free(t.s);
    guard_params_free(p);
    guard_params_free(c);

    guard_free(NULL);
    guard_params_free(NULL);
    assert_string_equal(guard_channel_name(LG_CH_REASONING), "reasoning");
    assert_string_equal(guard_channel_name(LG_CH_CONTENT), "content");
    assert_string_equal(guard_channel_name(LG_CH_TOOL_ARGS), "tool_args");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed_cases),
        cmocka_unit_test(test_traps),
        cmocka_unit_test(test_loops),
        cmocka_unit_test(test_chunking_invariance),
        cmocka_unit_test(test_reset),
        cmocka_unit_test(test_suspect),
        cmocka_unit_test(test_leak),
        cmocka_unit_test(test_rules),
        cmocka_unit_test(test_budget_and_empty),
        cmocka_unit_test(test_settings),
        cmocka_unit_test(test_fence_closing_in_the_chunk),
        cmocka_unit_test(test_loop_shapes),
        cmocka_unit_test(test_prompt_slack),
        cmocka_unit_test(test_template),
        cmocka_unit_test(test_template_slots),
        cmocka_unit_test(test_count),
        cmocka_unit_test(test_blocks),
        cmocka_unit_test(test_prompt_count_word),
        cmocka_unit_test(test_prose_loops),
        cmocka_unit_test(test_masked_cycle),
        cmocka_unit_test(test_mixed_cycle),
        cmocka_unit_test(test_third_sentence),
        cmocka_unit_test(test_fuzzy_cycle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
