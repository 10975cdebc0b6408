/* status_page.c — the status page's HTML (proxy/status_page.html), embedded in the binary
 * as it stands in the file: the assembler's .incbin copies the file's bytes into read-only
 * data at build time (the Makefile makes this object depend on the .html), and a NUL ends
 * them. One self-contained page, no external asset; see the .html for what it shows. */
#include "proxy/status_page.h"

__asm__(".section .rodata\n"
        ".global lg_status_page_html\n"
        ".type lg_status_page_html, @object\n"
        "lg_status_page_html:\n"
        ".incbin \"proxy/status_page.html\"\n"
        ".byte 0\n"
        ".size lg_status_page_html, . - lg_status_page_html\n"
        ".previous\n");
