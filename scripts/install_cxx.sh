#!/usr/bin/env bash
# torch.compile's CPU code generation (Inductor) needs a C++ compiler: Debian's g++ when none is on PATH and
# apt-get can (root). Otherwise it says so and leaves it: the engine then runs its layers eager and logs why.
if command -v g++ >/dev/null || command -v c++ >/dev/null; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null && exit 0
fi
echo "install_cxx.sh: no C++ compiler and none installed (needs root and apt-get); radixrt will run eager" >&2
exit 0
