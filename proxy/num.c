/* num.c — see num.h. */
#include "proxy/num.h"

#include <errno.h>
#include <stdlib.h>

bool lg_parse_ll(const char *s, long long min, long long max, long long *out)
{
    if (!s) return false;
    const char *digits = *s == '-' ? s + 1 : s;
    if (*digits < '0' || *digits > '9') return false; /* strtoll would skip spaces, take '+' */
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno == ERANGE || *end != '\0' || v < min || v > max) return false;
    *out = v;
    return true;
}
