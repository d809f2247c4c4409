#!/usr/bin/env bash
# Mooncake's transfer engine (prefill-decode disaggregation: the [pd] and [test] extras) links against
# Debian's libibverbs1, librdmacm1 and libnuma1 even for its TCP transport: installed when missing and
# apt-get can (root). Otherwise it says so and leaves it: --disaggregation-mode then refuses to start with
# the reason, and the disaggregation tests that need Mooncake skip.
missing=0
for lib in libibverbs.so.1 librdmacm.so.1 libnuma.so.1; do
    ldconfig -p 2>/dev/null | grep -q "$lib" || missing=1
done
[ "$missing" = 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 librdmacm1 libnuma1 >/dev/null \
        && exit 0
fi
echo "install_mooncake_libs.sh: libibverbs1/librdmacm1/libnuma1 not installed (needs root and apt-get); Mooncake cannot load" >&2
exit 0
