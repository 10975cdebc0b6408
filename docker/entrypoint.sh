#!/bin/sh
# docker/entrypoint.sh — the container image's entry point.
#
# Configuration comes from a mounted file, from LOOPGUARD_* environment variables, or both
# (loopguard itself reads LOOPGUARD_*: the key path upper-cased with '.' written '__', and
# they override the file). The image sets LOOPGUARD_LISTEN=0.0.0.0:8000.
#
#   (no arguments, or flags)  run the proxy; --config /etc/loopguard/loopguard.json is added
#                             when that file exists (mount yours there)
#   health                    probe /loopguard/health on the local listener (HEALTHCHECK)
#   scan ... | --check-config FILE | --help   passed to loopguard as they are
#
# Without a config file and without LOOPGUARD_UPSTREAM (or --upstream) loopguard would
# guard http://127.0.0.1:30000 inside its own container, which is never what is meant, so
# the entry point refuses to start and says what to set. LG_BIN and LG_CONFIG override the
# binary and the file path (the packaging test runs this script outside a container).
set -eu

bin=${LG_BIN:-/usr/bin/loopguard}
conf=${LG_CONFIG:-/etc/loopguard/loopguard.json}

# Exit 0 when loopguard answers 200 on /loopguard/health. The address is admin.listen when
# it is set through the environment, else listen; a wildcard host is probed on loopback.
health() {
    addr=${LOOPGUARD_ADMIN__LISTEN:-${LOOPGUARD_LISTEN:-127.0.0.1:8000}}
    port=${addr##*:}
    host=${addr%:*}
    case $host in
    0.0.0.0 | '') host=127.0.0.1 ;;
    '[::]') host='[::1]' ;;
    esac
    if [ -n "${LOOPGUARD_ADMIN__TOKEN:-}" ]; then
        exec curl -fsS -o /dev/null --max-time 3 \
            -H "Authorization: Bearer $LOOPGUARD_ADMIN__TOKEN" "http://$host:$port/loopguard/health"
    fi
    exec curl -fsS -o /dev/null --max-time 3 "http://$host:$port/loopguard/health"
}

case ${1:-} in
health) health ;;
scan | --check-config | --help | -h) exec "$bin" "$@" ;;
esac

if [ -f "$conf" ]; then
    exec "$bin" --config "$conf" "$@"
fi
for a in "$@"; do
    [ "$a" = --upstream ] && exec "$bin" "$@"
done
if [ -z "${LOOPGUARD_UPSTREAM:-}" ]; then
    echo "loopguard: no configuration: mount a config file at $conf or set" \
        "LOOPGUARD_UPSTREAM (e.g. http://sglang:30000)" >&2
    exit 2
fi
exec "$bin" "$@"
