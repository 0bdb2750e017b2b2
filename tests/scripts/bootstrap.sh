#!/usr/bin/env bash
# Makes a fresh Debian machine ready for `make test` (every extra, as root: it needs Debian's
# PostgreSQL, libvirt headers and compiler) or for `make demo` (GMD_EXTRAS=daemon,admin: no
# libvirt-python, so no root either when Python's venv module is there), and costs almost
# nothing when run again: Debian packages are installed only when missing, the virtualenv is
# made once, and pip runs only when pyproject.toml changed or extras not yet installed are
# wanted (a venv set up for `make test` serves `make demo` as it is).
# Every failure ends with one line saying what could not be installed, not a stack trace.
set -uo pipefail
cd "$(dirname "$0")/../.."

VENV=${VENV:-.venv}
EXTRAS=${GMD_EXTRAS:-dev,postgres,agent,daemon,admin,openstack,keystone,osc,broker,nova}
PYTHON=${PYTHON:-python3}

die() {
    echo "gmd setup: $*" >&2
    exit 1
}

apt_updated=0
# need_apt WHY PACKAGE...: install the Debian packages among PACKAGE that are not installed
# yet; WHY says what they are for, in the messages.
need_apt() {
    local why=$1 missing=() pkg
    shift
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
            missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    command -v apt-get >/dev/null ||
        die "$why needs ${missing[*]}, and there is no apt-get here: install them by hand"
    [ "$(id -u)" -eq 0 ] ||
        die "$why needs Debian packages: run as root, or: sudo apt-get install ${missing[*]}"
    if [ "$apt_updated" -eq 0 ]; then
        echo "gmd setup: apt-get update" >&2
        apt-get update -qq >/dev/null 2>&1 ||
            die "apt-get update failed: are Debian's package mirrors reachable?"
        apt_updated=1
    fi
    echo "gmd setup: installing Debian packages for $why: ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null 2>&1 ||
        die "could not install Debian packages: ${missing[*]} (try: apt-get install ${missing[*]})"
}

# What the tests need, when asked for: the PostgreSQL server (tests/scripts/postgres.sh starts a
# private cluster) and openssl (a test makes a TLS certificate for the daemon).
[ "${GMD_WITH_POSTGRES:-0}" = 1 ] && need_apt "the tests' PostgreSQL" postgresql openssl
# ...and systemd, for systemd-analyze and systemd-sysusers: tests/integration/test_systemd.py checks
# the unit files in systemd/ with them (no running systemd needed).
[ "${GMD_WITH_POSTGRES:-0}" = 1 ] && need_apt "the unit files' checks" systemd
# tmux: tests/unit/admin/test_terminal.py runs gmd-admin in a real 80-column terminal.
[ "${GMD_WITH_POSTGRES:-0}" = 1 ] && need_apt "the terminal session test" tmux
# chromium: tests/unit/daemon/api/test_read.py loads the read API's web page in a real headless
# browser.
[ "${GMD_WITH_POSTGRES:-0}" = 1 ] && need_apt "the web page's browser test" chromium fonts-dejavu-core

# libvirt-python has no wheel: pip builds it against Debian's libvirt headers.
case ",$EXTRAS," in
*,agent,*) need_apt "gmd[agent] (libvirt-python is built here)" libvirt-dev pkg-config gcc python3-dev ;;
esac

# The virtualenv: remade when missing or broken (a machine whose Python moved), with Python
# >= 3.11 and its venv module (Debian 12's python3 is 3.11, but venv is a separate package,
# python3-venv: the one reason `make demo` may need root).
if ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    if ! command -v "$PYTHON" >/dev/null 2>&1; then
        need_apt "the virtualenv ($PYTHON is missing)" python3 python3-venv
        PYTHON=python3
    fi
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
        die "$PYTHON is $("$PYTHON" -V 2>&1); gmd needs Python >= 3.11 (set PYTHON=/path/to/python3.11)"
    if ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
        echo "gmd setup: $PYTHON has no venv module (Debian's python3-venv)" >&2
        need_apt "the virtualenv" python3-venv
    fi
    echo "gmd setup: creating $VENV with $("$PYTHON" -V 2>&1)" >&2
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV" || die "could not create the virtualenv $VENV with $PYTHON"
fi

# The package and its extras, reinstalled only when pyproject.toml changed or an extra is
# wanted that is not installed yet. The stamp holds "HASH extras=A,B,…" of the last install.
stamp="$VENV/.gmd-installed"
hash=$(sha256sum pyproject.toml | cut -d' ' -f1)
want="$hash extras=$EXTRAS"
installed() {
    local have_hash have_extras extra
    [ -f "$stamp" ] && read -r have_hash have_extras <"$stamp" || return 1
    [ "$have_hash" = "$hash" ] || return 1
    for extra in ${EXTRAS//,/ }; do
        case ",${have_extras#extras=}," in
        *,"$extra",*) ;;
        *) return 1 ;;
        esac
    done
}
if ! installed; then
    echo "gmd setup: installing gmd[$EXTRAS] into $VENV" >&2
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 ||
        echo "gmd setup: (pip could not upgrade itself; going on with $("$VENV/bin/pip" -V))" >&2
    # Some machines' pip configuration names local mirrors that may be absent: keep the log
    # readable by dropping pip's warnings about them, but keep its exit status.
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[$EXTRAS]" 2>&1 |
        grep -v "^WARNING: Location 'file:" >&2
    if [ "${PIPESTATUS[0]}" -ne 0 ]; then
        die "could not install gmd[$EXTRAS] and its dependencies with pip (see above): is PyPI reachable?"
    fi
    echo "$want" >"$stamp"
fi
exit 0
