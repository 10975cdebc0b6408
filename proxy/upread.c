/* upread.c — see upread.h. */
#include "proxy/upread.h"

#include <stdint.h>

/* The share of this thread's recent upstream reads that brought UPREAD_SMALL bytes or
 * more, in 1/65536: each read moves it 1/16 of the way, so a few dozen reads decide and a
 * stray one does not. Above a quarter, transfers get the large buffer: a small one would
 * cost an extra read and poll in at least every fourth read. */
#define SHARE_ONE   65536
#define SHARE_LARGE (SHARE_ONE / 4)

static _Thread_local int32_t filling;
static _Thread_local unsigned large_held; /* transfers holding UPREAD_LARGE */

size_t upread_take(void)
{
    if (filling <= SHARE_LARGE || large_held >= UPREAD_LARGE_MAX) return UPREAD_SMALL;
    large_held++;
    return UPREAD_LARGE;
}

void upread_give(size_t size)
{
    if (size == UPREAD_LARGE) large_held--;
}

void upread_note_read(size_t n)
{
    int32_t target = n >= UPREAD_SMALL ? SHARE_ONE : 0;
    filling += (target - filling) / 16;
}
