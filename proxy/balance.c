/* balance.c — see balance.h. */
#include "proxy/balance.h"

#include <limits.h>
#include <stdint.h>

bool balance_takes(unsigned mine, unsigned others)
{
    return mine != UINT_MAX && mine <= others;
}

unsigned balance_shed(unsigned clients, unsigned mine, unsigned before, unsigned least)
{
    if (mine < BALANCE_SHED_PERMILLE || before < BALANCE_SHED_PERMILLE) return 0;
    if ((uint64_t)least * 2 >= mine) return 0;
    /* Moving k of n connections moves about k/n of the load: mine - load*k/n = least +
     * load*k/n gives k = n * (mine - least) / (2 * mine). */
    return (unsigned)((uint64_t)clients * (mine - least) / (2 * (uint64_t)mine));
}
