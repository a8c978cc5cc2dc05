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
