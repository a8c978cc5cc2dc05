# Shared by the ensure-* set-up scripts: `source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"`.
# Nothing here runs on its own; each function is small enough to read at a glance.

# say WORDS...: one progress line on stderr, named after the script that says it.
say() { echo "$(basename "$0"): $*" >&2; }

# can_install: true where this script may install Debian packages (Debian, as root).
can_install() { [ "$(id -u)" = 0 ] && [ -r /etc/debian_version ]; }

# apt_install PACKAGE...: install quietly, waiting for the apt lock (other set-up scripts may be
# running apt at the same moment); the package lists are refreshed only when a first try fails.
apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$@" >&2 \
        || { apt-get -o DPkg::Lock::Timeout=600 update -qq >&2 &&
             apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$@" >&2; }
}

# Debian's archive as this machine's apt knows it (deb822 .sources or one-line .list files),
# unless DSPARK_PATCH_DEBIAN_MIRROR names one. The archive carries every architecture.
debian_mirror() {
    if [ -n "${DSPARK_PATCH_DEBIAN_MIRROR:-}" ]; then echo "$DSPARK_PATCH_DEBIAN_MIRROR"; return; fi
    local found
    # Some of these files may not exist; cat's complaint is not an error here.
    found=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
        /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v '^\s*#' \
        | grep -oE '[a-z]+://[^ ]+' | grep -v -- '-security' || true)
    echo "${found%%$'\n'*}"
}
