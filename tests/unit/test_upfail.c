/* test_upfail.c — the upstream failure causes (proxy/upfail.c): libcurl's results, the
 * socket's errno and the attempt's phase map to the cause an operator can act on; the
 * client's message names HOST:PORT and never the URL's userinfo. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "proxy/upfail.h"

static void test_causes(void **state)
{
    (void)state;
    static const struct {
        upf_state s;
        upf_cause want;
    } cases[] = {
        {{CURLE_COULDNT_CONNECT, ECONNREFUSED, false, false, false, false}, UPF_REFUSED},
        {{CURLE_COULDNT_CONNECT, EHOSTUNREACH, false, false, false, false}, UPF_UNREACHABLE},
        {{CURLE_COULDNT_RESOLVE_HOST, 0, false, false, false, false}, UPF_DNS},
        {{CURLE_SSL_CONNECT_ERROR, 0, false, false, false, false}, UPF_TLS},
        {{CURLE_PEER_FAILED_VERIFICATION, 0, false, false, false, false}, UPF_TLS},
        {{CURLE_OPERATION_TIMEDOUT, 0, false, false, false, false}, UPF_CONNECT_TIMEOUT},
        {{CURLE_OPERATION_TIMEDOUT, 0, true, true, false, false}, UPF_FIRST_BYTE_TIMEOUT},
        {{CURLE_OPERATION_TIMEDOUT, 0, true, true, true, false}, UPF_IDLE_TIMEOUT},
        {{CURLE_RECV_ERROR, ECONNRESET, false, true, true, false}, UPF_RESET},
        {{CURLE_GOT_NOTHING, 0, false, true, false, false}, UPF_CLOSED},
        {{CURLE_OK, 0, false, true, true, false}, UPF_CLOSED},
        {{CURLE_OK, 0, false, true, true, true}, UPF_NOT_SSE},
        {{CURLE_FAILED_INIT, 0, false, false, false, false}, UPF_OTHER},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        if (upf_classify(&cases[i].s) != cases[i].want)
            fail_msg("case %zu: got %d, want %d", i, upf_classify(&cases[i].s), cases[i].want);
    assert_true(upf_is_timeout(UPF_IDLE_TIMEOUT));
    assert_false(upf_is_timeout(UPF_REFUSED));
}

static void test_messages_name_host_port_without_credentials(void **state)
{
    (void)state;
    char hp[64], msg[200];
    upf_hostport(hp, sizeof hp, "https://user:secret@gpu1.example:30000/v1");
    assert_string_equal(hp, "gpu1.example:30000");
    upf_hostport(hp, sizeof hp, "http://[::1]:8080");
    assert_string_equal(hp, "[::1]:8080");
    upf_state s = {CURLE_COULDNT_CONNECT, ECONNREFUSED, false, false, false, false};
    assert_int_equal(upf_report(msg, sizeof msg, "http://u:pw@10.0.0.5:30000", &s), UPF_REFUSED);
    assert_string_equal(msg, "upstream 10.0.0.5:30000: connection refused");
    s = (upf_state){CURLE_COULDNT_CONNECT, EHOSTUNREACH, false, false, false, false};
    upf_report(msg, sizeof msg, "http://10.0.0.5:30000", &s);
    assert_string_equal(msg, "upstream 10.0.0.5:30000: cannot connect: No route to host");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_causes),
        cmocka_unit_test(test_messages_name_host_port_without_credentials),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
