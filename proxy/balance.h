/* balance.h — where the workers' load sends client connections.
 *
 * A connection stays on one worker for its life. A new one goes to a worker that holds the
 * fewest: the worker that accepted it keeps it or hands it over (worker.c, accept_clients),
 * as HAProxy's accepting thread dispatches to the least loaded one. Every stream then waits
 * for one thread of several when that thread waits for a core. On a 2-core host whose cores were
 * queued 40-50 % of the time at 1,000 paced streams (the bench's fake, load generator and
 * relay), one worker holding ~80 % of the streams added 2-3x nginx's p99 latency and an even
 * split 0.5x, for 4-7 % more CPU per event (two threads wake for fewer events each); on an
 * idle host one worker had cost 10-30 % less (tests/bench/HISTORY.md, "even").
 *
 * Counting connections decides before they carry any load: streams of unequal weight can
 * leave one worker running a whole core while another idles. So a worker that ran
 * BALANCE_SHED_PERMILLE of a core over two ticks in a row, while another that takes
 * connections ran less than half as much, sheds: it closes the share of its connections that
 * evens the two out, each after its next response ("Connection: close", as nginx closes a
 * connection after keepalive_requests), and leaves the listener to the others until its
 * next tick, so that the clients' new connections land there. The next tick measures again,
 * so a shed that evened the load stops.
 *
 * Pure functions of the counts and shares (permille of a core over a tick); no state. */
#ifndef LG_BALANCE_H
#define LG_BALANCE_H

#include <stdbool.h>

#define BALANCE_SHED_PERMILLE 700 /* a core's share over two ticks past which a worker sheds */

/* Whether a worker that holds `mine` connections takes the next one, when the least loaded
 * other worker that takes connections holds `others`; UINT_MAX stands for a worker that
 * takes none (at its limit, draining or shedding), and for "no other" as `others`. */
bool balance_takes(unsigned mine, unsigned others);

/* How many of its `clients` connections a worker sheds: it used `mine` over the last tick
 * and `before` over the one before, and `least` is the least any other worker that takes
 * connections used over its last tick (`mine` when there is none). */
unsigned balance_shed(unsigned clients, unsigned mine, unsigned before, unsigned least);

#endif
