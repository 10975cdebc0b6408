/* balance.h — where the workers' load sends client connections.
 *
 * Connections stay on the worker that accepted them (worker.c). The spill places new ones:
 * the first worker takes them until it is full, the next one from then on, so that at a
 * paced load one thread wakes for many streams and each wake-up serves more events (at
 * 1,000 paced streams on two cores, 10.1 us of CPU per event against 13.3 for two evenly
 * loaded workers). A worker is full past half a core over the last tick, or at its share of
 * max_connections.
 *
 * The spill decides before the connections carry any load: a client that opens its whole
 * pool at once (a load generator, a batch job's workers) can land every connection on the
 * first worker, which then runs a whole core while the next idles (at 100 saturated
 * streams, 3 of 8 runs in probes, at a quarter more CPU per event). So a worker that ran
 * BALANCE_SHED_PERMILLE of a core over two ticks in a row, while another that is not full
 * ran less than half as much, sheds: it closes the share of its connections that evens the
 * two out, each after its next response ("Connection: close", as nginx closes a connection
 * after keepalive_requests), and leaves the listener to the others until its next tick, so
 * that the clients' new connections land there. A paced load never gets there; the next
 * tick measures again, so a shed that evened the load stops.
 *
 * Pure functions of the shares (permille of a core over a tick); no state. */
#ifndef LG_BALANCE_H
#define LG_BALANCE_H

#include <stdbool.h>

#define BALANCE_SPILL_PERMILLE 500 /* a core's share over a tick past which a worker is full */
#define BALANCE_SHED_PERMILLE  700 /* a core's share over two ticks past which a worker sheds */

/* Whether a worker that used `permille` over the last tick and holds `clients` of its
 * `max_clients` is full (the next worker takes new connections). */
bool balance_full(unsigned permille, unsigned clients, unsigned max_clients);

/* How many of its `clients` connections a worker sheds: it used `mine` over the last tick
 * and `before` over the one before, and `least` is the least any other worker that is not
 * full used over its last tick (`mine` when there is none). */
unsigned balance_shed(unsigned clients, unsigned mine, unsigned before, unsigned least);

#endif
