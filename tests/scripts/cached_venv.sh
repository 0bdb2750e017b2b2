# Sourced by openstack.sh and nova_cloud.sh: the pinned venv of a test cloud, kept in a cache
# outside the checkout so that a second clone on the same machine (CI's fresh clone, a developer's
# worktree) reuses it instead of installing ~500 MB again (70-90 s of pip with its cache warm).
#
#   cached_venv NAME LINK SEED PACKAGE...
#
# makes LINK (the checkout's var/NAME/venv) a symlink to $GMD_TEST_CACHE/NAME-venv-HASH, where
# HASH is of the packages and the Python that runs them, building that venv first when it is
# missing or half-built (the stamp is written last). The cache is ${XDG_CACHE_HOME:-~/.cache}/
# gmd-tests unless GMD_TEST_CACHE names another; one build at a time (a lock in the cache).
# When LINK points there anew, the caller's SEED (a directory made with another venv) is removed.
# Returns 0, or 1 with one line on stderr when the venv cannot be built.
cached_venv() {
    local name=$1 link=$2 seed=$3
    shift 3
    local cache=${GMD_TEST_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/gmd-tests}
    local stamp hash target
    stamp="$* $(python3 -c 'import sys; print(sys.version.split()[0])')"
    hash=$(printf '%s' "$stamp" | sha256sum | cut -c1-12)
    target="$cache/$name-venv-$hash"
    mkdir -p "$cache" || {
        echo "gmd test $name: cannot create the venv cache $cache (set GMD_TEST_CACHE)" >&2
        return 1
    }
    if [ "$(cat "$target/.gmd-stamp" 2>/dev/null)" != "$stamp" ]; then
        (
            exec 7>"$cache/$name.lock"
            flock -w 900 7 || exit 1
            [ "$(cat "$target/.gmd-stamp" 2>/dev/null)" = "$stamp" ] && exit 0
            echo "gmd test $name: installing $* into $target (a few minutes, once per machine)" >&2
            rm -rf "$target"
            python3 -m venv "$target" || exit 1
            "$target/bin/pip" install -q --disable-pip-version-check "$@" \
                >"$cache/$name-pip.log" 2>&1 || exit 1
            printf '%s' "$stamp" >"$target/.gmd-stamp"
        ) 7>&- || {
            echo "gmd test $name: could not install $*; see $cache/$name-pip.log" >&2
            return 1
        }
    fi
    [ "$(readlink "$link" 2>/dev/null)" = "$target" ] && return 0
    rm -rf "$link" "$seed"
    ln -s "$target" "$link"
}
