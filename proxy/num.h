/* num.h — strict decimal number parsing for text from outside (headers, flags, config).
 *
 * atoi and friends read "12abc" as 12, "" as 0 and an overflow as whatever strtol
 * saturated to; a number from the wire or a command line is either entirely a decimal
 * number within its range or it is rejected. */
#ifndef LG_NUM_H
#define LG_NUM_H

#include <stdbool.h>

/* Parses s, which must be an optional '-' and 1 or more decimal digits and nothing else
 * (no spaces, no '+', no hex), into *out when its value is within [min, max]. Returns
 * false, leaving *out alone, otherwise. */
bool lg_parse_ll(const char *s, long long min, long long max, long long *out);

#endif
