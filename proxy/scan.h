/* scan.h — `loopguard scan`: runs files through the guard offline, one JSON line each.
 *
 * The operator's tuning tool: point it at saved generations (or any text) with a candidate
 * config and see what would trip, where, and on which unit. */
#ifndef LG_SCAN_H
#define LG_SCAN_H

/* argv[0] is "scan". Options: --config FILE, --channel content|reasoning|tool_args,
 * --max-bytes N (scan only the first N bytes of each file), --prompt FILE (the request's
 * prompt for every guard), --records (each file is a JSON
 * array or JSONL of {instruction|prompt|messages, output} records, scanned one by one).
 * Arguments: files, "-" for stdin. Prints one JSON object per file (per record with
 * --records) on stdout. Returns the process exit status:
 * 0 when every file was read, 1 on an I/O error or a bad record (message on stderr), 2 on usage. */
int scan_main(int argc, char **argv);

#endif
