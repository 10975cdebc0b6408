#!/bin/sh
# docker/build.sh — the container image's build steps, runnable on a bare Debian 12 machine.
#
# The Dockerfile's build stage runs this script, and tests/e2e/packaging.test.mjs runs it
# here (no Docker engine on the CI machines), so what the image ships is what CI tested:
#
#   docker/build.sh [--prefix DIR] [--destdir DIR] [--build-dir DIR] [--jobs N]
#                   [--strip] [--deps-out FILE] [--no-deps]
#
# 1. Build dependencies: when a compiler, make, pkg-config or one of the libraries is
#    missing, installs the Makefile's APT_BUILD list with apt-get if we are root, else
#    prints the apt-get line and fails. The list is read from the Makefile so the two
#    cannot drift apart.
# 2. The loopguard binary alone into --build-dir (default build; no test or bench tool),
#    then `make install` with PREFIX and DESTDIR (the binary, the example config, the man
#    page, the systemd unit example).
# 3. --strip strips the installed binary (the image does; the build dir keeps symbols).
# 4. --deps-out FILE writes the Debian packages the installed binary's shared libraries
#    come from, one per line (ldd + dpkg -S): the runtime stage installs exactly those.
# 5. Smoke: the installed binary validates the installed example config.
#
# Prints the installed binary's path as its last line. Exit status non-zero on any failure.
set -eu

prefix=/usr/local destdir='' build_dir=build jobs='' strip=0 deps_out='' want_deps=1
while [ $# -gt 0 ]; do
    case $1 in
    --prefix) prefix=$2; shift 2 ;;
    --destdir) destdir=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --strip) strip=1; shift ;;
    --deps-out) deps_out=$2; shift 2 ;;
    --no-deps) want_deps=0; shift ;;
    -h | --help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
[ -n "$jobs" ] || jobs=$(nproc 2>/dev/null || echo 2)

# The APT_BUILD variable of the Makefile, joined across its backslash continuations.
apt_build=$(awk '/^APT_BUILD[ \t]*:?=/ { on = 1; sub(/^APT_BUILD[ \t]*:?=[ \t]*/, "") }
                 on { cont = sub(/\\[ \t]*$/, ""); printf "%s ", $0; if (!cont) exit }' Makefile)
[ -n "$apt_build" ] || { echo "build.sh: no APT_BUILD list in the Makefile" >&2; exit 1; }

have_deps() {
    command -v make >/dev/null && command -v cc >/dev/null && command -v pkg-config >/dev/null &&
        pkg-config --exists libmicrohttpd libcurl libcjson libpcre2-8
}
if [ "$want_deps" = 1 ] && ! have_deps; then
    if [ "$(id -u)" = 0 ]; then
        echo "build.sh: installing build dependencies: $apt_build"
        apt-get update -qq
        # shellcheck disable=SC2086 # the list is meant to split into package names
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $apt_build
    else
        echo "build.sh: missing build dependencies; run: sudo apt-get install -y $apt_build" >&2
        exit 1
    fi
fi

make -j"$jobs" BUILD="$build_dir" "$build_dir/loopguard"
make BUILD="$build_dir" PREFIX="$prefix" DESTDIR="$destdir" install

bin=$destdir$prefix/bin/loopguard
[ "$strip" = 0 ] || strip --strip-unneeded "$bin"

if [ -n "$deps_out" ]; then
    # ldd lines look like "libcurl.so.4 => /lib/x86_64-linux-gnu/libcurl.so.4 (0x...)";
    # dpkg -S answers "libcurl4:amd64: /lib/x86_64-linux-gnu/libcurl.so.4". usrmerge means
    # a library may be registered under /usr/lib while ldd reports /lib, so try both.
    : >"$deps_out"
    for lib in $(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'); do
        real=$(readlink -f "$lib")
        pkg=$( { dpkg -S "$lib" || dpkg -S "$real" || dpkg -S "/usr$lib" || dpkg -S "/usr$real"; } 2>/dev/null |
            head -n 1 | cut -d: -f1)
        [ -n "$pkg" ] || { echo "build.sh: no Debian package owns $lib" >&2; exit 1; }
        echo "$pkg" >>"$deps_out"
    done
    sort -u -o "$deps_out" "$deps_out"
fi

"$bin" --check-config "$destdir$prefix/share/doc/loopguard/loopguard.example.json" >/dev/null
echo "$bin"
