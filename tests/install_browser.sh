#!/usr/bin/env bash
# The dashboard test's browser: Debian's chromium + chromium-driver. Installed when missing and apt-get can
# (root); otherwise says so and leaves it: that one test then skips with the same reason.
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null \
        && exit 0
fi
echo "install_browser.sh: chromium/chromedriver not installed (needs root and apt-get); the dashboard browser test will skip" >&2
exit 0
