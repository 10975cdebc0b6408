/* upread.h — how large a read buffer libcurl gets for an upstream stream.
 *
 * libcurl 7.88 gives every transfer its own receive buffer (CURLOPT_BUFFERSIZE: at least
 * 1,024 bytes, fixed for the transfer, so it cannot grow for a burst), and it is a large
 * part of a stream's memory. A stream decoded at a model's pace (20-100 tokens a second,
 * a few hundred bytes each) has an event or two waiting in its socket when it is read,
 * and a small buffer takes them as well as a large one. Only when the upstream outruns
 * the relay (a saturated benchmark, a burst after a stall, a host too busy to keep up) do
 * reads find more than a small buffer holds, and then every full buffer costs a recvfrom
 * and libcurl's readiness poll: the large buffer saves most of them. So a transfer gets
 * the large buffer while a good share of its worker's recent upstream reads would have
 * filled the small one, and the small one otherwise. The measure is the same whichever
 * buffer the reads had (a read of UPREAD_SMALL bytes or more), so the choice does not
 * swing back and forth with its own effect. The large buffers a thread holds at once are
 * capped (UPREAD_LARGE_MAX): a thousand saturated streams on two workers fit, but thousands of paced
 * streams on a host that falls behind would otherwise each hold 8 KiB for a backlog that a
 * small buffer takes in a few more reads.
 *
 * A plain-HTTP exchange's event stream is read by the worker, not libcurl (worker.c), so
 * its transfer gets UPREAD_HEAD, libcurl's smallest, whatever the reads.
 *
 * The state is the calling thread's (each worker keeps its own); nothing is shared. */
#ifndef LG_UPREAD_H
#define LG_UPREAD_H

#include <stddef.h>

#define UPREAD_HEAD      1024 /* libcurl's smallest: a body the worker reads (worker.c) */
#define UPREAD_SMALL     2048 /* eight paced events of ~250 bytes */
#define UPREAD_LARGE     8192 /* a saturated stream: half the recvfrom and poll calls of 4 KiB */
#define UPREAD_LARGE_MAX 512  /* large buffers one thread holds at once: 4 MiB */

/* The buffer for a transfer starting now: UPREAD_SMALL before any read was noted and while
 * UPREAD_LARGE_MAX of this thread's transfers hold the large one. The transfer hands the
 * size back to upread_give when it ends. */
size_t upread_take(void);

/* The transfer that took `size` from upread_take (on this thread) ended. */
void upread_give(size_t size);

/* Notes one read of an upstream socket that returned n bytes (n > 0). */
void upread_note_read(size_t n);

#endif
